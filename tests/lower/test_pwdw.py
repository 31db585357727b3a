"""A 1x1 convolution fused into the depthwise convolution that reads it (``schedule.pwdw``): the loop IR against
numpy on every target's plan (bands, rows carried from band to band, both thread splits, partial groups of
blocks), the ``gemmq_`` micro-kernel against its contract, the kernel merge, and whole blocks against
onnxruntime."""

from __future__ import annotations

import ctypes
import dataclasses
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_lir import PRELUDE, _build, _conv_ref

import dlcc
import dlcc.schedule.pwdw as pwdw
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.lower.interp import interpret
from dlcc.lower.lir import MICRO, Buf, Layout, run_func, verify_func
from dlcc.lower.micro import apply_post, gemmq_micro, post_tag
from dlcc.schedule.dwconv import pack_dwc
from dlcc.schedule.gemm import ConvGeometry, register_tile
from dlcc.schedule.pwdw import pack_bias, pack_pw, plan_pwdw, pwdw_func
from dlcc.schedule.target import get_target
from dlcc.testing.harness import assert_close, ort_output, runnable_targets

# (images, 1x1 input channels, channels, H, W, kernel, stride, pad, dilation, plan overrides)
CASES = [
    (1, 5, 20, 14, 14, 3, 1, 1, 1, {}),
    (1, 5, 20, 14, 14, 3, 1, 1, 1, {"band": 2}),  # four bands: two rows carried each time
    (2, 5, 40, 16, 16, 3, 2, 1, 1, {"band": 2, "threads": 2, "by_rows": True}),  # stride 2, threads over rows
    (1, 3, 40, 15, 15, 3, 1, 1, 1, {"band": 3, "threads": 2, "by_rows": False}),  # threads over groups, one partial
    (1, 3, 40, 15, 15, 3, 1, 1, 1, {"band": 3, "threads": 2, "by_rows": True}),
    (1, 6, 20, 15, 15, 5, 1, 2, 1, {"band": 4, "threads": 2, "by_rows": True}),  # 5x5: four rows carried
    (1, 6, 20, 15, 15, 3, 1, 2, 2, {"band": 4}),  # dilated
    (1, 4, 20, 15, 15, 1, 2, 0, 1, {"band": 2}),  # 1x1 taps at stride 2: nothing carried
    (1, 5, 20, 7, 7, 3, 1, 1, 1, {}),  # rows narrower than the register tile: the flat form
    (2, 5, 40, 7, 7, 5, 1, 2, 1, {"threads": 2}),  # (two images, 5x5, threads over groups, a partial group)
    (1, 5, 40, 9, 9, 3, 2, 1, 1, {}),  # (stride 2: the last input row is read by no tap)
]


def _ref(x, wpw, bias, wdw, kh, s, pad, dil):
    e = np.clip(np.einsum("nkhw,ck->nchw", x.astype(np.float64), wpw) + bias[None, :, None, None], 0, 6)
    return np.concatenate([_conv_ref(e[:, i:i + 1], wdw[i].reshape(1, 1, kh, kh).astype(np.float64), (s, s),
                                     (dil, dil), (pad, pad)) for i in range(wpw.shape[0])], 1)


@pytest.mark.parametrize("target,n,k,c,h,w,kh,s,pad,dil,over,regs",
                         [(t, *case, False) for t in ("x86-64-v4", "x86-64-v3", "aarch64") for case in CASES]
                         + [("x86-64-v4", *case, True) for case in CASES[:8]])
