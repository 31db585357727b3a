"""Conv and ConvTranspose templates (ONNX semantics, 1-D/2-D/3-D, float32): thin adapters of the loop IR.

What goes in: a ``TemplateCall`` for a Conv or ConvTranspose node: X (a buffer), W (usually a constant),
optional bias B. What comes out: C printed from a loop-IR ``Func`` (``call.emit``) that computes every output
element once and hands it, bias added, to ``store``.

The kernel is chosen here, the loop nests built in ``dlcc.schedule``:
- depthwise 2-D convolutions: the plane micro-kernel (``schedule.dwconv``);
- group-1 2-D convolutions with a weight: the blocked direct kernel (``schedule.direct``: ``direct_pays``),
  the im2col GEMM with pixels as rows (``conv_gemm_pays``) or, for 1x1 stride-1 ones with long rows, the
  packed GEMM with pixels as columns (``schedule.gemm``);
- every other Conv (grouped, 1-D, 3-D, a weight computed at run time, the cases above the workspace or the
  input's layout keeps from their kernels) and ConvTranspose: the row kernel (``schedule.convrows``), pixels in
  the vector lanes, the input staged in the workspace when the schedule stage declared room for it (else read
  along rows), a constant weight packed at compile time, a run-time one read through its strides. A 1x1,
  stride-1, unpadded Conv takes all its pixels as one row.

Sums run in a different order than onnxruntime: tests compare with rtol 1e-4 (DESIGN: conv/matmul).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from dlcc.codegen.cbase import Operand, TemplateError, TensorRef, split_channel
from dlcc.codegen.element_c import ref_buf
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.templates.matmul import _verify_packed_once
from dlcc.lower.kir import blocked_strides
from dlcc.lower.lir import Buf, Cast, Const, For, Func, Layout, Store, Var, verify_func
from dlcc.lower.micro import post_tag
from dlcc.schedule.convrows import RowsPlan, conv_rows_plan, pack_rows, rows_func, weight_layout
from dlcc.schedule.direct import (
    DirectPlan,
    direct_func,
    direct_pays,
    flat_pointwise,
    pack_direct,
    plan_direct,
    reads_in_place,
    reads_nchw,
    reads_no_ring,
    trim_taps,
)
from dlcc.schedule.dwconv import DwcPlan, dw_func, dwc_func, pack_dwc, plan_dwc
from dlcc.schedule.gemm import (
    POINTWISE_ROWS_MAX_OW,
    ConvGeometry,
    GemmPlan,
    b_in_place,
    conv_gemm_pays,
    gemm_func,
    gemm_func_conv,
    gemm_func_wconst,
    pack_a,
    pack_b,
    plan_gemm,
    plan_gemm_conv,
    plan_gemm_wconst,
)
from dlcc.schedule.pads import attr_ints, conv_pads, convt_pads
from dlcc.schedule.pwdw import PwDwPlan, pack_bias, pack_pw, plan_pwdw, pwdw_func
from dlcc.schedule.winograd import WinoPlan, pack_winograd, plan_winograd, use_winograd, wino_func


def _ints(call: TemplateCall, name: str, n: int, default: int) -> list[int]:
    return attr_ints(call.attr, call.node.op_type, name, n, default)


def spatial_pads(call: TemplateCall, ins: Sequence[int], outs: Sequence[int], ks: Sequence[int],
                 strides: Sequence[int], dils: Sequence[int]) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) of a Conv/pool node from ``pads``/``auto_pad`` and the output shape."""
    return conv_pads(call.attr, call.node.op_type, ins, outs, ks, strides, dils)


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
    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    if call.producer is not None:
        return _pointwise_depthwise(call)
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
    # the kernels that repack their input (nchwc_) read it with unit column stride or channels-last
    # (or hold it in the channel blocks the repacking would have made: ``schedule.blocked``)
    repacks = xref.strides[-1] == 1 or xref.pixel_major or xref.block > 0
    if not call.scratch.contiguous and not call.scratch.pixel_major and not call.scratch.block:
        raise TemplateError("Conv: internal: a strided destination that is not channels-last")
    g = ConvGeometry(C, ins[0], ins[1], outs[0], outs[1], ks[0], ks[1], strides[0], strides[1], dils[0], dils[1],
                     pb[0], pb[1]) if r == 2 else None
    # the direct kernel reading its input in place needs no workspace (``schedule.direct.reads_in_place``)
    in_place = (r == 2 and group == 1 and repacks and call.input_scale is None and direct_pays(g, M, call.target)
                and (reads_in_place(trim_taps(g)[0], xref.strides, call.target.lanes)  # (as the workspace has it:
                     or reads_nchw(trim_taps(g)[0], xref.strides, call.target.lanes)))  # the taps that reach it)
    has_ws = call.workspace is not None or in_place or xref.block > 0
    w4 = np.asarray(w.const, dtype=np.float32) if w.const is not None else None
    if (r == 2 and group == C == M and C > 1 and w4 is not None and call.pack is not None and repacks):
        dw = _depthwise(call, xref, w4.reshape(C, -1), bref, g)
        if dw is not None:
            return dw
    direct_ok = (r == 2 and group == 1 and w.const is not None and has_ws and repacks
                 and direct_pays(g, M, call.target))
    winograd_ok = (r == 2 and group == 1 and w.const is not None and call.workspace is not None and repacks
                   and call.input_scale is None and trim_taps(g)[0] == g
                   and use_winograd(g, M, N, call.target, call.threads))
    if xref.block:  # an input in the channel blocks its Winograd or direct kernel reads (``schedule.blocked``)
        if xref.ring_fill and (g is None or not reads_no_ring(g)):  # (a 1x1 reads none of it)
            raise TemplateError("Conv: internal: an input in channel blocks whose ring is not zeros")
        blocked = _winograd(call, xref, w4, bref, g) if winograd_ok else None
        if blocked is None and direct_ok:
            blocked = _blocked_direct(call, xref, w4, bref, g)
        if blocked is None:
            raise TemplateError("Conv: internal: an input in channel blocks that this convolution cannot read")
        return blocked
    if not call.scratch.contiguous or call.input_scale is not None:
        # the kernels the schedule stage chose: a channels-last destination (``schedule.layouts``; the depthwise
        # kernel above, the Winograd or the direct one, or a 1x1 as the pixels-by-channels GEMM) or a per-channel
        # scale folded into the input (``schedule.chscale``)
        blocked = _winograd(call, xref, w4, bref, g) if winograd_ok else None
        if blocked is None and direct_ok:
            blocked = _blocked_direct(call, xref, w4, bref, g)
        if (blocked is None and call.scratch.channels_last and call.input_scale is None
                and r == 2 and group == 1 and w4 is not None and call.workspace is not None
                and tuple(ks) == (1, 1) and not any(pb) and not any(pe)):
            blocked = _gemm_channels_last(call, xref, w4.reshape(M, C), bref, g)
        if blocked is not None:
            return blocked
        raise TemplateError("Conv: internal: a channels-last destination or a scaled input this convolution "
                            "cannot take")
    # (a direct kernel reading its input in place takes no workspace, and no form below it is asked)
    gemm_form = group == 1 and w.const is not None and call.scratch.contiguous
    gemm_ok = gemm_form and has_ws
    if gemm_ok and r == 2:  # pixels as rows: where the direct kernel or short rows waste most
        if winograd_ok:
            wino = _winograd(call, xref, w4, bref, g)
            if wino is not None:
                return wino
        if direct_ok:
            blocked = _blocked_direct(call, xref, w4, bref, g)
            if blocked is not None:
                return blocked
        if conv_gemm_pays(g, M) and (not pointwise or g.ow <= POINTWISE_ROWS_MAX_OW):
            packed = _im2col_packed(call, xref, w4.reshape(M, -1), bref, g)
            if packed is not None:
                return packed
    if pointwise and gemm_form and _flat_ok(xref, 2):  # pixels as columns (B read in place: no workspace needed)
        packed = _pointwise_packed(call, xref, w4.reshape(M, C), bref, outs)
        if packed is not None:
            return packed
    return _rows(call, xref, w, bref, pointwise and r > 1 and _flat_ok(xref, 2))


