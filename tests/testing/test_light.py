"""The onnx wheel's light reference models, randomized: full-size weights, valid, runnable, not saturated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from dlcc.check import diff, run_ort
from dlcc.errors import DlccError
from dlcc.testing import LIGHT_MODELS, LightModelError, light_input, light_model, light_model_path

FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)

# Float parameters each file declares (the ConstantOfShape shapes plus the stored initializers, BN
# running statistics included), counted once by hand. They agree with the published sizes of these
# architectures: AlexNet 61.0M, VGG-19 143.7M, ResNet-50 25.6M, SqueezeNet 1.24M, GoogLeNet 7.0M,
# DenseNet-121 8.0M (+0.17M BN statistics), BN-Inception 11.2M.
PARAMS = {
    "bvlc_alexnet": 60_965_224, "densenet121": 8_146_152, "inception_v1": 6_998_552,
    "inception_v2": 11_234_792, "resnet50": 25_610_153, "shufflenet": 1_420_152, "squeezenet": 1_235_496,
    "vgg19": 143_667_240, "zfnet512": 87_250_537,
}
BIG = {"bvlc_alexnet", "vgg19", "zfnet512"}  # over 50M parameters: a few seconds each


def test_names_and_paths():
    assert len(LIGHT_MODELS) == 9 and set(PARAMS) == set(LIGHT_MODELS)
    for name in LIGHT_MODELS:
        path = light_model_path(name)
        assert path.is_file() and path.name == f"light_{name}.onnx"
        assert path.parent.parts[-4:] == ("backend", "test", "data", "light")


def test_unknown_name_is_a_dlcc_error():
    with pytest.raises(LightModelError, match="resnet50") as info:
        light_model_path("resnet51")
    assert isinstance(info.value, DlccError)


def test_missing_file_is_a_dlcc_error(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(onnx, "__file__", str(tmp_path / "onnx" / "__init__.py"))
    with pytest.raises(LightModelError, match="reinstall"):
        light_model_path("squeezenet")


def test_input_is_seeded_imagenet_shaped():
    a, b = light_input("squeezenet", seed=0), light_input("squeezenet", seed=1)
    assert list(a) == ["data_0"]
    assert a["data_0"].shape == (1, 3, 224, 224) and a["data_0"].dtype == np.float32
    assert np.array_equal(a["data_0"], light_input("squeezenet", seed=0)["data_0"])
    assert not np.array_equal(a["data_0"], b["data_0"])


def test_light_model_is_seeded():
    a = light_model("squeezenet", seed=0)
    assert light_model("squeezenet", seed=0).SerializeToString() == a.SerializeToString()
    assert light_model("squeezenet", seed=1).SerializeToString() != a.SerializeToString()


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _float_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer if t.data_type in FLOATS)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n
                                  for n in LIGHT_MODELS])
def test_randomized_light_model(name):
    original = onnx.load(light_model_path(name))
    assert _float_bytes(original) < 0.1 * PARAMS[name] * 4, "the file itself holds almost no weights"
    model = light_model(name, seed=0)
    onnx.checker.check_model(model, full_check=True)
    cos = [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    assert not cos, "every ConstantOfShape weight is materialized"
    assert _float_bytes(model) == pytest.approx(PARAMS[name] * 4, rel=0.01)
    assert [i.name for i in model.graph.output] == [i.name for i in original.graph.output]
    session = ort_session(model)
    (out,) = run_ort(model, light_input(name, seed=0), session=session).values()
    assert np.isfinite(out).all()
    assert np.ptp(out) > 0
    ops = {n.op_type for n in model.graph.node}
    if "Softmax" in ops:  # random weights with calibrated BN: a spread of scores, not one-hot
        assert out.max() < 0.99 and np.ptp(out) > 1e-3
    else:
        assert out.std() > 0.1
    # A second input gives another answer: the weights really reach the output.
    (other,) = run_ort(model, light_input(name, seed=1), session=session).values()
    assert not diff("out", out, other, rtol=1e-3, atol=0).ok
