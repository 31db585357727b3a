"""Channels-last buffers chosen by the schedule stage (``schedule.layouts``): the micro-kernels that read and write
that layout against their contracts, the rules on small graphs (which Transpose kernels go, which stay), and whole
models against onnxruntime and the kernel-IR interpreter on every target the machine runs."""

from __future__ import annotations

import ctypes
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_lir import PRELUDE, _build

import dlcc
import dlcc.lower.lower as lower
import dlcc.schedule.blocked as blocked
import dlcc.schedule.layouts as layouts
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.lower.interp import interpret
from dlcc.lower.lir import MICRO
from dlcc.lower.micro import dconv_micro, dwc_micro, nchwc_micro
from dlcc.schedule.target import get_target
from dlcc.testing.harness import assert_close, runnable_targets


@pytest.mark.parametrize("target", runnable_targets())
def test_channels_last_micro_kernels_match_their_contracts(target):
    """nchwc_ from a channels-last input (full and partial blocks, a band of rows), and the pixel-major tiles
    dwcp_, dconvp_ and dconvap_ (added to c), against their references; nothing outside their footprint."""
    t = get_target(target)
    if t.lanes < 4:
        pytest.skip(f"{target}: one float per vector, the channel-blocked kernels do not run")
    rng = np.random.default_rng(3)
    L = t.lanes
    src = PRELUDE + vector_helpers(L) + "\n"
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    packs = [(L, 5, 6, 1, 2, 7, 9, 3 * L), (L, 4, 9, 0, 0, 4, 9, L + 3)]  # (..., column stride)
    for geo in packs:
        name = nchwc_micro(*geo[:7], xw=geo[7])
        assert name.endswith(f"_{geo[7]}")
        src += micro_c(name, L) + (f"void w_{name}(const float* x, int64_t xc, int64_t xh, int64_t nci, int64_t y0, "
                                   f"int64_t rows, float* ws) {{ dlcc_uk_{name}(x, xc, xh, nci, y0, rows, ws); }}\n")
    dwcs = [(5, 3, 3, 1, 1, 1), (3, 5, 5, 2, 1, 1)]
    for px, kh, kw, sw, dh, dw in dwcs:
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * L + 2 * L
        name = dwc_micro(L, px, kh, kw, sw, dh, dw, xrow, pixel_major=True)
        assert name.startswith("dwcp_")
        src += micro_c(name, L) + (f"void w_{name}(const float* x, const float* w, float* c, int64_t ldc) "
                                   f"{{ dlcc_uk_{name}(x, w, c, ldc); }}\n")
    dconvs = [(2 * L, 5, L, 3, 3, 1, 1, 1, False), (L, 4, L, 1, 1, 2, 1, 1, True)]
    for no, px, cbi, kh, kw, sw, dh, dw, acc in dconvs:
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * cbi + 3
        xcb = ((kh - 1) * dh + 1) * xrow + 5
        name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, xcb, xrow, accumulate=acc, pixel_major=True)
        assert name.startswith("dconvap_" if acc else "dconvp_")
        src += micro_c(name, L) + (f"void w_{name}(int64_t ncb, const float* x, const float* w, float* c, "
                                   f"int64_t ldc) {{ dlcc_uk_{name}(ncb, x, w, c, ldc); }}\n")
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for geo in packs:
            cbi, h, w_, ph, pw, hp, wp, xw = geo
            name = nchwc_micro(*geo[:7], xw=xw)
            c_total = xw  # channels-last: a pixel's channels are xw apart from the next pixel's
            xh = w_ * xw
            x = rng.standard_normal(h * xh + c_total).astype(np.float32)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [ptr, i64, i64, i64, i64, i64, ptr]
            for nci, y0, y1 in ((cbi, 0, hp), (cbi - 2, 0, hp), (cbi, 1, hp - 1)):
                want = np.full(hp * wp * cbi + 3, 7.0, np.float32)
                MICRO[name].reference({"x": x, "ws": want}, {"x": 0, "ws": 0},
                                      {"xc": 1, "xh": xh, "nci": nci, "y0": y0, "rows": y1 - y0})
                got = np.full(hp * wp * cbi + 3, 7.0, np.float32)
                fn(x.ctypes.data_as(ptr), 1, xh, nci, y0, y1 - y0, got.ctypes.data_as(ptr))
                np.testing.assert_array_equal(got, want)
        for px, kh, kw, sw, dh, dw in dwcs:
            xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * L + 2 * L
            name = dwc_micro(L, px, kh, kw, sw, dh, dw, xrow, pixel_major=True)
            x = rng.standard_normal(((kh - 1) * dh + 1) * xrow).astype(np.float32)
            w = rng.standard_normal(kh * kw * L).astype(np.float32)
            want = np.full((px + 2) * L, 7.0, np.float32)
            MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, {"ldc": 0})
            got = np.full((px + 2) * L, 7.0, np.float32)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [ptr, ptr, ptr, i64]
            fn(x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), 0)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert (got[px * L:] == 7.0).all()
        for no, px, cbi, kh, kw, sw, dh, dw, acc in dconvs:
            xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * cbi + 3
            xcb = ((kh - 1) * dh + 1) * xrow + 5
            name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, xcb, xrow, accumulate=acc, pixel_major=True)
            ncb, ldc = 2, no + L  # (a pixel's row of the local buffer wider than the tile: the rest untouched)
            x = rng.standard_normal(ncb * xcb).astype(np.float32)
            w = rng.standard_normal(ncb * kh * kw * cbi * no).astype(np.float32)
            start = rng.standard_normal(px * ldc).astype(np.float32)
            want, got = start.copy(), start.copy()
            MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, {"ncb": ncb, "ldc": ldc})
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [i64, ptr, ptr, ptr, i64]
            fn(ncb, x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            assert (got.reshape(px, ldc)[:, no:] == start.reshape(px, ldc)[:, no:]).all()


def _w(rng, name, *shape):
    return onnx.numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                        name)


