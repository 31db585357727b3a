"""The rule driver: firing, refusals, graph outputs keep their names, cycles fail loudly."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from dlcc.check import random_inputs, run_ort
from dlcc.errors import PassError
from dlcc.frontend.shapes import infer_shapes
from dlcc.passes.rewrite import RewriteStats, Rule, apply_rules, const_array
from dlcc.passes.verify import verify_model

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y, float[2,3] z) {
    zero = Constant <value = float[1] {0.0}> ()
    a = Add(x, zero)
    r = Relu(a)
    y = Add(r, zero)
    z = Neg(r)
}
"""


def _add_zero() -> Rule:
    def pattern(node):
        c = const_array(node.inputs[1])
        return {"c": c} if c is not None else None

    def check(node, m):
        if np.any(m["c"] != 0):
            return "constant is not zero"
        if node.inputs[0].shape != node.outputs[0].shape:
            return "broadcasting changes the shape"
        return None

    return Rule("add-zero", ("Add",), pattern, check, lambda node, m, b: [node.inputs[0]])


def test_rule_fires_and_graph_output_keeps_name() -> None:
    model = infer_shapes(ir.from_onnx_text(TEXT))
    ref_feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    ref = run_ort(ir.serde.serialize_model(model), ref_feeds)
    stats = RewriteStats()
    assert apply_rules(model, [_add_zero()], stats=stats)
    assert stats.fired["add-zero"] == 2
    verify_model(model)
    assert [v.name for v in model.graph.outputs] == ["y", "z"]
    assert [n.op_type for n in model.graph] == ["Relu", "Neg"]  # Relu now writes y itself; Constant is gone
    got = run_ort(ir.serde.serialize_model(model), ref_feeds)
    for k in ref:
        np.testing.assert_array_equal(ref[k], got[k])
    assert not apply_rules(model, [_add_zero()])  # idempotent


def test_refusal_is_counted_with_reason() -> None:
    model = infer_shapes(ir.from_onnx_text(TEXT.replace("{0.0}", "{1.0}")))
    stats = RewriteStats()
    assert not apply_rules(model, [_add_zero()], stats=stats)
    assert stats.refused[("add-zero", "constant is not zero")] == 2


def test_cycle_fails_loudly() -> None:
    flip = Rule("flip", ("Relu",), lambda n: {}, rewrite=lambda n, m, b: [b.op("Relu", [n.inputs[0]])])
    with pytest.raises(PassError, match="cycles"):
        apply_rules(ir.from_onnx_text(TEXT), [flip], max_sweeps=5)


def test_builder_constants_and_names_are_unique() -> None:
    model = ir.from_onnx_text(TEXT)

    def rewrite(node, m, b):
        k = b.const(np.float32(2.0), "two")
        return [b.op("Mul", [node.inputs[0], k], hint="a")]

    rule = Rule("neg-to-mul", ("Neg",), lambda n: {}, rewrite=rewrite)
    apply_rules(model, [rule])
    verify_model(model)
    names = [v.name for n in model.graph for v in n.outputs]
    assert len(names) == len(set(names))
    feeds = random_inputs(ir.serde.serialize_model(model), seed=0)
    out = run_ort(ir.serde.serialize_model(model), feeds)
    r = np.maximum(feeds["x"], 0)
    np.testing.assert_allclose(out["z"], r * 2, rtol=1e-6)


def test_as_tensor_keeps_rank_zero_and_layout() -> None:
    from dlcc.passes.rewrite import as_tensor

    assert as_tensor(np.array(3, np.int64)).shape == ir.Shape([])
    t = as_tensor(np.arange(6, dtype=np.float32).reshape(2, 3).T, "t")
    assert t.shape == ir.Shape([3, 2]) and t.name == "t"
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3).T)


def test_losing_candidates_leave_no_uses_behind() -> None:
    """choose_best builds every candidate; the ones not chosen must not keep their inputs alive"""
    model = infer_shapes(ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) { a = Relu(x) y = Neg(a) }
    """))
    keep = Rule("a-keep", ("Neg",), lambda n: {}, rewrite=lambda node, m, b: [b.op("Abs", [node.inputs[0]])])
    skip = Rule("b-skip", ("Neg",), lambda n: {},
                rewrite=lambda node, m, b: [b.op("Sin", [node.inputs[0].producer().inputs[0]])])
    stats = RewriteStats()
    apply_rules(model, [keep, skip], stats=stats, choose_best=True, max_sweeps=1)
    # b-skip saves the Relu too, so it wins; the losing Abs(a) must not keep the Relu alive
    assert stats.fired["b-skip"] == 1
    assert [n.op_type for n in model.graph] == ["Sin"]
    verify_model(model)


EDIT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
    a = Mul(x, k)
    y = Neg(a)
}
"""