def _rows(call: TemplateCall, xref: TensorRef, w: Operand, bref: TensorRef | None, flat: bool = False) -> str:
    """A Conv or ConvTranspose as the row kernel of the loop IR (``schedule.convrows``): the input staged in
    the workspace when it has room, a constant weight packed at compile time, a run-time one read through its
    strides; bias in the epilogue. ``flat``: a 1x1 Conv over a flat input takes its pixels as one row."""
    op, r = call.node.op_type, len(xref.shape) - 2
    N, C, *ins = xref.shape
    outs = list(call.out_shape[2:])
    plan = conv_rows_plan(op, call.attr, xref.shape, w.shape, call.out_shape, call.target, call.threads, flat)
    ws = call.workspace
    if plan.staged and (ws is None or plan.workspace_floats > ws.size):
        plan = conv_rows_plan(op, call.attr, xref.shape, w.shape, call.out_shape, call.target, call.threads, flat,
                              stage=False)
    xs = xref.strides
    if flat:
        x = Buf(xref.ptr, "float32", Layout.strided((N, C, 1, 1, math.prod(ins)), (xs[0], xs[1], 0, 0, 1),
                                                    xref.offset))
    else:
        x = Buf(xref.ptr, "float32", Layout.strided((N, C, *[1] * (3 - r), *ins), (xs[0], xs[1], *[0] * (3 - r),
                                                                                   *xs[2:]), xref.offset))
    if w.const is not None and call.pack is not None:
        wc = np.asarray(w.const, dtype=np.float32)  # in gather form (group, Mg, Cg, KD, KH, KW):
        wg = (wc.reshape(plan.groups, plan.cg, plan.mg, *plan.ks).transpose(0, 2, 1, 3, 4, 5)
              if op == "ConvTranspose" else wc.reshape(plan.groups, plan.mg, plan.cg, *plan.ks))
        wpk = call.packed(pack_rows(wg, plan))
        wb = Buf(wpk.ptr, "float32", Layout.strided(plan.weight_shape))
    elif w.ref is not None:
        st = w.ref.strides  # (flat: a 1x1 kernel, the strides of its unit dims do not matter)
        st = (st[0], st[1], 0, 0, st[-1]) if flat else (st[0], st[1], *[0] * (3 - r), *st[2:])
        wb = Buf(w.ref.ptr, "float32", weight_layout(st, op == "ConvTranspose", plan, w.ref.offset))
    else:
        raise TemplateError(f"{op}: weight W must be a buffer")
    wsb = Buf(call.names("ws"), "float32", Layout.strided(plan.stage_shape), "workspace") if plan.staged else None
    f = rows_func(plan, x, wb, wsb, name="conv_transpose" if op == "ConvTranspose" else "conv_rows",
                  fresh=call.names)
    _verify_rows_once(plan, x.layout, wb.layout)

    def store(idx, v):
        n, m, *sp = idx
        if flat:
            return _pixel_store(call, bref, outs, [n, m, sp[-1]], v)
        return call.store([n, m, *sp[3 - r:]], f"{v} + {bref.at([m])}" if bref is not None else v)

    return call.emit(f, store, {wsb.name: ws.base()} if wsb is not None else None)


