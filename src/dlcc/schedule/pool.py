"""The loop IR of the pools the depthwise plane kernel (``schedule.dwconv``) does not take: windowed pools of
any spatial rank over any strides, and global pools.

What goes in: the pool's geometry (``PoolGeometry``: per spatial dim input and output length, kernel,
stride, dilation, begin pad), the input and accumulator buffers, and for AveragePool the divisor of each
output position as one factor per spatial dim (a constant, or a float32 table of the output length).
What comes out: a ``Func`` (``pool_func``, ``global_pool_func``) that hands every output element once to
the fused epilogue (or, without one, leaves the result in the accumulator buffer).

Windowed pool (``pool_func``), per (n, c) plane: the plane of the accumulator is set to the neutral value,
then the loop nest (k0, t0, k1, t1, ...) over kernel taps ``k`` and the output positions ``t`` whose input
position ``t*s + k*d - p`` is inside the input (the range of ``t`` is a function of ``k``, computed in the
loop bounds), so the innermost loop is branch-free and contiguous on the output; then each element is
divided by its window's count and handed on. Global pool (``global_pool_func``), per (n, c): a contiguous
plane of at least one vector is combined into ``lanes`` partial results (a vectorizable accumulator) that
are merged at the end; any other plane runs its loop nest into one scalar.
Both also take the maximum (MaxPool, GlobalMaxPool): ``acc < v ? v : acc`` (``running_max``), a Select of a
float comparison, so a NaN input element is skipped (as a vector max does) and a window of NaNs gives -inf (a
global pool's partial maxima start from the plane's first vector: a NaN there stays).
Sums run in a different order than onnxruntime (tests use rtol 1e-4 for the averaging ops).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dlcc.lower.lir import (
    Alloc,
    Bin,
    Buf,
    Const,
    Epilogue,
    Expr,
    For,
    Func,
    Layout,
    Load,
    Select,
    Stmt,
    Store,
    Var,
    simplify,
)
from dlcc.schedule.loops import nest, numbered, share
from dlcc.schedule.transform import loop_names, parallelize

__all__ = ["PoolGeometry", "global_pool_blocked_func", "global_pool_channels_last", "global_pool_func", "pool_counts",
           "pool_func", "running_max", "window_range"]


@dataclass(frozen=True)
class PoolGeometry:
    """Per spatial dim: input length, output length, kernel, stride, dilation, begin pad."""
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    ks: tuple[int, ...]
    strides: tuple[int, ...]
    dils: tuple[int, ...]
    pads: tuple[int, ...]


def window_range(T: int, L: int, s: int, d: int, p: int, k: int) -> tuple[int, int]:
    """The output positions [lo, hi) of [0, T) whose input position ``t*s + k*d - p`` at tap k is in [0, L)."""
    lo = max(0, -((k * d - p) // s))  # ceil((p - k*d) / s)
    return lo, max(lo, min(T, (L - 1 + p - k * d) // s + 1))


def pool_counts(g: PoolGeometry, end_pads: Sequence[int], include_pad: bool) -> list[list[int]]:
    """AveragePool's divisor of output position t as one factor per spatial dim: the taps inside the input
    (``include_pad`` 0), or inside the padded input without the ceil_mode overhang (1, as onnxruntime)."""
    counts = []
    for i, o, k, s, d, a, e in zip(g.ins, g.outs, g.ks, g.strides, g.dils, g.pads, end_pads, strict=True):
        lo, hi = (-a, i + e) if include_pad else (0, i)
        counts.append([sum(1 for j in range(k) if lo <= t * s - a + j * d < hi) for t in range(o)])
    return counts


def running_max(acc: Expr, v: Expr) -> Expr:
    """The running maximum ``acc < v ? v : acc``: a NaN ``v`` is skipped (MaxPool's semantics in dlcc)."""
    return Select(Bin("<", acc, v), v, acc)


def _bounds(T: int, L: int, s: int, d: int, p: int, K: int, k: Expr) -> tuple[Expr, Expr]:
    """``window_range`` as int64 expressions of the tap ``k`` (numerators kept >= 0: C divides toward zero)."""
    ranges = [window_range(T, L, s, d, p, j) for j in range(K)]
    lo: Expr = Const(ranges[0][0])
    if len({r[0] for r in ranges}) > 1:
        if p - (K - 1) * d < 0:
            lo = (Bin("max", Const(p) - k * d, Const(0)) + (s - 1)) // s
        else:
            lo = (Const(p + s - 1) - k * d) // s
    hi: Expr = Const(ranges[0][1])
    if len({r[1] for r in ranges}) > 1:
        num: Expr = Const(L - 1 + p + s) - k * d
        if L - 1 + p + s - (K - 1) * d < 0:
            num = Bin("max", num, Const(0))
        hi = num // s
        if (L - 1 + p + s) // s > T:
            hi = Bin("min", Const(T), hi)
    return simplify(lo), simplify(hi)


def pool_func(g: PoolGeometry, x: Buf, s: Buf, counts: Sequence[Buf | float] | None, epilogue: bool,
              name: str = "pool", fresh: Callable[[str], str] | None = None) -> Func:
    """``x`` (N, C, *ins) and ``s`` (N, C, *outs), any strides. ``counts`` (AveragePool): per spatial dim the
    window counts, a constant or a float32 table (outs[d],); the average of position t is ``s[t] / prod(counts)``.
    None: MaxPool (the maximum over the taps inside, -inf where there is none). With ``epilogue`` every result
    goes to the epilogue, else an average is written back to ``s`` (a maximum already is there)."""
    N, C = x.shape[:2]
    r = len(g.ins)
    fresh = fresh or numbered()
    is_max = counts is None
    init = Const(-math.inf if is_max else 0.0, "float32")
    tables = [c for c in counts or () if isinstance(c, Buf)]

    def plane(n: Expr, c: Expr) -> tuple[Stmt, ...]:
        setup = nest(g.outs, fresh, "s", lambda t: (Store(s, (n, c, *t), init),))

        def level(d: int, ts: list[Expr], xs: list[Expr]) -> tuple[Stmt, ...]:
            K = g.ks[d]
            k: Expr = Var(fresh("k")) if K > 1 else Const(0)
            t = Var(fresh("t"))
            lo, hi = _bounds(g.outs[d], g.ins[d], g.strides[d], g.dils[d], g.pads[d], K, k)
            ti, xi = [*ts, t], [*xs, simplify(t * g.strides[d] + k * g.dils[d] - g.pads[d])]
            if d == r - 1:
                acc, v = Load(s, (n, c, *ti)), Load(x, (n, c, *xi))
                inner: tuple[Stmt, ...] = (Store(s, (n, c, *ti), running_max(acc, v) if is_max else acc + v),)
            else:
                inner = level(d + 1, ti, xi)
            body: tuple[Stmt, ...] = (For(t, lo, hi, inner),)
            return (For(k, Const(0), Const(K), body),) if isinstance(k, Var) else body

        def finish(t: list[Expr]) -> tuple[Stmt, ...]:
            value: Expr = Load(s, (n, c, *t))
            if not is_max:
                const = math.prod(cnt for cnt in counts if not isinstance(cnt, Buf))
                div: Expr | None = Const(float(const), "float32") if const != 1 or not tables else None
                for cnt, i in zip(counts, t, strict=True):
                    if isinstance(cnt, Buf):
                        div = Load(cnt, (i,)) if div is None else div * Load(cnt, (i,))
                value = Bin("/", value, div)
            if epilogue:
                return (Epilogue((n, c, *t), value),)
            return () if is_max else (Store(s, (n, c, *t), value),)

        return (*setup, *level(0, [], []), *(nest(g.outs, fresh, "s", finish) if epilogue or not is_max else ()))

    body = nest((N, C), fresh, ("n", "c"), lambda nc: plane(*nc))
    return Func(name, (x, s, *tables), body)


def global_pool_func(x: Buf, lanes: int, is_max: bool, name: str = "global_pool",
                     fresh: Callable[[str], str] | None = None, threads: int = 1) -> Func:
    """The average (or maximum) of each plane of ``x`` (N, C, *spatial), any strides, handed to the epilogue
    as element (n, c). A rank-3 ``x`` with unit last stride and at least ``lanes`` elements per plane (the
    template flattens contiguous planes to that) takes ``lanes`` partial results. ``threads`` > 1: the outer
    loop (images, or channels for one image) in that many shares (``schedule.transform.parallelize``)."""
    N, C, *sp = x.shape
    size = math.prod(sp)
    fresh = fresh or numbered()

    def combine(a: Expr, v: Expr) -> Expr:
        return running_max(a, v) if is_max else a + v

    if global_pool_channels_last(x):
        return _global_pool_channels_last(x, is_max, name, fresh, threads, combine)

    def plane(n: Expr, c: Expr) -> tuple[Stmt, ...]:
        res = Buf(fresh("r"), "float32", Layout.strided((1,)), "register")

        def into_res(v: Expr) -> Stmt:
            return Store(res, (Const(0),), combine(Load(res, (Const(0),)), v))

        if len(sp) == 1 and x.layout.dims[-1][3] == 1 and size >= lanes:
            acc = Buf(fresh("acc"), "float32", Layout.strided((lanes,)), "register")
            i, j = Var(fresh("p")), Var(fresh("l"))
            full = size // lanes * lanes
            steps: tuple[Stmt, ...] = (
                For(j, Const(0), Const(lanes), (Store(acc, (j,), Load(x, (n, c, j))),)),
                For(i, Const(1), Const(size // lanes), (For(j, Const(0), Const(lanes), (
                    Store(acc, (j,), combine(Load(acc, (j,)), Load(x, (n, c, i * lanes + j)))),)),)),
                Store(res, (Const(0),), Load(acc, (Const(0),))),
                For(j, Const(1), Const(lanes), (into_res(Load(acc, (j,))),)))
            if full < size:
                steps += (For(i, Const(full), Const(size), (into_res(Load(x, (n, c, i))),)),)
            steps = (Alloc(acc, steps),)
        else:
            init = Const(-math.inf if is_max else 0.0, "float32")
            steps = (Store(res, (Const(0),), init),
                     *nest(sp, fresh, "s", lambda idx: (into_res(Load(x, (n, c, *idx))),)))
        value: Expr = Load(res, (Const(0),))
        if not is_max:
            value = Bin("/", value, Const(float(size), "float32"))
        return (Alloc(res, (*steps, Epilogue((n, c), value))),)

    thread = fresh("t") if threads > 1 and N * C > 1 else ""
    f = Func(name, (x,), nest((N, C), fresh, ("n", "c"), lambda nc: plane(*nc)))
    return parallelize(f, loop_names(f)[0], threads, thread) if thread else f


