"""Associative rules: regroup chains so that constants meet and fold, or so that one op does the work of two.

What goes in: a model with shapes and dtypes inferred. What comes out: the rules in ``RULES``; the driver
applies them (only the driver mutates the graph).

Families of rules, all local:

- constant chains ``(x op1 c1) op2 c2 -> x op3 (c1 . c2)`` for +, -, *, /, Max, Min, with the constant on
  either side of each op (the folded constant is computed in float64 and rounded once to its dtype);
- sign chains: ``Neg(x)*Neg(y) -> x*y``, ``Neg(x)*c -> x*(-c)``, ``Neg(x*c) -> x*(-c)`` ... (exact);
- unary pairs: ``Exp(a)*Exp(b) -> Exp(a+b)``, ``Log(a)+Log(b) -> Log(a*b)`` (operands known >= 0),
  ``Sqrt(a)*Sqrt(b) -> Sqrt(a*b)`` (operands known >= 0), ``Abs(a)*Abs(b) -> Abs(a*b)``, ...;
  ``Pow(Pow(x, a), b) -> Pow(x, a*b)`` and ``Pow(x, a)*Pow(x, b) -> Pow(x, a+b)`` for integer exponents;
- variadic Sum/Max/Min/Concat: nested ones are flattened, several constant operands are merged;
- linear chains: ``(x A) B -> x (A B)`` for MatMul/Gemm with constant weights when it saves FLOPs,
  ``A (B x) -> (A B) x``, ``Transpose(A) Transpose(B) -> Transpose(B A)``, and a scalar pre-scale moved
  into the weight (``MatMul(x*c, W) -> MatMul(x, W*c)``, Conv likewise, Gemm into alpha).

Guards (``check`` returns the reason): operands constant where required, float dtypes, static shapes
where the result could broadcast differently, intermediates with a single use (else the rewrite would
duplicate work), finite folded constants, and a cost comparison wherever the rewrite could add work.
Constants always end on the right of commutative ops; no rule moves them left (no cycles).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.passes.algebra.match import float_dtype, operand_orders, produced_by, scalar
from dlcc.passes.rewrite import Builder, Rule, attr, const_array, single_use, static_shape

FAM = "associative"

# ------------------------------------------------------------------------------------------- helpers


def is_const(v: ir.Value | None) -> bool:
    return const_array(v) is not None


def bshape(*shapes: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Numpy broadcast of static shapes, or None when unknown or incompatible."""
    if any(s is None for s in shapes):
        return None
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def fold(fn: Callable[..., np.ndarray], like: np.ndarray, *arrays: np.ndarray) -> np.ndarray | None:
    """``fn`` over the arrays in float64 (ints stay ints), rounded once to ``like``'s dtype; None if not finite."""
    if like.dtype.kind == "f":
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*[np.asarray(a, np.float64) for a in arrays]))
        with np.errstate(over="ignore"):
            out = out.astype(like.dtype)
        return out if np.all(np.isfinite(out)) else None
    return np.asarray(fn(*arrays)).astype(like.dtype)


def out_shape_kept(node: ir.Node, *shapes: tuple[int, ...] | None) -> str | None:
    """None when broadcasting ``shapes`` gives exactly the root's static output shape."""
    out = static_shape(node.outputs[0])
    if out is None or any(s is None for s in shapes):
        return "shapes unknown"
    if bshape(*shapes) != out:
        return "would change the output shape by broadcasting"
    return None


NONNEG_OPS = ("Relu", "Exp", "Abs", "Sqrt", "Sigmoid", "Softplus", "Softmax")


def known_nonneg(v: ir.Value) -> bool:
    """``v`` is >= 0 (or NaN) by construction: output of Relu/Exp/Abs/Sqrt/... or a constant >= 0."""
    c = const_array(v)
    if c is not None:
        return bool(np.all(c >= 0))
    p = v.producer()
    return p is not None and p.domain in ("", "ai.onnx") and p.op_type in NONNEG_OPS


# ------------------------------------------------------------------------------------ constant chains

_COMM = {"Add", "Mul", "Max", "Min"}


def _side(node: ir.Node, form: str) -> list[tuple[ir.Value, ir.Value]]:
    """Operand pairs (inner-or-x, constant) for a form "IC"/"CI" (or "XC"/"CX")."""
    a, b = node.inputs[0], node.inputs[1]
    if node.op_type in _COMM:
        return [(p, q) for p, q in operand_orders(node)]
    return [(a, b)] if form[1] == "C" else [(b, a)]


