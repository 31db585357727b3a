"""Linear-op fusion: fold per-channel affine ops into the constant weights of the linear op before them.

What goes in: a model with shapes inferred (``infer_shapes``), weights as constants (after folding).
What comes out: the same model where BatchNormalization and Add/Sub/Mul/Div by per-channel constants
that follow a Conv, ConvTranspose, Gemm or MatMul are gone, absorbed into that op's weight and bias;
BatchNormalizations with nothing to fold into absorb the Mul/Add after them and then become one Mul and
one Add; a rank-2 MatMul followed by a bias Add becomes a Gemm (a higher-rank one keeps its Add).

Algorithm: every foldable consumer is read as a per-output-channel affine map ``y -> y * s + t`` (s and t
are float64 vectors over the producer's output channels; a missing s is 1, a missing t is 0):

    BatchNormalization   s = scale / sqrt(var + eps)     t = bias - mean * s
    y + c,  c + y        s = 1                           t = c
    y - c                s = 1                           t = -c
    c - y                s = -1                          t = c
    y * c,  c * y        s = c                           t = 0
    y / c                s = 1 / c                       t = 0

and the producer absorbs it: ``W' = W * s`` along the output-channel axis of W and ``b' = b * s + t``:

    Conv           W (M, C/g, k...)       channel axis 0 of W
    ConvTranspose  W (C, M/g, k...)       output channel o = gi * M/g + j lives in W[gi * C/g:(gi+1) * C/g, j]
    Gemm           alpha * B (K, N), or (N, K) with transB=1;   C' = beta * C * s + t   (alpha = beta = 1)
    MatMul         W (K, N)               with a bias: rank-2 input -> Gemm; otherwise refused

Guards: the producer's output has exactly one use (no cloning of a shared producer); weights, bias and
the folded operands are constants of a float type; the operand broadcasts along the channel axis only and
cannot change the output's shape; the folded values are finite (no division by zero). The arithmetic is
done in float64 and rounded once to the weight's dtype, so every rule is ``exact=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dlcc.passes.patterns import channel_vector
from dlcc.passes.rewrite import (
    Builder,
    Rule,
    RulePass,
    attr,
    const_array,
    producer,
    single_use,
)

_FLOAT_KINDS = (np.float16, np.float32, np.float64)
_CONV = ("Conv", "ConvTranspose")


@dataclass
class _Linear:
    """A linear producer with constant weights: y = x (*) W + bias, ``channels`` outputs on ``axis``."""

    node: ir.Node
    w: np.ndarray
    bias: np.ndarray | None  # Conv: (M,); Gemm: beta * C (any shape broadcastable to the output)
    channels: int
    rank: int  # of the output
    axis: int  # output-channel axis of the output


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _float_const(v: ir.Value | None, what: str) -> np.ndarray | str:
    c = const_array(v)
    if c is None:
        return f"{what} is not a constant"
    if c.dtype.type not in _FLOAT_KINDS:
        return f"{what} is not float16/float32/float64"
    return c


def _linear(node: ir.Node) -> _Linear | str:
    """Read the producer's weights, or the reason it cannot absorb anything."""
    op = node.op_type
    if len(node.outputs) != 1:
        return f"{op} has several outputs"
    w = _float_const(node.inputs[1] if len(node.inputs) > 1 else None, f"{op} weight")
    if isinstance(w, str):
        return w
    bias_v = node.inputs[2] if len(node.inputs) > 2 else None
    bias = None
    if bias_v is not None:
        bias = _float_const(bias_v, f"{op} bias")
        if isinstance(bias, str):
            return bias
        if bias.dtype != w.dtype:
            return f"{op} bias and weight dtypes differ"
        bias = bias.astype(np.float64)
    if op in _CONV:
        if w.ndim < 3:
            return f"{op} weight has rank {w.ndim}"
        channels = w.shape[0] if op == "Conv" else w.shape[1] * int(attr(node, "group", 1))
        if bias is not None and bias.shape != (channels,):
            return f"{op} bias is not one value per channel"
        return _Linear(node, w, bias, channels, w.ndim, 1)
    if w.ndim != 2:
        return f"{op} weight is not 2-D"
    if op == "Gemm":
        if "broadcast" in node.attributes:
            return "legacy Gemm with a broadcast attribute"
        if bias is not None:
            bias = bias * float(attr(node, "beta", 1.0))
        return _Linear(node, w, bias, w.shape[0] if attr(node, "transB", 0) else w.shape[1], 2, 1)
    rank = _rank(node.inputs[0])  # MatMul: the output has the input's rank (2-D weight)
    if rank is None:
        return "MatMul input rank unknown"
    if rank < 1:
        return "MatMul input is a scalar"
    return _Linear(node, w, None, w.shape[1], rank, rank - 1)


