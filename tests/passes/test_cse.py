"""Common-subexpression elimination: equal nodes and equal initializers merge; what must not merge doesn't."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import numpy_helper

import dlcc
from dlcc.check import diff, random_inputs, run_ort
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.cse import CommonSubexpressionElimination, is_mergeable, node_key
from dlcc.passes.verify import verify_model

H = '<ir_version: 8, opset_import: ["" : 17]>'


def build(text: str, inits: dict[str, np.ndarray] | None = None, keep_inputs: bool = False) -> ir.Model:
    proto = onnx.parser.parse_model(text)
    for name, arr in (inits or {}).items():
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
    return infer_shapes(dlcc.load(proto, keep_initializer_inputs=keep_inputs))


def run_cse(model: ir.Model, *, ort: bool = True) -> CommonSubexpressionElimination:
    """Run CSE once; verify the IR, the checker, onnxruntime equivalence and idempotence."""
    before = ir.serde.serialize_model(model)
    feeds = random_inputs(before, seed=0) if ort else {}
    ref = run_ort(before, feeds) if ort else {}
    out_names = [v.name for v in model.graph.outputs]
    p = CommonSubexpressionElimination()
    changed = p(model)
    assert changed == bool(p.fired)
    verify_model(model)
    assert [v.name for v in model.graph.outputs] == out_names
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    if ort:
        got = run_ort(after, feeds)
        for k in ref:
            d = diff(k, ref[k], got[k], rtol=1e-5, atol=1e-6)
            assert d.ok, d
    assert not CommonSubexpressionElimination()(model)  # one sweep reaches the fixpoint
    return p


def ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def test_equal_nodes_merge_and_whole_subtrees_in_one_sweep() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y) {
        a = Relu (x)
        b = Relu (x)
        ea = Exp (a)
        eb = Exp (b)
        y = Add (ea, eb)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 2
    assert ops(model) == ["Relu", "Exp", "Add"]
    add = model.graph.node(2)
    assert add.inputs[0] is add.inputs[1]


def test_attributes_are_compared_exactly() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y) {
        a = LeakyRelu <alpha = 0.1> (x)
        b = LeakyRelu <alpha = 0.1> (x)
        c = LeakyRelu <alpha = 0.1000001> (x)
        s0 = Softmax <axis = 0> (x)
        s1 = Softmax <axis = 1> (x)
        ab = Add (a, b)
        cs = Add (c, s0)
        t = Add (ab, cs)
        y = Add (t, s1)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 1
    assert ops(model).count("LeakyRelu") == 2 and ops(model).count("Softmax") == 2


def test_omitted_inputs_are_part_of_the_key() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y) {
        lo = Constant <value = float {-0.5}> ()
        a = Clip (x, lo, )
        b = Clip (x, , lo)
        y = Add (a, b)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 0
    assert ops(model).count("Clip") == 2


def test_equal_constant_nodes_merge_by_value() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y) {
        c1 = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
        c2 = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
        c3 = Constant <value = int32[3] {1, 2, 3}> ()
        a = Mul (x, c1)
        b = Mul (x, c2)
        f = Cast <to = 1> (c3)
        s = Add (a, b)
        y = Add (s, f)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 2  # the constant, then the Mul that now reads the same constant
    assert ops(model) == ["Constant", "Constant", "Mul", "Cast", "Add", "Add"]


def test_equal_initializers_merge_by_bytes_not_dtype_or_shape() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3,)).astype(np.float32)
    inits = {"w1": w, "w2": w.copy(), "w3": w.reshape(1, 3).copy(), "zf": np.zeros(3, np.float32),
             "zi": np.zeros(3, np.int32)}
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y, int32[3] zo) {
        a = Mul (x, w1)
        b = Mul (x, w2)
        c = Mul (x, w3)
        f = Cast <to = 1> (zi)
        s = Add (a, b)
        t = Add (s, c)
        u = Add (t, zf)
        y = Add (u, f)
        zo = Identity (zi)
    }""", inits)
    p = run_cse(model)
    assert p.fired["merge-initializer"] == 1  # w2 -> w1; w3 (other shape) and zi/zf (other dtype) stay
    assert sorted(model.graph.initializers) == ["w1", "w3", "zf", "zi"]
    assert p.fired["merge-node"] == 1  # Mul(x, w1) twice


