"""Layout algebra rules: each fires on a small graph (several shapes), keeps onnxruntime's results, passes
the ONNX checker, is idempotent, and refuses with a reason on a guard."""

from __future__ import annotations

from string import Template

import onnx
import onnx.parser
import onnx.shape_inference
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlcc
from dlcc.check import diff, random_inputs, run_ort
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.algebra.layout import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires, check_rule_refuses

BY_NAME = {r.name: r for r in RULES}


def _model(text: str, opset: int = 17) -> ir.Model:
    proto = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n' + text)
    for o in proto.graph.output:  # outputs get their shapes from inference
        o.type.tensor_type.ClearField("shape")
    proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    return infer_shapes(dlcc.load(proto))


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph if n.op_type != "Constant"]


def _fire_and_compare(rule: str, text: str, opset: int = 17) -> ir.Model:
    return check_rule_fires(_model(text, opset), RULES, rule, seeds=(0, 1))

def _refuses(rule: str, text: str, reason: str, opset: int = 17) -> None:
    check_rule_refuses(_model(text, opset), RULES, rule, reason)

def _shapes(template: str, *subs: dict) -> list[str]:
    return [Template(template).substitute(s) for s in subs]


CONCAT_T = """g (float$A a, float$B b) => (float y) {
    p = Transpose <perm = $P> (a)
    q = Transpose <perm = $P> (b)
    y = Concat <axis = $K> (p, q)
}"""
CONCAT_U = """g (float$A a, float$B b) => (float y) {
    ax = Constant <value = int64[$N] {$U}> ()
    p = $OP(a, ax)
    q = $OP(b, ax)
    y = Concat <axis = $K> (p, q)
}"""
SLICE_T = """g (float$X x) => (float y) {
    st = Constant <value = int64[1] {1}> ()
    en = Constant <value = int64[1] {3}> ()
    ax = Constant <value = int64[1] {$AX}> ()
    sp = Constant <value = int64[1] {$SP}> ()
    t = Transpose <perm = [1, 0, 2]> (x)
    y = Slice(t, st, en, ax, sp)
}"""
GATHER_T = """g (float$X x) => (float y) {
    i = Constant <value = $I> ()
    t = Transpose <perm = [2, 0, 1]> (x)
    y = Gather <axis = $K> (t, i)
}"""
REDUCE_T = """g (float$X x) => ($T y) {
    t = Transpose <perm = $P> (x)
    y = $R <$ATTRS> (t)
}"""
REDUCE_T_INPUT = """g (float$X x) => (float y) {
    ax = Constant <value = int64[1] {$AX}> ()
    t = Transpose <perm = [0, 2, 1]> (x)
    y = ReduceSum <keepdims = $K> (t, ax)
}"""
SOFTMAX_T = """g (float$X x) => (float y) {
    t = Transpose <perm = [0, 2, 1]> (x)
    s = $OP <axis = $K> (t)
    y = Transpose <perm = [0, 2, 1]> (s)
}"""
T_OF = """g (float$X x) => (float y) {
    s = Constant <value = $S> ()
    e = $OP(x, s)
    y = Transpose <perm = [2, 0, 1]> (e)
}"""
T_OF_PAD = """g (float$X x) => (float y) {
    s = Constant <value = int64[6] {0, 1, 2, 1, 0, 1}> ()
    e = Pad <mode = "$M"> (x, s)
    y = Transpose <perm = [2, 0, 1]> (e)
}"""
UNIT_T = """g (float$X x) => (float y) {
    y = Transpose <perm = $P> (x)
}"""
VIEW_OF_UNIT_T = """g (float$X x) => (float y) {
    s = Constant <value = int64[2] {-1, 2}> ()
    t = Transpose <perm = $P> (x)
    y = $V
}"""
SQUEEZE_T = """g (float$X x) => (float y) {
    ax = Constant <value = int64[1] {$AX}> ()
    t = Transpose <perm = $P> (x)
    y = Squeeze(t, ax)
}"""
T_UNSQUEEZE = """g (float$X x) => (float y) {
    ax = Constant <value = int64[$N] {$U}> ()
    u = Unsqueeze(x, ax)
    y = Transpose <perm = $P> (u)
}"""
D2S = """g (float$X x) => (float y) {
    d = $IN <blocksize = $B> (x)
    y = $OUT <blocksize = $B> (d)
}"""
CONST_T = """g (float$X x) => (float y) {
    c = Constant <value = $C> ()
    t = Transpose <perm = [0, 2, 1]> (x)
    e = $OP
    r = Relu(e)
    y = Transpose <perm = [0, 2, 1]> (r)
}"""