# ----------------------------------------------------------------------------- the affine map of a consumer


def _bn_inference(bn: ir.Node) -> str | None:
    if len(bn.outputs) != 1:
        return "training-mode BatchNormalization (several outputs)"
    if any(k != "epsilon" and k != "momentum" for k in bn.attributes):  # the mode flags are rarely set
        if attr(bn, "training_mode", 0) or attr(bn, "is_test", 1) == 0:
            return "training-mode BatchNormalization"
        if attr(bn, "spatial", 1) == 0:
            return "BatchNormalization with spatial=0"
    return None


def _bn_affine(bn: ir.Node, channels: int) -> tuple[np.ndarray, np.ndarray] | str:
    """s, t of an inference BatchNormalization over ``channels`` channels."""
    why = _bn_inference(bn)
    if why:
        return why
    params = [const_array(v, cache=False) for v in bn.inputs[1:5]]  # read once: the BN is folded away
    for c, what in zip(params, ("scale", "bias", "mean", "variance"), strict=True):
        if c is None:
            return f"BatchNormalization {what} is not a constant"
        if c.dtype.type not in _FLOAT_KINDS:
            return f"BatchNormalization {what} is not float16/float32/float64"
        if c.shape != (channels,):
            return "BatchNormalization parameters are not one value per channel"
    scale, bias, mean, var = np.array(params, dtype=np.float64)  # one (4, channels) conversion
    eps = float(attr(bn, "epsilon", 1e-5))
    with np.errstate(all="ignore"):
        s = scale / np.sqrt(var + eps)
        t = bias - mean * s
    return s, t


def _binary_affine(node: ir.Node, m: dict, rank: int, axis: int,
                   channels: int) -> tuple[np.ndarray | None, np.ndarray | None] | str:
    """s, t of Add/Sub/Mul/Div of the linear output ``m["y"]`` and the constant ``m["c"]``."""
    vec = channel_vector(m["c"], rank, axis, channels)
    if vec is None:
        return "constant is not per-channel (or broadcasting changes the shape)"
    op, swapped = node.op_type, m["swapped"]
    if op == "Add":
        return None, vec
    if op == "Sub":
        return (-np.ones(channels), vec) if swapped else (None, -vec)
    if op == "Mul":
        return vec, None
    if np.any(vec == 0):
        return "division by zero"
    return 1.0 / vec, None


def _consumer_affine(node: ir.Node, m: dict, rank: int, axis: int,
                     channels: int) -> tuple[np.ndarray | None, np.ndarray | None] | str:
    if node.op_type == "BatchNormalization":
        if axis != 1:
            return "BatchNormalization's channel axis is not the output-feature axis"
        st = _bn_affine(node, channels)
    else:
        st = _binary_affine(node, m, rank, axis, channels)
    if isinstance(st, str):
        return st
    if any(v is not None and not np.isfinite(v).all() for v in st):
        return "folded values are not finite"
    return st


def _post_pattern(producers: tuple[str, ...]):
    """Match a consumer (BN, or Add/Sub/Mul/Div with one constant operand) of a ``producers`` op."""

    def pattern(node: ir.Node) -> dict | None:
        if node.op_type == "BatchNormalization":
            y = node.inputs[0]
            p = producer(y, producers)
            return {"y": y, "prod": p} if p is not None and len(node.inputs) == 5 else None
        if len(node.inputs) != 2:
            return None
        for i in (0, 1):
            if i == 1 and node.op_type == "Div":
                break  # c / y is not affine in y
            y, c_v = node.inputs[i], node.inputs[1 - i]
            p = producer(y, producers)
            c = const_array(c_v)
            if p is not None and c is not None and y is not c_v:
                return {"y": y, "prod": p, "c": c, "swapped": i == 1}
        return None

    return pattern


