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
- The real-size builders (``mobilenet_v2``, ``mobilenet_v3_small``, ``efficientnet_b0``, ``resnet18``,
  ``shufflenet_v2``, ``squeezenet``, ``convnext_block_stack``, ``deeplabv3_head``) are the torchvision
  architectures layer for layer at batch 1 and 224x224, with full-size weights (their parameter counts,
  BatchNormalization statistics excluded, equal torchvision's); they are not in ``KIT_MODELS`` (up to
  16M parameters and 24 GFLOP).
- The real-size transformers (``gpt2_decoder_stack``: GPT-2 small, ``vit_b16``: ViT-B/16) are batch 1,
  built as torch.onnx's TorchScript exporter shapes Hugging Face's GPT-2 and torchvision's ViT (opset 17
  LayerNormalization, one fused QKV projection, constant head shapes), with weights ~ N(0, 0.02^2) as
  Hugging Face initializes them; they are not in ``KIT_MODELS`` (86M parameters, 22 and 35 GFLOP).
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
    "convnext_block_stack",
    "deeplabv3_head",
    "depthwise_separable_block",
    "efficientnet_b0",
    "gelu_erf",
    "gelu_tanh",
    "gpt2_decoder_stack",
    "layernorm_primitive",
    "mlp",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "residual_block",
    "resnet18",
    "shufflenet_v2",
    "squeezenet",
    "transformer_encoder_block",
    "vit_b16",
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
        self._shared: dict[tuple[str, float], str] = {}

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

    def weight(self, base: str, shape: Sequence[int], fan_in: int, gain: float = 1.0) -> str:
        """Normal with std gain / sqrt(fan_in) (gain sqrt(2): He-normal, for a weight followed by a
        rectifier-like activation)."""
        w = self.rng.standard_normal(tuple(shape)).astype(np.float32) / np.float32(math.sqrt(fan_in))
        if gain != 1.0:
            w = w * np.float32(gain)
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

    def shared_scalar(self, base: str, value: float) -> str:
        """Like ``scalar``, but one Constant node per (base, value) for the whole graph."""
        key = (base, float(value))
        if key not in self._shared:
            self._shared[key] = self.scalar(base, value)
        return self._shared[key]

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


