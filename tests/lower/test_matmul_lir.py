"""The loop IR of the products the packed GEMM does not take (``dlcc.schedule.matmul``): verified, then
interpreted against numpy's matmul — narrow outputs (dot products), panels with row and column tails, a
packed weight B, broadcast batch dims and 1-D operands as stride-0 dims, and each thread split."""

import math

import numpy as np
import pytest

from dlcc.lower.lir import Buf, Layout, run_func, verify_func
from dlcc.schedule.matmul import dots_func, pack_panels, panel_width, panels_func


def _operand(x, batch, own_strides=None):
    """``x`` ([*own batch, r, c]) as a buffer of shape (*batch, r, c): broadcast dims of stride 0."""
    strides = own_strides or [math.prod(x.shape[d + 1:]) for d in range(x.ndim)]
    pad = len(batch) - (x.ndim - 2)
    bs = [0] * pad + [s if n != 1 else 0 for n, s in zip(x.shape[:-2], strides[:-2], strict=True)]
    return Layout.strided((*batch, *x.shape[-2:]), (*bs, *strides[-2:]))


def _run(f, arrays, batch, m, n):
    got = np.full((*batch, m, n), np.nan, np.float32)

    def take(idx, v):
        assert np.isnan(got[idx]), f"element {idx} handed on twice"
        got[idx] = v

    run_func(f, arrays, take)
    return got


CASES = [
    # batch, A shape, B shape
    ((), (7, 13), (13, 9)),
    ((), (9, 30), (30, 37)),          # row tail, several panels and a column tail (nb 16)
    ((), (3, 20), (20, 40)),          # fewer rows than one block
    ((2, 3), (2, 1, 5, 13), (3, 13, 20)),  # broadcast batch dims
    ((4,), (4, 6, 11), (11, 17)),     # B shared by the batch
    ((3,), (1, 8), (3, 8, 18)),       # A shared by the batch
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize(("batch", "sa", "sb"), CASES)
def test_panels_func_matches_numpy(batch, sa, sb, packed, threads):
    rng = np.random.default_rng(len(sa) + sb[-1])
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    m, k, n = sa[-2], sa[-1], sb[-1]
    nb = 16 if n > 16 else n
    ab = Buf("a", "float32", _operand(a, batch))
    if packed:
        bdata = pack_panels(b, nb)
        own = len(sb) - 2
        bs = [0] * (len(batch) - own) + [k * n if d != 1 else 0 for d in sb[:-2]]
        bb = Buf("b", "float32", Layout.strided((*batch, k * n), (*bs, 1)))
    else:
        bdata = b
        bb = Buf("b", "float32", _operand(b, batch))
    f = panels_func(batch, m, n, k, ab, bb, rows=4, nb=nb, packed=packed, threads=threads)
    verify_func(f)
    got = _run(f, {"a": a.ravel().copy(), "b": bdata.ravel().copy()}, batch, m, n)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("batch", "sa", "sb"), [
    ((), (5, 13), (13, 3)),           # k < 2 vectors: one sum
    ((), (4, 40), (40, 2)),           # partial sums and a k tail (8 lanes)
    ((3,), (3, 2, 32), (32, 1)),      # partial sums, no tail; B shared by the batch
    ((2, 3), (2, 1, 3, 20), (3, 20, 5)),
])
def test_dots_func_matches_numpy(batch, sa, sb, threads):
    rng = np.random.default_rng(sa[-1])
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    m, k, n = sa[-2], sa[-1], sb[-1]
    # B given transposed (K contiguous), as the template packs a weight
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    strides = [math.prod(bt.shape[d + 1:]) for d in range(bt.ndim - 2)] + [1, k]
    ab = Buf("a", "float32", _operand(a, batch))
    bb = Buf("b", "float32", _operand(b, batch, strides))
    f = dots_func(batch, m, n, k, ab, bb, lanes=8, threads=threads)
    verify_func(f)
    got = _run(f, {"a": a.ravel().copy(), "b": bt.ravel().copy()}, batch, m, n)
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_one_d_operands_as_stride_zero_dims():
    """A vector x matrix and a matrix x vector: the missing axis a dim of extent 1."""
    rng = np.random.default_rng(3)
    v, mat = rng.standard_normal(13).astype(np.float32), rng.standard_normal((13, 9)).astype(np.float32)
    a = Buf("a", "float32", Layout.strided((1, 13), (0, 1)))
    b = Buf("b", "float32", Layout.strided((13, 9)))
    f = panels_func((), 1, 9, 13, a, b, rows=4, nb=9, packed=False)
    verify_func(f)
    got = _run(f, {"a": v, "b": mat.ravel().copy()}, (), 1, 9)
    np.testing.assert_allclose(got[0], v @ mat, rtol=1e-5, atol=1e-5)
    b = Buf("b", "float32", Layout.strided((13, 1), (1, 0)))
    a = Buf("a", "float32", Layout.strided((9, 13), (1, 9)))  # mat.T read through its strides
    f = dots_func((), 9, 1, 13, a, b, lanes=4)
    verify_func(f)
    got = _run(f, {"a": mat.ravel().copy(), "b": v}, (), 9, 1)
    np.testing.assert_allclose(got[:, 0], mat.T @ v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("batch", "m", "n", "split"), [
    ((4,), 8, 20, "pb"),   # threads over the batch
    ((), 13, 20, "t"),     # over ranges of row blocks (the row tail on the last thread)
    ((), 3, 40, "q"),      # fewer row blocks than threads: over the panels (a tail panel)
    ((1, 3), 5, 20, "pb"),
])
def test_panels_thread_split(batch, m, n, split):
    a = Buf("a", "float32", Layout.strided((*batch, m, 6)))
    b = Buf("b", "float32", Layout.strided((*batch, 6, n)))
    f = panels_func(batch, m, n, 6, a, b, rows=4, nb=16, packed=False, threads=2)
    verify_func(f)
    top = f.body[0]
    while top.kind != "parallel":
        top = top.body[0]
    assert top.var.name.rstrip("0123456789") == split
    assert panels_func(batch, m, n, 6, a, b, rows=4, nb=16, packed=False).body[0].kind != "parallel"


def test_panel_width():
    assert panel_width(9, 13, 256 * 1024) == 9
    assert panel_width(1030, 300, 256 * 1024) == 208
    assert panel_width(5000, 100000, 64 * 1024) == 16