def test_pwdw_loop_ir_matches_numpy(target, n, k, c, h, w, kh, s, pad, dil, over, regs):
    """``regs``: the 1x1 convolution's bias and Clip applied in its tiles' registers (``gemmqe_``), no producer
    epilogue."""
    oh = (h + 2 * pad - (kh - 1) * dil - 1) // s + 1
    g = ConvGeometry(c, h, w, oh, oh, kh, kh, s, s, dil, dil, pad, pad)
    p = plan_pwdw(g, k, n, get_target(target), 1)
    p = dataclasses.replace(p, **over)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, k, h, w)).astype(np.float32)
    wpw, bias = rng.standard_normal((c, k)).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    wdw = rng.standard_normal((c, kh * kh)).astype(np.float32)
    wpb, wdb = pack_pw(wpw, p), pack_dwc(wdw, p)
    xl = Layout.strided((n, k, h * w) if p.flat else x.shape)
    f = pwdw_func(p, Buf("x", "float32", xl), Buf("wpw", "float32", Layout.strided(wpb.shape)),
                  Buf("wdw", "float32", Layout.strided(wdb.shape)),
                  Buf("c", "float32", Layout.strided((n, c, oh * oh))),
                  Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"), not regs, True,
                  post=(Buf("bias", "float32", Layout.strided((p.ncb * p.cbi,))), post_tag("clip", 0.0, 6.0))
                  if regs else None)
    verify_func(f)
    assert ("gemmqe_" in repr(f.body)) == regs
    out = np.full((n, c, oh * oh), np.nan, np.float32)
    seen = []

    def epilogue(i, v):
        seen.append(i)
        out[i] = v

    run_func(f, {"x": x.ravel().copy(), "wpw": wpb, "wdw": wdb.ravel(), "c": np.zeros(out.size, np.float32),
                 "bias": pack_bias(bias, p)}, epilogue,
             producer=lambda i, v: np.float32(min(max(v + bias[i[1]], 0), 6)))
    ref = _ref(x, wpw, bias, wdw, kh, s, pad, dil)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)
    assert len(seen) == len(set(seen)) == out.size  # every output handed to the epilogue once


