"""Other rules: strength reduction of Pow and Div by constants, Min/Max chains to Clip/Relu/LeakyRelu,
and activation idioms written with primitives to the ONNX op (Softmax, LogSoftmax, Sigmoid, Softplus,
Tanh, HardSigmoid, HardSwish).

What goes in: a root node and its producers. What comes out: fewer, cheaper ops computing the same
function. An idiom rule fires only when every intermediate it removes has no other consumer (otherwise it
would duplicate work), the constants are the idiom's (within float32 rounding), and no operand
broadcasts the result to a shape the fused op would not give.

Exactness: Div by a power of two -> Mul by its (exactly representable) reciprocal, Min/Max -> Clip,
Max(x, 0) -> Relu, Max(x, a*x) -> LeakyRelu, x * -1 -> Neg and Pow(x, 0) -> 1 are bit-identical (0 - x ->
Neg(x) up to the sign of a zero). Pow strength reduction, Div by other constants and the idioms round
differently (``exact=False``); the fused ops are also better behaved (no overflow in Exp). GELU idioms
are in ``patterns.py``; x * Sigmoid(x) (SiLU/Swish) has no ONNX op and is left alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.passes.algebra.identity import alone, const_like, live_uses, rule, same_shape, zeros_like
from dlcc.passes.algebra.match import float_dtype, operand_orders, scalar
from dlcc.passes.algebra.reduction import reduce_params
from dlcc.passes.rewrite import Builder, Rule, attr, const_array, producer, static_shape

FAMILY = "other"


def _near(v: float | None, target: float, tol: float = 1e-6) -> bool:
    return v is not None and abs(float(v) - target) <= tol * max(1.0, abs(target))


def _const_operand(node: ir.Node, value: float | None = None) -> dict | None:
    """(x, constant c) over the operand orders; with ``value``, c must be that scalar."""
    for x, c in operand_orders(node):
        if const_array(x) is not None:
            continue
        s = scalar(c)
        if s is not None and (value is None or s == value):
            return {"x": x, "c": c, "cv": s}
    return None


def _kept_shape(node: ir.Node, m: dict) -> str | None:
    if not same_shape(m["x"], node.outputs[0]):
        return "the constant broadcasts x (or shapes unknown)"
    return None


def _float_kept(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(m["x"]):
        return "dtype not float"
    return _kept_shape(node, m)


# ------------------------------------------------------------------------------------------ Pow


def _pow_of(value: float) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or const_array(node.inputs[0]) is not None:
            return None
        if scalar(node.inputs[1]) != value:
            return None
        return {"x": node.inputs[0], "c": node.inputs[1]}
    return pattern


def _pow_zero_check(node: ir.Node, m: dict) -> str | None:
    if static_shape(node.outputs[0]) is None:
        return "shape unknown"
    return _kept_shape(node, m)


def _ones(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    out = node.outputs[0]
    return [zeros_like(b, static_shape(out), out.dtype, 1.0)]


def _unary(op: str, **attrs) -> Callable:
    return lambda node, m, b: [b.op(op, [m["x"]], attrs or None, hint=op.lower())]


# ------------------------------------------------------------------------------------------ Div


def _pow2_reciprocal(c: np.ndarray) -> np.ndarray | None:
    """1/c when every element of c is a power of two whose reciprocal is exact in c's dtype."""
    if c.dtype.kind != "f" or c.size == 0 or not np.all(np.isfinite(c)) or np.any(c == 0):
        return None
    mant, _ = np.frexp(np.abs(c.astype(np.float64)))
    if not np.all(mant == 0.5):
        return None
    inv = 1.0 / c.astype(np.float64)
    if np.any(np.abs(inv) > float(np.finfo(c.dtype).max)):
        return None
    r = inv.astype(c.dtype)
    if not np.all(r.astype(np.float64) * c.astype(np.float64) == 1.0):
        return None
    return r


def _div_const(pow2: bool) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or const_array(node.inputs[0]) is not None:
            return None
        c = const_array(node.inputs[1])
        if c is None or c.dtype.kind != "f":
            return None
        if (_pow2_reciprocal(c) is not None) != pow2:
            return None
        return {"x": node.inputs[0], "c": c}
    return pattern


