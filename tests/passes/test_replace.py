"""Target-driven op replacement: every rule fires for targets that lack or disfavour the op, refuses (with
its reason) otherwise, is idempotent, and keeps the model's outputs in onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
from dlcc.check import diff, run_ort
from dlcc.errors import DlccError
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.replace import DLCC_DOMAIN, OpReplacement, replacement_rules, upgrade_pad
from dlcc.passes.targets import CHANNEL_SHUFFLE, GROUPED_CONV, TARGETS, Target, get_target
from dlcc.passes.verify import verify_model
from dlcc.testing.light import light_input, light_model, light_model_path
from dlcc.testing.rewrites import assert_equivalent

RNG_SEED = 0


# ------------------------------------------------------------------------------------------------ helpers


def make(text: str, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(text)
    for name, arr in (inits or {}).items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def load(proto: onnx.ModelProto, *, unknown_rank: tuple[str, ...] = ()) -> ir.Model:
    """Load and infer shapes; then forget the shapes of the ``unknown_rank`` inputs (as if never known)."""
    model = infer_shapes(dlcc.load(proto))
    for v in model.graph.inputs:
        if v.name in unknown_rank:
            v.shape = None
    return model


def rand(*shape: int, low: float | None = None) -> np.ndarray:
    rng = np.random.default_rng(abs(hash(shape)) % 1000 + RNG_SEED)
    if low is not None:
        return rng.uniform(low, low + 1.0, shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def run_pass(model: ir.Model, target="dlcc-c", **kw) -> OpReplacement:
    p = OpReplacement(target, **kw)
    p.changed = p(model)
    verify_model(model)
    return p


def ops(model: ir.Model) -> Counter:
    return Counter(n.op_type for n in model.graph)


def assert_same(proto: onnx.ModelProto, model: ir.Model, rtol: float, seed: int = 0) -> None:
    assert_equivalent(proto, model, rtol=rtol, seed=seed)


def assert_refused(model: ir.Model, rule: str, reason: str, target="dlcc-c", **kw) -> None:
    before = ops(model)
    p = run_pass(model, target, **kw)
    assert not p.changed and p.fired[rule] == 0
    assert p.refused[(rule, reason)] >= 1, dict(p.refused)
    assert ops(model) == before


def positive(proto: onnx.ModelProto, target: str, rule: str, rtol: float, **kw) -> ir.Model:
    model = load(proto)
    p = run_pass(model, target, **kw)
    assert p.changed and p.fired[rule] >= 1, (dict(p.fired), dict(p.refused))
    assert_same(proto, model, rtol)
    assert not run_pass(model, target, **kw).changed  # idempotent
    return model


# ------------------------------------------------------------------------------------------------ targets


def test_targets_table() -> None:
    assert {"onnx", "dlcc-c", "conv-centric", "no-groups"} <= set(TARGETS)
    onnx_t, c = get_target("onnx"), get_target("dlcc-c")
    assert onnx_t.has("BatchNormalization") and onnx_t.has(GROUPED_CONV) and not onnx_t.has(CHANNEL_SHUFFLE)
    # the C backend runs BatchNormalization (also with runtime statistics) but prefers Mul+Add
    assert c.has("BatchNormalization") and c.prefer("batchnorm") == "mul_add"
    assert c.has(GROUPED_CONV) and c.has(CHANNEL_SHUFFLE)
    for op in ("Conv", "ConvTranspose", "Gemm", "MatMul", "Softmax", "LayerNormalization", "Gather", "Resize"):
        assert c.has(op)
    assert c.prefer("linear") == "gemm" and get_target("conv-centric").prefer("linear") == "conv"
    assert not get_target("no-groups").has(GROUPED_CONV) and get_target("no-groups").has("Conv")
    assert get_target(c) is c
    assert all(t.doc for t in TARGETS.values())


def test_unknown_target_lists_names() -> None:
    with pytest.raises(DlccError, match="known targets: onnx, dlcc-c"):
        get_target("gpu9000")


def test_target_cannot_prefer_what_it_lacks() -> None:
    with pytest.raises(ValueError, match="lacks"):
        Target("bad", frozenset({"Conv"}), {"linear": "gemm"})
    with pytest.raises(ValueError, match="unknown preference"):
        Target("bad", None, {"linear": "fft"})


def test_rules_have_docs() -> None:
    for rule in replacement_rules("dlcc-c"):
        assert rule.doc and rule.family == "replace"


# ------------------------------------------------------------------------------------- BatchNormalization

BN = """
<ir_version: 8, opset_import: ["" : OPSET]>
g (float[N,6,5,5] x) => (float[N,6,5,5] y) {
    y = BatchNormalization<epsilon = 0.001>(x, s, b, mean, var)
}
"""


def bn_inits() -> dict[str, np.ndarray]:
    return {"s": rand(6, low=0.5), "b": rand(6), "mean": rand(6) * 0.1, "var": rand(6, low=0.5)}


@pytest.mark.parametrize("opset", [9, 17])
def test_batchnorm_to_mul_add(opset: int) -> None:
    model = positive(make(BN.replace("OPSET", str(opset)), bn_inits()), "dlcc-c", "batchnorm-to-mul-add", 1e-4)
    assert ops(model) == Counter({"Mul": 1, "Add": 1})
    mul = next(n for n in model.graph if n.op_type == "Mul")
    assert mul.inputs[1].const_value.numpy().shape == (6, 1, 1)


def test_batchnorm_rank2() -> None:
    text = BN.replace("OPSET", "17").replace("float[N,6,5,5]", "float[N,6]")
    model = positive(make(text, bn_inits()), "dlcc-c", "batchnorm-to-mul-add", 1e-4)
    assert next(n for n in model.graph if n.op_type == "Mul").inputs[1].const_value.numpy().shape == (6,)


def test_batchnorm_refusals() -> None:
    text = BN.replace("OPSET", "17")
    assert_refused(load(make(text, bn_inits())), "batchnorm-to-mul-add", "target supports BatchNormalization",
                   target="onnx")
    inits = bn_inits()
    del inits["s"]
    varying = text.replace("(float[N,6,5,5] x)", "(float[N,6,5,5] x, float[6] s)")
    assert_refused(load(make(varying, inits)), "batchnorm-to-mul-add", "parameters are not constant")
    assert_refused(load(make(text, bn_inits()), unknown_rank=("x",)), "batchnorm-to-mul-add",
                   "input rank unknown")
    training = """
    <ir_version: 8, opset_import: ["" : 15]>
    g (float[2,6,5,5] x) => (float[2,6,5,5] y, float[6] rm) {
        y, rm, rv = BatchNormalization<training_mode = 1>(x, s, b, mean, var)
    }"""
    assert_refused(load(make(training, bn_inits())), "batchnorm-to-mul-add", "training mode")
    stats = """
    <ir_version: 8, opset_import: ["" : 9]>
    g (float[2,6,5,5] x) => (float[2,6,5,5] y, float[6] rm) {
        y, rm, rv, sm, sv = BatchNormalization(x, s, b, mean, var)
    }"""
    assert_refused(load(make(stats, bn_inits())), "batchnorm-to-mul-add", "running-statistics outputs are used")


# ------------------------------------------------------------------------------------------------ PRelu

PRELU = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4,3,3] x) => (float[2,4,3,3] y) { y = PRelu(x, slope) }
"""


