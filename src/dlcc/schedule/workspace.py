"""The schedule stage of the backend: per kernel, the choices that must be known before memory planning.

What goes in: a kernel-IR ``Program``, the ``Target`` and the thread count. What comes out: the same
program where each template step that needs scratch owns a ``temp`` buffer of that size (``Step.workspace``:
a packed GEMM's panels (MatMul/Gemm with a weight B, group-1 2-D convolutions with a weight), the blocked
direct convolution's channel-blocked input, the channel-blocked depthwise convolution's repacked block per
thread (``schedule.dwconv``), a fused 1x1 -> depthwise pair's band of blocks per thread (``schedule.pwdw``), the
row kernel's staged input (every other Conv, and ConvTranspose:
``schedule.convrows``), dlcc::Attention's per-thread K, V and probability
rows (``schedule.attention``)), written by its kernel; the memory planner then
places it in the arena with everything else, and codegen hands it to the template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import onnx_ir as ir

from dlcc.errors import TemplateError
from dlcc.lower.kir import Buffer, Program
from dlcc.ops.attention import attention_attrs, attention_dims
from dlcc.schedule.attention import attention_plan
from dlcc.schedule.convrows import conv_rows_plan
from dlcc.schedule.direct import (
    DirectPlan,
    direct_pays,
    flat_pointwise,
    plan_direct,
    reads_in_place,
    reads_nchw,
    trim_taps,
)
from dlcc.schedule.dwconv import POOL_BLOCKED_MAX_W, plan_dwc
from dlcc.schedule.gemm import (
    POINTWISE_ROWS_MAX_OW,
    ConvGeometry,
    b_in_place,
    conv_gemm_pays,
    gemm_batched_dims,
    gemm_dims,
    plan_gemm,
    plan_gemm_batched,
    plan_gemm_conv,
    plan_gemm_wconst,
)
from dlcc.schedule.pads import conv_pads, node_attr
from dlcc.schedule.pwdw import fused_plan, window_geometry
from dlcc.schedule.target import Target
from dlcc.schedule.winograd import WinoPlan, plan_winograd, use_winograd

__all__ = ["blocked_conv_form", "declare_workspace", "gemm_channels_last_form", "node_workspace_bytes", "reader_plan"]


def _shape(v: ir.Value) -> tuple[int, ...]:
    return tuple(int(d) for d in v.shape) if v.shape is not None else ()


def _pointwise_conv_dims(node: ir.Node, is_const: Callable[[ir.Value], bool]) -> tuple[int, int, int, int] | None:
    """(Co, pixels, Ci, images) of a 1x1, stride-1, unpadded, ungrouped Conv with a weight W."""
    x, w = node.inputs[0], node.inputs[1]
    if x is None or w is None or x.shape is None or w.shape is None or not is_const(w):
        return None
    xs, ws = _shape(x), _shape(w)
    attrs = {k: v.value for k, v in node.attributes.items()}
    r = len(xs) - 2
    if r < 1 or len(ws) != len(xs) or any(d != 1 for d in ws[2:]) or int(attrs.get("group", 1)) != 1:
        return None
    if any(int(s) != 1 for s in attrs.get("strides", [1] * r)) or any(int(p) for p in attrs.get("pads", [0] * 2 * r)):
        return None
    pixels = 1
    for d in xs[2:]:
        pixels *= d
    return ws[0], pixels, xs[1], xs[0]


def _conv2d(node: ir.Node, is_const: Callable[[ir.Value], bool]) -> tuple[ConvGeometry, int, int] | None:
    """(geometry without padding, output channels, images) of a 2-D group-1 Conv with a weight, else None."""
    x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if x is None or w is None or x.shape is None or w.shape is None or y.shape is None or not is_const(w):
        return None
    xs, ws, ys = _shape(x), _shape(w), _shape(y)
    if len(xs) != 4 or len(ws) != 4 or len(ys) != 4 or min(*xs, *ws, *ys) < 1:
        return None
    attrs = {k: v.value for k, v in node.attributes.items()}
    if int(attrs.get("group", 1)) != 1:
        return None
    sh, sw = (int(v) for v in attrs.get("strides", [1, 1]))
    dh, dw = (int(v) for v in attrs.get("dilations", [1, 1]))
    return ConvGeometry(xs[1], xs[2], xs[3], ys[2], ys[3], ws[2], ws[3], sh, sw, dh, dw, 0, 0), ws[0], xs[0]


def blocked_conv_form(node: ir.Node, is_const: Callable[[ir.Value], bool], target: Target,
                      threads: int) -> tuple[str, ConvGeometry] | None:
    """("winograd" | "direct", the geometry its plan takes) of a 2-D group-1 convolution with a weight that the
    conv template runs as the Winograd or the blocked direct kernel (both repack their input), else None."""
    conv = _conv2d(node, is_const)
    if conv is None or not direct_pays(conv[0], conv[1], target):
        return None
    g, co, batch = conv
    try:
        pb, _ = conv_pads(node_attr(node), "Conv", (g.h, g.w), (g.oh, g.ow), (g.kh, g.kw), [g.sh, g.sw],
                          [g.dh, g.dw])
    except TemplateError:
        return None
    g, _, _ = trim_taps(dataclasses.replace(g, ph=pb[0], pw=pb[1]))  # (as the template does)
    if use_winograd(g, co, batch, target, threads):
        return "winograd", g
    return "direct", flat_pointwise(g, co, target, threads)


def gemm_channels_last_form(node: ir.Node, is_const: Callable[[ir.Value], bool], target: Target,
                            threads: int) -> ConvGeometry | None:
    """The geometry of a 1x1 group-1 convolution with a weight, unpadded, strided or with rows of at most
    POINTWISE_ROWS_MAX_OW pixels (where its NCHW form takes pixels as rows too), that neither the Winograd nor
    the blocked direct kernel takes, else None. With its output channels-last it is a GEMM with no
    transposed store: output pixels as rows (gathered at the stride per row micro-panel, or read in place from
    a channels-last input), output channels as columns (the weight packed at compile time), C stored
    pixel-major (``codegen.templates.conv``). The layout pass stores its output so where it runs from a
    channels-last input, whose other forms would gather it (``schedule.layouts``)."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    conv = _conv2d(node, is_const)
    if conv is None or (conv[0].kh, conv[0].kw) != (1, 1) or blocked_conv_form(node, is_const, target,
                                                                               threads) is not None:
        return None
    g = conv[0]
    try:
        pb, pe = conv_pads(node_attr(node), "Conv", (g.h, g.w), (g.oh, g.ow), (1, 1), [g.sh, g.sw], [g.dh, g.dw])
    except TemplateError:
        return None
    if any(pb) or any(pe) or (g.h - 1) // g.sh + 1 != g.oh or (g.w - 1) // g.sw + 1 != g.ow:
        return None
    if (g.sh, g.sw) == (1, 1) and g.ow > POINTWISE_ROWS_MAX_OW:
        return None  # (long rows: pixels as columns stay faster, DeepLab's 1280 -> 256 at 28 x 28 7.4 -> 10.2 ms)
    return g


