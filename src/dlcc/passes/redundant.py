"""Redundant-node elimination: ops that compute nothing, view chains, and pairs that undo each other.

What goes in: a model whose values carry dtypes and shapes (``infer_shapes`` ran). What comes out: the
same model with fewer nodes and the same outputs, bit for bit (``exact`` rules) — except for the one rule
a user must ask for: ``QuantizeLinear -> DequantizeLinear`` is lossy and only runs with
``InversePairs(allow_lossy=True)``.

Three rule families, each a rule table run by the driver in ``dlcc.passes.rewrite`` (only the driver
mutates the graph; graph outputs keep their names because the driver hands a graph output's name to the
value that replaces it):

- ``no-op`` (``NO_OP_RULES``): a node whose output equals one of its inputs is replaced by that input —
  Identity, inference Dropout, one-input Concat/Sum/Max/Min/Mean, Cast to the same type,
  Reshape/Flatten/Expand that keep the shape, Slice over the whole range, zero Pad, identity Transpose,
  one-part Split, 1x1 stride-1 pooling, unit Resize/Upsample, all-one Tile, and x+0, x-0, x*1, 1*x, x/1,
  Pow(x, 1) where the constant's broadcast changes neither shape nor dtype; and a Conv's kernel positions
  that every output meets only in the padding (dropped: the Conv gets a smaller kernel and padding).
- ``reshape-chains`` (``CHAIN_RULES``): chains of Reshape/Flatten/Squeeze/Unsqueeze with static shapes
  become one Reshape; Squeeze/Unsqueeze pairs on symbolic shapes become one Squeeze or Unsqueeze when the
  axes compose.
- ``inverse-pairs`` (``INVERSE_RULES``, ``LOSSY_RULES``): Squeeze/Unsqueeze on the same axes, Transpose
  chains (composed; removed when the composition is the identity), Reshape of Reshape, lossless Cast
  round trips, DequantizeLinear -> QuantizeLinear with equal parameters, Slice that picks one Concat input.

Invariants: a rule refuses (with a reason) whenever a guard depends on a shape, dtype or constant that is
unknown; no rule changes a graph input/output name or dtype; ops built by a rewrite use the form of the
model's opset (attribute axes below opset 13, input axes from 13; Reshape's shape input needs opset 5).
Unused nodes and initializers left behind are ``dead-code``'s job (the driver removes the obvious ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from dlcc.passes.rewrite import (
    Builder,
    Rule,
    RulePass,
    attr,
    const_array,
    producer,
    single_use,
    static_shape,
)

# An end (or start) at least this large (in magnitude) covers any real dim: exporters write INT64_MAX.
_HUGE = 2**62

_VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")

D = ir.DataType


# ------------------------------------------------------------------------------------------- helpers


def _opset(node: ir.Node) -> int:
    """The default-domain opset of the node's graph (subgraphs without imports count as the newest)."""
    graph = node.graph
    imports = graph.opset_imports if graph is not None else {}
    return imports.get("", imports.get("ai.onnx", 10**6))


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _live(v: ir.Value | None) -> bool:
    """Is this (optional) output read by anything?"""
    return v is not None and bool(v.name) and (bool(v.uses()) or v.is_graph_output())


def _ints(a) -> list[int]:
    return [int(x) for x in np.asarray(a).reshape(-1)]


def _forward(node: ir.Node, m: dict, b: Builder) -> list[ir.Value | None]:
    """The rewrite of every no-op rule: the first output becomes ``m["x"]``; other outputs are unused."""
    return [m["x"], *([None] * (len(node.outputs) - 1))]


def _first_input(node: ir.Node) -> dict | None:
    x = _input(node, 0)
    return {"x": x} if x is not None else None


def _normalize_axes(axes: Sequence[int], rank: int | None) -> list[int] | None:
    """Sorted non-negative axes, or None when out of range, repeated, or negative with an unknown rank."""
    out = []
    for a in axes:
        if a < 0:
            if rank is None:
                return None
            a += rank
        if a < 0 or (rank is not None and a >= rank):
            return None
        out.append(a)
    return sorted(out) if len(set(out)) == len(out) else None


def _axes_param(node: ir.Node) -> tuple[list[int] | None, str | None]:
    """Squeeze/Unsqueeze axes as written: attribute (opset < 13) or constant input (>= 13); None if absent."""
    a = attr(node, "axes")
    if a is not None:
        return [int(x) for x in a], None
    v = _input(node, 1)
    if v is None:
        return None, None
    c = const_array(v)
    if c is None:
        return None, "axes are not constant"
    return _ints(c), None


def _squeeze_axes(node: ir.Node, in_rank: int | None, in_shape=None) -> tuple[list[int] | None, str | None]:
    """Normalized axes a Squeeze removes, given its input's rank (and shape, for the no-axes form)."""
    axes, why = _axes_param(node)
    if why:
        return None, why
    if axes is None:
        shape = in_shape if in_shape is not None else static_shape(node.inputs[0])
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None, "squeeze without axes on a shape that is not static"
        return [i for i, d in enumerate(shape) if d == 1], None
    n = _normalize_axes(axes, in_rank)
    return (n, None) if n is not None else (None, "axes invalid or rank unknown")


