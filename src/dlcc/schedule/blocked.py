"""Channel-blocked buffers of the schedule stage: NCHW[c]c tensors, with a zero ring where their reader pads, which
the convolutions reading them take as they are instead of repacking them.

What goes in: a kernel-IR ``Program`` after layout assignment, the channel-scale fold and the depthwise rings
(``schedule.rings``), before workspace and memory planning; the ``Target`` and the thread count. What comes out:
the same program where some channels-last or NCHW buffers are views that store their channels in blocks of the
target's vector width (``kir.Buffer.block``) inside a larger buffer that also holds a ring of zeros (or -inf)
around each block's plane (``kir.Buffer.ring``) where the readers need one. ``block_buffers`` returns how many.

The Winograd and the blocked direct convolutions (``schedule.winograd``, ``schedule.direct``) repack their input on
every call into channel blocks of one vector: per block, its plane with a zero ring as wide as the padding (and
for Winograd as far as whole tiles reach), blocks outside images (``direct.repack_phase``). Where the one kernel
writing that input can store it so itself, the copy goes: the writer's epilogue stores each pixel's block of
channels as one vector where the repacking would have put it, the writer's kernel zeroes the ring before its step
(``rings.ring_func``: each block's plane is a channels-last plane of one vector of channels), and the reader's plan
reads the blocks where they are (``DirectPlan.blocked``, ``WinoPlan.blocked``: no repacking phase, and the
workspace without the repacked input). A 1x1 convolution reads blocks with no ring: from blocks a pixel's channels
are 64 bytes apart where channels-last they were all the channels apart (ResNet-50's 1024 and 2048 channels put a
register tile's pixels in one L1 set, so it repacked them). A convolution's epilogue reading such a buffer (the
residual add of a bottleneck) runs per block of channels, the channel written as (block, channel in it)
(``cbase.split_channel``), so that the address needs no division. In ResNet-50 every buffer between two
convolutions from the second stage on is stored so but the last sum (which the average pool reads): 25 of its 31
repacking kernels gone.

A buffer is stored so where all of these hold:
- it is a channels-last (``schedule.layouts``) or NCHW float32 temp, not a graph output, that nothing views (but
  a Concat's slices, below), whose channels are a whole number of vectors;
- one kernel step writes it: a convolution's blocked direct kernel (whose channel tiles are whole vectors) or
  its Winograd kernel (whose output transform runs per block of one vector), which then stores it through its
  epilogue as a channels-last one does (``Step.channels_last``; one that stored NCHW transposed its tiles); or
  (``BLOCKED_WINDOW_WRITERS``) a depthwise convolution's or a 2-D pool's channel-blocked kernel (a pool's on a
  plane at most ``dwconv.POOL_BLOCKED_MAX_W`` wide, or reading blocks; a fused 1x1 -> depthwise pair's, whose
  depthwise tiles are the same, ``schedule.pwdw``), whose tiles then stay pixel-major and
  store each pixel's block of channels as one vector (``dwc_func``'s ``dest_block``; ``dwcp_``, ``dwcmaxp_``);
  or (``BLOCKED_CONCATS``) it is the result of a Concat along the channels that ``lower`` left as slices of it
  written in place, each slice a whole number of vectors written by one such step: each slice is then a view of
  the same blocks (its first block where its first channel's is), whose writer stores its blocks there (the
  scratch it copied from, a strided slice, goes), and the first of the writers fills the ring of all of them;
- every step reading it is a convolution that runs as the Winograd or the blocked direct kernel and reads it
  as its input only (no fused producer, no folded input scale), whose Winograd plan keeps all of the input's
  rows and columns (a ring of at least zero on every side; a direct plan that skips the last ones, a strided
  projection's, reads them in place all the same), all these with the same ring (an unpadded 1x1 direct kernel
  tiling the plane's rows reads within any ring, of zeros or -inf: ``BLOCKED_ANY_RING``; Inception's module inputs,
  which its pool branch's 3x3 max pool reads within a ring of -inf); or a convolution storing
  channels-last whose epilogue reads it (``BLOCKED_RESIDUALS``); or (``BLOCKED_WINDOWS``) a depthwise
  convolution or a 2-D average pool, whose channel-blocked kernel (``schedule.dwconv``) reads each block as the
  block it would have repacked (``dwconv.reads_ring``: the ring as wide as its padding), a 2-D max pool (any ring
  where none of its taps falls outside the plane; else a ring of -inf, ``kir.Buffer.ring_fill``, which its
  writer fills as it would zero one: then no other reader may need zeros there), or a global pool (one vector of
  running results per block, ``pool.global_pool_blocked_func``; any ring); or (``BLOCKED_LOOPS``) a loop step whose
  result is stored in blocks too; or (``BLOCKED_SCALED``) a direct convolution into which a squeeze-and-excitation's
  per-channel scale is folded (``schedule.chscale``), which repacks its input multiplied by the scale on the way:
  from blocks each pixel's block of channels is one vector (``direct.repack_phase``; any ring); at least one
  reading it as its input. In MobileNetV3-Small and EfficientNet-B0 the depthwise results that a squeeze-and-
  excitation scales are stored so (2-6% and 1-2% faster, Zen 4, 1 and 2 threads).
A loop step (``BLOCKED_LOOPS``: ops that run element by element, broadcasting included, or a
``dlcc::ChannelShuffle``) writes blocks where every operand of its images and pixels is in blocks (or has one
channel): it then runs over the blocks in their memory order, a block's channels innermost as one vector loop, the
channel a ``Lane`` of the block (``map_func``'s ``block``; a shuffle gathers its source channels). A loop step
reading a buffer is one of its block readers only where its result gets blocks as well (both decided together:
``candidate``'s ``assume``); it reads the planes only, so any ring. DenseNet-121's Relu steps between its
convolutions: 115 -> 61 repacking kernels, the arena 13.7 -> 12.1 MB.
The ring and the planes' extent are the input readers' plan's (``workspace.reader_plan``), which the conv and pool
templates check again when they print each reader. In ResNet-50 the stem's result is stored so (ring of -inf),
which the first max pool reads, where the stem stored NCHW (its tiles transposed: 2.31 -> 2.17 ms, the pool 0.158
-> 0.166 ms, Zen 4, 1 thread), and the last sum (its 7x7 average pool read it repacked); MobileNetV2's and
EfficientNet-B0's last convolutions' results, which a global pool reads; and where a convolution writes the input
of a depthwise one that no zero ring takes (more than ``rings.RING_MAX_CHANNELS`` channels, where a channels-last
ring spreads a tile over few L1 sets: blocks do not). With the Concats and the windows writing blocks, SqueezeNet
1.1's repacking kernels go from 14 to 9, Inception-v1's from 50 to 39, Inception-v2's from 46 to 39; with the 1x1s
reading within any ring, to 5, 11 and 5 (AVX-512).
"""