def test_prelu_shared_slope_to_leakyrelu() -> None:
    model = positive(make(PRELU, {"slope": np.array([0.2], np.float32)}), "dlcc-c", "prelu-to-leakyrelu", 1e-5)
    (node,) = list(model.graph)
    assert node.op_type == "LeakyRelu" and node.attributes["alpha"].value == pytest.approx(0.2)


def test_prelu_refusals() -> None:
    shared = {"slope": np.array([0.2], np.float32)}
    assert_refused(load(make(PRELU, shared)), "prelu-to-leakyrelu", "target supports PRelu", target="onnx")
    per_channel = {"slope": rand(4, 1, 1, low=0.1)}
    assert_refused(load(make(PRELU, per_channel)), "prelu-to-leakyrelu", "slope is not shared (more than one element)")
    tiny = Target("tiny", frozenset({"Add", "Mul"}), {})
    assert_refused(load(make(PRELU, shared)), "prelu-to-leakyrelu", "target lacks LeakyRelu", target=tiny)
    varying = PRELU.replace("(float[2,4,3,3] x)", "(float[2,4,3,3] x, float[1] slope)")
    model = load(make(varying))
    assert not run_pass(model).changed  # slope not constant: no match


# -------------------------------------------------------------------------------------- Gemm / MatMul -> Conv

