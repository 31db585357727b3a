"""The thread pool of the generated runtime and the loops templates mark parallel: a model compiled for
two threads gives the same bits as the same model compiled for one (every output element is computed by
the same code; only which thread runs it changes), from one Python thread or several at once."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlcc
from dlcc.check import random_inputs, run_ort
from dlcc.codegen.threads import MARK, outline, par_for, split_parallel

# RTOL of tests/build: the compiled C sums in another order than onnxruntime
RTOL, ATOL = 1e-4, 1e-6


def test_split_and_outline_a_marked_loop() -> None:
    body = "static const int64_t t0[2] = {1, 2};\n" + par_for("o0", 7, "p_3[o0] = p_1[o0] * t0[0];") + "\nq();"
    loop = split_parallel(body)
    assert (loop.var, loop.extent, loop.suffix) == ("o0", 7, "q();")
    assert loop.prefix.startswith("static const int64_t t0")
    tasks, new = outline("dlcc_k5", "/* Mul */\n{\n" + body + "\n}\n", ["const float* restrict p_1",
                                                                     "float* restrict p_3"])
    assert MARK not in new and "dlcc_parallel(dlcc_k5_p0, &c_, 7);" in new
    assert "for (int64_t o0 = dlcc_lo; o0 < dlcc_hi; ++o0)" in tasks
    assert "struct dlcc_k5_p0_ctx { const float* p_1; float* p_3; };" in tasks
    assert split_parallel("for (int64_t i = 0; i < 3; ++i) {}") is None


def _typed(g: onnx.GraphProto) -> onnx.ModelProto:
    """The model of ``g`` with its output's type inferred (it is declared without a shape)."""
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    out = onnx.shape_inference.infer_shapes(m).graph.value_info
    y = next(vi for vi in out if vi.name == g.node[-1].input[0])  # the last node's input has the same shape
    g.output[0].type.CopyFrom(y.type)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _conv(x_shape, w_shape, **attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32) / 8, "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [w, b])
    return _typed(g)


def _conv_transpose(x_shape, w_shape, **attrs) -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal(w_shape).astype(np.float32) / 8, "w")
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [w])
    return _typed(g)


def _matmul(a_shape, b_shape, const_b=True) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    inits = []
    if const_b:
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(b_shape).astype(np.float32) / 16, "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
    nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], inits)
    return _typed(g)


CASES = {
    "conv3x3 rows": _conv([1, 32, 40, 40], [32, 32, 3, 3], pads=[1, 1, 1, 1]),
    "conv1x1 channel blocks": _conv([1, 64, 28, 28], [100, 64, 1, 1]),
    "conv small plane (im2col)": _conv([1, 128, 7, 7], [94, 128, 3, 3], pads=[1, 1, 1, 1]),
    "depthwise groups": _conv([1, 96, 40, 40], [96, 1, 3, 3], pads=[1, 1, 1, 1], group=96),
    "conv batch": _conv([3, 16, 32, 32], [32, 16, 3, 3], strides=[2, 2]),
    # the row kernel (schedule.convrows): threads over groups, channel blocks, depth rows, and rows
    "grouped conv": _conv([1, 64, 28, 28], [64, 8, 3, 3], pads=[1, 1, 1, 1], group=8),
    "conv 1-D": _conv([1, 32, 500], [40, 32, 5], pads=[2, 2]),
    "conv 3-D": _conv([1, 8, 6, 20, 20], [16, 8, 3, 3, 3], pads=[1, 1, 1, 1, 1, 1]),
    "conv transpose": _conv_transpose([1, 32, 20, 20], [32, 16, 4, 4], strides=[2, 2], pads=[1, 1, 1, 1]),
    "matmul rows": _matmul([130, 256], [256, 300]),
    "matmul few rows: panels": _matmul([3, 1024], [1024, 1000]),
    "batched matmul (heads)": _matmul([12, 64, 64], [12, 64, 64], const_b=False),
    "elementwise": _matmul([2, 128, 300], [300, 8]),
    "softmax rows": None,
}


def _softmax() -> onnx.ModelProto:
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 128, 130])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return _typed(g)


