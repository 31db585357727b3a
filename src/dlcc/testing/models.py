"""Small ONNX models built in code, in the shapes real networks and exporters produce.

What goes in: keyword arguments with small, realistic defaults (sizes, seed, opset where it matters).
What comes out: an ``onnx.ModelProto`` with ir_version 8 and the default domain at opset 17 (18 where a
builder takes ``opset=18``), float32 weights drawn from a seeded generator, and graph inputs/outputs
with full types.

Invariants:
- Every model passes ``onnx.checker.check_model(full_check=True)`` and runs in onnxruntime.
- Every intermediate shape is static (shape inference with data propagation finds it), unless the
  builder was given a symbolic ``batch`` (a string), in which case only the batch dimension is symbolic.
- Float scalars (eps, 0.5, sqrt(2), the attention scale, Clip bounds, Pow exponents) are Constant
  nodes or scalar initializers, so ``dlcc.testing.randomize`` keeps them; every tensor-valued float
  weight is an initializer, so ``randomize`` replaces it.
- ``KIT_MODELS`` maps a short name to a zero-argument builder; every builder runs well under a second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Dim = int | str

DEFAULT_OPSET = 17
IR_VERSION = 8

__all__ = [
    "DEFAULT_OPSET",
    "KIT_MODELS",
    "attention_block",
    "conv_bn_relu_stack",
    "depthwise_separable_block",
    "gelu_erf",
    "gelu_tanh",
    "layernorm_primitive",
    "mlp",
    "residual_block",
    "transformer_encoder_block",
]


class _Builder:
    """Collects nodes, initializers and graph inputs/outputs with unique generated names."""

    def __init__(self, name: str, *, seed: int = 0, opset: int = DEFAULT_OPSET) -> None:
        if opset not in (17, 18):
            raise ValueError(f"opset must be 17 or 18, not {opset}")
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._used: set[str] = set()

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self._used:
            name = f"{base}_{k}"
            k += 1
        self._used.add(name)
        return name

    def input(self, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        name = self.fresh(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, value: str, name: str, elem_type: int, shape: Sequence[Dim] | None) -> str:
        """Expose ``value`` as a graph output called ``name`` (renaming it where it is produced/used)."""
        if value != name:
            if name in self._used:
                raise ValueError(f"the name {name!r} is taken")
            self._used.add(name)
            for node in self.nodes:
                for seq in (node.input, node.output):
                    for i, v in enumerate(seq):
                        if v == value:
                            seq[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, None if shape is None
                                                          else list(shape)))
        return name

    def init(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, base: str, shape: Sequence[int], fan_in: int) -> str:
        w = self.rng.standard_normal(tuple(shape)).astype(np.float32) / np.float32(math.sqrt(fan_in))
        return self.init(base, w)

    def bias(self, base: str, n: int, std: float = 0.1) -> str:
        return self.init(base, (std * self.rng.standard_normal(n)).astype(np.float32))

    def around_one(self, base: str, n: int) -> str:
        return self.init(base, self.rng.uniform(0.5, 1.5, n).astype(np.float32))

    def ints(self, base: str, values: Sequence[int]) -> str:
        return self.init(base, np.asarray(list(values), dtype=np.int64))

    def scalar(self, base: str, value: float, dtype: type = np.float32) -> str:
        """A 0-d Constant node (what exporters emit for literals)."""
        out = self.fresh(base)
        t = numpy_helper.from_array(np.asarray(value, dtype=dtype), out)
        self.nodes.append(helper.make_node("Constant", [], [out], name=self.fresh(f"{base}_const"), value=t))
        return out

    def op(self, op_type: str, inputs: Sequence[str], base: str | None = None, n_out: int = 1,
           **attrs) -> str:
        base = base or op_type.lower()
        outs = [self.fresh(base if n_out == 1 else f"{base}_{i}") for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.fresh(f"{base}_node"),
                                           **attrs))
        return outs[0]

    def reduce_mean_last(self, x: str, base: str) -> str:
        """ReduceMean over the last axis, keepdims; axes is an attribute at 17 and an input at 18."""
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.ints(f"{base}_axes", [-1])], base, keepdims=1)
        return self.op("ReduceMean", [x], base, axes=[-1], keepdims=1)

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  ir_version=IR_VERSION, producer_name="dlcc.testing")
        onnx.checker.check_model(model, full_check=True)
        return model


# ------------------------------------------------------------------------------------ building blocks


def _linear(b: _Builder, x: str, d_in: int, d_out: int, base: str) -> str:
    """MatMul by a [d_in, d_out] weight, then Add of a [d_out] bias (the exporters' Linear)."""
    y = b.op("MatMul", [x, b.weight(f"{base}_weight", [d_in, d_out], d_in)], f"{base}_matmul")
    return b.op("Add", [y, b.bias(f"{base}_bias", d_out)], f"{base}_out")


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, base: str, *, kernel: int = 3, stride: int = 1,
             group: int = 1, conv_bias: bool = False) -> str:
    pad = kernel // 2
    fan_in = (c_in // group) * kernel * kernel
    inputs = [x, b.weight(f"{base}_weight", [c_out, c_in // group, kernel, kernel], fan_in)]
    if conv_bias:
        inputs.append(b.bias(f"{base}_bias", c_out))
    y = b.op("Conv", inputs, f"{base}_conv", kernel_shape=[kernel, kernel], pads=[pad] * 4,
             strides=[stride, stride], group=group)
    bn = [b.around_one(f"{base}_bn_scale", c_out), b.bias(f"{base}_bn_bias", c_out),
          b.bias(f"{base}_bn_mean", c_out),
          b.init(f"{base}_bn_var", b.rng.uniform(0.5, 1.5, c_out).astype(np.float32))]
    return b.op("BatchNormalization", [y, *bn], f"{base}_bn", epsilon=1e-5)


def _layernorm(b: _Builder, x: str, hidden: int, eps: float, base: str) -> str:
    """LayerNorm over the last axis written as the primitive ops exporters used before opset 17."""
    mean = b.reduce_mean_last(x, f"{base}_mean")
    d = b.op("Sub", [x, mean], f"{base}_centered")
    sq = b.op("Pow", [d, b.scalar(f"{base}_two", 2.0)], f"{base}_sq")
    var = b.reduce_mean_last(sq, f"{base}_var")
    ve = b.op("Add", [var, b.scalar(f"{base}_eps", eps)], f"{base}_var_eps")
    std = b.op("Sqrt", [ve], f"{base}_std")
    n = b.op("Div", [d, std], f"{base}_normed")
    y = b.op("Mul", [n, b.around_one(f"{base}_gamma", hidden)], f"{base}_scaled")
    return b.op("Add", [y, b.bias(f"{base}_beta", hidden)], f"{base}_out")


def _gelu_erf(b: _Builder, x: str, base: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt(2))), in the op order of the TorchScript exporter."""
    t = b.op("Div", [x, b.scalar(f"{base}_sqrt2", math.sqrt(2.0))], f"{base}_div")
    t = b.op("Erf", [t], f"{base}_erf")
    t = b.op("Add", [t, b.scalar(f"{base}_one", 1.0)], f"{base}_add")
    t = b.op("Mul", [x, t], f"{base}_mul")
    return b.op("Mul", [t, b.scalar(f"{base}_half", 0.5)], f"{base}_out")


def _gelu_tanh(b: _Builder, x: str, base: str) -> str:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))."""
    cube = b.op("Pow", [x, b.scalar(f"{base}_three", 3.0)], f"{base}_cube")
    t = b.op("Mul", [cube, b.scalar(f"{base}_coef", 0.044715)], f"{base}_cube_scaled")
    t = b.op("Add", [x, t], f"{base}_inner")
    t = b.op("Mul", [t, b.scalar(f"{base}_k", math.sqrt(2.0 / math.pi))], f"{base}_inner_scaled")
    t = b.op("Tanh", [t], f"{base}_tanh")
    t = b.op("Add", [t, b.scalar(f"{base}_one", 1.0)], f"{base}_add")
    half_x = b.op("Mul", [b.scalar(f"{base}_half", 0.5), x], f"{base}_half_x")
    return b.op("Mul", [half_x, t], f"{base}_out")


def _attention(b: _Builder, x: str, mask: str, d_model: int, heads: int, base: str, *,
               shape_idiom: bool) -> str:
    """Multi-head self-attention on x [B, S, D] with an additive mask broadcastable to [B, H, S, S].

    ``shape_idiom`` builds the head split/merge shapes at run time from Shape -> Gather -> Unsqueeze ->
    Concat (the TorchScript exporter's idiom); otherwise constant shapes with 0 ("copy this dim") are used.
    """
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
    dh = d_model // heads
    if shape_idiom:
        shape = b.op("Shape", [x], f"{base}_shape")
        dims = []
        for i, nm in ((0, "batch"), (1, "seq")):
            g = b.op("Gather", [shape, b.scalar(f"{base}_{nm}_index", i, np.int64)], f"{base}_{nm}", axis=0)
            dims.append(b.op("Unsqueeze", [g, b.ints(f"{base}_{nm}_axes", [0])], f"{base}_{nm}_1d"))
        split_shape = b.op("Concat", [*dims, b.ints(f"{base}_heads_dims", [heads, dh])],
                           f"{base}_split_shape", axis=0)
        merge_shape = b.op("Concat", [*dims, b.ints(f"{base}_model_dim", [d_model])],
                           f"{base}_merge_shape", axis=0)
    else:
        split_shape = b.ints(f"{base}_split_shape", [0, 0, heads, dh])
        merge_shape = b.ints(f"{base}_merge_shape", [0, 0, d_model])

    def heads_of(name: str, perm: list[int]) -> str:
        y = _linear(b, x, d_model, d_model, f"{base}_{name}")
        y = b.op("Reshape", [y, split_shape], f"{base}_{name}_heads")
        return b.op("Transpose", [y], f"{base}_{name}_t", perm=perm)

    q = heads_of("q", [0, 2, 1, 3])  # [B, H, S, dh]
    kt = heads_of("k", [0, 2, 3, 1])  # [B, H, dh, S]
    v = heads_of("v", [0, 2, 1, 3])  # [B, H, S, dh]
    scores = b.op("MatMul", [q, kt], f"{base}_scores")
    scores = b.op("Mul", [scores, b.scalar(f"{base}_scale", 1.0 / math.sqrt(dh))], f"{base}_scaled")
    scores = b.op("Add", [scores, mask], f"{base}_masked")
    probs = b.op("Softmax", [scores], f"{base}_probs", axis=-1)
    ctx = b.op("MatMul", [probs, v], f"{base}_context")
    ctx = b.op("Transpose", [ctx], f"{base}_context_t", perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, merge_shape], f"{base}_merged")
    return _linear(b, ctx, d_model, d_model, f"{base}_out")


# ----------------------------------------------------------------------------------------- builders


def mlp(*, batch: Dim = 4, in_features: int = 64, hidden: Sequence[int] = (128, 64), out_features: int = 10,
        gemm_layer: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x [batch, in] -> (Linear + Relu) per hidden size -> MatMul + Add -> y [batch, out].

    With ``gemm_layer`` the first hidden layer is one Gemm (transB=1, weight stored [out, in]) instead of
    MatMul + Add.
    """
    b = _Builder("mlp", seed=seed)
    x = b.input("x", TensorProto.FLOAT, [batch, in_features])
    d = in_features
    for i, h in enumerate(hidden):
        if i == 0 and gemm_layer:
            x = b.op("Gemm", [x, b.weight("fc0_weight", [h, d], d), b.bias("fc0_bias", h)], "fc0_gemm",
                     transB=1)
        else:
            x = _linear(b, x, d, h, f"fc{i}")
        x = b.op("Relu", [x], f"fc{i}_relu")
        d = h
    y = _linear(b, x, d, out_features, "head")
    b.output(y, "y", TensorProto.FLOAT, [batch, out_features])
    return b.model()


def conv_bn_relu_stack(*, batch: Dim = 1, in_channels: int = 3, size: int = 32,
                       channels: Sequence[int] = (8, 16, 16), num_classes: int = 10,
                       seed: int = 0) -> onnx.ModelProto:
    """image [batch, C, size, size] -> Conv+BN+Relu blocks (a 2x2 MaxPool after the first; the last one
    has stride 2; even-numbered convs have a bias, odd ones not) -> GlobalAveragePool -> Flatten -> Gemm
    -> logits [batch, num_classes]."""
    b = _Builder("conv_bn_relu_stack", seed=seed)
    x = b.input("image", TensorProto.FLOAT, [batch, in_channels, size, size])
    c = in_channels
    for i, co in enumerate(channels):
        stride = 2 if i == len(channels) - 1 and i > 0 else 1
        x = _conv_bn(b, x, c, co, f"block{i}", stride=stride, conv_bias=i % 2 == 0)
        x = b.op("Relu", [x], f"block{i}_relu")
        if i == 0:
            x = b.op("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
        c = co
    x = b.op("GlobalAveragePool", [x], "gap")
    x = b.op("Flatten", [x], "flat", axis=1)
    y = b.op("Gemm", [x, b.weight("fc_weight", [num_classes, c], c), b.bias("fc_bias", num_classes)],
             "fc", transB=1)
    b.output(y, "logits", TensorProto.FLOAT, [batch, num_classes])
    return b.model()


def residual_block(*, batch: Dim = 1, channels: int = 16, size: int = 16, projection: bool = False,
                   out_channels: int | None = None, stride: int | None = None,
                   seed: int = 0) -> onnx.ModelProto:
    """ResNet basic block: Conv-BN-Relu-Conv-BN plus the shortcut, Add, Relu.

    The shortcut is the identity, or with ``projection`` a strided 1x1 Conv + BN (then the defaults are
    twice the channels and stride 2). x [batch, channels, size, size] -> y [batch, out, size/stride, ...].
    """
    if out_channels is None:
        out_channels = 2 * channels if projection else channels
    if stride is None:
        stride = 2 if projection else 1
    if not projection and (out_channels != channels or stride != 1):
        raise ValueError("an identity shortcut needs out_channels == channels and stride 1")
    b = _Builder("residual_block_proj" if projection else "residual_block", seed=seed)
    x = b.input("x", TensorProto.FLOAT, [batch, channels, size, size])
    y = _conv_bn(b, x, channels, out_channels, "conv1", stride=stride)
    y = b.op("Relu", [y], "conv1_relu")
    y = _conv_bn(b, y, out_channels, out_channels, "conv2")
    shortcut = _conv_bn(b, x, channels, out_channels, "downsample", kernel=1, stride=stride) \
        if projection else x
    y = b.op("Add", [y, shortcut], "residual")
    y = b.op("Relu", [y], "out_relu")
    out_size = (size - 1) // stride + 1
    b.output(y, "y", TensorProto.FLOAT, [batch, out_channels, out_size, out_size])
    return b.model()


def depthwise_separable_block(*, batch: Dim = 1, channels: int = 16, out_channels: int = 32, size: int = 16,
                              stride: int = 1, seed: int = 0) -> onnx.ModelProto:
    """MobileNet block: depthwise 3x3 Conv (group=channels) + BN + Relu6 (Clip with min/max inputs),
    then pointwise 1x1 Conv + BN + Relu. x [batch, C, size, size] -> y [batch, out, size/stride, ...]."""
    b = _Builder("depthwise_separable_block", seed=seed)
    x = b.input("x", TensorProto.FLOAT, [batch, channels, size, size])
    y = _conv_bn(b, x, channels, channels, "dw", stride=stride, group=channels)
    y = b.op("Clip", [y, b.scalar("relu6_min", 0.0), b.scalar("relu6_max", 6.0)], "dw_relu6")
    y = _conv_bn(b, y, channels, out_channels, "pw", kernel=1)
    y = b.op("Relu", [y], "pw_relu")
    out_size = (size - 1) // stride + 1
    b.output(y, "y", TensorProto.FLOAT, [batch, out_channels, out_size, out_size])
    return b.model()


def attention_block(*, batch: Dim = 2, seq: int = 8, d_model: int = 32, heads: int = 4,
                    seed: int = 0) -> onnx.ModelProto:
    """Multi-head self-attention: x [batch, seq, d_model] and an additive float mask [batch, 1, 1, seq]
    -> y [batch, seq, d_model]. Q/K/V MatMul+Add, Reshape [0, 0, H, dh] + Transpose into heads,
    Q.K^T, Mul by 1/sqrt(dh), Add mask, Softmax, MatMul V, Transpose + Reshape back, output Linear."""
    b = _Builder("attention_block", seed=seed)
    x = b.input("x", TensorProto.FLOAT, [batch, seq, d_model])
    mask = b.input("mask", TensorProto.FLOAT, [batch, 1, 1, seq])
    y = _attention(b, x, mask, d_model, heads, "attn", shape_idiom=False)
    b.output(y, "y", TensorProto.FLOAT, [batch, seq, d_model])
    return b.model()


def layernorm_primitive(*, batch: Dim = 2, seq: int = 8, hidden: int = 32, eps: float = 1e-5,
                        opset: int = DEFAULT_OPSET, seed: int = 0) -> onnx.ModelProto:
    """x [batch, seq, hidden] -> LayerNorm over the last axis as primitive ops: ReduceMean, Sub, Pow(2),
    ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta (initializers "ln_gamma", "ln_beta")."""
    b = _Builder("layernorm_primitive", seed=seed, opset=opset)
    x = b.input("x", TensorProto.FLOAT, [batch, seq, hidden])
    y = _layernorm(b, x, hidden, eps, "ln")
    b.output(y, "y", TensorProto.FLOAT, [batch, seq, hidden])
    return b.model()


def gelu_erf(*, shape: Sequence[Dim] = (2, 8, 32)) -> onnx.ModelProto:
    """x -> x * 0.5 * (1 + Erf(x / sqrt(2))) as primitive ops; same shape out."""
    b = _Builder("gelu_erf")
    x = b.input("x", TensorProto.FLOAT, shape)
    b.output(_gelu_erf(b, x, "gelu"), "y", TensorProto.FLOAT, shape)
    return b.model()


def gelu_tanh(*, shape: Sequence[Dim] = (2, 8, 32)) -> onnx.ModelProto:
    """x -> 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) as primitive ops; same shape out."""
    b = _Builder("gelu_tanh")
    x = b.input("x", TensorProto.FLOAT, shape)
    b.output(_gelu_tanh(b, x, "gelu"), "y", TensorProto.FLOAT, shape)
    return b.model()


def transformer_encoder_block(*, batch: Dim = 2, seq: int = 16, vocab: int = 100, d_model: int = 32,
                              heads: int = 4, ffn: int = 64, eps: float = 1e-5, mask_style: str = "arith",
                              opset: int = DEFAULT_OPSET, seed: int = 0, layers: int = 1) -> onnx.ModelProto:
    """A BERT-style embedding + ``layers`` post-LN encoder layers (BERT-base: d_model 768, heads 12, ffn 3072,
    layers 12).

    input_ids int64 [batch, seq] and attention_mask int64 [batch, seq] (1 = token, 0 = padding)
    -> hidden float [batch, seq, d_model].

    Word embedding Gather + position embedding Gather (constant position ids) + Add, primitive
    LayerNorm; the mask becomes additive: ``mask_style="arith"`` is (1 - mask) * -10000 Unsqueezed to
    [batch, 1, 1, seq], ``"where"`` is Where(mask, 0, float32 min); attention with the Shape -> Gather ->
    Unsqueeze -> Concat -> Reshape head split; Add + LayerNorm; FFN Linear -> erf GELU -> Linear;
    Add + LayerNorm.
    """
    if mask_style not in ("arith", "where"):
        raise ValueError(f"mask_style must be 'arith' or 'where', not {mask_style!r}")
    b = _Builder("transformer_encoder_block", seed=seed, opset=opset)
    ids = b.input("input_ids", TensorProto.INT64, [batch, seq])
    am = b.input("attention_mask", TensorProto.INT64, [batch, seq])

    words = b.init("word_embeddings", b.rng.standard_normal((vocab, d_model)).astype(np.float32))
    positions = b.init("position_embeddings", b.rng.standard_normal((seq, d_model)).astype(np.float32))
    position_ids = b.init("position_ids", np.arange(seq, dtype=np.int64)[None, :])
    emb = b.op("Gather", [words, ids], "word_emb", axis=0)
    pos = b.op("Gather", [positions, position_ids], "pos_emb", axis=0)
    emb = b.op("Add", [emb, pos], "emb")
    h = _layernorm(b, emb, d_model, eps, "emb_ln")

    mask_axes = b.ints("mask_axes", [1, 2])
    if mask_style == "arith":
        m = b.op("Cast", [am], "mask_float", to=TensorProto.FLOAT)
        m = b.op("Sub", [b.scalar("mask_one", 1.0), m], "mask_inverted")
        m = b.op("Mul", [m, b.scalar("mask_fill", -10000.0)], "mask_additive")
        m = b.op("Unsqueeze", [m, mask_axes], "mask_4d")
    else:
        keep = b.op("Cast", [am], "mask_bool", to=TensorProto.BOOL)
        keep = b.op("Unsqueeze", [keep, mask_axes], "mask_4d_bool")
        m = b.op("Where", [keep, b.scalar("mask_zero", 0.0),
                           b.scalar("mask_min", float(np.finfo(np.float32).min))], "mask_4d")

    for layer in range(layers):
        p = f"l{layer}_" if layer else ""  # (one layer: the names it always had)
        a = _attention(b, h, m, d_model, heads, f"{p}attn", shape_idiom=True)
        h = _layernorm(b, b.op("Add", [h, a], f"{p}attn_residual"), d_model, eps, f"{p}attn_ln")
        f = _linear(b, h, d_model, ffn, f"{p}ffn_in")
        f = _gelu_erf(b, f, f"{p}ffn_gelu")
        f = _linear(b, f, ffn, d_model, f"{p}ffn_out")
        h = _layernorm(b, b.op("Add", [h, f], f"{p}ffn_residual"), d_model, eps, f"{p}ffn_ln")
    b.output(h, "hidden", TensorProto.FLOAT, [batch, seq, d_model])
    return b.model()


KIT_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "mlp": mlp,
    "mlp_gemm": partial(mlp, gemm_layer=True),
    "conv_bn_relu": conv_bn_relu_stack,
    "residual": residual_block,
    "residual_proj": partial(residual_block, projection=True),
    "depthwise_separable": depthwise_separable_block,
    "attention": attention_block,
    "layernorm": layernorm_primitive,
    "layernorm_opset18": partial(layernorm_primitive, opset=18),
    "gelu_erf": gelu_erf,
    "gelu_tanh": gelu_tanh,
    "transformer_encoder": transformer_encoder_block,
    "transformer_encoder_where": partial(transformer_encoder_block, mask_style="where", opset=18),
}