def test_initializers_that_are_graph_inputs_or_outputs_never_merge() -> None:
    w = np.arange(3, dtype=np.float32)
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x, float[3] w1) => (float[2,3] y, float[3] w2) {
        a = Mul (x, w1)
        b = Mul (x, w2)
        c = Mul (x, w3)
        s = Add (a, b)
        y = Add (s, c)
    }"""
    model = build(text, {"w1": w, "w2": w.copy(), "w3": w.copy()}, keep_inputs=True)
    assert model.graph.inputs[1].is_initializer()
    p = run_cse(model)
    assert p.fired["merge-initializer"] == 0
    assert sorted(model.graph.initializers) == ["w1", "w2", "w3"]


def test_duplicate_graph_output_keeps_its_name() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y, float[2,3] z) {
        a = Relu (x)
        y = Neg (a)
        z = Relu (x)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 1
    assert ops(model) == ["Relu", "Neg"]
    relu = model.graph.node(0)
    assert relu.outputs[0].name == "z" and model.graph.outputs[1] is relu.outputs[0]


def test_two_graph_outputs_keep_both_nodes() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y, float[2,3] z) {
        y = Relu (x)
        z = Relu (x)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 0
    assert ops(model) == ["Relu", "Relu"]


def test_non_deterministic_ops_never_merge() -> None:
    model = build(H + """
    g (float[2,3] x) => (float[2,3] y) {
        a = RandomNormalLike <seed = 1.0> (x)
        b = RandomNormalLike <seed = 1.0> (x)
        c = RandomUniform <shape = [2, 3], seed = 2.0> ()
        d = RandomUniform <shape = [2, 3], seed = 2.0> ()
        s = Add (a, b)
        t = Add (c, d)
        y = Add (s, t)
    }""")
    p = run_cse(model, ort=False)  # random draws: equivalence in onnxruntime is meaningless
    assert p.fired["merge-node"] == 0
    assert ops(model).count("RandomNormalLike") == 2 and ops(model).count("RandomUniform") == 2


def test_subgraph_carrying_nodes_never_merge() -> None:
    # (the condition is bool[1]: dlcc.check.random_inputs returns a numpy scalar for a rank-0 bool)
    model = build(H + """
    g (float[2,3] x, bool[1] c) => (float[2,3] y) {
        a = If (c) <then_branch = t () => (float[2,3] o) { o = Relu (x) },
                    else_branch = e () => (float[2,3] o) { o = Neg (x) }>
        b = If (c) <then_branch = t () => (float[2,3] o) { o = Relu (x) },
                    else_branch = e () => (float[2,3] o) { o = Neg (x) }>
        y = Add (a, b)
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 0
    assert ops(model).count("If") == 2


def test_subgraphs_are_processed_on_their_own() -> None:
    model = build(H + """
    g (float[2,3] x, bool[1] c) => (float[2,3] y) {
        y = If (c) <then_branch = t () => (float[2,3] o) { p = Relu (x)
                                                           q = Relu (x)
                                                           o = Add (p, q) },
                    else_branch = e () => (float[2,3] o) { o = Neg (x) }>
    }""")
    p = run_cse(model)
    assert p.fired["merge-node"] == 1
    then = model.graph.node(0).attributes["then_branch"].value
    assert [n.op_type for n in then] == ["Relu", "Add"]


@pytest.mark.parametrize(("domain", "op", "ok"), [
    ("", "Relu", True), ("com.microsoft", "Gelu", True), ("com.microsoft", "BiasDropout", False),
    ("", "Bernoulli", False), ("", "Dropout", False), ("custom.vendor", "Fancy", False),
])
def test_mergeable_ops(domain: str, op: str, ok: bool) -> None:
    x = ir.Value(name="x")
    node = ir.Node(domain, op, [x], num_outputs=1)
    assert is_mergeable(node) is ok
    assert (node_key(node) is not None) is ok
