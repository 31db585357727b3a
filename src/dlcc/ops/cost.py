"""Per-node cost from shapes: FLOPs and bytes moved.

What goes in: an ``onnx_ir.Node`` whose input/output values carry static shapes (ints) and dtypes; run
shape inference first. What comes out: ``node_flops`` and ``node_bytes`` give an int, or None when a shape
the formula needs is unknown or symbolic (or the op's cost depends on data, like ROI pooling or control
flow). ``model_flops`` sums the top-level nodes and counts the ones it could not cost; the nodes inside
If/Loop/Scan bodies are not visited (the If/Loop/Scan node itself counts as unknown).

Conventions (the numbers are for comparing models and kernels, not for predicting time):
- A multiply-add is 2 FLOPs.
- Conv: ``2 * N * Cout * prod(out spatial) * (Cin / group) * prod(kernel)``, plus ``N * Cout * prod(out
  spatial)`` for the bias. ``Cin / group`` is the weight's dim 1, so group, strides, pads and dilations
  enter only through the shapes. ConvInteger, QLinearConv and DeformConv count the same (their
  zero-point, requantize and sampling arithmetic is not counted).
- ConvTranspose: every input pixel meets every weight of its group once:
  ``2 * N * Cin * prod(in spatial) * (Cout / group) * prod(kernel)`` (+ bias as for Conv).
- MatMul (and MatMulInteger, QLinearMatMul): ``2 * prod(broadcast batch) * M * N * K``; a 1-D operand
  has M = 1 or N = 1.
- Gemm: ``2 * M * N * K``, + ``M * N`` to add C, + ``M * N`` when alpha != 1, + ``M * N`` when beta != 1
  and C is given.
- Einsum: ``operands * prod(size of every index)`` (each point of the iteration space does
  operands - 1 multiplies and one add); one operand with summed indices counts one add per point.
- Elementwise ops: 1 per output element, whatever the op: Add, Relu and Exp count the same; a
  transcendental or a composite activation (Gelu, Mish, HardSwish) is 1, not its instruction count. Cast
  counts 1. Variadic Sum/Max/Min count ``(inputs - 1)`` per element and Mean one more for the divide.
  Identity and Dropout (inference) count 0.
- BatchNormalization: 2 per output element, the inference form after folding ``x * s + b``; the unfolded
  ``(x - mean) / sqrt(var + eps) * scale + bias`` would be 4.
- QuantizeLinear and DequantizeLinear: 2 per element (a scale and a zero point). DynamicQuantizeLinear:
  4 per element (min and max over the tensor, then the quantize).
- Reductions (Reduce*, ArgMax/ArgMin, global pooling): 1 per input element.
- Softmax and LogSoftmax: 5 per element (max, subtract, exp, sum, divide / subtract log). Hardmax: 1.
- Normalizations: LayerNormalization, InstanceNormalization and GroupNormalization 7 per element (sum
  for the mean, subtract, square-accumulate for the variance = 2, multiply by 1/std, scale and bias = 2);
  MeanVarianceNormalization 5 (no scale and bias); RMSNormalization 4; LpNormalization 3; LRN
  ``2 * size + 4``. CumSum/CumProd 1 per element. The com.microsoft skip-normalizations add 1 for the
  skip connection.
- Pooling (MaxPool, AveragePool, LpPool): output elements * prod(kernel_shape).
- Resize/Upsample/GridSample: nearest 0; linear ``2 * 2**r`` and cubic ``2 * 4**r`` per output element,
  where r is the number of interpolated axes.
- RNN/GRU/LSTM: per step, direction and batch row: the gate matmuls ``2 * G * H * (I + H)``, + ``2 * G * H``
  for the two biases, + ``G * H`` for the gate activations, + 4 (GRU) or 5 (LSTM) per hidden unit to
  combine the gates (G = 1, 3, 4 gates).
- Attention: the two matmuls plus 5 per score for the softmax; a past KV cache lengthens the keys.
- Data movement (Reshape, Transpose, Slice, Gather, Concat, Pad, Expand, Tile, ...; also Identity and
  Dropout), generators
  (ConstantOfShape, Range, EyeLike, OneHot) and metadata (Shape, Size, Constant): 0. Random generators
  count 1 per element. Scatters count 1 per update element when they reduce, else 0.

``node_bytes`` is the bytes read from the inputs plus the bytes written to the outputs, each distinct
value once (a kernel that reads ``x`` twice reads it from cache). Absent optional inputs and unnamed,
unused optional outputs are skipped; sub-byte types round up to whole bytes per tensor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import onnx_ir as ir

from dlcc.ops.attention import attention_attrs, attention_dims
from dlcc.ops.table import Kind, op_info

__all__ = ["model_flops", "node_bytes", "node_flops", "static_shape"]

Dims = tuple[int, ...]


# -------------------------------------------------------------------------------------------- shapes


def static_shape(value: ir.Value | None) -> Dims | None:
    """The value's shape as ints, or None when it is absent, of unknown rank or has a symbolic dim."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape)
    if all(isinstance(d, int) for d in dims):
        return dims
    return None


