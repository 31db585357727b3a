"""The loop-level kernel IR: verifier, interpreter, transformations, the C printer and the GEMM micro-kernels
(C body against the contract's numpy reference)."""

import ctypes
import dataclasses
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

import dlcc.schedule.gemm as gemm_mod
from dlcc.build.cc import compile_files, compiler, flags_for
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.lir_c import print_c
from dlcc.codegen.ukernels import micro_c
from dlcc.errors import PassError
from dlcc.lower.lir import (
    MICRO,
    Alloc,
    Bcast,
    Bin,
    Buf,
    Call,
    Cast,
    Const,
    Epilogue,
    For,
    Func,
    If,
    In,
    Layout,
    Load,
    Micro,
    Ptr,
    Select,
    Store,
    Var,
    interval,
    print_func,
    run_func,
    verify_func,
)
from dlcc.lower.micro import DCONV_PAD, dwconv_micro, gemm_micro, gemmb_micro, gemmr_micro, gemmt_micro, im2col_micro
from dlcc.schedule.dwconv import dw_func
from dlcc.schedule.gemm import (
    ConvGeometry,
    b_in_place,
    gemm_func,
    gemm_func_batched,
    gemm_func_conv,
    gemm_func_wconst,
    pack_a,
    pack_b,
    plan_gemm,
    plan_gemm_batched,
    plan_gemm_conv,
    plan_gemm_wconst,
)
from dlcc.schedule.target import get_target
from dlcc.testing.harness import prelude, runnable_targets

# small caches, so that small products still have several K blocks, column blocks and row panels
TINY = dataclasses.replace(get_target("x86-64-v4"), l1d_bytes=2048, l2_bytes=16384)