def _unsqueeze_axes(node: ir.Node, in_rank: int | None) -> tuple[list[int] | None, str | None]:
    """Normalized positions an Unsqueeze inserts (in output coordinates), given its input's rank."""
    axes, why = _axes_param(node)
    if why:
        return None, why
    if axes is None:
        return None, "unsqueeze without axes"
    n = _normalize_axes(axes, None if in_rank is None else in_rank + len(axes))
    return (n, None) if n is not None else (None, "axes invalid or rank unknown")


def _axes_op(b: Builder, op: str, x: ir.Value, axes: Sequence[int]) -> ir.Value:
    """A Squeeze/Unsqueeze in the model's opset form."""
    if b.opset >= 13:
        return b.op(op, [x, b.const(np.array(list(axes), np.int64), "axes")])
    return b.op(op, [x], {"axes": list(axes)})


def _reshape(b: Builder, x: ir.Value, shape: Sequence[int], allowzero: bool = False) -> ir.Value:
    attrs = {"allowzero": 1} if allowzero else None
    return b.op("Reshape", [x, b.const(np.array(list(shape), np.int64), "shape")], attrs)


def _resolve_reshape(spec: Sequence[int], in_shape: Sequence[int], allowzero: bool) -> tuple[int, ...] | None:
    """The output shape of Reshape(in_shape, spec), honoring 0 (copy) and -1 (infer); None if invalid."""
    out: list[int] = []
    infer = -1
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                return None
            out.append(in_shape[i])
        elif d == -1:
            if infer >= 0:
                return None
            infer = i
            out.append(1)
        elif d < 0:
            return None
        else:
            out.append(d)
    total = math.prod(in_shape)
    if infer >= 0:
        known = math.prod(out)
        if known == 0 or total % known:
            return None
        out[infer] = total // known
    return tuple(out) if math.prod(out) == total else None


def _clamp(v: int, dim: int) -> int:
    v = v + dim if v < 0 else v
    return min(max(v, 0), dim)


def _slice_params(node: ir.Node) -> tuple[tuple[list[int], list[int], list[int], list[int]] | None, str | None]:
    """(starts, ends, axes, steps) of a Slice: attributes before opset 10, constant inputs after."""
    if "starts" in node.attributes:
        starts = [int(x) for x in attr(node, "starts")]
        ends = [int(x) for x in attr(node, "ends", [])]
        axes_a = attr(node, "axes")
        axes = [int(x) for x in axes_a] if axes_a is not None else list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        s, e = const_array(_input(node, 1)), const_array(_input(node, 2))
        if s is None or e is None:
            return None, "starts/ends are not constant"
        starts, ends = _ints(s), _ints(e)
        av, sv = _input(node, 3), _input(node, 4)
        a = const_array(av)
        st = const_array(sv)
        if (av is not None and a is None) or (sv is not None and st is None):
            return None, "axes/steps are not constant"
        axes = _ints(a) if a is not None else list(range(len(starts)))
        steps = _ints(st) if st is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return None, "starts/ends/axes/steps differ in length"
    return (starts, ends, axes, steps), None


def _covers(start: int, end: int, step: int, dim) -> bool:
    """Does [start:end:step] on an axis of size ``dim`` (int or symbolic) select the whole axis, in order?"""
    if step != 1:
        return False
    if isinstance(dim, int):
        return _clamp(start, dim) == 0 and _clamp(end, dim) == dim
    return (start == 0 or start <= -_HUGE) and end >= _HUGE


# ---------------------------------------------------------------------------------- no-op rules


def _identity_check(node: ir.Node, m: dict) -> str | None:
    x, out = m["x"], node.outputs[0]
    if out.is_graph_output() and (x.is_graph_input() or x.is_initializer() or x.is_graph_output()):
        return "copies a graph input, initializer or output to a graph output"
    return None


def _dropout_check(node: ir.Node, m: dict) -> str | None:
    if len(node.outputs) > 1 and _live(node.outputs[1]):
        return "mask output is used"
    if _opset(node) < 7 and attr(node, "is_test", 0) != 1:
        return "training mode (is_test is not 1)"
    tm = _input(node, 2)
    if tm is not None:
        c = const_array(tm)
        if c is None:
            return "training_mode is not constant"
        if np.any(c):
            return "training_mode is true"
    return None


def _one_input_check(node: ir.Node, m: dict) -> str | None:
    n = sum(v is not None for v in node.inputs)
    return None if n == 1 else f"has {n} inputs"


def _cast_check(node: ir.Node, m: dict) -> str | None:
    if m["x"].dtype is None:
        return "input dtype unknown"
    return None if attr(node, "to") == m["x"].dtype.value else "changes the type"


def _shape_kept(node: ir.Node, m: dict) -> str | None:
    """Reshape/Flatten: guard that the (static) output shape is the input shape."""
    x, out = m["x"], node.outputs[0]
    s = static_shape(x)
    if s is None:
        return "input shape not static"
    if node.op_type == "Flatten":
        axis = attr(node, "axis", 1)
        axis = axis + len(s) if axis < 0 else axis
        target = (math.prod(s[:axis]), math.prod(s[axis:]))
    else:
        spec = const_array(node.inputs[1])
        if spec is not None:
            target = _resolve_reshape(_ints(spec), s, bool(attr(node, "allowzero", 0)))
        else:
            target = static_shape(out)
        if target is None:
            return "output shape not static"
    return None if tuple(target) == s else "changes the shape"


