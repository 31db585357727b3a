"""Small helpers the loop-IR builders of ``dlcc.schedule`` share.

What goes in: extents, a name generator, a body builder. What comes out: loop-IR statements (``nest``),
fresh variable names (``numbered``), a thread's share of a range (``share``) and the rows of a band that stays
in L2 (``l2_quarter_rows``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dlcc.lower.lir import Const, Expr, For, Stmt, Var, simplify

__all__ = ["PAR_MIN_FLOPS", "PAR_MIN_FLOPS_WS", "l2_quarter_rows", "nest", "numbered", "share"]

# below this much work a kernel runs on one thread: a dispatch to the pool's spinning worker costs about a
# microsecond, so 0.5 MFLOP (2-3 us at one thread) still gains (the kit's residual block, two 1.2 MFLOP 3x3
# convolutions of 16 channels at 16 x 16: 16.5 -> 11.1 us at 2 threads; at the old bound of 2 MFLOP they ran on
# one thread and onnxruntime's 2 threads were 10% faster)
PAR_MIN_FLOPS = 5e5
# the same for kernels whose every thread needs its own workspace (a GEMM's packed panels, Winograd's V and M, the
# fused 1x1 -> depthwise pair's rows): below this their second thread's workspace costs more arena than the
# microseconds it saves (a 240 -> 8 channel 1x1 convolution at 14 x 14 as a GEMM on 2 threads: 188 KB more)
PAR_MIN_FLOPS_WS = 2e6


def numbered() -> Callable[[str], str]:
    """Fresh names prefix0, prefix1, ... (a builder's default ``fresh``: nested loops need distinct names)."""
    seen: dict[str, int] = {}

    def fresh(prefix: str) -> str:
        seen[prefix] = seen.get(prefix, -1) + 1
        return f"{prefix}{seen[prefix]}"
    return fresh


def l2_quarter_rows(l2_bytes: int, row_bytes: int) -> int:
    """Rows of ``row_bytes`` each that fit in a quarter of L2: a band of input that stays there while every
    channel tile or block reads it (the direct kernel's "rows" bands and flattened rows, the depthwise kernel's
    rows-outer parts)."""
    return (l2_bytes // 4) // row_bytes


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
