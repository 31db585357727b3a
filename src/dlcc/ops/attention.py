"""dlcc::Attention's operand layouts (shared by the graph rewrite, the cost model and the backend).

Layout codes, one per operand in the ``layout`` attribute [q, k, v, out]: 0 = [B, S, W] with the heads not split:
head h is columns ``offset + h*D`` to ``offset + (h+1)*D`` (``offsets`` [q, k, v], default 0; the output's offset
is 0), so Q, K and V may be column ranges of one merged projection; 1 = [B, H, S, D]; 2 (keys only) =
[B, H, D, S] (K transposed). ``head_size`` D (0: W / H of a code-0 operand, or the last dim of a 4-D one).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["attention_attrs", "attention_dims"]


def attention_attrs(get) -> tuple[int, list[int], int, list[int]]:
    """``get(name, default)``: an attribute getter. Returns (num_heads, layout, head_size, offsets)."""
    heads = int(get("num_heads", 0))
    layout = [int(x) for x in get("layout", [1, 2, 1, 1])]
    head_size = int(get("head_size", 0))
    offsets = [int(x) for x in get("offsets", [0, 0, 0])]
    return heads, layout, head_size, offsets


def attention_dims(q: Sequence[int], k: Sequence[int], v: Sequence[int], heads: int, layout: Sequence[int],
                   head_size: int = 0, offsets: Sequence[int] = (0, 0, 0)) -> tuple[int, int, int, int, int]:
    """(batch, heads, Sq, Sk, D) of Q, K, V shapes in ``layout`` codes; ValueError when they disagree."""
    def split(shape: Sequence[int], code: int, off: int) -> tuple[int, int, int, int]:  # (B, H, S, D)
        if code == 0 and len(shape) == 3 and heads > 0:
            d = head_size or (shape[2] // heads if shape[2] % heads == 0 else 0)
            if d > 0 and off >= 0 and off + heads * d <= shape[2] and (head_size or off == 0):
                return shape[0], heads, shape[1], d
        if off == 0 and code == 1 and len(shape) == 4:
            return tuple(shape)  # type: ignore[return-value]
        if off == 0 and code == 2 and len(shape) == 4:
            return shape[0], shape[1], shape[3], shape[2]
        raise ValueError(f"shape {list(shape)} does not fit layout code {code} with {heads} heads"
                         f"{f' of size {head_size}' if head_size else ''} at offset {off}")

    if len(layout) != 4 or layout[0] not in (0, 1) or layout[2] not in (0, 1) or layout[3] not in (0, 1):
        raise ValueError(f"layout {list(layout)} is not [q, k, v, out] codes")
    if len(offsets) != 3:
        raise ValueError(f"offsets {list(offsets)} are not [q, k, v]")
    bq, hq, sq, dq = split(q, layout[0], offsets[0])
    bk, hk, sk, dk = split(k, layout[1], offsets[1])
    bv, hv, sv, dv = split(v, layout[2], offsets[2])
    if not (bq == bk == bv and hq == hk == hv == heads and sk == sv and dq == dk == dv
            and (not head_size or dq == head_size)):
        raise ValueError(f"Q {list(q)}, K {list(k)} and V {list(v)} do not agree "
                         f"({heads} heads, layout {list(layout)})")
    return bq, heads, sq, sk, dq
