"""The rewrite-rule driver: rules are (name, pattern, check, rewrite); only the driver mutates the graph.

What goes in: a model and a rule set. What comes out: the model rewritten to a fixpoint, and counts of
rules fired and of refusals per (rule, reason).

A rule:
- ``pattern(node) -> dict | None``: does the structure around ``node`` (the root) match? Returns the
  captures (other nodes, values, constants) or None. Cheap and side-effect free.
- ``check(node, captures) -> str | None``: the guards. Returns why the rule refuses (shown in ``--stats``
  and in tests), or None to go ahead.
- ``rewrite(node, captures, b) -> list[Value | None] | None``: builds replacement values for the root's
  outputs with the builder ``b`` (new nodes and constants are only *recorded*, and so are edits of a
  producer only the root reads: ``b.set_input``, ``b.set_const``); None declines.

The driver, in a few lines:

    repeat (at most max_sweeps times, else PassError: the rule set cycles):
        for node in graph, in order:                       # skip nodes removed in this sweep
            for rule in rules indexed by node.op_type:
                m = rule.pattern(node); if m is None: continue
                why = rule.check(node, m); if why: count refusal; continue
                new = rule.rewrite(node, m, builder); if new is None: continue
                apply: insert recorded nodes before the root, register constants, make the recorded
                       edits of producers' inputs and initializers, reroute every use
                       of the root's outputs (graph outputs keep their names), remove the root and
                       any producer left without uses
                count the rule; go to the next node
    until a sweep fires nothing

Invariant: a rewrite never changes the model's input/output names or types.
"""

from __future__ import annotations

import itertools
import math
import re
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dlcc.errors import PassError
from dlcc.passes.manager import Pass


@dataclass(frozen=True)
class Rule:
    name: str
    roots: tuple[str, ...]  # op types (default domain) the pattern's root can have
    pattern: Callable[[ir.Node], dict | None]
    check: Callable[[ir.Node, dict], str | None] = lambda node, m: None
    rewrite: Callable[[ir.Node, dict, Builder], Sequence[ir.Value | None] | None] = lambda n, m, b: None
    doc: str = ""
    family: str = "other"
    exact: bool = True  # False: reassociates or otherwise changes floating-point results
    min_opset: int = 1
    domain: str = ""  # the root's domain ("" is the default ONNX domain, also spelled "ai.onnx")
    # a promise of the pattern, used to skip it cheaply: it only matches when some input of the root is
    # produced by a default-domain node of one of these op types (empty: no such promise)
    input_ops: frozenset[str] = frozenset()


class Builder:
    """Records the nodes and constants a rewrite creates; the driver inserts them."""

    def __init__(self, graph: ir.Graph, names: NameGen, opset: int) -> None:
        self.graph = graph
        self.names = names
        self.opset = opset
        self.nodes: list[ir.Node] = []
        self.constants: list[ir.Value] = []
        self.detached: list[list[ir.Value | None]] | None = None  # inputs of nodes while not chosen
        self.input_changes: list[tuple[ir.Node, int, ir.Value]] = []
        self.const_changes: list[tuple[ir.Value, ir.TensorProtocol]] = []

    def op(self, op_type: str, inputs: Sequence[ir.Value | None], attributes: dict | None = None, *,
           domain: str = "", num_outputs: int = 1, hint: str = "", dtype: ir.DataType | None = None,
           shape: Sequence | None = None) -> ir.Value:
        """Add a node; returns its (first) output. ``dtype``/``shape`` annotate the first output."""
        outputs = [ir.Value(name=self.names.new(hint or op_type)) for _ in range(num_outputs)]
        node = ir.Node(domain, op_type, inputs, attributes=_attrs(attributes or {}), outputs=outputs,
                       name=self.names.new("n_" + op_type))
        if dtype is not None:
            outputs[0].dtype = dtype
        if shape is not None:
            outputs[0].shape = ir.Shape(list(shape))
        self.nodes.append(node)
        return outputs[0] if num_outputs == 1 else tuple(outputs)

    def set_input(self, node: ir.Node, index: int, value: ir.Value) -> None:
        """Record that input ``index`` of the existing ``node`` becomes ``value`` (the inputs grow when
        ``index`` is past the last one). For a producer whose outputs only the root reads: the rewrite then
        returns that producer's outputs as the root's replacements, and the producer is edited instead of
        rebuilt. ``value`` must exist before ``node`` runs (a constant or an existing value), not be a new
        node's output. The driver applies the change with the rewrite, and drops the replaced inputs if
        nothing else reads them."""
        self.input_changes.append((node, index, value))

    def set_const(self, value: ir.Value, array) -> None:
        """Record that the initializer ``value`` holds ``array`` (same shape and dtype) from now on. For an
        initializer only the producer that ``set_input`` would edit reads: it keeps its name and no new one
        is made. The driver applies the change with the rewrite."""
        self.const_changes.append((value, as_tensor(array, value.name)))

    def const(self, array, hint: str = "const") -> ir.Value:
        array = np.asarray(array)
        name = self.names.new(hint)
        tensor = as_tensor(array, name)
        # the tensor's own (frozen) shape, as onnx_ir gives loaded initializers
        v = ir.Value(name=name, shape=tensor.shape, type=ir.TensorType(tensor.dtype), const_value=tensor)
        self.constants.append(v)
        return v


