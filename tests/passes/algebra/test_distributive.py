"""Distributive algebra rules: each fires on a small graph, keeps the outputs (onnxruntime, several shapes
with broadcasting), leaves a valid model, is idempotent, and refuses with a reason when a guard fails."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.algebra.distributive import RULES
from dlcc.passes.rewrite import RewriteStats, apply_rules
from dlcc.testing.rewrites import check_rule_fires

BY_NAME = {r.name: r for r in RULES}


def const(name: str, shape: tuple[int, ...], seed: int, dtype: str = "float") -> str:
    """A Constant node with seeded random values (never all equal: layout bugs would hide)."""
    vals = np.random.default_rng(seed).standard_normal(int(np.prod(shape))).round(3) + 0.01
    dims = ",".join(map(str, shape))
    return f"{name} = Constant <value = {dtype}[{dims}] {{{', '.join(map(str, vals))}}}> ()"


C1 = "c1 = Constant <value = float[3] {1.5, -2.0, 0.5}> ()"
C2 = "c2 = Constant <value = float[1] {2.5}> ()"
C3 = "c3 = Constant <value = float[3] {0.25, 3.0, -1.0}> ()"
S = "s = Constant <value = float {0.75}> ()"


def build(body: str, inputs: str, opset: int = 17) -> ir.Model:
    out_type = inputs.split("[")[0].strip()  # the output has the first input's element type
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\ng ({inputs}) => ({out_type} y) {{\n{body}\n}}'
    model = ir.from_onnx_text(text)
    for o in model.graph.outputs:
        o.shape = None
    return infer_shapes(model)


def run_case(rule: str, body: str, inputs: str, opset: int = 17, positive: bool = False) -> None:
    check_rule_fires(build(body, inputs, opset), RULES, rule, seeds=(3,),
                     transform=(lambda v: np.abs(v) + np.float32(0.5)) if positive else None)

XZW = ["float[2,3] x, float[2,3] z, float[2,3] w", "float[4,3] x, float[3] z, float[1,3] w",
       "float[4,1] x, float[4,3] z, float[4,3] w"]
X3 = ["float[2,3] x", "float[4,1] x", "float[3] x"]
XZ = ["float[2,3] x, float[2,3] z", "float[4,3] x, float[3] z", "float[3] x, float[2,3] z"]
SAME = ["float[2,3] x, float[2,3] z", "float[6,4] x, float[6,4] z"]
CONV_W = const("w1", (4, 3, 3, 3), 1) + "\n" + const("w2", (4, 3, 3, 3), 2) + "\n" + const("b1", (4,), 3)
CONV_X = ["float[1,3,5,5] x", "float[2,3,6,4] x"]
MM = const("a", (4, 5), 4) + "\n" + const("bw", (4, 5), 5)
GEMM = const("a", (5, 4), 6) + "\n" + const("bw", (5, 4), 7) + "\n" + const("g1", (5,), 8) + "\n" + const(
    "g2", (1, 5), 9)
SH = "sh = Constant <value = int64[2] {3, -1}> ()"

POSITIVE: list[tuple[str, str, list[str], int, bool]] = [
    ("dist-mul-add-common", "a = Mul(x, z)\nb = Mul(w, x)\ny = Add(a, b)", XZW, 17, False),
    ("dist-mul-add-common", f"{C1}\n{C2}\na = Mul(x, c1)\nb = Mul(c2, x)\ny = Add(b, a)", X3, 17, False),
    ("dist-mul-sub-common", "a = Mul(z, x)\nb = Mul(x, w)\ny = Sub(a, b)", XZW, 17, False),
    ("dist-div-add-common", "a = Div(z, x)\nb = Div(w, x)\ny = Add(a, b)", XZW, 17, True),
    ("dist-div-sub-common", "a = Div(z, x)\nb = Div(w, x)\ny = Sub(a, b)", XZW, 17, True),
    ("dist-add-mul-self", f"{C1}\na = Mul(c1, x)\ny = Add(x, a)", X3, 17, False),
    ("dist-sub-mul-self", f"{C1}\na = Mul(x, c1)\ny = Sub(a, x)", X3, 17, False),
    ("dist-sub-self-mul", f"{C1}\na = Mul(x, c1)\ny = Sub(x, a)", X3, 17, False),
    ("dist-conv-add", f"{CONV_W}\np = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)\nq = Conv <pads = [1, 1, 1, 1]> "
     "(x, w2)\ny = Add(p, q)", CONV_X, 17, False),
    ("dist-conv-sub", f"{CONV_W}\np = Conv <strides = [2, 2]> (x, w1)\nq = Conv <strides = [2, 2]> (x, w2)\n"
     "y = Sub(p, q)", CONV_X, 17, False),
    ("dist-conv-add-shared-weight", f"{CONV_W}\np = Conv(x, w1, b1)\nq = Conv(z, w1, b1)\ny = Add(p, q)",
     ["float[1,3,5,5] x, float[1,3,5,5] z", "float[2,3,4,6] x, float[2,3,4,6] z"], 17, False),
    ("dist-matmul-add-left", f"{MM}\np = MatMul(x, a)\nq = MatMul(x, bw)\ny = Add(p, q)",
     ["float[3,4] x", "float[2,3,4] x", "float[4] x"], 17, False),
    ("dist-matmul-add-left", "p = MatMul(x, z)\nq = MatMul(x, w)\ny = Add(q, p)",
     ["float[3,4] x, float[4,5] z, float[4,5] w", "float[2,3,4] x, float[1,4,5] z, float[1,4,5] w"], 17, False),
    ("dist-matmul-sub-left", f"{MM}\np = MatMul(x, a)\nq = MatMul(x, bw)\ny = Sub(p, q)",
     ["float[3,4] x", "float[2,3,4] x"], 17, False),
    ("dist-matmul-add-right", f"{MM}\np = MatMul(x, a)\nq = MatMul(z, a)\ny = Add(p, q)",
     ["float[3,4] x, float[3,4] z", "float[2,3,4] x, float[2,3,4] z"], 17, False),
    ("dist-matmul-sub-right", f"{MM}\np = MatMul(x, a)\nq = MatMul(z, a)\ny = Sub(p, q)",
     ["float[3,4] x, float[3,4] z", "float[2,3,4] x, float[2,3,4] z"], 17, False),
    ("dist-gemm-add", f"{GEMM}\np = Gemm <transB = 1, alpha = 0.5> (x, a, g1)\n"
     "q = Gemm <transB = 1, beta = 2.0> (x, bw, g2)\ny = Add(p, q)", ["float[3,4] x", "float[1,4] x"], 17, False),
    ("dist-gemm-add", f"{GEMM}\np = Gemm <transB = 1> (x, a)\nq = Gemm <transB = 1> (x, bw)\ny = Add(p, q)",
     ["float[3,4] x"], 17, False),
    ("dist-concat-matmul", f"{MM}\np = MatMul(x, a)\nq = MatMul(x, bw)\ny = Concat <axis = -1> (p, q)",
     ["float[3,4] x", "float[2,3,4] x"], 17, False),
    ("dist-concat-matmul", "p = MatMul(x, z)\nq = MatMul(x, w)\ny = Concat <axis = 1> (p, q)",
     ["float[6,4] x, float[4,5] z, float[4,2] w"], 17, False),
    ("dist-reducesum-mul-scalar", f"{S}\nax = Constant <value = int64[1] {{1}}> ()\nt = Mul(x, s)\n"
     "y = ReduceSum <keepdims = 0> (t, ax)", ["float[2,3] x", "float[4,5,2] x"], 13, False),
    ("dist-reducesum-mul-scalar", f"{S}\nt = Mul(s, x)\ny = ReduceSum <axes = [1]> (t)",
     ["float[2,3] x", "float[4,5,2] x"], 11, False),
    ("dist-reducemean-mul-scalar", f"{S}\nt = Mul(x, s)\ny = ReduceMean <axes = [-1]> (t)",
     ["float[2,3] x", "float[4,5,2] x"], 17, False),
    ("dist-reducemean-mul-scalar", f"{S}\nax = Constant <value = int64[1] {{0}}> ()\nt = Mul(x, s)\n"
     "y = ReduceMean(t, ax)", ["float[2,3] x"], 18, False),
    ("dist-reducesum-div-scalar", f"{S}\nt = Div(x, s)\ny = ReduceSum <keepdims = 1> (t)",
     ["float[2,3] x", "float[4,5,2] x"], 17, False),
    ("dist-reducemean-div-scalar", f"{S}\nt = Div(x, s)\ny = ReduceMean <axes = [0, 1]> (t)",
     ["float[2,3] x", "float[4,5,2] x"], 17, False),
    ("dist-reducesum-neg", "ax = Constant <value = int64[1] {1}> ()\nt = Neg(x)\ny = ReduceSum(t, ax)",
     ["float[2,3] x", "float[4,5,2] x"], 17, False),
    ("dist-reducemean-neg", "t = Neg(x)\ny = ReduceMean <axes = [1]> (t)", ["float[2,3] x"], 17, False),
    ("dist-reducemax-mul-pos", f"{S}\nt = Mul(x, s)\ny = ReduceMax <axes = [1]> (t)",
     ["float[2,3] x", "float[4,5,2] x"], 17, False),
    ("dist-reducemax-mul-pos", f"{S}\nax = Constant <value = int64[1] {{1}}> ()\nt = Mul(x, s)\n"
     "y = ReduceMax(t, ax)", ["float[2,3] x"], 18, False),
    ("dist-reducemin-mul-pos", f"{S}\nt = Mul(s, x)\ny = ReduceMin <axes = [0]> (t)",
     ["float[2,3] x", "float[4,5,2] x"], 17, False),
    ("dist-neg-add-const", f"{C1}\nt = Add(c1, x)\ny = Neg(t)", X3, 17, False),
    ("dist-neg-sub", "t = Sub(x, z)\ny = Neg(t)", XZ, 17, False),
    ("dist-relu-mul-pos", f"{C1}\n{S}\nt = Mul(x, c1)\nr = Relu(t)\ny = Mul(s, r)", X3, 17, False),
    ("dist-relu-mul-pos", f"{MM}\n{S}\nt = MatMul(x, a)\nr = Relu(t)\ny = Mul(r, s)",
     ["float[3,4] x", "float[2,3,4] x"], 17, False),
    ("dist-affine-add-mul-add", f"{C1}\n{C2}\n{C3}\nt = Add(x, c1)\nu = Mul(c2, t)\ny = Add(c3, u)", X3, 17, False),
    ("dist-affine-mul-add-mul", f"{C1}\n{C2}\n{C3}\nt = Mul(c1, x)\nu = Add(t, c3)\ny = Mul(u, c2)", X3, 17,
     False),
    *[(f"dist-transpose-{op.lower()}", f"a = Transpose <perm = [1, 0]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
       f"y = {op}(a, b)", SAME, 17, op == "Div") for op in ("Add", "Sub", "Mul", "Div")],
    *[(f"dist-reshape-{op.lower()}", f"{SH}\na = Reshape(x, sh)\nb = Reshape(z, sh)\ny = {op}(a, b)",
       ["float[2,3] x, float[2,3] z", "float[6,4] x, float[6,4] z"], 17, op == "Div")
      for op in ("Add", "Sub", "Mul", "Div")],
    ("dist-concat-mul-scalar", f"{S}\na = Mul(x, s)\nb = Mul(s, z)\ny = Concat <axis = 1> (a, b)",
     ["float[2,3] x, float[2,4] z", "float[5,1] x, float[5,2] z"], 17, False),
    ("dist-concat-add-scalar", f"{S}\na = Add(x, s)\nb = Add(z, s)\nc = Add(x, s)\ny = Concat <axis = 0> (a, b, c)",
     ["float[2,3] x, float[2,3] z", "float[1,2] x, float[4,2] z"], 17, False),
]

CASES = [(rule, body, inputs, opset, pos) for rule, body, shapes, opset, pos in POSITIVE for inputs in shapes]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_and_keeps_outputs(case: tuple[str, str, str, int, bool]) -> None:
    run_case(*case)


NEGATIVE = [
    ("dist-mul-add-common", "a = Mul(x, z)\nb = Mul(x, w)\ny = Add(a, b)",
     "float[1] x, float[4,1] z, float[1,5] w", "does not save work"),
    ("dist-mul-sub-common", "a = Mul(x, z)\nb = Mul(x, w)\ny = Sub(a, b)", "int64[3] x, int64[3] z, int64[3] w",
     "dtype not float"),
    ("dist-div-add-common", "a = Div(z, x)\nb = Div(w, x)\ny = Add(a, b)", "float[N] x, float[N] z, float[N] w",
     "shapes unknown"),
    ("dist-div-sub-common", "a = Div(z, x)\nb = Div(w, x)\ny = Sub(a, b)",
     "float[1] x, float[4,1] z, float[1,5] w", "does not save work"),
    ("dist-add-mul-self", f"{C1}\na = Mul(c1, x)\ny = Add(x, a)", "float[N] x", "shapes unknown"),
    ("dist-sub-mul-self", "c = Constant <value = int64[1] {2}> ()\na = Mul(x, c)\ny = Sub(a, x)", "int64[3] x",
     "dtype not float"),
    ("dist-sub-self-mul", f"{C1}\na = Mul(x, c1)\ny = Sub(x, a)", "float[N] x", "shapes unknown"),
    ("dist-conv-add", f"{CONV_W}\np = Conv <pads = [1, 1, 1, 1]> (x, w1)\nq = Conv(x, w2)\ny = Add(p, q)",
     "float[1,3,5,5] x", "Conv attributes differ"),
    ("dist-conv-sub", f"{CONV_W}\np = Conv(x, w1)\nq = Conv(x, z)\ny = Sub(p, q)", "float[1,3,5,5] x, "
     "float[4,3,3,3] z", "weights not constant"),
    ("dist-conv-add-shared-weight", f"{CONV_W}\np = Conv(x, w1)\nq = Conv(z, w1)\ny = Add(p, q)",
     "float[1,3,5,5] x, float[1,3,3,3] z", "inputs differ in shape"),
    ("dist-matmul-add-left", "p = MatMul(x, z)\nq = MatMul(x, w)\ny = Add(p, q)",
     "float[3,4] x, float[4,5] z, float[2,4,5] w", "operands differ in shape"),
    ("dist-matmul-sub-left", "p = MatMul(x, z)\nq = MatMul(x, w)\ny = Sub(p, q)",
     "float[3,4] x, float[4,1] z, float[4,5] w", "operands differ in shape"),
    ("dist-matmul-add-right", f"{MM}\np = MatMul(x, a)\nq = MatMul(z, a)\ny = Add(p, q)",
     "float[3,4] x, float[1,4] z", "operands differ in shape"),
    ("dist-matmul-sub-right", f"{MM}\np = MatMul(x, a)\nq = MatMul(z, a)\ny = Sub(p, q)",
     "float[N,4] x, float[N,4] z", "operands differ in shape"),
    ("dist-gemm-add", f"{GEMM}\np = Gemm <transB = 1> (x, a)\nq = Gemm(x, w)\ny = Add(p, q)",
     "float[3,4] x, float[4,5] w", "transposes differ"),
    ("dist-concat-matmul", f"{MM}\np = MatMul(x, a)\nq = MatMul(x, bw)\ny = Concat <axis = 0> (p, q)",
     "float[3,4] x", "not concatenated along the last axis"),
    ("dist-concat-matmul", "p = MatMul(x, z)\nq = MatMul(x, w)\ny = Concat <axis = -1> (p, q)",
     "float[1,8] x, float[8,4] z, float[8,4] w", "concatenating the weights costs more than the outputs"),
    ("dist-reducesum-mul-scalar", f"{S}\nt = Mul(x, s)\ny = ReduceSum <keepdims = 0> (t)", "float[N,3] x",
     "shapes unknown"),
    ("dist-reducemean-mul-scalar", f"{S}\nt = Mul(x, s)\ny = ReduceMean <axes = [0]> (t)", "float[1,3] x",
     "the reduction does not shrink the tensor"),
    ("dist-reducesum-div-scalar", "s = Constant <value = float[1,1] {2.0}> ()\nt = Div(x, s)\n"
     "y = ReduceSum <keepdims = 0> (t)", "float[3] x", "the scalar changes the operand's shape"),
    ("dist-reducemean-div-scalar", "s = Constant <value = int64 {2}> ()\nt = Div(x, s)\ny = ReduceMean(t)",
     "int64[2,3] x", "dtype not float"),
    ("dist-reducesum-neg", "t = Neg(x)\ny = ReduceSum <keepdims = 1> (t)", "float[N,3] x", "shapes unknown"),
    ("dist-reducemean-neg", "t = Neg(x)\ny = ReduceMean <axes = [0]> (t)", "float[1,3] x",
     "the reduction does not shrink the tensor"),
    ("dist-reducemax-mul-pos", "s = Constant <value = float {-2.0}> ()\nt = Mul(x, s)\ny = ReduceMax(t)",
     "float[2,3] x", "scalar not positive"),
    ("dist-reducemin-mul-pos", "s = Constant <value = float {0.0}> ()\nt = Mul(x, s)\ny = ReduceMin(t)",
     "float[2,3] x", "scalar not positive"),
    ("dist-neg-add-const", f"{C1}\nt = Add(c1, x)\ny = Neg(t)", "float[N] x", "shapes unknown"),
    ("dist-neg-sub", "t = Sub(x, z)\ny = Neg(t)", "int32[3] x, int32[3] z", "dtype not float"),
    ("dist-relu-mul-pos", f"{S}\nr = Relu(x)\ny = Mul(s, r)", "float[2,3] x",
     "the scale would not fold (no single-use linear producer)"),
    ("dist-relu-mul-pos", "s = Constant <value = float {-0.5}> ()\nt = Mul(x, x)\nr = Relu(t)\ny = Mul(s, r)",
     "float[2,3] x", "scalar not positive"),
    ("dist-affine-add-mul-add", f"{C1}\n{C2}\n{C3}\nt = Add(x, c1)\nu = Mul(c2, t)\ny = Add(c3, u)", "float[N] x",
     "shapes unknown"),
    ("dist-affine-mul-add-mul", f"{C1}\n{C3}\nc2 = Constant <value = float[1] {{0.0}}> ()\n"
     "c0 = Constant <value = float[1] {1e38}> ()\nt = Mul(c1, x)\nu = Add(t, c0)\ny = Mul(u, c0)", "float[3] x",
     "folded constant is not finite"),
    *[(f"dist-transpose-{op.lower()}", f"a = Transpose <perm = [1, 0]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
       f"y = {op}(a, b)", "float[2,3] x, float[1,3] z", "operands differ in shape") for op in ("Add", "Mul")],
    *[(f"dist-transpose-{op.lower()}", f"a = Transpose <perm = [0, 1]> (x)\nb = Transpose <perm = [1, 0]> (z)\n"
       f"y = {op}(a, b)", "float[3,3] x, float[3,3] z", "perms differ") for op in ("Sub", "Div")],
    *[(f"dist-reshape-{op.lower()}", "sh = Constant <value = int64[2] {6, 1}> ()\n"
       "sh2 = Constant <value = int64[2] {1, 6}> ()\na = Reshape(x, sh)\n"
       f"b = Reshape(z, sh2)\ny = {op}(a, b)", "float[6] x, float[6] z", "reshaped to different shapes")
      for op in ("Add", "Sub", "Mul", "Div")],
    ("dist-concat-mul-scalar", f"{S}\nt = Constant <value = float {{2.0}}> ()\na = Mul(x, s)\nb = Mul(t, z)\n"
     "y = Concat <axis = 1> (a, b)", "float[2,3] x, float[2,4] z", "scalars differ"),
    ("dist-concat-add-scalar", f"{S}\na = Add(x, s)\nb = Add(z, s)\ny = Concat <axis = 1> (a, b)",
     "int64[2,3] x, int64[2,4] z", "dtype not float"),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=[f"{c[0]}-{i}" for i, c in enumerate(NEGATIVE)])
def test_guards_refuse(case: tuple[str, str, str, str]) -> None:
    rule, body, inputs, reason = case
    if "int64" in inputs and "s = Constant <value = float" in body:
        body = body.replace("s = Constant <value = float {0.75}>", "s = Constant <value = int64 {2}>")
    model = build(body, inputs)
    stats = RewriteStats()
    apply_rules(model, RULES, stats=stats, choose_best=True)
    assert stats.fired[rule] == 0
    assert stats.refused[(rule, reason)] >= 1, stats.refused


def test_every_rule_is_tested() -> None:
    assert {c[0] for c in POSITIVE} == set(BY_NAME)
    assert {c[0] for c in NEGATIVE} == set(BY_NAME)


def test_reduction_keeps_the_opset_form() -> None:
    """The new ReduceSum copies the axes attribute (opset 11) or the axes input (opset 13)."""
    model = build(f"{S}\nt = Mul(s, x)\ny = ReduceSum <axes = [1]> (t)", "float[2,3] x", opset=11)
    assert apply_rules(model, RULES, choose_best=True)
    red = next(n for n in model.graph if n.op_type == "ReduceSum")
    assert list(red.attributes["axes"].value) == [1] and len(red.inputs) == 1
    model = build(f"{S}\nax = Constant <value = int64[1] {{1}}> ()\nt = Mul(x, s)\ny = ReduceSum(t, ax)",
                  "float[2,3] x", opset=13)
    assert apply_rules(model, RULES, choose_best=True)
    red = next(n for n in model.graph if n.op_type == "ReduceSum")
    assert len(red.inputs) == 2 and "axes" not in red.attributes