def _gemm(m, n, k, threads, *, tm=None, tn=None, epilogue=True, target=TINY, blocked=False):
    p = plan_gemm(m, n, k, target, threads)
    if tm or tn:
        p = dataclasses.replace(p, tm=tm or 1, tn=tn or 1)
    a = Buf("a", "float32", Layout.strided((m, k)))
    bp = Buf("bp", "float32", Layout.strided((p.col_panels * k * p.nr,) if blocked else (p.col_panels, k, p.nr)))
    c = Buf("c", "float32", Layout.strided((m, n)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    return p, gemm_func(p, a, bp, c, ws, epilogue, target_l2=target.l2_bytes)


@pytest.mark.parametrize("blocked", [False, True])  # B packed panel by panel, or K block by K block
@pytest.mark.parametrize("m,n,k,tm,tn", [(30, 40, 50, 1, 1), (30, 40, 50, 2, 1), (3, 70, 20, 1, 2),
                                         (29, 64, 33, 1, 1), (1, 8, 1, 1, 1), (45, 100, 130, 3, 1)])
def test_gemm_loop_ir_matches_numpy(m, n, k, tm, tn, blocked):
    p, f = _gemm(m, n, k, tm * tn, tm=tm, tn=tn, blocked=blocked)
    assert p.k_blocks > 1 or k < 64
    verify_func(f)  # (the prefetched lines inside the packed B too)
    # B packed K block by K block, larger than half of L2, in several column blocks: each tile prefetches its
    # share of the next block
    ahead = blocked and 4 * k * p.col_panels * p.nr > TINY.l2_bytes // 2 and not p.one_column_block and m % p.mr != 1
    assert ("_f" in print_func(f)) == ahead
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.full(m * n, np.nan, np.float32)
    seen = []
    bp = pack_b(b, p.nr, p.kc if blocked else None).ravel()
    run_func(f, {"a": a.ravel().copy(), "bp": bp, "c": c}, lambda i, v: seen.append(i))
    np.testing.assert_allclose(c.reshape(m, n), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
    assert sorted(seen) == [(i, j) for i in range(m) for j in range(n)]  # each element once, after its last K block


def test_print_func_lists_loops_kinds_and_workspace():
    _, f = _gemm(30, 40, 50, 2, tm=2)
    text = print_func(f)
    assert "parallel for t in [0, 2):" in text
    assert "workspace ws: float32" in text and "micro gemm_10x32(" in text and "epilogue[" in text  # 30 rows: 3 x 10


def _vec_func(n=37, lanes=8):
    """y = x * 2 + 1 over n elements: vectors of ``lanes`` through a register tile, a scalar tail."""
    x = Buf("x", "float32", Layout.strided((n,)))
    y = Buf("y", "float32", Layout.strided((n,)))
    reg = Buf("r", "float32", Layout.strided((2 * lanes,)), "register", vector=lanes)
    i, u, t = Var("i"), Var("u"), Var("t")
    full = n // (2 * lanes)
    body = (
        For(i, Const(0), Const(full), (Alloc(reg, (
            For(u, Const(0), Const(2), (Store(reg, (u * lanes,), Load(x, (i * (2 * lanes) + u * lanes,), lanes)
                                              * Bcast(Const(2.0, "float32"), lanes), lanes),), "unrolled"),
            For(u, Const(0), Const(2), (Store(y, (i * (2 * lanes) + u * lanes,),
                                              Load(reg, (u * lanes,), lanes) + Const(1.0, "float32"), lanes),),
                "unrolled"),)),)),
        For(t, Const(full * 2 * lanes), Const(n),
            (Store(y, (t,), x[t] * Const(2.0, "float32") + Const(1.0, "float32")),)),
    )
    return Func("affine", (x, y), body)


def _build(src: str, tmp: str, target) -> ctypes.CDLL:
    c = Path(tmp, "k.c")
    c.write_text(src)
    so = Path(tmp, "k.so")
    compile_files(compiler(), flags_for(target), [c], so, Path(tmp))
    return ctypes.CDLL(str(so))


PRELUDE = "#include <stdint.h>\n#include <string.h>\n"


@pytest.mark.parametrize("target", runnable_targets())
def test_c_printer_matches_interpreter(target):
    t = get_target(target)
    f = _vec_func(37, t.lanes)
    verify_func(f)
    x = np.random.default_rng(1).standard_normal(37).astype(np.float32)
    want = np.zeros(37, np.float32)
    run_func(f, {"x": x.copy(), "y": want})
    np.testing.assert_allclose(want, x * 2 + 1, rtol=1e-6)
    body, micro = print_c(f, {"x": "x", "y": "y"}, lanes=t.lanes)
    assert not micro
    src = (PRELUDE + vector_helpers(t.lanes) + "\nvoid k(const float* restrict x, float* restrict y) {\n"
           + body + "\n}\n")
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        got = np.zeros(37, np.float32)
        lib.k(x.ctypes.data_as(ctypes.c_void_p), got.ctypes.data_as(ctypes.c_void_p))
    np.testing.assert_array_equal(got, want)


def _tile_src(names, lanes):
    """C of the GEMM tiles ``names`` and an exported wrapper ``w_{name}`` of each (the micro-kernels are static)."""
    src = PRELUDE + vector_helpers(lanes) + "\n" + "".join(micro_c(n, lanes) for n in names)
    for n in names:
        src += (f"void w_{n}(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t acc, "
                f"int64_t ncols) {{ dlcc_uk_{n}(kc, a, b, c, ldc, acc, ncols); }}\n")
    return src


def _run_tile(lib, name, kc, a, b, c0, ldc, acc, ncols):
    """The exported wrapper ``w_{name}`` of a GEMM tile run on a copy of ``c0``: that copy."""
    got = c0.copy()
    fn = getattr(lib, f"w_{name}")
    ptr = ctypes.c_void_p
    fn.argtypes = [ctypes.c_int64, ptr, ptr, ptr, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    fn(kc, a.ctypes.data_as(ptr), b.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc, acc, ncols)
    return got


def _check_tile(lib, name, kc, a, b, c0, want, mr, ldc, acc, ncols):
    """A row-major-store GEMM tile matches ``want`` (the contract's reference) and leaves the columns past
    ``ncols`` of every row untouched."""
    got = _run_tile(lib, name, kc, a, b, c0, ldc, acc, ncols)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    untouched = np.ones(mr * ldc, bool).reshape(mr, ldc)
    untouched[:, :ncols] = False
    assert np.array_equal(got.reshape(mr, ldc)[untouched], c0.reshape(mr, ldc)[untouched])


@pytest.mark.parametrize("target", runnable_targets())
def test_gemm_micro_kernels_match_their_contract(target):
    t = get_target(target)
    p = plan_gemm(64, 64, 64, t, 1)
    rng = np.random.default_rng(2)
    cases = [(p.mr, p.nr, 37, 1, p.nr), (p.mr, p.nr, 5, 0, p.nr - 3), (1, p.nr, 9, 1, 1), (3, p.nr, 1, 0, p.nr)]
    names = sorted({gemm_micro(mr, nr) for mr, nr, *_ in cases})
    src = _tile_src(names, t.lanes)
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for mr, nr, kc, acc, ncols in cases:
            name = gemm_micro(mr, nr)
            a = rng.standard_normal(kc * mr).astype(np.float32)
            b = rng.standard_normal(kc * nr).astype(np.float32)
            ldc = nr + 5
            c0 = rng.standard_normal(mr * ldc).astype(np.float32)
            want = c0.copy()
            MICRO[name].reference({"a": a, "b": b, "c": want}, {"a": 0, "b": 0, "c": 0},
                                  {"kc": kc, "ldc": ldc, "acc": acc, "ncols": ncols})
            _check_tile(lib, name, kc, a, b, c0, want, mr, ldc, acc, ncols)


@pytest.mark.parametrize("target", runnable_targets())
def test_in_place_b_gemm_micro_kernel_matches_its_contract(target):
    """``gemmb_`` reads B's kc rows ``ldb`` apart (a 1x1 convolution's NCHW input) and stores as ``gemm_``: the
    C against the contract's reference, on whole and partial tiles, with the columns past ncols untouched."""
    t = get_target(target)
    p = plan_gemm(64, 64, 64, t, 1)
    rng = np.random.default_rng(4)
    cases = [(p.mr, 3 * p.nr + 5, 37, 1, p.nr), (p.mr, p.nr, 5, 0, p.nr - 3), (2, 2 * p.nr, 9, 1, p.nr),
             (1, p.nr + 1, 11, 0, p.nr)]
    names = sorted({gemmb_micro(mr, p.nr, ldb) for mr, ldb, *_ in cases})
    src = _tile_src(names, t.lanes)
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for mr, ldb, kc, acc, ncols in cases:
            name = gemmb_micro(mr, p.nr, ldb)
            assert MICRO[name].footprint({"kc": kc, "ldc": p.nr, "acc": acc, "ncols": ncols})["b"] == (kc, ldb, p.nr)
            a = rng.standard_normal(kc * mr).astype(np.float32)
            b = rng.standard_normal(kc * ldb).astype(np.float32)
            ldc = p.nr + 5
            c0 = rng.standard_normal(mr * ldc).astype(np.float32)
            want = c0.copy()
            MICRO[name].reference({"a": a, "b": b, "c": want}, {"a": 0, "b": 0, "c": 0},
                                  {"kc": kc, "ldc": ldc, "acc": acc, "ncols": ncols})
            dense = a.reshape(kc, mr).T.astype(np.float64) @ b.reshape(kc, ldb)[:, :ncols]
            np.testing.assert_allclose(want.reshape(mr, ldc)[:, :ncols],
                                       dense + (c0.reshape(mr, ldc)[:, :ncols] if acc else 0), rtol=1e-5, atol=1e-5)
            _check_tile(lib, name, kc, a, b, c0, want, mr, ldc, acc, ncols)


@pytest.mark.parametrize("target", runnable_targets())
def test_prefetching_gemm_micro_kernels_compute_the_same(target):
    """The tiles that prefetch the next block of B (``gemm_..._f{step}x{lines}``, ``gemmr_..._f...``) store the
    bits of the plain ones; ``pf`` is only read by the prefetch."""
    t = get_target(target)
    nr = plan_gemm(64, 64, 64, t, 1).nr
    rng = np.random.default_rng(3)
    pairs = [(gemm_micro(4, nr), gemm_micro(4, nr, (2, 5)), None), (gemm_micro(3, nr), gemm_micro(3, nr, (1, 3)), None),
             (gemmr_micro(2, nr, 19), gemmr_micro(2, nr, 19, (4, 2)), 19),
             (gemmt_micro(3, nr), gemmt_micro(3, nr, (2, 4)), None)]  # (stored transposed)
    src = PRELUDE + vector_helpers(t.lanes) + "\n"
    for plain, ahead, _ in pairs:
        assert ahead.startswith(plain + "_f") and MICRO[ahead].params[-1] == ("pf", "in")
        src += micro_c(plain, t.lanes) + micro_c(ahead, t.lanes)
        src += (f"void w_{plain}(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t acc, "
                f"int64_t ncols) {{ dlcc_uk_{plain}(kc, a, b, c, ldc, acc, ncols); }}\n"
                f"void w_{ahead}(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t acc, "
                f"int64_t ncols) {{ dlcc_uk_{ahead}(kc, a, b, c, ldc, acc, ncols, b); }}\n")
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for plain, ahead, lda in pairs:
            mr = int(plain.split("_")[1].split("x")[0])
            kc = 17
            a = rng.standard_normal(kc * mr if lda is None else mr * lda).astype(np.float32)
            b = rng.standard_normal(kc * nr).astype(np.float32)
            out = []
            for name in (plain, ahead):
                c = np.full(max(mr, nr) * (nr + 3), 7.0, np.float32)
                fn = getattr(lib, f"w_{name}")
                fn.argtypes = [i64, ptr, ptr, ptr, i64, i64, i64]
                fn(kc, a.ctypes.data_as(ptr), b.ctypes.data_as(ptr), c.ctypes.data_as(ptr), nr + 3, 0, nr)
                out.append(c)
            assert np.array_equal(out[0], out[1])


def _one(body, params=None, workspace=()):
    x = Buf("x", "float32", Layout.strided((8,)))
    return Func("bad", params or (x,), body, workspace)


def test_verifier_rejects_broken_kernels():
    x = Buf("x", "float32", Layout.strided((8,)))
    i, t = Var("i"), Var("t")
    # out of bounds
    with pytest.raises(PassError, match="outside"):
        verify_func(_one((For(i, Const(0), Const(9), (Store(x, (i,), Const(0.0, "float32")),)),), (x,)))
    # a vector access running past the end
    with pytest.raises(PassError, match="outside"):
        verify_func(_one((For(i, Const(0), Const(2), (Store(x, (i * 4 + 1,), Bcast(Const(0.0, "float32"), 4), 4),)),),
                         (x,)))
    # an unbound variable
    with pytest.raises(PassError, match="not bound"):
        verify_func(_one((Store(x, (i,), Const(0.0, "float32")),), (x,)))
    # a stored value of another dtype
    with pytest.raises(PassError, match="int64 into float32"):
        verify_func(_one((Store(x, (Const(0),), Const(1)),), (x,)))
    # parallel iterations writing the same element
    with pytest.raises(PassError, match="same elements"):
        verify_func(_one((For(t, Const(0), Const(2), (Store(x, (Const(3),), Const(0.0, "float32")),), "parallel"),),
                         (x,)))
    # workspace allocated but not declared
    ws = Buf("ws", "float32", Layout.strided((4,)), "workspace")
    with pytest.raises(PassError, match="not declared"):
        verify_func(_one((Alloc(ws, (Store(ws, (Const(0),), Const(0.0, "float32")),)),), (x,)))
    verify_func(_one((Alloc(ws, (Store(ws, (Const(0),), Const(0.0, "float32")),)),), (x,), (ws,)))
    # a buffer nobody declared
    z = Buf("z", "float32", Layout.strided((4,)))
    with pytest.raises(PassError, match="not a parameter"):
        verify_func(_one((Store(z, (Const(0),), Const(0.0, "float32")),), (x,)))
    # a micro-kernel whose footprint leaves its buffer
    name = gemm_micro(2, 4)
    c = Buf("c", "float32", Layout.strided((2, 4)))
    with pytest.raises(PassError, match="reaches element"):
        verify_func(Func("m", (x, c), (Micro(name, (Const(3), Ptr(x, (Const(0),)), Ptr(x, (Const(0),)),
                                                    Ptr(c, (Const(0), Const(0))), Const(4), Const(0), Const(4))),)))


def test_verifier_accepts_disjoint_column_split():
    """Threads over column panels write interleaved address ranges: disjoint as boxes of indices."""
    _, f = _gemm(3, 70, 20, 2, tm=1, tn=2)
    verify_func(f)


def test_verifier_keeps_a_threads_ranges_apart():
    """A thread's channels of each of two images are two address ranges (their hull would take in the other
    thread's channels of the first image): a 3x3 pool over two images on two threads verifies (it raised
    "may both write" and failed the compile); the same loops with one channel range for both threads still
    fail."""
    from dlcc.schedule.dwconv import dw_func

    g = ConvGeometry(128, 36, 36, 18, 18, 3, 3, 2, 2, 1, 1, 1, 1)
    x = Buf("x", "float32", Layout.strided((2, 128, 36, 36)))
    wt = Buf("wt", "float32", Layout.strided((128, 9)))
    for shape in ((2, 128, 324), (2, 128, 18, 18)):
        c = Buf("c", "float32", Layout.strided(shape))
        f = dw_func(g, 2, x, wt, c, len(shape) == 3, 2, pool_max=True, flat=len(shape) == 3)
        assert "parallel for t" in print_func(f)
        verify_func(f)
    t, b, ch = Var("t"), Var("b"), Var("ch")
    c = Buf("c", "float32", Layout.strided((2, 8, 4)))
    bad = Func("bad", (x, c), (For(t, Const(0), Const(2), (For(b, Const(0), Const(2), (
        For(ch, Bin("*", t, Const(3)), Bin("+", Bin("*", t, Const(3)), Const(5)), (
            Store(c, (b, ch, Const(0)), Const(0.0, "float32")),)),)),), "parallel"),))
    with pytest.raises(PassError, match="both write"):
        verify_func(bad)


def test_blocked_layout_addresses():
    lay = Layout.blocked((1, 20, 3, 3), 1, 8)  # NCHW8c, 3 channel blocks (the last one padded)
    assert lay.span == 3 * 3 * 3 * 8
    addr = lay.address([Const(0), Const(11), Const(2), Const(1)])
    from dlcc.lower.lir import interval
    assert interval(addr, {}) == ((1 * 3 * 3 + 2 * 3 + 1) * 8 + 3,) * 2
    assert not lay.vector_ok(4)  # W has stride 8 there: no vector along the last logical axis
    assert Layout.strided((2, 16)).vector_ok(16) and not Layout.strided((2, 16), (16, 2)).vector_ok(4)


def test_gemm_plans_for_each_target():
    for name, tile in (("x86-64-v4", (13, 32)), ("x86-64-v3", (5, 16)), ("aarch64", (8, 12)), ("generic", (5, 8))):
        p = plan_gemm(128, 768, 768, get_target(name), 1)
        # (128 rows: 13 on AVX-512 wastes least; on 16 registers 5, not 4 rows, whose 8 accumulators wait on the
        # FMA latency: gemm.MIN_ROWS)
        assert (p.mr, p.nr) == tile, name
        assert p.mr * p.kc * 4 <= get_target(name).l1d_bytes // 2 + 64 * p.mr
    assert os.cpu_count()


def test_gemm_threads_split_rows_unless_columns_save_the_packing():
    """Two threads: by rows, each packing only its rows of A, unless splitting the columns leaves the busiest
    thread less work with every row packed (a few row micro-panels against many column ones)."""
    v3 = get_target("x86-64-v3")
    # ConvNeXt's 784 x 768 -> 192: 157 row micro-panels of 12 columns ones; 157 x 6 tiles by columns are fewer than
    # 79 x 12 by rows, but then each thread packs all 157 row micro-panels
    assert (plan_gemm(784, 192, 768, v3, 2).tm, plan_gemm(784, 192, 768, v3, 2).tn) == (2, 1)
    assert (plan_gemm(32, 2304, 768, v3, 2).tm, plan_gemm(32, 2304, 768, v3, 2).tn) == (1, 2)  # 7 rows of 144
    assert (plan_gemm(128, 768, 768, v3, 2).tm, plan_gemm(128, 768, 768, v3, 2).tn) == (2, 1)


def test_conv_gemm_threads_split_pixels_into_channels_last_when_the_weight_outgrows_l2():
    """The pixels-as-rows convolution on two threads: over the output channels (with one im2col the threads share),
    except into a channels-last output with a weight larger than L2, which goes by pixels (each thread gathering
    its rows and prefetching the weight's next column block: ResNet-50's strided projections)."""
    v3 = get_target("x86-64-v3")
    big = ConvGeometry(1024, 14, 14, 7, 7, 1, 1, 2, 2, 1, 1, 0, 0)  # 1024 -> 2048, stride 2: an 8 MB weight
    small = ConvGeometry(256, 14, 14, 7, 7, 1, 1, 2, 2, 1, 1, 0, 0)  # 256 -> 256: 256 KB
    splits = {(g.ci, cl): (lambda p: (p.tm, p.tn, p.pack))(plan_gemm_conv(co, g, 1, v3, 2, channels_last=cl))
              for g, co in ((big, 2048), (small, 256)) for cl in (False, True)}
    assert splits[(1024, True)] == (2, 1, "i")
    assert splits[(1024, False)][:2] == splits[(256, True)][:2] == splits[(256, False)][:2] == (1, 2)


@pytest.mark.parametrize("m,n,k,batch,tm,tn,row", [(30, 40, 50, 1, 1, 1, 40), (30, 140, 150, 2, 1, 2, 140),
                                                   (3, 70, 20, 1, 1, 2, 70), (29, 64, 33, 2, 1, 1, 64),
                                                   (40, 20, 16, 1, 2, 1, 20), (29, 64, 33, 2, 1, 2, 96),
                                                   (13, 96, 40, 1, 2, 1, 100), (40, 32, 16, 1, 2, 1, 64),
                                                   (29, 64, 33, 1, 1, 1, 80), (100, 64, 20, 1, 1, 1, 64)])
def test_weight_left_gemm_loop_ir_matches_numpy(m, n, k, batch, tm, tn, row, monkeypatch):
    """The 1x1-convolution form: A a weight packed at compile time, each B packed per block at run time, or read
    in place where x's rows (``row`` floats apart) hold whole micro-panels (``gemmb_``: then no workspace)."""
    monkeypatch.setattr(gemm_mod, "B_IN_PLACE_MIN_N", 16)  # (test-sized products)
    monkeypatch.setattr(gemm_mod, "B_IN_PLACE_MAX_ROW_BLOCKS", 8)
    p = dataclasses.replace(plan_gemm_wconst(m, n, k, batch, TINY, 1), tm=tm, tn=tn)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((batch, k, row)).astype(np.float32)
    ap = Buf("ap", "float32", Layout.strided((m * k,)))
    xb = Buf("x", "float32", Layout.strided((batch, k, n), (k * row, row, 1)))
    cb = Buf("c", "float32", Layout.strided((batch, m, n)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    in_place = not n % p.nr and not row % p.nr and n > gemm_mod.B_IN_PLACE_MIN_N \
        and p.row_blocks <= gemm_mod.B_IN_PLACE_MAX_ROW_BLOCKS
    assert b_in_place(p, row) == in_place
    f = gemm_func_wconst(p, ap, xb, cb, None if in_place else ws, True)
    assert ("gemmb_" in print_func(f)) == in_place and (f.workspace == ()) == in_place
    verify_func(f)
    c = np.full(batch * m * n, np.nan, np.float32)
    seen = []
    run_func(f, {"ap": pack_a(a, p.mr), "x": x.ravel().copy(), "c": c}, lambda i, v: seen.append(i))
    np.testing.assert_allclose(c.reshape(batch, m, n), a.astype(np.float64) @ x[:, :, :n], rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == batch * m * n
    # every vectorized loop (the packing, the epilogue) runs a constant width, the last panel its own body
    # where the columns are not a whole number of panels (a run-time width is left scalar by the C compiler)
    widths = _vector_widths(f.body)
    assert widths and all(w is not None for w in widths), widths
    assert (n % p.nr in widths) == bool(n % p.nr)


class _Every(dict):
    """Every variable bound to the one value ``v``."""

    def __init__(self, v: int):
        super().__init__()
        self.v = v

    def __contains__(self, name) -> bool:
        return True

    def __getitem__(self, name) -> tuple[int, int]:
        return self.v, self.v


def _vector_widths(stmts) -> list[int | None]:
    """The trip count of every vectorized loop in ``stmts`` (None where it is not a constant)."""
    out = []
    for s in stmts:
        if isinstance(s, For):
            if s.kind == "vectorized":  # (the same count whatever the enclosing loops' variables)
                counts = {interval(s.stop - s.start, _Every(v))[0] for v in (3, 7)}
                out.append(counts.pop() if len(counts) == 1 else None)
            out += _vector_widths(s.body)
        elif isinstance(s, If):
            out += _vector_widths(s.then) + _vector_widths(s.else_)
        elif isinstance(s, Alloc):
            out += _vector_widths(s.body)
    return out


def _run_conv_ir(f, x, wname, wp, out_shape, ws_floats):
    """Interpret a convolution's loop IR ``f`` on ``x`` and its packed weight ``wp`` (parameter ``wname``), the
    workspace NaN: the values handed to the epilogue as an array of ``out_shape`` (NaN where none came) and the
    indices handed, in order."""
    out = np.full(out_shape, np.nan, np.float32)
    seen = []

    def epilogue(i, v):
        seen.append(i)
        out[i] = v

    run_func(f, {"x": x.ravel().copy(), wname: wp.ravel(), "c": np.zeros(out.size, np.float32),
                 "ws": np.full(ws_floats, np.nan, np.float32)}, epilogue)
    return out, seen


def _conv_ref(x, w, s, d, pad):
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - (kh - 1) * d[0] - 1) // s[0] + 1
    ow = (wd + 2 * pad[1] - (kw - 1) * d[1] - 1) // s[1] + 1
    out = np.zeros((n, co, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * d[0]:i * d[0] + s[0] * (oh - 1) + 1:s[0], j * d[1]:j * d[1] + s[1] * (ow - 1) + 1:s[1]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def _random_conv(seed, n, c, h, w, co, k, s, d, pad):
    """A random input and weight, their float64 convolution (stride, dilation, padding ``s``, ``d``, ``pad`` on both
    axes) and its geometry."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, c, k, k)).astype(np.float32)
    ref = _conv_ref(x, wt, (s, s), (d, d), (pad, pad))
    oh, ow = ref.shape[2:]
    return x, wt, ref, ConvGeometry(c, h, w, oh, ow, k, k, s, s, d, d, pad, pad)


def _assert_tile(got, want, pixel_major, rows, ldc, px, atol=1e-5):
    """A register tile's stores against its reference: pixel-major everywhere; channel-major (``rows`` channels,
    ``ldc`` apart) on its ``px`` pixels, and nothing written from DCONV_PAD past them."""
    if pixel_major:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)
        return
    g, r = got.reshape(rows, ldc), want.reshape(rows, ldc)
    np.testing.assert_allclose(g[:, :px], r[:, :px], rtol=1e-5, atol=atol)
    assert (g[:, px + DCONV_PAD:] == 7.0).all()


@pytest.mark.parametrize("n,c,h,w,co,k,s,d,pad,threads", [
    (1, 3, 9, 8, 20, 3, 1, 1, 1, 1), (2, 5, 7, 7, 40, 3, 2, 1, 1, 2), (1, 4, 10, 9, 33, 1, 2, 1, 0, 1),
    (1, 2, 11, 11, 17, 3, 1, 2, 2, 2), (1, 3, 8, 8, 8, 3, 1, 1, 0, 1)])
def test_conv_gemm_loop_ir_matches_numpy(n, c, h, w, co, k, s, d, pad, threads):
    """The im2col GEMM: pixels as rows, gathered (padding through clamped loads and a select)."""
    x, wt, ref, g = _random_conv(4, n, c, h, w, co, k, s, d, pad)
    p = plan_gemm_conv(co, g, n, TINY, 1)
    if threads > 1:
        p = dataclasses.replace(p, tm=threads)
    xb = Buf("x", "float32", Layout.strided((n, c, h, w)))
    wp = Buf("wp", "float32", Layout.strided((p.col_panels, p.k, p.nr)))
    cb = Buf("c", "float32", Layout.strided((n, co, g.oh * g.ow)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    f = gemm_func_conv(p, g, xb, wp, cb, ws, True)
    verify_func(f)
    out = np.full(n * co * g.oh * g.ow, np.nan, np.float32)
    seen = []
    run_func(f, {"x": x.ravel().copy(), "wp": pack_b(wt.reshape(co, -1).T.copy(), p.nr).ravel(), "c": out},
             lambda i, v: seen.append(i))
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


@pytest.mark.parametrize("n,c,h,w,co,s,x_cl,pack,threads", [
    (1, 24, 9, 8, 40, 2, True, "i", 1), (2, 19, 7, 7, 33, 2, True, "i", 2), (1, 24, 10, 9, 70, 2, False, "i", 2),
    (1, 20, 9, 9, 64, 2, True, "I", 2), (1, 16, 8, 8, 20, 1, True, "i", 1), (1, 12, 9, 8, 48, 3, False, "I", 2)])
def test_conv_gemm_channels_last_loop_ir_matches_numpy(n, c, h, w, co, s, x_cl, pack, threads):
    """The 1x1 GEMM into a channels-last output (``channels_last``): the tiles store pixel-major, every output
    handed to the epilogue once; from a channels-last input (each pixel's channels gathered along its row) or an
    NCHW one, strided, with threads over rows or columns and the shared im2col ("I")."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, c, 1, 1)).astype(np.float32)
    ref = _conv_ref(x, wt, (s, s), (1, 1), (0, 0))
    oh, ow = ref.shape[2:]
    g = ConvGeometry(c, h, w, oh, ow, 1, 1, s, s, 1, 1, 0, 0)
    p = plan_gemm_conv(co, g, n, TINY, 1)
    if threads > 1:
        p = dataclasses.replace(p, tm=1, tn=threads, pack=pack) if pack == "I" else dataclasses.replace(p, tm=threads)
    xs = (h * w * c, 1, w * c, c) if x_cl else None
    xb = Buf("x", "float32", Layout.strided((n, c, h, w), xs))
    wp = Buf("wp", "float32", Layout.strided((p.col_panels, p.k, p.nr)))
    cb = Buf("c", "float32", Layout.strided((n, oh * ow, co)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    f = gemm_func_conv(p, g, xb, wp, cb, ws, True, channels_last=True)
    verify_func(f)
    assert "gemmt_" not in print_func(f)
    out = np.full(n * oh * ow * co, np.nan, np.float32)
    seen = []
    xin = x.transpose(0, 2, 3, 1).ravel().copy() if x_cl else x.ravel().copy()
    run_func(f, {"x": xin, "wp": pack_b(wt.reshape(co, -1).T.copy(), p.nr).ravel(), "c": out},
             lambda i, v: seen.append(i))
    np.testing.assert_allclose(out.reshape(n, oh, ow, co).transpose(0, 3, 1, 2), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


@pytest.mark.parametrize("threads", [1, 2])
def test_conv_gemm_prefetches_the_next_column_block(threads):
    """An im2col GEMM whose packed weight (K block by K block) outgrows half of L2 and is blocked by columns:
    every tile prefetches its share of the next column block (``gemmt_..._f``), inside the weight (verified), and
    the results are numpy's; with the L2 unknown, no prefetching."""
    rng = np.random.default_rng(6)
    n, c, h, w, co = 1, 16, 12, 12, 70
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, c, 3, 3)).astype(np.float32)
    ref = _conv_ref(x, wt, (1, 1), (1, 1), (1, 1))
    g = ConvGeometry(c, h, w, h, w, 3, 3, 1, 1, 1, 1, 1, 1)
    p = plan_gemm_conv(co, g, n, TINY, threads)
    bp = pack_b(wt.reshape(co, -1).T.copy(), p.nr, p.kc)
    assert p.nc < p.col_panels and 4 * bp.size > TINY.l2_bytes // 2 and p.threads == threads
    xb = Buf("x", "float32", Layout.strided((n, c, h, w)))
    wp = Buf("wp", "float32", Layout.strided(bp.shape))
    cb = Buf("c", "float32", Layout.strided((n, co, h * w)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    assert "_f" not in print_func(gemm_func_conv(p, g, xb, wp, cb, ws, True))
    f = gemm_func_conv(p, g, xb, wp, cb, ws, True, target_l2=TINY.l2_bytes)
    assert re.search(r"gemmt_\d+x\d+_f\d+x\d+\(", print_func(f))
    verify_func(f)
    out = np.full(n * co * h * w, np.nan, np.float32)
    seen = []
    run_func(f, {"x": x.ravel().copy(), "wp": bp.copy(), "c": out}, lambda i, v: seen.append(i))
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == out.size


@pytest.mark.parametrize("target", runnable_targets())
def test_transposed_store_micro_kernel_matches_its_contract(target):
    t = get_target(target)
    p = plan_gemm(64, 64, 64, t, 1)
    rng = np.random.default_rng(5)
    cases = [(p.mr, 23, 1, p.nr), (p.mr, 4, 0, 5), (2, 7, 1, 1)]
    names = sorted({gemmt_micro(mr, p.nr) for mr, *_ in cases})
    src = _tile_src(names, t.lanes)
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for mr, kc, acc, ncols in cases:
            name = gemmt_micro(mr, p.nr)
            a = rng.standard_normal(kc * mr).astype(np.float32)
            b = rng.standard_normal(kc * p.nr).astype(np.float32)
            ldc = mr + 3
            c0 = rng.standard_normal(p.nr * ldc).astype(np.float32)
            want = c0.copy()
            MICRO[name].reference({"a": a, "b": b, "c": want}, {"a": 0, "b": 0, "c": 0},
                                  {"kc": kc, "ldc": ldc, "acc": acc, "ncols": ncols})
            got = _run_tile(lib, name, kc, a, b, c0, ldc, acc, ncols)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert np.array_equal(got[ncols * ldc:], c0[ncols * ldc:])  # columns >= ncols untouched


@pytest.mark.parametrize("target", runnable_targets())
def test_im2col_micro_kernel_matches_its_contract(target):
    """The gather's C (runs along output rows, padding as zeros; a 1x1 kernel's per-pixel offsets) against the
    contract's reference."""
    t = get_target(target)
    rng = np.random.default_rng(6)
    geos = [(9, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1), (11, 11, 4, 3, 3, 2, 2, 2, 2, 2, 2), (7, 7, 7, 1, 1, 1, 1, 1, 1, 0, 0),
            (10, 13, 5, 5, 5, 2, 3, 1, 1, 2, 1),
            # 1x1 (offsets once per panel, a full panel unrolled): strided, and with a padding ring
            (12, 12, 6, 1, 1, 2, 2, 1, 1, 0, 0), (6, 5, 7, 1, 1, 1, 1, 1, 1, 1, 1)]
    src = PRELUDE + vector_helpers(t.lanes) + "\n"
    names = []
    for h, w, ow, kh, kw, sh, sw, dh, dw, ph, pw in geos:
        name = im2col_micro(h, w, ow, kh, kw, sh, sw, dh, dw, ph, pw, h * w + 3, w + 1, 14)
        names.append(name)
        src += micro_c(name, t.lanes) + (
            f"void w_{name}(int64_t kc, int64_t k0, int64_t p0, int64_t rows, const float* x, float* ws) "
            f"{{ dlcc_uk_{name}(kc, k0, p0, rows, x, ws); }}\n")
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for name, (h, w, ow, kh, kw, *_) in zip(names, geos, strict=True):
            ci = 3
            x = rng.standard_normal(ci * (h * w + 3)).astype(np.float32)
            for kc, k0, p0, rows in [(ci * kh * kw, 0, 0, 14), (2, kh * kw - 1, ow - 1, 9), (1, 0, 3, 1)]:
                want = np.full(kc * rows + 4, 7.0, np.float32)
                MICRO[name].reference({"x": x, "ws": want}, {"x": 0, "ws": 0},
                                      {"kc": kc, "k0": k0, "p0": p0, "rows": rows})
                got = np.full(kc * rows + 4, 7.0, np.float32)
                fn = getattr(lib, f"w_{name}")
                i64, ptr = ctypes.c_int64, ctypes.c_void_p
                fn.argtypes = [i64, i64, i64, i64, ptr, ptr]
                fn(kc, k0, p0, rows, x.ctypes.data_as(ptr), got.ctypes.data_as(ptr))
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("target", runnable_targets())
def test_depthwise_plane_micro_kernel_and_loop_ir(target):
    """The depthwise plane micro-kernel's C against its contract, and the loop IR (threads over channels)
    against a float64 depthwise convolution."""
    t = get_target(target)
    rng = np.random.default_rng(7)
    for c, h, w, k, s, d, pad in [(3, 9, 8, 3, 1, 1, 1), (4, 11, 12, 5, 2, 1, 2), (2, 7, 7, 3, 2, 2, 2),
                                  (3, 3, 3, 3, 1, 1, 0),
                                  # stride-1 5x5 and 7x7 (the padded-plane form), rows wider than one vector
                                  (2, 20, 23, 5, 1, 1, 2), (2, 30, 30, 7, 1, 1, 3), (2, 19, 21, 5, 1, 2, 1)]:
        x = rng.standard_normal((1, c, h, w)).astype(np.float32)
        wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
        ref = np.stack([_conv_ref(x[:, i:i + 1], wt[i:i + 1], (s, s), (d, d), (pad, pad))[0, 0] for i in range(c)])
        oh, ow = ref.shape[1:]
        g = ConvGeometry(c, h, w, oh, ow, k, k, s, s, d, d, pad, pad)
        xb = Buf("x", "float32", Layout.strided((1, c, h, w)))
        wb = Buf("w", "float32", Layout.strided((c, k * k)))
        cb = Buf("c", "float32", Layout.strided((1, c, oh, ow)))
        f = dw_func(g, 1, xb, wb, cb, True, threads=2)
        verify_func(f)
        out = np.full(c * oh * ow, np.nan, np.float32)
        run_func(f, {"x": x.ravel().copy(), "w": wt.reshape(c, -1).ravel().copy(), "c": out})
        np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)
        name = dwconv_micro(h, w, oh, ow, k, k, s, s, d, d, pad, pad, w)
        src = (PRELUDE + vector_helpers(t.lanes) + "\n" + micro_c(name, t.lanes)
               + f"void w_(const float* x, const float* w, float* o) {{ dlcc_uk_{name}(x, w, o); }}\n")
        with tempfile.TemporaryDirectory() as tmp:
            lib = _build(src, tmp, t)
            got = np.full(oh * ow, np.nan, np.float32)
            ptr = ctypes.c_void_p
            lib.w_.argtypes = [ptr, ptr, ptr]
            lib.w_(x[0, 1].ctypes.data_as(ptr), np.ascontiguousarray(wt[1].ravel()).ctypes.data_as(ptr),
                   got.ctypes.data_as(ptr))
        np.testing.assert_allclose(got.reshape(oh, ow), ref[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch,m,n,k,threads,transposed", [(3, 30, 40, 50, 1, False), (4, 29, 64, 33, 2, True),
                                                            (2, 5, 9, 70, 2, True)])
def test_batched_gemm_loop_ir_matches_numpy(batch, m, n, k, threads, transposed):
    """Two run-time operands (attention's Q K^T, P V): B read through a transposed view, packed per K block."""
    p = plan_gemm_batched(batch, m, n, k, TINY, 1)
    p = dataclasses.replace(p, tm=threads)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    ab = Buf("a", "float32", Layout.strided((batch, m, k)))
    if transposed:  # stored [batch, n, k]
        bb = Buf("b", "float32", Layout.strided((batch, k, n), (n * k, 1, k)))
        bdata = np.ascontiguousarray(np.swapaxes(b, 1, 2)).ravel()
    else:
        bb, bdata = Buf("b", "float32", Layout.strided((batch, k, n))), b.ravel().copy()
    cb = Buf("c", "float32", Layout.strided((batch, m, n)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    f = gemm_func_batched(p, ab, bb, cb, ws, True)
    verify_func(f)
    c = np.full(batch * m * n, np.nan, np.float32)
    seen = []
    run_func(f, {"a": a.ravel().copy(), "b": bdata, "c": c}, lambda i, v: seen.append(i))
    np.testing.assert_allclose(c.reshape(batch, m, n), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)
    assert len(seen) == len(set(seen)) == batch * m * n


@pytest.mark.parametrize("target", runnable_targets())
def test_max_plane_micro_kernel_matches_its_contract(target):
    """MaxPool's plane kernel (flat and row forms, padding, stride, dilation) against its contract."""
    t = get_target(target)
    rng = np.random.default_rng(9)
    for h, w, k, s, d, pad in [(9, 8, 3, 1, 1, 1), (11, 12, 3, 2, 1, 1), (7, 7, 3, 1, 2, 2), (40, 70, 2, 2, 1, 0)]:
        oh, ow = (h + 2 * pad - (k - 1) * d - 1) // s + 1, (w + 2 * pad - (k - 1) * d - 1) // s + 1
        name = dwconv_micro(h, w, oh, ow, k, k, s, s, d, d, pad, pad, w, pool_max=True)
        x = rng.standard_normal(h * w).astype(np.float32)
        want = np.full(oh * ow, np.nan, np.float32)
        MICRO[name].reference({"x": x, "w": np.ones(k * k, np.float32), "out": want}, {"x": 0, "w": 0, "out": 0}, {})
        src = (PRELUDE + "#include <math.h>\n" + vector_helpers(t.lanes) + "\n" + micro_c(name, t.lanes)
               + f"void w_(const float* x, const float* w, float* o) {{ dlcc_uk_{name}(x, w, o); }}\n")
        with tempfile.TemporaryDirectory() as tmp:
            lib = _build(src, tmp, t)
            got = np.full(oh * ow, np.nan, np.float32)
            ptr = ctypes.c_void_p
            lib.w_.argtypes = [ptr, ptr, ptr]
            lib.w_(x.ctypes.data_as(ptr), np.ones(k * k, np.float32).ctypes.data_as(ptr), got.ctypes.data_as(ptr))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("c,h,w,co,k,s,pad", [(3, 9, 8, 70, 3, 1, 1), (5, 7, 7, 96, 3, 2, 1), (4, 10, 9, 64, 1, 2, 0)])
def test_conv_gemm_with_a_shared_im2col_matches_numpy(c, h, w, co, k, s, pad):
    """Threads over output channels: the im2col matrix gathered once, split over the threads (one parallel
    loop), then shared by the per-channel products (a second parallel loop) -- "I" plans."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, c, k, k)).astype(np.float32)
    ref = _conv_ref(x, wt, (s, s), (1, 1), (pad, pad))
    oh, ow = ref.shape[2:]
    g = ConvGeometry(c, h, w, oh, ow, k, k, s, s, 1, 1, pad, pad)
    p = dataclasses.replace(plan_gemm_conv(co, g, 1, TINY, 2), tm=1, tn=2, pack="I")
    xb = Buf("x", "float32", Layout.strided((1, c, h, w)))
    wp = Buf("wp", "float32", Layout.strided((p.col_panels, p.k, p.nr)))
    cb = Buf("c", "float32", Layout.strided((1, co, oh * ow)))
    ws = Buf("ws", "float32", Layout.strided((p.threads * p.workspace_floats,)), "workspace")
    f = gemm_func_conv(p, g, xb, wp, cb, ws, True)
    verify_func(f)
    assert print_func(f).count("parallel for") == 2
    out = np.full(co * oh * ow, np.nan, np.float32)
    run_func(f, {"x": x.ravel().copy(), "wp": pack_b(wt.reshape(co, -1).T.copy(), p.nr).ravel(), "c": out})
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
    body, _ = print_c(f, {"x": "x", "wp": "wp", "c": "c", "ws": "w"}, lambda i, v: "", 16)
    assert body.count("/* dlcc:parallel */") == 2 and body.count("float* restrict ws = w;") == 2


def _math_func(n=13):
    """Calls, casts, an opaque input, float comparisons and rank-0 register scalars: s = sum |x| in double,
    then y[i] = x < 0 ? exp(x) : sqrt(x) + log(1 + x^2) / float(s), 0 where x == 0; the epilogue gets
    tanh(x) * (1 + x*x)**0.5."""
    y = Buf("y", "float32", Layout.strided((n,)))
    s = Buf("s", "float64", Layout.strided(()), "register")
    v = Buf("v", "float32", Layout.strided(()), "register")
    i = Var("i")
    x = In(0, (i,), (n,))
    one = Const(1.0, "float32")
    body = (Alloc(s, (
        Store(s, (), Const(0.0, "float64")),
        For(i, Const(0), Const(n), (Store(s, (), Load(s, ()) + Cast(Call("abs", (x,)), "float64")),)),
        For(i, Const(0), Const(n), (Alloc(v, (
            Store(v, (), x),
            Store(y, (i,), Select(Bin("<", Load(v, ()), Const(0.0, "float32")), Call("exp", (Load(v, ()),)),
                                  Call("sqrt", (Load(v, ()),)) + Call("log", (one + x * x,)) / Cast(Load(s, ())))),
            If(Bin("==", Load(v, ()), Const(0.0, "float32")), (Store(y, (i,), Const(0.0, "float32")),)),
            Epilogue((i,), Call("tanh", (x,)) * Call("pow", (one + x * x, Const(0.5, "float32")))),
        )),)),
    )),)
    return Func("math", (y,), body)


@pytest.mark.parametrize("target", runnable_targets())
def test_calls_casts_and_opaque_inputs(target):
    t = get_target(target)
    n = 13
    f = _math_func(n)
    verify_func(f)
    listing = print_func(f)
    assert "exp(v[])" in listing and "float32(s[])" in listing and "in0[i]" in listing
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    x[3] = 0.0
    s = np.abs(x.astype(np.float64)).sum()
    with np.errstate(invalid="ignore"):
        want = np.where(x < 0, np.exp(x), np.sqrt(x) + np.log1p(x * x) / np.float32(s)).astype(np.float32)
    want[3] = 0.0
    for src in (x, lambda idx: x[idx]):  # an opaque input as an array or as a function of the index
        y, epi = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
        run_func(f, {"y": y}, epi.__setitem__, {0: src})
        np.testing.assert_allclose(y, want, rtol=1e-6)
        np.testing.assert_allclose(epi, np.tanh(x) * np.sqrt(1 + x * x), rtol=1e-6)
    body, _ = print_c(f, {"y": "y"}, lambda idx, val: f"e[{idx[0]}] = {val};", t.lanes,
                      {0: lambda idx: f"x[{idx[0]}]"})
    assert "double s;" in body and "dlcc_expf(" in body and "powf(" in body
    src = prelude(t) + "\nvoid k(const float* restrict x, float* restrict y, float* restrict e) {\n" + body + "\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        got, gepi = np.zeros(n, np.float32), np.zeros(n, np.float32)
        ptr = ctypes.c_void_p
        lib.k(x.ctypes.data_as(ptr), got.ctypes.data_as(ptr), gepi.ctypes.data_as(ptr))
    np.testing.assert_allclose(got, y, rtol=1e-6)  # vmath: within 2 ulp of numpy
    np.testing.assert_allclose(gepi, epi, rtol=1e-6)


def test_verifier_checks_calls_casts_and_opaque_inputs():
    y = Buf("y", "float32", Layout.strided((4,)))
    i = Var("i")

    def store(value):
        return Func("bad", (y,), (For(i, Const(0), Const(4), (Store(y, (i,), value),)),))
    x = In(0, (i,), (4,))
    verify_func(store(Call("pow", (x, x))))
    with pytest.raises(PassError, match="unknown function"):
        verify_func(store(Call("cbrt", (x,))))
    with pytest.raises(PassError, match="wrong number"):
        verify_func(store(Call("exp", (x, x))))
    with pytest.raises(PassError, match="must be scalars"):
        verify_func(store(Call("exp", (Bcast(x, 4),))))
    with pytest.raises(PassError, match="a cast converts"):
        verify_func(store(Cast(Cast(x, "float16"))))
    verify_func(store(Cast(Cast(x, "int8"))))  # (the stored element types convert too)
    with pytest.raises(PassError, match="outside"):
        verify_func(store(In(0, (i + 1,), (4,))))
    with pytest.raises(PassError, match="not a scalar int64"):
        verify_func(store(In(0, (Cast(i),), (4,))))
    with pytest.raises(PassError, match="int64 into float32"):
        verify_func(store(Bin("<", x, x)))  # a comparison is an int64 0/1


def test_depthwise_loop_ir_with_a_flat_epilogue():
    """``flat``: the epilogue as one loop over each output plane, indices (image, channel, pixel)."""
    rng = np.random.default_rng(8)
    c, h, w, k = 5, 7, 7, 3
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    ref = np.stack([_conv_ref(x[:, i:i + 1], wt[i:i + 1], (1, 1), (1, 1), (1, 1))[:, 0] for i in range(c)], 1)
    g = ConvGeometry(c, h, w, h, w, k, k, 1, 1, 1, 1, 1, 1)
    cb = Buf("c", "float32", Layout.strided((2, c, h * w)))
    f = dw_func(g, 2, Buf("x", "float32", Layout.strided(x.shape)), Buf("w", "float32", Layout.strided((c, k * k))),
                cb, True, threads=2, flat=True)
    verify_func(f)
    got = np.full((2, c, h * w), np.nan, np.float32)
    seen = []

    def epilogue(i, v):
        seen.append(i)
        got[i] = 2 * v

    run_func(f, {"x": x.ravel().copy(), "w": wt.reshape(c, -1).ravel().copy(), "c": np.zeros(got.size, np.float32)},
             epilogue)
    np.testing.assert_allclose(got.reshape(ref.shape), 2 * ref, rtol=1e-5, atol=1e-5)
    assert len(seen) == len(set(seen)) == got.size
