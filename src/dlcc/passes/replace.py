"""Target-driven operator replacement: rewrite ops a target lacks into ops it runs, or into its preferred form.

What goes in: a model (shapes inferred) and a ``Target`` (``dlcc.passes.targets``).
What comes out: the same model, where every rule whose target condition holds has been applied to a
fixpoint. Every rule's ``check`` consults the target first and refuses ("target supports
BatchNormalization") when the target runs the op and does not prefer the other form, so the ``onnx``
target leaves standard models unchanged.

Rules (each computes the same function; "exact" rules keep every float operation):
    batchnorm-to-mul-add     BatchNormalization(x) -> x * s + t, s and t per-channel constants
    prelu-to-leakyrelu       PRelu(x, one shared slope) -> LeakyRelu(x, alpha)
    gemm-to-conv             Gemm(A, B, C) -> Reshape(A, M,K,1,1) -> 1x1 Conv -> Reshape(M,N)
    matmul-to-conv           MatMul(A, W constant 2-D) -> the same 1x1 Conv sandwich
    conv1x1-to-gemm          1x1 Conv on a 1x1 map (after a global pool) -> Flatten + Gemm
                             (+ Reshape back to M,N,1,1 unless its consumers flatten it anyway)
    channel-shuffle-to-op    Reshape(N,g,C/g,...) -> Transpose(0,2,1,...) -> Reshape(x's shape)
                             -> dlcc::ChannelShuffle(group=g)
    channel-shuffle-to-idiom dlcc::ChannelShuffle -> the Reshape/Transpose/Reshape idiom (targets that
                             lack the op, such as ``onnx``: standard ONNX out)
    attention-to-op          MatMul(Q, K^T) -> [Mul/Div by a scalar] -> [Where(causal constant, s, fill)]
                             -> [Add(mask)] -> Softmax(last axis) -> MatMul(P, V)
                             -> dlcc::Attention(Q, K, V[, mask]); a scalar Mul on Q or K^T joins the scale;
                             Q, K, V split into heads by Reshape + Transpose are read unsplit (layout code 0),
                             and so is the output when it is merged back by Transpose + Reshape
    onnx-attention-to-op     Attention (opset 23: no past key/value, softcap or extra outputs, as many key/value
                             heads as query heads, V's head size Q's, causal only when Sq = Sk) ->
                             dlcc::Attention (a boolean mask becomes Where(mask, 0, -inf))
    attention-to-idiom       dlcc::Attention -> Slice/Reshape/Transpose per operand, MatMul, Mul, [Where], [Add],
                             Softmax, MatMul, [Transpose, Reshape] (targets that lack the op: standard ONNX out)
    merge-sibling-matmuls    MatMul(x, W_i) [+ b_i] for i < n (n >= 2, constant W_i of one K, the same x)
                             -> MatMul(x, [W_0 ... W_n-1]) [+ [b_0 ... b_n-1]] -> Slice per i (not a rule of
                             the driver: it replaces n roots at once; the Q, K, V projections become one GEMM
                             that attention-to-op then reads by column offsets)
    grouped-conv-split       Conv(group=g) -> Split + g Convs + Concat (targets without groups)
    pad-attrs-to-inputs      Pad(x; pads, value attributes) -> Pad(x, pads, value) when the pass raises
                             the opset to >= 11 (``upgrade_opset_to``; off by default)

The pass adds the ``dlcc`` domain (version 1) to the model's opset imports when a rule created a
dlcc node, and drops it when no dlcc node is left. The rule driver only visits default-domain nodes,
so the rule rooted at dlcc::ChannelShuffle is run by this pass's own small loop over dlcc nodes,
with the driver's builder and apply step.

Invariants: graph input/output names and dtypes never change; a rule never fires for a target that
runs the op and does not prefer the other form; no two rules undo each other for one target (a
``Target`` cannot prefer a form it lacks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from dlcc.ops.attention import attention_attrs, attention_dims
from dlcc.passes.rewrite import (
    Builder,
    NameGen,
    RewriteStats,
    Rule,
    RulePass,
    apply_rules,
    attr,
    const_array,
    producer,
    single_use,
    static_shape,
)
from dlcc.passes.targets import ATTENTION, CHANNEL_SHUFFLE, GROUPED_CONV, Target, get_target
from dlcc.util import all_graphs

DLCC_DOMAIN = "dlcc"
DLCC_DOMAIN_VERSION = 1

__all__ = ["DLCC_DOMAIN", "OpReplacement", "replacement_rules", "upgrade_pad"]


# ------------------------------------------------------------------------------------------------ helpers


def weight(v: ir.Value | None) -> np.ndarray | None:
    """Constant data of ``v``: an initializer, a Constant, or a ConstantOfShape of a constant shape."""
    data = const_array(v)
    if data is not None or v is None:
        return data
    p = producer(v, "ConstantOfShape")
    if p is None:
        return None
    shape = const_array(p.inputs[0])
    if shape is None:
        return None
    fill = attr(p, "value")
    fill = np.zeros(1, np.float32) if fill is None else fill.numpy()
    return np.full(tuple(int(d) for d in shape.reshape(-1)), fill.reshape(-1)[0], dtype=fill.dtype)


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _same_dim(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a is not None and b is not None and a.value is not None and a.value == b.value


def _is_float(v: ir.Value) -> bool:
    return v.dtype is not None and v.dtype.is_floating_point()


def _copy_attrs(node: ir.Node, drop: Sequence[str] = ()) -> dict[str, ir.Attr]:
    return {k: ir.Attr(a.name, a.type, a.value) for k, a in node.attributes.items() if k not in drop}


def _np_dtype(v: ir.Value) -> np.dtype:
    return np.dtype(v.dtype.numpy())


def _shape_of(v: ir.Value) -> list | None:
    return None if v.shape is None else list(v.shape)


# -------------------------------------------------------------------------------------- BatchNormalization


def _bn_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        return {} if len(node.inputs) >= 5 else None

    def check(node: ir.Node, m: dict) -> str | None:
        if t.has("BatchNormalization") and t.prefer("batchnorm") != "mul_add":
            return "target supports BatchNormalization"
        m["params"] = [weight(v) for v in node.inputs[1:5]]
        x = node.inputs[0]
        if attr(node, "training_mode", 0):
            return "training mode"
        if attr(node, "spatial", 1) != 1:
            return "per-element statistics (spatial=0)"
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return "running-statistics outputs are used"
        if any(p is None for p in m["params"]):
            return "parameters are not constant"
        if _rank(x) is None or _rank(x) < 2:
            return "input rank unknown"
        if not _is_float(x):
            return "input is not floating point"
        c = x.shape[1]
        if any(p.ndim != 1 or (isinstance(c, int) and p.size != c) for p in m["params"]):
            return "parameters are not per-channel vectors"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        x = node.inputs[0]
        scale, bias, mean, var = (p.astype(np.float64) for p in m["params"])
        s = scale / np.sqrt(var + float(attr(node, "epsilon", 1e-5)))
        shift = bias - mean * s
        bshape = (-1,) + (1,) * (len(x.shape) - 2)
        dt = _np_dtype(x)
        mul = b.op("Mul", [x, b.const(s.reshape(bshape).astype(dt), "bn_scale")], hint="bn_mul",
                   dtype=x.dtype, shape=_shape_of(x))
        y = b.op("Add", [mul, b.const(shift.reshape(bshape).astype(dt), "bn_shift")], hint="bn_add",
                 dtype=x.dtype, shape=_shape_of(x))
        return [y] + [None] * (len(node.outputs) - 1)

    return Rule("batchnorm-to-mul-add", ("BatchNormalization",), pattern, check, rewrite,
                doc="BatchNormalization -> Mul + Add by precomputed per-channel constants",
                family="replace", exact=False)


# ------------------------------------------------------------------------------------------------ PRelu


def _prelu_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        slope = weight(node.inputs[1])
        return None if slope is None else {"slope": slope}

    def check(node: ir.Node, m: dict) -> str | None:
        if t.has("PRelu") and t.prefer("shared_prelu") != "LeakyRelu":
            return "target supports PRelu"
        if not t.has("LeakyRelu"):
            return "target lacks LeakyRelu"
        if m["slope"].size != 1:
            return "slope is not shared (more than one element)"
        return None  # the slope broadcasts to x (unidirectional), so the output keeps x's shape

    def rewrite(node: ir.Node, m: dict, b: Builder):
        alpha = float(m["slope"].reshape(-1)[0])
        return [b.op("LeakyRelu", [node.inputs[0]], {"alpha": alpha}, hint="leakyrelu")]

    return Rule("prelu-to-leakyrelu", ("PRelu",), pattern, check, rewrite,
                doc="PRelu with one shared slope -> LeakyRelu(alpha)", family="replace", exact=True)


# ------------------------------------------------------------------------------------- Gemm / MatMul -> Conv


def _linear_to_conv_refusal(t: Target, op: str) -> str | None:
    if t.has(op) and t.prefer("linear") != "conv":
        return f"target supports {op}"
    if not t.has("Conv"):
        return "target lacks Conv"
    return None


def _conv_sandwich(b: Builder, a: ir.Value, w_nk: np.ndarray, bias: np.ndarray | None,
                   out_shape: list) -> ir.Value:
    """Reshape a (M?, K) input to (-1, K, 1, 1), 1x1 Conv with weight (N, K), Reshape to ``out_shape``."""
    n, k = w_nk.shape
    dt = _np_dtype(a)
    lead = out_shape[:-1]
    rows = lead[0] if len(lead) == 1 else int(np.prod(lead))
    x4 = b.op("Reshape", [a, b.const(np.array([0 if len(lead) == 1 else -1, k, 1, 1], np.int64), "shape")],
              hint="conv_in", dtype=a.dtype, shape=[rows, k, 1, 1])
    inputs = [x4, b.const(w_nk.reshape(n, k, 1, 1).astype(dt), "conv_w")]
    if bias is not None:
        inputs.append(b.const(bias.astype(dt), "conv_b"))
    y4 = b.op("Conv", inputs, {"kernel_shape": [1, 1]}, hint="conv", dtype=a.dtype, shape=[rows, n, 1, 1])
    back = [0, n] if len(lead) == 1 else [*lead, n]
    return b.op("Reshape", [y4, b.const(np.array(back, np.int64), "shape")], hint="conv_out")


def _gemm_to_conv_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        return {"c": node.inputs[2] if len(node.inputs) > 2 else None}

    def check(node: ir.Node, m: dict) -> str | None:
        why = _linear_to_conv_refusal(t, "Gemm")
        if why:
            return why
        m["w"], m["c_data"] = weight(node.inputs[1]), weight(m["c"])
        a = node.inputs[0]
        if attr(node, "transA", 0):
            return "input A is transposed"
        if _rank(a) != 2:
            return "input rank unknown" if _rank(a) is None else "input is not 2-D"
        if not _is_float(a):
            return "input is not floating point"
        if m["w"] is None or m["w"].ndim != 2:
            return "weight is not a constant matrix"
        n = m["w"].shape[0 if attr(node, "transB", 0) else 1]
        if m["c"] is not None:
            c = m["c_data"]
            if c is None:
                return "bias is not constant"
            if c.size != 1 and c.shape not in ((n,), (1, n)):
                return "bias is not per-column"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        a = node.inputs[0]
        w = m["w"].astype(np.float64)
        w_nk = (w if attr(node, "transB", 0) else w.T) * float(attr(node, "alpha", 1.0))
        n = w_nk.shape[0]
        bias = None
        if m["c"] is not None:
            bias = np.broadcast_to(m["c_data"].astype(np.float64).reshape(-1), (n,)) * float(attr(node, "beta", 1.0))
        return [_conv_sandwich(b, a, w_nk, bias, [a.shape[0], n])]

    return Rule("gemm-to-conv", ("Gemm",), pattern, check, rewrite, min_opset=5,
                doc="Gemm -> Reshape to N,C,1,1 + 1x1 Conv + Reshape back", family="replace", exact=False)


def _matmul_to_conv_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        return {}

    def check(node: ir.Node, m: dict) -> str | None:
        why = _linear_to_conv_refusal(t, "MatMul")
        if why:
            return why
        m["w"] = weight(node.inputs[1])
        a = node.inputs[0]
        if m["w"] is None or m["w"].ndim != 2:
            return "weight is not a constant matrix"
        r = _rank(a)
        if r is None:
            return "input rank unknown"
        if r < 2:
            return "input is a vector"
        if not _is_float(a):
            return "input is not floating point"
        if r > 2 and static_shape(a) is None:
            return "input shape is not static"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        a = node.inputs[0]
        w_nk = m["w"].astype(np.float64).T
        return [_conv_sandwich(b, a, w_nk, None, [*list(a.shape)[:-1], w_nk.shape[0]])]

    return Rule("matmul-to-conv", ("MatMul",), pattern, check, rewrite, min_opset=5,
                doc="MatMul by a constant 2-D weight -> 1x1 Conv between Reshapes", family="replace",
                exact=False)


# ---------------------------------------------------------------------------- 1x1 Conv on a 1x1 map -> Gemm


def _flattens_to_2d(node: ir.Node, conv_out: ir.Value) -> bool:
    """Does ``node`` turn the (M, N, 1, 1) ``conv_out`` into (M, N)?"""
    if node.op_type == "Flatten" and node.domain in ("", "ai.onnx"):
        return attr(node, "axis", 1) == 1
    if node.op_type == "Reshape" and node.domain in ("", "ai.onnx") and node.inputs[0] is conv_out:
        out, src = node.outputs[0].shape, conv_out.shape
        return (out is not None and src is not None and len(out) == 2 and _same_dim(out[0], src[0])
                and _same_dim(out[1], src[1]))
    return False


def _conv_gemm_refusal(t: Target, m: dict) -> str | None:
    if t.prefer("linear") != "gemm" and t.has("Conv"):
        return "target does not prefer Gemm over Conv"
    if not (t.has("Gemm") and t.has("Flatten")):
        return "target lacks Gemm"
    conv = m["conv"]
    x = conv.inputs[0]
    w = m["w"] = weight(conv.inputs[1])
    if attr(conv, "group", 1) != 1:
        return "grouped Conv"
    if w is None or w.ndim != 4 or w.shape[2:] != (1, 1):
        return "weight is not a constant 1x1 kernel"
    if _rank(x) != 4:
        return "input is not 4-D"
    if not _is_float(x):
        return "input is not floating point"
    if any(attr(conv, "pads", [0]) or [0]):
        return "Conv pads the input"
    if len(conv.inputs) > 2 and conv.inputs[2] is not None and _rank(conv.inputs[2]) != 1:
        return "bias rank unknown"
    return None


def _gemm_from_conv(b: Builder, conv: ir.Node, w: np.ndarray) -> ir.Value:
    x = conv.inputs[0]
    n, c = w.shape[:2]
    flat = b.op("Flatten", [x], {"axis": 1}, hint="flatten", dtype=x.dtype, shape=[x.shape[0], c])
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    if bias is None and b.opset < 11:  # Gemm's C is optional from opset 11 on
        bias = b.const(np.zeros(n, _np_dtype(x)), "gemm_c")
    inputs = [flat, b.const(w.reshape(n, c).astype(_np_dtype(x)), "gemm_w")] + ([bias] if bias is not None else [])
    return b.op("Gemm", inputs, {"transB": 1}, hint="gemm", dtype=x.dtype, shape=[x.shape[0], n])


def _conv_to_gemm_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        if node.op_type == "Conv":
            conv = node
            out = conv.outputs[0]
            uses = out.uses()
            if uses and not out.is_graph_output() and all(_flattens_to_2d(u.node, out) for u in uses):
                return None  # every consumer flattens: the rule fires at the consumers, without a Reshape
        else:
            conv = producer(node.inputs[0], "Conv")
            if conv is None or not _flattens_to_2d(node, conv.outputs[0]):
                return None
        x = conv.inputs[0]
        pooled = producer(x, ("GlobalAveragePool", "GlobalMaxPool")) is not None
        if not pooled and (_rank(x) != 4 or tuple(x.shape[2:]) != (1, 1)):
            return None  # not a 1x1 spatial map: nothing like a classifier head
        return {"conv": conv}

    def check(node: ir.Node, m: dict) -> str | None:
        return _conv_gemm_refusal(t, m)

    def rewrite(node: ir.Node, m: dict, b: Builder):
        y = _gemm_from_conv(b, m["conv"], m["w"])
        if node is m["conv"]:  # consumers need the 4-D map back
            n = m["w"].shape[0]
            y = b.op("Reshape", [y, b.const(np.array([0, n, 1, 1], np.int64), "shape")], hint="gemm_4d")
        return [y]

    return Rule("conv1x1-to-gemm", ("Conv", "Flatten", "Reshape"), pattern, check, rewrite, min_opset=5,
                doc="1x1 Conv on a 1x1 map (after a global pool) -> Flatten + Gemm", family="replace",
                exact=False)


# ------------------------------------------------------------------------------------------ channel shuffle


def _channel_shuffle_to_op_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        tr = producer(node.inputs[0], "Transpose")
        r1 = producer(tr.inputs[0], "Reshape") if tr is not None else None
        if r1 is None:
            return None
        perm = list(attr(tr, "perm", []) or [])
        if len(perm) < 3 or perm[:3] != [0, 2, 1] or perm[3:] != list(range(3, len(perm))):
            return None
        return {"tr": tr, "r1": r1, "x": r1.inputs[0]}

    def check(node: ir.Node, m: dict) -> str | None:
        if t.prefer("channel_shuffle") != "op" or not t.has(CHANNEL_SHUFFLE):
            return "target prefers the Reshape/Transpose form"
        if not (single_use(m["tr"].outputs[0]) and single_use(m["r1"].outputs[0])):
            return "intermediate values have other uses"
        x, mid, y = m["x"], m["r1"].outputs[0].shape, node.outputs[0].shape
        if x.shape is None or mid is None or y is None or len(x.shape) < 2:
            return "shapes unknown"
        c = x.shape[1]
        if not (isinstance(c, int) and isinstance(mid[1], int) and isinstance(mid[2], int)):
            return "channel count unknown"
        if not _same_dim(mid[0], x.shape[0]) or mid[1] * mid[2] != c:
            return "first Reshape does not split the channels"
        if len(y) != len(x.shape) or not all(_same_dim(a, b) for a, b in zip(x.shape, y, strict=True)):
            return "last Reshape does not restore the input shape"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        g = int(m["r1"].outputs[0].shape[1])
        x = m["x"]
        return [b.op("ChannelShuffle", [x], {"group": g}, domain=DLCC_DOMAIN, hint="shuffle", dtype=x.dtype,
                     shape=_shape_of(x))]

    return Rule("channel-shuffle-to-op", ("Reshape",), pattern, check, rewrite, min_opset=5,
                doc="Reshape/Transpose/Reshape channel shuffle -> dlcc::ChannelShuffle(group)",
                family="replace", exact=True)


def _channel_shuffle_to_idiom_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        if node.domain != DLCC_DOMAIN:
            return None
        return {"group": attr(node, "group")}

    def check(node: ir.Node, m: dict) -> str | None:
        if t.has(CHANNEL_SHUFFLE):
            return "target supports dlcc::ChannelShuffle"
        x = node.inputs[0]
        if _rank(x) is None or _rank(x) < 2:
            return "input rank unknown"
        c, g = x.shape[1], m["group"]
        if not isinstance(c, int):
            return "channel count unknown"
        if not isinstance(g, int) or g <= 0 or c % g:
            return "group does not divide the channels"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        x = node.inputs[0]
        g, c = m["group"], x.shape[1]
        spatial = list(x.shape[2:])
        if all(isinstance(d, int) for d in spatial):
            split, back = [0, g, c // g, *spatial], b.const(np.array([0, c, *spatial], np.int64), "shape")
        else:  # symbolic spatial dims: merge them, and take the final shape from x at run time
            split, back = [0, g, c // g, -1], b.op("Shape", [x], hint="shape")
        r1 = b.op("Reshape", [x, b.const(np.array(split, np.int64), "shape")], hint="shuffle_split")
        perm = [0, 2, 1, *range(3, len(split))]
        tr = b.op("Transpose", [r1], {"perm": perm}, hint="shuffle_swap")
        return [b.op("Reshape", [tr, back], hint="shuffle", dtype=x.dtype, shape=_shape_of(x))]

    return Rule("channel-shuffle-to-idiom", ("ChannelShuffle",), pattern, check, rewrite,
                doc="dlcc::ChannelShuffle -> Reshape/Transpose/Reshape (standard ONNX)", family="replace",
                exact=True, domain=DLCC_DOMAIN)


# ---------------------------------------------------------------------------------------------- attention


def _scalar(v: ir.Value | None) -> float | None:
    data = const_array(v)
    return None if data is None or data.size != 1 else float(data.reshape(-1)[0])


def _attention_core(x: ir.Value) -> dict | None:
    """Walk back from the softmax input without its mask: [Where(causal, s, fill)] <- [Mul/Div by a scalar]
    <- MatMul(Q, K^T), every value passed used once."""
    out: dict = {"scale": 1.0, "causal": 0, "fill": 0.0}
    w = producer(x, "Where")
    if w is not None and single_use(x):
        cond = const_array(w.inputs[0])
        keep_first = _scalar(w.inputs[2]) is not None  # Where(cond, s, fill): cond keeps
        chain, fill = (w.inputs[1], _scalar(w.inputs[2])) if keep_first else (w.inputs[2], _scalar(w.inputs[1]))
        shape = static_shape(x)
        if cond is None or fill is None or shape is None or len(shape) < 2 or cond.dtype != np.bool_:
            return None
        sq, sk = shape[-2:]
        if cond.ndim > len(shape) or any(d != 1 for d in cond.shape[:-2]) or cond.shape[-2:] != (sq, sk):
            return None
        tril = np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq)
        if not np.array_equal(cond.reshape(sq, sk), tril if keep_first else ~tril):
            return None
        out.update(causal=1, fill=fill)
        x = chain
    s = producer(x, ("Mul", "Div"))
    if s is not None and single_use(x):
        if s.op_type == "Mul":
            for i in (0, 1):
                c = _scalar(s.inputs[1 - i])
                if c is not None and producer(s.inputs[i], "MatMul") is not None:
                    out["scale"], x = c, s.inputs[i]
                    break
        else:
            c = _scalar(s.inputs[1])
            if c is not None and c != 0.0 and producer(s.inputs[0], "MatMul") is not None:
                out["scale"], x = float(np.float32(1.0) / np.float32(c)), s.inputs[0]
    mm = producer(x, "MatMul")
    if mm is None or not single_use(x):
        return None
    out["qk"] = mm
    return out


def _columns(x: ir.Value) -> tuple[ir.Value, int]:
    """``x`` as a column range of a wider [B, S, W] value: (that value, first column) when ``x`` is a unit-step
    Slice or a Split output along the last axis of it, else (x, 0)."""
    xs = static_shape(x)
    s = producer(x, ("Slice", "Split"))
    if s is None or xs is None or len(xs) != 3:
        return x, 0
    src = static_shape(s.inputs[0])
    if src is None or len(src) != 3 or src[:2] != xs[:2]:
        return x, 0
    if s.op_type == "Split":
        if attr(s, "axis", 0) not in (-1, 2):
            return x, 0
        outs = [static_shape(o) for o in s.outputs]
        if any(o is None for o in outs):
            return x, 0
        i = list(s.outputs).index(x)
        return s.inputs[0], sum(o[2] for o in outs[:i])
    parts = [const_array(v) for v in s.inputs[1:5]] + [None] * (5 - len(s.inputs))
    starts, ends, axes, steps = parts[:4]
    if starts is None or ends is None or starts.size != 1 or (len(s.inputs) > 3 and s.inputs[3] is not None
                                                              and (axes is None or axes.size != 1)):
        return x, 0
    axis = int(axes.reshape(-1)[0]) if axes is not None else 0
    if axis not in (-1, 2) or (steps is not None and int(steps.reshape(-1)[0]) != 1):
        return x, 0
    start = int(starts.reshape(-1)[0])
    start = start + src[2] if start < 0 else start
    if not 0 <= start <= src[2] - xs[2]:
        return x, 0
    return s.inputs[0], start


def _split_heads(v: ir.Value, perm: tuple[int, ...]) -> tuple[ir.Value, int] | None:
    """The [B, S, W] value and first column of the [B, S, H*D] range that ``v`` = Transpose(Reshape(x,
    [B, S, H, D]), perm) splits into heads (x itself, or x a column range of a merged projection)."""
    t = producer(v, "Transpose")
    if t is None or tuple(attr(t, "perm") or ()) != perm:
        return None
    r = producer(t.inputs[0], "Reshape")
    if r is None:
        return None
    x, split = static_shape(r.inputs[0]), static_shape(r.outputs[0])
    if x is None or split is None or len(x) != 3 or len(split) != 4:
        return None
    if split[:2] != x[:2] or split[2] * split[3] != x[2]:
        return None
    return _columns(r.inputs[0])


def _attention_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        sm = producer(node.inputs[0], "Softmax")
        return None if sm is None else {"sm": sm}

    def check(node: ir.Node, m: dict) -> str | None:
        if not (t.has(ATTENTION) and t.prefer("attention") == "fused"):
            return "target does not fuse attention"
        sm = m["sm"]
        p, v = sm.outputs[0], node.inputs[1]
        ps, vs, ys = static_shape(p), static_shape(v), static_shape(node.outputs[0])
        if ps is None or vs is None or ys is None or len(ps) != 4 or len(vs) != 4:
            return "not 4-D static shapes"
        if any(x.dtype != ir.DataType.FLOAT for x in (p, v, node.outputs[0])):
            return "not float32"
        if not single_use(p) or attr(sm, "axis", -1) not in (-1, 3):
            return "softmax not over the keys, or its result has other uses"
        x, core, mask = sm.inputs[0], None, None
        add = producer(x, "Add")
        if add is not None and single_use(x):
            for i in (0, 1):
                core = _attention_core(add.inputs[i])
                if core is not None:
                    mask = add.inputs[1 - i]
                    break
        if core is None:
            core = _attention_core(x)
        if core is None:
            return "no Q K^T product before the softmax"
        qh, kt = core["qk"].inputs
        for i in (0, 1):  # a scalar scale on Q or K^T before the product (exporters of torch's MHA, ViT)
            x = (qh, kt)[i]
            s = producer(x, "Mul")
            if s is None or not single_use(x):
                continue
            for j in (0, 1):
                c = _scalar(s.inputs[1 - j])
                if c is not None and static_shape(s.inputs[j]) == static_shape(x):
                    core["scale"] = float(np.float32(core["scale"]) * np.float32(c))
                    qh, kt = (s.inputs[j], kt) if i == 0 else (qh, s.inputs[j])
                    break
        qs, ks = static_shape(qh), static_shape(kt)
        if qs is None or ks is None or len(qs) != 4 or len(ks) != 4:
            return "Q or K^T not 4-D"
        b, h, sq, d = qs
        sk = ks[3]
        if ks != (b, h, d, sk) or vs != (b, h, sk, d) or ps != (b, h, sq, sk) or ys != (b, h, sq, d):
            return "Q, K, V shapes disagree"
        if mask is not None:
            ms = static_shape(mask)
            full = (b, h, sq, sk)
            if (ms is None or mask.dtype != ir.DataType.FLOAT or len(ms) > 4
                    or any(a not in (1, f) for a, f in zip(ms, full[4 - len(ms):], strict=True))):
                return "mask does not broadcast to the scores"
        if any(x.dtype != ir.DataType.FLOAT for x in (qh, kt)):
            return "not float32"
        m.update(core, mask=mask, dims=(b, h, sq, sk, d), q=qh, kt=kt)
        return None

    def rewrite(node: ir.Node, m: dict, b_: Builder):
        b, h, sq, sk, d = m["dims"]
        qh, kt = m["q"], m["kt"]
        v = node.inputs[1]
        q3, v3 = _split_heads(qh, (0, 2, 1, 3)), _split_heads(v, (0, 2, 1, 3))
        k3 = _split_heads(kt, (0, 2, 3, 1))
        layout = [0 if q3 is not None else 1, 0, 0 if v3 is not None else 1, 1]
        offsets = [q3[1] if q3 else 0, k3[1] if k3 else 0, v3[1] if v3 else 0]
        k_in = k3[0] if k3 else None
        if k3 is None:
            tk = producer(kt, "Transpose")
            if tk is not None and tuple(attr(tk, "perm") or ()) == (0, 1, 3, 2):
                k_in, layout[1] = tk.inputs[0], 1
            else:
                k_in, layout[1] = kt, 2
        y = node.outputs[0]
        merged = None  # the consumer Transpose(0, 2, 1, 3) -> Reshape [B, Sq, H*D]: the output read unsplit
        if len(y.uses()) == 1 and not y.is_graph_output():
            tr = y.uses()[0].node
            if (tr.op_type == "Transpose" and tr.domain in ("", "ai.onnx")
                    and tuple(attr(tr, "perm") or ()) == (0, 2, 1, 3)):
                merged = tr
        if merged is not None:
            layout[3] = 0
        inputs = [q3[0] if q3 is not None else qh, k_in, v3[0] if v3 is not None else v]
        if m["mask"] is not None:
            inputs.append(m["mask"])
        attrs = {"num_heads": h, "scale": float(m["scale"]), "causal": int(m["causal"]), "fill": float(m["fill"]),
                 "layout": layout}
        if any(offsets) or any(c == 0 and x.shape[2] != h * d for c, x in zip(layout, inputs, strict=False)):
            attrs.update(head_size=d, offsets=offsets)
        f32 = ir.DataType.FLOAT
        if layout[3] == 0:
            y3 = b_.op("Attention", inputs, attrs, domain=DLCC_DOMAIN, hint="attention", dtype=f32,
                       shape=[b, sq, h * d])
            r = b_.op("Reshape", [y3, b_.const(np.array([b, sq, h, d], np.int64), "shape")], hint="attention_heads",
                      dtype=f32, shape=[b, sq, h, d])
            return [b_.op("Transpose", [r], {"perm": [0, 2, 1, 3]}, hint="attention_heads_t", dtype=f32,
                          shape=[b, h, sq, d])]
        return [b_.op("Attention", inputs, attrs, domain=DLCC_DOMAIN, hint="attention", dtype=f32,
                      shape=[b, h, sq, d])]

    return Rule("attention-to-op", ("MatMul",), pattern, check, rewrite, min_opset=13,
                doc="MatMul -> scale -> causal Where -> mask Add -> Softmax -> MatMul -> dlcc::Attention",
                family="replace", exact=False, input_ops=frozenset({"Softmax"}))


def _onnx_attention_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        return {}

    def check(node: ir.Node, m: dict) -> str | None:
        if not (t.has(ATTENTION) and t.prefer("attention") == "fused"):
            return "target does not fuse attention"
        ins = list(node.inputs) + [None] * (6 - len(node.inputs))
        if ins[4] is not None or ins[5] is not None:
            return "past key/value"
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return "present key/value or the QK product are used"
        if attr(node, "softcap", 0.0) or attr(node, "qk_matmul_output_mode", 0):
            return "softcap or a QK output mode"
        q, k, v = (static_shape(x) for x in ins[:3])
        if q is None or k is None or v is None or any(x.dtype != ir.DataType.FLOAT for x in ins[:3]):
            return "not float32 static shapes"
        if len(q) == 4 and len(k) == 4 and len(v) == 4:
            b, h, sq, d = q
            if k[:2] != (b, h) or v[:2] != (b, h) or k[3] != d or v[3] != d or k[2] != v[2]:
                return "grouped heads or another V head size"
            sk, layout = k[2], [1, 1, 1, 1]
        elif len(q) == 3 and len(k) == 3 and len(v) == 3:
            h = attr(node, "q_num_heads", 0)
            if not h or attr(node, "kv_num_heads", 0) != h or q[2] % h or k[2] != q[2] or v[2] != q[2]:
                return "grouped heads or another V head size"
            b, sq, d = q[0], q[1], q[2] // h
            sk, layout = k[1], [0, 0, 0, 0]
            if k[0] != b or v[0] != b or v[1] != sk:
                return "batch or keys disagree"
        else:
            return "Q, K, V ranks"
        causal = int(attr(node, "is_causal", 0))
        if causal and sq != sk:
            return "causal with another number of queries than keys (upper-left alignment)"
        mask = ins[3]
        if mask is not None:
            ms = static_shape(mask)
            full = (b, h, sq, sk)
            if (ms is None or len(ms) > 4 or mask.dtype not in (ir.DataType.FLOAT, ir.DataType.BOOL)
                    or any(a not in (1, f) for a, f in zip(ms, full[4 - len(ms):], strict=True))):
                return "mask does not broadcast to the scores"
        scale = attr(node, "scale", None)
        m.update(layout=layout, heads=h, causal=causal, mask=mask,
                 scale=float(scale) if scale is not None else float(1.0 / np.sqrt(np.float32(d))))
        return None

    def rewrite(node: ir.Node, m: dict, b_: Builder):
        inputs = list(node.inputs[:3])
        mask = m["mask"]
        if mask is not None:
            if mask.dtype == ir.DataType.BOOL:
                mask = b_.op("Where", [mask, b_.const(np.array(0.0, np.float32), "zero"),
                                       b_.const(np.array(-np.inf, np.float32), "minus_inf")], hint="attn_mask",
                             dtype=ir.DataType.FLOAT, shape=_shape_of(mask))
            inputs.append(mask)
        attrs = {"num_heads": m["heads"], "scale": m["scale"], "causal": m["causal"], "fill": float("-inf"),
                 "layout": m["layout"]}
        y = node.outputs[0]
        out = b_.op("Attention", inputs, attrs, domain=DLCC_DOMAIN, hint="attention", dtype=y.dtype,
                    shape=_shape_of(y))
        return [out] + [None] * (len(node.outputs) - 1)

    return Rule("onnx-attention-to-op", ("Attention",), pattern, check, rewrite, min_opset=23,
                doc="Attention (opset 23) -> dlcc::Attention", family="replace", exact=False)


def _attention_to_idiom_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        return {} if node.domain == DLCC_DOMAIN else None

    def check(node: ir.Node, m: dict) -> str | None:
        if t.has(ATTENTION):
            return "target supports dlcc::Attention"
        shapes = [static_shape(v) for v in node.inputs[:3]]
        if len(node.inputs) < 3 or any(s is None for s in shapes):
            return "shapes unknown"
        m["attrs"] = attention_attrs(lambda n, d: attr(node, n, d))
        try:
            m["dims"] = attention_dims(*shapes, *m["attrs"])
        except ValueError as e:
            return str(e)
        return None

    def rewrite(node: ir.Node, m: dict, b_: Builder):
        heads, layout, _, offsets = m["attrs"]
        b, h, sq, sk, d = m["dims"]

        def ints(vals, hint):
            return b_.const(np.array(vals, np.int64), hint)

        def split(x: ir.Value, code: int, off: int, perm: list[int]) -> ir.Value:
            """Q or V as [B, H, S, D], K as K^T [B, H, D, S] (``perm``: the head Transpose of a code-0 operand)."""
            keys = perm == [0, 2, 3, 1]
            if code == 1 and keys:
                return b_.op("Transpose", [x], {"perm": [0, 1, 3, 2]}, hint="attn_kt")
            if code != 0:
                return x
            s = static_shape(x)
            if off or s[2] != h * d:
                x = b_.op("Slice", [x, ints([off], "start"), ints([off + h * d], "end"), ints([2], "axis")],
                          hint="attn_cols")
            return b_.op("Transpose", [b_.op("Reshape", [x, ints([s[0], s[1], h, d], "shape")], hint="attn_heads")],
                         {"perm": perm}, hint="attn_heads_t")

        q = split(node.inputs[0], layout[0], offsets[0], [0, 2, 1, 3])
        kt = split(node.inputs[1], layout[1], offsets[1], [0, 2, 3, 1])
        v = split(node.inputs[2], layout[2], offsets[2], [0, 2, 1, 3])
        s = b_.op("Mul", [b_.op("MatMul", [q, kt], hint="attn_scores"),
                          b_.const(np.array(attr(node, "scale", 1.0), np.float32), "scale")], hint="attn_scaled")
        if attr(node, "causal", 0):
            tril = np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq)
            s = b_.op("Where", [b_.const(tril, "causal"), s,
                                b_.const(np.array(attr(node, "fill", 0.0), np.float32), "fill")], hint="attn_causal")
        if len(node.inputs) > 3 and node.inputs[3] is not None:
            s = b_.op("Add", [s, node.inputs[3]], hint="attn_masked")
        p = b_.op("Softmax", [s], {"axis": -1}, hint="attn_probs")
        y = b_.op("MatMul", [p, v], hint="attn_context", dtype=ir.DataType.FLOAT, shape=[b, h, sq, d])
        if layout[3] == 0:
            y = b_.op("Reshape", [b_.op("Transpose", [y], {"perm": [0, 2, 1, 3]}, hint="attn_context_t"),
                                  ints([b, sq, h * d], "shape")], hint="attention", dtype=ir.DataType.FLOAT,
                      shape=[b, sq, h * d])
        return [y]

    return Rule("attention-to-idiom", ("Attention",), pattern, check, rewrite, min_opset=13,
                doc="dlcc::Attention -> MatMul/Mul/Where/Add/Softmax/MatMul with the head Reshape/Transposes "
                    "(standard ONNX)", family="replace", exact=False, domain=DLCC_DOMAIN)


# ------------------------------------------------------------------------------------ sibling MatMuls


def _weight_product(node: ir.Node) -> np.ndarray | None:
    """The constant 2-D float32 weight of a MatMul(x, W) whose x is at least 2-D with static shape."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    w, xs = const_array(node.inputs[1]), static_shape(node.inputs[0])
    if w is None or w.ndim != 2 or w.dtype != np.float32 or xs is None or len(xs) < 2 or xs[-1] != w.shape[0]:
        return None
    return w


