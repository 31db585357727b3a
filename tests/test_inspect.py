"""The model summary behind ``dlcc inspect``: exact counts on a small model, units, rendering, JSON."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import pytest
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console

import dlcc
from dlcc.inspect import (
    ModelSummary,
    human_bytes,
    human_count,
    human_flops,
    render,
    summarize,
    summary_dict,
)

LIGHT_RESNET50 = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


def small_model() -> ir.Model:
    """x[N,3] @ W + B -> Relu -> Relu -> com.microsoft Gelu; plus a float16 Constant cast to float.

    Parameters: W float[3,4] (12, 48 B), B float[4] (4, 16 B), Q int4[5] (5, 3 B), the Constant
    float16[2,2] (4, 8 B): 25 elements, 75 bytes.
    """
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "B"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r1"]),
        helper.make_node("Relu", ["r1"], ["r2"]),
        helper.make_node("Gelu", ["r2"], ["y"], domain="com.microsoft"),
        helper.make_node("Constant", [], ["c16"], value=numpy_helper.from_array(
            np.arange(4, dtype=np.float16).reshape(2, 2))),
        helper.make_node("Cast", ["c16"], ["c"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 2])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B"),
            helper.make_tensor("Q", TensorProto.INT4, [5], [1, 2, 3, 4, 5]),
        ])
    proto = helper.make_model(graph, producer_name="unit", producer_version="1.0", ir_version=10,
                              opset_imports=[helper.make_opsetid("", 21),
                                             helper.make_opsetid("com.microsoft", 1)])
    proto = onnx.shape_inference.infer_shapes(proto)
    return ir.serde.deserialize_model(proto)


def test_summary_of_a_small_model():
    s = summarize(small_model())
    assert s.producer == "unit 1.0"
    assert s.graph_name == "small"
    assert s.ir_version == 10
    assert s.opsets == {"ai.onnx": 21, "com.microsoft": 1}
    assert s.inputs == [("x", "float32", ["N", 3])]
    assert s.outputs == [("y", "float32", ["N", 4]), ("c", "float32", [2, 2])]
    assert s.node_count == 7
    assert s.parameter_count == 12 + 4 + 5 + 4
    assert s.parameter_bytes == 48 + 16 + 3 + 8
    # only the Cast has static shapes (4 elements); the Constant costs 0; the N-shaped nodes are unknown
    assert (s.flops, s.unknown_cost_nodes) == (4, 5)


def test_histogram_most_frequent_first_then_by_name():
    s = summarize(small_model())
    assert isinstance(s.op_histogram, Counter)
    assert list(s.op_histogram.items()) == [
        ("Relu", 2), ("Add", 1), ("Cast", 1), ("Constant", 1), ("MatMul", 1), ("com.microsoft::Gelu", 1)]


def test_parameters_come_from_shapes_not_data(tmp_path):
    model = small_model()
    # 1000 floats in a file that does not exist: loading them would fail
    missing = ir.ExternalTensor("missing.bin", offset=0, length=4000, dtype=ir.DataType.FLOAT,
                                shape=ir.Shape([1000]), name="E", base_dir=str(tmp_path))
    model.graph.initializers["E"] = ir.Value(name="E", const_value=missing)
    s = summarize(model)
    assert s.parameter_count == 25 + 1000
    assert s.parameter_bytes == 75 + 4000


def test_unknown_rank_and_unnamed_dims():
    model = ir.from_onnx_text("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[?,3] x, float[] u) => (float[] y) { y = Add(x, u) }""")
    s = summarize(model)
    assert s.inputs == [("x", "float32", ["?", 3]), ("u", "float32", None)]


def test_summarize_does_not_change_the_model():
    model = small_model()
    before = ir.serde.serialize_model(model).SerializeToString()
    summarize(model)
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_summary_dict_is_json():
    d = summary_dict(summarize(small_model()))
    back = json.loads(json.dumps(d))
    assert back == d
    assert back["parameter_count"] == 25 and back["parameter_bytes"] == 75
    assert back["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["N", 3]}]
    assert list(back["ops"]) == ["Relu", "Add", "Cast", "Constant", "MatMul", "com.microsoft::Gelu"]
    assert back["flops"] == 4 and back["unknown_cost_nodes"] == 5


@pytest.mark.parametrize(("n", "count", "nbytes", "flops"), [
    (0, "0", "0 B", "0 FLOPs"),
    (999, "999", "999 B", "999 FLOPs"),
    (1_500, "1.5 K", "1.5 KB", "1.5 KFLOPs"),
    (999_960, "1.0 M", "1.0 MB", "1.0 MFLOPs"),
    (25_557_032, "25.6 M", "25.6 MB", "25.6 MFLOPs"),
    (102_228_128, "102.2 M", "102.2 MB", "102.2 MFLOPs"),
    (7_717_000_000, "7.7 G", "7.7 GB", "7.7 GFLOPs"),
])
def test_human_units(n, count, nbytes, flops):
    assert (human_count(n), human_bytes(n), human_flops(n)) == (count, nbytes, flops)


def _rendered(summary: ModelSummary) -> str:
    out = io.StringIO()
    render(summary, Console(file=out, width=120, color_system=None))
    return out.getvalue()


def test_render_shows_everything():
    text = _rendered(summarize(small_model()))
    assert text.splitlines()[0].startswith("small")
    for expected in ("unit 1.0", "IR 10", "ai.onnx 21", "com.microsoft 1", "[N, 3]", "float32",
                     "com.microsoft::Gelu", "25 params", "75 B", "4 FLOPs", "5 node(s) of unknown cost"):
        assert expected in text, expected


def test_render_prints_model_names_literally():
    model = small_model()
    model.graph.inputs[0].name = "[bold red]x[/]"
    text = _rendered(summarize(model))
    assert "[bold red]x[/]" in text


def test_resnet50_summary():
    model = dlcc.load(LIGHT_RESNET50)
    onnx_ir.passes.common.ShapeInferencePass()(model)
    s = summarize(model)
    assert s.node_count == 415
    assert s.op_histogram.most_common(1) == [("ConstantOfShape", 239)]
    assert s.op_histogram["Conv"] == 53
    assert s.inputs == [("gpu_0/data_0", "float32", [1, 3, 224, 224])]
    assert 7.7e9 <= s.flops <= 8.3e9 and s.unknown_cost_nodes == 0
    assert "8.2 GFLOPs" in _rendered(s)


def test_generated_weights_count_as_parameters() -> None:
    """ResNet-50 has 25.6 M parameters even when ConstantOfShape generates them (the light model)."""
    from pathlib import Path

    import onnx

    import dlcc
    from dlcc.frontend.shapes import infer_shapes

    model = dlcc.load(Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx")
    infer_shapes(model)
    s = summarize(model)
    assert 25.5e6 < s.parameter_count < 25.7e6