def test_plan_choices():
    t = get_target("x86-64-v4")

    def g(c, h, kh=3, s=1):
        return ConvGeometry(c, h, h, (h - 1) // s + 1, (h - 1) // s + 1, kh, kh, s, s, 1, 1, kh // 2, kh // 2)

    assert plan_pwdw(g(960, 7), 160, 1, t).flat  # rows narrower than the register tile: along the plane
    assert plan_pwdw(g(960, 7), 160, 1, t, rows_contiguous=False) is None  # (which needs contiguous rows)
    assert not plan_pwdw(g(960, 14), 160, 1, t).flat
    scalar = dataclasses.replace(get_target("generic"), vector_bytes=4)
    assert plan_pwdw(g(96, 112, s=2), 16, 1, scalar) is None  # one channel per vector
    p = plan_pwdw(g(96, 112, s=2), 16, 1, t, 2)
    assert (p.nv, p.mr, p.threads, p.by_rows) == (2, 14, 2, True)  # 3 groups of 2 blocks: by rows
    assert 4 * p.workspace_floats <= t.l2_bytes
    p = plan_pwdw(g(672, 14, kh=5), 112, 1, t, 2)  # 21 groups: 11 of them beat 7 + 4 rows
    assert (p.threads, p.by_rows) == (2, False)


@pytest.mark.parametrize("target", runnable_targets())
def test_gemmq_micro_kernel_matches_its_contract(target):
    t = get_target(target)
    if t.lanes < 4:
        pytest.skip(f"{target}: one float per vector, the fused kernel does not run")
    rng = np.random.default_rng(9)
    lda, kc, ldq = 37, 29, 5 * t.lanes * 3 + 7
    names = [gemmq_micro(5, 2 * t.lanes, lda, t.lanes), gemmq_micro(3, t.lanes, lda, t.lanes)]
    src = PRELUDE + vector_helpers(t.lanes) + "\n" + "".join(micro_c(n, t.lanes) for n in names)
    src += "".join(f"void w{i}(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t ldq) "
                   f"{{ dlcc_uk_{n}(kc, a, b, c, ldc, ldq); }}\n" for i, n in enumerate(names))
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for i, (name, nr) in enumerate(zip(names, (2 * t.lanes, t.lanes), strict=True)):
            a = rng.standard_normal(kc * lda).astype(np.float32)
            b = rng.standard_normal(kc * nr).astype(np.float32)
            want, got = (np.full(2 * ldq + 5 * t.lanes, 7.0, np.float32) for _ in range(2))
            MICRO[name].reference({"a": a, "b": b, "c": want}, {"a": 0, "b": 0, "c": 0},
                                  {"kc": kc, "ldc": t.lanes, "ldq": ldq})
            fn = getattr(lib, f"w{i}")
            fn.argtypes = [i64, ptr, ptr, ptr, i64, i64]
            fn(kc, a.ctypes.data_as(ptr), b.ctypes.data_as(ptr), got.ctypes.data_as(ptr), t.lanes, ldq)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            assert (got[5 * t.lanes:ldq] == 7.0).all()  # nothing between the blocks


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("kind,lo,hi", [("none", None, None), ("relu", None, None), ("clip", 0.0, 6.0),
                                        ("clip", -1.5, 2.25)])
def test_gemmqe_applies_bias_and_activation_in_registers(target, kind, lo, hi):
    """``gemmqe_``: the tile plus a bias per column, then ReLU or Clip, before the store; against its reference,
    and that against the elementwise chain's semantics: a NaN passes, -0 stays -0 under ReLU, Clip's bounds
    replace values equal to them."""
    t = get_target(target)
    if t.lanes < 4:
        pytest.skip(f"{target}: one float per vector, the fused kernel does not run")
    rng = np.random.default_rng(10)
    lda, kc, ldq, mr, nr = 11, 7, 2 * t.lanes * 4 + 3, 4, 2 * t.lanes
    tag = post_tag(kind, lo, hi)
    name = gemmq_micro(mr, nr, lda, t.lanes, tag)
    src = PRELUDE + vector_helpers(t.lanes) + "\n" + micro_c(name, t.lanes)
    src += (f"void w(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t ldq, const float* bias)"
            f" {{ dlcc_uk_{name}(kc, a, b, c, ldc, ldq, bias); }}\n")
    a = rng.standard_normal(kc * lda).astype(np.float32)
    a[:mr] = [np.nan, 0.0, 1e30, -1e30]  # k = 0: rows of NaN, zero, +inf and -inf products (b's row 0 is 1)
    b = rng.standard_normal(kc * nr).astype(np.float32)
    b[:nr] = 1.0
    a[lda:lda + mr] = 0.0
    bias = rng.standard_normal(nr).astype(np.float32) * 3
    bias[0] = -0.0
    want, got = (np.full(2 * ldq, 7.0, np.float32) for _ in range(2))
    MICRO[name].reference({"a": a, "b": b, "c": want, "bias": bias}, {"a": 0, "b": 0, "c": 0, "bias": 0},
                          {"kc": kc, "ldc": t.lanes, "ldq": ldq})
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    with tempfile.TemporaryDirectory() as tmp:
        fn = _build(src, tmp, t).w
        fn.argtypes = [i64, ptr, ptr, ptr, i64, i64, ptr]
        fn(kc, *(v.ctypes.data_as(ptr) for v in (a, b, got)), t.lanes, ldq, bias.ctypes.data_as(ptr))
    finite = np.isfinite(want) & (np.abs(want) < 1e29)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-4)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()
    assert np.array_equal(got[~finite & ~np.isnan(got)], want[~finite & ~np.isnan(want)])
    x = np.array([np.nan, -0.0, 0.0, -2.0, 7.0, -1.5, 2.25], np.float32)  # (dlcc_relu, dlcc_max, dlcc_min)
    chain = {"none": x, "relu": np.where(x < 0, 0, x)}.get(kind)
    if kind == "clip":
        chain = np.where(x <= lo, np.float32(lo), x)
        chain = np.where(chain >= hi, np.float32(hi), chain)
    assert np.array_equal(apply_post(x, tag).view(np.uint32)[1:], np.asarray(chain, np.float32).view(np.uint32)[1:])


