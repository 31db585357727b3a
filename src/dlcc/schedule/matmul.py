"""The loop IR of the matrix products the packed GEMM (``schedule.gemm``) does not take: few output columns,
a B per batch that is a weight, broadcast batch dims, 1-D operands, a run-time B of Gemm.

What goes in: the product's batch dims and sizes (M rows, N columns, K), A and B as buffers of the
product's logical shapes (``a`` (*batch, M, K), ``b`` (*batch, K, N): a broadcast batch dim or a 1-D
operand's missing axis is a dim of stride 0; a weight B may instead be packed by ``pack_panels``), the
target's figures and the threads the work is worth. What comes out: a ``Func`` that hands
``C[*b, i, j] = sum_k A[*b, i, k] * B[*b, k, j]`` to the fused epilogue (index (*b, i, j)), each once.

``panels_func`` (N >= MIN_N): per product, B's columns are split into panels of ``nb`` columns (``nb * K``
floats sized to stay in L2: ``panel_width``), and for each panel the rows of A are taken ``rows`` at a
time: a local accumulator block ``acc[rows][nb]`` (L1 resident) is updated for every k with
``acc[r][j] += a_r * B[k, j0 + j]`` (the rows' A values in registers, a contiguous inner j loop that
vectorizes, each B load feeding ``rows`` FMAs), then handed on. A weight B is packed at compile time
panel by panel (panel p holds ``B[:, j0:j0+nb]`` row-major), so the inner loop streams one contiguous panel.
``dots_func`` (N < MIN_N): per (i, j) a dot product along k, in ``lanes`` partial sums once K holds two
vectors (a weight B is best given transposed, K contiguous).
Threads: over the first batch dim of more than one product when it has at least as many products as
threads; for a single product, over ranges of row blocks (B stays in each core's L2), or over the panels
when there are fewer row blocks than threads.
Sums run in a different order than onnxruntime: compared with rtol 1e-4 (DESIGN tolerance for matmul).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dlcc.lower.lir import Alloc, Bin, Buf, Const, Epilogue, Expr, For, Func, If, Layout, Load, Stmt, Store, Var
from dlcc.schedule.loops import nest, numbered
from dlcc.schedule.transform import loop_names, mark

__all__ = ["dots_func", "pack_panels", "panel_width", "panels_func"]

NB_MAX = 256


def panel_width(n: int, k: int, panel_bytes: int) -> int:
    """Columns per panel of B: ``panel_bytes`` of K x nb floats, a multiple of 16 in [16, NB_MAX]."""
    nb = panel_bytes // (4 * max(k, 1))
    nb = max(16, min(NB_MAX, nb - nb % 16))
    return n if n <= nb else nb


def pack_panels(b: np.ndarray, nb: int) -> np.ndarray:
    """[..., K, N] -> [..., K*N] with panels of nb columns, each row-major [K, w]."""
    n = b.shape[-1]
    parts = [b[..., :, j0:j0 + nb].reshape(*b.shape[:-2], -1) for j0 in range(0, n, nb)]
    return np.concatenate(parts, axis=-1).astype(np.float32)


def _f32(x: float) -> Const:
    return Const(float(x), "float32")


def _batches(batch: tuple[int, ...], threads: int, fresh: Callable[[str], str],
             body: Callable[[list[Expr], int], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
    """The loops over the batch dims around ``body(batch index, threads left for one product)``: threads over
    the first batch dim of more than one product when it has at least ``threads``; the product itself gets
    them only when it is the only one."""
    lead = next((d for d, e in enumerate(batch) if e > 1), None)
    if threads > 1 and lead is not None and batch[lead] >= threads:  # (the loops before it: one product each)
        loops = nest(batch, fresh, ["pb" if d == lead else "b" for d in range(len(batch))], lambda bidx: body(bidx, 1))
        return mark(loops, loop_names(loops)[0], "parallel")
    return nest(batch, fresh, "b", lambda bidx: body(bidx, threads if math.prod(batch) == 1 else 1))


def panels_func(batch: tuple[int, ...], m: int, n: int, k: int, a: Buf, b: Buf, *, rows: int, nb: int,
                packed: bool, threads: int = 1, name: str = "matmul_panels",
                fresh: Callable[[str], str] | None = None) -> Func:
    """The panel kernel (module docstring). ``b`` is (*batch, K, N), or with ``packed`` (*batch, K*N) as
    ``pack_panels(B, nb)`` lays it out; ``rows`` rows of A per block; ``threads``: the pool's threads when
    the product is worth splitting, else 1."""
    fresh = fresh or numbered()
    nfull, ntail = divmod(n, nb)
    mfull, mtail = divmod(m, rows)
    npanels = nfull + (ntail > 0)

    def block(bidx: list[Expr], i0: Expr, mr: int, j0: Expr, w: int) -> Stmt:
        """Rows [i0, i0 + mr) x columns [j0, j0 + w): accumulated over all of K, then handed on."""
        acc = Buf(fresh("acc"), "float32", Layout.strided((mr, w)), "stack")
        av = Buf(fresh("a"), "float32", Layout.strided((mr,)), "register")
        kk, j, r = Var(fresh("k")), Var(fresh("j")), Var(fresh("r"))
        bv = Load(b, (*bidx, j0 * k + kk * w + j) if packed else (*bidx, kk, j0 + j))
        fma = Store(acc, (r, j), Load(acc, (r, j)) + Load(av, (r,)) * bv)
        return Alloc(acc, (
            For(r, Const(0), Const(mr), (For(j, Const(0), Const(w), (Store(acc, (r, j), _f32(0)),)),)),
            For(kk, Const(0), Const(k), (Alloc(av, (
                For(r, Const(0), Const(mr), (Store(av, (r,), Load(a, (*bidx, i0 + r, kk))),), "unrolled"),
                For(j, Const(0), Const(w), (For(r, Const(0), Const(mr), (fma,), "unrolled"),)))),)),
            For(r, Const(0), Const(mr), (For(j, Const(0), Const(w), (
                Epilogue((*bidx, i0 + r, j0 + j), Load(acc, (r, j))),)),))))

    def loop(lo: Expr, hi: Expr, prefix: str, fn: Callable[[Expr], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        """``fn(v)`` for v in [lo, hi), without a loop when that is a single constant value."""
        if isinstance(lo, Const) and isinstance(hi, Const) and hi.value - lo.value <= 1:
            return fn(lo) if hi.value > lo.value else ()
        v = Var(fresh(prefix))
        return (For(v, lo, hi, fn(v)),)

    def panel(bidx: list[Expr], j0: Expr, w: int, rb0: Expr, rb1: Expr, tail_if: Expr | None = None) -> tuple[
            Stmt, ...]:
        """Row blocks [rb0, rb1) of the panel at column ``j0``, then the row tail (only where ``tail_if``)."""
        out = loop(rb0, rb1, "i", lambda ib: (block(bidx, ib * rows, rows, j0, w),))
        if mtail:
            tail = block(bidx, Const(mfull * rows), mtail, j0, w)
            out += (If(tail_if, (tail,)),) if tail_if is not None else (tail,)
        return out

    def panels(bidx: list[Expr], rb0: Expr, rb1: Expr, tail_if: Expr | None = None) -> tuple[Stmt, ...]:
        out = loop(Const(0), Const(nfull), "jb", lambda jb: panel(bidx, jb * nb, nb, rb0, rb1, tail_if))
        if ntail:
            out += panel(bidx, Const(nfull * nb), ntail, rb0, rb1, tail_if)
        return out

    def product(bidx: list[Expr], par: int) -> tuple[Stmt, ...]:
        T = min(par, mfull)
        if T > 1:  # threads over ranges of row blocks, each through every panel
            t = Var(fresh("t"))
            return (For(t, Const(0), Const(T), panels(bidx, t * mfull // T, (t + 1) * mfull // T,
                                                      Bin("==", t, Const(T - 1))), "parallel"),)
        if par > 1 and npanels > 1:  # few rows: threads over the panels
            q = Var(fresh("q"))
            one = panel(bidx, q * nb, nb, Const(0), Const(mfull))
            if ntail:
                tail = panel(bidx, Const(nfull * nb), ntail, Const(0), Const(mfull))
                one = (If(Bin("<", q, Const(nfull)), one, tail),) if nfull else tail
            return (For(q, Const(0), Const(npanels), one, "parallel"),)
        return panels(bidx, Const(0), Const(mfull))

    return Func(name, (a, b), _batches(batch, threads, fresh, product))


def dots_func(batch: tuple[int, ...], m: int, n: int, k: int, a: Buf, b: Buf, *, lanes: int, threads: int = 1,
              name: str = "matmul_dots", fresh: Callable[[str], str] | None = None) -> Func:
    """The dot-product kernel (module docstring): ``a`` (*batch, M, K), ``b`` (*batch, K, N); ``threads``:
    the pool's threads when the product is worth splitting (only ever over the batch), else 1."""
    fresh = fresh or numbered()

    def product(bidx: list[Expr], par: int) -> tuple[Stmt, ...]:
        i, j = Var(fresh("i")), Var(fresh("j"))

        def term(kk: Expr) -> Expr:
            return Load(a, (*bidx, i, kk)) * Load(b, (*bidx, kk, j))

        if k >= 2 * lanes:
            lane = Buf(fresh("lane"), "float32", Layout.strided((lanes,)), "register")
            kb, ln, kk = Var(fresh("k")), Var(fresh("l")), Var(fresh("k"))
            total: Expr = Load(lane, (Const(0),))
            for q in range(1, lanes):
                total = total + Load(lane, (Const(q),))
            steps: tuple[Stmt, ...] = (
                For(ln, Const(0), Const(lanes), (Store(lane, (ln,), _f32(0)),)),
                For(kb, Const(0), Const(k // lanes), (For(ln, Const(0), Const(lanes), (
                    Store(lane, (ln,), Load(lane, (ln,)) + term(kb * lanes + ln)),)),)))
            if k % lanes:
                steps += (For(kk, Const(k - k % lanes), Const(k), (
                    Store(lane, (Const(0),), Load(lane, (Const(0),)) + term(kk)),)),)
        else:
            lane = Buf(fresh("s"), "float32", Layout.strided((1,)), "register")
            kk = Var(fresh("k"))
            total = Load(lane, (Const(0),))
            steps = (Store(lane, (Const(0),), _f32(0)),
                     For(kk, Const(0), Const(k), (Store(lane, (Const(0),), total + term(kk)),)))
        dot = Alloc(lane, (*steps, Epilogue((*bidx, i, j), total)))
        return (For(i, Const(0), Const(m), (For(j, Const(0), Const(n), (dot,)),)),)

    return Func(name, (a, b), _batches(batch, threads, fresh, product))
