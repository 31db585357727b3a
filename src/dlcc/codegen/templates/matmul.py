"""Matrix products: MatMul (numpy semantics: 1-D operands, broadcast batch dims) and Gemm.

What goes in: a ``TemplateCall`` with buffer operands (``needs_buffers``); B may be a compile-time constant.
What comes out: C computing ``C[b, i, j] = sum_k A[b, i, k] * B[b, k, j]`` and one ``store`` per element,
printed from the loop IR of one of four kernels:
- a weight B (2-D, at least MIN_N columns): the packed GEMM over all rows of A (``schedule.gemm.gemm_func``);
- two run-time operands with the same batch dims (attention): the batched packed GEMM (``gemm_func_batched``);
- any other product: the panel kernel (``schedule.matmul.panels_func``: accumulator blocks of a few rows of A
  against panels of B that stay in L2; a constant B repacked panel by panel at compile time, Gemm's transB
  folded into that), or with fewer than MIN_N output columns dot products along k (``dots_func``, a
  constant B transposed to [N, K] at compile time).
Operands are loop-IR buffers of the product's logical shapes: a broadcast batch dim or the missing axis of a
1-D operand is a dim of stride 0, Gemm's transA/transB swap the strides.
Sums run in a different order than onnxruntime: compared with rtol 1e-4 (DESIGN tolerance for matmul).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from dlcc.codegen.cbase import TemplateError, TensorRef, c_float
from dlcc.codegen.templates import TemplateCall, register
from dlcc.lower.lir import Buf, Layout, verify_func
from dlcc.schedule.gemm import (
    MIN_N,
    GemmPlan,
    gemm_func,
    gemm_func_batched,
    pack_b,
    plan_gemm,
    plan_gemm_batched,
)
from dlcc.schedule.matmul import dots_func, pack_panels, panel_width, panels_func


class _Gemm:
    """One batched product: its operands as loop-IR buffers of the product's logical shapes."""

    def __init__(self, call: TemplateCall, batch: tuple[int, ...], m: int, n: int, k: int, a: Buf, b: Buf | None,
                 b_const: np.ndarray | None, b_batch: tuple[int, ...], b_ref: TensorRef | None, epilogue,
                 a_rows: tuple[TensorRef, int, int] | None = None, trivial_epilogue: bool = False,
                 ab_refs: tuple[TensorRef, TensorRef] | None = None):
        self.call, self.names = call, call.names
        self.batch, self.m, self.n, self.k = batch, m, n, k
        self.a = a  # A as [*batch, m, k] (broadcast dims of stride 0)
        self.b = b  # a run-time B as [*batch, k, n], or None
        self.b_const = b_const  # [*b_batch, K, N] float32, or None
        self.b_batch = b_batch
        self.b_ref = b_ref  # the B buffer when it can be read as is ([*b_batch, K, N] row-major)
        self.epilogue = epilogue  # (bidx, i, j, value) -> C statements
        self.a_rows = a_rows  # A as (ref, row stride, column stride) over all rows of all batches, if it can be
        self.trivial = trivial_epilogue  # the epilogue only stores the value where the product is accumulated
        self.ab_refs = ab_refs  # both operands' buffers ([*batch, m, k], [*batch, k, n]) when B is not a weight

    def code(self) -> str:
        if self.m == 0 or self.n == 0 or math.prod(self.batch) == 0:
            return ""
        packed = self._packed_lir() if self.b_const is not None else self._batched_lir()
        if packed is not None:
            return packed
        call = self.call
        par = call.threads if call.parallel(2.0 * self.m * self.n * self.k * math.prod(self.batch)) else 1
        dims = (self.batch, self.m, self.n, self.k)
        if self.n < MIN_N:  # few columns: dot products along k
            b = self.b
            if b is None:
                bt = call.packed(np.swapaxes(self.b_const, -1, -2).reshape(*self.b_batch, -1))
                b = _batched(bt, len(self.b_batch), self.batch, (self.k, self.n), (1, self.k))
            f = dots_func(*dims, self.a, b, lanes=call.target.lanes, threads=par, fresh=self.names)
            _verify_once(dots_func, dims, self.a.layout, b.layout, lanes=call.target.lanes, threads=par)
        else:
            nb = panel_width(self.n, self.k, call.target.gemm_panel_bytes)
            b, packed = self.b, self.b_const is not None
            if packed:
                ref = self.b_ref if self.b_ref is not None and nb == self.n else call.packed(
                    pack_panels(self.b_const, nb))
                b = _batched(ref, len(self.b_batch), self.batch, (self.k * self.n,), (1,))
            opts = {"rows": call.target.gemm_rows, "nb": nb, "packed": packed, "threads": par}
            f = panels_func(*dims, self.a, b, **opts, fresh=self.names)
            _verify_once(panels_func, dims, self.a.layout, b.layout, **opts)
        return call.emit(f, lambda idx, v: self.epilogue(list(idx[:-2]), idx[-2], idx[-1], v))

    # -- the packed GEMM (loop IR, schedule.gemm): a constant B, all rows of A as one matrix
    def _packed_lir(self) -> str | None:
        call = self.call
        ws, c = call.workspace, call.scratch
        if (self.b_const is None or self.a_rows is None or ws is None or self.n < MIN_N
                or any(d != 1 for d in self.b_batch) or not c.contiguous):
            return None
        rows = math.prod(self.batch) * self.m
        plan = plan_gemm(rows, self.n, self.k, call.target, call.threads)
        if plan.workspace_bytes > 4 * ws.size:
            return None
        aref, rs, cs = self.a_rows
        names = call.names
        a = Buf(aref.ptr, "float32", Layout.strided((rows, self.k), (rs, cs), aref.offset))
        packed = call.packed(pack_b(self.b_const.reshape(self.k, self.n), plan.nr, plan.kc))
        bp = Buf(packed.ptr, "float32", Layout.strided(packed.shape))
        cb = Buf(c.ptr, "float32", Layout.strided((rows, self.n), (self.n, 1), c.offset))
        wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
        l2 = call.target.l2_bytes
        f = gemm_func(plan, a, bp, cb, wsb, not self.trivial, fresh=names, target_l2=l2)
        _verify_packed_once(plan, (rs, cs), not self.trivial, ws.size, l2)
        batch, m = self.batch, self.m

        def store(idx, v):
            row = idx[0]
            bidx = ["0" if d == 1 else f"(({row}) / {m * math.prod(batch[i + 1:])}) % {d}"
                    for i, d in enumerate(batch)]
            i = row if math.prod(batch) == 1 else f"(({row}) % {m})"
            return self.epilogue(bidx, i, idx[1], v)

        return call.emit(f, store, {wsb.name: ws.base()})

    # -- two run-time operands (attention): the batched packed GEMM of the loop IR
    def _batched_lir(self) -> str | None:
        call = self.call
        ws, c = call.workspace, call.scratch
        if self.ab_refs is None or ws is None or self.n < MIN_N or not c.contiguous:
            return None
        aref, bref = self.ab_refs
        lead = len(self.batch)
        a3, b3 = _batch3(aref, lead), _batch3(bref, lead)
        if a3 is None or b3 is None:
            return None
        nb = math.prod(self.batch)
        plan = plan_gemm_batched(nb, self.m, self.n, self.k, call.target, call.threads)
        if plan.workspace_bytes > 4 * ws.size:
            return None
        names = call.names
        a = Buf(aref.ptr, "float32", Layout.strided((nb, self.m, self.k), a3, aref.offset))
        b = Buf(bref.ptr, "float32", Layout.strided((nb, self.k, self.n), b3, bref.offset))
        cb = Buf(c.ptr, "float32", Layout.strided((nb, self.m, self.n), None, c.offset))
        wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
        f = gemm_func_batched(plan, a, b, cb, wsb, not self.trivial, fresh=names)
        _verify_batched_once(plan, a3, b3, not self.trivial, ws.size)
        batch = self.batch

        def store(idx, v):
            q = idx[0]
            bidx = ["0" if d == 1 else f"(({q}) / {math.prod(batch[i + 1:])}) % {d}" for i, d in enumerate(batch)]
            return self.epilogue(bidx, idx[1], idx[2], v)

        return call.emit(f, store, {wsb.name: ws.base()})


