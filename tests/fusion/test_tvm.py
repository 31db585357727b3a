"""TVM FuseOps grouping (``plan_tvm``) on TVM's classic cases and on the light reference models."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlcc
import dlcc.api
from dlcc.frontend.shapes import infer_shapes
from dlcc.fusion.plan import FusionPlan, node_kind, verify_plan
from dlcc.fusion.tvm import plan_tvm
from dlcc.ops.table import Kind

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _model(body: str) -> ir.Model:
    return infer_shapes(ir.from_onnx_text(HEAD + body))


def _groups(plan: FusionPlan) -> list[list[str]]:
    """Each group as the names of its nodes' first outputs, in plan order."""
    return [[n.outputs[0].name for n in g.nodes] for g in plan.groups]


def _anchor(plan: FusionPlan, member: str) -> str:
    (g,) = [g for g in plan.groups if member in [n.outputs[0].name for n in g.nodes]]
    return g.anchor.outputs[0].name


def test_diamond_fuses_into_one_group_anchored_at_the_conv() -> None:
    plan = plan_tvm(_model("""
    g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        r = Relu(c)
        s = Sigmoid(c)
        y = Add(r, s)
    }
    """))
    assert plan.planner == "tvm"
    assert _groups(plan) == [["c", "r", "s", "y"]]
    assert plan.groups[0].anchor.op_type == "Conv" and plan.groups[0].kind == Kind.OUT_ELEMWISE_FUSABLE


def test_conv_add_relu_with_a_broadcast_bias() -> None:
    plan = plan_tvm(_model("""
    g (float[1,3,8,8] x, float[4,3,3,3] w, float[1,4,1,1] b) => (float[1,4,8,8] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        a = Add(c, b)
        y = Relu(a)
    }
    """))
    assert _groups(plan) == [["c", "a", "y"]] and _anchor(plan, "y") == "c"


def test_residual_block() -> None:
    plan = plan_tvm(_model("""
    g (float[1,4,8,8] x, float[4,4,3,3] w1, float[4,4,3,3] w2) => (float[1,4,8,8] y) {
        c1 = Conv <pads = [1,1,1,1]> (x, w1)
        r1 = Relu(c1)
        c2 = Conv <pads = [1,1,1,1]> (r1, w2)
        a = Add(c2, r1)
        y = Relu(a)
    }
    """))
    assert _groups(plan) == [["c1", "r1"], ["c2", "a", "y"]]
    assert _anchor(plan, "r1") == "c1" and _anchor(plan, "y") == "c2"


def test_concat_after_branches() -> None:
    # conv branches keep their epilogue; light branches fuse into the Concat (INJECTIVE in dlcc) and on
    plan = plan_tvm(_model("""
    g (float[1,3,8,8] x, float[4,3,3,3] w1, float[4,3,1,1] w2) => (float[1,11,8,8] y) {
        c1 = Conv <pads = [1,1,1,1]> (x, w1)
        r1 = Relu(c1)
        c2 = Conv (x, w2)
        r2 = Relu(c2)
        t = Sigmoid(x)
        cat = Concat <axis = 1> (r1, r2, t)
        y = Relu(cat)
    }
    """))
    assert _groups(plan) == [["c1", "r1"], ["c2", "r2"], ["t", "cat", "y"]]
    assert _anchor(plan, "cat") == "y"  # no master op: the group's root


TUPLE_BODY = """
g (float[1,4,8,8] x) => (float[1,512] {out}) {{
    t1 = Transpose <perm = [0,1,3,2]> (x)
    t2 = Transpose <perm = [0,1,3,2]> (x)
    cat = Concat <axis = 1> (t1, t2)
    f = Flatten(cat)
    y = Relu(f)
}}
"""


def _tuple_kind(node: ir.Node) -> Kind:
    return Kind.TUPLE if node.op_type == "Concat" else node_kind(node)