_UNSAFE = re.compile(r"[^\w./]")  # \w: what str.isalnum() accepts, and "_"


class NameGen:
    """Unique value/node names: never collides with a name already in the graph. The graph's names are
    collected on first use (most driver runs fire nothing and need none)."""

    def __init__(self, graph: ir.Graph) -> None:
        self.graph = graph
        self._used: set[str] | None = None
        self.counter = itertools.count()

    @property
    def used(self) -> set[str]:
        if self._used is None:
            self._used = {v.name for v in _values(self.graph)} | {n.name for n in self.graph}
        return self._used

    def new(self, hint: str) -> str:
        base = _UNSAFE.sub("_", (hint or "v")[:48])
        while True:
            name = f"{base}__{next(self.counter)}"
            if name not in self.used:
                self.used.add(name)
                return name


def _values(graph: ir.Graph) -> Iterable[ir.Value]:
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def _attrs(attributes: dict) -> list[ir.Attr]:
    out = []
    for k, v in attributes.items():
        if isinstance(v, ir.Attr):
            out.append(v)
        elif isinstance(v, bool | int | np.integer):
            out.append(ir.AttrInt64(k, int(v)))
        elif isinstance(v, float | np.floating):
            out.append(ir.AttrFloat32(k, float(v)))
        elif isinstance(v, str):
            out.append(ir.AttrString(k, v))
        elif isinstance(v, ir.TensorProtocol):
            out.append(ir.AttrTensor(k, v))
        elif isinstance(v, list | tuple) and all(isinstance(x, int | np.integer) for x in v):
            out.append(ir.AttrInt64s(k, [int(x) for x in v]))
        elif isinstance(v, list | tuple) and all(isinstance(x, float | int) for x in v):
            out.append(ir.AttrFloat32s(k, [float(x) for x in v]))
        elif isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
            out.append(ir.AttrStrings(k, list(v)))
        else:
            raise TypeError(f"attribute {k}: cannot convert {type(v).__name__}")
    return out


@dataclass
class RewriteStats:
    fired: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)  # (rule, reason) -> count


# Tests set this: every pattern then runs, and a match outside its rule's ``input_ops`` promise raises.
CHECK_PROMISES = False