def global_pool_channels_last(x: Buf) -> bool:
    """Does ``global_pool_func`` read ``x`` (N, C, *spatial) pixel by pixel, every channel along a vector loop?
    Where its channels are contiguous (a channels-last buffer: read plane by plane, each element would be its own
    cache line)."""
    strides = x.layout.plain_strides
    return len(x.shape) >= 3 and x.shape[1] > 1 and math.prod(x.shape[2:]) > 1 and strides is not None \
        and strides[1] == 1


def _global_pool_channels_last(x: Buf, is_max: bool, name: str, fresh: Callable[[str], str], threads: int,
                               combine: Callable[[Expr, Expr], Expr]) -> Func:
    """Per image (threads over shares of the channels): a stack row of C running results set to the neutral
    value, combined with every pixel's channels in memory order (the inner loop over contiguous channels,
    vectorized), then each divided (average) and handed to the epilogue as element (n, c)."""
    N, C, *sp = x.shape
    size = math.prod(sp)
    T = max(1, min(threads, C))
    t, n, c = Var(fresh("t")), Var(fresh("n")), Var(fresh("c"))
    lo, hi = share(t if T > 1 else Const(0), C, T)
    acc = Buf(fresh("acc"), "float32", Layout.strided((C,)), "stack")
    init = Const(-math.inf if is_max else 0.0, "float32")
    value: Expr = Load(acc, (c,))
    if not is_max:
        value = Bin("/", value, Const(float(size), "float32"))
    per_image: tuple[Stmt, ...] = (Alloc(acc, (
        For(c, lo, hi, (Store(acc, (c,), init),), "vectorized"),
        *nest(sp, fresh, "s", lambda idx: (For(c, lo, hi, (
            Store(acc, (c,), combine(Load(acc, (c,)), Load(x, (n, c, *idx)))),), "vectorized"),)),
        For(c, lo, hi, (Epilogue((n, c), value),)))),)
    body: tuple[Stmt, ...] = (For(n, Const(0), Const(N), per_image),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (x,), body)


