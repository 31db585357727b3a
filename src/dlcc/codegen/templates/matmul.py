"""Matrix products: MatMul (numpy semantics: 1-D operands, broadcast batch dims) and Gemm.

What goes in: a ``TemplateCall`` with buffer operands (``needs_buffers``); B may be a compile-time constant.
What comes out: C computing ``C[b, i, j] = sum_k A[b, i, k] * B[b, k, j]`` and one ``store`` per element.

Kernel: for each batch, B's columns are split into panels of ``nb`` columns (``nb * K`` floats sized to stay
in L2 cache), and for each panel the rows of A are taken ``MR`` at a time: a local accumulator block
``acc[MR][nb]`` (L1 resident) is updated for every k with ``acc[r][j] += a_r * B[k, j0 + j]`` (contiguous
inner j loop: vectorizes, each B load feeds MR FMAs), then stored. A constant B is repacked at compile
time panel by panel (panel p holds ``B[:, j0:j0+nb]`` row-major), so the inner loop streams one contiguous
panel; Gemm's transB is folded into that repacking. A product with few output columns (N < 8) is a set of
dot products along k instead (with a constant B transposed to [N, K]), split over 8 partial sums.
Sums run in a different order than onnxruntime: compared with rtol 1e-4 (DESIGN tolerance for matmul).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dlcc.codegen.cbase import TemplateError, TensorRef, c_float, indent, loops
from dlcc.codegen.expr import broadcast_index
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.threads import par_for
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

NB_MAX = 256
DOT_N = 8  # below this many output columns, use dot products along k


def _panel_width(n: int, k: int, panel_bytes: int) -> int:
    nb = panel_bytes // (4 * max(k, 1))
    nb = max(16, min(NB_MAX, nb - nb % 16))
    return n if n <= nb else nb


def _pack_panels(b: np.ndarray, nb: int) -> np.ndarray:
    """[..., K, N] -> [..., K*N] with panels of nb columns, each row-major [K, w]."""
    n = b.shape[-1]
    parts = [b[..., :, j0:j0 + nb].reshape(*b.shape[:-2], -1) for j0 in range(0, n, nb)]
    return np.concatenate(parts, axis=-1).astype(np.float32)


class _Gemm:
    """One batched product: accessors for A and B elements by (batch index, row, col)."""

    def __init__(self, call: TemplateCall, batch: tuple[int, ...], m: int, n: int, k: int, a_at, b_runtime,
                 b_const: np.ndarray | None, b_batch: tuple[int, ...], b_ref: TensorRef | None, epilogue,
                 a_rows: tuple[TensorRef, int, int] | None = None, trivial_epilogue: bool = False,
                 ab_refs: tuple[TensorRef, TensorRef] | None = None):
        self.call, self.names = call, call.names
        self.batch, self.m, self.n, self.k = batch, m, n, k
        self.a_at = a_at  # (bidx, i, k) -> C expr
        self.b_runtime = b_runtime  # (bidx, k, j) -> C expr, for a runtime B
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
        body = self._dot if self.n < DOT_N else self._panels
        work = 2.0 * self.m * self.n * self.k * math.prod(self.batch)
        self.par = self.call.threads if self.call.parallel(work) else 0
        lead = next((d for d, n in enumerate(self.batch) if n > 1), None)
        if self.par and lead is not None and self.batch[lead] >= self.par:
            # threads over the batch (attention heads...): each product is its own; the panels stay serial
            self.par = 0
            var = self.names("pb")
            shape = [1 if d <= lead else n for d, n in enumerate(self.batch)]
            _, text = loops(shape, self.names, lambda bidx: body([*bidx[:lead], var, *bidx[lead + 1:]]), prefix="b")
            return par_for(var, self.batch[lead], text)
        if math.prod(self.batch) > 1:
            self.par = 0  # (a marked loop must be the outermost statement)
        bidx, text = loops(self.batch, self.names, lambda bidx: body(list(bidx)), prefix="b")
        return text

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
        packed = call.packed(pack_b(self.b_const.reshape(self.k, self.n), plan.nr))
        bp = Buf(packed.ptr, "float32", Layout.strided(packed.shape))
        cb = Buf(c.ptr, "float32", Layout.strided((rows, self.n), (self.n, 1), c.offset))
        wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
        f = gemm_func(plan, a, bp, cb, wsb, not self.trivial, fresh=names)
        _verify_once(plan, (rs, cs), not self.trivial, ws.size)
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

    # -- B access for the panel kernel
    def _setup_panels(self) -> None:
        self.nb = _panel_width(self.n, self.k, self.call.target.gemm_panel_bytes)
        self.packed = None
        if self.b_const is not None:
            if self.b_ref is not None and self.nb == self.n:
                self.packed = self.b_ref
            else:
                self.packed = self.call.packed(_pack_panels(self.b_const, self.nb))

    def _b_panel(self, bidx: list[str], kk: str, j0: str, w: int, j: str) -> str:
        if self.packed is None:
            return self.b_runtime(bidx, kk, f"{j0} + {j}")
        bb = broadcast_index(bidx, self.b_batch)
        if self.packed is self.b_ref:
            return self.packed.at([*bb, kk, f"{j0} + {j}"])
        # panel base j0*K, row stride w
        lin = f"({j0})*{self.k} + ({kk})*{w} + {j}"
        return self.packed.at([*bb, lin])

    def _panels(self, bidx: list[str]) -> str:
        self._setup_panels()
        n, m, nb = self.n, self.m, self.nb
        parts = []
        nfull, ntail = divmod(n, nb)
        MR = self.call.target.gemm_rows  # rows of A per block
        mfull, mtail = divmod(m, MR)
        col_blocks = []
        if nfull:
            col_blocks.append(("loop", nfull, nb))
        if ntail:
            col_blocks.append(("at", nfull * nb, ntail))
        T = min(self.par, mfull)
        if T > 1:  # threads: each takes a range of row blocks through every panel (B stays in its own L2)
            return self._panels_rows(bidx, col_blocks, T, MR, mfull, mtail)
        if self.par > 1 and nfull + (ntail > 0) > 1:  # few rows: threads over the panels
            q = self.names("q")
            one = self._panel_rows(bidx, f"({q})*{nb}", nb, MR, mfull, mtail, "0", str(mfull))
            if ntail:
                tail = self._panel_rows(bidx, str(nfull * nb), ntail, MR, mfull, mtail, "0", str(mfull))
                one = f"if ({q} < {nfull}) {{\n{indent(one)}\n}} else {{\n{indent(tail)}\n}}" if nfull else tail
            return par_for(q, nfull + (ntail > 0), one)
        for kind, cval, w in col_blocks:
            if kind == "loop" and nfull > 1:
                j0 = self.names("j")
                head, cexpr = f"for (int64_t {j0} = 0; {j0} < {nfull * nb}; {j0} += {nb}) {{", j0
            else:
                head, cexpr = "{", str(cval if kind == "at" else 0)
            rows = []
            if mfull:
                if mfull > 1:
                    i0 = self.names("i")
                    rows.append(f"for (int64_t {i0} = 0; {i0} < {mfull * MR}; {i0} += {MR}) {{\n"
                                f"{indent(self._block(bidx, i0, MR, cexpr, w))}\n}}")
                else:
                    rows.append(f"{{\n{indent(self._block(bidx, '0', MR, cexpr, w))}\n}}")
            if mtail:
                rows.append(f"{{\n{indent(self._block(bidx, str(mfull * MR), mtail, cexpr, w))}\n}}")
            parts.append(f"{head}\n{indent(chr(10).join(rows))}\n}}")
        return "\n".join(parts)

    def _panel_rows(self, bidx: list[str], cexpr: str, w: int, MR: int, mfull: int, mtail: int, rb0: str,
                    rb1: str, tail_if: str | None = None) -> str:
        """Row blocks [rb0, rb1) of one panel (columns from ``cexpr``, ``w`` wide), then the row tail
        (when ``tail_if``: only where that C condition holds)."""
        i0 = self.names("i")
        rows = [f"for (int64_t {i0} = ({rb0}) * {MR}; {i0} < ({rb1}) * {MR}; {i0} += {MR}) {{\n"
                f"{indent(self._block(bidx, i0, MR, cexpr, w))}\n}}"]
        if mtail:
            tail = self._block(bidx, str(mfull * MR), mtail, cexpr, w)
            rows.append(f"if ({tail_if}) {{\n{indent(tail)}\n}}" if tail_if else f"{{\n{indent(tail)}\n}}")
        return "\n".join(rows)

    def _panels_rows(self, bidx: list[str], col_blocks: list, T: int, MR: int, mfull: int, mtail: int) -> str:
        t, rb0, rb1 = self.names("t"), self.names("rb"), self.names("rb")
        parts = [f"const int64_t {rb0} = {t} * {mfull} / {T};", f"const int64_t {rb1} = ({t} + 1) * {mfull} / {T};"]
        for kind, cval, w in col_blocks:
            if kind == "loop" and cval > 1:
                j0 = self.names("j")
                body = self._panel_rows(bidx, j0, w, MR, mfull, mtail, rb0, rb1, f"{t} == {T - 1}")
                parts.append(f"for (int64_t {j0} = 0; {j0} < {cval * w}; {j0} += {w}) {{\n{indent(body)}\n}}")
            else:
                start = str(cval if kind == "at" else 0)
                body = self._panel_rows(bidx, start, w, MR, mfull, mtail, rb0, rb1, f"{t} == {T - 1}")
                parts.append(f"{{\n{indent(body)}\n}}")
        return par_for(t, T, "\n".join(parts))

    def _block(self, bidx: list[str], i0: str, mr: int, j0: str, w: int) -> str:
        nm = self.names
        acc, kk, j, r = nm("acc"), nm("k"), nm("j"), nm("r")
        a_names = [nm("a") for _ in range(mr)]
        loads = "\n".join(f"const float {a} = {self.a_at(bidx, f'{i0} + {q}', kk)};" for q, a in enumerate(a_names))
        bv = nm("bv")
        fmas = "\n".join(f"{acc}[{q}][{j}] += {a} * {bv};" for q, a in enumerate(a_names))
        inner = (f"for (int64_t {j} = 0; {j} < {w}; ++{j}) {{\n"
                 f"    const float {bv} = {self._b_panel(bidx, kk, j0, w, j)};\n{indent(fmas)}\n}}")
        store = self.epilogue(bidx, f"{i0} + {r}", f"{j0} + {j}", f"{acc}[{r}][{j}]")
        return (f"float {acc}[{mr}][{w}];\nmemset({acc}, 0, sizeof {acc});\n"
                f"for (int64_t {kk} = 0; {kk} < {self.k}; ++{kk}) {{\n{indent(loads)}\n{indent(inner)}\n}}\n"
                f"for (int64_t {r} = 0; {r} < {mr}; ++{r}) {{\n"
                f"    for (int64_t {j} = 0; {j} < {w}; ++{j}) {{\n{indent(store, 2)}\n    }}\n}}")

    # -- few columns: dot products along k
    def _dot(self, bidx: list[str]) -> str:
        LANES = self.call.target.lanes  # partial sums of a dot product: one vector
        nm = self.names
        if not hasattr(self, "bt"):
            self.bt = None
            if self.b_const is not None:
                bt = np.swapaxes(self.b_const, -1, -2).reshape(*self.b_batch, -1)
                self.bt = self.call.packed(bt.astype(np.float32))
        i, j = nm("i"), nm("j")
        k = self.k

        def b_at(kk: str) -> str:
            if self.bt is None:
                return self.b_runtime(bidx, kk, j)
            return self.bt.at([*broadcast_index(bidx, self.b_batch), f"({j})*{k} + {kk}"])

        s = nm("s")
        if k >= 2 * LANES:
            lane, kk, ln = nm("lane"), nm("k"), nm("l")
            e = f"{kk} + {ln}"
            merged = " + ".join(f"{lane}[{q}]" for q in range(LANES))
            dot = (f"float {lane}[{LANES}] = {{0}};\nint64_t {kk};\n"
                   f"for ({kk} = 0; {kk} + {LANES} <= {k}; {kk} += {LANES}) {{\n"
                   f"    for (int64_t {ln} = 0; {ln} < {LANES}; ++{ln}) "
                   f"{lane}[{ln}] += {self.a_at(bidx, i, e)} * {b_at(e)};\n}}\n"
                   f"for (; {kk} < {k}; ++{kk}) {lane}[0] += {self.a_at(bidx, i, kk)} * {b_at(kk)};\n"
                   f"float {s} = {merged};")
        else:
            kk = nm("k")
            dot = (f"float {s} = 0.0f;\n"
                   f"for (int64_t {kk} = 0; {kk} < {k}; ++{kk}) {s} += {self.a_at(bidx, i, kk)} * {b_at(kk)};")
        body = f"{dot}\n{self.epilogue(bidx, i, j, s)}"
        for name, size in ((j, self.n), (i, self.m)):
            body = f"for (int64_t {name} = 0; {name} < {size}; ++{name}) {{\n{indent(body)}\n}}"
        return body


@functools.lru_cache(maxsize=256)
def _verify_once(plan: GemmPlan, a_strides: tuple[int, int], epilogue: bool, ws_floats: int) -> None:
    """verify_func on the loop IR of ``plan`` (the same for every product with this plan and A's strides)."""
    rs, cs = a_strides
    span = (plan.m - 1) * rs + (plan.k - 1) * cs + 1
    a = Buf("a", "float32", Layout.strided((plan.m, plan.k), (rs, cs)))
    if a.layout.span > span:
        raise TemplateError("internal: A's rows overlap")
    bp = Buf("b", "float32", Layout.strided((plan.col_panels, plan.k, plan.nr)))
    c = Buf("c", "float32", Layout.strided((plan.m, plan.n)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(gemm_func(plan, a, bp, c, ws, epilogue))


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

    def a_at(bidx, i, kk):
        if a1:
            return a.at([kk])
        return a.at([*broadcast_index(bidx, a_batch), i, kk])

    def b_at(bidx, kk, j):
        if b1:
            return b.at([kk])
        return b.at([*broadcast_index(bidx, b_batch), kk, j])

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
    return _Gemm(call, batch, m, n, k, a_at, b_at, b_const, b_batch, b_ref, epilogue, a_rows, call.direct,
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

    def a_at(bidx, i, kk):
        return a.at([kk, i] if ta else [i, kk])

    def b_at(bidx, kk, j):
        return b.at([j, kk] if tb else [kk, j])

    def epilogue(bidx, i, j, v):
        val = v if alpha == 1.0 else f"{c_float(alpha)} * {v}"
        if c is not None and beta != 0.0:
            cv = c.at(broadcast_index([i, j], c.shape))
            val = f"{val} + {cv}" if beta == 1.0 else f"{val} + {c_float(beta)} * {cv}"
        return call.store([i, j], val)

    b_const = b_ref = None
    if b.const is not None:
        b_const = np.asarray(b.const, dtype=np.float32)
        if tb:
            b_const = np.ascontiguousarray(b_const.T)
        elif b.ref is not None and b.ref.contiguous:
            b_ref = b.ref
    a_rows = None
    if a.ref is not None:
        a_rows = (a.ref, a.ref.strides[1], a.ref.strides[0]) if ta else (a.ref, a.ref.strides[0], a.ref.strides[1])
    trivial = call.direct and alpha == 1.0 and (c is None or beta == 0.0)
    return _Gemm(call, (), m, n, k, a_at, b_at, b_const, (), b_ref, epilogue, a_rows, trivial).code()
