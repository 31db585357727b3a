"""FusionPlan construction and the verifier's invariants."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from dlcc.errors import PassError
from dlcc.frontend.shapes import infer_shapes
from dlcc.fusion.plan import build_plan, verify_plan
from dlcc.ops.table import Kind

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
    c = Conv <pads = [1,1,1,1]> (x, w)
    r = Relu(c)
    s = Sigmoid(c)
    y = Add(r, s)
}
"""


def _graph() -> ir.Graph:
    return infer_shapes(ir.from_onnx_text(TEXT)).graph


def test_diamond_in_one_group_is_valid() -> None:
    g = _graph()
    plan = build_plan(g, [list(g)], "test")
    verify_plan(plan)
    (grp,) = plan.groups
    assert grp.anchor.op_type == "Conv" and grp.kind == Kind.OUT_ELEMWISE_FUSABLE
    assert [v.name for v in grp.inputs] == ["x", "w"] and [v.name for v in grp.outputs] == ["y"]
    assert plan.fusion_rate == 4


def test_singletons_are_valid_and_ordered() -> None:
    g = _graph()
    nodes = list(g)
    plan = build_plan(g, [[n] for n in reversed(nodes)], "test")
    verify_plan(plan)
    assert [grp.anchor.op_type for grp in plan.groups] == ["Conv", "Relu", "Sigmoid", "Add"]


def test_non_convex_group_is_refused() -> None:
    g = _graph()
    conv, relu, sig, add = list(g)
    plan = build_plan(g, [[conv, add], [relu], [sig]], "test")  # conv -> relu -> add leaves and re-enters
    with pytest.raises(PassError, match="not convex|comes later|cyclic"):
        verify_plan(plan)


def test_missing_and_duplicate_nodes_are_refused() -> None:
    g = _graph()
    conv, relu, sig, add = list(g)
    with pytest.raises(PassError, match="in 0 groups"):
        verify_plan(build_plan(g, [[conv], [relu], [add]], "test"))
    plan = build_plan(g, [[conv], [relu], [sig], [add]], "test")
    plan.groups[1].nodes.append(conv)
    with pytest.raises(PassError, match="in 2 groups"):
        verify_plan(plan)