def _bias_of(node: ir.Node, n: int) -> tuple[ir.Node, np.ndarray] | None:
    """The Add of a constant [n] float32 bias that alone reads ``node``'s product."""
    y = node.outputs[0]
    if not single_use(y):
        return None
    add = y.uses()[0].node
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    b = const_array(other)
    if b is None or b.dtype != np.float32 or b.shape != (n,) or static_shape(add.outputs[0]) != static_shape(y):
        return None
    return add, b


def _merge_sibling_matmuls(graph: ir.Graph, stats: RewriteStats) -> bool:
    """merge-sibling-matmuls (see the module docstring); returns whether the graph changed."""
    names = NameGen(graph)
    order = {n: i for i, n in enumerate(graph)}
    done: set[ir.Node] = set()
    changed = False
    for node in list(graph):
        if node in done or _weight_product(node) is None:
            continue
        x = node.inputs[0]
        sibs = sorted({u.node for u in x.uses() if u.idx == 0 and _weight_product(u.node) is not None},
                      key=lambda n: order.get(n, -1))
        done.update(sibs)
        if len(sibs) < 2 or sibs[0] is not node:
            continue
        ws = [_weight_product(s) for s in sibs]
        biases = [_bias_of(s, w.shape[1]) for s, w in zip(sibs, ws, strict=True)]
        with_bias = all(b is not None for b in biases)
        outs = [b[0].outputs[0] if with_bias else s.outputs[0] for s, b in zip(sibs, biases, strict=True)]
        if any(o.is_graph_output() or static_shape(o) is None for o in outs):
            continue
        xs = static_shape(x)
        width = sum(w.shape[1] for w in ws)

        def const(array: np.ndarray, hint: str) -> ir.Value:
            name = names.new(hint)
            t = ir.tensor(array, name=name)
            v = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(t.dtype), const_value=t)
            graph.register_initializer(v)
            return v

        def value(hint: str, shape) -> ir.Value:
            return ir.Value(name=names.new(hint), shape=ir.Shape(list(shape)), type=ir.TensorType(ir.DataType.FLOAT))

        full = (*xs[:-1], width)
        new = [ir.Node("", "MatMul", [x, const(np.concatenate(ws, axis=1), "merged_weight")],
                       outputs=[value("merged_matmul", full)], name=names.new("n_MatMul"))]
        y = new[0].outputs[0]
        if with_bias:
            bias = const(np.concatenate([b[1] for b in biases]), "merged_bias")
            new.append(ir.Node("", "Add", [y, bias], outputs=[value("merged_out", full)], name=names.new("n_Add")))
            y = new[-1].outputs[0]
        slices, start = [], 0
        axis = const(np.array([len(xs) - 1], np.int64), "merged_axis")
        for o, w in zip(outs, ws, strict=True):
            n = w.shape[1]
            s = ir.Node("", "Slice", [y, const(np.array([start], np.int64), "merged_start"),
                                      const(np.array([start + n], np.int64), "merged_end"), axis],
                        outputs=[value("merged_part", static_shape(o))], name=names.new("n_Slice"))
            new.append(s)
            slices.append(s.outputs[0])
            start += n
        graph.insert_before(sibs[0], new)
        for o, s in zip(outs, slices, strict=True):
            o.replace_all_uses_with(s)
        for s, b in zip(sibs, biases, strict=True):
            if with_bias:
                graph.remove(b[0], safe=True)
            graph.remove(s, safe=True)
        stats.fired["merge-sibling-matmuls"] += 1
        changed = True
    return changed


