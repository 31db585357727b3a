"""The loop nest of an elementwise/injective kernel step, and of a copy: every element of the destination
computed once, in row-major order.

What goes in: the destination's shape and dtype, the threads the step is worth. What comes out: a loop-IR
``Func`` (``map_func``) that hands ``In(0, index)`` to the epilogue for every index: the opaque input is
the element the kernel computes there (``fill_map`` puts it in: ``dlcc.lower.element``'s expression of the group's
fused elementwise and injective ops, or a plain load for a copy), the epilogue the
store into the destination. Dims of one element get no loop. Threads: the first dim of more than one
element is split into at most 4 x threads contiguous ranges (a parallel loop over the ranges), each range
writing its own slice of the destination. ``tile`` (a transposing step: the destination axis ``a`` that is the
source's last, and the destination's last axis): those two loops blocked into ``block`` x ``block`` tiles, the
tile loops innermost, so that reads along the source's rows and writes along the destination's rows both stay
within a few cache lines; innermost the one whose other side moves by the smaller stride (``reads_inner``: along
the source's last axis, the writes then a destination row apart). ConvNeXt's 56 x 56 x 96 NHWC -> NCHW:
0.138 -> 0.047 ms (writes inner, reads 96 floats apart, not 3136); NCHW -> NHWC: 0.077 -> 0.073 (reads inner).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx_ir as ir

from dlcc.lower.lir import Buf, Const, Epilogue, Expr, For, Func, In, Lane, Let, Stmt, Store, Var, rewrite_stmts
from dlcc.schedule.loops import nest, numbered
from dlcc.schedule.transform import drop_unit_loops, loop_names, parallelize, reorder, split

__all__ = ["fill_map", "inlined_nodes", "map_func"]


def inlined_nodes(v: ir.Value, materialized: Callable[[ir.Value], bool]) -> list[ir.Node]:
    """The nodes a loop step's element expression of ``v`` computes: its producer, and theirs up to the values
    that are ``materialized`` (buffers, constants)."""
    out: list[ir.Node] = []
    todo, seen = [v], set()
    while todo:
        n = todo.pop().producer()
        if n is None or n in seen:
            continue
        seen.add(n)
        out.append(n)
        todo += [i for i in n.inputs if i is not None and not materialized(i)]
    return out


def map_func(shape: tuple[int, ...], dtype: str, threads: int = 1, name: str = "map",
             fresh: Callable[[str], str] | None = None, tile: tuple[int, int, bool] | None = None,
             order: tuple[int, ...] | None = None, block: int = 0) -> Func:
    """``epilogue[index] <- In(0, index)`` over ``shape`` (module docstring); ``threads`` > 1 splits the first
    dim of more than one element; ``tile``: (axis, block, reads_inner), that axis and the last one blocked;
    ``order``: the dims from the outermost loop to the innermost (a destination stored in another order than
    its logical one, e.g. channels-last: its memory order), row-major when None; ``block``: an (N, C, H, W)
    destination in channel blocks of ``block`` (``schedule.blocked``): loops over the blocks, images, rows,
    columns and, innermost, the channels of a block, the channel a ``Lane`` (addressed with no division). The
    algorithm is a plain nest; threads and tiles are transformations of it (``schedule.transform``)."""
    fresh = fresh or numbered()
    if block:
        return _blocked(shape, dtype, threads, name, fresh, block)
    if tile is not None:
        return _tiled(shape, dtype, threads, name, fresh, *tile)
    perm = list(order) if order is not None else list(range(len(shape)))
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"map: loop order {order} is not a permutation of {len(shape)} dims")
    pshape = [shape[d] for d in perm]

    def body(pidx: list[Expr]) -> tuple[Stmt, ...]:
        idx: list[Expr] = [Const(0)] * len(shape)
        for d, i in zip(perm, pidx, strict=True):
            idx[d] = i
        return (Epilogue(tuple(idx), In(0, tuple(idx), shape, dtype)),)

    return _threaded_nest(pshape, body, threads, name, fresh)


def _threaded_nest(pshape: list[int], body: Callable[[list[Expr]], tuple[Stmt, ...]], threads: int, name: str,
                   fresh: Callable[[str], str]) -> Func:
    """The plain nest over ``pshape`` around ``body``; with ``threads`` > 1, its outermost loop (the first dim of
    more than one element) in shares."""
    split_threads = threads > 1 and any(n > 1 for n in pshape)
    thread = fresh("t") if split_threads else ""
    f = Func(name, (), nest(pshape, fresh, "i", body))
    if split_threads:
        f = parallelize(f, loop_names(f)[0], 4 * threads, thread)
    return f


def _blocked(shape: tuple[int, ...], dtype: str, threads: int, name: str, fresh: Callable[[str], str],
             block: int) -> Func:
    """``map_func`` over an (N, C, H, W) destination in channel blocks of ``block``, in its memory order (module
    docstring of ``schedule.blocked``: the blocks outermost, the images inside them); threads over the blocks (or
    the images where there is one block)."""
    if len(shape) != 4 or shape[1] % block:
        raise ValueError(f"map: shape {shape} is not (N, C, H, W) in whole channel blocks of {block}")
    n, c, h, w = shape
    pshape = [c // block, n, h, w]
    lane = Var(fresh("l"))

    def body(pidx: list[Expr]) -> tuple[Stmt, ...]:
        cb, b, y, x = pidx
        idx = (b, Lane(cb, lane, block), y, x)
        return (For(lane, Const(0), Const(block), (Epilogue(idx, In(0, idx, shape, dtype)),), "vectorized"),)

    return _threaded_nest(pshape, body, threads, name, fresh)


def _tiled(shape: tuple[int, ...], dtype: str, threads: int, name: str, fresh: Callable[[str], str], a: int,
           block: int, reads_inner: bool) -> Func:
    """``map_func`` with axis ``a`` and the last axis blocked (module docstring): the plain nest, both axes split
    into blocks, the two in-block loops moved inside (in the order ``reads_inner`` says), the loops over one
    block dropped; threads over the first loop of more than one iteration."""
    last = len(shape) - 1
    if shape[a] == 1 or shape[last] == 1 or a == last:
        return map_func(shape, dtype, threads, name, fresh)
    extents = [-(-n // block) if d in (a, last) else n for d, n in enumerate(shape)]  # the outer loops
    names = [fresh("o" if d in (a, last) else "i") if e > 1 else "" for d, e in enumerate(extents)]
    ti, tj = fresh("ti"), fresh("tj")
    names[a] = names[a] or f"{ti}_blocks"  # (a loop over one block: dropped below)
    names[last] = names[last] or f"{tj}_blocks"
    lead = next((d for d, e in enumerate(extents) if e > 1), None)
    thread = fresh("t") if threads > 1 and lead is not None else ""

    def body(idx: list[Expr]) -> tuple[Stmt, ...]:
        return (Epilogue(tuple(idx), In(0, tuple(idx), shape, dtype)),)

    f = Func(name, (), nest(shape, lambda v: v, names, body))
    f = split(split(f, names[a], block, names[a], ti), names[last], block, names[last], tj)
    chain = loop_names(f)[loop_names(f).index(names[a]):]
    f = reorder(f, [n for n in chain if n not in (ti, tj)] + ([tj, ti] if reads_inner else [ti, tj]))
    f = drop_unit_loops(f, {names[a], names[last]})
    if thread:
        f = parallelize(f, names[lead], 4 * threads, thread)
    return f


def fill_map(f: Func, dst: Buf, element: Callable[[tuple[Expr, ...]], tuple[list[Let], Expr]],
             params: Iterable[Buf]) -> Func:
    """``f`` (a ``map_func`` nest, transformed or not) with each ``epilogue[index] <- In(0, index)`` replaced by the
    element's computation: ``element(index)`` -> (the locals it binds, its expression), stored into ``dst`` at
    ``index``. ``params``: the buffers it reads and ``dst``."""
    def fill(s: Stmt) -> tuple[Stmt, ...] | None:
        if isinstance(s, Epilogue) and s.dest is None and isinstance(s.value, In):
            lets, value = element(s.index)
            return (*lets, Store(dst, s.index, value))
        return None
    return Func(f.name, tuple(params), rewrite_stmts(f.body, fill), f.workspace)
