"""randomize: seeded, role-aware random weights; ConstantOfShape weights of legacy models materialized."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dlcc.check import random_inputs, run_ort
from dlcc.testing import KIT_MODELS, conv_bn_relu_stack, randomize

SMALL_KIT = ["mlp", "conv_bn_relu", "residual_proj", "depthwise_separable", "attention", "layernorm",
             "transformer_encoder"]


def arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {}
    for n in model.graph.node:
        if n.op_type == "Constant":
            a = n.attribute[0]
            out[n.output[0]] = numpy_helper.to_array(a.t) if a.name == "value" else np.asarray(a.floats)
    return out


def run(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    return run_ort(model, random_inputs(model, seed))


@pytest.mark.parametrize("name", SMALL_KIT)
def test_seeded_deterministic_and_input_untouched(name):
    model = KIT_MODELS[name]()
    before = model.SerializeToString()
    a = randomize(model, seed=0)
    assert model.SerializeToString() == before, "the argument was modified"
    assert randomize(model, seed=0).SerializeToString() == a.SerializeToString()
    b = randomize(model, seed=1)
    wa, wb = arrays(a), arrays(b)
    floats = [k for k, v in wa.items() if v.dtype == np.float32 and v.size > 1]
    assert floats and all(not np.array_equal(wa[k], wb[k]) for k in floats)


@pytest.mark.parametrize("name", sorted(KIT_MODELS))
def test_weights_change_structure_stays(name):
    model = KIT_MODELS[name]()
    out = randomize(model, seed=3)
    onnx.checker.check_model(out, full_check=True)
    old, new = arrays(model), arrays(out)
    assert list(old) == list(new), "same initializers, same order"
    for k, v in old.items():
        assert new[k].dtype == v.dtype and new[k].shape == v.shape, k
        if v.dtype.kind in "iub" or v.size <= 1:
            assert np.array_equal(new[k], v), f"{k} must be kept"
        else:
            assert not np.allclose(new[k], v), f"{k} was not randomized"
    for k, v in constants(model).items():  # the kit's constants are all scalars
        assert np.array_equal(constants(out)[k], v)
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert out.graph.input == model.graph.input and out.graph.output == model.graph.output
    assert out.ir_version == model.ir_version and out.opset_import == model.opset_import
    for k, value in run(out).items():
        assert np.isfinite(value).all(), k
        assert np.ptp(value) > 0, f"{k} is constant"


def test_roles_give_sane_values():
    model = randomize(conv_bn_relu_stack(channels=(8, 16, 16)), seed=5, calibrate_bn=False)
    w = arrays(model)
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            scale, bias, mean, var = (w[i] for i in n.input[1:])
            assert np.all((scale >= 0.5) & (scale <= 1.5))
            assert np.all((var >= 0.5) & (var <= 1.5))
            assert abs(mean).max() < 0.25 and abs(bias).max() < 0.25
        if n.op_type == "Conv":
            weight = w[n.input[1]]
            fan_in = math.prod(weight.shape[1:])
            if weight.size > 1000:
                assert weight.std() == pytest.approx(math.sqrt(2 / fan_in), rel=0.1)
            assert abs(weight.mean()) < 0.1 * weight.std() + 1e-3
        if n.op_type == "Gemm":  # weight stored [out, in] with transB=1: fan-in is the second dim
            weight = w[n.input[1]]
            assert weight.std() == pytest.approx(math.sqrt(2 / weight.shape[1]), rel=0.2)


def test_only_bn_statistics_depend_on_calibration():
    model = conv_bn_relu_stack()
    on, off = arrays(randomize(model, seed=2)), arrays(randomize(model, seed=2, calibrate_bn=False))
    stats = {i for n in model.graph.node if n.op_type == "BatchNormalization" for i in n.input[3:5]}
    for k in on:
        assert np.array_equal(on[k], off[k]) == (k not in stats), k
    assert all(np.all(on[k] > 0) for k in stats if "var" in k)


def test_calibrated_batchnorm_normalizes():
    """After calibration each BN output has a per-tensor RMS near its scale's (not 1e4 as it can be)."""
    model = randomize(conv_bn_relu_stack(channels=(8, 16, 32, 32)), seed=0)
    bn_outputs = [n.output[0] for n in model.graph.node if n.op_type == "BatchNormalization"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in bn_outputs)
    outs = run(probe)
    for o in bn_outputs:
        rms = float(np.sqrt(np.mean(outs[o].astype(np.float64) ** 2)))
        assert 0.4 < rms < 2.5, (o, rms)