@functools.lru_cache(maxsize=256)
def _verify_rows_once(plan: RowsPlan, x: Layout, w: Layout) -> None:
    ws = Buf("ws", "float32", Layout.strided(plan.stage_shape), "workspace") if plan.staged else None
    verify_func(rows_func(plan, Buf("x", "float32", x), Buf("w", "float32", w), ws))


def _pointwise_packed(call: TemplateCall, xref: TensorRef, w2: np.ndarray, bref: TensorRef | None,
                      outs: list[int]) -> str | None:
    """A 1x1 stride-1 convolution as the packed GEMM of the loop IR (``schedule.gemm``, "b" plan): per
    image, Y (Co x pixels) = W (Co x Ci, packed at compile time) @ X (Ci x pixels, packed per block into
    the workspace); bias in the epilogue."""
    N, C = xref.shape[:2]
    M, P = w2.shape[0], math.prod(outs)
    ws, c = call.workspace, call.scratch
    plan = plan_gemm_wconst(M, P, C, N, call.target, call.threads)
    xs = (xref.strides[0], xref.strides[1], 1)
    x = Buf(xref.ptr, "float32", Layout.strided((N, C, P), xs, xref.offset))
    in_place = b_in_place(plan, xs[1])  # (B read from x: no workspace)
    if not in_place and (ws is None or plan.workspace_bytes > 4 * ws.size):
        return None
    names = call.names
    apk = call.packed(pack_a(w2, plan.mr))
    ap = Buf(apk.ptr, "float32", Layout.strided((M * C,)))
    cb = Buf(c.ptr, "float32", Layout.strided((N, M, P), (M * P, P, 1), c.offset))
    wsb = None if in_place else Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    trivial = call.direct and bref is None
    f = gemm_func_wconst(plan, ap, x, cb, wsb, not trivial, fresh=names)
    _verify_wconst_once(plan, xs, not trivial, 0 if in_place else ws.size)

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return call.emit(f, store, {wsb.name: ws.base()} if wsb is not None else None)


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
    bpk = call.packed(pack_b(np.ascontiguousarray(w2.T), plan.nr, plan.kc))
    wp = Buf(bpk.ptr, "float32", Layout.strided(bpk.shape))
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    cb = Buf(c.ptr, "float32", Layout.strided((N, M, P), (M * P, P, 1), c.offset))
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    trivial = call.direct and bref is None
    f = gemm_func_conv(plan, g, x, wp, cb, wsb, not trivial, fresh=names, target_l2=call.target.l2_bytes)
    _verify_conv_once(plan, g, xref.shape, xref.strides, not trivial, ws.size, call.target.l2_bytes)
    outs = [g.oh, g.ow]

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return call.emit(f, store, {wsb.name: ws.base()})