def _block(n=1, k=16, c=40, h=28, w=28, kh=3, s=1, act="Clip", extra_reader=False, seed=0):
    """An inverted-residual block's expand (1x1) -> depthwise -> project (1x1), the activation after each of the
    first two; ``extra_reader``: the expand's result is a second output too."""
    rng = np.random.default_rng(seed)

    def w_(name, *shape):
        return onnx.numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)

    inits = [w_("we", c, k, 1, 1), w_("be", c), w_("wd", c, 1, kh, kh), w_("bd", c), w_("wp", 8, c, 1, 1)]
    inits += [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0), ("hi", 6))]

    def act_(src, dst):
        if act == "Clip":
            return [helper.make_node("Clip", [src, "lo", "hi"], [dst])]
        return [helper.make_node("Sigmoid", [src], [dst + "_s"]), helper.make_node("Mul", [src, dst + "_s"], [dst])]

    nodes = [helper.make_node("Conv", ["x", "we", "be"], ["e"]), *act_("e", "ea"),
             helper.make_node("Conv", ["ea", "wd", "bd"], ["d"], kernel_shape=[kh, kh], strides=[s, s],
                              pads=[kh // 2] * 4, group=c), *act_("d", "da"),
             helper.make_node("Conv", ["da", "wp"], ["y"])]
    oh = (h - 1) // s + 1
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 8, oh, oh])]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("ea", TensorProto.FLOAT, [n, c, h, w]))
    graph = helper.make_graph(nodes, "b", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, k, h, w])], outs,
                              inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return m, {"x": rng.standard_normal((n, k, h, w)).astype(np.float32)}


def _fused(cm) -> list:
    """The fused steps of a compiled model (or of its artifacts)."""
    art = getattr(cm, "artifacts", cm)
    return [s for kk in art.program.kernels for s in kk.steps if s.producer is not None]


def _unfused(build):
    """``build()`` with the 1x1 -> depthwise merge switched off."""
    orig = pwdw.fuse_pointwise_depthwise
    try:
        pwdw.fuse_pointwise_depthwise = lambda *a, **kw: 0
        return build()
    finally:
        pwdw.fuse_pointwise_depthwise = orig


