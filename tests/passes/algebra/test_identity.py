"""Identity algebra rules: each fires on a small graph, keeps the numbers (onnxruntime, several shapes
including broadcasting), leaves a valid model, is idempotent, and refuses when its guard says so."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
from dlcc.check import run_ort
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.algebra.identity import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires, check_rule_refuses

BY_NAME = {r.name: r for r in RULES}
SHAPES = [("2,3", "2,3"), ("4,1,5", "1,5"), ("3", "1")]  # (x, y): equal, broadcasting, rank 1


def build(sig: str, body: str, x: str = "2,3", y: str = "2,3", opset: int = 17) -> ir.Model:
    """A model from onnx text; ``{x}``/``{y}`` in ``sig`` are input shapes; outputs get inferred shapes."""
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({sig.format(x=x, y=y)}) => ({body}'
    proto = onnx.parser.parse_model(text)
    for o in proto.graph.output:
        o.type.tensor_type.ClearField("shape")
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return infer_shapes(dlcc.load(proto))


def run_case(name: str, sig: str, body: str, x: str, y: str, opset: int = 17) -> None:
    check_rule_fires(build(sig, body, x, y, opset), RULES, name)

def refuses(name: str, reason: str, sig: str, body: str, opset: int = 17) -> None:
    check_rule_refuses(build(sig, body, opset=opset), RULES, name, reason)

X = "float[{x}] x"
XY = "float[{x}] x, float[{y}] y"
B = "bool[{x}] x, bool[{y}] y"

# (rule, signature, "outputs) { body }", uses y)
CASES = [
    ("identity-neg-neg", X, "float o) { a = Neg(x)\n o = Neg(a) }"),
    ("identity-not-not", "bool[{x}] x", "bool o) { a = Not(x)\n o = Not(a) }"),
    ("identity-relu-of-nonneg", X, "float o) { a = Sigmoid(x)\n o = Relu(a) }"),
    ("identity-relu-of-nonneg", XY, "float o) { a = Mul(x, x)\n b = Relu(a)\n c = Add(b, y)\n o = Relu(c) }"),
    ("identity-abs-of-nonneg", X, "float o) { a = Exp(x)\n o = Abs(a) }"),
    ("identity-abs-of-nonneg", X, "float o) { a = Relu(x)\n o = Abs(a) }"),
    ("identity-abs-of-neg", X, "float o) { a = Neg(x)\n o = Abs(a) }"),
    ("identity-floor-of-integral", X, "float o) { a = Ceil(x)\n o = Floor(a) }"),
    ("identity-ceil-of-integral", "int32[{x}] x", "float o) { a = Cast<to=1>(x)\n o = Ceil(a) }"),
    ("identity-round-of-integral", X, "float o) { a = Floor(x)\n o = Round(a) }"),
    ("identity-sign-sign", X, "float o) { a = Sign(x)\n o = Sign(a) }"),
    ("identity-max-self", XY, "float o) { a = Add(x, y)\n o = Max(a, a) }"),
    ("identity-min-self", XY, "float o) { a = Sub(x, y)\n o = Min(a, a) }"),
    ("identity-and-self", B, "bool o) { a = Xor(x, y)\n o = And(a, a) }"),
    ("identity-or-self", B, "bool o) { a = And(x, y)\n o = Or(a, a) }"),
    ("identity-and-true", B, "bool o) { t = Constant<value = bool[1] {1}>()\n a = Xor(x, y)\n o = And(t, a) }"),
    ("identity-or-false", B, "bool o) { t = Constant<value = bool {0}>()\n a = Xor(x, y)\n o = Or(a, t) }"),
    ("identity-where-same", "float[{x}] x, bool[{y}] c", "float o) { a = Exp(x)\n o = Where(c, a, a) }"),
    ("identity-sub-self", XY, "float o) { a = Add(x, y)\n o = Sub(a, a) }"),
    ("identity-div-self", XY, "float o) { a = Mul(x, y)\n o = Div(a, a) }"),
    ("identity-sqrt-of-square", X, "float o) { a = Mul(x, x)\n o = Sqrt(a) }"),
    ("identity-square-of-sqrt", X, "float o) { a = Abs(x)\n s = Sqrt(a)\n o = Mul(s, s) }"),
    ("identity-reciprocal-reciprocal", X, "float o) { a = Reciprocal(x)\n o = Reciprocal(a) }"),
    ("identity-exp-of-log", X, "float o) { a = Sigmoid(x)\n b = Log(a)\n o = Exp(b) }"),
    ("identity-log-of-exp", X, "float o) { a = Exp(x)\n o = Log(a) }"),
    ("identity-clip-clip", X, "float o) { lo = Constant<value = float {-1.0}>()\n hi = Constant<value = float {1.0}>()"
     "\n z = Constant<value = float {0.0}>()\n h = Constant<value = float {2.0}>()\n a = Clip(x, lo, hi)"
     "\n o = Clip(a, z, h) }"),
    ("identity-clip-of-relu", X, "float o) { lo = Constant<value = float {0.5}>()"
     "\n hi = Constant<value = float {1.0}>()\n a = Relu(x)\n o = Clip(a, lo, hi) }"),
    ("identity-clip-to-relu", X, "float o) { z = Constant<value = float {0.0}>()\n o = Clip(x, z) }"),
    ("identity-sub-of-neg", XY, "float o) { b = Neg(y)\n o = Sub(x, b) }"),
    ("identity-add-of-neg", XY, "float o) { b = Neg(y)\n o = Add(b, x) }"),
]


@pytest.mark.parametrize(("name", "sig", "body"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize(("x", "y"), SHAPES, ids=["same", "bcast", "rank1"])
def test_rule_fires_and_keeps_numbers(name: str, sig: str, body: str, x: str, y: str) -> None:
    run_case(name, sig, body, x, y)


REFUSALS = [
    ("identity-abs-of-neg", "Neg has other uses: nothing saved", X,
     "float o, float p) { a = Neg(x)\n o = Abs(a)\n p = Exp(a) }"),
    ("identity-and-true", "constant is not True or broadcasts", "bool[3] x",
     "bool o) { t = Constant<value = bool[2,3] {1,1,1,1,1,1}>()\n o = And(x, t) }"),
    ("identity-or-false", "constant is not False or broadcasts", "bool[3] x",
     "bool o) { t = Constant<value = bool {1}>()\n o = Or(x, t) }"),
    ("identity-where-same", "the condition broadcasts the result", "float[3] x, bool[2,3] c",
     "float o) { o = Where(c, x, x) }"),
    ("identity-sub-self", "dtype not float", "int32[3] x", "int32 o) { o = Sub(x, x) }"),
    ("identity-div-self", "shape unknown", "float[N] x", "float o) { o = Div(x, x) }"),
    ("identity-sqrt-of-square", "x*x has other uses: nothing saved", X,
     "float o, float p) { a = Mul(x, x)\n o = Sqrt(a)\n p = Neg(a) }"),
    ("identity-clip-clip", "the two ranges do not overlap", X,
     "float o) { lo = Constant<value = float {-1.0}>()\n hi = Constant<value = float {1.0}>()"
     "\n z = Constant<value = float {2.0}>()\n a = Clip(x, lo, hi)\n o = Clip(a, z) }"),
    ("identity-clip-of-relu", "lower bound is negative", X,
     "float o) { lo = Constant<value = float {-0.5}>()\n a = Relu(x)\n o = Clip(a, lo) }"),
    ("identity-clip-of-relu", "Relu has other uses: nothing saved", X,
     "float o, float p) { lo = Constant<value = float {0.5}>()\n a = Relu(x)\n o = Clip(a, lo)\n p = Neg(a) }"),
    ("identity-clip-to-relu", "bounds are not [0, inf)", X,
     "float o) { z = Constant<value = float {0.0}>()\n h = Constant<value = float {6.0}>()\n o = Clip(x, z, h) }"),
    ("identity-clip-to-relu", "dtype not float", "int32[{x}] x",
     "int32 o) { z = Constant<value = int32 {0}>()\n o = Clip(x, z) }"),
    ("identity-sub-of-neg", "Neg has other uses: nothing saved", XY,
     "float o, float p) { b = Neg(y)\n o = Sub(x, b)\n p = Exp(b) }"),
    ("identity-add-of-neg", "Neg has other uses: nothing saved", XY,
     "float o, float p) { b = Neg(y)\n o = Add(x, b)\n p = Exp(b) }"),
]


@pytest.mark.parametrize(("name", "reason", "sig", "body"), REFUSALS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSALS)])
def test_guard_refuses(name: str, reason: str, sig: str, body: str) -> None:
    refuses(name, reason, sig, body)


@pytest.mark.parametrize("name", ["identity-relu-of-nonneg", "identity-abs-of-nonneg", "identity-exp-of-log",
                                  "identity-floor-of-integral", "identity-square-of-sqrt"])
def test_fact_not_known_no_match(name: str) -> None:
    """Rules that need a value fact (>= 0, > 0, integral) do not fire on an unknown operand."""
    body = {"identity-relu-of-nonneg": "float o) { a = Neg(x)\n o = Relu(a) }",
            "identity-abs-of-nonneg": "float o) { a = Tanh(x)\n o = Abs(a) }",
            "identity-exp-of-log": "float o) { a = Log(x)\n o = Exp(a) }",
            "identity-floor-of-integral": "float o) { a = Sqrt(x)\n o = Floor(a) }",
            "identity-square-of-sqrt": "float o) { s = Sqrt(x)\n o = Mul(s, s) }"}[name]
    model = build(X, body)
    stats = RewriteStats()
    apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.fired[name] == 0


def test_every_rule_is_tested() -> None:
    assert {c[0] for c in CASES} == set(BY_NAME)
    assert all(r.family == "identity" and r.name.startswith("identity-") and r.doc for r in RULES)
    assert len(BY_NAME) == len(RULES)


def test_graph_input_to_output_keeps_interface() -> None:
    model = build(X, "float o) { a = Neg(x)\n o = Neg(a) }")
    assert apply_rules(model, RULES, choose_best=True)
    assert [v.name for v in model.graph.outputs] == ["o"]
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    np.testing.assert_array_equal(run_ort(ir.serde.serialize_model(model), feeds)["o"], feeds["x"])


def test_integer_abs_is_not_known_nonneg() -> None:
    """Abs(INT_MIN) is negative and x*x wraps: Relu(Abs(x)) on int32 keeps its Relu."""
    model = build("int32[{x}] x", "int32 o) { a = Abs(x)\n o = Relu(a) }")
    stats = RewriteStats()
    apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.fired["identity-relu-of-nonneg"] == 0
    feeds = {"x": np.array([[-2**31, -1, 3], [0, 5, -7]], dtype=np.int32)}
    assert run_ort(ir.serde.serialize_model(model), feeds)["o"][0, 0] == 0
