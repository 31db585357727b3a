"""Constant folding (fold) and constant parameters (params): what folds, what must not, the size guard;
which parameter inputs move into attributes."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
from dlcc.check import diff, random_inputs, run_ort
from dlcc.frontend.shapes import infer_shapes, set_input_shapes
from dlcc.passes.fold import MAX_BYTES, MAX_GROWTH, SMALL_BYTES, ConstantFolding, ConstantParams
from dlcc.passes.verify import verify_model

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"


def _proto(text: str, **inits: np.ndarray) -> onnx.ModelProto:
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items())
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _model(proto: onnx.ModelProto) -> ir.Model:
    return infer_shapes(dlcc.load(proto))


def _fold(model: ir.Model, **kw) -> ConstantFolding:
    p = ConstantFolding(**kw)
    p(model)
    verify_model(model, where="after fold")
    return p


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


def _same_outputs(before: onnx.ModelProto, model: ir.Model, feeds=None, rtol: float = 1e-4) -> None:
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    feeds = feeds if feeds is not None else random_inputs(before, seed=0)
    ref, got = run_ort(before, feeds), run_ort(after, feeds)
    assert list(ref) == list(got)  # same outputs, same names, same order
    for name in ref:
        assert ref[name].dtype == got[name].dtype
        d = diff(name, ref[name], got[name], rtol=rtol, atol=1e-6)
        assert d.ok, d


def _idempotent(model: ir.Model, **kw) -> None:
    assert not ConstantFolding(**kw)(model)


# ------------------------------------------------------------------------------------ rule 1: fold

CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y, float16[2,3] r) {
    one = Constant <value = float[3] {1.0, -2.0, 0.5}> ()
    t = Transpose <perm = [1, 0]> (w)
    a = Add(t, one)
    b = Abs(a)
    s = Sqrt(b)
    n = Neg(s)
    e = Exp(n)
    r = Cast <to = 10> (e)
    rf = Cast <to = 1> (r)
    y = Mul(x, rf)
}
"""


def test_constant_chain_folds_to_one_initializer_with_onnxruntime_value() -> None:
    w = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    proto = _proto(CHAIN, w=w)
    model = _model(proto)
    p = _fold(model)
    assert p.fired["lift-constant"] == 1 and p.fired["fold:Exp"] == 1 and not p.failures
    assert _ops(model) == ["Mul"]
    r = model.graph.initializers["r"]  # the folded graph output keeps its name and dtype
    assert r.is_graph_output() and r.dtype == ir.DataType.FLOAT16
    assert [v.name for v in model.graph.outputs] == ["y", "r"]
    assert set(model.graph.initializers) == {"r", "rf"}  # w and the intermediates are gone
    ort_r = run_ort(proto, random_inputs(proto, seed=0))["r"]
    np.testing.assert_array_equal(r.const_value.numpy(), ort_r)
    _same_outputs(proto, model)
    _idempotent(model)


def test_node_with_a_non_constant_input_is_not_folded() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) {
        y = Add(x, c)
    }""", c=np.ones((2, 3), np.float32))
    model = _model(proto)
    assert not ConstantFolding()(model)
    assert _ops(model) == ["Add"]


def test_overridable_initializer_is_not_a_constant() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x, float[3] c) => (float[2,3] y) {
        n = Neg(c)
        y = Add(x, n)
    }""", c=np.ones(3, np.float32))
    model = infer_shapes(dlcc.load(proto, keep_initializer_inputs=True))
    assert not ConstantFolding()(model)
    assert _ops(model) == ["Neg", "Add"]


def test_random_ops_and_their_users_are_never_folded() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) {
        r = RandomNormal <shape = [2, 3], seed = 1.0> ()
        a = Add(r, c)
        u = RandomUniformLike <seed = 2.0> (c)
        b = Mul(a, u)
        y = Add(x, b)
    }""", c=np.ones((2, 3), np.float32))
    model = _model(proto)
    assert not ConstantFolding()(model)
    assert _ops(model) == ["RandomNormal", "Add", "RandomUniformLike", "Mul", "Add"]


def test_dropout_is_left_to_its_own_pass() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3] x) => (float[3] y) {
        d = Dropout(c)
        y = Add(x, d)
    }""", c=np.ones(3, np.float32))
    model = _model(proto)
    assert not ConstantFolding()(model)
    assert _ops(model) == ["Dropout", "Add"]