def _numel(dims: Dims) -> int:
    return math.prod(dims)


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _out_elements(node: ir.Node) -> int | None:
    dims = static_shape(node.outputs[0]) if node.outputs else None
    return None if dims is None else _numel(dims)


def _in_elements(node: ir.Node) -> int | None:
    dims = static_shape(_input(node, 0))
    return None if dims is None else _numel(dims)


def _broadcast(a: Dims, b: Dims) -> Dims:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    return tuple(y if x == 1 else x for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------------------------------- formulas


def _conv_like(weight_index: int, bias_index: int | None) -> Callable[[ir.Node], int | None]:
    def flops(node: ir.Node) -> int | None:
        w, y = static_shape(_input(node, weight_index)), static_shape(node.outputs[0])
        if w is None or y is None:
            return None
        n, c_out, spatial = y[0], y[1], _numel(y[2:])
        total = 2 * n * c_out * spatial * w[1] * _numel(w[2:])
        if bias_index is not None and _input(node, bias_index) is not None:
            total += n * c_out * spatial
        return total

    return flops


def _conv_transpose(node: ir.Node) -> int | None:
    x, w, y = (static_shape(_input(node, 0)), static_shape(_input(node, 1)), static_shape(node.outputs[0]))
    if x is None or w is None:
        return None
    total = 2 * x[0] * x[1] * _numel(x[2:]) * w[1] * _numel(w[2:])
    if _input(node, 2) is not None:
        if y is None:
            return None
        total += _numel(y)
    return total


def _matmul_like(a_index: int, b_index: int) -> Callable[[ir.Node], int | None]:
    def flops(node: ir.Node) -> int | None:
        a, b = static_shape(_input(node, a_index)), static_shape(_input(node, b_index))
        if a is None or b is None:
            return None
        k = a[-1]
        m = a[-2] if len(a) >= 2 else 1
        n = b[-1] if len(b) >= 2 else 1
        batch = _numel(_broadcast(a[:-2], b[:-2]))
        return 2 * batch * m * n * k

    return flops


def _gemm(node: ir.Node) -> int | None:
    a, b = static_shape(_input(node, 0)), static_shape(_input(node, 1))
    if a is None or b is None:
        return None
    attrs = node.attributes
    m, k = (a[1], a[0]) if attrs.get_int("transA", 0) else (a[0], a[1])
    n = b[0] if attrs.get_int("transB", 0) else b[1]
    total = 2 * m * n * k
    if attrs.get_float("alpha", 1.0) != 1.0:
        total += m * n
    if _input(node, 2) is not None:
        total += m * n
        if attrs.get_float("beta", 1.0) != 1.0:
            total += m * n
    return total


def _fused_matmul(node: ir.Node) -> int | None:
    """com.microsoft FusedMatMul: alpha * op(A) @ op(B); counted from the output shape."""
    a, y = static_shape(_input(node, 0)), static_shape(node.outputs[0])
    if a is None or y is None:
        return None
    k = a[-2] if node.attributes.get_int("transA", 0) and len(a) >= 2 else a[-1]
    total = 2 * _numel(y) * k
    if node.attributes.get_float("alpha", 1.0) != 1.0:
        total += _numel(y)
    return total


def _with_activation(base: Callable[[ir.Node], int | None]) -> Callable[[ir.Node], int | None]:
    """FusedConv / FusedGemm: the contraction plus one per output element for the activation."""

    def flops(node: ir.Node) -> int | None:
        core, out = base(node), _out_elements(node)
        return None if core is None or out is None else core + out

    return flops


def _einsum(node: ir.Node) -> int | None:
    equation = node.attributes.get_string("equation", "").replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    operands = [static_shape(v) for v in node.inputs]
    if len(terms) != len(operands) or any(o is None for o in operands):
        return None
    sizes: dict[str, int] = {}
    ellipsis: Dims = ()
    for term, dims in zip(terms, operands, strict=True):
        assert dims is not None
        if "..." in term:
            head, _, tail = term.partition("...")
            n_ell = len(dims) - len(head) - len(tail)
            ellipsis = _broadcast(ellipsis, dims[len(head):len(head) + n_ell])
            letters = head + tail
            dims = dims[:len(head)] + dims[len(head) + n_ell:]
        else:
            letters = term
        if len(letters) != len(dims):
            return None
        for letter, d in zip(letters, dims, strict=True):
            sizes[letter] = max(sizes.get(letter, 1), d)
    points = _numel(tuple(sizes.values())) * _numel(ellipsis)
    if len(operands) >= 2:
        return len(operands) * points
    letters = re.sub(r"[^A-Za-z]", "", terms[0])
    kept = set(rhs) if arrow else {c for c in letters if letters.count(c) == 1}
    return points if any(c not in kept for c in letters) else 0


def _per_output_element(count: int) -> Callable[[ir.Node], int | None]:
    def flops(node: ir.Node) -> int | None:
        out = _out_elements(node)
        return None if out is None else count * out

    return flops


def _per_input_element(node: ir.Node) -> int | None:
    return _in_elements(node)


def _zero(node: ir.Node) -> int | None:
    return 0


def _variadic(node: ir.Node) -> int | None:
    out = _out_elements(node)
    if out is None:
        return None
    n = sum(v is not None for v in node.inputs)
    return max(n - 1, 0) * out + (out if node.op_type == "Mean" and n > 1 else 0)


def _pool(node: ir.Node) -> int | None:
    out = _out_elements(node)
    kernel = node.attributes.get_ints("kernel_shape", None)
    if out is None or kernel is None:
        return None
    return out * _numel(tuple(kernel))


def _lrn(node: ir.Node) -> int | None:
    out = _out_elements(node)
    return None if out is None else out * (2 * node.attributes.get_int("size", 1) + 4)


def _interpolate(node: ir.Node) -> int | None:
    x, y = static_shape(_input(node, 0)), static_shape(node.outputs[0])
    if x is None or y is None:
        return None
    default_mode = "linear" if node.op_type == "GridSample" else "nearest"
    mode = node.attributes.get_string("mode", default_mode)
    if mode == "nearest":
        return 0
    # GridSample interpolates every spatial axis; Resize only the axes whose size changes
    grid = node.op_type == "GridSample"
    axes = len(x) - 2 if grid else sum(a != b for a, b in zip(x, y, strict=False))
    if axes < 0:
        return None
    taps = 4 if mode in ("cubic", "bicubic") else 2
    return _numel(y) * 2 * taps**axes


def _recurrent(gates: int, combine: int) -> Callable[[ir.Node], int | None]:
    def flops(node: ir.Node) -> int | None:
        x, w = static_shape(_input(node, 0)), static_shape(_input(node, 1))
        if x is None or w is None:
            return None
        seq, batch = (x[1], x[0]) if node.attributes.get_int("layout", 0) else (x[0], x[1])
        directions, gh, inputs = w
        hidden = gh // gates
        per_step = 2 * gh * (inputs + hidden) + gh + combine * hidden
        if _input(node, 3) is not None:
            per_step += 2 * gh
        return directions * seq * batch * per_step

    return flops


def _attention(node: ir.Node) -> int | None:
    q, k, v = (static_shape(_input(node, i)) for i in range(3))
    if q is None or k is None or v is None:
        return None
    past = static_shape(_input(node, 4)) if _input(node, 4) is not None else ()
    if past is None:
        return None
    if len(q) == 4:  # [B, heads, S, D]
        b, heads, s, d = q
        keys = k[2] + (past[2] if past else 0)
        return b * heads * s * keys * (2 * d + 5 + 2 * v[3])
    b, s, q_hidden = q  # [B, S, heads * D]
    q_heads = node.attributes.get_int("q_num_heads", 0)
    kv_heads = node.attributes.get_int("kv_num_heads", 0)
    if q_heads <= 0 or kv_heads <= 0:
        return None
    keys = k[1] + (past[2] if past else 0)
    y_hidden = v[2] // kv_heads * q_heads
    return b * s * keys * (2 * q_hidden + 5 * q_heads + 2 * y_hidden)


def _dlcc_attention(node: ir.Node) -> int | None:
    """dlcc::Attention: the two products and the softmax (as Attention's formula), shapes from its layout."""
    shapes = [static_shape(_input(node, i)) for i in range(3)]
    if any(s is None for s in shapes):
        return None
    heads, layout, head_size, offsets = attention_attrs(lambda n, dflt: node.attributes[n].value
                                                        if n in node.attributes else dflt)
    b, h, sq, sk, d = attention_dims(*shapes, heads, layout, head_size, offsets)
    return b * h * sq * sk * (4 * d + 5)


def _scatter(updates_index: int) -> Callable[[ir.Node], int | None]:
    def flops(node: ir.Node) -> int | None:
        if node.attributes.get_string("reduction", "none") == "none":
            return 0
        updates = static_shape(_input(node, updates_index))
        return None if updates is None else _numel(updates)

    return flops


def _not_estimated(node: ir.Node) -> int | None:
    return None


def _table(entries: dict[str, Callable[[ir.Node], int | None]]) -> dict[str, Callable]:
    """Expand space-separated op lists in the keys."""
    return {op: fn for ops, fn in entries.items() for op in ops.split()}


_DEFAULT = _table({
    "Conv": _conv_like(1, 2),
    "ConvInteger": _conv_like(1, None),
    "QLinearConv": _conv_like(3, 8),
    "DeformConv": _conv_like(1, 3),
    "ConvTranspose": _conv_transpose,
    "MatMul MatMulInteger": _matmul_like(0, 1),
    "QLinearMatMul": _matmul_like(0, 3),
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Sum Mean Max Min": _variadic,
    "Identity Dropout Expand Tile": _zero,
    "BatchNormalization QuantizeLinear DequantizeLinear": _per_output_element(2),
    "DynamicQuantizeLinear": _per_output_element(4),
    "Softmax LogSoftmax": _per_output_element(5),
    "Hardmax CumSum CumProd RandomNormal RandomUniform RandomNormalLike RandomUniformLike Bernoulli":
        _per_output_element(1),
    "LayerNormalization InstanceNormalization GroupNormalization": _per_output_element(7),
    "MeanVarianceNormalization": _per_output_element(5),
    "RMSNormalization": _per_output_element(4),
    "LpNormalization": _per_output_element(3),
    "SwiGLU": _per_output_element(3),
    "LRN": _lrn,
    "MaxPool AveragePool LpPool": _pool,
    "GlobalAveragePool GlobalMaxPool GlobalLpPool": _per_input_element,
    "Resize Upsample GridSample": _interpolate,
    "RNN": _recurrent(1, 0),
    "GRU": _recurrent(3, 4),
    "LSTM": _recurrent(4, 5),
    "Attention": _attention,
    "ScatterND ScatterElements Scatter": _scatter(2),
    "Shape Size Constant OneHot NonZero Compress Unique TopK MaxUnpool Col2Im TensorScatter": _zero,
    "MaxRoiPool RoiAlign NonMaxSuppression If Loop Scan": _not_estimated,
})

_FORMULAS: dict[tuple[str, str], Callable[[ir.Node], int | None]] = {
    **{("", op): fn for op, fn in _DEFAULT.items()},
    ("com.microsoft", "FusedConv"): _with_activation(_conv_like(1, 2)),
    ("com.microsoft", "FusedGemm"): _with_activation(_gemm),
    ("com.microsoft", "FusedMatMul"): _fused_matmul,
    ("com.microsoft", "QLinearConv"): _conv_like(3, 8),
    ("com.microsoft", "SkipLayerNormalization"): _per_output_element(8),
    ("com.microsoft", "SimplifiedLayerNormalization"): _per_output_element(4),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): _per_output_element(5),
    ("ai.onnx.ml", "Normalizer"): _per_output_element(3),
    ("dlcc", "Attention"): _dlcc_attention,
}