# ------------------------------------------------------------------------------------------- grouped Conv


def _grouped_conv_rule(t: Target) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        if attr(node, "group", 1) == 1:
            return None
        return {"bias": node.inputs[2] if len(node.inputs) > 2 else None}

    def check(node: ir.Node, m: dict) -> str | None:
        if t.has(GROUPED_CONV):
            return "target supports grouped Conv"
        m["w"], m["b"] = weight(node.inputs[1]), weight(m["bias"])
        g, w, x = attr(node, "group", 1), m["w"], node.inputs[0]
        if w is None:
            return "weight is not constant"
        if m["bias"] is not None and m["b"] is None:
            return "bias is not constant"
        if _rank(x) is None or not isinstance(x.shape[1], int):
            return "channel count unknown"
        if x.shape[1] != g * w.shape[1] or w.shape[0] % g:
            return "group does not divide the channels"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        x, w, g = node.inputs[0], m["w"], attr(node, "group", 1)
        cg, mg = w.shape[1], w.shape[0] // g
        sizes = np.full(g, cg, np.int64)
        if b.opset >= 13:
            parts = b.op("Split", [x, b.const(sizes, "split")], {"axis": 1}, num_outputs=g, hint="group_in")
        else:
            parts = b.op("Split", [x], {"axis": 1, "split": sizes.tolist()}, num_outputs=g, hint="group_in")
        parts = parts if isinstance(parts, tuple) else (parts,)
        out = node.outputs[0].shape
        outs = []
        for i, part in enumerate(parts):
            part.dtype, part.shape = x.dtype, ir.Shape([x.shape[0], cg, *x.shape[2:]])
            inputs = [part, b.const(w[i * mg:(i + 1) * mg], "group_w")]
            if m["b"] is not None:
                inputs.append(b.const(m["b"][i * mg:(i + 1) * mg], "group_b"))
            outs.append(b.op("Conv", inputs, _copy_attrs(node, drop=("group",)), hint="group_conv",
                             dtype=x.dtype, shape=None if out is None else [out[0], mg, *out[2:]]))
        return [b.op("Concat", outs, {"axis": 1}, hint="group_out")]

    return Rule("grouped-conv-split", ("Conv",), pattern, check, rewrite,
                doc="grouped Conv -> Split + one Conv per group + Concat", family="replace", exact=True)