from __future__ import annotations

import math

import onnx_ir as ir

from dlcc.lower.kir import Buffer, Program, Step, blocked_strides
from dlcc.schedule.chscale import scale_operands
from dlcc.schedule.direct import reads_no_ring
from dlcc.schedule.dwconv import POOL_BLOCKED_MAX_W, padded_extent, pool_max_inside
from dlcc.schedule.layouts import _Layouts, is_channels_last
from dlcc.schedule.pwdw import depthwise_geometry, fused_plan, pool_geometry
from dlcc.schedule.target import Target
from dlcc.schedule.workspace import blocked_conv_form, reader_plan

__all__ = ["BLOCKED", "block_buffers"]

BLOCKED = True  # switch: convolutions read an input that their input's writer stored in their channel blocks
BLOCKED_RESIDUALS = True  # ... also where a convolution's epilogue reads it (a residual add), per block of channels
BLOCKED_WINDOWS = True  # ... also where depthwise convolutions and pools read it (in place: ``dwconv.reads_ring``)
BLOCKED_WINDOW_WRITERS = True  # depthwise convolutions and pools store their results in blocks too
BLOCKED_CONCATS = True  # ... also a Concat's result whose producers write their slices (each its own blocks)
BLOCKED_LOOPS = True  # loop steps (elementwise ops, channel shuffles) read and write blocks, in their memory order
BLOCKED_SCALED = True  # direct convolutions repack an input in blocks scaled per channel (an SE block's scale)
BLOCKED_ANY_RING = True  # unpadded 1x1 convolutions read blocks within any ring (Inception's pool branch's -inf)
WINDOWED = ("Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool")
Need = tuple[tuple[int, int, int, int], float]  # a reader's ring (above, below, left, right) and what it holds


