"""emit_groups: multi-node groups become local-function calls; the model stays valid and computes the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
import dlcc.api
from dlcc.check import diff, random_inputs, run_ort
from dlcc.errors import DlccError, PassError
from dlcc.frontend.shapes import infer_shapes
from dlcc.fusion.emit import FUSED_DOMAIN, emit_groups
from dlcc.fusion.plan import FusionPlan, build_plan

DIAMOND = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
    c = Conv <pads = [1,1,1,1]> (x, w)
    r = Relu(c)
    s = Sigmoid(c)
    y = Add(r, s)
}
"""

CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,6] x) => (float[2,6] y, float[2,6] t) {
    a = Relu(x)
    b = Sigmoid(a)
    t = Tanh(b)
    c = Neg(t)
    y = Abs(c)
}
"""

INIT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[3,4] x) => (float[3,5] y) {
    m = MatMul(x, w)
    a = Add(m, b)
    y = Relu(a)
}
"""


def _model(text: str, **weights: tuple[int, ...]) -> ir.Model:
    """Parse ``text`` and add seeded random float initializers of the given shapes."""
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    for name, shape in weights.items():
        proto.graph.initializer.append(
            onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    return infer_shapes(ir.serde.deserialize_model(proto))


def _check_same(original: ir.Model, emitted: ir.Model) -> None:
    proto = ir.serde.serialize_model(emitted)
    onnx.checker.check_model(proto, full_check=True)
    feeds = random_inputs(original, seed=1)
    ref = run_ort(original, feeds)
    got = run_ort(emitted, feeds)
    assert list(ref) == list(got)
    for name in ref:
        d = diff(name, ref[name], got[name], rtol=1e-6, atol=0.0)  # same computation, only regrouped
        assert d.ok, d


def _calls(model: ir.Model) -> list[ir.Node]:
    return [n for n in model.graph if n.domain == FUSED_DOMAIN]


def test_diamond_becomes_one_call() -> None:
    model = _model(DIAMOND)
    before = ir.serde.serialize_model(model).SerializeToString()
    plan = build_plan(model.graph, [list(model.graph)], "test")
    out = emit_groups(model, plan)
    assert ir.serde.serialize_model(model).SerializeToString() == before  # input untouched
    (call,) = list(out.graph)
    assert call.domain == FUSED_DOMAIN and call.op_type == "group_0_Conv"
    assert [v.name for v in call.inputs] == ["x", "w"] and [v.name for v in call.outputs] == ["y"]
    (fn,) = out.functions.values()
    assert [n.op_type for n in fn] == ["Conv", "Relu", "Sigmoid", "Add"]
    assert list(fn[0].attributes["pads"].as_ints()) == [1, 1, 1, 1]
    assert out.opset_imports[FUSED_DOMAIN] == 1 and out.opset_imports[""] == 17
    assert fn.opset_imports[""] == 17
    _check_same(model, out)


def test_two_groups_in_a_chain_and_a_group_output_that_is_a_graph_output() -> None:
    model = _model(CHAIN)
    a, b, t, c, y = list(model.graph)
    plan = build_plan(model.graph, [[c, y], [a, b, t]], "test")  # t is read by c and is a graph output
    out = emit_groups(model, plan)
    calls = _calls(out)
    assert [n.op_type for n in calls] == ["group_0_Tanh", "group_1_Abs"]
    assert [v.name for v in calls[0].outputs] == ["t"]
    assert [v.name for v in calls[1].inputs] == ["t"]
    assert len(out.functions) == 2
    _check_same(model, out)


def test_group_reading_initializers_passes_them_as_inputs() -> None:
    model = _model(INIT, w=(4, 5), b=(5,))
    plan = build_plan(model.graph, [list(model.graph)], "test")
    out = emit_groups(model, plan)
    (call,) = _calls(out)
    assert [v.name for v in call.inputs] == ["x", "w", "b"]
    assert set(out.graph.initializers) == {"w", "b"}
    _check_same(model, out)


def test_singletons_stay_plain_nodes() -> None:
    model = _model(DIAMOND)
    plan = build_plan(model.graph, [[n] for n in model.graph], "test")
    out = emit_groups(model, plan)
    assert [n.op_type for n in out.graph] == ["Conv", "Relu", "Sigmoid", "Add"]
    assert not out.functions and FUSED_DOMAIN not in out.opset_imports
    _check_same(model, out)


def test_mixed_singletons_and_group() -> None:
    model = _model(DIAMOND)
    conv, relu, sig, add = list(model.graph)
    out = emit_groups(model, build_plan(model.graph, [[conv, relu], [sig], [add]], "test"))
    assert [n.op_type for n in out.graph] == ["group_0_Conv", "Sigmoid", "Add"]
    _check_same(model, out)


def test_invalid_plan_is_refused() -> None:
    model = _model(DIAMOND)
    conv, relu, sig, add = list(model.graph)
    with pytest.raises(PassError):
        emit_groups(model, build_plan(model.graph, [[conv, add], [relu], [sig]], "test"))
    other = _model(DIAMOND)
    with pytest.raises(DlccError, match="another graph"):
        emit_groups(model, build_plan(other.graph, [list(other.graph)], "test"))


def _light(name: str) -> ir.Model:
    from dlcc.testing.light import light_model

    model = dlcc.load(light_model(name))
    return dlcc.api.optimize(model, level=3, emit=lambda s: None)


def _conv_relu_plan(model: ir.Model) -> FusionPlan:
    """Every Conv whose only use is a Relu is grouped with it; everything else is alone."""
    parts: list[list[ir.Node]] = []
    taken: set[ir.Node] = set()
    for n in model.graph:
        if n in taken:
            continue
        uses = list(n.outputs[0].uses()) if n.op_type == "Conv" else []
        if len(uses) == 1 and uses[0].node.op_type == "Relu" and n.outputs[0] not in model.graph.outputs:
            parts.append([n, uses[0].node])
            taken.add(uses[0].node)
        else:
            parts.append([n])
    return build_plan(model.graph, parts, "test")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_models_conv_relu_groups(name: str) -> None:
    model = _light(name)
    plan = _conv_relu_plan(model)
    fused = [g for g in plan.groups if len(g) > 1]
    assert len(fused) >= 16
    out = emit_groups(model, plan)
    assert len(out.functions) == len(fused)
    assert len(list(out.graph)) == len(list(model.graph)) - len(fused)
    _check_same(model, out)


@pytest.mark.slow
def test_emit_a_real_plan() -> None:
    pytest.importorskip("dlcc.fusion.tvm")
    from dlcc.fusion import plan_fusion

    path = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    model = dlcc.api.optimize(dlcc.load(path), level=3, emit=lambda s: None)
    out = emit_groups(model, plan_fusion(model))
    _check_same(model, out)
