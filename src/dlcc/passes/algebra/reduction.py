"""Reduction rules: reductions over unit axes, nested reductions, unary ops moved past a max/min
reduction (so they run on the smaller tensor), ArgMax/ArgMin of monotone ops, and norm idioms to the fused Reduce ops.

What goes in: a Reduce*/ArgMax/ArgMin/Log/Sqrt root. What comes out: the same values with fewer or
cheaper ops. Axes are read in both forms (attribute before opset 13 for ReduceSum and before 18 for the
others; an input from then on) and written in the form the model's opset wants.

Exactness: max/min commute exactly with nondecreasing functions and with negation (max and min swap);
merging nested sums/means/products regroups the arithmetic (``exact=False``). ArgMax/ArgMin of
a strictly increasing op drops the op: exact in real arithmetic, but float rounding may make two
different inputs map to the same output (a tie the original resolves to the first index), so those rules
are ``exact=False`` too. NaN inputs are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.passes.algebra.identity import alone, rule
from dlcc.passes.rewrite import Builder, Rule, attr, const_array, producer

FAMILY = "reduction"

_PLAIN = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")


# ------------------------------------------------------------------------------------------ helpers


def axes_as_input(op: str, opset: int) -> bool:
    return opset >= (13 if op == "ReduceSum" else 18)


def reduce_params(node: ir.Node) -> tuple[list[int] | None, int, str | None]:
    """(sorted non-negative axes, keepdims, why not) of a Reduce* node; empty axes mean all axes."""
    x = node.inputs[0]
    keep = int(attr(node, "keepdims", 1))
    if x is None or x.shape is None:
        return None, keep, "rank unknown"
    rank = len(x.shape)
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        c = const_array(node.inputs[1])
        if c is None:
            return None, keep, "axes not constant"
        axes = [int(a) for a in c.reshape(-1)]
    else:
        axes = [int(a) for a in attr(node, "axes", None) or []]
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return None, keep, "empty axes with noop_with_empty_axes"
        axes = list(range(rank))
    norm = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in norm):
        return None, keep, "axis out of range"
    return norm, keep, None


def make_reduce(b: Builder, op: str, x: ir.Value, axes: list[int], keepdims: int) -> ir.Value:
    if axes_as_input(op, b.opset):
        return b.op(op, [x, b.const(np.array(axes, np.int64), "axes")], {"keepdims": keepdims}, hint=op)
    return b.op(op, [x], {"axes": axes, "keepdims": keepdims}, hint=op)


def reapply(b: Builder, node: ir.Node, x: ir.Value, op: str | None = None) -> ir.Value:
    """``node``'s reduction (same axes inputs and attributes) on ``x``, optionally as another op with the
    same signature (ReduceMax <-> ReduceMin, ArgMax <-> ArgMin)."""
    return b.op(op or node.op_type, [x, *node.inputs[1:]], dict(node.attributes), hint=op or node.op_type)


def copy_unary(b: Builder, f: ir.Node, x: ir.Value) -> ir.Value:
    return b.op(f.op_type, [x], dict(f.attributes), hint=f.op_type)


def inner_of(ops: str | tuple[str, ...]) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        p = producer(node.inputs[0] if node.inputs else None, ops)
        if p is None or not p.inputs or p.inputs[0] is None:
            return None
        return {"inner": p, "x": p.inputs[0], "y": node.inputs[0]}
    return pattern


def _params_ok(node: ir.Node, m: dict) -> str | None:
    return reduce_params(node)[2]


def _single_inner(node: ir.Node, m: dict) -> str | None:
    if not alone(m["y"]):
        return f"{m['inner'].op_type} has other uses"
    return None


def _single_inner_params(node: ir.Node, m: dict) -> str | None:
    return _single_inner(node, m) or _params_ok(node, m)


# ----------------------------------------------------------------------------------- unit axes


def _keepdims_is(value: int) -> Callable[[ir.Node], dict | None]:
    return lambda node: {} if int(attr(node, "keepdims", 1)) == value else None


def _unit_axes_check(node: ir.Node, m: dict) -> str | None:
    axes, _, why = reduce_params(node)
    if why:
        return why
    x = node.inputs[0]
    if any(x.shape[a] != 1 for a in axes):
        return "reduced axes are not all of size 1"
    m["axes"] = axes
    return None


def _squeeze_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    x = node.inputs[0]
    if b.opset >= 13:
        return [b.op("Squeeze", [x, b.const(np.array(m["axes"], np.int64), "axes")], hint="squeeze")]
    return [b.op("Squeeze", [x], {"axes": m["axes"]}, hint="squeeze")]


# ----------------------------------------------------------------------------- nested reductions


def _nested_check(node: ir.Node, m: dict) -> str | None:
    if not alone(m["y"]):
        return "inner reduction has other uses"
    outer, keep_o, why_o = reduce_params(node)
    inner, keep_i, why_i = reduce_params(m["inner"])
    if why_o or why_i:
        return why_o or why_i
    if keep_o != keep_i:
        return "keepdims differ"
    if keep_o:
        union = set(inner) | set(outer)
    else:
        rest = [a for a in range(len(m["x"].shape)) if a not in inner]
        union = set(inner) | {rest[a] for a in outer}
    m["axes"], m["keep"] = sorted(union), keep_o
    return None


def _nested_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    return [make_reduce(b, node.op_type, m["x"], m["axes"], m["keep"])]


def _nested(op: str, exact: bool, note: str) -> Rule:
    short = op.removeprefix("Reduce").lower()
    return rule(f"reduction-{short}-{short}", (op,), inner_of(op), _nested_check, _nested_rewrite,
                f"{op}({op}(x, a1), a2) -> {op}(x, a1 + a2), same keepdims{note}", FAMILY, exact=exact)


# ------------------------------------------------------------------------ unary ops past reductions


def _neg_through(op: str | None) -> Callable:
    def rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
        return [b.op("Neg", [reapply(b, node, m["x"], op)], hint="neg")]
    return rewrite


# Nondecreasing for every attribute value _monotone_attrs accepts. Piecewise-linear ones are monotone in
# floating point too (rounding is monotone), so max(f(x)) == f(max(x)) bit for bit; a transcendental
# implementation need not be monotone to the last ulp.
_PIECEWISE = frozenset({"Relu", "Floor", "Ceil", "Round", "LeakyRelu", "HardSigmoid"})
_SMOOTH = frozenset({"Exp", "Sigmoid", "Tanh", "Erf", "Softplus", "Softsign", "Atan", "Asinh", "Sinh", "Elu"})
_STRICT = frozenset({"Exp", "Sigmoid", "Tanh", "Erf", "Softplus", "Softsign", "Atan", "Asinh", "Sinh"})


def _monotone_attrs(f: ir.Node) -> bool:
    if f.op_type in ("LeakyRelu", "HardSigmoid", "Elu"):
        return float(attr(f, "alpha", 0.01 if f.op_type == "LeakyRelu" else 0.2)) >= 0
    return True


def _monotone_pattern(ops: frozenset[str]) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        m = inner_of(tuple(sorted(ops)))(node)
        if m is None or len(m["inner"].inputs) != 1 or not _monotone_attrs(m["inner"]):
            return None
        return m
    return pattern


def _monotone_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    return [copy_unary(b, m["inner"], reapply(b, node, m["x"]))]


def _drop_inner(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    return [reapply(b, node, m["x"])]


def _arg_swap(op: str) -> Callable:
    return lambda node, m, b: [reapply(b, node, m["x"], op)]


def _softmax_pattern(node: ir.Node) -> dict | None:
    m = inner_of(("Softmax", "LogSoftmax"))(node)
    if m is None or m["x"].shape is None:
        return None
    rank = len(m["x"].shape)
    axis = int(attr(node, "axis", 0))
    inner_axis = int(attr(m["inner"], "axis", -1))
    if (axis + rank) % max(rank, 1) != (inner_axis + rank) % max(rank, 1):
        return None
    return m


# ---------------------------------------------------------------------------------- norm idioms


def _to_reduce(op: str) -> Callable:
    """Rewrite the root reduction (params read from the root) as ``op`` over ``m['x']``."""
    def rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
        axes, keep, _ = reduce_params(node)
        return [make_reduce(b, op, m["x"], axes, keep)]
    return rewrite


def _square_of(node: ir.Node) -> dict | None:
    p = producer(node.inputs[0], "Mul")
    if p is None or p.inputs[0] is not p.inputs[1]:
        return None
    return {"inner": p, "x": p.inputs[0], "y": node.inputs[0]}


def _of_reduce(op: str, inner_op: str | None = None) -> Callable[[ir.Node], dict | None]:
    """Pattern for Unary(op(...)): captures the reduction ``red`` and its data input ``x`` (or, with
    ``inner_op``, the input of ``inner_op`` feeding the reduction)."""
    def pattern(node: ir.Node) -> dict | None:
        red = producer(node.inputs[0], op)
        if red is None or red.inputs[0] is None:
            return None
        m = {"red": red, "y": node.inputs[0], "x": red.inputs[0], "inner": red}
        if inner_op is not None:
            e = producer(red.inputs[0], inner_op)
            if e is None:
                return None
            m.update(e=e, ey=red.inputs[0], x=e.inputs[0])
        return m
    return pattern


def _of_reduce_check(node: ir.Node, m: dict) -> str | None:
    if not alone(m["y"]):
        return f"{m['red'].op_type} has other uses"
    if "ey" in m and not alone(m["ey"]):
        return f"{m['e'].op_type} has other uses"
    return reduce_params(m["red"])[2]


def _log_sum_check(node: ir.Node, m: dict) -> str | None:
    e = producer(m["x"], "Exp")
    if e is not None and alone(m["x"]):
        return "Log(ReduceSum(Exp(x))) is reduction-log-sum-exp"
    return _of_reduce_check(node, m)


def _from_reduce(op: str) -> Callable:
    def rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
        axes, keep, _ = reduce_params(m["red"])
        return [make_reduce(b, op, m["x"], axes, keep)]
    return rewrite








RULES: list[Rule] = [
    rule("reduction-unit-axes-keepdims", _PLAIN, _keepdims_is(1), _unit_axes_check, lambda n, m, b: [n.inputs[0]],
         "Reduce{Sum,Mean,Max,Min,Prod}(x) over axes of size 1 with keepdims=1 -> x", FAMILY),
    rule("reduction-unit-axes-squeeze", _PLAIN, _keepdims_is(0), _unit_axes_check, _squeeze_rewrite,
         "Reduce{Sum,Mean,Max,Min,Prod}(x) over axes of size 1 with keepdims=0 -> Squeeze(x, axes)", FAMILY),
    _nested("ReduceSum", False, " (regroups the sum)"),
    _nested("ReduceMax", True, ""),
    _nested("ReduceMin", True, ""),
    _nested("ReduceMean", False, " (mean of equal-size means; regroups)"),
    _nested("ReduceProd", False, " (regroups the product)"),
    rule("reduction-max-of-neg", ("ReduceMax",), inner_of("Neg"), _single_inner_params, _neg_through("ReduceMin"),
         "ReduceMax(Neg(x)) -> Neg(ReduceMin(x))", FAMILY),
    rule("reduction-min-of-neg", ("ReduceMin",), inner_of("Neg"), _single_inner_params, _neg_through("ReduceMax"),
         "ReduceMin(Neg(x)) -> Neg(ReduceMax(x))", FAMILY),
    rule("reduction-max-of-monotone", ("ReduceMax",), _monotone_pattern(_PIECEWISE), _single_inner_params,
         _monotone_rewrite, "ReduceMax(f(x)) -> f(ReduceMax(x)) for nondecreasing piecewise-linear f (Relu, "
         "LeakyRelu, HardSigmoid, Floor, Ceil, Round)", FAMILY),
    rule("reduction-min-of-monotone", ("ReduceMin",), _monotone_pattern(_PIECEWISE), _single_inner_params,
         _monotone_rewrite, "ReduceMin(f(x)) -> f(ReduceMin(x)) for nondecreasing piecewise-linear f (Relu, "
         "LeakyRelu, HardSigmoid, Floor, Ceil, Round)", FAMILY),
    rule("reduction-max-of-smooth", ("ReduceMax",), _monotone_pattern(_SMOOTH), _single_inner_params,
         _monotone_rewrite, "ReduceMax(f(x)) -> f(ReduceMax(x)) for increasing transcendental f (Exp, Sigmoid, "
         "Tanh, Erf, Elu, ...); f's last ulp may differ", FAMILY, exact=False),
    rule("reduction-min-of-smooth", ("ReduceMin",), _monotone_pattern(_SMOOTH), _single_inner_params,
         _monotone_rewrite, "ReduceMin(f(x)) -> f(ReduceMin(x)) for increasing transcendental f (Exp, Sigmoid, "
         "Tanh, Erf, Elu, ...); f's last ulp may differ", FAMILY, exact=False),
    rule("reduction-argmax-of-neg", ("ArgMax",), inner_of("Neg"), None, _arg_swap("ArgMin"),
         "ArgMax(Neg(x)) -> ArgMin(x) (ties resolve the same way)", FAMILY),
    rule("reduction-argmin-of-neg", ("ArgMin",), inner_of("Neg"), None, _arg_swap("ArgMax"),
         "ArgMin(Neg(x)) -> ArgMax(x) (ties resolve the same way)", FAMILY),
    rule("reduction-argmax-of-increasing", ("ArgMax",), _monotone_pattern(_STRICT), None, _drop_inner,
         "ArgMax(f(x)) -> ArgMax(x) for strictly increasing f (Exp, Sigmoid, Tanh, Erf, ...); float ties of "
         "f may differ", FAMILY, exact=False),
    rule("reduction-argmin-of-increasing", ("ArgMin",), _monotone_pattern(_STRICT), None, _drop_inner,
         "ArgMin(f(x)) -> ArgMin(x) for strictly increasing f (Exp, Sigmoid, Tanh, Erf, ...); float ties of "
         "f may differ", FAMILY, exact=False),
    rule("reduction-argmax-of-softmax", ("ArgMax", "ArgMin"), _softmax_pattern, None, _drop_inner,
         "ArgMax/ArgMin(Softmax or LogSoftmax(x, axis), axis) -> ArgMax/ArgMin(x, axis); float ties may differ",
         FAMILY, exact=False, min_opset=13),
    rule("reduction-norm-of-abs", ("ReduceSumSquare", "ReduceL1", "ReduceL2"), inner_of(("Abs", "Neg")),
         _single_inner, _drop_inner, "ReduceSumSquare/L1/L2(Abs(x) or Neg(x)) -> the same reduction of x", FAMILY),
    rule("reduction-sum-of-abs-to-l1", ("ReduceSum",), inner_of("Abs"), _single_inner_params,
         _to_reduce("ReduceL1"), "ReduceSum(Abs(x)) -> ReduceL1(x)", FAMILY, exact=False),
    rule("reduction-sum-of-square", ("ReduceSum",), _square_of, _single_inner_params,
         _to_reduce("ReduceSumSquare"), "ReduceSum(x*x) -> ReduceSumSquare(x)", FAMILY, exact=False),
    rule("reduction-sqrt-of-sumsquare", ("Sqrt",), _of_reduce("ReduceSumSquare"), _of_reduce_check,
         _from_reduce("ReduceL2"), "Sqrt(ReduceSumSquare(x)) -> ReduceL2(x)", FAMILY, exact=False),
    rule("reduction-log-of-sum", ("Log",), _of_reduce("ReduceSum"), _log_sum_check, _from_reduce("ReduceLogSum"),
         "Log(ReduceSum(x)) -> ReduceLogSum(x)", FAMILY, exact=False),
    rule("reduction-log-sum-exp", ("Log",), _of_reduce("ReduceSum", "Exp"), _of_reduce_check,
         _from_reduce("ReduceLogSumExp"), "Log(ReduceSum(Exp(x))) -> ReduceLogSumExp(x) (no overflow in Exp)",
         FAMILY, exact=False),
]
