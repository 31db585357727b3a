"""Conv and ConvTranspose templates (ONNX semantics, 1-D/2-D/3-D, float32).

What goes in: a ``TemplateCall`` for a Conv or ConvTranspose node: X (a buffer), W (usually a constant),
optional bias B. What comes out: C that computes every output element once and hands it to ``store``.

Both ops run as a register-blocked direct convolution in gather form (``_direct``): for each (n, group,
outer output position, block of 6 output channels), tiles of 2 vectors of the last spatial dim accumulate
in GCC vector registers (``dlcc_vf``: 16 floats on an AVX-512 host, else 8) over (input channel, valid
outer taps, last-dim taps); each input vector load feeds 6 FMAs and each weight broadcast 2. The constant
weight is repacked at compile time as [group][channel block][ic][taps][6] so weight reads are sequential.
Padding costs no per-element test: the valid outer taps of each output row come from compile-time tables,
interior tiles use plain vector loads in a loop, and the few tiles at a row's borders are generated with
literal positions where lanes reading the padding get literal zeros.
- Conv: the last dim is one phase (input position u*stride - pad + k*dilation). A 1x1, stride 1,
  unpadded Conv views the spatial dims as one row: a GEMM with 6 x 2-vector register tiles. Small planes
  with short rows (or a strided last dim) use ``_conv_im2col``: receptive fields gathered into a < 32 KB
  stack buffer per chunk of input channels, then the same GEMM tiles over the flattened positions.
- ConvTranspose: the output o = i*stride - pad + k*dilation is split by residue o mod stride into
  phases, each a stride-1 convolution over the input (no scatter, no zero-stuffing).
Results go through ``store`` from a small local array (im2col: from ``call.scratch`` at the end).

Sums run in a different order than onnxruntime: tests compare with rtol 1e-4 (DESIGN: conv/matmul).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlcc.codegen.cbase import Names, Operand, TemplateError, TensorRef, indent, loops
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.threads import par_for
from dlcc.lower.lir import Buf, Layout, verify_func
from dlcc.schedule.direct import DirectPlan, direct_func, direct_pays, pack_direct, plan_direct
from dlcc.schedule.dwconv import dw_func
from dlcc.schedule.gemm import (
    POINTWISE_ROWS_MAX_OW,
    ConvGeometry,
    GemmPlan,
    conv_gemm_pays,
    gemm_func_conv,
    gemm_func_wconst,
    pack_a,
    pack_b,
    plan_gemm_conv,
    plan_gemm_wconst,
)

# im2col is used for short rows (or a strided last dim) when a chunk of input channels gives at least this
# reduction length (measured: shorter chunks lose to the direct path's register tiles)
IM2COL_MIN_RED = 64
IM2COL_MIN_RED_STRIDED = 16



def lin(*terms: int | tuple[str, int]) -> str:
    """C int64 text of a sum of ints and ``(expr, coef)`` terms, constant-folded."""
    const, parts = 0, []
    for term in terms:
        if isinstance(term, int):
            const += term
            continue
        expr, coef = term
        expr = str(expr).strip()
        if coef == 0:
            continue
        if expr.lstrip("-").isdigit():
            const += int(expr) * coef
            continue
        parts.append(expr if coef == 1 else f"({expr})*{coef}")
    if const or not parts:
        parts.append(str(const) if const >= 0 else f"({const})")
    return " + ".join(parts)


def _table(names: Names, decls: list[str], values: list[int], k: str) -> str:
    if len(set(values)) == 1:
        return str(values[0])
    name = names("tab")
    decls.append(f"static const int64_t {name}[{len(values)}] = {{{', '.join(map(str, values))}}};")
    return f"{name}[{k}]"


def _ints(call: TemplateCall, name: str, n: int, default: int) -> list[int]:
    v = call.attr(name)
    if v is None:
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise TemplateError(f"{call.node.op_type}: attribute {name} has {len(v)} values, expected {n}")
    return v


def spatial_pads(call: TemplateCall, ins: Sequence[int], outs: Sequence[int], ks: Sequence[int],
                 strides: Sequence[int], dils: Sequence[int]) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) of a Conv/pool node from ``pads``/``auto_pad`` and the output shape."""
    r = len(ins)
    auto = call.attr("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto == "NOTSET":
        pads = _ints(call, "pads", 2 * r, 0)
        return pads[:r], pads[r:]
    if auto == "VALID":
        return [0] * r, [0] * r
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise TemplateError(f"{call.node.op_type}: unsupported auto_pad {auto!r}")
    begin, end = [], []
    for i, o, k, s, d in zip(ins, outs, ks, strides, dils, strict=True):
        total = max(0, (o - 1) * s + (k - 1) * d + 1 - i)
        b = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begin.append(b)
        end.append(total - b)
    return begin, end


def _buffer(call: TemplateCall, op: Operand | None, what: str) -> TensorRef:
    if op is None:
        raise TemplateError(f"{call.node.op_type}: missing input {what}")
    if op.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: {what} is {op.dtype}; only float32 is supported")
    if op.ref is None and op.const is not None and call.pack is not None:
        return call.packed(np.asarray(op.const, dtype=np.float32))
    if op.ref is None:
        raise TemplateError(f"{call.node.op_type}: input {what} is not a buffer")
    return op.ref


def _common(call: TemplateCall):
    if call.out_dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 outputs are supported")
    x = call.inputs[0]
    w = call.inputs[1] if len(call.inputs) > 1 else None
    b = call.inputs[2] if len(call.inputs) > 2 else None
    if x is None or x.ref is None:
        raise TemplateError(f"{call.node.op_type}: input X must be a buffer")
    if x.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 inputs are supported")
    if w is None:
        raise TemplateError(f"{call.node.op_type}: missing weight")
    if len(x.shape) < 3:
        raise TemplateError(f"{call.node.op_type}: input rank {len(x.shape)} < 3 is not supported")
    if len(w.shape) != len(x.shape):
        raise TemplateError(f"{call.node.op_type}: weight rank {len(w.shape)} != input rank {len(x.shape)}")
    r = len(x.shape) - 2
    ks = list(w.shape[2:])
    kattr = call.attr("kernel_shape")
    if kattr is not None and [int(v) for v in kattr] != ks:
        raise TemplateError(f"{call.node.op_type}: kernel_shape {list(kattr)} does not match the weight {ks}")
    group = int(call.attr("group", 1))
    strides = _ints(call, "strides", r, 1)
    dils = _ints(call, "dilations", r, 1)
    if min(strides) < 1 or min(dils) < 1 or group < 1:
        raise TemplateError(f"{call.node.op_type}: strides, dilations and group must be >= 1")
    if w.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: W is {w.dtype}; only float32 is supported")
    bref = _buffer(call, b, "B") if b is not None else None
    return x.ref, w, bref, r, ks, group, strides, dils


# ----------------------------------------------------------------------------------------------- Conv

@register("Conv", needs_buffers=True)
def conv(call: TemplateCall) -> str:
    LANES, OC_BLOCK = call.target.lanes, call.target.conv_oc_block
    COL_FLOATS = call.target.l1d_bytes * 7 // 32  # the im2col stack buffer: 7/8 of L1d
    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    xref, w, bref, r, ks, group, strides, dils = _common(call)
    N, C, *ins = xref.shape
    M, Cg = w.shape[:2]
    outs = list(call.out_shape[2:])
    if Cg * group != C or M % group:
        raise TemplateError(f"Conv: channels {C} (weight {M}x{Cg}) do not divide into {group} groups")
    if tuple(call.out_shape[:2]) != (N, M):
        raise TemplateError(f"Conv: output shape {call.out_shape} does not match N={N}, M={M}")
    pb, pe = spatial_pads(call, ins, outs, ks, strides, dils)
    for i, o, k, s, d, a, e in zip(ins, outs, ks, strides, dils, pb, pe, strict=True):
        if (i + a + e - ((k - 1) * d + 1)) // s + 1 != o:
            raise TemplateError(f"Conv: output shape {call.out_shape} inconsistent with the attributes")
    pointwise = all(k == 1 for k in ks) and all(s == 1 for s in strides) and not any(pb) and not any(pe)
    if (r == 2 and group == C == M and C > 1 and w.const is not None and call.pack is not None
            and xref.strides[-1] == 1 and call.scratch.contiguous):
        g = ConvGeometry(C, ins[0], ins[1], outs[0], outs[1], ks[0], ks[1], strides[0], strides[1], dils[0],
                         dils[1], pb[0], pb[1])
        return _depthwise(call, xref, np.asarray(w.const, dtype=np.float32).reshape(C, -1), bref, g)
    gemm_ok = group == 1 and w.const is not None and call.workspace is not None and call.scratch.contiguous
    if gemm_ok and r == 2:  # pixels as rows: where the direct kernel or short rows waste most
        g = ConvGeometry(C, ins[0], ins[1], outs[0], outs[1], ks[0], ks[1], strides[0], strides[1], dils[0],
                         dils[1], pb[0], pb[1])
        if direct_pays(g, M) and xref.strides[-1] == 1:
            blocked = _blocked_direct(call, xref, np.asarray(w.const, dtype=np.float32), bref, g)
            if blocked is not None:
                return blocked
        if conv_gemm_pays(g, M) and (not pointwise or g.ow <= POINTWISE_ROWS_MAX_OW):
            packed = _im2col_packed(call, xref, np.asarray(w.const, dtype=np.float32).reshape(M, -1), bref, g)
            if packed is not None:
                return packed
    if pointwise and gemm_ok and _flat_ok(xref, 2):  # pixels as columns
        packed = _pointwise_packed(call, xref, np.asarray(w.const, dtype=np.float32).reshape(M, C), bref, outs)
        if packed is not None:
            return packed
    if pointwise and _flat_ok(xref, 2) and r > 1:
        # a 1x1 conv is a GEMM: view the spatial dims as one row of length P
        P = math.prod(ins)
        flat = TensorRef(xref.ptr, xref.dtype, (N, C, P), (*xref.strides[:2], 1), xref.offset)
        xref, ins, outs_k, ks2, strides, dils, pb = flat, [P], [P], [1], [1], [1], [0]
        out_sp = lambda sp: _unflat(sp[0], outs)  # noqa: E731
    else:
        outs_k, ks2, out_sp = outs, ks, (lambda sp: sp)
    wconv = None
    if w.const is not None and call.pack is not None:
        wconv = np.asarray(w.const, dtype=np.float32).reshape(M, Cg, -1)
    elif w.ref is None:
        raise TemplateError("Conv: weight W must be a buffer")
    Kp, P = math.prod(ks), math.prod(outs)
    Pp = -(-P // LANES) * LANES
    chunk = min(Cg, COL_FLOATS // (Kp * Pp)) * Kp  # reduction length per im2col chunk
    if (wconv is not None and (Kp > 1 or strides[-1] > 1) and outs_k is outs and _flat_ok(call.scratch, 2)
            and M // group >= OC_BLOCK and (outs[-1] < 2 * LANES or strides[-1] > 1)
            and chunk >= (IM2COL_MIN_RED if strides[-1] == 1 else IM2COL_MIN_RED_STRIDED)):
        return _conv_im2col(call, xref, wconv, bref, group, ks, strides, dils, pb)
    kzero = ["0"] * (len(w.shape) - 2)

    def wexpr(g: str, m: str, c: str, kk: list[str]) -> str:
        return w.ref.at([lin((g, M // group), (m, 1)), c, *(kk if len(kk) == len(kzero) else kzero)])

    outer = [_conv_taps(o, i, s, d, p, k) for o, i, s, d, p, k in
             zip(outs_k[:-1], ins[:-1], strides[:-1], dils[:-1], pb[:-1], ks2[:-1], strict=True)]
    phase = Phase(outs_k[-1], 0, 1, strides[-1],
                  [(k, k * dils[-1] - pb[-1]) for k in range(ks2[-1])])
    return _direct(call, xref, wconv, wexpr, bref, group, Cg, M // group, ks2, outer, [phase], out_sp)


def _pointwise_packed(call: TemplateCall, xref: TensorRef, w2: np.ndarray, bref: TensorRef | None,
                      outs: list[int]) -> str | None:
    """A 1x1 stride-1 convolution as the packed GEMM of the loop IR (``schedule.gemm``, "b" plan): per
    image, Y (Co x pixels) = W (Co x Ci, packed at compile time) @ X (Ci x pixels, packed per block into
    the workspace); bias in the epilogue."""
    N, C = xref.shape[:2]
    M, P = w2.shape[0], math.prod(outs)
    ws, c = call.workspace, call.scratch
    plan = plan_gemm_wconst(M, P, C, N, call.target, call.threads)
    if plan.workspace_bytes > 4 * ws.size:
        return None
    names = call.names
    apk = call.packed(pack_a(w2, plan.mr))
    ap = Buf(apk.ptr, "float32", Layout.strided((M * C,)))
    xs = (xref.strides[0], xref.strides[1], 1)
    x = Buf(xref.ptr, "float32", Layout.strided((N, C, P), xs, xref.offset))
    cb = Buf(c.ptr, "float32", Layout.strided((N, M, P), (M * P, P, 1), c.offset))
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    trivial = call.direct and bref is None
    f = gemm_func_wconst(plan, ap, x, cb, wsb, not trivial, fresh=names)
    _verify_wconst_once(plan, xs, not trivial, ws.size)

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return call.emit(f, store, {wsb.name: ws.base()})


def _im2col_packed(call: TemplateCall, xref: TensorRef, w2: np.ndarray, bref: TensorRef | None,
                   g: ConvGeometry) -> str | None:
    """A 2-D group-1 convolution as the im2col GEMM of the loop IR (``schedule.gemm.gemm_func_conv``):
    output pixels as rows, output channels as columns (the weight packed at compile time), im2col panels
    gathered per block into the workspace; bias in the epilogue."""
    N = xref.shape[0]
    M, P = w2.shape[0], g.oh * g.ow
    ws, c = call.workspace, call.scratch
    plan = plan_gemm_conv(M, g, N, call.target, call.threads)
    if plan.workspace_bytes > 4 * ws.size:
        return None
    names = call.names
    bpk = call.packed(pack_b(np.ascontiguousarray(w2.T), plan.nr))
    wp = Buf(bpk.ptr, "float32", Layout.strided(bpk.shape))
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    cb = Buf(c.ptr, "float32", Layout.strided((N, M, P), (M * P, P, 1), c.offset))
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    trivial = call.direct and bref is None
    f = gemm_func_conv(plan, g, x, wp, cb, wsb, not trivial, fresh=names)
    _verify_conv_once(plan, g, xref.shape, xref.strides, not trivial, ws.size)
    outs = [g.oh, g.ow]

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return call.emit(f, store, {wsb.name: ws.base()})


def _blocked_direct(call: TemplateCall, xref: TensorRef, w4: np.ndarray, bref: TensorRef | None,
                    g: ConvGeometry) -> str | None:
    """A 2-D group-1 convolution as the direct convolution of the loop IR over a channel-blocked copy of the
    input (``schedule.direct``): the weight packed at compile time for the register tile; bias in the
    epilogue."""
    N, M = xref.shape[0], w4.shape[0]
    ws, c = call.workspace, call.scratch
    plan = plan_direct(M, g, N, call.target, call.threads)
    if plan.workspace_floats > ws.size:
        return None
    names = call.names
    wpk = call.packed(pack_direct(w4, plan))
    wp = Buf(wpk.ptr, "float32", Layout.strided(wpk.shape))
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    cb = Buf(c.ptr, "float32", Layout.strided((N, M, g.oh * g.ow), None, c.offset))
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    f = direct_func(plan, x, wp, cb, wsb, fresh=names)
    _verify_direct_once(plan, xref.shape, xref.strides, ws.size)
    outs = [g.oh, g.ow]

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return call.emit(f, store, {wsb.name: ws.base()})


@functools.lru_cache(maxsize=256)
def _verify_direct_once(plan: DirectPlan, shape: tuple[int, ...], strides: tuple[int, ...], ws_floats: int) -> None:
    x = Buf("x", "float32", Layout.strided(shape, strides))
    wp = Buf("w", "float32", Layout.strided((plan.n_oct, plan.ncb * plan.g.kh * plan.g.kw * plan.cbi * plan.no)))
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.co, plan.g.oh * plan.g.ow)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(direct_func(plan, x, wp, c, ws))


@functools.lru_cache(maxsize=256)
def _verify_conv_once(plan: GemmPlan, g: ConvGeometry, shape: tuple[int, ...], strides: tuple[int, ...],
                      epilogue: bool, ws_floats: int) -> None:
    """verify_func on the loop IR of ``plan`` (the same for every convolution with this geometry)."""
    x = Buf("x", "float32", Layout.strided(shape, strides))
    wp = Buf("w", "float32", Layout.strided((plan.col_panels, plan.k, plan.nr)))
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.n, plan.m)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(gemm_func_conv(plan, g, x, wp, c, ws, epilogue))


def _depthwise(call: TemplateCall, xref: TensorRef, w2: np.ndarray, bref: TensorRef | None, g: ConvGeometry) -> str:
    """A depthwise convolution (one channel per group) in the loop IR (``schedule.dwconv``): per channel, the
    plane micro-kernel, then bias and the fused epilogue as one loop over the plane (vectorized)."""
    N, c = xref.shape[0], call.scratch
    wpk = call.packed(w2)
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    wt = Buf(wpk.ptr, "float32", Layout.strided(wpk.shape))
    cb = Buf(c.ptr, "float32", Layout.strided((N, g.ci, g.oh * g.ow), None, c.offset))
    trivial = call.direct and bref is None
    f = dw_func(g, N, x, wt, cb, not trivial, call.threads, fresh=call.names, flat=True)
    _verify_dw_once(g, N, xref.shape, xref.strides, not trivial, call.threads)

    def store(idx, v):
        return _pixel_store(call, bref, [g.oh, g.ow], idx, v)

    return call.emit(f, store)


@functools.lru_cache(maxsize=256)
def _verify_dw_once(g: ConvGeometry, batch: int, shape: tuple[int, ...], strides: tuple[int, ...], epilogue: bool,
                    threads: int) -> None:
    x = Buf("x", "float32", Layout.strided(shape, strides))
    wt = Buf("w", "float32", Layout.strided((g.ci, g.kh * g.kw)))
    c = Buf("c", "float32", Layout.strided((batch, g.ci, g.oh * g.ow)))
    verify_func(dw_func(g, batch, x, wt, c, epilogue, threads, flat=True))


def _pixel_store(call: TemplateCall, bref: TensorRef | None, outs: list[int], idx, v: str) -> str:
    """The epilogue of element (image, channel, flat pixel) of a GEMM-form convolution: bias, then ``store``
    at the pixel's (h, w). An address h*W + w of a contiguous operand is the flat index again, which C
    compilers do not see (and then do not vectorize the epilogue): it is folded back."""
    n, co, p = idx
    val = f"{v} + {bref.at([co])}" if bref is not None else v
    name = p if re.fullmatch(r"\w+", p) else call.names("px")
    text = _FLAT_AGAIN.sub(r"\1", call.store([n, co, *_unflat(name, outs)], val))
    return text if name == p else f"{{ const int64_t {name} = {p}; {text} }}"


_FLAT_AGAIN = re.compile(r"\(\((\w+)\) / (\d+)\)\*\2 \+ \(\(\1\) % \2\)")


@functools.lru_cache(maxsize=256)
def _verify_wconst_once(plan: GemmPlan, x_strides: tuple[int, int, int], epilogue: bool, ws_floats: int) -> None:
    """verify_func on the loop IR of ``plan`` (the same for every convolution with this plan and strides)."""
    ap = Buf("a", "float32", Layout.strided((plan.m * plan.k,)))
    span = (plan.batch - 1) * x_strides[0] + (plan.k - 1) * x_strides[1] + plan.n
    x = Buf("x", "float32", Layout.strided((plan.batch, plan.k, plan.n), x_strides))
    if x.layout.span > span:
        raise TemplateError("internal: the input's channels overlap")
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.m, plan.n)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(gemm_func_wconst(plan, ap, x, c, ws, epilogue))


@dataclass
class Phase:
    """Output positions ``OO + OS*u`` (u in [0, U)) of the last spatial dim; a tap ``(k, off)`` (kernel index
    k of the last dim) reads the input position ``u*SL + off`` (when inside the input)."""

    U: int
    OO: int
    OS: int
    SL: int
    taps: list[tuple[int, int]]


def _direct(call: TemplateCall, xref: TensorRef, wconv: np.ndarray | None,
            wexpr: Callable[[str, str, str, list[str]], str], bref: TensorRef | None, group: int, Cg: int, Mg: int,
            ks: list[int], outer: list[list[list[tuple[int, int]]]], phases: list[Phase],
            out_sp: Callable[[list[str]], list[str]]) -> str:
    """Register-blocked direct convolution (the gather form of Conv and ConvTranspose).

    For each (n, group, outer output position, block of up to 6 output channels), tiles of 2 x LANES
    positions of the last spatial dim accumulate in GCC vector registers over (input channel, outer taps,
    last-dim taps). ``outer[d][o]`` lists the (tap k, input position) pairs that feed output row o of outer
    dim d; ``phases`` describe the last dim. Lanes whose input position falls in the padding get literal
    zeros (tiles at the row borders are generated with literal positions); tiles in the interior run in a
    loop with plain vector loads. ``wconv``: the constant weight as (M, Cg, prod(ks)) in Conv layout, packed
    as [group][block][ic][taps][6]; otherwise ``wexpr(g, m, ic, k indices)`` reads the runtime weight of
    output channel g*Mg + m, input channel g*Cg + ic."""
    LANES = call.target.lanes
    names = call.names
    N = xref.shape[0]
    IL = xref.shape[-1]
    Kp = math.prod(ks)
    xs = xref.strides
    decls: list[str] = []
    n = names("n") if N > 1 else "0"
    g = names("g") if group > 1 else "0"
    O_outer = [len(rows) for rows in outer]
    osp = [names("o") if o > 1 else "0" for o in O_outer]

    packed = _pack_blocks(call, wconv.reshape(group * Mg, Cg, Kp), group, Mg) if wconv is not None else None

    # outer dims: (k expr, input position expr) per dim, with table-driven tap loops when needed
    outer_plan = []
    for d, rows in enumerate(outer):
        single = all(len(t) == 1 and t[0][0] == 0 for t in rows)
        lin_ok = single and (len(rows) == 1 or all(t[0][1] - rows[0][0][1] == o * (rows[1][0][1] - rows[0][0][1])
                                                   for o, t in enumerate(rows)))
        if lin_ok:
            step = rows[1][0][1] - rows[0][0][1] if len(rows) > 1 else 0
            outer_plan.append(("lin", "0", lin((osp[d], step), rows[0][0][1])))
            continue
        start, end, tk, ti = [], [], [], []
        for t in rows:
            start.append(len(tk))
            tk += [k for k, _ in t]
            ti += [i for _, i in t]
            end.append(len(tk))
        q = names("q")
        if not tk:
            tk, ti = [0], [0]
        outer_plan.append(("tab", q, _table(names, decls, start, osp[d]), _table(names, decls, end, osp[d]),
                           _table(names, decls, tk, q), _table(names, decls, ti, q)))

    def outer_taps(body: Callable[[list[str], list[str]], str]) -> str:
        kk, ii, heads = [], [], []
        for plan in outer_plan:
            if plan[0] == "lin":
                kk.append(plan[1])
                ii.append(plan[2])
                continue
            _, q, lo, hi, tk, ti = plan
            k, i = names("k"), names("ih")
            kk.append(k)
            ii.append(i)
            heads.append(f"for (int64_t {q} = {lo}; {q} < {hi}; ++{q}) {{\nconst int64_t {k} = {tk};\n"
                         f"const int64_t {i} = {ti};")
        text = body(kk, ii)
        for h in reversed(heads):
            text = f"{h}\n{indent(text)}\n}}"
        return text

    def xrow(c: str, ii: list[str], last: str) -> str:
        terms = [(n, xs[0]), (lin((g, Cg), (c, 1)), xs[1])]
        terms += [(i, xs[2 + d]) for d, i in enumerate(ii)]
        return f"{xref.ptr} + ({lin(xref.offset, *terms, (last, xs[-1]))})"

    def block(m0: str, nb: int) -> str:
        gm0 = lin((g, Mg), (m0, 1))
        ocs = [lin((gm0, 1), j) for j in range(nb)]
        init = [bref.at([oc]) if bref else "0.0f" for oc in ocs]
        parts = []

        def weights(c: str, kk: list[str]) -> tuple[list[str], Callable[[int], list[str]]]:
            if packed is not None:
                wr = names("pw")
                flat = lin((c, Kp), *[(k, math.prod(ks[d + 1:])) for d, k in enumerate(kk)])
                decl = f"const float* restrict {wr} = {packed.ptr} + ({lin((gm0, Cg * Kp), (flat, nb))});"
                return [decl], lambda kl: [f"{wr}[{kl * nb + j}]" for j in range(nb)]
            return [], lambda kl: [wexpr(g, lin((m0, 1), j), c, [*kk, str(kl)]) for j in range(nb)]

        def tile(ph: Phase, u0: str, lit: int | None, vecs: list[tuple[int, int]]) -> str:
            """8-lane vectors of last-dim positions u, vector q at ``u0 + vecs[q][0]``, its lanes before
            ``vecs[q][1]`` not stored (they overlap the previous vector). ``lit``: the value of u0 when
            literal; then lanes reading the padding get literal zeros and lanes >= U are dead."""
            c, v = names("c"), names("v")
            accv = [[names("av") for _ in vecs] for _ in ocs]
            lines = []
            for jj in range(nb):
                lines += [f"dlcc_vf {a} = (dlcc_vf){{0}} + {init[jj]};" for a in accv[jj]]
            sx = ph.SL * xs[-1]

            def inner(kk: list[str], ii: list[str]) -> str:
                xr = names("px")
                wdecl, wexp = weights(c, kk)
                body = [f"const float* restrict {xr} = {xrow(c, ii, lin((u0, ph.SL)))};", *wdecl]
                for k, off in ph.taps:
                    xv = [names("xv") for _ in vecs]
                    for q, name in enumerate(xv):
                        ok = [True] * LANES
                        if lit is not None:
                            for e in range(LANES):
                                u = lit + vecs[q][0] + e
                                ok[e] = u < ph.U and 0 <= u * ph.SL + off < IL
                        if sx == 1 and all(ok):
                            body.append(f"const dlcc_vf {name} = dlcc_vf_load({xr} + {off * xs[-1] + vecs[q][0]});")
                        else:
                            els = ", ".join(f"{xr}[{off * xs[-1] + (vecs[q][0] + e) * sx}]" if ok[e] else "0.0f"
                                            for e in range(LANES))
                            body.append(f"const dlcc_vf {name} = (dlcc_vf){{{els}}};")
                    for jj, we in enumerate(wexp(k)):
                        wv = names("wv")
                        body.append(f"const float {wv} = {we};")
                        body += [f"{a} += {wv} * {x};" for a, x in zip(accv[jj], xv, strict=True)]
                return "\n".join(body)

            if ph.taps:
                red = outer_taps(inner)
                lines.append(f"for (int64_t {c} = 0; {c} < {Cg}; ++{c}) {{\n{indent(red)}\n}}")
            res = names("res")
            lines.append(f"float {res}[{nb}][{len(vecs) * LANES}];")
            for jj in range(nb):
                lines += [f"dlcc_vf_store(&{res}[{jj}][{q * LANES}], {a});" for q, a in enumerate(accv[jj])]
            for q, (off, sf) in enumerate(vecs):
                stop = LANES if lit is None else min(LANES, ph.U - lit - off)
                pos = lin((lin((u0, 1), (v, 1), off), ph.OS), ph.OO)
                st = "\n".join(call.store([n, oc, *out_sp([*osp, pos])], f"{res}[{jj}][{lin((v, 1), q * LANES)}]")
                               for jj, oc in enumerate(ocs))
                lines.append(f"for (int64_t {v} = {sf}; {v} < {stop}; ++{v}) {{\n{indent(st)}\n}}")
            return "{\n" + indent("\n".join(lines)) + "\n}"

        for ph in phases:
            if ph.U <= 0:
                continue
            # cover [0, U) with 8-lane groups; a last partial group overlaps the previous one (its overlapping
            # lanes are recomputed, not stored); runs of groups that never read the padding become a loop
            if ph.U < LANES:
                groups = [(0, 0)]
            else:
                groups = [(st, 0) for st in range(0, ph.U - LANES + 1, LANES)]
                if ph.U % LANES:
                    groups.append((ph.U - LANES, groups[-1][0] + LANES - (ph.U - LANES)))

            def interior(st: int, sf: int, ph: Phase = ph) -> bool:
                return (sf == 0 and ph.U >= LANES
                        and all(st * ph.SL + off >= 0 and (st + LANES - 1) * ph.SL + off <= IL - 1
                                for _, off in ph.taps))

            pending: list[tuple[int, int]] = []  # groups that need literal tiles, paired two by two

            def flush(ph: Phase = ph, pending: list = pending) -> None:
                while pending:
                    vs, pending[:] = pending[:2], pending[2:]
                    parts.append(tile(ph, str(vs[0][0]), vs[0][0], [(st - vs[0][0], sf) for st, sf in vs]))

            i = 0
            while i < len(groups):
                if not interior(*groups[i]):
                    pending.append(groups[i])
                    i += 1
                    continue
                j = i
                while j < len(groups) and interior(*groups[j]):
                    j += 1
                st, run = groups[i][0], j - i
                pairs = run // 2
                if run % 2:
                    pending.append(groups[j - 1])
                flush()
                if pairs == 1:
                    parts.append(tile(ph, str(st), None, [(0, 0), (LANES, 0)]))
                elif pairs > 1:
                    tb = names("tb")
                    body = tile(ph, lin((tb, 2 * LANES), st), None, [(0, 0), (LANES, 0)])
                    parts.append(f"for (int64_t {tb} = 0; {tb} < {pairs}; ++{tb}) {body}")
                i = j
            flush()
        return "\n".join(p for p in parts if p)

    # threads: the outermost loop (batch, group, output rows; else the channel blocks) is split over them:
    # its iterations write disjoint outputs and keep their accumulators in registers and locals
    outer_loops = [(v, e) for v, e in [(n, N), (g, group), *zip(osp, O_outer, strict=True)] if v != "0"]
    par = call.parallel(2.0 * math.prod(call.out_shape) * Cg * Kp)
    code = _blocks(names, Mg, block, call.target.conv_oc_block, parallel=par and not outer_loops)
    for i, (v, e) in enumerate(reversed(outer_loops)):
        if par and i == len(outer_loops) - 1:
            code = par_for(v, e, code)
        else:
            code = f"for (int64_t {v} = 0; {v} < {e}; ++{v}) {{\n{indent(code)}\n}}"
    return "\n".join([*decls, code])


def _pack_blocks(call: TemplateCall, wconv: np.ndarray, group: int, Mg: int) -> TensorRef:
    """The Conv-layout weight (M, Cg, taps) packed as [group][channel block][ic][taps][j < 6]."""
    OC_BLOCK = call.target.conv_oc_block
    M, Cg, Kp = wconv.shape
    w2 = wconv.reshape(M, Cg * Kp)
    chunks = []
    for gi in range(group):
        for m0, nb in _block_list(Mg, OC_BLOCK):
            chunks.append(w2[gi * Mg + m0: gi * Mg + m0 + nb].T.reshape(-1))  # [ic, taps, j]
    return call.packed(np.concatenate(chunks).astype(np.float32))


def _conv_im2col(call: TemplateCall, xref: TensorRef, wconv: np.ndarray, bref: TensorRef | None, group: int,
                 ks: list[int], strides: list[int], dils: list[int], pb: list[int]) -> str:
    """Conv on small planes (short rows waste vector lanes in ``_direct``): per (n, group, chunk of input
    channels) the receptive fields are gathered into a zero-padded stack buffer col[ic][taps][positions]
    (< 32 KB), then a GEMM with (6 channels x 2 vectors) register tiles runs over the flattened output
    positions, accumulating partial sums in ``call.scratch`` across chunks; ``store`` is applied at the end."""
    LANES, OC_BLOCK = call.target.lanes, call.target.conv_oc_block
    COL_FLOATS = call.target.l1d_bytes * 7 // 32
    names = call.names
    sref = call.scratch
    N, _, *ins = xref.shape
    outs = list(call.out_shape[2:])
    M, Cg, Kp = wconv.shape
    Mg = M // group
    r = len(ks)
    P = math.prod(outs)
    Pp = -(-P // LANES) * LANES
    CC = min(Cg, COL_FLOATS // (Kp * Pp))
    packed = _pack_blocks(call, wconv, group, Mg)
    xs = xref.strides
    n = names("n") if N > 1 else "0"
    g = names("g") if group > 1 else "0"
    c0, cn, col = names("c0"), names("cn"), names("col")
    # gather: col[(ci*Kp + tap)*Pp + p] = x[n, g*Cg + c0 + ci, o*s - pad + k*d] or 0 in the padding
    ci = names("ci")
    kk = [names("k") for _ in ks]
    oo = [names("o") for _ in outs]
    ii = [names("ih") for _ in outs]
    body = []
    conds = []
    for d in range(r):
        body.append(f"const int64_t {ii[d]} = {lin((oo[d], strides[d]), (kk[d], dils[d]), -pb[d])};")
        conds.append(f"{ii[d]} >= 0 && {ii[d]} < {ins[d]}")
    src_idx = lin(xref.offset, (n, xs[0]), (lin((g, Cg), (c0, 1), (ci, 1)), xs[1]),
                  *[(i, s) for i, s in zip(ii, xs[2:], strict=True)])
    src = f"{xref.ptr}[{src_idx}]"
    tap = lin(*[(k, math.prod(ks[d + 1:])) for d, k in enumerate(kk)])
    pos = lin(*[(o, math.prod(outs[d + 1:])) for d, o in enumerate(oo)])
    body.append(f"{col}[{lin((lin((ci, Kp), (tap, 1)), Pp), (pos, 1))}] = ({' && '.join(conds)}) ? {src} : 0.0f;")
    gather = "\n".join(body)
    for o, size in reversed(list(zip(oo, outs, strict=True))):
        gather = f"for (int64_t {o} = 0; {o} < {size}; ++{o}) {{\n{indent(gather)}\n}}"
    for k, size in reversed(list(zip(kk, ks, strict=True))):
        gather = f"for (int64_t {k} = 0; {k} < {size}; ++{k}) {{\n{indent(gather)}\n}}"
    gather = f"for (int64_t {ci} = 0; {ci} < {cn}; ++{ci}) {{\n{indent(gather)}\n}}"

    def sptr(oc: str) -> str:
        return f"({sref.ptr} + ({sref.index([n, oc, *['0'] * r])}))"

    def block(m0: str, nb: int) -> str:
        gm0 = lin((g, Mg), (m0, 1))
        ocs = [lin((gm0, 1), j) for j in range(nb)]

        def tile(p0: str, nvec: int, live: int) -> str:
            accs = [[names("av") for _ in range(nvec)] for _ in ocs]
            ck, cp, wp, v = names("ck"), names("pc"), names("pw"), names("v")
            lines = [f"dlcc_vf {a};" for row in accs for a in row]
            init0, load, save = [], [], []
            for jj, oc in enumerate(ocs):
                bias = bref.at([oc]) if bref else "0.0f"
                for q, a in enumerate(accs[jj]):
                    init0.append(f"{a} = (dlcc_vf){{0}} + {bias};")
                    base = f"{sptr(oc)} + {lin((p0, 1), q * LANES)}"
                    n_live = min(LANES, live - q * LANES)
                    if n_live == LANES:
                        load.append(f"{a} = dlcc_vf_load({base});")
                        save.append(f"dlcc_vf_store({base}, {a});")
                    else:  # the last vector of the plane: only its live lanes are in the buffer
                        load.append(f"{a} = (dlcc_vf){{0}};\nfor (int64_t {v} = 0; {v} < {n_live}; ++{v}) "
                                    f"{a}[{v}] = ({base})[{v}];")
                        save.append(f"for (int64_t {v} = 0; {v} < {n_live}; ++{v}) ({base})[{v}] = {a}[{v}];")
            lines.append(f"if ({c0} == 0) {{\n{indent(chr(10).join(init0))}\n}} else {{\n"
                         f"{indent(chr(10).join(load))}\n}}")
            red = [f"const float* restrict {cp} = {col} + {lin((ck, Pp), (p0, 1))};",
                   f"const float* restrict {wp} = {packed.ptr} + {lin((gm0, Cg * Kp), (c0, Kp * nb), (ck, nb))};"]
            xv = [names("xv") for _ in range(nvec)]
            red += [f"const dlcc_vf {x} = dlcc_vf_load({cp} + {q * LANES});" for q, x in enumerate(xv)]
            for jj in range(nb):
                wv = names("wv")
                red.append(f"const float {wv} = {wp}[{jj}];")
                red += [f"{a} += {wv} * {x};" for a, x in zip(accs[jj], xv, strict=True)]
            lines.append(f"for (int64_t {ck} = 0; {ck} < {cn} * {Kp}; ++{ck}) {{\n{indent(chr(10).join(red))}\n}}")
            lines += save
            return "{\n" + indent("\n".join(lines)) + "\n}"

        parts = []
        full, rest = divmod(Pp, 2 * LANES)
        if full:
            tb = names("tb")
            last_full_live = P - (full - 1) * 2 * LANES
            if last_full_live >= 2 * LANES:
                parts.append(f"for (int64_t {tb} = 0; {tb} < {full}; ++{tb}) "
                             + tile(f"({tb})*{2 * LANES}", 2, 2 * LANES))
            else:
                if full > 1:
                    parts.append(f"for (int64_t {tb} = 0; {tb} < {full - 1}; ++{tb}) "
                                 + tile(f"({tb})*{2 * LANES}", 2, 2 * LANES))
                parts.append(tile(str((full - 1) * 2 * LANES), 2, last_full_live))
        if rest:
            parts.append(tile(str(full * 2 * LANES), 1, P - full * 2 * LANES))
        return "\n".join(parts)

    nblocks = -(-Mg // OC_BLOCK)
    T = min(call.threads, nblocks) if call.parallel(2.0 * math.prod(call.out_shape) * Cg * Kp) else 1
    if T > 1:  # threads: each takes a range of output-channel blocks, gathering into its own col buffer
        t, blo, bhi, b = names("t"), names("blo"), names("bhi"), names("b")
        full, tail = divmod(Mg, OC_BLOCK)
        one = block(f"({b})*{OC_BLOCK}", OC_BLOCK)
        if tail:
            one = f"if ({b} < {full}) {{\n{indent(one)}\n}} else {{\n{indent(block(str(full * OC_BLOCK), tail))}\n}}"
        blocks = f"for (int64_t {b} = {blo}; {b} < {bhi}; ++{b}) {{\n{indent(one)}\n}}"
    else:
        blocks = _blocks(names, Mg, block, OC_BLOCK)
    chunk = "\n".join([f"const int64_t {cn} = {Cg} - {c0} < {CC} ? {Cg} - {c0} : {CC};", gather, blocks])
    code = f"for (int64_t {c0} = 0; {c0} < {Cg}; {c0} += {CC}) {{\n{indent(chunk)}\n}}"
    if group > 1:
        code = f"for (int64_t {g} = 0; {g} < {group}; ++{g}) {{\n{indent(code)}\n}}"
    if N > 1:
        code = f"for (int64_t {n} = 0; {n} < {N}; ++{n}) {{\n{indent(code)}\n}}"
    col_decl = [f"float {col}[{CC * Kp * Pp}];", f"memset({col}, 0, sizeof {col});"]
    if T > 1:
        code = par_for(t, T, "\n".join([f"const int64_t {blo} = {t} * {nblocks} / {T};",
                                         f"const int64_t {bhi} = ({t} + 1) * {nblocks} / {T};", *col_decl, code]))
        col_decl = []
    lines = [*col_decl, code]
    if not call.direct:
        _, st = loops(call.out_shape, names, lambda idx: call.store(idx, sref.at(idx)), "s")
        lines.append(st)
    return "\n".join(lines)


def _conv_taps(O: int, I: int, s: int, d: int, p: int, K: int) -> list[list[tuple[int, int]]]:
    """Conv: for each output position o, the (tap, input position) pairs inside the input."""
    return [[(k, o * s - p + k * d) for k in range(K) if 0 <= o * s - p + k * d < I] for o in range(O)]


def _convt_taps(O: int, I: int, s: int, d: int, p: int, K: int) -> list[list[tuple[int, int]]]:
    """ConvTranspose (gather form): output o = i*s - p + k*d, so i = (o + p - k*d) / s when exact."""
    rows = []
    for o in range(O):
        rows.append([(k, (o + p - k * d) // s) for k in range(K)
                     if (o + p - k * d) % s == 0 and 0 <= (o + p - k * d) // s < I])
    return rows


def _convt_phases(O: int, s: int, d: int, p: int, K: int) -> list[Phase]:
    """The last dim of a ConvTranspose: outputs o = r + s*u per residue r, each a stride-1 conv in u."""
    phases = []
    for rr in range(min(s, O)):
        taps = [(k, (rr + p - k * d) // s) for k in range(K) if (rr + p - k * d) % s == 0]
        phases.append(Phase(-(-(O - rr) // s), rr, s, 1, taps))
    return phases


def _block_list(total: int, size: int) -> list[tuple[int, int]]:
    return [(m, min(size, total - m)) for m in range(0, total, size)]


def _blocks(names: Names, total: int, block: Callable[[str, int], str], size: int,
            var: str | None = None, parallel: bool = False) -> str:
    """Code running ``block(start, count)`` over [0, total) in blocks of ``size`` (a loop) plus a tail;
    ``parallel``: one loop over every block, marked for the thread pool, the tail its last iteration."""
    full, tail = divmod(total, size)
    if parallel and full + (tail > 0) > 1:
        b = var or names("b")
        body = block(f"({b})*{size}", size)
        if tail:
            body = (f"if ({b} < {full}) {{\n{indent(body)}\n}} else {{\n{indent(block(str(full * size), tail))}\n}}"
                    if full else block("0", tail))
        return par_for(b, full + (tail > 0), body)
    parts = []
    if full == 1:
        parts.append("{\n" + indent(block("0", size)) + "\n}")
    elif full > 1:
        b = var or names("b")
        parts.append(f"for (int64_t {b} = 0; {b} < {full}; ++{b}) {{\n{indent(block(f'({b})*{size}', size))}\n}}")
    if tail:
        parts.append("{\n" + indent(block(str(full * size), tail)) + "\n}")
    return "\n".join(parts)


def _flat_ok(ref: TensorRef, lead: int) -> bool:
    """True when the dims after ``lead`` of ``ref`` are one contiguous run (flat index p works)."""
    acc = 1
    for d, s in zip(reversed(ref.shape[lead:]), reversed(ref.strides[lead:]), strict=True):
        if d != 1 and s != acc:
            return False
        acc *= d
    return True


def _unflat(p: str, shape: Sequence[int]) -> list[str]:
    """Per-dim index expressions of flat row-major position ``p`` in ``shape``."""
    idx, inner = [], math.prod(shape)
    for d in shape:
        inner //= d
        if d == 1:
            idx.append("0")
        elif inner == 1:
            idx.append(f"({p}) % {d}" if len(idx) else p)
        else:
            idx.append(f"(({p}) / {inner}) % {d}" if idx else f"({p}) / {inner}")
    return idx


# -------------------------------------------------------------------------------------- ConvTranspose

@register("ConvTranspose", needs_buffers=True)
def conv_transpose(call: TemplateCall) -> str:
    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    xref, w, bref, r, ks, group, strides, dils = _common(call)
    N, C, *ins = xref.shape
    Cw, Mg = w.shape[:2]
    M = Mg * group
    outs = list(call.out_shape[2:])
    if Cw != C or C % group:
        raise TemplateError(f"ConvTranspose: channels {C} (weight {Cw}) do not divide into {group} groups")
    Cg = C // group
    if tuple(call.out_shape[:2]) != (N, M):
        raise TemplateError(f"ConvTranspose: output shape {call.out_shape} does not match N={N}, M={M}")
    outpad = _ints(call, "output_padding", r, 0)
    auto = call.attr("auto_pad", "NOTSET")
    oshape = call.attr("output_shape")
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise TemplateError(f"ConvTranspose: unsupported auto_pad {auto!r}")
    if oshape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if oshape is not None:
            oshape = [int(v) for v in oshape][-r:]
            if oshape != outs:
                raise TemplateError(f"ConvTranspose: output_shape {oshape} does not match the output {outs}")
        pb = []
        for i, o, k, s, d, a in zip(ins, outs, ks, strides, dils, outpad, strict=True):
            total = max(0, s * (i - 1) + a + (k - 1) * d + 1 - o)
            # onnxruntime: SAME_LOWER puts the odd extra pad at the head (begin), others at the tail
            pb.append(total - total // 2 if auto == "SAME_LOWER" else total // 2)
    elif auto == "VALID":
        pb = [0] * r
    else:
        pads = _ints(call, "pads", 2 * r, 0)
        pb = pads[:r]
        for i, o, k, s, d, a, e, q in zip(ins, outs, ks, strides, dils, outpad, pads[:r], pads[r:], strict=True):
            if s * (i - 1) + a + (k - 1) * d + 1 - e - q != o:
                raise TemplateError(f"ConvTranspose: output shape {call.out_shape} inconsistent with the attributes")
    wconv = None
    if w.const is not None and call.pack is not None:
        wconv = (np.asarray(w.const, dtype=np.float32).reshape(group, Cg, Mg, -1)
                 .transpose(0, 2, 1, 3).reshape(M, Cg, -1))
    elif w.ref is None:
        raise TemplateError("ConvTranspose: weight W must be a buffer")

    def wexpr(g: str, m: str, c: str, kk: list[str]) -> str:
        return w.ref.at([lin((g, Cg), (c, 1)), m, *kk])

    outer = [_convt_taps(o, i, s, d, p, k) for o, i, s, d, p, k in
             zip(outs[:-1], ins[:-1], strides[:-1], dils[:-1], pb[:-1], ks[:-1], strict=True)]
    phases = _convt_phases(outs[-1], strides[-1], dils[-1], pb[-1], ks[-1])
    return _direct(call, xref, wconv, wexpr, bref, group, Cg, Mg, ks, outer, phases, lambda sp: sp)
