"""dlcc::Attention: the micro-kernel against its contract, the loop IR through the verifier and interpreter, the
graph rewrite on the attention forms exporters emit, and compiled models against onnxruntime."""

import ctypes
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from test_lir import PRELUDE, _build

import dlcc
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.codegen.vmath import C_TEXT as VMATH_C
from dlcc.lower.interp import attention_reference
from dlcc.lower.lir import MICRO, Buf, Const, Layout, run_func, verify_func
from dlcc.lower.micro import AttnSpec, attn_micro
from dlcc.schedule.attention import Head, attention_func, attention_plan
from dlcc.schedule.target import get_target
from dlcc.testing.harness import runnable_targets

SPECS = [  # sq, sk, d, causal, mask (0 none, 1 per key, 2 per query and key), qb, nv
    (16, 16, 8, 0, 1, 6, 4),  # a query block tail, one key vector on AVX-512
    (13, 29, 10, 1, 2, 6, 2),  # causal with more keys than queries, head size not whole vectors, full mask
    (37, 37, 64, 1, 0, 6, 4),  # causal, no mask, several key tiles and a key tail
    (5, 70, 16, 0, 1, 3, 4),  # few queries, a key tail past the tile
]


def _spec(sq, sk, d, causal, mask, qb, nv, scale=0.37, fill=-3.0e38):
    # q: rows of 3d (a head inside a wider row), k: transposed (keys contiguous), v and o: plain rows
    return AttnSpec.make(sq=sq, sk=sk, d=d, qs=3 * d, qd=1, ks=1, kd=sk + 2, vs=d + 1, vd=1, os=d, od=1,
                         mk=int(mask > 0), ms=(sk + 3) if mask == 2 else 0, mj=1 if mask else 0, causal=causal,
                         scale=scale, fill=fill, qb=qb, nv=nv)


@pytest.mark.parametrize("target", runnable_targets())
def test_attention_micro_kernel_matches_its_contract(target):
    t = get_target(target)
    rng = np.random.default_rng(3)
    src = PRELUDE + "#include <math.h>\n" + vector_helpers(t.lanes) + "\n" + VMATH_C + "\n"
    specs = [_spec(*s) for s in SPECS]
    for sp in specs:
        name = attn_micro(sp)
        m = "const float* m, " if sp.mk else ""
        src += micro_c(name, t.lanes) + (
            f"void w_{name}(const float* q, const float* k, const float* v, {m}float* o, float* ws) "
            f"{{ dlcc_uk_{name}(q, k, v, {'m, ' if sp.mk else ''}o, ws); }}\n")
    ptr = ctypes.c_void_p
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for sp in specs:
            name = sp.name
            q = rng.standard_normal(sp.sq * sp.qs).astype(np.float32)
            k = rng.standard_normal(sp.d * sp.kd + sp.sk).astype(np.float32)
            v = rng.standard_normal(sp.sk * sp.vs).astype(np.float32)
            mask = (rng.standard_normal(sp.sq * (sp.sk + 3)) * 2).astype(np.float32)
            arrays = {"q": q, "k": k, "v": v, "m": mask}
            want = np.full(sp.sq * sp.os + 5, 7.0, np.float32)
            got = want.copy()
            MICRO[name].reference({**arrays, "o": want}, dict.fromkeys(("q", "k", "v", "m", "o"), 0), {})
            ws = np.full(sp.ws_floats(t.lanes) + 1, np.nan, np.float32)
            args = [arrays[p].ctypes.data_as(ptr) for p in ("q", "k", "v", *(("m",) if sp.mk else ()))]
            fn = getattr(lib, f"w_{name}")
            fn(*args, got.ctypes.data_as(ptr), ws.ctypes.data_as(ptr))
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=name)
            assert np.isnan(ws[-1])  # no write past the declared workspace


def test_attention_spec_name_round_trips():
    sp = _spec(13, 29, 10, 1, 2, 6, 2)
    assert AttnSpec.parse(sp.name) == sp
    assert sp.scale_value == pytest.approx(0.37) and sp.fill_value == pytest.approx(-3.0e38, rel=1e-6)
    assert AttnSpec.parse("attn_1_2") is None and AttnSpec.parse("gemm_6x32") is None


