"""The real-size transformer builders (GPT-2 small, ViT-B/16), at small configurations: valid, static,
computing what their names say (numpy references), in the exporter's op patterns, and compiled by dlcc
to onnxruntime's outputs.

Tolerances against onnxruntime (DESIGN.md, relative to each output's scale): rtol 1e-4, atol 1e-6.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import dlcc
from dlcc.check import diff, random_inputs, run_ort
from dlcc.testing.models import gpt2_decoder_stack, transformer_encoder_block, vit_b16

RTOL, ATOL = 1e-4, 1e-6
GPT2_SMALL = {"seq": 16, "d_model": 64, "heads": 4, "layers": 2, "vocab": 100, "positions": 32}
VIT_SMALL = {"image": 32, "patch": 16, "d_model": 64, "heads": 4, "layers": 2, "mlp": 128, "classes": 10}
ENCODER_SMALL = {"batch": 1, "seq": 16, "d_model": 64, "heads": 4, "ffn": 256, "layers": 2}

CASES = {
    "gpt2": lambda: gpt2_decoder_stack(**GPT2_SMALL),
    "vit": lambda: vit_b16(**VIT_SMALL),
    "encoder": lambda: transformer_encoder_block(**ENCODER_SMALL),  # the distilbert_enc / BERT sweep builder
}


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers, float ones as float64."""
    out = {}
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        out[t.name] = a.astype(np.float64) if a.dtype == np.float32 else a
    return out


def assert_close(name: str, ref: np.ndarray, got: np.ndarray) -> None:
    d = diff(name, ref, got, rtol=RTOL, atol=ATOL)
    assert d.ok, f"{name}: max abs {d.max_abs:.3g} vs scale {d.scale:.3g} ({d.reason})"


@pytest.mark.parametrize("name", ["gpt2", "vit"])
def test_small_model_is_valid_static_and_runs(name):
    model = CASES[name]()
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8 and [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    g = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True).graph
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in [*g.value_info, *g.output]}
    produced = [o for n in model.graph.node for o in n.output]
    assert all(v in shapes and all(d and d > 0 for d in shapes[v]) for v in produced)
    (out,) = run_ort(model, random_inputs(model, seed=0)).values()
    assert np.isfinite(out).all() and np.ptp(out) > 0


# ------------------------------------------------------------------------------------ numpy references


