"""The blocked direct convolution (``schedule.direct``): its loop IR verified and interpreted against a float64
convolution, and its two micro-kernels (the register tile ``dconv_``, the repacking ``nchwc_``) in C
against their contracts on every target this machine runs."""

import ctypes
import dataclasses
import re
import tempfile

import numpy as np
import pytest
from test_lir import PRELUDE, _build, _conv_ref, _random_conv, _run_conv_ir

from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.lower.lir import MICRO, Buf, Layout, print_func, verify_func
from dlcc.lower.micro import DCONV_PAD, dconv_micro, dwc_micro, nchwc_micro
from dlcc.schedule.direct import direct_func, flat_tiles, pack_direct, plan_direct, reads_in_place
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.target import get_target
from dlcc.testing.harness import runnable_targets

CASES = [  # n, ci, h, w, co, k, stride, dilation, pad, threads
    (1, 3, 9, 8, 20, 3, 1, 1, 1, 1),  # fewer input channels than a vector: one short block
    (2, 20, 7, 7, 40, 3, 2, 1, 1, 2),  # a partial input block, batch, stride
    (1, 17, 10, 9, 33, 3, 1, 2, 2, 2),  # dilation, an output-channel tile past the channels
    (1, 16, 16, 30, 64, 3, 1, 1, 1, 2),  # two pixel tiles per row and a tail, threads over rows
    (1, 16, 30, 28, 64, 3, 1, 1, 1, 2),  # threads over rows, each thread's 15 in bands of 13 and 2
    (1, 3, 23, 21, 32, 3, 2, 1, 1, 2),  # one input block, two threads: the block's rows repacked in two halves
    (1, 3, 11, 11, 8, 5, 2, 1, 2, 1),  # 5x5 stride 2
    (3, 16, 32, 32, 32, 3, 2, 1, 0, 2),  # unpadded stride 2: the last input column is never read
    (1, 32, 7, 7, 96, 3, 1, 1, 1, 2),  # 7-wide rows: 4-vector tiles, threads over channel tiles
    (1, 40, 14, 14, 48, 1, 1, 1, 0, 2),  # 1x1 on a small plane
    (1, 24, 13, 13, 40, 1, 2, 1, 0, 1),  # strided 1x1
    (1, 16, 20, 20, 32, 3, 1, 8, 8, 2),  # dilation 8 on 20 columns: row and column segments of 2, 3, 2 taps
    (1, 16, 8, 8, 32, 3, 1, 12, 12, 1),  # dilation past the plane: only the centre tap reaches it, no zero ring
    (1, 16, 4, 4, 16, 3, 1, 1, 5, 1),  # padding past the kernel: border outputs read only the ring (kept)
    (1, 24, 14, 14, 40, 3, 2, 1, 1, 2),  # 16 registers: flat tiles over the 7 x 7 plane (4 of 6 pixels, 5 of 5)
    (2, 16, 9, 7, 16, 3, 1, 2, 2, 1),  # 16 registers: flat tiles with dilation along the row, two images
]


# a 20 KiB L1 and a 128 KiB L2 on AVX2: a channel tile's weights (117 input channels, 15 blocks, x 9 taps x 16: 68
# KiB) beyond half of L2, in passes of 2 blocks (9 KiB: half of L1 at most), the last pass one (partial) block
SMALL_L1 = dataclasses.replace(get_target("x86-64-v3"), l1d_bytes=20 * 1024, l2_bytes=128 * 1024)
# a smaller L2, so that a channel tile's weights (256 input channels x 9 taps x 32) exceed half of it while its
# 24x24 plane is too large for the "plane" order: the input channels in chunks of 7 blocks (7, 7, 2)
SMALL_L2 = dataclasses.replace(get_target("x86-64-v4"), l2_bytes=512 * 1024)
# and a small L3, so that the input (692 KB repacked) and the weights (590 KB) exceed half of it: the "sweep" order,
# chunks of 6 input blocks outside (6, 6, 4), each channel tile's plane in the workspace
SMALL_L3 = dataclasses.replace(SMALL_L2, l3_bytes=1 << 20)


@pytest.mark.parametrize("target,n,ci,h,w,co,k,s,d,pad,threads",
                         [(t, *c) for t in ("x86-64-v4", "x86-64-v3", "aarch64") for c in CASES]
                         + [(SMALL_L2, 1, 256, 24, 24, 64, 3, 1, 1, 1, 2),
                            (SMALL_L3, 1, 256, 24, 24, 64, 3, 1, 1, 1, 2),
                            (SMALL_L3, 2, 256, 24, 24, 40, 3, 1, 1, 1, 1),
                            (SMALL_L3, 1, 256, 24, 24, 64, 3, 1, 5, 5, 2),  # (dilation: segments)
                            (SMALL_L1, 1, 117, 7, 7, 48, 3, 1, 1, 1, 2),  # L1 passes of flat tiles, prefetching
                            (SMALL_L1, 2, 117, 14, 14, 48, 3, 2, 1, 1, 1),  # ... strided, two images
                            (SMALL_L1, 1, 117, 4, 50, 32, 3, 1, 1, 1, 2),  # ... of a plane's rows, a tail tile
                            (SMALL_L1, 1, 117, 6, 48, 48, 3, 1, 1, 1, 2)])  # ... of the rows' tiles, per segment