def _outputs(root: ir.Node, new: ir.Value) -> list[ir.Value | None]:
    return [new] + [None] * (len(root.outputs) - 1)


# ----------------------------------------------------------------------------- folding into the producer


def _channel_factor(lin: _Linear, s: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """``s`` shaped to multiply W along its output channels, and the shape W is viewed in for that."""
    w, op = lin.w, lin.node.op_type
    if op == "Conv":
        return w.shape, s.reshape((-1,) + (1,) * (w.ndim - 1))
    if op == "ConvTranspose":  # output channel o = gi * M/g + j lives in W[gi * C/g:(gi+1) * C/g, j]
        g = int(attr(lin.node, "group", 1))
        cin, mg = w.shape[0], w.shape[1]
        return (g, cin // g, mg) + w.shape[2:], s.reshape((g, 1, mg) + (1,) * (w.ndim - 2))
    if op == "Gemm" and attr(lin.node, "transB", 0):
        return w.shape, s[:, None]
    return w.shape, s[None, :]


def _scaled_weight(lin: _Linear, s: np.ndarray | None, alpha: float) -> np.ndarray | None:
    """W * s along the output channels, times ``alpha``: computed in float64 and rounded once to W's dtype
    (in one pass over W, no float64 copy of it); None when W stays as it is."""
    w = lin.w
    if s is None:
        return None if alpha == 1.0 else (w.astype(np.float64) * alpha).astype(w.dtype)
    view, factor = _channel_factor(lin, s)
    if alpha != 1.0:
        return ((w.reshape(view) * factor) * alpha).astype(w.dtype).reshape(w.shape)
    out = np.empty(view, w.dtype)
    np.multiply(w.reshape(view), factor, out=out, dtype=np.float64, casting="same_kind")
    return out.reshape(w.shape)


def _new_bias(lin: _Linear, s: np.ndarray | None, t: np.ndarray | None) -> np.ndarray | None:
    bias = lin.bias
    if bias is not None and s is not None:
        bias = bias * s
    if t is not None:
        bias = t if bias is None else bias + t
    return bias


def _fold(lin: _Linear, s: np.ndarray | None, t: np.ndarray | None, root: ir.Node, b: Builder) -> ir.Value:
    node, dt = lin.node, lin.w.dtype
    w = _scaled_weight(lin, s, float(attr(node, "alpha", 1.0)) if node.op_type == "Gemm" else 1.0)
    bias = _new_bias(lin, s, t)
    w_name = node.inputs[1].name or "w"
    if node.op_type in _CONV:  # same op and attributes: the Conv itself takes the new weight and bias
        if w is not None:
            _take_const(b, node, 1, w, w_name + "_fused")
        if bias is not None:
            _take_const(b, node, 2, bias.astype(dt), w_name + "_bias")
        return node.outputs[0]
    inputs = [node.inputs[0], node.inputs[1] if w is None else b.const(w, w_name + "_fused")]
    if bias is not None:
        inputs.append(b.const(bias.astype(dt), w_name + "_bias"))
    out = root.outputs[0]
    if node.op_type == "Gemm":
        op, attrs = "Gemm", {k: v for k, v in node.attributes.items() if k in ("transA", "transB")}
    elif bias is None:
        op, attrs = "MatMul", {}
    else:  # a rank-2 MatMul with a bias: Gemm's C is unidirectionally broadcast to (M, N)
        op, attrs = "Gemm", {}
    return b.op(op, inputs, attrs, hint=out.name, dtype=out.dtype, shape=out.shape)


def _take_const(b: Builder, node: ir.Node, i: int, array: np.ndarray, hint: str) -> None:
    """Input ``i`` of ``node`` becomes ``array``: the initializer there takes it when ``node`` is its only
    reader (it keeps its name), else a new initializer is wired in."""
    v = node.inputs[i] if i < len(node.inputs) else None
    if v is not None and v.is_initializer() and not v.is_graph_input() and not v.is_graph_output() \
            and len(v.uses()) == 1:
        b.set_const(v, array)
    else:
        b.set_input(node, i, b.const(array, hint))


def _linear_rule(name: str, roots: tuple[str, ...], producers: tuple[str, ...], doc: str) -> Rule:
    pattern = _post_pattern(producers)

    def check(node: ir.Node, m: dict) -> str | None:
        lin = _linear(m["prod"])
        if isinstance(lin, str):
            return lin
        if not single_use(m["y"]):
            return "the producer's output has other uses"
        st = _consumer_affine(node, m, lin.rank, lin.axis, lin.channels)
        if isinstance(st, str):
            return st
        if lin.node.op_type == "MatMul" and (st[1] is not None) and lin.rank != 2:
            return f"a bias on a rank-{lin.rank} MatMul cannot become a Gemm"
        m["lin"], m["st"] = lin, st
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value | None]:
        s, t = m["st"]
        return _outputs(node, _fold(m["lin"], s, t, node, b))

    return Rule(name, roots, pattern, check, rewrite, doc=doc, family="fuse-linear", exact=False,
                input_ops=frozenset(producers))


# ----------------------------------------------------------------------------- BatchNormalization alone


def _bn_rank_channels(bn: ir.Node) -> tuple[int, int] | str:
    rank = _rank(bn.inputs[0])
    if rank is None or rank < 2:
        return "BatchNormalization input rank unknown"
    scale = const_array(bn.inputs[1]) if len(bn.inputs) == 5 else None
    if scale is None or scale.ndim != 1:
        return "BatchNormalization scale is not a 1-D constant"
    return rank, scale.shape[0]


def _bn_consumer_rule(name: str, roots: tuple[str, ...], doc: str) -> Rule:
    """Mul/Div/Add/Sub by a per-channel constant after a BatchNormalization -> its scale and bias."""
    pattern = _post_pattern(("BatchNormalization",))

    def check(node: ir.Node, m: dict) -> str | None:
        bn = m["prod"]
        if not single_use(m["y"]):
            return "the BatchNormalization output has other uses"
        rc = _bn_rank_channels(bn)
        if isinstance(rc, str):
            return rc
        why = _bn_inference(bn)
        if why:
            return why
        scale = _float_const(bn.inputs[1], "BatchNormalization scale")
        bias = _float_const(bn.inputs[2], "BatchNormalization bias")
        for c in (scale, bias):
            if isinstance(c, str):
                return c
            if c.shape != (rc[1],):
                return "BatchNormalization parameters are not one value per channel"
        st = _consumer_affine(node, m, rc[0], 1, rc[1])
        if isinstance(st, str):
            return st
        s, t = st
        new_scale = scale.astype(np.float64) * (1.0 if s is None else s)
        new_bias = bias.astype(np.float64) * (1.0 if s is None else s) + (0.0 if t is None else t)
        m["scale"], m["bias"] = new_scale.astype(scale.dtype), new_bias.astype(bias.dtype)
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value | None]:
        bn = m["prod"]
        x, _, _, mean, var = bn.inputs
        inputs = [x, b.const(m["scale"], (bn.inputs[1].name or "bn") + "_fused"),
                  b.const(m["bias"], (bn.inputs[2].name or "bn") + "_fused"), mean, var]
        out = node.outputs[0]
        return _outputs(node, b.op("BatchNormalization", inputs, dict(bn.attributes), hint=out.name,
                                   dtype=out.dtype, shape=out.shape))

    return Rule(name, roots, pattern, check, rewrite, doc=doc, family="fuse-linear", exact=False)