@pytest.mark.parametrize("threads", [1, 2])
def test_attention_loop_ir_verifies_and_interprets(threads):
    b, h, sq, sk, d = 2, 3, 7, 9, 4
    t = get_target("x86-64-v4")
    plan = attention_plan(b, h, sq, sk, d, t, threads)
    rng = np.random.default_rng(5)
    q3 = rng.standard_normal((b, sq, h * d)).astype(np.float32)  # heads unsplit
    k4 = rng.standard_normal((b, h, d, sk)).astype(np.float32)  # K transposed
    v4 = rng.standard_normal((b, h, sk, d)).astype(np.float32)
    mask = rng.standard_normal((b, 1, 1, sk)).astype(np.float32)

    def buf(name, a):
        return Buf(name, "float32", Layout.strided(a.shape))

    z = Const(0)
    qh = Head(buf("q", q3), lambda b_, h_: (b_, z, h_ * d), h * d, 1)
    kh = Head(buf("k", k4), lambda b_, h_: (b_, h_, z, z), 1, sk)
    vh = Head(buf("v", v4), lambda b_, h_: (b_, h_, z, z), d, 1)
    oh = Head(buf("o", np.zeros((b, h, sq, d))), lambda b_, h_: (b_, h_, z, z), d, 1)
    mh = Head(buf("m", mask), lambda b_, h_: (b_, z, z, z), 0, 1)
    ws = Buf("ws", "float32", Layout.strided((plan.workspace_bytes // 4,)), "workspace")
    f = attention_func(plan, b, h, sq, sk, d, qh, kh, vh, oh, mh, ws, scale=0.5, causal=True, fill=-1e9)
    verify_func(f)
    out = np.zeros(b * h * sq * d, np.float32)
    run_func(f, {"q": q3.ravel(), "k": k4.ravel(), "v": v4.ravel(), "m": mask.ravel(), "o": out,
                 "ws": np.zeros(plan.workspace_bytes // 4, np.float32)})
    out = out.reshape(b, h, sq, d)
    want = attention_reference(q3, k4, v4, mask, num_heads=h, scale=0.5, causal=1, fill=-1e9, layout=(0, 2, 1, 1))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ the rewrite and whole models


def _attention_model(*, b=2, s=11, h=3, dh=8, form="bert", seed=0) -> onnx.ModelProto:
    """One self-attention block on x [b, s, h*dh] as exporters write it: ``bert`` (Q, K, V projections, heads
    split by Reshape + Transpose, K^T by perm (0,2,3,1), Mul scale, additive [b,1,1,s] mask); ``gpt2`` (one
    QKV MatMul + Split, Div scale, causal Where with float min); ``vit`` (Q scaled by Mul before the product,
    K^T as a Transpose of the split K, no mask); ``bhsd`` (4-D heads that are not a split: the graph input)."""
    rng = np.random.default_rng(seed)
    d = h * dh
    inits, nodes = [], []

    def init(name, a):
        inits.append(onnx.numpy_helper.from_array(np.asarray(a), name))
        return name

    def node(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], name=out + "_n", **kw))
        return out

    x = "x"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, d])]
    init("split_shape", np.array([b, s, h, dh], np.int64))
    init("merge_shape", np.array([b, s, d], np.int64))

    def proj(name, n_out):
        w = init(f"{name}_w", (rng.standard_normal((d, n_out)) / np.sqrt(d)).astype(np.float32))
        bias = init(f"{name}_b", (rng.standard_normal(n_out) * 0.1).astype(np.float32))
        return node("Add", [node("MatMul", [x, w], f"{name}_mm"), bias], f"{name}_out")

    def heads(v, name, perm):
        return node("Transpose", [node("Reshape", [v, "split_shape"], f"{name}_r")], f"{name}_t", perm=perm)

    if form == "bhsd":
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, h, s, dh]) for n in ("q", "k", "v")]
        q, v = "q", "v"
        kt = node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2])
    elif form == "gpt2":
        qkv = proj("qkv", 3 * d)
        init("split_sizes", np.array([d, d, d], np.int64))
        nodes.append(helper.make_node("Split", [qkv, "split_sizes"], ["q3", "k3", "v3"], axis=2, name="split"))
        q, kt, v = heads("q3", "q", [0, 2, 1, 3]), heads("k3", "k", [0, 2, 3, 1]), heads("v3", "v", [0, 2, 1, 3])
    else:
        q = heads(proj("q", d), "q", [0, 2, 1, 3])
        if form == "vit":
            q = node("Mul", [q, init("qscale", np.array(1 / np.sqrt(dh), np.float32))], "q_scaled")
            kt = node("Transpose", [heads(proj("k", d), "k", [0, 2, 1, 3])], "kt", perm=[0, 1, 3, 2])
        else:
            kt = heads(proj("k", d), "k", [0, 2, 3, 1])
        v = heads(proj("v", d), "v", [0, 2, 1, 3])
    scores = node("MatMul", [q, kt], "scores")
    if form in ("bert", "bhsd"):
        scores = node("Mul", [scores, init("scale", np.array(1 / np.sqrt(dh), np.float32))], "scaled")
        mask = (rng.random((b, 1, 1, s)) < 0.3).astype(np.float32) * -10000.0
        scores = node("Add", [scores, init("mask", mask)], "masked")
    elif form == "gpt2":
        scores = node("Div", [scores, init("div", np.array(np.sqrt(dh), np.float32))], "scaled")
        tril = np.tril(np.ones((s, s), bool))[None, None]
        scores = node("Where", [init("causal", tril), scores, init("fill", np.array(np.finfo(np.float32).min))],
                      "masked")
    probs = node("Softmax", [scores], "probs", axis=-1)
    ctx = node("MatMul", [probs, v], "ctx")
    if form == "bhsd":  # an elementwise op on the product: the attention kernel's fused epilogue
        out, shape = node("Relu", [node("Sub", [ctx, init("shift", np.array(0.1, np.float32))], "shifted")], "y"), \
            [b, h, s, dh]
    else:
        out = node("Reshape", [node("Transpose", [ctx], "ctx_t", perm=[0, 2, 1, 3]), "merge_shape"], "y")
        shape = [b, s, d]
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                                          shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["bert", "gpt2", "vit", "bhsd"])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_forms_fuse_and_match_onnxruntime(form, threads):
    model = _attention_model(form=form)
    cm = dlcc.compile(model, threads=threads)
    ops = [k["ops"] for k in cm.info["per_kernel"]]
    assert any("Attention" in k for k in ops) and not any("Softmax" in k for k in ops), ops
    if form == "bhsd":
        assert ops == ["Attention+Sub+Relu"], ops  # (K^T by a Transpose of K: K read as it is)
    if form != "bhsd":  # every head split, the scale and the merge absorbed: only the projections stay around it
        assert not {"Transpose", "Mul", "Div", "Where"} & {op for k in ops for op in k.split("+")}, ops
        # Q, K, V in one GEMM (merge-sibling-matmuls, or the model's own QKV Split), read by column offsets
        assert ops == ["MatMul+Add", "Attention"], ops
    _assert_matches_onnxruntime(model, cm, seed=1)


