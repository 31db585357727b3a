"""Kernel IR: buffers, kernels (one per fusion group) made of steps, and the call schedule.

What goes in: built by ``dlcc.lower.lower`` from a graph and its FusionPlan.
What comes out: a ``Program`` that the memory planner places, the C generator prints, and the numpy
interpreter (``dlcc.lower.interp``) runs.

    Program
      buffers   id -> Buffer(kind input | output | weight | temp | view, dtype, shape)
                a view is a window (element offset, element strides) on another buffer: Reshape-like ops
                and Concat inputs written in place are views, so they cost no copy; a view may keep a zero
                ring in its base around its (H, W) planes (``ring``: rows above, below, columns left, right;
                ``schedule.rings``), which the kernel writing the view zeroes before its step and nothing
                else writes, so a kernel reading it takes the taps outside the plane without bounds tests;
                a view may store its channels in blocks (``block``: NCHW[block]c, channel c at (c // block) *
                strides[1] + c % block, a block's channels contiguous; ``schedule.blocked``), as the convolution
                reading it would have repacked it
      kernels   in call order; a kernel = one fusion group = one C function, made of steps:
                  loop      one loop nest over a materialized value; its element is an inlined expression
                            of the group's elementwise/injective ops reading buffers
                  template  a named kernel template (Conv, MatMul, Softmax, ...) for the group's anchor,
                            with its elementwise epilogue (bias, activation, residual add) applied to each
                            result before it is stored — the kernel owns its epilogue
      inputs / outputs      buffer ids in graph order
    producer: a template step may compute another template step's result inside it (``Step.producer``: a 1x1
    Conv feeding a depthwise Conv); that result has no buffer. Likewise a Conv's input that is a per-channel
    Mul of a buffer (``Step.input_scale``: a squeeze-and-excitation scale) is computed as the Conv repacks it.
    workspace: a template step may own a ``temp`` buffer of scratch (packed operands, transform tiles) that
    the schedule stage declared before memory planning; its kernel writes it and nothing reads it after,
    so it lives for that kernel only.

Invariants (``verify_program``): every buffer a kernel reads is a graph input or weight, or is written by
an earlier kernel (or earlier in the same kernel); views stay inside their base; each graph output is
written; a buffer is written by one kernel only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dlcc.errors import PassError
from dlcc.util import contiguous_strides, sanitize_comment

__all__ = ["Buffer", "Kernel", "Program", "Step", "blocked_strides", "print_program", "verify_program"]

KINDS = ("input", "output", "weight", "temp", "view")


@dataclass
class Buffer:
    id: int
    kind: str
    dtype: str
    shape: tuple[int, ...]
    name: str = ""  # the ONNX value name: for comments and messages only, never a C identifier
    base: int | None = None  # views: the buffer viewed
    offset: int = 0  # views: elements into the base
    strides: tuple[int, ...] = ()  # element strides (contiguous when empty)
    data: np.ndarray | None = None  # weights
    ring: tuple[int, ...] = ()  # views: the zero ring around the view's planes in its base (module docstring)
    block: int = 0  # views of rank 4: channels in blocks of this many (NCHW[block]c; module docstring), 0: plain
    ring_fill: float = 0.0  # what the ring holds: zeros, or -inf where only max pools read it (their padding)

    def address_span(self) -> int:
        """Elements from the view's first element to its last (through its strides and channel block)."""
        if not self.size:
            return 0
        if self.block:
            n, c, h, w = self.shape
            return ((n - 1) * self.strides[0] + (c - 1) // self.block * self.strides[1] + (self.block - 1)
                    + (h - 1) * self.strides[2] + (w - 1) * self.strides[3])
        return sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PassError(f"kernel IR: unknown buffer kind {self.kind}")
        self.shape = tuple(int(d) for d in self.shape)
        if not self.strides:
            self.strides = contiguous_strides(self.shape)
        if self.block and (len(self.shape) != 4 or self.shape[1] % self.block):
            raise PassError(f"kernel IR: buffer {self.id}: channel blocks of {self.block} in shape {self.shape}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def contiguous(self) -> bool:
        return not self.block and (self.strides == contiguous_strides(self.shape) or self.size <= 1)


@dataclass
class Step:
    kind: str  # "loop" | "template" | "copy"
    outputs: list[ir.Value]  # the values this step materializes (a template: the epilogue's end value)
    anchor: ir.Node | None = None  # template steps: the node the template computes
    nodes: list[ir.Node] = field(default_factory=list)  # the group nodes this step computes (incl. inlined)
    copy: tuple[int, int] | None = None  # copy steps: (destination buffer, source buffer)
    scratch: int | None = None  # template steps whose destination is strided or not float32: an accumulator
    workspace: int | None = None  # template steps: the scratch buffer the schedule declared (packed operands)
    loop_ir: str = ""  # template steps built in the loop-level IR: its listing (``lir.print_func``), by codegen
    # template steps: a template step whose result this one reads, computed inside this one and never stored
    # (a 1x1 Conv fused into the depthwise Conv that reads it: ``schedule.pwdw``); ``nodes`` then holds its
    # nodes first
    producer: Step | None = None
    # template steps: the destination is a channels-last view the schedule stage chose (``schedule.layouts``); the
    # template stores every element through its epilogue, in that layout (no scratch)
    channels_last: bool = False
    # template steps: a Mul by a per-channel factor (a squeeze-and-excitation scale) whose result is this step's
    # Conv input, computed as the Conv repacks its input (``schedule.chscale``): that product has no buffer, and
    # ``nodes`` holds the Mul first
    input_scale: ir.Node | None = None

    def describe(self) -> str:
        ops = "+".join(n.op_type for n in self.nodes) or "-"
        into = f" <- {self.producer.anchor.op_type}" if self.producer is not None and self.producer.anchor else ""
        into += " <- scaled input" if self.input_scale is not None else ""
        return f"{self.kind}{'(' + self.anchor.op_type + into + ')' if self.anchor else ''} [{ops}]"


@dataclass
class Kernel:
    id: int
    group: int  # the fusion group id
    steps: list[Step]
    reads: list[int] = field(default_factory=list)  # buffer ids (views included)
    writes: list[int] = field(default_factory=list)
    nodes: list[ir.Node] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        return [n.op_type for n in self.nodes]


@dataclass
class Program:
    buffers: dict[int, Buffer]
    kernels: list[Kernel]
    inputs: list[int]
    outputs: list[int]
    value_buffer: dict[ir.Value, int]  # materialized values -> buffer ids
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    consts: dict[ir.Value, np.ndarray] = field(default_factory=dict)
    opset: dict[str, int] = field(default_factory=dict)
    transposes_removed: int = 0  # Transpose steps the schedule stage's layout assignment made unnecessary

    def is_constant(self, v: ir.Value | None) -> bool:
        """Is ``v`` a compile-time constant (a folded value, an initializer, or a weight buffer)?"""
        if v is None:
            return False
        if v in self.consts or v.const_value is not None:
            return True
        bid = self.value_buffer.get(v)
        return bid is not None and self.buffers[bid].kind == "weight"

    def root(self, bid: int) -> Buffer:
        b = self.buffers[bid]
        while b.kind == "view":
            b = self.buffers[b.base]
        return b

    def merge_into(self, k1: Kernel, k2: Kernel, value: ir.Value) -> None:
        """Compute one-step kernel ``k1``, whose result ``value`` only ``k2`` reads, inside ``k2``'s one step (the
        caller marks how: ``Step.producer``, ``Step.input_scale``): its nodes go first, its reads become ``k2``'s,
        and the value's buffer is gone. ``k1`` stays in ``kernels`` until ``remove_kernels``."""
        bid = self.value_buffer[value]
        step = k2.steps[0]
        step.nodes = [*k1.steps[0].nodes, *step.nodes]
        k2.nodes = [*k1.nodes, *k2.nodes]
        k2.reads = list(dict.fromkeys([*k1.reads, *(r for r in k2.reads if r != bid)]))
        del self.buffers[bid]
        del self.value_buffer[value]

    def remove_kernels(self, drop: set[int]) -> None:
        """Remove the kernels at these positions and number the rest in call order again."""
        self.kernels = [k for i, k in enumerate(self.kernels) if i not in drop]
        for n, k in enumerate(self.kernels):
            k.id = n

    def window(self, bid: int) -> tuple[Buffer, int, tuple[int, ...]]:
        """(root buffer, element offset into it, element strides) of buffer ``bid``."""
        b = self.buffers[bid]
        offset, strides = 0, b.strides
        while b.kind == "view":
            offset += b.offset
            b = self.buffers[b.base]
        return b, offset, strides


def blocked_strides(rows: int, cols: int, batch: int, block: int) -> tuple[int, int, int, int]:
    """The element strides (NCHW order: image, channel block, row, column) of a view in channel blocks of ``block``
    (``Buffer.block``) whose blocks' planes are ``rows`` x ``cols`` pixels, its ring included, one after the other
    for the ``batch`` images, the blocks outside them."""
    plane = rows * cols * block
    return plane, batch * plane, cols * block, block


def verify_program(p: Program) -> None:
    """Check the invariants of the module docstring; raise PassError naming the first broken one."""
    written: dict[int, int] = {}
    avail = {b.id for b in p.buffers.values() if b.kind in ("input", "weight")}
    for b in p.buffers.values():
        if b.kind == "view":
            if b.base not in p.buffers:
                raise PassError(f"kernel IR: view {b.id} of missing buffer {b.base}")
            base = p.buffers[b.base]
            if b.size:  # (a view's strides are its root's, its offset its base's: ``Program.window``)
                root, offset, _ = p.window(b.id)
                if b.offset < 0 or offset + b.address_span() >= root.size:
                    raise PassError(f"kernel IR: view {b.id} ({b.shape} at {b.offset}) leaves buffer {root.id}")
            if base.dtype != b.dtype:
                raise PassError(f"kernel IR: view {b.id} is {b.dtype} but its base is {base.dtype}")
    for k in p.kernels:
        own = set(k.writes) | {p.root(b).id for b in k.writes}
        # every buffer its nodes read and its steps do not compute is among its reads (liveness and the memory
        # plan know a kernel's buffers from its reads and writes only)
        computed = {v for s in k.steps for v in s.outputs}
        listed = {p.root(b).id for b in (*k.reads, *k.writes)}
        for n in k.nodes:
            for v in n.inputs:
                if v is not None and v in p.value_buffer and v not in computed and \
                        p.root(p.value_buffer[v]).id not in listed:
                    raise PassError(f"kernel IR: kernel {k.id} reads buffer {p.value_buffer[v]} ('{v.name}') "
                                    "without listing it")
        for bid in k.reads:
            root = p.root(bid).id
            if bid not in avail and root not in avail and bid not in own and root not in own:
                raise PassError(f"kernel IR: kernel {k.id} reads buffer {bid} before anything writes it")
        for bid in k.writes:
            if bid in written:
                raise PassError(f"kernel IR: buffer {bid} written by kernels {written[bid]} and {k.id}")
            if p.buffers[bid].kind in ("input", "weight"):
                raise PassError(f"kernel IR: kernel {k.id} writes read-only buffer {bid}")
            written[bid] = k.id
            avail.add(bid)
            # writing a view makes its base (partly) available: the base is complete when all its views are
            b = p.buffers[bid]
            while b.kind == "view":
                avail.add(b.base)
                b = p.buffers[b.base]
    for bid in p.outputs:
        if bid not in avail:
            raise PassError(f"kernel IR: graph output buffer {bid} is never written")


def print_program(p: Program, memory=None) -> str:
    """A readable listing: buffers (with arena offsets when a MemoryPlan is given), then kernels and steps."""
    lines = [f"program: {len(p.kernels)} kernels, {len(p.buffers)} buffers"]
    for b in sorted(p.buffers.values(), key=lambda b: b.id):
        where = ""
        if b.kind == "view":
            fill = "zero" if not b.ring_fill else f"{b.ring_fill}"
            where = f" = view of b{b.base} at +{b.offset} strides {list(b.strides)}" + (
                f" {fill} ring {list(b.ring)}" if b.ring else "") + (f" channel blocks of {b.block}" if b.block else "")
        elif b.kind == "temp" and memory is not None and b.id in memory.offsets:
            where = f" @ arena+{memory.offsets[b.id]}"
        lines.append(f"  b{b.id:<4} {b.kind:<6} {b.dtype}{list(b.shape)}{where}  # {sanitize_comment(b.name)}")
    for k in p.kernels:
        reads = ", ".join(f"b{i}" for i in k.reads)
        writes = ", ".join(f"b{i}" for i in k.writes)
        lines.append(f"  k{k.id} (group {k.group}): ({reads}) -> ({writes})")
        for s in k.steps:
            outs = f"b{s.copy[0]} <- b{s.copy[1]}" if s.copy else ", ".join(f"b{p.value_buffer[v]}" for v in s.outputs)
            ws = f" (workspace b{s.workspace})" if s.workspace is not None else ""
            lines.append(f"    {s.describe()} -> {outs}{ws}")
            lines += [f"      {line}" for line in s.loop_ir.splitlines()]
    return "\n".join(lines)
