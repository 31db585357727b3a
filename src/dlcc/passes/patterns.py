"""Pattern fusion: recognize primitive forms of LayerNormalization, RMSNorm and GELU, and record the
elementwise epilogues that follow Conv/Gemm/MatMul, for the backend.

What goes in: a model with shapes inferred (``infer_shapes``). What comes out: the same model where
- the primitive LayerNorm chain becomes one ``LayerNormalization`` (opset >= 17), the primitive RMSNorm
  chain one ``RMSNormalization`` (opset >= 23) and the primitive GELU chains one ``Gelu`` (opset >= 20);
- below those opsets the ONNX graph is left as it is (it must stay standard ONNX that onnxruntime runs)
  and the chain's final node is annotated instead: ``node.meta["dlcc.pattern"]`` names the pattern and
  the captures sit beside it (``"input"``, ``"approximate"``, ``"axis"``, ``"epsilon"``, ``"scale"``...);
- every Conv/ConvTranspose/Gemm/MatMul whose output flows through a per-feature constant bias Add, an
  activation and/or a residual Add carries the ordered list of those steps in
  ``node.meta["dlcc.epilogue"]`` (annotation only: the graph is unchanged).

Invariants: annotations never change the graph; an annotation counts as a change only when it writes
something the node did not already carry, so the pass is idempotent. A chain is matched only when every
value inside it is used inside it alone (the chain's input may have other uses). Constants must match
within 1e-4 relative.

Algorithm: each primitive chain is matched backwards from a candidate final node (the node the driver
visits as root) down to the chain's input ``x``; for LayerNorm and RMSNorm the optional ``* gamma`` and
``+ beta`` tail is then extended forwards from the normalization, and the match is only taken at the
root where that extension ends, so the whole chain is replaced at once:

    x ─ReduceMean─▶ mean      d = x - mean      v = ReduceMean(d*d | d^2)
    y = d / Sqrt(v + eps)   (or d * Reciprocal(...))   [* gamma]   [+ beta]     LayerNorm
    y = x / Sqrt(ReduceMean(x*x | x^2) + eps)          [* gamma]                 RMSNorm
    y = x * 0.5 * (1 + Erf(x / sqrt2 | x * 1/sqrt2))              any product order   GELU (erf)
    y = x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3)))     any product order   GELU (tanh)

The epilogue walk starts at the producer's output and follows single uses: first an optional per-feature
constant Add (role "bias"), then at most one activation and at most one residual Add (or two-input Sum;
same shape, other operand not a per-feature constant), in graph order. When both operands of a residual
Add come out of producers' epilogues, only input 0's producer records it (else each kernel would wait for
the other). SiLU (``x * Sigmoid(x)``) and Swish
(``x * Sigmoid(beta * x)``) are recognized although their input has two uses.

This module also holds the small pieces ``fuse_linear`` shares: ``channel_vector``, the ``Annotation``
rule form and its runner, and ``bias_step`` (so both passes write the same epilogue entries).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from dlcc.passes.rewrite import (
    Annotation,
    Builder,
    Rule,
    RulePass,
    attr,
    const_array,
    single_use,
    static_shape,
)

EPILOGUE = "dlcc.epilogue"
PATTERN = "dlcc.pattern"
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


def set_meta(node: ir.Node, updates: dict) -> bool:
    """Write ``updates`` into ``node.meta``; True when something was new or different."""
    changed = False
    for k, v in updates.items():
        if k not in node.meta or node.meta[k] != v:
            node.meta[k] = v
            changed = True
    return changed


# ------------------------------------------------------------------------------ annotation rules




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


def _norm_annotate(kind: str):
    def annotate(node: ir.Node, m: dict) -> bool:
        info = {PATTERN: kind, "input": m["x"].name, "axis": m["axis"], "epsilon": m["epsilon"],
                "scale": m["gamma"].name if m["gamma"] is not None else None}
        if kind == "layernorm":
            info["bias"] = m["beta"].name if m["beta"] is not None else None
        return set_meta(node, info)

    return annotate


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


def _gelu_annotate(node: ir.Node, m: dict) -> bool:
    return set_meta(node, {PATTERN: "gelu", "approximate": m["approximate"], "input": m["x"].name})


# ------------------------------------------------------------------------------ epilogues

PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def _feature_layout(node: ir.Node) -> tuple[int, int, int] | None:
    """(rank, feature axis, features) of a linear producer's output, when known."""
    out = node.outputs[0]
    rank = _rank(out)
    shape = static_shape(out)
    op = node.op_type
    w = node.inputs[1] if len(node.inputs) > 1 else None
    wshape = static_shape(w)
    if op in ("Conv", "ConvTranspose"):
        if rank is None and wshape is not None:
            rank = len(wshape)
        axis = 1
        size = None
        if wshape is not None and len(wshape) >= 2:
            size = wshape[0] if op == "Conv" else wshape[1] * int(attr(node, "group", 1))
    elif op == "Gemm":
        rank, axis = 2, 1
        size = None if wshape is None or len(wshape) != 2 else wshape[0 if attr(node, "transB", 0) else 1]
    else:  # MatMul
        x_rank, w_rank = _rank(node.inputs[0]), _rank(w)
        if rank is None and x_rank is not None and w_rank is not None and w_rank >= 2:
            rank = w_rank - 1 if x_rank == 1 else max(x_rank, w_rank)
        size = wshape[-1] if wshape is not None and len(wshape) >= 2 else None
        if w_rank is not None and w_rank < 2:
            return None
        axis = rank - 1 if rank else None
    if size is None and shape is not None and axis is not None and axis < len(shape):
        size = shape[axis]
    if rank is None or axis is None or size is None:
        return None
    return rank, axis, size