def chain_rule(name: str, outer: str, outer_form: str, inner: str, inner_form: str,
               new_op: str, new_form: str, combine: Callable, doc: str, exact: bool = False,
               floats_only: bool = True) -> Rule:
    """``outer(inner(x, c1), c2) -> new_op(x, combine(c1, c2))`` (forms say on which side each constant is)."""

    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or None in node.inputs:
            return None
        for iv, c2v in _side(node, outer_form):
            c2 = const_array(c2v)
            if c2 is None:
                continue
            p = produced_by(iv, inner)
            if p is None or len(p.inputs) != 2:
                continue
            for x, c1v in _side(p, inner_form):
                c1 = const_array(c1v)
                if c1 is not None and not is_const(x):
                    return {"x": x, "c1": c1, "c2": c2}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        if floats_only and not float_dtype(node.outputs[0]):
            return "dtype not float"
        if m["c1"].dtype != m["c2"].dtype:
            return "constants differ in dtype"
        c = fold(combine, m["c1"], m["c1"], m["c2"])
        if c is None:
            return "folded constant is not finite"
        why = out_shape_kept(node, static_shape(m["x"]), c.shape)
        if why:
            return why
        m["c"] = c
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        c = b.const(m["c"], "folded")
        ins = [m["x"], c] if new_form == "XC" else [c, m["x"]]
        return [b.op(new_op, ins)]

    return Rule(name, (outer,), pattern, check, rewrite, doc=doc, family=FAM, exact=exact,
                input_ops=frozenset({inner} if isinstance(inner, str) else inner))


CHAIN_RULES = [
    chain_rule("assoc-mul-mul-const", "Mul", "IC", "Mul", "XC", "Mul", "XC", np.multiply,
               "(x*c1)*c2 -> x*(c1*c2)"),
    chain_rule("assoc-add-add-const", "Add", "IC", "Add", "XC", "Add", "XC", np.add,
               "(x+c1)+c2 -> x+(c1+c2)"),
    chain_rule("assoc-sub-sub-const", "Sub", "IC", "Sub", "XC", "Sub", "XC", np.add,
               "(x-c1)-c2 -> x-(c1+c2)"),
    chain_rule("assoc-add-sub-const", "Sub", "IC", "Add", "XC", "Add", "XC", np.subtract,
               "(x+c1)-c2 -> x+(c1-c2)"),
    chain_rule("assoc-sub-add-const", "Add", "IC", "Sub", "XC", "Add", "XC", lambda a, b: b - a,
               "(x-c1)+c2 -> x+(c2-c1)"),
    chain_rule("assoc-rsub-add-const", "Add", "IC", "Sub", "CX", "Sub", "CX", np.add,
               "(c1-x)+c2 -> (c1+c2)-x"),
    chain_rule("assoc-rsub-sub-const", "Sub", "IC", "Sub", "CX", "Sub", "CX", np.subtract,
               "(c1-x)-c2 -> (c1-c2)-x"),
    chain_rule("assoc-const-sub-add", "Sub", "CI", "Add", "XC", "Sub", "CX", lambda a, b: b - a,
               "c2-(x+c1) -> (c2-c1)-x"),
    chain_rule("assoc-const-sub-sub", "Sub", "CI", "Sub", "XC", "Sub", "CX", np.add,
               "c2-(x-c1) -> (c2+c1)-x"),
    chain_rule("assoc-const-sub-rsub", "Sub", "CI", "Sub", "CX", "Add", "XC", lambda a, b: b - a,
               "c2-(c1-x) -> x+(c2-c1)"),
    chain_rule("assoc-div-div-const", "Div", "IC", "Div", "XC", "Div", "XC", np.multiply,
               "(x/c1)/c2 -> x/(c1*c2)"),
    chain_rule("assoc-mul-div-const", "Div", "IC", "Mul", "XC", "Mul", "XC", np.divide,
               "(x*c1)/c2 -> x*(c1/c2)"),
    chain_rule("assoc-div-mul-const", "Mul", "IC", "Div", "XC", "Mul", "XC", lambda a, b: b / a,
               "(x/c1)*c2 -> x*(c2/c1)"),
    chain_rule("assoc-rdiv-mul-const", "Mul", "IC", "Div", "CX", "Div", "CX", np.multiply,
               "(c1/x)*c2 -> (c1*c2)/x"),
    chain_rule("assoc-rdiv-div-const", "Div", "IC", "Div", "CX", "Div", "CX", np.divide,
               "(c1/x)/c2 -> (c1/c2)/x"),
    chain_rule("assoc-const-div-mul", "Div", "CI", "Mul", "XC", "Div", "CX", lambda a, b: b / a,
               "c2/(x*c1) -> (c2/c1)/x"),
    chain_rule("assoc-const-div-div", "Div", "CI", "Div", "XC", "Div", "CX", np.multiply,
               "c2/(x/c1) -> (c2*c1)/x"),
    chain_rule("assoc-const-div-rdiv", "Div", "CI", "Div", "CX", "Mul", "XC", lambda a, b: b / a,
               "c2/(c1/x) -> x*(c2/c1)"),
    chain_rule("assoc-max-max-const", "Max", "IC", "Max", "XC", "Max", "XC", np.maximum,
               "Max(Max(x, c1), c2) -> Max(x, max(c1, c2))", exact=True, floats_only=False),
    chain_rule("assoc-min-min-const", "Min", "IC", "Min", "XC", "Min", "XC", np.minimum,
               "Min(Min(x, c1), c2) -> Min(x, min(c1, c2))", exact=True, floats_only=False),
]

