"""Identity rules: compositions that collapse to one of their operands or to a simpler op.

What goes in: a node (the root) whose operands come from known producers. What comes out: the value the
root computes, re-expressed with fewer ops: Neg(Neg(x)) -> x, Relu(y) -> y when y >= 0 is known,
Floor(y) -> y when y is integral, Max(x, x) -> x, Clip(Clip(x)) -> one Clip, a - Neg(b) -> a + b, ...

Value facts (``nonneg``, ``positive``, ``integral``) are read off the producer of a value; they hold for
every non-NaN input. NaN propagation is not modelled: Relu(NaN) may be 0 in a runtime while the
rewritten graph gives NaN. Rules marked ``exact=False`` change results on some inputs (x - x -> 0 on
Inf, Log(Exp(x)) -> x where Exp overflows, ...), their docs say where.

The helpers here (value facts, constant/shape guards) are shared with ``reduction.py`` and ``other.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.passes.algebra.match import float_dtype, operand_orders, scalar
from dlcc.passes.rewrite import Builder, Rule, const_array, producer, static_shape

FAMILY = "identity"

INT_TYPES = frozenset({
    ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64, ir.DataType.UINT8,
    ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64, ir.DataType.BOOL,
})


# ------------------------------------------------------------------------------------------ helpers


def rule(name: str, roots: tuple[str, ...], pattern: Callable, check: Callable | None, rewrite: Callable,
         doc: str, family: str, *, exact: bool = True, min_opset: int = 1) -> Rule:
    return Rule(name, roots, pattern, check or (lambda node, m: None), rewrite, doc=doc, family=family,
                exact=exact, min_opset=min_opset)


def first_input(node: ir.Node) -> ir.Value | None:
    return node.inputs[0] if node.inputs else None


def same_shape(a: ir.Value | None, b: ir.Value | None) -> bool:
    """Equal shapes, symbolic dims allowed (named dims compare by name)."""
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    for da, db in zip(a.shape, b.shape, strict=True):
        if isinstance(da, int) or isinstance(db, int):
            if da != db:
                return False
        elif da.value is None or da.value != db.value:
            return False
    return True


def clip_bounds(node: ir.Node) -> tuple[float, float] | None:
    """(lo, hi) of a Clip with constant scalar bounds (inputs form, opset >= 11); absent = -inf/+inf."""
    lo, hi = -np.inf, np.inf
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        v = scalar(node.inputs[1])
        if v is None:
            return None
        lo = v
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        v = scalar(node.inputs[2])
        if v is None:
            return None
        hi = v
    return float(lo), float(hi)


_NONNEG_UNARY = frozenset({"Relu", "Abs", "Exp", "Sigmoid", "Softplus"})
_POSITIVE_UNARY = frozenset({"Exp", "Sigmoid", "Softplus"})


def nonneg(v: ir.Value | None) -> bool:
    """``v >= 0`` for every non-NaN input, read off its producer (float values) or its constant data."""
    if v is None:
        return False
    c = const_array(v)
    if c is not None:
        return bool(c.dtype.kind in "fiu" and np.all(c >= 0))
    p = v.producer()
    if p is None or p.domain not in ("", "ai.onnx") or not float_dtype(v):  # Abs(INT_MIN) < 0, x*x wraps
        return False
    if p.op_type in _NONNEG_UNARY:
        return True
    if p.op_type == "Mul" and len(p.inputs) == 2 and p.inputs[0] is p.inputs[1]:
        return True
    if p.op_type in ("ReduceSumSquare", "ReduceL1", "ReduceL2"):
        return True
    if p.op_type == "Clip":
        b = clip_bounds(p)
        return b is not None and b[0] >= 0
    return False


def positive(v: ir.Value | None) -> bool:
    """``v > 0`` mathematically (may underflow to 0 in floating point)."""
    if v is None:
        return False
    c = const_array(v)
    if c is not None:
        return bool(c.dtype.kind in "fiu" and np.all(c > 0))
    p = producer(v, tuple(_POSITIVE_UNARY))
    return p is not None


def integral(v: ir.Value | None) -> bool:
    """Every element of ``v`` is an integer value (Floor/Ceil/Round/Sign output, Cast from an integer)."""
    p = producer(v, ("Floor", "Ceil", "Round", "Sign", "Cast"))
    if p is None:
        return False
    if p.op_type == "Cast":
        return p.inputs[0] is not None and p.inputs[0].dtype in INT_TYPES
    return True


def alone(v: ir.Value | None) -> bool:
    """``v`` has exactly one consumer in the graph and is not a graph output. Unlike ``single_use``, uses
    by nodes a rejected candidate rewrite built (never inserted: their ``graph`` is None) do not count."""
    if v is None or v.is_graph_output():
        return False
    return sum(1 for u in v.uses() if u.node.graph is not None) == 1


def live_uses(v: ir.Value) -> int:
    return sum(1 for u in v.uses() if u.node.graph is not None)


def forward(key: str) -> Callable:
    return lambda node, m, b: [m[key]]


def unary_of(op: str | tuple[str, ...]) -> Callable[[ir.Node], dict | None]:
    """Pattern: the root's first operand is produced by ``op``; captures it as ``inner``, its input ``x``."""
    def pattern(node: ir.Node) -> dict | None:
        p = producer(first_input(node), op)
        if p is None or not p.inputs or p.inputs[0] is None:
            return None
        return {"inner": p, "x": p.inputs[0], "y": node.inputs[0]}
    return pattern