def _expand_check(node: ir.Node, m: dict) -> str | None:
    x = m["x"]
    shape = const_array(_input(node, 1))
    if shape is None:
        return "shape is not constant"
    if x.shape is None:
        return "input shape unknown"
    spec, dims = _ints(shape), list(x.shape)
    if len(spec) > len(dims):
        return "adds dimensions"
    for c, d in zip(reversed(spec), reversed(dims), strict=False):
        if c != 1 and not (isinstance(d, int) and d == c):
            return "broadcast changes the shape"
    return None


def _slice_check(node: ir.Node, m: dict) -> str | None:
    x = m["x"]
    params, why = _slice_params(node)
    if why:
        return why
    if x.shape is None:
        return "input rank unknown"
    starts, ends, axes, steps = params
    norm = _normalize_axes(axes, len(x.shape))
    if norm is None:
        return "axes invalid"
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = a + len(x.shape) if a < 0 else a
        if st != 1:
            return "step is not 1"
        if not _covers(s, e, st, x.shape[a]):
            return "does not cover the whole axis" if isinstance(x.shape[a], int) else "axis size unknown"
    return None


def _pad_check(node: ir.Node, m: dict) -> str | None:
    pads = attr(node, "pads", attr(node, "paddings"))
    if pads is None:
        c = const_array(_input(node, 1))
        if c is None:
            return "pads are not constant"
        pads = _ints(c)
    return None if all(int(p) == 0 for p in pads) else "pads are not zero"


def _transpose_check(node: ir.Node, m: dict) -> str | None:
    perm = attr(node, "perm")
    if perm is None:
        if m["x"].shape is None:
            return "rank unknown"
        return None if len(m["x"].shape) <= 1 else "reverses the axes"
    return None if list(perm) == list(range(len(perm))) else "permutation is not the identity"


def _split_check(node: ir.Node, m: dict) -> str | None:
    return None if len(node.outputs) == 1 else f"splits into {len(node.outputs)} parts"


def _pool_check(node: ir.Node, m: dict) -> str | None:
    kernel = attr(node, "kernel_shape")
    if kernel is None or any(k != 1 for k in kernel):
        return "window is not 1x1"
    if any(s != 1 for s in attr(node, "strides", ())):
        return "stride is not 1"
    if any(p != 0 for p in attr(node, "pads", ())):
        return "has padding"
    if any(d != 1 for d in attr(node, "dilations", ())):
        return "has dilation"
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and _live(node.outputs[1]):
        return "indices output is used"
    return None


