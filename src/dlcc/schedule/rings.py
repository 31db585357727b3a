"""Zero padding rings of the schedule stage: a channels-last buffer stored with zeros around its planes, so that the
depthwise convolution reading it takes its taps outside the plane where they are, with no repacked copy.

What goes in: a kernel-IR ``Program`` after layout assignment (``schedule.layouts``) and the channel-scale fold,
before workspace and memory planning; the ``Target`` and the thread count. What comes out: the same program where
some buffers are views of a larger buffer (``kir.Buffer.ring``: rows above, below, columns left, right of every
(H, W) plane), and ``ring_func``, the loop IR that zeroes a ring (the writer's kernel runs it before the step
that writes the view). ``add_rings`` returns how many buffers it gave a ring.

The channel-blocked depthwise kernel (``schedule.dwconv``) repacks each block of its input with a zero ring into
its workspace, so that no tap tests bounds: from a channels-last input that copy is every pixel's channels one
vector, the same vectors the tiles would read in place but for the taps outside the plane. With the ring in the
input's own buffer the copy goes (``dwconv.reads_ring``): the tiles read the input at a pixel stride of all its
channels. The first depthwise convolution of MobileNetV2 and EfficientNet reads a 32-channel 112 x 112 tensor
that only the stem writes: its repacking was a quarter of that kernel's time.

A buffer gets a ring where all of these hold:
- it is a channels-last temp (``schedule.layouts``), not a graph output, that nothing views but loop steps
  writing their result over it (in place: ConvNeXt's residual adds), which take the ring too;
- one kernel step writes it: a loop step, or a convolution's blocked direct or Winograd kernel, whose epilogue
  stores each element through the buffer's strides (any row and plane stride);
- the kernels that read it as their input are depthwise convolutions (no fused producer, no folded input scale)
  that run as the channel-blocked kernel, whose channels fill whole vectors, at most ``RING_MAX_CHANNELS`` of
  them; the other steps read it element by
  element through its strides (loop steps, epilogues).
The ring is as wide as the readers' padding on each side (less below and right where no tap reaches). The first
writer zeroes it each run, before its step: the arena reuses the memory for other buffers between runs.
"""

from __future__ import annotations

from dlcc.lower.kir import Buffer, Program, Step
from dlcc.lower.lir import Buf, Const, For, Func, Layout, Stmt, Store, Var
from dlcc.schedule.dwconv import padded_extent
from dlcc.schedule.layouts import _Layouts, is_channels_last
from dlcc.schedule.pwdw import depthwise_geometry
from dlcc.schedule.target import Target

__all__ = ["RINGS", "add_rings", "ring_func"]

RINGS = True  # switch: depthwise convolutions read a channels-last input within a zero ring where it has one
# the readers' channels at most this many: in place, a tile's pixels are all the channels apart, and a wider pixel
# stride spreads a tile's rows over few L1 sets (ConvNeXt's 7x7 at 192 channels, 28 x 28: 0.088 -> 0.092 ms in
# place, and its residual adds writing around the ring slower too; MobileNetV2's first at 32: 0.122 -> 0.092)
RING_MAX_CHANNELS = 32


def _dw_ring(p: Program, s: Step, target: Target, threads: int) -> tuple[int, int, int, int] | None:
    """The zero ring the depthwise convolution of step ``s`` needs to read its input in place, or None where it does
    not run as the channel-blocked kernel reading a whole number of vectors of channels."""
    if s.kind != "template" or s.anchor is None or s.producer is not None or s.input_scale is not None:
        return None
    geo = depthwise_geometry(p, s.anchor)
    if geo is None:
        return None
    g = geo[0]
    if target.lanes < 4 or g.ci % target.lanes or g.ci > RING_MAX_CHANNELS:
        return None
    hp, wp = padded_extent(g)
    ring = (g.ph, max(0, hp - g.ph - g.h), g.pw, max(0, wp - g.pw - g.w))
    return ring if any(ring) else None


