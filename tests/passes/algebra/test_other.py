"""Other algebra rules (Pow/Div strength reduction, Min/Max -> Clip/Relu/LeakyRelu, activation idioms):
each fires on a small graph, keeps the numbers in onnxruntime over several shapes (including a broadcast
operand), leaves a valid model, is idempotent, and refuses when its guard says so."""

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
from dlcc.passes.algebra.other import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires, check_rule_refuses

BY_NAME = {r.name: r for r in RULES}
SHAPES = [("2,3", "2,3"), ("4,1,5", "1,5"), ("3", "1")]  # (x, y): z = Add(x, y) is the data
SIG = "float[{x}] x, float[{y}] y"


def build(body: str, x: str = "2,3", y: str = "2,3", opset: int = 17, sig: str = SIG) -> ir.Model:
    outs, rest = body.split(")", 1)
    text = (f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({sig.format(x=x, y=y)}) => ({outs}) '
            f'{{ z = Add(x, y)\n{rest.split("{", 1)[1]}')
    proto = onnx.parser.parse_model(text)
    for o in proto.graph.output:
        if not o.type.tensor_type.shape.dim:
            o.type.tensor_type.ClearField("shape")
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return infer_shapes(dlcc.load(proto))


def check_rule(model: ir.Model, name: str, feeds: dict | None = None) -> None:
    check_rule_fires(model, RULES, name, feeds=feeds, seeds=(3,))

def c(name: str, value: float, shape: str = "") -> str:
    """A Constant node line: ``name = Constant<value = float[shape] {value}>()``."""
    typ = f"float[{shape}]" if shape else "float"
    return f" {name} = Constant<value = {typ} {{{value}}}>()\n"


MAX_SUB = " m = ReduceMax<axes = [-1]>(z)\n d = Sub(z, m)\n"
A = " a = Constant<value = int64[1] {-1}>()\n"

