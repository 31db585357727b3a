"""Input-shape overrides and shape/dtype inference.

What goes in: an onnx_ir model, optionally ``{input name: dims}`` overrides (from ``--input-shape
NAME=1,3,224,224``).
What comes out: the same model, with the overridden inputs fixed, every value's dtype and shape filled in
where onnx's inference (with data propagation) or our own completion can tell, and symbolic dims kept
symbolic where nothing fixes them.

Invariants:
- An override names a real (non-initializer) graph input, has that input's rank and agrees with every
  static dim it already has; a symbolic dim fixed on one input is fixed on every input that shares it.
- Inference never drops information: a value keeps its old shape unless inference refines it.
- Our completion only handles ops whose output shape follows from input shapes by a rule we own
  (elementwise unary: same shape; elementwise binary: numpy broadcasting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import onnx
import onnx_ir as ir

from dlcc.errors import ShapeError

# Ops whose output has the shape and dtype of their first input.
_SAME_SHAPE_UNARY = frozenset({
    "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Relu", "LeakyRelu", "Elu",
    "Selu", "Celu", "Gelu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish", "Erf", "Sin",
    "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Floor", "Ceil", "Round", "Sign", "Identity",
    "Clip", "PRelu", "ThresholdedRelu", "Shrink", "Softmax", "LogSoftmax", "Hardmax", "Dropout",
    "LayerNormalization", "InstanceNormalization", "BatchNormalization", "LRN", "CumSum",
})
# Ops whose output is the numpy broadcast of all inputs, with the dtype of the first input.
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "PRelu"})
_COMPARE = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"})


def parse_input_shape(text: str) -> tuple[str, list[int]]:
    """Parse ``NAME=1,3,224,224`` (also ``NAME:1x3x224x224``) into a name and dims."""
    sep = "=" if "=" in text else (":" if ":" in text else None)
    if sep is None:
        raise ShapeError(f"--input-shape '{text}' is not of the form NAME=D1,D2,...",
                         hint="e.g. --input-shape input=1,3,224,224")
    name, _, dims_text = text.rpartition(sep)
    parts = [p for p in dims_text.replace("x", ",").split(",") if p.strip()] if dims_text.strip() else []
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise ShapeError(f"--input-shape '{text}': dims must be integers",
                         hint="e.g. --input-shape input=1,3,224,224") from None
    if not name:
        raise ShapeError(f"--input-shape '{text}' names no input", hint="e.g. --input-shape input=1,3,224,224")
    if any(d <= 0 for d in dims):
        raise ShapeError(f"--input-shape '{text}': every dim must be a positive integer")
    return name, dims


def set_input_shapes(model: ir.Model, shapes: Mapping[str, Sequence[int]]) -> ir.Model:
    """Fix the shapes of graph inputs; symbolic dims fixed this way are fixed on every input sharing them."""
    if not shapes:
        return model
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs if v.name not in graph.initializers}
    bindings: dict[str, int] = {}
    for name, dims in shapes.items():
        if name not in inputs:
            raise ShapeError(f"--input-shape names unknown input '{name}'",
                             hint=f"the model's inputs are: {', '.join(sorted(inputs)) or '(none)'}")
        v = inputs[name]
        dims = [int(d) for d in dims]
        if v.shape is not None:
            if len(v.shape) != len(dims):
                raise ShapeError(
                    f"--input-shape gives input '{name}' rank {len(dims)} ({_fmt(dims)}), but the model "
                    f"declares rank {len(v.shape)} ({_fmt(v.shape)})", hint="give one dim per axis")
            for axis, (old, new) in enumerate(zip(v.shape, dims, strict=True)):
                if isinstance(old, int) and old != new:
                    raise ShapeError(
                        f"--input-shape gives input '{name}' dim {new} on axis {axis}, but the model fixes "
                        f"it to {old}", hint="only symbolic dims can be overridden")
                if isinstance(old, ir.SymbolicDim) and old.value is not None:
                    prev = bindings.setdefault(old.value, new)
                    if prev != new:
                        raise ShapeError(f"symbolic dim '{old.value}' is given two values, {prev} and {new}",
                                         hint="use one value for a dim shared between inputs")
        v.shape = ir.Shape(dims)
    # a symbol fixed on one input is fixed everywhere it appears on the inputs and outputs
    for v in [*inputs.values(), *graph.outputs]:
        if v.shape is not None and v.name not in shapes:
            v.shape = ir.Shape([bindings.get(d.value, d) if isinstance(d, ir.SymbolicDim) else d
                                for d in v.shape])
    # intermediate shapes were inferred from the old input shapes: let inference redo them
    for node in graph:
        for out in node.outputs:
            if not out.is_graph_output():
                out.shape = None
    model.meta["dlcc.input_shapes"] = {k: list(v) for k, v in shapes.items()}
    return model


def infer_shapes(model: ir.Model, *, strict: bool | None = None) -> ir.Model:
    """Run onnx shape inference (with data propagation) and our completion; returns ``model``.

    With ``strict`` (the default when input shapes were overridden) an inconsistency is a ShapeError;
    otherwise inference falls back to the lenient mode and records a note.
    """
    if strict is None:
        strict = "dlcc.input_shapes" in model.meta
    try:
        _onnx_infer(model, strict_mode=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), str(e))
        if strict:
            raise ShapeError(f"the shapes do not fit the model: {first}",
                             hint="check the --input-shape values") from None
        note = f"strict shape inference failed ({first}); used lenient inference"
        notes = model.meta.setdefault("dlcc.notes", [])
        if note not in notes:
            notes.append(note)
        with contextlib.suppress(onnx.shape_inference.InferenceError, RuntimeError, ValueError):
            _onnx_infer(model, strict_mode=False)
    complete_shapes(model.graph)
    return model


def skeleton_call(func, model: ir.Model):
    """Call an onnx C++ API on the model without its big tensors (onnx_ir's helper passes them as typed
    inputs), keeping the initializers' order so that output files stay byte-stable."""
    from onnx_ir.passes.common import _c_api_utils

    order = list(model.graph.initializers.values())
    try:
        return _c_api_utils.call_onnx_api(func, model)
    finally:
        if list(model.graph.initializers.values()) != order:
            model.graph.initializers.clear()
            for v in order:
                model.graph.initializers.add(v)


