"""A first convolution reading its NCHW input where it is (``schedule.direct.reads_nchw``): the register tile over
an NCHW block against its contract, the loop IR (every tap inside the input, checked by the verifier) against a
float64 convolution on each vector target, and whole models against onnxruntime with no repacked input."""

from __future__ import annotations

import ctypes
import re
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_lir import PRELUDE, _assert_tile, _build, _random_conv, _run_conv_ir

import dlcc
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.compiler import build_artifacts
from dlcc.lower.lir import MICRO, Buf, Layout, verify_func
from dlcc.lower.micro import DCONV_PAD, dconv_micro
from dlcc.schedule.direct import direct_func, nchw_pieces, pack_direct, plan_direct, reads_nchw
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.target import get_target
from dlcc.testing.harness import assert_close, ort_output, runnable_targets


@pytest.mark.parametrize("target", runnable_targets())
def test_nchw_tiles_match_their_contract(target):
    """dconv_ / dconvp_ over one block of 3 (or 1) NCHW channels, a plane apart, a row's pixels adjacent: strided,
    a kernel row skipped (``wskip``), two of three kernel columns (``kwf``), against the reference."""
    t = get_target(target)
    if t.lanes < 4:
        pytest.skip(f"{target}: one float per vector, the blocked direct kernel does not run")
    rng = np.random.default_rng(4)
    L = t.lanes
    tiles = [  # no, px, cbi, kh, kw, sw, dh, dw, wskip, kwf, pixel_major
        (2 * L, 5, 3, 3, 3, 2, 1, 1, 0, 3, False), (L, 4, 3, 2, 3, 1, 1, 1, 3 * 3 * L, 3, True),
        (L, 3, 1, 3, 2, 2, 2, 2, 0, 3, False), (2 * L, 1, 3, 3, 2, 2, 1, 1, 0, 3, True)]
    src = PRELUDE + vector_helpers(L) + "\n"
    cases = []
    for no, px, cbi, kh, kw, sw, dh, dw, wskip, kwf, pm in tiles:
        xrow = (px - 1) * sw + (kw - 1) * dw + 1 + 2
        xci = ((kh - 1) * dh + 1) * xrow + 3
        name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, cbi * xci, xrow, wskip, kwf=kwf, pixel_major=pm, xci=xci)
        assert name.endswith(f"_n{xci}")
        cases.append((name, no, px, cbi, kh, kwf, xci, wskip, pm))
        src += micro_c(name, L) + (f"void w_{name}(int64_t ncb, const float* x, const float* w, float* c, "
                                   f"int64_t ldc) {{ dlcc_uk_{name}(ncb, x, w, c, ldc); }}\n")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for name, no, px, cbi, kh, kwf, xci, wskip, pm in cases:
            x = rng.standard_normal(cbi * xci).astype(np.float32)
            w = rng.standard_normal(kh * kwf * cbi * no + wskip).astype(np.float32)
            ldc = no + 3 if pm else px + DCONV_PAD + 2
            size = px * ldc if pm else no * ldc
            want = np.full(size, 7.0, np.float32)
            MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, {"ncb": 1, "ldc": ldc})
            got = np.full(size, 7.0, np.float32)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [i64, ptr, ptr, ptr, i64]
            fn(1, x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc)
            _assert_tile(got, want, pm, no, ldc, px, atol=1e-4)


