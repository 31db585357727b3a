"""Channel-blocked buffers of the schedule stage: NCHW[c]c tensors with a zero ring, which the convolution reading
them takes as they are instead of repacking them.

What goes in: a kernel-IR ``Program`` after layout assignment, the channel-scale fold and the depthwise rings
(``schedule.rings``), before workspace and memory planning; the ``Target`` and the thread count. What comes out:
the same program where some channels-last buffers are views that store their channels in blocks of the target's
vector width (``kir.Buffer.block``) inside a larger buffer that also holds a zero ring around each block's plane
(``kir.Buffer.ring``). ``block_buffers`` returns how many.

The Winograd and the blocked direct convolutions (``schedule.winograd``, ``schedule.direct``) repack their input on
every call into channel blocks of one vector: per block, its plane with a zero ring as wide as the padding (and
for Winograd as far as whole tiles reach), blocks outside images (``direct.repack_phase``). Where the one kernel
writing that input can store it so itself, the copy goes: the writer's epilogue stores each pixel's block of
channels as one vector where the repacking would have put it, the writer's kernel zeroes the ring before its step
(``rings.ring_func``: each block's plane is a channels-last plane of one vector of channels), and the reader's plan
reads the blocks where they are (``DirectPlan.blocked``, ``WinoPlan.blocked``: no repacking phase, and the
workspace without the repacked input). In ResNet-50 that is the input of every 3x3 convolution but the first
(written by a 1x1 GEMM in NCHW): its bottleneck's middle tensor, 64 to 512 channels.

A buffer is stored so where all of these hold:
- it is a channels-last float32 temp (``schedule.layouts``), not a graph output, that nothing views, whose
  channels are a whole number of vectors;
- one kernel step writes it: a convolution's blocked direct kernel (whose channel tiles are whole vectors) or
  its Winograd kernel (whose output transform runs per block of one vector), storing channels-last;
- one step reads it, as the input (and only the input) of a convolution with a kernel larger than 1x1 that runs
  as the Winograd or the blocked direct kernel, with no fused producer and no folded input scale, whose plan keeps
  all of the input's rows and columns (a ring of at least zero on every side).
The ring and the planes' extent are the reader's plan's (``workspace.reader_plan``), which the conv template
checks again when it prints the reader.
"""

from __future__ import annotations

from dlcc.lower.kir import Buffer, Program, Step
from dlcc.schedule.layouts import _Layouts, is_channels_last
from dlcc.schedule.target import Target
from dlcc.schedule.workspace import blocked_conv_form, reader_plan

__all__ = ["BLOCKED", "block_buffers"]

BLOCKED = True  # switch: convolutions read an input that their input's writer stored in their channel blocks


class _Blocked(_Layouts):
    def writer(self, bid: int) -> Step | None:
        """The one step writing buffer ``bid``, if it is a convolution that can store it in channel blocks."""
        ks = self.writers(bid)
        steps = [s for k in ks for s in k.steps if s.outputs and self.p.value_buffer.get(s.outputs[0]) == bid]
        if len(ks) != 1 or len(steps) != 1:
            return None
        w = steps[0]
        if (w.kind != "template" or w.anchor is None or w.producer is not None or w.scratch is not None
                or not w.channels_last or self.conv_form(w.anchor) is None):
            return None
        return w

    def reader(self, bid: int) -> tuple[Step, tuple[int, int, int, int]] | None:
        """The one step reading buffer ``bid`` and the ring its plan reads, if it is a convolution whose Winograd or
        direct kernel reads it as its repacked input (module docstring)."""
        steps = self.reading_steps([bid])
        if len(steps) != 1:
            return None
        r = steps[0]
        x = r.anchor.inputs[0] if r.kind == "template" and r.anchor is not None else None
        if (x is None or self.p.value_buffer.get(x) != bid or r.producer is not None or r.input_scale is not None
                or any(v is x for v in r.anchor.inputs[1:])
                or any(x in n.inputs for n in r.nodes if n is not r.anchor)):
            return None
        form = blocked_conv_form(r.anchor, self.p.is_constant, self.target, self.threads) \
            if self.conv_form(r.anchor) is not None else None
        if form is None or form[1].kh * form[1].kw == 1:
            return None
        plan = reader_plan(r.anchor, form, self.target, self.threads)
        g = plan.g
        rh, rw = (plan.rh, plan.rw) if form[0] == "direct" else (g.ph, g.pw)
        ring = (rh, plan.hp - g.h - rh, rw, plan.wp - g.w - rw)
        if plan.cbi != self.target.lanes or min(ring) < 0:
            return None
        return r, ring

    def candidate(self, bid: int) -> tuple[tuple[int, int, int, int], int] | None:
        """The ring and the batch of buffer ``bid`` where it can be stored in channel blocks (module docstring)."""
        b = self.p.buffers[bid]
        lanes = self.target.lanes
        if (b.kind != "temp" or b.dtype != "float32" or not is_channels_last(b) or bid in self.p.outputs
                or b.shape[1] % lanes or any(o.kind == "view" and o.base == bid for o in self.p.buffers.values())):
            return None
        if self.writer(bid) is None:
            return None
        found = self.reader(bid)
        return (found[1], b.shape[0]) if found is not None else None

    def give(self, bid: int, ring: tuple[int, int, int, int]) -> None:
        """Buffer ``bid`` becomes a view in channel blocks of a new temp holding its blocks' planes with ``ring``."""
        b = self.p.buffers[bid]
        n, c, h, w = b.shape
        lanes = self.target.lanes
        top, bottom, left, right = ring
        hr, wr = h + top + bottom, w + left + right
        plane = hr * wr * lanes
        root = max(self.p.buffers) + 1
        self.p.buffers[root] = Buffer(root, "temp", b.dtype, (c // lanes, n, hr, wr, lanes), b.name)
        self.p.buffers[bid] = Buffer(bid, "view", b.dtype, b.shape, b.name, base=root,
                                     offset=(top * wr + left) * lanes, strides=(plane, n * plane, wr * lanes, lanes),
                                     ring=ring if any(ring) else (), block=lanes)
        for k in self.writers(bid):
            k.writes.append(root)  # (the ring: written by the kernel writing the view, before its step)

    def run(self) -> int:
        given = 0
        for bid in list(self.p.buffers):
            found = self.candidate(bid)
            if found is not None:
                self.give(bid, found[0])
                given += 1
        return given


def block_buffers(p: Program, target: Target, threads: int) -> int:
    """Store in channel blocks the buffers a convolution then reads as they are (module docstring); returns how
    many."""
    if not BLOCKED or target.lanes < 4:
        return 0
    return _Blocked(p, target, threads).run()