def _resize_check(node: ir.Node, m: dict) -> str | None:
    x = m["x"]
    if attr(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        return "crops with roi"
    if node.op_type == "Upsample":
        scales_v, sizes_v = None, None
        scales = attr(node, "scales")
        if scales is None:
            scales_v = _input(node, 1)
    else:
        idx = 1 if _opset(node) < 11 else 2
        scales, scales_v, sizes_v = None, _input(node, idx), _input(node, idx + 1)
    if scales is None and scales_v is not None:
        scales = const_array(scales_v)
        if scales is None:
            return "scales are not constant"
    if scales is not None and np.asarray(scales).size > 0:
        return None if np.all(np.asarray(scales) == 1) else "scales are not all 1"
    if sizes_v is None:
        return "no scales or sizes"
    sizes = const_array(sizes_v)
    if sizes is None:
        return "sizes are not constant"
    if x.shape is None:
        return "input shape unknown"
    axes_a = attr(node, "axes")
    axes = _normalize_axes(list(axes_a), len(x.shape)) if axes_a is not None else list(range(len(x.shape)))
    if axes is None or len(axes) != np.asarray(sizes).size:
        return "sizes do not fit the input rank"
    for a, n in zip(axes, _ints(sizes), strict=True):
        if not (isinstance(x.shape[a], int) and x.shape[a] == n):
            return "sizes differ from the input shape"
    return None


def _tile_check(node: ir.Node, m: dict) -> str | None:
    if len(node.inputs) != 2:
        return "legacy Tile form"
    reps = const_array(node.inputs[1])
    if reps is None:
        return "repeats are not constant"
    return None if np.all(reps == 1) else "repeats are not all 1"


def _broadcast_keeps(x: ir.Value, c: np.ndarray) -> str | None:
    """Does broadcasting x with a constant of c's shape keep x's shape?"""
    if x.shape is None:
        return "input shape unknown"
    if c.ndim > len(x.shape):
        return "broadcasting adds dimensions"
    for cd, xd in zip(reversed(c.shape), reversed(list(x.shape)), strict=False):
        if cd != 1 and not (isinstance(xd, int) and xd == cd):
            return "broadcasting changes the shape"
    return None


def _arith_rule(name: str, op: str, value: int, sides: tuple[int, ...], doc: str) -> Rule:
    """x (op) c -> x where the constant c is all ``value`` on one of ``sides`` (the constant's index)."""

    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
            return None
        found = [(side, c) for side in sides if (c := const_array(node.inputs[side])) is not None]
        if not found:
            return None
        # prefer the side holding the neutral value; otherwise report the first constant's refusal
        side, c = next(((s, c) for s, c in found if c.size and np.all(c == value)), found[0])
        return {"x": node.inputs[1 - side], "c": c}

    def check(node: ir.Node, m: dict) -> str | None:
        c = m["c"]
        if c.size == 0 or not np.all(c == value):
            return f"constant is not {value}"
        why = _broadcast_keeps(m["x"], c)
        if why:
            return why
        out = node.outputs[0]
        if m["x"].dtype is None or (out.dtype is not None and out.dtype != m["x"].dtype):
            return "dtype unknown or changed"
        return None

    return Rule(name, (op,), pattern, check, _forward, doc=doc, family="no-op")


def _noop(name: str, ops: tuple[str, ...], check: Callable[[ir.Node, dict], str | None], doc: str,
          min_opset: int = 1) -> Rule:
    return Rule(name, ops, _first_input, check, _forward, doc=doc, family="no-op", min_opset=min_opset)


def _conv_taps_pattern(node: ir.Node) -> dict | None:
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    w = const_array(node.inputs[1])
    return None if w is None else {"x": node.inputs[0], "w": w}


def _conv_taps(node: ir.Node, m: dict) -> tuple[list[tuple[int, int]], list[int], list[int]] | str:
    """Per spatial axis the kernel positions [t0, t1) that some output reaches inside the input, and the
    padding (begin, end) once the others are dropped; or why not."""
    xs, w = static_shape(m["x"]), m["w"]
    if xs is None or len(xs) < 3 or w.ndim != len(xs):
        return "input shape unknown or rank mismatch"
    if attr(node, "auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return "auto_pad"
    r = len(xs) - 2
    strides, dils = list(attr(node, "strides", [1] * r)), list(attr(node, "dilations", [1] * r))
    pads = list(attr(node, "pads", [0] * 2 * r))
    if len(strides) != r or len(dils) != r or len(pads) != 2 * r:
        return "attribute lengths"
    keep, begin, end = [], [], []
    for i in range(r):
        n, k, st, d, pb, pe = xs[2 + i], w.shape[2 + i], strides[i], dils[i], pads[i], pads[r + i]
        o = (n + pb + pe - ((k - 1) * d + 1)) // st + 1
        if o < 1 or n < 1:
            return "empty output"
        inside = [t for t in range(k) if any(0 <= y * st + t * d - pb < n for y in range(o))]
        t0, t1 = (inside[0], inside[-1] + 1) if inside else (0, 1)
        keep.append((t0, t1))
        begin.append(pb - t0 * d)
        end.append(pe - (k - t1) * d)
    if all(t1 - t0 == w.shape[2 + i] for i, (t0, t1) in enumerate(keep)):
        return "every kernel position reaches the input"
    if min(begin + end) < 0:
        return "the padding left would be negative"
    return keep, begin, end


def _conv_taps_check(node: ir.Node, m: dict) -> str | None:
    got = _conv_taps(node, m)
    if isinstance(got, str):
        return got
    w = m["w"]
    kept = w[(slice(None), slice(None), *(slice(t0, t1) for t0, t1 in got[0]))]
    if np.count_nonzero(~np.isfinite(w)) > np.count_nonzero(~np.isfinite(kept)):  # (0 x inf is not 0)
        return "a dropped weight is not finite"
    return None


def _conv_taps_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value | None]:
    keep, begin, end = _conv_taps(node, m)  # type: ignore[misc]
    w = m["w"][(slice(None), slice(None), *(slice(t0, t1) for t0, t1 in keep))]
    r = len(keep)
    attrs = {k: v.value for k, v in node.attributes.items() if k not in ("kernel_shape", "pads", "dilations")}
    attrs["kernel_shape"] = [t1 - t0 for t0, t1 in keep]
    attrs["pads"] = begin + end
    dils = list(attr(node, "dilations", [1] * r))
    attrs["dilations"] = [d if t1 - t0 > 1 else 1 for d, (t0, t1) in zip(dils, keep, strict=True)]
    out = node.outputs[0]
    inputs = [node.inputs[0], b.const(np.ascontiguousarray(w), (node.inputs[1].name or "w") + "_taps"),
              *node.inputs[2:]]
    return [b.op("Conv", inputs, attrs, hint=out.name, dtype=out.dtype, shape=out.shape)]


NO_OP_RULES: list[Rule] = [
    _noop("identity", ("Identity",), _identity_check, "Identity(x) -> x"),
    _noop("dropout-inference", ("Dropout",), _dropout_check,
          "Dropout(x) -> x in inference (mask unused; training_mode absent or constant false)"),
    *[_noop(f"single-input-{op.lower()}", (op,), _one_input_check, f"{op}(x) with one input -> x")
      for op in ("Concat", "Sum", "Max", "Min", "Mean")],
    _noop("cast-same-type", ("Cast",), _cast_check, "Cast(x, to=dtype(x)) -> x"),
    _noop("reshape-same-shape", ("Reshape",), _shape_kept, "Reshape(x) whose static output shape is x's -> x"),
    _noop("flatten-same-shape", ("Flatten",), _shape_kept, "Flatten(x) of a 2-D x whose output shape is x's -> x"),
    _noop("expand-same-shape", ("Expand",), _expand_check,
          "Expand(x, shape) whose broadcast with x's shape is x's shape -> x"),
    _noop("slice-full", ("Slice",), _slice_check, "Slice covering every sliced axis whole, step 1 -> x"),
    _noop("pad-zero", ("Pad",), _pad_check, "Pad with all pads zero -> x"),
    _noop("transpose-identity", ("Transpose",), _transpose_check, "Transpose with the identity permutation -> x"),
    _noop("split-single", ("Split",), _split_check, "Split into one part -> x"),
    _noop("pool-unit", ("MaxPool", "AveragePool"), _pool_check,
          "1x1 MaxPool/AveragePool, stride 1, no padding or dilation (indices unused) -> x"),
    _noop("resize-unit", ("Resize", "Upsample"), _resize_check,
          "Resize/Upsample with all-unit scales or sizes equal to the input shape -> x"),
    _noop("tile-ones", ("Tile",), _tile_check, "Tile with all repeats 1 -> x"),
    Rule("conv-unreached-taps", ("Conv",), _conv_taps_pattern, _conv_taps_check, _conv_taps_rewrite,
         doc="Conv with a constant weight whose kernel rows/columns only ever meet padding (a dilation as large "
             "as the input: DeepLab's ASPP) -> Conv with those taps dropped and the padding shrunk",
         family="no-op"),
    _arith_rule("add-zero", "Add", 0, (1, 0),
                "x + 0 and 0 + x -> x where 0 does not broadcast x (-0.0 + 0 is +0.0: a zero's sign may differ)"),
    _arith_rule("sub-zero", "Sub", 0, (1,), "x - 0 -> x where 0 does not broadcast x"),
    _arith_rule("mul-one", "Mul", 1, (1, 0), "x * 1 and 1 * x -> x where 1 does not broadcast x"),
    _arith_rule("div-one", "Div", 1, (1,), "x / 1 -> x where 1 does not broadcast x"),
    _arith_rule("pow-one", "Pow", 1, (1,), "Pow(x, 1) -> x where 1 does not broadcast x"),
]


# ------------------------------------------------------------------------------ view-chain rules


def _chain_pattern(node: ir.Node) -> dict | None:
    inner = producer(_input(node, 0), _VIEW_OPS)
    return {"inner": inner, "x": inner.inputs[0]} if inner is not None and inner.inputs[0] is not None else None


def _chain_check(node: ir.Node, m: dict) -> str | None:
    if not single_use(node.inputs[0]):
        return "intermediate has other uses"
    s, o = static_shape(m["x"]), static_shape(node.outputs[0])
    if s is None or o is None:
        return "shapes not static"
    if math.prod(s) != math.prod(o):
        return "shapes disagree"
    if o != s and 0 in o:
        return "empty tensor"
    return None


def _chain_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    s, o = static_shape(m["x"]), static_shape(node.outputs[0])
    return [m["x"] if s == o else _reshape(b, m["x"], o)]


def _unit_gaps(seq: Sequence[int], unit: set[int]) -> tuple[list[int], list[int]]:
    """Split a dim sequence (x's axis index, or -1 for an inserted 1) into non-unit axes and unit runs."""
    keys: list[int] = []
    gaps = [0]
    for e in seq:
        if e < 0 or e in unit:
            gaps[-1] += 1
        else:
            keys.append(e)
            gaps.append(0)
    return keys, gaps


def _compose_pattern(node: ir.Node) -> dict | None:
    inner = producer(_input(node, 0), ("Squeeze", "Unsqueeze"))
    return {"inner": inner, "x": inner.inputs[0]} if inner is not None and inner.inputs[0] is not None else None


def _compose(node: ir.Node, m: dict) -> tuple[str | None, tuple[str, list[int]] | None]:
    """Compose Squeeze/Unsqueeze(Squeeze/Unsqueeze(x)): (why not, (op or "", axes))."""
    x, inner = m["x"], m["inner"]
    if x.shape is None:
        return "input rank unknown", None
    rank = len(x.shape)
    seq = list(range(rank))
    proven: set[int] = set()  # x axes a Squeeze removed: they are 1 in every valid run
    for op_node in (inner, node):
        if op_node.op_type == "Squeeze":
            shape = [x.shape[e] if e >= 0 else 1 for e in seq]
            axes, why = _squeeze_axes(op_node, len(seq), shape)
            if why:
                return why, None
            proven.update(seq[a] for a in axes if seq[a] >= 0)
            removed = set(axes)
            seq = [e for i, e in enumerate(seq) if i not in removed]
        else:
            axes, why = _unsqueeze_axes(op_node, len(seq))
            if why:
                return why, None
            rest, inserted = iter(seq), set(axes)
            seq = [-1 if i in inserted else next(rest) for i in range(len(seq) + len(axes))]
    unit = proven | {i for i, d in enumerate(x.shape) if isinstance(d, int) and d == 1}
    keys_in, gaps_in = _unit_gaps(range(rank), unit)
    keys_out, gaps_out = _unit_gaps(seq, unit)
    if keys_in != keys_out:  # cannot happen: only unit dims come and go
        return "axes do not compose", None
    if gaps_in == gaps_out:
        return None, ("", [])
    if all(o <= i for o, i in zip(gaps_out, gaps_in, strict=True)):
        op, src, want, have = "Squeeze", list(range(rank)), gaps_in, gaps_out
    elif all(o >= i for o, i in zip(gaps_out, gaps_in, strict=True)):
        op, src, want, have = "Unsqueeze", seq, gaps_out, gaps_in
    else:
        return "axes do not compose into one Squeeze or Unsqueeze", None
    # in each unit run, the first (want - have) unit positions are the ones removed / inserted
    axes, gap, taken = [], 0, 0
    for pos, e in enumerate(src):
        if e >= 0 and e not in unit:
            gap, taken = gap + 1, 0
            continue
        if taken < want[gap] - have[gap]:
            axes.append(pos)
            taken += 1
    return None, (op, axes)


def _compose_check(node: ir.Node, m: dict) -> str | None:
    if not single_use(node.inputs[0]):
        return "intermediate has other uses"
    why, _ = _compose(node, m)
    return why


def _compose_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value] | None:
    _, result = _compose(node, m)
    if result is None:
        return None
    op, axes = result
    return [m["x"] if not op else _axes_op(b, op, m["x"], axes)]