GEMM = """
<ir_version: 8, opset_import: ["" : OPSET]>
g (float[M,8] a) => (float[M,5] y) { y = Gemm<ATTRS>(a, w, c) }
"""


@pytest.mark.parametrize(("opset", "attrs", "w_shape", "c_shape"), [
    (9, "transB = 1", (5, 8), (5,)),
    (17, "alpha = 0.5, beta = 2.0", (8, 5), (1, 5)),
    (13, "transB = 1", (5, 8), (1,)),
])
def test_gemm_to_conv(opset: int, attrs: str, w_shape, c_shape) -> None:
    text = GEMM.replace("OPSET", str(opset)).replace("ATTRS", attrs)
    model = positive(make(text, {"w": rand(*w_shape), "c": rand(*c_shape)}), "conv-centric", "gemm-to-conv", 1e-4)
    assert [n.op_type for n in model.graph] == ["Reshape", "Conv", "Reshape"]
    conv = next(n for n in model.graph if n.op_type == "Conv")
    assert conv.inputs[1].const_value.numpy().shape == (5, 8, 1, 1)


def test_gemm_without_bias_to_conv() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3,8] a) => (float[3,5] y) { y = Gemm(a, w) }"""
    model = positive(make(text, {"w": rand(8, 5)}), "conv-centric", "gemm-to-conv", 1e-4)
    assert len(next(n for n in model.graph if n.op_type == "Conv").inputs) == 2


def test_gemm_to_conv_refusals() -> None:
    base = GEMM.replace("OPSET", "17")
    inits = {"w": rand(5, 8), "c": rand(5)}
    rule = "gemm-to-conv"
    assert_refused(load(make(base.replace("ATTRS", "transB = 1"), inits)), rule, "target supports Gemm", "dlcc-c")
    assert_refused(load(make(base.replace("ATTRS", "transB = 1"), inits)), rule, "target supports Gemm", "onnx")
    transposed = base.replace("float[M,8] a", "float[8,M] a").replace("ATTRS", "transA = 1, transB = 1")
    assert_refused(load(make(transposed, inits)), rule, "input A is transposed", "conv-centric")
    varying_w = base.replace("(float[M,8] a)", "(float[M,8] a, float[5,8] w)").replace("ATTRS", "transB = 1")
    assert_refused(load(make(varying_w, {"c": rand(5)})), rule, "weight is not a constant matrix", "conv-centric")
    varying_c = base.replace("(float[M,8] a)", "(float[M,8] a, float[5] c)").replace("ATTRS", "transB = 1")
    assert_refused(load(make(varying_c, {"w": rand(5, 8)})), rule, "bias is not constant", "conv-centric")
    full = base.replace("float[M,8] a", "float[3,8] a").replace("float[M,5] y", "float[3,5] y")
    assert_refused(load(make(full.replace("ATTRS", "transB = 1"), {"w": rand(5, 8), "c": rand(3, 5)})), rule,
                   "bias is not per-column", "conv-centric")
    no_conv = Target("matmul-only", frozenset({"MatMul"}), {})  # lacks Gemm, and Conv too
    assert_refused(load(make(base.replace("ATTRS", "transB = 1"), inits)), rule, "target lacks Conv", no_conv)
    no_gemm = Target("no-gemm", None, {}, lacks=frozenset({"Gemm"}))  # lacking Gemm is reason enough
    model = load(make(base.replace("ATTRS", "transB = 1"), inits))
    assert run_pass(model, no_gemm).fired[rule] == 1


MATMUL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[SHAPE,8] a) => (float[SHAPE,5] y) { y = MatMul(a, w) }
"""


@pytest.mark.parametrize("shape", ["M", "2,3"])
def test_matmul_to_conv(shape: str) -> None:
    model = positive(make(MATMUL.replace("SHAPE", shape), {"w": rand(8, 5)}), "conv-centric", "matmul-to-conv",
                     1e-4)
    assert ops(model) == Counter({"Reshape": 2, "Conv": 1})