def _div_const_check(node: ir.Node, m: dict) -> str | None:
    c = m["c"]
    if not np.all(np.isfinite(c)) or np.any(c == 0):
        return "divisor has zeros or non-finite values"
    if np.any(np.abs(1.0 / c.astype(np.float64)) > float(np.finfo(c.dtype).max)):
        return "reciprocal overflows"
    return None


def _div_to_mul(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    c = m["c"]
    r = (1.0 / c.astype(np.float64)).astype(c.dtype)
    return [b.op("Mul", [m["x"], b.const(r, "recip")], hint="mul")]


# --------------------------------------------------------------------------------- Min/Max -> Clip


def _lower(v: ir.Value) -> dict | None:
    """v = Max(x, lo) with a scalar constant lo, or Relu(x) (lo = 0)."""
    p = producer(v, ("Max", "Relu"))
    if p is None:
        return None
    if p.op_type == "Relu":
        return {"x": p.inputs[0], "lo": 0.0, "inner": v}
    m = _const_operand(p)
    return None if m is None else {"x": m["x"], "lo": float(m["cv"]), "inner": v}


def _upper(v: ir.Value) -> dict | None:
    p = producer(v, "Min")
    m = None if p is None else _const_operand(p)
    return None if m is None else {"x": m["x"], "hi": float(m["cv"]), "inner": v}


def _clip_pattern(inner_fn: Callable, key: str) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        outer = _const_operand(node)
        if outer is None:
            return None
        m = inner_fn(outer["x"])
        if m is None:
            return None
        return {**m, key: float(outer["cv"])}
    return pattern


def _clip_check(node: ir.Node, m: dict) -> str | None:
    if m["lo"] > m["hi"]:
        return "lower bound above upper bound"
    if not alone(m["inner"]):
        return "the inner Min/Max has other uses"
    return _kept_shape(node, m)


def _clip_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    x = m["x"]
    return [b.op("Clip", [x, const_like(b, m["lo"], x, "lo"), const_like(b, m["hi"], x, "hi")], hint="clip")]


# ------------------------------------------------------------------------------- LeakyRelu, Neg


def _leaky_pattern(node: ir.Node) -> dict | None:
    for x, ax in operand_orders(node):
        p = producer(ax, "Mul")
        if p is None:
            continue
        for a, c in operand_orders(p):
            s = scalar(c)
            if a is x and s is not None:
                return {"x": x, "alpha": float(s), "inner": ax, "c": c}
    return None


def _leaky_check(node: ir.Node, m: dict) -> str | None:
    if not 0 < m["alpha"] < 1:
        return "slope not in (0, 1)"
    if m["x"].dtype != ir.DataType.FLOAT:
        return "dtype not float32"
    if not alone(m["inner"]):
        return "the Mul has other uses"
    return _kept_shape(node, m)


def _leaky_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    return [b.op("LeakyRelu", [m["x"]], {"alpha": m["alpha"]}, hint="leakyrelu")]


def _zero_minus(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2 or scalar(node.inputs[0]) != 0 or const_array(node.inputs[1]) is not None:
        return None
    return {"x": node.inputs[1]}


# --------------------------------------------------------------------------------- Softmax idioms


def _single_axis(node: ir.Node, keepdims: int = 1) -> int | None:
    axes, keep, why = reduce_params(node)
    if why or keep != keepdims or axes is None or len(axes) != 1:
        return None
    return axes[0]


def _max_sub(z: ir.Value, axis: int) -> ir.Node | None:
    """z = Sub(x, ReduceMax(x, [axis], keepdims=1)): the Sub node."""
    s = producer(z, "Sub")
    if s is None:
        return None
    mx = producer(s.inputs[1], "ReduceMax")
    if mx is None or mx.inputs[0] is not s.inputs[0] or _single_axis(mx) != axis:
        return None
    return s


def _softmax_pattern(stable: bool) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        e, s = node.inputs
        ex = producer(e, "Exp")
        red = producer(s, "ReduceSum")
        if ex is None or red is None or red.inputs[0] is not e:
            return None
        axis = _single_axis(red)
        if axis is None:
            return None
        z = ex.inputs[0]
        sub = _max_sub(z, axis)
        if stable != (sub is not None):
            return None
        x = sub.inputs[0] if sub is not None else z
        return {"x": x, "axis": axis, "e": e, "s": s, "z": z, "stable": stable}
    return pattern


def _softmax_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(m["x"]):
        return "dtype not float"
    if live_uses(m["e"]) != 2 or m["e"].is_graph_output() or not alone(m["s"]):
        return "an intermediate has other uses"
    if m["stable"] and (not alone(m["z"]) or not alone(producer(m["z"], "Sub").inputs[1])):
        return "an intermediate has other uses"
    if not same_shape(m["x"], node.outputs[0]):
        return "shapes unknown"
    return None


def _softmax_rewrite(op: str) -> Callable:
    return lambda node, m, b: [b.op(op, [m["x"]], {"axis": m["axis"]}, hint=op.lower())]


def _logsoftmax_pattern(node: ir.Node) -> dict | None:
    z, lse = node.inputs
    m: dict = {"z": z, "lse": lse}
    rl = producer(lse, "ReduceLogSumExp")
    if rl is not None:
        if rl.inputs[0] is not z:
            return None
        axis = _single_axis(rl)
        m["chain"] = []
    else:
        lg = producer(lse, "Log")
        red = None if lg is None else producer(lg.inputs[0], "ReduceSum")
        ex = None if red is None else producer(red.inputs[0], "Exp")
        if ex is None or ex.inputs[0] is not z:
            return None
        axis = _single_axis(red)
        m["chain"] = [lg.inputs[0], red.inputs[0]]
    if axis is None:
        return None
    sub = _max_sub(z, axis)
    m.update(axis=axis, x=sub.inputs[0] if sub is not None else z, sub=sub)
    return m


def _logsoftmax_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(m["x"]):
        return "dtype not float"
    if not alone(m["lse"]) or not all(alone(v) for v in m["chain"]):
        return "an intermediate has other uses"
    if m["sub"] is not None:
        z = m["z"]
        if live_uses(z) != 2 or z.is_graph_output() or not alone(m["sub"].inputs[1]):
            return "an intermediate has other uses"
    if not same_shape(m["x"], node.outputs[0]):
        return "shapes unknown"
    return None


# ------------------------------------------------------------------------------ Sigmoid, Softplus


def _one_plus_exp(v: ir.Value | None, neg: bool) -> dict | None:
    """v = Add(1, Exp(x)) (either order); with ``neg``, Exp(Neg(x))."""
    add = producer(v, "Add")
    if add is None:
        return None
    m = _const_operand(add, 1.0)
    ex = None if m is None else producer(m["x"], "Exp")
    if ex is None:
        return None
    chain = [v, m["x"]]
    x = ex.inputs[0]
    if neg:
        n = producer(x, "Neg")
        if n is None:
            return None
        chain.append(x)
        x = n.inputs[0]
    return {"x": x, "chain": chain}


def _sigmoid_pattern(node: ir.Node) -> dict | None:
    if node.op_type == "Div":
        if scalar(node.inputs[0]) != 1.0:
            return None
        return _one_plus_exp(node.inputs[1], True)
    return _one_plus_exp(node.inputs[0], True)


def _softplus_pattern(node: ir.Node) -> dict | None:
    return _one_plus_exp(node.inputs[0], False)


def _chain_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(m["x"]):
        return "dtype not float"
    if not all(alone(v) for v in m["chain"]):
        return "an intermediate has other uses"
    if not same_shape(m["x"], node.outputs[0]):
        return "a constant broadcasts x (or shapes unknown)"
    return None


# ------------------------------------------------------------------------------------------- Tanh


def _tanh_pattern(node: ir.Node) -> dict | None:
    num, den = node.inputs
    s, a = producer(num, "Sub"), producer(den, "Add")
    if s is None or a is None or scalar(s.inputs[1]) != 1.0:
        return None
    m = _const_operand(a, 1.0)
    if m is None or m["x"] is not s.inputs[0]:
        return None
    e = m["x"]
    ex = producer(e, "Exp")
    if ex is None:
        return None
    two = producer(ex.inputs[0], ("Mul", "Add"))
    if two is None:
        return None
    if two.op_type == "Add":
        if two.inputs[0] is not two.inputs[1]:
            return None
        x = two.inputs[0]
    else:
        mm = _const_operand(two, 2.0)
        if mm is None:
            return None
        x = mm["x"]
    return {"x": x, "chain": [num, den, ex.inputs[0]], "e": e}


def _tanh_check(node: ir.Node, m: dict) -> str | None:
    if live_uses(m["e"]) != 2 or m["e"].is_graph_output():
        return "an intermediate has other uses"
    return _chain_check(node, m)


# ---------------------------------------------------------------------------- HardSigmoid/HardSwish


def _relu6_of_x_plus_3(v: ir.Value | None) -> dict | None:
    """v = Clip(Add(x, 3), 0, 6)."""
    c = producer(v, "Clip")
    if c is None or len(c.inputs) != 3 or scalar(c.inputs[1]) != 0 or scalar(c.inputs[2]) != 6:
        return None
    add = producer(c.inputs[0], "Add")
    m = None if add is None else _const_operand(add, 3.0)
    if m is None:
        return None
    return {"x": m["x"], "chain": [v, c.inputs[0]]}


def _over_six(node: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """(a, root) for a root Div(a, 6) or Mul(a, 1/6)."""
    if node.op_type == "Div":
        return (node.inputs[0], node.inputs[1]) if _near(scalar(node.inputs[1]), 6.0) else None
    for a, c in operand_orders(node):
        if _near(scalar(c), 1 / 6):
            return a, c
    return None


def _hardsigmoid_pattern(node: ir.Node) -> dict | None:
    d = _over_six(node)
    return None if d is None else _relu6_of_x_plus_3(d[0])


def _hardswish_clip_pattern(node: ir.Node) -> dict | None:
    d = _over_six(node)
    mul = None if d is None else producer(d[0], "Mul")
    if mul is None:
        return None
    for x, r in operand_orders(mul):
        m = _relu6_of_x_plus_3(r)
        if m is not None and m["x"] is x:
            return {"x": x, "chain": [d[0], *m["chain"]]}
    return None


def _hardswish_pattern(node: ir.Node) -> dict | None:
    for x, h in operand_orders(node):
        p = producer(h, "HardSigmoid")
        if (p is not None and p.inputs[0] is x and _near(attr(p, "alpha", 0.2), 1 / 6)
                and _near(attr(p, "beta", 0.5), 0.5)):
            return {"x": x, "chain": [h]}
    return None


RULES: list[Rule] = [
    rule("other-pow-square", ("Pow",), _pow_of(2.0), _float_kept, lambda n, m, b: [b.op("Mul", [m["x"], m["x"]])],
         "Pow(x, 2) -> x * x", FAMILY, exact=False),
    rule("other-pow-sqrt", ("Pow",), _pow_of(0.5), _float_kept, _unary("Sqrt"),
         "Pow(x, 0.5) -> Sqrt(x) (differs at -0 and -inf)", FAMILY, exact=False),
    rule("other-pow-reciprocal", ("Pow",), _pow_of(-1.0), _float_kept, _unary("Reciprocal"),
         "Pow(x, -1) -> Reciprocal(x)", FAMILY, exact=False),
    rule("other-pow-zero", ("Pow",), _pow_of(0.0), _pow_zero_check, _ones,
         "Pow(x, 0) -> ones (ConstantOfShape); pow(x, 0) is 1 even for NaN", FAMILY, min_opset=9),
    rule("other-div-pow2-to-mul", ("Div",), _div_const(True), None, _div_to_mul,
         "x / c -> x * (1/c) when every c is a power of two (1/c exact, so bit-identical)", FAMILY),
    rule("other-div-const-to-mul", ("Div",), _div_const(False), _div_const_check, _div_to_mul,
         "x / c -> x * (1/c) for a float constant c (rounds differently)", FAMILY, exact=False),
    rule("other-max-min-to-clip", ("Min",), _clip_pattern(_lower, "hi"), _clip_check, _clip_rewrite,
         "Min(Max(x, lo) or Relu(x), hi) -> Clip(x, lo, hi) for scalar constants lo <= hi", FAMILY,
         min_opset=12),
    rule("other-min-max-to-clip", ("Max",), _clip_pattern(_upper, "lo"), _clip_check, _clip_rewrite,
         "Max(Min(x, hi), lo) -> Clip(x, lo, hi) for scalar constants lo <= hi", FAMILY, min_opset=12),
    rule("other-max-zero-to-relu", ("Max",), lambda n: _const_operand(n, 0.0), _float_kept, _unary("Relu"),
         "Max(x, 0) -> Relu(x)", FAMILY),
    rule("other-leakyrelu-idiom", ("Max",), _leaky_pattern, _leaky_check, _leaky_rewrite,
         "Max(x, x * a) with 0 < a < 1 -> LeakyRelu(x, a) (float32)", FAMILY),
    rule("other-zero-minus-to-neg", ("Sub",), _zero_minus, _kept_shape, _unary("Neg"),
         "0 - x -> Neg(x) (a zero result is -0 instead of +0)", FAMILY),
    rule("other-mul-minus-one-to-neg", ("Mul",), lambda n: _const_operand(n, -1.0), _kept_shape, _unary("Neg"),
         "x * -1 -> Neg(x)", FAMILY),
    rule("other-softmax-idiom", ("Div",), _softmax_pattern(True), _softmax_check, _softmax_rewrite("Softmax"),
         "Exp(x - ReduceMax(x, a)) / ReduceSum(that, a) (keepdims) -> Softmax(x, a)", FAMILY, exact=False,
         min_opset=13),
    rule("other-softmax-unstable-idiom", ("Div",), _softmax_pattern(False), _softmax_check,
         _softmax_rewrite("Softmax"), "Exp(x) / ReduceSum(Exp(x), a) (keepdims) -> Softmax(x, a) (no overflow)",
         FAMILY, exact=False, min_opset=13),
    rule("other-logsoftmax-idiom", ("Sub",), _logsoftmax_pattern, _logsoftmax_check, _softmax_rewrite("LogSoftmax"),
         "z - Log(ReduceSum(Exp(z), a)) or z - ReduceLogSumExp(z, a), z = x or x - ReduceMax(x, a) -> "
         "LogSoftmax(x, a)", FAMILY, exact=False, min_opset=13),
    rule("other-sigmoid-idiom", ("Div", "Reciprocal"), _sigmoid_pattern, _chain_check, _unary("Sigmoid"),
         "1 / (1 + Exp(-x)) or Reciprocal(1 + Exp(-x)) -> Sigmoid(x)", FAMILY, exact=False),
    rule("other-softplus-idiom", ("Log",), _softplus_pattern, _chain_check, _unary("Softplus"),
         "Log(1 + Exp(x)) -> Softplus(x)", FAMILY, exact=False),
    rule("other-tanh-idiom", ("Div",), _tanh_pattern, _tanh_check, _unary("Tanh"),
         "(Exp(2x) - 1) / (Exp(2x) + 1) -> Tanh(x) (2x as x*2 or x+x)", FAMILY, exact=False),
    rule("other-hardsigmoid-idiom", ("Div", "Mul"), _hardsigmoid_pattern, _chain_check,
         _unary("HardSigmoid", alpha=1 / 6, beta=0.5),
         "Clip(x + 3, 0, 6) / 6 (or * 1/6) -> HardSigmoid(x, 1/6, 0.5)", FAMILY, exact=False, min_opset=11),
    rule("other-hardswish-idiom", ("Div", "Mul"), _hardswish_clip_pattern, _chain_check, _unary("HardSwish"),
         "x * Clip(x + 3, 0, 6) / 6 (or * 1/6) -> HardSwish(x)", FAMILY, exact=False, min_opset=14),
    rule("other-hardsigmoid-to-hardswish", ("Mul",), _hardswish_pattern, _chain_check, _unary("HardSwish"),
         "x * HardSigmoid(x, 1/6, 0.5) -> HardSwish(x)", FAMILY, exact=False, min_opset=14),
]