def gemm_channels_last_bytes(g: ConvGeometry, co: int, batch: int, target: Target, threads: int) -> int:
    """The workspace of that GEMM: the pixels gathered per row micro-panel (``plan_gemm_conv``), or at stride 1
    the images' pixels as one matrix's rows (``plan_gemm``), which the template takes where the input's layout
    allows (room for either)."""
    gathered = plan_gemm_conv(co, g, batch, target, threads, channels_last=True).workspace_bytes
    if (g.sh, g.sw) == (1, 1):
        return max(gathered, plan_gemm(batch * g.oh * g.ow, co, g.ci, target, threads).workspace_bytes)
    return gathered


def _conv_gemm_bytes(node: ir.Node, is_const: Callable[[ir.Value], bool], target: Target, threads: int) -> int:
    """A 2-D group-1 convolution with a weight: the blocked direct kernel's repacked input
    (``schedule.direct``) or its im2col GEMM's panels (``schedule.gemm.plan_gemm_conv``)."""
    conv = _conv2d(node, is_const)
    if conv is None:
        return 0
    g, co, batch = conv
    if direct_pays(g, co, target):
        form = blocked_conv_form(node, is_const, target, threads)
        if form is None:
            return 0
        if form[0] == "winograd":  # (which the template then takes)
            return plan_winograd(co, form[1], batch, target, threads).workspace_bytes
        return plan_direct(co, form[1], batch, target, threads).workspace_bytes
    if not conv_gemm_pays(g, co):
        return 0
    if g.kh * g.kw == 1 and (g.sh, g.sw) == (1, 1) and g.ow > POINTWISE_ROWS_MAX_OW:
        return 0  # (a 1x1 stride-1 convolution with long rows takes pixels as columns)
    return plan_gemm_conv(co, g, batch, target, threads).workspace_bytes