CASES["softmax rows"] = _softmax()


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_threads_give_the_bits_of_one(name) -> None:
    model = CASES[name]
    feeds = random_inputs(model, seed=2)
    one = dlcc.compile(model.SerializeToString(), threads=1)
    two = dlcc.compile(model.SerializeToString(), threads=2)
    assert "dlcc_parallel(" in two.artifacts.csource.source  # the case does reach the pool
    assert "pthread" not in one.artifacts.csource.source  # a one-thread build has no pool
    assert (one.threads, two.threads) == (1, 2)
    got1, got2 = one(feeds)["y"], two(feeds)["y"]
    ref = run_ort(model, feeds)["y"]
    assert np.max(np.abs(got1 - ref)) <= RTOL * np.max(np.abs(ref)) + ATOL
    np.testing.assert_array_equal(got1, got2)
    two.threads = 1  # lowered at run time: the same bits on one thread
    np.testing.assert_array_equal(two(feeds)["y"], got1)


def test_a_threaded_model_called_from_several_threads_at_once() -> None:
    model = CASES["conv3x3 rows"]
    cm = dlcc.compile(model.SerializeToString(), threads=2)
    feeds = [random_inputs(model, seed=s) for s in range(4)]
    want = [cm(f)["y"] for f in feeds]
    errors = []

    def work(i: int) -> None:
        for _ in range(20):
            if not np.array_equal(cm(feeds[i])["y"], want[i]):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_threads_must_be_positive() -> None:
    with pytest.raises(dlcc.DlccError, match="at least 1"):
        dlcc.compile(CASES["elementwise"].SerializeToString(), threads=0)


# a C program driving the pool alone: many back-to-back dispatches of different tasks, contexts and sizes, each
# chunk marking the iterations it ran; the run checks each was run exactly once, by its own dispatch's task
_POOL_STRESS = r"""
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#define DLCC_THREADS 2
#include <stdlib.h>
POOL_C_HERE
typedef struct { int64_t dispatch; int32_t *hits; int64_t n; } stress_ctx;
static void task_a(void *p, int64_t lo, int64_t hi) {
    stress_ctx *c = (stress_ctx *)p;
    for (int64_t i = lo; i < hi; ++i) c->hits[i] += 1;
}
static void task_b(void *p, int64_t lo, int64_t hi) {
    stress_ctx *c = (stress_ctx *)p;
    for (int64_t i = lo; i < hi; ++i) c->hits[i] += 1000;
}
int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 200000;
    static int32_t hits[2][64];
    int owned = dlcc_pool_enter();
    long bad = 0;
    for (long r = 0; r < rounds; ++r) {
        int which = (int)(r & 1);
        int64_t n = 2 + (r * 7) % 13;  /* 2 .. 14 iterations: 2 to 8 chunks */
        memset(hits[which], 0, sizeof hits[which]);
        stress_ctx c = {r, hits[which], n};
        dlcc_parallel(which ? task_b : task_a, &c, n);
        for (int64_t i = 0; i < 64; ++i) {
            int32_t want = i < n ? (which ? 1000 : 1) : 0;
            if (hits[which][i] != want) { ++bad; break; }
        }
    }
    dlcc_pool_leave(owned);
    printf("%ld bad of %ld\n", bad, rounds);
    return bad != 0;
}
"""


def test_pool_runs_every_chunk_once_by_its_own_dispatch(tmp_path) -> None:
    """Back-to-back dispatches: every iteration runs exactly once, through its own dispatch's task and context,
    and the dispatch returns only after all its chunks ran. (A worker that found the last dispatch's chunks taken
    could read the next dispatch's chunk count while the ticket still held the last one, claim a chunk of a
    dispatch that did not exist with the next one's task and the last one's context, and count it as done: then a
    dispatch returned with a chunk still running, one chunk in about 2e4 dispatches on a busy 2-core machine.)"""
    import subprocess

    from dlcc.build.cc import compiler
    from dlcc.codegen.threads import POOL_C

    src = tmp_path / "pool.c"
    src.write_text(_POOL_STRESS.replace("POOL_C_HERE", POOL_C))
    exe = tmp_path / "pool"
    subprocess.run([compiler(), "-O2", "-std=c11", "-pthread", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe), "400000"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