def test_direct_conv_loop_ir_matches_numpy(target, n, ci, h, w, co, k, s, d, pad, threads):
    x, wt, ref, g = _random_conv(11, n, ci, h, w, co, k, s, d, pad)
    p = plan_direct(co, g, n, get_target(target), threads)
    if target == "x86-64-v3" and (ci, h, w) in ((24, 14, 14), (16, 9, 7)):
        assert p.flat and p.order == "plane"
    assert p.order == {id(SMALL_L2): "chunks", id(SMALL_L3): "sweep"}.get(
        id(target), p.order if p.order not in ("chunks", "sweep") else "")
    assert (p.kchunk == 2) == (target is SMALL_L1)
    wpk = pack_direct(wt, p)
    f = direct_func(p, Buf("x", "float32", Layout.strided((n, ci, h, w))),
                    Buf("wp", "float32", Layout.strided(wpk.shape)),
                    Buf("c", "float32", Layout.strided((n, co, g.oh * g.ow))),
                    Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"))
    verify_func(f)  # (the prefetched lines inside the packed weight too)
    # channel tiles outside: each call prefetches a share of the next tile's weights
    assert bool(re.search(r"dconvp?_\w*_f\d+\(", print_func(f))) == (p.order in ("plane", "oc") and p.n_oct > 1)
    out, seen = _run_conv_ir(f, x, "wp", wpk, (n, co, g.oh * g.ow), p.workspace_floats)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size  # every output handed to the epilogue once


def test_direct_plan_chunks_the_input_channels_when_a_tiles_weights_exceed_l2():
    g = ConvGeometry(1024, 28, 28, 28, 28, 3, 3, 1, 1, 12, 12, 12, 12)  # DeepLab's ASPP branch (half), dilation 12
    v4 = dataclasses.replace(get_target("x86-64-v4"), l3_bytes=32 << 20)
    p = plan_direct(256, g, 1, v4, 2)
    assert p.order == "chunks" and 1 <= p.chunk < p.ncb and p.threads == 2
    assert 4 * p.chunk * p.cbi * 9 * p.no <= v4.l2_bytes // 4
    # at 2048 channels the input (6.4 MB) and the weights (19 MB) outgrow half of L3: chunks of the input outside
    p = plan_direct(256, dataclasses.replace(g, ci=2048), 1, v4, 2)
    assert p.order == "sweep" and 1 <= p.chunk < p.ncb and p.threads == 2
    assert 4 * p.chunk * p.cbi * p.hp * p.wp <= v4.l2_bytes // 2
    assert p.workspace_floats == p.input_floats + 256 * (28 * 28 + DCONV_PAD)
    # every tap its row and column segments keep is inside the input: blocks of the input's size, no zero ring
    assert (p.rh, p.rw, p.hp, p.wp) == (0, 0, 28, 28) and p.input_floats == 2048 * 28 * 28
    small = plan_direct(64, ConvGeometry(64, 56, 56, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1), 1, get_target("x86-64-v4"), 2)
    assert small.order != "chunks" and small.chunk == small.ncb


def test_direct_plan_passes_over_input_blocks_whose_weights_stay_in_l1():
    """A channel tile's weights beyond half of L2: its row's (plane's) tiles in passes over input blocks whose
    weights fill at most half of L1, as even as they go; not for 1x1s, smaller weights, passes over fewer than 8
    register tiles, or 32 registers."""
    v3 = dataclasses.replace(get_target("x86-64-v3"), l2_bytes=512 * 1024)  # (Zen 3's L2)
    g7 = ConvGeometry(512, 7, 7, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1)  # ResNet-50's last stage: 288 KiB per tile
    p = plan_direct(512, g7, 1, v3, 2)
    assert p.flat and p.kchunk == 3 and 4 * p.kchunk * p.cbi * 9 * p.no <= v3.l1d_bytes // 2
    assert plan_direct(512, g7, 1, dataclasses.replace(v3, l2_bytes=1 << 20), 2).kchunk == 0  # (within half of L2)
    assert plan_direct(512, g7, 1, get_target("x86-64-v4"), 2).kchunk == 0
    g14 = ConvGeometry(117, 14, 14, 14, 14, 3, 3, 1, 1, 1, 1, 1, 1)  # 15 blocks: passes of 2, 2, ..., 1
    assert plan_direct(48, g14, 1, SMALL_L1).kchunk == 2
    assert plan_direct(48, dataclasses.replace(g14, ci=96), 1, SMALL_L1).kchunk == 0  # 54 KiB: within half of L2
    g20 = ConvGeometry(117, 20, 20, 20, 20, 3, 3, 1, 1, 1, 1, 1, 1)  # rows of 4 tiles: too few per pass
    assert plan_direct(48, g20, 1, SMALL_L1).kchunk == 0
    g1 = ConvGeometry(2048, 7, 7, 7, 7, 1, 1, 1, 1, 1, 1, 0, 0)
    assert plan_direct(512, g1, 1, v3).kchunk == 0  # (a 1x1: measured slower at 2 threads)


def test_direct_plan_takes_a_wider_plane_for_kernels_with_taps():
    """A 128-channel 3x3 strided into 28 x 28 (a 50 KB tile plane) takes the "plane" order and flat tiles where its
    tile's weights stay in half of L2; a 1x1 with that plane, or weights beyond half of L2, keep the 48 KB bound."""
    v3 = dataclasses.replace(get_target("x86-64-v3"), l2_bytes=512 * 1024)  # (Zen 3's L2)
    g = ConvGeometry(128, 56, 56, 28, 28, 3, 3, 2, 2, 1, 1, 1, 1)
    p = plan_direct(128, g, 1, v3, 2)
    assert (p.order, p.flat, p.no) == ("plane", True, 16) and 4 * p.no * 28 * 28 > 48 * 1024
    assert plan_direct(128, dataclasses.replace(g, ci=512), 1, v3).order != "plane"  # 288 KB of tile weights
    g1 = ConvGeometry(512, 28, 28, 28, 28, 1, 1, 1, 1, 1, 1, 0, 0)
    assert plan_direct(128, g1, 1, v3, 1).order != "plane"


def test_direct_plan_tiles_and_order():
    v4, v3 = get_target("x86-64-v4"), get_target("x86-64-v3")
    g56 = ConvGeometry(64, 56, 56, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1)
    p = plan_direct(64, g56, 1, v4, 2)
    assert (p.no, p.px, p.cbi, p.order, p.threads) == (32, 14, 16, "rows", 2)  # 28 accumulators
    assert (p.rh, p.rw, p.hp, p.wp) == (1, 1, 58, 58)  # the padding's zero ring
    assert (plan_direct(64, g56, 1, v3).no, plan_direct(64, g56, 1, v3).px) == (16, 6)  # 12 of 16 registers
    g7 = ConvGeometry(512, 7, 7, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1)
    p = plan_direct(512, g7, 1, v4, 2)
    assert (p.no, p.px, p.order, p.threads) == (32, 7, "plane", 2)  # channel tiles outside, each a 7x7 plane
    assert not p.flat  # (32 registers: its tiles fill the rows)
    # 16 registers: 2 x 6 tiles along the 49 pixels as one row (4 of 6 pixels, 5 of 5), not 1 x 7 along the rows
    p = plan_direct(512, g7, 1, v3, 2)
    assert (p.no, p.px, p.order, p.flat, flat_tiles(49, 6)) == (16, 6, "plane", True, (9, 4, 5))
    assert not plan_direct(64, g56, 1, v3).flat  # (56-wide rows, "rows" order: a row at a time)
    assert not plan_direct(512, g7, 1, dataclasses.replace(v3, vector_registers=32)).flat
    # (2 x 7 tiles, 16 of them: 8 per thread; see test_threads_split_channel_tiles_evenly)


@pytest.mark.parametrize("target", runnable_targets())
def test_direct_micro_kernels_match_their_contracts(target):
    t = get_target(target)
    rng = np.random.default_rng(12)
    tiles = [(2 * t.lanes, 5, t.lanes, 3, 3, 1, 1, 1, 0), (t.lanes, 3, 3, 2, 5, 2, 1, 2, 0),
             (t.lanes, 4, t.lanes, 1, 3, 1, 2, 1, 2 * 3 * t.lanes * t.lanes)]  # one of 3 kernel rows: 2 skipped
    kwf_tiles = [(2 * t.lanes, 3, 3, 2, 2, 1, 1, 2, 3 * 5, False),  # 2 of a 5-wide kernel's columns, a row skipped
                 (t.lanes, 5, t.lanes, 3, 3, 1, 1, 1, 3, True)]  # added to c (a later chunk of input blocks)
    packs = [(t.lanes, 5, 6, 1, 2, 7, 9), (3, 6, 7, 0, 0, 5, 6),  # rows shorter than a vector
             (t.lanes, 3, 37, 1, 1, 5, 39), (3, 4, 40, 1, 1, 6, 42), (2, 3, 35, 0, 2, 3, 37), (1, 2, 33, 1, 0, 4, 33)]
    src = PRELUDE + vector_helpers(t.lanes) + "\n"
    names = []
    for no, px, cbi, kh, kw, sw, dh, dw, wskip in tiles:
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * cbi + 3
        xcb = ((kh - 1) * dh + 1) * xrow + 5
        name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, xcb, xrow, wskip)
        names.append(("dconv", name, (no, px, cbi, kh, kw, xcb, wskip)))
        src += micro_c(name, t.lanes) + (f"void w_{name}(int64_t ncb, const float* x, const float* w, float* c, "
                                         f"int64_t ldc) {{ dlcc_uk_{name}(ncb, x, w, c, ldc); }}\n")
    for no, px, cbi, kh, kw, sw, dh, dw, kwf, accumulate in kwf_tiles:
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * cbi + 3
        xcb = ((kh - 1) * dh + 1) * xrow + 5
        wskip = kwf * cbi * no  # (the packed kernel has kh + 1 rows)
        name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, xcb, xrow, wskip, kwf=kwf, accumulate=accumulate)
        assert name.endswith(f"_{kwf}") == (kwf != kw) and name.startswith("dconva_") == accumulate
        names.append(("dconv", name, (no, px, cbi, kh, kwf, xcb, wskip)))
        src += micro_c(name, t.lanes) + (f"void w_{name}(int64_t ncb, const float* x, const float* w, float* c, "
                                         f"int64_t ldc) {{ dlcc_uk_{name}(ncb, x, w, c, ldc); }}\n")
    for no, px, cbi, kh, kw, sw, dh, dw, wskip in tiles[:2]:  # prefetching the next tile's weights: the same values
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * cbi + 3
        xcb = ((kh - 1) * dh + 1) * xrow + 5
        name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, xcb, xrow, wskip, prefetch=1)
        assert name.endswith("_f1") and MICRO[name].params[-1] == ("pf", "in")
        names.append(("dconv", name, (no, px, cbi, kh, kw, xcb, wskip)))
        src += micro_c(name, t.lanes) + (f"void w_{name}(int64_t ncb, const float* x, const float* w, float* c, "
                                         f"int64_t ldc) {{ dlcc_uk_{name}(ncb, x, w, c, ldc, w); }}\n")
    for geo in packs:
        name = nchwc_micro(*geo)
        names.append(("nchwc", name, geo))
        src += micro_c(name, t.lanes) + (f"void w_{name}(const float* x, int64_t xc, int64_t xh, int64_t nci, "
                                         f"int64_t y0, int64_t rows, float* ws) "
                                         f"{{ dlcc_uk_{name}(x, xc, xh, nci, y0, rows, ws); }}\n")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for kind, name, geo in names:
            fn = getattr(lib, f"w_{name}")
            if kind == "dconv":
                no, px, cbi, kh, kw, xcb, wskip = geo
                ncb = 2
                x = rng.standard_normal(ncb * xcb).astype(np.float32)
                w = rng.standard_normal(ncb * (kh * kw * cbi * no + wskip)).astype(np.float32)
                ldc = px + DCONV_PAD + 2
                want = np.full(ldc * no, 7.0, np.float32)
                MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, {"ncb": ncb, "ldc": ldc})
                got = np.full(ldc * no, 7.0, np.float32)
                fn.argtypes = [i64, ptr, ptr, ptr, i64]
                fn(ncb, x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc)
                got, want = got.reshape(no, ldc), want.reshape(no, ldc)
                np.testing.assert_allclose(got[:, :px], want[:, :px], rtol=1e-5, atol=1e-4)
                assert (got[:, px + DCONV_PAD:] == 7.0).all()  # beyond the pad: untouched
            else:
                cbi, h, w_, ph, pw, hp, wp = geo
                xc, xh = h * (w_ + 2) + 1, w_ + 2
                x = rng.standard_normal(cbi * xc).astype(np.float32)
                for nci, y0, y1 in ((cbi, 0, hp), (max(1, cbi - 2), 0, hp), (cbi, 1, hp - 1)):  # a band of rows
                    want = np.full(hp * wp * cbi + 3, 7.0, np.float32)
                    MICRO[name].reference({"x": x, "ws": want}, {"x": 0, "ws": 0},
                                          {"xc": xc, "xh": xh, "nci": nci, "y0": y0, "rows": y1 - y0})
                    got = np.full(hp * wp * cbi + 3, 7.0, np.float32)
                    fn.argtypes = [ptr, i64, i64, i64, i64, i64, ptr]
                    fn(x.ctypes.data_as(ptr), xc, xh, nci, y0, y1 - y0, got.ctypes.data_as(ptr))
                    np.testing.assert_array_equal(got, want)
                    assert (got[(y1 - y0) * wp * cbi:] == 7.0).all()  # nothing past the rows written