def _rows_bytes(node: ir.Node, target: Target, threads: int) -> int:
    """The row kernel's staged input (``schedule.convrows``; a 1x1 Conv's pixels as one row)."""
    shapes = [v.shape for v in (node.inputs[0], node.inputs[1], node.outputs[0])]
    if any(s is None for s in shapes):
        return 0
    xs, ws, ys = (tuple(int(d) for d in s) for s in shapes)
    if len(xs) < 3 or len(ws) != len(xs) or len(ys) != len(xs) or min(*xs, *ws, *ys) < 1:
        return 0
    try:
        return conv_rows_plan(node.op_type, node_attr(node), xs, ws, ys, target, threads, flat=True).workspace_bytes
    except (TemplateError, ValueError, ZeroDivisionError):  # (the template reports what it does not handle)
        return 0


def _blocked_depthwise_bytes(node: ir.Node, kernel: tuple[int, int] | None, target: Target, threads: int,
                             strides: tuple[int, ...] | None = None, ring: tuple[int, ...] = ()) -> int:
    """A depthwise convolution (``kernel``: its weight's kh, kw) or a 2-D pool (``kernel`` None: its kernel_shape;
    only on planes up to POOL_BLOCKED_MAX_W wide): the channel-blocked form's repacked block per thread
    (``schedule.dwconv``), 0 where the plane kernel runs instead or a convolution reads its input in place (its
    ``strides`` and zero ``ring``: ``dwconv.reads_ring``)."""
    geo = window_geometry(node, kernel)
    if geo is None or (kernel is None and geo[0].w > POOL_BLOCKED_MAX_W):
        return 0
    plan = plan_dwc(geo[0], geo[1], target, threads, strides if kernel is not None else None, ring)
    return 4 * plan.workspace_floats if plan is not None else 0


def _attention_bytes(node: ir.Node, target: Target, threads: int) -> int:
    """dlcc::Attention: K transposed, V and a few rows of probabilities per thread (``schedule.attention``)."""
    if len(node.inputs) < 3 or any(v is None or v.shape is None for v in node.inputs[:3]):
        return 0
    try:
        b, h, sq, sk, d = attention_dims(*(_shape(v) for v in node.inputs[:3]), *attention_attrs(node_attr(node)))
    except ValueError:
        return 0
    return attention_plan(b, h, sq, sk, d, target, threads).workspace_bytes


def _direct_in_place(node: ir.Node, is_const: Callable[[ir.Value], bool], target: Target, threads: int,
                     strides: tuple[int, ...] | None) -> bool:
    """Does this Conv run as the direct kernel reading its input (``strides``) in place (no workspace)?"""
    if strides is None:
        return False
    form = blocked_conv_form(node, is_const, target, threads)
    return form is not None and form[0] == "direct" and (reads_in_place(form[1], strides, target.lanes)
                                                         or reads_nchw(form[1], strides, target.lanes))


def _depthwise_node(node: ir.Node, is_const: Callable[[ir.Value], bool]) -> bool:
    """Is this Conv a depthwise one (one channel per group) with a weight, of known rank-4 shapes?"""
    x, w = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if x is None or w is None or x.shape is None or w.shape is None or len(x.shape) != 4:
        return False
    group = int(node_attr(node)("group", 1))
    return group == _shape(x)[1] == _shape(w)[0] and group > 1 and is_const(w)


def reader_plan(node: ir.Node, form: tuple[str, ConvGeometry], target: Target, threads: int) -> DirectPlan | WinoPlan:
    """The plan of the Winograd or direct kernel (``form``: ``blocked_conv_form``'s) of a 2-D convolution with a
    weight whose input is stored in the channel blocks it reads (``schedule.blocked``): the plan of the repacking
    kernel, reading them in place."""
    co, batch = _shape(node.inputs[1])[0], _shape(node.inputs[0])[0]
    if form[0] == "winograd":
        return dataclasses.replace(plan_winograd(co, form[1], batch, target, threads), blocked=True)
    return dataclasses.replace(plan_direct(co, form[1], batch, target, threads), blocked=True)