def apply_rules(model: ir.Model, rules: Sequence[Rule], *, max_sweeps: int = 50,
                stats: RewriteStats | None = None, graphs: Sequence[ir.Graph] | None = None,
                choose_best: bool = False) -> bool:
    """Run ``rules`` to a fixpoint over the main graph (and ``graphs`` if given); returns changed.

    With ``choose_best``, every rule that applies at a node builds its rewrite, and the one whose
    estimated work saved (``rewrite_savings``: FLOPs + bytes of the nodes it removes minus those it adds)
    is largest is applied; ties go to the rule name, so the result does not depend on the rules' order.
    Otherwise the first rule that applies wins (cheap; for rule sets whose rules never overlap)."""
    stats = stats or RewriteStats()
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    active = [r for r in rules if opset >= r.min_opset]
    by_op: dict[tuple[str, str], list[Rule]] = {}
    for r in active:
        for op in r.roots:
            by_op.setdefault((r.domain, op), []).append(r)
    changed = False
    for graph in graphs or [model.graph]:
        names = NameGen(graph)
        for sweep in range(max_sweeps + 1):
            fired_now: Counter = Counter()
            for node in list(graph):
                if node.graph is not graph:
                    continue
                domain = "" if node.domain == "ai.onnx" else node.domain
                candidates = []
                feeding = None  # op types of the default-domain producers of the node's inputs
                for rule in by_op.get((domain, node.op_type), ()):
                    if rule.input_ops:
                        if feeding is None:
                            feeding = _feeding_ops(node)
                        if feeding.isdisjoint(rule.input_ops) and not CHECK_PROMISES:
                            continue
                    m = rule.pattern(node)
                    if m is None:
                        continue
                    if CHECK_PROMISES and rule.input_ops and feeding.isdisjoint(rule.input_ops):
                        raise AssertionError(f"rule {rule.name} matched a {node.op_type} fed by {sorted(feeding)}, "
                                             f"outside its input_ops {sorted(rule.input_ops)}")
                    why = rule.check(node, m)
                    if why:
                        stats.refused[(rule.name, why)] += 1
                        continue
                    b = Builder(graph, names, opset)
                    new = rule.rewrite(node, m, b)
                    if new is None:
                        _detach(b)  # a declined rewrite's nodes must not count as uses
                        continue
                    candidates.append((rule, b, list(new)))
                    if not choose_best:
                        break
                    # built nodes register uses on their inputs: detach them so that the next rule's
                    # pattern sees the graph as it is (single_use, savings); the winner is re-attached
                    b.detached = _detach(b)
                if not candidates:
                    continue
                if choose_best and len(candidates) > 1:
                    rule, b, new = max(candidates, key=lambda c: (_savings_detached(node, c[1], c[2]),
                                                                  c[0].name))
                else:
                    rule, b, new = candidates[0]
                if b.detached is not None:
                    _attach(b, b.detached)
                _apply(graph, node, new, b)
                fired_now[rule.name] += 1
            if not fired_now:
                break
            changed = True
            stats.fired.update(fired_now)
            if sweep == max_sweeps:
                raise PassError(f"rewrite rules did not reach a fixpoint in {max_sweeps} sweeps; still "
                                f"firing: {', '.join(sorted(fired_now))} (a dlcc bug: the rule set cycles)")
    return changed


def _feeding_ops(node: ir.Node) -> set[str]:
    ops = set()
    for v in node.inputs:
        p = v.producer() if v is not None else None
        if p is not None and p.domain in ("", "ai.onnx"):
            ops.add(p.op_type)
    return ops


def _detach(b: Builder) -> list[list[ir.Value | None]]:
    saved = []
    for n in b.nodes:
        saved.append(list(n.inputs))
        for i in range(len(n.inputs)):
            n.replace_input_with(i, None)
    return saved


def _attach(b: Builder, saved: list[list[ir.Value | None]]) -> None:
    for n, inputs in zip(b.nodes, saved, strict=True):
        for i, v in enumerate(inputs):
            n.replace_input_with(i, v)


def _savings_detached(root: ir.Node, b: Builder, new_values: Sequence[ir.Value | None]) -> float:
    """rewrite_savings for a detached candidate: attached while it is measured, detached again after."""
    saved = b.detached
    if saved is None:
        return rewrite_savings(root, b, new_values)
    _attach(b, saved)
    try:
        return rewrite_savings(root, b, new_values)
    finally:
        _detach(b)