# Fallbacks by pattern kind for ops without a formula; OUT_ELEMWISE_FUSABLE and OPAQUE ops need one.
_BY_KIND: dict[Kind, Callable[[ir.Node], int | None]] = {
    Kind.ELEMWISE: _per_output_element(1),
    Kind.BROADCAST: _per_output_element(1),
    Kind.INJECTIVE: _zero,
    Kind.COMM_REDUCE: _per_input_element,
}


# ------------------------------------------------------------------------------------------ public API


def node_flops(node: ir.Node) -> int | None:
    """FLOPs of one node (see the module docstring), or None when its cost is unknown."""
    info = op_info(node.op_type, node.domain)
    formula = _FORMULAS.get((info.domain, node.op_type)) or _BY_KIND.get(info.kind, _not_estimated)
    try:
        return formula(node)
    except (IndexError, ValueError, TypeError, ZeroDivisionError):
        return None  # shapes or attributes that do not fit the op: unknown, not a crash


def _value_bytes(value: ir.Value) -> int | None:
    dims, dtype = static_shape(value), value.dtype
    if dims is None or dtype is None:
        return None
    try:
        itemsize = dtype.itemsize
    except TypeError:  # STRING, UNDEFINED: no fixed size
        return None
    return math.ceil(_numel(dims) * itemsize)


def node_bytes(node: ir.Node) -> int | None:
    """Bytes the node reads from its inputs plus bytes it writes, or None when a size is unknown."""
    total = 0
    seen: set[int] = set()
    outputs = [v for v in node.outputs if v.name or v.uses() or v.is_graph_output()]
    for value in [*node.inputs, *outputs]:
        if value is None or id(value) in seen:
            continue
        seen.add(id(value))
        size = _value_bytes(value)
        if size is None:
            return None
        total += size
    return total


def model_flops(model: ir.Model) -> tuple[int, int]:
    """(FLOPs summed over the top-level nodes whose cost is known, number of nodes whose cost is not)."""
    total = unknown = 0
    for node in model.graph:
        flops = node_flops(node)
        if flops is None:
            unknown += 1
        else:
            total += flops
    return total, unknown
