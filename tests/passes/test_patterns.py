"""Pattern fusion: primitive LayerNorm/RMSNorm/GELU chains become one op where the opset has it and are
left as they are where it does not."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import dlcc
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.patterns import RULES, PatternFusion
from dlcc.testing.rewrites import run_checked

RTOL = 1e-4  # one fused kernel against a chain of primitives: the rounding differs


def build(text: str, inits: dict[str, np.ndarray] | None = None, opset: int = 17) -> ir.Model:
    graph = onnx.parser.parse_graph(text)
    graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in (inits or {}).items())
    opsets = [helper.make_opsetid("", opset)]
    proto = helper.make_model(graph, opset_imports=opsets)
    proto.ir_version = max(helper.find_min_ir_version_for(opsets), 7)
    onnx.checker.check_model(proto, full_check=True)
    return infer_shapes(dlcc.load(proto))


def run_pass(model: ir.Model, rtol: float = RTOL) -> tuple[PatternFusion, bool]:
    """Run the pass; verify the IR, the ONNX and the outputs against the model before."""
    p = PatternFusion()
    return p, run_checked(model, p, rtol=rtol)


def ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph if n.op_type != "Constant"]


def assert_idempotent(model: ir.Model) -> None:
    assert not PatternFusion()(model)


# ---------------------------------------------------------------------------------------- LayerNorm


def ln_text(opset: int, *, square: str = "pow", divide: str = "div", gamma: str | None = "Mul(n, gamma)",
            beta: str | None = "Add(g, beta)", axes: tuple[int, ...] = (-1,), x: str = "float[2,3,8]",
            axes2: tuple[int, ...] | None = None, extra_out: str = "") -> str:
    def reduce(arg: str, ax: tuple[int, ...], name: str) -> str:
        if opset >= 18:
            vals = ", ".join(map(str, ax))
            return f"{name}_ax = Constant<value = int64[{len(ax)}] {{{vals}}}>()\n{name} = ReduceMean({arg}, {name}_ax)"
        return f"{name} = ReduceMean<axes=[{', '.join(map(str, ax))}]>({arg})"

    lines = [reduce("x", axes, "mean"), "d = Sub(x, mean)"]
    lines.append("two = Constant<value = float {2.0}>()\nsq = Pow(d, two)" if square == "pow" else "sq = Mul(d, d)")
    lines += [reduce("sq", axes2 or axes, "var"), "eps = Constant<value = float {1e-5}>()",
              "ve = Add(var, eps)", "std = Sqrt(ve)"]
    lines.append("n = Div(d, std)" if divide == "div" else "r = Reciprocal(std)\nn = Mul(d, r)")
    last = "n"
    if gamma:
        lines.append(f"g = {gamma}")
        last = "g"
    if beta:
        lines.append(f"y = {beta}")
    else:
        lines.append(f"y = Identity({last})")
    body = "\n".join(lines)
    return f"g ({x} x) => (float[a,b,c] y{extra_out}) {{\n{body}\n}}"


def ln_params(rng: np.random.Generator, shape: tuple[int, ...] = (8,)) -> dict[str, np.ndarray]:
    return {"gamma": rng.uniform(0.5, 1.5, shape).astype(np.float32),
            "beta": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("square,divide", [("pow", "div"), ("mul", "recip"), ("mul", "div")])
def test_layernorm_forms(opset: int, square: str, divide: str) -> None:
    rng = np.random.default_rng(0)
    model = build(ln_text(opset, square=square, divide=divide), ln_params(rng), opset)
    p, changed = run_pass(model)
    assert changed and p.fired["layernorm"] == 1
    assert ops(model) == ["LayerNormalization"]
    ln = next(n for n in model.graph if n.op_type == "LayerNormalization")
    assert ln.attributes["axis"].value == 2
    assert abs(ln.attributes["epsilon"].value - 1e-5) < 1e-10
    assert [v.name for v in model.graph.outputs] == ["y"]
    assert_idempotent(model)


@pytest.mark.parametrize("gamma,beta", [
    ("Mul(gamma, n)", "Add(beta, g)"),
    ("Mul(n, gamma)", None),
    (None, "Add(n, beta)"),
    (None, None),
])
def test_layernorm_optional_and_commuted_affine(gamma: str | None, beta: str | None) -> None:
    rng = np.random.default_rng(1)
    params = ln_params(rng)
    inits = {k: v for k, v in params.items() if (k == "gamma" and gamma) or (k == "beta" and beta)}
    model = build(ln_text(17, gamma=gamma, beta=beta), inits)
    p, _ = run_pass(model)
    assert p.fired["layernorm"] == 1
    assert ops(model) == ["LayerNormalization"] + ([] if beta else ["Identity"])
    assert_idempotent(model)


def test_layernorm_two_trailing_axes_and_broadcast_gamma() -> None:
    rng = np.random.default_rng(2)
    inits = {"gamma": rng.uniform(0.5, 1.5, (1, 4, 1)).astype(np.float32),
             "beta": rng.standard_normal((5,)).astype(np.float32)}
    model = build(ln_text(18, axes=(1, 2), x="float[3,4,5]"), inits, 18)
    p, _ = run_pass(model)
    assert p.fired["layernorm"] == 1
    ln = next(n for n in model.graph if n.op_type == "LayerNormalization")
    assert ln.attributes["axis"].value == 1
    assert ln.inputs[1].const_value.shape == ir.Shape([4, 5])


def test_layernorm_refuses_non_trailing_axes() -> None:
    model = build(ln_text(17, axes=(1,), x="float[2,3,8]", gamma=None, beta=None))
    p = PatternFusion()
    p(model)
    assert p.fired["layernorm"] == 0
    assert ("layernorm", "the reduced axes are not the trailing axes") in p.refused


def test_layernorm_refuses_different_axes() -> None:
    model = build(ln_text(17, axes=(-1,), axes2=(-2, -1), gamma=None, beta=None))
    p = PatternFusion()
    p(model)
    assert ("layernorm", "ReduceMean axes differ, are unknown or keepdims=0") in p.refused


def test_layernorm_refuses_gamma_varying_over_leading_axes() -> None:
    rng = np.random.default_rng(3)
    inits = {"gamma": rng.uniform(0.5, 1.5, (3, 8)).astype(np.float32), "beta": np.zeros(8, np.float32)}
    model = build(ln_text(17), inits)
    p = PatternFusion()
    p(model)
    assert p.fired["layernorm"] == 0
    assert ("layernorm", "gamma does not broadcast like the normalization's parameter") in p.refused


def test_layernorm_refuses_shared_intermediate() -> None:
    text = ln_text(17, gamma=None, beta=None, extra_out=", float[a,b,c] mean")
    model = build(text)
    p = PatternFusion()
    p(model)
    assert ("layernorm", "an intermediate value has other uses") in p.refused
    assert "LayerNormalization" not in ops(model)


def test_layernorm_refuses_other_exponent() -> None:
    model = build(ln_text(17, gamma=None, beta=None).replace("float {2.0}", "float {3.0}"))
    p = PatternFusion()
    p(model)
    assert p.fired["layernorm"] == 0


def test_layernorm_below_opset17_is_left_alone() -> None:
    rng = np.random.default_rng(4)
    model = build(ln_text(13), ln_params(rng), 13)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert not changed and ops(model) == before and not p.fired


# ---------------------------------------------------------------------------------------- RMSNorm


def rms_text(*, square: str = "pow", divide: str = "recip", gamma: str | None = "Mul(n, gamma)",
             opset: int = 23, axes: tuple[int, ...] = (-1,), extra_out: str = "") -> str:
    sq = "two = Constant<value = float {2.0}>()\nsq = Pow(x, two)" if square == "pow" else "sq = Mul(x, x)"
    if opset >= 18:
        vals = ", ".join(map(str, axes))
        red = f"ax = Constant<value = int64[{len(axes)}] {{{vals}}}>()\nms = ReduceMean(sq, ax)"
    else:
        red = f"ms = ReduceMean<axes=[{', '.join(map(str, axes))}]>(sq)"
    norm = "r = Reciprocal(std)\nn = Mul(x, r)" if divide == "recip" else "n = Div(x, std)"
    tail = f"y = {gamma}" if gamma else "y = Identity(n)"
    return f"""g (float[2,3,8] x) => (float[a,b,c] y{extra_out}) {{
        {sq}
        {red}
        eps = Constant<value = float {{1e-6}}>()
        ve = Add(ms, eps)
        std = Sqrt(ve)
        {norm}
        {tail}
    }}"""


@pytest.mark.parametrize("square,divide,gamma", [
    ("pow", "recip", "Mul(n, gamma)"), ("mul", "div", "Mul(gamma, n)"), ("pow", "div", None),
])
def test_rmsnorm_opset23_becomes_rmsnormalization(square: str, divide: str, gamma: str | None) -> None:
    rng = np.random.default_rng(5)
    inits = {"gamma": rng.uniform(0.5, 1.5, 8).astype(np.float32)} if gamma else {}
    model = build(rms_text(square=square, divide=divide, gamma=gamma), inits, 23)
    p, _ = run_pass(model)
    assert p.fired["rmsnorm"] == 1
    assert "RMSNormalization" in ops(model) and "ReduceMean" not in ops(model)
    assert_idempotent(model)


def test_rmsnorm_below_opset23_is_left_alone() -> None:
    rng = np.random.default_rng(6)
    model = build(rms_text(opset=18), {"gamma": rng.uniform(0.5, 1.5, 8).astype(np.float32)}, 18)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert not changed and ops(model) == before and not p.fired


def test_rmsnorm_refuses_non_trailing_axes_and_shared_values() -> None:
    model = build(rms_text(gamma=None, axes=(1,)), {}, 23)
    p = PatternFusion()
    p(model)
    assert ("rmsnorm", "the reduced axes are not the trailing axes") in p.refused

    model = build(rms_text(gamma=None, extra_out=", float[a,b,c] std"), {}, 23)
    p = PatternFusion()
    p(model)
    assert ("rmsnorm", "an intermediate value has other uses") in p.refused
    assert "RMSNormalization" not in ops(model)


def test_layernorm_is_not_mistaken_for_rmsnorm() -> None:
    rng = np.random.default_rng(7)
    model = build(ln_text(23), ln_params(rng), 23)
    p, _ = run_pass(model)
    assert p.fired == Counter({"layernorm": 1})


# ---------------------------------------------------------------------------------------- GELU

ERF_PRODUCTS = [
    "h = Mul(x, half)\ny = Mul(h, p)",
    "h = Mul(half, x)\ny = Mul(p, h)",
    "h = Mul(p, half)\ny = Mul(x, h)",
    "h = Mul(x, p)\ny = Mul(h, half)",
    "h = Mul(p, x)\ny = Mul(half, h)",
    "h = Div(x, two)\ny = Mul(h, p)",
]
ERF_ARGS = [
    "s2 = Constant<value = float {1.4142135}>()\nu = Div(x, s2)",
    "s2 = Constant<value = float {1.4142}>()\nu = Div(x, s2)",
    "s2 = Constant<value = float {0.7071}>()\nu = Mul(x, s2)",
    "s2 = Constant<value = float {0.70710677}>()\nu = Mul(s2, x)",
]


def gelu_erf_text(product: str = ERF_PRODUCTS[0], arg: str = ERF_ARGS[0], half: str = "0.5",
                  extra_out: str = "") -> str:
    return f"""g (float[2,16] x) => (float[a,b] y{extra_out}) {{
        {arg}
        e = Erf(u)
        one = Constant<value = float {{1.0}}>()
        p = Add(e, one)
        half = Constant<value = float {{{half}}}>()
        two = Constant<value = float {{2.0}}>()
        {product}
    }}"""


@pytest.mark.parametrize("product", ERF_PRODUCTS)
def test_gelu_erf_any_product_order(product: str) -> None:
    model = build(gelu_erf_text(product), opset=20)
    p, _ = run_pass(model)
    assert p.fired["gelu"] == 1 and ops(model) == ["Gelu"]
    assert "approximate" not in model.graph.node(len(model.graph) - 1).attributes
    assert_idempotent(model)


@pytest.mark.parametrize("arg", ERF_ARGS)
def test_gelu_erf_argument_forms(arg: str) -> None:
    model = build(gelu_erf_text(arg=arg), opset=20)
    p, _ = run_pass(model)
    assert p.fired["gelu"] == 1 and ops(model) == ["Gelu"]


CUBES = [
    "three = Constant<value = float {3.0}>()\ncube = Pow(x, three)",
    "xx = Mul(x, x)\ncube = Mul(xx, x)",
    "xx = Mul(x, x)\ncube = Mul(x, xx)",
]


def gelu_tanh_text(cube: str = CUBES[0], k: str = "0.044715", c: str = "0.7978846") -> str:
    return f"""g (float[2,16] x) => (float[a,b] y) {{
        {cube}
        k = Constant<value = float {{{k}}}>()
        kc = Mul(k, cube)
        s = Add(x, kc)
        c = Constant<value = float {{{c}}}>()
        u = Mul(s, c)
        t = Tanh(u)
        one = Constant<value = float {{1.0}}>()
        p = Add(one, t)
        half = Constant<value = float {{0.5}}>()
        h = Mul(half, x)
        y = Mul(h, p)
    }}"""


@pytest.mark.parametrize("cube", CUBES)
def test_gelu_tanh_forms(cube: str) -> None:
    model = build(gelu_tanh_text(cube), opset=20)
    p, _ = run_pass(model)
    assert p.fired["gelu"] == 1 and ops(model) == ["Gelu"]
    assert model.graph.node(len(model.graph) - 1).attributes["approximate"].value == "tanh"
    assert_idempotent(model)


@pytest.mark.parametrize("text", [
    gelu_erf_text(half="0.6"),
    gelu_erf_text(arg="s2 = Constant<value = float {1.5}>()\nu = Div(x, s2)"),
    gelu_tanh_text(k="0.05"),
    gelu_tanh_text(c="0.8"),
    gelu_erf_text(arg="s2 = Constant<value = float {1.4142135}>()\nu = Div(s2, x)"),
])
def test_gelu_wrong_constants_or_shape_do_not_match(text: str) -> None:
    model = build(text, opset=20)
    before = ops(model)
    p = PatternFusion()
    assert not p(model)
    assert ops(model) == before and not p.refused


def test_gelu_refuses_shared_intermediate() -> None:
    model = build(gelu_erf_text(extra_out=", float[a,b] e"), opset=20)
    p = PatternFusion()
    assert not p(model)
    assert ("gelu", "an intermediate value has other uses") in p.refused


def test_gelu_inner_and_outer_x_must_be_the_same_value() -> None:
    text = gelu_erf_text().replace("g (float[2,16] x)", "g (float[2,16] x, float[2,16] z)").replace(
        "u = Div(x, s2)", "u = Div(z, s2)")
    model = build(text, opset=20)
    assert not PatternFusion()(model)


@pytest.mark.parametrize("text", [gelu_erf_text(), gelu_tanh_text(CUBES[1])], ids=["erf", "tanh"])
def test_gelu_below_opset20_is_left_alone(text: str) -> None:
    model = build(text, opset=17)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert not changed and ops(model) == before and not p.fired


def test_rule_tables_are_documented() -> None:
    for r in RULES:
        assert r.doc and r.family
    assert {r.name for r in RULES} == {"layernorm", "rmsnorm", "gelu"}
    assert {r.min_opset for r in RULES} == {17, 20, 23}