def _convnext(c=40, h=16, blocks=2, n=1, seed=0):
    """A ConvNeXt-style stack: a 4x4 stride-4 stem, LayerNorm in NHWC between two Transposes, then blocks of
    depthwise 7x7 -> NHWC -> LayerNorm -> Linear 4C -> GELU (erf) -> Linear C -> layer scale -> NCHW -> residual,
    then a 2x2 stride-2 downsample (LayerNorm first) and one more block, global average pool."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def ln(src, dst, ch, tag):
        inits.extend([onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(ch)).astype(np.float32), tag + "g"),
                      onnx.numpy_helper.from_array((0.1 * rng.standard_normal(ch)).astype(np.float32), tag + "b")])
        nodes.append(helper.make_node("LayerNormalization", [src, tag + "g", tag + "b"], [dst], axis=-1))

    def t(src, dst, perm):
        nodes.append(helper.make_node("Transpose", [src], [dst], perm=perm))

    def block(x, ch, tag):
        inits.extend([_w(rng, tag + "dw", ch, 1, 7, 7), _w(rng, tag + "db", ch), _w(rng, tag + "w1", ch, 4 * ch),
                      _w(rng, tag + "b1", 4 * ch), _w(rng, tag + "w2", 4 * ch, ch), _w(rng, tag + "b2", ch),
                      onnx.numpy_helper.from_array((0.5 + rng.random(ch)).astype(np.float32), tag + "ls"),
                      onnx.numpy_helper.from_array(np.array(2 ** -0.5, np.float32), tag + "r2"),
                      onnx.numpy_helper.from_array(np.array(1.0, np.float32), tag + "one"),
                      onnx.numpy_helper.from_array(np.array(0.5, np.float32), tag + "half")])
        nodes.append(helper.make_node("Conv", [x, tag + "dw", tag + "db"], [tag + "d"], kernel_shape=[7, 7],
                                      pads=[3] * 4, group=ch))
        t(tag + "d", tag + "nhwc", [0, 2, 3, 1])
        ln(tag + "nhwc", tag + "ln", ch, tag + "ln")
        nodes.extend([helper.make_node("MatMul", [tag + "ln", tag + "w1"], [tag + "m1"]),
                  helper.make_node("Add", [tag + "m1", tag + "b1"], [tag + "a1"]),
                  helper.make_node("Mul", [tag + "a1", tag + "r2"], [tag + "s"]),
                  helper.make_node("Erf", [tag + "s"], [tag + "e"]),
                  helper.make_node("Add", [tag + "e", tag + "one"], [tag + "e1"]),
                  helper.make_node("Mul", [tag + "a1", tag + "e1"], [tag + "g0"]),
                  helper.make_node("Mul", [tag + "g0", tag + "half"], [tag + "g"]),
                  helper.make_node("MatMul", [tag + "g", tag + "w2"], [tag + "m2"]),
                  helper.make_node("Add", [tag + "m2", tag + "b2"], [tag + "a2"]),
                  helper.make_node("Mul", [tag + "a2", tag + "ls"], [tag + "sc"])])
        t(tag + "sc", tag + "nchw", [0, 3, 1, 2])
        nodes.append(helper.make_node("Add", [x, tag + "nchw"], [tag + "out"]))
        return tag + "out"

    inits += [_w(rng, "stem_w", c, 3, 4, 4), _w(rng, "stem_b", c)]
    nodes.append(helper.make_node("Conv", ["x", "stem_w", "stem_b"], ["stem"], kernel_shape=[4, 4], strides=[4, 4]))
    t("stem", "stem_nhwc", [0, 2, 3, 1])
    ln("stem_nhwc", "stem_ln", c, "sln")
    t("stem_ln", "s0", [0, 3, 1, 2])
    x = "s0"
    for i in range(blocks):
        x = block(x, c, f"a{i}_")
    t(x, "ds_nhwc", [0, 2, 3, 1])
    ln("ds_nhwc", "ds_ln", c, "dln")
    t("ds_ln", "ds_nchw", [0, 3, 1, 2])
    inits += [_w(rng, "ds_w", 2 * c, c, 2, 2), _w(rng, "ds_b", 2 * c)]
    nodes.append(helper.make_node("Conv", ["ds_nchw", "ds_w", "ds_b"], ["s1"], kernel_shape=[2, 2], strides=[2, 2]))
    x = block("s1", 2 * c, "b0_")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["y"]))
    hw = 4 * h
    graph = helper.make_graph(nodes, "convnext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 2 * c, 1, 1])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return m, {"x": rng.standard_normal((n, 3, hw, hw)).astype(np.float32)}


def _ort(m, feeds):
    import onnxruntime as ort

    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


def _transposes(cm) -> int:
    """Steps that only transpose a buffer into another (a kernel of their own, or a step of a kernel with others)."""
    p = cm.artifacts.program
    rules = layouts._Layouts(p, get_target(), 1)
    return sum(1 for k in p.kernels for s in k.steps if rules.transpose_step(s) is not None)


def _plain(m, **kw):
    """``m`` compiled with every buffer as the graph has it: no layout assignment, no channel blocks
    (``schedule.blocked`` also blocks NCHW buffers between convolutions)."""
    orig = layouts.assign_layouts, blocked.BLOCKED
    try:
        layouts.assign_layouts = lambda *a, **k: 0
        blocked.BLOCKED = False
        return dlcc.compile(m, **kw)
    finally:
        layouts.assign_layouts, blocked.BLOCKED = orig


@pytest.mark.parametrize("c,h,n,threads", [(40, 16, 1, 1), (32, 14, 2, 2), (48, 8, 1, 2)])
def test_convnext_stack_channels_last(c, h, n, threads):
    """Every NCHW <-> NHWC Transpose kernel of the stack goes but the stem's (whose 4x4 stride-4 convolution
    writes NCHW for its NHWC LayerNorm... through the direct kernel's pixel-major form now: it goes too); the
    residual adds run in NHWC memory; outputs match onnxruntime and the interpreter; memory no larger."""
    m, feeds = _convnext(c, h, 2, n)
    ref = _ort(m, feeds)["y"]
    cm = dlcc.compile(m, threads=threads)
    plain = _plain(m, threads=threads)
    assert _transposes(plain) >= 6 and _transposes(cm) == 0
    src = cm.artifacts.csource.source
    assert "dlcc_uk_dwcp_" in src and "dlcc_uk_dconvp_" in src
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
    art = cm.artifacts
    assert_close(interpret(art.program, art.memory, feeds)["y"], ref, 1e-4, 1e-6)
    assert art.memory.arena_bytes <= plain.artifacts.memory.arena_bytes
    assert art.memory.arena_bytes <= 1.05 * art.memory.lower_bound + 64


def test_convnext_stack_every_target():
    m, feeds = _convnext(24, 8, 1, 1)
    ref = _ort(m, feeds)["y"]
    for target in runnable_targets():
        cm = dlcc.compile(m, target=target, threads=1)
        assert (_transposes(cm) == 0) == (get_target(target).lanes >= 4)
        assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)


def _nhwc_graph(kind="direct", out_nhwc=True, extra=None, n=1, c=24, h=12):
    """A graph kept in NHWC around one NCHW convolution (as channels-last frameworks export it): NHWC input ->
    Transpose -> Conv (+ Relu) -> Transpose -> NHWC output. ``kind``: "direct" (5x5 group 1), "depthwise" (3x3),
    "winograd" (3x3 group 1); ``extra``: a second reader of the NCHW input: "add" (a loop
    step) or "pool" (a MaxPool, which reads NCHW only)."""
    rng = np.random.default_rng(7)
    co = c if kind == "depthwise" else 2 * c
    group = c if kind == "depthwise" else 1
    k = 5 if kind == "direct" else 3
    inits = [_w(rng, "w", co, c // group, k, k), _w(rng, "b", co)]
    nodes = [helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xc", "w", "b"], ["y0"], kernel_shape=[k, k], pads=[k // 2] * 4, group=group),
             helper.make_node("Relu", ["y0"], ["y1"])]
    outs = []
    if out_nhwc:
        nodes.append(helper.make_node("Transpose", ["y1"], ["y"], perm=[0, 2, 3, 1]))
        outs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, h, h, co]))
    else:
        nodes.append(helper.make_node("Identity", ["y1"], ["y"]))
        outs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, co, h, h]))
    if extra == "add":
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal((c, 1, 1)).astype(np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["xc", "bias"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, c, h, h]))
    elif extra == "pool":
        nodes.append(helper.make_node("MaxPool", ["xc"], ["z"], kernel_shape=[2, 2], strides=[2, 2]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, c, h // 2, h // 2]))
    graph = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, h, h, c])],
                              outs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return m, {"x": rng.standard_normal((n, h, h, c)).astype(np.float32)}


@pytest.mark.parametrize("kind,out_nhwc,extra,transposes,threads", [
    ("direct", True, None, 0, 1),  # both Transposes go: the input read channels-last, the output written so
    ("direct", True, None, 0, 2),
    ("depthwise", True, None, 0, 2),
    ("direct", False, "add", 0, 1),  # a loop step reads the input channels-last too
    ("direct", True, "pool", 0, 1),  # a MaxPool on a narrow plane repacks its input (channel-blocked) too
    ("direct", True, "widepool", 1, 1),  # one on a plane wider than 32 (the plane kernel) reads NCHW: it stays
    ("winograd", True, None, 0, 1),  # the Winograd kernel's output transform stores pixel-major: both go
    ("winograd", True, None, 0, 2),
])
def test_nhwc_graph_around_a_convolution(kind, out_nhwc, extra, transposes, threads):
    big = kind == "winograd"
    h = 28 if big else 36 if extra == "widepool" else 12
    m, feeds = _nhwc_graph(kind, out_nhwc, "pool" if extra == "widepool" else extra, c=64 if big else 24, h=h)
    ref = _ort(m, feeds)
    cm = dlcc.compile(m, threads=threads)
    assert _transposes(cm) == transposes
    if kind == "winograd":
        assert "dlcc_uk_wgi_" in cm.artifacts.csource.source and "dlcc_uk_wgop_" in cm.artifacts.csource.source
    got = cm(feeds)
    art = cm.artifacts
    back = interpret(art.program, art.memory, feeds)
    for name, r in ref.items():
        assert_close(got[name], r, 1e-4, 1e-6)
        assert_close(back[name], r, 1e-4, 1e-6)


def _bottlenecks(c=64, h=28, blocks=2, n=1, seed=0):
    """ResNet bottlenecks (1x1 c -> c/4, 5x5 (direct, where a 3x3 could take Winograd), 1x1 -> c plus the
    residual, Relu; rows of at most 16 pixels, where every 1x1 convolution takes the direct kernel), then a global
    average pool."""
    rng = np.random.default_rng(seed)
    inits, nodes = [_w(rng, "stem_w", c, 3, 3, 3), _w(rng, "stem_b", c)], []
    nodes.append(helper.make_node("Conv", ["x", "stem_w", "stem_b"], ["s"], kernel_shape=[3, 3], pads=[1] * 4))
    nodes.append(helper.make_node("Relu", ["s"], ["x0"]))
    x, m = "x0", c // 4
    for i in range(blocks):
        t = f"b{i}_"
        inits += [_w(rng, t + "w1", m, c, 1, 1), _w(rng, t + "b1", m), _w(rng, t + "w2", m, m, 5, 5),
                  _w(rng, t + "b2", m), _w(rng, t + "w3", c, m, 1, 1), _w(rng, t + "b3", c)]
        nodes += [helper.make_node("Conv", [x, t + "w1", t + "b1"], [t + "c1"]),
                  helper.make_node("Relu", [t + "c1"], [t + "r1"]),
                  helper.make_node("Conv", [t + "r1", t + "w2", t + "b2"], [t + "c2"], kernel_shape=[5, 5],
                                   pads=[2] * 4),
                  helper.make_node("Relu", [t + "c2"], [t + "r2"]),
                  helper.make_node("Conv", [t + "r2", t + "w3", t + "b3"], [t + "c3"]),
                  helper.make_node("Add", [t + "c3", x], [t + "a"]),
                  helper.make_node("Relu", [t + "a"], [t + "out"])]
        x = t + "out"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["y"]))
    graph = helper.make_graph(nodes, "bottlenecks",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {
        "x": rng.standard_normal((n, 3, h, h)).astype(np.float32)}


def _channels_last(cm) -> int:
    """Buffers stored channels-last, or in channel blocks (``schedule.blocked``: channels-last ones it stored so)."""
    p = cm.artifacts.program
    return sum(1 for b in p.buffers.values() if len(b.shape) == 4 and b.shape[1] > 1
               and (b.strides == layouts.channels_last_strides(b.shape) or b.block))


@pytest.mark.parametrize("c,h,n,threads", [(128, 14, 1, 1), (128, 14, 2, 2), (256, 14, 1, 2), (48, 12, 1, 1),
                                           (256, 7, 1, 1)])
def test_bottleneck_trunk_channels_last(c, h, n, threads, monkeypatch):
    """Rule 4: the convolutions' outputs and the residual sums between them are channels-last, the last sum too,
    which the global pool reads pixel by pixel (``GLOBAL_POOL_CHANNELS_LAST``; without it that sum stays NCHW),
    in the channel blocks the convolutions read (``schedule.blocked``: the pool reads them in place too); outputs
    match onnxruntime and the interpreter."""
    m, feeds = _bottlenecks(c, h, 2, n)
    ref = _ort(m, feeds)["y"]

    def pool_reads_channels_last(cm) -> bool:
        p = cm.artifacts.program
        k = next(k for k in p.kernels if "GlobalAveragePool" in k.ops)
        x = p.buffers[p.value_buffer[k.steps[0].anchor.inputs[0]]]
        return layouts.is_channels_last(p.root(k.reads[0])) or x.block == cm.artifacts.target.lanes

    cm = dlcc.compile(m, threads=threads)
    assert _channels_last(cm) >= 3 and "dlcc_uk_dconvp_" in cm.artifacts.csource.source
    assert pool_reads_channels_last(cm)
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
    art = cm.artifacts
    assert_close(interpret(art.program, art.memory, feeds)["y"], ref, 1e-4, 1e-6)
    assert _channels_last(_plain(m, threads=threads)) == 0
    monkeypatch.setattr(layouts, "GLOBAL_POOL_CHANNELS_LAST", False)
    monkeypatch.setattr(blocked, "BLOCKED_WINDOWS", False)  # (else the NCHW sum is stored in blocks for the pool)
    off = dlcc.compile(m, threads=threads)
    assert not pool_reads_channels_last(off) and _channels_last(off) < _channels_last(cm)
    assert_close(off(feeds)["y"], ref, 1e-4, 1e-6)


def _dense_block(c=32, g=16, layers=3, h=14, seed=0, n=1):
    """DenseNet-style layers: BN (as Mul + Add) + Relu -> 1x1 -> BN + Relu -> 3x3 (5x5 here: direct) -> Concat
    with everything before, the next layer's BN over the Concat; then a 1x1 transition."""
    rng = np.random.default_rng(seed)
    inits, nodes = [_w(rng, "stem_w", c, 3, 3, 3)], []
    nodes.append(helper.make_node("Conv", ["x", "stem_w"], ["f0"], kernel_shape=[3, 3], pads=[1] * 4))
    feats, ch = "f0", c
    for i in range(layers):
        t = f"l{i}_"
        inits += [onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal((ch, 1, 1))).astype(np.float32), t + "s"),
                  onnx.numpy_helper.from_array((0.1 * rng.standard_normal((ch, 1, 1))).astype(np.float32), t + "b"),
                  _w(rng, t + "w1", 4 * g, ch, 1, 1), _w(rng, t + "w2", g, 4 * g, 5, 5)]
        nodes += [helper.make_node("Mul", [feats, t + "s"], [t + "m"]), helper.make_node("Add", [t + "m", t + "b"],
                                                                                          [t + "a"]),
                  helper.make_node("Relu", [t + "a"], [t + "r"]),
                  helper.make_node("Conv", [t + "r", t + "w1"], [t + "c1"]),
                  helper.make_node("Relu", [t + "c1"], [t + "r1"]),
                  helper.make_node("Conv", [t + "r1", t + "w2"], [t + "c2"], kernel_shape=[5, 5], pads=[2] * 4),
                  helper.make_node("Concat", [feats, t + "c2"], [t + "cat"], axis=1)]
        feats, ch = t + "cat", ch + g
    inits.append(_w(rng, "tw", c, ch, 1, 1))
    nodes.append(helper.make_node("Conv", [feats, "tw"], ["y"]))
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, h, h])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {
        "x": rng.standard_normal((n, 3, h, h)).astype(np.float32)}