POSITIVE: list[tuple[str, str]] = [
    *[("layout-concat-of-transposes", t) for t in _shapes(
        CONCAT_T, {"A": "[2,3,4]", "B": "[2,3,5]", "P": "[0, 2, 1]", "K": "1"},
        {"A": "[2,3,4]", "B": "[1,3,4]", "P": "[2, 1, 0]", "K": "-1"})],
    *[("layout-concat-of-unsqueezes", t) for t in _shapes(
        CONCAT_U, {"A": "[3,4]", "B": "[2,4]", "OP": "Unsqueeze", "N": "1", "U": "0", "K": "1"},
        {"A": "[3,4]", "B": "[3,2]", "OP": "Unsqueeze", "N": "2", "U": "0, 2", "K": "-1"})],
    *[("layout-concat-of-squeezes", t) for t in _shapes(
        CONCAT_U, {"A": "[3,1,4]", "B": "[2,1,4]", "OP": "Squeeze", "N": "1", "U": "1", "K": "0"},
        {"A": "[1,3,1,4]", "B": "[1,3,1,2]", "OP": "Squeeze", "N": "2", "U": "0, -2", "K": "-1"})],
    *[("layout-slice-of-transpose", t) for t in _shapes(
        SLICE_T, {"X": "[4,5,6]", "AX": "0", "SP": "1"}, {"X": "[5,4,3]", "AX": "-1", "SP": "1"},
        {"X": "[5,4,3]", "AX": "0", "SP": "2"})],
    *[("layout-gather-of-transpose", t) for t in _shapes(
        GATHER_T, {"X": "[3,4,5]", "I": "int64[2] {0, 2}", "K": "1"}, {"X": "[3,4,5]", "I": "int64 {2}", "K": "0"},
        {"X": "[3,4,5]", "I": "int64[2,1] {1, 0}", "K": "2"})],
    *[("layout-reduce-minmax-of-transpose", t) for t in _shapes(
        REDUCE_T,
        {"X": "[2,3,4]", "P": "[0, 2, 1]", "T": "float", "R": "ReduceMax", "ATTRS": "axes = [1], keepdims = 0"},
        {"X": "[2,3,4]", "P": "[2, 0, 1]", "T": "float", "R": "ReduceMin", "ATTRS": "axes = [0, 2], keepdims = 1"},
        {"X": "[2,3,4]", "P": "[1, 2, 0]", "T": "float", "R": "ReduceMax", "ATTRS": "keepdims = 0"})],
    *[("layout-reduce-of-transpose", t) for t in _shapes(
        REDUCE_T,
        {"X": "[2,3,4]", "P": "[0, 2, 1]", "T": "float", "R": "ReduceMean", "ATTRS": "axes = [2], keepdims = 0"},
        {"X": "[2,3,4]", "P": "[2, 0, 1]", "T": "float", "R": "ReduceL2", "ATTRS": "axes = [1], keepdims = 1"})],
    *[("layout-reduce-of-transpose", t) for t in _shapes(REDUCE_T_INPUT, {"X": "[2,3,4]", "AX": "1", "K": "0"},
                                                           {"X": "[3,2,5]", "AX": "-1", "K": "1"})],
    *[("layout-argmax-of-transpose", t) for t in _shapes(
        REDUCE_T, {"X": "[2,3,4]", "P": "[0, 2, 1]", "T": "int64", "R": "ArgMax", "ATTRS": "axis = 1, keepdims = 0"},
        {"X": "[2,3,4]", "P": "[2, 0, 1]", "T": "int64", "R": "ArgMin", "ATTRS": "axis = -1, keepdims = 1"})],
    *[("layout-softmax-of-transpose", t) for t in _shapes(
        SOFTMAX_T, {"X": "[2,3,4]", "OP": "Softmax", "K": "1"}, {"X": "[2,3,4]", "OP": "LogSoftmax", "K": "-1"})],
    *[("layout-transpose-of-expand", t) for t in _shapes(
        T_OF, {"X": "[3,1,4]", "S": "int64[3] {3, 5, 4}", "OP": "Expand"},
        {"X": "[1,2,1]", "S": "int64[3] {3, 2, 4}", "OP": "Expand"})],
    *[("layout-transpose-of-tile", t) for t in _shapes(
        T_OF, {"X": "[3,1,4]", "S": "int64[3] {1, 5, 2}", "OP": "Tile"},
        {"X": "[2,2,2]", "S": "int64[3] {2, 1, 3}", "OP": "Tile"})],
    *[("layout-transpose-of-pad", t) for t in _shapes(T_OF_PAD, {"X": "[3,4,5]", "M": "constant"},
                                                        {"X": "[2,3,3]", "M": "reflect"})],
    *[("layout-transpose-unit-to-reshape", t) for t in _shapes(
        UNIT_T, {"X": "[3,1,4]", "P": "[1, 0, 2]"}, {"X": "[1,3,1,4]", "P": "[1, 2, 0, 3]"})],
    *[("layout-reshape-of-unit-transpose", t) for t in _shapes(
        VIEW_OF_UNIT_T, {"X": "[3,1,4]", "P": "[1, 0, 2]", "V": "Reshape(t, s)"},
        {"X": "[1,6,1,2]", "P": "[0, 2, 1, 3]", "V": "Reshape(t, s)"})],
    *[("layout-flatten-of-unit-transpose", t) for t in _shapes(
        VIEW_OF_UNIT_T, {"X": "[3,1,4]", "P": "[1, 0, 2]", "V": "Flatten <axis = 1> (t)"},
        {"X": "[1,6,1,2]", "P": "[0, 2, 1, 3]", "V": "Flatten <axis = 2> (t)"})],
    *[("layout-squeeze-of-transpose", t) for t in _shapes(
        SQUEEZE_T, {"X": "[3,1,4]", "P": "[1, 0, 2]", "AX": "0"}, {"X": "[3,4,1]", "P": "[2, 0, 1]", "AX": "0"})],
    *[("layout-transpose-of-unsqueeze", t) for t in _shapes(
        T_UNSQUEEZE, {"X": "[3,4]", "N": "1", "U": "0", "P": "[1, 0, 2]"},
        {"X": "[3,4]", "N": "2", "U": "0, 3", "P": "[3, 1, 0, 2]"})],
    *[("layout-space-to-depth-of-depth-to-space", t) for t in _shapes(
        D2S, {"X": "[1,8,2,3]", "IN": "DepthToSpace", "OUT": "SpaceToDepth", "B": "2"},
        {"X": "[2,9,1,2]", "IN": "DepthToSpace", "OUT": "SpaceToDepth", "B": "3"})],
    *[("layout-depth-to-space-of-space-to-depth", t) for t in _shapes(
        D2S, {"X": "[1,2,4,6]", "IN": "SpaceToDepth", "OUT": "DepthToSpace", "B": "2"},
        {"X": "[2,1,3,6]", "IN": "SpaceToDepth", "OUT": "DepthToSpace", "B": "3"})],
    *[("layout-sink-transpose-past-const-op", t) for t in _shapes(
        CONST_T, {"X": "[2,3,4]", "C": "float[4,3] {1,2,3,4,5,6,7,8,9,10,11,12}", "OP": "Mul(t, c)"},
        {"X": "[2,3,4]", "C": "float[1,4,1] {1,-2,3,0.5}", "OP": "Sub(c, t)"},
        {"X": "[2,3,4]", "C": "float[2,1,3] {1,-2,3,0.5,0.25,2}", "OP": "Add(t, c)"})],
]