def bias_step(producer: ir.Node, add: ir.Node) -> dict | None:
    """The epilogue entry for ``add`` when it adds a per-feature constant to ``producer``'s output."""
    y = producer.outputs[0]
    if add.op_type != "Add" or not _default(add) or y not in add.inputs:
        return None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    c = const_array(other)
    layout = _feature_layout(producer)
    if other is y or c is None or layout is None or channel_vector(c, *layout) is None:
        return None
    return {"op": "Add", "input": other.name, "role": "bias", "output": add.outputs[0].name}


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    for da, db in zip(a.shape, b.shape, strict=True):
        if isinstance(da, int) and isinstance(db, int):
            if da != db:
                return False
        elif not (isinstance(da, ir.SymbolicDim) and isinstance(db, ir.SymbolicDim)
                  and da.value is not None and da.value == db.value):
            return False
    return True


def _activation(node: ir.Node) -> dict | None:
    """The epilogue entry for a single-node activation, or None."""
    op = node.op_type
    entry: dict = {"op": op}
    if op in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        pass
    elif op == "LeakyRelu":
        entry["alpha"] = float(attr(node, "alpha", 0.01))
    elif op == "HardSigmoid":
        entry["alpha"] = float(attr(node, "alpha", 0.2))
        entry["beta"] = float(attr(node, "beta", 0.5))
    elif op == "Gelu":
        entry["approximate"] = str(attr(node, "approximate", "none"))
    elif op == "Clip":
        lo, hi = attr(node, "min"), attr(node, "max")
        for i, name in ((1, "min"), (2, "max")):
            if len(node.inputs) > i and node.inputs[i] is not None:
                value = _scalar(node.inputs[i])
                if value is None:
                    return None  # a bound that is not a constant
                lo, hi = (value, hi) if name == "min" else (lo, value)
        entry["min"] = float(lo) if lo is not None else -math.inf
        entry["max"] = float(hi) if hi is not None else math.inf
    else:
        return None
    entry["output"] = node.outputs[0].name
    return entry


def _silu_step(v: ir.Value) -> tuple[dict, ir.Value] | None:
    """``v * Sigmoid(v)`` (SiLU) or ``v * Sigmoid(beta * v)`` (Swish): (entry, its output), or None."""
    uses = v.uses()
    if v.is_graph_output() or len(uses) != 2:
        return None
    for first, second in ((uses[0].node, uses[1].node), (uses[1].node, uses[0].node)):
        if first is second or not (_default(first) and _default(second)):
            continue
        alpha, sig = 1.0, first
        if first.op_type == "Mul":
            other = first.inputs[1] if first.inputs[0] is v else first.inputs[0]
            alpha = _scalar(other)
            sig = _consumer(first.outputs[0], "Sigmoid") if alpha is not None else None
        if sig is None or sig.op_type != "Sigmoid" or len(sig.outputs) != 1:
            continue
        mul = _consumer(sig.outputs[0], "Mul")
        if mul is None or mul is not second or v not in mul.inputs:
            continue
        entry = {"op": "Silu"} if first is sig else {"op": "Swish", "alpha": float(alpha)}
        entry["output"] = mul.outputs[0].name
        return entry, mul.outputs[0]
    return None


_ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu")


