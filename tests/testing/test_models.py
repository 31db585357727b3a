"""The kit's hand-built models: valid, static-shaped, runnable, and computing what their names say."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dlcc.check import diff, random_inputs, run_ort
from dlcc.testing import (
    KIT_MODELS,
    attention_block,
    conv_bn_relu_stack,
    convnext_block_stack,
    deeplabv3_head,
    depthwise_separable_block,
    efficientnet_b0,
    gelu_erf,
    gelu_tanh,
    layernorm_primitive,
    mlp,
    mobilenet_v2,
    mobilenet_v3_small,
    residual_block,
    resnet18,
    shufflenet_v2,
    squeezenet,
    transformer_encoder_block,
)


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def inferred_shapes(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Every value's shape after strict shape inference with data propagation."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    g = inferred.graph
    shapes = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                               for d in tt.shape.dim]
    return shapes


def assert_ok(name: str, ref: np.ndarray, got: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    d = diff(name, ref, got, rtol=rtol, atol=atol)
    assert d.ok, f"{name}: max abs {d.max_abs:.3g} vs scale {d.scale:.3g} ({d.reason})"


@pytest.mark.parametrize("name", sorted(KIT_MODELS))
def test_kit_model_is_valid_static_and_runs(name):
    model = KIT_MODELS[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] in ([("", 17)], [("", 18)])
    shapes = inferred_shapes(model)
    produced = [o for n in model.graph.node for o in n.output]
    missing = [v for v in produced if v not in shapes]
    assert not missing, f"no inferred shape for {missing}"
    dynamic = {v: s for v, s in shapes.items() if not all(isinstance(d, int) and d > 0 for d in s)}
    assert not dynamic, f"non-static shapes: {dynamic}"
    outs = run_ort(model, random_inputs(model, seed=0))
    for out_name, value in outs.items():
        assert np.isfinite(value).all(), out_name
        assert np.ptp(value) > 0, f"{out_name} is constant"


@pytest.mark.parametrize("builder", [mlp, conv_bn_relu_stack, residual_block, depthwise_separable_block,
                                     attention_block, transformer_encoder_block])
def test_symbolic_batch_only_batch_is_symbolic(builder):
    model = builder(batch="N")
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "N"
    for name, shape in inferred_shapes(model).items():
        if shape and not isinstance(shape[0], int):
            assert all(isinstance(d, int) for d in shape[1:]), (name, shape)
        else:
            assert all(isinstance(d, int) for d in shape), (name, shape)
    feeds = random_inputs(model, seed=1, shapes={i.name: [3, *[d.dim_value for d in
                                                            i.type.tensor_type.shape.dim[1:]]]
                                                 for i in model.graph.input})
    for value in run_ort(model, feeds).values():
        assert value.shape[0] == 3 and np.isfinite(value).all()


def test_mlp_structure():
    assert ops(mlp()) == Counter({"Relu": 2, "MatMul": 3, "Add": 3})
    assert ops(mlp(gemm_layer=True)) == Counter({"Gemm": 1, "Relu": 2, "MatMul": 2, "Add": 2})
    assert mlp(hidden=(8, 8, 8), out_features=3).graph.output[0].type.tensor_type.shape.dim[1].dim_value == 3


def test_conv_stack_structure():
    model = conv_bn_relu_stack()
    c = ops(model)
    assert c["Conv"] == 3 and c["BatchNormalization"] == 3 and c["Relu"] == 3
    assert c["MaxPool"] == 1 and c["GlobalAveragePool"] == 1 and c["Flatten"] == 1 and c["Gemm"] == 1
    conv_inputs = sorted(len(n.input) for n in model.graph.node if n.op_type == "Conv")
    assert conv_inputs == [2, 3, 3], "convs with and without bias"


def test_residual_variants():
    plain = residual_block()
    assert ops(plain)["Conv"] == 2 and ops(plain)["Add"] == 1
    add = next(n for n in plain.graph.node if n.op_type == "Add")
    assert plain.graph.input[0].name in add.input, "identity shortcut"
    proj = residual_block(projection=True)
    assert ops(proj)["Conv"] == 3 and ops(proj)["BatchNormalization"] == 3
    dims = [d.dim_value for d in proj.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 32, 8, 8]
    with pytest.raises(ValueError):
        residual_block(out_channels=8)


def test_depthwise_structure():
    model = depthwise_separable_block(channels=12, out_channels=24)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    groups = [next((a.i for a in n.attribute if a.name == "group"), 1) for n in convs]
    assert groups == [12, 1]
    clip = next(n for n in model.graph.node if n.op_type == "Clip")
    assert len(clip.input) == 3
    outs = run_ort(model, random_inputs(model, seed=0))
    assert all(np.all(v >= 0) for v in outs.values())


def test_gelu_erf_matches_formula():
    model = gelu_erf()
    x = np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32) * 3
    got = run_ort(model, {"x": x})["y"]
    erf = np.vectorize(math.erf)
    x64 = x.astype(np.float64)
    assert_ok("gelu_erf", x64 * 0.5 * (1 + erf(x64 / math.sqrt(2))), got)
    assert ops(model)["Erf"] == 1


def test_gelu_tanh_matches_formula():
    model = gelu_tanh()
    x = np.random.default_rng(1).standard_normal((2, 8, 32)).astype(np.float32) * 3
    got = run_ort(model, {"x": x})["y"]
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    assert_ok("gelu_tanh", ref, got)
    assert ops(model)["Tanh"] == 1 and ops(model)["Pow"] == 1


@pytest.mark.parametrize("opset", [17, 18])
def test_layernorm_matches_numpy(opset):
    model = layernorm_primitive(opset=opset, eps=1e-5)
    assert model.opset_import[0].version == opset
    means = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert len(means) == 2
    for n in means:  # axes: an attribute at 17, an input at 18
        assert (len(n.input) == 2) == (opset == 18)
        assert any(a.name == "axes" for a in n.attribute) == (opset == 17)
    assert set(ops(model)) == {"ReduceMean", "Sub", "Pow", "Add", "Sqrt", "Div", "Mul", "Constant"}
    w = initializers(model)
    x = np.random.default_rng(2).standard_normal((2, 8, 32)).astype(np.float32) * 2 + 1
    got = run_ort(model, {"x": x})["y"]
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    ref = (x64 - mu) / np.sqrt(var + 1e-5) * w["ln_gamma"] + w["ln_beta"]
    assert_ok("layernorm", ref, got)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_attention_matches_numpy():
    batch, seq, d_model, heads = 2, 8, 32, 4
    model = attention_block(batch=batch, seq=seq, d_model=d_model, heads=heads)
    c = ops(model)
    assert c["MatMul"] == 6 and c["Softmax"] == 1 and c["Reshape"] == 4 and c["Transpose"] == 4
    w = {k: v.astype(np.float64) for k, v in initializers(model).items() if v.dtype == np.float32}
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, seq, d_model)).astype(np.float32)
    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[1, ..., -3:] = -10000.0
    got = run_ort(model, {"x": x, "mask": mask})["y"]
    dh = d_model // heads

    def split(name):
        y = x.astype(np.float64) @ w[f"attn_{name}_weight"] + w[f"attn_{name}_bias"]
        return y.reshape(batch, seq, heads, dh).transpose(0, 2, 1, 3)

    q, k, v = split("q"), split("k"), split("v")
    p = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + mask)
    ctx = (p @ v).transpose(0, 2, 1, 3).reshape(batch, seq, d_model)
    ref = ctx @ w["attn_out_weight"] + w["attn_out_bias"]
    assert_ok("attention", ref, got)


def _encoder_feeds(batch: int = 2, seq: int = 16, vocab: int = 100, seed: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[1, -5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_transformer_encoder_idioms():
    model = transformer_encoder_block()
    c = ops(model)
    for op in ("Gather", "Shape", "Unsqueeze", "Concat", "Reshape", "Softmax", "Erf", "Sqrt", "Pow", "Cast"):
        assert c[op] >= 1, op
    assert c["ReduceMean"] == 6, "three primitive LayerNorms"
    assert [i.type.tensor_type.elem_type for i in model.graph.input] == [onnx.TensorProto.INT64] * 2
    assert ops(transformer_encoder_block(mask_style="where"))["Where"] == 1


def test_transformer_encoder_ignores_padding_and_mask_styles_agree():
    feeds = _encoder_feeds()
    arith = transformer_encoder_block()
    where = transformer_encoder_block(mask_style="where", opset=18)
    out = run_ort(arith, feeds)["hidden"]
    assert np.isfinite(out).all()
    assert_ok("where vs arith", out, run_ort(where, feeds)["hidden"])
    # Other tokens at padded positions change nothing at the real positions.
    changed = dict(feeds)
    changed["input_ids"] = feeds["input_ids"].copy()
    changed["input_ids"][1, -5:] = (changed["input_ids"][1, -5:] + 7) % 100
    out2 = run_ort(arith, changed)["hidden"]
    assert_ok("padding", out[1, :-5], out2[1, :-5])
    assert not np.allclose(out[1, -5:], out2[1, -5:])


def test_builders_are_deterministic_and_seeded():
    assert mlp().SerializeToString() == mlp().SerializeToString()
    assert mlp(seed=1).SerializeToString() != mlp().SerializeToString()
    with pytest.raises(ValueError):
        layernorm_primitive(opset=16)


# ----------------------------------------------------------------------- real architectures at real sizes

# (builder, torchvision's published parameter count: BatchNormalization statistics are buffers, not
# parameters; the ConvNeXt and DeepLab figures are this kit's partial models, counted by hand)
SIZED = {
    "mobilenet_v2": (mobilenet_v2, 3_504_872),
    "mobilenet_v3_small": (mobilenet_v3_small, 2_542_856),
    "efficientnet_b0": (efficientnet_b0, 5_288_548),
    "resnet18": (resnet18, 11_689_512),
    "shufflenet_v2": (shufflenet_v2, 2_278_604),
    "squeezenet": (squeezenet, 1_235_496),
    "convnext_block_stack": (convnext_block_stack, 1_428_424),
    "deeplabv3_head": (deeplabv3_head, 16_130_845),
}


def parameters(model: onnx.ModelProto) -> int:
    """Float initializer elements, BatchNormalization running mean and variance excluded."""
    stats = {i for n in model.graph.node if n.op_type == "BatchNormalization" for i in n.input[3:5]}
    return sum(v.size for k, v in initializers(model).items() if v.dtype == np.float32 and k not in stats)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SIZED))
def test_sized_model_is_valid_static_full_size_and_runs(name):
    builder, params = SIZED[name]
    model = builder()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8 and [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert parameters(model) == params
    shapes = inferred_shapes(model)
    produced = [o for n in model.graph.node for o in n.output]
    assert all(v in shapes and all(isinstance(d, int) and d > 0 for d in shapes[v]) for v in produced)
    (inp,) = model.graph.input
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == \
        ([1, 2048, 28, 28] if name == "deeplabv3_head" else [1, 3, 224, 224])
    (out,) = run_ort(model, random_inputs(model, seed=0)).values()
    assert out.shape == ((1, 21, 224, 224) if name == "deeplabv3_head" else (1, 1000))
    assert np.isfinite(out).all() and np.ptp(out) > 0
    assert 0.05 < float(np.sqrt(np.mean(out.astype(np.float64) ** 2))) < 100, "activations drifted"


def _attr(node: onnx.NodeProto, name: str, default=None):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def test_sized_model_structure():
    c = ops(mobilenet_v2())
    assert c["Conv"] == 52 and c["BatchNormalization"] == 52 and c["Clip"] == 35 and c["Add"] == 10
    c = ops(mobilenet_v3_small())
    assert c["HardSigmoid"] == 9 and c["HardSwish"] == 19 and c["Add"] == 6 and c["GlobalAveragePool"] == 10
    hs = next(n for n in mobilenet_v3_small().graph.node if n.op_type == "HardSigmoid")
    assert math.isclose(_attr(hs, "alpha"), 1 / 6, rel_tol=1e-6) and _attr(hs, "beta") == 0.5
    c = ops(efficientnet_b0())
    assert c["Sigmoid"] == c["Mul"] == 65 and c["GlobalAveragePool"] == 17 and c["Add"] == 9
    c = ops(resnet18())
    assert c["Conv"] == 20 and c["Add"] == 8 and c["MaxPool"] == 1
    c = ops(shufflenet_v2())
    assert c["Split"] == 13 and c["Concat"] == c["Transpose"] == 16 and c["Reshape"] == 32
    c = ops(squeezenet())
    assert c["Concat"] == 8 and c["MaxPool"] == 3 and "BatchNormalization" not in c
    c = ops(convnext_block_stack())
    assert c["LayerNormalization"] == 9 and c["Erf"] == 6 and c["MatMul"] == 12
    model = deeplabv3_head()
    dilations = sorted(_attr(n, "dilations", [1, 1])[0] for n in model.graph.node if n.op_type == "Conv")
    assert dilations == [1] * 5 + [12, 24, 36]
    resizes = [n for n in model.graph.node if n.op_type == "Resize"]
    assert len(resizes) == 2 and all(_attr(n, "mode") == b"linear" for n in resizes)
