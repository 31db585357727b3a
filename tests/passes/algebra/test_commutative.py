"""Commutative algebra rules: each fires on a small graph (several shapes, broadcasting included), keeps
onnxruntime's results, passes the ONNX checker, is idempotent, and refuses with a reason on a guard."""

from __future__ import annotations

from string import Template

import numpy as np
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
from dlcc.passes.algebra.commutative import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires, check_rule_refuses

BY_NAME = {r.name: r for r in RULES}


def _model(text: str, opset: int = 17) -> ir.Model:
    proto = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\n' + text)
    for o in proto.graph.output:  # outputs get their shapes from inference
        o.type.tensor_type.ClearField("shape")
    proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    return infer_shapes(dlcc.load(proto))


def _fire_and_compare(rule: str, text: str, opset: int = 17) -> None:
    check_rule_fires(_model(text, opset), RULES, rule, seeds=(0, 1))

def _refuses(rule: str, text: str, reason: str, opset: int = 17) -> None:
    check_rule_refuses(_model(text, opset), RULES, rule, reason)

def _shapes(template: str, *subs: dict) -> list[str]:
    return [Template(template).substitute(s) for s in subs]


EXPAND = """g (float$X x) => (float y) {
    s = Constant <value = $S> ()
    e = Expand(x, s)
    y = $F
}"""
TILE = """g (float$X x) => (float y) {
    r = Constant <value = int64[2] {2, 3}> ()
    e = Tile(x, r)
    y = Abs(e)
}"""
RESIZE = """g (float$X x) => (float y) {
    sc = Constant <value = float[4] {1.0, 1.0, 2.0, 3.0}> ()
    e = Resize <mode = "$M"> (x, , sc)
    y = Tanh(e)
}"""
CONCAT = """g (float$X x, float$X z) => (float y) {
    e = Concat <axis = $A> (x, z, x, x)
    y = Exp(e)
}"""
PAD = """g (float$X x) => (float y) {
    p = Constant <value = int64[4] {1, 0, 2, 1}> ()
    e = Pad <mode = "$M"> (x, p)
    y = $F(e)
}"""
MAXPOOL = """g (float$X x) => (float y) {
    c = Constant <value = float {0.25}> ()
    lo = Constant <value = float {-0.5}> ()
    e = $F
    y = MaxPool <kernel_shape = [2, 2], strides = [2, 2], pads = [0, 0, 1, 1]> (e)
}"""
GMAXPOOL = """g (float$X x) => (float y) {
    e = $F(x)
    y = GlobalMaxPool(e)
}"""
GATHER_ELEMENTS = """g (float[4,3] x) => (float y) {
    i = Constant <value = int64$I> ()
    e = Neg(x)
    y = GatherElements <axis = 0> (e, i)
}"""
GATHER_ND = """g (float$X x) => (float y) {
    i = Constant <value = int64[2,1] {1, 3}> ()
    e = Abs(x)
    y = GatherND(e, i)
}"""
COMPRESS = """g (float$X x) => (float y) {
    c = Constant <value = bool[4] {1, 0, 1, 0}> ()
    e = Relu(x)
    y = Compress <axis = $A> (e, c)
}"""
PAIR = """g (float$A a, float$B b) => ($T y) {
    $S
    p = $L (a$P)
    q = $L (b$P)
    y = $OP(p, q)
}"""
CANON = """g (float$X x) => ($T y) {
    c = Constant <value = float[3] {0.5, -1.0, 2.0}> ()
    y = $OP(c, x)
}"""
RELU_DIFF = """g ($T$X x) => ($T y) {
    n = Neg(x)
    r1 = Relu(x)
    r2 = Relu(n)
    y = Sub(r1, r2)
}"""

SHAPES3 = ({"X": "[3,1]", "S": "int64[3] {2, 3, 4}"}, {"X": "[1,4]", "S": "int64[2] {5, 4}"},
           {"X": "[2,1,5]", "S": "int64[4] {3, 2, 4, 5}"})
POOL_SHAPES = ({"X": "[1,2,4,4]"}, {"X": "[2,3,5,6]"})


def _pair(layout: str, op: str, shapes: list[tuple[str, str]], setup: str = "", params: str = "",
          out: str = "float") -> list[str]:
    return _shapes(PAIR, *[{"A": a, "B": b, "T": out, "S": setup, "L": layout, "P": params, "OP": op}
                           for a, b in shapes])