NEGATIVE: list[tuple[str, str, str]] = [
    ("layout-concat-of-transposes", """g (float[2,3,4] a, float[2,4,3] b) => (float y) {
        p = Transpose <perm = [0, 2, 1]> (a)
        q = Transpose <perm = [0, 1, 2]> (b)
        y = Concat <axis = 1> (p, q)
    }""", "permutations differ or unknown"),
    ("layout-concat-of-unsqueezes", _shapes(
        CONCAT_U, {"A": "[3,4]", "B": "[3,4]", "OP": "Unsqueeze", "N": "1", "U": "0", "K": "0"})[0],
     "concat runs along an inserted axis"),
    ("layout-concat-of-squeezes", """g (float[3,1,4] a, float[3,4,1] b) => (float y) {
        a1 = Constant <value = int64[1] {1}> ()
        a2 = Constant <value = int64[1] {2}> ()
        p = Squeeze(a, a1)
        q = Squeeze(b, a2)
        y = Concat <axis = 0> (p, q)
    }""", "axes differ"),
    ("layout-slice-of-transpose", """g (float[4,5,6] x) => (float y, float z) {
        st = Constant <value = int64[1] {1}> ()
        en = Constant <value = int64[1] {3}> ()
        t = Transpose <perm = [1, 0, 2]> (x)
        y = Slice(t, st, en)
        z = Neg(t)
    }""", "Transpose result has other uses"),
    ("layout-gather-of-transpose", _shapes(GATHER_T, {"X": "[3,4,2]", "I": "int64[3] {0, 1, 1}", "K": "0"})[0],
     "gather does not shrink the tensor"),
    ("layout-reduce-minmax-of-transpose", """g (float[2,3,4] x) => (float y, float z) {
        t = Transpose <perm = [0, 2, 1]> (x)
        y = ReduceMax <axes = [1]> (t)
        z = Neg(t)
    }""", "Transpose result has other uses"),
    ("layout-reduce-of-transpose", """g (float[2,3,4] x) => (float y) {
        t = Transpose <perm = [0, 2, 1]> (x)
        y = ReduceSum <noop_with_empty_axes = 1> (t)
    }""", "empty axes reduce nothing"),
    ("layout-argmax-of-transpose", """g (float[2,3,4] x) => (int64 y, float z) {
        t = Transpose <perm = [0, 2, 1]> (x)
        y = ArgMax <axis = 1> (t)
        z = Neg(t)
    }""", "Transpose result has other uses"),
    ("layout-softmax-of-transpose", """g (float[2,3,4] x) => (float y) {
        t = Transpose <perm = [0, 2, 1]> (x)
        y = Softmax <axis = 1> (t)
    }""", "no Transpose below to meet"),
    ("layout-transpose-of-expand", _shapes(T_OF, {"X": "[1,4]", "S": "int64[3] {3, 5, 4}", "OP": "Expand"})[0],
     "operand rank differs from the output rank"),
    ("layout-transpose-of-tile", """g (float[3,1,4] x) => (float y, float z) {
        s = Constant <value = int64[3] {1, 5, 2}> ()
        e = Tile(x, s)
        y = Transpose <perm = [2, 0, 1]> (e)
        z = Neg(e)
    }""", "Tile result has other uses"),
    ("layout-transpose-of-pad", """g (float[3,4,5] x) => (float y, float z) {
        s = Constant <value = int64[6] {0, 1, 2, 1, 0, 1}> ()
        e = Pad(x, s)
        y = Transpose <perm = [2, 0, 1]> (e)
        z = Neg(e)
    }""", "Pad result has other uses"),
    ("layout-transpose-unit-to-reshape", _shapes(UNIT_T, {"X": "[3,2,4]", "P": "[1, 0, 2]"})[0],
     "transpose moves data"),
    ("layout-reshape-of-unit-transpose", _shapes(
        VIEW_OF_UNIT_T, {"X": "[3,2,4]", "P": "[1, 0, 2]", "V": "Reshape(t, s)"})[0], "transpose moves data"),
    ("layout-flatten-of-unit-transpose", _shapes(
        VIEW_OF_UNIT_T, {"X": "[3,2,4]", "P": "[1, 0, 2]", "V": "Flatten <axis = 1> (t)"})[0],
     "transpose moves data"),
    ("layout-squeeze-of-transpose", _shapes(SQUEEZE_T, {"X": "[3,1,4]", "P": "[2, 1, 0]", "AX": "1"})[0],
     "transpose still needed after the squeeze"),
    ("layout-transpose-of-unsqueeze", _shapes(
        T_UNSQUEEZE, {"X": "[3,4]", "N": "1", "U": "0", "P": "[2, 0, 1]"})[0], "transpose moves data"),
    ("layout-space-to-depth-of-depth-to-space", """g (float[1,8,2,3] x) => (float y) {
        d = DepthToSpace <blocksize = 2, mode = "CRD"> (x)
        y = SpaceToDepth <blocksize = 2> (d)
    }""", "DepthToSpace mode is not DCR"),
    ("layout-depth-to-space-of-space-to-depth", """g (float[1,1,4,4] x) => (float y) {
        d = SpaceToDepth <blocksize = 4> (x)
        y = DepthToSpace <blocksize = 2> (d)
    }""", "block sizes differ"),
    ("layout-sink-transpose-past-const-op", """g (float[2,3,4] x) => (float y) {
        c = Constant <value = float[4,3] {1,2,3,4,5,6,7,8,9,10,11,12}> ()
        t = Transpose <perm = [0, 2, 1]> (x)
        y = Mul(t, c)
    }""", "no Transpose below to meet"),
]