def needs_alone(key: str, what: str) -> Callable[[ir.Node, dict], str | None]:
    def check(node: ir.Node, m: dict) -> str | None:
        return None if alone(m[key]) else f"{what} has other uses: nothing saved"
    return check


def zeros_like(b: Builder, shape: tuple[int, ...], dtype: ir.DataType, value: float) -> ir.Value:
    """ConstantOfShape(shape) filled with ``value``: a tiny constant instead of a full tensor."""
    fill = ir.tensor(np.array([value], dtype=dtype.numpy()))
    return b.op("ConstantOfShape", [b.const(np.array(shape, np.int64), "shape")], {"value": fill},
                dtype=dtype, shape=shape)


def const_like(b: Builder, value: float, like: ir.Value, hint: str = "c") -> ir.Value:
    """A rank-0 constant of ``like``'s dtype."""
    return b.const(np.array(value, dtype=like.dtype.numpy()), hint)


def unit_const(v: ir.Value | None, value: float | bool, out: ir.Value, x: ir.Value) -> bool:
    """``v`` is a constant equal to ``value`` everywhere and does not broadcast ``x`` to a new shape."""
    c = const_array(v)
    if c is None or c.size == 0 or not np.all(c == value):
        return False
    if c.ndim > (len(x.shape) if x.shape is not None else -1):
        return False
    return same_shape(x, out)


# ------------------------------------------------------------------------------------------- rules


def _nonneg_input(node: ir.Node) -> dict | None:
    x = first_input(node)
    return {"x": x} if nonneg(x) else None


def _integral_input(node: ir.Node) -> dict | None:
    x = first_input(node)
    return {"x": x} if integral(x) else None