@pytest.mark.parametrize("target", runnable_targets())
def test_flat_direct_tiles_match_their_contract(target):
    """dconv_..._q{ow}_{rowstep}: a tile's pixels q0 .. q0 + px - 1 of a plane taken as one row, crossing output
    rows (q0 = 3 on rows of 4), with a stride, a dilation along the row, a prefetch, accumulation and pixel-major
    stores, against the contract's reference; nothing beyond the tile written."""
    t = get_target(target)
    rng = np.random.default_rng(13)
    L = t.lanes
    cases = [  # no, px, kh, kw, sw, dh, dw, ow, q0, accumulate, pixel_major, prefetch
        (2 * L, 6, 3, 3, 1, 1, 1, 4, 3, False, False, 0),
        (2 * L, 5, 3, 3, 2, 1, 1, 7, 5, False, True, 2),
        (L, 4, 3, 2, 1, 2, 2, 3, 2, True, False, 0),
        (L, 7, 1, 1, 1, 1, 1, 5, 0, True, True, 1),
    ]
    src = PRELUDE + vector_helpers(L) + "\n"
    built = []
    for no, px, kh, kw, sw, dh, dw, ow, q0, acc, pm, pf in cases:
        cbi = L
        rows = (q0 + px - 1) // ow + 1  # output rows the tile reaches
        xrow = ((ow - 1) * sw + (kw - 1) * dw + 1) * cbi + 3
        xcb = ((rows - 1) * sw + (kh - 1) * dh + 1) * xrow + 5
        name = dconv_micro(no, px, cbi, kh, kw, sw, dh, dw, xcb, xrow, accumulate=acc, pixel_major=pm, prefetch=pf,
                           flat=(ow, sw * xrow))
        assert f"_q{ow}_{sw * xrow}" in name and [n for n, _ in MICRO[name].params][5] == "q0"
        fp = f"{name}(ncb, x, w, c, ldc, q0{', w' if pf else ''})"
        src += micro_c(name, L) + (f"void w_{name}(int64_t ncb, const float* x, const float* w, float* c, "
                                   f"int64_t ldc, int64_t q0) {{ dlcc_uk_{fp}; }}\n")
        built.append((name, no, px, cbi, kh, kw, xcb, q0, pm))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for name, no, px, cbi, kh, kw, xcb, q0, pm in built:
            ncb = 2
            x = rng.standard_normal(ncb * xcb).astype(np.float32)
            w = rng.standard_normal(ncb * kh * kw * cbi * no).astype(np.float32)
            ldc = max(px + DCONV_PAD, no) + 2
            size = (px if pm else no) * ldc
            scal = {"ncb": ncb, "ldc": ldc, "q0": q0}
            fpx = MICRO[name].footprint(scal)["x"]
            assert fpx[2] <= x.size  # (the contract's reach: what the buffer was sized for)
            want = rng.standard_normal(size).astype(np.float32)
            got = want.copy()
            MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, scal)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [i64, ptr, ptr, ptr, i64, i64]
            before = got.copy()
            fn(ncb, x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc, q0)
            mask = np.zeros(size, bool)
            for o in range(no):
                for q in range(px):
                    mask[q * ldc + o if pm else o * ldc + q] = True
            np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-4)
            if pm:
                assert (got[~mask] == before[~mask]).all()  # (pixel-major: only the tile's elements)
            else:
                rest = np.ones((no, ldc), bool)
                rest[:, :px + DCONV_PAD] = False
                assert (got.reshape(no, ldc)[rest] == before.reshape(no, ldc)[rest]).all()


