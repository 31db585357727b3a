"""DNNFusion planner: the pair table, the cost model and its hook, seeded growth, convexity, bytes moved."""

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
from dlcc.fusion.dnnfusion import (
    PAIR_TABLE,
    Decision,
    bytes_moved,
    bytes_moved_unfused,
    decide,
    fan_out,
    plan_dnnfusion,
)
from dlcc.fusion.plan import FusionPlan, node_kind
from dlcc.ops.table import Kind, Mapping, op_info
from dlcc.testing import KIT_MODELS

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _graph(text: str) -> ir.Graph:
    return infer_shapes(ir.from_onnx_text(HEADER + text)).graph


def _groups(plan: FusionPlan) -> list[list[str]]:
    return [[n.name for n in g.nodes] for g in plan.groups]


def _group_with(plan: FusionPlan, name: str) -> list[str]:
    return next(names for names in _groups(plan) if name in names)


# ------------------------------------------------------------------------------------- pair table


def test_pair_table_covers_every_pair() -> None:
    assert len(PAIR_TABLE) == len(Mapping) ** 2
    assert all(decide(a, b) is PAIR_TABLE[(a, b)] for a in Mapping for b in Mapping)


def test_one_to_one_with_anything_always_fuses() -> None:
    for other in Mapping:
        assert decide(Mapping.ONE_TO_ONE, other) is Decision.ALWAYS
        assert decide(other, Mapping.ONE_TO_ONE) is Decision.ALWAYS


def test_never_pairs() -> None:
    assert decide(Mapping.ONE_TO_MANY, Mapping.MANY_TO_MANY) is Decision.NEVER
    assert decide(Mapping.MANY_TO_MANY, Mapping.MANY_TO_MANY) is Decision.NEVER
    assert sum(d is Decision.NEVER for d in PAIR_TABLE.values()) == 2


def test_other_pairs_are_measured() -> None:
    assert decide(Mapping.REORGANIZE, Mapping.SHUFFLE) is Decision.MEASURE
    assert decide(Mapping.MANY_TO_MANY, Mapping.ONE_TO_MANY) is Decision.MEASURE
    assert decide(Mapping.SHUFFLE, Mapping.MANY_TO_MANY) is Decision.MEASURE
    assert decide(Mapping.MANY_TO_MANY, Mapping.REORGANIZE) is Decision.MEASURE
    assert sum(d is Decision.MEASURE for d in PAIR_TABLE.values()) == 25 - 9 - 2


# ------------------------------------------------------------------------------------- always / never


def test_elementwise_chain_is_one_group() -> None:
    g = _graph("""
    g (float[2,8] x, float[2,8] z) => (float[2,8] y) {
        a = Relu(x)
        b = Sigmoid(a)
        c = Add(b, z)
        y = Tanh(c)
    }""")
    plan = plan_dnnfusion(g)
    assert plan.planner == "dnnfusion"
    assert len(plan.groups) == 1 and plan.groups[0].ops == ["Relu", "Sigmoid", "Add", "Tanh"]
    assert [v.name for v in plan.groups[0].outputs] == ["y"]


def test_conv_relu_add_fuse() -> None:
    g = _graph("""
    g (float[1,3,8,8] x, float[4,3,3,3] w, float[1,4,8,8] z) => (float[1,4,8,8] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        r = Relu(c)
        y = Add(r, z)
    }""")
    plan = plan_dnnfusion(g)
    assert len(plan.groups) == 1
    (grp,) = plan.groups
    assert grp.ops == ["Conv", "Relu", "Add"] and grp.anchor.op_type == "Conv"


def test_matmul_matmul_never_fuse() -> None:
    g = _graph("""
    g (float[4,8] x, float[8,8] w1, float[8,8] w2) => (float[4,8] y) {
        m = MatMul(x, w1)
        y = MatMul(m, w2)
    }""")
    assert [grp.ops for grp in plan_dnnfusion(g).groups] == [["MatMul"], ["MatMul"]]


def test_matmul_relu_matmul_keeps_the_matmuls_apart() -> None:
    g = _graph("""
    g (float[4,8] x, float[8,8] w1, float[8,8] w2) => (float[4,8] y) {
        m = MatMul(x, w1)
        r = Relu(m)
        y = MatMul(r, w2)
    }""")
    plan = plan_dnnfusion(g)
    assert all(grp.ops.count("MatMul") == 1 for grp in plan.groups)
    assert len(plan.groups) == 2


def test_expand_then_conv_never_fuse() -> None:
    g = _graph("""
    g (float[1,1,8,8] x, float[4,3,3,3] w) => (float[1,4,6,6] y) <int64[4] shape = {1,3,8,8}> {
        e = Expand(x, shape)
        r = Relu(e)
        y = Conv(r, w)
    }""")
    plan = plan_dnnfusion(g)
    assert [grp.ops for grp in plan.groups] == [["Expand"], ["Relu", "Conv"]]


# ------------------------------------------------------------------------------------- measure

