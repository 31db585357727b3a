"""Constant folding, with a size guard and shape arithmetic; constant parameter inputs as attributes.

What goes in: an onnx_ir model, ideally after ``infer_shapes`` (shape folding needs static shapes).
What comes out, from ``ConstantFolding`` ("fold"): the same model, changed in place, where
- every ``Constant`` node is an initializer (lifted), so later rules see constants in one form;
- every default-domain node whose inputs are all constant was evaluated with ``onnx.reference``'s op
  implementations and replaced by initializers holding its results (same names, same dtypes);
- ``Shape``/``Size`` of a value with a static shape are constants, and so are ``Gather``/``Slice`` over
  the static part of a partially known shape;
- a result far larger than what it is computed from stays as its generator node (see below).
From ``ConstantParams`` ("params"): the same model where a node that gets its parameters (axes, pads,
scales...) as constant inputs although the model's opset defines them as attributes of that op takes
them as attributes (all of them or none: a value an attribute cannot hold leaves the node as it is).

Invariants: graph input/output names and dtypes never change (a folded graph output becomes an
initializer of the same name); initializers that are also graph inputs are overridable, so they are not
constants; random ops (and nodes reading them), Dropout, control flow (If/Loop/Scan) and ops outside the
default domain are never folded; an evaluation that fails leaves its node in place (counted as
``fold-failed:<op>``), it never raises; a generated tensor is materialized only when it is not far
larger than its source, or has a single user and at most ``max_bytes`` (the size guard), so a model
grows by at most one ``max_bytes`` per such tensor. Both passes are idempotent.

The algorithm: sweeps in topological order (a folded value is constant before its users are seen),
with shape inference after each sweep that changed something (folded shapes make more shapes static),
until a sweep changes nothing (at most ``MAX_SWEEPS``). One sweep:

    for node in graph:
        Constant                      -> lift it into an initializer
        Shape/Size, static input      -> evaluate on a zero-byte stand-in of that shape
        Shape, partially static       -> remember which entries are known (no change)
        Gather/Slice of such a vector -> evaluate on arange(n): the positions read; fold if all are known
        all inputs constant           -> guard:  out > SMALL and out > growth * source?
                                            yes: the node stays, as a *generator* (not evaluated)
                                            no : evaluate, replace the node by initializers
    settle generators, last first:
        unused                                                   -> removed
        one use, <= max_bytes, its user is not itself a generator -> evaluated, becomes an initializer
        otherwise                                                -> stays as it is

``source`` is the largest materialized tensor a result is computed from: a generator passes its own
source on, so ``Mul(ConstantOfShape(s), k)`` is measured against ``s`` and ``k``, not against the
generated tensor. A node reading a generator is still "all constant": it is evaluated by evaluating the
generator on the fly (never materializing it alone), and its own result goes through the same guard.
So a ConstantOfShape feeding a Conv weight stays a ConstantOfShape above ``max_bytes`` (materialized at
or below it), one feeding a foldable chain is folded into that chain's result, and the light VGG-19
keeps its 15 generated weights above 1 MiB (547 MB) as generators. ``max_bytes=0`` keeps every
generated tensor above ``SMALL_BYTES`` that no foldable node reads as its generator.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from dlcc.frontend.shapes import infer_shapes
from dlcc.ops.table import ops_with
from dlcc.passes.manager import Pass
from dlcc.passes.rewrite import NameGen, as_tensor, tensor_array

MAX_GROWTH = 16  # a result this many times larger than its source is a generator candidate
MAX_BYTES = 1 << 20  # a generator candidate above this size is never materialized
SMALL_BYTES = 1024  # results up to this size are always folded (the guard would only cost folding)
MAX_EVAL_BYTES = 256 << 20  # a generator above this size is never evaluated (not even transiently)
MAX_SWEEPS = 4  # sweeps per run; shape inference between them (more remain for the manager's next round)

NON_DETERMINISTIC = ops_with("deterministic", value=False)  # the random ops
# Dropout is bypassed by its own pass; control flow and sequence/optional ops do not yield tensors we keep.
NEVER_FOLDED = NON_DETERMINISTIC | frozenset({
    "Dropout", "If", "Loop", "Scan", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
    "SequenceInsert", "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Optional",
    "OptionalGetElement", "OptionalHasElement",
})
_DEFAULT_DOMAINS = ("", "ai.onnx")
_EVALUATOR_CACHE = 1024  # evaluators kept per pass instance (one per op form and input dtypes)


def _opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def _is_const(v: ir.Value | None) -> bool:
    """A materialized constant: an initializer that is not an (overridable) graph input."""
    return v is not None and v.is_initializer() and not v.is_graph_input() and v.const_value is not None


def _nbytes(count: int, dtype: ir.DataType) -> int | None:
    try:
        return int(math.ceil(count * dtype.itemsize))
    except (TypeError, ValueError):  # strings and other types without a fixed size
        return None


def _static_dims(shape: ir.Shape | None) -> list[int] | None:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return [int(d) for d in shape]


def _needed(v: ir.Value) -> bool:
    return bool(v.uses()) or v.is_graph_output()


def _has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


class _Evaluator:
    """Runs one node with onnx.reference: its op implementation called directly (a ReferenceEvaluator
    around a one-node model costs five times more), or such an evaluator for ops whose implementation
    needs one (functions, context, type-dependent implementations); one per (node form, opset, input
    dtypes), cached for the pass instance."""

    def __init__(self) -> None:
        self._cache: dict[tuple, object] = {}

    def run(self, node: ir.Node, opset: int, args: list[np.ndarray | None]) -> list[np.ndarray | None]:
        from onnx.reference import ReferenceEvaluator
        from onnx.reference.op_run import OpRun

        while args and args[-1] is None:
            args = args[:-1]
        proto = ir.serde.serialize_node(node)
        in_names = [f"i{k}" if a is not None else "" for k, a in enumerate(args)]
        # an unused output without a name is an omitted optional output
        out_names = [f"o{k}" if o.name or _needed(o) else "" for k, o in enumerate(node.outputs)]
        del proto.input[:]
        proto.input.extend(in_names)
        del proto.output[:]
        proto.output.extend(out_names)
        proto.name = ""
        proto.doc_string = ""
        elem = tuple(onnx.helper.np_dtype_to_tensor_dtype(a.dtype) if a is not None else 0 for a in args)
        key = (proto.SerializeToString(deterministic=True), opset, elem)
        ev = self._cache.get(key)
        if ev is None:
            ev = _op_instance(proto, opset)
        if ev is None:
            inputs = []
            for name, t in zip(in_names, elem, strict=True):
                if name:
                    vi = onnx.ValueInfoProto(name=name)
                    vi.type.tensor_type.elem_type = t
                    inputs.append(vi)
            outputs = [onnx.ValueInfoProto(name=n) for n in out_names if n]
            graph = onnx.helper.make_graph([proto], "fold", inputs, outputs)
            one = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
            ev = ReferenceEvaluator(one)
        if len(self._cache) >= _EVALUATOR_CACHE:
            self._cache.clear()
        self._cache[key] = ev
        with np.errstate(all="ignore"):
            if isinstance(ev, OpRun):  # inputs by position (None for an omitted one), every output back
                res = ev.run(*args)
                return [res[k] if n and k < len(res) else None for k, n in enumerate(out_names)]
            results = iter(ev.run(None, {n: a for n, a in zip(in_names, args, strict=True) if n}))
        return [next(results) if n else None for n in out_names]


def _op_instance(proto: onnx.NodeProto, opset: int):
    """onnx.reference's implementation of a default-domain node, ready to run, or None when it needs a
    ReferenceEvaluator around it (a function body, a subgraph or context, a type-dependent choice)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpFunction, OpRun
    from onnx.reference.ops import load_op

    try:
        cls = load_op("", proto.op_type, opset)
    except Exception:  # unknown op or a context-dependent implementation: the evaluator decides
        return None
    if not isinstance(cls, type) or not issubclass(cls, OpRun) or issubclass(cls, OpFunction):
        return None
    params = {"log": lambda pattern, *args: None, "opsets": {"": opset}, "verbose": 0, "new_ops": None,
              "existing_functions": {}, "evaluator_cls": ReferenceEvaluator}
    try:
        op = cls(proto, params)
    except Exception:
        return None
    return None if op.need_context() or op.has_subgraph else op