CHAIN_RULES: list[Rule] = [
    Rule("reshape-chain", _VIEW_OPS, _chain_pattern, _chain_check, _chain_rewrite,
         doc="Reshape/Flatten/Squeeze/Unsqueeze of one of them, static shapes -> one Reshape (or x)",
         family="reshape-chains", min_opset=5),
    Rule("squeeze-unsqueeze-compose", ("Squeeze", "Unsqueeze"), _compose_pattern, _compose_check,
         _compose_rewrite, doc="Squeeze/Unsqueeze of Squeeze/Unsqueeze -> one Squeeze or Unsqueeze (or x) "
                               "when the axes compose, symbolic dims allowed", family="reshape-chains"),
]


# -------------------------------------------------------------------------------- inverse pairs


def _pair_pattern(inner_ops: str | tuple[str, ...]) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        inner = producer(_input(node, 0), inner_ops)
        if inner is None or not inner.inputs or inner.inputs[0] is None:
            return None
        return {"inner": inner, "x": inner.inputs[0]}

    return pattern


def _squeeze_unsqueeze_check(node: ir.Node, m: dict) -> str | None:
    """Squeeze(Unsqueeze(x, a), a)."""
    rank = len(m["x"].shape) if m["x"].shape is not None else None
    a, why = _unsqueeze_axes(m["inner"], rank)
    if why:
        return why
    s, why = _squeeze_axes(node, None if rank is None else rank + len(a))
    if why:
        return why
    return None if a == s else "axes differ"