class _Blocked(_Layouts):
    def __init__(self, p: Program, target: Target, threads: int):
        super().__init__(p, target, threads)
        self.sliced: dict[int, list[int]] = {}  # buffer -> the Concat slices ``candidate`` found it has

    def writer(self, bid: int, sliced: bool = False, assume: frozenset[int] = frozenset()) -> Step | None:
        """The one step writing buffer ``bid``, if it is a convolution that can store it in channel blocks (with a
        scratch where ``sliced``: a Concat's slice, which its step computed in a temp and copied, strided), or a
        loop step computing it element by element from buffers in blocks (or in ``assume``: to be)."""
        ks = self.writers(bid)
        steps = [s for k in ks for s in k.steps if s.outputs and self.p.value_buffer.get(s.outputs[0]) == bid]
        if len(ks) != 1 or len(steps) != 1:
            return None
        w = steps[0]
        if BLOCKED_LOOPS and not sliced and self.loop_writer(w, bid, assume):
            return w
        if w.kind != "template" or w.anchor is None or (w.scratch is not None and not sliced):
            return None
        if w.producer is not None:  # (a fused 1x1 -> depthwise pair: its depthwise tiles store as the kernel's do;
            # only for a squeeze-and-excitation, whose scaled projection repacks it: from blocks with no transpose.
            # MobileNetV2's projections read its channels-last result in place: in blocks 2% slower at 2 threads)
            scaled = any(r.input_scale is not None for r in self.reading_steps([bid]))
            return w if BLOCKED_WINDOW_WRITERS and scaled and self.window_writer(w) else None
        return w if self.conv_form(w.anchor) is not None or (BLOCKED_WINDOW_WRITERS and self.window_writer(w)) \
            else None

    def loop_writer(self, w: Step, bid: int, assume: frozenset[int]) -> bool:
        """Is ``w`` a loop step computing buffer ``bid`` (N, C, H, W) from ops that run element by element
        (broadcasting included) or shuffle its channels (``dlcc::ChannelShuffle``), whose every operand of the same
        images and pixels is in channel blocks (or in ``assume``), or has one channel? It then runs over the blocks
        in their memory order (``map_func``'s ``block``), a block's channels innermost, one vector."""
        if w.kind != "loop" or len(w.outputs) != 1 or self.p.value_buffer.get(w.outputs[0]) != bid:
            return False
        n, c, h, wd = self.p.buffers[bid].shape
        nodes = self._inlined(w.outputs[0])
        if not nodes or not all(_per_element(x) for x in nodes):
            return False
        for v in (v for x in nodes for v in x.inputs if v is not None and v in self.p.value_buffer):
            b = self.p.buffers[self.p.value_buffer[v]]
            if len(b.shape) == 4 and (b.shape[0], *b.shape[2:]) == (n, h, wd) and b.shape[1] != 1 and not (
                    b.block == self.target.lanes or self.p.value_buffer[v] in assume):
                return False
        return True

    def window_writer(self, w: Step) -> bool:
        """Does step ``w`` run a depthwise convolution or a 2-D pool as the channel-blocked kernel
        (``schedule.dwconv``), which stores pixel-major tiles through its epilogue, a pixel's block of channels as
        one vector (``dwc_func``'s ``dest_block``)? A pool on a plane at most ``POOL_BLOCKED_MAX_W`` wide (wider
        ones take the plane kernel, with no workspace), or reading its input in channel blocks already."""
        node = w.anchor
        if w.input_scale is not None or self.target.lanes < 4:
            return False
        if w.producer is not None:
            plan = fused_plan(self.p, w, self.target, self.threads)
            return plan is not None and plan.cbi == self.target.lanes and node.outputs[0].shape[1] % plan.cbi == 0
        geo = depthwise_geometry(self.p, node) if node.op_type == "Conv" else pool_geometry(node)
        if geo is None or int(node.outputs[0].shape[1]) % self.target.lanes:
            return False
        if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1] is not None \
                and node.outputs[1].uses():
            return False
        x = self.p.value_buffer.get(node.inputs[0])
        return (node.op_type == "Conv" or geo[0].w <= POOL_BLOCKED_MAX_W
                or (x is not None and bool(self.p.buffers[x].block)))

    def slices(self, bid: int) -> list[int] | None:
        """The views of buffer ``bid`` where a Concat along its channels left them (``lower``'s Concat in place:
        each input a slice of the result, which its producer writes), in channel order, where each slice holds a
        whole number of vectors of channels, one convolution that can store it in channel blocks writes it, and
        nothing else reads or views it; [] where nothing views ``bid``; None where that does not hold."""
        b = self.p.buffers[bid]
        views = sorted((o for o in self.p.buffers.values() if o.kind == "view" and o.base == bid),
                       key=lambda o: o.offset)
        if not views:
            return []
        based = {o.base for o in self.p.buffers.values() if o.kind == "view"}
        start = 0
        for v in views:
            if (v.shape[0] != b.shape[0] or v.shape[2:] != b.shape[2:] or v.strides != b.strides or v.block
                    or v.ring or v.offset != start * b.strides[1] or v.shape[1] % self.target.lanes
                    or v.id in based or v.id in self.p.outputs or self.reading_steps([v.id])
                    or self.writer(v.id, sliced=True) is None):
                return None
            start += v.shape[1]
        return [v.id for v in views] if start == b.shape[1] else None

    def input_ring(self, r: Step, shape: tuple[int, ...]) -> tuple[int, int, int, int] | bool | None:
        """The zero ring (above, below, left, right) around each block's plane that step ``r``'s convolution reads
        its input (of ``shape``) within, if its Winograd or blocked direct kernel would repack that input into
        blocks of one vector (the plan's extent holding every row and column of it), else None; True where any
        ring does, holding anything (``BLOCKED_ANY_RING``: an unpadded 1x1 direct kernel tiling the plane's rows,
        whose taps never reach the ring)."""
        form = blocked_conv_form(r.anchor, self.p.is_constant, self.target, self.threads) \
            if self.conv_form(r.anchor) is not None else None
        if form is None:
            return None
        plan = reader_plan(r.anchor, form, self.target, self.threads)
        if plan.cbi != self.target.lanes:
            return None
        g, (h, w) = plan.g, shape[2:]
        if BLOCKED_ANY_RING and form[0] == "direct" and reads_no_ring(g) and (g.h, g.w) == (h, w) and not plan.flat:
            return True
        if (g.h, g.w) != (h, w):  # (a 1x1 convolution's plane as one row: blocks with no ring)
            return (0, 0, 0, 0) if g.kh * g.kw == 1 and plan.hp * plan.wp == h * w else None
        ring = (plan.rh, plan.hp - h - plan.rh, plan.rw, plan.wp - w - plan.rw)
        if form[0] == "direct":  # (a plan that reads fewer rows or columns than the input's reads them in place all
            # the same: the conv template sets its extent to the blocks')
            return ring[0], max(0, ring[1]), ring[2], max(0, ring[3])
        return ring if min(ring) >= 0 else None

    def window_ring(self, r: Step, shape: tuple[int, ...]) -> Need | bool | None:
        """What step ``r``'s depthwise convolution or pool needs to read its input (of ``shape``) in channel blocks
        where they are (``dwconv.reads_ring``): the ring holding every tap outside the plane, of zeros, or of -inf
        for a max pool (its padding); True where any ring does (a max pool none of whose taps falls outside the
        plane, a global pool); None where its channel-blocked kernel would not read them."""
        node = r.anchor
        if node.op_type in ("MaxPool", "AveragePool") and r.channels_last and not self.p.buffers[
                self.p.value_buffer[r.outputs[0]]].block:
            return None  # (its channel-blocked kernel stores a plain or a blocked destination, not channels-last)
        if node.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
            return len(shape) == 4 or None
        geo = depthwise_geometry(self.p, node) if node.op_type == "Conv" else pool_geometry(node)
        if geo is None or self.target.lanes < 4:
            return None
        g = geo[0]
        hp, wp = padded_extent(g)
        ring = (g.ph, max(0, hp - g.ph - g.h), g.pw, max(0, wp - g.pw - g.w))
        if node.op_type == "MaxPool":
            if len(node.outputs) > 1 and node.outputs[1] is not None and node.outputs[1].uses():
                return None
            return True if pool_max_inside(g) else (ring, -math.inf)
        return ring, 0.0

    def readers_ring(self, bid: int, assume: frozenset[int] = frozenset()) -> Need | None:
        """The ring (and what it holds) buffer ``bid`` gets where every step reading it takes it in channel blocks:
        convolutions, depthwise convolutions and pools reading it as their input (module docstring), all within the
        same ring, and convolutions storing channels-last whose epilogue reads it (a residual add: then per block of
        channels), and loop steps whose result is stored in blocks too (``loop_writer``: ``assume`` the buffers
        given blocks on the way); None where another step reads it, or none reads it as its input."""
        vals = self.values_of([bid])
        need: Need | None = None
        read = False
        for r in self.reading_steps([bid]):
            if BLOCKED_LOOPS and r.kind == "loop" and len(r.outputs) == 1 and r.outputs[0] in self.p.value_buffer:
                y = self.p.value_buffer[r.outputs[0]]
                if self.p.buffers[y].block == self.target.lanes or (
                        y != bid and self.candidate(y, assume | {bid}) is not None):
                    read = True  # (it reads the blocks' planes only: any ring)
                    continue
                return None
            if r.kind != "template" or r.anchor is None or r.producer is not None:
                return None
            if r.input_scale is not None and r.input_scale.inputs and any(v in vals for v in r.input_scale.inputs):
                # (a squeeze-and-excitation scale folded into the convolution, which multiplies its input by it as it
                # repacks it: from blocks, each pixel's block of channels one vector, any ring)
                xs = scale_operands(self.p, r.input_scale)
                if not (BLOCKED_SCALED and xs is not None and xs[0] in vals and xs[1] not in vals
                        and self.conv_form(r.anchor) == "direct"
                        and not any(v in vals for n in r.nodes if n is not r.input_scale for v in n.inputs)):
                    return None
                read = True
                continue
            x = r.anchor.inputs[0]
            others = [v for n in r.nodes for v in n.inputs if v in vals and not (n is r.anchor and v is x)]
            if x in vals:
                if r.input_scale is not None or others:
                    return None
                shape = self.p.buffers[bid].shape
                mine = self.window_ring(r, shape) if BLOCKED_WINDOWS and r.anchor.op_type in WINDOWED else None
                if mine is None:
                    ring = self.input_ring(r, shape)
                    mine = ring if ring is None or ring is True else (ring, 0.0)
                if mine is None or (need is not None and mine is not True and mine != need):
                    return None
                read = True
                if mine is not True:
                    need = mine
            elif not (BLOCKED_RESIDUALS and r.channels_last and r.scratch is None
                      and self.conv_form(r.anchor) is not None
                      and int(r.anchor.outputs[0].shape[1]) % self.target.lanes == 0):
                return None
        return need if need is not None or not read else ((0, 0, 0, 0), 0.0)

    def candidate(self, bid: int, assume: frozenset[int] = frozenset()) -> Need | None:
        """The ring (and what it holds) buffer ``bid`` gets where it can be stored in channel blocks (module
        docstring; ``assume``: buffers to be stored so too), else None."""
        b = self.p.buffers[bid]
        lanes = self.target.lanes
        if (b.kind != "temp" or b.dtype != "float32" or len(b.shape) != 4 or b.shape[1] % lanes
                or not (is_channels_last(b) or b.contiguous) or bid in self.p.outputs):
            return None
        if b.block:
            return None
        sliced = self.slices(bid) if BLOCKED_CONCATS else []
        if sliced is None or (not sliced and self.writer(bid, assume=assume) is None):
            return None
        self.sliced[bid] = sliced  # (for ``give``)
        return self.readers_ring(bid, assume)

    def give(self, bid: int, need: Need) -> None:
        """Buffer ``bid`` becomes a view in channel blocks of a new temp holding its blocks' planes with the ring of
        ``need``; its writer stores it so (a convolution that stored NCHW now stores through its epilogue, as a
        channels-last one does)."""
        (top, bottom, left, right), fill = need
        ring = (top, bottom, left, right)
        b = self.p.buffers[bid]
        n, c, h, w = b.shape
        lanes = self.target.lanes
        hr, wr = h + top + bottom, w + left + right
        root = max(self.p.buffers) + 1
        self.p.buffers[root] = Buffer(root, "temp", b.dtype, (c // lanes, n, hr, wr, lanes), b.name)
        sliced = self.sliced[bid]  # (``candidate``'s)
        strides = blocked_strides(hr, wr, n, lanes)
        for v in (bid, *sliced):  # (a Concat's slices: their blocks one after the other, as its channels)
            o = self.p.buffers[v]
            first = 0 if v == bid else o.offset // b.strides[1] // lanes * strides[1]
            self.p.buffers[v] = Buffer(v, "view", b.dtype, o.shape, o.name, base=root,
                                       offset=(top * wr + left) * lanes + first, strides=strides,
                                       ring=ring if any(ring) else (), block=lanes,
                                       ring_fill=fill if any(ring) else 0.0)
        kernels = []
        for v in sliced or [bid]:
            w = self.writer(v, sliced=bool(sliced), assume=frozenset(self.p.buffers))
            w.channels_last = w.kind == "template"
            for k in self.writers(v):
                if w.scratch is not None and w in k.steps:  # (it stores into its blocks as they are)
                    k.writes.remove(w.scratch)
                    del self.p.buffers[w.scratch]
                    w.scratch = None
                kernels.append(k)
        # (the ring: written by the first kernel writing a view, before its step, for all of them)
        min(kernels, key=self.p.kernels.index).writes.append(root)

    def run(self) -> int:
        given, changed = 0, True
        while changed:  # (a loop step's input given blocks first, its result on a later pass where its id is lower)
            changed = False
            for bid in list(self.p.buffers):
                need = self.candidate(bid) if bid in self.p.buffers else None  # (a slice's scratch goes)
                if need is not None:
                    self.give(bid, need)
                    given += 1
                    changed = True
        return given


def _per_element(n: ir.Node) -> bool:
    """An op a loop step computes element by element (broadcasting included: ``layouts``' rule, but for its
    Transpose), or a channel shuffle."""
    if n.domain == "dlcc":
        return n.op_type == "ChannelShuffle"
    return n.op_type != "Transpose" and n.domain in ("", "ai.onnx") and _Layouts._elementwise(n)


def block_buffers(p: Program, target: Target, threads: int) -> int:
    """Store in channel blocks the buffers a convolution then reads as they are (module docstring); returns how
    many."""
    if not BLOCKED or target.lanes < 4:
        return 0
    return _Blocked(p, target, threads).run()
