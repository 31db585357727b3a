"""Conv / ConvTranspose templates against onnxruntime.

Sums run in a different order than onnxruntime, so results are compared with rtol 1e-4 (DESIGN allows it
for conv/matmul), relative to the output's scale.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dlcc.codegen.cbase import TemplateError
from dlcc.testing.harness import assert_close, ort_output, run_node, runnable_targets

_ort = ort_output


def _close(got, ref, rtol=1e-4, atol=1e-6):
    assert_close(got, ref, rtol, atol)


def _model(op, x_shape, w_shape, b, attrs, const_w, out_shape=None, opset=21):
    rng = np.random.default_rng(len(x_shape) * 7 + sum(w_shape))
    w = rng.standard_normal(w_shape, dtype=np.float32)
    nb = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    bias = rng.standard_normal((nb,), dtype=np.float32)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    feeds = {"x": x}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    inits = []
    names = ["x", "w"]
    if const_w:
        inits.append(onnx.numpy_helper.from_array(w, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, w_shape))
        feeds["w"] = w
    if b:
        names.append("b")
        if const_w:
            inits.append(onnx.numpy_helper.from_array(bias, "b"))
        else:
            inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [nb]))
            feeds["b"] = bias
    node = helper.make_node(op, names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    graph = helper.make_graph([node], "g", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9), feeds


def _check(op, x_shape, w_shape, attrs, b=True, const_w=True):
    m, feeds = _model(op, x_shape, w_shape, b, attrs, const_w)
    ref = _ort(m, feeds)
    m, feeds = _model(op, x_shape, w_shape, b, attrs, const_w, list(ref.shape))
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref)


CONV_CASES = [
    # (x_shape, w_shape, attrs, bias, const weight)
    ((1, 3, 7, 7), (5, 3, 3, 3), {}, True, True),
    ((2, 3, 7, 7), (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}, False, False),
    ((1, 4, 13, 11), (6, 2, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 0, 1, 2]}, True, True),
    ((1, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}, True, True),  # depthwise
    # depthwise, channel-blocked (schedule.dwconv): a partial last block, strides, dilation, asymmetric pads, a
    # row tail, the whole plane or row by row in the local buffer, two images
    ((1, 40, 14, 14), (40, 1, 5, 5), {"group": 40, "pads": [2, 2, 2, 2]}, True, True),
    ((2, 32, 17, 15), (32, 1, 3, 3), {"group": 32, "strides": [2, 2], "pads": [1, 0, 1, 2]}, True, True),
    ((1, 16, 30, 31), (16, 1, 3, 3), {"group": 16, "dilations": [2, 2], "pads": [2, 2, 2, 2]}, False, True),
    ((1, 24, 9, 40), (24, 1, 7, 7), {"group": 24, "pads": [3, 3, 3, 3]}, True, True),
    ((1, 16, 56, 57), (16, 1, 3, 3), {"group": 16, "pads": [1, 1, 1, 1]}, True, True),
    ((1, 6, 10, 10), (12, 1, 5, 5), {"group": 6, "strides": [2, 2], "auto_pad": "SAME_UPPER"}, True, True),
    ((1, 3, 10, 9), (4, 3, 4, 4), {"strides": [3, 2], "auto_pad": "SAME_LOWER"}, True, True),
    ((1, 3, 12, 12), (4, 3, 3, 3), {"dilations": [2, 3], "pads": [2, 3, 2, 3]}, True, False),
    ((1, 3, 11, 12), (5, 3, 3, 2), {"auto_pad": "VALID", "strides": [2, 1]}, True, True),
    ((1, 2, 5, 5), (3, 2, 7, 7), {"pads": [3, 3, 3, 3]}, True, True),  # kernel larger than input
    ((1, 16, 7, 13), (9, 16, 1, 1), {}, True, True),  # 1x1 GEMM path
    ((2, 130, 3, 50), (7, 130, 1, 1), {}, False, False),  # GEMM: tile tail, runtime weight
    ((1, 8, 5, 5), (6, 4, 1, 1), {"group": 2}, True, True),  # grouped GEMM
    ((1, 8, 9, 9), (5, 8, 1, 1), {"strides": [2, 2]}, True, True),  # strided 1x1: direct path
    ((1, 1, 1, 1), (1, 1, 1, 1), {}, True, True),
    ((2, 3, 17), (4, 3, 5), {"pads": [2, 1], "strides": [2]}, True, True),  # 1-D
    ((1, 4, 13), (4, 1, 3), {"group": 4, "dilations": [2], "pads": [2, 1]}, False, True),
    ((1, 4, 13), (8, 1, 4), {"group": 4, "strides": [3], "auto_pad": "SAME_UPPER"}, False, True),
    ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 1]}, True, True),  # 3-D
    ((1, 3, 6, 6), (5, 3, 3, 3), {"kernel_shape": [3, 3], "strides": [1, 1]}, True, True),
    ((1, 3, 6, 40), (7, 3, 1, 11), {"pads": [0, 5, 0, 5]}, True, True),  # long row, 11 taps
    ((1, 5, 9, 30), (13, 5, 3, 3), {"pads": [1, 1, 1, 1]}, True, False),  # channel blocks 6+6+1, overlap tile
    ((1, 4, 4, 37), (6, 4, 2, 3), {"strides": [1, 3], "pads": [0, 2, 1, 1]}, True, True),  # strided lanes
    # small planes (im2col + GEMM path)
    ((2, 10, 7, 7), (12, 10, 3, 3), {"pads": [1, 1, 1, 1]}, True, True),
    ((1, 20, 9, 9), (7, 20, 3, 3), {"pads": [1, 1, 1, 1]}, False, True),  # 3 chunks of input channels
    ((1, 30, 20, 20), (6, 30, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, True, True),  # 5 chunks
    ((1, 40, 9, 9), (13, 40, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1]}, True, True),
    ((1, 16, 6, 6), (12, 8, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [2, 1, 2, 1]}, True, True),
    ((1, 8, 20), (8, 8, 5), {"pads": [2, 2]}, True, True),
    ((1, 3, 4, 5, 6), (6, 3, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}, True, True),
    # the row kernel (schedule.convrows) on more shapes: channel blocks and a tail, groups with a run-time weight
    ((1, 32, 14, 14), (64, 8, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, True, True),
    ((2, 12, 9, 10), (12, 4, 3, 3), {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}, True, False),
    ((1, 6, 4, 6, 7), (6, 2, 3, 3, 3), {"group": 3, "pads": [1] * 6, "dilations": [1, 2, 1]}, True, True),
    ((1, 8, 50), (12, 4, 3), {"group": 2, "strides": [2], "pads": [1, 1]}, True, False),
    ((1, 12, 6, 40), (24, 4, 1, 1), {"group": 3}, True, True),  # grouped 1x1: the pixels as one row
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "b", "const_w"), CONV_CASES)
def test_conv(x_shape, w_shape, attrs, b, const_w):
    _check("Conv", x_shape, w_shape, attrs, b, const_w)


CONVT_CASES = [
    ((1, 3, 5, 5), (3, 4, 3, 3), {}, True, True),
    ((2, 3, 5, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, False, False),
    ((1, 4, 5, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 3], "output_padding": [1, 2]}, True, True),
    ((1, 4, 6, 5), (4, 1, 3, 3), {"group": 4, "dilations": [2, 1], "pads": [1, 0, 2, 1]}, True, True),
    ((1, 2, 5, 5), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, True, True),
    ((1, 2, 5, 5), (2, 3, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, True, True),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}, True, True),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [3, 2], "auto_pad": "VALID"}, True, True),
    ((1, 3, 7), (3, 2, 4), {"strides": [3], "pads": [1, 2]}, True, True),  # 1-D
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), {"strides": [2, 1, 2]}, True, True),  # 3-D
    ((1, 3, 5, 9), (3, 4, 3, 5), {"strides": [3, 2], "dilations": [2, 3], "pads": [1, 2, 0, 3]}, True, True),
    ((1, 2, 2, 2), (2, 2, 1, 1), {"strides": [4, 4]}, True, True),  # outputs with no taps: bias only
    ((1, 7, 3, 20), (7, 13, 2, 3), {"strides": [1, 2], "output_padding": [0, 1]}, True, False),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs", "b", "const_w"), CONVT_CASES)
def test_conv_transpose(x_shape, w_shape, attrs, b, const_w):
    _check("ConvTranspose", x_shape, w_shape, attrs, b, const_w)


def test_conv_bad_auto_pad():
    m, feeds = _model("Conv", (1, 2, 5, 5), (2, 2, 3, 3), False, {"auto_pad": "BOGUS"}, True, [1, 2, 3, 3])
    with pytest.raises(TemplateError, match="auto_pad"):
        run_node(m, feeds)


def test_conv_bad_kernel_shape():
    m, feeds = _model("Conv", (1, 2, 5, 5), (2, 2, 3, 3), False, {"kernel_shape": [2, 2]}, True, [1, 2, 3, 3])
    with pytest.raises(TemplateError, match="kernel_shape"):
        run_node(m, feeds)


def test_epilogue_store(monkeypatch):
    """With call.direct False every element goes through store exactly once (here a fused Relu)."""
    import dlcc.codegen.templates as templates

    real = templates.TemplateCall

    def fake(node, operands, shape, dtype, store, scratch, direct, names, pack, target, **kw):
        return real(node, operands, shape, dtype, lambda idx, v: store(idx, f"fmaxf({v}, 0.0f)"), scratch,
                    False, names, pack, target, **kw)

    monkeypatch.setattr(templates, "TemplateCall", fake)
    for op, xs, ws, attrs in [("Conv", (1, 3, 7, 6), (6, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
                              ("Conv", (1, 5, 7, 6), (6, 5, 1, 1), {}),
                              ("Conv", (1, 8, 7, 6), (8, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # im2col
                              ("Conv", (1, 5, 20, 20), (7, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
                              ("Conv", (1, 8, 9, 9), (8, 2, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),
                              ("ConvTranspose", (1, 3, 4, 5), (3, 5, 3, 3), {"strides": [2, 2]})]:
        m, feeds = _model(op, xs, ws, True, attrs, True)
        ref = _ort(m, feeds)
        m, feeds = _model(op, xs, ws, True, attrs, True, list(ref.shape))
        _close(run_node(m, feeds), np.maximum(ref, 0))


@pytest.mark.parametrize(("op", "ws", "attrs"), [
    ("Conv", (5, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("Conv", (6, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # im2col
    ("Conv", (5, 3, 1, 1), {}),  # 1x1 on a non-contiguous input: no flat GEMM view
    ("ConvTranspose", (3, 4, 3, 3), {"strides": [2, 2]}),
])
def test_strided_input(monkeypatch, op, ws, attrs):
    """X given as a strided window (every other column of a wider buffer)."""
    import dlcc.codegen.templates as templates
    from dlcc.codegen.cbase import Operand, TensorRef

    real = templates.TemplateCall

    def fake(node, operands, shape, dtype, store, scratch, direct, names, pack, target, **kw):
        big = operands[0].ref
        view = TensorRef(big.ptr, big.dtype, (*big.shape[:3], big.shape[3] // 2), (*big.strides[:3], 2), 1)
        return real(node, [Operand.of(view), *operands[1:]], shape, dtype, store, scratch, direct, names, pack, target,
                    **kw)

    xs = (1, 3, 7, 9)
    m, feeds = _model(op, xs, ws, True, attrs, True)
    ref = _ort(m, feeds)
    wide = np.zeros((1, 3, 7, 18), np.float32)
    wide[..., 1::2] = feeds["x"]
    wide[..., 0::2] = np.nan  # must never be read
    m, _ = _model(op, (1, 3, 7, 18), ws, True, attrs, True, list(ref.shape))
    monkeypatch.setattr(templates, "TemplateCall", fake)
    _close(run_node(m, {"x": wide}), ref)