def test_multi_output_folds_and_control_flow_does_not() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2] x, bool cond) => (float[2] y, float[2] z) {
        c = Constant <value = float[4] {1.0, 2.0, 3.0, 4.0}> ()
        lo, hi = Split <num_outputs = 2> (c)
        y = Add(x, lo)
        z = If (cond) <
            then_branch = t () => (float[2] o) { o = Mul(x, hi) },
            else_branch = e () => (float[2] o) { k = Constant <value = float[2] {5.0, 6.0}> ()
                                                 o = Add(k, hi) }
        >
    }""")
    model = _model(proto)
    p = _fold(model)
    assert p.fired == {"lift-constant": 1, "fold:Split": 1}
    assert _ops(model) == ["Add", "If"]  # the If reads the folded 'hi' from its branches; it stays
    assert model.graph.initializers["hi"].const_value.numpy().tolist() == [3.0, 4.0]
    for cond in (True, False):
        _same_outputs(proto, model, {"x": np.array([1.0, -1.0], np.float32), "cond": np.array(cond)})
    _idempotent(model)


def test_failed_evaluation_leaves_the_node_and_is_counted() -> None:
    # a Reshape whose constant shape does not fit its constant data: built in IR (the checker would not
    # look at values, but shape inference would refuse it)
    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[4] y) {
        c = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
        s = Constant <value = int64[1] {4}> ()
        r = Reshape(c, s)
        y = Add(x, r)
    }""")
    p = _fold(model)
    assert p.fired["fold-failed:Reshape"] == 1 and len(p.failures) == 1
    assert _ops(model) == ["Reshape", "Add"]
    assert not ConstantFolding()(model)  # still there, still not foldable, no change


# ------------------------------------------------------------------------------- rule 2: size guard

def _generator_model(consumer: str, dims: tuple[int, ...]) -> onnx.ModelProto:
    """g = ConstantOfShape(dims) of 0.5, then ``consumer`` lines that read g and x."""
    shape = ",".join(map(str, dims))
    return _proto(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[{shape}] x) => (float[{shape}] y) {{
        g = ConstantOfShape <value = float[1] {{0.5}}> (dims)
        {consumer}
    }}""", dims=np.array(dims, np.int64), two=np.float32(2.0))


def test_small_generator_is_folded() -> None:
    proto = _generator_model("y = Add(x, g)", (2, 3))
    model = _model(proto)
    p = _fold(model)
    assert _ops(model) == ["Add"] and p.materialized == {"g": 24}
    _same_outputs(proto, model)
    _idempotent(model)


def test_big_generator_with_two_uses_stays() -> None:
    proto = _generator_model("a = Add(x, g)\n y = Mul(a, g)", (64, 64))  # 16 KiB from 16 bytes
    model = _model(proto)
    p = _fold(model)
    assert _ops(model) == ["ConstantOfShape", "Add", "Mul"]
    assert p.kept["ConstantOfShape"] == 1 and p.materialized == {}
    _idempotent(model)


def test_big_generator_is_folded_into_its_single_foldable_consumer() -> None:
    proto = _generator_model("h = Mul(g, two)\n y = Add(x, h)", (64, 64))
    model = _model(proto)
    p = _fold(model)
    assert _ops(model) == ["Add"]
    assert p.materialized == {"h": 64 * 64 * 4}  # the consumer's result; g never on its own
    np.testing.assert_array_equal(model.graph.initializers["h"].const_value.numpy(), 1.0)
    _same_outputs(proto, model)
    _idempotent(model)


def test_generator_above_the_threshold_folds_into_a_consumer_that_shrinks_it() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1024] x) => (float[1024] y) {
        g = ConstantOfShape <value = float[1] {0.5}> (dims)
        s = ReduceSum <keepdims = 0> (g, axes)
        y = Add(x, s)
    }""", dims=np.array([512, 1024], np.int64), axes=np.array([0], np.int64))
    model = _model(proto)
    p = _fold(model)  # g (2 MiB) is evaluated on the fly, only the 4 KiB sum is kept
    assert _ops(model) == ["Add"] and p.materialized == {"s": 4096}
    _same_outputs(proto, model)