# ------------------------------------------------------------------------------------------ sign rules


def _neg_pair_rule(name: str, op: str, doc: str) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2:
            return None
        a, b = produced_by(node.inputs[0], "Neg"), produced_by(node.inputs[1], "Neg")
        if a is None or b is None or a is b:
            return None
        return {"x": a.inputs[0], "y": b.inputs[0]}

    def check(node: ir.Node, m: dict) -> str | None:
        return None if float_dtype(node.outputs[0]) else "dtype not float"

    return Rule(name, (op,), pattern, check, lambda n, m, b: [b.op(op, [m["x"], m["y"]])], doc=doc,
                family=FAM, exact=True)


def _neg_const_rule(name: str, op: str, form: str, doc: str) -> Rule:
    """``op(Neg(x), c) -> op(x, -c)`` (form "XC") or ``c / Neg(x) -> (-c) / x`` (form "CX")."""

    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or None in node.inputs:
            return None
        for nv, cv in _side(node, "IC" if form == "XC" else "CI"):
            c = const_array(cv)
            p = produced_by(nv, "Neg")
            if c is not None and p is not None:
                return {"x": p.inputs[0], "c": c}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        return out_shape_kept(node, static_shape(m["x"]), m["c"].shape)

    def rewrite(node: ir.Node, m: dict, b: Builder):
        c = b.const(np.negative(m["c"]), "neg")
        return [b.op(op, [m["x"], c] if form == "XC" else [c, m["x"]])]

    return Rule(name, (op,), pattern, check, rewrite, doc=doc, family=FAM, exact=True)


def _neg_of_rule(name: str, inner: str, form: str, doc: str) -> Rule:
    """Root Neg: ``Neg(inner(x, c)) -> inner(x, -c)`` (or ``Neg(c / x) -> (-c) / x``)."""

    def pattern(node: ir.Node) -> dict | None:
        p = produced_by(node.inputs[0], inner)
        if p is None or len(p.inputs) != 2 or None in p.inputs:
            return None
        for x, cv in _side(p, form):
            c = const_array(cv)
            if c is not None and not is_const(x):
                return {"x": x, "c": c}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        return out_shape_kept(node, static_shape(m["x"]), m["c"].shape)

    def rewrite(node: ir.Node, m: dict, b: Builder):
        c = b.const(np.negative(m["c"]), "neg")
        return [b.op(inner, [m["x"], c] if form == "XC" else [c, m["x"]])]

    return Rule(name, ("Neg",), pattern, check, rewrite, doc=doc, family=FAM, exact=True)


SIGN_RULES = [
    _neg_pair_rule("assoc-neg-neg-mul", "Mul", "Neg(x)*Neg(y) -> x*y"),
    _neg_pair_rule("assoc-neg-neg-div", "Div", "Neg(x)/Neg(y) -> x/y"),
    _neg_const_rule("assoc-neg-mul-const", "Mul", "XC", "Neg(x)*c -> x*(-c)"),
    _neg_const_rule("assoc-neg-div-const", "Div", "XC", "Neg(x)/c -> x/(-c)"),
    _neg_const_rule("assoc-const-div-neg", "Div", "CX", "c/Neg(x) -> (-c)/x"),
    _neg_of_rule("assoc-neg-of-mul-const", "Mul", "XC", "Neg(x*c) -> x*(-c)"),
    _neg_of_rule("assoc-neg-of-div-const", "Div", "XC", "Neg(x/c) -> x/(-c)"),
    _neg_of_rule("assoc-neg-of-const-div", "Div", "CX", "Neg(c/x) -> (-c)/x"),
]