@dataclass
class _Generator:
    nbytes: int  # bytes of all its outputs
    source: int  # bytes of the largest materialized tensor it is computed from


class _TooBig(Exception):
    pass


def _all_static(graph: ir.Graph) -> bool:
    """Every output that something reads has a static shape (an unread one, such as Dropout's mask, may
    stay unknown: no fold depends on it)."""
    return all((o.shape is not None and all(isinstance(d, int) for d in o.shape)) or not _needed(o)
               for node in graph for o in node.outputs)


class ConstantFolding(Pass):
    name = "fold"
    doc = "evaluate nodes whose inputs are constant, and shape arithmetic on static shapes, at compile time"

    def __init__(self, max_growth: float = MAX_GROWTH, max_bytes: int = MAX_BYTES) -> None:
        super().__init__()
        self.max_growth = max_growth
        self.max_bytes = max_bytes
        self.kept: Counter[str] = Counter()  # generators left in place by the size guard, by op
        self.failures: list[str] = []  # "op 'node': error" for evaluations that raised
        self.materialized: dict[str, int] = {}  # initializers this run created: name -> bytes
        self._evaluator = _Evaluator()

    # ------------------------------------------------------------------------------------------ driver

    def run(self, model: ir.Model) -> bool:
        self.kept = Counter()
        self.failures = []
        self.materialized = {}
        self._graph = model.graph
        self._opset_version = _opset(model)
        self._names: NameGen | None = None
        self._failed: set[ir.Node] = set()  # evaluated in vain this run: not tried again
        changed = False
        for _ in range(MAX_SWEEPS):
            if not self._sweep():
                break
            changed = True
            # folded shapes make more shapes static, and those fold in the next sweep; when every shape is
            # already static, a sweep in topological order has folded all it can
            if _all_static(self._graph):
                break
            infer_shapes(model, strict=False)
        return changed

    def _sweep(self) -> bool:
        self.kept = Counter()  # as the last sweep left them
        self._generators: dict[ir.Node, _Generator] = {}
        self._partial: dict[ir.Value, list[int | None]] = {}
        changed = False
        for node in list(self._graph):
            if node.graph is self._graph and node.domain in _DEFAULT_DOMAINS:
                changed |= self._visit(node)
        return self._settle_generators() or changed

    def _visit(self, node: ir.Node) -> bool:
        op = node.op_type
        if op == "Constant":
            return self._lift(node)
        if not any(_needed(o) for o in node.outputs):
            return False  # dead: dead-code elimination removes it
        if op in ("Shape", "Size") and self._fold_shape(node):
            return True
        if op in ("Gather", "Slice") and node.inputs and node.inputs[0] in self._partial:
            return self._fold_partial(node)
        if op in NEVER_FOLDED or node in self._failed or _has_subgraph(node):
            return False
        if not all(v is None or self._is_constant(v) for v in node.inputs):
            return False
        return self._fold(node)

    def _is_constant(self, v: ir.Value) -> bool:
        return _is_const(v) or v.producer() in self._generators

    # ---------------------------------------------------------------------------------- lifting

    def _lift(self, node: ir.Node) -> bool:
        out = node.outputs[0]
        if not _needed(out) or "sparse_value" in node.attributes:
            return False
        value = node.attributes.get("value")
        if value is not None and value.type == ir.AttributeType.TENSOR and len(node.attributes) == 1:
            tensor = value.value  # the common form, without get_const_tensor's Protocol checks (~40 us)
        else:
            try:
                tensor = ir.convenience.get_const_tensor(out)
            except ValueError:
                tensor = None
        if tensor is None:
            return False
        self._replace_with_tensor(out, tensor)
        self._graph.remove(node, safe=True)
        self.fired["lift-constant"] += 1
        return True

    # --------------------------------------------------------------------------------- generic fold

    def _fold(self, node: ir.Node) -> bool:
        source = max((self._source_bytes(v) for v in node.inputs if v is not None), default=0)
        estimate = self._estimate_bytes(node)
        if estimate is not None and self._too_large(estimate, source):
            self._generators[node] = _Generator(estimate, source)
            return False
        values = self._evaluate(node)
        if values is None:
            return False
        nbytes = sum(a.nbytes for a in values if a is not None)
        if self._too_large(nbytes, source):
            self._generators[node] = _Generator(nbytes, source)
            return False
        self._materialize(node, values)
        self.fired[f"fold:{node.op_type}"] += 1
        return True

    def _too_large(self, nbytes: int, source: int) -> bool:
        return nbytes > SMALL_BYTES and nbytes > max(source, 1) * self.max_growth

    def _source_bytes(self, v: ir.Value) -> int:
        if _is_const(v):
            return v.const_value.nbytes
        gen = self._generators.get(v.producer())
        return gen.source if gen is not None else 0

    def _estimate_bytes(self, node: ir.Node) -> int | None:
        """Bytes of the node's outputs from static shapes, or for ops whose output size is set by the value
        of an input (ConstantOfShape, Expand, Tile, Range), from those values: shape inference may not
        know the shape yet when an input was folded in this sweep, and evaluating to find out could
        allocate terabytes. Python integers: a product above 64 bits is a (huge) number, not a wrap."""
        generated = _generated_elements(node, self._value_shape)
        if generated is not None and node.outputs[0].dtype is not None:
            return _nbytes(generated, node.outputs[0].dtype)
        if node.op_type == "ConstantOfShape" and _is_const(node.inputs[0]):
            a = node.attributes.get("value")
            dtype = a.value.dtype if a is not None else ir.DataType.FLOAT
            return _nbytes(math.prod(int(d) for d in node.inputs[0].const_value.numpy().ravel()), dtype)
        total = 0
        for out in node.outputs:
            dims = _static_dims(out.shape)
            nbytes = None if dims is None or out.dtype is None else _nbytes(math.prod(dims), out.dtype)
            if nbytes is None:
                return None
            total += nbytes
        return total

    def _value_shape(self, v: ir.Value) -> list[int] | None:
        """The static shape of a constant (or generated) value, without evaluating it."""
        if _is_const(v):
            return [int(d) for d in v.const_value.shape]
        return _static_dims(v.shape)

    def _evaluate(self, node: ir.Node) -> list[np.ndarray | None] | None:
        """The node's results, or None (recorded) when an input is too big or evaluation fails."""
        try:
            return self._run(node, [None if v is None else self._value_of(v) for v in node.inputs])
        except _TooBig:
            return None
        except Exception as e:  # any failure of the reference implementation leaves the node alone
            self._failed.add(node)
            self.fired[f"fold-failed:{node.op_type}"] += 1
            first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            self.failures.append(f"{node.op_type} '{node.name}': {first[:200]}")
            return None

    def _run(self, node: ir.Node, args: list[np.ndarray | None]) -> list[np.ndarray | None]:
        results = self._evaluator.run(node, self._opset_version, args)
        for out, r in zip(node.outputs, results, strict=True):
            if r is None and _needed(out):
                raise ValueError(f"no value for output '{out.name}'")
        return [None if r is None else _conform(out, r) for out, r in zip(node.outputs, results, strict=True)]

    def _value_of(self, v: ir.Value) -> np.ndarray:
        if _is_const(v):
            return v.const_value.numpy()
        node = v.producer()
        gen = self._generators[node]
        if gen.nbytes > MAX_EVAL_BYTES:
            raise _TooBig(v.name)
        results = self._run(node, [None if x is None else self._value_of(x) for x in node.inputs])
        return results[v.index()]

    # --------------------------------------------------------------------------------- shape folds

    def _fold_shape(self, node: ir.Node) -> bool:
        x = node.inputs[0]
        if x is None or x.shape is None or node in self._failed:
            return False
        dims = [d if isinstance(d, int) else None for d in x.shape]
        # Shape's start/end: ONNX counts negatives from the back and clamps, as Python slicing does
        picked = dims[_attr(node, "start", 0):_attr(node, "end", None)] if node.op_type == "Shape" else dims
        if None in picked:
            if node.op_type == "Shape":
                self._partial[node.outputs[0]] = picked
            return False
        # a zero-byte stand-in with the input's shape (dims outside Shape's start:end do not matter)
        stand_in = np.broadcast_to(np.zeros((), np.float32), [1 if d is None else d for d in dims])
        try:
            values = self._run(node, [stand_in])
        except Exception as e:
            self._failed.add(node)
            self.fired[f"fold-failed:{node.op_type}"] += 1
            self.failures.append(f"{node.op_type} '{node.name}': {e}")
            return False
        self._materialize(node, values)
        self.fired["fold-shape"] += 1
        return True

    def _fold_partial(self, node: ir.Node) -> bool:
        """Gather/Slice reading a partially known shape: evaluate on positions, fold if all are known."""
        known = self._partial[node.inputs[0]]
        rest = node.inputs[1:]
        if not all(v is None or self._is_constant(v) for v in rest):
            return False
        try:
            args = [np.arange(len(known), dtype=np.int64)]
            args += [None if v is None else self._value_of(v) for v in rest]
            positions = np.asarray(self._evaluator.run(node, self._opset_version, args)[0])
        except Exception:
            return False  # e.g. an index out of range: onnxruntime will say so at run time
        picked = [known[int(i)] for i in positions.ravel()]
        out = node.outputs[0]
        if any(d is None for d in picked):
            if positions.ndim == 1:
                self._partial[out] = picked
            return False
        try:
            value = _conform(out, np.array(picked, dtype=np.int64).reshape(positions.shape))
        except (TypeError, ValueError):
            return False  # contradicts the inferred shape: leave it to onnxruntime
        self._materialize(node, [value])
        self.fired["fold-shape-element"] += 1
        return True

    # -------------------------------------------------------------------------------- generators

    def _settle_generators(self) -> bool:
        changed = False
        for node in reversed(list(self._graph)):
            gen = self._generators.get(node)
            if gen is None:
                continue
            users = {u.node for o in node.outputs for u in o.uses()}
            outputs = sum(o.is_graph_output() for o in node.outputs)
            if not users and not outputs:
                inputs = [v for v in node.inputs if v is not None]
                self._graph.remove(node, safe=True)
                del self._generators[node]
                self._drop_dead(inputs)
                changed = True
                continue
            if (len(users) + outputs == 1 and gen.nbytes <= self.max_bytes
                    and not any(u in self._generators for u in users)):
                values = self._evaluate(node)
                if values is not None:
                    self._materialize(node, values)
                    self.fired[f"fold:{node.op_type}"] += 1
                    changed = True
                    continue
            self.kept[node.op_type] += 1
        return changed

    # ------------------------------------------------------------------------------ graph surgery

    def _materialize(self, node: ir.Node, values: list[np.ndarray | None]) -> None:
        """Replace ``node`` by initializers named like its outputs; drop constants it alone used."""
        for out, value in zip(node.outputs, values, strict=True):
            if _needed(out):
                if value is None:
                    raise AssertionError(f"{node.op_type} produced no value for used output '{out.name}'")
                self._replace_with_tensor(out, as_tensor(value))
        inputs = [v for v in node.inputs if v is not None]
        self._graph.remove(node, safe=True)
        self._generators.pop(node, None)
        self._drop_dead(inputs)

    def _replace_with_tensor(self, old: ir.Value, tensor: ir.TensorProtocol) -> None:
        name = old.name
        if not name:
            if self._names is None:
                self._names = NameGen(self._graph)
            name = self._names.new("folded")
        old.name = None
        tensor.name = name
        new = ir.Value(name=name, shape=ir.Shape(list(tensor.shape)), type=ir.TensorType(tensor.dtype),
                       const_value=tensor)
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        self._graph.register_initializer(new)
        self.materialized[name] = tensor.nbytes

    def _drop_dead(self, values: list[ir.Value]) -> None:
        """Remove constants and generators that the last change left without users."""
        stack = list(values)
        while stack:
            v = stack.pop()
            if _needed(v) or v.is_graph_input():
                continue
            if v.is_initializer():
                if self._graph.initializers.get(v.name) is v:
                    del self._graph.initializers[v.name]
                continue
            node = v.producer()
            if node is None or node.graph is not self._graph:
                continue
            if node not in self._generators and node.op_type != "Constant":
                continue
            if any(_needed(o) for o in node.outputs):
                continue
            stack.extend(x for x in node.inputs if x is not None)
            self._graph.remove(node, safe=True)
            self._generators.pop(node, None)


