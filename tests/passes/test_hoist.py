"""Hoisting: Slice/Gather move ahead of elementwise ops (the arithmetic shrinks), Transpose/Reshape move
behind them until a pair meets; each rule fires, refuses with its reason, is idempotent and exact."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlcc
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.hoist import RULES, Hoisting
from dlcc.passes.verify import verify_model
from dlcc.testing.rewrites import assert_equivalent


def make(text: str, inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(text)
    for name, arr in (inits or {}).items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def load(proto: onnx.ModelProto) -> ir.Model:
    return infer_shapes(dlcc.load(proto))


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)


def ints(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def run_pass(model: ir.Model) -> Hoisting:
    p = Hoisting()
    p.changed = p(model)
    verify_model(model)
    return p


def order(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def assert_same(proto: onnx.ModelProto, model: ir.Model, seed: int = 0) -> None:
    assert_equivalent(proto, model, rtol=1e-5, seed=seed)  # every hoisting rule is exact


def positive(proto: onnx.ModelProto, rule: str) -> ir.Model:
    model = load(proto)
    p = run_pass(model)
    assert p.changed and p.fired[rule] >= 1, (dict(p.fired), dict(p.refused))
    assert model.graph.outputs[0].name == proto.graph.output[0].name
    assert_same(proto, model)
    assert not run_pass(model).changed  # idempotent
    return model


def assert_refused(proto: onnx.ModelProto, rule: str, reason: str) -> None:
    model = load(proto)
    before = order(model)
    p = run_pass(model)
    assert not p.changed and p.fired[rule] == 0
    assert p.refused[(rule, reason)] >= 1, dict(p.refused)
    assert order(model) == before


def test_rules_have_docs() -> None:
    assert {r.name for r in RULES} == {"slice-before-elementwise", "gather-before-elementwise", "sink-transpose",
                                       "sink-reshape"}
    assert all(r.doc and r.family == "hoist" and r.exact for r in RULES)


# ------------------------------------------------------------------------------------------------ Slice

SLICE_UNARY = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,8,6] x) => (float[N,3,6] y) {
    r = Sigmoid(x)
    y = Slice(r, starts, ends, axes)
}
"""


def test_slice_before_unary() -> None:
    model = positive(make(SLICE_UNARY, {"starts": ints(1), "ends": ints(4), "axes": ints(1)}),
                     "slice-before-elementwise")
    assert order(model) == ["Slice", "Sigmoid"]
    assert list(model.graph)[1].outputs[0].name == "y"


def test_slice_before_unary_attribute_form() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 9]>
    g (float[2,8,6] x) => (float[2,8,2] y) {
        r = LeakyRelu<alpha = 0.3>(x)
        y = Slice<starts = [-3], ends = [-1], axes = [-1]>(r)
    }"""
    model = positive(make(text), "slice-before-elementwise")
    assert order(model) == ["Slice", "LeakyRelu"]
    assert list(model.graph)[1].attributes["alpha"].value == pytest.approx(0.3)


def test_slice_before_binary_slices_full_operands_only() -> None:
    # a: full (sliced by a node), bias: full on axis 1 (sliced as a constant), s: scalar, row: dim 1 on axis 1
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8,6] a, float[2,1,6] row) => (float[2,4,6] y) {
        t = Add(a, bias)
        u = Mul(t, s)
        v = Sub(u, row)
        y = Slice(v, starts, ends, axes, steps)
    }"""
    inits = {"bias": rand(8, 1, seed=1), "s": np.array(2.5, np.float32), "starts": ints(7), "ends": ints(0),
             "axes": ints(-2), "steps": ints(-2)}
    model = positive(make(text, inits), "slice-before-elementwise")
    assert Counter(order(model)) == Counter({"Slice": 1, "Add": 1, "Mul": 1, "Sub": 1})
    assert order(model)[0] == "Slice"
    add = next(n for n in model.graph if n.op_type == "Add")
    assert add.inputs[1].const_value.numpy().shape == (4, 1)  # rows 7, 5, 3, 1