# ------------------------------------------------------------------------------------------ unary pairs


def _unary_pair_rule(name: str, op: str, unary: str, new_bin: str, new_unary: str, doc: str, *,
                     nonneg: bool = False, exact: bool = False) -> Rule:
    """``op(U(a), U(b)) -> U'(new_bin(a, b))``: one unary op instead of two."""

    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2:
            return None
        pa, pb = produced_by(node.inputs[0], unary), produced_by(node.inputs[1], unary)
        if pa is None or pb is None or pa is pb:
            return None
        return {"a": pa.inputs[0], "b": pb.inputs[0]}

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        if nonneg and not (known_nonneg(m["a"]) and known_nonneg(m["b"])):
            return "operands not known to be >= 0"
        sa, sb, so = static_shape(m["a"]), static_shape(m["b"]), static_shape(node.outputs[0])
        if sa is None or sb is None or so is None:
            return "shapes unknown"
        if math.prod(sa) + math.prod(sb) < math.prod(so):
            return "the unary op would run on a larger tensor"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        return [b.op(new_unary, [b.op(new_bin, [m["a"], m["b"]])])]

    return Rule(name, (op,), pattern, check, rewrite, doc=doc, family=FAM, exact=exact)


UNARY_RULES = [
    _unary_pair_rule("assoc-exp-mul", "Mul", "Exp", "Add", "Exp", "Exp(a)*Exp(b) -> Exp(a+b)"),
    _unary_pair_rule("assoc-exp-div", "Div", "Exp", "Sub", "Exp", "Exp(a)/Exp(b) -> Exp(a-b)"),
    _unary_pair_rule("assoc-log-add", "Add", "Log", "Mul", "Log", "Log(a)+Log(b) -> Log(a*b) (a, b >= 0)",
                     nonneg=True),
    _unary_pair_rule("assoc-log-sub", "Sub", "Log", "Div", "Log", "Log(a)-Log(b) -> Log(a/b) (a, b >= 0)",
                     nonneg=True),
    _unary_pair_rule("assoc-sqrt-mul", "Mul", "Sqrt", "Mul", "Sqrt", "Sqrt(a)*Sqrt(b) -> Sqrt(a*b) (a, b >= 0)",
                     nonneg=True),
    _unary_pair_rule("assoc-sqrt-div", "Div", "Sqrt", "Div", "Sqrt", "Sqrt(a)/Sqrt(b) -> Sqrt(a/b) (a, b >= 0)",
                     nonneg=True),
    _unary_pair_rule("assoc-abs-mul", "Mul", "Abs", "Mul", "Abs", "Abs(a)*Abs(b) -> Abs(a*b)", exact=True),
    _unary_pair_rule("assoc-abs-div", "Div", "Abs", "Div", "Abs", "Abs(a)/Abs(b) -> Abs(a/b)", exact=True),
    _unary_pair_rule("assoc-reciprocal-mul", "Mul", "Reciprocal", "Mul", "Reciprocal",
                     "Reciprocal(a)*Reciprocal(b) -> Reciprocal(a*b)"),
]

# ----------------------------------------------------------------------------------------------- powers


def _int_scalar(v: ir.Value | None) -> int | None:
    s = scalar(v)
    if s is None or not float(s).is_integer():
        return None
    return int(s)


def _pow_pow_pattern(node: ir.Node) -> dict | None:
    p = produced_by(node.inputs[0], "Pow")
    if p is None:
        return None
    return {"x": p.inputs[0], "a": _int_scalar(p.inputs[1]), "b": _int_scalar(node.inputs[1]),
            "ea": const_array(p.inputs[1]), "eb": const_array(node.inputs[1])}


def _pow_pow_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    if m["a"] is None or m["b"] is None:
        return "exponents not integer scalar constants"
    return out_shape_kept(node, static_shape(m["x"]), m["ea"].shape, m["eb"].shape)