def test_row_pieces_cover_every_tap_inside_once():
    """``nchw_pieces``: per chunk, a first tile over all its pixels, then added tiles; every (pixel, kernel column)
    reaching inside the input covered exactly once, none outside; ResNet's 7x7 stem: its edge chunks of 14 pixels
    in 3 and 2 tiles of 12 to 14 pixels, its middle chunks one tile of the whole kernel."""
    for g in (ConvGeometry(3, 224, 224, 112, 112, 7, 7, 2, 2, 1, 1, 3, 3),
              ConvGeometry(3, 57, 57, 29, 29, 3, 3, 2, 2, 1, 1, 1, 1),
              ConvGeometry(1, 9, 10, 9, 10, 3, 3, 1, 1, 2, 2, 2, 2),
              ConvGeometry(3, 20, 11, 20, 11, 5, 5, 1, 1, 1, 1, 2, 2)):
        for px in (14, 6, 5):
            pieces = nchw_pieces(g, px)
            seen = np.zeros((g.ow, g.kw), int)
            for chunk in pieces:
                assert not chunk[0][4] and all(c[4] for c in chunk[1:])
                assert all(chunk[0][0] <= c[0] < c[1] <= chunk[0][1] for c in chunk)
                for x0, x1, j0, j1, _ in chunk:
                    seen[x0:x1, j0:j1] += 1
            want = np.array([[int(0 <= ox * g.sw + j * g.dw - g.pw < g.w) for j in range(g.kw)] for ox in range(g.ow)])
            np.testing.assert_array_equal(seen, want)
    r50 = nchw_pieces(ConvGeometry(3, 224, 224, 112, 112, 7, 7, 2, 2, 1, 1, 3, 3), 14)
    assert [[c[1] - c[0] for c in ch] for ch in (r50[0], r50[-1])] == [[14, 12, 13], [14, 13]]
    assert all(ch == [(ch[0][0], ch[0][0] + 14, 0, 7, False)] for ch in r50[1:-1])


CASES = [  # n, ci, h, w, co, k, stride, dilation, pad, threads
    (1, 3, 16, 16, 32, 3, 2, 1, 1, 1),  # MobileNet's stem: the first row and column lose a kernel row / column
    (2, 3, 15, 17, 40, 3, 2, 1, 1, 2),  # odd sizes (the last column and row reach the padding too), two images
    (1, 3, 12, 30, 24, 3, 1, 1, 1, 2),  # stride 1: every border, two pixel tiles per row and a tail
    (1, 1, 9, 10, 16, 3, 1, 2, 2, 1),  # one channel, dilation 2
    (1, 4, 8, 9, 16, 2, 1, 1, 0, 1),  # 2x2 unpadded: one segment each way
    (1, 3, 30, 31, 32, 7, 2, 1, 3, 2),  # ResNet's 7x7 stem: edge chunks as a tile and added ones, both sides
    (1, 3, 20, 11, 16, 5, 1, 1, 2, 1),  # 5x5 stride 1 on 11 columns: one chunk reaching both edges
    (1, 3, 5, 4, 16, 2, 1, 1, 1, 1),  # 2x2 padded on 4 columns: no kernel column every pixel reaches (exact segments)
]


@pytest.mark.parametrize("target,n,ci,h,w,co,k,s,d,pad,threads",
                         [(t, *c) for t in ("x86-64-v4", "x86-64-v3", "aarch64") for c in CASES])
def test_loop_ir_matches_numpy(target, n, ci, h, w, co, k, s, d, pad, threads):
    """The plan reads the NCHW input in place (no workspace); the verifier proves every tap of every tile inside
    the input; interpreted, the outputs match a float64 convolution, each handed to the epilogue once."""
    t = get_target(target)
    x, wt, ref, g = _random_conv(9, n, ci, h, w, co, k, s, d, pad)
    strides = (ci * h * w, h * w, w, 1)
    assert reads_nchw(g, strides, t.lanes)
    p = plan_direct(co, g, n, t, threads, strides)
    assert p.nchw and not p.flat and p.workspace_floats == 0
    wpk = pack_direct(wt, p)
    f = direct_func(p, Buf("x", "float32", Layout.strided((n, ci, h, w))),
                    Buf("wp", "float32", Layout.strided(wpk.shape)),
                    Buf("c", "float32", Layout.strided((n, co, g.oh * g.ow))),
                    Buf("ws", "float32", Layout.strided((1,)), "workspace"))
    verify_func(f)
    assert not f.workspace
    out, seen = _run_conv_ir(f, x, "wp", wpk, (n, co, g.oh * g.ow), 1)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


