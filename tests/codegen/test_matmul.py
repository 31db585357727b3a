"""MatMul and Gemm templates against onnxruntime (sums in another order: rtol 1e-4)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from dlcc.codegen.cbase import TemplateError
from dlcc.testing.harness import assert_close, ort_output, run_node, runnable_targets

_ort = ort_output


def _close(got, ref, rtol=1e-4, atol=1e-6):
    assert_close(got, ref, rtol, atol)


def _build(op, operands, consts, attrs=None, dtype=TensorProto.FLOAT):
    """operands: list of (name, array); names in ``consts`` become initializers, the rest graph inputs."""
    inputs, inits, feeds = [], [], {}
    for name, arr in operands:
        if name in consts:
            inits.append(onnx.numpy_helper.from_array(arr, name))
        else:
            inputs.append(helper.make_tensor_value_info(name, dtype, arr.shape))
            feeds[name] = arr
    node = helper.make_node(op, [n for n, _ in operands], ["y"], **(attrs or {}))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", dtype, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


MATMUL = [
    ([7, 13], [13, 9]),
    ([1, 1], [1, 1]),
    ([13], [13, 9]),          # 1-D A
    ([7, 13], [13]),          # 1-D B
    ([13], [13]),             # dot
    ([5, 4, 3], [3]),         # batched matrix x vector
    ([3], [2, 3, 6]),         # vector x batched matrix
    ([2, 1, 5, 13], [3, 13, 37]),  # broadcast batch dims
    ([4, 6, 11], [4, 11, 17]),
    ([3, 5, 300], [300, 3]),  # few columns: dot-product path
    ([1, 300], [300, 1030]),  # several column panels + tail panel
    ([9, 130], [130, 257]),   # row tail (9 = 2*4 + 1), column tail
    ([2, 3, 20], [1, 20, 2]),
]


@pytest.mark.parametrize("sa,sb", MATMUL)
@pytest.mark.parametrize("b_const", [False, True])
def test_matmul(sa, sb, b_const):
    m, feeds = _build("MatMul", [("a", _rand(sa, 0)), ("b", _rand(sb, 1))], {"b"} if b_const else set())
    ref = _ort(m, feeds)
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref)


def test_matmul_k1():
    m, feeds = _build("MatMul", [("a", _rand([6, 1], 0)), ("b", _rand([1, 19], 1))], {"b"})
    ref = _ort(m, feeds)
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref)


def test_matmul_int_unsupported():
    a = np.ones((2, 3), np.int32)
    m, feeds = _build("MatMul", [("a", a), ("b", a.T.copy())], set(), dtype=TensorProto.INT32)
    with pytest.raises(TemplateError, match="float32"):
        run_node(m, feeds)


GEMM = [
    # (M, K, N, transA, transB, alpha, beta, C shape or None)
    (5, 7, 9, 0, 0, 1.0, 1.0, None),
    (5, 7, 9, 1, 0, 1.0, 1.0, [9]),
    (5, 7, 9, 0, 1, 0.5, 2.0, [1, 9]),
    (5, 7, 9, 1, 1, 1.0, 1.0, [5, 1]),
    (13, 31, 17, 0, 1, 2.0, 0.5, [13, 17]),
    (13, 31, 17, 0, 0, 1.0, 1.0, []),
    (4, 64, 3, 0, 1, 1.0, 1.0, [3]),         # dot-product path with transB
    (3, 40, 700, 0, 1, 1.0, 1.0, [700]),     # panels + tail with transB (Linear layer)
    (6, 8, 10, 0, 0, 1.0, 0.0, [6, 10]),     # beta 0: C ignored
    (1, 1, 1, 0, 0, -1.5, 1.0, [1]),
]


@pytest.mark.parametrize("m_,k,n,ta,tb,alpha,beta,cshape", GEMM)
@pytest.mark.parametrize("consts", [set(), {"b", "c"}])
def test_gemm(m_, k, n, ta, tb, alpha, beta, cshape, consts):
    a = _rand([k, m_] if ta else [m_, k], 0)
    b = _rand([n, k] if tb else [k, n], 1)
    ops = [("a", a), ("b", b)] + ([("c", _rand(cshape, 2))] if cshape is not None else [])
    attrs = {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
    m, feeds = _build("Gemm", ops, consts, attrs)
    ref = _ort(m, feeds)
    for target in runnable_targets():  # every vector width this machine runs
        _close(run_node(m, feeds, target=target), ref)


@pytest.mark.parametrize("op,sa,sb,attrs", [
    ("MatMul", [8, 64, 256], [256, 64], {}),         # panels, threads over the batch (B broadcast)
    ("MatMul", [16, 64, 256], [16, 256, 4], {}),     # dot products, threads over the batch
    ("Gemm", [64, 256], [256, 128], {}),             # run-time B: threads over ranges of row blocks
    ("Gemm", [3, 512], [1024, 512], {"transB": 1}),  # fewer row blocks than threads: over the panels
])
def test_small_products_on_two_threads(op, sa, sb, attrs):
    """The products of schedule.matmul split over the pool: the bits of one thread."""
    import dlcc

    m, feeds = _build(op, [("a", _rand(sa, 0)), ("b", _rand(sb, 1))], set(), attrs)
    one = dlcc.compile(m.SerializeToString(), threads=1)
    two = dlcc.compile(m.SerializeToString(), threads=2)
    assert "dlcc_parallel(" in two.artifacts.csource.source
    assert any("func matmul_" in s.loop_ir for k in two.artifacts.program.kernels for s in k.steps if s.loop_ir)
    got1 = one(feeds)["y"]
    _close(got1, _ort(m, feeds))
    np.testing.assert_array_equal(two(feeds)["y"], got1)
