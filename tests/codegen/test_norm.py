"""Softmax/LogSoftmax/LayerNormalization/InstanceNormalization/RMSNormalization templates vs onnxruntime."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from dlcc.codegen.cbase import TemplateError
from dlcc.testing.harness import assert_close, ort_output, run_node

_ort = ort_output


def _close(got, ref, rtol=1e-5, atol=1e-6):
    assert_close(got, ref, rtol, atol)


def _model(op, shape, attrs, *, opset=17, weights=(), const=True, outputs=("y",)):
    """x (graph input) plus weights (name, array) as initializers or graph inputs."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    inits = []
    for name, arr in weights:
        if const:
            inits.append(onnx.numpy_helper.from_array(arr, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, arr.shape))
    node = helper.make_node(op, ["x", *[n for n, _ in weights]], list(outputs), **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape if i == 0 else None)
            for i, o in enumerate(outputs) if o]
    graph = helper.make_graph([node], "g", inputs, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(shape, weights=(), const=True, seed=0, scale=3.0):
    x = (np.random.default_rng(seed).standard_normal(shape) * scale + 1).astype(np.float32)
    feeds = {"x": x}
    if not const:
        feeds.update(dict(weights))
    return feeds


def _w(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", [
    ([2, 3, 40], -1), ([2, 3, 40], 1), ([4, 7], 0), ([1, 13], 1), ([7], 0), ([2, 5000], -1), ([3, 4100, 2], 1),
    ([2, 3, 5, 7], 2),
])
def test_softmax(op, shape, axis):
    m = _model(op, shape, {"axis": axis}, opset=13)
    feeds = _feeds(shape)
    rtol = 1e-4 if max(shape) > 1000 else 1e-5  # long rows: sums in another order
    _close(run_node(m, feeds), _ort(m, feeds), rtol=rtol)


def test_softmax_large_values():
    m = _model("Softmax", [3, 9], {"axis": -1}, opset=13)
    feeds = {"x": np.linspace(-300, 500, 27, dtype=np.float32).reshape(3, 9)}
    _close(run_node(m, feeds), _ort(m, feeds))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,attrs", [([2, 3, 5], {}), ([2, 3, 5], {"axis": 2}), ([2, 3, 5], {"axis": 0})])
def test_softmax_opset11(op, shape, attrs):
    """opset < 13: 2-D coercion at axis (default 1), requested through node.meta["dlcc.opset"]."""
    m = _model(op, shape, attrs, opset=11)
    feeds = _feeds(shape)
    irm = ir.serde.deserialize_model(m)
    next(iter(irm.graph)).meta["dlcc.opset"] = 11
    _close(run_node(irm, feeds), _ort(m, feeds))


@pytest.mark.parametrize("shape,axis,wshape,bias,const", [
    ([2, 3, 40], -1, [40], True, True),
    ([2, 3, 40], -1, [40], False, False),
    ([2, 3, 40], 1, [3, 40], True, False),
    ([5, 7], 0, [5, 7], True, True),
    ([3, 13], -1, [1], True, True),
    ([2, 5000], -1, [5000], True, True),
    ([1, 2, 2, 9], 2, [2, 9], True, False),
])
def test_layer_norm(shape, axis, wshape, bias, const):
    weights = [("s", _w(wshape, 1))] + ([("b", _w(wshape, 2))] if bias else [])
    m = _model("LayerNormalization", shape, {"axis": axis, "epsilon": 1e-3}, weights=weights, const=const)
    feeds = _feeds(shape, weights, const)
    rtol = 1e-4 if max(shape) > 1000 else 1e-5
    _close(run_node(m, feeds), _ort(m, feeds), rtol=rtol)


def test_layer_norm_default_epsilon():
    weights = [("s", _w([16], 1)), ("b", _w([16], 2))]
    m = _model("LayerNormalization", [4, 16], {}, weights=weights)
    feeds = _feeds([4, 16], scale=0.01)
    _close(run_node(m, feeds), _ort(m, feeds))


def test_layer_norm_extra_outputs_used():
    weights = [("s", _w([8], 1))]
    m = _model("LayerNormalization", [2, 8], {}, weights=weights, outputs=("y", "mean"))
    with pytest.raises(TemplateError, match="output 0"):
        run_node(m, _feeds([2, 8]))


@pytest.mark.parametrize("shape,const", [([2, 3, 5, 7], True), ([1, 4, 13], False), ([3, 2, 2, 3, 4], True),
                                         ([2, 3, 70, 70], True)])
def test_instance_norm(shape, const):
    c = shape[1]
    weights = [("s", _w([c], 1)), ("b", _w([c], 2))]
    m = _model("InstanceNormalization", shape, {"epsilon": 1e-4}, weights=weights, const=const)
    feeds = _feeds(shape, weights, const)
    rtol = 1e-4 if np.prod(shape[2:]) > 1000 else 1e-5
    _close(run_node(m, feeds), _ort(m, feeds), rtol=rtol)


def test_instance_norm_rank2():
    weights = [("s", _w([3], 1)), ("b", _w([3], 2))]
    m = _model("InstanceNormalization", [2, 3], {}, weights=weights)
    with pytest.raises(TemplateError):
        run_node(m, _feeds([2, 3]))


def _rms_ref(x, s, axis, eps):
    axes = tuple(range(axis % x.ndim, x.ndim))
    return (x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=axes, keepdims=True) + eps) * s).astype(np.float32)


@pytest.mark.parametrize("shape,axis,wshape", [([2, 3, 40], -1, [40]), ([2, 3, 7], 1, [3, 7]), ([13], 0, [13])])
def test_rms_norm(shape, axis, wshape):
    weights = [("s", _w(wshape, 1))]
    m = _model("RMSNormalization", shape, {"axis": axis, "epsilon": 1e-4}, opset=23, weights=weights)
    feeds = _feeds(shape)
    got = run_node(m, feeds)
    try:
        ref = _ort(m, feeds)
    except Exception:  # onnxruntime without opset 23 RMSNormalization: numpy reference
        ref = _rms_ref(feeds["x"], weights[0][1], axis, 1e-4)
    _close(got, ref)
    _close(got, _rms_ref(feeds["x"], weights[0][1], axis, 1e-4))