def _gemm_channels_last(call: TemplateCall, xref: TensorRef, w2: np.ndarray, bref: TensorRef | None,
                        g: ConvGeometry) -> str | None:
    """A 1x1 group-1 unpadded convolution into a channels-last output
    (``schedule.workspace.gemm_channels_last_form``) as a GEMM with output pixels as rows and output channels as
    columns, the weight packed at compile time: stride 1 over a channels-last input (its images one after the
    other), the packed GEMM of a MatMul over the pixels (``gemm_func``: A, the input, read in place or packed
    per row micro-panel); else the pixels gathered at the stride per row micro-panel (``gemm_func_conv``,
    pixel-major; from NCHW by runs along the rows, ``im2col_``: packing an NCHW A as the MatMul does read each
    64-byte line of it three times, once per row micro-panel: DeepLab's 1280 -> 256 at 28 x 28 6.2 -> 8.4 ms).
    Bias in the epilogue, stored along the channels."""
    N, C = xref.shape[:2]
    M, P = w2.shape[0], g.oh * g.ow
    ws, c, names = call.workspace, call.scratch, call.names
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    trivial = call.direct and bref is None
    l2 = call.target.l2_bytes
    outs = [g.oh, g.ow]
    rowmajor = ((g.sh, g.sw) == (1, 1) and c.strides[0] == P * M and xref.channels_last and C > 1
                and (N == 1 or xref.strides[0] == P * C))
    plan = plan_gemm(N * P, M, C, call.target, call.threads) if rowmajor else \
        plan_gemm_conv(M, g, N, call.target, call.threads, channels_last=True)
    if plan.workspace_bytes > 4 * ws.size:
        return None
    packed = call.packed(pack_b(np.ascontiguousarray(w2.T), plan.nr, plan.kc))
    wp = Buf(packed.ptr, "float32", Layout.strided(packed.shape))
    if rowmajor:
        a = Buf(xref.ptr, "float32", Layout.strided((N * P, C), (C, 1), xref.offset))
        cb = Buf(c.ptr, "float32", Layout.strided((N * P, M), (M, 1), c.offset))
        f = gemm_func(plan, a, wp, cb, wsb, not trivial, fresh=names, target_l2=l2)
        _verify_packed_once(plan, (C, 1), not trivial, ws.size, l2)

        def store(idx, v):
            row, col = idx
            n, px = ("0", row) if N == 1 else (f"({row}) / {P}", f"({row}) % {P}")
            return _pixel_store(call, bref, outs, [n, col, px], v)
    else:
        x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
        cb = Buf(c.ptr, "float32", Layout.strided((N, P, M), (c.strides[0], M, 1), c.offset))
        f = gemm_func_conv(plan, g, x, wp, cb, wsb, not trivial, fresh=names, target_l2=l2, channels_last=True)
        _verify_conv_once(plan, g, xref.shape, xref.strides, not trivial, ws.size, l2, True)

        def store(idx, v):
            n, px, col = idx
            return _pixel_store(call, bref, outs, [n, col, px], v)

    return call.emit(f, store, {wsb.name: ws.base()})


def _blocked_direct(call: TemplateCall, xref: TensorRef, w4: np.ndarray, bref: TensorRef | None,
                    g: ConvGeometry) -> str | None:
    """A 2-D group-1 convolution as the direct convolution of the loop IR over a channel-blocked copy of the
    input (``schedule.direct``): the weight packed at compile time for the register tile; bias in the
    epilogue."""
    g, (y0, y1), (x0, x1) = trim_taps(g)  # taps no output reaches inside the input: dropped
    w4 = w4[:, :, y0:y1, x0:x1]
    outs = (g.oh, g.ow)
    flat = flat_pointwise(g, w4.shape[0], call.target, call.threads)
    n, c, h, w = xref.shape
    step = xref.strides[3] if w > 1 else xref.strides[2]  # (from pixel to pixel along the plane, if it is one row)
    if flat is not g and step > 0 and xref.strides[2] == w * step:  # (rows contiguous: one row, or one per thread)
        g = flat
        xref = dataclasses.replace(xref, shape=(n, c, g.h, g.w), strides=(*xref.strides[:2], g.w * step, step))
    plan = plan_direct(w4.shape[0], g, xref.shape[0], call.target, call.threads,
                       xref.strides if call.input_scale is None and not xref.block else None)
    if xref.block and call.input_scale is None:  # (the blocks' planes: at least the plan's extent, which may skip
        # the input's last rows; a scaled input is repacked from its blocks, scaled on the way)
        top, bottom, left, right = xref.ring or (0, 0, 0, 0)
        hr, wr = top + xref.shape[2] + bottom, left + xref.shape[3] + right  # (its plane as one row: 1 x H*W)
        if (top, left) != (plan.rh, plan.rw) and reads_no_ring(g) and not plan.flat:
            # (a 1x1 reads no tap in the ring: it reads the pixels inside a wider one, which other readers need)
            plan = dataclasses.replace(plan, ring=(top, left))
        plan = dataclasses.replace(plan, blocked=True, hp=max(plan.hp, hr) if top == plan.rh else plan.hp,
                                   wp=max(plan.wp, wr) if left == plan.rw else plan.wp)
    return _planned_conv(call, xref, bref, g, plan, lambda: pack_direct(w4, plan), direct_func, outs)


