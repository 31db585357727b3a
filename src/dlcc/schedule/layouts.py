"""Layout assignment of the schedule stage: channels-last buffers where that removes a layout change.

What goes in: a kernel-IR ``Program`` (after the 1x1 -> depthwise merge, before workspace and memory planning),
the ``Target`` and the thread count. What comes out: the same program where some rank-4 (N, C, H, W) buffers
are stored channels-last (NHWC memory: element strides (H*W*C, 1, W*C, C)) and the kernels that only changed a
layout are gone. ``assign_layouts`` returns how many kernels it removed.

A kernel that is one Transpose between NCHW and NHWC costs a pass over the tensor and a buffer; a model that
keeps its activations in NHWC around NCHW convolutions (ConvNeXt's blocks, graphs exported from channels-last
frameworks) has one beside every convolution. The kernels around it can often take the other layout instead:
- the depthwise convolution's channel-blocked kernel repacks its input per block (``nchwc_``) and stores its
  output through its epilogue: from a channels-last input each pixel's channels are one vector load, and into a
  channels-last output each pixel's channels are one vector store (the tile kept pixel-major, no transpose);
- the blocked direct and Winograd convolutions repack their input the same way, the direct one's tiles store
  pixel-major just as well (``dconvp_``), and Winograd's output transform keeps each pixel's channels together
  (``wgop_``), tile by tile;
- a 1x1 convolution that neither of those takes is a GEMM over pixels x channels: into a channels-last output
  its tiles store as they are (from an NCHW input the pixels are gathered per row micro-panel, from a
  channels-last one read along their rows); its NCHW forms would gather a channels-last input instead, so it
  reads one only into a channels-last output (``gemm_channels_last``);
- a loop step reads every operand through its strides and runs in its destination's memory order.

Rules, applied until none applies (each keeps every element's value; only where it is stored changes):
1. NCHW -> NHWC Transpose kernel whose input X only it reads, X written by a loop step, a depthwise
   convolution's channel-blocked kernel, a blocked direct convolution or a Winograd one: X becomes a
   channels-last view of the Transpose's output (a graph output too), whose writer stores into it; the
   Transpose kernel goes.
2. NHWC -> NCHW Transpose kernel whose output Y is read only by kernels that take channels-last (loop steps;
   convolutions whose kernel repacks their input, reading Y as that input): Y becomes a channels-last view of
   the Transpose's input; the Transpose kernel goes.
3. A loop step that transposes an NHWC buffer into its NCHW result Z (ConvNeXt's layer scale and residual add),
   Z read only by kernels that take channels-last: Z is stored channels-last, and the step then runs as an
   elementwise one over memory in order.
4. Then the convolution trunk: the largest set of buffers (with the views that are all of one) written by
   kernels that can store channels-last, whose every reader takes it (a Conv that repacks it as its input, or
   a loop step or a template's epilogue (a residual add) computing a result that is channels-last as well) and
   whose writers read their other operands of that shape (a residual) channels-last too, found by dropping,
   until none is left to drop, each buffer that breaks one of these; of those, the ones a convolution writes
   or reads. The convolutions' tiles then store pixel-major and the next ones repack a pixel's channels as
   one vector, where NCHW needs a transpose in registers at both ends. Here the 1x1 GEMMs over at least
   ``GEMM_CHANNELS_LAST_MIN_CI`` channels, strided or on rows of at most 16 pixels, count as writers (and as
   readers into a channels-last output), and a direct convolution whose epilogue reads another tensor (a
   residual) stores channels-last in any order
   (``TRUNK_RESIDUALS``): one NCHW link would break the whole residual chain of a ResNet into NCHW. A
   GlobalAveragePool or GlobalMaxPool reads a channels-last input pixel by pixel, every channel along one vector
   loop (``GLOBAL_POOL_CHANNELS_LAST``), so the trunk reaches the classifier's pool: MobileNetV2's last 1x1
   convolution (320 -> 1280 at 7 x 7) then stores pixel-major, 0.64 -> 0.52 ms, MobileNetV3-Small's 0.113 ->
   0.087, ConvNeXt's layer scales before its pool run in memory order, 0.24 -> 0.07 ms (Zen 3, 1 thread). ResNet-50's
   trunk, pool to pool, is then channels-last (Zen 3, AVX2, 1 thread, alternated, sums of kernel minima:
   83.0 -> 80.9 ms; its strided projections 2.9 -> 2.5, 2.6 -> 2.3 ms, the direct 1x1s no longer transposing
   their input 0.05-0.17 ms less each; the 1x1 GEMMs over 64 channels were slower as pixels x channels, 0.34 ->
   0.57 ms for 64 -> 64 at 56 x 56, and keep their NCHW forms).
Graph inputs and outputs keep their layout; a buffer that another buffer views is left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from dlcc.lower.kir import Buffer, Kernel, Program, Step
from dlcc.ops.table import Kind, op_info
from dlcc.schedule.direct import plan_direct
from dlcc.schedule.dwconv import plan_dwc
from dlcc.schedule.elementwise import inlined_nodes
from dlcc.schedule.pwdw import _dims, depthwise_geometry
from dlcc.schedule.target import Target, get_target
from dlcc.schedule.workspace import blocked_conv_form, gemm_channels_last_form, node_workspace_bytes

__all__ = ["assign_layouts", "channels_last_strides", "describe_layouts", "is_channels_last", "layout_figures"]

# switches (module docstring), each measured: rule 4's 1x1 GEMMs over pixels x channels (over at least this many
# input channels), Winograd's channels-last output, and direct convolutions with a residual in any order in rule 4
GEMM_CHANNELS_LAST = True
GEMM_CHANNELS_LAST_MIN_CI = 128
WINOGRAD_CHANNELS_LAST = True
TRUNK_RESIDUALS = True
GLOBAL_POOL_CHANNELS_LAST = True  # GlobalAveragePool / GlobalMaxPool read a channels-last input (schedule.pool)
PWDW_CHANNELS_LAST = True  # the fused 1x1 -> depthwise kernel stores channels-last (pixel-major depthwise tiles)

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of an (N, C, H, W) tensor stored as NHWC."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def is_channels_last(b: Buffer) -> bool:
    """Is this buffer (or view) stored channels-last (and not also row-major, as with one channel)?"""
    return len(b.shape) == 4 and not b.contiguous and b.strides == channels_last_strides(b.shape)


def _perm(node: ir.Node) -> tuple[int, ...] | None:
    a = node.attributes.get("perm")
    return tuple(int(v) for v in a.value) if a is not None else None


class _Layouts:
    def __init__(self, p: Program, target: Target, threads: int):
        self.p, self.target, self.threads = p, target, threads
        self.removed = 0

    # ---------------------------------------------------------------------------------------------- facts
    def readers(self, bid: int) -> list[Kernel]:
        return [k for k in self.p.kernels if bid in k.reads]

    def writers(self, bid: int) -> list[Kernel]:
        return [k for k in self.p.kernels if bid in k.writes]

    def family(self, bid: int) -> list[int] | None:
        """Buffer ``bid`` (a temp root of rank 4, float32, row-major, not a graph output) and the views that are
        all of it (an elementwise kernel writing its result over its input: ``lower``'s in place), which change
        layout together; None where something else views it (a Reshape, a slice)."""
        b = self.p.buffers[bid]
        if (b.kind != "temp" or b.dtype != "float32" or len(b.shape) != 4 or not b.contiguous
                or bid in self.p.outputs):
            return None
        members = [bid]
        for o in self.p.buffers.values():
            if o.kind != "view" or self.p.root(o.id).id != bid:
                continue
            if o.offset or o.shape != b.shape or o.strides != b.strides or o.id in self.p.outputs:
                return None
            members.append(o.id)
        return members

    def values_of(self, bids: list[int]) -> set[ir.Value]:
        return {v for v, b in self.p.value_buffer.items() if b in bids}

    def transpose_step(self, s: Step) -> tuple[int, int, tuple[int, ...]] | None:
        """(input buffer, output buffer, perm) of a loop step that is one Transpose of a rank-4 buffer."""
        if s.kind != "loop" or len(s.nodes) != 1:
            return None
        n = s.nodes[0]
        if n.op_type != "Transpose" or n.domain not in ("", "ai.onnx") or n.inputs[0] not in self.p.value_buffer:
            return None
        perm = _perm(n)
        if perm not in (TO_NHWC, TO_NCHW) or s.outputs != [n.outputs[0]] or n.outputs[0] not in self.p.value_buffer:
            return None
        return self.p.value_buffer[n.inputs[0]], self.p.value_buffer[n.outputs[0]], perm

    def reading_steps(self, bids: list[int]) -> list[Step]:
        """The steps that read any of these buffers (copies included; in the kernel that writes one, too)."""
        vals = self.values_of(bids)
        out: list[Step] = []
        for k in {id(k): k for b in bids for k in (*self.readers(b), *self.writers(b))}.values():
            for s in k.steps:
                if (s.kind == "copy" and any(b in s.copy[1:] for b in bids)) or any(
                        v in vals for n in s.nodes for v in n.inputs):
                    out.append(s)
        return out

    def repacking_conv(self, node: ir.Node) -> bool:
        """Does the kernel of this Conv (or pool) repack its input (any strides, channels-last included)? The
        channel-blocked depthwise kernel, the blocked direct and Winograd ones (``conv`` template's order), and
        2-D MaxPool and AveragePool on planes up to POOL_BLOCKED_MAX_W wide (the channel-blocked form)."""
        if node.op_type in ("MaxPool", "AveragePool") and node.domain in ("", "ai.onnx"):
            if len([o for o in node.outputs if o is not None and o.name]) != 1:
                return False  # (MaxPool's indices: the windowed kernel)
            return node_workspace_bytes(node, self.p.is_constant, self.target, self.threads) > 0
        if depthwise_geometry(self.p, node) is not None:
            return self.blocked_depthwise(node)
        return self.conv_form(node) is not None

    def blocked_depthwise(self, node: ir.Node) -> bool:
        """Is this a depthwise Conv that runs as the channel-blocked kernel?"""
        geo = depthwise_geometry(self.p, node)
        return geo is not None and plan_dwc(geo[0], geo[1], self.target, self.threads) is not None

    def conv_form(self, node: ir.Node) -> str | None:
        """"winograd" or "direct": the group-1 Conv kernels that repack their input (``workspace``), else None."""
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            return None
        form = blocked_conv_form(node, self.p.is_constant, self.target, self.threads)
        return form[0] if form is not None else None

    def gemm_channels_last(self, s: Step) -> bool:
        """Is this step's Conv a 1x1 that runs as the pixels-by-channels GEMM when its output is channels-last
        (``schedule.workspace.gemm_channels_last_form``; no folded input scale)? Rule 4 only: it takes a
        channels-last input only into a channels-last output."""
        if not GEMM_CHANNELS_LAST or s.input_scale is not None:
            return False
        g = gemm_channels_last_form(s.anchor, self.p.is_constant, self.target, self.threads)
        return g is not None and g.ci >= GEMM_CHANNELS_LAST_MIN_CI

    def takes_channels_last(self, bids: list[int], but: Step | None = None, chosen: set[int] | None = None) -> bool:
        """Does every step reading these buffers (but ``but``) read them right stored channels-last, at no loss? A
        Conv (or pool) that repacks them as its input, a global pool. Rules 2 and 3 (``chosen`` None): any loop
        step, and no epilogue. Rule 4: a loop step or a template's epilogue only where its own result is
        channels-last as well (read in the same order): a family in ``chosen`` (roots), or already so."""
        vals = self.values_of(bids)

        def same_order(s: Step) -> bool:
            if chosen is None or not s.outputs or s.outputs[0] not in self.p.value_buffer:
                return False
            out = self.p.root(self.p.value_buffer[s.outputs[0]]).id
            return out in chosen or self.channels_last(out)

        for s in self.reading_steps(bids):
            if s is but:
                continue
            if s.kind == "loop":
                if chosen is not None and not same_order(s):
                    return False
                continue
            if s.kind != "template" or s.anchor is None or s.producer is not None:
                return False
            a = s.anchor
            if any(v in vals for v in a.inputs[1:]):
                return False
            if a.inputs[0] in vals and not self.repacking_conv(a) and not global_pool(a) and not (
                    self.gemm_channels_last(s) and same_order(s)):
                return False
            if any(v in vals for n in s.nodes if n is not a for v in n.inputs) and not same_order(s):
                return False
        return True

    def writes_channels_last(self, bids: list[int], but: Step | None = None, trunk: bool = False) -> list[Step] | None:
        """The steps writing these buffers (but ``but``) when each can store channels-last: loop steps, the
        depthwise convolutions' channel-blocked kernels and the blocked direct ones, whose result (their
        epilogue's end) is the buffer; in rule 4 (``trunk``) also the 1x1 convolutions that run as the
        pixels-by-channels GEMM then (``gemm_channels_last``), and the direct ones whatever their epilogue reads."""
        out: list[Step] = []
        for bid in bids:
            for k in self.writers(bid):
                for s in k.steps:
                    if s is but:
                        continue
                    if s.kind == "copy":
                        if s.copy[0] == bid:
                            return None
                        continue
                    if not s.outputs or self.p.value_buffer.get(s.outputs[0]) != bid:
                        continue
                    if s.kind != "loop":
                        if s.kind != "template" or s.scratch is not None or s.anchor is None:
                            return None
                        if s.producer is not None and not PWDW_CHANNELS_LAST:
                            return None
                        if not self.template_writes_channels_last(s, trunk):
                            return None
                    out.append(s)
        return out

    def template_writes_channels_last(self, s: Step, trunk: bool) -> bool:
        """Can this template step (a convolution's kernel) store its result channels-last?"""
        a = s.anchor
        if self.blocked_depthwise(a) or self.direct_writes_channels_last(s, trunk):
            return True
        if WINOGRAD_CHANNELS_LAST and self.conv_form(a) == "winograd":
            return True
        return trunk and self.gemm_channels_last(s)

    def direct_writes_channels_last(self, s: Step, trunk: bool = False) -> bool:
        """Does this Conv step run as the blocked direct kernel, and store channels-last at no loss? Its epilogue
        then runs per pixel along the channels; with output-channel tiles outside (a plan other than rows
        outside), per pixel along one tile's channels, which is as fast except where the epilogue reads another
        tensor (a residual add): 128 bytes every few KB, which the prefetchers do not follow (ResNet-50's
        256 -> 1024 channels at 14 x 14 with their residual, 0.45 -> 0.49 ms), a loss rule 4 (``trunk``) takes
        where ``TRUNK_RESIDUALS``."""
        a = s.anchor
        if a is None or a.op_type != "Conv" or a.domain not in ("", "ai.onnx") or len(a.inputs) < 2:
            return False
        form = blocked_conv_form(a, self.p.is_constant, self.target, self.threads)
        if form is None or form[0] != "direct":
            return False
        shape = _dims(a.outputs[0])
        operands = [v for n in s.nodes if n is not a for v in n.inputs
                    if v in self.p.value_buffer and self.p.buffers[self.p.value_buffer[v]].shape == shape]
        if not operands or (trunk and TRUNK_RESIDUALS):
            return True
        co, batch = shape[1], shape[0]
        return plan_direct(co, form[1], batch, self.target, self.threads).order == "rows"

    # ---------------------------------------------------------------------------------------------- rules
    def drop(self, k: Kernel, s: Step, y: int) -> None:
        """Remove Transpose step ``s`` (of kernel ``k``; its output buffer ``y`` now a view or viewed), and its
        kernel when nothing is left of it."""
        self.removed += 1
        k.steps = [o for o in k.steps if o is not s]
        if k.steps:
            k.nodes = [n for n in k.nodes if n not in s.nodes]
            k.writes = [b for b in k.writes if b != y]
            if any(s.outputs[0] in n.inputs for n in k.nodes) and y not in k.reads:
                k.reads.append(y)  # (its other steps read what is now another kernel's write, or a view)
            return
        self.p.remove_kernels({self.p.kernels.index(k)})

    def relayout(self, bids: list[int], base: int | None, writers: list[Step]) -> None:
        """Store these buffers channels-last: as views of ``base`` (which then holds them), or in place."""
        for bid in bids:
            b = self.p.buffers[bid]
            strides = channels_last_strides(b.shape)
            if base is not None:
                self.p.buffers[bid] = Buffer(bid, "view", b.dtype, b.shape, b.name, base=base, offset=0,
                                             strides=strides)
            else:
                b.strides = strides
        for s in writers:
            if s.kind == "template":
                s.channels_last = True

    def transposes(self, k: Kernel, perm: tuple[int, ...]) -> Iterator[tuple[Step, int, int]]:
        """(step, input buffer, output buffer) of kernel ``k``'s steps that are one Transpose by ``perm``."""
        for s in k.steps:
            t = self.transpose_step(s)
            if t is not None and t[2] == perm:
                yield s, t[0], t[1]

    def into_producer(self, k: Kernel) -> bool:
        """Rule 1 (module docstring)."""
        for s, x, y in self.transposes(k, TO_NHWC):
            xs, yb = self.family(x), self.p.buffers[y]
            if xs is None or len(xs) != 1 or self.reading_steps(xs) != [s]:
                continue
            if yb.kind not in ("temp", "output") or not yb.contiguous or any(
                    o.kind == "view" and o.base == y for o in self.p.buffers.values()):
                continue
            writers = self.writes_channels_last(xs)
            if not writers:
                continue
            self.relayout(xs, y, writers)
            self.drop(k, s, y)
            return True
        return False

    def into_consumers(self, k: Kernel) -> bool:
        """Rule 2 (module docstring)."""
        for s, x, y in self.transposes(k, TO_NCHW):
            xb, ys = self.p.buffers[x], self.family(y)
            if ys is None or xb.kind not in ("temp", "input") or not xb.contiguous or xb.dtype != "float32":
                continue
            writers = self.writes_channels_last(ys, but=s)
            if writers is None or not self.takes_channels_last(ys, but=s):
                continue
            self.relayout(ys, x, writers)
            self.drop(k, s, y)
            return True
        return False

    def step_output(self, k: Kernel) -> bool:
        """Rule 3 (module docstring)."""
        changed = False
        for s in k.steps:
            if s.kind != "loop" or not s.outputs or s.outputs[0] not in self.p.value_buffer:
                continue
            z = self.p.value_buffer[s.outputs[0]]
            zs = self.family(self.p.root(z).id)
            if zs is None or not self._transposes_nhwc(s, self.p.buffers[z].shape):
                continue
            writers = self.writes_channels_last(zs)
            if writers is None or not self.takes_channels_last(zs):
                continue
            self.relayout(zs, None, writers)
            changed = True
        return changed

    def _inlined(self, v: ir.Value) -> list[ir.Node]:
        """The nodes a loop step's element expression of ``v`` computes: its producer, and theirs up to buffers."""
        return inlined_nodes(v, lambda i: i in self.p.value_buffer or self.p.is_constant(i))

    def _transposes_nhwc(self, s: Step, shape: tuple[int, ...]) -> bool:
        """Does loop step ``s`` transpose a row-major NHWC buffer into its result of ``shape``?"""
        for n in self._inlined(s.outputs[0]):
            if n.op_type == "Transpose" and _perm(n) == TO_NCHW and n.inputs[0] in self.p.value_buffer:
                src = self.p.buffers[self.p.value_buffer[n.inputs[0]]]
                if src.contiguous and _dims(n.outputs[0]) == shape:
                    return True
        return False

    def channels_last(self, bid: int) -> bool:
        return is_channels_last(self.p.buffers[bid])

    def trunk(self) -> bool:
        """Rule 4 (module docstring): the largest set of buffer families that can all be channels-last together."""
        cands: dict[int, tuple[list[int], list[Step]]] = {}
        for bid in list(self.p.buffers):
            fam = self.family(bid)
            if fam is None:
                continue
            writers = self.writes_channels_last(fam, trunk=True)
            if writers:
                cands[bid] = (fam, writers)
        chosen = set(cands)
        changed = True
        while changed:
            changed = False
            for bid in sorted(chosen):
                fam, writers = cands[bid]
                if not self.takes_channels_last(fam, chosen=chosen) or not self._operands_follow(fam, writers, chosen):
                    chosen.discard(bid)
                    changed = True
        # (a family only loop steps write and read, with no convolution around, gains nothing)
        chosen = {b for b in chosen if self._touches_convolution(cands[b][0], cands[b][1])}
        for bid in sorted(chosen):
            fam, writers = cands[bid]
            self.relayout(fam, None, writers)
        return bool(chosen)

    def _operands_follow(self, fam: list[int], writers: list[Step], chosen: set[int]) -> bool:
        """Are the tensors of the same images and pixels that the writers of ``fam`` read element by element (a
        residual in an epilogue, an operand of a loop step, a Concat's inputs; not a convolution's input, which it
        repacks) channels-last too? Else each element written in channels-last order would read them a row apart
        (DenseNet-121's Concat + BN + Relu steps: 20.7 -> 23.0 ms)."""
        shape = self.p.buffers[fam[0]].shape
        plane = (shape[0], *shape[2:])  # (a Concat's inputs have other channel counts: the same images and pixels)
        for s in writers:
            if s.kind == "loop":
                nodes = self._inlined(s.outputs[0])
                if not all(self._elementwise(n) for n in nodes):
                    return False
                reads = [v for n in nodes for v in n.inputs]
            else:
                convs = (s.anchor, s.producer.anchor if s.producer is not None else None)  # (they repack)
                reads = [v for n in s.nodes if n not in convs for v in n.inputs]
            for v in reads:
                bid = self.p.value_buffer.get(v)
                b = self.p.buffers[bid] if bid is not None else None
                if b is None or len(b.shape) != 4 or (b.shape[0], *b.shape[2:]) != plane or b.size == b.shape[0]:
                    continue
                root = self.p.root(bid).id
                if root not in chosen and root not in fam and not self.channels_last(root):
                    return False
        return True

    @staticmethod
    def _elementwise(n: ir.Node) -> bool:
        """An elementwise node (broadcasting included), or the Transpose from NHWC that rule 3 lets run in memory
        order: what a loop step can compute in any order of its elements at the same cost. An index map along the
        channels (a Concat, a Slice) would pick its source per element, innermost (DeepLab's pooled-branch Concat
        0.13 -> 1.9 ms written channels-last)."""
        if n.op_type == "Transpose" and n.domain in ("", "ai.onnx"):
            return _perm(n) == TO_NCHW
        return op_info(n.op_type, n.domain).kind in (Kind.ELEMWISE, Kind.BROADCAST)

    def _touches_convolution(self, fam: list[int], writers: list[Step]) -> bool:
        if any(s.kind == "template" for s in writers):
            return True
        return any(s.kind == "template" for s in self.reading_steps(fam))

    def run(self) -> int:
        changed = True
        trunk = True
        while changed:
            changed = False
            for rule in (self.into_consumers, self.into_producer, self.step_output):
                for k in list(self.p.kernels):
                    if k in self.p.kernels and rule(k):
                        changed = True
            if not changed and trunk:
                trunk = False
                changed = self.trunk()
        return self.removed


def global_pool(node: ir.Node) -> bool:
    """Does this node's kernel read its channels-last input pixel by pixel at no loss? GlobalAveragePool and
    GlobalMaxPool (``schedule.pool.global_pool_channels_last``)."""
    return GLOBAL_POOL_CHANNELS_LAST and node.op_type in ("GlobalAveragePool", "GlobalMaxPool") \
        and node.domain in ("", "ai.onnx")


def assign_layouts(p: Program, target: Target, threads: int) -> int:
    """Store buffers channels-last where that removes a layout change (module docstring); returns (and adds to
    ``p.transposes_removed``) the Transpose steps removed."""
    if target.lanes < 4:  # (the channel-blocked kernels that read and write channels-last need vectors)
        return 0
    removed = _Layouts(p, target, threads).run()
    p.transposes_removed += removed
    return removed


def layout_figures(p: Program) -> dict[str, int]:
    """What ``dlcc run --profile`` and ``dlcc report`` say of the layouts: buffers stored channels-last, the
    Transpose steps the assignment removed, and the layout changes left (steps that only transpose a rank-4
    buffer between NCHW and NHWC); where some have a zero ring (``schedule.rings``), how many buffers hold one;
    how many are stored in channel blocks for the convolution reading them (``schedule.blocked``); once the C is
    generated, how many kernels still repack their input into channel blocks on every call (their loop IR calls
    ``nchwc_``: the layout changes left inside the convolutions)."""
    rules = _Layouts(p, get_target("generic"), 1)
    left = sum(1 for k in p.kernels for s in k.steps if rules.transpose_step(s) is not None)
    cl = sum(1 for b in p.buffers.values() if b.shape[1:2] != (1,) and not b.block
             and (is_channels_last(b) or b.ring))
    out = {"channels_last_buffers": cl, "transposes_removed": p.transposes_removed, "transposes_left": left}
    rings = len({p.root(b.id).id for b in p.buffers.values() if b.ring and not b.block})
    if rings:
        out["zero_rings"] = rings
    blocked = sum(1 for b in p.buffers.values() if b.block)
    if blocked:
        out["blocked_buffers"] = blocked
    repacks = sum(1 for k in p.kernels if any("nchwc_" in s.loop_ir for s in k.steps))
    if repacks:
        out["repacking_kernels"] = repacks
    return out


def describe_layouts(fig: dict | None) -> str:
    """One sentence of ``layout_figures``, or "" when there is nothing to say."""
    if not fig or not any(fig.values()):
        return ""
    n, r, left = fig["channels_last_buffers"], fig["transposes_removed"], fig["transposes_left"]
    z, k, bl = fig.get("zero_rings", 0), fig.get("repacking_kernels", 0), fig.get("blocked_buffers", 0)
    return (f"{n} buffer{'s' * (n != 1)} stored channels-last, {r} NCHW <-> NHWC Transpose"
            f"{'s' * (r != 1)} removed, {left} left"
            + (f", {z} with a zero ring read in place by depthwise convolutions" if z else "")
            + (f"; {bl} stored in channel blocks (NCHWc) with a ring (zeros, or -inf for max pools), read in place "
               "by convolutions and pools" if bl else "")
            + (f"; {k} kernel{'s' * (k != 1)} repack{'s' * (k == 1)} {'its' if k == 1 else 'their'} input into "
               "channel blocks on every call" if k else ""))