def _layer_norm(x, w, base, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[f"{base}_weight"] + w[f"{base}_bias"]


def _linear(x, w, base):
    return x @ w[f"{base}_weight"] + w[f"{base}_bias"]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attention(x, w, base, heads, causal):
    s, d = x.shape[-2:]
    dh = d // heads
    q, k, v = np.split(_linear(x, w, f"{base}_qkv"), 3, axis=-1)
    q, k, v = (t.reshape(s, heads, dh).transpose(1, 0, 2) for t in (q, k, v))
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
    if causal:
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    ctx = (_softmax(scores) @ v).transpose(1, 0, 2).reshape(s, d)
    return _linear(ctx, w, f"{base}_proj")


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_gpt2_matches_numpy_and_is_causal():
    model = CASES["gpt2"]()
    w = weights(model)
    seq = GPT2_SMALL["seq"]
    ids = np.random.default_rng(5).integers(0, GPT2_SMALL["vocab"], (1, seq)).astype(np.int64)
    h = w["wte"][ids[0]] + w["wpe"][:seq]
    for i in range(GPT2_SMALL["layers"]):
        h = h + _attention(_layer_norm(h, w, f"h{i}_ln_1", 1e-5), w, f"h{i}_attn", GPT2_SMALL["heads"], True)
        m = _gelu_tanh(_linear(_layer_norm(h, w, f"h{i}_ln_2", 1e-5), w, f"h{i}_mlp_c_fc"))
        h = h + _linear(m, w, f"h{i}_mlp_c_proj")
    ref = _layer_norm(h, w, "ln_f", 1e-5)[None]
    got = run_ort(model, {"input_ids": ids})["hidden"]
    assert_close("gpt2", ref, got)
    # Another last token changes only the last position.
    changed = ids.copy()
    changed[0, -1] = (changed[0, -1] + 1) % GPT2_SMALL["vocab"]
    got2 = run_ort(model, {"input_ids": changed})["hidden"]
    np.testing.assert_array_equal(got[:, :-1], got2[:, :-1])
    assert not np.allclose(got[:, -1], got2[:, -1])


def test_vit_matches_numpy():
    model = CASES["vit"]()
    w = weights(model)
    p, d, image = VIT_SMALL["patch"], VIT_SMALL["d_model"], VIT_SMALL["image"]
    g = image // p
    x = np.random.default_rng(6).standard_normal((1, 3, image, image)).astype(np.float32)
    patches = x.astype(np.float64).reshape(3, g, p, g, p).transpose(1, 3, 0, 2, 4).reshape(g * g, 3 * p * p)
    t = patches @ w["conv_proj_weight"].reshape(d, -1).T + w["conv_proj_bias"]
    t = np.concatenate([w["class_token"][0], t]) + w["pos_embedding"][0]
    for i in range(VIT_SMALL["layers"]):
        p_ = f"encoder_layer_{i}"
        t = t + _attention(_layer_norm(t, w, f"{p_}_ln_1", 1e-6), w, f"{p_}_self_attention", VIT_SMALL["heads"],
                           False)
        y = _gelu_erf(_linear(_layer_norm(t, w, f"{p_}_ln_2", 1e-6), w, f"{p_}_mlp_0"))
        t = t + _linear(y, w, f"{p_}_mlp_3")
    ref = _linear(_layer_norm(t, w, "encoder_ln", 1e-6)[:1], w, "heads_head")
    assert_close("vit", ref, run_ort(model, {"pixels": x})["logits"])


# ------------------------------------------------------------------------------------------- op patterns


def _layer_ops(model: onnx.ModelProto, prefix: str) -> list[tuple[str, list[int] | None]]:
    """(op, perm) of the non-Constant nodes named ``prefix``..., in graph order."""
    out = []
    for n in model.graph.node:
        if n.name.startswith(prefix) and n.op_type != "Constant":
            perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
            out.append((n.op_type, perm))
    return out


_HEADS = [("Split", None), ("Reshape", None), ("Transpose", [0, 2, 1, 3]), ("Reshape", None),
          ("Transpose", [0, 2, 3, 1]), ("Reshape", None), ("Transpose", [0, 2, 1, 3])]
_MERGE = [("Softmax", None), ("MatMul", None), ("Transpose", [0, 2, 1, 3]), ("Reshape", None), ("MatMul", None),
          ("Add", None)]


def test_attention_op_sequences():
    gpt2 = CASES["gpt2"]()
    assert _layer_ops(gpt2, "h1_attn_") == [("MatMul", None), ("Add", None), *_HEADS, ("MatMul", None),
                                            ("Div", None), ("Where", None), *_MERGE]
    vit = CASES["vit"]()
    assert _layer_ops(vit, "encoder_layer_1_self_attention_") == [("MatMul", None), ("Add", None), *_HEADS,
                                                                  ("Mul", None), ("MatMul", None), *_MERGE]
    c = Counter(n.op_type for n in gpt2.graph.node)
    assert c["LayerNormalization"] == 5 and c["Split"] == c["Where"] == c["Tanh"] == c["Pow"] == 2
    assert "Gemm" not in c and "ReduceMean" not in c
    c = Counter(n.op_type for n in vit.graph.node)
    assert c["LayerNormalization"] == 5 and c["Erf"] == 2 and c["Conv"] == c["Concat"] == c["Gather"] == 1
    assert "Where" not in c


# ------------------------------------------------------------------------------------------ dlcc.compile


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_matches_onnxruntime(name):
    model = CASES[name]()
    cm = dlcc.compile(model)
    feeds = random_inputs(model, seed=1)
    ref = run_ort(model, feeds)
    got = cm(feeds)
    assert set(got) == set(ref)
    for k in ref:
        assert_close(k, ref[k], got[k])


def test_builders_are_deterministic_and_seeded():
    for build in (gpt2_decoder_stack, vit_b16):
        small = GPT2_SMALL if build is gpt2_decoder_stack else VIT_SMALL
        a, b, c = build(**small), build(**small), build(**small, seed=1)
        assert a.SerializeToString() == b.SerializeToString()
        assert a.SerializeToString() != c.SerializeToString()


@pytest.mark.slow
@pytest.mark.parametrize(("build", "params"), [(gpt2_decoder_stack, 86_610_432), (vit_b16, 86_567_656)])
def test_full_size_parameters_and_sane_output(build, params):
    """GPT-2 small less its vocabulary (124,439,808 with 50257 tokens) and torchvision's ViT-B/16 count."""
    model = build()
    assert sum(math.prod(t.dims) for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT) == params
    (out,) = run_ort(model, random_inputs(model, seed=0)).values()
    assert np.isfinite(out).all() and np.ptp(out) > 0
    assert 0.05 < float(np.sqrt(np.mean(out.astype(np.float64) ** 2))) < 100, "activations drifted"