def _would_fire(rule: Rule, node: ir.Node) -> bool:
    m = rule.pattern(node)
    return m is not None and rule.check(node, m) is None


def _lone_bn_check(node: ir.Node, m: dict) -> str | None:
    for rule in (CONV_BN, GEMM_BN, MATMUL_BN):
        if _would_fire(rule, node):
            return f"folds into its producer ({rule.name})"
    y = node.outputs[0]
    if single_use(y):
        user = y.uses()[0].node
        if any(_would_fire(rule, user) for rule in (BN_MUL, BN_ADD)):
            return "a following Mul/Add folds into it first"
    rc = _bn_rank_channels(node)
    if isinstance(rc, str):
        return rc
    if node.inputs[0].dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
        return "input dtype is not float"
    st = _bn_affine(node, rc[1])
    if isinstance(st, str):
        return st
    if any(not np.all(np.isfinite(v)) for v in st):
        return "folded values are not finite"
    m["st"], m["rank"] = st, rc[0]
    return None


def _lone_bn_rewrite(node: ir.Node, m: dict, b: Builder) -> list[ir.Value | None]:
    s, t = m["st"]
    x, out = node.inputs[0], node.outputs[0]
    dt = x.dtype.numpy()
    shape = (-1,) + (1,) * (m["rank"] - 2)  # (C,1,1) for NCHW: broadcasts along axis 1
    name = node.inputs[1].name or "bn"
    scaled = b.op("Mul", [x, b.const(s.reshape(shape).astype(dt), name + "_mul")], hint=out.name + "_scaled",
                  dtype=x.dtype, shape=x.shape)
    return _outputs(node, b.op("Add", [scaled, b.const(t.reshape(shape).astype(dt), name + "_add")],
                               hint=out.name, dtype=out.dtype, shape=out.shape))