def _unsqueeze_squeeze_check(node: ir.Node, m: dict) -> str | None:
    """Unsqueeze(Squeeze(x, a), a)."""
    rank = len(m["x"].shape) if m["x"].shape is not None else None
    s, why = _squeeze_axes(m["inner"], rank)
    if why:
        return why
    a, why = _unsqueeze_axes(node, None if rank is None else rank - len(s))
    if why:
        return why
    return None if a == s else "axes differ"


def _perm(node: ir.Node, rank: int | None) -> list[int] | None:
    p = attr(node, "perm")
    if p is not None:
        return [int(i) for i in p]
    return None if rank is None else list(reversed(range(rank)))


def _transpose_compose(node: ir.Node, m: dict) -> list[int] | None:
    rank = len(m["x"].shape) if m["x"].shape is not None else None
    p1, p2 = _perm(m["inner"], rank), _perm(node, rank)
    if p1 is None or p2 is None or len(p1) != len(p2):
        return None
    return [p1[i] for i in p2]


def _transpose_pair_check(node: ir.Node, m: dict) -> str | None:
    return None if _transpose_compose(node, m) is not None else "rank unknown"


def _transpose_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    p = _transpose_compose(node, m)
    if p == list(range(len(p))):
        return [m["x"]]
    return [b.op("Transpose", [m["x"]], {"perm": p})]


def _reshape_pair_spec(node: ir.Node, m: dict) -> tuple[str | None, list[int] | None]:
    spec = const_array(_input(node, 1))
    if spec is None:
        return "shape is not constant", None
    spec = _ints(spec)
    allowzero = bool(attr(node, "allowzero", 0))
    if allowzero:
        return None, spec
    mid = node.inputs[0].shape
    out = []
    for i, d in enumerate(spec):
        if d == 0:  # copies the intermediate's dim i: only known when that dim is static
            if mid is None or i >= len(mid) or not isinstance(mid[i], int):
                return "0 copies an intermediate dim that is unknown", None
            out.append(mid[i])
        else:
            out.append(d)
    return None, out


def _reshape_pair_check(node: ir.Node, m: dict) -> str | None:
    why, spec = _reshape_pair_spec(node, m)
    if why:
        return why
    if 0 in spec and not attr(node, "allowzero", 0) and _opset(node) < 14:
        return "a resolved dim is 0 and allowzero needs opset 14"
    return None