def _next_step(producer: ir.Node, cur: ir.Value, first: bool, have_act: bool,
               have_res: bool) -> tuple[dict, ir.Value, str] | None:
    """The epilogue step that consumes ``cur``: (entry, its output, "bias" | "act" | "res"), or None."""
    if not have_act:
        silu = _silu_step(cur)
        if silu is not None:
            return silu[0], silu[1], "act"
    node = _consumer(cur, ("Add", "Sum") if have_act else ("Add", "Sum", *_ACTIVATIONS))
    if node is None or len(node.outputs) != 1 or (node.op_type == "Sum" and len(node.inputs) != 2):
        return None
    out = node.outputs[0]
    if node.op_type not in ("Add", "Sum"):
        entry = _activation(node)
        return None if entry is None else (entry, out, "act")
    entry = bias_step(producer, node) if first else None
    if entry is not None:
        return entry, out, "bias"
    other = node.inputs[1] if node.inputs[0] is cur else node.inputs[0]
    if have_res or other is cur or not _same_shape(cur, out):
        return None
    if cur is not node.inputs[0] and _claimed_from(other):
        return None  # both operands come out of producers: input 0's producer takes the Add, never both
    return {"op": "Add", "input": other.name, "role": "residual", "output": out.name}, out, "res"


def _prefix_values(producer: ir.Node) -> list[ir.Value]:
    """The values along ``producer``'s epilogue before any residual step (its output first)."""
    cur = producer.outputs[0]
    values, have_act = [cur], False
    for _ in range(3):
        step = _next_step(producer, cur, len(values) == 1, have_act, True)
        if step is None:
            break
        _, cur, kind = step
        values.append(cur)
        have_act |= kind == "act"
    return values


def _claimed_from(other: ir.Value) -> bool:
    """Whether ``other`` ends the residual-free epilogue of some producer a few nodes above it, which
    could then record the same Add (two kernels each waiting for the other)."""
    frontier, seen = [other], set()
    for _ in range(4):
        nxt = []
        for v in frontier:
            p = v.producer()
            if p is None or id(p) in seen or not _default(p):
                continue
            seen.add(id(p))
            if p.op_type in PRODUCERS:
                if any(x is other for x in _prefix_values(p)):
                    return True
                continue
            nxt.extend(x for x in p.inputs if x is not None)
        frontier = nxt
    return False


def epilogue_chain(producer: ir.Node) -> list[dict]:
    """The ordered elementwise steps that can run in ``producer``'s kernel after it (see the module doc)."""
    chain: list[dict] = []
    if producer.op_type not in PRODUCERS or not producer.outputs:
        return chain
    cur = producer.outputs[0]
    have_act = have_res = False
    while not (have_act and have_res):
        step = _next_step(producer, cur, not chain, have_act, have_res)
        if step is None:
            break
        entry, cur, kind = step
        chain.append(entry)
        have_act |= kind == "act"
        have_res |= kind == "res"
    return chain


def _epilogue_pattern(node: ir.Node) -> dict | None:
    chain = epilogue_chain(node)
    if not chain and EPILOGUE not in node.meta:
        return None
    return {"chain": chain}


def _epilogue_annotate(node: ir.Node, m: dict) -> bool:
    chain = m["chain"]
    if not chain:
        del node.meta[EPILOGUE]  # a stale record: the graph around the producer changed
        return True
    return set_meta(node, {EPILOGUE: chain})


# ------------------------------------------------------------------------------ the rule tables

def _never(node: ir.Node, m: dict) -> str | None:
    return None


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

ANNOTATIONS: list[Annotation] = [
    Annotation("layernorm-annotate", ("Div", "Mul", "Add"), _norm_pattern(_ln_core, True), _norm_check,
               _norm_annotate("layernorm"), doc="mark a primitive LayerNorm chain (opset < 17)",
               max_opset=16),
    Annotation("rmsnorm-annotate", ("Div", "Mul"), _norm_pattern(_rms_core, False), _norm_check,
               _norm_annotate("rmsnorm"), doc="mark a primitive RMSNorm chain (opset < 23)", max_opset=22),
    Annotation("gelu-annotate", ("Mul",), _gelu_pattern, _gelu_check, _gelu_annotate,
               doc="mark a primitive GELU chain (opset < 20)", max_opset=19),
    Annotation("epilogue", PRODUCERS, _epilogue_pattern, _never, _epilogue_annotate,
               doc="record bias/activation/residual steps after Conv/Gemm/MatMul in meta['dlcc.epilogue']"),
]


class PatternFusion(RulePass):
    name = "patterns"
    doc = "recognize LayerNorm/RMSNorm/GELU chains; record Conv/Gemm/MatMul epilogues for the backend"
    rules = RULES
    annotations = ANNOTATIONS