def _winograd(call: TemplateCall, xref: TensorRef, w4: np.ndarray, bref: TensorRef | None,
              g: ConvGeometry) -> str | None:
    """A 3x3 stride-1 convolution as Winograd F(4x4, 3x3) (``schedule.winograd``): the weight transformed and
    packed at compile time; bias in the epilogue."""
    plan = plan_winograd(w4.shape[0], g, xref.shape[0], call.target, call.threads)
    if xref.block:
        plan = dataclasses.replace(plan, blocked=True)
    return _planned_conv(call, xref, bref, g, plan, lambda: pack_winograd(w4, plan), wino_func)


def _planned_conv(call: TemplateCall, xref: TensorRef, bref: TensorRef | None, g: ConvGeometry,
                  plan: DirectPlan | WinoPlan, pack: Callable[[], np.ndarray],
                  func: Callable[..., Func], outs: tuple[int, int] | None = None) -> str | None:
    """The loop IR ``func(plan, x, packed weight, c, ws)`` of a convolution whose plan needs workspace (the
    direct or the Winograd form), or None when the declared workspace is smaller than the plan's; the weight
    packed at compile time (``pack``, only when it runs); each output pixel through the fused epilogue."""
    ws, c, sc = call.workspace, call.scratch, call.input_scale
    need = plan.workspace_floats + (sc.batch * sc.channels if sc is not None else 0)
    if need > (ws.size if ws is not None else 0):
        return None
    names = call.names
    wpk = call.packed(pack())
    wp = Buf(wpk.ptr, "float32", Layout.strided(wpk.shape))
    if plan.blocked:
        x = Buf(xref.ptr, "float32", Layout.strided((_blocked_base(xref, plan),)))
    elif xref.block:  # (repacked from its blocks: a block's channels contiguous, ``repack_phase``)
        if xref.block != plan.cbi:
            raise TemplateError(f"Conv: internal: an input in channel blocks of {xref.block} repacked into {plan.cbi}")
        x = ref_buf(xref, xref.ptr)
    else:
        x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    cl = not c.contiguous  # a channels-last destination (the caller checked): the direct kernel's pixel-major form
    cb = Buf(c.ptr, "float32", Layout.strided((xref.shape[0], plan.co, g.oh * g.ow), None if not cl else (
        c.strides[0], 1, plan.co), c.offset))
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size if ws is not None else 1,)), "workspace")
    kw: dict = {"channels_last": True} if cl else {}
    if call.epilogue_block:  # (a destination or a residual in channel blocks: ``schedule.blocked``)
        kw["dest_block"] = call.epilogue_block
    ptrs, pre = ({wsb.name: ws.base()} if ws is not None else {}), ""
    if sc is not None:  # the factors first, after the repacking's floats; the repacking multiplies by them
        scb = Buf(names("sc"), "float32", Layout.strided((sc.batch, sc.channels)))
        ptrs[scb.name] = f"({ws.base()} + {plan.workspace_floats})"
        n, ch = Var(names("n")), Var(names("c"))
        lets, gate = sc.gate(n, ch)
        put = Store(scb, (n, ch), gate if gate.dtype == "float32" else Cast(gate, "float32"))
        fill = Func("scale", (scb, *sc.bufs), (For(n, Const(0), Const(sc.batch), (
            For(ch, Const(0), Const(sc.channels), (*lets, put)),)),))
        verify_func(fill)
        pre = call.emit(fill, None, {**sc.ptrs, **ptrs}) + "\n"
        kw["scale"] = scb
    f = func(plan, x, wp, cb, wsb, fresh=names, **kw)
    _verify_planned_once(func, plan, xref.shape, xref.strides, tuple(wpk.shape), ws.size if ws is not None else 1, cl,
                         sc is not None, call.epilogue_block)
    outs = list(outs or (g.oh, g.ow))  # (the output's rows and columns: ``g``'s, or those of its plane as one row)

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return pre + call.emit(f, store, ptrs)


@functools.lru_cache(maxsize=256)
def _verify_planned_once(func: Callable[..., Func], plan: DirectPlan | WinoPlan, shape: tuple[int, ...],
                         strides: tuple[int, ...], packed: tuple[int, ...], ws_floats: int,
                         channels_last: bool = False, scaled: bool = False, dest_block: int = 0) -> None:
    """verify_func on ``func``'s loop IR of ``plan`` (the same for every convolution with these shapes)."""
    x = Buf("x", "float32", Layout.strided(shape, strides)) if not plan.blocked else \
        Buf("x", "float32", Layout.strided((plan.blocks_floats,)))
    wp = Buf("w", "float32", Layout.strided(packed))
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.co, plan.g.oh * plan.g.ow)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    kw: dict = {"channels_last": True} if channels_last else {}
    if dest_block:
        kw["dest_block"] = dest_block
    if scaled:
        kw["scale"] = Buf("sc", "float32", Layout.strided(shape[:2]))
    verify_func(func(plan, x, wp, c, ws, **kw))