def node_cost(node: ir.Node, fallback: ir.Value | None = None) -> float:
    """Work of one node: FLOPs + bytes moved (ops.cost), or the elements of ``fallback`` when its shapes
    are not known (new nodes built by a rewrite often carry no shapes yet)."""
    from dlcc.ops.cost import node_bytes, node_flops

    flops, nbytes = node_flops(node), node_bytes(node)
    if flops is not None and nbytes is not None:
        return float(flops + nbytes)
    shape = static_shape(fallback) if fallback is not None else None
    return float(2 * math.prod(shape)) if shape is not None else 1.0


def rewrite_savings(root: ir.Node, b: Builder, new_values: Sequence[ir.Value | None]) -> float:
    """Estimated work a rewrite saves: the root and the producers that only it uses, minus what it adds."""
    removed = {root}
    stack = [v.producer() for v in root.inputs if v is not None and v.producer() is not None]
    while stack:
        p = stack.pop()
        if p in removed or p.graph is not root.graph:
            continue
        if all(not o.is_graph_output() and all(u.node in removed for u in o.uses()) for o in p.outputs):
            kept_alive = any(v is o for v in new_values for o in p.outputs) or any(
                inp is o for n in b.nodes for inp in n.inputs for o in p.outputs)
            if not kept_alive:
                removed.add(p)
                stack.extend(v.producer() for v in p.inputs if v is not None and v.producer() is not None)
    out = root.outputs[0] if root.outputs else None
    return sum(node_cost(n, out) for n in removed) - sum(node_cost(n, out) for n in b.nodes)


def _apply(graph: ir.Graph, root: ir.Node, new_values: list[ir.Value | None], b: Builder) -> None:
    if len(new_values) != len(root.outputs):
        raise PassError(f"a rewrite of {root.op_type} returned {len(new_values)} values for "
                        f"{len(root.outputs)} outputs (a dlcc bug)")
    for v in b.constants:
        graph.register_initializer(v)
    if b.nodes:
        graph.insert_before(root, b.nodes)
    for v, tensor in b.const_changes:
        if not v.is_initializer() or v.is_graph_input() or v.is_graph_output() or len(v.uses()) != 1:
            raise PassError(f"a rewrite of {root.op_type} changed '{v.name}', which is not an initializer only "
                            "one node reads (a dlcc bug)")
        v.const_value = tensor
    replaced = []
    for node, i, v in b.input_changes:
        if v.producer() in b.nodes:
            raise PassError(f"a rewrite of {root.op_type} made {node.op_type} read a value computed after it "
                            "(a dlcc bug)")
        if i >= len(node.inputs):
            node.resize_inputs(i + 1)
        if node.inputs[i] is not None:
            replaced.append(node.inputs[i])
        node.replace_input_with(i, v)
    for old, new in zip(root.outputs, new_values, strict=True):
        if new is None:
            if old.uses() or old.is_graph_output():
                raise PassError(f"a rewrite of {root.op_type} dropped output '{old.name}' that is still used")
            continue
        if new.dtype is None and old.dtype is not None:  # a None dtype would make a Tensor(None) type
            new.dtype = old.dtype
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
        if old.is_graph_output():
            _take_graph_output(graph, root, old, new, b)
        else:
            old.replace_all_uses_with(new)
    inputs = [v for v in root.inputs if v is not None]
    graph.remove(root, safe=True)
    _remove_dead_producers(graph, inputs + replaced)


def _take_graph_output(graph: ir.Graph, root: ir.Node, old: ir.Value, new: ir.Value, b: Builder) -> None:
    """``new`` replaces graph output ``old`` and takes its name (the model's interface stays the same)."""
    if new.is_graph_input() or new.is_initializer() or new.is_graph_output():
        # an input/initializer/other output cannot also take this output's name: copy through Identity
        node = ir.Node("", "Identity", [new], outputs=[ir.Value(name=b.names.new("out"))],
                       name=b.names.new("n_Identity"))
        graph.insert_before(root, node)
        new = node.outputs[0]
        new.dtype, new.shape = old.dtype, old.shape
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    name = old.name
    old.name = b.names.new(name + "_old")
    new.name = name