POSITIVE: list[tuple[str, str]] = [
    *[("comm-pointwise-before-expand", t) for t in _shapes(EXPAND, *[{**s, "F": "Sigmoid(e)"} for s in SHAPES3])],
    *[("comm-pointwise-before-expand", t) for t in _shapes(
        EXPAND.replace("y = $F", 'h = Constant <value = float {0.5}> ()\n    y = $F'),
        *[{**s, "F": "Mul(e, h)"} for s in SHAPES3[:2]])],
    *[("comm-pointwise-before-tile", t) for t in _shapes(TILE, {"X": "[2,3]"}, {"X": "[1,4]"})],
    *[("comm-pointwise-before-resize", t) for t in _shapes(RESIZE, {"X": "[1,2,3,3]", "M": "nearest"},
                                                             {"X": "[2,1,2,4]", "M": "nearest"})],
    *[("comm-pointwise-before-concat", t) for t in _shapes(CONCAT, {"X": "[2,3]", "A": "0"},
                                                             {"X": "[2,3,4]", "A": "-1"})],
    *[("comm-pointwise-before-pad", t) for t in _shapes(PAD, {"X": "[3,4]", "M": "reflect", "F": "Exp"},
                                                          {"X": "[3,4]", "M": "edge", "F": "Sigmoid"},
                                                          {"X": "[2,5]", "M": "constant", "F": "Relu"})],
    *[("comm-monotone-after-maxpool", t) for t in _shapes(MAXPOOL, *[{**s, "F": f} for s in POOL_SHAPES
                                                                     for f in ("Relu(x)", "Add(x, c)",
                                                                               "Clip(x, lo)")])],
    *[("comm-monotone-after-globalmaxpool", t) for t in _shapes(GMAXPOOL, *[{**s, "F": "LeakyRelu"}
                                                                            for s in POOL_SHAPES])],
    *[("comm-smooth-after-maxpool", t) for t in _shapes(MAXPOOL, *[{**s, "F": "Sigmoid(x)"} for s in POOL_SHAPES])],
    *[("comm-pointwise-after-gatherelements", t) for t in _shapes(
        GATHER_ELEMENTS, {"I": "[2,3] {0, 3, 1, 2, 2, 0}"}, {"I": "[1,3] {3, 1, 0}"})],
    *[("comm-pointwise-after-gathernd", t) for t in _shapes(GATHER_ND, {"X": "[4,5]"}, {"X": "[4,2,3]"})],
    *[("comm-pointwise-after-compress", t) for t in _shapes(COMPRESS, {"X": "[4,3]", "A": "0"},
                                                              {"X": "[2,4]", "A": "1"})],
    *[("comm-binary-of-transposes", t) for t in _pair(
        "Transpose <perm = [1, 0, 2]>", "Max", [("[2,3,4]", "[2,1,4]"), ("[2,3,4]", "[1,3,1]")])],
    *[("comm-binary-of-transposes", t) for t in _pair(
        "Transpose <perm = [1, 0, 2]>", "Less", [("[2,3,4]", "[2,3,4]")], out="bool")],
    *[("comm-binary-of-reshapes", t) for t in _pair(
        "Reshape", "Min", [("[2,6]", "[2,6]"), ("[3,2,2]", "[3,2,2]")],
        "s = Constant <value = int64[2] {4, 3}> ()", ", s")],
    *[("comm-binary-of-flattens", t) for t in _pair(
        "Flatten <axis = 2>", "Mul", [("[2,3,4,5]", "[2,3,4,5]"), ("[1,2,3]", "[1,2,3]")])],
    *[("comm-binary-of-squeezes", t) for t in _pair(
        "Squeeze", "Max", [("[3,1,4]", "[1,1,4]"), ("[3,1,4]", "[3,1,1]")],
        "ax = Constant <value = int64[1] {1}> ()", ", ax")],
    *[("comm-binary-of-unsqueezes", t) for t in _pair(
        "Unsqueeze", "Min", [("[3,4]", "[1,4]"), ("[3,4]", "[3,4]")],
        "ax = Constant <value = int64[2] {0, -1}> ()", ", ax")],
    *[("comm-binary-of-expands", t) for t in _pair(
        "Expand", "Mul", [("[3,1]", "[1,4]"), ("[3,4]", "[3,4]"), ("[1,1,4]", "[3,1]")],
        "s = Constant <value = int64[3] {2, 3, 4}> ()", ", s")],
    *[("comm-binary-of-tiles", t) for t in _pair(
        "Tile", "Add", [("[2,3]", "[2,3]"), ("[1,4]", "[1,4]")],
        "r = Constant <value = int64[2] {2, 2}> ()", ", r")],
    *[("comm-binary-of-depthtospaces", t) for t in _pair(
        "DepthToSpace <blocksize = 2>", "Add", [("[1,8,2,3]", "[1,8,2,3]"), ("[2,4,1,2]", "[2,4,1,2]")])],
    *[("comm-binary-of-spacetodepths", t) for t in _pair(
        "SpaceToDepth <blocksize = 2>", "Sub", [("[1,2,4,6]", "[1,2,4,6]"), ("[2,1,2,2]", "[2,1,2,2]")])],
    *[("comm-binary-of-resizes", t) for t in _pair(
        "Resize", "Add", [("[1,2,3,3]", "[1,2,3,3]"), ("[2,1,2,2]", "[2,1,2,2]")],
        "sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()", ", , sc")],
    *[("comm-binary-of-pads", t) for t in _pair(
        'Pad <mode = "reflect">', "Div", [("[3,4]", "[3,4]"), ("[2,5]", "[2,5]")],
        "pd = Constant <value = int64[4] {1, 2, 1, 0}> ()", ", pd")],
    *[("comm-binary-of-pads", t) for t in _pair(
        "Pad", "Mul", [("[3,4]", "[3,4]")], "pd = Constant <value = int64[4] {1, 2, 1, 0}> ()", ", pd")],
    *[("comm-binary-of-gathers", t) for t in _pair(
        "Gather <axis = 0>", "Add", [("[3,4]", "[3,4]"), ("[2,1,3]", "[2,1,3]")],
        "i = Constant <value = int64[5] {0, 1, 1, 0, 1}> ()", ", i")],
    *[("comm-pointwise-before-gather", t) for t in _shapes(
        """g (float$X x) => (float y) {
        i = Constant <value = int64[$I] {0, 1, 1, 0, 1, 1}> ()
        e = Gather <axis = $A> (x, i)
        y = Cos(e)
    }""", {"X": "[2,3]", "I": "6", "A": "0"}, {"X": "[4,2]", "I": "3,2", "A": "1"})],
    *[("comm-binary-of-concats", t) for t in _shapes(
        """g (float$A a1, float$B a2, float$A b1, float$B b2) => (float y) {
        p = Concat <axis = $K> (a1, a2)
        q = Concat <axis = $K> (b1, b2)
        y = $OP(p, q)
    }""", {"A": "[2,3]", "B": "[2,4]", "K": "1", "OP": "Add"}, {"A": "[1,3]", "B": "[2,3]", "K": "-2", "OP": "Pow"})],
    *[(f"comm-{op.lower()}-const-right", t) for op, out in
      (("Add", "float"), ("Mul", "float"), ("Max", "float"), ("Min", "float"), ("Equal", "bool"))
      for t in _shapes(CANON, {"X": "[2,3]", "T": out, "OP": op}, {"X": "[3]", "T": out, "OP": op})],
    *[("comm-relu-minus-relu-neg", t) for t in _shapes(RELU_DIFF, {"X": "[3,4]", "T": "float"},
                                                         {"X": "[2,1,5]", "T": "float"})],
]

