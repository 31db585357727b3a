"""The loop nest of an elementwise/injective kernel step, and of a copy: every element of the destination
computed once, in row-major order.

What goes in: the destination's shape and dtype, the threads the step is worth. What comes out: a loop-IR
``Func`` (``map_func``) that hands ``In(0, index)`` to the epilogue for every index: the opaque input is
the element the kernel's expression generator computes there (``dlcc.codegen.expr``: the group's fused
elementwise and injective ops inlined into one expression, or a plain load for a copy), the epilogue the
store into the destination. Dims of one element get no loop. Threads: the first dim of more than one
element is split into at most 4 x threads contiguous ranges (a parallel loop over the ranges), each range
writing its own slice of the destination.
"""

from __future__ import annotations

from collections.abc import Callable

from dlcc.lower.lir import Const, Epilogue, Expr, For, Func, In, Stmt, Var
from dlcc.schedule.loops import nest, numbered, share

__all__ = ["map_func"]


def map_func(shape: tuple[int, ...], dtype: str, threads: int = 1, name: str = "map",
             fresh: Callable[[str], str] | None = None) -> Func:
    """``epilogue[index] <- In(0, index)`` over ``shape`` (module docstring); ``threads`` > 1 splits the first
    dim of more than one element."""
    fresh = fresh or numbered()

    def body(idx: list[Expr]) -> tuple[Stmt, ...]:
        return (Epilogue(tuple(idx), In(0, tuple(idx), shape, dtype)),)

    lead = next((d for d, n in enumerate(shape) if n > 1), None)
    if threads <= 1 or lead is None:
        return Func(name, (), nest(shape, fresh, "i", body))
    n = shape[lead]
    parts = min(n, 4 * threads)
    t, i = Var(fresh("t")), Var(fresh("i"))
    rest = nest(shape[lead + 1:], fresh, "i", lambda idx: body([*[Const(0)] * lead, i, *idx]))
    ranges = For(i, *share(t, n, parts), rest)
    return Func(name, (), (For(t, Const(0), Const(parts), (ranges,), "parallel"),))