@pytest.mark.parametrize("target", runnable_targets())
def test_depthwise_tile_matches_its_contract(target):
    """dwc_...: cbi (= lanes) channels x px pixels of one output row, strides and dilations, against the
    contract's reference; the row beyond px + DCONV_PAD untouched."""
    t = get_target(target)
    if t.lanes < 4:
        pytest.skip(f"{target}: one float per vector, the plane kernel runs instead")
    rng = np.random.default_rng(5)
    cbi = t.lanes
    tiles = [(14, 3, 3, 1, 1, 1), (5, 5, 5, 2, 1, 1), (16, 3, 3, 1, 2, 2), (3, 7, 7, 1, 1, 1)]
    src = PRELUDE + vector_helpers(t.lanes) + "\n"
    names = []
    for px, kh, kw, sw, dh, dw in tiles:
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * cbi + 2 * cbi
        name = dwc_micro(cbi, px, kh, kw, sw, dh, dw, xrow)
        names.append((name, px, kh, kw, dh, xrow))
        src += micro_c(name, t.lanes) + (f"void w_{name}(const float* x, const float* w, float* c, int64_t ldc) "
                                         f"{{ dlcc_uk_{name}(x, w, c, ldc); }}\n")
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for name, px, kh, kw, dh, xrow in names:
            x = rng.standard_normal(((kh - 1) * dh + 1) * xrow).astype(np.float32)
            w = rng.standard_normal(kh * kw * cbi).astype(np.float32)
            ldc = px + DCONV_PAD + 3
            want = np.full(ldc * cbi, 7.0, np.float32)
            MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, {"ldc": ldc})
            got = np.full(ldc * cbi, 7.0, np.float32)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [ptr, ptr, ptr, i64]
            fn(x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc)
            got, want = got.reshape(cbi, ldc), want.reshape(cbi, ldc)
            np.testing.assert_allclose(got[:, :px], want[:, :px], rtol=1e-5, atol=1e-5)
            assert (got[:, px + DCONV_PAD:] == 7.0).all()