def test_threshold_and_growth_flags_change_the_decision() -> None:
    text = "h = Mul(g, two)\n y = Add(x, h)"
    model = _model(_generator_model(text, (64, 64)))
    p = _fold(model, max_bytes=8 * 1024)  # 16 KiB result: above the threshold, so it stays
    assert _ops(model) == ["ConstantOfShape", "Mul", "Add"] and p.kept == {"ConstantOfShape": 1, "Mul": 1}
    _idempotent(model, max_bytes=8 * 1024)
    p = _fold(model, max_bytes=8 * 1024, max_growth=10_000)  # not "far larger" any more: folds
    assert _ops(model) == ["Add"]
    # a generator read by a non-foldable node is materialized only up to the threshold
    for max_bytes, expected in ((MAX_BYTES, ["Add"]), (0, ["ConstantOfShape", "Add"])):
        model = _model(_generator_model("y = Add(x, g)", (64, 64)))
        _fold(model, max_bytes=max_bytes)
        assert _ops(model) == expected
    assert MAX_GROWTH == 16 and MAX_BYTES == 1 << 20


def _saved_size(model: ir.Model) -> int:
    return len(ir.serde.serialize_model(model).SerializeToString())


@pytest.mark.parametrize("name", ["vgg19", "resnet50"])
def test_light_model_grows_only_by_the_tensors_it_needed(name: str) -> None:
    # weights are ConstantOfShape(shape) of 0.02: vgg19 would be 548 MB and resnet50 98 MB if folded
    proto = onnx.load(LIGHT / f"light_{name}.onnx")
    growth = {}
    for max_bytes in (MAX_BYTES, 0):
        model = _model(proto)
        baseline = _saved_size(model)  # what saving without folding writes (file + inferred shapes)
        p = _fold(model, max_bytes=max_bytes)
        assert not p.failures
        kept = [n for n in model.graph if n.op_type == "ConstantOfShape"]
        assert all(np.prod(n.inputs[0].const_value.numpy()) * 4 > max(max_bytes, SMALL_BYTES) for n in kept)
        assert all(nbytes <= max(max_bytes, SMALL_BYTES) for nbytes in p.materialized.values())
        overhead = 100 * len(p.materialized)  # name, dims and tags of each new tensor
        assert _saved_size(model) <= baseline + sum(p.materialized.values()) + overhead
        _idempotent(model, max_bytes=max_bytes)
        growth[max_bytes] = (_saved_size(model) - baseline, len(kept))
    if name == "vgg19":
        # default: the generated tensors <= 1 MiB (conv1_1..conv2_2 weights, biases) are materialized,
        # the 15 weights above it (547 MB) stay generators; threshold 0: only biases <= 1 KiB fold
        assert growth[MAX_BYTES][0] < 1_200_000 and growth[MAX_BYTES][1] == 15
        assert growth[0][0] < 8 * 1024


# ---------------------------------------------------------------------------- rule 3: shape arithmetic

SHAPE_CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[{batch},3,4,4] x) => (float[{batch},48] y) {{
    s = Shape(x)
    zero = Constant <value = int64 {{0}}> ()
    n = Gather(s, zero)
    n1 = Unsqueeze(n, axes)
    c = Concat <axis = 0> (n1, rest)
    y = Reshape(x, c)
}}
"""


def _shape_chain(batch: str) -> onnx.ModelProto:
    return _proto(SHAPE_CHAIN.format(batch=batch), axes=np.array([0], np.int64), rest=np.array([48], np.int64))


def test_shape_chain_on_a_static_input_folds_into_a_constant_reshape_shape() -> None:
    proto = _shape_chain("2")
    model = _model(proto)
    p = _fold(model)
    assert p.fired["fold-shape"] == 1
    assert _ops(model) == ["Reshape"]  # x is not constant: the Reshape stays, with a constant shape
    shape = model.graph.node(0).inputs[1]
    assert shape.is_initializer() and shape.const_value.numpy().tolist() == [2, 48]
    _same_outputs(proto, model)
    _idempotent(model)


def test_partially_symbolic_shape_folds_only_its_static_part() -> None:
    proto = _proto("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N,3,5,7] x) => (int64 d1, int64 d0, int64[3] tail, int64[2] head, int64[2] part, int64 n) {
        s = Shape(x)
        d1 = Gather(s, one)
        d0 = Gather(s, zero)
        tail = Slice(s, one1, four)
        head = Slice(s, zero1, two)
        part = Shape <start = 2> (x)
        n = Size(x)
    }""", one=np.int64(1), zero=np.int64(0), one1=np.array([1], np.int64), four=np.array([4], np.int64),
                   zero1=np.array([0], np.int64), two=np.array([2], np.int64))
    model = _model(proto)
    p = _fold(model)
    assert p.fired["fold-shape-element"] == 2 and p.fired["fold-shape"] == 1
    assert _ops(model) == ["Shape", "Gather", "Slice", "Size"]  # what reads the symbolic N stays
    values = {k: model.graph.initializers[k].const_value.numpy().tolist() for k in ("d1", "tail", "part")}
    assert values == {"d1": 3, "tail": [3, 5, 7], "part": [5, 7]}
    feeds = {"x": np.zeros((2, 3, 5, 7), np.float32)}
    _same_outputs(proto, model, feeds)
    _idempotent(model)


