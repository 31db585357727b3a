"""Reduce* and ArgMax/ArgMin templates against onnxruntime (sums in another order: rtol 1e-4)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from dlcc.codegen.cbase import TemplateError
from dlcc.testing.harness import run_node, runnable_targets


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def _close(got, ref, rtol=1e-4, atol=1e-6):
    assert got.shape == ref.shape
    assert np.max(np.abs(got - ref), initial=0.0) <= rtol * np.max(np.abs(ref), initial=0.0) + atol


def _model(op, shape, attrs, *, opset, axes=None, axes_const=True, dtype=TensorProto.FLOAT, out_shape=None):
    inputs = [helper.make_tensor_value_info("x", dtype, shape)]
    names, inits = ["x"], []
    if axes is not None:
        names.append("axes")
        if axes_const:
            inits.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
        else:
            inputs.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [len(axes)]))
    out_t = TensorProto.INT64 if op in ("ArgMax", "ArgMin") else dtype
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", out_t, out_shape)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def _data(op, shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op == "ReduceProd":
        x = (1 + 0.05 * x).astype(np.float32)
    return x


OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
       "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"]
# axes as an attribute (opset 11) for some, as a constant input (opset 18) for the others
CASES = [
    ("ReduceSum", [3, 5, 33], [2], 1),
    ("ReduceSum", [2, 7, 13], [0, 2], 0),
    ("ReduceSum", [4, 9], None, 1),
    ("ReduceMean", [2, 37, 100], [1], 0),
    ("ReduceMean", [3, 5001], [0], 1),
    ("ReduceMean", [2, 3, 4, 5], [-1, -3], 1),
    ("ReduceMax", [5, 7, 19], [1, 2], 0),
    ("ReduceMax", [1, 13], [-1], 1),
    ("ReduceMin", [6, 7, 8], [0], 0),
    ("ReduceMin", [7], None, 0),
    ("ReduceProd", [3, 17], [1], 1),
    ("ReduceProd", [4, 3, 2], [0, 1], 0),
    ("ReduceL1", [3, 40], [1], 0),
    ("ReduceL1", [5, 6, 7], [0, 2], 1),
    ("ReduceL2", [3, 40], [-1], 1),
    ("ReduceL2", [9, 11], [0], 0),
    ("ReduceSumSquare", [2, 3, 31], [2], 0),
    ("ReduceSumSquare", [8, 5], None, 1),
    ("ReduceLogSumExp", [3, 50], [1], 0),
    ("ReduceLogSumExp", [4, 6, 7], [0, 1], 1),
    ("ReduceLogSum", [3, 29], [1], 1),
    ("ReduceLogSum", [6, 5, 4], [1], 0),
]


@pytest.mark.parametrize("op,shape,axes,keep", CASES)
@pytest.mark.parametrize("as_input", [False, True])
def test_reduce(op, shape, axes, keep, as_input):
    if as_input:
        m = _model(op, shape, {"keepdims": keep}, opset=18, axes=axes)
    else:
        attrs = {"keepdims": keep, **({"axes": axes} if axes is not None else {})}
        m = _model(op, shape, attrs, opset=11 if op != "ReduceSum" else 12)
    feeds = {"x": _data(op, shape)}
    ref = _ort(m, feeds)
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref)


@pytest.mark.parametrize("op", OPS)
def test_noop_with_empty_axes(op):
    m = _model(op, [3, 7], {"noop_with_empty_axes": 1}, opset=18, axes=[])
    feeds = {"x": _data(op, [3, 7], seed=1)}
    _close(run_node(m, feeds), _ort(m, feeds), rtol=1e-5)


def test_empty_axes_reduces_all():
    m = _model("ReduceSum", [3, 7], {"keepdims": 0}, opset=18, axes=[])
    feeds = {"x": _data("ReduceSum", [3, 7])}
    ref = _ort(m, feeds)
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref)


@pytest.mark.parametrize("op,axes,keep", [("ReduceSum", [1], 0), ("ReduceMax", [0], 1), ("ReduceMin", None, 0)])
def test_reduce_int64(op, axes, keep):
    m = _model(op, [5, 23], {"keepdims": keep}, opset=18, axes=axes, dtype=TensorProto.INT64)
    feeds = {"x": np.random.default_rng(2).integers(-1000, 1000, (5, 23)).astype(np.int64)}
    np.testing.assert_array_equal(run_node(m, feeds), _ort(m, feeds))


def test_axes_must_be_constant():
    m = _model("ReduceSum", [3, 4], {}, opset=18, axes=[1], axes_const=False, out_shape=[3, 1])
    with pytest.raises(TemplateError, match="constant"):
        run_node(m, {"x": np.zeros((3, 4), np.float32), "axes": np.array([1], np.int64)})


def test_unsupported_dtype():
    m = _model("ReduceProd", [3, 4], {}, opset=18, axes=[1], dtype=TensorProto.INT64)
    with pytest.raises(TemplateError):
        run_node(m, {"x": np.zeros((3, 4), np.int64)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis,keep,last", [
    ([3, 17], 1, 1, 0), ([3, 17], 1, 0, 1), ([4, 7, 5], 1, 0, 0), ([4, 7, 5], -3, 1, 1), ([13], 0, 0, 0),
])
def test_arg(op, shape, axis, keep, last):
    m = _model(op, shape, {"axis": axis, "keepdims": keep, "select_last_index": last}, opset=13)
    # small integers: plenty of ties, so select_last_index matters
    x = np.random.default_rng(3).integers(-3, 4, shape).astype(np.float32)
    feeds = {"x": x}
    np.testing.assert_array_equal(run_node(m, feeds), _ort(m, feeds))
