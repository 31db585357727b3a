"""dlcc::Attention: scaled dot-product attention in one kernel (the graph rewrite ``attention-to-op`` makes it).

What goes in: a ``TemplateCall`` with buffer operands Q, K, V and an optional additive mask (a weight or a
run-time buffer, broadcastable to [B, H, Sq, Sk]); attributes ``num_heads``, ``scale``, ``causal``, ``fill``,
``layout`` = [q, k, v, out] codes, ``head_size`` and ``offsets`` (``dlcc.ops.attention``).
What comes out: C printed from the loop IR of ``schedule.attention.attention_func``: per (batch, head) one call
of the attention micro-kernel, ``softmax(scale * Q K^T (causal: ``fill`` above the diagonal) + mask) V``, then,
when an epilogue follows, one pass of it over the output.
Sums run in another order than onnxruntime's (rtol 1e-4, DESIGN's matmul tolerance).
"""

from __future__ import annotations

import numpy as np

from dlcc.codegen.cbase import TemplateError, TensorRef
from dlcc.codegen.templates import TemplateCall, register
from dlcc.lower.lir import Buf, Const, Epilogue, Expr, Func, Layout, Load, simplify
from dlcc.ops.attention import attention_attrs, attention_dims
from dlcc.schedule.attention import Head, attention_func, attention_plan
from dlcc.schedule.loops import nest


def _buf(ref: TensorRef) -> Buf:
    return Buf(ref.ptr, "float32", Layout.strided(ref.shape, ref.strides, ref.offset))


def _head(ref: TensorRef, code: int, d: int, off: int = 0) -> Head:
    """Where head (b, h) of ``ref`` (in layout ``code``; code 0: from column ``off``) starts, and its row and
    column strides."""
    st = ref.strides
    b1 = ref.shape[0] == 1
    if code == 0:
        return Head(_buf(ref), lambda b, h: (Const(0) if b1 else b, Const(0), simplify(h * d + off)), st[1], st[2])

    def at(b: Expr, h: Expr) -> tuple[Expr, ...]:
        return (Const(0) if b1 else b, h, Const(0), Const(0))

    return Head(_buf(ref), at, st[3], st[2]) if code == 2 else Head(_buf(ref), at, st[2], st[3])


def _mask_head(ref: TensorRef, batch: int, heads: int, sq: int, sk: int) -> Head:
    """The mask (rank <= 4, broadcastable to [batch, heads, sq, sk]) as a head operand."""
    shape, st = ref.shape, ref.strides
    full = (batch, heads, sq, sk)
    lead = 4 - len(shape)
    if lead < 0 or any(d not in (1, f) for d, f in zip(shape, full[lead:], strict=True)):
        raise TemplateError(f"Attention: mask of shape {list(shape)} does not broadcast to {list(full)}")

    def stride(axis: int) -> int:  # of the full axis, 0 where it broadcasts
        i = axis - lead
        return st[i] if i >= 0 and shape[i] != 1 else 0

    def at(b: Expr, h: Expr) -> tuple[Expr, ...]:
        picks = (b, h, Const(0), Const(0))
        return tuple(picks[lead + i] if shape[i] != 1 else Const(0) for i in range(len(shape)))

    return Head(_buf(ref), at, stride(2), stride(3))


@register("dlcc::Attention", needs_buffers=True)
def attention(call: TemplateCall) -> str:
    for op in call.inputs:
        if op is not None and op.dtype != "float32":
            raise TemplateError(f"Attention: only float32 operands are supported, not {op.dtype}")
    heads, layout, head_size, offsets = attention_attrs(call.attr)
    q, k, v = call.inputs[:3]
    if q is None or k is None or v is None:
        raise TemplateError("Attention: Q, K and V are required")
    try:
        batch, heads, sq, sk, d = attention_dims(q.shape, k.shape, v.shape, heads, layout, head_size, offsets)
    except ValueError as e:
        raise TemplateError(f"Attention: {e}") from e
    expect = (batch, sq, heads * d) if layout[3] == 0 else (batch, heads, sq, d)
    if tuple(call.out_shape) != expect:
        raise TemplateError(f"Attention: output shape {list(call.out_shape)} is not {list(expect)}")
    if min(batch, heads, sq, d) == 0:
        return ""
    if sk == 0:
        raise TemplateError("Attention: no keys")
    refs = []
    for i, op in enumerate((q, k, v)):
        if op.ref is None:
            raise TemplateError(f"Attention: input {i} must be a buffer")
        refs.append(op.ref)
    mask = call.inputs[3] if len(call.inputs) > 3 else None
    mhead = None
    if mask is not None:
        mref = mask.ref
        if mref is None and mask.const is not None:
            mref = call.packed(np.asarray(mask.const, dtype=np.float32))
        if mref is None:
            raise TemplateError("Attention: the mask must be a buffer")
        mhead = _mask_head(mref, batch, heads, sq, sk)
    ws = call.workspace
    plan = attention_plan(batch, heads, sq, sk, d, call.target, call.threads)
    if ws is None or plan.workspace_bytes > 4 * ws.size:
        raise TemplateError("Attention: its workspace was not declared")
    names = call.names
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    out = call.scratch
    heads_ = [_head(r, c, d, off) for r, c, off in zip(refs, layout[:3], offsets, strict=True)]
    o = _head(out, layout[3], d)
    f = attention_func(plan, batch, heads, sq, sk, d, *heads_, o, mhead, wsb,
                       scale=float(call.attr("scale", 1.0)), causal=bool(call.attr("causal", 0)),
                       fill=float(call.attr("fill", 0.0)), fresh=names)
    if not call.direct:  # the fused epilogue, one pass over the finished output
        ob = o.buf

        def ep(idx: list[Expr]):
            return (Epilogue(tuple(idx), Load(ob, tuple(idx))),)

        loops = nest(out.shape, names, "i", ep)
        f = Func(f.name, f.params, (*f.body, *loops), f.workspace)
    return call.emit(f, lambda idx, val: call.store(list(idx), val), {wsb.name: ws.base()})