@pytest.mark.parametrize("threads", [1, 2])
def test_dense_block_with_concats(threads):
    """Concats in the trunk: a loop step that picks each element's source by its channel is never written
    channels-last, and nothing reads an NCHW tensor in channels-last order; outputs match."""
    m, feeds = _dense_block()
    ref = _ort(m, feeds)["y"]
    cm = dlcc.compile(m, threads=threads)
    p = cm.artifacts.program
    for k in p.kernels:
        for s in k.steps:
            if s.kind == "loop" and s.outputs and s.outputs[0] in p.value_buffer:
                rules = layouts._Layouts(p, get_target(), 1)
                if not all(rules._elementwise(n) for n in rules._inlined(s.outputs[0])):
                    assert not rules.channels_last(p.root(p.value_buffer[s.outputs[0]]).id)
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
    art = cm.artifacts
    assert_close(interpret(art.program, art.memory, feeds)["y"], ref, 1e-4, 1e-6)


@pytest.mark.parametrize("n,threads", [(1, 1), (2, 2)])
def test_dense_block_concats_in_place(n, threads, monkeypatch):
    """DenseNet's chain of Concats, each taking the one before, which a BN + Relu step reads too: every Concat is
    done in place (``lower.CONCAT_SHARED``), each layer's features a slice of the last Concat's result that its
    convolution writes once, where each Concat copied all the earlier ones; no Concat step is left, and the arena is
    smaller. Outputs match onnxruntime on an arena of NaNs (batch 2: the slices' batch stride is the whole
    result's), and the interpreter."""
    m, feeds = _dense_block(n=n, seed=n)
    ref = _ort(m, feeds)["y"]
    cm = dlcc.compile(m, threads=threads)
    p = cm.artifacts.program

    def concat_steps(art) -> int:
        return sum(1 for k in art.program.kernels for s in k.steps for x in s.nodes if x.op_type == "Concat")

    assert concat_steps(cm.artifacts) == 0
    cats = [b for b in p.buffers.values() if b.name == "f0" or b.name.endswith("_cat")]
    assert len(cats) == 4 and len({p.root(b.id).id for b in cats}) == 1
    cm(feeds)
    cm._local.state[0][:] = 0xFF  # (the arena: NaN bytes)
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)
    monkeypatch.setattr(lower, "CONCAT_SHARED", False)
    off = dlcc.compile(m, threads=threads)
    assert concat_steps(off.artifacts) >= 1 and off.artifacts.memory.arena_bytes > cm.artifacts.memory.arena_bytes
    assert_close(off(feeds)["y"], ref, 1e-4, 1e-6)