def test_exported_style_symbolic_batch_folds_once_the_input_shape_is_fixed() -> None:
    proto = _shape_chain("N")
    model = _model(proto)
    p = _fold(model)
    assert p.fired == {"lift-constant": 1}  # only the Constant: the batch is unknown
    assert _ops(model) == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    set_input_shapes(model, {"x": [2, 3, 4, 4]})
    infer_shapes(model)
    _fold(model)
    assert _ops(model) == ["Reshape"]
    assert model.graph.node(0).inputs[1].const_value.numpy().tolist() == [2, 48]
    _same_outputs(proto, model, {"x": np.random.default_rng(1).standard_normal((2, 3, 4, 4), np.float32)})
    _idempotent(model)


# ---------------------------------------------------------------------------------- light models

@pytest.mark.parametrize("name", ["bvlc_alexnet", "squeezenet"])
def test_opset9_light_models_fold_and_still_match(name: str) -> None:
    proto = onnx.load(LIGHT / f"light_{name}.onnx")
    model = _model(proto)
    p = _fold(model)
    assert p.fired["fold:ConstantOfShape"] > 0 and not p.failures
    _same_outputs(proto, model)  # weights are all 0.02: a weak check, but a wrong fold still shows
    _idempotent(model)


def test_densenet121_folds_quickly() -> None:
    model = _model(onnx.load(LIGHT / "light_densenet121.onnx"))
    start = time.perf_counter()
    p = _fold(model)
    assert time.perf_counter() - start < 2.0
    assert p.fired["fold:Unsqueeze"] == 242 and not p.failures
    assert "Unsqueeze" not in _ops(model)


# ----------------------------------------------------------------------------- params

PARAMS = """
<ir_version: 8, opset_import: ["" : {opset}]>
g (float[2,3] x) => (float[1,2,3] u, float[2,3] y, float[2,3] z, float[2,3] v, float[2,3] q) {{
    u = Unsqueeze {uattr} (x {uaxes})
    m = Mul(x, k)
    y = Sub(k, m)
    z = Add(x, k3)
    v = Clip(x, lo, hi)
    q = PRelu(x, slope)
}}
"""


def _params_model(opset: int) -> onnx.ModelProto:
    attr_form = opset < 13
    text = PARAMS.format(opset=opset, uattr="<axes = [0]>" if attr_form else "",
                         uaxes="" if attr_form else ", axes")
    inits = dict(k=np.float32(2.5), k3=np.array([1.0, 2.0, 3.0], np.float32), lo=np.float32(-0.5),
                 hi=np.float32(0.5), slope=np.array([0.25], np.float32))
    if not attr_form:
        inits["axes"] = np.array([0], np.int64)
    return _proto(text, **inits)


def test_params_opset17_inputs_stay_inputs() -> None:
    proto = _params_model(17)
    model = _model(proto)
    p = ConstantParams()
    assert not p(model) and not p.fired  # opset 17 has no attribute form for Unsqueeze's axes or Clip's bounds
    assert len(model.graph.node(0).inputs) == 2 and "axes" not in model.graph.node(0).attributes
    assert len(model.graph.node(4).inputs) == 3
    _same_outputs(proto, model, rtol=1e-5)


def test_params_opset11_keeps_the_attribute_form() -> None:
    proto = _params_model(11)
    model = _model(proto)
    assert not ConstantParams()(model)
    unsq = model.graph.node(0)
    assert len(unsq.inputs) == 1 and unsq.attributes["axes"].value == (0,)
    assert len(model.graph.node(4).inputs) == 3  # Clip-11 takes its bounds as inputs
    _same_outputs(proto, model, rtol=1e-5)