def test_slice_of_shared_operand_is_sliced_once() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4,10] x) => (float[4,5] y) {
        sq = Mul(x, x)
        y = Slice(sq, starts, ends, axes)
    }"""
    model = positive(make(text, {"starts": ints(0), "ends": ints(5), "axes": ints(1)}), "slice-before-elementwise")
    assert order(model) == ["Slice", "Mul"]


def test_slice_refusals() -> None:
    rule = "slice-before-elementwise"
    inits = {"starts": ints(1), "ends": ints(4), "axes": ints(1)}
    shared = SLICE_UNARY.replace("=> (float[N,3,6] y)", "=> (float[N,3,6] y, float[N,8,6] r)")
    assert_refused(make(shared, inits), rule, "elementwise result has other uses")
    varying = SLICE_UNARY.replace("(float[N,8,6] x)", "(float[N,8,6] x, int64[1] starts)")
    assert_refused(make(varying, {"ends": ints(4), "axes": ints(1)}), rule, "slice parameters are not constant")
    whole = SLICE_UNARY.replace("float[N,3,6] y", "float[N,8,6] y")
    assert_refused(make(whole, {"starts": ints(0), "ends": ints(100), "axes": ints(1)}), rule,
                   "slice does not shrink the tensor")
    symbolic = SLICE_UNARY.replace("float[N,8,6] x", "float[N,C,6] x").replace("float[N,3,6] y", "float[N,3,6] y")
    assert_refused(make(symbolic, inits), rule, "sliced dims unknown")
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4,8] a, float[4,K] b) => (float[4,3] y) {
        t = Add(a, b)
        y = Slice(t, starts, ends, axes)
    }"""
    assert_refused(make(text, inits), rule, "operand dim unknown on the selected axis")


# ----------------------------------------------------------------------------------------------- Gather

GATHER = """
<ir_version: 8, opset_import: ["" : OPSET]>
g (float[5,7,3] x, float[5,1,3] one) => (float[OUT] y) {
    t = Mul(x, s)
    u = Add(t, one)
    v = Div(u, col)
    y = Gather<axis = 1>(v, idx)
}
"""


@pytest.mark.parametrize(("opset", "idx", "out"), [
    (17, np.array(2, np.int64), "5,3"),
    (13, np.array([6, 0, -1], np.int64), "5,3,3"),
    (9, np.array([[1, 2], [3, 4]], np.int64), "5,2,2,3"),
])
def test_gather_before_binary(opset: int, idx: np.ndarray, out: str) -> None:
    text = GATHER.replace("OPSET", str(opset)).replace("OUT", out)
    inits = {"s": np.array([1.5], np.float32), "col": (np.abs(rand(7, 1, seed=3)) + 0.5), "idx": idx}
    model = positive(make(text, inits), "gather-before-elementwise")
    # x is gathered by a node, `one` (dim 1 on the axis) by index 0, col (constant) in numpy
    assert Counter(order(model)) == Counter({"Gather": 2, "Mul": 1, "Add": 1, "Div": 1})
    div = next(n for n in model.graph if n.op_type == "Div")
    assert div.inputs[1].const_value.numpy().shape == (*idx.shape, 1)


def test_gather_refusals() -> None:
    rule = "gather-before-elementwise"
    text = GATHER.replace("OPSET", "17").replace("OUT", "5,3")
    inits = {"s": np.array([1.5], np.float32), "col": rand(7, 1), "idx": np.array(2, np.int64)}
    varying = text.replace("float[5,1,3] one)", "float[5,1,3] one, int64 idx)")
    assert_refused(make(varying, {k: v for k, v in inits.items() if k != "idx"}), rule, "indices are not constant")
    full = text.replace("float[5,3] y", "float[5,7,3] y")
    assert_refused(make(full, dict(inits, idx=np.arange(7, dtype=np.int64))), rule,
                   "gather does not shrink the tensor")
    shared = text.replace("=> (float[5,3] y)", "=> (float[5,3] y, float[5,7,3] v)")
    assert_refused(make(shared, inits), rule, "elementwise result has other uses")


# ---------------------------------------------------------------------------------------- sink Transpose

TRANSPOSES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4,5] x) => (float[2,3,4,5] y) {
    a = Transpose<perm = [0, 2, 3, 1]>(x)
    b = Relu(a)
    c = Mul(b, s)
    d = Clip(c, lo, hi)
    y = Transpose<perm = [0, 3, 1, 2]>(d)
}
"""
T_INITS = {"s": np.array(0.5, np.float32), "lo": np.array(-0.2, np.float32), "hi": np.array(0.7, np.float32)}


def test_sink_transpose_lets_the_pair_meet() -> None:
    model = positive(make(TRANSPOSES, T_INITS), "sink-transpose")
    assert order(model) == ["Relu", "Mul", "Clip", "Transpose", "Transpose"]
    first, second = list(model.graph)[3:]
    assert second.inputs[0] is first.outputs[0]


def test_inverse_pairs_removes_the_met_transposes() -> None:
    redundant = pytest.importorskip("dlcc.passes.redundant")
    proto = make(TRANSPOSES, T_INITS)
    model = load(proto)
    assert run_pass(model).changed
    assert redundant.InversePairs()(model)
    verify_model(model)
    assert "Transpose" not in order(model)
    assert_same(proto, model)


def test_sink_reshape() -> None:
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,12] x) => (float[2,12] y) {
        a = Reshape(x, s1)
        b = Tanh(a)
        c = Add(two, b)
        y = Reshape(c, s2)
    }"""
    inits = {"s1": ints(2, 3, 4), "s2": ints(2, 12), "two": np.array([[2.0]], np.float32)}
    model = positive(make(text, inits), "sink-reshape")
    assert order(model) == ["Tanh", "Add", "Reshape", "Reshape"]