# --------------------------------------------------------------------- legacy ConstantOfShape weights


def legacy_model() -> onnx.ModelProto:
    """A light-model lookalike: IR 3, opset 9, initializers listed as inputs, weights ConstantOfShape."""
    fill = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.02])
    ints = {
        "conv_w__SHAPE": [8, 3, 3, 3], "conv_b__SHAPE": [8],
        "bn__SHAPE": [8],  # shared by three ConstantOfShape nodes
        "fc_w__SHAPE": [1280], "fc_w__TARGET": [10, 128],  # the weight is made flat, then reshaped
        "fc_b__SHAPE": [10],  # also the target of the final Reshape: must stay
        "flat": [1, 128],
    }
    inits = [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in ints.items()]
    inits.append(numpy_helper.from_array(np.full(8, 0.5, np.float32), "bn_scale"))  # a real initializer

    def cos(shape: str, out: str) -> onnx.NodeProto:
        return helper.make_node("ConstantOfShape", [shape], [out], value=fill)

    nodes = [
        cos("conv_w__SHAPE", "conv_w"), cos("conv_b__SHAPE", "conv_b"), cos("bn__SHAPE", "bn_bias"),
        cos("bn__SHAPE", "bn_mean"), cos("bn__SHAPE", "bn_var"), cos("fc_w__SHAPE", "fc_w_flat"),
        cos("fc_b__SHAPE", "fc_b"),
        helper.make_node("Reshape", ["fc_w_flat", "fc_w__TARGET"], ["fc_w"]),
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Reshape", ["r", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Reshape", ["logits", "fc_b__SHAPE"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "legacy", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_constant_of_shape_weights_are_materialized():
    model = legacy_model()
    out = randomize(model, seed=0)
    onnx.checker.check_model(out, full_check=True)
    assert out.ir_version == 3
    assert not [n for n in out.graph.node if n.op_type == "ConstantOfShape"]
    w = arrays(out)
    gone = {"conv_w__SHAPE", "conv_b__SHAPE", "bn__SHAPE", "fc_w__SHAPE"}
    assert not gone & set(w) and not gone & {i.name for i in out.graph.input}
    for kept in ("fc_b__SHAPE", "fc_w__TARGET", "flat"):
        assert kept in w
    # IR 3: every initializer is a graph input (so onnxruntime treats them all as constants).
    assert set(w) <= {i.name for i in out.graph.input}
    shapes = {"conv_w": (8, 3, 3, 3), "conv_b": (8,), "bn_bias": (8,), "bn_mean": (8,), "bn_var": (8,),
              "fc_w_flat": (1280,), "fc_b": (10,)}
    for name, shape in shapes.items():
        assert w[name].shape == shape and w[name].dtype == np.float32
        assert np.unique(w[name]).size == w[name].size, f"{name} is not random"
    assert np.all(w["bn_var"] > 0)
    assert not np.array_equal(w["bn_scale"], np.full(8, 0.5, np.float32))
    # fan-in seen through the Reshape: the Gemm's K is 128, not 1280 or 10.
    assert w["fc_w_flat"].std() == pytest.approx(math.sqrt(2 / 128), rel=0.15)
    assert w["conv_w"].std() == pytest.approx(math.sqrt(2 / 27), rel=0.25)
    y = run(out)["y"]
    assert np.isfinite(y).all() and np.ptp(y) > 0
    assert randomize(model, seed=0).SerializeToString() == out.SerializeToString()
    assert legacy_model().SerializeToString() == model.SerializeToString()


def test_ir4_created_initializers_are_not_inputs():
    model = legacy_model()
    model.ir_version = 4
    keep = [i for i in model.graph.input if i.name in ("x", "bn_scale")]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    out = randomize(model)
    onnx.checker.check_model(out, full_check=True)
    inputs = {i.name for i in out.graph.input}
    assert "conv_w" in arrays(out) and "conv_w" not in inputs
    assert inputs == {"x", "bn_scale"}, "existing graph inputs are kept"
    assert np.isfinite(run(out)["y"]).all()


def test_ir4_overridable_shape_is_not_a_constant():
    model = legacy_model()
    model.ir_version = 4  # every initializer is a graph input: each can be overridden at run time
    out = randomize(model)
    onnx.checker.check_model(out, full_check=True)
    assert sum(n.op_type == "ConstantOfShape" for n in out.graph.node) == 7
    assert not np.array_equal(arrays(out)["bn_scale"], arrays(model)["bn_scale"])


def structural_model() -> onnx.ModelProto:
    """Constants whose values are the point (exponents, bounds, scales) next to ones that are weights."""
    f = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(np.asarray(2.0, np.float32), "exponent"),
        numpy_helper.from_array(np.full((4,), 3.0, np.float32), "divisor"),
        numpy_helper.from_array(np.full((4,), 1.0, np.float32), "gamma"),
        numpy_helper.from_array(np.asarray(-1.5, np.float32), "lo"),
        numpy_helper.from_array(np.asarray(1.5, np.float32), "hi"),
        numpy_helper.from_array(np.asarray([1, 1, 2, 2], np.float32), "scales"),
        numpy_helper.from_array(np.full((4, 4), 0.1, np.float32), "w"),
        numpy_helper.from_array(np.full((4, 4), 0.1, np.float16), "w16"),
        numpy_helper.from_array(np.full((4,), 1.0, np.float64), "w64"),
    ]
    nodes = [
        helper.make_node("Constant", [], ["c_vec"], value=numpy_helper.from_array(np.full(4, 7, np.float32))),
        helper.make_node("Constant", [], ["c_one"], value=numpy_helper.from_array(np.float32(7.0))),
        helper.make_node("Constant", [], ["c_floats"], value_floats=[2.0, 2.0, 2.0, 2.0]),
        helper.make_node("Pow", ["x", "exponent"], ["p"]),
        helper.make_node("Div", ["p", "divisor"], ["d"]),
        helper.make_node("Mul", ["d", "gamma"], ["m"]),
        helper.make_node("Add", ["m", "c_vec"], ["a"]),
        helper.make_node("Sub", ["a", "c_floats"], ["a2"]),
        helper.make_node("Add", ["a2", "c_one"], ["a3"]),
        helper.make_node("Clip", ["a3", "lo", "hi"], ["cl"]),
        helper.make_node("MatMul", ["cl", "w"], ["mm"]),
        helper.make_node("Reshape", ["mm", "shape4d"], ["r"]),
        helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="nearest"),
        helper.make_node("Cast", ["x16"], ["x16f"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["x16f", "w16"], ["y16"]),
        helper.make_node("Add", ["x64", "w64"], ["y64"]),
    ]
    inits.append(numpy_helper.from_array(np.asarray([1, 1, 2, 4], np.int64), "shape4d"))
    graph = helper.make_graph(
        nodes, "structural",
        [helper.make_tensor_value_info("x", f, [2, 4]), helper.make_tensor_value_info("x16", f, [3, 4]),
         helper.make_tensor_value_info("x64", TensorProto.DOUBLE, [4])],
        [helper.make_tensor_value_info("y", f, [1, 1, 4, 8]),
         helper.make_tensor_value_info("y16", TensorProto.FLOAT16, [3, 4]),
         helper.make_tensor_value_info("y64", TensorProto.DOUBLE, [4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_structural_constants_kept_weights_randomized():
    model = structural_model()
    out = randomize(model, seed=7)
    onnx.checker.check_model(out, full_check=True)
    old, new = arrays(model), arrays(out)
    for kept in ("exponent", "lo", "hi", "scales", "shape4d"):
        assert np.array_equal(old[kept], new[kept]), kept
    assert np.all((new["divisor"] >= 0.5) & (new["divisor"] <= 1.5)), "divisors stay away from 0"
    assert np.all((new["gamma"] >= 0.5) & (new["gamma"] <= 1.5)), "Mul scales stay around 1"
    assert new["w16"].dtype == np.float16 and new["w64"].dtype == np.float64
    for k in ("w", "w16", "w64", "divisor", "gamma"):
        assert np.unique(new[k]).size == new[k].size, k
    c_old, c_new = constants(model), constants(out)
    assert np.array_equal(c_old["c_one"], c_new["c_one"]), "scalar Constant kept"
    for k in ("c_vec", "c_floats"):
        assert np.unique(c_new[k]).size == 4, f"{k} not randomized"
    for k, v in run(out).items():
        assert np.isfinite(v).all() and np.ptp(v) > 0, k


def test_bfloat16_weights_keep_their_type():
    w_bf16 = helper.make_tensor("w", TensorProto.BFLOAT16, [3, 3], np.zeros(9, np.uint16).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 3])], [w_bf16])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out = randomize(model)
    onnx.checker.check_model(out, full_check=True)
    t = out.graph.initializer[0]
    assert t.data_type == TensorProto.BFLOAT16 and list(t.dims) == [3, 3]
    values = numpy_helper.to_array(t).astype(np.float32)
    assert np.unique(values).size > 1 and np.isfinite(values).all()
