"""Redundant-node elimination: every rule fires where it should, refuses per guard, is idempotent, and keeps
onnxruntime's outputs; all passes together keep the light models' outputs without adding nodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import dlcc
from dlcc.check import diff, run_ort
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.cse import CommonSubexpressionElimination
from dlcc.passes.eliminate import DeadCodeElimination
from dlcc.passes.manager import ManagerOptions, Pass, PassManager
from dlcc.passes.redundant import (
    RULES,
    InversePairs,
    NoOpElimination,
    ReshapeChains,
    holds_exactly,
)
from dlcc.passes.verify import verify_model
from dlcc.testing.rewrites import run_checked as _run_checked

H9 = '<ir_version: 8, opset_import: ["" : 9]>'
H10 = '<ir_version: 8, opset_import: ["" : 10]>'
H13 = '<ir_version: 8, opset_import: ["" : 13]>'
H17 = '<ir_version: 8, opset_import: ["" : 17]>'
BIG = 9223372036854775807


def build(text: str, inits: dict[str, np.ndarray] | None = None) -> ir.Model:
    proto = onnx.parser.parse_model(text)
    for name, arr in (inits or {}).items():
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
    return infer_shapes(dlcc.load(proto))


def run_checked(model: ir.Model, p: Pass, *, ort: bool = True, rtol: float = 1e-5,
                compare: Callable | None = None) -> bool:
    return _run_checked(model, p, ort=ort, rtol=rtol, compare=compare)


def ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


@dataclass
class Case:
    id: str
    text: str
    rule: str
    after: list[str] | None = None  # op types left (positive case)
    reason: str | None = None  # refusal (negative case); None: the pattern does not even match
    make: Callable[[], Pass] = NoOpElimination
    inits: dict = field(default_factory=dict)
    ort: bool = True


def g(header: str, sig: str, body: str) -> str:
    return f"{header}\ng {sig} {{\n{body}\n}}"


F23 = "(float[2,3] x) => (float[2,3] y)"
# a constant 3 x 2 x 3 x 3 Conv weight (seeded)
W332 = ("w = Constant <value = float[3,2,3,3] {" + ", ".join(
    f"{v:.4f}" for v in np.random.default_rng(4).standard_normal(54)) + "}> ()\n")
R = "    y = Relu(t)"  # most cases end in a Relu so the rewritten value is not a graph output

POSITIVE: list[Case] = [
    # --- no-op
    Case("identity", g(H17, F23, "t = Identity(x)\n" + R), "identity", ["Relu"]),
    Case("identity-to-output", g(H17, F23, "t = Relu(x)\n y = Identity(t)"), "identity", ["Relu"]),
    Case("dropout-opset9", g(H9, F23, "t, m = Dropout <ratio = 0.3> (x)\n" + R), "dropout-inference", ["Relu"]),
    Case("dropout-opset13-false", g(H13, F23, """r = Constant <value = float {0.7}> ()
        f = Constant <value = bool {0}> ()
        t = Dropout (x, r, f)\n""" + R), "dropout-inference", ["Relu"]),
    Case("dropout-opset13-ratio-only", g(H13, F23, "r = Constant <value = float {0.2}> ()\n"
                                                   "t = Dropout (x, r)\n" + R), "dropout-inference", ["Relu"]),
    *[Case(f"single-{op.lower()}", g(H17, F23, f"t = {op}{' <axis = 0>' if op == 'Concat' else ''} (x)\n" + R),
           f"single-input-{op.lower()}", ["Relu"]) for op in ("Concat", "Sum", "Max", "Min", "Mean")],
    Case("cast-same", g(H17, F23, "t = Cast <to = 1> (x)\n" + R), "cast-same-type", ["Relu"]),
    Case("reshape-same", g(H17, F23, "s = Constant <value = int64[2] {2, 3}> ()\n t = Reshape (x, s)\n" + R),
         "reshape-same-shape", ["Relu"]),
    Case("reshape-same-0-1", g(H9, F23, "s = Constant <value = int64[2] {0, -1}> ()\n t = Reshape (x, s)\n" + R),
         "reshape-same-shape", ["Relu"]),
    Case("flatten-same", g(H9, F23, "t = Flatten <axis = 1> (x)\n" + R), "flatten-same-shape", ["Relu"]),
    Case("expand-same", g(H17, F23, "s = Constant <value = int64[2] {1, 3}> ()\n t = Expand (x, s)\n" + R),
         "expand-same-shape", ["Relu"]),
    Case("expand-symbolic", g(H17, "(float[N,3] x) => (float[N,3] y)",
                              "s = Constant <value = int64[1] {1}> ()\n t = Expand (x, s)\n" + R),
         "expand-same-shape", ["Relu"]),
    Case("slice-full-opset9", g(H9, F23, "t = Slice <starts = [0], ends = [3], axes = [1]> (x)\n" + R),
         "slice-full", ["Relu"]),
    Case("slice-full-opset17", g(H17, "(float[N,3] x) => (float[N,3] y)", f"""
        s = Constant <value = int64[2] {{0, -3}}> ()
        e = Constant <value = int64[2] {{{BIG}, 3}}> ()
        a = Constant <value = int64[2] {{0, -1}}> ()
        t = Slice (x, s, e, a)\n""" + R), "slice-full", ["Relu"]),
    Case("pad-zero-opset9", g(H9, F23, "t = Pad <pads = [0, 0, 0, 0]> (x)\n" + R), "pad-zero", ["Relu"]),
    Case("pad-zero-opset17", g(H17, F23, "p = Constant <value = int64[4] {0, 0, 0, 0}> ()\n"
                                         "t = Pad <mode = \"reflect\"> (x, p)\n" + R), "pad-zero", ["Relu"]),
    Case("transpose-identity", g(H17, F23, "t = Transpose <perm = [0, 1]> (x)\n" + R), "transpose-identity",
         ["Relu"]),
    Case("split-one-opset9", g(H9, F23, "t = Split <axis = 1, split = [3]> (x)\n" + R), "split-single", ["Relu"]),
    Case("split-one-opset17", g(H17, F23, "t = Split <axis = 1> (x)\n" + R), "split-single", ["Relu"]),
    Case("maxpool-1x1", g(H17, "(float[1,2,4,4] x) => (float[1,2,4,4] y)",
                          "t = MaxPool <kernel_shape = [1, 1], strides = [1, 1], ceil_mode = 1> (x)\n" + R),
         "pool-unit", ["Relu"]),
    Case("avgpool-1x1", g(H9, "(float[1,2,4,4] x) => (float[1,2,4,4] y)",
                          "t = AveragePool <kernel_shape = [1, 1], pads = [0, 0, 0, 0]> (x)\n" + R),
         "pool-unit", ["Relu"]),
    Case("resize-scales-opset13", g(H13, "(float[1,2,3,4] x) => (float[1,2,3,4] y)",
                                    "s = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()\n"
                                    "t = Resize <mode = \"linear\"> (x, , s)\n" + R), "resize-unit", ["Relu"]),
    Case("resize-sizes-opset13", g(H13, "(float[1,2,3,4] x) => (float[1,2,3,4] y)",
                                   "z = Constant <value = int64[4] {1, 2, 3, 4}> ()\n"
                                   "t = Resize <mode = \"cubic\"> (x, , , z)\n" + R), "resize-unit", ["Relu"]),
    Case("resize-opset10", g(H10, "(float[1,2,3,4] x) => (float[1,2,3,4] y)",
                             "s = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()\n"
                             "t = Resize <mode = \"nearest\"> (x, s)\n" + R), "resize-unit", ["Relu"]),
    Case("upsample-opset9", g(H9, "(float[1,2,3,4] x) => (float[1,2,3,4] y)",
                              "s = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()\n"
                              "t = Upsample <mode = \"nearest\"> (x, s)\n" + R), "resize-unit", ["Relu"]),
    Case("tile-ones", g(H17, F23, "r = Constant <value = int64[2] {1, 1}> ()\n t = Tile (x, r)\n" + R),
         "tile-ones", ["Relu"]),
    # a dilation as large as the plane: only the centre tap reaches the input -> a 1x1 Conv (DeepLab's ASPP)
    Case("conv-unreached-taps", g(H17, "(float[1,2,4,4] x) => (float[1,3,4,4] y)",
                                  W332 + "t = Conv <pads = [4, 4, 4, 4], dilations = [4, 4]> (x, w)\n" + R),
         "conv-unreached-taps", ["Conv", "Relu"]),
    # rows only: the first kernel row never meets the input, the other two do (stride 2, 1-D dilation)
    Case("conv-unreached-rows", g(H17, "(float[1,2,5,6] x, float[3] b) => (float[1,3,2,3] y)",
                                  W332 + "t = Conv <pads = [3, 1, 2, 1], strides = [2, 2], dilations = [3, 1]> "
                                  "(x, w, b)\n" + R),
         "conv-unreached-taps", ["Conv", "Relu"]),
    Case("add-zero", g(H17, F23, "c = Constant <value = float[3] {0.0, 0.0, 0.0}> ()\n t = Add (x, c)\n" + R),
         "add-zero", ["Relu"]),
    Case("zero-add", g(H9, F23, "c = Constant <value = float[1,1] {0.0}> ()\n t = Add (c, x)\n" + R),
         "add-zero", ["Relu"]),
    Case("add-zero-int", g(H17, "(int64[2,3] x) => (int64[2,3] y)",
                           "c = Constant <value = int64 {0}> ()\n y = Add (x, c)"), "add-zero", ["Identity"]),
    Case("sub-zero", g(H17, F23, "c = Constant <value = float {0.0}> ()\n t = Sub (x, c)\n" + R),
         "sub-zero", ["Relu"]),
    Case("mul-one", g(H17, F23, "c = Constant <value = float[2,1] {1.0, 1.0}> ()\n t = Mul (x, c)\n" + R),
         "mul-one", ["Relu"]),
    Case("one-mul", g(H17, F23, "c = Constant <value = float {1.0}> ()\n t = Mul (c, x)\n" + R),
         "mul-one", ["Relu"]),
    Case("div-one", g(H17, F23, "c = Constant <value = float {1.0}> ()\n t = Div (x, c)\n" + R),
         "div-one", ["Relu"]),
    Case("pow-one", g(H17, F23, "c = Constant <value = int64 {1}> ()\n t = Pow (x, c)\n" + R),
         "pow-one", ["Relu"]),
    # --- reshape chains
    Case("chain-static-opset9", g(H9, "(float[2,3,4] x) => (float[6,4] y)", """
        f = Flatten <axis = 1> (x)
        u = Unsqueeze <axes = [1]> (f)
        s = Constant <value = int64[2] {6, 4}> ()
        t = Reshape (u, s)\n""" + R), "reshape-chain", ["Reshape", "Relu"], make=ReshapeChains),
    Case("chain-static-opset17", g(H17, "(float[2,1,3] x) => (float[3,2] y)", """
        a = Constant <value = int64[1] {1}> ()
        q = Squeeze (x, a)
        b = Constant <value = int64[1] {0}> ()
        u = Unsqueeze (q, b)
        s = Constant <value = int64[2] {3, 2}> ()
        t = Reshape (u, s)\n""" + R), "reshape-chain", ["Reshape", "Relu"], make=ReshapeChains),
    Case("chain-static-identity", g(H9, "(float[2,1,3] x) => (float[2,1,3] y)", """
        q = Squeeze <axes = [1]> (x)
        t = Unsqueeze <axes = [1]> (q)\n""" + R), "reshape-chain", ["Relu"], make=ReshapeChains),
    Case("compose-unsqueeze-opset9", g(H9, "(float[N,3] x) => (float[1,N,1,3] y)", """
        a = Unsqueeze <axes = [1]> (x)
        t = Unsqueeze <axes = [0]> (a)\n""" + R), "squeeze-unsqueeze-compose", ["Unsqueeze", "Relu"],
         make=ReshapeChains),
    Case("compose-unsqueeze-opset17", g(H17, "(float[N,3] x) => (float[1,N,1,3] y)", """
        i = Constant <value = int64[1] {-2}> ()
        a = Unsqueeze (x, i)
        j = Constant <value = int64[1] {0}> ()
        t = Unsqueeze (a, j)\n""" + R), "squeeze-unsqueeze-compose", ["Unsqueeze", "Relu"],
         make=ReshapeChains),
    Case("compose-squeeze-opset17", g(H17, "(float[N,1,3,1] x) => (float[N,3] y)", """
        i = Constant <value = int64[1] {1}> ()
        a = Squeeze (x, i)
        j = Constant <value = int64[1] {-1}> ()
        t = Squeeze (a, j)\n""" + R), "squeeze-unsqueeze-compose", ["Squeeze", "Relu"], make=ReshapeChains),
    Case("compose-mixed-to-unsqueeze", g(H9, "(float[N,1,3] x) => (float[N,1,1,3] y)", """
        a = Squeeze <axes = [1]> (x)
        t = Unsqueeze <axes = [1, 2]> (a)\n""" + R), "squeeze-unsqueeze-compose", ["Unsqueeze", "Relu"],
         make=ReshapeChains),
    Case("compose-mixed-identity", g(H9, "(float[N,1,3] x) => (float[N,1,3] y)", """
        a = Unsqueeze <axes = [2]> (x)
        t = Squeeze <axes = [1]> (a)\n""" + R), "squeeze-unsqueeze-compose", ["Relu"], make=ReshapeChains),
    # --- inverse pairs
    Case("squeeze-unsqueeze-opset9", g(H9, F23, "a = Unsqueeze <axes = [-1]> (x)\n t = Squeeze <axes = [2]> (a)\n"
                                                + R), "squeeze-of-unsqueeze", ["Relu"], make=InversePairs),
    Case("squeeze-unsqueeze-opset17", g(H17, "(float[N,3] x) => (float[N,3] y)", """
        i = Constant <value = int64[2] {0, -1}> ()
        a = Unsqueeze (x, i)
        j = Constant <value = int64[2] {3, 0}> ()
        t = Squeeze (a, j)\n""" + R), "squeeze-of-unsqueeze", ["Relu"], make=InversePairs),
    Case("unsqueeze-squeeze-opset9", g(H9, "(float[2,1,3] x) => (float[2,1,3] y)",
                                       "a = Squeeze <axes = [1]> (x)\n t = Unsqueeze <axes = [-2]> (a)\n" + R),
         "unsqueeze-of-squeeze", ["Relu"], make=InversePairs),
    Case("unsqueeze-squeeze-opset17", g(H17, "(float[N,M,3] x) => (float[N,1,3] y)", """
        i = Constant <value = int64[1] {1}> ()
        a = Squeeze (x, i)
        t = Unsqueeze (a, i)\n""" + R), "unsqueeze-of-squeeze", ["Relu"], make=InversePairs),
    Case("transpose-cancel", g(H9, "(float[2,3,4] x) => (float[2,3,4] y)",
                               "a = Transpose <perm = [1, 0, 2]> (x)\n t = Transpose <perm = [1, 0, 2]> (a)\n" + R),
         "transpose-transpose", ["Relu"], make=InversePairs),
    Case("transpose-compose", g(H17, "(float[2,3,4] x) => (float[4,2,3] y)",
                                "a = Transpose <perm = [1, 2, 0]> (x)\n t = Transpose <perm = [1, 2, 0]> (a)\n" + R),
         "transpose-transpose", ["Transpose", "Relu"], make=InversePairs),
    Case("transpose-default-perm", g(H17, "(float[2,3] x) => (float[2,3] y)",
                                     "a = Transpose (x)\n t = Transpose (a)\n" + R),
         "transpose-transpose", ["Relu"], make=InversePairs),
    Case("reshape-reshape-zero", g(H9, "(float[2,3,4] x) => (float[3,4,2] y)", """
        s = Constant <value = int64[2] {6, 4}> ()
        a = Reshape (x, s)
        z = Constant <value = int64[3] {3, 0, -1}> ()
        t = Reshape (a, z)\n""" + R), "reshape-reshape", ["Reshape", "Relu"], make=InversePairs),
    Case("reshape-reshape-symbolic", g(H17, "(float[N,3,4] x) => (float[M,4] y)", """
        s = Constant <value = int64[2] {-1, 12}> ()
        a = Reshape (x, s)
        z = Constant <value = int64[2] {-1, 4}> ()
        t = Reshape (a, z)\n""" + R), "reshape-reshape", ["Reshape", "Relu"], make=InversePairs),
    Case("reshape-reshape-back", g(H17, "(float[2,3,4] x) => (float[2,3,4] y)", """
        s = Constant <value = int64[2] {6, 4}> ()
        a = Reshape (x, s)
        z = Constant <value = int64[3] {2, 3, 4}> ()
        t = Reshape (a, z)\n""" + R), "reshape-reshape", ["Relu"], make=InversePairs),
    Case("reshape-reshape-allowzero", g(H17, "(float[2,3] x) => (float[3,2] y)", """
        s = Constant <value = int64[1] {6}> ()
        a = Reshape (x, s)
        z = Constant <value = int64[2] {3, 2}> ()
        t = Reshape <allowzero = 1> (a, z)\n""" + R), "reshape-reshape", ["Reshape", "Relu"], make=InversePairs),
    Case("dq-q", g(H13, "(uint8[2,3] x) => (uint8[2,3] y)", """
        s = Constant <value = float {0.05}> ()
        z = Constant <value = uint8 {3}> ()
        s2 = Constant <value = float {0.05}> ()
        z2 = Constant <value = uint8 {3}> ()
        d = DequantizeLinear (x, s, z)
        y = QuantizeLinear (d, s2, z2)"""), "dequantize-quantize", ["Identity"], make=InversePairs),
    Case("dq-q-per-axis", g(H13, "(int8[2,3] x) => (int8[2,3] y)", """
        s = Constant <value = float[3] {0.05, 0.5, 3.0}> ()
        z = Constant <value = int8[3] {3, -4, 0}> ()
        d = DequantizeLinear <axis = 1> (x, s, z)
        y = QuantizeLinear <axis = -1> (d, s, z)"""), "dequantize-quantize", ["Identity"], make=InversePairs),
    Case("dq-q-default-zero", g(H13, "(uint8[2,3] x) => (uint8[2,3] y)", """
        s = Constant <value = float {0.05}> ()
        z = Constant <value = uint8 {0}> ()
        d = DequantizeLinear (x, s)
        y = QuantizeLinear (d, s, z)"""), "dequantize-quantize", ["Identity"], make=InversePairs),
    Case("concat-slice-opset17", g(H17, "(float[2,3] a, float[2,4] b) => (float[2,4] y)", f"""
        c = Concat <axis = 1> (a, b)
        s = Constant <value = int64[1] {{3}}> ()
        e = Constant <value = int64[1] {{{BIG}}}> ()
        x = Constant <value = int64[1] {{-1}}> ()
        t = Slice (c, s, e, x)\n""" + R), "concat-slice", ["Relu"], make=InversePairs),
    Case("concat-slice-opset9", g(H9, "(float[2,3] a, float[2,4] b) => (float[2,3] y)",
                                  "c = Concat <axis = 1> (a, b)\n"
                                  "t = Slice <starts = [0, 0], ends = [2, 3], axes = [0, 1]> (c)\n" + R),
         "concat-slice", ["Relu"], make=InversePairs),
]


@pytest.mark.parametrize("case", POSITIVE, ids=lambda c: c.id)
def test_rule_fires(case: Case) -> None:
    model = build(case.text, case.inits)
    p = case.make()
    assert run_checked(model, p, ort=case.ort)
    assert p.fired[case.rule] >= 1, (p.fired, getattr(p, "refused", None))
    assert ops(model) == case.after
    assert [v.name for v in model.graph.outputs] == [v.name for v in build(case.text).graph.outputs]
    again = case.make()
    assert not again(model)  # idempotent


NEGATIVE: list[Case] = [
    Case("identity-input-to-output", g(H17, F23, "y = Identity(x)"), "identity",
         reason="copies a graph input, initializer or output to a graph output"),
    Case("dropout-mask-used", g(H9, "(float[2,3] x) => (float[2,3] y, float[2,3] m)",
                                "y, m = Dropout <ratio = 0.3> (x)"), "dropout-inference", reason="mask output is used"),
    Case("dropout-training", g(H13, F23, """r = Constant <value = float {0.5}> ()
        f = Constant <value = bool {1}> ()
        t = Dropout <seed = 1> (x, r, f)\n""" + R), "dropout-inference", reason="training_mode is true", ort=False),
    Case("dropout-training-input", g(H13, "(float[2,3] x, bool f) => (float[2,3] y)", """
        r = Constant <value = float {0.5}> ()
        t = Dropout <seed = 1> (x, r, f)\n""" + R), "dropout-inference", reason="training_mode is not constant",
         ort=False),
    Case("concat-two", g(H17, "(float[2,3] x) => (float[4,3] y)", "t = Concat <axis = 0> (x, x)\n" + R),
         "single-input-concat", reason="has 2 inputs"),
    Case("sum-two", g(H17, F23, "t = Sum (x, x)\n" + R), "single-input-sum", reason="has 2 inputs"),
    Case("cast-other", g(H17, "(float[2,3] x) => (double[2,3] y)", "y = Cast <to = 11> (x)"), "cast-same-type",
         reason="changes the type"),
    Case("reshape-changes", g(H17, "(float[2,3] x) => (float[3,2] y)",
                              "s = Constant <value = int64[2] {3, 2}> ()\n t = Reshape (x, s)\n" + R),
         "reshape-same-shape", reason="changes the shape"),
    Case("reshape-symbolic", g(H17, "(float[N,3] x) => (float[N,3] y)",
                               "s = Constant <value = int64[2] {-1, 3}> ()\n t = Reshape (x, s)\n" + R),
         "reshape-same-shape", reason="input shape not static"),
    Case("flatten-3d", g(H9, "(float[2,3,4] x) => (float[2,12] y)", "t = Flatten <axis = 1> (x)\n" + R),
         "flatten-same-shape", reason="changes the shape"),
    Case("expand-grows", g(H17, "(float[1,3] x) => (float[2,3] y)",
                           "s = Constant <value = int64[2] {2, 3}> ()\n t = Expand (x, s)\n" + R),
         "expand-same-shape", reason="broadcast changes the shape"),
    Case("expand-adds-dims", g(H17, "(float[2,3] x) => (float[1,2,3] y)",
                               "s = Constant <value = int64[3] {1, 1, 3}> ()\n t = Expand (x, s)\n" + R),
         "expand-same-shape", reason="adds dimensions"),
    Case("expand-not-const", g(H17, F23, "s = Shape (x)\n t = Expand (x, s)\n" + R), "expand-same-shape",
         reason="shape is not constant"),
    Case("slice-part-opset9", g(H9, "(float[2,3] x) => (float[2,2] y)",
                                "t = Slice <starts = [0], ends = [2], axes = [1]> (x)\n" + R),
         "slice-full", reason="does not cover the whole axis"),
    Case("slice-step", g(H17, "(float[2,3] x) => (float[2,2] y)", f"""
        s = Constant <value = int64[1] {{0}}> ()
        e = Constant <value = int64[1] {{{BIG}}}> ()
        a = Constant <value = int64[1] {{1}}> ()
        p = Constant <value = int64[1] {{2}}> ()
        t = Slice (x, s, e, a, p)\n""" + R), "slice-full", reason="step is not 1"),
    Case("slice-symbolic-end", g(H17, "(float[N,3] x) => (float[M,3] y)", """
        s = Constant <value = int64[1] {0}> ()
        e = Constant <value = int64[1] {3}> ()
        t = Slice (x, s, e)\n""" + R), "slice-full", reason="axis size unknown"),
    Case("slice-not-const", g(H17, "(float[2,3] x, int64[1] e) => (float[2,M] y)", """
        s = Constant <value = int64[1] {0}> ()
        a = Constant <value = int64[1] {1}> ()
        t = Slice (x, s, e, a)\n""" + R), "slice-full", reason="starts/ends are not constant"),
    Case("pad-nonzero-opset9", g(H9, "(float[2,3] x) => (float[2,5] y)", "t = Pad <pads = [0, 1, 0, 1]> (x)\n" + R),
         "pad-zero", reason="pads are not zero"),
    Case("pad-nonzero-opset17", g(H17, "(float[2,3] x) => (float[2,4] y)",
                                  "p = Constant <value = int64[4] {0, 0, 0, 1}> ()\n t = Pad (x, p)\n" + R),
         "pad-zero", reason="pads are not zero"),
    Case("transpose-swap", g(H17, "(float[2,3] x) => (float[3,2] y)", "t = Transpose <perm = [1, 0]> (x)\n" + R),
         "transpose-identity", reason="permutation is not the identity"),
    Case("transpose-default", g(H17, "(float[2,3] x) => (float[3,2] y)", "t = Transpose (x)\n" + R),
         "transpose-identity", reason="reverses the axes"),
    Case("split-two-opset9", g(H9, "(float[2,4] x) => (float[2,1] y, float[2,3] z)",
                               "y, z = Split <axis = 1, split = [1, 3]> (x)"), "split-single",
         reason="splits into 2 parts"),
    Case("split-two-opset17", g(H17, "(float[2,4] x) => (float[2,2] y, float[2,2] z)",
                                "y, z = Split <axis = 1> (x)"), "split-single", reason="splits into 2 parts"),
    Case("maxpool-2x2", g(H17, "(float[1,2,4,4] x) => (float[1,2,3,3] y)",
                          "t = MaxPool <kernel_shape = [2, 2]> (x)\n" + R), "pool-unit", reason="window is not 1x1"),
    Case("maxpool-stride", g(H17, "(float[1,2,4,4] x) => (float[1,2,2,2] y)",
                             "t = MaxPool <kernel_shape = [1, 1], strides = [2, 2]> (x)\n" + R), "pool-unit",
         reason="stride is not 1"),
    Case("avgpool-pads", g(H17, "(float[1,2,4,4] x) => (float[1,2,6,6] y)",
                           "t = AveragePool <kernel_shape = [1, 1], pads = [1, 1, 1, 1]> (x)\n" + R), "pool-unit",
         reason="has padding", ort=False),
    Case("maxpool-dilation", g(H17, "(float[1,2,4,4] x) => (float[1,2,4,4] y)",
                               "t = MaxPool <kernel_shape = [1, 1], dilations = [2, 2]> (x)\n" + R), "pool-unit",
         reason="has dilation"),
    Case("maxpool-indices", g(H17, "(float[1,2,4,4] x) => (float[1,2,4,4] y, int64[1,2,4,4] i)",
                              "y, i = MaxPool <kernel_shape = [1, 1]> (x)"), "pool-unit",
         reason="indices output is used"),
    Case("resize-scale-2", g(H13, "(float[1,2,3,4] x) => (float[1,2,6,8] y)",
                             "s = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()\n"
                             "t = Resize <mode = \"nearest\"> (x, , s)\n" + R), "resize-unit",
         reason="scales are not all 1"),
    Case("resize-crop", g(H13, "(float[1,2,3,4] x) => (float[1,2,3,4] y)", """
        r = Constant <value = float[8] {0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.5}> ()
        s = Constant <value = float[4] {1.0, 1.0, 1.0, 1.0}> ()
        t = Resize <coordinate_transformation_mode = "tf_crop_and_resize", mode = "linear"> (x, r, s)\n""" + R),
         "resize-unit", reason="crops with roi"),
    Case("resize-sizes-differ", g(H13, "(float[1,2,3,4] x) => (float[1,2,3,5] y)",
                                  "z = Constant <value = int64[4] {1, 2, 3, 5}> ()\n"
                                  "t = Resize (x, , , z)\n" + R), "resize-unit",
         reason="sizes differ from the input shape"),
    Case("upsample-2", g(H9, "(float[1,2,3,4] x) => (float[1,2,6,8] y)",
                         "s = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()\n"
                         "t = Upsample (x, s)\n" + R), "resize-unit", reason="scales are not all 1"),
    Case("tile-two", g(H17, "(float[2,3] x) => (float[4,3] y)",
                       "r = Constant <value = int64[2] {2, 1}> ()\n t = Tile (x, r)\n" + R), "tile-ones",
         reason="repeats are not all 1"),
    Case("tile-not-const", g(H17, "(float[2,3] x, int64[2] r) => (float[A,B] y)", "t = Tile (x, r)\n" + R),
         "tile-ones", reason="repeats are not constant"),
    Case("pad-not-const", g(H17, "(float[2,3] x, int64[4] p) => (float[A,B] y)", "t = Pad (x, p)\n" + R),
         "pad-zero", reason="pads are not constant"),
    Case("resize-scales-not-const", g(H13, "(float[1,2,3,4] x, float[4] s) => (float[A,B,C,D] y)",
                                      "t = Resize (x, , s)\n" + R), "resize-unit", reason="scales are not constant",
         ort=False),
    Case("dropout-opset6-training", g('<ir_version: 8, opset_import: ["" : 6]>', F23,
                                      "t = Dropout <is_test = 0> (x)\n" + R), "dropout-inference",
         reason="training mode (is_test is not 1)", ort=False),
    Case("add-nonzero", g(H17, F23, "c = Constant <value = float {0.5}> ()\n t = Add (x, c)\n" + R), "add-zero",
         reason="constant is not 0"),
    Case("add-zero-broadcasts", g(H17, "(float[2,1] x) => (float[2,3] y)",
                                  "c = Constant <value = float[3] {0.0, 0.0, 0.0}> ()\n t = Add (x, c)\n" + R),
         "add-zero", reason="broadcasting changes the shape"),
    Case("add-zero-adds-dims", g(H17, "(float[2,3] x) => (float[1,2,3] y)",
                                 "c = Constant <value = float[1,1,1] {0.0}> ()\n t = Add (x, c)\n" + R),
         "add-zero", reason="broadcasting adds dimensions"),
    Case("zero-sub", g(H17, F23, "c = Constant <value = float {0.0}> ()\n t = Sub (c, x)\n" + R), "sub-zero"),
    Case("mul-two", g(H17, F23, "c = Constant <value = float {2.0}> ()\n t = Mul (x, c)\n" + R), "mul-one",
         reason="constant is not 1"),
    Case("mul-one-broadcasts", g(H17, "(float[3] x) => (float[2,3] y)",
                                 "c = Constant <value = float[2,1] {1.0, 1.0}> ()\n t = Mul (c, x)\n" + R),
         "mul-one", reason="broadcasting adds dimensions"),
    Case("one-div", g(H17, F23, "c = Constant <value = float {1.0}> ()\n t = Div (c, x)\n" + R), "div-one"),
    Case("pow-two", g(H17, F23, "c = Constant <value = float {2.0}> ()\n t = Pow (x, c)\n" + R), "pow-one",
         reason="constant is not 1"),
    # --- reshape chains
    Case("chain-shared", g(H9, "(float[2,3,4] x) => (float[6,4] y, float[2,12] z)", """
        z = Flatten <axis = 1> (x)
        s = Constant <value = int64[2] {6, 4}> ()
        y = Reshape (z, s)"""), "reshape-chain", reason="intermediate has other uses", make=ReshapeChains),
    Case("chain-symbolic", g(H17, "(float[N,3,4] x) => (float[M,4] y)", """
        s = Constant <value = int64[2] {-1, 12}> ()
        a = Reshape (x, s)
        z = Constant <value = int64[2] {-1, 4}> ()
        t = Reshape (a, z)\n""" + R), "reshape-chain", reason="shapes not static", make=ReshapeChains),
    Case("compose-crossing", g(H9, "(float[N,1,3] x) => (float[N,3,1] y)", """
        a = Squeeze <axes = [1]> (x)
        t = Unsqueeze <axes = [2]> (a)\n""" + R), "squeeze-unsqueeze-compose",
         reason="axes do not compose into one Squeeze or Unsqueeze", make=ReshapeChains),
    Case("compose-shared", g(H9, "(float[N,3] x) => (float[1,N,1,3] y, float[N,1,3] z)", """
        z = Unsqueeze <axes = [1]> (x)
        y = Unsqueeze <axes = [0]> (z)"""), "squeeze-unsqueeze-compose", reason="intermediate has other uses",
         make=ReshapeChains),
    Case("compose-squeeze-all-symbolic", g(H9, "(float[N,1,3] x) => (float[N,3] y)", """
        a = Unsqueeze <axes = [0]> (x)
        t = Squeeze (a)\n""" + R), "squeeze-unsqueeze-compose",
         reason="squeeze without axes on a shape that is not static", make=ReshapeChains, ort=False),
    # --- inverse pairs
    Case("squeeze-unsqueeze-differ", g(H9, "(float[1,3] x) => (float[1,3] y)",
                                       "a = Unsqueeze <axes = [0]> (x)\n t = Squeeze <axes = [1]> (a)\n" + R),
         "squeeze-of-unsqueeze", reason="axes differ", make=InversePairs),
    Case("unsqueeze-squeeze-differ", g(H17, "(float[2,1,3] x) => (float[1,2,3] y)", """
        i = Constant <value = int64[1] {1}> ()
        a = Squeeze (x, i)
        j = Constant <value = int64[1] {0}> ()
        t = Unsqueeze (a, j)\n""" + R), "unsqueeze-of-squeeze", reason="axes differ", make=InversePairs),
    Case("unsqueeze-squeeze-noaxes", g(H9, "(float[N,1,3] x) => (float[N,1,3] y)",
                                       "a = Squeeze (x)\n t = Unsqueeze <axes = [1]> (a)\n" + R),
         "unsqueeze-of-squeeze", reason="squeeze without axes on a shape that is not static", make=InversePairs,
         ort=False),
    Case("reshape-reshape-zero-symbolic", g(H17, "(float[N,3,4] x) => (float[N,3,4] y)", """
        s = Constant <value = int64[2] {0, 12}> ()
        a = Reshape (x, s)
        z = Constant <value = int64[3] {0, 3, 4}> ()
        t = Reshape (a, z)\n""" + R), "reshape-reshape", reason="0 copies an intermediate dim that is unknown",
         make=InversePairs),
    Case("reshape-reshape-shape-input", g(H17, "(float[2,3,4] x, float[4,6] w) => (float[4,6] y)", """
        s = Constant <value = int64[2] {6, 4}> ()
        a = Reshape (x, s)
        z = Shape (w)
        t = Reshape (a, z)\n""" + R), "reshape-reshape", reason="shape is not constant", make=InversePairs),
    Case("cast-back-other", g(H17, "(int32[2,3] x) => (float[2,3] y)",
                              "a = Cast <to = 7> (x)\n y = Cast <to = 1> (a)"), "cast-roundtrip",
         reason="does not cast back to the input type", make=InversePairs),
    Case("dq-q-scales-differ", g(H13, "(uint8[2,3] x) => (uint8[2,3] y)", """
        s = Constant <value = float {0.05}> ()
        s2 = Constant <value = float {0.1}> ()
        z = Constant <value = uint8 {3}> ()
        d = DequantizeLinear (x, s, z)
        y = QuantizeLinear (d, s2, z)"""), "dequantize-quantize", reason="scales differ", make=InversePairs),
    Case("dq-q-zero-points-differ", g(H13, "(uint8[2,3] x) => (uint8[2,3] y)", """
        s = Constant <value = float {0.05}> ()
        z = Constant <value = uint8 {3}> ()
        z2 = Constant <value = uint8 {4}> ()
        d = DequantizeLinear (x, s, z)
        y = QuantizeLinear (d, s, z2)"""), "dequantize-quantize", reason="zero points differ", make=InversePairs),
    Case("dq-q-type-differs", g(H13, "(int8[2,3] x) => (uint8[2,3] y)", """
        s = Constant <value = float {0.05}> ()
        z = Constant <value = int8 {0}> ()
        z2 = Constant <value = uint8 {0}> ()
        d = DequantizeLinear (x, s, z)
        y = QuantizeLinear (d, s, z2)"""), "dequantize-quantize", reason="quantized types differ or are unknown",
         make=InversePairs),
    Case("dq-q-axes-differ", g(H13, "(uint8[2,2] x) => (uint8[2,2] y)", """
        s = Constant <value = float[2] {0.5, 0.25}> ()
        z = Constant <value = uint8[2] {1, 2}> ()
        d = DequantizeLinear <axis = 0> (x, s, z)
        y = QuantizeLinear <axis = 1> (d, s, z)"""), "dequantize-quantize", reason="axes differ or rank unknown",
         make=InversePairs),
    Case("dq-q-scale-input", g(H13, "(uint8[2,3] x, float s) => (uint8[2,3] y)", """
        z = Constant <value = uint8 {3}> ()
        d = DequantizeLinear (x, s, z)
        y = QuantizeLinear (d, s, z)"""), "dequantize-quantize", reason="scale is not constant", make=InversePairs,
         ort=False),
    Case("dq-q-tiny-scale", g(H13, "(uint8[2,3] x) => (uint8[2,3] y)", """
        s = Constant <value = float {1e-35}> ()
        d = DequantizeLinear (x, s)
        y = QuantizeLinear (d, s)"""), "dequantize-quantize",
         reason="scale is zero, too small or too large for an exact round trip", make=InversePairs),
    Case("dq-q-lossy-off", g(H13, "(float[2,3] x) => (float[2,3] y)", """
        s = Constant <value = float {0.05}> ()
        z = Constant <value = uint8 {128}> ()
        q = QuantizeLinear (x, s, z)
        y = DequantizeLinear (q, s, z)"""), "quantize-dequantize", make=InversePairs),
    Case("concat-slice-straddles", g(H17, "(float[2,3] a, float[2,4] b) => (float[2,3] y)", """
        c = Concat <axis = 1> (a, b)
        s = Constant <value = int64[1] {2}> ()
        e = Constant <value = int64[1] {5}> ()
        x = Constant <value = int64[1] {1}> ()
        t = Slice (c, s, e, x)\n""" + R), "concat-slice", reason="selects no single concat input",
         make=InversePairs),
    Case("concat-slice-step", g(H17, "(float[2,3] a, float[2,4] b) => (float[2,2] y)", """
        c = Concat <axis = 1> (a, b)
        s = Constant <value = int64[1] {3}> ()
        e = Constant <value = int64[1] {7}> ()
        x = Constant <value = int64[1] {1}> ()
        p = Constant <value = int64[1] {2}> ()
        t = Slice (c, s, e, x, p)\n""" + R), "concat-slice", reason="step is not 1", make=InversePairs),
    Case("concat-slice-other-axis", g(H9, "(float[2,3] a, float[2,4] b) => (float[1,3] y)",
                                      "c = Concat <axis = 1> (a, b)\n"
                                      "t = Slice <starts = [0, 0], ends = [1, 3], axes = [0, 1]> (c)\n" + R),
         "concat-slice", reason="slices another axis", make=InversePairs),
    Case("conv-every-tap", g(H17, "(float[1,2,4,4] x) => (float[1,3,4,4] y)",
                             "t = Conv <pads = [1, 1, 1, 1]> (x, w)\n" + R), "conv-unreached-taps",
         reason="every kernel position reaches the input", inits={"w": np.ones((3, 2, 3, 3), np.float32)}),
    Case("conv-negative-pad", g(H17, "(float[1,2,4,4] x) => (float[1,3,2,2] y)",
                                "t = Conv <pads = [4, 4, 4, 4], dilations = [5, 5]> (x, w)\n" + R),
         "conv-unreached-taps", reason="the padding left would be negative",
         inits={"w": np.ones((3, 2, 3, 3), np.float32)}),
    Case("conv-inf-dropped", g(H17, "(float[1,2,4,4] x) => (float[1,3,4,4] y)",
                               "t = Conv <pads = [4, 4, 4, 4], dilations = [4, 4]> (x, w)\n" + R),
         "conv-unreached-taps", reason="a dropped weight is not finite",
         inits={"w": np.pad(np.ones((3, 2, 1, 1), np.float32), ((0, 0), (0, 0), (1, 1), (1, 1)),
                            constant_values=np.inf)}, ort=False),
    Case("concat-slice-symbolic", g(H17, "(float[2,N] a, float[2,4] b) => (float[2,M] y)", """
        c = Concat <axis = 1> (a, b)
        s = Constant <value = int64[1] {0}> ()
        e = Constant <value = int64[1] {3}> ()
        x = Constant <value = int64[1] {1}> ()
        t = Slice (c, s, e, x)\n""" + R), "concat-slice", reason="concat input sizes unknown", make=InversePairs),
]


@pytest.mark.parametrize("case", NEGATIVE, ids=lambda c: c.id)
def test_rule_refuses(case: Case) -> None:
    model = build(case.text, case.inits)
    before = ops(model)
    p = case.make()
    assert not run_checked(model, p, ort=case.ort)
    assert p.fired[case.rule] == 0
    assert ops(model) == before
    if case.reason is not None:
        assert p.refused[(case.rule, case.reason)] >= 1, p.refused


CASTS = [  # (from, via, fires)
    ("int32", "int64", True), ("float16", "float", True), ("bool", "float", True), ("bool", "int8", True),
    ("uint8", "int16", True), ("float", "double", True), ("uint8", "float16", True), ("int16", "float", True),
    ("float", "float16", False), ("int64", "int32", False), ("float", "int32", False),
    ("int16", "float16", False), ("int8", "uint8", False), ("int64", "double", False),
]


@pytest.mark.parametrize(("a", "via", "fires"), CASTS, ids=[f"{a}-{b}-{a}" for a, b, _ in CASTS])
def test_cast_roundtrip(a: str, via: str, fires: bool) -> None:
    types = {"float": 1, "uint8": 2, "int8": 3, "int16": 5, "int32": 6, "int64": 7, "bool": 9, "float16": 10,
             "double": 11}
    text = g(H17, f"({a}[2,3] x) => ({a}[2,3] y)",
             f"m = Cast <to = {types[via]}> (x)\n y = Cast <to = {types[a]}> (m)")
    model = build(text)
    p = InversePairs()
    assert run_checked(model, p) == fires
    assert p.fired["cast-roundtrip"] == int(fires)
    if fires:
        assert ops(model) == ["Identity"]
        assert not InversePairs()(model)
    else:
        assert p.refused[("cast-roundtrip", f"{ir.DataType(types[via]).name} does not hold every "
                                            f"{ir.DataType(types[a]).name} value")] == 1


def test_holds_exactly_table() -> None:
    D = ir.DataType
    assert holds_exactly(D.INT32, D.INT64) and not holds_exactly(D.INT64, D.INT32)
    assert holds_exactly(D.INT32, D.DOUBLE) and not holds_exactly(D.INT32, D.FLOAT)
    assert holds_exactly(D.BFLOAT16, D.FLOAT) and not holds_exactly(D.FLOAT16, D.BFLOAT16)
    assert not holds_exactly(D.FLOAT, D.INT64) and not holds_exactly(D.INT8, D.BOOL)


def test_quantize_dequantize_only_when_lossy_allowed() -> None:
    text = g(H13, "(float[4,5] x) => (float[4,5] y)", """
        s = Constant <value = float {0.05}> ()
        z = Constant <value = uint8 {128}> ()
        q = QuantizeLinear (x, s, z)
        y = DequantizeLinear (q, s, z)""")
    model = build(text)
    assert not InversePairs()(model)

    def within_half_step(name: str, ref: np.ndarray, got: np.ndarray) -> None:
        # lossy on purpose: the rounding to the 0.05 grid is gone (inputs stay inside the uint8 range)
        assert np.max(np.abs(ref - got)) <= 0.025 + 1e-6

    p = InversePairs(allow_lossy=True)
    assert run_checked(model, p, compare=within_half_step)
    assert p.fired["quantize-dequantize"] == 1
    assert ops(model) == ["Identity"]
    assert not InversePairs(allow_lossy=True)(model)


def test_reshape_reshape_empty_tensor_keeps_allowzero() -> None:
    text = g(H17, "(float[0,6] x) => (float[0,2,3] y)", """
        s = Constant <value = int64[2] {0, 6}> ()
        a = Reshape <allowzero = 1> (x, s)
        z = Constant <value = int64[3] {0, 2, 3}> ()
        t = Reshape (a, z)\n""" + R)
    model = build(text)
    p = InversePairs()
    assert run_checked(model, p)
    assert p.fired["reshape-reshape"] == 1
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    assert reshape.attributes["allowzero"].value == 1


def test_transpose_rank_unknown_refuses() -> None:
    # the Reshape's shape has an unknown length, so the rank of everything after it is unknown
    model = build(g(H17, "(float[2,3] x, int64[K] s) => (float y)", """
        r = Reshape (x, s)
        a = Transpose (r)
        t = Transpose (a)\n""" + R))
    assert model.graph.node(1).inputs[0].shape is None
    p = InversePairs()
    assert not run_checked(model, p, ort=False)
    assert p.refused[("transpose-transpose", "rank unknown")] == 1


# ---------------------------------------------------------------------------------- rule tables


def test_rule_tables_are_listed_and_documented() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(r.doc and r.family in ("no-op", "reshape-chains", "inverse-pairs") for r in RULES)
    assert [r.name for r in RULES if not r.exact] == ["quantize-dequantize"]
    tested = {c.rule for c in POSITIVE} | {"cast-roundtrip", "quantize-dequantize"}
    assert set(names) <= tested


# ---------------------------------------------------------------------------------- light models

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512"]


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT)
def test_light_models_keep_outputs(name: str) -> None:
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    model = infer_shapes(dlcc.load(path))
    x = model.graph.inputs[0]
    feeds = {x.name: np.random.default_rng(0).standard_normal(tuple(x.shape)).astype(np.float32)}
    # onnxruntime's own optimizer would spend seconds folding the ConstantOfShape weights: run it plain
    ref = run_ort(ir.serde.serialize_model(model), feeds, threads=2, optimize=False)
    n_before = model.graph.num_nodes()
    passes = [NoOpElimination(), ReshapeChains(), InversePairs(), CommonSubexpressionElimination(),
              DeadCodeElimination()]
    report = PassManager(passes, ManagerOptions(verify=True)).run(model)
    assert model.graph.num_nodes() <= n_before
    if name in ("bvlc_alexnet", "vgg19", "inception_v1", "squeezenet"):
        assert report.rules_fired["dropout-inference"] >= 1
        assert "Dropout" not in ops(model)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    got = run_ort(after, feeds, threads=2, optimize=False)
    for k in ref:
        d = diff(k, ref[k], got[k], rtol=1e-5, atol=1e-6)
        assert d.ok, d


# ---------------------------------------------------------------------------------- property: view pairs

_KINDS = {"2": (None, 2), "1": (None, 1), "S": ("S", 3), "U": ("U", 1)}  # declared symbol, runtime size


@st.composite
def squeeze_unsqueeze_pairs(draw) -> tuple[str, list[int]]:
    """A random Squeeze/Unsqueeze pair over static and symbolic dims, in opset 9 or 17 form."""
    kinds = draw(st.lists(st.sampled_from(sorted(_KINDS)), min_size=1, max_size=4))
    opset = draw(st.sampled_from([9, 17]))
    decl = [f"{k}{i}" if _KINDS[k][0] else k for i, k in enumerate(kinds)]
    run = [_KINDS[k][1] for k in kinds]
    unit = [k in "1U" for k in kinds]
    body, prev = [], "x"
    for j in range(2):
        if any(unit) and len(unit) > 1 and draw(st.booleans()):  # (a rank-0 result has no shape to declare)
            op = "Squeeze"
            axes = sorted(draw(st.sets(st.sampled_from([i for i, u in enumerate(unit) if u]), min_size=1,
                                       max_size=len(unit) - 1)))
            unit = [u for i, u in enumerate(unit) if i not in axes]
            rank = len(unit) + len(axes)
        else:
            op = "Unsqueeze"
            rank = len(unit) + draw(st.integers(1, 2))
            axes = sorted(draw(st.sets(st.integers(0, rank - 1), min_size=rank - len(unit),
                                       max_size=rank - len(unit))))
            rest = iter(unit)
            unit = [True if i in axes else next(rest) for i in range(rank)]
        if opset > 9:  # negative axes exist from opset 11
            axes = [a - rank if draw(st.booleans()) else a for a in axes]
        text_axes = ", ".join(map(str, axes))
        if opset == 9:
            body.append(f"v{j} = {op} <axes = [{text_axes}]> ({prev})")
        else:
            body.append(f"c{j} = Constant <value = int64[{len(axes)}] {{{text_axes}}}> ()")
            body.append(f"v{j} = {op} ({prev}, c{j})")
        prev = f"v{j}"
    out = ",".join(f"o{i}" for i in range(len(unit)))
    body.append(f"t = Identity ({prev})\n" + R)
    return g(H9 if opset == 9 else H17, f"(float[{','.join(decl)}] x) => (float[{out}] y)", "\n".join(body)), run


@settings(max_examples=25, deadline=None, derandomize=True)
@given(squeeze_unsqueeze_pairs())
def test_squeeze_unsqueeze_pairs_keep_values(case: tuple[str, list[int]]) -> None:
    text, run = case
    feeds = {"x": np.random.default_rng(0).standard_normal(run).astype(np.float32)}
    ref = run_ort(ir.serde.serialize_model(build(text)), feeds)
    for make in (ReshapeChains, InversePairs):
        model = build(text)
        make()(model)
        verify_model(model)
        after = ir.serde.serialize_model(model)
        onnx.checker.check_model(after, full_check=True)
        np.testing.assert_array_equal(run_ort(after, feeds)["y"], ref["y"])
        assert not make()(model)