# (rule, "outputs) { body }" over z = Add(x, y), opset)
CASES = [
    ("other-pow-square", "float o) {" + c("k", 2.0) + " o = Pow(z, k) }", 17),
    ("other-pow-sqrt", "float o) {" + c("k", 0.5, "1") + " r = Abs(z)\n o = Pow(r, k) }", 17),
    ("other-pow-reciprocal", "float o) {" + c("k", -1.0) + " o = Pow(z, k) }", 17),
    ("other-pow-zero", "float o) {" + c("k", 0.0) + " o = Pow(z, k) }", 17),
    ("other-div-pow2-to-mul", "float o) {" + c("k", 4.0) + " o = Div(z, k) }", 17),
    ("other-div-pow2-to-mul", "float o) { k = Constant<value = float[2] {0.5, -8.0}>()\n"
     " w = Unsqueeze<axes = [-1]>(z)\n o = Div(w, k) }", 12),
    ("other-div-const-to-mul", "float o) {" + c("k", 3.0) + " o = Div(z, k) }", 17),
    ("other-max-min-to-clip", "float o) {" + c("lo", -0.5) + c("hi", 0.5) + " a = Max(z, lo)\n o = Min(hi, a) }", 17),
    ("other-max-min-to-clip", "float o) {" + c("hi", 0.5) + " a = Relu(z)\n o = Min(a, hi) }", 17),
    ("other-min-max-to-clip", "float o) {" + c("lo", -0.5) + c("hi", 0.5) + " a = Min(z, hi)\n o = Max(a, lo) }", 17),
    ("other-max-zero-to-relu", "float o) {" + c("k", 0.0) + " o = Max(k, z) }", 17),
    ("other-leakyrelu-idiom", "float o) {" + c("k", 0.2) + " a = Mul(z, k)\n o = Max(z, a) }", 17),
    ("other-zero-minus-to-neg", "float o) {" + c("k", 0.0) + " o = Sub(k, z) }", 17),
    ("other-mul-minus-one-to-neg", "float o) {" + c("k", -1.0) + " o = Mul(k, z) }", 17),
    ("other-softmax-idiom", "float o) {" + A + MAX_SUB + " e = Exp(d)\n s = ReduceSum(e, a)\n o = Div(e, s) }", 17),
    ("other-softmax-idiom", "float o) { m = ReduceMax<axes = [0]>(z)\n d = Sub(z, m)\n e = Exp(d)\n"
     " a = Constant<value = int64[1] {0}>()\n s = ReduceSum(e, a)\n o = Div(e, s) }", 13),
    ("other-softmax-unstable-idiom", "float o) {" + A + " e = Exp(z)\n s = ReduceSum(e, a)\n o = Div(e, s) }", 17),
    ("other-logsoftmax-idiom", "float o) {" + A + " e = Exp(z)\n s = ReduceSum(e, a)\n l = Log(s)\n o = Sub(z, l) }",
     17),
    ("other-logsoftmax-idiom", "float o) {" + A + MAX_SUB + " e = Exp(d)\n s = ReduceSum(e, a)\n l = Log(s)\n"
     " o = Sub(d, l) }", 17),
    ("other-logsoftmax-idiom", "float o) {" + MAX_SUB + " l = ReduceLogSumExp<axes = [-1]>(d)\n o = Sub(d, l) }", 17),
    ("other-sigmoid-idiom", "float o) {" + c("one", 1.0) + " n = Neg(z)\n e = Exp(n)\n p = Add(one, e)\n"
     " o = Div(one, p) }", 17),
    ("other-sigmoid-idiom", "float o) {" + c("one", 1.0) + " n = Neg(z)\n e = Exp(n)\n p = Add(e, one)\n"
     " o = Reciprocal(p) }", 17),
    ("other-softplus-idiom", "float o) {" + c("one", 1.0) + " e = Exp(z)\n p = Add(e, one)\n o = Log(p) }", 17),
    ("other-tanh-idiom", "float o) {" + c("one", 1.0) + c("two", 2.0) + " t = Mul(z, two)\n e = Exp(t)\n"
     " n = Sub(e, one)\n d = Add(e, one)\n o = Div(n, d) }", 17),
    ("other-tanh-idiom", "float o) {" + c("one", 1.0) + " t = Add(z, z)\n e = Exp(t)\n"
     " n = Sub(e, one)\n d = Add(one, e)\n o = Div(n, d) }", 17),
    ("other-hardsigmoid-idiom", "float o) {" + c("three", 3.0) + c("zero", 0.0) + c("six", 6.0) +
     " p = Add(z, three)\n r = Clip(p, zero, six)\n o = Div(r, six) }", 17),
    ("other-hardsigmoid-idiom", "float o) {" + c("three", 3.0) + c("zero", 0.0) + c("six", 6.0) +
     c("k", 1 / 6) + " p = Add(three, z)\n r = Clip(p, zero, six)\n o = Mul(k, r) }", 17),
    ("other-hardswish-idiom", "float o) {" + c("three", 3.0) + c("zero", 0.0) + c("six", 6.0) +
     " p = Add(z, three)\n r = Clip(p, zero, six)\n q = Mul(z, r)\n o = Div(q, six) }", 17),
    ("other-hardsigmoid-to-hardswish", "float o) { h = HardSigmoid<alpha = 0.16666667, beta = 0.5>(z)\n"
     " o = Mul(h, z) }", 17),
]