def node_workspace_bytes(node: ir.Node, is_const: Callable[[ir.Value], bool], target: Target, threads: int,
                         strides: tuple[int, ...] | None = None, channels_last: bool = False,
                         ring: tuple[int, ...] = (), blocked: bool = False) -> int:
    """Scratch bytes the template of ``node`` asks for (``is_const``: is this input a weight? ``strides``: its
    first input's, where known: a direct convolution reading it in place asks for none, nor does a depthwise one
    reading it within its zero ``ring``; ``channels_last``: its output is stored so, ``schedule.layouts``;
    ``blocked``: its input is stored in the channel blocks its Winograd or direct kernel reads, ``schedule.blocked``,
    which then repacks nothing)."""
    if blocked and (node.op_type != "Conv" or _depthwise_node(node, is_const)):
        return 0  # (a depthwise convolution or a pool reads the blocks where they are)
    if blocked:
        form = blocked_conv_form(node, is_const, target, threads)
        if form is None:
            raise TemplateError(f"{node.op_type}: internal: an input in channel blocks that no blocked kernel reads")
        return reader_plan(node, form, target, threads).workspace_bytes
    if node.op_type == "Attention" and node.domain == "dlcc":
        return _attention_bytes(node, target, threads)
    if node.op_type in ("MaxPool", "AveragePool") and node.inputs and node.inputs[0] is not None:
        return _blocked_depthwise_bytes(node, None, target, threads)
    if node.op_type == "ConvTranspose" and len(node.inputs) >= 2 and node.inputs[1] is not None:
        return _rows_bytes(node, target, threads)
    if node.op_type == "Conv" and len(node.inputs) >= 2 and node.inputs[1] is not None:
        x, w = node.inputs[0], node.inputs[1]
        if _depthwise_node(node, is_const):
            ws = _shape(w)  # depthwise: channel-blocked, or the plane kernel (no workspace)
            return _blocked_depthwise_bytes(node, (ws[2], ws[3]), target, threads, strides, ring) if len(ws) == 4 \
                else 0
        if _direct_in_place(node, is_const, target, threads, strides):
            return 0
        gcl = gemm_channels_last_form(node, is_const, target, threads) if channels_last else None
        if gcl is not None:
            return gemm_channels_last_bytes(gcl, _shape(w)[0], _shape(x)[0], target, threads)
        dims = _pointwise_conv_dims(node, is_const)
        rows = _conv_gemm_bytes(node, is_const, target, threads)  # the pixels-as-rows form, if it pays
        if dims is not None:  # a 1x1 stride-1 one may take either form: room for both
            m, n, k, batch = dims
            cols = 0
            if min(dims) >= 1:
                plan = plan_gemm_wconst(m, n, k, batch, target, threads)
                flat = strides is not None and len(strides) == 4 and strides[3] == 1 and strides[2] == _shape(x)[3]
                cols = 0 if flat and b_in_place(plan, strides[1]) else plan.workspace_bytes
            return max(cols, rows)
        return rows or _rows_bytes(node, target, threads)
    if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2 or node.inputs[1] is None:
        return 0
    a, b = node.inputs[0], node.inputs[1]
    if a.shape is None or b.shape is None:
        return 0
    attrs = {k: v.value for k, v in node.attributes.items()}
    if node.op_type == "MatMul" and not is_const(b):  # both operands computed at run time (attention)
        bd = gemm_batched_dims(_shape(a), _shape(b))
        return plan_gemm_batched(*bd, target, threads).workspace_bytes if bd else 0
    dims = gemm_dims(node.op_type, _shape(a), _shape(b), is_const(b), attrs)
    return plan_gemm(*dims, target, threads).workspace_bytes if dims else 0


def declare_workspace(p: Program, target: Target, threads: int) -> None:
    for k in p.kernels:
        for step in k.steps:
            if step.kind != "template" or step.anchor is None or step.workspace is not None:
                continue
            fused = fused_plan(p, step, target, threads)
            x = step.anchor.inputs[0] if step.anchor.inputs else None
            strides = p.window(p.value_buffer[x])[2] if x in p.value_buffer and step.input_scale is None else None
            ring = p.buffers[p.value_buffer[x]].ring if strides is not None else ()
            blocked = strides is not None and p.buffers[p.value_buffer[x]].block > 0
            nbytes = 4 * fused.workspace_floats if fused is not None else \
                node_workspace_bytes(step.anchor, p.is_constant, target, threads, strides, step.channels_last, ring,
                                     blocked)
            if nbytes and step.input_scale is not None:  # the folded per-channel scale (``chscale``), after the
                n, c = (int(d) for d in step.input_scale.outputs[0].shape[:2])  # repacking: one per image, channel
                nbytes += 4 * n * c
            if nbytes:
                bid = max(p.buffers) + 1
                p.buffers[bid] = Buffer(bid, "temp", "float32", (nbytes // 4,), "workspace")
                step.workspace = bid
                k.writes.append(bid)