def _remove_dead_producers(graph: ir.Graph, values: list[ir.Value]) -> None:
    stack = list(values)
    seen = list(values)
    while stack:
        v = stack.pop()
        node = v.producer()
        if node is None or node.graph is not graph:
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        inputs = [x for x in node.inputs if x is not None]
        stack.extend(inputs)
        seen.extend(inputs)
        graph.remove(node, safe=True)
    for v in seen:
        if (v.is_initializer() and not v.uses() and not v.is_graph_output() and not v.is_graph_input()
                and v.name in graph.initializers):
            del graph.initializers[v.name]


class RulePass(Pass):
    """Runs a rule set with the driver; subclasses set ``name`` and ``rules``."""

    rules: Sequence[Rule] = ()
    choose_best = False  # see apply_rules

    def __init__(self) -> None:
        super().__init__()
        self.refused: Counter = Counter()

    def run(self, model: ir.Model) -> bool:
        stats = RewriteStats()
        changed = apply_rules(model, self.rules, stats=stats, choose_best=self.choose_best)
        self.fired.update(stats.fired)
        self.refused = stats.refused
        return changed


# ---------------------------------------------------------------------------- helpers for rule writers


# numpy views of small serialized tensors, decoded once (passes read the same BN parameters, biases and
# scalars many times per round); weak keys: an entry lives as long as its tensor. Big tensors are decoded
# on demand only, so a large model is never held twice.
_DECODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_DECODE_CACHE_BYTES = 1 << 16


def tensor_array(t: ir.TensorProtocol, cache: bool = True) -> np.ndarray:
    """``t.numpy()``, cached for small tensors that are not numpy-backed already (``cache=False``: a tensor
    read once, e.g. the parameters of a BatchNormalization that is folded away). Callers must not write
    into the result (true of ``numpy()`` on an ``ir.Tensor`` too: it is the tensor's own array)."""
    if type(t) is ir.Tensor:  # not isinstance: ir.Tensor derives from a Protocol (slow instance checks)
        return t.numpy()
    arr = _DECODED.get(t)
    if arr is None:
        arr = t.numpy()
        if cache and arr.nbytes <= _DECODE_CACHE_BYTES:
            arr.flags.writeable = False
            _DECODED[t] = arr
    return arr


def const_array(v: ir.Value | None, cache: bool = True) -> np.ndarray | None:
    """The value's constant data (initializer or Constant node output), or None; ``cache``: see
    ``tensor_array``."""
    if v is None or v.is_graph_input():  # an initializer that is also an input can be overridden
        return None
    if v.const_value is not None:
        return tensor_array(v.const_value, cache)
    p = v.producer()
    if p is not None and p.op_type == "Constant" and p.domain in ("", "ai.onnx"):
        t = ir.convenience.get_const_tensor(v)
        return None if t is None else t.numpy()
    return None


def as_tensor(array, name: str | None = None) -> ir.TensorProtocol:
    """An ir tensor over a numpy array. ``ir.Tensor`` directly: ``ir.tensor`` runs Protocol isinstance
    checks that cost more than the folding itself on big graphs; strings still go through it."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        return ir.tensor(array, name=name)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d arrays 1-d
    return ir.Tensor(array, name=name)


def single_use(v: ir.Value) -> bool:
    return len(v.uses()) == 1 and not v.is_graph_output()


def producer(v: ir.Value | None, op_type: str | tuple[str, ...]) -> ir.Node | None:
    if v is None:
        return None
    p = v.producer()
    ops = (op_type,) if isinstance(op_type, str) else op_type
    return p if p is not None and p.op_type in ops and p.domain in ("", "ai.onnx") else None


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def static_shape(v: ir.Value | None) -> tuple[int, ...] | None:
    if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(v.shape)
