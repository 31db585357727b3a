"""Reduction algebra rules: each fires on a small graph (axes as attributes and as inputs), keeps the
numbers in onnxruntime over several shapes (the data is a broadcast Add of two inputs), leaves a valid
model, is idempotent, and refuses when its guard says so."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnx.shape_inference
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlcc
from dlcc.check import random_inputs, run_ort
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.algebra.reduction import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires, check_rule_refuses

BY_NAME = {r.name: r for r in RULES}
SHAPES = [("2,3,4", "2,3,4"), ("3,1,5", "2,5"), ("3,2,2", "1")]  # (x, y): z = Add(x, y) is the data
SIG = "float[{x}] x, float[{y}] y"


def build(body: str, x: str = "2,3,4", y: str = "2,3,4", opset: int = 17, sig: str = SIG) -> ir.Model:
    text = (f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({sig.format(x=x, y=y)}) => '
            f'({body.split(")", 1)[0]}) {{ z = Add(x, y)\n{body.split("{", 1)[1]}')
    proto = onnx.parser.parse_model(text)
    for o in proto.graph.output:
        if not o.type.tensor_type.shape.dim:  # "float o": let inference fill the shape
            o.type.tensor_type.ClearField("shape")
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return infer_shapes(dlcc.load(proto))


def run_case(name: str, body: str, x: str, y: str, opset: int) -> None:
    check_rule_fires(build(body, x, y, opset), RULES, name, seeds=(2,))

U = "ax = Constant<value = int64[1] {1}>()\n u = Unsqueeze(z, ax)\n"  # u: z with a unit axis 1
A1 = "a1 = Constant<value = int64[1] {1}>()\n"
A0 = "a0 = Constant<value = int64[1] {0}>()\n"

# (rule, "outputs) { body }" over z, opset)
CASES = [
    ("reduction-unit-axes-keepdims", "float o) { " + U + " o = ReduceMax<axes = [1]>(u) }", 17),
    ("reduction-unit-axes-keepdims", "float o) { " + U + A1 + " o = ReduceSum(u, a1) }", 17),
    ("reduction-unit-axes-squeeze", "float o) { " + U + " o = ReduceMean<axes = [1], keepdims = 0>(u) }", 17),
    ("reduction-unit-axes-squeeze", "float o) { u = Unsqueeze<axes = [1]>(z)\n"
     " o = ReduceSum<axes = [1], keepdims = 0>(u) }", 11),
    ("reduction-sum-sum", "float o) { " + A1 + A0 + " a = ReduceSum<keepdims = 0>(z, a1)\n"
     " o = ReduceSum<keepdims = 0>(a, a0) }", 17),
    ("reduction-max-max", "float o) { a = ReduceMax<axes = [-1]>(z)\n o = ReduceMax<axes = [0]>(a) }", 17),
    ("reduction-max-max", "float o) { " + A1 + A0 + " a = ReduceMax(z, a1)\n o = ReduceMax(a, a0) }", 18),
    ("reduction-min-min", "float o) { a = ReduceMin<axes = [0], keepdims = 0>(z)\n"
     " o = ReduceMin<axes = [1], keepdims = 0>(a) }", 17),
    ("reduction-mean-mean", "float o) { a = ReduceMean<axes = [2]>(z)\n o = ReduceMean<axes = [0, 1]>(a) }", 17),
    ("reduction-prod-prod", "float o) { a = ReduceProd<axes = [1]>(z)\n o = ReduceProd<axes = [2]>(a) }", 17),
    ("reduction-max-of-neg", "float o) { n = Neg(z)\n o = ReduceMax<axes = [1]>(n) }", 17),
    ("reduction-min-of-neg", "float o) { n = Neg(z)\n o = ReduceMin<keepdims = 0>(n) }", 17),
    ("reduction-max-of-monotone", "float o) { n = Relu(z)\n o = ReduceMax<axes = [2]>(n) }", 17),
    ("reduction-max-of-monotone", "float o) { n = LeakyRelu<alpha = 0.1>(z)\n o = ReduceMax<axes = [0]>(n) }", 17),
    ("reduction-min-of-smooth", "float o) { n = Exp(z)\n o = ReduceMin<axes = [1], keepdims = 0>(n) }", 17),
    ("reduction-max-of-smooth", "float o) { n = Sigmoid(z)\n o = ReduceMax<axes = [0, 2]>(n) }", 17),
    ("reduction-max-of-smooth", "float o) { " + A1 + " n = Elu<alpha = 0.5>(z)\n o = ReduceMax(n, a1) }", 18),
    ("reduction-min-of-monotone", "float o) { n = HardSigmoid(z)\n o = ReduceMin<axes = [2]>(n) }", 17),
    ("reduction-min-of-monotone", "float o) { " + A1 + " n = Floor(z)\n o = ReduceMin(n, a1) }", 18),
    ("reduction-argmax-of-neg", "int64 o) { n = Neg(z)\n o = ArgMax<axis = 1>(n) }", 17),
    ("reduction-argmin-of-neg", "int64 o) { n = Neg(z)\n o = ArgMin<axis = -1, keepdims = 0>(n) }", 17),
    ("reduction-argmax-of-increasing", "int64 o) { n = Tanh(z)\n o = ArgMax<axis = 2>(n) }", 17),
    ("reduction-argmin-of-increasing", "int64 o) { n = Exp(z)\n o = ArgMin<axis = 0>(n) }", 17),
    ("reduction-argmax-of-softmax", "int64 o) { n = Softmax<axis = 1>(z)\n o = ArgMax<axis = 1>(n) }", 17),
    ("reduction-argmax-of-softmax", "int64 o) { n = LogSoftmax(z)\n o = ArgMin<axis = -1>(n) }", 17),
    ("reduction-norm-of-abs", "float o) { n = Abs(z)\n o = ReduceL2<axes = [1]>(n) }", 17),
    ("reduction-norm-of-abs", "float o) { n = Neg(z)\n o = ReduceSumSquare<axes = [0]>(n) }", 17),
    ("reduction-sum-of-abs-to-l1", "float o) { " + A1 + " n = Abs(z)\n o = ReduceSum(n, a1) }", 17),
    ("reduction-sum-of-abs-to-l1", "float o) { " + A1 + " n = Abs(z)\n o = ReduceSum<keepdims = 0>(n, a1) }", 18),
    ("reduction-sum-of-square", "float o) { " + A0 + " n = Mul(z, z)\n o = ReduceSum(n, a0) }", 17),
    ("reduction-sqrt-of-sumsquare", "float o) { s = ReduceSumSquare<axes = [2]>(z)\n o = Sqrt(s) }", 17),
    ("reduction-log-of-sum", "float o) { " + A1 + " r = Relu(z)\n s = ReduceSum(r, a1)\n o = Log(s) }", 17),
    ("reduction-log-sum-exp", "float o) { " + A1 + " e = Exp(z)\n s = ReduceSum(e, a1)\n o = Log(s) }", 17),
]


@pytest.mark.parametrize(("name", "body", "opset"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize(("x", "y"), SHAPES, ids=["same", "bcast", "scalar"])
def test_rule_fires_and_keeps_numbers(name: str, body: str, opset: int, x: str, y: str) -> None:
    run_case(name, body, x, y, opset)


REFUSALS = [
    ("reduction-unit-axes-keepdims", "reduced axes are not all of size 1", "float o) { o = ReduceMax<axes = [1]>(z) }"),
    ("reduction-unit-axes-keepdims", "axes not constant", "float[A,B,C,D] o) { " + U + " o = ReduceSum(u, a) }",
     SIG + ", int64[1] a"),
    ("reduction-unit-axes-squeeze", "reduced axes are not all of size 1",
     "float o) { o = ReduceMin<axes = [0], keepdims = 0>(z) }"),
    ("reduction-max-max", "keepdims differ",
     "float o) { a = ReduceMax<axes = [1]>(z)\n o = ReduceMax<axes = [0], keepdims = 0>(a) }"),
    ("reduction-sum-sum", "inner reduction has other uses", "float o, float p) { " + A1 + A0 +
     " a = ReduceSum(z, a1)\n o = ReduceSum(a, a0)\n p = Neg(a) }"),
    ("reduction-min-of-smooth", "Tanh has other uses",
     "float o, float p) { n = Tanh(z)\n o = ReduceMin<axes = [1]>(n)\n p = Exp(n) }"),
    ("reduction-max-of-monotone", "Relu has other uses",
     "float o, float p) { n = Relu(z)\n o = ReduceMax<axes = [1]>(n)\n p = Exp(n) }"),
    ("reduction-norm-of-abs", "Abs has other uses",
     "float o, float p) { n = Abs(z)\n o = ReduceL1<axes = [1]>(n)\n p = Exp(n) }"),
    ("reduction-sqrt-of-sumsquare", "ReduceSumSquare has other uses",
     "float o, float p) { s = ReduceSumSquare<axes = [2]>(z)\n o = Sqrt(s)\n p = Neg(s) }"),
    ("reduction-log-of-sum", "Log(ReduceSum(Exp(x))) is reduction-log-sum-exp",
     "float o) { " + A1 + " e = Exp(z)\n s = ReduceSum(e, a1)\n o = Log(s) }"),
    ("reduction-log-sum-exp", "Exp has other uses",
     "float o, float p) { " + A1 + " e = Exp(z)\n s = ReduceSum(e, a1)\n o = Log(s)\n p = Neg(e) }"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSALS)])
def test_guard_refuses(case: tuple) -> None:
    name, reason, body, *sig = case
    check_rule_refuses(build(body, sig=sig[0] if sig else SIG), RULES, name, reason)

@pytest.mark.parametrize(("name", "body"), [
    ("reduction-argmax-of-increasing", "int64 o) { n = Relu(z)\n o = ArgMax<axis = 1>(n) }"),  # Relu: ties
    ("reduction-argmax-of-softmax", "int64 o) { n = Softmax<axis = 1>(z)\n o = ArgMax<axis = 2>(n) }"),
    ("reduction-max-of-monotone", "float o) { n = LeakyRelu<alpha = -0.5>(z)\n o = ReduceMax<axes = [1]>(n) }"),
    ("reduction-max-of-smooth", "float o) { n = Cos(z)\n o = ReduceMax<axes = [1]>(n) }"),
    ("reduction-max-of-monotone", "float o) { n = Exp(z)\n o = ReduceMax<axes = [1]>(n) }"),
])
def test_no_match(name: str, body: str) -> None:
    """Structures the rules must not touch: non-strict or decreasing ops, another axis."""
    stats = RewriteStats()
    apply_rules(build(body), RULES, stats=stats, choose_best=True)
    assert stats.fired[name] == 0


def test_every_rule_is_tested() -> None:
    assert {c[0] for c in CASES} == set(BY_NAME)
    assert all(r.family == "reduction" and r.name.startswith("reduction-") and r.doc for r in RULES)
    assert len(BY_NAME) == len(RULES)


@settings(max_examples=20, deadline=None)
@given(dims=st.lists(st.integers(1, 4), min_size=2, max_size=4), data=st.data(),
       op=st.sampled_from(["ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean"]), keep=st.integers(0, 1),
       opset=st.sampled_from([13, 17, 18]))
def test_nested_reductions_property(dims: list[int], data, op: str, keep: int, opset: int) -> None:
    """Random ranks, axes (negative too) and keepdims: the merged reduction computes the same values."""
    rank = len(dims)
    inner = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank - 1, unique=True))
    if len({a % rank for a in inner}) != len(inner):
        inner = [inner[0]]
    left = rank if keep else rank - len(inner)
    outer = data.draw(st.lists(st.integers(0, left - 1), min_size=1, max_size=left, unique=True))

    def red(name: str, src: str, axes: list[int]) -> str:
        if axes_input(op, opset):
            return (f" {name}_ax = Constant<value = int64[{len(axes)}] {{{', '.join(map(str, axes))}}}>()\n"
                    f" {name} = {op}<keepdims = {keep}>({src}, {name}_ax)\n")
        return f" {name} = {op}<axes = [{', '.join(map(str, axes))}], keepdims = {keep}>({src})\n"

    shape = ",".join(map(str, dims))
    body = "float o) {" + red("a", "z", inner) + red("o", "a", outer) + "}"
    model = build(body, shape, shape, opset)
    proto = ir.serde.serialize_model(model)
    feeds = random_inputs(proto, seed=7)
    ref = run_ort(proto, feeds)
    stats = RewriteStats()
    assert apply_rules(model, RULES, stats=stats, choose_best=True)
    assert sum(stats.fired.values()) >= 1
    assert sum(1 for n in model.graph if n.op_type == op) <= 1
    got = run_ort(ir.serde.serialize_model(model), feeds)
    np.testing.assert_allclose(got["o"], ref["o"], rtol=1e-5, atol=1e-6)


def axes_input(op: str, opset: int) -> bool:
    return opset >= (13 if op == "ReduceSum" else 18)