def _pow_pow_rewrite(node: ir.Node, m: dict, b: Builder):
    e = b.const(np.asarray(m["a"] * m["b"], m["eb"].dtype).reshape(m["eb"].shape), "exp")
    return [b.op("Pow", [m["x"], e])]


def _pow_mul_pattern(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2:
        return None
    pa, pb = produced_by(node.inputs[0], "Pow"), produced_by(node.inputs[1], "Pow")
    if pa is None or pb is None or pa is pb or pa.inputs[0] is not pb.inputs[0]:
        return None
    return {"x": pa.inputs[0], "a": _int_scalar(pa.inputs[1]), "b": _int_scalar(pb.inputs[1]),
            "ea": const_array(pa.inputs[1]), "eb": const_array(pb.inputs[1])}


def _pow_mul_check(node: ir.Node, m: dict) -> str | None:
    why = _pow_pow_check(node, m)
    if why:
        return why
    if m["a"] * m["b"] < 0:
        return "exponents of different signs (x = 0 would give inf*0)"
    return None


def _pow_mul_rewrite(node: ir.Node, m: dict, b: Builder):
    shape = np.broadcast_shapes(m["ea"].shape, m["eb"].shape)
    e = b.const(np.full(shape, m["a"] + m["b"], m["eb"].dtype), "exp")
    return [b.op("Pow", [m["x"], e])]


POW_RULES = [
    Rule("assoc-pow-pow", ("Pow",), _pow_pow_pattern, _pow_pow_check, _pow_pow_rewrite,
         doc="Pow(Pow(x, a), b) -> Pow(x, a*b) for integer scalar a, b", family=FAM, exact=False),
    Rule("assoc-pow-mul", ("Mul",), _pow_mul_pattern, _pow_mul_check, _pow_mul_rewrite,
         doc="Pow(x, a)*Pow(x, b) -> Pow(x, a+b) for integer scalar a, b of the same sign", family=FAM,
         exact=False),
]

# ----------------------------------------------------------------------------------------- variadic ops


def _flatten_rule(name: str, op: str, inner_ops: tuple[str, ...], doc: str, exact: bool) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        ins = list(node.inputs)
        if any(v is None for v in ins):
            return None
        new: list[ir.Value] = []
        found = False
        shared = False
        for v in ins:
            p = produced_by(v, inner_ops, only_use=False)
            if p is not None and all(x is not None for x in p.inputs):
                if ins.count(v) == 1 and single_use(v):
                    new.extend(p.inputs)
                    found = True
                    continue
                shared = True
            new.append(v)
        if not found and not shared:
            return None
        return {"inputs": new, "found": found}

    def check(node: ir.Node, m: dict) -> str | None:
        if op == "Sum" and not float_dtype(node.outputs[0]):
            return "dtype not float"
        if not m["found"]:
            return "an intermediate has other uses"
        return None

    return Rule(name, (op,), pattern, check, lambda n, m, b: [b.op(op, m["inputs"])], doc=doc, family=FAM,
                exact=exact)


def _merge_consts_rule(name: str, op: str, combine: Callable, doc: str, exact: bool) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        ins = list(node.inputs)
        consts = [const_array(v) for v in ins]
        if sum(c is not None for c in consts) < 2 or all(c is not None for c in consts):
            return None
        return {"rest": [v for v, c in zip(ins, consts, strict=True) if c is None],
                "consts": [c for c in consts if c is not None]}

    def check(node: ir.Node, m: dict) -> str | None:
        cs = m["consts"]
        if op == "Sum" and not float_dtype(node.outputs[0]):
            return "dtype not float"
        if any(c.dtype != cs[0].dtype for c in cs):
            return "constants differ in dtype"
        acc = cs[0]
        for c in cs[1:]:
            acc = fold(combine, cs[0], acc, c)
            if acc is None:
                return "folded constant is not finite"
        why = out_shape_kept(node, *[static_shape(v) for v in m["rest"]], acc.shape)
        if why:
            return why
        m["c"] = acc
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        return [b.op(op, [*m["rest"], b.const(m["c"], "merged")])]

    return Rule(name, (op,), pattern, check, rewrite, doc=doc, family=FAM, exact=exact)


def _concat_flatten_pattern(node: ir.Node) -> dict | None:
    axis = attr(node, "axis")
    items: list[ir.Value | ir.Node] = []
    for v in node.inputs:
        p = produced_by(v, "Concat") if list(node.inputs).count(v) == 1 else None
        ok = p is not None and attr(p, "axis") is not None and all(x is not None for x in p.inputs)
        items.append(p if ok else v)
    if axis is None or all(isinstance(it, ir.Value) or it is None for it in items):
        return None
    return {"items": items, "axis": axis}


def _norm_axis(axis: int, v: ir.Value) -> int | None:
    if v.shape is None:
        return None
    r = len(v.shape)
    return axis + r if axis < 0 else axis


def _concat_flatten_check(node: ir.Node, m: dict) -> str | None:
    out_axis = _norm_axis(m["axis"], node.outputs[0])
    flat: list[ir.Value] = []
    for it in m["items"]:
        if isinstance(it, ir.Node):
            if _norm_axis(attr(it, "axis"), it.outputs[0]) != out_axis or out_axis is None:
                return "inner Concat has another axis"
            flat.extend(it.inputs)
        else:
            flat.append(it)
    m["inputs"] = flat
    return None


def _concat_merge_pattern(node: ir.Node) -> dict | None:
    consts = [const_array(v) for v in node.inputs]
    if all(c is not None for c in consts):
        return None
    runs = any(consts[i] is not None and consts[i + 1] is not None for i in range(len(consts) - 1))
    return {"consts": consts} if runs else None


def _concat_merge_check(node: ir.Node, m: dict) -> str | None:
    axis = _norm_axis(attr(node, "axis", 0), node.outputs[0])
    if axis is None:
        return "rank unknown"
    m["ax"] = axis
    return None


def _concat_merge_rewrite(node: ir.Node, m: dict, b: Builder):
    new: list[ir.Value] = []
    run: list[np.ndarray] = []

    def flush() -> None:
        if len(run) == 1:
            new.append(b.const(run[0], "part"))
        elif run:
            new.append(b.const(np.concatenate(run, axis=m["ax"]), "merged"))
        run.clear()

    for v, c in zip(node.inputs, m["consts"], strict=True):
        if c is None:
            flush()
            new.append(v)
        else:
            run.append(c)
    flush()
    return [b.op("Concat", new, {"axis": m["ax"]})]


VARIADIC_RULES = [
    _flatten_rule("assoc-sum-flatten", "Sum", ("Sum", "Add"), "Sum(Sum(a, b)|Add(a, b), c) -> Sum(a, b, c)",
                  exact=False),
    _flatten_rule("assoc-max-flatten", "Max", ("Max",), "Max(Max(a, b), c) -> Max(a, b, c)", exact=True),
    _flatten_rule("assoc-min-flatten", "Min", ("Min",), "Min(Min(a, b), c) -> Min(a, b, c)", exact=True),
    _merge_consts_rule("assoc-sum-merge-consts", "Sum", np.add, "Sum(x, c1, c2) -> Sum(x, c1+c2)", exact=False),
    _merge_consts_rule("assoc-max-merge-consts", "Max", np.maximum, "Max(x, c1, c2) -> Max(x, max(c1, c2))",
                       exact=True),
    _merge_consts_rule("assoc-min-merge-consts", "Min", np.minimum, "Min(x, c1, c2) -> Min(x, min(c1, c2))",
                       exact=True),
    Rule("assoc-concat-flatten", ("Concat",), _concat_flatten_pattern, _concat_flatten_check,
         lambda n, m, b: [b.op("Concat", m["inputs"], {"axis": attr(n, "axis")})],
         doc="Concat(a, Concat(b, c; k), d; k) -> Concat(a, b, c, d; k)", family=FAM, exact=True),
    Rule("assoc-concat-merge-consts", ("Concat",), _concat_merge_pattern, _concat_merge_check,
         _concat_merge_rewrite, doc="Concat(x, c1, c2) -> Concat(x, [c1 c2]) for adjacent constants",
         family=FAM, exact=True),
]

# -------------------------------------------------------------------------------------------- linear


def _linear(node: ir.Node) -> dict | None:
    """A MatMul by a constant 2-D right operand, or a Gemm (transA=0) by a constant B: x @ W + bias."""
    if node.op_type == "MatMul":
        w = const_array(node.inputs[1])
        if w is None or w.ndim != 2 or is_const(node.inputs[0]):
            return None
        return {"x": node.inputs[0], "w": w.astype(np.float64), "bias": None}
    if node.op_type == "Gemm":
        if attr(node, "transA", 0):
            return None
        w = const_array(node.inputs[1])
        c = const_array(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None
        if w is None or (len(node.inputs) > 2 and node.inputs[2] is not None and c is None):
            return None
        w = w.astype(np.float64)
        if attr(node, "transB", 0):
            w = w.T
        bias = None if c is None else c.astype(np.float64) * attr(node, "beta", 1.0)
        return {"x": node.inputs[0], "w": w * attr(node, "alpha", 1.0), "bias": bias}
    return None


def _linear_chain_rule(name: str, outer: str, inner: str, doc: str) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        p = produced_by(node.inputs[0], inner)
        if p is None:
            return None
        lo, li = _linear(node), _linear(p)
        if lo is None or li is None:
            return None
        return {"outer": lo, "inner": li}

    def check(node: ir.Node, m: dict) -> str | None:
        lo, li = m["outer"], m["inner"]
        x = li["x"]
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        xs = static_shape(x)
        if xs is None or static_shape(node.outputs[0]) is None:
            return "shapes unknown"
        if len(xs) < 1 or (li["bias"] is not None or lo["bias"] is not None) and len(xs) != 2:
            return "a bias needs a 2-D input"
        k, n1 = li["w"].shape
        n2 = lo["w"].shape[1]
        rows = math.prod(xs[:-1])
        old = 2 * rows * k * n1 + 2 * rows * n1 * n2 + 4 * (k * n1 + n1 * n2 + 2 * rows * n1)
        new = 2 * rows * k * n2 + 4 * k * n2
        if new >= old:
            return "the folded weight does not save work"
        w = lo["w"]
        m["w"] = li["w"] @ w
        bias = None
        if li["bias"] is not None:
            cb = np.atleast_2d(li["bias"])
            bias = np.broadcast_to(cb, (cb.shape[0], n1)) @ w
        if lo["bias"] is not None:
            bias = lo["bias"] if bias is None else bias + lo["bias"]
        if bias is not None:
            try:
                np.broadcast_shapes(bias.shape, (rows, n2))
            except ValueError:
                return "bias does not broadcast"
        m["bias"] = bias
        if not np.all(np.isfinite(m["w"])) or (bias is not None and not np.all(np.isfinite(bias))):
            return "folded constant is not finite"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        dt = const_array(node.inputs[1]).dtype
        w = b.const(m["w"].astype(dt), "weight")
        x = m["inner"]["x"]
        if m["bias"] is None:
            return [b.op("MatMul", [x, w])]
        return [b.op("Gemm", [x, w, b.const(m["bias"].astype(dt), "bias")])]

    return Rule(name, (outer,), pattern, check, rewrite, doc=doc, family=FAM, exact=False)


def _matmul_left_pattern(node: ir.Node) -> dict | None:
    a = const_array(node.inputs[0])
    p = produced_by(node.inputs[1], "MatMul")
    if a is None or p is None or a.ndim != 2:
        return None
    b_ = const_array(p.inputs[0])
    if b_ is None or b_.ndim != 2 or is_const(p.inputs[1]):
        return None
    return {"a": a, "b": b_, "x": p.inputs[1]}


def _matmul_left_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    xs = static_shape(m["x"])
    if xs is None or len(xs) < 2:
        return "x not of static rank >= 2"
    p_, q = m["a"].shape
    r = m["b"].shape[1]
    cols = math.prod(xs) // r
    old = 2 * q * r * cols + 2 * p_ * q * cols + 4 * (p_ * q + q * r + 2 * q * cols)
    new = 2 * p_ * r * cols + 4 * p_ * r
    if new >= old:
        return "the folded weight does not save work"
    return None


def _matmul_left_rewrite(node: ir.Node, m: dict, b: Builder):
    w = (m["a"].astype(np.float64) @ m["b"].astype(np.float64)).astype(m["a"].dtype)
    return [b.op("MatMul", [b.const(w, "weight"), m["x"]])]


def _swap_last(perm: list[int] | None, rank: int) -> bool:
    return perm is not None and rank >= 2 and list(perm) == [*range(rank - 2), rank - 1, rank - 2]


def _transpose_matmul_pattern(node: ir.Node) -> dict | None:
    ta, tb = produced_by(node.inputs[0], "Transpose"), produced_by(node.inputs[1], "Transpose")
    if ta is None or tb is None or ta is tb:
        return None
    return {"ta": ta, "tb": tb}


def _transpose_matmul_check(node: ir.Node, m: dict) -> str | None:
    a, b_ = m["ta"].inputs[0], m["tb"].inputs[0]
    sa, sb, so = static_shape(a), static_shape(b_), static_shape(node.outputs[0])
    if sa is None or sb is None or so is None:
        return "shapes unknown"
    if not (_swap_last(attr(m["ta"], "perm"), len(sa)) and _swap_last(attr(m["tb"], "perm"), len(sb))):
        return "perm does not swap the last two axes"
    if math.prod(so) >= math.prod(sa) + math.prod(sb):
        return "the product is larger than the operands"
    return None


def _transpose_matmul_rewrite(node: ir.Node, m: dict, b: Builder):
    rank = len(static_shape(node.outputs[0]))
    prod = b.op("MatMul", [m["tb"].inputs[0], m["ta"].inputs[0]])
    return [b.op("Transpose", [prod], {"perm": [*range(rank - 2), rank - 1, rank - 2]})]


def _prescale_pattern(node: ir.Node) -> dict | None:
    """A scalar Mul feeding operand 0 or 1 of MatMul/Conv/Gemm."""
    slots = (0, 1) if node.op_type in ("MatMul", "Gemm") else (0,)
    for i in slots:
        p = produced_by(node.inputs[i], "Mul")
        if p is None:
            continue
        for x, cv in operand_orders(p):
            c = scalar(cv)
            if c is not None and not is_const(x):
                return {"slot": i, "x": x, "c": c, "cv": const_array(cv)}
    return None


def _prescale_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    if static_shape(m["x"]) is None or static_shape(m["x"]) != static_shape(node.inputs[m["slot"]]):
        return "the scalar changes the operand's shape"
    if node.op_type in ("MatMul", "Conv"):
        other = 1 - m["slot"] if node.op_type == "MatMul" else 1
        if const_array(node.inputs[other]) is None:
            return "the other operand is not constant"
    return None


def _prescale_rewrite(node: ir.Node, m: dict, b: Builder):
    ins = list(node.inputs)
    ins[m["slot"]] = m["x"]
    attrs = {k: a for k, a in node.attributes.items()}
    if node.op_type == "Gemm":
        attrs["alpha"] = ir.AttrFloat32("alpha", float(attr(node, "alpha", 1.0)) * float(m["c"]))
    else:
        other = 1 - m["slot"] if node.op_type == "MatMul" else 1
        w = const_array(ins[other])
        ins[other] = b.const((w.astype(np.float64) * m["c"]).astype(w.dtype), "scaled")
    return [b.op(node.op_type, ins, attrs)]


LINEAR_RULES = [
    _linear_chain_rule("assoc-matmul-matmul-const", "MatMul", "MatMul",
                       "(x A) B -> x (A B) for constant 2-D A, B when it saves FLOPs"),
    _linear_chain_rule("assoc-gemm-gemm-const", "Gemm", "Gemm",
                       "Gemm(Gemm(x, A, c1), B, c2) -> Gemm(x, A B, c1 B + c2) when it saves FLOPs"),
    _linear_chain_rule("assoc-gemm-matmul-const", "Gemm", "MatMul",
                       "Gemm(x A, B, c) -> Gemm(x, A B, c) when it saves FLOPs"),
    _linear_chain_rule("assoc-matmul-gemm-const", "MatMul", "Gemm",
                       "Gemm(x, A, c) B -> Gemm(x, A B, c B) when it saves FLOPs"),
    Rule("assoc-matmul-const-left", ("MatMul",), _matmul_left_pattern, _matmul_left_check, _matmul_left_rewrite,
         doc="A (B x) -> (A B) x for constant 2-D A, B when it saves FLOPs", family=FAM, exact=False),
    Rule("assoc-transpose-matmul", ("MatMul",), _transpose_matmul_pattern, _transpose_matmul_check,
         _transpose_matmul_rewrite, doc="Transpose(A) Transpose(B) -> Transpose(B A) (perms swap the last two "
         "axes)", family=FAM, exact=False),
    Rule("assoc-linear-prescale", ("MatMul", "Conv", "Gemm"), _prescale_pattern, _prescale_check,
         _prescale_rewrite, doc="MatMul/Conv(x*s, W) -> MatMul/Conv(x, W*s); Gemm(x*s, B) -> Gemm(x, B, "
         "alpha*s) for scalar s", family=FAM, exact=False),
]

RULES: list[Rule] = [*CHAIN_RULES, *SIGN_RULES, *UNARY_RULES, *POW_RULES, *VARIADIC_RULES, *LINEAR_RULES]
