"""dlcc.compile end to end: kit models, light models, errors, threads, the cache, memory figures.

Tolerances (DESIGN.md, relative to each output's scale): rtol 1e-4 against onnxruntime on the original
model, since compilation runs the level-3 optimizer (BN folding reassociates arithmetic) and the C sums
in another order than onnxruntime; atol 1e-6.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

import dlcc
from dlcc.check import diff, random_inputs, run_ort
from dlcc.errors import DlccError
from dlcc.lower.interp import interpret
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model
from dlcc.testing.randomize import randomize

RTOL, ATOL = 1e-4, 1e-6


def _check(model: onnx.ModelProto, cm, seed: int = 1) -> dict:
    feeds = random_inputs(model, seed=seed)
    ref = run_ort(model, feeds)
    got = cm(feeds)
    assert set(got) == set(ref)
    for k in ref:
        d = diff(k, ref[k], got[k], rtol=RTOL, atol=ATOL)
        assert d.ok, f"{k}: {d.reason} (max abs err {d.max_abs:.3g}, scale {d.scale:.3g})"
    return feeds


@pytest.mark.parametrize("name", sorted(KIT_MODELS))
def test_kit_models_match_onnxruntime(name: str) -> None:
    model = randomize(KIT_MODELS[name](), seed=0)
    cm = dlcc.compile(model)
    feeds = _check(model, cm)
    art = cm.artifacts
    # the kernel-IR interpreter (same buffers, same arena offsets, reference ops) agrees too
    ref = run_ort(model, feeds)
    it = interpret(art.program, art.memory, feeds)
    for k in ref:
        assert diff(k, ref[k], it[k], rtol=RTOL, atol=ATOL).ok
    assert art.memory.arena_bytes <= 1.10 * art.memory.lower_bound + 64


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_models_match_onnxruntime(name: str) -> None:
    model = light_model(name, seed=0)
    cm = dlcc.compile(model)
    _check(model, cm)
    m = cm.artifacts.memory
    assert m.arena_bytes <= 1.10 * m.lower_bound, (m.arena_bytes, m.lower_bound)
    assert m.arena_bytes < m.no_reuse_bytes


def _model(text: str, **inits) -> onnx.ModelProto:
    m = onnx.parser.parse_model(text)
    for name, a in inits.items():
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(a), name))
    return m


def test_symbolic_input_names_it_and_suggests_input_shape() -> None:
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[N,4] x) => (float[N,4] y) { y = Relu(x) }""")
    with pytest.raises(DlccError) as e:
        dlcc.compile(m)
    assert "'x'" in str(e.value) and "--input-shape" in str(e.value)
    cm = dlcc.compile(m, input_shapes={"x": [3, 4]})
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(cm(x=x)["y"], np.maximum(x, 0))


def test_unsupported_ops_are_listed_all_at_once_with_counts() -> None:
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[4,8] x) => (float[4,2] a, float[4,2] b, float[4,8] c) {
        a, ia = TopK <axis = 1> (x, k)
        b, ib = TopK <axis = 1> (x, k)
        c = CumSum(x, ax)
    }""", k=np.array([2], dtype=np.int64), ax=np.array(1, dtype=np.int64))
    with pytest.raises(DlccError) as e:
        dlcc.compile(m)
    assert "CumSum (1)" in str(e.value) and "TopK (2)" in str(e.value)


def test_wrong_inputs_raise_clear_errors() -> None:
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) { y = Sigmoid(x) }""")
    cm = dlcc.compile(m)
    with pytest.raises(DlccError, match="unknown input"):
        cm(z=np.zeros((2, 3), np.float32))
    with pytest.raises(DlccError, match="missing input 'x'"):
        cm({})
    with pytest.raises(DlccError, match=r"shape \[3, 2\].*\[2, 3\]"):
        cm(x=np.zeros((3, 2), np.float32))
    with pytest.raises(DlccError, match="float64 but the model expects float32"):
        cm(x=np.zeros((2, 3)))