def _stage(c=128, h=14, n=1, seed=0):
    """A ResNet stage's shapes on 16 registers (x86-64-v3): stem, a max pool too wide for the channel-blocked
    form (NCHW), a 1x1 reduction to c/4 channels (the pixels-by-channels GEMM from that NCHW input), a 3x3
    back to c (Winograd), a strided 1x1 to 2c plus a strided 1x1 projection of the pool (both GEMMs), the sum,
    Relu and an average pool over the plane."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "sw", c, 3, 3, 3), _w(rng, "sb", c), _w(rng, "w1", c // 4, c, 1, 1), _w(rng, "b1", c // 4),
             _w(rng, "w2", c, c // 4, 3, 3), _w(rng, "b2", c), _w(rng, "w3", 2 * c, c, 1, 1), _w(rng, "b3", 2 * c),
             _w(rng, "wp", 2 * c, c, 1, 1)]
    node = helper.make_node
    nodes = [node("Conv", ["x", "sw", "sb"], ["s0"], pads=[1] * 4), node("Relu", ["s0"], ["s1"]),
             node("MaxPool", ["s1"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             node("Conv", ["p", "w1", "b1"], ["c1"]), node("Relu", ["c1"], ["r1"]),
             node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4), node("Relu", ["c2"], ["r2"]),
             node("Conv", ["r2", "w3", "b3"], ["c3"], strides=[2, 2]),
             node("Conv", ["p", "wp"], ["pj"], strides=[2, 2]),
             node("Add", ["c3", "pj"], ["a"]), node("Relu", ["a"], ["o"]),
             node("AveragePool", ["o"], ["y"], kernel_shape=[h // 2, h // 2])]
    graph = helper.make_graph(nodes, "stage", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [n, 3, 2 * h, 2 * h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 2 * c, 1, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {
        "x": rng.standard_normal((n, 3, 2 * h, 2 * h)).astype(np.float32)}


@pytest.mark.parametrize("n,threads", [(1, 1), (2, 2)])
def test_stage_trunk_through_gemms_and_winograd(n, threads):
    """Rule 4 with the 1x1 GEMMs and Winograd: every buffer after the pool is channels-last (the GEMMs store
    pixel-major, reading the NCHW pool's output or a channels-last one, in place or gathered at the stride;
    Winograd's output transform keeps a pixel's channels together); outputs match onnxruntime and the
    interpreter. With the switches off, none of them is."""
    if not get_target("x86-64-v3").runs_here():
        pytest.skip("x86-64-v3 code does not run here")
    m, feeds = _stage(n=n)
    ref = _ort(m, feeds)["y"]
    cm = dlcc.compile(m, threads=threads, target="x86-64-v3")
    p = cm.artifacts.program
    convs = [k for k in p.kernels if k.nodes[0].op_type == "Conv"][1:]  # (after the stem)
    assert len(convs) == 4
    for k in convs:  # (channels-last, or the Winograd kernel's input in its channel blocks: ``schedule.blocked``)
        assert all(layouts.is_channels_last(p.root(b)) or p.buffers[b].block for b in k.writes
                   if len(p.buffers[b].shape) == 4)
    src = cm.artifacts.csource.source
    assert "dlcc_uk_wgop_" in src and "dlcc_uk_gemmt_" not in src
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
    art = cm.artifacts
    assert_close(interpret(art.program, art.memory, feeds)["y"], ref, 1e-4, 1e-6)
    saved = layouts.GEMM_CHANNELS_LAST, layouts.WINOGRAD_CHANNELS_LAST
    try:
        layouts.GEMM_CHANNELS_LAST = layouts.WINOGRAD_CHANNELS_LAST = False
        plain = dlcc.compile(m, threads=threads, target="x86-64-v3")
    finally:
        layouts.GEMM_CHANNELS_LAST, layouts.WINOGRAD_CHANNELS_LAST = saved
    assert _channels_last(plain) < _channels_last(cm)
    assert_close(plain(feeds)["y"], ref, 1e-4, 1e-6)
