"""MaxPool / AveragePool / global pools / LRN templates against onnxruntime.

Averages and LRN sums run in a different order than onnxruntime: compared with rtol 1e-4 (DESIGN:
reductions); MaxPool/GlobalMaxPool are exact selections (rtol 1e-5).
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from dlcc.codegen.cbase import TemplateError
from dlcc.testing.harness import assert_close, ort_output, run_node, runnable_targets

_ort = ort_output


def _close(got, ref, rtol=1e-4, atol=1e-6):
    assert_close(got, ref, rtol, atol)


def _model(op, x_shape, attrs, out_shape=None, opset=21, outputs=("y",)):
    node = helper.make_node(op, ["x"], list(outputs), **attrs)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT if i == 0 else TensorProto.INT64,
                                          out_shape if i == 0 else None) for i, o in enumerate(outputs)]
    graph = helper.make_graph([node], "g", inputs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _check(op, x_shape, attrs, rtol=1e-4, opset=21):
    rng = np.random.default_rng(sum(x_shape))
    feeds = {"x": rng.standard_normal(x_shape, dtype=np.float32)}
    ref = _ort(_model(op, x_shape, attrs, opset=opset), feeds)
    m = _model(op, x_shape, attrs, list(ref.shape), opset=opset)
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref, rtol)


POOL_CASES = [
    ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((2, 2, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 13, 11), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 0, 1]}),
    # ceil_mode: the last window of dim 0 would start in the right padding -> dropped
    ((1, 2, 5, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 1, 7, 7), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 0, 0], "ceil_mode": 1}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [4, 3], "strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "auto_pad": "VALID"}),
    ((1, 2, 17), {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}),  # 1-D
    ((1, 2, 6, 5, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 1, 0]}),  # 3-D
    ((1, 1, 1, 1), {"kernel_shape": [1, 1]}),
]

DILATED = [
    ((1, 2, 11, 12), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 1, 2, 1]}),
    ((1, 2, 10, 9), {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2], "ceil_mode": 1}),
]


@pytest.mark.parametrize(("x_shape", "attrs"), POOL_CASES + DILATED)
def test_maxpool(x_shape, attrs):
    _check("MaxPool", x_shape, attrs, rtol=1e-5)


@pytest.mark.parametrize("include", [0, 1])
@pytest.mark.parametrize(("x_shape", "attrs"), POOL_CASES + DILATED)
def test_averagepool(x_shape, attrs, include):
    _check("AveragePool", x_shape, {**attrs, "count_include_pad": include})


@pytest.mark.parametrize("x_shape", [(2, 3, 5, 7), (1, 13, 1, 1), (1, 2, 3), (1, 3, 4, 3, 5), (2, 2, 16, 16)])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op, x_shape):
    _check(op, x_shape, {}, rtol=1e-4 if op == "GlobalAveragePool" else 1e-5)


def test_global_pool_two_threads():
    """A DeepLab-like 1024 x 28 x 28 mean, compiled for two threads: the channels split between them."""
    import dlcc

    x = np.random.default_rng(6).standard_normal((1, 1024, 28, 28), dtype=np.float32)
    ref = _ort(_model("GlobalAveragePool", x.shape, {}), {"x": x})
    cm = dlcc.compile(_model("GlobalAveragePool", x.shape, {}, list(ref.shape)), threads=2)
    assert "parallel for" in cm.artifacts.program.kernels[0].steps[0].loop_ir
    _close(list(cm({"x": x}).values())[0], ref, 1e-4)


@pytest.mark.parametrize(("x_shape", "attrs"), [
    ((1, 7, 5, 5), {"size": 3}),
    ((2, 13, 4, 3), {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}),
    ((1, 5, 6, 1), {"size": 1, "alpha": 0.1}),
    ((1, 1, 3, 3), {"size": 5}),
    ((1, 8, 5, 5), {"size": 3, "alpha": 0.05, "beta": 0.6}),  # exp and log
])
def test_lrn(x_shape, attrs):
    _check("LRN", x_shape, attrs)


@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_two_threads(beta):
    """GoogLeNet's LRN shape, compiled for two threads: the channels split between them, no libm pow."""
    import dlcc

    attrs = {"size": 5, "alpha": 0.002, "bias": 0.5, "beta": beta}
    x = np.random.default_rng(3).standard_normal((1, 192, 28, 28), dtype=np.float32) * 4
    ref = _ort(_model("LRN", x.shape, attrs), {"x": x})
    cm = dlcc.compile(_model("LRN", x.shape, attrs, list(ref.shape)), threads=2)
    listing = cm.artifacts.program.kernels[0].steps[0].loop_ir
    assert "parallel for" in listing and "pow(" not in listing
    _close(list(cm({"x": x}).values())[0], ref, 1e-4)


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size(size):
    # onnxruntime rejects even sizes: compare with the ONNX definition in numpy
    x = np.random.default_rng(size).standard_normal((1, 6, 3, 4), dtype=np.float32)
    alpha, beta, bias = 0.3, 0.75, 1.5
    sq = np.zeros_like(x)
    for c in range(6):
        lo, hi = max(0, c - (size - 1) // 2), min(5, c + size - 1 - (size - 1) // 2)
        sq[:, c] = np.sum(x[:, lo:hi + 1] ** 2, axis=1)
    ref = x / (bias + alpha / size * sq) ** beta
    m = _model("LRN", x.shape, {"size": size, "alpha": alpha, "beta": beta, "bias": bias}, list(x.shape))
    _close(run_node(m, {"x": x}), ref)


def test_epilogue_store(monkeypatch):
    """With call.direct False every element goes through store exactly once (here a fused Relu)."""
    import dlcc.codegen.templates as templates

    real = templates.TemplateCall

    def fake(node, operands, shape, dtype, store, scratch, direct, names, pack, target, **kw):
        return real(node, operands, shape, dtype, lambda idx, v: store(idx, f"fmaxf({v}, 0.0f)"), scratch,
                    False, names, pack, target, **kw)

    monkeypatch.setattr(templates, "TemplateCall", fake)
    x = np.random.default_rng(1).standard_normal((1, 3, 7, 6), dtype=np.float32)
    for op, attrs in [("MaxPool", {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1]}),
                      ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
                      ("GlobalAveragePool", {}), ("GlobalMaxPool", {}), ("LRN", {"size": 3})]:
        ref = _ort(_model(op, x.shape, attrs), {"x": x})
        got = run_node(_model(op, x.shape, attrs, list(ref.shape)), {"x": x})
        _close(got, np.maximum(ref, 0))