@pytest.mark.parametrize("ci,h,s,k,batch,threads", [
    (144, 20, 1, 3, 1, 2),  # 9 blocks over 2 threads: each block's rows in two parts (9 + 9 half blocks)
    (144, 21, 2, 3, 2, 2),  # stride 2, two images, an odd plane
    (40, 30, 1, 5, 1, 2),  # 3 blocks (the last partial), 5x5
    (64, 24, 1, 3, 1, 2),  # 4 blocks: whole blocks
    (48, 9, 1, 3, 1, 1),  # one thread
])
def test_blocked_depthwise_loop_ir_matches_numpy(ci, h, s, k, batch, threads):
    from dlcc.schedule.dwconv import dwc_func, pack_dwc, plan_dwc

    rng = np.random.default_rng(21)
    pad = k // 2
    x = rng.standard_normal((batch, ci, h, h)).astype(np.float32)
    wt = rng.standard_normal((ci, 1, k, k)).astype(np.float32)
    ref = np.concatenate([_conv_ref(x[:, i:i + 1], wt[i:i + 1], (s, s), (1, 1), (pad, pad)) for i in range(ci)], axis=1)
    oh = ref.shape[2]
    g = ConvGeometry(ci, h, h, oh, oh, k, k, s, s, 1, 1, pad, pad)
    p = plan_dwc(g, batch, get_target("x86-64-v4"), threads)
    assert p.threads == threads and p.splits == (2 if threads == 2 and p.ncb % 2 else 1)
    wp = pack_dwc(wt.reshape(ci, -1), p)
    f = dwc_func(p, Buf("x", "float32", Layout.strided(x.shape)), Buf("wp", "float32", Layout.strided(wp.shape)),
                 Buf("c", "float32", Layout.strided((batch, ci, oh * oh))),
                 Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"), True)
    verify_func(f)
    out, seen = _run_conv_ir(f, x, "wp", wp, (batch, ci, oh * oh), p.workspace_floats)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


@pytest.mark.parametrize("ci,h,s,threads,channels_last,l2k", [
    (32, 64, 1, 1, True, 256),  # MobileNetV2's first depthwise, scaled to a 256 KiB L2: 8 parts of 8 rows
    (32, 64, 1, 2, False, 256),  # two threads: a part count they divide, each thread its half of the rows
    (20, 41, 2, 1, True, 128),  # stride 2, an odd plane, a partial last block: 6 parts of 4 rows
])
def test_blocked_depthwise_rows_outer(ci, h, s, threads, channels_last, l2k):
    """A depthwise convolution whose input outgrows half of L2 runs in parts of output rows outermost and the
    channel blocks inside each (``DwcPlan.rows_outer``): every part's input rows are read from memory once, not
    once per block, and each block repacks only the rows its part reads; results as numpy's, every output
    once. Channels-last inputs (a pixel's channels contiguous) are where that pays most."""
    from dlcc.schedule.dwconv import dwc_func, pack_dwc, plan_dwc

    rng = np.random.default_rng(22)
    x = rng.standard_normal((1, ci, h, h)).astype(np.float32)
    wt = rng.standard_normal((ci, 1, 3, 3)).astype(np.float32)
    ref = np.concatenate([_conv_ref(x[:, i:i + 1], wt[i:i + 1], (s, s), (1, 1), (1, 1)) for i in range(ci)], axis=1)
    oh = ref.shape[2]
    g = ConvGeometry(ci, h, h, oh, oh, 3, 3, s, s, 1, 1, 1, 1)
    tg = dataclasses.replace(get_target("x86-64-v3"), l2_bytes=l2k * 1024)
    p = plan_dwc(g, 1, tg, threads)
    assert p.rows_outer and p.splits > 1 and p.splits % threads == 0 and oh >= 2 * p.splits
    assert not plan_dwc(g, 1, get_target("x86-64-v3"), threads).rows_outer  # (the input fits half of 1 MiB)
    assert p.workspace_floats < threads * p.hp * p.wp * p.cbi  # (a part's rows only)
    # 7x7 on ConvNeXt's 96 channels at 56 x 56: parts whose input fits would repack twice their rows
    convnext = ConvGeometry(96, 56, 56, 56, 56, 7, 7, 1, 1, 1, 1, 3, 3)
    assert not plan_dwc(convnext, 1, dataclasses.replace(tg, l2_bytes=512 * 1024), threads).rows_outer
    wp = pack_dwc(wt.reshape(ci, -1), p)
    strides = (h * h * ci, 1, h * ci, ci) if channels_last else None
    f = dwc_func(p, Buf("x", "float32", Layout.strided(x.shape, strides)),
                 Buf("wp", "float32", Layout.strided(wp.shape)), Buf("c", "float32", Layout.strided((1, ci, oh * oh))),
                 Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"), True)
    verify_func(f)
    out, seen = _run_conv_ir(f, x.transpose(0, 2, 3, 1) if channels_last else x, "wp", wp, (1, ci, oh * oh),
                             p.workspace_floats)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


@pytest.mark.parametrize("threads", [1, 2])
def test_aspp_head_compiled_without_zero_rings(threads):
    """A DeepLabV3 head (ASPP dilations 12, 24 and 36 on a 28 x 28 plane, 64 input channels, two images): the
    dilated convolutions keep only taps inside the input, so their repacked blocks hold no zero ring (the
    workspace is the input's size, not 52 x 52 or 100 x 100 per block); the one at dilation 36 reaches the input
    with its centre tap only and is a 1x1 Conv by then (the graph rule conv-unreached-taps); outputs match
    onnxruntime."""
    import onnxruntime as ort

    import dlcc
    from dlcc.testing.harness import assert_close
    from dlcc.testing.models import deeplabv3_head

    m = deeplabv3_head(batch=2, in_channels=64, seed=3)
    x = np.random.default_rng(4).standard_normal((2, 64, 28, 28)).astype(np.float32)
    name = m.graph.input[0].name
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {name: x})[0]
    cm = dlcc.compile(m, threads=threads)
    assert_close(list(cm({name: x}).values())[0], ref, 1e-4, 1e-6)
    p = cm.artifacts.program
    spaces = [p.buffers[s.workspace].size for k in p.kernels for s in k.steps
              if s.workspace is not None and s.anchor is not None and s.anchor.op_type == "Conv"
              and any(a.name == "dilations" and max(a.value) >= 12 for a in s.anchor.attributes.values())]
    assert len(spaces) == 2 and max(spaces) <= 2 * 64 * 28 * 28
    convs = [s.anchor for k in p.kernels for s in k.steps if s.anchor is not None and s.anchor.op_type == "Conv"]
    assert sum(1 for n in convs if list(n.inputs[1].shape[2:]) == [1, 1]) == 4  # (3 in the model, and dilation 36)


@pytest.mark.parametrize("target,n,ci,h,w,co,s,threads,small_l2", [
    ("x86-64-v4", 2, 32, 9, 11, 40, 1, 2, False),  # two images, a channel tile past the channels, threads
    ("x86-64-v4", 1, 48, 13, 13, 64, 2, 1, False),  # strided: every other pixel and row read where it is
    ("x86-64-v3", 1, 16, 7, 7, 72, 1, 2, False),
    ("aarch64", 1, 8, 6, 10, 24, 2, 2, False),
    ("x86-64-v4", 1, 1056, 20, 20, 32, 1, 1, True),  # input channels in chunks, the later ones added
])
def test_direct_conv_reads_a_channels_last_input_in_place(target, n, ci, h, w, co, s, threads, small_l2):
    """A 1x1 unpadded convolution whose input is channels-last (pixels a whole number of channel blocks apart)
    runs without the repacking phase and without workspace (``reads_in_place``), with the same results."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
    ref = _conv_ref(x, wt, (s, s), (1, 1), (0, 0))
    oh, ow = ref.shape[2:]
    g = ConvGeometry(ci, h, w, oh, ow, 1, 1, s, s, 1, 1, 0, 0)
    tg = dataclasses.replace(SMALL_L2, l2_bytes=256 * 1024) if small_l2 else get_target(target)
    nhwc = (h * w * ci, 1, w * ci, ci)
    p = plan_direct(co, g, n, tg, threads, nhwc)
    assert p.in_place and p.workspace_floats == 0 and (p.order == "chunks") == small_l2
    assert not plan_direct(co, g, n, tg, threads, (ci * h * w, h * w, w, 1)).in_place  # NCHW: repacked
    wpk = pack_direct(wt, p)
    f = direct_func(p, Buf("x", "float32", Layout.strided((n, ci, h, w), nhwc)),
                    Buf("wp", "float32", Layout.strided(wpk.shape)),
                    Buf("c", "float32", Layout.strided((n, co, oh * ow))), None)
    verify_func(f)
    assert not f.workspace and "nchwc_" not in repr(f.body)
    out, seen = _run_conv_ir(f, x.transpose(0, 2, 3, 1), "wp", wpk, (n, co, oh * ow), 1)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


def test_in_place_needs_whole_channel_blocks_and_no_4k_aliasing():
    v4 = get_target("x86-64-v4")
    g = ConvGeometry(512, 28, 28, 28, 28, 1, 1, 1, 1, 1, 1, 0, 0)
    assert reads_in_place(g, (28 * 28 * 512, 1, 28 * 512, 512), v4.lanes)
    strided = dataclasses.replace(g, oh=14, ow=14, sh=2, sw=2)  # pixels read 2 x 512 floats = 4 KiB apart
    assert not reads_in_place(strided, (28 * 28 * 512, 1, 28 * 512, 512), v4.lanes)
    assert not reads_in_place(dataclasses.replace(g, ci=24), (28 * 28 * 24, 1, 28 * 24, 24), v4.lanes)
    assert not reads_in_place(dataclasses.replace(g, kh=3, kw=3, ph=1, pw=1), (28 * 28 * 512, 1, 28 * 512, 512),
                              v4.lanes)


@pytest.mark.parametrize("threads", [1, 2])
def test_bottleneck_reads_channels_last_in_place(threads):
    """A ResNet bottleneck's 1x1 convolutions after a 3x3 one that writes channels-last: compiled, the 1x1
    convolution's step declares no workspace, and the outputs match onnxruntime. (The last one strided where the
    target has 32 vector registers; on 16, a strided 1x1 convolution is a GEMM: ``direct_pays``.)"""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import dlcc
    from dlcc.testing.harness import assert_close

    rng = np.random.default_rng(5)
    v4 = get_target("x86-64-v4")  # (else this machine's: AVX2 reads 8-channel blocks in place just as well)
    target = v4 if v4.runs_here() else get_target("native")
    stride = 2 if target.vector_registers >= 32 else 1

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"]), helper.make_node("Relu", ["c"], ["d"]),
             helper.make_node("Conv", ["d", "w3"], ["e"], strides=[stride, stride]),
             helper.make_node("Relu", ["e"], ["y"])]
    g = helper.make_graph(nodes, "bottleneck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [w("w1", 128, 64, 3, 3), w("w2", 96, 128, 1, 1), w("w3", 64, 96, 1, 1)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 64, 14, 14)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cm = dlcc.compile(onnx.shape_inference.infer_shapes(m), threads=threads, target=target)
    p = cm.artifacts.program
    pointwise = [s for k in p.kernels for s in k.steps if s.anchor is not None and s.anchor.op_type == "Conv"
                 and s.anchor.inputs[1].name in ("w2", "w3")]
    in_place = [s for s in pointwise if s.workspace is None]
    assert in_place, "no 1x1 convolution reads its channels-last input in place"
    assert_close(cm({"x": x})["y"], ref, 1e-4, 1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_mobilenet_stem_depthwise_rows_outer_compiled(threads):
    """MobileNetV2's stem at full size (3 -> 32 channels 3x3 stride 2 to 112 x 112, ReLU6, depthwise 3x3, ReLU6,
    1x1 to 16): the depthwise convolution's 1.6 MB input outgrows half of L2, so it runs in parts of rows with
    the channel blocks inside (``DwcPlan.rows_outer``) and its workspace holds one part's rows; outputs match
    onnxruntime."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import dlcc
    from dlcc.schedule.dwconv import plan_dwc
    from dlcc.testing.harness import assert_close

    rng = np.random.default_rng(6)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c"], pads=[1, 1, 1, 1], group=32),
             helper.make_node("Clip", ["c", "lo", "hi"], ["d"]),
             helper.make_node("Conv", ["d", "w3"], ["y"])]
    lo, hi = (numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0)))
    g = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [w("w1", 32, 3, 3, 3), w("w2", 32, 1, 3, 3), w("w3", 16, 32, 1, 1), lo, hi])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cm = dlcc.compile(onnx.shape_inference.infer_shapes(m), threads=threads)
    target = cm.artifacts.target
    plan = plan_dwc(ConvGeometry(32, 112, 112, 112, 112, 3, 3, 1, 1, 1, 1, 1, 1), 1, target, threads)
    if target.lanes >= 4 and target.l2_bytes < 8 * 32 * 112 * 112:  # (the input: more than half of L2)
        assert plan.rows_outer and plan.workspace_floats < threads * plan.hp * plan.wp * plan.cbi
    assert_close(cm({"x": x})["y"], ref, 1e-4, 1e-6)


