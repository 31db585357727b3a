"""Linear-op fusion: every rule folds what it should (checked in onnxruntime), refuses what it must, and
the pass is idempotent; on the light ResNet-50 and Inception-v2 every BatchNormalization disappears."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import dlcc
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.eliminate import DeadCodeElimination
from dlcc.passes.fuse_linear import RULES, LinearFusion
from dlcc.testing.rewrites import run_checked

RTOL = 1e-4  # folding reassociates float arithmetic (DESIGN.md: 1e-4 for BN folding and the like)


def dims(rank: int, prefix: str = "d") -> str:
    return ",".join(f"{prefix}{i}" for i in range(rank))


def build(text: str, inits: dict[str, np.ndarray] | None = None, opset: int = 13) -> ir.Model:
    graph = onnx.parser.parse_graph(text)
    graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in (inits or {}).items())
    opsets = [helper.make_opsetid("", opset)]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = max(helper.find_min_ir_version_for(opsets), 7)
    onnx.checker.check_model(proto, full_check=True)
    return infer_shapes(dlcc.load(proto))


def fuse(model: ir.Model, rtol: float = RTOL, seed: int = 0) -> tuple[LinearFusion, bool]:
    """Run the pass; verify the IR, the ONNX and the outputs against the model before."""
    p = LinearFusion()
    return p, run_checked(model, p, rtol=rtol, seed=seed)


def ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def bn_params(rng: np.random.Generator, c: int, dtype=np.float32) -> dict[str, np.ndarray]:
    return {"s": rng.uniform(0.5, 1.5, c).astype(dtype), "b": rng.standard_normal(c).astype(dtype),
            "mu": rng.standard_normal(c).astype(dtype), "var": rng.uniform(0.2, 2.0, c).astype(dtype)}


def assert_idempotent(model: ir.Model) -> None:
    assert not LinearFusion()(model)


# ----------------------------------------------------------------------------------------- Conv + BN

CONV_CASES = {
    # name: (x shape, weight shape, group, bias)
    "2d": ((2, 4, 7, 7), (6, 4, 3, 3), 1, True),
    "2d-nobias": ((2, 4, 7, 7), (6, 4, 3, 3), 1, False),
    "1d": ((2, 4, 9), (6, 4, 3), 1, True),
    "3d": ((1, 4, 5, 5, 5), (6, 4, 3, 3, 3), 1, False),
    "grouped": ((2, 4, 7, 7), (6, 2, 3, 3), 2, True),
    "depthwise": ((2, 4, 7, 7), (8, 1, 3, 3), 4, False),
}


def conv_model(case: str, tail: str, extra: dict | None = None, seed: int = 0, opset: int = 13,
               out_rank: int | None = None):
    xs, ws, group, bias = CONV_CASES[case]
    rng = np.random.default_rng(seed)
    inits = {"w": f32(rng, *ws), **bn_params(rng, ws[0]), **(extra or {})}
    if bias:
        inits["cb"] = f32(rng, ws[0])
    args = "x, w, cb" if bias else "x, w"
    text = f"""g (float[{','.join(map(str, xs))}] x) => (float[{dims(out_rank or len(xs))}] y) {{
        c = Conv<group={group}>({args})
        {tail}
    }}"""
    return build(text, inits, opset)


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_bn_folds(case: str) -> None:
    model = conv_model(case, "y = BatchNormalization<epsilon=0.001>(c, s, b, mu, var)")
    p, changed = fuse(model)
    assert changed and p.fired["conv-bn"] == 1
    assert ops(model) == ["Conv"]
    assert_idempotent(model)


def test_conv_bn_edits_the_conv_in_place() -> None:
    """The Conv stays the same node; its weight and bias initializers keep their names and take the folded
    values (nothing else reads them); a missing bias is added as a new initializer."""
    for case in ("2d", "2d-nobias"):
        model = conv_model(case, "y = BatchNormalization<epsilon=0.001>(c, s, b, mu, var)")
        conv = next(iter(model.graph))
        w_before = model.graph.initializers["w"].const_value.numpy().copy()
        fuse(model)
        assert list(model.graph) == [conv]
        assert conv.inputs[1].name == "w" and not np.array_equal(conv.inputs[1].const_value.numpy(), w_before)
        if case == "2d":
            assert conv.inputs[2].name == "cb"
        assert conv.outputs[0].name == "y"  # it took the graph output's name
        assert sorted(model.graph.initializers) == sorted(v.name for v in conv.inputs[1:])


def test_conv_bn_with_a_shared_weight_leaves_the_other_reader_alone() -> None:
    """Two Convs read one weight: the first fold wires in a new initializer; the second Conv is then the
    weight's only reader, and the weight takes its folded values. A reader that does not fold keeps the
    weight as it was."""
    rng = np.random.default_rng(3)
    w = f32(rng, 6, 4, 3, 3)
    inits = {"w": w, **bn_params(rng, 6), "s2": rng.uniform(0.5, 1.5, 6).astype(np.float32)}
    model = build("""g (float[2,4,7,7] x) => (float[2,6,5,5] y, float[2,6,5,5] z) {
        c1 = Conv(x, w)
        c2 = Conv(x, w)
        y = BatchNormalization(c1, s, b, mu, var)
        z = BatchNormalization(c2, s2, b, mu, var)
    }""", inits)
    p, _ = fuse(model)
    assert p.fired["conv-bn"] == 2 and ops(model) == ["Conv", "Conv"]
    c1, c2 = model.graph
    assert c1.inputs[1].name != "w" and c2.inputs[1].name == "w"
    assert not np.array_equal(c2.inputs[1].const_value.numpy(), w)
    model = build("""g (float[2,4,7,7] x) => (float[2,6,5,5] y, float[2,6,5,5] z) {
        c1 = Conv(x, w)
        y = BatchNormalization(c1, s, b, mu, var)
        z = Conv(x, w)
    }""", inits)
    fuse(model)  # checks both outputs against the model before in onnxruntime
    assert np.array_equal(model.graph.initializers["w"].const_value.numpy(), w)


def test_conv_bn_opset9() -> None:
    rng = np.random.default_rng(1)
    model = build("""g (float[1,2,6,6] x) => (float[1,3,4,4] y) {
        c = Conv(x, w)
        y = BatchNormalization(c, s, b, mu, var)
    }""", {"w": f32(rng, 3, 2, 3, 3), **bn_params(rng, 3)}, opset=9)
    p, _ = fuse(model)
    assert ops(model) == ["Conv"] and p.fired["conv-bn"] == 1


def test_gemm_bn_float64_keeps_the_dtype() -> None:
    rng = np.random.default_rng(1)
    inits = {"w": rng.standard_normal((4, 5)), "cc": rng.standard_normal(5), **bn_params(rng, 5, np.float64)}
    model = build("""g (double[3,4] x) => (double[3,5] y) {
        g = Gemm(x, w, cc)
        y = BatchNormalization(g, s, b, mu, var)
    }""", inits)
    p, _ = fuse(model, rtol=1e-12)
    assert ops(model) == ["Gemm"] and p.fired["gemm-bn"] == 1
    assert all(v.const_value.dtype == ir.DataType.DOUBLE for v in model.graph.node(0).inputs[1:])


@pytest.mark.parametrize("group,bias", [(1, False), (1, True), (2, True), (2, False)])
def test_convtranspose_bn_folds(group: int, bias: bool) -> None:
    # weight (Cin, Cout/group, k, k) with Cin/group != Cout/group, so a wrong axis cannot pass
    rng = np.random.default_rng(2)
    cin, cout = 4, 6
    inits = {"w": f32(rng, cin, cout // group, 3, 3), **bn_params(rng, cout)}
    if bias:
        inits["cb"] = f32(rng, cout)
    model = build(f"""g (float[2,{cin},5,5] x) => (float[a,b,c,d] y) {{
        c = ConvTranspose<group={group}, strides=[2,2]>(x, w{', cb' if bias else ''})
        y = BatchNormalization(c, s, b, mu, var)
    }}""", inits)
    p, _ = fuse(model)
    assert ops(model) == ["ConvTranspose"] and p.fired["conv-bn"] == 1
    assert_idempotent(model)


def test_conv_bn_refuses_shared_output_and_lowers_bn() -> None:
    model = conv_model("2d", """bn = BatchNormalization(c, s, b, mu, var)
        r = Relu(c)
        y = Add(bn, r)""")
    p, _ = fuse(model)
    assert p.refused[("conv-bn", "the producer's output has other uses")] >= 1
    assert p.fired["conv-bn"] == 0 and p.fired["bn-to-mul-add"] == 1
    assert Counter(ops(model)) == Counter(["Conv", "Mul", "Add", "Relu", "Add"])
    mul = next(n for n in model.graph if n.op_type == "Mul")
    assert mul.inputs[1].const_value.shape == ir.Shape([6, 1, 1])
    assert_idempotent(model)


def test_conv_output_that_is_a_graph_output_is_not_folded() -> None:
    rng = np.random.default_rng(3)
    model = build("""g (float[1,2,5,5] x) => (float[1,3,3,3] y, float[1,3,3,3] c) {
        c = Conv(x, w)
        y = BatchNormalization(c, s, b, mu, var)
    }""", {"w": f32(rng, 3, 2, 3, 3), **bn_params(rng, 3)})
    p, _ = fuse(model)
    assert p.fired["conv-bn"] == 0
    assert p.refused[("conv-bn", "the producer's output has other uses")] >= 1
    assert [v.name for v in model.graph.outputs] == ["y", "c"]


def test_conv_bn_refuses_non_constant_weight() -> None:
    rng = np.random.default_rng(4)
    model = build("""g (float[1,2,5,5] x, float[3,2,3,3] w) => (float[1,3,3,3] y) {
        c = Conv(x, w)
        y = BatchNormalization(c, s, b, mu, var)
    }""", bn_params(rng, 3))
    p, _ = fuse(model)
    assert p.refused[("conv-bn", "Conv weight is not a constant")] >= 1
    assert ops(model) == ["Conv", "Mul", "Add"]  # the BN alone became Mul + Add
    assert_idempotent(model)


def test_conv_bn_refuses_non_constant_bn_parameter() -> None:
    rng = np.random.default_rng(5)
    params = bn_params(rng, 3)
    del params["var"]
    model = build("""g (float[1,2,5,5] x, float[3] var) => (float[1,3,3,3] y) {
        c = Conv(x, w)
        y = BatchNormalization(c, s, b, mu, var)
    }""", {"w": f32(rng, 3, 2, 3, 3), **params})
    p, _ = fuse(model)
    assert p.refused[("conv-bn", "BatchNormalization variance is not a constant")] >= 1
    assert ops(model) == ["Conv", "BatchNormalization"]


def test_training_mode_bn_is_left_alone() -> None:
    rng = np.random.default_rng(6)
    model = build("""g (float[2,2,5,5] x) => (float[2,3,3,3] y, float[3] rm, float[3] rv) {
        c = Conv(x, w)
        y, rm, rv = BatchNormalization<training_mode=1>(c, s, b, mu, var)
    }""", {"w": f32(rng, 3, 2, 3, 3), **bn_params(rng, 3)}, opset=15)
    p = LinearFusion()
    assert not p(model)
    assert ("conv-bn", "training-mode BatchNormalization (several outputs)") in p.refused


# ------------------------------------------------------------------------------ Conv + constant ops

PER_CHANNEL = [(6, 1, 1), (1, 6, 1, 1), (), (1,), (1, 1, 1)]


@pytest.mark.parametrize("shape", PER_CHANNEL)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_conv_constant_op_folds(op: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(7)
    k = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    model = conv_model("2d", f"y = {op}(c, k)", {"k": k})
    p, _ = fuse(model)
    assert ops(model) == ["Conv"]
    assert p.fired["conv-add" if op in ("Add", "Sub") else "conv-mul"] == 1
    assert_idempotent(model)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_conv_constant_first_operand_folds(op: str) -> None:
    rng = np.random.default_rng(8)
    model = conv_model("2d-nobias", f"y = {op}(k, c)", {"k": f32(rng, 6, 1, 1)})
    fuse(model)
    assert ops(model) == ["Conv"]
    assert_idempotent(model)


def test_conv_div_constant_by_output_is_not_folded() -> None:
    rng = np.random.default_rng(9)
    model = conv_model("2d", "y = Div(k, c)", {"k": f32(rng, 6, 1, 1)})
    p, changed = fuse(model)
    assert not changed and ops(model) == ["Conv", "Div"]


@pytest.mark.parametrize("shape", [(1, 1, 5, 5), (5,), (1, 1, 6, 1, 1), (2, 6, 1, 1)])
def test_conv_add_refuses_non_per_channel_constant(shape: tuple[int, ...]) -> None:
    # per-position, per-column, rank-raising and per-sample constants cannot go into a bias
    rng = np.random.default_rng(10)
    model = conv_model("2d", "y = Add(c, k)", {"k": f32(rng, *shape)}, out_rank=max(4, len(shape)))
    p, changed = fuse(model)
    assert not changed
    assert p.refused[("conv-add", "constant is not per-channel (or broadcasting changes the shape)")] >= 1


def test_conv_div_by_zero_is_refused() -> None:
    k = np.ones((6, 1, 1), np.float32)
    k[2] = 0
    model = conv_model("2d", "y = Div(c, k)", {"k": k})
    p = LinearFusion()
    assert not p(model)
    assert p.refused[("conv-mul", "division by zero")] >= 1


def test_conv_add_refuses_non_constant_operand() -> None:
    rng = np.random.default_rng(11)
    model = build("""g (float[1,2,5,5] x, float[3,1,1] k) => (float[1,3,3,3] y) {
        c = Conv(x, w)
        y = Add(c, k)
    }""", {"w": f32(rng, 3, 2, 3, 3)})
    p, changed = fuse(model)
    assert not changed and ops(model) == ["Conv", "Add"]


def test_conv_bn_mul_add_chain_and_relu() -> None:
    # the Inception-v2 form: Conv -> BN -> Mul(scale) -> Add(bias) -> Relu
    rng = np.random.default_rng(12)
    model = conv_model("grouped", """bn = BatchNormalization(c, s, b, mu, var)
        m = Mul(bn, k1)
        a = Add(m, k2)
        y = Relu(a)""", {"k1": rng.uniform(0.5, 1.5, (6, 1, 1)).astype(np.float32), "k2": f32(rng, 6, 1, 1)})
    p, _ = fuse(model)
    assert ops(model) == ["Conv", "Relu"]
    assert p.fired == Counter({"conv-bn": 1, "conv-mul": 1, "conv-add": 1})
    assert_idempotent(model)


def test_convtranspose_constant_ops() -> None:
    rng = np.random.default_rng(13)
    model = build("""g (float[1,4,5,5] x) => (float[a,b,c,d] y) {
        c = ConvTranspose<group=2>(x, w)
        m = Mul(c, k1)
        y = Sub(m, k2)
    }""", {"w": f32(rng, 4, 3, 3, 3), "k1": f32(rng, 6, 1, 1), "k2": f32(rng, 6, 1, 1)})
    fuse(model)
    assert ops(model) == ["ConvTranspose"]


# ---------------------------------------------------------------------------------- Gemm / MatMul


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (3, 5), (3, 1)])
def test_gemm_bn_folds(trans_b: int, c_shape: tuple[int, ...] | None) -> None:
    rng = np.random.default_rng(14)
    inits = {"w": f32(rng, *((5, 4) if trans_b else (4, 5))), **bn_params(rng, 5)}
    args = "x, w"
    if c_shape is not None:
        inits["cc"] = f32(rng, *c_shape)
        args += ", cc"
    model = build(f"""g (float[3,4] x) => (float[3,5] y) {{
        g = Gemm<transB={trans_b}, alpha=0.7, beta=1.3>({args})
        y = BatchNormalization(g, s, b, mu, var)
    }}""", inits)
    p, _ = fuse(model)
    assert ops(model) == ["Gemm"] and p.fired["gemm-bn"] == 1
    assert_idempotent(model)


def test_gemm_trans_a_chain_of_constant_ops() -> None:
    rng = np.random.default_rng(15)
    model = build("""g (float[4,3] x) => (float[3,5] y) {
        g = Gemm<transA=1, alpha=2.0>(x, w, cc)
        a = Mul(g, k1)
        b = Div(a, k2)
        c = Add(k3, b)
        y = Sub(c, k4)
    }""", {"w": f32(rng, 4, 5), "cc": f32(rng, 5), "k1": f32(rng, 5), "k2": np.float32(1.7),
           "k3": f32(rng, 1, 5), "k4": np.float32(0.3)})
    p, _ = fuse(model)
    assert ops(model) == ["Gemm"]
    assert p.fired == Counter({"gemm-mul": 2, "gemm-add": 2})
    assert_idempotent(model)


def test_gemm_refuses_per_row_constant() -> None:
    rng = np.random.default_rng(16)
    model = build("""g (float[3,4] x) => (float[3,5] y) {
        g = Gemm(x, w)
        y = Mul(g, k)
    }""", {"w": f32(rng, 4, 5), "k": f32(rng, 3, 1)})
    p = LinearFusion()
    assert not p(model)
    assert ("gemm-mul", "constant is not per-channel (or broadcasting changes the shape)") in p.refused


def test_gemm_with_dynamic_c_is_refused() -> None:
    rng = np.random.default_rng(17)
    model = build("""g (float[3,4] x, float[5] cc) => (float[3,5] y) {
        g = Gemm(x, w, cc)
        y = Add(g, k)
    }""", {"w": f32(rng, 4, 5), "k": f32(rng, 5)})
    p = LinearFusion()
    assert not p(model)
    assert ("gemm-add", "Gemm bias is not a constant") in p.refused


def test_matmul_bn_becomes_gemm() -> None:
    rng = np.random.default_rng(18)
    model = build("""g (float[3,4] x) => (float[3,5] y) {
        m = MatMul(x, w)
        y = BatchNormalization(m, s, b, mu, var)
    }""", {"w": f32(rng, 4, 5), **bn_params(rng, 5)})
    p, _ = fuse(model)
    assert ops(model) == ["Gemm"] and p.fired["matmul-bn"] == 1
    assert_idempotent(model)


def test_matmul_rank3_bn_is_not_folded() -> None:
    # BN normalizes axis 1 of a (B, M, N) MatMul output: not the feature axis
    rng = np.random.default_rng(19)
    model = build("""g (float[2,5,4] x) => (float[2,5,5] y) {
        m = MatMul(x, w)
        y = BatchNormalization(m, s, b, mu, var)
    }""", {"w": f32(rng, 4, 5), **bn_params(rng, 5)})
    p, _ = fuse(model)
    assert p.refused[("matmul-bn", "BatchNormalization's channel axis is not the output-feature axis")] >= 1
    assert ops(model) == ["MatMul", "Mul", "Add"]  # the BN on its own was lowered


@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (), (1, 1)])
@pytest.mark.parametrize("form", ["Add(m, k)", "Add(k, m)", "Sub(m, k)"])
def test_matmul_add_becomes_gemm(bias_shape: tuple[int, ...], form: str) -> None:
    rng = np.random.default_rng(20)
    model = build(f"""g (float[3,4] x) => (float[3,5] y) {{
        m = MatMul(x, w)
        y = {form}
    }}""", {"w": f32(rng, 4, 5), "k": f32(rng, *bias_shape)})
    p, _ = fuse(model)
    assert ops(model) == ["Gemm"] and p.fired["matmul-add"] == 1
    gemm = model.graph.node(0)
    assert gemm.inputs[2] is not None
    assert_idempotent(model)


def test_matmul_add_refuses_full_matrix_and_dynamic_weight() -> None:
    rng = np.random.default_rng(21)
    model = build("""g (float[3,4] x, float[4,5] w2) => (float[3,5] y, float[3,5] z) {
        m = MatMul(x, w)
        y = Add(m, k)
        m2 = MatMul(x, w2)
        z = Add(m2, k2)
    }""", {"w": f32(rng, 4, 5), "k": f32(rng, 3, 5), "k2": f32(rng, 5)})
    p = LinearFusion()
    assert not p(model)
    assert ("matmul-add", "constant is not per-channel (or broadcasting changes the shape)") in p.refused


def test_matmul_rank3_bias_is_kept() -> None:
    rng = np.random.default_rng(22)
    model = build("""g (float[2,3,4] x) => (float[2,3,5] y) {
        m = MatMul(x, w)
        a = Add(m, k)
        y = Relu(a)
    }""", {"w": f32(rng, 4, 5), "k": f32(rng, 5)})
    p, changed = fuse(model, rtol=1e-6)
    assert not changed and not p.fired
    assert p.refused[("matmul-add", "a bias on a rank-3 MatMul cannot become a Gemm")] >= 1
    assert ops(model) == ["MatMul", "Add", "Relu"]


@pytest.mark.parametrize("x_shape", [(3, 4), (2, 3, 4), (4,)])
def test_matmul_mul_scales_the_weight(x_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(24)
    out = dims(max(len(x_shape), 1))
    model = build(f"""g (float[{','.join(map(str, x_shape))}] x) => (float[{out}] y) {{
        m = MatMul(x, w)
        y = Div(m, k)
    }}""", {"w": f32(rng, 4, 5), "k": rng.uniform(0.5, 2, 5).astype(np.float32)})
    p, _ = fuse(model)
    assert ops(model) == ["MatMul"] and p.fired["matmul-mul"] == 1
    assert_idempotent(model)


# -------------------------------------------------------------------------------- lone BN and BN folds


def test_bn_absorbs_mul_and_add_then_becomes_mul_add() -> None:
    rng = np.random.default_rng(25)
    model = build("""g (float[2,4,5,5] x) => (float[2,4,5,5] y) {
        r = Relu(x)
        bn = BatchNormalization(r, s, b, mu, var)
        m = Mul(bn, k1)
        y = Sub(m, k2)
    }""", {**bn_params(rng, 4), "k1": f32(rng, 4, 1, 1), "k2": f32(rng, 1, 4, 1, 1)})
    p, _ = fuse(model)
    assert p.fired == Counter({"bn-mul": 1, "bn-add": 1, "bn-to-mul-add": 1})
    assert ops(model) == ["Relu", "Mul", "Add"]
    consts = [n.inputs[1].const_value for n in model.graph if n.op_type in ("Mul", "Add")]
    assert [c.shape for c in consts] == [ir.Shape([4, 1, 1])] * 2
    assert_idempotent(model)


@pytest.mark.parametrize("x_shape,const_shape", [((3, 4), (4,)), ((2, 4, 6), (4, 1))])
def test_lone_bn_lowered_for_any_rank(x_shape: tuple[int, ...], const_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(26)
    shape = ",".join(map(str, x_shape))
    model = build(f"""g (float[{shape}] x) => (float[{shape}] y) {{
        y = BatchNormalization(x, s, b, mu, var)
    }}""", bn_params(rng, 4))
    p, _ = fuse(model)
    assert ops(model) == ["Mul", "Add"] and p.fired["bn-to-mul-add"] == 1
    assert model.graph.node(0).inputs[1].const_value.shape == ir.Shape(list(const_shape))
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert_idempotent(model)


def test_lone_bn_refuses_unknown_rank_and_mul_refuses_spatial_constant() -> None:
    rng = np.random.default_rng(27)
    model = build("""g (float[2,4,3,3] x, int64[k] shp) => (float[a,b,c,d] y) {
        r = Reshape(x, shp)
        y = BatchNormalization(r, s, b, mu, var)
    }""", bn_params(rng, 4))
    assert model.graph.node(1).inputs[0].shape is None
    p = LinearFusion()
    assert not p(model)
    assert ("bn-to-mul-add", "BatchNormalization input rank unknown") in p.refused

    model = build("""g (float[2,4,3,3] x) => (float[2,4,3,3] y) {
        r = Relu(x)
        bn = BatchNormalization(r, s, b, mu, var)
        y = Mul(bn, k)
    }""", {**bn_params(rng, 4), "k": f32(rng, 1, 1, 3, 3)})
    p, _ = fuse(model)
    assert p.fired == Counter({"bn-to-mul-add": 1})  # the per-position Mul stays a Mul
    assert ops(model) == ["Relu", "Mul", "Add", "Mul"]


def test_rule_table_is_documented() -> None:
    for r in RULES:
        assert r.doc and r.family == "fuse-linear"
    assert all(not r.exact for r in RULES)
    assert len({r.name for r in RULES}) == len(RULES)


# -------------------------------------------------------------------------------- light models

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"


def materialize_constants(model: ir.Model, seed: int = 0) -> None:
    """Replace each ConstantOfShape (and each Unsqueeze of a constant) by a seeded random initializer.

    Stands in for the constant-folding pass. Values follow the consumer: He-scaled conv/gemm weights,
    BN scales and variances in [0.5, 1.5] (variances must be positive), small biases and means.
    """
    rng = np.random.default_rng(seed)
    graph = model.graph
    for node in list(graph):
        out = node.outputs[0]
        if node.op_type == "ConstantOfShape":
            shape = tuple(int(d) for d in node.inputs[0].const_value.numpy())
            use = out.uses()[0]
            if use.node.op_type == "Unsqueeze":  # Inception-v2's extra scale (Mul) and bias (Add)
                use = use.node.outputs[0].uses()[0]
                positive = use.node.op_type == "Mul"
            else:
                positive = use.node.op_type == "BatchNormalization" and use.idx in (1, 4)
            if use.node.op_type in ("Conv", "Gemm") and use.idx == 1:
                arr = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
            elif positive:
                arr = rng.uniform(0.5, 1.5, shape)
            else:
                arr = 0.1 * rng.standard_normal(shape)
        elif node.op_type == "Unsqueeze" and node.inputs[0].const_value is not None:
            arr = node.inputs[0].const_value.numpy()
            for axis in sorted(node.attributes["axes"].value):
                arr = np.expand_dims(arr, axis)
        else:
            continue
        arr = np.asarray(arr, np.float32)
        name = out.name
        out.name = name + "__materialized"
        value = ir.Value(name=name, shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.FLOAT),
                         const_value=ir.tensor(arr, name=name))
        graph.register_initializer(value)
        out.replace_all_uses_with(value)
        graph.remove(node, safe=True)
    DeadCodeElimination()(model)


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", [
    ("resnet50", {"conv-bn": 53}),
    ("inception_v2", {"conv-bn": 69, "conv-mul": 69, "conv-add": 69}),
])
def test_light_models(name: str, expected: dict[str, int]) -> None:
    model = dlcc.load(onnx.load(LIGHT / f"light_{name}.onnx"))
    materialize_constants(model)
    infer_shapes(model)
    softmax = next(n for n in model.graph if n.op_type == "Softmax")
    model.graph.outputs.append(softmax.inputs[0])  # the logits too: a softmax can hide differences
    p, changed = fuse(model)
    assert changed and dict(p.fired) == expected
    counts = Counter(ops(model))
    assert counts["BatchNormalization"] == 0
    if name == "inception_v2":
        assert counts["Mul"] == 0 and counts["Add"] == 0
    assert_idempotent(model)