def _small_const(v: ir.Value | None) -> np.ndarray | None:
    """The value of a small materialized constant (a shape, repeats, a scalar), else None."""
    if v is None or not _is_const(v) or v.const_value.nbytes > SMALL_BYTES:
        return None
    return tensor_array(v.const_value)


def _generated_elements(node: ir.Node, shape_of) -> int | None:
    """Elements of the first output of an op whose output size is given by an input's value, computed
    from that value without evaluating the op; None for other ops or when a value is not known."""
    op, ins = node.op_type, node.inputs
    try:
        if op == "Expand" and len(ins) == 2 and ins[0] is not None:
            target, x = _small_const(ins[1]), shape_of(ins[0])
            if target is None or x is None:
                return None
            dims = [int(d) for d in target.ravel()]
            rank = max(len(dims), len(x))
            dims, x = [1] * (rank - len(dims)) + dims, [1] * (rank - len(x)) + x
            return math.prod(max(a, b) if 1 in (a, b) else a for a, b in zip(dims, x, strict=True))
        if op == "Tile" and len(ins) == 2 and ins[0] is not None:
            reps, x = _small_const(ins[1]), shape_of(ins[0])
            if reps is None or x is None:
                return None
            return math.prod(x) * math.prod(max(int(r), 0) for r in reps.ravel())
        if op == "Range" and len(ins) == 3:
            args = [_small_const(v) for v in ins]
            if any(a is None or a.size != 1 for a in args):
                return None
            start, limit, delta = (a.ravel()[0].item() for a in args)
            if delta == 0:
                return None
            return max(int(math.ceil((limit - start) / delta)), 0)
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _conform(out: ir.Value, value) -> np.ndarray:
    """The evaluated ``value`` in ``out``'s dtype; raises when it contradicts ``out``'s known shape."""
    arr = np.asarray(value)
    if arr.dtype.kind in "OUS":
        raise TypeError("string and object results are not folded")
    if out.dtype is not None:
        target = out.dtype.numpy()
        if arr.dtype != target:
            arr = arr.astype(target)
    if out.shape is not None:
        dims = list(out.shape)
        if len(dims) != arr.ndim or any(isinstance(d, int) and d != n for d, n in zip(dims, arr.shape,
                                                                                      strict=True)):
            raise ValueError(f"result shape {list(arr.shape)} contradicts the inferred shape {out.shape}")
    return arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)


