"""bench/kernels_vs_ort.py's matching of onnxruntime's node names to dlcc's kernels."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from onnx import TensorProto, helper

_PATH = Path(__file__).resolve().parents[2] / "bench" / "kernels_vs_ort.py"


def _tool():
    spec = importlib.util.spec_from_file_location("kernels_vs_ort", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _model():
    """Conv -> BatchNormalization -> Relu, then a second Conv (names as a model zoo export has them)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["r1"], name="n1"),
             helper.make_node("BatchNormalization", ["r1", "s", "b", "m", "v"], ["r2"], name="n2"),
             helper.make_node("Relu", ["r2"], ["r3"], name="n3"),
             helper.make_node("Conv", ["r3", "w2"], ["r4"], name="n4")]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "r4")]
    return helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:]))


def test_a_folded_batchnorm_counts_for_the_kernel_of_its_conv():
    """onnxruntime names its fused Conv after the BatchNormalization's output ("r2_nchwc"); dlcc folded that
    BatchNormalization away, so its kernel holds the Conv (n1) and the Relu, not r2: the chain up the data
    input leads there. A name nothing leads to stays unmatched."""
    tool = _tool()
    kernels = [{"n1", "r1", "n3", "r3"}, {"n4", "r4"}]
    chains = tool.upstream(_model())
    assert chains["r2"][:3] == ["r2", "n2", "r1"]
    where, missing = tool.match(kernels, ["r2_nchwc", "n4", "r4_nchwc", "n4/MatMulAddFusion", "ReorderOutput"],
                                chains)
    assert where == {0: ["r2_nchwc"], 1: ["n4", "r4_nchwc", "n4/MatMulAddFusion"]}
    assert missing == ["ReorderOutput"]
    # a node dlcc rebuilt under another name ("n_MatMul__5") writes its value still, or its reader is fused with it
    assert chains["n4"][:2] == ["n4", "r4"] and chains["n2"][:3] == ["n2", "r2", "n3"]
    where, missing = tool.match([{"n1", "r1"}, {"n_MatMul__5", "r4"}], ["n4/MatMulAddFusion"], chains)
    assert where == {1: ["n4/MatMulAddFusion"]} and not missing
    where, missing = tool.match([{"n_Conv__1", "n3", "r3"}], ["n2"], chains)
    assert where == {0: ["n2"]} and not missing
    # without the graph (the names alone), the folded one cannot be placed
    where, missing = tool.match(kernels, ["r2_nchwc"])
    assert not where and missing == ["r2_nchwc"]