# ----------------------------------------------------------------------------- the rule table

CONV_BN = _linear_rule("conv-bn", ("BatchNormalization",), _CONV,
                       "Conv/ConvTranspose + BatchNormalization -> Conv with scaled weights and new bias")
CONV_ADD = _linear_rule("conv-add", ("Add", "Sub"), _CONV,
                        "Conv/ConvTranspose +/- a per-channel constant -> into the bias")
CONV_MUL = _linear_rule("conv-mul", ("Mul", "Div"), _CONV,
                        "Conv/ConvTranspose * or / a per-channel constant -> into weight and bias")
GEMM_BN = _linear_rule("gemm-bn", ("BatchNormalization",), ("Gemm",),
                       "Gemm + BatchNormalization over its features -> Gemm with folded B and C")
GEMM_ADD = _linear_rule("gemm-add", ("Add", "Sub"), ("Gemm",),
                        "Gemm +/- a per-feature constant -> into C")
GEMM_MUL = _linear_rule("gemm-mul", ("Mul", "Div"), ("Gemm",),
                        "Gemm * or / a per-feature constant -> into B and C")
MATMUL_BN = _linear_rule("matmul-bn", ("BatchNormalization",), ("MatMul",),
                         "rank-2 MatMul + BatchNormalization -> Gemm with folded weight and bias")
MATMUL_ADD = _linear_rule("matmul-add", ("Add", "Sub"), ("MatMul",),
                          "rank-2 MatMul +/- a per-feature constant bias -> Gemm")
MATMUL_MUL = _linear_rule("matmul-mul", ("Mul", "Div"), ("MatMul",),
                          "MatMul * or / a per-feature constant -> MatMul with scaled weight")
BN_MUL = _bn_consumer_rule("bn-mul", ("Mul", "Div"),
                           "BatchNormalization * or / a per-channel constant -> its scale and bias")
BN_ADD = _bn_consumer_rule("bn-add", ("Add", "Sub"),
                           "BatchNormalization +/- a per-channel constant -> its bias")
LONE_BN = Rule("bn-to-mul-add", ("BatchNormalization",), lambda node: {}, _lone_bn_check, _lone_bn_rewrite,
               doc="BatchNormalization with nothing to fold into -> Mul + Add by per-channel constants",
               family="fuse-linear", exact=False)

# order matters where two rules share a root: folding into a producer is tried before the lone BN form
RULES: list[Rule] = [CONV_BN, GEMM_BN, MATMUL_BN, CONV_ADD, CONV_MUL, GEMM_ADD, GEMM_MUL, MATMUL_ADD,
                     MATMUL_MUL, BN_MUL, BN_ADD, LONE_BN]


class LinearFusion(RulePass):
    name = "fuse-linear"
    doc = "fold BatchNormalization and per-channel constant Add/Sub/Mul/Div into Conv/Gemm/MatMul weights"
    rules = RULES