def test_inputs_read_only_strided_or_as_keywords_give_the_same_outputs() -> None:
    """The call's fast path (every input a C-contiguous array of its dtype and shape) and the others (read-only,
    strided, keywords, a Mapping that is not a dict) give the same outputs; each call's outputs are its
    own, though the arena is reused by the thread's next calls."""
    from types import MappingProxyType

    model = randomize(KIT_MODELS["residual"](), seed=3)
    cm = dlcc.compile(model)
    (name, a), = random_inputs(model, seed=1).items()
    ref = cm({name: a})
    first = {k: v.copy() for k, v in ref.items()}
    ro = a.copy()
    ro.flags.writeable = False
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    for feeds in ({name: ro}, {name: wide[..., ::2]}, MappingProxyType({name: a})):
        got = cm(feeds)
        assert all(np.array_equal(got[k], first[k]) for k in ref)
    got = cm(**{name: a})
    assert all(np.array_equal(got[k], first[k]) for k in ref)
    other = cm({name: -a})  # (another call: ref's arrays are not overwritten)
    assert all(np.array_equal(ref[k], first[k]) for k in ref) and any(not np.array_equal(other[k], ref[k]) for k in ref)


def test_eight_threads_share_one_compiled_model() -> None:
    model = randomize(KIT_MODELS["residual"](), seed=3)
    cm = dlcc.compile(model)
    feeds = [random_inputs(model, seed=s) for s in range(8)]
    refs = [run_ort(model, f) for f in feeds]
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(5):
            results[i] = cm(feeds[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ref, got in zip(refs, results, strict=True):
        for k in ref:
            assert diff(k, ref[k], got[k], rtol=RTOL, atol=ATOL).ok


def test_reshape_is_a_view_and_concat_is_written_in_place() -> None:
    rng = np.random.default_rng(0)
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1,3,8,8] x) => (float[1,448] y) {
        a = Conv <kernel_shape = [3, 3], pads = [1, 1, 1, 1]> (x, w1)
        b = Conv <kernel_shape = [1, 1]> (x, w2)
        ra = Relu(a)
        rb = Relu(b)
        c = Concat <axis = 1> (ra, rb)
        d = Conv <kernel_shape = [1, 1]> (c, w3)
        y = Reshape(d, s)
    }""", w1=rng.standard_normal((5, 3, 3, 3)).astype(np.float32),
           w2=rng.standard_normal((11, 3, 1, 1)).astype(np.float32),
           w3=rng.standard_normal((7, 16, 1, 1)).astype(np.float32), s=np.array([1, 448], dtype=np.int64))
    cm = dlcc.compile(m, fusion="tvm")
    _check(m, cm)
    prog = cm.artifacts.program
    steps = [n.op_type for k in prog.kernels for s in k.steps for n in s.nodes]
    assert "Concat" not in steps, "the Concat should be written in place by its producers"
    views = [b for b in prog.buffers.values() if b.kind == "view"]
    assert len(views) >= 2  # the two concat inputs write into their slices


def test_outputs_that_are_inputs_or_repeated() -> None:
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y, float[2,3] z, float[2,3] x2, float[6] f) {
        y = Relu(x)
        z = Identity(y)
        x2 = Identity(x)
        f = Reshape(y, s)
    }""", s=np.array([6], dtype=np.int64))
    cm = dlcc.compile(m)
    _check(m, cm)


def test_cache_hit_and_tampered_entry_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DLCC_CACHE_DIR", str(tmp_path / "cache"))
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) { y = Tanh(x) }""")
    a = dlcc.compile(m)
    b = dlcc.compile(m)
    assert a.library == b.library and b.artifacts.timings["cc"] < 0.5
    a.library.unlink()  # tamper (a new file: the loaded one stays mapped): the hash check must catch it
    a.library.write_bytes(b"not a library")
    c = dlcc.compile(m)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(c(x=x)["y"], np.tanh(x), rtol=1e-6)
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0


def test_cache_dir_writable_by_others_is_refused(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("DLCC_CACHE_DIR", str(cache))
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) { y = Neg(x) }""")
    with pytest.raises(DlccError, match="writable by other users"):
        dlcc.compile(m)