def test_threads_split_channel_tiles_evenly():
    """512 output channels at 7 x 7: 3 x 7 tiles (11 channel tiles) at 1 thread; at 2, 2 x 7 ones (16 tiles,
    8 per thread) rather than 6 + 5 tiles; 224 channels (5 or 7 tiles, odd either way) keep the 3-vector tile."""
    v4 = get_target("x86-64-v4")
    g = ConvGeometry(512, 7, 7, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1)
    one, two = plan_direct(512, g, 1, v4, 1), plan_direct(512, g, 1, v4, 2)
    assert (one.no, one.px, one.n_oct) == (48, 7, 11)
    assert (two.no, two.px, two.n_oct, two.threads) == (32, 7, 16, 2) and two.order != "rows"
    odd = plan_direct(224, dataclasses.replace(g, ci=224), 1, v4, 2)
    assert odd.no == 48 and odd.n_oct == 5


@pytest.mark.parametrize("threads", [1, 2])
def test_sweep_order_compiled_matches_onnxruntime(threads):
    """A dilated convolution whose input and weights outgrow half of a (small) L3: the "sweep" order, compiled to C
    for this machine's vectors, matches onnxruntime at 1 and 2 threads."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import dlcc
    from dlcc.testing.harness import assert_close

    rng = np.random.default_rng(9)
    native = get_target("native")
    if native.lanes < 4:
        pytest.skip("the blocked direct kernel needs vectors")
    g = ConvGeometry(256, 30, 30, 30, 30, 3, 3, 1, 1, 5, 5, 5, 5)
    co = 8 * native.lanes
    # (the L2 at which a channel tile's weights exceed half of it while its plane fits a quarter: the tile's size,
    # 2 x 8 channels x 14 pixels on AVX2, 4 x 16 x 6 on AVX-512 (a 230 KB plane: 1 MiB))
    sizes = [dataclasses.replace(native, l2_bytes=kb * 1024, l3_bytes=1 << 20) for kb in (128, 256, 512, 1024)]
    target = next(t for t in sizes if plan_direct(co, g, 1, t, threads).order == "sweep")
    w = numpy_helper.from_array((rng.standard_normal((co, 256, 3, 3)) * 0.05).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[5] * 4, dilations=[5, 5]),
             helper.make_node("Relu", ["c"], ["y"])]
    gr = helper.make_graph(nodes, "sweep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256, 30, 30])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, co, 30, 30])], [w, b])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 256, 30, 30)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cm = dlcc.compile(m, threads=threads, target=target)
    assert_close(cm({"x": x})["y"], ref, 1e-4, 1e-6)


def test_flat_pointwise_one_row_per_thread():
    """A 1x1 convolution on a 16-register target whose one-row plane would split its channel tiles over the threads
    (each thread reading the whole input): one row per thread instead, each thread its pixels with every channel
    tile ("rows"), the loop IR matching numpy; one row at 1 thread, and not where the weight outgrows L2 (ResNet-50's
    256 -> 1024 at 14 x 14) or on 32 registers."""
    from dlcc.schedule.direct import flat_pointwise

    v3, v4 = get_target("x86-64-v3"), get_target("x86-64-v4")
    g = ConvGeometry(576, 14, 14, 14, 14, 1, 1, 1, 1, 1, 1, 0, 0)  # MobileNetV2's 576 -> 96 projection
    assert (flat_pointwise(g, 96, v3).oh, flat_pointwise(g, 96, v3).ow) == (1, 196)
    assert plan_direct(96, flat_pointwise(g, 96, v3), 1, v3, 2).order == "plane"
    two = flat_pointwise(g, 96, v3, 2)
    assert (two.h, two.w, two.oh, two.ow) == (2, 98, 2, 98)
    p = plan_direct(96, two, 1, v3, 2)
    assert (p.order, p.threads) == ("rows", 2)
    big = dataclasses.replace(g, ci=256)
    assert flat_pointwise(big, 1024, v3, 2).oh == 1 and flat_pointwise(g, 96, v4, 2) is g
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 576, 14, 14)).astype(np.float32)
    wt = rng.standard_normal((96, 576, 1, 1)).astype(np.float32)
    ref = _conv_ref(x, wt, (1, 1), (1, 1), (0, 0))
    wpk = pack_direct(wt, p)
    f = direct_func(p, Buf("x", "float32", Layout.strided((1, 576, 2, 98))),
                    Buf("wp", "float32", Layout.strided(wpk.shape)),
                    Buf("c", "float32", Layout.strided((1, 96, 196))),
                    Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"))
    verify_func(f)  # (the threads' rows disjoint)
    out, seen = _run_conv_ir(f, x.reshape(1, 576, 2, 98), "wp", wpk, (1, 96, 196), p.workspace_floats)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


@pytest.mark.parametrize("threads,ci,co,hw", [(1, 576, 96, 14), (2, 576, 96, 14), (1, 256, 128, 56), (2, 256, 128, 56)])
def test_projection_with_residual_compiled_matches_onnxruntime(threads, ci, co, hw):
    """MobileNetV2's 576 -> 96 projection at 14 x 14 with its residual add (on AVX2 at 2 threads, one row of 98
    pixels per thread), and ResNet-50's 256 -> 128 at 56 x 56 (on AVX2, rows of 64 pixels outside: its input
    outgrows L2), compiled for this machine: the outputs match onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    import dlcc
    from dlcc.testing.harness import assert_close

    rng = np.random.default_rng(14)
    w = numpy_helper.from_array((rng.standard_normal((co, ci, 1, 1)) * 0.05).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "r"], ["y"])]
    vi = helper.make_tensor_value_info
    gr = helper.make_graph(nodes, "projection", [vi("x", TensorProto.FLOAT, [1, ci, hw, hw]),
                                                 vi("r", TensorProto.FLOAT, [1, co, hw, hw])],
                           [vi("y", TensorProto.FLOAT, [1, co, hw, hw])], [w, b])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, ci, hw, hw)).astype(np.float32),
             "r": rng.standard_normal((1, co, hw, hw)).astype(np.float32)}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    cm = dlcc.compile(m, threads=threads)
    assert_close(cm(feeds)["y"], ref, 1e-4, 1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_input_beyond_l2_runs_rows_outside(threads):
    """A 1x1 convolution whose input outgrows half of L2 (16 registers) while its weight does not: its plane as rows
    whose input stays in a quarter of L2, output rows outside ("rows", in bands within that quarter), the loop IR
    matching numpy; ResNet-50's 256 -> 128 at 56 x 56 on Zen 3 as 49 rows of 64 pixels."""
    from dlcc.schedule.direct import flat_pointwise, streams_input

    v3 = get_target("x86-64-v3")
    r50 = ConvGeometry(256, 56, 56, 56, 56, 1, 1, 1, 1, 1, 1, 0, 0)
    zen3 = dataclasses.replace(v3, l2_bytes=512 * 1024)
    g = flat_pointwise(r50, 128, zen3, threads)
    assert (g.oh, g.ow) == (49, 64) and streams_input(g, zen3)
    p = plan_direct(128, g, 1, zen3, threads)
    assert p.order == "rows" and p.band * 4 * 256 * 64 <= zen3.l2_bytes // 4 and p.threads == threads
    assert not streams_input(r50, get_target("x86-64-v4"))  # (32 registers: plans unchanged)
    small = dataclasses.replace(v3, l2_bytes=64 * 1024)  # 64 channels x 256 pixels (64 KB): beyond half of it
    g0 = ConvGeometry(64, 16, 16, 16, 16, 1, 1, 1, 1, 1, 1, 0, 0)
    g = flat_pointwise(g0, 40, small, threads)
    # (on 2 threads, one row per thread first: ``SPLIT_FLAT``, test_flat_pointwise_one_row_per_thread)
    assert g.oh * g.ow == 256 and g.oh % threads == 0 and (4 * 64 * g.ow <= 16 * 1024 or g.oh == threads > 1)
    p = plan_direct(40, g, 1, small, threads)
    assert p.order == "rows" and (4 * 64 * g.ow * p.band <= 16 * 1024 or threads > 1)
    rng = np.random.default_rng(15)
    x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
    wt = rng.standard_normal((40, 64, 1, 1)).astype(np.float32)
    ref = _conv_ref(x, wt, (1, 1), (1, 1), (0, 0))
    wpk = pack_direct(wt, p)
    f = direct_func(p, Buf("x", "float32", Layout.strided((1, 64, g.oh, g.ow))),
                    Buf("wp", "float32", Layout.strided(wpk.shape)),
                    Buf("c", "float32", Layout.strided((1, 40, 256))),
                    Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"))
    verify_func(f)
    out, seen = _run_conv_ir(f, x.reshape(1, 64, g.oh, g.ow), "wp", wpk, (1, 40, 256), p.workspace_floats)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size