# ============================================================================ constant parameters

# op -> (input index, parameter name, name of the attribute form in older opsets or None)
PARAM_INPUTS: dict[str, tuple[tuple[int, str, str | None], ...]] = {
    "Unsqueeze": ((1, "axes", "axes"),),
    "Squeeze": ((1, "axes", "axes"),),
    **{op: ((1, "axes", "axes"),) for op in (
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
    "Pad": ((1, "pads", "pads"), (2, "value", "value"), (3, "axes", None)),
    "Clip": ((1, "min", "min"), (2, "max", "max")),
    "Split": ((1, "split", "split"),),
    "Slice": ((1, "starts", "starts"), (2, "ends", "ends"), (3, "axes", "axes"), (4, "steps", None)),
    "TopK": ((1, "k", "k"),),
    "Upsample": ((1, "scales", "scales"),),
    "Resize": ((1, "roi", None), (2, "scales", None), (3, "sizes", None)),
    "Reshape": ((1, "shape", "shape"),),
    "Expand": ((1, "shape", None),),
    "Tile": ((1, "repeats", None),),
    "CumSum": ((1, "axis", None),),
    "Dropout": ((1, "ratio", "ratio"),),
}


def _const_array(v: ir.Value | None) -> np.ndarray | None:
    """Constant data of an initializer (not a graph input) or of a Constant node's output."""
    if v is None or v.is_graph_input():
        return None
    if _is_const(v):
        return tensor_array(v.const_value)
    p = v.producer()
    if p is None or p.op_type != "Constant" or p.domain not in _DEFAULT_DOMAINS:
        return None
    try:
        t = ir.convenience.get_const_tensor(v)
    except ValueError:
        return None
    return None if t is None else t.numpy()


def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


class ConstantParams(Pass):
    name = "params"
    doc = "move constant axes/pads/scales/... inputs into the attribute form where the opset defines one"

    def run(self, model: ir.Model) -> bool:
        opset = _opset(model)
        changed = False
        for node in list(model.graph):
            if node.domain in _DEFAULT_DOMAINS and node.op_type in PARAM_INPUTS:
                changed |= self._params(node, opset)
        return changed

    def _params(self, node: ir.Node, opset: int) -> bool:
        present: list[int] = []
        schema = _schema(node.op_type, opset)
        attrs: dict[str, ir.Attr] = {}
        for index, _, attr_name in PARAM_INPUTS[node.op_type]:
            if index >= len(node.inputs) or node.inputs[index] is None:
                continue
            present.append(index)
            arr = _const_array(node.inputs[index])
            if arr is None or arr.dtype.kind not in "fiub":
                continue
            # the attribute form applies only where this opset's op has the attribute and not the input
            if (schema is not None and attr_name is not None and attr_name in schema.attributes
                    and schema.max_input <= index):
                # a value not expressible as that attribute leaves the node as it is
                with contextlib.suppress(TypeError, ValueError):
                    attrs[attr_name] = _as_attribute(attr_name, schema.attributes[attr_name].type, arr)
        if not attrs or len(attrs) != len(present):
            return False
        for a in attrs.values():
            node.attributes[a.name] = a
        node.resize_inputs(min(present))
        self.fired["param-to-attribute"] += 1
        return True


def _as_attribute(name: str, kind: onnx.defs.OpSchema.AttrType, arr: np.ndarray) -> ir.Attr:
    T = onnx.defs.OpSchema.AttrType
    if kind == T.INTS:
        return ir.AttrInt64s(name, [int(x) for x in arr.ravel().tolist()])
    if kind == T.INT:
        return ir.AttrInt64(name, int(arr.item()))
    if kind == T.FLOATS:
        return ir.AttrFloat32s(name, [float(x) for x in arr.ravel().tolist()])
    if kind == T.FLOAT:
        return ir.AttrFloat32(name, float(arr.item()))
    raise TypeError(f"attribute {name}: unsupported kind {kind}")


__all__ = ["ConstantFolding", "ConstantParams", "MAX_BYTES", "MAX_GROWTH", "NEVER_FOLDED",
           "NON_DETERMINISTIC", "PARAM_INPUTS", "SMALL_BYTES"]