def _self_pair(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[0] is not node.inputs[1]:
        return None
    return {"x": node.inputs[0]}


def _var_and_const(node: ir.Node) -> dict | None:
    """(x, constant c) over the operand orders of a binary node."""
    for x, c in operand_orders(node):
        if const_array(c) is not None and const_array(x) is None:
            return {"x": x, "c": c}
    return None


def _is_unit(value: float | bool) -> Callable[[ir.Node, dict], str | None]:
    def check(node: ir.Node, m: dict) -> str | None:
        if not unit_const(m["c"], value, node.outputs[0], m["x"]):
            return f"constant is not {value} or broadcasts"
        return None
    return check


def _where_same(node: ir.Node) -> dict | None:
    if len(node.inputs) != 3 or node.inputs[1] is None or node.inputs[1] is not node.inputs[2]:
        return None
    return {"x": node.inputs[1]}


def _where_check(node: ir.Node, m: dict) -> str | None:
    return None if same_shape(m["x"], node.outputs[0]) else "the condition broadcasts the result"


def _fill_check(node: ir.Node, m: dict) -> str | None:
    x = m["x"]
    if not float_dtype(x):
        return "dtype not float"
    if static_shape(node.outputs[0]) is None:
        return "shape unknown"
    return None


def _fill(value: float) -> Callable:
    def rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
        out = node.outputs[0]
        return [zeros_like(b, static_shape(out), out.dtype, value)]
    return rewrite


def _square_pattern(node: ir.Node) -> dict | None:
    p = producer(first_input(node), "Mul")
    if p is None or len(p.inputs) != 2 or p.inputs[0] is not p.inputs[1]:
        return None
    return {"inner": p, "x": p.inputs[0], "y": node.inputs[0]}


def _abs_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    return [b.op("Abs", [m["x"]], hint="abs")]


def _sqrt_square_pattern(node: ir.Node) -> dict | None:
    m = _self_pair(node)
    if m is None:
        return None
    s = producer(m["x"], "Sqrt")
    if s is None or not nonneg(s.inputs[0]):
        return None
    return {"x": s.inputs[0]}


def _exp_log_pattern(node: ir.Node) -> dict | None:
    m = unary_of("Log")(node)
    return m if m is not None and positive(m["x"]) else None


def _clip_clip_pattern(node: ir.Node) -> dict | None:
    inner = producer(first_input(node), "Clip")
    if inner is None:
        return None
    outer_b, inner_b = clip_bounds(node), clip_bounds(inner)
    if outer_b is None or inner_b is None:
        return None
    return {"x": inner.inputs[0], "lo": max(outer_b[0], inner_b[0]), "hi": min(outer_b[1], inner_b[1])}


def _clip_clip_check(node: ir.Node, m: dict) -> str | None:
    if m["lo"] > m["hi"]:
        return "the two ranges do not overlap"
    return None


def _clip_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    x = m["x"]
    lo = const_like(b, m["lo"], x, "lo") if np.isfinite(m["lo"]) else None
    hi = const_like(b, m["hi"], x, "hi") if np.isfinite(m["hi"]) else None
    inputs = [x, lo, hi] if hi is not None else ([x, lo] if lo is not None else [x])
    return [b.op("Clip", inputs, hint="clip")]


def _clip_relu_pattern(node: ir.Node) -> dict | None:
    r = producer(first_input(node), "Relu")
    bounds = clip_bounds(node)
    if r is None or bounds is None:
        return None
    return {"x": r.inputs[0], "y": node.inputs[0], "lo": bounds[0], "hi": bounds[1]}


def _clip_relu_check(node: ir.Node, m: dict) -> str | None:
    if m["lo"] < 0:
        return "lower bound is negative"
    if not alone(m["y"]):
        return "Relu has other uses: nothing saved"
    return None


def _clip_to_relu_pattern(node: ir.Node) -> dict | None:
    bounds = clip_bounds(node)
    if bounds is None or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    return {"x": node.inputs[0], "lo": bounds[0], "hi": bounds[1]}


def _clip_to_relu_check(node: ir.Node, m: dict) -> str | None:
    if m["lo"] != 0 or m["hi"] != np.inf:
        return "bounds are not [0, inf)"
    if not float_dtype(m["x"]):
        return "dtype not float"
    return None








def _binary(op: str, key_a: str = "a", key_b: str = "b") -> Callable:
    return lambda node, m, b: [b.op(op, [m[key_a], m[key_b]], hint=op.lower())]


def _sub_neg_pattern(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2:
        return None
    n = producer(node.inputs[1], "Neg")
    return None if n is None else {"a": node.inputs[0], "b": n.inputs[0], "y": node.inputs[1]}


def _add_neg_pattern(node: ir.Node) -> dict | None:
    for a, nb in operand_orders(node):
        n = producer(nb, "Neg")
        if n is not None:
            return {"a": a, "b": n.inputs[0], "y": nb}
    return None


def _fwd_x(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    return [m["x"]]


def _unary_new(op: str) -> Callable:
    return lambda node, m, b: [b.op(op, [m["x"]], hint=op.lower())]


_ROUNDING_DOC = "-> y when y is integral (Floor/Ceil/Round/Sign output or Cast from an integer type)"

RULES: list[Rule] = [
    rule("identity-neg-neg", ("Neg",), unary_of("Neg"), None, _fwd_x, "Neg(Neg(x)) -> x", FAMILY),
    rule("identity-not-not", ("Not",), unary_of("Not"), None, _fwd_x, "Not(Not(x)) -> x", FAMILY),
    rule("identity-relu-of-nonneg", ("Relu",), _nonneg_input, None, _fwd_x,
         "Relu(y) -> y when y >= 0 (Relu, Abs, Exp, Sigmoid, Softplus, x*x, Clip(lo>=0), norms)", FAMILY),
    rule("identity-abs-of-nonneg", ("Abs",), _nonneg_input, None, _fwd_x,
         "Abs(y) -> y when y >= 0 (Relu, Abs, Exp, Sigmoid, Softplus, x*x, Clip(lo>=0), norms)", FAMILY),
    rule("identity-abs-of-neg", ("Abs",), unary_of("Neg"), needs_alone("y", "Neg"), _unary_new("Abs"),
         "Abs(Neg(x)) -> Abs(x)", FAMILY),
    rule("identity-floor-of-integral", ("Floor",), _integral_input, None, _fwd_x, "Floor(y) " + _ROUNDING_DOC,
         FAMILY),
    rule("identity-ceil-of-integral", ("Ceil",), _integral_input, None, _fwd_x, "Ceil(y) " + _ROUNDING_DOC,
         FAMILY),
    rule("identity-round-of-integral", ("Round",), _integral_input, None, _fwd_x, "Round(y) " + _ROUNDING_DOC,
         FAMILY),
    rule("identity-sign-sign", ("Sign",), unary_of("Sign"), None, forward("y"), "Sign(Sign(x)) -> Sign(x)",
         FAMILY),
    rule("identity-max-self", ("Max",), _self_pair, None, _fwd_x, "Max(x, x) -> x", FAMILY),
    rule("identity-min-self", ("Min",), _self_pair, None, _fwd_x, "Min(x, x) -> x", FAMILY),
    rule("identity-and-self", ("And",), _self_pair, None, _fwd_x, "And(x, x) -> x", FAMILY),
    rule("identity-or-self", ("Or",), _self_pair, None, _fwd_x, "Or(x, x) -> x", FAMILY),
    rule("identity-and-true", ("And",), _var_and_const, _is_unit(True), _fwd_x,
         "And(x, true) -> x where true does not broadcast x", FAMILY),
    rule("identity-or-false", ("Or",), _var_and_const, _is_unit(False), _fwd_x,
         "Or(x, false) -> x where false does not broadcast x", FAMILY),
    rule("identity-where-same", ("Where",), _where_same, _where_check, _fwd_x,
         "Where(c, x, x) -> x where c does not broadcast x", FAMILY),
    rule("identity-sub-self", ("Sub",), _self_pair, _fill_check, _fill(0.0),
         "x - x -> zeros (ConstantOfShape); differs on Inf/NaN (gives NaN before)", FAMILY, exact=False,
         min_opset=9),
    rule("identity-div-self", ("Div",), _self_pair, _fill_check, _fill(1.0),
         "x / x -> ones (ConstantOfShape); differs on 0, Inf, NaN (gives NaN before)", FAMILY, exact=False,
         min_opset=9),
    rule("identity-sqrt-of-square", ("Sqrt",), _square_pattern, needs_alone("y", "x*x"), _abs_rewrite,
         "Sqrt(x*x) -> Abs(x); differs where x*x overflows or underflows", FAMILY, exact=False),
    rule("identity-square-of-sqrt", ("Mul",), _sqrt_square_pattern, None, _fwd_x,
         "Sqrt(x)*Sqrt(x) -> x when x >= 0 is known; rounding differs", FAMILY, exact=False),
    rule("identity-reciprocal-reciprocal", ("Reciprocal",), unary_of("Reciprocal"), None, _fwd_x,
         "Reciprocal(Reciprocal(x)) -> x; rounding, overflow and denormals differ", FAMILY, exact=False),
    rule("identity-exp-of-log", ("Exp",), _exp_log_pattern, None, _fwd_x,
         "Exp(Log(x)) -> x when x > 0 is known (Exp, Sigmoid, Softplus output); rounding differs", FAMILY,
         exact=False),
    rule("identity-log-of-exp", ("Log",), unary_of("Exp"), None, _fwd_x,
         "Log(Exp(x)) -> x; rounding differs, and x > 88 (float32) no longer overflows to inf", FAMILY,
         exact=False),
    rule("identity-clip-clip", ("Clip",), _clip_clip_pattern, _clip_clip_check, _clip_rewrite,
         "Clip(Clip(x, a, b), c, d) -> Clip(x, max(a, c), min(b, d)) when the ranges overlap", FAMILY,
         min_opset=11),
    rule("identity-clip-of-relu", ("Clip",), _clip_relu_pattern, _clip_relu_check, _clip_rewrite,
         "Clip(Relu(x), lo, hi) -> Clip(x, lo, hi) when lo >= 0", FAMILY, min_opset=11),
    rule("identity-clip-to-relu", ("Clip",), _clip_to_relu_pattern, _clip_to_relu_check, _unary_new("Relu"),
         "Clip(x, 0) with no upper bound -> Relu(x)", FAMILY, min_opset=11),
    rule("identity-sub-of-neg", ("Sub",), _sub_neg_pattern, needs_alone("y", "Neg"), _binary("Add"),
         "a - Neg(b) -> a + b", FAMILY),
    rule("identity-add-of-neg", ("Add",), _add_neg_pattern, needs_alone("y", "Neg"), _binary("Sub"),
         "a + Neg(b) -> a - b (either operand order)", FAMILY),
]
