"""Pattern fusion: primitive LayerNorm/RMSNorm/GELU chains become one op where the opset has it and are
annotated where it does not; Conv/Gemm/MatMul epilogues are recorded without touching the graph."""

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
from dlcc.passes.patterns import ANNOTATIONS, EPILOGUE, PATTERN, RULES, PatternFusion
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


def node_writing(model: ir.Model, name: str) -> ir.Node:
    return next(n for n in model.graph if any(o.name == name for o in n.outputs))


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


def test_layernorm_below_opset17_is_annotated_only() -> None:
    rng = np.random.default_rng(4)
    model = build(ln_text(13), ln_params(rng), 13)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert changed and ops(model) == before and p.fired["layernorm-annotate"] == 1
    final = node_writing(model, "y")
    assert final.meta[PATTERN] == "layernorm"
    assert final.meta["input"] == "x" and final.meta["axis"] == 2
    assert final.meta["scale"] == "gamma" and final.meta["bias"] == "beta"
    assert_idempotent(model)


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


def test_rmsnorm_below_opset23_is_annotated_only() -> None:
    rng = np.random.default_rng(6)
    model = build(rms_text(opset=18), {"gamma": rng.uniform(0.5, 1.5, 8).astype(np.float32)}, 18)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert changed and ops(model) == before and p.fired["rmsnorm-annotate"] == 1
    final = node_writing(model, "y")
    assert final.meta[PATTERN] == "rmsnorm"
    assert final.meta["input"] == "x" and final.meta["scale"] == "gamma" and final.meta["axis"] == 2
    assert abs(final.meta["epsilon"] - 1e-6) < 1e-12
    assert_idempotent(model)


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
    model = build(ln_text(13), ln_params(rng), 13)
    p = PatternFusion()
    p(model)
    assert p.fired == Counter({"layernorm-annotate": 1})


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


@pytest.mark.parametrize("text,approx", [(gelu_erf_text(), "none"), (gelu_tanh_text(CUBES[1]), "tanh")])
def test_gelu_below_opset20_is_annotated_only(text: str, approx: str) -> None:
    model = build(text, opset=17)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert changed and ops(model) == before and p.fired["gelu-annotate"] == 1
    final = node_writing(model, "y")
    assert final.meta[PATTERN] == "gelu"
    assert final.meta["approximate"] == approx and final.meta["input"] == "x"
    assert_idempotent(model)


# ---------------------------------------------------------------------------------------- epilogues


def conv_text(tail: str, inputs: str = "float[1,3,6,6] x", extra_out: str = "") -> str:
    return f"""g ({inputs}) => (float[a,b,c,d] y{extra_out}) {{
        c = Conv<pads=[1,1,1,1]>(x, w, cb)
        {tail}
    }}"""


def conv_inits(rng: np.random.Generator, **extra: np.ndarray) -> dict[str, np.ndarray]:
    return {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
            "cb": rng.standard_normal(4).astype(np.float32), **extra}


ACTIVATIONS = [
    ("y = Relu(c)", 13, {"op": "Relu"}),
    ("y = LeakyRelu<alpha=0.2>(c)", 13, {"op": "LeakyRelu", "alpha": pytest.approx(0.2)}),
    ("y = Sigmoid(c)", 13, {"op": "Sigmoid"}),
    ("y = HardSigmoid(c)", 13, {"op": "HardSigmoid", "alpha": pytest.approx(0.2), "beta": 0.5}),
    ("y = HardSwish(c)", 14, {"op": "HardSwish"}),
    ("y = Tanh(c)", 13, {"op": "Tanh"}),
    ("y = Clip<min=0.0, max=6.0>(c)", 9, {"op": "Clip", "min": 0.0, "max": 6.0}),
    ("lo = Constant<value = float {0.0}>()\nhi = Constant<value = float {6.0}>()\ny = Clip(c, lo, hi)", 13,
     {"op": "Clip", "min": 0.0, "max": 6.0}),
    ("hi = Constant<value = float {6.0}>()\ny = Clip(c, , hi)", 13, {"op": "Clip", "min": -np.inf, "max": 6.0}),
    ("y = Gelu<approximate=\"tanh\">(c)", 20, {"op": "Gelu", "approximate": "tanh"}),
    ("s = Sigmoid(c)\ny = Mul(c, s)", 13, {"op": "Silu"}),
    ("bt = Constant<value = float {1.702}>()\nb = Mul(bt, c)\ns = Sigmoid(b)\ny = Mul(s, c)", 13,
     {"op": "Swish", "alpha": pytest.approx(1.702)}),
]


@pytest.mark.parametrize("tail,opset,entry", ACTIVATIONS, ids=[a[2]["op"] + str(a[1]) for a in ACTIVATIONS])
def test_conv_activation_epilogue(tail: str, opset: int, entry: dict) -> None:
    model = build(conv_text(tail), conv_inits(np.random.default_rng(8)), opset)
    before = ops(model)
    p, changed = run_pass(model, rtol=0)
    assert changed and ops(model) == before and p.fired["epilogue"] == 1
    conv = model.graph.node(0)
    assert conv.meta[EPILOGUE] == [{**entry, "output": "y"}]
    assert_idempotent(model)