def refresh_shapes(model: ir.Model) -> bool:
    """After rewrites: fill what our completion can; run onnx inference only when some value is still
    unknown or symbolic (rewrites keep the shapes of the values they keep, and give new values theirs).
    Returns whether anything may have changed (a value filled, or inference run)."""
    filled = complete_shapes(model.graph)
    for node in model.graph:
        for o in node.outputs:
            if o.shape is not None and o.dtype is not None and all(isinstance(d, int) for d in o.shape):
                continue
            if not o.uses() and not o.is_graph_output():
                continue  # an output nothing reads (Dropout's mask): inference may leave it unknown
            infer_shapes(model, strict=False)
            return True
    return filled > 0


def _onnx_infer(model: ir.Model, *, strict_mode: bool) -> None:
    def infer(proto: onnx.ModelProto) -> onnx.ModelProto:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=strict_mode,
                                                 data_prop=True)

    merge_inferred(model, skeleton_call(infer, model))


def check_and_infer(model: ir.Model, check) -> None:
    """One skeleton call for a big model at load: ``check(proto)`` (may raise), then inference, strict
    first and lenient if that fails; shapes are merged when inference succeeds."""

    def run(proto: onnx.ModelProto) -> onnx.ModelProto | None:
        check(proto)
        for strict_mode in (True, False):
            with contextlib.suppress(onnx.shape_inference.InferenceError, RuntimeError, ValueError):
                return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=strict_mode,
                                                         data_prop=True)
        return None

    inferred = skeleton_call(run, model)
    if inferred is not None:
        merge_inferred(model, inferred)


def merge_inferred(model: ir.Model, inferred: onnx.ModelProto) -> None:
    """Copy dtypes and shapes from an inferred proto onto the model's values (never losing information)."""
    found: dict[str, tuple[int, list]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        found[vi.name] = (tt.elem_type, dims)
    values = {v.name: v for v in _all_values(model.graph)}
    for name, (elem, dims) in found.items():
        v = values.get(name)
        if v is None:
            continue
        if v.dtype is None and elem:
            v.dtype = ir.DataType(elem)
        if dims is not None:
            new = ir.Shape(dims)
            if v.shape is None or _more_specific(new, v.shape):
                v.shape = new


def _more_specific(new: ir.Shape, old: ir.Shape) -> bool:
    if len(new) != len(old):
        return False
    return sum(isinstance(d, int) for d in new) > sum(isinstance(d, int) for d in old)


def _all_values(graph: ir.Graph):
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def complete_shapes(graph: ir.Graph) -> int:
    """Fill shapes onnx left unknown for ops whose rule we own; returns how many values were filled."""
    filled = 0
    for node in graph:
        if node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        out = node.outputs[0]
        if out.shape is not None and out.dtype is not None:
            continue
        ins = [v for v in node.inputs if v is not None]
        if not ins:
            continue
        shape, dtype = None, None
        if node.op_type in _SAME_SHAPE_UNARY:
            shape, dtype = ins[0].shape, ins[0].dtype
        elif node.op_type in _BROADCAST or node.op_type in _COMPARE:
            shape = broadcast_shapes([v.shape for v in ins])
            dtype = ir.DataType.BOOL if node.op_type in _COMPARE else ins[0].dtype
        if out.shape is None and shape is not None:
            out.shape = ir.Shape(list(shape))
            filled += 1
        if out.dtype is None and dtype is not None:
            out.dtype = dtype
    return filled


def broadcast_shapes(shapes: Sequence[ir.Shape | None]) -> list | None:
    """Numpy broadcasting over dims that may be symbolic; None when it cannot be decided."""
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    result = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        known = {d for d in dims if isinstance(d, int) and d != 1}
        symbolic = {d.value for d in dims if isinstance(d, ir.SymbolicDim)}
        if len(known) > 1:
            return None
        if known:
            result.append(known.pop())
        elif len(symbolic) == 1 and None not in symbolic:
            result.append(ir.SymbolicDim(symbolic.pop()))
        elif symbolic:
            return None
        else:
            result.append(1)
    return result


def symbolic_inputs(model: ir.Model) -> dict[str, list]:
    """Inputs whose shape still has a symbolic or unknown dim: name -> dims."""
    out = {}
    for v in model.graph.inputs:
        if v.name in model.graph.initializers:
            continue
        if v.shape is None or any(not isinstance(d, int) for d in v.shape):
            out[v.name] = [d if isinstance(d, int) else str(d) for d in (v.shape or [])]
    return out


def _fmt(dims) -> str:
    return "x".join(str(d) for d in dims) if dims is not None else "?"
