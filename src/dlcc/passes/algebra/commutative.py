"""Commutative rules: reorder ops that commute so that elementwise work runs on fewer elements, layout
ops meet (and cancel in ``inverse-pairs``), and constant operands sit in one canonical place.

What goes in: a model with inferred shapes. What comes out: the same function; every rule marked
``exact`` gives bit-identical results (it only reorders an elementwise op and a data-movement op).

The rules, by direction (each firing strictly reduces elements processed or removes a node, so the set
cannot cycle; together with ``hoist`` — which moves Slice/Gather up and Transpose/Reshape down past
elementwise ops — every op moves one way only):

    pointwise f (a unary op, or a binary op with scalar-constant other operands):
        f(Expand(x)) / f(Tile(x)) / f(Resize-nearest(x)) / f(Pad(x)) / f(enlarging Gather(x))
                                             -> Expand/Tile/Resize/Pad/Gather(f(x))
        f(Concat(x, .., x))                  -> Concat(f(x), .., f(x))
        MaxPool/GlobalMaxPool(f(x))          -> f(pool(x))   (f monotone non-decreasing)
        GatherElements/GatherND/Compress(f(x)) -> f(gather(x))   (when it selects fewer elements)
    binary op of two operands moved by the same data-movement op L (equal parameters):
        op(L(a), L(b)) -> L(op(a, b))   for Transpose, Reshape (ops distributive.py leaves), Flatten,
                                       Squeeze, Unsqueeze, Expand, Tile, DepthToSpace, SpaceToDepth,
                                       Resize-nearest, Pad, enlarging Gather
        op(Concat(a1, a2), Concat(b1, b2)) -> Concat(op(a1, b1), op(a2, b2))
    canonical order: c + x -> x + c, c * x -> x * c, Max/Min/Equal(c, x) -> (x, c). No rule in dlcc
        moves a constant to the left operand of these ops.
    Relu(x) - Relu(-x) -> x.

ReduceMax/ReduceMin of monotone f or of Neg live in reduction.py; Transpose/Reshape past Add/Sub/Mul/Div
in distributive.py; Slice/Gather up and Transpose/Reshape down past elementwise ops in hoist.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.frontend.shapes import broadcast_shapes
from dlcc.passes.algebra.match import float_dtype
from dlcc.passes.hoist import BROADCASTING, UNARY
from dlcc.passes.rewrite import Builder, Rule, attr, const_array, producer, static_shape

FAMILY = "commutative"

# Binary ops whose operands may be swapped without changing any bit (ONNX broadcasting is symmetric).
CANONICAL = ("Add", "Mul", "Max", "Min", "Equal")
# Exactly monotone non-decreasing (piecewise linear or rounding; no approximated transcendental).
MONOTONE_EXACT = frozenset({"Relu", "LeakyRelu", "Clip", "Floor", "Ceil", "Round", "Sign", "Identity"})
# Monotone non-decreasing mathematically; vectorized implementations may not be monotone to the last bit.
MONOTONE_SMOOTH = frozenset({"Sigmoid", "Tanh", "Exp", "Erf", "Softplus", "Softsign", "Atan", "Asinh",
                             "Sinh", "Elu", "Selu", "Celu", "HardSigmoid"})
# f(0) == 0 (so a zero constant Pad commutes with f).
ZERO_PRESERVING = frozenset({"Relu", "LeakyRelu", "Neg", "Abs", "Tanh", "Erf", "Sign", "Floor", "Ceil",
                             "Round", "Softsign", "Sin", "Asinh", "Atan", "Sinh", "Tan", "Asin", "Sqrt",
                             "Identity", "Elu", "Celu", "Selu", "Atanh"})
ARITH = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"})
LOGIC = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor"})


# ------------------------------------------------------------------------------------------ helpers


def _uses(v: ir.Value) -> list:
    """Uses by nodes in a graph (a candidate rewrite the driver did not apply leaves detached readers)."""
    return [u for u in v.uses() if u.node.graph is not None]


def _used_only_by(v: ir.Value | None, node: ir.Node) -> bool:
    return v is not None and not v.is_graph_output() and bool(_uses(v)) and all(
        u.node is node for u in _uses(v))


def _size(shape) -> int | None:
    return None if shape is None else int(np.prod(shape, dtype=np.int64))


def _copy_attrs(node: ir.Node) -> dict[str, ir.Attr]:
    return {k: ir.Attr(a.name, a.type, a.value) for k, a in node.attributes.items()}


def _pointwise(e: ir.Node | None) -> bool:
    return (e is not None and e.domain in ("", "ai.onnx") and len(e.outputs) == 1
            and (e.op_type in UNARY or (e.op_type in BROADCASTING and e.op_type != "Where"
                                        and len(e.inputs) == 2)))


def _data_index(e: ir.Node) -> int | None:
    """Which input of pointwise ``e`` carries data: the others must be scalar constants (or, for a
    unary op, its scalar parameters such as Clip's bounds). None if there is no single data input."""
    if e.op_type in UNARY:
        return 0
    idx = [i for i, v in enumerate(e.inputs) if v is not None and not _scalar_const(v)]
    return idx[0] if len(idx) == 1 else None


def _scalar_const(v: ir.Value | None) -> bool:
    c = const_array(v)
    return c is not None and c.size == 1


def _param_rank_ok(e: ir.Node, i: int, rank: int) -> bool:
    """Scalar operands of ``e`` do not raise the rank of data of rank ``rank``."""
    for j, v in enumerate(e.inputs):
        if j != i and v is not None and v.shape is not None and len(v.shape) > rank:
            return False
    return True


def _rebuild(b: Builder, e: ir.Node, i: int, x: ir.Value, shape=None) -> ir.Value:
    """``e`` with its data input ``i`` replaced by ``x``."""
    inputs = list(e.inputs)
    inputs[i] = x
    return b.op(e.op_type, inputs, _copy_attrs(e), hint=e.op_type.lower(), dtype=e.outputs[0].dtype,
                shape=shape)


def _with_input(b: Builder, n: ir.Node, x: ir.Value, shape=None, dtype=None) -> ir.Value:
    """A copy of data-movement node ``n`` reading ``x`` (its parameter inputs are kept)."""
    return b.op(n.op_type, [x, *n.inputs[1:]], _copy_attrs(n), hint=n.op_type.lower(),
                dtype=dtype or n.outputs[0].dtype, shape=shape)


# --------------------------------------------------- pointwise f before an op that makes copies


def _before_pattern(op: str) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        if not _pointwise(node):
            return None
        i = _data_index(node)
        if i is None:
            return None
        m = producer(node.inputs[i], op)
        return None if m is None else {"m": m, "i": i, "x": m.inputs[0]}
    return pattern


def _before_check(kind: str) -> Callable[[ir.Node, dict], str | None]:
    def check(node: ir.Node, cap: dict) -> str | None:
        m, i, x = cap["m"], cap["i"], cap["x"]
        if not _used_only_by(m.outputs[0], node):
            return f"{m.op_type} result has other uses"
        sx, so = static_shape(x), static_shape(m.outputs[0])
        if sx is None or so is None:
            return "shapes unknown"
        if not _param_rank_ok(node, i, len(sx)):
            return "scalar operand raises the rank"
        if kind == "concat":
            vals = [id(v) for v in m.inputs]
            if len(set(vals)) == len(vals):
                return "no repeated concat input"
            return None
        if _size(sx) >= _size(so):
            return f"{m.op_type} does not enlarge the tensor"
        if kind == "resize":
            if attr(m, "mode", "nearest") != "nearest":
                return "resize mode is not nearest"
            if attr(m, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
                return "resize may write the extrapolation value"
            if not (float_dtype(x) and float_dtype(node.outputs[0])):
                return "dtype not float"
        if kind == "pad":
            if node.outputs[0].dtype != x.dtype:
                return "op changes the dtype"
            if _pad_mode(m) == "constant" and not _maps_zero(node, i, m):
                return "op does not map the pad value to itself"
        return None
    return check


def _pad_mode(m: ir.Node) -> str:
    mode = attr(m, "mode", "constant")
    return mode.decode() if isinstance(mode, bytes) else mode


def _maps_zero(e: ir.Node, i: int, pad: ir.Node) -> bool:
    cv = pad.inputs[2] if len(pad.inputs) > 2 and pad.inputs[2] is not None else None
    if cv is not None:
        c = const_array(cv)
        if c is None or np.any(c != 0):
            return False
    if attr(pad, "value", 0.0) != 0.0:
        return False
    op = e.op_type
    if op in ZERO_PRESERVING:
        return True
    if op == "Clip":
        lo = const_array(e.inputs[1]) if len(e.inputs) > 1 and e.inputs[1] is not None else None
        hi = const_array(e.inputs[2]) if len(e.inputs) > 2 and e.inputs[2] is not None else None
        return ((lo is None or float(lo) <= 0) and (hi is None or float(hi) >= 0)
                and not any(v is not None and const_array(v) is None for v in e.inputs[1:]))
    if op == "Mul" or (op == "Div" and i == 0):
        c = const_array(e.inputs[1 - i])
        return c is not None and bool(np.all(np.isfinite(c))) and (op == "Mul" or bool(np.all(c != 0)))
    return False


def _before_rewrite(node: ir.Node, cap: dict, b: Builder):
    m, i, x = cap["m"], cap["i"], cap["x"]
    if m.op_type == "Concat":
        done: dict[int, ir.Value] = {}
        parts = []
        for v in m.inputs:
            if id(v) not in done:
                done[id(v)] = _rebuild(b, node, i, v, shape=v.shape)
            parts.append(done[id(v)])
        return [b.op("Concat", parts, _copy_attrs(m), hint="concat", dtype=node.outputs[0].dtype)]
    y = _rebuild(b, node, i, x, shape=x.shape)
    return [_with_input(b, m, y, dtype=node.outputs[0].dtype)]


def _before_rule(op: str, kind: str, doc: str, min_opset: int = 1) -> Rule:
    return Rule(f"comm-pointwise-before-{kind}", tuple(sorted(UNARY | BROADCASTING)), _before_pattern(op),
                _before_check(kind), _before_rewrite, doc=doc, family=FAMILY, exact=True, min_opset=min_opset,
                input_ops=frozenset({op}))


# --------------------------------------------------- pointwise f after an op that selects or reduces


def _monotone(e: ir.Node, i: int, ops: frozenset[str]) -> bool:
    """``e`` as a function of its data input is monotone non-decreasing (within ``ops`` for unary)."""
    op = e.op_type
    if op in UNARY:
        if op not in ops:
            return False
        if op in ("LeakyRelu", "Elu", "Celu", "HardSigmoid"):
            return attr(e, "alpha", 0.01 if op == "LeakyRelu" else 1.0 if op != "HardSigmoid" else 0.2) >= 0
        if op == "Selu":
            return attr(e, "alpha", 1.67) >= 0 and attr(e, "gamma", 1.05) >= 0
        return True
    if ops is MONOTONE_SMOOTH:
        return False
    c = const_array(e.inputs[1 - i])
    if c is None:
        return False
    if op in ("Add", "Max", "Min") or (op == "Sub" and i == 0):
        return bool(np.all(np.isfinite(c)))
    if op in ("Mul", "Div") and (op == "Mul" or i == 0):
        return bool(np.all(np.isfinite(c) & (c > 0)))
    return False


def _after_pattern(node: ir.Node) -> dict | None:
    e = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if not _pointwise(e):
        return None
    i = _data_index(e)
    return None if i is None else {"e": e, "i": i, "x": e.inputs[i]}


# BatchNormalization: linear fusion folds it into the Conv before it, so its activation becomes the Conv's too
_EPILOGUE_PRODUCERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization"})


def _is_epilogue(e: ir.Node) -> bool:
    """An activation right after a Conv/Gemm/MatMul that only it reads: runtimes (and dlcc's backend) fuse
    it into that op's epilogue, so moving it elsewhere saves nothing and loses the fusion."""
    x, consumer = (e.inputs[0] if e.inputs else None), e
    while x is not None and _used_only_by(x, consumer):
        p = x.producer()
        if p is None or p.domain not in ("", "ai.onnx"):
            return False
        if p.op_type in _EPILOGUE_PRODUCERS:
            return True
        # a per-channel affine step (x*s, x+b...) folds into the op above it: look through it
        if p.op_type not in ("Add", "Sub", "Mul", "Div") or len(p.inputs) != 2 or const_array(p.inputs[1]) is None:
            return False
        x, consumer = p.inputs[0], p
    return False


def _after_check(monotone: frozenset[str] | None) -> Callable[[ir.Node, dict], str | None]:
    def check(node: ir.Node, cap: dict) -> str | None:
        e, i, x = cap["e"], cap["i"], cap["x"]
        if not _used_only_by(e.outputs[0], node):
            return "pointwise result has other uses"
        if _is_epilogue(e):
            return "the op is its producer's fused epilogue (Conv/Gemm/MatMul + activation costs nothing)"
        if any(o is not None and (_uses(o) or o.is_graph_output()) for o in node.outputs[1:]):
            return "second output is used"
        if monotone is not None:
            if not _monotone(e, i, monotone):
                return "op is not monotone non-decreasing"
            if e.outputs[0].dtype != x.dtype:
                return "op changes the dtype"
        si, so = static_shape(x), static_shape(node.outputs[0])
        if node.op_type == "Compress" and si is not None:
            cond = const_array(node.inputs[1])
            if cond is None:
                return "condition is not constant"
            axis = attr(node, "axis")
            kept = int(np.count_nonzero(cond[: (_size(si) if axis is None else si[axis])]))
            so = (kept,) if axis is None else si[:axis] + (kept,) + si[axis + 1:]
        if si is None or so is None:
            return "shapes unknown"
        if not _param_rank_ok(e, i, len(so)):
            return "scalar operand raises the rank"
        if _size(so) >= _size(si):
            return f"{node.op_type} does not shrink the tensor"
        return None
    return check


def _after_rewrite(node: ir.Node, cap: dict, b: Builder):
    e, i, x = cap["e"], cap["i"], cap["x"]
    outs = [b.op(node.op_type, [x, *node.inputs[1:]], _copy_attrs(node), hint=node.op_type.lower(),
                 dtype=x.dtype, shape=node.outputs[0].shape)]
    y = _rebuild(b, e, i, outs[0], shape=node.outputs[0].shape)
    return [y, *([None] * (len(node.outputs) - 1))]


def _after_rule(name: str, roots: tuple[str, ...], monotone: frozenset[str] | None, doc: str,
                exact: bool = True) -> Rule:
    return Rule(f"comm-{name}", roots, _after_pattern, _after_check(monotone), _after_rewrite, doc=doc,
                family=FAMILY, exact=exact)


# ---------------------------------------------------------------- op(L(a), L(b)) -> L(op(a, b))


def _same_params(p: ir.Node, q: ir.Node) -> bool:
    if p.op_type != q.op_type or p.domain != q.domain or len(p.inputs) != len(q.inputs):
        return False
    if {k: a.value for k, a in p.attributes.items()} != {k: a.value for k, a in q.attributes.items()}:
        return False
    for u, v in zip(p.inputs[1:], q.inputs[1:], strict=True):
        if u is v:
            continue
        cu, cv = const_array(u), const_array(v)
        if cu is None or cv is None or cu.dtype != cv.dtype or cu.shape != cv.shape or not np.array_equal(cu, cv):
            return False
    return True


def _pair_pattern(op: str) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or len(node.outputs) != 1:
            return None
        p, q = producer(node.inputs[0], op), producer(node.inputs[1], op)
        if p is None or q is None or p is q:
            return None
        return {"p": p, "q": q, "a": p.inputs[0], "b": q.inputs[0]}
    return pattern


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _pair_check(kind: str) -> Callable[[ir.Node, dict], str | None]:
    def check(node: ir.Node, cap: dict) -> str | None:
        p, q, a, b = cap["p"], cap["q"], cap["a"], cap["b"]
        if not (_used_only_by(p.outputs[0], node) and _used_only_by(q.outputs[0], node)):
            return "a layout result has other uses"
        if not _same_params(p, q):
            return "layout parameters differ"
        if a.dtype != b.dtype:
            return "operand dtypes differ"
        if kind in ("transpose", "squeeze", "unsqueeze"):
            if _rank(a) is None or _rank(a) != _rank(b):
                return "operand ranks differ or unknown"
            no_axes = attr(p, "axes") is None and (len(p.inputs) < 2 or p.inputs[1] is None)
            if kind == "squeeze" and no_axes and (static_shape(a) is None or static_shape(a) != static_shape(b)):
                return "squeeze without axes on operands of different shapes"
            return None
        if kind == "expand":
            sa, sb, so = static_shape(a), static_shape(b), static_shape(node.outputs[0])
            if sa is None or sb is None or so is None:
                return "shapes unknown"
            ab = broadcast_shapes([ir.Shape(list(sa)), ir.Shape(list(sb))])
            if ab is None or _size(ab) >= _size(so):
                return "operands broadcast to the full shape"
            return None
        sa, sb = static_shape(a), static_shape(b)
        if sa is None or sa != sb:
            return "operand shapes differ or unknown"
        if kind == "gather" and _size(sa) >= _size(static_shape(node.outputs[0]) or (0,)):
            return "gather does not enlarge the tensor"
        if kind in ("resize", "pad", "depthtospace", "spacetodepth") and node.op_type not in ARITH:
            return "op is not arithmetic"
        if kind == "resize" and (attr(p, "mode", "nearest") != "nearest" or not float_dtype(a) or attr(
                p, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"):
            return "not a nearest resize of float arithmetic"
        if kind == "pad" and _pad_mode(p) == "constant":
            cv = const_array(p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] is not None else 0
            if cv is None or np.any(np.asarray(cv) != 0) or attr(p, "value", 0.0) != 0.0:
                return "pad value is not zero"
            if node.op_type not in ("Add", "Sub", "Mul", "Max", "Min"):
                return "op does not map (0, 0) to 0"
        return None
    return check


def _pair_rewrite(node: ir.Node, cap: dict, b: Builder):
    p = cap["p"]
    shape = broadcast_shapes([cap["a"].shape, cap["b"].shape])
    y = b.op(node.op_type, [cap["a"], cap["b"]], _copy_attrs(node), hint=node.op_type.lower(),
             dtype=node.outputs[0].dtype, shape=shape)
    return [_with_input(b, p, y, dtype=node.outputs[0].dtype, shape=node.outputs[0].shape)]


_PAIR_ROOTS = tuple(sorted(ARITH | LOGIC | {"Mod"}))
# distributive.py already moves Transpose/Reshape past Add/Sub/Mul/Div (dist-transpose-*, dist-reshape-*)
_NOT_DISTRIBUTIVE = tuple(op for op in _PAIR_ROOTS if op not in ("Add", "Sub", "Mul", "Div"))


def _pair_rule(op: str, kind: str, roots=_PAIR_ROOTS) -> Rule:
    only = "" if roots is _PAIR_ROOTS else " (Max/Min/Pow/Mod, comparisons, logic; dist-* has the rest)"
    return Rule(f"comm-binary-of-{kind}s", roots, _pair_pattern(op), _pair_check(kind), _pair_rewrite,
                doc=f"op({op}(a), {op}(b)) -> {op}(op(a, b)) with equal {op} parameters{only}", family=FAMILY,
                exact=True, input_ops=frozenset({op}))


def _concat_pair_pattern(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    p, q = producer(node.inputs[0], "Concat"), producer(node.inputs[1], "Concat")
    if p is None or q is None or p is q or len(p.inputs) != len(q.inputs):
        return None
    return {"p": p, "q": q}


def _concat_pair_check(node: ir.Node, cap: dict) -> str | None:
    p, q = cap["p"], cap["q"]
    if not (_used_only_by(p.outputs[0], node) and _used_only_by(q.outputs[0], node)):
        return "a Concat result has other uses"
    r = _rank(p.outputs[0])
    if r is None or _rank(q.outputs[0]) != r:
        return "ranks differ or unknown"
    ka, kb = attr(p, "axis", 0), attr(q, "axis", 0)
    if (ka + r if ka < 0 else ka) != (kb + r if kb < 0 else kb):
        return "concat axes differ"
    for u, v in zip(p.inputs, q.inputs, strict=True):
        if static_shape(u) is None or static_shape(u) != static_shape(v):
            return "pieces do not align"
        if const_array(u) is not None or const_array(v) is not None:
            return "constant pieces (folding's job)"
    return None


def _concat_pair_rewrite(node: ir.Node, cap: dict, b: Builder):
    parts = [b.op(node.op_type, [u, v], _copy_attrs(node), hint=node.op_type.lower(), dtype=node.outputs[0].dtype,
                  shape=u.shape) for u, v in zip(cap["p"].inputs, cap["q"].inputs, strict=True)]
    return [b.op("Concat", parts, _copy_attrs(cap["p"]), hint="concat", dtype=node.outputs[0].dtype)]


# ---------------------------------------------------------------------------------- canonical order


def _const_left_pattern(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    if const_array(node.inputs[0]) is None:
        return None
    return {}


def _const_left_check(node: ir.Node, m: dict) -> str | None:
    if const_array(node.inputs[1]) is not None:
        return "both operands constant (constant folding's job)"
    return None


def _const_left_rewrite(node: ir.Node, cap: dict, b: Builder):
    a, c = node.inputs[1], node.inputs[0]
    return [b.op(node.op_type, [a, c], _copy_attrs(node), hint=node.op_type.lower(),
                 dtype=node.outputs[0].dtype, shape=node.outputs[0].shape)]


def _canonical_rule(op: str) -> Rule:
    return Rule(f"comm-{op.lower()}-const-right", (op,), _const_left_pattern, _const_left_check,
                _const_left_rewrite, doc=f"{op}(c, x) -> {op}(x, c): constants on the right",
                family=FAMILY, exact=True)


# ----------------------------------------------------------------------------- Relu(x) - Relu(-x)


def _relu_diff_pattern(node: ir.Node) -> dict | None:
    r1, r2 = producer(node.inputs[0], "Relu"), producer(node.inputs[1], "Relu")
    if r1 is None or r2 is None:
        return None
    n = producer(r2.inputs[0], "Neg")
    if n is None or n.inputs[0] is not r1.inputs[0]:
        return None
    return {"x": r1.inputs[0]}


def _relu_diff_check(node: ir.Node, cap: dict) -> str | None:
    x = cap["x"]
    if not float_dtype(x):
        return "dtype not float"
    if x.shape is None or node.outputs[0].shape is None or x.shape != node.outputs[0].shape:
        return "shapes unknown"
    return None


RULES: list[Rule] = [
    _before_rule("Expand", "expand", "f(Expand(x, s)) -> Expand(f(x), s): compute before copying"),
    _before_rule("Tile", "tile", "f(Tile(x, r)) -> Tile(f(x), r): compute before copying"),
    _before_rule("Resize", "resize", "f(Resize-nearest(x)) -> Resize-nearest(f(x)) when upsampling",
                 min_opset=10),
    _before_rule("Concat", "concat", "f(Concat(x, .., x)) -> Concat(f(x), .., f(x)): f(x) once per value"),
    _before_rule("Gather", "gather", "f(Gather(x, i)) -> Gather(f(x), i) when the gather enlarges (lookups)"),
    _before_rule("Pad", "pad", "f(Pad(x)) -> Pad(f(x)) (edge/reflect, or zero pad with f(0) = 0)",
                 min_opset=11),
    _after_rule("monotone-after-maxpool", ("MaxPool",), MONOTONE_EXACT,
                "MaxPool(f(x)) -> f(MaxPool(x)) for monotone piecewise-linear f"),
    _after_rule("monotone-after-globalmaxpool", ("GlobalMaxPool",), MONOTONE_EXACT,
                "GlobalMaxPool(f(x)) -> f(GlobalMaxPool(x)) for monotone piecewise-linear f"),
    _after_rule("smooth-after-maxpool", ("MaxPool", "GlobalMaxPool"), MONOTONE_SMOOTH,
                "MaxPool/GlobalMaxPool(f(x)) -> f(pool(x)) for monotone transcendental f", exact=False),
    _after_rule("pointwise-after-gatherelements", ("GatherElements",), None,
                "GatherElements(f(x), i) -> f(GatherElements(x, i)) when it selects fewer elements"),
    _after_rule("pointwise-after-gathernd", ("GatherND",), None,
                "GatherND(f(x), i) -> f(GatherND(x, i)) when it selects fewer elements"),
    _after_rule("pointwise-after-compress", ("Compress",), None,
                "Compress(f(x), c) -> f(Compress(x, c)) when it selects fewer elements"),
    _pair_rule("Transpose", "transpose", _NOT_DISTRIBUTIVE),
    _pair_rule("Reshape", "reshape", _NOT_DISTRIBUTIVE),
    _pair_rule("Flatten", "flatten"),
    _pair_rule("Squeeze", "squeeze"),
    _pair_rule("Unsqueeze", "unsqueeze"),
    _pair_rule("Expand", "expand"),
    _pair_rule("Tile", "tile"),
    _pair_rule("DepthToSpace", "depthtospace"),
    _pair_rule("SpaceToDepth", "spacetodepth"),
    _pair_rule("Resize", "resize"),
    _pair_rule("Pad", "pad"),
    _pair_rule("Gather", "gather"),
    Rule("comm-binary-of-concats", _PAIR_ROOTS, _concat_pair_pattern, _concat_pair_check, _concat_pair_rewrite,
         doc="op(Concat(a1, a2), Concat(b1, b2)) -> Concat(op(a1, b1), op(a2, b2)) for aligned pieces",
         family=FAMILY, exact=True, input_ops=frozenset({"Concat"})),
    *[_canonical_rule(op) for op in CANONICAL],
    Rule("comm-relu-minus-relu-neg", ("Sub",), _relu_diff_pattern, _relu_diff_check,
         lambda node, m, b: [m["x"]], doc="Relu(x) - Relu(-x) -> x (a zero may change sign)",
         family=FAMILY, exact=False),
]