class _Rings(_Layouts):
    def members(self, bid: int) -> list[int] | None:
        """Channels-last temp ``bid`` and the views that are all of it (a loop step writing its result over its
        input: ``lower``'s in place), which get the ring together; None where something else views it."""
        b = self.p.buffers[bid]
        if b.kind != "temp" or b.dtype != "float32" or not is_channels_last(b) or bid in self.p.outputs:
            return None
        out = [bid]
        for o in self.p.buffers.values():
            if o.kind == "view" and self.p.root(o.id).id == bid:
                if o.base != bid or o.offset or o.shape != b.shape or o.strides != b.strides or o.id in self.p.outputs:
                    return None
                out.append(o.id)
        return out

    def writes_through_strides(self, bid: int, first: bool) -> bool:
        """Is buffer ``bid`` written by one step that stores each element through its strides: a loop step, or
        (``first``: the family's root) a convolution's blocked direct or Winograd kernel?"""
        steps = [s for k in self.writers(bid) for s in k.steps
                 if s.outputs and self.p.value_buffer.get(s.outputs[0]) == bid]
        if len(steps) != 1 or len(self.writers(bid)) != 1:
            return False
        w = steps[0]
        return w.kind == "loop" or (first and w.kind == "template" and w.anchor is not None and w.producer is None
                                    and w.scratch is None and w.channels_last
                                    and self.conv_form(w.anchor) in ("direct", "winograd"))

    def candidate(self, bid: int) -> tuple[list[int], tuple[int, int, int, int]] | None:
        """The buffers that get a ring with ``bid`` and the ring (module docstring), or None."""
        fam = self.members(bid)
        if fam is None or not all(self.writes_through_strides(m, m == bid) for m in fam):
            return None
        vals = self.values_of(fam)
        ring = None
        # (a step that reads it through a fused elementwise chain, not as a node's input, is not listed: it reads
        # element by element through the strides, as a template's inlined operand does)
        for r in self.reading_steps(fam):
            if r.kind == "copy":
                return None
            if r.kind == "template" and r.anchor is not None and r.anchor.inputs[0] in vals:
                # (the depthwise convolutions take the ring as their padding; other steps read element by element)
                dw = _dw_ring(self.p, r, self.target, self.threads)
                if dw is None or any(v in vals for v in r.anchor.inputs[1:]):
                    return None
                ring = dw if ring is None else tuple(max(a, b) for a, b in zip(ring, dw, strict=True))
            elif r.kind == "template" and (r.anchor is None or r.producer is not None or any(
                    v in vals for v in r.anchor.inputs)):
                return None
        return (fam, ring) if ring is not None else None

    def give(self, fam: list[int], ring: tuple[int, int, int, int]) -> None:
        """The buffers of ``fam`` become views of a new temp that holds them with ``ring`` around their planes."""
        b = self.p.buffers[fam[0]]
        n, c, h, w = b.shape
        top, bottom, left, right = ring
        hr, wr = h + top + bottom, w + left + right
        root = max(self.p.buffers) + 1
        self.p.buffers[root] = Buffer(root, "temp", b.dtype, (n, hr, wr, c), b.name)
        for bid in fam:
            self.p.buffers[bid] = Buffer(bid, "view", b.dtype, b.shape, self.p.buffers[bid].name, base=root,
                                         offset=(top * wr + left) * c, strides=(hr * wr * c, 1, wr * c, c), ring=ring)
        for k in self.writers(fam[0]):
            k.writes.append(root)  # (the ring: written by the kernel writing the root's first view, before its step)

    def run(self) -> int:
        given = 0
        for bid in list(self.p.buffers):
            found = self.candidate(bid)
            if found is not None:
                self.give(*found)
                given += 1
        return given


def add_rings(p: Program, target: Target, threads: int) -> int:
    """Give a zero ring to the buffers that a depthwise convolution can then read in place (module docstring);
    returns how many."""
    if not RINGS or target.lanes < 4:
        return 0
    return _Rings(p, target, threads).run()


def ring_func(view: Buffer, name: str, fresh=str) -> Func:
    """The loop IR zeroing the ring of ``view`` (an (N, C, H, W) view with ``ring``, channels-last in its base, or
    in channel blocks (``Buffer.block``) whose planes follow one another, each block's plane channels-last): per
    plane, the rows above and the first row's left columns, then between each row's right columns and the next
    row's left ones, then the last row's right columns and the rows below, each one contiguous run (with -inf
    instead of zeros where the view's ``ring_fill`` says so: a ring only max pools read)."""
    n0, c0, h, w = view.shape
    top, bottom, left, right = view.ring
    c = view.block or c0  # (the channels of one plane: a block's, or all of them)
    nb = c0 // c
    n = n0 * nb  # (planes, one after the other)
    wr = w + left + right
    plane = (h + top + bottom) * wr * c
    planes = ((plane, n0 * plane), (nb * plane, plane)) if view.block else ((plane, 1),)
    if view.dtype != "float32" or view.strides[2:] != (wr * c, c) or view.strides[:2] not in planes:
        raise ValueError("ring: the view is not float32 with channels-last planes one after the other in its base")
    base = Buf(name, view.dtype, Layout.strided((n * plane,)))
    b, q, y = Var(fresh("b")), Var(fresh("q")), Var(fresh("y"))
    fill = Const(float(view.ring_fill), "float32")  # (zeros, or -inf: ``Buffer.ring_fill``)

    def run(start, length: int) -> Stmt:
        return For(q, Const(0), Const(length), (Store(base, (b * plane + start + q,), fill),), "vectorized")

    first = (top * wr + left) * c
    body: list[Stmt] = [run(Const(0), first)] if first else []
    if left + right and h > 1:
        body.append(For(y, Const(0), Const(h - 1), (run(((y + top) * wr + left + w) * c, (left + right) * c),)))
    last = ((top + h - 1) * wr + left + w) * c
    if plane - last:
        body.append(run(Const(last), plane - last))
    return Func("ring", (base,), (For(b, Const(0), Const(n), tuple(body)),))