NEGATIVE: list[tuple[str, str, str]] = [
    ("comm-pointwise-before-expand", """g (float[3,1] x) => (float y, float z) {
        s = Constant <value = int64[2] {3, 4}> ()
        e = Expand(x, s)
        y = Relu(e)
        z = Neg(e)
    }""", "Expand result has other uses"),
    ("comm-pointwise-before-expand", _shapes(EXPAND, {"X": "[3,4]", "S": "int64[2] {3, 4}", "F": "Relu(e)"})[0],
     "Expand does not enlarge the tensor"),
    ("comm-pointwise-before-tile", """g (float[2,3] x) => (float y, float z) {
        r = Constant <value = int64[2] {2, 1}> ()
        e = Tile(x, r)
        y = Relu(e)
        z = Neg(e)
    }""", "Tile result has other uses"),
    ("comm-pointwise-before-resize", _shapes(RESIZE, {"X": "[1,2,3,3]", "M": "linear"})[0],
     "resize mode is not nearest"),
    ("comm-pointwise-before-concat", """g (float[2,3] x, float[2,3] z) => (float y) {
        e = Concat <axis = 0> (x, z)
        y = Exp(e)
    }""", "no repeated concat input"),
    ("comm-pointwise-before-pad", _shapes(PAD, {"X": "[3,4]", "M": "constant", "F": "Exp"})[0],
     "op does not map the pad value to itself"),
    ("comm-monotone-after-maxpool", _shapes(MAXPOOL, {"X": "[1,2,4,4]", "F": "Neg(x)"})[0],
     "op is not monotone non-decreasing"),
    ("comm-monotone-after-globalmaxpool", _shapes(GMAXPOOL, {"X": "[1,2,4,4]", "F": "Abs"})[0],
     "op is not monotone non-decreasing"),
    ("comm-smooth-after-maxpool", _shapes(MAXPOOL, {"X": "[1,2,4,4]", "F": "Sin(x)"})[0],
     "op is not monotone non-decreasing"),
    ("comm-pointwise-after-gatherelements", """g (float[2,3] x) => (float y) {
        i = Constant <value = int64[2,3] {0, 1, 1, 1, 0, 0}> ()
        e = Neg(x)
        y = GatherElements <axis = 0> (e, i)
    }""", "GatherElements does not shrink the tensor"),
    ("comm-pointwise-after-gathernd", """g (float[4,5] x) => (float y, float z) {
        i = Constant <value = int64[2,1] {1, 3}> ()
        e = Abs(x)
        y = GatherND(e, i)
        z = Neg(e)
    }""", "pointwise result has other uses"),
    ("comm-pointwise-after-compress", """g (float[4,3] x, bool[4] c) => (float y) {
        e = Relu(x)
        y = Compress <axis = 0> (e, c)
    }""", "condition is not constant"),
    ("comm-binary-of-transposes", """g (float[2,2,2] a, float[2,2,2] b) => (float y) {
        p = Transpose <perm = [1, 0, 2]> (a)
        q = Transpose <perm = [0, 2, 1]> (b)
        y = Max(p, q)
    }""", "layout parameters differ"),
    ("comm-binary-of-reshapes", """g (float[2,6] a, float[12] b) => (float y) {
        s = Constant <value = int64[2] {4, 3}> ()
        p = Reshape(a, s)
        q = Reshape(b, s)
        y = Min(p, q)
    }""", "operand shapes differ or unknown"),
    ("comm-binary-of-flattens", """g (float[2,3,4] a, float[6,4] b) => (float y) {
        p = Flatten <axis = 2> (a)
        q = Flatten <axis = 1> (b)
        y = Add(p, q)
    }""", "layout parameters differ"),
    ("comm-binary-of-squeezes", """g (float[2,3,1,4] a, float[3,1,4] b) => (float y) {
        ax = Constant <value = int64[1] {-2}> ()
        p = Squeeze(a, ax)
        q = Squeeze(b, ax)
        y = Add(p, q)
    }""", "operand ranks differ or unknown"),
    ("comm-binary-of-unsqueezes", """g (float[3,4] a, float[3,4] b) => (float y, float z) {
        ax = Constant <value = int64[1] {0}> ()
        p = Unsqueeze(a, ax)
        q = Unsqueeze(b, ax)
        y = Add(p, q)
        z = Neg(p)
    }""", "a layout result has other uses"),
    ("comm-binary-of-expands", """g (float[2,1,4] a, float[1,3,1] b) => (float y) {
        s = Constant <value = int64[3] {2, 3, 4}> ()
        p = Expand(a, s)
        q = Expand(b, s)
        y = Add(p, q)
    }""", "operands broadcast to the full shape"),
    ("comm-binary-of-tiles", """g (float[2,3] a, float[2,6] b) => (float y) {
        r = Constant <value = int64[2] {2, 2}> ()
        r1 = Constant <value = int64[2] {2, 1}> ()
        p = Tile(a, r)
        q = Tile(b, r1)
        y = Add(p, q)
    }""", "layout parameters differ"),
    ("comm-binary-of-depthtospaces", """g (float[1,8,2,3] a, float[1,8,2,3] b) => (float y, float z) {
        p = DepthToSpace <blocksize = 2> (a)
        q = DepthToSpace <blocksize = 2> (b)
        y = Add(p, q)
        z = Neg(q)
    }""", "a layout result has other uses"),
    ("comm-binary-of-spacetodepths", """g (float[1,2,4,6] a, float[1,2,2,6] b) => (float y) {
        p = SpaceToDepth <blocksize = 2> (a)
        q = SpaceToDepth <blocksize = 2> (b)
        y = Add(p, q)
    }""", "operand shapes differ or unknown"),
    ("comm-binary-of-resizes", """g (float[1,2,3,3] a, float[1,2,3,3] b) => (float y) {
        sc = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
        p = Resize <mode = "linear"> (a, , sc)
        q = Resize <mode = "linear"> (b, , sc)
        y = Add(p, q)
    }""", "not a nearest resize of float arithmetic"),
    ("comm-binary-of-pads", """g (float[3,4] a, float[3,4] b) => (float y) {
        pd = Constant <value = int64[4] {1, 2, 1, 0}> ()
        p = Pad(a, pd)
        q = Pad(b, pd)
        y = Div(p, q)
    }""", "op does not map (0, 0) to 0"),
    ("comm-binary-of-gathers", """g (float[3,4] a, float[3,4] b) => (float y) {
        i = Constant <value = int64[2] {0, 2}> ()
        p = Gather(a, i)
        q = Gather(b, i)
        y = Add(p, q)
    }""", "gather does not enlarge the tensor"),
    ("comm-pointwise-before-gather", """g (float[4,3] x) => (float y) {
        i = Constant <value = int64[2] {0, 2}> ()
        e = Gather(x, i)
        y = Cos(e)
    }""", "Gather does not enlarge the tensor"),
    ("comm-binary-of-concats", """g (float[2,3] a1, float[2,4] a2, float[2,4] b1, float[2,3] b2) => (float y) {
        p = Concat <axis = 1> (a1, a2)
        q = Concat <axis = 1> (b1, b2)
        y = Add(p, q)
    }""", "pieces do not align"),
    *[(f"comm-{op.lower()}-const-right", f"""g (float[3] x) => (float y) {{
        c = Constant <value = float[3] {{0.5, -1.0, 2.0}}> ()
        d = Constant <value = float[3] {{1.5, 1.0, 2.0}}> ()
        e = {op}(c, d)
        y = Add(x, e)
    }}""", "both operands constant (constant folding's job)") for op in ("Add", "Mul", "Max", "Min", "Equal")
      if op != "Equal"],
    ("comm-equal-const-right", """g (float[3] x) => (bool y) {
        c = Constant <value = float[3] {0.5, -1.0, 2.0}> ()
        d = Constant <value = float[3] {1.5, 1.0, 2.0}> ()
        e = Equal(c, d)
        f = Less(x, c)
        y = And(e, f)
    }""", "both operands constant (constant folding's job)"),
    ("comm-relu-minus-relu-neg", _shapes(RELU_DIFF, {"X": "[3,4]", "T": "int32"})[0], "dtype not float"),
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
    assert len(names) == len(RULES) >= 30
    assert names == {r for r, _ in POSITIVE}
    assert names == {r for r, _, _ in NEGATIVE}
    assert all(r.family == "commutative" and r.name.startswith("comm-") and r.doc for r in RULES)


def test_expand_rule_moves_the_op_before_the_copy() -> None:
    model = _model(_shapes(EXPAND, {**SHAPES3[0], "F": "Relu(e)"})[0])
    apply_rules(model, RULES, choose_best=True)
    assert [n.op_type for n in model.graph if n.op_type != "Constant"] == ["Relu", "Expand"]


def test_no_rule_moves_constants_left() -> None:
    """Canonical order: after the rules, no binary op in the result has a constant first operand."""
    model = _model(_shapes(CANON, {"X": "[2,3]", "T": "float", "OP": "Add"})[0])
    apply_rules(model, RULES, choose_best=True)
    (node,) = [n for n in model.graph if n.op_type == "Add"]
    assert node.inputs[0].name == "x"
    np.testing.assert_array_equal(ir.convenience.get_const_tensor(node.inputs[1]).numpy(),
                                  np.array([0.5, -1.0, 2.0], np.float32))


_UNARY_OPS = ("Relu", "Neg", "Abs", "Exp", "Sigmoid", "Tanh", "Floor", "Ceil", "Sign", "Softsign")
_MONOTONE_OPS = ("Relu", "Floor", "Ceil", "Sign", "LeakyRelu")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(_UNARY_OPS), mover=st.sampled_from(("expand", "tile", "pad", "concat")),
       dims=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_property_pointwise_before_copies(op: str, mover: str, dims: list[int], seed: int) -> None:
    """Random pointwise op over a random copying op: the rewrite fires and the results are identical."""
    x = "[" + ",".join(map(str, dims)) + "]"
    r = len(dims)
    def ints(values: list[int]) -> str:
        return f"s = Constant <value = int64[{len(values)}] {{{', '.join(map(str, values))}}}> ()"

    if mover == "expand":  # a new leading axis, and unit dims broadcast to 3
        setup, e = ints([2] + [3 if d == 1 else d for d in dims]), "Expand(x, s)"
    elif mover == "tile":
        setup, e = ints([2] * r), "Tile(x, s)"
    elif mover == "pad":
        setup, e = ints([1] * (2 * r)), 'Pad <mode = "edge"> (x, s)'
    else:
        setup, e = "", f"Concat <axis = {seed % r}> (x, x, x)"
    text = f"g (float{x} x) => (float y) {{\n {setup}\n e = {e}\n y = {op}(e)\n}}"
    model = _model(text)
    before = ir.serde.serialize_model(model)
    stats = RewriteStats()
    assert apply_rules(model, RULES, stats=stats, choose_best=True)
    assert sum(stats.fired.values()) == 1 and next(iter(stats.fired)).startswith("comm-pointwise-before-")
    feeds = random_inputs(before, seed=seed)
    ref, got = run_ort(before, feeds), run_ort(ir.serde.serialize_model(model), feeds)
    assert diff("y", ref["y"], got["y"], rtol=1e-5, atol=1e-6).ok


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op=st.sampled_from(_MONOTONE_OPS), c=st.integers(2, 3), hw=st.integers(2, 7), k=st.integers(2, 3),
       seed=st.integers(0, 2**16))