@pytest.mark.parametrize("n,k,c,h,kh,s,act,threads", [
    (1, 16, 96, 56, 3, 2, "Clip", 2),  # MobileNetV2's second block, halved: stride 2, threads over rows
    (1, 24, 144, 28, 3, 1, "Clip", 1),
    (2, 20, 40, 17, 5, 1, "Silu", 2),  # two images, 5x5, a partial group of blocks, SiLU (EfficientNet)
    (1, 40, 240, 14, 5, 1, "Silu", 2),  # threads over groups
    (1, 32, 160, 7, 3, 1, "Clip", 2),  # 7 x 7: the flat form
])
def test_fused_block_matches_onnxruntime(n, k, c, h, kh, s, act, threads):
    m, feeds = _block(n, k, c, h, h, kh, s, act)
    ref = ort_output(m, feeds)
    v4 = get_target("x86-64-v4")  # (the cases are AVX-512's; AVX2 does not fuse the pairs on 7- and 14-wide rows)
    target = v4 if v4.runs_here() else get_target("native")
    cm = dlcc.compile(m, threads=threads, target=target)
    plan = pwdw.plan_pwdw(ConvGeometry(c, h, h, (h - 1) // s + 1, (h - 1) // s + 1, kh, kh, s, s, 1, 1, kh // 2,
                                       kh // 2), k, n, target, threads)
    if plan is None or not pwdw.pair_pays(plan, target):
        assert not _fused(cm)
        assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
        return
    src = cm.artifacts.csource.source
    assert len(_fused(cm)) == 1 and "dlcc_uk_gemmq" in src
    # the expand's bias and Clip in the 1x1 tiles' registers (not for SiLU, nor in the flat form of planes
    # narrower than the register tile: 7 x 7 on AVX-512, not on AVX2's 6 rows)
    flat = h < register_tile(target)[1]
    assert ("dlcc_uk_gemmqe_" in src) == (act == "Clip" and not flat)
    assert len(cm.artifacts.program.kernels) == 2
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)
    art = cm.artifacts
    assert_close(interpret(art.program, art.memory, feeds)["y"], ref, 1e-4, 1e-6)
    # the expanded tensor has no buffer: the arena is below the unfused one's (the flat form's scratch holds it,
    # as the unfused tensor did: a 7 x 7 plane's worth, beside the ring buffers; the unfused projection reads the
    # depthwise output where it is, channels-last, so the flat form's per-thread scratch may exceed it by 8%)
    plain = _unfused(lambda: dlcc.compile(m, threads=threads, target=target))
    assert not _fused(plain) and len(plain.artifacts.program.kernels) == 3
    # the pair stores its result in the unfused depthwise kernel's layout (channels-last: pixel-major depthwise tiles)
    assert _fused(cm)[0].channels_last == plain.artifacts.program.kernels[1].steps[0].channels_last
    assert art.memory.arena_bytes < plain.artifacts.memory.arena_bytes * (1.1 if h < 14 else 1.0)
    assert art.memory.arena_bytes <= 1.05 * art.memory.lower_bound + 64


@pytest.mark.parametrize("n,k,c,h,kh,s,act,threads", [
    (1, 40, 240, 14, 5, 1, "Silu", 2),  # rows as wide as the register tile, threads over groups
    (1, 32, 160, 7, 3, 1, "Clip", 2),  # the flat form
    (1, 24, 144, 28, 3, 1, "Clip", 1),
])
def test_fused_block_plan_for_avx512_on_any_machine(n, k, c, h, kh, s, act, threads):
    """The AVX-512 plan of the fused pair, built (not run) whatever the machine: its arena is below the unfused
    pair's and its result is in the unfused depthwise kernel's layout (on AVX-512 the pair fuses on 14- and 7-wide
    rows; its result was NCHW there while the unfused depthwise stored channels-last, the projection then
    repacking it in a workspace larger than the expanded tensor it saved: this failed on AVX-512 machines only)."""
    from dlcc.compiler import build_artifacts

    m, _ = _block(n, k, c, h, h, kh, s, act)
    v4 = get_target("x86-64-v4")
    art = build_artifacts(m, target=v4, threads=threads)
    plain = _unfused(lambda: build_artifacts(m, target=v4, threads=threads))
    fused = _fused(art)
    assert len(fused) == 1 and len(plain.program.kernels) == 3
    assert fused[0].channels_last == plain.program.kernels[1].steps[0].channels_last
    assert art.memory.arena_bytes < plain.memory.arena_bytes * (1.1 if h < 14 else 1.0)


def test_fused_block_every_target():
    m, feeds = _block(1, 8, 40, 15, 15, 3, 1, "Clip")
    ref = ort_output(m, feeds)
    for target in runnable_targets():
        cm = dlcc.compile(m, target=target, threads=1)
        assert len(_fused(cm)) == (1 if get_target(target).lanes >= 4 else 0)
        assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)


def test_not_fused_where_the_expanded_tensor_is_read_again():
    m, feeds = _block(extra_reader=True)  # the expand's activation is a graph output too
    cm = dlcc.compile(m, threads=1)
    assert not _fused(cm)
    got, ref = cm(feeds), dict(zip(["y", "ea"], _ort_all(m, feeds), strict=True))
    for name in ref:
        assert_close(got[name], ref[name], 1e-4, 1e-6)


def _ort_all(m, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