@pytest.mark.parametrize(("name", "body", "opset"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize(("x", "y"), SHAPES, ids=["same", "bcast", "rank1"])
def test_rule_fires_and_keeps_numbers(name: str, body: str, opset: int, x: str, y: str) -> None:
    check_rule(build(body, x, y, opset), name)


REFUSALS = [
    ("other-pow-square", "dtype not float", "int32 o) { k = Constant<value = int32 {2}>()\n o = Pow(z, k) }",
     "int32[{x}] x, int32[{y}] y"),
    ("other-pow-reciprocal", "the constant broadcasts x (or shapes unknown)",
     "float o) { k = Constant<value = float[1,1,1] {-1.0}>()\n o = Pow(z, k) }"),
    ("other-pow-zero", "shape unknown", "float o) {" + c("k", 0.0) + " o = Pow(z, k) }", "float[N] x, float[N] y"),
    ("other-div-const-to-mul", "divisor has zeros or non-finite values",
     "float o) { k = Constant<value = float[3] {1.0, 0.0, 3.0}>()\n o = Div(z, k) }"),
    ("other-div-const-to-mul", "reciprocal overflows", "float o) {" + c("k", 1e-40) + " o = Div(z, k) }"),
    ("other-leakyrelu-idiom", "dtype not float32", "double o) { k = Constant<value = double {0.5}>()\n"
     " a = Mul(z, k)\n o = Max(z, a) }", "double[{x}] x, double[{y}] y"),
    ("other-max-min-to-clip", "lower bound above upper bound",
     "float o) {" + c("lo", 1.0) + c("hi", 0.5) + " a = Max(z, lo)\n o = Min(a, hi) }"),
    ("other-max-min-to-clip", "the inner Min/Max has other uses",
     "float o, float p) {" + c("lo", -1.0) + c("hi", 0.5) + " a = Max(z, lo)\n o = Min(a, hi)\n p = Neg(a) }"),
    ("other-min-max-to-clip", "the constant broadcasts x (or shapes unknown)",
     "float o) {" + c("lo", -0.5, "1,1,1") + c("hi", 0.5) + " a = Min(z, hi)\n o = Max(a, lo) }"),
    ("other-max-zero-to-relu", "dtype not float", "int32 o) { k = Constant<value = int32 {0}>()\n o = Max(z, k) }",
     "int32[{x}] x, int32[{y}] y"),
    ("other-leakyrelu-idiom", "slope not in (0, 1)", "float o) {" + c("k", 1.5) + " a = Mul(z, k)\n o = Max(z, a) }"),
    ("other-leakyrelu-idiom", "the Mul has other uses",
     "float o, float p) {" + c("k", 0.5) + " a = Mul(z, k)\n o = Max(z, a)\n p = Neg(a) }"),
    ("other-zero-minus-to-neg", "the constant broadcasts x (or shapes unknown)",
     "float o) {" + c("k", 0.0, "1,1,1") + " o = Sub(k, z) }"),
    ("other-softmax-idiom", "an intermediate has other uses", "float o, float p) {" + A + MAX_SUB +
     " e = Exp(d)\n s = ReduceSum(e, a)\n o = Div(e, s)\n p = Neg(e) }"),
    ("other-softmax-unstable-idiom", "an intermediate has other uses", "float o, float p) {" + A +
     " e = Exp(z)\n s = ReduceSum(e, a)\n o = Div(e, s)\n p = Neg(s) }"),
    ("other-logsoftmax-idiom", "an intermediate has other uses", "float o, float p) {" + MAX_SUB +
     " l = ReduceLogSumExp<axes = [-1]>(d)\n o = Sub(d, l)\n p = Neg(d) }"),
    ("other-sigmoid-idiom", "an intermediate has other uses", "float o, float q) {" + c("one", 1.0) +
     " n = Neg(z)\n e = Exp(n)\n p = Add(one, e)\n o = Div(one, p)\n q = Neg(e) }"),
    ("other-softplus-idiom", "an intermediate has other uses", "float o, float q) {" + c("one", 1.0) +
     " e = Exp(z)\n p = Add(e, one)\n o = Log(p)\n q = Neg(p) }"),
    ("other-tanh-idiom", "an intermediate has other uses", "float o, float q) {" + c("one", 1.0) +
     " t = Add(z, z)\n e = Exp(t)\n n = Sub(e, one)\n d = Add(one, e)\n o = Div(n, d)\n q = Neg(e) }"),
    ("other-hardsigmoid-idiom", "an intermediate has other uses", "float o, float q) {" + c("three", 3.0) +
     c("zero", 0.0) + c("six", 6.0) + " p = Add(z, three)\n r = Clip(p, zero, six)\n o = Div(r, six)\n"
     " q = Neg(p) }"),
    ("other-hardswish-idiom", "an intermediate has other uses", "float o, float q) {" + c("three", 3.0) +
     c("zero", 0.0) + c("six", 6.0) + " p = Add(z, three)\n r = Clip(p, zero, six)\n qq = Mul(z, r)\n"
     " o = Div(qq, six)\n q = Neg(r) }"),
    ("other-hardsigmoid-to-hardswish", "an intermediate has other uses",
     "float o, float q) { h = HardSigmoid<alpha = 0.16666667, beta = 0.5>(z)\n o = Mul(h, z)\n q = Neg(h) }"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSALS)])
def test_guard_refuses(case: tuple) -> None:
    name, reason, body, *sig = case
    check_rule_refuses(build(body, sig=sig[0] if sig else SIG), RULES, name, reason)

@pytest.mark.parametrize(("name", "body", "opset"), [
    ("other-softmax-idiom", "float o) {" + MAX_SUB + " e = Exp(d)\n s = ReduceSum<axes = [-1]>(e)\n o = Div(e, s) }",
     12),
    ("other-hardswish-idiom", "float o) {" + c("three", 3.0) + c("zero", 0.0) + c("six", 6.0) +
     " p = Add(z, three)\n r = Clip(p, zero, six)\n q = Mul(z, r)\n o = Div(q, six) }", 13),
    ("other-div-pow2-to-mul", "float o) {" + c("k", 3.0) + " o = Div(z, k) }", 17),
    ("other-div-const-to-mul", "float o) {" + c("k", 0.25) + " o = Div(z, k) }", 17),
    ("other-softmax-idiom", "float o) { m = ReduceMax<axes = [0]>(z)\n d = Sub(z, m)\n e = Exp(d)\n"
     " a = Constant<value = int64[1] {-1}>()\n s = ReduceSum(e, a)\n o = Div(e, s) }", 17),  # different axes
])
def test_no_match(name: str, body: str, opset: int) -> None:
    """Below the op's opset, a non-power-of-two (or a power of two for the inexact rule), mismatched axes."""
    stats = RewriteStats()
    apply_rules(build(body, opset=opset), RULES, stats=stats, choose_best=True)
    assert stats.fired[name] == 0


def test_div_pow2_is_bit_identical() -> None:
    model = build("float o) {" + c("k", 0.125) + " o = Div(z, k) }", "1000", "1")
    proto = ir.serde.serialize_model(model)
    feeds = random_inputs(proto, seed=4)
    feeds["x"] = (feeds["x"] * np.float32(1e-38)).astype(np.float32)  # denormal results too
    ref = run_ort(proto, feeds)["o"]
    assert apply_rules(model, RULES, choose_best=True)
    np.testing.assert_array_equal(run_ort(ir.serde.serialize_model(model), feeds)["o"], ref)


@settings(max_examples=15, deadline=None)
@given(lo=st.floats(-4, 4, width=32), width=st.floats(0, 4, width=32), order=st.booleans(),
       dims=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_min_max_to_clip_property(lo: float, width: float, order: bool, dims: list[int]) -> None:
    hi = float(np.float32(lo + width))
    inner, outer = ("Max(z, lo)", "Min(a, hi)") if order else ("Min(z, hi)", "Max(a, lo)")
    shape = ",".join(map(str, dims))
    body = "float o) {" + c("lo", lo) + c("hi", hi) + f" a = {inner}\n o = {outer} }}"
    check_rule(build(body, shape, shape), "other-max-min-to-clip" if order else "other-min-max-to-clip")


def test_every_rule_is_tested() -> None:
    assert {c[0] for c in CASES} == set(BY_NAME)
    assert all(r.family == "other" and r.name.startswith("other-") and r.doc for r in RULES)
    assert len(BY_NAME) == len(RULES)