CHAIN = """
g (float[{n},{n}] x) => (float[{n},{n}] y) <int64[2] shape = {{{n},{n}}}> {{
    r0 = Relu(x)
    r1 = Relu(r0)
    r2 = Relu(r1)
    r3 = Relu(r2)
    r4 = Relu(r3)
    r5 = Relu(r4)
    r6 = Relu(r5)
    r7 = Relu(r6)
    r8 = Relu(r7)
    r9 = Relu(r8)
    s = Reshape(r9, shape)
    y = Transpose(s)
}}"""


def _chain(n: int) -> ir.Graph:
    """Ten Relus + Reshape (group mapping REORGANIZE), then Transpose (SHUFFLE): a MEASURE pair. The fused
    group would hold 11 intermediates, 3 over the register limit: small tensors are not worth it."""
    g = _graph(CHAIN.format(n=n))
    for node, name in zip(g, [f"r{i}" for i in range(10)] + ["s", "t"], strict=True):
        node.name = name
    return g


def test_measure_pair_small_tensors_stay_apart() -> None:
    plan = plan_dnnfusion(_chain(2))
    assert len(plan.groups) == 2 and _group_with(plan, "t") == ["t"]


def test_measure_pair_large_tensors_fuse() -> None:
    plan = plan_dnnfusion(_chain(64))
    assert len(plan.groups) == 1


def test_measure_hook_decides_instead_of_the_cost_model() -> None:
    calls: list[tuple[list[str], list[str]]] = []

    def yes(producer, consumer) -> bool:
        calls.append(([n.op_type for n in producer], [n.op_type for n in consumer]))
        return True

    assert len(plan_dnnfusion(_chain(2), measure=yes).groups) == 1
    assert calls == [(["Relu"] * 10 + ["Reshape"], ["Transpose"])]
    assert len(plan_dnnfusion(_chain(64), measure=lambda p, c: False).groups) == 2


def test_hook_is_not_asked_for_always_and_never_pairs() -> None:
    g = _graph("""
    g (float[4,8] x, float[8,8] w1, float[8,8] w2) => (float[4,8] y) {
        m = MatMul(x, w1)
        r = Relu(m)
        y = MatMul(r, w2)
    }""")

    def fail(producer, consumer) -> bool:
        raise AssertionError("measure called for a pair the table decides")

    assert len(plan_dnnfusion(g, measure=fail).groups) == 2


def test_fan_out_of_one_to_many_ops() -> None:
    g = _graph("""
    g (float[1,4] x) => (float[8,4] y) <int64[2] shape = {8,4}> {
        y = Expand(x, shape)
    }""")
    (expand,) = g
    assert fan_out(expand) == 8


# ------------------------------------------------------------------------------------- seeds, convexity


SEEDS = """
g (float[1,{a}] x, float[{a},{b}] w1, float[{b},{a}] w2) => (float[1,{a}] y) {{
    ra = Relu(x)
    m1 = MatMul(ra, w1)
    rb = Relu(m1)
    y = MatMul(rb, w2)
}}"""


def _seeds_graph(a: int, b: int) -> ir.Graph:
    g = _graph(SEEDS.format(a=a, b=b))
    for node, name in zip(g, ["ra", "m1", "rb", "m2"], strict=True):
        node.name = name
    return g


def test_smallest_intermediate_seeds_first() -> None:
    # rb's output (1x4) is smaller than ra's (1x64): rb grows first and takes the second MatMul
    plan = plan_dnnfusion(_seeds_graph(64, 4))
    assert sorted(_groups(plan)) == [["ra", "m1"], ["rb", "m2"]]
    # ra's output (1x4) is smaller: ra grows first through m1 into rb; m2 cannot join (two MatMuls)
    plan = plan_dnnfusion(_seeds_graph(4, 64))
    assert sorted(_groups(plan)) == [["m2"], ["ra", "m1", "rb"]]


DIAMOND = """
g (float[1,8] x) => (float[1,8] y) <int64 axis = {1}> {
    a = Relu(x)
    b = Sigmoid(a)
    t = CumSum(a, axis)
    y = Add(b, t)
}"""


def test_diamond_with_opaque_side_path_stays_convex() -> None:
    g = _graph(DIAMOND)
    for node, name in zip(g, ["a", "b", "t", "y"], strict=True):
        node.name = name
    plan = plan_dnnfusion(g)  # verifies convexity too
    assert _group_with(plan, "t") == ["t"]  # opaque: alone
    assert "y" not in _group_with(plan, "a")  # a -> t -> y leaves the group and comes back
    assert _group_with(plan, "a") == ["a", "b"]


def test_opaque_ops_are_alone() -> None:
    g = _graph("""
    g (float[1,8] x) => (float[1,8] y) <int64 axis = {1}> {
        a = Relu(x)
        t = CumSum(a, axis)
        y = Relu(t)
    }""")
    plan = plan_dnnfusion(g)
    assert [grp.ops for grp in plan.groups] == [["Relu"], ["CumSum"], ["Relu"]]


def test_graph_output_inside_a_group() -> None:
    g = _graph("""
    g (float[2,8] x) => (float[2,8] a, float[2,8] y) {
        a = Relu(x)
        y = Sigmoid(a)
    }""")
    plan = plan_dnnfusion(g)
    assert len(plan.groups) == 1 and [v.name for v in plan.groups[0].outputs] == ["a", "y"]


