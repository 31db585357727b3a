"""Pattern fusion: recognize primitive forms of LayerNormalization, RMSNorm and GELU and replace each by
its ONNX op.

What goes in: a model with shapes inferred (``infer_shapes``). What comes out: the same model where the
primitive LayerNorm chain becomes one ``LayerNormalization`` (opset >= 17), the primitive RMSNorm chain
one ``RMSNormalization`` (opset >= 23) and the primitive GELU chains one ``Gelu`` (opset >= 20); below
those opsets the chain is left as it is (the graph must stay standard ONNX that onnxruntime runs).

Invariants: a chain is matched only when every value inside it is used inside it alone (the chain's
input may have other uses). Constants must match within 1e-4 relative.

Algorithm: each primitive chain is matched backwards from a candidate final node (the node the driver
visits as root) down to the chain's input ``x``; for LayerNorm and RMSNorm the optional ``* gamma`` and
``+ beta`` tail is then extended forwards from the normalization, and the match is only taken at the
root where that extension ends, so the whole chain is replaced at once:

    x ─ReduceMean─▶ mean      d = x - mean      v = ReduceMean(d*d | d^2)
    y = d / Sqrt(v + eps)   (or d * Reciprocal(...))   [* gamma]   [+ beta]     LayerNorm
    y = x / Sqrt(ReduceMean(x*x | x^2) + eps)          [* gamma]                 RMSNorm
    y = x * 0.5 * (1 + Erf(x / sqrt2 | x * 1/sqrt2))              any product order   GELU (erf)
    y = x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3)))     any product order   GELU (tanh)

This module also holds ``channel_vector``, which ``fuse_linear`` shares.
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
    single_use,
)

REL_TOL = 1e-4  # how closely a recognized constant must match its textbook value

FLOAT_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE})
NORM_DTYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})  # normalization ops stash in float

# ------------------------------------------------------------------------------ shared small helpers


def model_opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def channel_vector(c: np.ndarray, rank: int, axis: int, size: int) -> np.ndarray | None:
    """``c`` broadcast against a rank-``rank`` tensor with ``size`` channels on ``axis``: when it varies
    along that axis only and cannot change the tensor's shape, its per-channel values (float64, length
    ``size``); else None."""
    if c.ndim > rank or not 0 <= axis < rank:
        return None
    full = (1,) * (rank - c.ndim) + tuple(c.shape)
    if any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] not in (1, size):
        return None
    return np.broadcast_to(np.asarray(c, dtype=np.float64).reshape(-1), (size,)).copy()


def _default(node: ir.Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _prod(v: ir.Value | None, ops: str | tuple[str, ...]) -> ir.Node | None:
    """The producer of ``v`` when it is a default-domain node of one of ``ops`` with one output."""
    if v is None:
        return None
    p = v.producer()
    ops = (ops,) if isinstance(ops, str) else ops
    if p is None or not _default(p) or p.op_type not in ops or len(p.outputs) != 1:
        return None
    return p


def _scalar(v: ir.Value | None) -> float | None:
    c = const_array(v)
    if c is None or c.size != 1 or c.dtype.kind not in "fiu":
        return None
    return float(c.reshape(-1)[0])


def _close(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= REL_TOL * abs(expected)


def _pairs(node: ir.Node) -> list[tuple[ir.Value, ir.Value]]:
    """Both operand orders of a binary commutative node."""
    a, b = node.inputs[0], node.inputs[1]
    return [(a, b), (b, a)]


def _consumer(v: ir.Value, op_type: str | tuple[str, ...]) -> ir.Node | None:
    """The only consumer of ``v`` when ``v`` has a single use by a default-domain ``op_type`` node."""
    if not single_use(v):
        return None
    node = v.uses()[0].node
    ops = (op_type,) if isinstance(op_type, str) else op_type
    return node if _default(node) and node.op_type in ops else None


def _closed(nodes: Sequence[ir.Node], final: ir.Node) -> bool:
    """Every value produced inside ``nodes`` (but the final node's) is used inside ``nodes`` only."""
    ids = {id(n) for n in nodes}
    for n in nodes:
        if n is final:
            continue
        for o in n.outputs:
            if o.is_graph_output() or any(id(u.node) not in ids for u in o.uses()):
                return False
    return True


# ------------------------------------------------------------------------------ reductions and shapes


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _reduced_axes(node: ir.Node, rank: int) -> tuple[int, ...] | None:
    """The sorted, non-negative axes a ReduceMean with keepdims=1 reduces; None when unknown or other."""
    if attr(node, "keepdims", 1) != 1:
        return None
    if "axes" in node.attributes:
        axes = list(attr(node, "axes"))
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        c = const_array(node.inputs[1])
        if c is None:
            return None
        axes = [int(a) for a in c.reshape(-1)]
        if not axes and attr(node, "noop_with_empty_axes", 0):
            return None
    else:
        if attr(node, "noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    if not axes:
        axes = list(range(rank))
    norm = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in norm):
        return None
    return tuple(norm)


def _trailing_axis(axes: tuple[int, ...], rank: int) -> int | None:
    """The first axis when ``axes`` are exactly the trailing axes of a rank-``rank`` tensor."""
    if not axes or tuple(axes) != tuple(range(rank - len(axes), rank)):
        return None
    return rank - len(axes)


def _norm_param(c: np.ndarray, rank: int, axis: int, norm_shape: tuple[int, ...]) -> np.ndarray | None:
    """A gamma/beta constant as the normalized shape, when it broadcasts the way a normalization's
    scale does (varies over the normalized axes only, does not change the shape); else None."""
    if c.ndim > rank:
        return None
    full = (1,) * (rank - c.ndim) + tuple(c.shape)
    if any(d != 1 for d in full[:axis]):
        return None
    if any(d not in (1, n) for d, n in zip(full[axis:], norm_shape, strict=True)):
        return None
    return np.broadcast_to(c.reshape(full[axis:]), norm_shape).copy()


def _norm_guards(x: ir.Value, m: dict) -> str | None:
    """Shared LayerNorm/RMSNorm guards; fills ``m`` with axis, eps, scale/bias arrays."""
    if x.dtype not in NORM_DTYPES:
        return "input dtype is not float32/float16"
    rank = _rank(x)
    if rank is None:
        return "input rank unknown"
    axes = [_reduced_axes(rm, rank) for rm in m["reductions"]]
    if any(a is None for a in axes) or len(set(axes)) != 1:
        return "ReduceMean axes differ, are unknown or keepdims=0"
    axis = _trailing_axis(axes[0], rank)
    if axis is None:
        return "the reduced axes are not the trailing axes"
    norm_shape = tuple(x.shape)[axis:]
    if not all(isinstance(d, int) for d in norm_shape):
        return "normalized dims are not static"
    eps = _scalar(m["eps"])
    if eps is None or eps < 0 or not math.isfinite(eps) or const_array(m["eps"]).ndim > rank:
        return "epsilon is not a non-negative scalar constant"
    dt = x.dtype.numpy()
    for key, fill in (("gamma", 1.0), ("beta", 0.0)):
        v = m.get(key)
        if v is None:
            m[key + "_array"] = np.full(norm_shape, fill, dtype=dt)
            continue
        c = const_array(v)
        arr = None if c is None or c.dtype != dt else _norm_param(c, rank, axis, norm_shape)
        if arr is None:
            return f"{key} does not broadcast like the normalization's parameter"
        m[key + "_array"] = arr
    if not _closed(m["nodes"], m["final"]):
        return "an intermediate value has other uses"
    m["axis"], m["epsilon"] = axis, eps
    return None


def _candidates(root: ir.Node, ops: tuple[str, ...], depth: int = 2) -> list[ir.Node]:
    """``root`` and the producers up to ``depth`` steps above it that have an op in ``ops``."""
    found, frontier = [root], [root]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for v in n.inputs:
                p = _prod(v, ops)
                if p is not None and p not in found:
                    found.append(p)
                    nxt.append(p)
        frontier = nxt
    return found


def _affine_tail(norm: ir.Node, with_beta: bool) -> tuple[ir.Value | None, ir.Value | None, list[ir.Node]]:
    """From the normalization node forwards: an optional Mul by a constant (gamma), then (if asked) an
    optional Add of a constant (beta). Returns gamma, beta and the tail nodes."""
    cur, gamma, beta, nodes = norm.outputs[0], None, None, []
    mul = _consumer(cur, "Mul")
    if mul is not None:
        other = mul.inputs[1] if mul.inputs[0] is cur else mul.inputs[0]
        if other is not cur and const_array(other) is not None:
            gamma, cur = other, mul.outputs[0]
            nodes.append(mul)
    add = _consumer(cur, "Add") if with_beta else None
    if add is not None:
        other = add.inputs[1] if add.inputs[0] is cur else add.inputs[0]
        if other is not cur and const_array(other) is not None:
            beta = other
            nodes.append(add)
    return gamma, beta, nodes


def _divide(node: ir.Node) -> tuple[ir.Value, ir.Value, list[ir.Node]] | None:
    """``node`` computes ``a / s`` as Div(a, s) or Mul(a, Reciprocal(s)): (a, s, [extra nodes])."""
    if node.op_type == "Div":
        return node.inputs[0], node.inputs[1], []
    if node.op_type == "Mul":
        for a, r in _pairs(node):
            rec = _prod(r, "Reciprocal")
            if rec is not None:
                return a, rec.inputs[0], [rec]
    return None


def _square_of(v: ir.Value) -> tuple[ir.Value, ir.Node] | None:
    """``v`` = Pow(d, 2) or Mul(d, d): (d, node)."""
    p = _prod(v, ("Pow", "Mul"))
    if p is None:
        return None
    if p.op_type == "Pow" and _scalar(p.inputs[1]) == 2.0:
        return p.inputs[0], p
    if p.op_type == "Mul" and p.inputs[0] is p.inputs[1]:
        return p.inputs[0], p
    return None


def _rms_denominator(std: ir.Value) -> dict | None:
    """``std`` = Sqrt(ReduceMean(sq) + eps): its nodes, the squared value, eps and the reduction."""
    sqrt = _prod(std, "Sqrt")
    add = _prod(sqrt.inputs[0], "Add") if sqrt else None
    if add is None:
        return None
    for var, eps in _pairs(add):
        rm = _prod(var, "ReduceMean")
        if rm is not None and const_array(eps) is not None:
            sq = _square_of(rm.inputs[0])
            if sq is not None:
                return {"base": sq[0], "eps": eps, "reduction": rm, "nodes": [sq[1], rm, add, sqrt]}
    return None


def _ln_core(node: ir.Node) -> dict | None:
    """``node`` is the normalization step of a primitive LayerNorm: d / sqrt(mean(d^2) + eps)."""
    div = _divide(node)
    if div is None:
        return None
    d, std, extra = div
    sub = _prod(d, "Sub")
    mean_rm = _prod(sub.inputs[1], "ReduceMean") if sub else None
    if mean_rm is None or mean_rm.inputs[0] is not sub.inputs[0]:
        return None
    den = _rms_denominator(std)
    if den is None or den["base"] is not d:
        return None
    return {"x": sub.inputs[0], "eps": den["eps"], "reductions": [mean_rm, den["reduction"]],
            "nodes": [mean_rm, sub, *den["nodes"], *extra, node]}


def _is_centering(v: ir.Value) -> bool:
    """``v`` = x - ReduceMean(x): then an RMS chain over ``v`` is the tail of a LayerNorm."""
    sub = _prod(v, "Sub")
    rm = _prod(sub.inputs[1], "ReduceMean") if sub else None
    return rm is not None and rm.inputs[0] is sub.inputs[0]


def _rms_core(node: ir.Node) -> dict | None:
    """``node`` is the normalization step of a primitive RMSNorm: x / sqrt(mean(x^2) + eps)."""
    div = _divide(node)
    if div is None:
        return None
    x, std, extra = div
    den = _rms_denominator(std)
    if den is None or den["base"] is not x or _is_centering(x):
        return None
    return {"x": x, "eps": den["eps"], "reductions": [den["reduction"]],
            "nodes": [*den["nodes"], *extra, node]}


def _norm_pattern(core_fn: Callable[[ir.Node], dict | None], with_beta: bool):
    def pattern(root: ir.Node) -> dict | None:
        for cand in _candidates(root, ("Div", "Mul")):
            core = core_fn(cand)
            if core is None:
                continue
            gamma, beta, tail = _affine_tail(cand, with_beta)
            final = tail[-1] if tail else cand
            if final is not root:
                continue  # the chain goes on: it is matched at its last node
            core.update(gamma=gamma, beta=beta, final=root, nodes=core["nodes"] + tail)
            return core
        return None

    return pattern


def _norm_check(node: ir.Node, m: dict) -> str | None:
    return _norm_guards(m["x"], m)


def _param_value(m: dict, key: str, b: Builder, hint: str) -> ir.Value:
    """The gamma/beta value itself when it already has the normalized shape, else a new constant."""
    v, arr = m[key], m[key + "_array"]
    c = const_array(v)
    if c is not None and c.shape == arr.shape:
        return v
    return b.const(arr, hint)


def _layernorm_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    x = m["x"]
    g = _param_value(m, "gamma", b, "ln_scale")
    bias = _param_value(m, "beta", b, "ln_bias")
    y = b.op("LayerNormalization", [x, g, bias], {"axis": m["axis"], "epsilon": m["epsilon"]},
             hint=node.outputs[0].name, dtype=x.dtype, shape=node.outputs[0].shape)
    return [y]


def _rmsnorm_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    x = m["x"]
    g = _param_value(m, "gamma", b, "rms_scale")
    y = b.op("RMSNormalization", [x, g], {"axis": m["axis"], "epsilon": m["epsilon"]},
             hint=node.outputs[0].name, dtype=x.dtype, shape=node.outputs[0].shape)
    return [y]


# ------------------------------------------------------------------------------ GELU

_SQRT2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _half_factor(v: ir.Value) -> list[ir.Node] | None:
    """``v`` is the constant 0.5: [] (no node belongs to the chain for it)."""
    return [] if _close(_scalar(v), 0.5) else None


def _one_plus(v: ir.Value, op: str) -> tuple[ir.Node, list[ir.Node]] | None:
    """``v`` = Add(op(u), 1): (the op node, [Add, op])."""
    add = _prod(v, "Add")
    if add is None:
        return None
    for t, one in _pairs(add):
        fn = _prod(t, op)
        if fn is not None and _close(_scalar(one), 1.0):
            return fn, [add, fn]
    return None


def _erf_arg(u: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """``u`` = x / sqrt(2) or x * (1/sqrt(2)): (x, nodes)."""
    p = _prod(u, ("Div", "Mul"))
    if p is None:
        return None
    if p.op_type == "Div" and _close(_scalar(p.inputs[1]), _SQRT2):
        return p.inputs[0], [p]
    if p.op_type == "Mul":
        for x, c in _pairs(p):
            if _close(_scalar(c), 1 / _SQRT2) and const_array(x) is None:
                return x, [p]
    return None


def _cube_of(v: ir.Value, x: ir.Value) -> list[ir.Node] | None:
    """``v`` = x^3 as Pow(x, 3) or x*x*x in either grouping."""
    p = _prod(v, ("Pow", "Mul"))
    if p is None:
        return None
    if p.op_type == "Pow":
        return [p] if p.inputs[0] is x and _scalar(p.inputs[1]) == 3.0 else None
    for a, sq in _pairs(p):
        q = _prod(sq, "Mul")
        if a is x and q is not None and q.inputs[0] is x and q.inputs[1] is x:
            return [p, q]
    return None


def _tanh_arg(u: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """``u`` = sqrt(2/pi) * (x + 0.044715 * x^3): (x, nodes)."""
    outer = _prod(u, "Mul")
    if outer is None:
        return None
    for s, c in _pairs(outer):
        if not _close(_scalar(c), _SQRT_2_OVER_PI):
            continue
        add = _prod(s, "Add")
        if add is None:
            continue
        for x, k3 in _pairs(add):
            mul = _prod(k3, "Mul")
            if mul is None:
                continue
            for cube, k in _pairs(mul):
                if _close(_scalar(k), _GELU_CUBIC):
                    nodes = _cube_of(cube, x)
                    if nodes is not None:
                        return x, [outer, add, mul, *nodes]
    return None


def _gelu_inner(p: ir.Value) -> tuple[ir.Value, str, list[ir.Node]] | None:
    """``p`` = 1 + Erf(x/sqrt2) or 1 + Tanh(...): (x, approximate, nodes)."""
    for op, approx, arg in (("Erf", "none", _erf_arg), ("Tanh", "tanh", _tanh_arg)):
        hit = _one_plus(p, op)
        if hit is None:
            continue
        fn, nodes = hit
        inner = arg(fn.inputs[0])
        if inner is not None:
            return inner[0], approx, nodes + inner[1]
    return None


def _product_terms(root: ir.Node) -> list[tuple[list[ir.Value], list[ir.Node]]]:
    """The ways to read ``root`` (a Mul) as a product of three terms: expand one operand's Mul (or
    Div by the constant 2, read as a factor 0.5)."""
    out = []
    for i in range(2):
        v, keep = root.inputs[i], root.inputs[1 - i]
        p = _prod(v, ("Mul", "Div"))
        if p is None:
            continue
        if p.op_type == "Mul":
            out.append(([p.inputs[0], p.inputs[1], keep], [p]))
        elif _close(_scalar(p.inputs[1]), 2.0):
            out.append(([p.inputs[0], _HALF, keep], [p]))
    return out


_HALF = ir.Value(name="__half__")  # a marker for "x / 2" read as "x * 0.5"


def _gelu_pattern(root: ir.Node) -> dict | None:
    for terms, extra in _product_terms(root):
        for i, j, k in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
            x, half, p = terms[i], terms[j], terms[k]
            if half is not _HALF and _half_factor(half) is None:
                continue
            inner = _gelu_inner(p)
            if inner is None or inner[0] is not x:
                continue
            return {"x": x, "approximate": inner[1], "nodes": [root, *extra, *inner[2]]}
    return None


def _gelu_check(node: ir.Node, m: dict) -> str | None:
    if m["x"].dtype not in FLOAT_DTYPES:
        return "input dtype is not float"
    if not _closed(m["nodes"], node):
        return "an intermediate value has other uses"
    return None


def _gelu_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value]:
    attrs = {"approximate": "tanh"} if m["approximate"] == "tanh" else {}
    return [b.op("Gelu", [m["x"]], attrs, hint=node.outputs[0].name, dtype=m["x"].dtype,
                 shape=node.outputs[0].shape)]


# ------------------------------------------------------------------------------ the rule table

RULES: list[Rule] = [
    Rule("layernorm", ("Div", "Mul", "Add"), _norm_pattern(_ln_core, True), _norm_check, _layernorm_rewrite,
         doc="ReduceMean/Sub/square/ReduceMean/Add eps/Sqrt/Div [*gamma] [+beta] -> LayerNormalization",
         family="patterns", exact=False, min_opset=17),
    Rule("rmsnorm", ("Div", "Mul"), _norm_pattern(_rms_core, False), _norm_check, _rmsnorm_rewrite,
         doc="x / Sqrt(ReduceMean(x^2) + eps) [*gamma] -> RMSNormalization", family="patterns",
         exact=False, min_opset=23),
    Rule("gelu", ("Mul",), _gelu_pattern, _gelu_check, _gelu_rewrite,
         doc="x * 0.5 * (1 + Erf(x/sqrt2)) or its tanh approximation -> Gelu", family="patterns",
         exact=False, min_opset=20),
]


class PatternFusion(RulePass):
    name = "patterns"
    doc = "replace primitive LayerNorm/RMSNorm/GELU chains by LayerNormalization/RMSNormalization/Gelu"
    rules = RULES