def test_params_input_form_moves_into_the_attribute_where_the_opset_defines_it() -> None:
    # an opset-11 model whose Squeeze got its axes as an input (as a careless rewrite could build it)
    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 11]>
    g (float[1,3] x) => (float[3] y) {
        y = Squeeze <axes = [0]> (x)
    }""")
    node = model.graph.node(0)
    axes = ir.Value(name="axes", const_value=ir.tensor(np.array([0], np.int64), name="axes"))
    model.graph.register_initializer(axes)
    del node.attributes["axes"]
    node.resize_inputs(2)
    node.replace_input_with(1, axes)
    p = ConstantParams()
    assert p(model) and p.fired == {"param-to-attribute": 1}
    assert len(node.inputs) == 1 and node.attributes["axes"].value == (0,)
    assert not ConstantParams()(model)
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    np.testing.assert_array_equal(run_ort(proto, {"x": x})["y"], x[0])


# node text, inputs (None: omitted), outputs requested ("" = omitted), opset
_DIRECT_CASES = [
    ('Gather <axis = 0> (a, b)', [np.arange(6, dtype=np.int64), np.array([4, 1])], ["y"], 17),
    ('Concat <axis = 0> (a, b)', [np.arange(3, dtype=np.int64), np.array([7])], ["y"], 17),
    ('Unsqueeze (a, b)', [np.arange(3.0, dtype=np.float32), np.array([0])], ["y"], 17),
    ('Unsqueeze <axes = [1]> (a)', [np.arange(3.0, dtype=np.float32)], ["y"], 11),
    ('Slice (a, b, c)', [np.arange(10, dtype=np.int64), np.array([2]), np.array([8])], ["y"], 17),
    ('Clip (a, , c)', [np.linspace(-2, 2, 5).astype(np.float32), None, np.float32(1.0)], ["y"], 17),
    ('TopK <axis = 0> (a, b)', [np.array([3.0, 1.0, 2.0], np.float32), np.array([2])], ["y", "z"], 17),
    ('TopK <axis = 0> (a, b)', [np.array([3.0, 1.0, 2.0], np.float32), np.array([2])], ["", "z"], 17),
    ('Split <axis = 0> (a, b)', [np.arange(5, dtype=np.int64), np.array([2, 3])], ["y", "z"], 17),
    ('Range (a, b, c)', [np.int64(1), np.int64(9), np.int64(3)], ["y"], 17),
    ('ConstantOfShape <value = float[1] {2.5}> (a)', [np.array([2, 3])], ["y"], 17),
    ('Cast <to = 10> (a)', [np.linspace(0, 1, 4).astype(np.float32)], ["y"], 17),
    ('Where (a, b, c)', [np.array([True, False]), np.float32([1, 2]), np.float32([3, 4])], ["y"], 17),
    ('Dropout (a)', [np.float32([1, 2])], ["y", ""], 17),
    ('LayerNormalization (a, b, c)', [np.float32([[1, 2, 4]]), np.float32([1, 1, 2]), np.float32([0, 1, 0])],
     ["y"], 17),
    ('Gelu (a)', [np.float32([-1, 0, 1])], ["y"], 20),
]


@pytest.mark.parametrize("case", range(len(_DIRECT_CASES)))
def test_direct_op_call_matches_the_reference_evaluator(case: int) -> None:
    """fold calls onnx.reference's op implementations directly where it can; each gives what a
    ReferenceEvaluator around the same node gives (ops defined as functions take the evaluator)."""
    from onnx.reference import ReferenceEvaluator

    from dlcc.passes.fold import _op_instance

    text, args, outs, opset = _DIRECT_CASES[case]
    names = ["a", "b", "c"][:len(args)]
    used = [n if a is not None else "" for n, a in zip(names, args, strict=True)]
    call = text.split("(")[0] + "(" + ", ".join(used) + ")"
    node = onnx.parser.parse_node(f"{', '.join(outs)} = {call}")
    args = [None if a is None else np.asarray(a) for a in args]
    graph = onnx.helper.make_graph([node], "g", [onnx.ValueInfoProto(name=n) for n in used if n],
                                   [onnx.ValueInfoProto(name=o) for o in outs if o])
    ev = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)]))
    want = ev.run(None, {n: a for n, a in zip(names, args, strict=True) if a is not None})
    op = _op_instance(node, opset)
    if op is None:  # a function-defined op: the evaluator path is the only one
        assert text.startswith("Gelu"), text  # (of these cases, only Gelu is a function in onnx.reference)
        return
    got = [r for r, o in zip(op.run(*args), outs, strict=False) if o]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert np.asarray(g).dtype == np.asarray(w).dtype