def test_sink_refusals() -> None:
    rule = "sink-transpose"
    no_pair = TRANSPOSES.replace("y = Transpose<perm = [0, 3, 1, 2]>(d)", "y = Softmax(d)").replace(
        "float[2,3,4,5] y", "float[2,4,5,3] y")
    assert_refused(make(no_pair, T_INITS), rule, "no Transpose below to meet")
    shared = TRANSPOSES.replace("=> (float[2,3,4,5] y)", "=> (float[2,3,4,5] y, float[2,4,5,3] a)")
    assert_refused(make(shared, T_INITS), rule, "Transpose result has other uses")
    tensor = TRANSPOSES.replace("b = Relu(a)", "b = Mul(a, w)")
    assert_refused(make(tensor, dict(T_INITS, w=rand(3))), rule, "other operands are not scalar constants")
    rank = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[6] x) => (float[1,6] y) {
        a = Reshape(x, s1)
        b = Mul(a, s)
        y = Reshape(b, s2)
    }"""
    assert_refused(make(rank, {"s1": ints(2, 3), "s2": ints(1, 6), "s": np.ones((1, 1), np.float32)}),
                   "sink-reshape", "scalar operand raises the rank")


def test_hoisting_rules_do_not_cycle_together() -> None:
    # a Transpose above an elementwise op whose result is sliced, beside a Transpose pair
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,6,4] x) => (float[2,6,4] y, float[2,2,6] z) {
        a = Transpose<perm = [0, 2, 1]>(x)
        b = Exp(a)
        z = Slice(b, starts, ends, axes)
        c = Transpose<perm = [0, 2, 1]>(x)
        d = Neg(c)
        e = Sigmoid(d)
        y = Transpose<perm = [0, 2, 1]>(e)
    }"""
    proto = make(text, {"starts": ints(1), "ends": ints(3), "axes": ints(1)})
    model = load(proto)
    p = run_pass(model)
    assert p.fired["slice-before-elementwise"] == 1 and p.fired["sink-transpose"] == 2
    assert_same(proto, model)
    assert not run_pass(model).changed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain=st.lists(st.sampled_from(["Relu", "Neg", "Tanh", "Mul", "Add"]), min_size=1, max_size=4),
       perm=st.permutations([0, 1, 2]), tail=st.sampled_from(["Transpose", "Slice", "Gather"]))
def test_random_chains_stay_equivalent(chain: list[str], perm: list[int], tail: str) -> None:
    lines, v = [f"t0 = Transpose<perm = {list(perm)}>(x)"], "t0"
    for i, op in enumerate(chain):
        args = f"{v}, k" if op in ("Mul", "Add") else v
        lines.append(f"e{i} = {op}({args})")
        v = f"e{i}"
    tails = {"Transpose": f"y = Transpose<perm = [2, 0, 1]>({v})",
             "Slice": f"y = Slice({v}, starts, ends, axes)", "Gather": f"y = Gather<axis = 2>({v}, idx)"}
    lines.append(tails[tail])
    body = "\n        ".join(lines)
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3,4,5] x) => (float[d0,d1,d2] y) {{
        {body}
    }}"""
    proto = onnx.parser.parse_model(text)
    for name, arr in {"k": np.array(0.5, np.float32), "starts": ints(1), "ends": ints(3), "axes": ints(0),
                      "idx": ints(0, 2)}.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    model = load(proto)
    p = run_pass(model)
    if tail == "Transpose":
        assert p.fired["sink-transpose"] == len(chain)
        assert order(model)[-2:] == ["Transpose", "Transpose"]
    else:
        assert p.fired[f"{tail.lower()}-before-elementwise"] == len(chain)
    assert_same(proto, model)
    assert not run_pass(model).changed