def _reshape_pair_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    _, spec = _reshape_pair_spec(node, m)
    s, o = static_shape(m["x"]), static_shape(node.outputs[0])
    if s is not None and s == o:
        return [m["x"]]
    return [_reshape(b, m["x"], spec, allowzero=0 in spec)]


# integer ranges and float precisions/limits for the lossless-cast table
_INT_RANGE = {D.INT4: (-8, 7), D.UINT4: (0, 15), D.INT8: (-(2**7), 2**7 - 1), D.UINT8: (0, 2**8 - 1),
              D.INT16: (-(2**15), 2**15 - 1), D.UINT16: (0, 2**16 - 1), D.INT32: (-(2**31), 2**31 - 1),
              D.UINT32: (0, 2**32 - 1), D.INT64: (-(2**63), 2**63 - 1), D.UINT64: (0, 2**64 - 1)}
_FLOAT_BITS = {D.BFLOAT16: 8, D.FLOAT16: 11, D.FLOAT: 24, D.DOUBLE: 53}  # significand bits
_FLOAT_WIDER = {D.BFLOAT16: {D.FLOAT, D.DOUBLE}, D.FLOAT16: {D.FLOAT, D.DOUBLE}, D.FLOAT: {D.DOUBLE}}


def holds_exactly(a: ir.DataType, b: ir.DataType) -> bool:
    """Does type ``b`` hold every value of type ``a`` exactly (so Cast a->b->a is the identity)?"""
    if a == b:
        return True
    if a == D.BOOL:
        return b in _INT_RANGE or b in _FLOAT_BITS
    if a in _INT_RANGE:
        lo, hi = _INT_RANGE[a]
        if b in _INT_RANGE:
            blo, bhi = _INT_RANGE[b]
            return blo <= lo and hi <= bhi
        if b in _FLOAT_BITS:
            return max(-lo, hi) <= 2 ** _FLOAT_BITS[b]
        return False
    return b in _FLOAT_WIDER.get(a, set())


def _cast_pair_check(node: ir.Node, m: dict) -> str | None:
    x = m["x"]
    if x.dtype is None:
        return "input dtype unknown"
    if attr(node, "to") != x.dtype.value:
        return "does not cast back to the input type"
    mid = ir.DataType(attr(m["inner"], "to"))
    return None if holds_exactly(x.dtype, mid) else f"{mid.name} does not hold every {x.dtype.name} value"


_Q_EXACT = {D.FLOAT: {D.INT4, D.UINT4, D.INT8, D.UINT8, D.INT16, D.UINT16},
            D.FLOAT16: {D.INT4, D.UINT4, D.INT8, D.UINT8}}
_SCALE_RANGE = {D.FLOAT: (1e-30, 1e30), D.FLOAT16: (2.0**-14, 255.0)}


def _same_qparams(a: ir.Node, b: ir.Node, rank: int | None) -> str | None:
    """Do two Q/DQ nodes use equal scale, zero point, axis and block size (constants, by value)?"""
    sa, sb = const_array(_input(a, 1)), const_array(_input(b, 1))
    if sa is None or sb is None:
        return "scale is not constant"
    if sa.shape != sb.shape or sa.dtype != sb.dtype or not np.array_equal(sa, sb):
        return "scales differ"
    za_v, zb_v = _input(a, 2), _input(b, 2)
    za, zb = const_array(za_v), const_array(zb_v)
    if (za_v is not None and za is None) or (zb_v is not None and zb is None):
        return "zero point is not constant"
    za = np.zeros(sa.shape, np.int64) if za is None else za
    zb = np.zeros(sa.shape, np.int64) if zb is None else zb
    if za.shape != zb.shape or not np.array_equal(za.astype(np.int64), zb.astype(np.int64)):
        return "zero points differ"
    if sa.size > 1:
        axes = [int(attr(n, "axis", 1)) for n in (a, b)]
        norm = [_normalize_axes([ax], rank) for ax in axes]
        if None in norm or norm[0] != norm[1]:
            return "axes differ or rank unknown"
    if attr(a, "block_size", 0) != attr(b, "block_size", 0):
        return "block sizes differ"
    return None


def _dq_q_check(node: ir.Node, m: dict) -> str | None:
    """QuantizeLinear(DequantizeLinear(q)) -> q."""
    q, out = m["x"], node.outputs[0]
    if q.dtype is None or out.dtype is None or q.dtype != out.dtype:
        return "quantized types differ or are unknown"
    rank = len(q.shape) if q.shape is not None else None
    why = _same_qparams(m["inner"], node, rank)
    if why:
        return why
    scale = const_array(node.inputs[1])
    sdtype = ir.DataType.from_numpy(scale.dtype)
    if q.dtype not in _Q_EXACT.get(sdtype, set()):
        return f"{q.dtype.name} values do not survive a {sdtype.name} round trip"
    lo, hi = _SCALE_RANGE[sdtype]
    mag = np.abs(scale.astype(np.float64))
    if not (np.all(np.isfinite(mag)) and np.all(mag >= lo) and np.all(mag <= hi)):
        return "scale is zero, too small or too large for an exact round trip"
    return None


def _q_dq_check(node: ir.Node, m: dict) -> str | None:
    """DequantizeLinear(QuantizeLinear(x)) -> x (lossy)."""
    x, out = m["x"], node.outputs[0]
    if x.dtype is None or out.dtype is None or x.dtype != out.dtype:
        return "float types differ or are unknown"
    return _same_qparams(m["inner"], node, len(x.shape) if x.shape is not None else None)