def global_pool_blocked_func(x: Buf, batch: int, channels: int, plane: tuple[int, int],
                             ring: tuple[int, int, int, int], lanes: int, is_max: bool, name: str = "global_pool",
                             fresh: Callable[[str], str] | None = None, threads: int = 1) -> Func:
    """The average (or maximum) of each (H, W) ``plane`` of an input stored in channel blocks of ``lanes`` (``x``:
    its base as one flat run, blocks outside the ``batch`` images, each block's plane within its ``ring``,
    rows above, below, columns left, right: ``schedule.blocked``), handed to the epilogue as element (n, c). Per
    block (threads over shares of the blocks) and image: one vector of running results set to the neutral value,
    combined with each pixel's block of channels (one vector load, the ring skipped), then divided (average)."""
    fresh = fresh or numbered()
    h, w = plane
    top, bottom, left, right = ring
    row = (w + left + right) * lanes
    size = (h + top + bottom) * row
    ncb = channels // lanes
    if channels % lanes or x.layout.span < ncb * batch * size:
        raise ValueError("global pool: the input is not whole channel blocks of its planes")
    T = max(1, min(threads, ncb))
    t, blk, n, y, col, j = (Var(fresh(v)) for v in ("t", "cb", "n", "y", "x", "l"))
    lo, hi = share(t if T > 1 else Const(0), ncb, T)
    acc = Buf(fresh("acc"), "float32", Layout.strided((lanes,)), "register")
    init = Const(-math.inf if is_max else 0.0, "float32")
    at = blk * (batch * size) + n * size + (y + top) * row + (col + left) * lanes + j
    v = Load(x, (simplify(at),))
    value: Expr = Load(acc, (j,))
    if not is_max:
        value = Bin("/", value, Const(float(h * w), "float32"))
    per_block: tuple[Stmt, ...] = (For(n, Const(0), Const(batch), (Alloc(acc, (
        For(j, Const(0), Const(lanes), (Store(acc, (j,), init),), "vectorized"),
        For(y, Const(0), Const(h), (For(col, Const(0), Const(w), (For(j, Const(0), Const(lanes), (
            Store(acc, (j,), running_max(Load(acc, (j,)), v) if is_max else Load(acc, (j,)) + v),),
            "vectorized"),)),)),
        For(j, Const(0), Const(lanes), (Epilogue((n, simplify(blk * lanes + j)), value),)))),)),)
    body: tuple[Stmt, ...] = (For(blk, lo, hi, per_block),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (x,), body)