def test_model_names_never_reach_c_unescaped() -> None:
    evil = 'x*/ #include "evil.h"\n\\ \u00e9'
    m = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", [evil], ["y */ int z;"], name="n */ system(\"rm\");")],
        "g\"*/", [onnx.helper.make_tensor_value_info(evil, onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("y */ int z;", onnx.TensorProto.FLOAT, [4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    cm = dlcc.compile(m)
    import re

    src = cm.artifacts.csource.source + cm.artifacts.csource.header
    comments = re.findall(r"/\*.*?\*/", src, flags=re.S)
    named = [c for c in comments if "evil" in c or "system(" in c]
    assert named and all("\n" not in c and "\\" not in c for c in named)  # one line each, no escapes
    code = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    assert "evil" not in code and "system(" not in code and "int z" not in code
    x = np.array([-1, 2, -3, 4], dtype=np.float32)
    np.testing.assert_array_equal(cm({evil: x})["y */ int z;"], np.maximum(x, 0))


def test_elementwise_kernel_writes_in_place_over_a_dying_input() -> None:
    """With a plan that leaves Relu+Mul alone in a kernel, its output takes over the buffer of the MatMul
    result that dies there (a view of it), and the results still match."""
    from dlcc.build.cc import build_shared
    from dlcc.build.runtime import CompiledModel, aligned_empty
    from dlcc.codegen.program import generate
    from dlcc.compiler import _lift_constants
    from dlcc.fusion.plan import build_plan
    from dlcc.lower.lower import lower
    from dlcc.memory.schedule import plan_program_memory

    rng = np.random.default_rng(0)
    m = _model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[8,16] x) => (float[8,4] y) {
        a = MatMul(x, w)
        r = Relu(a)
        s = Mul(r, a)
        y = MatMul(s, v)
    }""", w=rng.standard_normal((16, 32)).astype(np.float32), v=rng.standard_normal((32, 4)).astype(np.float32))
    model = dlcc.load(m)
    _lift_constants(model)
    nodes = list(model.graph)
    plan = build_plan(model.graph, [[nodes[0]], [nodes[1], nodes[2]], [nodes[3]]], "manual")
    program = lower(model, plan)
    s_buf = program.buffers[program.value_buffer[nodes[2].outputs[0]]]
    assert s_buf.kind == "view" and s_buf.base == program.value_buffer[nodes[0].outputs[0]]
    memory = plan_program_memory(program)
    src = generate(program, memory)
    lib = build_shared({"model.c": src.source, "model.h": src.header})
    weights = aligned_empty(max(len(src.weights), 1))
    weights[:len(src.weights)] = np.frombuffer(src.weights, dtype=np.uint8)
    cm = CompiledModel(lib, src.inputs, src.outputs, src.arena_bytes, weights)
    _check(m, cm)
    assert memory.arena_bytes == 8 * 32 * 4  # one [8,32] buffer holds a, then s


def test_workspace_is_declared_before_memory_planning_and_reported() -> None:
    """A packed GEMM's scratch is a buffer of the memory plan (in the arena and its lower bound), reported in
    compiled.info; the plan stays at the lower bound."""
    from dlcc.testing.models import mlp

    cm = dlcc.compile(mlp(batch=64, in_features=256, hidden=(256,), out_features=64), threads=2)
    info = cm.info
    assert info["workspace_bytes"] > 0 and info["workspace_peak_bytes"] > 0
    assert info["arena_bytes"] >= info["workspace_peak_bytes"]
    assert info["lower_bound_bytes"] >= info["workspace_peak_bytes"]
    assert info["arena_bytes"] <= 1.05 * info["lower_bound_bytes"]
    program = cm.artifacts.program
    ws = [s.workspace for k in program.kernels for s in k.steps if s.workspace is not None]
    assert ws and all(program.buffers[b].kind == "temp" for b in ws)
    assert all(b in cm.artifacts.memory.offsets for b in ws)  # placed in the arena like any temporary