# ---------------------------------------------------------------------------------------- Pad (opset >= 11)


def _pad_rule() -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        return {} if "pads" in node.attributes and len(node.inputs) == 1 else None

    def check(node: ir.Node, m: dict) -> str | None:
        x = node.inputs[0]
        if x.dtype is None:
            return "input dtype unknown"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        x = node.inputs[0]
        inputs = [x, b.const(np.array(attr(node, "pads"), np.int64), "pads")]
        value = float(attr(node, "value", 0.0))
        if value != 0.0:
            inputs.append(b.const(np.array(value, dtype=_np_dtype(x)), "pad_value"))
        mode = attr(node, "mode", "constant")
        return [b.op("Pad", inputs, {"mode": mode} if mode != "constant" else {}, hint="pad")]

    return Rule("pad-attrs-to-inputs", ("Pad",), pattern, check, rewrite,
                doc="Pad with pads/value attributes (opset < 11) -> Pad with pads/value inputs",
                family="replace", exact=True)


def upgrade_pad(model: ir.Model, to_opset: int, stats: RewriteStats | None = None) -> bool:
    """Rewrite attribute-form Pads into the input form of opset 11+, for a model about to import ``to_opset``.

    Only a step of raising the opset: the caller sets the opset import (the model is invalid between the
    two). Does nothing when ``to_opset`` < 11 or the model already imports 11+. Returns changed.
    """
    if to_opset < 11 or _opset(model) >= 11:
        return False
    return apply_rules(model, [_pad_rule()], stats=stats)