def test_bias_activation_residual_chain_in_order() -> None:
    rng = np.random.default_rng(9)
    model = build(conv_text("a = Add(c, k)\nr = Add(a, z)\ny = Relu(r)",
                            inputs="float[1,3,6,6] x, float[1,4,6,6] z"),
                  conv_inits(rng, k=rng.standard_normal((4, 1, 1)).astype(np.float32)))
    run_pass(model, rtol=0)
    chain = model.graph.node(0).meta[EPILOGUE]
    assert chain == [{"op": "Add", "input": "k", "role": "bias", "output": "a"},
                     {"op": "Add", "input": "z", "role": "residual", "output": "r"},
                     {"op": "Relu", "output": "y"}]
    assert_idempotent(model)


def test_activation_then_residual_gemm_and_matmul() -> None:
    rng = np.random.default_rng(10)
    model = build("""g (float[3,4] x, float[3,5] z, float[2,3,4] x3) => (float[3,5] y, float[2,3,5] y3) {
        g = Gemm(x, w)
        r = Relu(g)
        y = Add(z, r)
        m = MatMul(x3, w)
        s = Sigmoid(m)
        y3 = Mul(s, m)
    }""", {"w": rng.standard_normal((4, 5)).astype(np.float32)})
    run_pass(model, rtol=0)
    gemm = node_writing(model, "g")
    assert gemm.meta[EPILOGUE] == [{"op": "Relu", "output": "r"},
                                   {"op": "Add", "input": "z", "role": "residual", "output": "y"}]
    assert node_writing(model, "m").meta[EPILOGUE] == [{"op": "Silu", "output": "y3"}]


@pytest.mark.parametrize("tail,inputs,extra_out", [
    ("r = Relu(c)\ny = Add(r, c)", "float[1,3,6,6] x", ""),  # two uses of the conv output
    ("y = Relu(c)", "float[1,3,6,6] x", ", float[a,b,c,d] c"),  # the conv output is a graph output
    ("y = Clip(c, lo)", "float[1,3,6,6] x, float lo", ""),  # a bound that is not a constant
    ("y = Add(c, z)", "float[1,3,6,6] x, float[2,4,6,6] z", ""),  # broadcasting changes the shape
    ("y = Softmax(c)", "float[1,3,6,6] x", ""),  # not an epilogue op
])
def test_no_epilogue(tail: str, inputs: str, extra_out: str) -> None:
    model = build(conv_text(tail, inputs, extra_out), conv_inits(np.random.default_rng(11)))
    p = PatternFusion()
    assert not p(model)
    assert EPILOGUE not in model.graph.node(0).meta


def test_stale_epilogue_is_replaced() -> None:
    model = build(conv_text("y = Relu(c)"), conv_inits(np.random.default_rng(12)))
    conv = model.graph.node(0)
    conv.meta[EPILOGUE] = [{"op": "Tanh", "output": "gone"}]
    assert PatternFusion()(model)
    assert conv.meta[EPILOGUE] == [{"op": "Relu", "output": "y"}]
    model = build(conv_text("y = Softmax(c)"), conv_inits(np.random.default_rng(12)))
    conv = model.graph.node(0)
    conv.meta[EPILOGUE] = [{"op": "Relu", "output": "y"}]
    assert PatternFusion()(model)
    assert EPILOGUE not in conv.meta
    assert_idempotent(model)


def test_rule_tables_are_documented() -> None:
    for r in [*RULES, *ANNOTATIONS]:
        assert r.doc and r.family
    assert {r.name for r in RULES} == {"layernorm", "rmsnorm", "gelu"}
    assert {r.min_opset for r in RULES} == {17, 20, 23}


@pytest.mark.parametrize("join", ["Add", "Sum"])
def test_residual_between_two_producers_is_recorded_once(join: str) -> None:
    # projection shortcut: both Add operands come out of Convs; if both recorded it, each fused kernel
    # would wait for the other
    rng = np.random.default_rng(13)
    model = build(f"""g (float[1,3,6,6] x) => (float[1,4,6,6] y) {{
        a = Conv<pads=[1,1,1,1]>(x, w, cb)
        ra = Relu(a)
        b = Conv(x, w1)
        s = {join}(b, ra)
        y = Relu(s)
    }}""", conv_inits(rng, w1=rng.standard_normal((4, 3, 1, 1)).astype(np.float32)))
    run_pass(model, rtol=0)
    assert node_writing(model, "a").meta[EPILOGUE] == [{"op": "Relu", "output": "ra"}]
    assert node_writing(model, "b").meta[EPILOGUE] == [
        {"op": "Add", "input": "ra", "role": "residual", "output": "s"}, {"op": "Relu", "output": "y"}]
    assert_idempotent(model)