def test_matmul_to_conv_refusals() -> None:
    w = {"w": rand(8, 5)}
    rule = "matmul-to-conv"
    assert_refused(load(make(MATMUL.replace("SHAPE", "M"), w)), rule, "target supports MatMul", "onnx")
    assert_refused(load(make(MATMUL.replace("SHAPE", "B,S"), w)), rule, "input shape is not static", "conv-centric")
    vector = MATMUL.replace("float[SHAPE,8] a", "float[8] a").replace("float[SHAPE,5] y", "float[5] y")
    assert_refused(load(make(vector, w)), rule, "input is a vector", "conv-centric")
    varying = MATMUL.replace("SHAPE", "M").replace("(float[M,8] a)", "(float[M,8] a, float[8,5] w)")
    assert_refused(load(make(varying)), rule, "weight is not a constant matrix", "conv-centric")
    assert_refused(load(make(MATMUL.replace("SHAPE", "M"), w), unknown_rank=("a",)), rule, "input rank unknown",
                   "conv-centric")


def test_conv_centric_and_dlcc_c_do_not_undo_each_other() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8,6,6] x) => (float[2,5] y) {
        p = GlobalAveragePool(x)
        f = Flatten(p)
        y = Gemm<transB = 1>(f, w, c)
    }"""
    proto = make(text, {"w": rand(5, 8), "c": rand(5)})
    model = load(proto)
    assert run_pass(model, "conv-centric").changed
    assert run_pass(model, "dlcc-c").changed  # the 1x1 Conv on the pooled map goes back to a Gemm
    assert ops(model)["Gemm"] == 1 and ops(model)["Conv"] == 0
    assert_same(proto, model, 1e-4)


# ---------------------------------------------------------------------------------- 1x1 Conv after a pool

HEAD = """
<ir_version: 8, opset_import: ["" : OPSET]>
g (float[N,8,6,6] x) => (float[N,5,1,1] y) {
    p = POOL(x)
    y = Conv<kernel_shape = [1, 1]ATTRS>(p, w, b)
}
"""


def head(opset=17, pool="GlobalAveragePool", attrs="") -> str:
    return HEAD.replace("OPSET", str(opset)).replace("POOL", pool).replace("ATTRS", attrs)


@pytest.mark.parametrize("opset", [9, 17])
def test_conv1x1_to_gemm_keeps_4d_for_4d_consumers(opset: int) -> None:
    model = positive(make(head(opset), {"w": rand(5, 8, 1, 1), "b": rand(5)}), "dlcc-c", "conv1x1-to-gemm", 1e-4)
    assert [n.op_type for n in model.graph] == ["GlobalAveragePool", "Flatten", "Gemm", "Reshape"]


def test_conv1x1_without_bias_at_opset9_gets_zero_c() -> None:
    text = head(9, "GlobalMaxPool").replace("(p, w, b)", "(p, w)")
    model = positive(make(text, {"w": rand(5, 8, 1, 1)}), "dlcc-c", "conv1x1-to-gemm", 1e-4)
    gemm = next(n for n in model.graph if n.op_type == "Gemm")
    assert len(gemm.inputs) == 3 and not gemm.inputs[2].const_value.numpy().any()


@pytest.mark.parametrize("flatten", ["Flatten(c)", "Reshape(c, shape)"])
def test_conv1x1_to_gemm_at_a_flattening_consumer(flatten: str) -> None:
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3,8,6,6] x) => (float[3,5] y) {{
        p = GlobalAveragePool(x)
        c = Conv<kernel_shape = [1, 1]>(p, w, b)
        y = {flatten}
    }}"""
    inits = {"w": rand(5, 8, 1, 1), "b": rand(5), "shape": np.array([3, 5], np.int64)}
    model = positive(make(text, inits), "dlcc-c", "conv1x1-to-gemm", 1e-4)
    assert [n.op_type for n in model.graph] == ["GlobalAveragePool", "Flatten", "Gemm"]


def test_conv1x1_on_static_1x1_map() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8,7,7] x) => (float[2,5,1,1] y) {
        p = AveragePool<kernel_shape = [7, 7]>(x)
        y = Conv<kernel_shape = [1, 1]>(p, w)
    }"""
    positive(make(text, {"w": rand(5, 8, 1, 1)}), "dlcc-c", "conv1x1-to-gemm", 1e-4)


def test_conv1x1_to_gemm_refusals() -> None:
    rule = "conv1x1-to-gemm"
    inits = {"w": rand(5, 8, 1, 1), "b": rand(5)}
    assert_refused(load(make(head(), inits)), rule, "target does not prefer Gemm over Conv", "onnx")
    grouped = head(attrs=", group = 2").replace("float[N,5,1,1]", "float[N,6,1,1]")
    assert_refused(load(make(grouped, {"w": rand(6, 4, 1, 1), "b": rand(6)})), rule, "grouped Conv")
    padded = head(attrs=", pads = [1, 1, 1, 1]").replace("float[N,5,1,1]", "float[N,5,3,3]")
    assert_refused(load(make(padded, inits)), rule, "Conv pads the input")
    varying = head().replace("(float[N,8,6,6] x)", "(float[N,8,6,6] x, float[5,8,1,1] w)")
    assert_refused(load(make(varying, {"b": rand(5)})), rule, "weight is not a constant 1x1 kernel")
    big = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8,6,6] x) => (float[2,5,6,6] y) { y = Conv<kernel_shape = [1, 1]>(x, w) }"""
    model = load(make(big, {"w": rand(5, 8, 1, 1)}))
    assert not run_pass(model).changed  # not a 1x1 map: no match at all