@functools.lru_cache(maxsize=256)
def _verify_conv_once(plan: GemmPlan, g: ConvGeometry, shape: tuple[int, ...], strides: tuple[int, ...],
                      epilogue: bool, ws_floats: int, target_l2: int | None = None,
                      channels_last: bool = False) -> None:
    """verify_func on the loop IR of ``plan`` (the same for every convolution with this geometry)."""
    x = Buf("x", "float32", Layout.strided(shape, strides))
    wp = Buf("w", "float32", Layout.strided((plan.col_panels * plan.k * plan.nr,)))  # (K block by K block)
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.m, plan.n) if channels_last else
                                           (plan.batch, plan.n, plan.m)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    verify_func(gemm_func_conv(plan, g, x, wp, c, ws, epilogue, target_l2=target_l2, channels_last=channels_last))


def _pointwise_depthwise(call: TemplateCall) -> str:
    """A 1x1 Conv (``call.producer``) and the depthwise Conv that reads its result, as one loop IR
    (``schedule.pwdw``): both weights packed at compile time; the 1x1 Conv's bias and chain applied to each row it
    computes in the workspace, the depthwise Conv's bias and epilogue to each output."""
    prod = call.producer
    px, pw_ = prod.inputs[0], prod.inputs[1] if len(prod.inputs) > 1 else None
    w = call.inputs[1] if len(call.inputs) > 1 else None
    if px is None or px.ref is None or pw_ is None or pw_.const is None or w is None or w.const is None:
        raise TemplateError("Conv: a fused 1x1 -> depthwise pair needs its input as a buffer and constant weights")
    xref = px.ref
    if xref.strides[-1] != 1 or len(xref.shape) != 4:
        raise TemplateError("Conv: a fused 1x1 -> depthwise pair reads a 4-D input with unit column stride")
    bref = _buffer(call, call.inputs[2], "B") if len(call.inputs) > 2 and call.inputs[2] is not None else None
    N, K, H, W = xref.shape
    C = int(w.shape[0])
    ks, outs = [int(d) for d in w.shape[2:]], [int(d) for d in call.out_shape[2:]]
    strides, dils = _ints(call, "strides", 2, 1), _ints(call, "dilations", 2, 1)
    pb, _ = spatial_pads(call, [H, W], outs, ks, strides, dils)
    g = ConvGeometry(C, H, W, outs[0], outs[1], ks[0], ks[1], strides[0], strides[1], dils[0], dils[1], pb[0], pb[1])
    plan = plan_pwdw(g, K, N, call.target, call.threads, xref.strides[2] == W)
    ws, c = call.workspace, call.scratch
    if plan is None or ws is None or plan.workspace_floats > ws.size:
        raise TemplateError("Conv: internal: the fused 1x1 -> depthwise pair has no plan or workspace")
    cl = not c.contiguous  # (the layout pass's choice: channels-last)
    names = call.names
    wpp = call.packed(pack_pw(np.asarray(pw_.const, dtype=np.float32).reshape(C, K), plan))
    wdp = call.packed(pack_dwc(np.asarray(w.const, dtype=np.float32).reshape(C, -1), plan))
    x = Buf(xref.ptr, "float32", _pwdw_input(plan, xref.shape, xref.strides, xref.offset))
    wpb = Buf(wpp.ptr, "float32", Layout.strided(wpp.shape))
    wdb = Buf(wdp.ptr, "float32", Layout.strided(wdp.shape))
    cb = _pixels_dest(c, N, C, g.oh * g.ow)
    wsb = Buf(names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
    epilogue = not (call.direct and bref is None) or cl
    # the 1x1 convolution's bias and ReLU or Clip in registers before its tiles' stores (no pass over its rows)
    tag = post_tag(*prod.post) if prod.post is not None and not plan.flat else None
    post = None
    if tag is not None:
        bp = call.packed(pack_bias(np.asarray(prod.inputs[2].const, dtype=np.float32), plan))
        post = (Buf(bp.ptr, "float32", Layout.strided(bp.shape)), tag)
    blocks = dest_in_blocks(c, plan.cbi, "the fused 1x1 -> depthwise pair")
    f = pwdw_func(plan, x, wpb, wdb, cb, wsb, not prod.identity and tag is None, epilogue, fresh=names, post=post,
                  channels_last=cl, dest_block=blocks)
    _verify_pwdw_once(plan, xref.shape, xref.strides, not prod.identity and tag is None, epilogue, ws.size, tag, cl,
                      blocks)

    def store(idx, v):
        return _pixel_store(call, bref, outs, idx, v)

    return call.emit(f, store, {wsb.name: ws.base()})


def _blocked_base(xref: TensorRef, plan: DirectPlan | WinoPlan) -> int:
    """The floats of the base of input ``xref``, held in the channel blocks ``plan`` reads (``schedule.blocked``): as
    the repacking would have stored them, blocks outside images, each block's plane ``hp`` x ``wp`` with the zero
    ring, the input at row ``rh`` and column ``rw`` of it; raises TemplateError where it is not so."""
    expect = blocked_strides(plan.hp, plan.wp, plan.batch, plan.cbi)
    if xref.block != plan.cbi or xref.strides != expect or xref.offset != (plan.rh * plan.wp + plan.rw) * plan.cbi:
        raise TemplateError(f"Conv: internal: an input in channel blocks of {xref.block} (strides {xref.strides}, "
                            f"at {xref.offset}) that the plan does not read")
    return plan.blocks_floats


def dest_in_blocks(c: TensorRef, cbi: int | None, what: str) -> bool:
    """Is destination ``c`` in channel blocks (``schedule.blocked``)? Raises TemplateError where they are not the
    ``cbi`` channels of the channel-blocked kernel's tiles (None: no such plan), which ``what`` then cannot store."""
    if c.block and cbi != c.block:
        raise TemplateError(f"internal: a destination in channel blocks of {c.block} that {what} does not store")
    return bool(c.block)


def _pixels_dest(c: TensorRef, n: int, ch: int, pixels: int) -> Buf:
    """The destination ``c`` as (N, C, pixels): contiguous, or channels-last where the layout pass stored it so."""
    return Buf(c.ptr, "float32", Layout.strided((n, ch, pixels), None if c.contiguous else (c.strides[0], 1, ch),
                                                c.offset))


def _pwdw_input(plan: PwDwPlan, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> Layout:
    """The layout the fused loop IR reads its input through: (N, K, H, W), or (N, K, H*W) for a flat plan."""
    if plan.flat:
        return Layout.strided((shape[0], shape[1], shape[2] * shape[3]), (strides[0], strides[1], 1), offset)
    return Layout.strided(shape, strides, offset)


@functools.lru_cache(maxsize=256)
def _verify_pwdw_once(plan: PwDwPlan, shape: tuple[int, ...], strides: tuple[int, ...], producer_epilogue: bool,
                      epilogue: bool, ws_floats: int, tag: str | None = None, channels_last: bool = False,
                      dest_block: bool = False) -> None:
    """verify_func on the fused loop IR of ``plan`` (the same for every pair with these shapes)."""
    x = Buf("x", "float32", _pwdw_input(plan, shape, strides))
    wpb = Buf("wpw", "float32", Layout.strided((plan.ncb * plan.k * plan.cbi,)))
    wdb = Buf("wdw", "float32", Layout.strided((plan.ncb, plan.g.kh * plan.g.kw * plan.cbi)))
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.g.ci, plan.g.oh * plan.g.ow)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace")
    post = (Buf("bias", "float32", Layout.strided((plan.ncb * plan.cbi,))), tag) if tag is not None else None
    verify_func(pwdw_func(plan, x, wpb, wdb, c, ws, producer_epilogue, epilogue, post=post,
                          channels_last=channels_last, dest_block=dest_block))


def _depthwise(call: TemplateCall, xref: TensorRef, w2: np.ndarray, bref: TensorRef | None,
               g: ConvGeometry) -> str | None:
    """A depthwise convolution (one channel per group) in the loop IR (``schedule.dwconv``): channel-blocked
    where the target's vectors hold several channels and the workspace has room, else per channel the plane
    micro-kernel; then bias and the fused epilogue (vectorized). None where neither reads the input's layout
    (the plane kernel needs unit column stride) or writes the destination's (a channels-last destination:
    only the channel-blocked form, per pixel along its channels)."""
    N, c = xref.shape[0], call.scratch
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    cl = not c.contiguous  # (the caller checked: channels-last)
    cb = _pixels_dest(c, N, g.ci, g.oh * g.ow)
    trivial = call.direct and bref is None
    # (a ring, or channel blocks: read in place)
    plan = plan_dwc(g, N, call.target, call.threads, xref.strides, xref.ring, xref.block)
    if xref.block and (plan is None or not plan.blocked or xref.ring_fill):
        raise TemplateError(f"Conv: internal: an input in channel blocks (strides {xref.strides}, ring {xref.ring}) "
                            "that the depthwise kernel does not read in place")
    ws = call.workspace
    repacked = plan is not None and plan.ring is None  # (else read in place: no workspace)
    if plan is not None and (not repacked or (ws is not None and plan.workspace_floats <= ws.size)):
        wpk = call.packed(pack_dwc(w2, plan))
        wp = Buf(wpk.ptr, "float32", Layout.strided(wpk.shape))
        wsb = Buf(call.names("ws"), "float32", Layout.strided((ws.size,)), "workspace") if repacked else None
        blocks = dest_in_blocks(c, plan.cbi, "the depthwise kernel")
        f = dwc_func(plan, x, wp, cb, wsb, not trivial or cl, fresh=call.names, channels_last=cl, dest_block=blocks)
        _verify_dwc_once(plan, xref.shape, xref.strides, not trivial or cl, ws.size if repacked else 0,
                         channels_last=cl, offset=xref.offset, dest_block=blocks)
        extra = {wsb.name: ws.base()} if repacked else {}
    elif cl or xref.strides[-1] != 1:
        dest_in_blocks(c, None, "the depthwise kernel with no workspace")
        return None
    else:
        wpk = call.packed(w2)
        wt = Buf(wpk.ptr, "float32", Layout.strided(wpk.shape))
        f = dw_func(g, N, x, wt, cb, not trivial, call.threads, fresh=call.names, flat=True)
        _verify_dw_once(g, N, xref.shape, xref.strides, not trivial, call.threads)
        extra = {}

    def store(idx, v):
        return _pixel_store(call, bref, [g.oh, g.ow], idx, v)

    return call.emit(f, store, extra)


@functools.lru_cache(maxsize=256)
def _verify_dwc_once(plan: DwcPlan, shape: tuple[int, ...], strides: tuple[int, ...], epilogue: bool,
                     ws_floats: int, pool_max: bool = False, channels_last: bool = False, offset: int = 0,
                     dest_block: bool = False) -> None:
    """verify_func on the channel-blocked depthwise loop IR of ``plan`` (a convolution's, or a pool's; ``offset``:
    the input's, in a buffer with a zero ring read in place)."""
    x = Buf("x", "float32", Layout.strided(shape, strides, offset))
    wp = Buf("w", "float32", Layout.strided((plan.ncb, plan.g.kh * plan.g.kw * plan.cbi)))
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.g.ci, plan.g.oh * plan.g.ow)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace") if ws_floats else None
    verify_func(dwc_func(plan, x, wp, c, ws, epilogue, pool_max=pool_max, channels_last=channels_last,
                         dest_block=dest_block))


