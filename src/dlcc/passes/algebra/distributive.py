"""Distributive rules: factor a shared operand out of a sum, or move a cheap op across a linear one.

What goes in: a model with shapes and dtypes inferred. What comes out: the rules in ``RULES``; the driver
applies them (only the driver mutates the graph).

Families of rules:

- common factors: ``x*a + x*b -> x*(a+b)``, ``a/x - b/x -> (a-b)/x``, ``x*a + x -> x*(a+1)``: one
  multiply instead of two (a constant ``a+b`` is folded at once);
- linear ops that share an operand: ``Conv(x, W1) + Conv(x, W2) -> Conv(x, W1+W2)`` (biases summed),
  ``Conv(x, W) + Conv(y, W) -> Conv(x+y, W)``, ``MatMul(x, A) + MatMul(x, B) -> MatMul(x, A+B)``,
  ``MatMul(x, A) + MatMul(y, A) -> MatMul(x+y, A)``, Gemm likewise, and
  ``Concat(MatMul(x, A), MatMul(x, B)) -> MatMul(x, Concat(A, B))`` along the last axis;
- reductions: ``ReduceSum(x*c) -> ReduceSum(x)*c`` for a scalar c (the multiply runs on the reduced
  tensor), ReduceMean likewise, ``/c``, ``Neg``; ``ReduceMax/Min(x*c) -> ReduceMax/Min(x)*c`` for c > 0.
  The new reduction copies the old node's attributes and extra inputs, so the axes stay in the form of
  the model's opset (attribute before 13/18, input after);
- sign: ``Neg(x+c) -> (-c)-x``, ``Neg(a-b) -> b-a``;
- a scalar moved to where it folds: ``Relu(x)*c -> Relu(x*c)`` for c > 0 when x is a Mul by a constant
  or a Conv/Gemm/MatMul with constant weights (folded by the associative rules or linear fusion);
  ``((x+c)*k)+d -> x*k + (c*k+d)`` and ``(x*k+c)*k2 -> x*(k*k2) + c*k2``;
- elementwise ops across layout ops and Concat: ``Transpose(a, p) op Transpose(b, p) -> Transpose(a op b,
  p)``, ``Reshape(a) op Reshape(b) -> Reshape(a op b)`` (equal shapes), ``Concat(a*c, b*c) -> Concat(a,
  b)*c`` for the same scalar c (and ``+c``).

Guards: every intermediate that disappears has a single use; float dtypes; static shapes wherever the
rewrite could broadcast differently; a cost check wherever the factored form could cost more (for
example ``x*a + x*b`` when ``a+b`` would be larger than the products).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.passes.algebra.associative import bshape, fold, is_const, out_shape_kept
from dlcc.passes.algebra.match import float_dtype, operand_orders, produced_by, scalar
from dlcc.passes.rewrite import Builder, Rule, attr, const_array, static_shape

FAM = "distributive"


def _size(shape: tuple[int, ...] | None) -> int:
    return math.prod(shape) if shape is not None else 0


def _value_or_fold(b: Builder, op: str, a: ir.Value, c: ir.Value, np_op: Callable) -> ir.Value:
    """``op(a, c)`` as a constant when both are constants, else as a node."""
    ca, cc = const_array(a), const_array(c)
    if ca is not None and cc is not None and ca.dtype == cc.dtype:
        folded = fold(np_op, ca, ca, cc)
        if folded is not None:
            return b.const(folded, "folded")
    return b.op(op, [a, c])


_NP = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}

# ---------------------------------------------------------------------------------------- common factor


def _common_rule(name: str, root: str, inner: str, shared_pos: int | None, doc: str) -> Rule:
    """``root(inner(x, a), inner(x, b)) -> inner(x, root(a, b))``; ``shared_pos`` fixes where x is in
    ``inner`` (None: either side, inner is commutative)."""

    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2:
            return None
        p, q = produced_by(node.inputs[0], inner), produced_by(node.inputs[1], inner)
        if p is None or q is None or p is q:
            return None
        orders_p = [(p.inputs[0], p.inputs[1]), (p.inputs[1], p.inputs[0])]
        orders_q = [(q.inputs[0], q.inputs[1]), (q.inputs[1], q.inputs[0])]
        if shared_pos is not None:
            orders_p = [(p.inputs[shared_pos], p.inputs[1 - shared_pos])]
            orders_q = [(q.inputs[shared_pos], q.inputs[1 - shared_pos])]
        for x, a in orders_p:
            for y, bb in orders_q:
                if x is y and x is not None:
                    return {"x": x, "a": a, "b": bb, "p": p, "q": q}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        sx, sa, sb = static_shape(m["x"]), static_shape(m["a"]), static_shape(m["b"])
        so = static_shape(node.outputs[0])
        if None in (sx, sa, sb, so):
            return "shapes unknown"
        sab = bshape(sa, sb)
        if sab is None or bshape(sx, sab) != so:
            return "would change the output shape by broadcasting"
        both_const = is_const(m["a"]) and is_const(m["b"])
        old = _size(static_shape(m["p"].outputs[0])) + _size(static_shape(m["q"].outputs[0])) + _size(so)
        new = (0 if both_const else _size(sab)) + _size(so)
        if new >= old:
            return "does not save work"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        ab = _value_or_fold(b, root, m["a"], m["b"], _NP[root])
        ins = [m["x"], ab] if shared_pos in (None, 0) else [ab, m["x"]]
        return [b.op(inner, ins)]

    return Rule(name, (root,), pattern, check, rewrite, doc=doc, family=FAM, exact=False, input_ops=frozenset({inner}))


def _self_rule(name: str, root: str, mul_pos: int, doc: str, combine: Callable) -> Rule:
    """``x*a + x -> x*(a+1)`` and kin: ``mul_pos`` is where the Mul sits in the root (None: either)."""

    def pattern(node: ir.Node) -> dict | None:
        if len(node.inputs) != 2 or None in node.inputs:
            return None
        pairs = list(operand_orders(node)) if root == "Add" else [
            (node.inputs[mul_pos], node.inputs[1 - mul_pos])]
        for mv, x in pairs:
            p = produced_by(mv, "Mul")
            if p is None:
                continue
            for xx, av in operand_orders(p):
                a = const_array(av)
                if xx is x and a is not None:
                    return {"x": x, "a": a}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        c = fold(combine, m["a"], m["a"])
        if c is None:
            return "folded constant is not finite"
        why = out_shape_kept(node, static_shape(m["x"]), c.shape)
        if why:
            return why
        m["c"] = c
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        return [b.op("Mul", [m["x"], b.const(m["c"], "factor")])]

    return Rule(name, (root,), pattern, check, rewrite, doc=doc, family=FAM, exact=False, input_ops=frozenset({"Mul"}))


COMMON_RULES = [
    _common_rule("dist-mul-add-common", "Add", "Mul", None, "x*a + x*b -> x*(a+b)"),
    _common_rule("dist-mul-sub-common", "Sub", "Mul", None, "x*a - x*b -> x*(a-b)"),
    _common_rule("dist-div-add-common", "Add", "Div", 1, "a/x + b/x -> (a+b)/x"),
    _common_rule("dist-div-sub-common", "Sub", "Div", 1, "a/x - b/x -> (a-b)/x"),
    _self_rule("dist-add-mul-self", "Add", 0, "x*a + x -> x*(a+1) for constant a", lambda a: a + 1),
    _self_rule("dist-sub-mul-self", "Sub", 0, "x*a - x -> x*(a-1) for constant a", lambda a: a - 1),
    _self_rule("dist-sub-self-mul", "Sub", 1, "x - x*a -> x*(1-a) for constant a", lambda a: 1 - a),
]

# ------------------------------------------------------------------------------------------ linear ops


def _attrs_equal(p: ir.Node, q: ir.Node) -> bool:
    if set(p.attributes) != set(q.attributes):
        return False
    return all(p.attributes[k].value == q.attributes[k].value for k in p.attributes)


def _pair(node: ir.Node, op: str) -> tuple[ir.Node, ir.Node] | None:
    if len(node.inputs) != 2:
        return None
    p, q = produced_by(node.inputs[0], op), produced_by(node.inputs[1], op)
    if p is None or q is None or p is q:
        return None
    return p, q


def _bias(n: ir.Node) -> ir.Value | None:
    return n.inputs[2] if len(n.inputs) > 2 else None


def _conv_rule(name: str, root: str, doc: str) -> Rule:
    sign = 1.0 if root == "Add" else -1.0

    def pattern(node: ir.Node) -> dict | None:
        pq = _pair(node, "Conv")
        if pq is None or pq[0].inputs[0] is not pq[1].inputs[0]:
            return None
        return {"p": pq[0], "q": pq[1]}

    def check(node: ir.Node, m: dict) -> str | None:
        p, q = m["p"], m["q"]
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        if not _attrs_equal(p, q):
            return "Conv attributes differ"
        w1, w2 = const_array(p.inputs[1]), const_array(q.inputs[1])
        if w1 is None or w2 is None:
            return "weights not constant"
        if w1.shape != w2.shape:
            return "weight shapes differ"
        if static_shape(p.outputs[0]) is None or static_shape(p.outputs[0]) != static_shape(node.outputs[0]):
            return "shapes unknown or broadcast"
        biases = []
        for n in (p, q):
            bv = _bias(n)
            c = const_array(bv) if bv is not None else np.zeros(w1.shape[0], w1.dtype)
            if c is None:
                return "bias not constant"
            biases.append(c)
        m["w"] = fold(lambda a, b: a + sign * b, w1, w1, w2)
        m["bias"] = fold(lambda a, b: a + sign * b, biases[0], biases[0], biases[1])
        if m["w"] is None or m["bias"] is None:
            return "folded constant is not finite"
        m["has_bias"] = _bias(p) is not None or _bias(q) is not None
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        ins = [m["p"].inputs[0], b.const(m["w"], "weight")]
        if m["has_bias"]:
            ins.append(b.const(m["bias"], "bias"))
        return [b.op("Conv", ins, dict(m["p"].attributes))]

    return Rule(name, (root,), pattern, check, rewrite, doc=doc, family=FAM, exact=False, input_ops=frozenset({"Conv"}))


def _same_const(a: ir.Value, b: ir.Value) -> bool:
    if a is b:
        return True
    ca, cb = const_array(a), const_array(b)
    return ca is not None and cb is not None and ca.shape == cb.shape and ca.dtype == cb.dtype and bool(
        np.array_equal(ca, cb))


def _conv_shared_pattern(node: ir.Node) -> dict | None:
    pq = _pair(node, "Conv")
    if pq is None or not _same_const(pq[0].inputs[1], pq[1].inputs[1]):
        return None
    return {"p": pq[0], "q": pq[1]}


def _conv_shared_check(node: ir.Node, m: dict) -> str | None:
    p, q = m["p"], m["q"]
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    if not _attrs_equal(p, q):
        return "Conv attributes differ"
    sx, sy = static_shape(p.inputs[0]), static_shape(q.inputs[0])
    if sx is None or sx != sy:
        return "inputs differ in shape"
    if static_shape(p.outputs[0]) != static_shape(node.outputs[0]):
        return "would change the output shape by broadcasting"
    biases = [const_array(_bias(n)) if _bias(n) is not None else None for n in (p, q)]
    if any(bv is not None and c is None for bv, c in zip((_bias(p), _bias(q)), biases, strict=True)):
        return "bias not constant"
    present = [c for c in biases if c is not None]
    m["bias"] = None if not present else (present[0] if len(present) == 1 else fold(np.add, present[0], *present))
    return None


def _conv_shared_rewrite(node: ir.Node, m: dict, b: Builder):
    p, q = m["p"], m["q"]
    s = b.op("Add", [p.inputs[0], q.inputs[0]])
    ins = [s, p.inputs[1]]
    if m["bias"] is not None:
        ins.append(b.const(m["bias"], "bias"))
    return [b.op("Conv", ins, dict(p.attributes))]


def _matmul_rule(name: str, root: str, shared: int, doc: str) -> Rule:
    """``MatMul(x, A) op MatMul(x, B) -> MatMul(x, A op B)`` (shared=0) or the right operand shared."""
    other = 1 - shared

    def pattern(node: ir.Node) -> dict | None:
        pq = _pair(node, "MatMul")
        if pq is None:
            return None
        p, q = pq
        if p.inputs[shared] is not q.inputs[shared] and not _same_const(p.inputs[shared], q.inputs[shared]):
            return None
        return {"x": p.inputs[shared], "a": p.inputs[other], "b": q.inputs[other], "p": p, "q": q}

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        sa, sb = static_shape(m["a"]), static_shape(m["b"])
        if sa is None or sa != sb:
            return "operands differ in shape"
        if static_shape(m["p"].outputs[0]) is None or static_shape(m["p"].outputs[0]) != static_shape(
                node.outputs[0]):
            return "would change the output shape by broadcasting"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        ab = _value_or_fold(b, root, m["a"], m["b"], _NP[root])
        return [b.op("MatMul", [m["x"], ab] if shared == 0 else [ab, m["x"]])]

    return Rule(name, (root,), pattern, check, rewrite, doc=doc, family=FAM, exact=False,
                input_ops=frozenset({"MatMul"}))


def _gemm_pattern(node: ir.Node) -> dict | None:
    pq = _pair(node, "Gemm")
    if pq is None or pq[0].inputs[0] is not pq[1].inputs[0]:
        return None
    return {"p": pq[0], "q": pq[1]}


def _gemm_check(node: ir.Node, m: dict) -> str | None:
    p, q = m["p"], m["q"]
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    if attr(p, "transA", 0) != attr(q, "transA", 0) or attr(p, "transB", 0) != attr(q, "transB", 0):
        return "transposes differ"
    w1, w2 = const_array(p.inputs[1]), const_array(q.inputs[1])
    if w1 is None or w2 is None or w1.shape != w2.shape:
        return "weights not constant or of different shapes"
    so = static_shape(node.outputs[0])
    if so is None or static_shape(p.outputs[0]) != so:
        return "would change the output shape by broadcasting"
    a1, a2 = attr(p, "alpha", 1.0), attr(q, "alpha", 1.0)
    m["w"] = fold(lambda x, y: a1 * x + a2 * y, w1, w1, w2)
    bias = None
    for n in (p, q):
        bv = _bias(n)
        if bv is None:
            continue
        c = const_array(bv)
        if c is None:
            return "bias not constant"
        c = c.astype(np.float64) * attr(n, "beta", 1.0)
        bias = c if bias is None else bias + c
    if m["w"] is None or (bias is not None and not np.all(np.isfinite(bias))):
        return "folded constant is not finite"
    m["bias"] = None if bias is None else bias.astype(w1.dtype)
    return None


def _gemm_rewrite(node: ir.Node, m: dict, b: Builder):
    p = m["p"]
    ins = [p.inputs[0], b.const(m["w"], "weight")]
    if m["bias"] is not None:
        ins.append(b.const(m["bias"], "bias"))
    return [b.op("Gemm", ins, {"transA": attr(p, "transA", 0), "transB": attr(p, "transB", 0)})]


def _concat_matmul_pattern(node: ir.Node) -> dict | None:
    ps = [produced_by(v, "MatMul") for v in node.inputs]
    if len(ps) < 2 or any(p is None for p in ps) or len(set(map(id, ps))) != len(ps):
        return None
    x = ps[0].inputs[0]
    if any(p.inputs[0] is not x for p in ps):
        return None
    return {"x": x, "ws": [p.inputs[1] for p in ps]}


def _concat_matmul_check(node: ir.Node, m: dict) -> str | None:
    so = static_shape(node.outputs[0])
    if so is None or any(static_shape(w) is None for w in m["ws"]):
        return "shapes unknown"
    axis = attr(node, "axis", 0)
    if axis not in (-1, len(so) - 1):
        return "not concatenated along the last axis"
    if any(len(static_shape(w)) != 2 for w in m["ws"]):
        return "weights not 2-D"
    if not all(is_const(w) for w in m["ws"]) and sum(_size(static_shape(w)) for w in m["ws"]) > _size(so):
        return "concatenating the weights costs more than the outputs"
    return None


def _concat_matmul_rewrite(node: ir.Node, m: dict, b: Builder):
    cs = [const_array(w) for w in m["ws"]]
    if all(c is not None for c in cs) and len({c.dtype for c in cs}) == 1:
        w = b.const(np.concatenate(cs, axis=1), "weight")
    else:
        w = b.op("Concat", m["ws"], {"axis": 1})
    return [b.op("MatMul", [m["x"], w])]


LINEAR_RULES = [
    _conv_rule("dist-conv-add", "Add", "Conv(x, W1, b1) + Conv(x, W2, b2) -> Conv(x, W1+W2, b1+b2)"),
    _conv_rule("dist-conv-sub", "Sub", "Conv(x, W1, b1) - Conv(x, W2, b2) -> Conv(x, W1-W2, b1-b2)"),
    Rule("dist-conv-add-shared-weight", ("Add",), _conv_shared_pattern, _conv_shared_check, _conv_shared_rewrite,
         doc="Conv(x, W, b1) + Conv(y, W, b2) -> Conv(x+y, W, b1+b2)", family=FAM, exact=False,
         input_ops=frozenset({"Conv"})),
    _matmul_rule("dist-matmul-add-left", "Add", 0, "MatMul(x, A) + MatMul(x, B) -> MatMul(x, A+B)"),
    _matmul_rule("dist-matmul-sub-left", "Sub", 0, "MatMul(x, A) - MatMul(x, B) -> MatMul(x, A-B)"),
    _matmul_rule("dist-matmul-add-right", "Add", 1, "MatMul(x, A) + MatMul(y, A) -> MatMul(x+y, A)"),
    _matmul_rule("dist-matmul-sub-right", "Sub", 1, "MatMul(x, A) - MatMul(y, A) -> MatMul(x-y, A)"),
    Rule("dist-gemm-add", ("Add",), _gemm_pattern, _gemm_check, _gemm_rewrite,
         doc="Gemm(x, A, c1) + Gemm(x, B, c2) -> Gemm(x, a1 A + a2 B, b1 c1 + b2 c2)", family=FAM, exact=False,
         input_ops=frozenset({"Gemm"})),
    Rule("dist-concat-matmul", ("Concat",), _concat_matmul_pattern, _concat_matmul_check, _concat_matmul_rewrite,
         doc="Concat(MatMul(x, A), MatMul(x, B); last axis) -> MatMul(x, Concat(A, B))", family=FAM,
         exact=False, input_ops=frozenset({"MatMul"})),
]

# ------------------------------------------------------------------------------------------ reductions


def _reduce_rule(name: str, reduce: str, inner: str, doc: str, *, exact: bool, positive: bool = False) -> Rule:
    """``Reduce(inner(x, c)) -> inner(Reduce(x), c)`` for a scalar c (``inner`` Neg: no constant)."""

    def pattern(node: ir.Node) -> dict | None:
        p = produced_by(node.inputs[0], inner)
        if p is None:
            return None
        if inner == "Neg":
            return {"x": p.inputs[0], "cv": None}
        pairs = list(operand_orders(p)) if inner == "Mul" else [(p.inputs[0], p.inputs[1])]
        for x, cv in pairs:
            if scalar(cv) is not None and not is_const(x):
                return {"x": x, "cv": cv, "inner": p}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        sx, so = static_shape(m["x"]), static_shape(node.outputs[0])
        if sx is None or so is None:
            return "shapes unknown"
        if sx != static_shape(node.inputs[0]):
            return "the scalar changes the operand's shape"
        if _size(so) >= _size(sx):
            return "the reduction does not shrink the tensor"
        if positive and not scalar(m["cv"]) > 0:
            return "scalar not positive"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        r = b.op(reduce, [m["x"], *node.inputs[1:]], dict(node.attributes))
        if inner == "Neg":
            return [b.op("Neg", [r])]
        c = b.const(np.asarray(const_array(m["cv"])).reshape(()), "scale")
        return [b.op(inner, [r, c])]

    return Rule(name, (reduce,), pattern, check, rewrite, doc=doc, family=FAM, exact=exact,
                input_ops=frozenset({inner}))


REDUCE_RULES = [
    _reduce_rule("dist-reducesum-mul-scalar", "ReduceSum", "Mul", "ReduceSum(x*c) -> ReduceSum(x)*c (scalar c)",
                 exact=False),
    _reduce_rule("dist-reducemean-mul-scalar", "ReduceMean", "Mul", "ReduceMean(x*c) -> ReduceMean(x)*c "
                 "(scalar c)", exact=False),
    _reduce_rule("dist-reducesum-div-scalar", "ReduceSum", "Div", "ReduceSum(x/c) -> ReduceSum(x)/c (scalar c)",
                 exact=False),
    _reduce_rule("dist-reducemean-div-scalar", "ReduceMean", "Div", "ReduceMean(x/c) -> ReduceMean(x)/c "
                 "(scalar c)", exact=False),
    _reduce_rule("dist-reducesum-neg", "ReduceSum", "Neg", "ReduceSum(Neg(x)) -> Neg(ReduceSum(x))", exact=True),
    _reduce_rule("dist-reducemean-neg", "ReduceMean", "Neg", "ReduceMean(Neg(x)) -> Neg(ReduceMean(x))",
                 exact=True),
    _reduce_rule("dist-reducemax-mul-pos", "ReduceMax", "Mul", "ReduceMax(x*c) -> ReduceMax(x)*c (scalar c > 0)",
                 exact=True, positive=True),
    _reduce_rule("dist-reducemin-mul-pos", "ReduceMin", "Mul", "ReduceMin(x*c) -> ReduceMin(x)*c (scalar c > 0)",
                 exact=True, positive=True),
]

# ------------------------------------------------------------------------------------------------ sign


def _neg_add_pattern(node: ir.Node) -> dict | None:
    p = produced_by(node.inputs[0], "Add")
    if p is None:
        return None
    for x, cv in operand_orders(p):
        c = const_array(cv)
        if c is not None and not is_const(x):
            return {"x": x, "c": c}
    return None


def _neg_add_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    return out_shape_kept(node, static_shape(m["x"]), m["c"].shape)


def _neg_sub_pattern(node: ir.Node) -> dict | None:
    p = produced_by(node.inputs[0], "Sub")
    return None if p is None else {"a": p.inputs[0], "b": p.inputs[1]}


def _neg_sub_check(node: ir.Node, m: dict) -> str | None:
    return None if float_dtype(node.outputs[0]) else "dtype not float"


SIGN_RULES = [
    Rule("dist-neg-add-const", ("Neg",), _neg_add_pattern, _neg_add_check,
         lambda n, m, b: [b.op("Sub", [b.const(np.negative(m["c"]), "neg"), m["x"]])],
         doc="Neg(x + c) -> (-c) - x", family=FAM, exact=True, input_ops=frozenset({"Add"})),
    Rule("dist-neg-sub", ("Neg",), _neg_sub_pattern, _neg_sub_check,
         lambda n, m, b: [b.op("Sub", [m["b"], m["a"]])], doc="Neg(a - b) -> b - a", family=FAM, exact=True,
         input_ops=frozenset({"Sub"})),
]

# ---------------------------------------------------------------------------------- scalars that fold


_FOLDS_SCALE = ("Conv", "Gemm", "MatMul", "Mul")


def _relu_mul_pattern(node: ir.Node) -> dict | None:
    for rv, cv in operand_orders(node):
        r = produced_by(rv, "Relu")
        c = scalar(cv)
        if r is not None and c is not None:
            return {"x": r.inputs[0], "cv": cv, "c": c}
    return None


def _relu_mul_check(node: ir.Node, m: dict) -> str | None:
    if not float_dtype(node.outputs[0]):
        return "dtype not float"
    if not m["c"] > 0:
        return "scalar not positive"
    if static_shape(m["x"]) is None or static_shape(m["x"]) != static_shape(node.outputs[0]):
        return "the scalar changes the operand's shape"
    p = produced_by(m["x"], _FOLDS_SCALE)
    if p is None:
        return "the scale would not fold (no single-use linear producer)"
    ok = any(is_const(v) for v in p.inputs) if p.op_type == "Mul" else len(p.inputs) > 1 and is_const(p.inputs[1])
    return None if ok else "the scale would not fold (producer has no constant operand)"


def _relu_mul_rewrite(node: ir.Node, m: dict, b: Builder):
    return [b.op("Relu", [b.op("Mul", [m["x"], m["cv"]])])]


def _affine_pattern(outer: str, mid: str, inner: str) -> Callable[[ir.Node], dict | None]:
    """``outer(mid(inner(x, c), k), d)`` with constants c, k, d (commutative operands in any order)."""

    def pattern(node: ir.Node) -> dict | None:
        for mv, dv in operand_orders(node):
            d = const_array(dv)
            mp = produced_by(mv, mid)
            if d is None or mp is None:
                continue
            for iv, kv in operand_orders(mp):
                k = const_array(kv)
                ip = produced_by(iv, inner)
                if k is None or ip is None:
                    continue
                for x, cv in operand_orders(ip):
                    c = const_array(cv)
                    if c is not None and not is_const(x):
                        return {"x": x, "c": c, "k": k, "d": d}
        return None

    return pattern


def _affine_check(combine_scale: Callable, combine_shift: Callable) -> Callable[[ir.Node, dict], str | None]:
    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        if len({m["c"].dtype, m["k"].dtype, m["d"].dtype}) != 1:
            return "constants differ in dtype"
        s = fold(combine_scale, m["k"], m["c"], m["k"], m["d"])
        t = fold(combine_shift, m["k"], m["c"], m["k"], m["d"])
        if s is None or t is None:
            return "folded constant is not finite"
        why = out_shape_kept(node, static_shape(m["x"]), s.shape, t.shape)
        if why:
            return why
        m["s"], m["t"] = s, t
        return None

    return check


def _affine_rewrite(node: ir.Node, m: dict, b: Builder):
    y = b.op("Mul", [m["x"], b.const(m["s"], "scale")])
    return [b.op("Add", [y, b.const(m["t"], "shift")])]


FOLD_RULES = [
    Rule("dist-relu-mul-pos", ("Mul",), _relu_mul_pattern, _relu_mul_check, _relu_mul_rewrite,
         doc="Relu(x)*c -> Relu(x*c) for scalar c > 0 when x*c folds into x's producer", family=FAM,
         exact=False, input_ops=frozenset({"Relu"})),
    Rule("dist-affine-add-mul-add", ("Add",), _affine_pattern("Add", "Mul", "Add"),
         _affine_check(lambda c, k, d: k, lambda c, k, d: c * k + d), _affine_rewrite,
         doc="((x+c)*k)+d -> x*k + (c*k+d)", family=FAM, exact=False, input_ops=frozenset({"Mul"})),
    Rule("dist-affine-mul-add-mul", ("Mul",), _affine_pattern("Mul", "Add", "Mul"),
         _affine_check(lambda c, k, d: c * d, lambda c, k, d: k * d), _affine_rewrite,
         doc="(x*c + k)*d -> x*(c*d) + k*d", family=FAM, exact=False, input_ops=frozenset({"Add"})),
]

# --------------------------------------------------------------------------------- across layout ops


def _layout_rule(name: str, root: str, layout: str, doc: str) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        pq = _pair(node, layout)
        return None if pq is None else {"p": pq[0], "q": pq[1]}

    def check(node: ir.Node, m: dict) -> str | None:
        p, q = m["p"], m["q"]
        sa, sb = static_shape(p.inputs[0]), static_shape(q.inputs[0])
        if sa is None or sa != sb:
            return "operands differ in shape"
        if p.inputs[0].dtype != q.inputs[0].dtype:
            return "dtypes differ"
        if layout == "Transpose":
            if attr(p, "perm") != attr(q, "perm"):
                return "perms differ"
        elif static_shape(p.outputs[0]) != static_shape(q.outputs[0]):
            return "reshaped to different shapes"
        if static_shape(p.outputs[0]) != static_shape(node.outputs[0]):
            return "would change the output shape by broadcasting"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        p, q = m["p"], m["q"]
        y = b.op(root, [p.inputs[0], q.inputs[0]])
        return [b.op(layout, [y, *p.inputs[1:]], dict(p.attributes))]

    return Rule(name, (root,), pattern, check, rewrite, doc=doc, family=FAM, exact=True, input_ops=frozenset({layout}))


def _concat_scalar_rule(name: str, op: str, doc: str) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        xs, cs = [], []
        if len(node.inputs) < 2 or len(set(map(id, node.inputs))) != len(node.inputs):
            return None
        for v in node.inputs:
            p = produced_by(v, op)
            if p is None:
                return None
            for x, cv in operand_orders(p):
                if scalar(cv) is not None and not is_const(x):
                    xs.append(x)
                    cs.append(const_array(cv))
                    break
            else:
                return None
        return {"xs": xs, "cs": cs}

    def check(node: ir.Node, m: dict) -> str | None:
        if not float_dtype(node.outputs[0]):
            return "dtype not float"
        c0 = m["cs"][0]
        if any(c.dtype != c0.dtype or c.reshape(()) != c0.reshape(()) for c in m["cs"]):
            return "scalars differ"
        for x, v in zip(m["xs"], node.inputs, strict=True):
            if static_shape(x) is None or static_shape(x) != static_shape(v):
                return "the scalar changes an operand's shape"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        cat = b.op("Concat", m["xs"], dict(node.attributes))
        return [b.op(op, [cat, b.const(m["cs"][0].reshape(()), "scalar")])]

    return Rule(name, ("Concat",), pattern, check, rewrite, doc=doc, family=FAM, exact=True, input_ops=frozenset({op}))


LAYOUT_RULES = [
    *[_layout_rule(f"dist-transpose-{op.lower()}", op, "Transpose",
                   f"Transpose(a, p) {sym} Transpose(b, p) -> Transpose(a {sym} b, p)")
      for op, sym in (("Add", "+"), ("Sub", "-"), ("Mul", "*"), ("Div", "/"))],
    *[_layout_rule(f"dist-reshape-{op.lower()}", op, "Reshape",
                   f"Reshape(a, s) {sym} Reshape(b, s) -> Reshape(a {sym} b, s) (a, b of equal shapes)")
      for op, sym in (("Add", "+"), ("Sub", "-"), ("Mul", "*"), ("Div", "/"))],
    _concat_scalar_rule("dist-concat-mul-scalar", "Mul", "Concat(a*c, b*c) -> Concat(a, b)*c for the same scalar c"),
    _concat_scalar_rule("dist-concat-add-scalar", "Add", "Concat(a+c, b+c) -> Concat(a, b)+c for the same scalar c"),
]

RULES: list[Rule] = [*COMMON_RULES, *LINEAR_RULES, *REDUCE_RULES, *SIGN_RULES, *FOLD_RULES, *LAYOUT_RULES]