# --------------------------------------------------------------------------------------- channel shuffle

SHUFFLE = """
<ir_version: 8, opset_import: ["" : OPSET]>
g (float[N,12,5,5] x) => (float[N,12,5,5] y) {
    r = Relu(x)
    a = Reshape(r, s1)
    t = Transpose<perm = [0, 2, 1, 3, 4]>(a)
    y = Reshape(t, s2)
}
"""
SHUFFLE_INITS = {"s1": np.array([0, 3, 4, 5, 5], np.int64), "s2": np.array([0, 12, 5, 5], np.int64)}


@pytest.mark.parametrize("opset", [9, 17])
def test_channel_shuffle_round_trip(opset: int) -> None:
    proto = make(SHUFFLE.replace("OPSET", str(opset)), SHUFFLE_INITS)
    model = load(proto)
    p = run_pass(model, "dlcc-c")
    assert p.fired["channel-shuffle-to-op"] == 1
    assert [(n.domain, n.op_type) for n in model.graph] == [("", "Relu"), (DLCC_DOMAIN, "ChannelShuffle")]
    shuffle = list(model.graph)[1]
    assert shuffle.attributes["group"].value == 3 and shuffle.inputs[0] is list(model.graph)[0].outputs[0]
    assert model.opset_imports[DLCC_DOMAIN] == 1 and model.graph.outputs[0].name == "y"
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    assert not run_pass(model, "dlcc-c").changed
    # back to standard ONNX for a target without the op
    p = run_pass(model, "onnx")
    assert p.fired["channel-shuffle-to-idiom"] == 1
    assert [n.op_type for n in model.graph] == ["Relu", "Reshape", "Transpose", "Reshape"]
    assert DLCC_DOMAIN not in model.opset_imports
    assert_same(proto, model, 1e-5)
    assert not run_pass(model, "onnx").changed


def test_channel_shuffle_symbolic_spatial_round_trip() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8,H,W] x) => (float[2,8,H,W] y) {
        a = Reshape(x, s1)
        t = Transpose<perm = [0, 2, 1, 3]>(a)
        s2 = Shape(x)
        y = Reshape(t, s2)
    }"""
    proto = make(text, {"s1": np.array([0, 2, 4, -1], np.int64)})
    model = load(proto)
    assert run_pass(model, "dlcc-c").fired["channel-shuffle-to-op"] == 1
    assert [n.op_type for n in model.graph] == ["ChannelShuffle"]
    assert run_pass(model, "onnx").fired["channel-shuffle-to-idiom"] == 1
    assert ops(model) == Counter({"Reshape": 2, "Transpose": 1, "Shape": 1})
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    feeds = {"x": rand(2, 8, 3, 4)}
    np.testing.assert_array_equal(run_ort(proto, feeds)["y"], run_ort(after, feeds)["y"])


def test_channel_shuffle_refusals() -> None:
    rule = "channel-shuffle-to-op"
    text = SHUFFLE.replace("OPSET", "17")
    assert_refused(load(make(text, SHUFFLE_INITS)), rule, "target prefers the Reshape/Transpose form", "onnx")
    shared = text.replace("=> (float[N,12,5,5] y)", "=> (float[N,12,5,5] y, float[N,4,3,5,5] u)").replace(
        "y = Reshape(t, s2)", "y = Reshape(t, s2)\n    u = Identity(t)")
    assert_refused(load(make(shared, SHUFFLE_INITS)), rule, "intermediate values have other uses")
    no_split = dict(SHUFFLE_INITS, s1=np.array([0, 3, 5, 4, 5], np.int64))  # splits C*H, not C
    assert_refused(load(make(text, no_split)), rule, "first Reshape does not split the channels")
    flat = text.replace("=> (float[N,12,5,5] y)", "=> (float[N,12,25] y)")
    assert_refused(load(make(flat, dict(SHUFFLE_INITS, s2=np.array([0, 12, 25], np.int64)))), rule,
                   "last Reshape does not restore the input shape")
    other_perm = text.replace("perm = [0, 2, 1, 3, 4]", "perm = [0, 1, 2, 4, 3]")
    assert not run_pass(load(make(other_perm, SHUFFLE_INITS))).changed  # not the idiom: no match


def test_channel_shuffle_op_refusals() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17, "dlcc" : 1]>
    g (float[N,C,4,4] x, float[2,12,4,4] z) => (float[N,C,4,4] y, float[2,12,4,4] w) {
        y = dlcc.ChannelShuffle<group = 2>(x)
        w = dlcc.ChannelShuffle<group = 5>(z)
    }"""
    model = load(make(text))
    p = run_pass(model, "onnx")
    assert not p.changed
    assert p.refused[("channel-shuffle-to-idiom", "channel count unknown")] == 1
    assert p.refused[("channel-shuffle-to-idiom", "group does not divide the channels")] == 1
    assert_refused(load(make(text)), "channel-shuffle-to-idiom", "target supports dlcc::ChannelShuffle", "dlcc-c")