@functools.lru_cache(maxsize=256)
def _verify_dw_once(g: ConvGeometry, batch: int, shape: tuple[int, ...], strides: tuple[int, ...], epilogue: bool,
                    threads: int) -> None:
    x = Buf("x", "float32", Layout.strided(shape, strides))
    wt = Buf("w", "float32", Layout.strided((g.ci, g.kh * g.kw)))
    c = Buf("c", "float32", Layout.strided((batch, g.ci, g.oh * g.ow)))
    verify_func(dw_func(g, batch, x, wt, c, epilogue, threads, flat=True))


def _pixel_store(call: TemplateCall, bref: TensorRef | None, outs: list[int], idx, v: str) -> str:
    """The epilogue of element (image, channel, flat pixel) of a GEMM-form convolution: bias, then ``store``
    at the pixel's (h, w), ``(p) / W`` and ``(p) % W``: the epilogue's addresses are the flat index again
    (``lir.Layout.address``), which C compilers would not see (and then not vectorize the epilogue)."""
    if len(idx) == 4:  # (image, channel block, channel in it, pixel): an epilogue per block of channels
        n, kb, ci, p = idx
        co = split_channel(kb, ci, call.epilogue_block)
        head = [n, kb, ci] if call.scratch.block else [n, co]
    else:
        n, co, p = idx
        head = [n, co]
    val = f"{v} + {bref.at([co])}" if bref is not None else v
    name = p if re.fullmatch(r"\w+", p) else call.names("px")
    text = call.store([*head, *_unflat(name, outs)], val)  # (addressed flat again: ``lir.Layout.address``)
    return text if name == p else f"{{ const int64_t {name} = {p}; {text} }}"


