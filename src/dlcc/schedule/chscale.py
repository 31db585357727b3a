"""Per-channel scales folded into the convolution that reads them (squeeze-and-excitation).

What goes in: a kernel-IR ``Program`` after layout assignment (before workspace and memory planning), the
``Target`` and the thread count. What comes out: the same program where each kernel that only multiplies a rank-4
buffer X (N, C, H, W) by a factor G of one value per image and channel (a squeeze-and-excitation block's gate,
``X * Sigmoid(s)`` with s of shape (N, C, 1, 1)) is merged into the kernel of the Conv that alone reads the product
Y, when that Conv runs as the blocked direct kernel (``schedule.direct``). The Conv's step gets ``input_scale``
(the Mul) and its nodes first; its C computes G once per image and channel into its workspace, after the
repacking's floats, and the repacking multiplies each channel by it as it copies X (``nchwc_..._s``): Y has no
buffer, and the pass that read and wrote all of X is gone. ``fold_channel_scales`` returns the merges.

Why: the direct kernel copies its input into channel blocks anyway, so the product costs one vector multiply
per vector copied there, against a pass over the tensor on its own (EfficientNet-B0 has 16 such kernels, MobileNetV3
nine; each read and wrote its tensor at about 50 GB/s).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from dlcc.lower.kir import Program
from dlcc.schedule.pwdw import _dims
from dlcc.schedule.target import Target
from dlcc.schedule.workspace import blocked_conv_form

__all__ = ["MAX_SCALES", "fold_channel_scales", "scale_operands"]

MAX_SCALES = 1 << 16
"""At most this many (image, channel) factors per folded Conv (they sit in its workspace)."""


def scale_operands(p: Program, mul: ir.Node) -> tuple[ir.Value, ir.Value, tuple[int, ...]] | None:
    """(X, G, G's shape padded to rank 4) of a Mul of a float32 rank-4 buffer X by a factor G of one value per
    image (or one for all) and channel; None for any other node."""
    if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.inputs) != 2:
        return None
    y = _dims(mul.outputs[0])
    if y is None or len(y) != 4:
        return None
    for x, g in (mul.inputs, mul.inputs[::-1]):
        xd, gd = _dims(x), _dims(g)
        if x is None or g is None or x is g or x not in p.value_buffer or xd != y or gd is None or len(gd) > 4:
            continue
        if p.buffers[p.value_buffer[x]].dtype != "float32":
            continue
        g4 = (1,) * (4 - len(gd)) + tuple(gd)
        if g4[0] in (1, y[0]) and g4[1] == y[1] and g4[2:] == (1, 1):
            return x, g, g4
    return None


def fold_channel_scales(p: Program, target: Target, threads: int) -> int:
    """Merge each per-channel scaling kernel into the direct Conv that alone reads its result (module docstring);
    returns the merges."""
    if target.lanes < 4:  # (the blocked direct kernel needs vectors)
        return 0
    readers: dict[int, list[int]] = {}
    for i, k in enumerate(p.kernels):
        for bid in k.reads:
            readers.setdefault(bid, []).append(i)
    viewed = {b.base for b in p.buffers.values() if b.kind == "view"}
    drop: set[int] = set()
    for i, k1 in enumerate(p.kernels):
        if len(k1.steps) != 1 or k1.steps[0].kind != "loop" or len(k1.steps[0].outputs) != 1:
            continue
        yv = k1.steps[0].outputs[0]
        mul = yv.producer()
        y = p.value_buffer.get(yv)
        if mul is None or y is None or y in viewed or y in p.outputs or k1.writes != [y]:
            continue
        if scale_operands(p, mul) is None or math.prod(_dims(yv)[:2]) > MAX_SCALES:
            continue  # (scale_operands: yv has rank 4)
        rd = readers.get(y, [])
        if len(rd) != 1 or rd[0] <= i:
            continue
        k2 = p.kernels[rd[0]]
        if len(k2.steps) != 1:
            continue
        s2 = k2.steps[0]
        conv = s2.anchor
        if (s2.kind != "template" or conv is None or s2.producer is not None or s2.scratch is not None
                or s2.input_scale is not None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx")
                or len(conv.inputs) < 2 or conv.inputs[0] is not yv):
            continue
        if any(yv in n.inputs for n in k2.nodes if n is not conv):
            continue
        form = blocked_conv_form(conv, p.is_constant, target, threads)
        if form is None or form[0] != "direct":
            continue
        s2.input_scale = mul
        p.merge_into(k1, k2, yv)
        drop.add(i)
    p.remove_kernels(drop)
    return len(drop)