def _conv(b: _Builder, x: str, c_in: int, c_out: int, base: str, *, kernel: int = 3, stride: int = 1,
          group: int = 1, dilation: int = 1, pad: int | None = None, bias: bool = False,
          gain: float = 1.0) -> str:
    """Conv with a [c_out, c_in/group, k, k] weight (std gain/sqrt(fan_in)) and an optional bias; the
    padding defaults to dilation * (kernel // 2) on every side (PyTorch's "same" for odd kernels)."""
    if pad is None:
        pad = dilation * (kernel // 2)
    fan_in = (c_in // group) * kernel * kernel
    inputs = [x, b.weight(f"{base}_weight", [c_out, c_in // group, kernel, kernel], fan_in, gain)]
    if bias:
        inputs.append(b.bias(f"{base}_bias", c_out))
    attrs = {"dilations": [dilation, dilation]} if dilation != 1 else {}
    return b.op("Conv", inputs, f"{base}_conv", kernel_shape=[kernel, kernel], pads=[pad] * 4,
                strides=[stride, stride], group=group, **attrs)


def _bn(b: _Builder, x: str, c: int, base: str, *, eps: float = 1e-5) -> str:
    """Inference BatchNormalization: scale and variance in [0.5, 1.5], bias and mean ~ N(0, 0.1^2)."""
    bn = [b.around_one(f"{base}_bn_scale", c), b.bias(f"{base}_bn_bias", c), b.bias(f"{base}_bn_mean", c),
          b.init(f"{base}_bn_var", b.rng.uniform(0.5, 1.5, c).astype(np.float32))]
    return b.op("BatchNormalization", [x, *bn], f"{base}_bn", epsilon=eps)


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, base: str, *, kernel: int = 3, stride: int = 1,
             group: int = 1, conv_bias: bool = False, dilation: int = 1, eps: float = 1e-5,
             gain: float = 1.0) -> str:
    y = _conv(b, x, c_in, c_out, base, kernel=kernel, stride=stride, group=group, dilation=dilation,
              bias=conv_bias, gain=gain)
    return _bn(b, y, c_out, base, eps=eps)


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


# ------------------------------------------------------------------------ transformers at real sizes
#
# GPT-2 and ViT as the TorchScript exporter (torch.onnx, opset 17) shapes Hugging Face's eager GPT-2 and
# torchvision's ViT at batch 1: LayerNormalization nodes, one fused QKV projection Split three ways,
# constant head-split shapes. Weights as Hugging Face initializes them: normal with std 0.02 (biases too,
# so that no Add of zeros is left for a compiler to delete), LayerNorm weight 1 and bias 0.

_INIT_STD = 0.02


def _normal(b: _Builder, base: str, shape: Sequence[int], std: float = _INIT_STD) -> str:
    """An initializer drawn from N(0, std^2), float32."""
    return b.init(base, b.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std))


def _linear_normal(b: _Builder, x: str, d_in: int, d_out: int, base: str, std: float = _INIT_STD) -> str:
    """MatMul by a [d_in, d_out] weight ~ N(0, std^2), then Add of a [d_out] bias ~ N(0, 0.02^2)."""
    y = b.op("MatMul", [x, _normal(b, f"{base}_weight", [d_in, d_out], std)], f"{base}_matmul")
    return b.op("Add", [y, _normal(b, f"{base}_bias", [d_out])], f"{base}_out")


def _layer_norm_unit(b: _Builder, x: str, c: int, eps: float, base: str) -> str:
    """LayerNormalization over the last axis with weight 1 and bias 0 (as freshly initialized)."""
    return b.op("LayerNormalization", [x, b.init(f"{base}_weight", np.ones(c, np.float32)),
                                       b.init(f"{base}_bias", np.zeros(c, np.float32))], base,
                axis=-1, epsilon=eps)


def _fused_qkv_attention(b: _Builder, x: str, seq: int, d_model: int, heads: int, base: str, *, scale: str,
                         causal: str | None = None, out_std: float = _INIT_STD) -> str:
    """Self-attention on x [1, seq, d_model] with one [d, 3d] input projection.

    MatMul + Add to 3d -> Split [d, d, d] (axis -1) -> per part Reshape [1, seq, heads, dh] (a constant
    shape) -> Transpose (0, 2, 1, 3) for q and v, (0, 2, 3, 1) for k (the exporter fuses K's transpose for
    the product into the head transpose) -> [``scale="query"``: Mul q by 1/sqrt(dh)] -> MatMul(q, kT) ->
    [``scale="scores"``: Div by sqrt(dh)] -> [with ``causal`` (bool [1, 1, seq, seq]): Where(causal, scores,
    float32 min)] -> Softmax(axis -1) -> MatMul(p, v) -> Transpose (0, 2, 1, 3) -> Reshape [1, seq, d] ->
    MatMul + Add (weight std ``out_std``).
    """
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
    if scale not in ("query", "scores"):
        raise ValueError(f"scale must be 'query' or 'scores', not {scale!r}")
    dh = d_model // heads
    qkv = _linear_normal(b, x, d_model, 3 * d_model, f"{base}_qkv")
    b.op("Split", [qkv, b.ints(f"{base}_split_sizes", [d_model] * 3)], f"{base}_split", n_out=3, axis=-1)
    q, k, v = b.nodes[-1].output
    split_shape = b.ints(f"{base}_split_shape", [1, seq, heads, dh])

    def heads_of(t: str, name: str, perm: list[int]) -> str:
        t = b.op("Reshape", [t, split_shape], f"{base}_{name}_heads")
        return b.op("Transpose", [t], f"{base}_{name}_t", perm=perm)

    q = heads_of(q, "q", [0, 2, 1, 3])  # [1, H, S, dh]
    kt = heads_of(k, "k", [0, 2, 3, 1])  # [1, H, dh, S]
    v = heads_of(v, "v", [0, 2, 1, 3])  # [1, H, S, dh]
    if scale == "query":
        q = b.op("Mul", [q, b.scalar(f"{base}_scale", 1.0 / math.sqrt(dh))], f"{base}_q_scaled")
    scores = b.op("MatMul", [q, kt], f"{base}_scores")
    if scale == "scores":
        scores = b.op("Div", [scores, b.scalar(f"{base}_scale", math.sqrt(dh))], f"{base}_scaled")
    if causal is not None:
        scores = b.op("Where", [causal, scores, b.scalar(f"{base}_mask_value", float(np.finfo(np.float32).min))],
                      f"{base}_masked")
    probs = b.op("Softmax", [scores], f"{base}_probs", axis=-1)
    ctx = b.op("MatMul", [probs, v], f"{base}_context")
    ctx = b.op("Transpose", [ctx], f"{base}_context_t", perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.ints(f"{base}_merge_shape", [1, seq, d_model])], f"{base}_merged")
    return _linear_normal(b, ctx, d_model, d_model, f"{base}_proj", out_std)


def gpt2_decoder_stack(*, seq: int = 128, d_model: int = 768, heads: int = 12, layers: int = 12, vocab: int = 1000,
                       positions: int = 1024, eps: float = 1e-5, seed: int = 0) -> onnx.ModelProto:
    """GPT-2 small (Hugging Face's eager GPT2Model, no past key/values), batch 1: input_ids int64 [1, seq]
    -> hidden float [1, seq, d_model]. 86.6M parameters at the defaults (GPT-2's 124M less the 50257-token
    vocabulary, here ``vocab`` 1000); 22.3 GFLOP at seq 128.

    Token embedding Gather (wte [vocab, d]) + position embedding Gather (wpe [positions, d], constant ids
    [1, seq]) + Add; per layer (pre-LN): LayerNormalization; attention as ``_fused_qkv_attention`` with the
    scores Div by sqrt(dh) and the causal mask Where(tril bool constant [1, 1, seq, seq] shared by the
    layers, scores, float32 min); Add (attention, residual); LayerNormalization; MatMul + Add to 4d;
    GELU "gelu_new" as primitive ops (Pow 3, Mul 0.044715, Add, Mul sqrt(2/pi), Tanh, Add 1, Mul 0.5 x,
    Mul); MatMul + Add back to d; Add (residual, MLP). Final LayerNormalization. Epsilon 1e-5. Weights
    N(0, 0.02^2), the two c_proj weights of a layer N(0, (0.02 / sqrt(2 layers))^2), as Hugging Face
    initializes GPT-2.

    Where torch.onnx's TorchScript export of the real model differs (equivalent arithmetic): each Conv1D
    is Reshape [-1, d] -> Gemm -> Reshape; Split has axis 2; the sqrt(dh) divisor is computed by
    Pow/ConstantOfShape/Add; no-op Casts surround the Where and follow the Softmax.
    """
    if seq > positions:
        raise ValueError(f"seq {seq} is longer than the {positions} positions")
    b = _Builder("gpt2_decoder_stack", seed=seed)
    ids = b.input("input_ids", TensorProto.INT64, [1, seq])
    tok = b.op("Gather", [_normal(b, "wte", [vocab, d_model]), ids], "wte_emb", axis=0)
    position_ids = b.init("position_ids", np.arange(seq, dtype=np.int64)[None, :])
    pos = b.op("Gather", [_normal(b, "wpe", [positions, d_model]), position_ids], "wpe_emb", axis=0)
    h = b.op("Add", [tok, pos], "emb")
    causal = b.init("causal_mask", np.tril(np.ones((seq, seq), dtype=bool))[None, None])
    proj_std = _INIT_STD / math.sqrt(2 * layers)
    for i in range(layers):
        p = f"h{i}"
        a = _layer_norm_unit(b, h, d_model, eps, f"{p}_ln_1")
        a = _fused_qkv_attention(b, a, seq, d_model, heads, f"{p}_attn", scale="scores", causal=causal,
                                 out_std=proj_std)
        h = b.op("Add", [a, h], f"{p}_residual_attn")
        m = _layer_norm_unit(b, h, d_model, eps, f"{p}_ln_2")
        m = _linear_normal(b, m, d_model, 4 * d_model, f"{p}_mlp_c_fc")
        m = _gelu_tanh(b, m, f"{p}_mlp_act")
        m = _linear_normal(b, m, 4 * d_model, d_model, f"{p}_mlp_c_proj", proj_std)
        h = b.op("Add", [h, m], f"{p}_residual_mlp")
    h = _layer_norm_unit(b, h, d_model, eps, "ln_f")
    b.output(h, "hidden", TensorProto.FLOAT, [1, seq, d_model])
    return b.model()


def vit_b16(*, image: int = 224, patch: int = 16, d_model: int = 768, heads: int = 12, layers: int = 12,
            mlp: int = 3072, classes: int = 1000, eps: float = 1e-6, seed: int = 0) -> onnx.ModelProto:
    """ViT-B/16 (torchvision's vit_b_16, 86.57M parameters; 35.1 GFLOP at 224x224), batch 1: pixels float
    [1, 3, image, image] -> logits [1, classes].

    Patch embedding Conv (patch x patch, stride patch, bias) to d_model -> Reshape [1, d, n] (n =
    (image / patch)^2) -> Transpose (0, 2, 1) -> Concat(class token [1, 1, d], patches) on axis 1 -> Add
    position embedding [1, n + 1, d]; per layer (pre-LN): LayerNormalization; attention as
    ``_fused_qkv_attention`` with q scaled by a Mul by 1/sqrt(dh) before the product (where the exported
    scaled_dot_product_attention scales; the scores are not divided) and no mask; Add (attention, input);
    LayerNormalization; MatMul + Add to ``mlp``; GELU (Erf form: Div sqrt(2), Erf, Add 1, Mul x, Mul 0.5);
    MatMul + Add back; Add (x, MLP). Final LayerNormalization (epsilon 1e-6 throughout), Gather index 0 on
    axis 1 (the class token) -> [1, d], MatMul + Add to ``classes``. Conv weight N(0, 1/fan_in) (as
    torchvision), everything else N(0, 0.02^2), LayerNorm weight 1 and bias 0.

    Where torch.onnx's TorchScript export of nn.MultiheadAttention differs (equivalent arithmetic): it
    transposes to sequence-first around the attention, splits the in-projection by Reshape -> Unsqueeze
    -> Transpose -> Squeeze -> Gather, computes the scale from Shape/Sqrt, multiplies q and kT each by
    sqrt(scale), and the 2-D classifier Linear is a Gemm (transB 1).
    """
    if image % patch:
        raise ValueError(f"image {image} is not a multiple of patch {patch}")
    n = (image // patch) ** 2
    b = _Builder("vit_b16", seed=seed)
    x = b.input("pixels", TensorProto.FLOAT, [1, 3, image, image])
    w = _normal(b, "conv_proj_weight", [d_model, 3, patch, patch], 1.0 / math.sqrt(3 * patch * patch))
    x = b.op("Conv", [x, w, _normal(b, "conv_proj_bias", [d_model])], "conv_proj", dilations=[1, 1], group=1,
             kernel_shape=[patch, patch], pads=[0, 0, 0, 0], strides=[patch, patch])
    x = b.op("Reshape", [x, b.ints("patches_shape", [1, d_model, n])], "patches")
    x = b.op("Transpose", [x], "patches_t", perm=[0, 2, 1])
    x = b.op("Concat", [_normal(b, "class_token", [1, 1, d_model]), x], "tokens", axis=1)
    x = b.op("Add", [x, _normal(b, "pos_embedding", [1, n + 1, d_model])], "embedded")
    for i in range(layers):
        p = f"encoder_layer_{i}"
        y = _layer_norm_unit(b, x, d_model, eps, f"{p}_ln_1")
        y = _fused_qkv_attention(b, y, n + 1, d_model, heads, f"{p}_self_attention", scale="query")
        x = b.op("Add", [y, x], f"{p}_residual_attn")
        y = _layer_norm_unit(b, x, d_model, eps, f"{p}_ln_2")
        y = _gelu_erf(b, _linear_normal(b, y, d_model, mlp, f"{p}_mlp_0"), f"{p}_mlp_gelu")
        y = _linear_normal(b, y, mlp, d_model, f"{p}_mlp_3")
        x = b.op("Add", [x, y], f"{p}_residual_mlp")
    x = _layer_norm_unit(b, x, d_model, eps, "encoder_ln")
    x = b.op("Gather", [x, b.scalar("class_index", 0, np.int64)], "class_token_out", axis=1)
    b.output(_linear_normal(b, x, d_model, classes, "heads_head"), "logits", TensorProto.FLOAT, [1, classes])
    return b.model()


# --------------------------------------------------------------- real architectures at real sizes
#
# Published ImageNet/segmentation architectures layer for layer (the torchvision definitions), for
# benchmarks: batch 1, 224x224 images, full-size seeded weights (He-normal: std sqrt(2/fan_in) for a
# weight followed by a rectifier-like activation, 1/sqrt(fan_in) otherwise), BatchNormalization kept
# as nodes. Parameter counts (BN running statistics excluded) equal torchvision's published ones.
# These are not in ``KIT_MODELS`` (they take seconds, not milliseconds, to run).

_HE = math.sqrt(2.0)


def _activate(b: _Builder, x: str, act: str, base: str) -> str:
    """``act``: "relu", "relu6" (Clip with Constant bounds 0 and 6, shared by the graph), "hardswish"
    (HardSwish), "silu" (x * Sigmoid(x)) or "none"."""
    if act == "none":
        return x
    if act == "relu":
        return b.op("Relu", [x], f"{base}_relu")
    if act == "relu6":
        return b.op("Clip", [x, b.shared_scalar("relu6_min", 0.0), b.shared_scalar("relu6_max", 6.0)],
                    f"{base}_relu6")
    if act == "hardswish":
        return b.op("HardSwish", [x], f"{base}_hswish")
    if act == "silu":
        return b.op("Mul", [x, b.op("Sigmoid", [x], f"{base}_sigmoid")], f"{base}_silu")
    raise ValueError(f"unknown activation {act!r}")


def _conv_bn_act(b: _Builder, x: str, c_in: int, c_out: int, base: str, act: str, *, kernel: int = 3,
                 stride: int = 1, group: int = 1, dilation: int = 1, eps: float = 1e-5) -> str:
    """Conv (no bias) + BatchNormalization + activation: torchvision's Conv2dNormActivation."""
    y = _conv_bn(b, x, c_in, c_out, base, kernel=kernel, stride=stride, group=group, dilation=dilation,
                 eps=eps, gain=1.0 if act == "none" else _HE)
    return _activate(b, y, act, base)


def _squeeze_excite(b: _Builder, x: str, c: int, squeeze: int, base: str, *, act: str, gate: str) -> str:
    """torchvision's SqueezeExcitation: GlobalAveragePool -> 1x1 Conv (bias) to ``squeeze`` -> ``act``
    -> 1x1 Conv (bias) back to ``c`` -> ``gate`` ("hardsigmoid": HardSigmoid alpha 1/6, beta 0.5, as
    PyTorch's; or "sigmoid") -> Mul by x."""
    s = b.op("GlobalAveragePool", [x], f"{base}_pool")
    s = _conv(b, s, c, squeeze, f"{base}_fc1", kernel=1, bias=True, gain=_HE)
    s = _activate(b, s, act, f"{base}_fc1")
    s = _conv(b, s, squeeze, c, f"{base}_fc2", kernel=1, bias=True)
    if gate == "hardsigmoid":
        s = b.op("HardSigmoid", [s], f"{base}_gate", alpha=1.0 / 6.0, beta=0.5)
    elif gate == "sigmoid":
        s = b.op("Sigmoid", [s], f"{base}_gate")
    else:
        raise ValueError(f"unknown gate {gate!r}")
    return b.op("Mul", [s, x], f"{base}_scale")


def _gemm(b: _Builder, x: str, c_in: int, c_out: int, base: str, gain: float = 1.0) -> str:
    """Gemm by a [c_out, c_in] weight (transB=1) plus a bias: the exporters' Linear on a 2-D input."""
    w = b.weight(f"{base}_weight", [c_out, c_in], c_in, gain)
    return b.op("Gemm", [x, w, b.bias(f"{base}_bias", c_out)], base, transB=1)


def _pooled_classifier(b: _Builder, x: str, c: int, num_classes: int, batch: Dim) -> None:
    """GlobalAveragePool -> Flatten -> Gemm -> graph output "logits" [batch, num_classes]."""
    x = b.op("GlobalAveragePool", [x], "gap")
    x = b.op("Flatten", [x], "flat", axis=1)
    b.output(_gemm(b, x, c, num_classes, "fc"), "logits", TensorProto.FLOAT, [batch, num_classes])


def _image(b: _Builder, batch: Dim, size: int) -> str:
    return b.input("image", TensorProto.FLOAT, [batch, 3, size, size])


def _down(size: int, stride: int) -> int:
    """Output size of a "same"-padded odd kernel (or a 3x3 pad-1 pool) with this stride."""
    return (size - 1) // stride + 1


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: the nearest multiple of ``divisor``, never below 90% of v."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


# (expand ratio t, out channels c, blocks n, first stride s): the MobileNetV2 paper's table 2
MOBILENET_V2_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                        (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(*, batch: Dim = 1, size: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (width 1.0; torchvision's, 3.50M parameters): image [batch, 3, size, size] -> logits
    [batch, num_classes].

    Stem 3x3/2 Conv to 32 + BN + ReLU6; the 17 inverted residual blocks of ``MOBILENET_V2_SETTING``:
    1x1 expand Conv (t x channels; absent for t = 1) + BN + ReLU6, 3x3 depthwise Conv (stride s in a
    stage's first block) + BN + ReLU6, 1x1 project Conv + BN (linear), Add of the input when the stride is
    1 and the channels match; 1x1 Conv to 1280 + BN + ReLU6; GlobalAveragePool, Flatten, Gemm. ReLU6 is
    Clip(x, 0, 6) with Constant bounds.
    """
    b = _Builder("mobilenet_v2", seed=seed)
    x = _conv_bn_act(b, _image(b, batch, size), 3, 32, "stem", "relu6", stride=2)
    c, i = 32, 0
    for t, co, n, s in MOBILENET_V2_SETTING:
        for j in range(n):
            stride, p, hidden = (s if j == 0 else 1), f"block{i}", c * t
            y = x if t == 1 else _conv_bn_act(b, x, c, hidden, f"{p}_expand", "relu6", kernel=1)
            y = _conv_bn_act(b, y, hidden, hidden, f"{p}_dw", "relu6", stride=stride, group=hidden)
            y = _conv_bn_act(b, y, hidden, co, f"{p}_project", "none", kernel=1)
            x = b.op("Add", [x, y], f"{p}_residual") if stride == 1 and c == co else y
            c, i = co, i + 1
    x = _conv_bn_act(b, x, c, 1280, "head", "relu6", kernel=1)
    _pooled_classifier(b, x, 1280, num_classes, batch)
    return b.model()


# (kernel, expanded channels, out channels, squeeze-and-excitation, activation, stride): the bneck rows of
# the MobileNetV3 paper's table 2 (Small), from 16 input channels
MOBILENET_V3_SMALL_SETTING = (
    (3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
    (5, 96, 40, True, "hardswish", 2), (5, 240, 40, True, "hardswish", 1), (5, 240, 40, True, "hardswish", 1),
    (5, 120, 48, True, "hardswish", 1), (5, 144, 48, True, "hardswish", 1), (5, 288, 96, True, "hardswish", 2),
    (5, 576, 96, True, "hardswish", 1), (5, 576, 96, True, "hardswish", 1))


def mobilenet_v3_small(*, batch: Dim = 1, size: int = 224, num_classes: int = 1000,
                       seed: int = 0) -> onnx.ModelProto:
    """MobileNetV3-Small (torchvision's, 2.54M parameters): image [batch, 3, size, size] -> logits
    [batch, num_classes].

    Stem 3x3/2 Conv to 16 + BN + HardSwish; the 11 bneck blocks of ``MOBILENET_V3_SMALL_SETTING``: 1x1
    expand Conv + BN + act (absent when the expansion equals the input), kxk depthwise Conv + BN + act,
    squeeze-and-excitation (GlobalAveragePool -> 1x1 Conv to make_divisible(expanded / 4, 8) -> Relu ->
    1x1 Conv -> HardSigmoid(alpha 1/6, beta 0.5) -> Mul), 1x1 project Conv + BN, residual Add at stride 1
    with equal channels; 1x1 Conv to 576 + BN + HardSwish; GlobalAveragePool, Flatten, Gemm to 1024,
    HardSwish, Gemm. BatchNormalization epsilon 1e-3, as torchvision's.
    """
    b = _Builder("mobilenet_v3_small", seed=seed)
    eps = 1e-3
    x = _conv_bn_act(b, _image(b, batch, size), 3, 16, "stem", "hardswish", stride=2, eps=eps)
    c = 16
    for i, (k, e, co, se, act, s) in enumerate(MOBILENET_V3_SMALL_SETTING):
        p = f"block{i}"
        y = x if e == c else _conv_bn_act(b, x, c, e, f"{p}_expand", act, kernel=1, eps=eps)
        y = _conv_bn_act(b, y, e, e, f"{p}_dw", act, kernel=k, stride=s, group=e, eps=eps)
        if se:
            y = _squeeze_excite(b, y, e, _make_divisible(e // 4), f"{p}_se", act="relu", gate="hardsigmoid")
        y = _conv_bn_act(b, y, e, co, f"{p}_project", "none", kernel=1, eps=eps)
        x = b.op("Add", [y, x], f"{p}_residual") if s == 1 and c == co else y
        c = co
    x = _conv_bn_act(b, x, c, 6 * c, "head", "hardswish", kernel=1, eps=eps)
    x = b.op("GlobalAveragePool", [x], "gap")
    x = b.op("Flatten", [x], "flat", axis=1)
    x = b.op("HardSwish", [_gemm(b, x, 6 * c, 1024, "fc1", gain=_HE)], "fc1_hswish")
    b.output(_gemm(b, x, 1024, num_classes, "fc2"), "logits", TensorProto.FLOAT, [batch, num_classes])
    return b.model()


# (expand ratio, kernel, first stride, out channels, blocks): the EfficientNet paper's table 1 (B0)
EFFICIENTNET_B0_SETTING = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                           (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))


def efficientnet_b0(*, batch: Dim = 1, size: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """EfficientNet-B0 (torchvision's, 5.29M parameters): image [batch, 3, size, size] -> logits
    [batch, num_classes].

    Stem 3x3/2 Conv to 32 + BN + SiLU; the 16 MBConv blocks of ``EFFICIENTNET_B0_SETTING``: 1x1 expand
    Conv + BN + SiLU (absent for ratio 1), kxk depthwise Conv + BN + SiLU, squeeze-and-excitation
    (GlobalAveragePool -> 1x1 Conv to max(1, block input channels / 4) -> SiLU -> 1x1 Conv -> Sigmoid ->
    Mul), 1x1 project Conv + BN, residual Add at stride 1 with equal channels (stochastic depth is the
    identity at inference); 1x1 Conv to 1280 + BN + SiLU; GlobalAveragePool, Flatten, Gemm. SiLU is
    x * Sigmoid(x).
    """
    b = _Builder("efficientnet_b0", seed=seed)
    x = _conv_bn_act(b, _image(b, batch, size), 3, 32, "stem", "silu", stride=2)
    c, i = 32, 0
    for t, k, s, co, n in EFFICIENTNET_B0_SETTING:
        for j in range(n):
            stride, p, e = (s if j == 0 else 1), f"block{i}", c * t
            y = x if e == c else _conv_bn_act(b, x, c, e, f"{p}_expand", "silu", kernel=1)
            y = _conv_bn_act(b, y, e, e, f"{p}_dw", "silu", kernel=k, stride=stride, group=e)
            y = _squeeze_excite(b, y, e, max(1, c // 4), f"{p}_se", act="silu", gate="sigmoid")
            y = _conv_bn_act(b, y, e, co, f"{p}_project", "none", kernel=1)
            x = b.op("Add", [y, x], f"{p}_residual") if stride == 1 and c == co else y
            c, i = co, i + 1
    x = _conv_bn_act(b, x, c, 1280, "head", "silu", kernel=1)
    _pooled_classifier(b, x, 1280, num_classes, batch)
    return b.model()


def resnet18(*, batch: Dim = 1, size: int = 224, num_classes: int = 1000, layers: Sequence[int] = (2, 2, 2, 2),
             seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 (torchvision's, 11.69M parameters; ``layers=(3, 4, 6, 3)`` is ResNet-34): image
    [batch, 3, size, size] -> logits [batch, num_classes].

    Stem 7x7/2 Conv to 64 + BN + Relu, 3x3/2 MaxPool (pad 1); four stages of BasicBlocks with 64, 128,
    256, 512 channels (``layers`` blocks each; stride 2 in the first block of stages 2-4): 3x3 Conv + BN
    + Relu, 3x3 Conv + BN, shortcut (identity, or 1x1 strided Conv + BN where the shape changes), Add,
    Relu; GlobalAveragePool, Flatten, Gemm.
    """
    if len(layers) != 4:
        raise ValueError(f"layers must have four stages, not {len(layers)}")
    b = _Builder("resnet18" if tuple(layers) == (2, 2, 2, 2) else "resnet", seed=seed)
    x = _conv_bn_act(b, _image(b, batch, size), 3, 64, "stem", "relu", kernel=7, stride=2)
    x = b.op("MaxPool", [x], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 64
    for stage, (co, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
        for j in range(n):
            stride, p = (2 if stage > 0 and j == 0 else 1), f"layer{stage + 1}_{j}"
            y = _conv_bn_act(b, x, c, co, f"{p}_conv1", "relu", stride=stride)
            y = _conv_bn(b, y, co, co, f"{p}_conv2")
            shortcut = x if stride == 1 and c == co else \
                _conv_bn(b, x, c, co, f"{p}_downsample", kernel=1, stride=stride)
            x = b.op("Relu", [b.op("Add", [y, shortcut], f"{p}_residual")], f"{p}_relu")
            c = co
    _pooled_classifier(b, x, c, num_classes, batch)
    return b.model()


def shufflenet_v2(*, batch: Dim = 1, size: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """ShuffleNetV2 x1.0 (torchvision's, 2.28M parameters): image [batch, 3, size, size] -> logits
    [batch, num_classes].

    Stem 3x3/2 Conv to 24 + BN + Relu, 3x3/2 MaxPool (pad 1); stages of 4, 8, 4 units with 116, 232, 464
    channels. A stage's first unit (stride 2) concatenates branch 1 (3x3/2 depthwise Conv + BN, 1x1 Conv
    + BN + Relu) and branch 2 (1x1 Conv + BN + Relu, 3x3/2 depthwise Conv + BN, 1x1 Conv + BN + Relu);
    the others Split the channels in halves (Split with a ``split`` input) and concatenate the first half
    with branch 2 (stride 1) of the second. Each unit ends in the channel shuffle Reshape [0, 2, C/2, H, W]
    -> Transpose [0, 2, 1, 3, 4] -> Reshape [0, C, H, W]. Then 1x1 Conv to 1024 + BN + Relu, ReduceMean
    over axes [2, 3] (keepdims 0; torchvision's ``x.mean([2, 3])``), Gemm.
    """
    b = _Builder("shufflenet_v2", seed=seed)
    x = _conv_bn_act(b, _image(b, batch, size), 3, 24, "stem", "relu", stride=2)
    x = b.op("MaxPool", [x], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c, hw = 24, _down(_down(size, 2), 2)

    def branch2(y: str, c_in: int, bf: int, stride: int, p: str) -> str:
        y = _conv_bn_act(b, y, c_in, bf, f"{p}_branch2_pw1", "relu", kernel=1)
        y = _conv_bn(b, y, bf, bf, f"{p}_branch2_dw", stride=stride, group=bf)
        return _conv_bn_act(b, y, bf, bf, f"{p}_branch2_pw2", "relu", kernel=1)

    for stage, (n, co) in enumerate(zip((4, 8, 4), (116, 232, 464), strict=True)):
        bf = co // 2
        for j in range(n):
            p = f"stage{stage + 2}_{j}"
            if j == 0:
                b1 = _conv_bn(b, x, c, c, f"{p}_branch1_dw", stride=2, group=c)
                b1 = _conv_bn_act(b, b1, c, bf, f"{p}_branch1_pw", "relu", kernel=1)
                y = b.op("Concat", [b1, branch2(x, c, bf, 2, p)], f"{p}_concat", axis=1)
                hw = _down(hw, 2)
            else:
                b.op("Split", [x, b.ints(f"{p}_split_sizes", [bf, bf])], f"{p}_split", n_out=2, axis=1)
                x1, x2 = b.nodes[-1].output
                y = b.op("Concat", [x1, branch2(x2, bf, bf, 1, p)], f"{p}_concat", axis=1)
            y = b.op("Reshape", [y, b.ints(f"{p}_shuffle_shape", [0, 2, bf, hw, hw])], f"{p}_shuffle_split")
            y = b.op("Transpose", [y], f"{p}_shuffle_t", perm=[0, 2, 1, 3, 4])
            x = b.op("Reshape", [y, b.ints(f"{p}_merge_shape", [0, co, hw, hw])], f"{p}_shuffle")
            c = co
    x = _conv_bn_act(b, x, c, 1024, "conv5", "relu", kernel=1)
    x = b.op("ReduceMean", [x], "mean", axes=[2, 3], keepdims=0)
    b.output(_gemm(b, x, 1024, num_classes, "fc"), "logits", TensorProto.FLOAT, [batch, num_classes])
    return b.model()


# (squeeze, expand 1x1, expand 3x3) per fire module, with "pool" for a 3x3/2 MaxPool (ceil_mode)
SQUEEZENET1_1_SETTING = ((16, 64, 64), (16, 64, 64), "pool", (32, 128, 128), (32, 128, 128), "pool",
                         (48, 192, 192), (48, 192, 192), (64, 256, 256), (64, 256, 256))


def squeezenet(*, batch: Dim = 1, size: int = 224, num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """SqueezeNet 1.1 (torchvision's squeezenet1_1, 1.24M parameters; no BatchNormalization): image
    [batch, 3, size, size] -> logits [batch, num_classes].

    3x3/2 Conv to 64 (no padding, bias) + Relu, 3x3/2 MaxPool (ceil_mode), then ``SQUEEZENET1_1_SETTING``:
    fire modules (1x1 squeeze Conv + Relu, then 1x1 and 3x3 expand Convs + Relu, Concat) and MaxPools;
    1x1 Conv to num_classes (bias) + Relu, GlobalAveragePool, Flatten.
    """
    b = _Builder("squeezenet", seed=seed)
    x = b.op("Relu", [_conv(b, _image(b, batch, size), 3, 64, "conv1", stride=2, pad=0, bias=True, gain=_HE)],
             "conv1_relu")
    c, f = 64, 0

    def pool(y: str, base: str) -> str:
        return b.op("MaxPool", [y], base, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)

    x = pool(x, "pool1")
    for i, row in enumerate(SQUEEZENET1_1_SETTING):
        if row == "pool":
            x = pool(x, f"pool{i + 2}")
            continue
        sq, e1, e3 = row
        p = f"fire{f + 2}"
        s = b.op("Relu", [_conv(b, x, c, sq, f"{p}_squeeze", kernel=1, bias=True, gain=_HE)], f"{p}_squeeze_relu")
        y1 = b.op("Relu", [_conv(b, s, sq, e1, f"{p}_expand1x1", kernel=1, bias=True, gain=_HE)], f"{p}_e1_relu")
        y3 = b.op("Relu", [_conv(b, s, sq, e3, f"{p}_expand3x3", bias=True, gain=_HE)], f"{p}_e3_relu")
        x = b.op("Concat", [y1, y3], f"{p}_concat", axis=1)
        c, f = e1 + e3, f + 1
    x = b.op("Relu", [_conv(b, x, c, num_classes, "classifier", kernel=1, bias=True, gain=_HE)], "classifier_relu")
    x = b.op("GlobalAveragePool", [x], "gap")
    b.output(b.op("Flatten", [x], "flat", axis=1), "logits", TensorProto.FLOAT, [batch, num_classes])
    return b.model()


def _layer_norm(b: _Builder, x: str, c: int, base: str, eps: float = 1e-6) -> str:
    """LayerNormalization over the last axis (gamma in [0.5, 1.5], beta ~ N(0, 0.1^2))."""
    return b.op("LayerNormalization", [x, b.around_one(f"{base}_gamma", c), b.bias(f"{base}_beta", c)], base,
                axis=-1, epsilon=eps)


def _layer_norm_2d(b: _Builder, x: str, c: int, base: str) -> str:
    """torchvision's LayerNorm2d: Transpose to NHWC, LayerNormalization over channels, Transpose back."""
    x = b.op("Transpose", [x], f"{base}_nhwc", perm=[0, 2, 3, 1])
    return b.op("Transpose", [_layer_norm(b, x, c, base)], f"{base}_nchw", perm=[0, 3, 1, 2])


def convnext_block_stack(*, batch: Dim = 1, size: int = 224, depths: Sequence[int] = (3, 3),
                         dims: Sequence[int] = (96, 192), num_classes: int = 1000, seed: int = 0) -> onnx.ModelProto:
    """The first two stages of ConvNeXt-T (1.43M parameters; ``depths=(3, 3, 9, 3), dims=(96, 192, 384,
    768)`` is the whole ConvNeXt-T, 28.6M): image [batch, 3, size, size] -> logits [batch, num_classes].

    Stem 4x4/4 Conv (bias) + LayerNorm2d; per stage (after the first, a downsample LayerNorm2d + 2x2/2
    Conv with bias) ``depths[s]`` blocks at ``dims[s]`` channels, as torchvision's CNBlock exports: 7x7
    depthwise Conv (bias), Transpose to NHWC, LayerNormalization (axis -1, epsilon 1e-6), MatMul + Add to
    4x the channels, GELU (the Erf form), MatMul + Add back, Transpose to NCHW, Mul by the layer scale
    [C, 1, 1] (drawn in [0.1, 1]), Add of the block input. LayerNorm2d is Transpose -> LayerNormalization
    -> Transpose. Head: GlobalAveragePool, Flatten, LayerNormalization, Gemm (torchvision normalizes the
    pooled [C, 1, 1] map before flattening: the same numbers).
    """
    if len(depths) != len(dims) or not depths:
        raise ValueError("depths and dims need the same, nonzero, number of stages")
    b = _Builder("convnext_block_stack", seed=seed)
    c = dims[0]
    x = _conv(b, _image(b, batch, size), 3, c, "stem", kernel=4, stride=4, pad=0, bias=True)
    x = _layer_norm_2d(b, x, c, "stem_ln")
    for s, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
        if s > 0:
            x = _layer_norm_2d(b, x, c, f"downsample{s}_ln")
            x = _conv(b, x, c, dim, f"downsample{s}", kernel=2, stride=2, pad=0, bias=True)
            c = dim
        for j in range(depth):
            p = f"stage{s}_{j}"
            y = _conv(b, x, c, c, f"{p}_dw", kernel=7, group=c, bias=True)
            y = b.op("Transpose", [y], f"{p}_nhwc", perm=[0, 2, 3, 1])
            y = _layer_norm(b, y, c, f"{p}_ln")
            y = _gelu_erf(b, _linear(b, y, c, 4 * c, f"{p}_fc1"), f"{p}_gelu")
            y = _linear(b, y, 4 * c, c, f"{p}_fc2")
            y = b.op("Transpose", [y], f"{p}_nchw", perm=[0, 3, 1, 2])
            scale = b.init(f"{p}_layer_scale", b.rng.uniform(0.1, 1.0, (c, 1, 1)).astype(np.float32))
            x = b.op("Add", [b.op("Mul", [scale, y], f"{p}_scaled"), x], f"{p}_residual")
    x = b.op("GlobalAveragePool", [x], "gap")
    x = _layer_norm(b, b.op("Flatten", [x], "flat", axis=1), c, "head_ln")
    b.output(_gemm(b, x, c, num_classes, "fc"), "logits", TensorProto.FLOAT, [batch, num_classes])
    return b.model()


def deeplabv3_head(*, batch: Dim = 1, in_channels: int = 2048, size: int = 28, num_classes: int = 21,
                   rates: Sequence[int] = (12, 24, 36), upsample: int = 8, seed: int = 0) -> onnx.ModelProto:
    """torchvision's DeepLabHead (ASPP) plus DeepLabV3's final upsampling (16.1M parameters), on the
    output-stride-8 backbone features of a 224x224 image: features [batch, in_channels, size, size] ->
    logits [batch, num_classes, size * upsample, size * upsample].

    ASPP: five branches of 256 channels, each Conv (no bias) + BN + Relu: a 1x1 Conv, one 3x3 Conv per
    dilation in ``rates`` (padding = dilation), and image pooling (GlobalAveragePool -> 1x1 Conv + BN +
    Relu -> Resize back to size x size); Concat; 1x1 Conv to 256 + BN + Relu (dropout: identity). Then a 3x3
    Conv + BN + Relu, a 1x1 Conv (bias) to num_classes, and Resize x upsample. Both Resizes are mode
    "linear", coordinate_transformation_mode "pytorch_half_pixel" (F.interpolate bilinear,
    align_corners=False) with ``scales`` inputs.
    """
    b = _Builder("deeplabv3_head", seed=seed)
    x = b.input("features", TensorProto.FLOAT, [batch, in_channels, size, size])

    def resize(y: str, factor: int, base: str) -> str:
        scales = b.init(f"{base}_scales", np.array([1, 1, factor, factor], np.float32))
        return b.op("Resize", [y, "", scales], base, mode="linear",
                    coordinate_transformation_mode="pytorch_half_pixel")

    branches = [_conv_bn_act(b, x, in_channels, 256, "aspp0", "relu", kernel=1)]
    for i, rate in enumerate(rates):
        branches.append(_conv_bn_act(b, x, in_channels, 256, f"aspp{i + 1}", "relu", dilation=rate))
    pooled = b.op("GlobalAveragePool", [x], "aspp_pool_gap")
    pooled = _conv_bn_act(b, pooled, in_channels, 256, "aspp_pool", "relu", kernel=1)
    branches.append(resize(pooled, size, "aspp_pool_resize"))
    y = b.op("Concat", branches, "aspp_concat", axis=1)
    y = _conv_bn_act(b, y, 256 * len(branches), 256, "aspp_project", "relu", kernel=1)
    y = _conv_bn_act(b, y, 256, 256, "head", "relu")
    y = _conv(b, y, 256, num_classes, "classifier", kernel=1, bias=True)
    out = size * upsample
    b.output(resize(y, upsample, "upsample"), "logits", TensorProto.FLOAT, [batch, num_classes, out, out])
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