def _edit_model() -> ir.Model:
    model = infer_shapes(ir.from_onnx_text(EDIT))
    k = ir.Value(name="k", const_value=ir.Tensor(np.full((2, 3), 2.0, np.float32), name="k"))
    model.graph.register_initializer(k)
    mul = next(iter(model.graph))
    mul.replace_input_with(1, k)
    return model


def _neg_into_mul(how: str) -> Rule:
    """Neg(Mul(x, k)) -> Mul(x, -k), by editing the Mul: ``set_const`` on k, or ``set_input`` with a new
    constant ("input"), or with a value a new node computes (a bug the driver must catch)."""
    def pattern(node):
        p = node.inputs[0].producer()
        return {"mul": p} if p is not None and p.op_type == "Mul" else None

    def rewrite(node, m, b):
        mul = m["mul"]
        neg_k = -const_array(mul.inputs[1])
        if how == "const":
            b.set_const(mul.inputs[1], neg_k)
        elif how == "input":
            b.set_input(mul, 1, b.const(neg_k, "negk"))
        else:
            b.set_input(mul, 1, b.op("Neg", [mul.inputs[1]]))
        return [mul.outputs[0]]

    return Rule("neg-into-mul", ("Neg",), pattern, rewrite=rewrite)


@pytest.mark.parametrize("how", ["const", "input"])
def test_rewrite_edits_a_producer_in_place(how: str) -> None:
    model = _edit_model()
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)}
    ref = run_ort(ir.serde.serialize_model(model), feeds)["y"]
    mul = next(iter(model.graph))
    assert apply_rules(model, [_neg_into_mul(how)])
    verify_model(model)
    assert list(model.graph) == [mul] and mul.outputs[0].name == "y"
    assert list(model.graph.initializers) == (["k"] if how == "const" else [mul.inputs[1].name])
    np.testing.assert_array_equal(run_ort(ir.serde.serialize_model(model), feeds)["y"], ref)


def test_set_input_to_a_later_value_and_set_const_on_a_shared_value_are_bugs() -> None:
    model = _edit_model()
    with pytest.raises(PassError, match="computed after it"):
        apply_rules(model, [_neg_into_mul("node")])
    model = _edit_model()
    mul = next(iter(model.graph))
    k2 = ir.Node("", "Add", [mul.inputs[1], mul.inputs[1]], outputs=[ir.Value(name="k2")])  # k: 2 readers
    model.graph.append(k2)
    model.graph.outputs.append(k2.outputs[0])
    with pytest.raises(PassError, match="not an initializer only one node reads"):
        apply_rules(model, [_neg_into_mul("const")])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
                                   np.int32, np.uint32, np.int64, np.uint64, np.bool_])
@pytest.mark.parametrize("shape", [(), (1,), (3, 4), (2, 0, 5)])
def test_tensor_array_of_a_loaded_tensor_is_what_onnx_ir_decodes(dtype, shape) -> None:
    """tensor_array decodes a loaded tensor's raw_data itself (faster than onnx_ir's numpy()): same values,
    dtype and shape; a tensor stored in typed fields (no raw_data) still goes through onnx_ir."""
    import onnx

    from dlcc.passes.rewrite import tensor_array

    rng = np.random.default_rng(0)
    arr = (rng.standard_normal(shape) * 50).astype(dtype)
    raw = ir.serde.TensorProtoTensor(ir.serde.serialize_tensor(ir.Tensor(arr, name="t")))
    elem = onnx.helper.np_dtype_to_tensor_dtype(arr.dtype)
    typed = ir.serde.TensorProtoTensor(onnx.helper.make_tensor("t", elem, shape, arr.reshape(-1).tolist()))
    assert not typed.raw.HasField("raw_data")
    for t in (raw, typed):
        got, want = tensor_array(t), t.numpy()
        assert got.dtype == want.dtype and got.shape == want.shape == arr.shape
        np.testing.assert_array_equal(got, arr)
