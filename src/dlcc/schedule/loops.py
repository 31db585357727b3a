"""Small helpers the loop-IR builders of ``dlcc.schedule`` share.

What goes in: extents, a name generator, a body builder. What comes out: loop-IR statements (``nest``),
fresh variable names (``numbered``) and a thread's share of a range (``share``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dlcc.lower.lir import Const, Expr, For, Stmt, Var, simplify

__all__ = ["nest", "numbered", "share"]


def numbered() -> Callable[[str], str]:
    """Fresh names prefix0, prefix1, ... (a builder's default ``fresh``: nested loops need distinct names)."""
    seen: dict[str, int] = {}

    def fresh(prefix: str) -> str:
        seen[prefix] = seen.get(prefix, -1) + 1
        return f"{prefix}{seen[prefix]}"
    return fresh


def share(t: Expr, n: int, parts: int) -> tuple[Expr, Expr]:
    """Part ``t``'s contiguous share [lo, hi) of range(n) split in ``parts`` (all of it for one part)."""
    if parts == 1:
        return Const(0), Const(n)
    return simplify(t * n // parts), simplify((t + 1) * n // parts)


def nest(shape: Sequence[int], fresh: Callable[[str], str], prefix: str | Sequence[str],
         body: Callable[[list[Expr]], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
    """A row-major loop nest over ``shape`` around ``body(index)``; dims of extent 1 get index 0 and no loop.
    ``prefix``: the variables' name prefix (one, or one per dim)."""
    names = [prefix] * len(shape) if isinstance(prefix, str) else prefix
    idx: list[Expr] = [Var(fresh(v)) if d != 1 else Const(0) for v, d in zip(names, shape, strict=True)]
    out = body(idx)
    for i, d in reversed(list(zip(idx, shape, strict=True))):
        if isinstance(i, Var):
            out = (For(i, Const(0), Const(d), out),)
    return out