@functools.lru_cache(maxsize=256)
def _verify_wconst_once(plan: GemmPlan, x_strides: tuple[int, int, int], epilogue: bool, ws_floats: int) -> None:
    """verify_func on the loop IR of ``plan`` (the same for every convolution with this plan and strides)."""
    ap = Buf("a", "float32", Layout.strided((plan.m * plan.k,)))
    span = (plan.batch - 1) * x_strides[0] + (plan.k - 1) * x_strides[1] + plan.n
    x = Buf("x", "float32", Layout.strided((plan.batch, plan.k, plan.n), x_strides))
    if x.layout.span > span:
        raise TemplateError("internal: the input's channels overlap")
    c = Buf("c", "float32", Layout.strided((plan.batch, plan.m, plan.n)))
    ws = Buf("ws", "float32", Layout.strided((ws_floats,)), "workspace") if ws_floats else None
    verify_func(gemm_func_wconst(plan, ap, x, c, ws, epilogue))


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
    if tuple(call.out_shape[:2]) != (N, M):
        raise TemplateError(f"ConvTranspose: output shape {call.out_shape} does not match N={N}, M={M}")
    convt_pads(call.attr, ins, outs, ks, strides, dils)  # (checks the attributes against the shapes)
    return _rows(call, xref, w, bref)