@pytest.mark.parametrize(("rule", "text"), POSITIVE, ids=[f"{r}-{i}" for i, (r, _) in enumerate(POSITIVE)])
def test_rule_fires_and_keeps_results(rule: str, text: str) -> None:
    _fire_and_compare(rule, text)


@pytest.mark.parametrize(("rule", "text", "reason"), NEGATIVE,
                         ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(NEGATIVE)])
def test_rule_refuses(rule: str, text: str, reason: str) -> None:
    _refuses(rule, text, reason)


def test_every_rule_is_tested() -> None:
    names = {r.name for r in RULES}
    assert len(names) == len(RULES) >= 20
    assert names == {r for r, _ in POSITIVE}
    assert names == {r for r, _, _ in NEGATIVE}
    assert all(r.family == "layout" and r.name.startswith("layout-") and r.doc for r in RULES)


def test_attribute_axes_below_opset_13() -> None:
    text = _shapes(T_UNSQUEEZE, {"X": "[3,4]", "N": "1", "U": "0", "P": "[1, 0, 2]"})[0]
    text = text.replace("    ax = Constant <value = int64[1] {0}> ()\n", "").replace(
        "Unsqueeze(x, ax)", "Unsqueeze <axes = [0]> (x)")
    model = _fire_and_compare("layout-transpose-of-unsqueeze", text, opset=11)
    (node,) = [n for n in model.graph if n.op_type == "Unsqueeze"]
    assert list(node.attributes["axes"].value) == [1]


