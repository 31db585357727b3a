"""Lowering: graph IR + FusionPlan -> kernel IR (one kernel per group, explicit buffers, views).

What goes in: an onnx_ir model with static shapes (constants as initializers) and a FusionPlan of its graph.
What comes out: a verified ``Program`` (see ``dlcc.lower.kir``).

Algorithm, per group (in the plan's topological order):
1. Decide which values of the group are *materialized* (get a buffer): the group's outputs, the inputs of
   templates that address raw buffers (Conv, MatMul, pools: ``needs_buffers``), and the results of
   templates. Every other value is *inlined*: computed inside the loop nest of its consumer.
2. Epilogues: a template's result followed, in the group, by a chain of elementwise ops of the same shape
   (bias Add, folded BN Mul/Add, Relu, residual Add, ...) is not materialized; the template step stores the
   end of the chain instead (the template hands each finished element to the epilogue). A link is a value's
   single use, or several uses that meet again in one value through such ops (SiLU: x * sigmoid(x)).
3. Memory forwarding: a materialized output of Reshape/Flatten/Squeeze/Unsqueeze/Identity/Dropout is a
   view of its input's buffer (the input is materialized instead) — no copy, no step. Graph outputs are
   never views of temporaries: they get a copy step so the caller's output array holds the data.
4. Steps: one ``template`` step per template (placed where its epilogue ends), one ``loop`` step per
   other materialized value, in group order.
Then, program-wide, Concat in place: a Concat alone in its group whose inputs are each written by one
earlier kernel step and read only by that Concat becomes a no-op: each input becomes a view (offset,
strides) into the Concat's buffer, so the producers write straight into their slice.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx_ir as ir

from dlcc.errors import DlccError, TemplateError
from dlcc.fusion.plan import FusionPlan
from dlcc.lower.kir import Buffer, Kernel, Program, Step, verify_program
from dlcc.ops.backend import backend_ops
from dlcc.util import contiguous_strides, value_dtype, value_shape

__all__ = ["RESHAPE_LIKE", "lower", "op_key", "supported", "unsupported_ops"]

RESHAPE_LIKE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def op_key(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def supported(node: ir.Node) -> bool:
    key = op_key(node)
    if key == "Dropout":  # inference only: no mask, training_mode absent or a constant false
        if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
            return False
        mode = node.inputs[2] if len(node.inputs) > 2 else None
        if mode is not None and (mode.const_value is None or bool(mode.const_value.numpy().any())):
            return False
    ops = backend_ops()  # (what the C generator can print: dlcc.ops.backend)
    return (key in ops.elementwise or key in ops.indexed or key in ops.templates or key in RESHAPE_LIKE
            or key == "Constant")


def unsupported_ops(graph: ir.Graph) -> Counter:
    """Op type -> count of the nodes the C backend cannot compile (all of them, so one error lists all)."""
    return Counter(op_key(n) for n in graph if not supported(n))


def _is_template(node: ir.Node) -> bool:
    return op_key(node) in backend_ops().templates


def _elementwise(node: ir.Node) -> bool:
    return op_key(node) in backend_ops().elementwise or op_key(node) == "BatchNormalization"


class _Lowering:
    def __init__(self, model: ir.Model, plan: FusionPlan):
        self.model = model
        self.graph = model.graph
        self.plan = plan
        self.buffers: dict[int, Buffer] = {}
        self.value_buffer: dict[ir.Value, int] = {}
        self.consts: dict[ir.Value, np.ndarray] = {}
        self.graph_outputs = set(self.graph.outputs)
        self.graph_inputs = set(self.graph.inputs)
        for v in self.graph.initializers.values():
            if v.const_value is not None and v not in self.graph_inputs:
                self.consts[v] = v.const_value.numpy()
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 21))
        for n in self.graph:
            n.meta["dlcc.opset"] = opset  # templates whose semantics changed with the opset read it

    # ------------------------------------------------------------------ buffers
    def new_buffer(self, kind: str, dtype: str, shape, name: str = "", **kw) -> int:
        bid = len(self.buffers)
        self.buffers[bid] = Buffer(bid, kind, dtype, tuple(shape), name, **kw)
        return bid

    def buffer_of(self, v: ir.Value) -> int:
        """The buffer of ``v``, created on first use (inputs, weights and temps; views are set explicitly)."""
        bid = self.value_buffer.get(v)
        if bid is not None:
            return bid
        if v in self.consts:
            bid = self.new_buffer("weight", value_dtype(v), value_shape(v), v.name, data=self.consts[v])
        elif v in self.graph_inputs:
            bid = self.new_buffer("input", value_dtype(v), value_shape(v), v.name)
        elif v in self.graph_outputs:
            bid = self.new_buffer("output", value_dtype(v), value_shape(v), v.name)
        else:
            bid = self.new_buffer("temp", value_dtype(v), value_shape(v), v.name)
        self.value_buffer[v] = bid
        return bid

    # ------------------------------------------------------------------ groups
    def lower_group(self, group, kid: int) -> Kernel | None:
        nodes = [n for n in group.nodes if n.op_type != "Constant"]
        for n in group.nodes:
            if n.op_type == "Constant":
                for v in n.outputs:
                    self.consts[v] = _constant_value(n)
        if not nodes:
            return None
        members = set(nodes)
        order = {n: i for i, n in enumerate(nodes)}

        def uses_in(v: ir.Value) -> list[ir.Node]:
            return [u.node for u in v.uses() if u.node in members]

        need: set[ir.Value] = {v for v in group.outputs if v not in self.consts}
        for n in nodes:
            if op_key(n) in backend_ops().needs_buffers:
                need.update(v for v in n.inputs if v is not None)
            for extra in n.outputs[1:] if _is_template(n) else ():
                if extra.uses() or extra in self.graph_outputs:
                    raise TemplateError(f"{n.op_type}: only output 0 is supported by the C backend "
                                    f"(output {extra.index()} is used)")
        changed = True
        while changed:  # a reshape-like output held in a buffer is a view: its input gets the buffer
            changed = False
            for n in nodes:
                if op_key(n) in RESHAPE_LIKE and n.outputs[0] in need and n.inputs[0] not in need:
                    need.add(n.inputs[0])
                    changed = True
        def fits(c: ir.Node, shape) -> bool:
            return _elementwise(c) and len(c.outputs) == 1 and value_shape(c.outputs[0]) == shape

        def region_from(cur: ir.Value, anchor: ir.Node) -> list[ir.Node] | None:
            """The elementwise nodes (group order) through which the several uses of ``cur`` meet again in
            one value (SiLU: x * sigmoid(x)), each reading only values of the region and values computed
            before ``anchor``; None when they do not meet before leaving the group or the shape."""
            live, region, shape = {cur}, [], value_shape(cur)
            for c in nodes[order[cur.producer()] + 1:]:
                ins = [v for v in c.inputs if v is not None]
                if not any(v in live for v in ins):
                    continue
                if not fits(c, shape) or any(v not in live and v.producer() in members
                                             and order[v.producer()] >= order[anchor] for v in ins):
                    return None
                region.append(c)
                live.add(c.outputs[0])
                read = {v for r in region for v in r.inputs}
                live = {v for v in live if not (v in read and all(u.node in region for u in v.uses()))}
                if len(live) == 1:
                    return region
                if any(v in need or any(u.node not in members for u in v.uses()) for v in live):
                    return None
            return None

        epilogue: dict[ir.Node, list[ir.Node]] = {}  # a template's epilogue nodes, in group order
        for n in nodes:
            if not _is_template(n):
                continue
            cur, shape, chain = n.outputs[0], value_shape(n.outputs[0]), []
            while cur not in need:
                users = uses_in(cur)
                if len(users) == 1 and len(cur.uses()) == 1 and fits(users[0], shape):
                    chain.append(users[0])
                elif len(cur.uses()) > 1 and (region := region_from(cur, n)) is not None:
                    chain += region
                else:
                    break
                cur = chain[-1].outputs[0]
            need.add(cur)
            epilogue[n] = chain
        epilogue_end = {n: chain[-1].outputs[0] if chain else n.outputs[0] for n, chain in epilogue.items()}
        chain_ends = {end for a, end in epilogue_end.items() if end is not a.outputs[0]}

        steps: list[tuple[int, Step]] = []
        kernel = Kernel(kid, group.id, [], nodes=nodes)
        for n in nodes:
            key = op_key(n)
            if _is_template(n):
                end = epilogue_end[n]
                steps.append((order[end.producer()], Step("template", [end], n, [n, *epilogue[n]])))
                continue
            if key in RESHAPE_LIKE and n.outputs[0] in need:
                y, x = n.outputs[0], n.inputs[0]
                if y in self.graph_outputs:  # in node order: later steps of the group may read y's buffer
                    steps.append((order[n], Step("copy", [y], None, [], (self.buffer_of(y), self.buffer_of(x)))))
                    continue
                base = self.buffer_of(x)
                if not self.buffers[base].contiguous:
                    raise DlccError("internal: a reshape of a strided view")
                self.value_buffer[y] = self.new_buffer("view", value_dtype(y), value_shape(y), y.name, base=base)
                continue
            for v in n.outputs:
                if v in need and v not in chain_ends:
                    steps.append((order[n], Step("loop", [v], None, [n])))
        steps.sort(key=lambda t: t[0])
        kernel.steps = [s for _, s in steps]
        return kernel

    # ------------------------------------------------------------------ program
    def run(self) -> Program:
        kernels = []
        for g in self.plan.groups:
            k = self.lower_group(g, len(kernels))
            if k is not None:
                kernels.append(k)
        inputs = [self.buffer_of(v) for v in self.graph.inputs]
        outputs: list[int] = []
        tail = Kernel(len(kernels), -1, [], nodes=[])
        for v in self.graph.outputs:
            bid = self.buffer_of(v)
            if bid in outputs or self.buffers[bid].kind != "output":
                # the same value listed twice, or a graph input/weight returned as is: copy into a fresh buffer
                dst = self.new_buffer("output", value_dtype(v), value_shape(v), v.name)
                tail.steps.append(Step("copy", [v], None, [], (dst, bid)))
                tail.writes.append(dst)
                tail.reads.append(bid)
                bid = dst
            outputs.append(bid)
        kernels = [k for k in kernels if k.steps]  # groups of views only: nothing to run
        for i, k in enumerate(kernels):
            k.id = i
            self._fill_rw(k)
        tail.id = len(kernels)
        if tail.steps:
            kernels.append(tail)
        program = Program(self.buffers, kernels, inputs, outputs, self.value_buffer,
                          [v.name for v in self.graph.inputs], [v.name for v in self.graph.outputs], self.consts,
                          dict(self.model.opset_imports))
        _concat_in_place(program)
        _in_place(program)
        self._scratch(program)
        verify_program(program)
        return program

    def _scratch(self, p: Program) -> None:
        """Template steps whose destination is strided (a Concat slice) or not float32 accumulate in a temp."""
        for k in p.kernels:
            for s in k.steps:
                if s.kind != "template":
                    continue
                dst = p.buffers[p.value_buffer[s.outputs[0]]]
                shape = value_shape(s.anchor.outputs[0])
                if dst.dtype == "float32" and p.window(dst.id)[2] == contiguous_strides(dst.shape) \
                        and dst.shape == shape:
                    continue
                s.scratch = self.new_buffer("temp", "float32", shape, "scratch")
                k.writes.append(s.scratch)

    def _fill_rw(self, k: Kernel) -> None:
        members = set(k.nodes)
        writes: list[int] = []
        reads: list[int] = []
        for s in k.steps:
            if s.copy:
                writes.append(s.copy[0])
                reads.append(s.copy[1])
                continue
            writes.extend(self.buffer_of(v) for v in s.outputs)
        for n in k.nodes:
            for v in n.inputs:
                if v is None or (v.producer() in members and v not in self.value_buffer):
                    continue
                if v in self.consts and v not in self.value_buffer and _scalar(self.consts[v]):
                    continue  # inlined as a literal
                bid = self.buffer_of(v)
                if bid not in writes:
                    reads.append(bid)
        k.writes = list(dict.fromkeys(writes))
        k.reads = list(dict.fromkeys(reads))


def _scalar(a: np.ndarray) -> bool:
    return a.size == 1


def _constant_value(node: ir.Node) -> np.ndarray:
    for name in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        a = node.attributes.get(name)
        if a is None:
            continue
        v = a.value
        if name == "value":
            return v.numpy()
        dtype = np.float32 if "float" in name else np.int64
        return np.asarray(v, dtype=dtype)
    raise DlccError("a Constant node with a string or sparse value is not supported by the C backend")


CONCAT_SHARED = True  # Concat inputs that other steps read too, or that are Concats in place themselves (DenseNet)


def _concat_in_place(p: Program) -> None:
    """Drop Concat loop steps whose inputs can be slice views of the output: each input is a temporary
    written by an earlier kernel, so its producer writes straight into the slice, and whatever else reads it reads
    the slice (``CONCAT_SHARED``; without it, only inputs the Concat alone reads). An input that is itself a Concat
    done in place (a chain of Concats each taking the one before: DenseNet's dense blocks, which copied every
    earlier layer's features once per layer) becomes a slice too, its own slices then slices of the outer result
    (their strides the outer one's)."""
    writer: dict[int, Kernel] = {}
    readers: Counter = Counter()
    for k in p.kernels:
        for b in k.writes:
            writer[b] = k
        for b in k.reads:
            readers[b] += 1
    based = {b.base for b in p.buffers.values() if b.kind == "view"}
    concats: set[int] = set()  # (outputs of the Concats done in place so far: their slices are views of them)

    def slices_only(bid: int, axis: int) -> bool:
        """Are all the views of ``bid`` (and theirs) slices of it along ``axis``, with its strides?"""
        b = p.buffers[bid]
        return all(v.strides == b.strides and len(v.shape) == len(b.shape)
                   and all(d1 == d2 for i, (d1, d2) in enumerate(zip(v.shape, b.shape, strict=True)) if i != axis)
                   and slices_only(v.id, axis)
                   for v in p.buffers.values() if v.kind == "view" and v.base == bid)

    def nested_ok(bid: int, axis: int) -> bool:
        """Is ``bid`` an earlier Concat's result done in place along ``axis``, all of whose views are its slices
        (so that they can take the outer result's strides)?"""
        b = p.buffers[bid]
        return bid in concats and b.strides == contiguous_strides(b.shape) and slices_only(bid, axis)

    def loop_read(bid: int, concat: Step) -> bool:
        """Do only loop steps (which read any strides) read buffer ``bid``, but ``concat``? (A template may ask for
        a contiguous input: a slice's batch stride is the whole result's.)"""
        vals = {v for v, b in p.value_buffer.items() if b == bid}
        return all(s.kind == "loop" for k in p.kernels if bid in k.reads for s in k.steps
                   if s is not concat and any(v in vals for n in s.nodes for v in n.inputs))

    def restride(bid: int, strides: tuple[int, ...]) -> None:
        for v in p.buffers.values():
            if v.kind == "view" and v.base == bid:
                v.strides = strides
                restride(v.id, strides)
    for k in p.kernels:
        for step in list(k.steps):
            node = step.nodes[0] if step.kind == "loop" and len(step.nodes) == 1 else None
            if node is None or op_key(node) != "Concat":
                continue
            out = p.buffers[p.value_buffer[node.outputs[0]]]
            ins = [p.value_buffer.get(v) for v in node.inputs]
            ok = out.kind in ("temp", "output") and out.contiguous and len(set(ins)) == len(ins)
            axis = node.attributes["axis"].value
            axis = axis + len(out.shape) if axis < 0 else axis
            for bid in ins:
                b = p.buffers.get(bid) if bid is not None else None
                ok = (ok and b is not None and b.kind == "temp" and (bid in writer or bid in concats)
                      and writer.get(bid) is not k and b.dtype == out.dtype
                      and ((readers[bid] == 1 and bid not in based)
                           or (CONCAT_SHARED and loop_read(bid, step)
                               and (bid not in based or nested_ok(bid, axis)))))
            if not ok:
                continue
            start = 0
            for bid in ins:
                b = p.buffers[bid]
                b.kind, b.base, b.offset, b.strides = "view", out.id, start * out.strides[axis], out.strides
                restride(bid, out.strides)
                start += b.shape[axis]
                k.reads.remove(bid)
            concats.add(out.id)
            k.steps.remove(step)
            k.writes.remove(out.id)
            # the kernel's other steps that read the Concat's result now read what earlier kernels wrote into it
            # (without this read its liveness began after them, and a later workspace could reuse its bytes)
            if any(node.outputs[0] in n.inputs for n in k.nodes if n is not node) and out.id not in k.reads:
                k.reads.append(out.id)
    p.kernels = [k for k in p.kernels if k.steps]
    for i, k in enumerate(p.kernels):
        k.id = i


def _identity_leaves(v: ir.Value, p: Program) -> tuple[set, set]:
    """The materialized values the loop computing ``v`` reads at ``v``'s own index (through elementwise
    ops of the same shape only), and those it reads any other way."""
    shape = value_shape(v)
    same, other = set(), set()
    stack = [(x, True) for x in v.producer().inputs if x is not None]
    producer_ok = op_key(v.producer()) in backend_ops().elementwise
    stack = [(x, producer_ok and value_shape(x) == shape) for x, _ in stack]
    while stack:
        x, ident = stack.pop()
        if x in p.value_buffer or x.producer() is None:
            (same if ident else other).add(x)
            continue
        node = x.producer()
        keep = ident and op_key(node) in backend_ops().elementwise
        stack.extend((y, keep and value_shape(y) == shape) for y in node.inputs if y is not None)
    return same, other


def _in_place(p: Program) -> None:
    """An elementwise kernel writes its result over an input that dies there (same shape and dtype, read
    only at the element being written): the output becomes a view of that input's buffer."""
    last: dict[int, int] = {}
    for i, k in enumerate(p.kernels):
        for b in (*k.reads, *k.writes):
            last[p.root(b).id] = i
    based = {b.base for b in p.buffers.values() if b.kind == "view"}
    for i, k in enumerate(p.kernels):
        if len(k.steps) != 1 or k.steps[0].kind != "loop":
            continue
        v = k.steps[0].outputs[0]
        out = p.buffers[p.value_buffer[v]]
        if out.kind != "temp" or out.id in based:
            continue
        same, other = _identity_leaves(v, p)
        for x in sorted(same - other, key=lambda x: p.value_buffer.get(x, -1)):
            bid = p.value_buffer.get(x)
            b = p.buffers.get(bid) if bid is not None else None
            if (b is None or b.kind != "temp" or b.id in based or b.dtype != out.dtype or b.shape != out.shape
                    or last.get(b.id) != i or bid in k.writes):
                continue
            out.kind, out.base, out.offset, out.strides = "view", b.id, 0, b.strides
            based.add(b.id)
            break


def lower(model: ir.Model, plan: FusionPlan) -> Program:
    """Lower ``model``'s graph (with ``plan`` made on it) to a verified kernel-IR Program."""
    return _Lowering(model, plan).run()