def test_max_group_size_and_no_mutation() -> None:
    g = _chain(64)
    before = [(n.op_type, n.name) for n in g]
    plan = plan_dnnfusion(g, max_group_size=1)
    assert len(plan.groups) == 12
    assert [(n.op_type, n.name) for n in g] == before
    with pytest.raises(ValueError):
        plan_dnnfusion(g, max_group_size=0)


def test_bytes_moved_drops_on_a_fusable_chain() -> None:
    g = _graph("""
    g (float[16,16] x) => (float[16,16] y) {
        a = Relu(x)
        b = Sigmoid(a)
        y = Tanh(b)
    }""")
    plan = plan_dnnfusion(g)
    assert bytes_moved(plan) == 2 * 16 * 16 * 4  # read x, write y
    assert bytes_moved_unfused(g) == 6 * 16 * 16 * 4
    assert bytes_moved(plan) < bytes_moved_unfused(g)


# ------------------------------------------------------------------------------------- models

LIGHT = "bvlc_alexnet densenet121 inception_v1 inception_v2 resnet50 shufflenet squeezenet vgg19 zfnet512"


def _check_model(model: ir.Model) -> FusionPlan:
    dlcc.api.optimize(model, level=3, emit=lambda s: None)
    plan = plan_dnnfusion(model)  # verify_plan inside
    nodes = len(list(model.graph))
    assert sum(len(grp) for grp in plan.groups) == nodes
    assert len(plan.groups) < nodes
    assert all(len(grp) == 1 for grp in plan.groups if any(node_kind(n) == Kind.OPAQUE for n in grp.nodes))
    assert bytes_moved(plan) < bytes_moved_unfused(model)
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT.split())
def test_light_models(name: str) -> None:
    path = Path(onnx.__file__).parent / f"backend/test/data/light/light_{name}.onnx"
    _check_model(dlcc.load(path))


@pytest.mark.slow
def test_transformer_encoder() -> None:
    plan = _check_model(dlcc.load(KIT_MODELS["transformer_encoder"]()))
    # every MANY_TO_MANY op (MatMul, LayerNormalization, Softmax) needs its own group
    many = sum(1 for n in plan.graph if n.op_type in {"MatMul", "LayerNormalization", "Softmax"})
    assert many <= len(plan.groups) <= many + 1
    assert plan.fusion_rate > 3


RESIZE = """
g (float[1,1,8,8] x) => (y) <float[4] scales = {{1.0, 1.0, {s}, {s}}}> {{
    r = Relu(x)
    z = Resize <mode = "linear"> (r, , scales)
    y = Transpose(z)
}}"""


def test_measure_pair_decided_by_recomputation() -> None:
    # Relu + Resize (ONE_TO_MANY) then Transpose (SHUFFLE): MEASURE. Without fan-out the saved tensor wins;
    # a 4x upsample would recompute its linear interpolation per output element: too costly.
    same = plan_dnnfusion(_graph(RESIZE.format(s=1.0)))
    assert [grp.ops for grp in same.groups] == [["Relu", "Resize", "Transpose"]]
    up = plan_dnnfusion(_graph(RESIZE.format(s=4.0)))
    assert [grp.ops for grp in up.groups] == [["Relu", "Resize"], ["Transpose"]]
    assert fan_out(list(up.graph)[1]) == 16


# ------------------------------------------------------------------------------------- random graphs

_RANDOM_OPS = ["Relu", "Add", "MatMul", "Transpose", "CumSum", "Sigmoid", "Mul"]
_ARITY = {"Add": 2, "MatMul": 2, "Mul": 2}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_RANDOM_OPS), st.integers(0, 10**6), st.integers(0, 10**6)),
                min_size=1, max_size=14))
def test_random_graphs_give_valid_plans(spec: list[tuple[str, int, int]]) -> None:
    """Random DAGs of 4x4 tensors mixing all mapping types and an opaque op: the plan always verifies
    (every node once, convex groups, opaque alone) and no group holds two MANY_TO_MANY ops."""
    values, lines = ["x"], []
    for i, (op, a, b) in enumerate(spec):
        args = [values[a % len(values)], values[b % len(values)]][: _ARITY.get(op, 1)]
        if op == "CumSum":
            args.append("axis")
        lines.append(f"v{i} = {op}({', '.join(args)})")
        values.append(f"v{i}")
    used = {arg for line in lines for arg in line.split("(", 1)[1].rstrip(")").split(", ")}
    outs = [v for v in values[1:] if v not in used] or [values[-1]]
    text = (f"g (float[4,4] x) => ({', '.join(f'float[4,4] {v}' for v in outs)}) <int64 axis = {{1}}> {{\n"
            + "\n".join(lines) + "\n}")
    plan = plan_dnnfusion(_graph(text))
    for grp in plan.groups:
        assert sum(op_info(n.op_type).mapping is Mapping.MANY_TO_MANY and node_kind(n) != Kind.OPAQUE
                   for n in grp.nodes) <= 1