# ------------------------------------------------------------------------------------------- grouped Conv

GCONV = """
<ir_version: 8, opset_import: ["" : OPSET]>
g (float[2,CIN,7,7] x) => (float[2,COUT,4,4] y) {
    y = Conv<kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2], group = G>(x, w, b)
}
"""


def gconv(opset: int, cin: int, cout: int, g: int) -> str:
    return (GCONV.replace("OPSET", str(opset)).replace("CIN", str(cin)).replace("COUT", str(cout))
            .replace("G>", f"{g}>"))


@pytest.mark.parametrize(("opset", "cin", "cout", "g"), [(9, 6, 4, 2), (17, 6, 9, 3), (13, 4, 8, 4), (18, 5, 5, 5)])
def test_grouped_conv_split(opset: int, cin: int, cout: int, g: int) -> None:
    inits = {"w": rand(cout, cin // g, 3, 3), "b": rand(cout)}
    model = positive(make(gconv(opset, cin, cout, g), inits), "no-groups", "grouped-conv-split", 1e-5)
    assert ops(model) == Counter({"Split": 1, "Conv": g, "Concat": 1})
    assert all(attr_group(n) == 1 for n in model.graph if n.op_type == "Conv")


def attr_group(node: ir.Node) -> int:
    a = node.attributes.get("group")
    return 1 if a is None else a.value


def test_grouped_conv_without_bias() -> None:
    text = gconv(17, 4, 4, 2).replace("(x, w, b)", "(x, w)")
    positive(make(text, {"w": rand(4, 2, 3, 3)}), "no-groups", "grouped-conv-split", 1e-5)


def test_grouped_conv_refusals() -> None:
    rule = "grouped-conv-split"
    text = gconv(17, 6, 4, 2)
    inits = {"w": rand(4, 3, 3, 3), "b": rand(4)}
    for target in ("onnx", "dlcc-c"):
        assert_refused(load(make(text, inits)), rule, "target supports grouped Conv", target)
    varying_w = text.replace("(float[2,6,7,7] x)", "(float[2,6,7,7] x, float[4,3,3,3] w)")
    assert_refused(load(make(varying_w, {"b": rand(4)})), rule, "weight is not constant", "no-groups")
    varying_b = text.replace("(float[2,6,7,7] x)", "(float[2,6,7,7] x, float[4] b)")
    assert_refused(load(make(varying_b, {"w": rand(4, 3, 3, 3)})), rule, "bias is not constant", "no-groups")
    symbolic = text.replace("float[2,6,7,7] x", "float[2,C,7,7] x")
    assert_refused(load(make(symbolic, inits)), rule, "channel count unknown", "no-groups")


# --------------------------------------------------------------------------------------------- Pad upgrade

PAD = """
<ir_version: 7, opset_import: ["" : 10]>
g (float[2,3,4,4] x) => (float[2,3,6,8] y) {
    p = Pad<pads = [0, 0, 1, 2, 0, 0, 1, 2], MODE>(x)
    y = Relu(p)
}
"""


@pytest.mark.parametrize("mode", ['value = 1.5', 'mode = "reflect"', 'mode = "edge"'])
def test_pad_upgrade_with_opset(mode: str) -> None:
    proto = make(PAD.replace("MODE", mode))
    model = load(proto)
    p = run_pass(model, "onnx", upgrade_opset_to=11)
    assert p.fired["pad-attrs-to-inputs"] == 1 and p.fired["raise-opset"] == 1
    assert model.opset_imports[""] == 11
    pad = next(n for n in model.graph if n.op_type == "Pad")
    assert "pads" not in pad.attributes and pad.inputs[1].const_value.numpy().tolist() == [0, 0, 1, 2, 0, 0, 1, 2]
    assert_same(proto, model, 1e-5)
    assert not run_pass(model, "onnx", upgrade_opset_to=11).changed


def test_pad_upgrade_off_by_default_and_refusals() -> None:
    text = PAD.replace("MODE", "value = 1.5")
    model = load(make(text))
    assert not run_pass(model, "onnx").changed and model.opset_imports[""] == 10
    assert not upgrade_pad(model, 10)  # not raising past 10: Pad keeps its attribute form
    assert upgrade_pad(model, 11)  # the step alone: the caller then sets the opset
    conv = text.replace("y = Relu(p)", "y = Conv<kernel_shape = [1, 1]>(p, w)").replace("float[2,3,6,8] y",
                                                                                       "float[2,1,6,8] y")
    model = load(make(conv, {"w": rand(1, 3, 1, 1)}))
    assert_refused(model, "raise-opset", "Conv changes between opset 10 and 11", "onnx", upgrade_opset_to=11)
    assert model.opset_imports[""] == 10


# ------------------------------------------------------------------------------------------- light models


@pytest.mark.parametrize(("name", "bn"), [("shufflenet", 49), ("resnet50", 53)])
def test_light_models_dlcc_c(name: str, bn: int) -> None:
    model = load(onnx.load(light_model_path(name)))  # weights: ConstantOfShape fills
    before = ops(model)
    p = run_pass(model, "dlcc-c")
    after = ops(model)
    assert p.fired["batchnorm-to-mul-add"] == bn == before["BatchNormalization"]
    assert after["BatchNormalization"] == 0 and after["Mul"] == bn and after["Add"] == bn
    if name == "shufflenet":
        assert p.fired["channel-shuffle-to-op"] == 16 and after["ChannelShuffle"] == 16
        assert after["Transpose"] == 0 and model.opset_imports[DLCC_DOMAIN] == 1
    assert after["Conv"] == before["Conv"] and after["Gemm"] == before["Gemm"] == 1
    assert not run_pass(model, "dlcc-c").changed


@pytest.mark.parametrize("name", ["shufflenet", "resnet50"])
def test_light_models_onnx_target_changes_nothing(name: str) -> None:
    model = load(onnx.load(light_model_path(name)))
    before = [(n.op_type, [v.name for v in n.inputs if v is not None]) for n in model.graph]
    assert not run_pass(model, "onnx").changed
    assert [(n.op_type, [v.name for v in n.inputs if v is not None]) for n in model.graph] == before
    assert dict(model.opset_imports) == {"": 9}


def test_light_shufflenet_no_groups() -> None:
    model = load(onnx.load(light_model_path("shufflenet")))
    p = run_pass(model, "no-groups")
    assert p.fired["grouped-conv-split"] == 48  # 32 pointwise group-4 Convs and 16 depthwise ones
    assert all(attr_group(n) == 1 for n in model.graph if n.op_type == "Conv")
    assert ops(model)["Split"] == ops(model)["Concat"] - 3 == 48  # the model has 3 Concats of its own


@pytest.mark.slow
@pytest.mark.parametrize(("name", "targets"), [("shufflenet", ("dlcc-c", "onnx")), ("resnet50", ("dlcc-c",))])
def test_light_models_random_weights_equivalent(name: str, targets: tuple[str, ...]) -> None:
    proto = light_model(name)
    model = load(proto)
    for target in targets:
        run_pass(model, target)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    feeds = light_input(name)
    ref, got = run_ort(proto, feeds), run_ort(after, feeds)
    for k in ref:
        d = diff(k, ref[k], got[k], rtol=1e-4, atol=1e-6)
        assert d.ok, d