def test_attention_is_not_fused_for_the_onnx_target():
    import onnx_ir as ir

    from dlcc.api import optimize

    m = ir.serde.deserialize_model(_attention_model())
    optimize(m, level=3, target="onnx", emit=lambda s: None)
    assert not any(n.domain == "dlcc" for n in m.graph)
    assert sum(n.op_type == "MatMul" for n in m.graph) == 5  # the projections stay apart for portable ONNX


@pytest.mark.parametrize("form", ["bert", "gpt2", "vit", "bhsd"])
def test_attention_round_trips_to_standard_onnx(form):
    """dlcc-c's rewrite, then the onnx target's attention-to-idiom: standard ONNX computing the same."""
    import onnx_ir as ir

    from dlcc.api import optimize

    model = _attention_model(form=form)
    m = ir.serde.deserialize_model(model)
    optimize(m, level=3, target="dlcc-c", emit=lambda s: None)
    assert any(n.op_type == "Attention" for n in m.graph)
    optimize(m, level=3, target="onnx", emit=lambda s: None)
    assert not any(n.domain == "dlcc" for n in m.graph) and "dlcc" not in m.opset_imports
    rng = np.random.default_rng(2)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    proto = ir.serde.serialize_model(m).SerializeToString()
    got = ort.InferenceSession(proto, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _onnx_attention_model(*, rank: int, causal: int, mask: str | None, b=2, h=3, s=9, d=8, scale=None):
    """One opset-23 Attention op on graph inputs q, k, v (rank 4: [b, h, s, d]; rank 3: [b, s, h*d] with
    q_num_heads/kv_num_heads), an optional constant mask (``"bool"`` [s, s] keep-mask, ``"float"`` [b, 1, s, s])."""
    shape = [b, h, s, d] if rank == 4 else [b, s, h * d]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v")]
    inits, names = [], ["q", "k", "v"]
    rng = np.random.default_rng(4)
    if mask == "bool":
        keep = rng.random((s, s)) > 0.3
        keep[:, 0] = True  # no fully masked row
        inits.append(onnx.numpy_helper.from_array(keep, "mask"))
        names.append("mask")
    elif mask == "float":
        inits.append(onnx.numpy_helper.from_array((rng.standard_normal((b, 1, s, s)) * 2).astype(np.float32), "mask"))
        names.append("mask")
    attrs = {"is_causal": causal}
    if rank == 3:
        attrs.update(q_num_heads=h, kv_num_heads=h)
    if scale is not None:
        attrs["scale"] = scale
    node = helper.make_node("Attention", names, ["y"], **attrs)
    graph = helper.make_graph([node], "attention23", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                             shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("rank,causal,mask,scale", [(4, 0, None, None), (3, 1, "bool", None), (4, 1, "float", 0.3),
                                                    (3, 0, "float", None)])
def test_onnx_attention_op_fuses_and_matches_onnxruntime(rank, causal, mask, scale):
    model = _onnx_attention_model(rank=rank, causal=causal, mask=mask, scale=scale)
    onnx.checker.check_model(model)
    cm = dlcc.compile(model, threads=2)
    assert [k["ops"] for k in cm.info["per_kernel"]] == ["Attention"]
    _assert_matches_onnxruntime(model, cm, seed=6)


def _assert_matches_onnxruntime(model, cm, seed: int) -> None:
    """``cm`` (compiled from ``model``) against onnxruntime on seeded random inputs: DESIGN's rtol 1e-4 of scale."""
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = cm(**feeds)
    got = next(iter(got.values())) if isinstance(got, dict) else got
    assert np.abs(np.asarray(got) - want).max() <= 1e-4 * np.abs(want).max() + 1e-6