def _opset(model: ir.Model) -> int:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))


def _opset_blocker(model: ir.Model, to_opset: int) -> str | None:
    """Why the opset cannot be raised by converting Pad alone: the first other op whose schema changes."""
    old = _opset(model)
    for graph in all_graphs(model.graph):
        for node in graph:
            if node.domain not in ("", "ai.onnx") or node.op_type == "Pad":
                continue
            try:
                a = onnx.defs.get_schema(node.op_type, old).since_version
                b = onnx.defs.get_schema(node.op_type, to_opset).since_version
            except onnx.defs.SchemaError:
                return f"no schema for {node.op_type}"
            if a != b:
                return f"{node.op_type} changes between opset {old} and {to_opset}"
    return None


# ------------------------------------------------------------------------------------------------ the pass


def replacement_rules(target: Target | str) -> list[Rule]:
    """The replacement rules for ``target``, channel-shuffle-to-idiom (a dlcc-domain root) included."""
    t = get_target(target)
    return [_bn_rule(t), _prelu_rule(t), _gemm_to_conv_rule(t), _matmul_to_conv_rule(t), _conv_to_gemm_rule(t),
            _channel_shuffle_to_op_rule(t), _grouped_conv_rule(t), _channel_shuffle_to_idiom_rule(t),
            _attention_rule(t), _onnx_attention_rule(t), _attention_to_idiom_rule(t)]