def _batched(ref: TensorRef, own: int, batch: tuple[int, ...], shape: tuple[int, ...],
             strides: Sequence[int]) -> Buf:
    """``ref`` (its first ``own`` dims batch dims, then a matrix of ``shape`` at ``strides``) as a buffer of
    shape (*batch, *shape): its batch dims aligned to the right of ``batch``, broadcast ones (absent or of
    extent 1) with stride 0."""
    bs = [s if d != 1 else 0 for d, s in zip(ref.shape[:own], ref.strides[:own], strict=True)]
    bs = [0] * (len(batch) - own) + bs
    strides = tuple(s if d != 1 else 0 for d, s in zip(shape, strides, strict=True))
    return Buf(ref.ptr, "float32", Layout.strided((*batch, *shape), (*bs, *strides), ref.offset))


@functools.lru_cache(maxsize=256)
def _verify_once(build, dims: tuple, a: Layout, b: Layout, **opts) -> None:
    """verify_func on a small-product kernel (``build``: ``panels_func`` or ``dots_func``) for these operand
    layouts (the same for every product with them)."""
    verify_func(build(*dims, Buf("a", "float32", a), Buf("b", "float32", b), **opts))


@functools.lru_cache(maxsize=256)
def _verify_packed_once(plan: GemmPlan, a_strides: tuple[int, int], epilogue: bool, ws_floats: int,
                        l2: int | None = None) -> None:
    """verify_func on the loop IR of ``plan`` (the same for every product with this plan and A's strides)."""
    rs, cs = a_strides
    span = (plan.m - 1) * rs + (plan.k - 1) * cs + 1
    a = Buf("a", "float32", Layout.strided((plan.m, plan.k), (rs, cs)))
    if a.layout.span > span:
        raise TemplateError("internal: A's rows overlap")
    bp = Buf("b", "float32", Layout.strided((plan.col_panels * plan.k * plan.nr,)))  # (packed K block by K block)
    c = Buf("c", "float32", Layout.strided((plan.m, plan.n)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(gemm_func(plan, a, bp, c, ws, epilogue, target_l2=l2))


def _batch3(ref: TensorRef, lead: int) -> tuple[int, int, int] | None:
    """The strides of ``ref`` ([*batch, r, c], ``lead`` batch dims) as (batch, r, c) when its batch dims flatten
    into one stride."""
    dims = [(d, s) for d, s in zip(ref.shape[:lead], ref.strides[:lead], strict=True) if d != 1]
    for (_, s0), (d1, s1) in zip(dims, dims[1:], strict=False):
        if s0 != s1 * d1:
            return None
    sb = dims[-1][1] if dims else 0
    return sb, ref.strides[-2], ref.strides[-1]


@functools.lru_cache(maxsize=256)
def _verify_batched_once(plan: GemmPlan, a3: tuple[int, int, int], b3: tuple[int, int, int], epilogue: bool,
                         ws_floats: int) -> None:
    a = Buf("a", "float32", Layout.strided((plan.batch, plan.m, plan.k), a3))
    b = Buf("b", "float32", Layout.strided((plan.batch, plan.k, plan.n), b3))
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.m, plan.n)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(gemm_func_batched(plan, a, b, c, ws, epilogue))


def _rows(ref: TensorRef | None, lead: int) -> tuple[TensorRef, int, int] | None:
    """``ref`` ([*batch, m, k] with ``lead`` = len(batch) + 1 leading dims, or [k]) as one matrix of rows:
    (ref, row stride, column stride), when its leading dims flatten into one stride."""
    if ref is None:
        return None
    if ref.rank == 1:
        return ref, ref.size, ref.strides[0]
    dims = [(d, s) for d, s in zip(ref.shape[:lead], ref.strides[:lead], strict=True) if d != 1]
    for (_, s0), (d1, s1) in zip(dims, dims[1:], strict=False):
        if s0 != s1 * d1:
            return None
    rs = dims[-1][1] if dims else ref.size
    return ref, rs, ref.strides[-1]


def _ref(call: TemplateCall, i: int) -> TensorRef:
    ref = call.inputs[i].ref
    if ref is None:
        raise TemplateError(f"{call.node.op_type}: input {i} must be a buffer")
    return ref


def _float(call: TemplateCall) -> None:
    for op in call.inputs:
        if op is not None and op.dtype != "float32":
            raise TemplateError(f"{call.node.op_type}: only float32 operands are supported, not {op.dtype}")
    if call.out_dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 output is supported")


@register("MatMul", needs_buffers=True)
def matmul(call: TemplateCall) -> str:
    _float(call)
    a, b = call.inputs[0], call.inputs[1]
    ash, bsh = list(a.shape), list(b.shape)
    if not ash or not bsh:
        raise TemplateError("MatMul: scalar operands are not allowed")
    a1, b1 = len(ash) == 1, len(bsh) == 1
    am = [1, *ash] if a1 else ash
    bm = [*bsh, 1] if b1 else bsh
    m, k = am[-2], am[-1]
    k2, n = bm[-2], bm[-1]
    if k != k2:
        raise TemplateError(f"MatMul: inner dimensions differ ({ash} x {bsh})")
    a_batch, b_batch = tuple(am[:-2]), tuple(bm[:-2])
    try:
        batch = tuple(np.broadcast_shapes(a_batch, b_batch))
    except ValueError as e:
        raise TemplateError(f"MatMul: batch dims do not broadcast ({ash} x {bsh})") from e
    expect = (*batch, *([] if a1 else [m]), *([] if b1 else [n]))
    if tuple(call.out_shape) != expect:
        raise TemplateError(f"MatMul: output shape {call.out_shape} is not {expect}")

    aref = _ref(call, 0)
    abuf = _batched(aref, len(a_batch), batch, (m, k), (0, aref.strides[0]) if a1 else aref.strides[-2:])
    bbuf = None
    if b.const is None:
        bref = _ref(call, 1)
        bbuf = _batched(bref, len(b_batch), batch, (k, n), (bref.strides[0], 0) if b1 else bref.strides[-2:])

    def epilogue(bidx, i, j, v):
        idx = [*bidx, *([] if a1 else [i]), *([] if b1 else [j])]
        return call.store(idx, v)

    b_const = None
    b_ref = None
    if b.const is not None:
        b_const = np.asarray(b.const, dtype=np.float32).reshape(*b_batch, k, n)
        if not b1 and b.ref is not None and b.ref.contiguous:
            b_ref = b.ref
    a_rows = _rows(a.ref, len(ash) - 1) if len(a_batch) == len(batch) or not a_batch else None
    ab_refs = None
    if b.const is None and not a1 and not b1 and a.ref is not None and b.ref is not None and a_batch == b_batch:
        ab_refs = (a.ref, b.ref)
    return _Gemm(call, batch, m, n, k, abuf, bbuf, b_const, b_batch, b_ref, epilogue, a_rows, call.direct,
                 ab_refs).code()


@register("Gemm", needs_buffers=True)
def gemm(call: TemplateCall) -> str:
    _float(call)
    a, b = call.inputs[0], call.inputs[1]
    c = call.inputs[2] if len(call.inputs) > 2 else None
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise TemplateError(f"Gemm: A and B must be 2-D, not {a.shape} and {b.shape}")
    ta, tb = int(call.attr("transA", 0)), int(call.attr("transB", 0))
    alpha, beta = float(call.attr("alpha", 1.0)), float(call.attr("beta", 1.0))
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    k2, n = (b.shape[1], b.shape[0]) if tb else b.shape
    if k != k2:
        raise TemplateError(f"Gemm: inner dimensions differ ({a.shape}, {b.shape}, transA={ta}, transB={tb})")
    if tuple(call.out_shape) != (m, n):
        raise TemplateError(f"Gemm: output shape {call.out_shape} is not {(m, n)}")
    if c is not None:
        if len(c.shape) > 2:
            raise TemplateError(f"Gemm: C of shape {c.shape} does not broadcast to {(m, n)}")
        for dc, do in zip(reversed(c.shape), (n, m), strict=False):
            if dc not in (1, do):
                raise TemplateError(f"Gemm: C of shape {c.shape} does not broadcast to {(m, n)}")

    aref = _ref(call, 0)
    abuf = _batched(aref, 0, (), (m, k), aref.strides[::-1] if ta else aref.strides)
    bbuf = None
    if b.const is None:
        bref = _ref(call, 1)
        bbuf = _batched(bref, 0, (), (k, n), bref.strides[::-1] if tb else bref.strides)

    def epilogue(bidx, i, j, v):
        val = v if alpha == 1.0 else f"{c_float(alpha)} * {v}"
        if c is not None and beta != 0.0:
            tail = [i, j][2 - len(c.shape):]  # (C broadcast to the product: dims of 1 read index 0)
            cv = c.at(["0" if d == 1 else x for x, d in zip(tail, c.shape, strict=True)])
            val = f"{val} + {cv}" if beta == 1.0 else f"{val} + {c_float(beta)} * {cv}"
        return call.store([i, j], val)

    b_const = b_ref = None
    if b.const is not None:
        b_const = np.asarray(b.const, dtype=np.float32)
        if tb:
            b_const = np.ascontiguousarray(b_const.T)
        elif b.ref is not None and b.ref.contiguous:
            b_ref = b.ref
    a_rows = (aref, aref.strides[1], aref.strides[0]) if ta else (aref, aref.strides[0], aref.strides[1])
    trivial = call.direct and alpha == 1.0 and (c is None or beta == 0.0)
    return _Gemm(call, (), m, n, k, abuf, bbuf, b_const, (), b_ref, epilogue, a_rows, trivial).code()
