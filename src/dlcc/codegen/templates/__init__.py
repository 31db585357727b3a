"""Kernel templates: C for the ops that are not plain index maps (Conv, MatMul, pools, reductions, norms).

What goes in: a ``TemplateCall`` — the ONNX node (attributes), one ``Operand`` per input (None for an
absent optional input), the output's shape and dtype, and ``store``, the epilogue callback.
What comes out: C statements (a string) that compute every element of output 0 exactly once and hand it
to ``store(idx, value)``. ``scratch`` is a float32 TensorRef of the output's shape that the template may
use as an accumulator (it is the destination itself: after accumulating, a template calls ``store`` on
each element it finished, e.g. ``call.store(idx, call.scratch.at(idx))``; when ``call.direct`` is True
there is no epilogue and the accumulated values already are the result, so that pass can be skipped).

Registry: ``TEMPLATES[op_type] = function(call) -> str``; ``NEEDS_BUFFERS`` lists the op types whose
inputs must be materialized buffers (``Operand.ref`` set) rather than inlined expressions.
Target: ``call.target`` (a ``dlcc.schedule.target.Target``) gives the vector width, registers and caches
every lane count, register tile and cache block derives from; the C may use ``dlcc_vf``, the target's
float vector (``cbase.vector_helpers``, in every generated file's prelude).
Weights: an operand whose ``const`` is set is a compile-time constant; ``call.packed(array)`` adds a
rearranged copy as a new weight buffer (compile-time repacking into the layout the kernel reads fastest).
Workspace: ``call.workspace`` is the scratch ``dlcc.schedule.workspace`` declared for this step before
memory planning (None when it declared none); a template that prints loop IR adds the micro-kernels it
calls to ``call.micro``.
A template that meets an attribute or shape it does not handle raises ``TemplateError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dlcc.codegen.cbase import Names, Operand, Store, TensorRef
from dlcc.codegen.lir_c import print_c
from dlcc.lower.lir import Buf, Expr, Func, Let, print_func
from dlcc.schedule.loops import PAR_MIN_FLOPS
from dlcc.schedule.target import Target, get_target

__all__ = ["NEEDS_BUFFERS", "TEMPLATES", "InputScale", "Producer", "TemplateCall", "register"]


@dataclass
class Producer:
    """A template step computed inside another one (``kir.Step.producer``: a 1x1 Conv inside the depthwise Conv
    that reads it): its node, operands, and ``chain(index, value)``, the C expression of its result at element
    ``index`` given its anchor's value there (bias and fused elementwise ops applied; ``identity``: neither)."""
    node: ir.Node
    inputs: list[Operand | None]
    chain: Callable[[Sequence[str], str], str]
    identity: bool
    # the chain as an in-register epilogue after a constant bias, where it is one (``lower.micro.post_tag``'s
    # kind, lo, hi): ("none" | "relu" | "clip", bounds); None for any other chain, or without a constant bias
    post: tuple[str, float | None, float | None] | None = None


@dataclass
class InputScale:
    """A factor per image and channel that a Conv's input is multiplied by before the Conv (``kir.Step.input_scale``:
    a squeeze-and-excitation scale; the Conv's input operand is then the unscaled tensor): ``gate(n, c)`` is the
    element expression (the locals it binds, its value) of image n's channel c's factor, for n < ``batch``,
    c < ``channels``, reading ``bufs`` (C pointers: ``ptrs``)."""
    gate: Callable[[Expr, Expr], tuple[list[Let], Expr]]
    batch: int
    channels: int
    bufs: tuple[Buf, ...] = ()
    ptrs: dict[str, str] = field(default_factory=dict)


@dataclass
class TemplateCall:
    node: ir.Node
    inputs: list[Operand | None]
    out_shape: tuple[int, ...]
    out_dtype: str
    store: Store
    scratch: TensorRef
    direct: bool
    names: Names = field(default_factory=Names)
    pack: Callable[[np.ndarray], TensorRef] | None = None
    target: Target = field(default_factory=get_target)  # every lane count and tile size derives from it
    threads: int = 1  # the pool's size: >1 lets the template mark one top-level loop ``threads.par_for``
    workspace: TensorRef | None = None  # the scratch the schedule stage declared for this step (float32, 1-D)
    micro: set[str] = field(default_factory=set)  # micro-kernels the C calls (their bodies go in the prelude)
    loop_ir: list[str] = field(default_factory=list)  # listings of the loop IR the template printed (dumps)
    producer: Producer | None = None  # a producer computed inside this template, whose result it reads
    input_scale: InputScale | None = None  # Conv: its input 0 times this per image and channel
    # channels per block of an epilogue that the destination, or another tensor the epilogue reads, stores in
    # channel blocks (``kir.Buffer.block``); 0: none. A template that runs its epilogue per block of channels hands
    # ``store`` (image, channel block, channel in it, ...) where the destination is in blocks, else the channel as
    # ``cbase.split_channel`` writes it
    epilogue_block: int = 0

    def packed(self, array: np.ndarray) -> TensorRef:
        """A new weight buffer holding ``array`` (e.g. a weight rearranged at compile time for this kernel);
        returns its TensorRef. Only valid for operands whose ``const`` is set."""
        if self.pack is None:
            raise RuntimeError("this call cannot pack weights")
        return self.pack(np.ascontiguousarray(array))

    def emit(self, f: Func, store: Store, ptrs: dict[str, str] | None = None,
             inputs: dict[int, Callable[[Sequence[str]], str]] | None = None) -> str:
        """The C of loop-IR function ``f`` (``lir_c.print_c``; ``ptrs``: where its workspace is; ``inputs[k]``: the C
        of element ``idx`` of its opaque input ``k``, e.g. an ``Operand.at``; a producer's epilogues through its
        chain), its micro-kernels added to ``micro`` and its listing to ``loop_ir``."""
        chain = self.producer.chain if self.producer is not None else None
        text, micro = print_c(f, ptrs or {}, store, self.target.lanes, inputs, chain)
        self.micro.update(micro)
        self.loop_ir.append(print_func(f))
        return text

    def parallel(self, flops: float) -> bool:
        """Whether to mark a loop for the thread pool: more than one thread, and enough work (``flops``)
        that a dispatch (about a microsecond: ``schedule.loops.PAR_MIN_FLOPS``) is worth it."""
        return self.threads > 1 and flops >= PAR_MIN_FLOPS

    def attr(self, name: str, default=None):
        a = self.node.attributes.get(name)
        return default if a is None else a.value


TEMPLATES: dict[str, Callable[[TemplateCall], str]] = {}
NEEDS_BUFFERS: set[str] = set()


def register(*ops: str, needs_buffers: bool = False):
    def deco(fn):
        for op in ops:
            TEMPLATES[op] = fn
            if needs_buffers:
                NEEDS_BUFFERS.add(op)
        return fn
    return deco


def _load_all() -> None:
    """Import the template modules (each registers its ops)."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_load_all()
