"""A slow numpy interpreter for kernel IR, so a wrong result can be blamed on one stage.

What goes in: a ``Program``, its placement (a ``dlcc.memory.MemoryPlan``, or anything with ``arena_bytes``
and ``offsets``: buffer id -> byte offset in the arena) and input arrays.
What comes out: the output arrays, computed kernel by kernel and step by step exactly as the C does it —
through buffers placed in one simulated arena at the planned offsets, views as numpy strided views — but
with each op evaluated by onnx's reference implementation instead of generated C.

So: interpreter == onnxruntime but C != interpreter  -> the C generator (or a template) is wrong;
interpreter != onnxruntime -> lowering, memory forwarding or the memory plan is wrong (an overlap in the
plan shows up as corrupted values here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import onnx
import onnx_ir as ir
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from dlcc.errors import DlccError
from dlcc.lower.kir import Program

__all__ = ["interpret"]


class Placement(Protocol):
    """What the interpreter reads of a memory plan (``dlcc.memory.MemoryPlan`` is one; the memory stage
    comes after lowering, so it is not imported here)."""

    arena_bytes: int
    offsets: Mapping[int, int]


class ChannelShuffle(OpRun):
    op_domain = "dlcc"

    def _run(self, x, group=None):
        n, c = x.shape[:2]
        y = x.reshape(n, group, c // group, *x.shape[2:]).swapaxes(1, 2)
        return (y.reshape(x.shape),)


def attention_reference(q, k, v, mask=None, *, num_heads: int, scale: float, causal: int = 0, fill: float = 0.0,
                        layout=(1, 2, 1, 1), head_size: int = 0, offsets=(0, 0, 0)) -> np.ndarray:
    """dlcc::Attention in numpy (float32 result): ``softmax(scale * Q K^T [causal: fill above the diagonal]
    + mask) V``, each operand in its ``layout`` code (0: [B, S, H*D], 1: [B, H, S, D], 2: [B, H, D, S])."""
    def heads(x, code, off):
        if code == 0:
            d = head_size or x.shape[2] // num_heads
            b, s = x.shape[:2]
            return x[:, :, off:off + num_heads * d].reshape(b, s, num_heads, d).transpose(0, 2, 1, 3)
        return x.swapaxes(-1, -2) if code == 2 else x

    qh, kh, vh = (heads(x, c, o) for x, c, o in zip((q, k, v), layout[:3], offsets, strict=True))
    s = np.matmul(qh, kh.swapaxes(-1, -2)) * np.float32(scale)
    sq, sk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None] + sk - sq, np.float32(fill), s)
    if mask is not None:
        s = s + mask
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    out = np.matmul(e / e.sum(axis=-1, keepdims=True), vh).astype(np.float32)
    if layout[3] == 0:
        b, h, n, d = out.shape
        out = out.transpose(0, 2, 1, 3).reshape(b, n, h * d)
    return out


class Attention(OpRun):
    op_domain = "dlcc"

    def _run(self, q, k, v, mask=None, num_heads=None, scale=None, causal=None, fill=None, layout=None,
             head_size=None, offsets=None, **_onnx_defaults):
        # (onnx's ReferenceEvaluator may add the default attributes of the standard ai.onnx Attention of the same
        # name, e.g. right_window_size with onnx 1.23: not dlcc::Attention's, ignored)
        return (attention_reference(q, k, v, mask, num_heads=num_heads, scale=scale, causal=causal or 0,
                                    fill=fill or 0.0, layout=tuple(layout) if layout is not None else (1, 2, 1, 1),
                                    head_size=head_size or 0,
                                    offsets=tuple(offsets) if offsets is not None else (0, 0, 0)),)


def _evaluator(node: ir.Node, opset: dict[str, int]) -> ReferenceEvaluator:
    proto = ir.serde.serialize_node(node)
    ins = [onnx.helper.make_empty_tensor_value_info(n) for n in proto.input if n]
    outs = [onnx.helper.make_empty_tensor_value_info(n) for n in proto.output if n]
    graph = onnx.helper.make_graph([proto], "node", ins, outs)
    imports = [onnx.helper.make_opsetid(d, v) for d, v in opset.items()]
    model = onnx.helper.make_model(graph, opset_imports=imports)
    return ReferenceEvaluator(model, new_ops=[ChannelShuffle, Attention])


def interpret(program: Program, memory: Placement, feeds: Mapping[str, np.ndarray],
              opset: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    opset = dict(opset or program.opset or {"": 21})
    arena = np.zeros(max(memory.arena_bytes, 1), dtype=np.uint8)
    roots: dict[int, np.ndarray] = {}
    for b in program.buffers.values():
        if b.kind == "input":
            name = program.input_names[program.inputs.index(b.id)]
            if name not in feeds:
                raise DlccError(f"missing input '{name}'")
            roots[b.id] = np.ascontiguousarray(feeds[name], dtype=b.dtype).reshape(-1)
        elif b.kind == "output":
            roots[b.id] = np.zeros(b.size, dtype=b.dtype)
        elif b.kind == "weight":
            roots[b.id] = np.ascontiguousarray(b.data, dtype=b.dtype).reshape(-1)
        elif b.kind == "temp" and b.id in memory.offsets:
            off = memory.offsets[b.id]
            roots[b.id] = arena[off:off + b.nbytes].view(b.dtype)

    def array(bid: int) -> np.ndarray:
        b = program.buffers[bid]
        root, offset, strides = program.window(bid)
        flat = roots[root.id]
        item = flat.itemsize
        if b.block:  # (N, C // block, block, H, W): reshaped to (N, C, H, W) by ``load`` and ``put``
            n, c, h, w = b.shape
            return np.lib.stride_tricks.as_strided(flat[offset:], (n, c // b.block, b.block, h, w),
                                                   [strides[0] * item, strides[1] * item, item, strides[2] * item,
                                                    strides[3] * item])
        return np.lib.stride_tricks.as_strided(flat[offset:], b.shape, [s * item for s in strides])

    def load(bid: int) -> np.ndarray:
        return np.array(array(bid)).reshape(program.buffers[bid].shape)

    def put(bid: int, x: np.ndarray) -> None:
        a = array(bid)
        a[...] = np.asarray(x).reshape(a.shape) if program.buffers[bid].block else x

    evaluators: dict[ir.Node, ReferenceEvaluator] = {}

    def run_node(node: ir.Node, env: dict) -> None:
        ev = evaluators.get(node)
        if ev is None:
            ev = evaluators[node] = _evaluator(node, opset)
        args = {v.name: value(v, env) for v in node.inputs if v is not None}
        results = ev.run(None, args)
        for v, r in zip([o for o in node.outputs if o.name], results, strict=False):
            env[v] = np.asarray(r)

    def value(v: ir.Value, env: dict) -> np.ndarray:
        if v in env:
            return env[v]
        if v in program.value_buffer and (v.producer() is None or v in written):
            return load(program.value_buffer[v])
        if v in program.consts:
            return program.consts[v]
        producer = v.producer()
        if producer is None:
            raise DlccError(f"interpreter: no value for '{v.name}'")
        run_node(producer, env)
        return env[v]

    written: set[ir.Value] = set()
    for k in program.kernels:
        env: dict = {}
        # a kernel's scratch (workspace, accumulators) is overwritten by it: NaN here, so that a memory plan that
        # let scratch share bytes with a buffer still live shows in the results
        for step in k.steps:
            for bid in (step.workspace, step.scratch):
                if bid is not None and bid in roots:
                    roots[bid][...] = np.nan
        for step in k.steps:
            if step.kind == "copy":
                dst, src = step.copy
                put(dst, load(src).reshape(program.buffers[dst].shape))
                continue
            if step.kind == "template":
                for n in step.nodes:
                    run_node(n, env)
            v = step.outputs[0]
            if step.kind == "loop":
                run_node(v.producer(), env)
            put(program.value_buffer[v], env[v])
            written.add(v)
            # values that are views of this buffer are now readable too
            for other, bid in program.value_buffer.items():
                if program.buffers[bid].kind == "view" and program.buffers[bid].base == program.value_buffer[v]:
                    written.add(other)
    return {name: load(bid) for name, bid in zip(program.output_names, program.outputs, strict=True)}