def _concat_slice_pick(node: ir.Node, m: dict) -> tuple[str | None, ir.Value | None]:
    concat: ir.Node = m["inner"]
    params, why = _slice_params(node)
    if why:
        return why, None
    out = concat.outputs[0]
    if out.shape is None:
        return "concat shape unknown", None
    rank = len(out.shape)
    caxis = attr(concat, "axis", 0)
    caxis = caxis + rank if caxis < 0 else caxis
    starts, ends, axes, steps = params
    if _normalize_axes(axes, rank) is None:
        return "axes invalid", None
    picked = None
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        a = a + rank if a < 0 else a
        if st != 1:
            return "step is not 1", None
        if a == caxis:
            picked = (s, e)
        elif not _covers(s, e, st, out.shape[a]):
            return "slices another axis", None
    if picked is None:
        return "does not slice the concat axis", None
    dims = [v.shape[caxis] if v is not None and v.shape is not None and len(v.shape) == rank else None
            for v in concat.inputs]
    if not all(isinstance(d, int) for d in dims):
        return "concat input sizes unknown", None
    total = sum(dims)
    s, e = _clamp(picked[0], total), _clamp(picked[1], total)
    offset = 0
    for v, d in zip(concat.inputs, dims, strict=True):
        if (s, e) == (offset, offset + d) and d > 0:
            return None, v
        offset += d
    return "selects no single concat input", None


def _concat_slice_check(node: ir.Node, m: dict) -> str | None:
    return _concat_slice_pick(node, m)[0]


def _concat_slice_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value] | None:
    why, v = _concat_slice_pick(node, m)
    return None if why else [v]


INVERSE_RULES: list[Rule] = [
    Rule("squeeze-of-unsqueeze", ("Squeeze",), _pair_pattern("Unsqueeze"), _squeeze_unsqueeze_check,
         _forward, doc="Squeeze(Unsqueeze(x, a), a) -> x", family="inverse-pairs"),
    Rule("unsqueeze-of-squeeze", ("Unsqueeze",), _pair_pattern("Squeeze"), _unsqueeze_squeeze_check,
         _forward, doc="Unsqueeze(Squeeze(x, a), a) -> x (squeezed dims are 1)", family="inverse-pairs"),
    Rule("transpose-transpose", ("Transpose",), _pair_pattern("Transpose"), _transpose_pair_check,
         _transpose_rewrite, doc="Transpose(Transpose(x, p), q) -> Transpose(x, p[q]), or x if the identity",
         family="inverse-pairs"),
    Rule("reshape-reshape", ("Reshape",), _pair_pattern("Reshape"), _reshape_pair_check, _reshape_pair_rewrite,
         doc="Reshape(Reshape(x), s) -> Reshape(x, s) with 0s resolved against the intermediate shape",
         family="inverse-pairs", min_opset=5),
    Rule("cast-roundtrip", ("Cast",), _pair_pattern("Cast"), _cast_pair_check, _forward,
         doc="Cast(Cast(x, B), A) -> x when x is A and B holds every A value", family="inverse-pairs"),
    Rule("dequantize-quantize", ("QuantizeLinear",), _pair_pattern("DequantizeLinear"), _dq_q_check, _forward,
         doc="QuantizeLinear(DequantizeLinear(q, s, z), s, z) -> q (8/16-bit q, scales in a safe range)",
         family="inverse-pairs", min_opset=10),
    Rule("concat-slice", ("Slice",), _pair_pattern("Concat"), _concat_slice_check, _concat_slice_rewrite,
         doc="Slice(Concat(a, b, ...)) selecting exactly one input -> that input", family="inverse-pairs"),
]

LOSSY_RULES: list[Rule] = [
    Rule("quantize-dequantize", ("DequantizeLinear",), _pair_pattern("QuantizeLinear"), _q_dq_check, _forward,
         doc="DequantizeLinear(QuantizeLinear(x, s, z), s, z) -> x (drops the rounding: changes values)",
         family="inverse-pairs", exact=False, min_opset=10),
]

RULES: list[Rule] = [*NO_OP_RULES, *CHAIN_RULES, *INVERSE_RULES, *LOSSY_RULES]


# -------------------------------------------------------------------------------------- passes


class NoOpElimination(RulePass):
    name = "no-op"
    doc = "remove ops that compute nothing (Identity, inference Dropout, x+0, unit Resize, ...)"
    rules = NO_OP_RULES


class ReshapeChains(RulePass):
    name = "reshape-chains"
    doc = "collapse chains of Reshape/Flatten/Squeeze/Unsqueeze into one view op"
    rules = CHAIN_RULES


class InversePairs(RulePass):
    name = "inverse-pairs"
    doc = "remove pairs of ops that undo each other (Squeeze/Unsqueeze, Transposes, Casts, DQ->Q, ...)"

    def __init__(self, allow_lossy: bool = False) -> None:
        super().__init__()
        self.allow_lossy = allow_lossy
        self.rules = [*INVERSE_RULES, *(LOSSY_RULES if allow_lossy else [])]
