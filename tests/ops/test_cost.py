"""FLOPs and bytes per node, checked against hand-computed numbers on tiny graphs with inferred shapes."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx.parser
import onnx.shape_inference
import onnx_ir as ir
import onnx_ir.passes.common
import pytest

import dlcc
from dlcc.ops import model_flops, node_bytes, node_flops, static_shape

LIGHT_RESNET50 = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


def build(graph_text: str, opset: int = 21) -> ir.Model:
    """A model from the text of its graph, with shapes inferred by onnx (data propagation on)."""
    text = f'<ir_version: 10, opset_import: ["" : {opset}]>\n{graph_text}'
    proto = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(text), strict_mode=True,
                                              data_prop=True)
    return ir.serde.deserialize_model(proto)


def only(model: ir.Model, op_type: str) -> ir.Node:
    (node,) = [n for n in model.graph if n.op_type == op_type]
    return node


def out_shape(node: ir.Node) -> tuple[int, ...] | None:
    return static_shape(node.outputs[0])


# -------------------------------------------------------------------------------------------- conv


def test_conv_same_padding():
    m = build("g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) "
              "{ y = Conv <pads = [1,1,1,1]> (x, w) }")
    # 2 * N * Cout * H * W * Cin * kh * kw
    assert node_flops(only(m, "Conv")) == 2 * 1 * 4 * 8 * 8 * 3 * 3 * 3 == 13824


def test_conv_bias_adds_one_per_output():
    m = build("g (float[1,3,8,8] x, float[4,3,3,3] w, float[4] b) => (float[1,4,8,8] y) "
              "{ y = Conv <pads = [1,1,1,1]> (x, w, b) }")
    assert node_flops(only(m, "Conv")) == 13824 + 4 * 8 * 8


def test_conv_groups_strides_padding_dilations():
    m = build("g (float[2,8,15,15] x, float[6,4,3,3] w) => (float[2,6,7,7] y) "
              "{ y = Conv <group = 2, strides = [2,2], dilations = [2,2], pads = [1,1,1,1]> (x, w) }")
    conv = only(m, "Conv")
    # effective kernel 5, (15 + 2 - 5) / 2 + 1 = 7; each output sees Cin / group = 4 channels
    assert out_shape(conv) == (2, 6, 7, 7)
    assert node_flops(conv) == 2 * 2 * 6 * 7 * 7 * 4 * 3 * 3 == 42336


def test_depthwise_conv():
    m = build("g (float[1,8,10,10] x, float[8,1,3,3] w) => (float[1,8,8,8] y) "
              "{ y = Conv <group = 8> (x, w) }")
    assert node_flops(only(m, "Conv")) == 2 * 8 * 8 * 8 * 1 * 9 == 9216


def test_conv1d_and_asymmetric_padding():
    m = build("g (float[1,2,10] x, float[3,2,4] w) => (float[1,3,10] y) "
              "{ y = Conv <pads = [2,1], strides = [1]> (x, w) }")
    conv = only(m, "Conv")
    assert out_shape(conv) == (1, 3, 10)  # 10 + 3 - 4 + 1
    assert node_flops(conv) == 2 * 3 * 10 * 2 * 4


def test_conv_transpose():
    m = build("g (float[1,4,5,5] x, float[4,2,3,3] w, float[2] b) => (float[1,2,11,11] y) "
              "{ y = ConvTranspose <strides = [2,2]> (x, w, b) }")
    conv = only(m, "ConvTranspose")
    assert out_shape(conv) == (1, 2, 11, 11)
    # every input pixel (N * Cin * 25) meets Cout/g * kh * kw = 2 * 9 weights, plus a bias per output
    assert node_flops(conv) == 2 * 1 * 4 * 25 * 2 * 9 + 2 * 11 * 11 == 3842


# ------------------------------------------------------------------------------------------ matmul


def test_matmul_batch_broadcast():
    m = build("g (float[2,1,3,4] a, float[5,4,6] b) => (float[2,5,3,6] y) { y = MatMul(a, b) }")
    # batch dims (2, 1) and (5) broadcast to (2, 5)
    assert node_flops(only(m, "MatMul")) == 2 * (2 * 5) * 3 * 6 * 4 == 1440


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("[4]", "[4,6]", 2 * 1 * 6 * 4),
    ("[2,3,4]", "[4]", 2 * 2 * 3 * 1 * 4),
    ("[3,4]", "[4,6]", 2 * 3 * 6 * 4),
])
def test_matmul_vectors(a, b, expected):
    m = build(f"g (float{a} a, float{b} b) => (float[] y) {{ y = MatMul(a, b) }}")
    assert node_flops(only(m, "MatMul")) == expected


def test_matmul_integer():
    m = build("g (uint8[3,4] a, uint8[4,5] b) => (int32[3,5] y) { y = MatMulInteger(a, b) }")
    assert node_flops(only(m, "MatMulInteger")) == 2 * 3 * 5 * 4


def test_gemm_with_c():
    m = build("g (float[3,4] a, float[5,4] b, float[5] c) => (float[3,5] y) "
              "{ y = Gemm <transB = 1> (a, b, c) }")
    assert node_flops(only(m, "Gemm")) == 2 * 3 * 5 * 4 + 3 * 5 == 135


def test_gemm_alpha_beta_and_transposes():
    m = build("g (float[4,3] a, float[5,4] b, float[3,5] c) => (float[3,5] y) "
              "{ y = Gemm <transA = 1, transB = 1, alpha = 0.5, beta = 2.0> (a, b, c) }")
    # A@B, scale by alpha, scale C by beta, add C
    assert node_flops(only(m, "Gemm")) == 120 + 15 + 15 + 15


def test_gemm_without_c():
    m = build("g (float[3,4] a, float[4,5] b) => (float[3,5] y) { y = Gemm(a, b) }")
    assert node_flops(only(m, "Gemm")) == 120


@pytest.mark.parametrize(("equation", "shapes", "expected"), [
    ("bij,bjk->bik", ("[2,3,4]", "[2,4,5]"), 2 * 2 * 3 * 4 * 5),
    ("...ij,...jk", ("[2,3,4]", "[2,4,5]"), 2 * 2 * 3 * 4 * 5),
    ("ij->", ("[3,4]",), 12),
    ("ij->ji", ("[3,4]",), 0),
])
def test_einsum(equation, shapes, expected):
    inputs = ", ".join(f"float{s} x{i}" for i, s in enumerate(shapes))
    args = ", ".join(f"x{i}" for i in range(len(shapes)))
    m = build(f'g ({inputs}) => (float[] y) {{ y = Einsum <equation = "{equation}"> ({args}) }}')
    assert node_flops(only(m, "Einsum")) == expected


# ------------------------------------------------------------------------------- elementwise & co


@pytest.mark.parametrize("op_type", ["Relu", "Exp", "Sigmoid", "Tanh", "Erf", "Neg"])
def test_unary_is_one_per_element(op_type):
    m = build(f"g (float[2,3,4] x) => (float[2,3,4] y) {{ y = {op_type}(x) }}")
    assert node_flops(only(m, op_type)) == 24


def test_broadcast_binary_counts_output_elements():
    m = build("g (float[2,3,4] x, float[4] b) => (float[2,3,4] y) { y = Add(x, b) }")
    assert node_flops(only(m, "Add")) == 24


def test_variadic_sum_and_mean():
    m = build("g (float[2,3] a, float[2,3] b, float[3] c) => (float[2,3] s, float[2,3] m) "
              "{ s = Sum(a, b, c)  m = Mean(a, b, c) }")
    assert node_flops(only(m, "Sum")) == 2 * 6
    assert node_flops(only(m, "Mean")) == 3 * 6


def test_identity_is_free_and_cast_is_not():
    m = build("g (float[2,3] x) => (float[2,3] y, int32[2,3] z) { y = Identity(x)  z = Cast <to = 6> (x) }")
    assert node_flops(only(m, "Identity")) == 0
    assert node_flops(only(m, "Cast")) == 6


def test_batch_normalization_is_two_per_element():
    m = build("g (float[1,3,4,4] x, float[3] s, float[3] b, float[3] mu, float[3] var) => (float[1,3,4,4] y) "
              "{ y = BatchNormalization(x, s, b, mu, var) }")
    assert node_flops(only(m, "BatchNormalization")) == 2 * 48


def test_reductions_count_input_elements():
    m = build("g (float[2,3,4] x) => (float[2,1,4] y, int64[2,4] i) "
              "{ axes = Constant <value_ints = [1]> ()  y = ReduceSum(x, axes)"
              "  i = ArgMax <axis = 1, keepdims = 0> (x) }")
    assert node_flops(only(m, "ReduceSum")) == 24
    assert node_flops(only(m, "ArgMax")) == 24


def test_softmax_is_five_per_element():
    m = build("g (float[2,5] x) => (float[2,5] y) { y = Softmax(x) }")
    assert node_flops(only(m, "Softmax")) == 50


def test_pooling_is_output_times_kernel():
    m = build("g (float[1,2,8,8] x) => (float[1,2,3,3] y, float[1,2,4,4] z, float[1,2,1,1] w) {"
              "  y = MaxPool <kernel_shape = [3,3], strides = [2,2]> (x)"
              "  z = AveragePool <kernel_shape = [2,2], strides = [2,2]> (x)"
              "  w = GlobalAveragePool(x) }")
    assert out_shape(only(m, "MaxPool")) == (1, 2, 3, 3)
    assert node_flops(only(m, "MaxPool")) == 18 * 9
    assert node_flops(only(m, "AveragePool")) == 32 * 4
    assert node_flops(only(m, "GlobalAveragePool")) == 128


def test_data_movement_is_free():
    m = build("g (float[2,3,4] x, int64[2] idx) => (float[4,6] r, float[4,3,2] t, float[4,3,4] c, "
              "float[2,2,4] gth, float[5,2,3,4] e, float[2,6,4] tl) {"
              "  shape = Constant <value_ints = [4, 6]> ()"
              "  r = Reshape(x, shape)"
              "  t = Transpose <perm = [2,1,0]> (x)"
              "  c = Concat <axis = 0> (x, x)"
              "  gth = Gather <axis = 1> (x, idx)"
              "  eshape = Constant <value_ints = [5, 1, 1, 1]> ()"
              "  e = Expand(x, eshape)"
              "  reps = Constant <value_ints = [1, 2, 1]> ()"
              "  tl = Tile(x, reps) }")
    for op_type in ("Reshape", "Transpose", "Concat", "Gather", "Expand", "Tile"):
        assert node_flops(only(m, op_type)) == 0, op_type
    assert all(node_flops(n) == 0 for n in m.graph if n.op_type == "Constant")


def test_resize_linear_and_nearest():
    m = build('g (float[1,1,4,4] x) => (float[1,1,8,8] y, float[1,1,8,8] z) {'
              '  scales = Constant <value_floats = [1.0, 1.0, 2.0, 2.0]> ()'
              '  y = Resize <mode = "linear"> (x, , scales)'
              '  z = Resize <mode = "nearest"> (x, , scales) }')
    linear, nearest = [n for n in m.graph if n.op_type == "Resize"]
    assert node_flops(linear) == 64 * 2 * 2**2  # two interpolated axes, 2 taps each, a multiply-add per tap
    assert node_flops(nearest) == 0


def test_lstm():
    # seq 5, batch 2, input 3, hidden 4 (4 gates -> 16 rows), with bias
    m = build("g (float[5,2,3] x, float[1,16,3] w, float[1,16,4] r, float[1,32] b) => (float[5,1,2,4] y) "
              "{ y = LSTM <hidden_size = 4> (x, w, r, b) }")
    per_step = 2 * 16 * (3 + 4) + 2 * 16 + 16 + 5 * 4
    assert node_flops(only(m, "LSTM")) == 5 * 2 * per_step == 2920


def test_attention():
    m = build("g (float[1,2,3,4] q, float[1,2,5,4] k, float[1,2,5,6] v) => (float[1,2,3,6] y) "
              "{ y = Attention(q, k, v) }", opset=23)
    # per score (B * heads * S * L = 30): q.k (2 * 4), softmax (5), weighted sum of v (2 * 6)
    assert node_flops(only(m, "Attention")) == 30 * (8 + 5 + 12)


# ---------------------------------------------------------------------------------- unknown shapes


def test_symbolic_shapes_give_none():
    m = build("g (float[N,3,8,8] x, float[4,3,3,3] w, float[N,4] a, float[4,5] b) => (float[] y, float[] z) "
              "{ y = Conv(x, w)  z = MatMul(a, b) }")
    assert node_flops(only(m, "Conv")) is None
    # MatMul's flops only need the inputs' static dims: N is symbolic, so unknown
    assert node_flops(only(m, "MatMul")) is None
    assert node_bytes(only(m, "Conv")) is None


def test_model_flops_counts_unknown_nodes():
    m = build("g (float[N,4] a, float[4,5] b, float[2,3] x) => (float[] z, float[2,3] y) "
              "{ z = MatMul(a, b)  y = Relu(x)  s = Shape(a) }")
    assert model_flops(m) == (6, 1)


def test_unknown_op_and_control_flow_are_unknown():
    m = ir.from_onnx_text("""
        <ir_version: 10, opset_import: ["" : 21, "com.example" : 1]>
        g (float[2] x, bool c) => (float[2] y, float[2] z) {
            y = com.example.Mystery(x)
            z = If (c) <then_branch = t () => (float[2] o) { o = Relu(x) },
                        else_branch = e () => (float[2] o) { o = Neg(x) }>
        }""")
    assert [node_flops(n) for n in m.graph] == [None, None]
    assert model_flops(m) == (0, 2)


def test_rank_mismatch_is_unknown_not_a_crash():
    x = ir.Value(name="x", shape=ir.Shape([1, 2]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([3]), type=ir.TensorType(ir.DataType.FLOAT))
    node = ir.Node("", "Conv", [x, w])
    node.outputs[0].shape = ir.Shape([1, 3])
    assert node_flops(node) is None


# ------------------------------------------------------------------------------------------- bytes


def test_node_bytes_reads_and_writes():
    m = build("g (float[2,3] x, float[3] b) => (float[2,3] y) { y = Add(x, b) }")
    assert node_bytes(only(m, "Add")) == (6 + 3 + 6) * 4


def test_node_bytes_counts_a_repeated_input_once():
    m = build("g (float16[4] x) => (float16[4] y) { y = Mul(x, x) }")
    assert node_bytes(only(m, "Mul")) == 4 * 2 + 4 * 2


def test_node_bytes_counts_named_outputs():
    m = build("g (float[4] x) => (float[4] y) { y, mask = Dropout(x) }")
    assert node_bytes(only(m, "Dropout")) == 4 * 4 + 4 * 4 + 4  # x, y and the bool mask


def test_node_bytes_skips_absent_inputs_and_unnamed_unused_outputs():
    f32 = ir.TensorType(ir.DataType.FLOAT)
    x = ir.Value(name="x", shape=ir.Shape([4]), type=f32)
    node = ir.Node("", "Dropout", [x, None, None], num_outputs=2)
    y, mask = node.outputs
    y.name, y.shape, y.type = "y", ir.Shape([4]), f32
    mask.name = ""  # an absent optional output: no shape, never written
    assert node_bytes(node) == 32


def test_node_bytes_sub_byte_and_string():
    q = ir.Value(name="q", shape=ir.Shape([5]), type=ir.TensorType(ir.DataType.INT4))
    node = ir.Node("", "Identity", [q])
    node.outputs[0].name, node.outputs[0].shape = "o", ir.Shape([5])
    node.outputs[0].type = ir.TensorType(ir.DataType.INT4)
    assert node_bytes(node) == 3 + 3
    s = ir.Value(name="s", shape=ir.Shape([5]), type=ir.TensorType(ir.DataType.STRING))
    assert node_bytes(ir.Node("", "Identity", [s])) is None


# ------------------------------------------------------------------------------------------ models


def test_resnet50_flops_in_the_right_ballpark():
    model = dlcc.load(LIGHT_RESNET50)
    onnx_ir.passes.common.ShapeInferencePass()(model)
    flops, unknown = model_flops(model)
    # ResNet-50 is ~4.1 GMACs; 2 FLOPs per multiply-add, plus BN, ReLU, adds and pooling
    assert unknown == 0
    assert 7.7e9 <= flops <= 8.3e9
    conv = sum(node_flops(n) for n in model.graph if n.op_type == "Conv")
    assert 4.0e9 <= conv / 2 <= 4.2e9


@pytest.mark.parametrize("n_inputs", [0, 1, 2, 3, 5, 9])
@pytest.mark.parametrize("rank", [0, 1, 4])
def test_every_known_op_gives_an_answer_without_crashing(n_inputs, rank):
    # Shapes that rarely fit the op: the answer may be None, but never an exception.
    from dlcc.ops import KNOWN_OPS

    f32 = ir.TensorType(ir.DataType.FLOAT)
    for domain, op_type in KNOWN_OPS:
        inputs = [ir.Value(name=f"i{k}", shape=ir.Shape([3] * rank), type=f32) for k in range(n_inputs)]
        node = ir.Node(domain, op_type, inputs)
        node.outputs[0].name, node.outputs[0].shape, node.outputs[0].type = "o", ir.Shape([3] * rank), f32
        flops = node_flops(node)
        assert flops is None or (isinstance(flops, int) and flops >= 0), op_type
        assert node_bytes(node) == 4 * 3**rank * (n_inputs + 1)