def test_phase2_fuses_tuple_fields_once_the_tuple_is_fused_downstream() -> None:
    plan = plan_tvm(_model(TUPLE_BODY.format(out="y")), kind_of=_tuple_kind)
    assert _groups(plan) == [["t1", "t2", "cat", "f", "y"]]
    # with the table's kinds (Concat INJECTIVE) phase 1 already does it
    assert _groups(plan_tvm(_model(TUPLE_BODY.format(out="y")))) == [["t1", "t2", "cat", "f", "y"]]


def test_phase2_leaves_fields_of_an_unfused_tuple_alone() -> None:
    body = TUPLE_BODY.format(out="y").replace("=> (float[1,512] y)", "=> (float[1,512] y, float[1,8,8,8] cat)")
    plan = plan_tvm(_model(body), kind_of=_tuple_kind)
    assert _groups(plan) == [["t1"], ["t2"], ["cat"], ["f", "y"]]


def test_reduction_absorbs_producers_but_never_starts_a_fusion() -> None:
    plan = plan_tvm(_model("""
    g (float[2,16] x) => (float[2,1] y) {
        e = Exp(x)
        m = Mul(e, e)
        r = ReduceMean <axes = [1]> (m)
        y = Relu(r)
    }
    """))
    assert _groups(plan) == [["e", "m", "r"], ["y"]]
    assert _anchor(plan, "e") == "r"


def test_opaque_ops_are_barriers() -> None:
    plan = plan_tvm(_model("""
    g (float[2,16] x) => (float[2,16] y) {
        ax = Constant <value = int64 {1}> ()
        r = Relu(x)
        s = CumSum(r, ax)
        y = Relu(s)
    }
    """))
    assert sorted(_groups(plan)) == [["ax"], ["r"], ["s"], ["y"]]


def test_group_size_cap() -> None:
    lines = "\n".join(f"r{i} = Relu(r{i - 1})" for i in range(1, 10))
    model = _model(f"g (float[4] r0_in) => (float[4] r9) {{\n r0 = Relu(r0_in)\n {lines}\n}}")
    assert [len(g) for g in plan_tvm(model, max_group_size=4).groups] == [4, 4, 2]
    assert [len(g) for g in plan_tvm(model).groups] == [10]
    assert [len(g) for g in plan_tvm(model, max_group_size=1).groups] == [1] * 10
    with pytest.raises(ValueError, match="max_group_size"):
        plan_tvm(model, max_group_size=0)


def test_two_complex_ops_are_never_in_one_group() -> None:
    plan = plan_tvm(_model("""
    g (float[1,3,8,8] x, float[4,3,3,3] w, float[8,4] wm) => (float[1,8] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        p = MaxPool <kernel_shape = [2,2], strides = [2,2]> (c)
        r = Relu(p)
        g = GlobalAveragePool(r)
        f = Flatten(g)
        y = Gemm <transB = 1> (f, wm)
    }
    """))
    assert _groups(plan) == [["c"], ["p", "r"], ["g"], ["f"], ["y"]]
    for g in plan.groups:
        assert sum(node_kind(n) >= Kind.OUT_ELEMWISE_FUSABLE for n in g.nodes) <= 1


def test_graph_outputs_end_fusion_upward_but_can_be_sinks() -> None:
    # A node producing a graph output has no post-dominator, so it never fuses into its consumers; its
    # producers may still fuse into it. Graph outputs are therefore always produced by a group's root.
    plan = plan_tvm(_model("""
    g (float[4] x) => (float[4] b, float[4] d) {
        a = Relu(x)
        b = Exp(a)
        c = Sigmoid(b)
        d = Neg(c)
    }
    """))
    assert _groups(plan) == [["a", "b"], ["c", "d"]]
    assert [v.name for v in plan.groups[0].outputs] == ["b"]
    # in a diamond, a graph output on one branch also stops the conv from fusing
    plan = plan_tvm(_model("""
    g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] r, float[1,4,8,8] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        r = Relu(c)
        s = Sigmoid(c)
        y = Add(r, s)
    }
    """))
    assert _groups(plan) == [["c"], ["r"], ["s", "y"]]


