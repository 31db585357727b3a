"""Associative algebra rules: each fires on a small graph, keeps the outputs (onnxruntime, several shapes
with broadcasting), leaves a valid model, is idempotent, and refuses with a reason when a guard fails."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcc.check import diff, random_inputs, run_ort
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.algebra.associative import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires

BY_NAME = {r.name: r for r in RULES}

C1 = "c1 = Constant <value = float[3] {1.5, -2.0, 0.5}> ()"
C2 = "c2 = Constant <value = float[1] {2.5}> ()"
C2V = "c2 = Constant <value = float[3] {0.5, 3.0, -1.25}> ()"


def build(body: str, inputs: str, opset: int = 17) -> ir.Model:
    out_type = inputs.split("[")[0].strip()  # the output has the first input's element type
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({inputs}) => ({out_type} y) {{\n{body}\n}}'
    model = ir.from_onnx_text(text)
    for o in model.graph.outputs:
        o.shape = None
    return infer_shapes(model)


def serialize(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def run_case(rule: str, body: str, inputs: str, opset: int = 17, positive: bool = False) -> None:
    check_rule_fires(build(body, inputs, opset), RULES, rule, seeds=(1,),
                     transform=(lambda v: np.abs(v) + np.float32(0.1)) if positive else None)

SHAPES_3 = ["2,3", "4,1", "3"]

CHAIN = {
    "assoc-mul-mul-const": "t = Mul(x, c1)\ny = Mul(c2, t)",
    "assoc-add-add-const": "t = Add(c1, x)\ny = Add(t, c2)",
    "assoc-sub-sub-const": "t = Sub(x, c1)\ny = Sub(t, c2)",
    "assoc-add-sub-const": "t = Add(x, c1)\ny = Sub(t, c2)",
    "assoc-sub-add-const": "t = Sub(x, c1)\ny = Add(c2, t)",
    "assoc-rsub-add-const": "t = Sub(c1, x)\ny = Add(t, c2)",
    "assoc-rsub-sub-const": "t = Sub(c1, x)\ny = Sub(t, c2)",
    "assoc-const-sub-add": "t = Add(x, c1)\ny = Sub(c2, t)",
    "assoc-const-sub-sub": "t = Sub(x, c1)\ny = Sub(c2, t)",
    "assoc-const-sub-rsub": "t = Sub(c1, x)\ny = Sub(c2, t)",
    "assoc-div-div-const": "t = Div(x, c1)\ny = Div(t, c2)",
    "assoc-mul-div-const": "t = Mul(c1, x)\ny = Div(t, c2)",
    "assoc-div-mul-const": "t = Div(x, c1)\ny = Mul(t, c2)",
    "assoc-rdiv-mul-const": "t = Div(c1, x)\ny = Mul(c2, t)",
    "assoc-rdiv-div-const": "t = Div(c1, x)\ny = Div(t, c2)",
    "assoc-const-div-mul": "t = Mul(x, c1)\ny = Div(c2, t)",
    "assoc-const-div-div": "t = Div(x, c1)\ny = Div(c2, t)",
    "assoc-const-div-rdiv": "t = Div(c1, x)\ny = Div(c2, t)",
    "assoc-max-max-const": "t = Max(x, c1)\ny = Max(c2, t)",
    "assoc-min-min-const": "t = Min(c1, x)\ny = Min(t, c2)",
    "assoc-neg-mul-const": "t = Neg(x)\ny = Mul(c1, t)",
    "assoc-neg-div-const": "t = Neg(x)\ny = Div(t, c1)",
    "assoc-const-div-neg": "t = Neg(x)\ny = Div(c1, t)",
    "assoc-neg-of-mul-const": "t = Mul(c1, x)\ny = Neg(t)",
    "assoc-neg-of-div-const": "t = Div(x, c1)\ny = Neg(t)",
    "assoc-neg-of-const-div": "t = Div(c1, x)\ny = Neg(t)",
    "assoc-pow-pow": "e1 = Constant <value = float[1] {2.0}> ()\ne2 = Constant <value = float {-3.0}> ()\n"
                     "t = Pow(x, e1)\ny = Pow(t, e2)",
    "assoc-sum-merge-consts": "y = Sum(c1, x, c2)",
    "assoc-max-merge-consts": "y = Max(c1, x, c2)",
    "assoc-min-merge-consts": "y = Min(c1, x, c2)",
}

PAIR = {  # two inputs x, y0
    "assoc-neg-neg-mul": "a = Neg(x)\nb = Neg(z)\ny = Mul(a, b)",
    "assoc-neg-neg-div": "a = Neg(x)\nb = Neg(z)\ny = Div(a, b)",
    "assoc-exp-mul": "a = Exp(x)\nb = Exp(z)\ny = Mul(a, b)",
    "assoc-exp-div": "a = Exp(x)\nb = Exp(z)\ny = Div(a, b)",
    "assoc-log-add": "p = Abs(x)\nq = Exp(z)\na = Log(p)\nb = Log(q)\ny = Add(a, b)",
    "assoc-log-sub": "p = Relu(x)\nq = Sigmoid(z)\na = Log(p)\nb = Log(q)\ny = Sub(a, b)",
    "assoc-sqrt-mul": "p = Abs(x)\nq = Exp(z)\na = Sqrt(p)\nb = Sqrt(q)\ny = Mul(a, b)",
    "assoc-sqrt-div": "p = Abs(x)\nq = Exp(z)\na = Sqrt(p)\nb = Sqrt(q)\ny = Div(a, b)",
    "assoc-abs-mul": "a = Abs(x)\nb = Abs(z)\ny = Mul(a, b)",
    "assoc-abs-div": "a = Abs(x)\nb = Abs(z)\ny = Div(a, b)",
    "assoc-reciprocal-mul": "a = Reciprocal(x)\nb = Reciprocal(z)\ny = Mul(a, b)",
    "assoc-pow-mul": "e1 = Constant <value = float {2.0}> ()\ne2 = Constant <value = float[1] {3.0}> ()\n"
                     "a = Pow(x, e1)\nb = Pow(x, e2)\nt = Mul(a, b)\ny = Add(t, z)",
    "assoc-sum-flatten": "a = Add(x, z)\nb = Sum(z, x)\ny = Sum(a, b, x)",
    "assoc-max-flatten": "a = Max(x, z)\ny = Max(z, a)",
    "assoc-min-flatten": "a = Min(x, z)\ny = Min(a, x, z)",
}
PAIR_SHAPES = [("2,3", "2,3"), ("4,3", "3"), ("2,3", "2,1,3")]


@pytest.mark.parametrize("shape", SHAPES_3)
@pytest.mark.parametrize("rule", sorted(CHAIN))
def test_chain_rules(rule: str, shape: str) -> None:
    consts = C1 + "\n" + (C2V if rule == "assoc-sum-merge-consts" else C2)
    run_case(rule, consts + "\n" + CHAIN[rule], f"float[{shape}] x")


@pytest.mark.parametrize("shapes", PAIR_SHAPES)
@pytest.mark.parametrize("rule", sorted(PAIR))
def test_pair_rules(rule: str, shapes: tuple[str, str]) -> None:
    xs, zs = shapes
    positive = rule in ("assoc-reciprocal-mul", "assoc-neg-neg-div", "assoc-abs-div", "assoc-pow-mul")
    run_case(rule, PAIR[rule], f"float[{xs}] x, float[{zs}] z", positive=positive)


OTHER = [
    ("assoc-concat-flatten", "a = Concat <axis = 1> (x, z)\ny = Concat <axis = -1> (z, a, x)",
     "float[2,3] x, float[2,4] z"),
    ("assoc-concat-flatten", "a = Concat <axis = 0> (x, x)\ny = Concat <axis = 0> (a, x)",
     "float[3] x, float[3] z"),
    ("assoc-concat-merge-consts", "k1 = Constant <value = float[2,1] {1.0, 2.0}> ()\n"
     "k2 = Constant <value = float[2,2] {3.0, 4.0, 5.0, 6.0}> ()\ny = Concat <axis = 1> (x, k1, k2, z)",
     "float[2,3] x, float[2,4] z"),
    ("assoc-matmul-matmul-const", "w1 = Constant <value = float[8,8] {" + ",".join(["0.1"] * 64) + "}> ()\n"
     "w2 = Constant <value = float[8,2] {" + ",".join(str(i / 7) for i in range(16)) + "}> ()\n"
     "t = MatMul(x, w1)\ny = MatMul(t, w2)", "float[3,5,8] x"),
    ("assoc-matmul-matmul-const", "w1 = Constant <value = float[8,8] {" + ",".join(["0.1"] * 64) + "}> ()\n"
     "w2 = Constant <value = float[8,2] {" + ",".join(str(i / 7) for i in range(16)) + "}> ()\n"
     "t = MatMul(x, w1)\ny = MatMul(t, w2)", "float[8] x"),
    ("assoc-gemm-gemm-const", "w1 = Constant <value = float[6,8] {" + ",".join(str(i % 5 - 2) for i in range(48))
     + "}> ()\nb1 = Constant <value = float[6] {1,2,3,4,5,6}> ()\n"
     "w2 = Constant <value = float[6,2] {" + ",".join(str(i / 7) for i in range(12)) + "}> ()\n"
     "b2 = Constant <value = float[1,2] {0.5, -0.5}> ()\n"
     "t = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (x, w1, b1)\ny = Gemm <beta = 0.25> (t, w2, b2)",
     "float[4,8] x"),
    ("assoc-gemm-matmul-const", "w1 = Constant <value = float[8,6] {" + ",".join(str(i % 5 - 2) for i in range(48))
     + "}> ()\nw2 = Constant <value = float[2,6] {" + ",".join(str(i / 7) for i in range(12)) + "}> ()\n"
     "b2 = Constant <value = float[2] {0.5, -0.5}> ()\n"
     "t = MatMul(x, w1)\ny = Gemm <transB = 1> (t, w2, b2)", "float[4,8] x"),
    ("assoc-matmul-gemm-const", "w1 = Constant <value = float[8,6] {" + ",".join(str(i % 5 - 2) for i in range(48))
     + "}> ()\nb1 = Constant <value = float[4,1] {1,2,3,4}> ()\n"
     "w2 = Constant <value = float[6,2] {" + ",".join(str(i / 7) for i in range(12)) + "}> ()\n"
     "t = Gemm(x, w1, b1)\ny = MatMul(t, w2)", "float[4,8] x"),
    ("assoc-matmul-const-left", "w1 = Constant <value = float[2,6] {" + ",".join(str(i % 5 - 2) for i in range(12))
     + "}> ()\nw2 = Constant <value = float[6,8] {" + ",".join(str(i / 9) for i in range(48)) + "}> ()\n"
     "t = MatMul(w2, x)\ny = MatMul(w1, t)", "float[3,8,5] x"),
    ("assoc-transpose-matmul", "a = Transpose <perm = [1, 0]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
     "y = MatMul(a, b)", "float[16,3] x, float[2,16] z"),
    ("assoc-transpose-matmul", "a = Transpose <perm = [0, 2, 1]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
     "y = MatMul(a, b)", "float[2,16,3] x, float[2,16] z"),
    ("assoc-linear-prescale", "s = Constant <value = float {0.5}> ()\nw = Constant <value = float[3,2] "
     "{1,2,3,4,5,6}> ()\nt = Mul(s, x)\ny = MatMul(t, w)", "float[4,3] x"),
    ("assoc-linear-prescale", "s = Constant <value = float[1] {-1.5}> ()\nt = Mul(z, s)\n"
     "y = Gemm <transB = 1, alpha = 2.0> (x, t)", "float[4,3] x, float[5,3] z"),
    ("assoc-linear-prescale", "s = Constant <value = float[1] {-1.5}> ()\nw = Constant <value = float[2,3,1,1] "
     "{1,2,3,4,5,6}> ()\nbias = Constant <value = float[2] {1, -1}> ()\nt = Mul(x, s)\n"
     "y = Conv <pads = [1, 1, 1, 1]> (t, w, bias)", "float[1,3,4,4] x"),
]


@pytest.mark.parametrize("case", OTHER, ids=[f"{c[0]}-{i}" for i, c in enumerate(OTHER)])
def test_other_rules(case: tuple[str, str, str]) -> None:
    run_case(*case)


NEGATIVE = [
    ("assoc-mul-mul-const", "c1 = Constant <value = int64[1] {2}> ()\nt = Mul(x, c1)\ny = Mul(t, c1)",
     "int64[3] x", "dtype not float"),
    ("assoc-mul-div-const", f"{C1}\nc2 = Constant <value = float[1] {{0.0}}> ()\nt = Mul(x, c1)\ny = Div(t, c2)",
     "float[3] x", "folded constant is not finite"),
    ("assoc-max-max-const", f"{C1}\n{C2}\nt = Max(x, c1)\ny = Max(t, c2)", "float[N,3] x", "shapes unknown"),
    ("assoc-neg-mul-const", f"{C1}\nt = Neg(x)\ny = Mul(t, c1)", "float[N] x", "shapes unknown"),
    ("assoc-neg-of-mul-const", f"{C1}\nt = Mul(x, c1)\ny = Neg(t)", "float[N] x", "shapes unknown"),
    ("assoc-neg-neg-mul", "a = Neg(x)\nb = Neg(z)\ny = Mul(a, b)", "int32[3] x, int32[3] z", "dtype not float"),
    ("assoc-exp-mul", "a = Exp(x)\nb = Exp(z)\ny = Mul(a, b)", "float[4,1] x, float[1,5] z",
     "the unary op would run on a larger tensor"),
    ("assoc-exp-div", "a = Exp(x)\nb = Exp(z)\ny = Div(a, b)", "float[N] x, float[N] z", "shapes unknown"),
    ("assoc-log-sub", "p = Relu(x)\na = Log(p)\nb = Log(z)\ny = Sub(a, b)", "float[3] x, float[3] z",
     "operands not known to be >= 0"),
    ("assoc-sqrt-div", "p = Abs(x)\nq = Abs(z)\na = Sqrt(p)\nb = Sqrt(q)\ny = Div(a, b)",
     "float[4,1] x, float[1,5] z", "the unary op would run on a larger tensor"),
    ("assoc-abs-mul", "a = Abs(x)\nb = Abs(z)\ny = Mul(a, b)", "int32[3] x, int32[3] z", "dtype not float"),
    ("assoc-abs-div", "a = Abs(x)\nb = Abs(z)\ny = Div(a, b)", "float[4,1] x, float[1,5] z",
     "the unary op would run on a larger tensor"),
    ("assoc-reciprocal-mul", "a = Reciprocal(x)\nb = Reciprocal(z)\ny = Mul(a, b)", "float[4,1] x, float[1,5] z",
     "the unary op would run on a larger tensor"),
    ("assoc-neg-neg-div", "a = Neg(x)\nb = Neg(z)\ny = Div(a, b)", "int32[3] x, int32[3] z", "dtype not float"),
    ("assoc-max-flatten", "a = Max(x, z)\nb = Relu(a)\nc = Max(a, x)\ny = Add(b, c)", "float[3] x, float[3] z",
     "an intermediate has other uses"),
    ("assoc-min-flatten", "a = Min(x, z)\nb = Relu(a)\nc = Min(a, x)\ny = Add(b, c)", "float[3] x, float[3] z",
     "an intermediate has other uses"),
    ("assoc-gemm-gemm-const", "w1 = Constant <value = float[16,1] {" + ",".join(["0.1"] * 16) + "}> ()\n"
     "w2 = Constant <value = float[1,16] {" + ",".join(["0.2"] * 16) + "}> ()\nt = Gemm(x, w1)\n"
     "y = Gemm(t, w2)", "float[4,16] x", "the folded weight does not save work"),
    ("assoc-gemm-matmul-const", "w1 = Constant <value = float[16,1] {" + ",".join(["0.1"] * 16) + "}> ()\n"
     "w2 = Constant <value = float[1,16] {" + ",".join(["0.2"] * 16) + "}> ()\nt = MatMul(x, w1)\n"
     "y = Gemm(t, w2)", "float[4,16] x", "the folded weight does not save work"),
    ("assoc-matmul-gemm-const", "w1 = Constant <value = float[16,1] {" + ",".join(["0.1"] * 16) + "}> ()\n"
     "w2 = Constant <value = float[1,16] {" + ",".join(["0.2"] * 16) + "}> ()\nt = Gemm(x, w1)\n"
     "y = MatMul(t, w2)", "float[4,16] x", "the folded weight does not save work"),
    ("assoc-log-add", "a = Log(x)\nb = Log(z)\ny = Add(a, b)", "float[3] x, float[3] z",
     "operands not known to be >= 0"),
    ("assoc-sqrt-mul", "p = Abs(x)\na = Sqrt(p)\nb = Sqrt(z)\ny = Mul(a, b)", "float[3] x, float[3] z",
     "operands not known to be >= 0"),
    ("assoc-pow-pow", "e1 = Constant <value = float {0.5}> ()\nt = Pow(x, e1)\ny = Pow(t, e1)", "float[3] x",
     "exponents not integer scalar constants"),
    ("assoc-pow-mul", "e1 = Constant <value = float {2.0}> ()\ne2 = Constant <value = float {-1.0}> ()\n"
     "a = Pow(x, e1)\nb = Pow(x, e2)\ny = Mul(a, b)", "float[3] x", "exponents of different signs (x = 0 would "
     "give inf*0)"),
    ("assoc-sum-merge-consts", f"{C1}\n{C2}\ny = Sum(c1, x, c2)", "float[N] x", "shapes unknown"),
    ("assoc-sum-flatten", "a = Add(x, z)\ny = Sum(a, z)", "int64[3] x, int64[3] z", "dtype not float"),
    ("assoc-concat-flatten", "a = Concat <axis = 0> (x, z)\ny = Concat <axis = 1> (a, x)",
     "float[2,2] x, float[2,2] z", "inner Concat has another axis"),
    ("assoc-min-min-const", f"{C1}\n{C2}\nt = Min(x, c1)\ny = Min(t, c2)", "float[N,3] x", "shapes unknown"),
    ("assoc-max-merge-consts", f"{C1}\n{C2}\ny = Max(c1, x, c2)", "float[N] x", "shapes unknown"),
    ("assoc-min-merge-consts", f"{C1}\n{C2}\ny = Min(c1, x, c2)", "float[N] x", "shapes unknown"),
    ("assoc-matmul-matmul-const", "w1 = Constant <value = float[16,1] {" + ",".join(["0.1"] * 16) + "}> ()\n"
     "w2 = Constant <value = float[1,16] {" + ",".join(["0.2"] * 16) + "}> ()\nt = MatMul(x, w1)\n"
     "y = MatMul(t, w2)", "float[4,16] x", "the folded weight does not save work"),
    ("assoc-matmul-const-left", "w1 = Constant <value = float[8,2] {" + ",".join(["0.1"] * 16) + "}> ()\n"
     "w2 = Constant <value = float[2,8] {" + ",".join(["0.2"] * 16) + "}> ()\nt = MatMul(w2, x)\n"
     "y = MatMul(w1, t)", "float[8,4] x", "the folded weight does not save work"),
    ("assoc-transpose-matmul", "a = Transpose <perm = [1, 0]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
     "y = MatMul(a, b)", "float[1,8] x, float[8,1] z", "the product is larger than the operands"),
    ("assoc-transpose-matmul", "a = Transpose <perm = [1, 0, 2]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
     "y = MatMul(a, b)", "float[4,4,4] x, float[4,4] z", "perm does not swap the last two axes"),
    ("assoc-linear-prescale", "s = Constant <value = float {0.5}> ()\nt = Mul(s, x)\ny = MatMul(t, z)",
     "float[4,3] x, float[3,2] z", "the other operand is not constant"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=[f"{c[0]}-{i}" for i, c in enumerate(NEGATIVE)])
def test_guards_refuse(case: tuple[str, str, str, str | None]) -> None:
    rule, body, inputs, reason = case
    model = build(body, inputs)
    stats = RewriteStats()
    apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.fired[rule] == 0
    if reason is not None:
        assert stats.refused[(rule, reason)] >= 1, stats.refused


def test_concat_merge_consts_symbolic_still_fires() -> None:
    """Merging constants of a Concat needs the rank only, not static dims."""
    model = build(f"{C1}\n{C2}\ny = Concat <axis = 0> (x, c1, c2)", "float[N] x")
    stats = RewriteStats()
    assert apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.fired["assoc-concat-merge-consts"] == 1


def test_concat_merge_consts_refuses_unknown_rank() -> None:
    model = build(f"{C1}\n{C2}\ny = Concat <axis = 0> (x, c1, c2)", "float[N] x")
    model.graph.outputs[0].shape = None
    stats = RewriteStats()
    assert not apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.refused[("assoc-concat-merge-consts", "rank unknown")] == 1


INT_REFUSED = sorted(r for r in CHAIN if not r.startswith(("assoc-max", "assoc-min", "assoc-pow")))


def test_every_rule_is_tested() -> None:
    tested = set(CHAIN) | set(PAIR) | {c[0] for c in OTHER}
    assert tested == set(BY_NAME), set(BY_NAME) - tested
    refused = {c[0] for c in NEGATIVE} | set(INT_REFUSED) | {"assoc-concat-merge-consts"}
    assert refused == set(BY_NAME), set(BY_NAME) - refused


@pytest.mark.parametrize("rule", INT_REFUSED)
def test_chain_rules_refuse_integers(rule: str) -> None:
    body = ("c1 = Constant <value = int64[1] {2}> ()\nc2 = Constant <value = int64[1] {3}> ()\n"
            + CHAIN[rule])
    model = build(body, "int64[3] x")
    stats = RewriteStats()
    apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.fired[rule] == 0
    assert stats.refused[(rule, "dtype not float")] >= 1


@st.composite
def chains(draw) -> tuple[str, str]:
    """A random chain of 2-5 binary ops by constants (either side), on a random broadcastable shape."""
    shape = draw(st.sampled_from(["2,3", "4,1", "3", "2,1,3"]))
    lines, prev = [], "x"
    for i in range(draw(st.integers(2, 5))):
        op = draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min", "Neg"]))
        name = f"t{i}"
        if op == "Neg":
            lines.append(f"{name} = Neg({prev})")
        else:
            cshape = draw(st.sampled_from([[1], [3], []]))
            vals = [draw(st.sampled_from([0.5, -1.5, 2.0, 3.0, -0.25])) for _ in range(math.prod(cshape))]
            ty = f"float[{','.join(map(str, cshape))}]" if cshape else "float"
            lines.append(f"k{i} = Constant <value = {ty} {{{', '.join(map(str, vals))}}}> ()")
            left = draw(st.booleans()) and op not in ("Div",)
            lines.append(f"{name} = {op}({f'k{i}, {prev}' if left else f'{prev}, k{i}'})")
        prev = name
    lines.append(f"y = Identity({prev})")
    return "\n".join(lines), f"float[{shape}] x"


@settings(max_examples=30, deadline=None)
@given(chains())
def test_random_constant_chains_keep_outputs(case: tuple[str, str]) -> None:
    body, inputs = case
    model = build(body, inputs)
    proto = serialize(model)
    feeds = random_inputs(proto, seed=2)
    ref = run_ort(proto, feeds)
    apply_rules(model, RULES, stats=RewriteStats(), choose_best=True)
    out = serialize(model)
    onnx.checker.check_model(out, full_check=True)
    got = run_ort(out, feeds)
    for k in ref:
        d = diff(k, ref[k], got[k], rtol=1e-4, atol=1e-6)
        assert d.ok, d
    assert not apply_rules(model, RULES, stats=RewriteStats(), choose_best=True)