def test_maxpool_indices_unsupported():
    m = _model("MaxPool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2]}, [1, 1, 2, 2],
               outputs=("y", "i"))
    with pytest.raises(TemplateError, match="Indices"):
        run_node(m, {"x": np.zeros((1, 1, 4, 4), np.float32)})


def test_pool_bad_auto_pad():
    m = _model("MaxPool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "auto_pad": "BOGUS"}, [1, 1, 3, 3])
    with pytest.raises(TemplateError, match="auto_pad"):
        run_node(m, {"x": np.zeros((1, 1, 4, 4), np.float32)})


@pytest.mark.parametrize(("op", "attrs"), [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [2, 3], "pads": [0, 1, 1, 1]}),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
    ("LRN", {"size": 3}),
])
def test_strided_input(monkeypatch, op, attrs):
    """X given as a strided window (every other column of a wider buffer)."""
    import dlcc.codegen.templates as templates
    from dlcc.codegen.cbase import Operand, TensorRef

    real = templates.TemplateCall

    def fake(node, operands, shape, dtype, store, scratch, direct, names, pack, target, **kw):
        big = operands[0].ref
        view = TensorRef(big.ptr, big.dtype, (*big.shape[:3], big.shape[3] // 2), (*big.strides[:3], 2), 1)
        return real(node, [Operand.of(view), *operands[1:]], shape, dtype, store, scratch, direct, names, pack, target,
                    **kw)

    x = np.random.default_rng(5).standard_normal((1, 3, 7, 9), dtype=np.float32)
    ref = _ort(_model(op, x.shape, attrs), {"x": x})
    wide = np.full((1, 3, 7, 18), np.nan, np.float32)  # the NaN columns must never be read
    wide[..., 1::2] = x
    m = _model(op, wide.shape, attrs, list(ref.shape))
    monkeypatch.setattr(templates, "TemplateCall", fake)
    _close(run_node(m, {"x": wide}), ref)


@pytest.mark.parametrize(("op", "x_shape", "attrs"), [
    ("MaxPool", (1, 2, 9), {"kernel_shape": [3], "pads": [1, 1]}),  # 1-D: schedule.pool.pool_func
    ("MaxPool", (1, 1, 3, 4, 5), {"kernel_shape": [2, 2, 2], "strides": [1, 2, 2]}),  # 3-D
    ("GlobalMaxPool", (1, 3, 40), {}),  # partial maxima in one vector
    ("GlobalMaxPool", (1, 2, 3, 1), {}),  # fewer elements than lanes: one running maximum
])
def test_max_skips_nan(op, x_shape, attrs):
    """A NaN element is skipped by the running maximum (``acc < x ? x : acc``); a window of NaNs gives -inf.
    (GlobalMaxPool's partial maxima start from a plane's first vector: a NaN there would stay.)"""
    x = np.random.default_rng(3).standard_normal(x_shape).astype(np.float32)
    flat = x.reshape(*x_shape[:2], -1)
    flat[..., 16 if flat.shape[-1] >= 32 else 0::4] = np.nan
    if op == "MaxPool" or flat.shape[-1] < 4:
        x[0, 0] = np.nan  # a whole plane of NaNs
    ref = _ort(_model(op, x_shape, attrs), {"x": np.where(np.isnan(x), -np.inf, x).astype(np.float32)})
    ref[ref == np.finfo(np.float32).min] = -np.inf  # (onnxruntime starts its maxima at the lowest float)
    for target in runnable_targets():
        got = run_node(_model(op, x_shape, attrs, list(ref.shape)), {"x": x}, target=target)
        np.testing.assert_array_equal(got, ref)