def test_accepts_a_graph_and_does_not_mutate_it() -> None:
    model = _model("""
    g (float[4] x) => (float[4] y) {
        a = Relu(x)
        y = Exp(a)
    }
    """)
    before = [(n.op_type, [v.name for v in n.inputs], [v.name for v in n.outputs]) for n in model.graph]
    plan = plan_tvm(model.graph)
    verify_plan(plan)
    assert _groups(plan) == [["a", "y"]]
    assert [(n.op_type, [v.name for v in n.inputs], [v.name for v in n.outputs]) for n in model.graph] == before


LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512"]


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT)
def test_light_models(name: str) -> None:
    path = Path(onnx.__file__).parent / f"backend/test/data/light/light_{name}.onnx"
    model = dlcc.api.optimize(dlcc.load(path), level=3, emit=lambda s: None)
    plan = plan_tvm(model)  # verified inside
    verify_plan(plan)
    assert sum(len(g) for g in plan.groups) == len(list(model.graph))
    assert plan.num_kernels < len(list(model.graph))
    for g in plan.groups:
        assert sum(node_kind(n) >= Kind.OUT_ELEMWISE_FUSABLE for n in g.nodes) <= 1
    if name == "resnet50":
        assert plan.num_kernels <= 80  # well below 145


# Random DAGs: every value has shape [1,4,4,4] except where a reduction or a broadcast operand says so.
_RANDOM_OPS = {
    "Relu": "{o} = Relu({a})",
    "Exp": "{o} = Exp({a})",
    "Add": "{o} = Add({a}, {b})",
    "AddBias": "{o} = Add({a}, bias)",
    "Transpose": "{o} = Transpose <perm = [0,1,3,2]> ({a})",
    "Reduce": "{o}_r = ReduceMean <axes = [1]> ({a})\n{o} = Mul({o}_r, {b})",
    "Conv": "{o} = Conv <pads = [1,1,1,1]> ({a}, w)",
    "MaxPool": "{o} = MaxPool <kernel_shape = [3,3], pads = [1,1,1,1]> ({a})",
    "Opaque": "{o} = CumSum({a}, ax)",
    "Identity": "{o} = Identity({a})",
}


def _random_model(steps: list[tuple[str, int, int, bool]]) -> ir.Model:
    values, lines, outputs = ["x"], ['ax = Constant <value = int64 {1}> ()'], []
    for i, (op, a, b, is_output) in enumerate(steps):
        name = f"v{i}"
        lines.append(_RANDOM_OPS[op].format(o=name, a=values[a % len(values)], b=values[b % len(values)]))
        values.append(name)
        if is_output:
            outputs.append(name)
    outputs = outputs or [values[-1]]
    outs = ", ".join(f"float[1,4,4,4] {v}" for v in outputs)
    body = "\n".join(lines)
    return _model(f"g (float[1,4,4,4] x, float[1,4,1,1] bias, float[4,4,3,3] w) => ({outs}) {{\n{body}\n}}")


def _identity_is_tuple(node: ir.Node) -> Kind:
    return Kind.TUPLE if node.op_type == "Identity" else node_kind(node)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(_RANDOM_OPS)), st.integers(0, 10**6), st.integers(0, 10**6),
                          st.booleans()), min_size=1, max_size=14),
       st.integers(1, 6), st.booleans())
def test_random_graphs_give_valid_plans(steps, cap, tuples) -> None:
    model = _random_model(steps)
    kind_of = _identity_is_tuple if tuples else node_kind
    for max_group_size in (cap, 256):
        plan = plan_tvm(model, max_group_size=max_group_size, kind_of=kind_of)  # verify_plan inside
        outputs = {id(v) for v in model.graph.outputs}
        for g in plan.groups:
            assert len(g) <= max_group_size
            assert sum(node_kind(n) >= Kind.OUT_ELEMWISE_FUSABLE for n in g.nodes) <= 1
            # graph outputs are produced by the group's root (the last node in graph order)
            produced = [n for n in g.nodes if any(id(v) in outputs for v in n.outputs)]
            assert all(n is g.nodes[-1] for n in produced)
            if any(kind_of(n) == Kind.COMM_REDUCE for n in g.nodes):
                assert g.nodes[-1].op_type == "ReduceMean"  # a reduction never starts a fusion
