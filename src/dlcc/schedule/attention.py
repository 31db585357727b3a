"""Scaled dot-product attention in one kernel (``dlcc::Attention``): its loop IR and its workspace.

What goes in: the attention's sizes (batch, heads, query and key lengths, head size), each operand as a loop-IR
buffer of its own shape with where one head starts (``Head``), the ``Target`` and the thread count.
What comes out: ``attention_func``, a ``Func`` that calls the attention micro-kernel (``lower.micro.attn_micro``)
once per (batch, head), the (batch, head) pairs split over the threads, each thread with its own workspace slice
(K transposed, V and a few rows of probabilities: no query x key buffer); ``attention_plan`` gives the register
tile and the workspace bytes, which the schedule stage declares before memory planning.

Heads: a [B, S, H*D] operand (the heads not split: the graph's Reshape/Transpose absorbed by the rewrite) starts
head h at (b, 0, h*D); a [B, H, S, D] one at (b, h, 0, 0). A mask broadcastable to [B, H, Sq, Sk] starts at
(b, h) of its own dims, 0 where it broadcasts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dlcc.lower.lir import Alloc, Buf, Const, Expr, For, Func, Micro, Ptr, Var, simplify
from dlcc.lower.micro import ATTN_WS_LANES, AttnSpec, attn_micro
from dlcc.ops.attention import attention_dims
from dlcc.schedule.loops import share
from dlcc.schedule.target import Target

__all__ = ["ATTN_QB", "AttnPlan", "Head", "attention_dims", "attention_func", "attention_plan"]

ATTN_QB = 6  # query rows per register tile (the GEMM tiles' row count)


@dataclass(frozen=True)
class AttnPlan:
    qb: int  # query rows of the register tile
    nv: int  # key (or feature) vectors of the register tile
    threads: int
    call_floats: int  # workspace of one call (one head)

    @property
    def workspace_bytes(self) -> int:
        return 4 * self.call_floats * self.threads


def attention_plan(batch: int, heads: int, sq: int, sk: int, d: int, target: Target, threads: int) -> AttnPlan:
    """The register tile (qb rows x nv vectors: 6 x 4 on 32 vector registers, 6 x 2 on 16) and the per-thread
    workspace for ``batch`` x ``heads`` heads of ``sq`` queries over ``sk`` keys of size ``d``."""
    nv = 4 if target.vector_registers >= 32 else 2
    qb = ATTN_QB
    t = max(1, min(threads, batch * heads))
    probe = AttnSpec(sq, sk, d, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, qb, nv)
    return AttnPlan(qb, nv, t, probe.ws_floats(ATTN_WS_LANES))


@dataclass(frozen=True)
class Head:
    """An operand as a buffer of its own shape: ``at(b, h)`` is the index where head (b, h) starts; ``rows``
    and ``cols`` the element strides along its rows (queries or keys) and columns (features, or keys for
    the mask)."""
    buf: Buf
    at: Callable[[Expr, Expr], tuple[Expr, ...]]
    rows: int
    cols: int


def attention_func(plan: AttnPlan, batch: int, heads: int, sq: int, sk: int, d: int, q: Head, k: Head, v: Head,
                   o: Head, m: Head | None, ws: Buf, *, scale: float, causal: bool, fill: float,
                   name: str = "attention", fresh: Callable[[str], str] = str) -> Func:
    """The loop IR of attention over ``batch`` x ``heads`` heads (see the module docstring)."""
    spec = AttnSpec.make(sq=sq, sk=sk, d=d, qs=q.rows, qd=q.cols, ks=k.rows, kd=k.cols, vs=v.rows, vd=v.cols,
                         os=o.rows, od=o.cols, mk=int(m is not None), ms=m.rows if m else 0, mj=m.cols if m else 0,
                         causal=int(causal), scale=scale, fill=fill, qb=plan.qb, nv=plan.nv)
    micro = attn_micro(spec)
    T = plan.threads
    t, bh = Var(fresh("t")), Var(fresh("bh"))
    tv: Expr = t if T > 1 else Const(0)
    lo, hi = share(tv, batch * heads, T)
    b, h = simplify(bh // heads), simplify(bh % heads)
    ptrs: list[Expr] = [Ptr(x.buf, x.at(b, h)) for x in (q, k, v, *((m,) if m else ()), o)]
    call = Micro(micro, (*ptrs, Ptr(ws, (simplify(tv * plan.call_floats),))))
    body: Sequence = (For(bh, lo, hi, (call,)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), tuple(body), "parallel"),)
    params = tuple(x.buf for x in (q, k, v, *((m,) if m else ()), o))
    return Func(name, params, (Alloc(ws, tuple(body)),), (ws,))