def test_only_first_convolutions_read_nchw():
    """A few channels with taps, one block (3x3 and 7x7 stems): yes; more channels than NCHW_MAX_CI, a 1x1, or a
    channels-last input: no."""
    t = get_target("x86-64-v4")
    g = ConvGeometry(3, 224, 224, 112, 112, 3, 3, 2, 2, 1, 1, 1, 1)
    nchw = (3 * 224 * 224, 224 * 224, 224, 1)
    assert reads_nchw(g, nchw, t.lanes) and not reads_nchw(g, None, t.lanes)
    assert reads_nchw(ConvGeometry(3, 224, 224, 112, 112, 7, 7, 2, 2, 1, 1, 3, 3), nchw, t.lanes)
    assert not reads_nchw(ConvGeometry(16, 56, 56, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1), (16 * 3136, 3136, 56, 1), 16)
    assert not reads_nchw(ConvGeometry(3, 56, 56, 56, 56, 1, 1, 1, 1, 1, 1, 0, 0), (3 * 3136, 3136, 56, 1), 16)
    assert not reads_nchw(g, (3 * 224 * 224, 1, 224 * 3, 3), t.lanes)
    # (padding past the kernel: border outputs would read only the padding, which the repacked copy holds)
    assert not reads_nchw(ConvGeometry(3, 4, 4, 8, 8, 3, 3, 1, 1, 1, 1, 3, 3), (48, 16, 4, 1), t.lanes)
    assert nchw_pieces(ConvGeometry(3, 5, 4, 6, 5, 2, 2, 1, 1, 1, 1, 1, 1), 14) is None


def _stem(k=3, s=2, c=32, h=64, n=1, seed=0):
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array((rng.standard_normal((c, 3, k, k)) / np.sqrt(3 * k * k)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")
    oh = (h + 2 * (k // 2) - k) // s + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["a"], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4),
             helper.make_node("Relu", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, oh, oh])], [w, b])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return m, {"x": rng.standard_normal((n, 3, h, h)).astype(np.float32)}


def _repacks(src: str) -> bool:
    """Does the C repack a 3-channel input (``nchwc_3_...``)?"""
    return any(u.startswith("nchwc_3_") for u in re.findall(r"static void dlcc_uk_(\w+)\(", src))


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("k,s,h,n,threads", [(3, 2, 64, 1, 1), (3, 2, 57, 2, 2), (3, 1, 40, 1, 2), (7, 2, 64, 1, 1)])
def test_stem_matches_onnxruntime(target, k, s, h, n, threads):
    """Against onnxruntime on each target the machine runs: the stems read the image where it is (no repacking,
    no workspace)."""
    t = get_target(target)
    m, feeds = _stem(k, s, 32, h, n)
    cm = dlcc.compile(m, target=t, threads=threads)
    assert_close(cm(feeds)["y"], ort_output(m, feeds), 1e-4, 1e-6)
    if t.lanes >= 4:
        assert not _repacks(cm.artifacts.csource.source)
        assert cm.artifacts.program.kernels[0].steps[0].workspace is None


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3", "aarch64"])
def test_stem_plan_on_any_machine(target):
    """Built (not run) for each vector target: MobileNet's 3x3 stem at 224 x 224 reads the image in place, and the
    arena loses the repacked copy."""
    import dlcc.schedule.direct as direct

    m, _ = _stem(3, 2, 32, 224)
    art = build_artifacts(m, target=get_target(target), threads=2)
    assert not _repacks(art.csource.source) and art.program.kernels[0].steps[0].workspace is None
    orig = direct.NCHW_INPUT
    try:
        direct.NCHW_INPUT = False
        plain = build_artifacts(m, target=get_target(target), threads=2)
    finally:
        direct.NCHW_INPUT = orig
    assert _repacks(plain.csource.source)
    assert art.memory.arena_bytes < plain.memory.arena_bytes