class OpReplacement(RulePass):
    """Replace ops the target lacks, or prefers in another form; optionally raise the opset (Pad)."""

    name = "replace"
    doc = "rewrite ops the target lacks into ops it runs, or into the form it prefers"

    def __init__(self, target: Target | str = "onnx", *, upgrade_opset_to: int | None = None) -> None:
        super().__init__()
        self.target = get_target(target)
        self.upgrade_opset_to = upgrade_opset_to
        self.rules = replacement_rules(self.target)

    def run(self, model: ir.Model) -> bool:
        stats = RewriteStats()
        changed = False
        if self.upgrade_opset_to is not None and _opset(model) < self.upgrade_opset_to:
            changed |= self._raise_opset(model, self.upgrade_opset_to, stats)
        if self.target.prefer("siblings") == "merged" and _opset(model) >= 13:
            changed |= _merge_sibling_matmuls(model.graph, stats)
        changed |= apply_rules(model, self.rules, stats=stats)
        changed |= _sync_dlcc_import(model)
        self.fired.update(stats.fired)
        self.refused = stats.refused
        return changed

    def _raise_opset(self, model: ir.Model, to_opset: int, stats: RewriteStats) -> bool:
        why = _opset_blocker(model, to_opset)
        if why:
            stats.refused[("raise-opset", why)] += 1
            return False
        upgrade_pad(model, to_opset, stats)
        model.opset_imports[""] = to_opset
        model.opset_imports.pop("ai.onnx", None)
        needed = onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", to_opset)])
        model.ir_version = max(model.ir_version, needed)
        stats.fired["raise-opset"] += 1
        return True


def _sync_dlcc_import(model: ir.Model) -> bool:
    """Import the dlcc domain iff a node uses it; returns whether the imports changed."""
    used = any(n.domain == DLCC_DOMAIN for g in all_graphs(model.graph) for n in g)
    if used and DLCC_DOMAIN not in model.opset_imports:
        model.opset_imports[DLCC_DOMAIN] = DLCC_DOMAIN_VERSION
        return True
    if not used and DLCC_DOMAIN in model.opset_imports and not model.functions:
        del model.opset_imports[DLCC_DOMAIN]
        return True
    return False