def test_property_monotone_after_maxpool(op: str, c: int, hw: int, k: int, seed: int) -> None:
    text = f"""g (float[1,{c},{hw},{hw}] x) => (float y) {{
        e = {op}(x)
        y = MaxPool <kernel_shape = [{k}, {k}], strides = [{k}, {k}], ceil_mode = 1> (e)
    }}"""
    model = _model(text)
    before = ir.serde.serialize_model(model)
    stats = RewriteStats()
    apply_rules(model, RULES, stats=stats, choose_best=True)
    if hw * hw > ((hw + k - 1) // k) ** 2:
        assert stats.fired["comm-monotone-after-maxpool"] == 1
    feeds = random_inputs(before, seed=seed)
    ref, got = run_ort(before, feeds), run_ort(ir.serde.serialize_model(model), feeds)
    assert diff("y", ref["y"], got["y"], rtol=1e-5, atol=1e-6).ok


def test_activation_in_a_conv_epilogue_stays_before_maxpool() -> None:
    """Conv -> Relu -> MaxPool: the Relu is free in the Conv's epilogue, so it is not moved after the pool"""
    import numpy as np
    import onnx.parser

    import dlcc
    from dlcc.frontend.shapes import infer_shapes
    from dlcc.passes.algebra.commutative import RULES
    from dlcc.passes.rewrite import RewriteStats, apply_rules

    proto = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,3,8,8] x) => (float[1,4,4,4] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        r = Relu(c)
        y = MaxPool <kernel_shape = [2,2], strides = [2,2]> (r)
    }
    """)
    proto.graph.initializer.append(onnx.numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w"))
    model = infer_shapes(dlcc.load(proto))
    stats = RewriteStats()
    assert not apply_rules(model, RULES, stats=stats, choose_best=True)
    assert any(rule == "comm-monotone-after-maxpool" and "epilogue" in why for rule, why in stats.refused)