def test_reduce_drops_the_transpose_when_order_is_kept() -> None:
    text = _shapes(REDUCE_T, {"X": "[2,3,4]", "P": "[0, 2, 1]", "R": "ReduceMax", "T": "float",
                              "ATTRS": "axes = [1], keepdims = 0"})[0]
    model = _fire_and_compare("layout-reduce-minmax-of-transpose", text)
    assert _ops(model) == ["ReduceMax"]


def test_softmax_transposes_meet() -> None:
    text = _shapes(SOFTMAX_T, {"X": "[2,3,4]", "OP": "Softmax", "K": "1"})[0]
    model = _fire_and_compare("layout-softmax-of-transpose", text)
    assert _ops(model) == ["Softmax", "Transpose", "Transpose"]  # the pair cancels in inverse-pairs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), op=st.sampled_from(("ReduceMax", "ReduceMin", "ArgMax", "ArgMin")),
       dims=st.lists(st.integers(1, 4), min_size=2, max_size=4), keep=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_property_reduce_of_transpose(data, op: str, dims: list[int], keep: int, seed: int) -> None:
    """Random permutation, reduced axes and keepdims: the Transpose moves below the reduction, exactly."""
    r = len(dims)
    perm = data.draw(st.permutations(list(range(r))))
    if op.startswith("Arg"):
        attrs, out = f"axis = {data.draw(st.integers(-r, r - 1))}, keepdims = {keep}", "int64"
    else:
        axes = data.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
        attrs, out = f"axes = [{', '.join(map(str, axes))}], keepdims = {keep}", "float"
    text = _shapes(REDUCE_T, {"X": "[" + ",".join(map(str, dims)) + "]", "P": str(list(perm)), "R": op,
                              "ATTRS": attrs, "T": out})[0]
    model = _model(text)
    before = ir.serde.serialize_model(model)
    stats = RewriteStats()
    assert apply_rules(model, RULES, stats=stats, choose_best=True)
    assert set(stats.fired) <= {"layout-reduce-minmax-of-transpose", "layout-argmax-of-transpose",
                                "layout-transpose-unit-to-reshape"}
    feeds = random_inputs(before, seed=seed)
    ref, got = run_ort(before, feeds), run_ort(ir.serde.serialize_model(model), feeds)
    assert diff("y", ref["y"], got["y"], rtol=1e-5, atol=1e-6).ok
