"""Input-shape overrides, onnx inference and our completion."""

from __future__ import annotations

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
from dlcc.errors import ShapeError
from dlcc.frontend.shapes import (
    broadcast_shapes,
    complete_shapes,
    infer_shapes,
    parse_input_shape,
    set_input_shapes,
    symbolic_inputs,
)

TWO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch,3,8,8] x, float[batch,3] s) => (float[batch,3,8,8] y) {
    s4 = Unsqueeze(s, axes)
    y = Mul(x, s4)
}
"""


def _model() -> ir.Model:
    m = onnx.parser.parse_model(TWO_INPUTS)
    m.graph.initializer.append(onnx.numpy_helper.from_array(__import__("numpy").array([2, 3]), "axes"))
    return dlcc.load(m)


@pytest.mark.parametrize("text,expected", [
    ("x=1,3,224,224", ("x", [1, 3, 224, 224])),
    ("x:1x3x224x224", ("x", [1, 3, 224, 224])),
    ("gpu_0/data_0=2,3", ("gpu_0/data_0", [2, 3])),
    ("a=b=4", ("a=b", [4])),
])
def test_parse_input_shape(text, expected) -> None:
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["x", "x=1,a", "=1,2", "x=0,3", "x=-1"])
def test_parse_input_shape_rejects(text) -> None:
    with pytest.raises(ShapeError):
        parse_input_shape(text)


def test_override_fixes_shared_symbol_and_inference_follows() -> None:
    model = _model()
    set_input_shapes(model, {"x": [2, 3, 8, 8]})
    infer_shapes(model)
    assert list(model.graph.inputs[1].shape) == [2, 3]  # 'batch' is fixed on s too
    assert list(model.graph.outputs[0].shape) == [2, 3, 8, 8]
    assert symbolic_inputs(model) == {}


def test_symbolic_dims_kept_without_override() -> None:
    model = infer_shapes(_model())
    assert str(model.graph.outputs[0].shape[0]) == "batch"
    assert symbolic_inputs(model) == {"x": ["batch", 3, 8, 8], "s": ["batch", 3]}


def test_override_unknown_input() -> None:
    with pytest.raises(ShapeError, match="unknown input 'nope'.*x, s|unknown input 'nope'.*s, x"):
        set_input_shapes(_model(), {"nope": [1]})


def test_override_wrong_rank() -> None:
    with pytest.raises(ShapeError, match="rank 2"):
        set_input_shapes(_model(), {"x": [1, 3]})


def test_override_conflicting_static_dim() -> None:
    with pytest.raises(ShapeError, match="axis 1"):
        set_input_shapes(_model(), {"x": [1, 4, 8, 8]})


def test_override_conflicting_symbol() -> None:
    with pytest.raises(ShapeError, match="two values"):
        set_input_shapes(_model(), {"x": [1, 3, 8, 8], "s": [2, 3]})


def test_broadcast_shapes() -> None:
    S = ir.Shape
    assert broadcast_shapes([S([2, 1, 4]), S([3, 1])]) == [2, 3, 4]
    assert [str(d) for d in broadcast_shapes([S(["n", 1]), S([1, 5])])] == ["n", "5"]
    assert broadcast_shapes([S([2]), S([3])]) is None
    assert broadcast_shapes([S(["n"]), S(["m"])]) is None
    assert broadcast_shapes([S([2]), None]) is None


def test_completion_fills_what_onnx_left_unknown() -> None:
    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x, float[3] b) => (float y) { r = Relu(x) s = Add(r, b) y = Sigmoid(s) }
    """)
    assert model.graph.node(0).outputs[0].shape is None
    assert complete_shapes(model.graph) == 2
    assert list(model.graph.node(1).outputs[0].shape) == [2, 3]
    assert model.graph.node(1).outputs[0].dtype == ir.DataType.FLOAT


def test_light_model_weight_shapes_inferred_by_data_propagation() -> None:
    from pathlib import Path

    model = dlcc.load(Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx")
    infer_shapes(model)
    unknown = [o.name for n in model.graph for o in n.outputs if o.shape is None]
    assert unknown == []


def test_inference_keeps_initializer_order() -> None:
    """onnx_ir's skeleton call re-registers big initializers; the order (and so the file) must not move"""
    import numpy as np

    from dlcc.frontend.shapes import refresh_shapes

    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,300] x) => (float[2,300] y) { a = Add(x, big) y = Mul(a, small) }
    """)
    big = ir.Value(name="big", const_value=ir.Tensor(np.ones(300, np.float32), name="big"))
    small = ir.Value(name="small", const_value=ir.Tensor(np.ones(1, np.float32), name="small"))
    for v in (big, small):
        model.graph.register_initializer(v)
    model.graph.node(0).replace_input_with(1, big)
    model.graph.node(1).replace_input_with(1, small)
    infer_shapes(model)
    assert list(model.graph.initializers) == ["big", "small"]
    refresh_shapes(model)
    assert list(model.graph.initializers) == ["big", "small"]
