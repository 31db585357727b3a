"""The loop IR of the reductions and normalizations (``dlcc.schedule.reduce``): verified, then interpreted
against numpy on reduced last axes (partial lane accumulators, with and without a remainder), non-last axes
(accumulator arrays over the tail), several axes, keepdims, threads, the cached row, ArgMax/ArgMin and LRN."""

import numpy as np
import pytest

from dlcc.lower.lir import Buf, Layout, print_func, run_func, verify_func
from dlcc.schedule.reduce import RowOp, arg_func, lrn_func, row_func


def _run(f, inputs, out_shape, dtype=np.float32, arrays=None):
    """Interpret ``f``; the epilogue must receive every output element exactly once."""
    out = np.zeros(out_shape, dtype)
    seen = np.zeros(out_shape, np.int64)

    def epilogue(idx, v):
        out[idx] = v
        seen[idx] += 1
    run_func(f, arrays or {}, epilogue, inputs)
    assert (seen == 1).all()
    return out


def _close(got, ref, rtol=1e-4, atol=1e-6):
    assert got.shape == ref.shape
    assert np.max(np.abs(got - ref), initial=0.0) <= rtol * np.max(np.abs(ref), initial=0.0) + atol


REDUCE = {
    "ReduceSum": lambda x, a: np.sum(x, axis=a),
    "ReduceMean": lambda x, a: np.mean(x, axis=a),
    "ReduceMax": lambda x, a: np.max(x, axis=a),
    "ReduceMin": lambda x, a: np.min(x, axis=a),
    "ReduceProd": lambda x, a: np.prod(x, axis=a),
    "ReduceL1": lambda x, a: np.sum(np.abs(x), axis=a),
    "ReduceL2": lambda x, a: np.sqrt(np.sum(x * x, axis=a)),
    "ReduceSumSquare": lambda x, a: np.sum(x * x, axis=a),
    "ReduceLogSum": lambda x, a: np.log(np.sum(x, axis=a)),
    "ReduceLogSumExp": lambda x, a: np.log(np.sum(np.exp(x), axis=a)),
}

CASES = [  # op, shape, axes, keepdims, lanes, threads
    ("ReduceSum", (3, 2, 21), (2,), True, 4, 1),  # last axis: 5 lane blocks and a remainder of 1
    ("ReduceSum", (2, 7, 13), (0, 2), False, 4, 1),  # several axes, the last one in lanes
    ("ReduceMean", (2, 9, 5), (1,), False, 4, 1),  # a non-last axis: an accumulator array over the tail
    ("ReduceMean", (2, 3, 4, 5), (1, 3), True, 8, 1),
    ("ReduceMax", (5, 3, 19), (1, 2), False, 8, 1),
    ("ReduceMax", (4, 6), (0,), True, 4, 1),
    ("ReduceMin", (6, 7, 8), (0, 1, 2), False, 4, 1),  # everything: a scalar result
    ("ReduceProd", (3, 17), (1,), True, 4, 1),
    ("ReduceL1", (5, 6, 7), (0, 2), True, 4, 1),
    ("ReduceL2", (3, 40), (1,), True, 8, 1),  # 40 = 5 lane blocks, no remainder
    ("ReduceSumSquare", (2, 3, 11), (2,), False, 4, 1),
    ("ReduceLogSum", (6, 5, 4), (1,), False, 4, 1),
    ("ReduceLogSumExp", (3, 20), (1,), False, 4, 1),
    ("ReduceLogSumExp", (4, 6, 3), (0, 1), True, 4, 1),
    ("ReduceSum", (12, 9), (1,), True, 4, 2),  # rows over threads: 8 ranges of rows
    ("ReduceMean", (5, 6, 3), (1,), False, 4, 2),  # 5 rows over threads: one each
]


@pytest.mark.parametrize("op,shape,axes,keep,lanes,threads", CASES)
def test_reductions_match_numpy(op, shape, axes, keep, lanes, threads):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op == "ReduceProd":
        x = 1 + 0.05 * x
    f = row_func(RowOp(op, shape, axes, keepdims=keep), lanes, threads)
    verify_func(f)
    assert ("parallel for" in print_func(f)) == (threads > 1)
    ref = REDUCE[op](x.astype(np.float64), axes)
    ref = np.expand_dims(ref, axes) if keep else ref
    _close(_run(f, {0: x}, ref.shape), ref.astype(np.float32))


@pytest.mark.parametrize("op,axes,keep", [("ReduceSum", (1,), False), ("ReduceMax", (0,), True),
                                          ("ReduceMin", (0, 1), False)])
def test_int64_reductions_are_exact(op, axes, keep):
    x = np.random.default_rng(1).integers(-1000, 1000, (5, 11)).astype(np.int64)
    f = row_func(RowOp(op, x.shape, axes, "int64", keep), 4)
    verify_func(f)
    ref = REDUCE[op](x, axes)
    ref = np.expand_dims(ref, axes) if keep else ref
    np.testing.assert_array_equal(_run(f, {0: x}, ref.shape, np.int64), ref)


@pytest.mark.parametrize("op,fn", [("ReduceL1", np.abs), ("ReduceSumSquare", np.square), ("ReduceMax", lambda v: v)])
def test_nothing_reduced_is_the_elementwise_part(op, fn):
    x = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)
    f = row_func(RowOp(op, x.shape, ()), 4)
    verify_func(f)
    np.testing.assert_array_equal(_run(f, {0: x}, x.shape), fn(x))


def _softmax(x, axes):
    e = np.exp(x - np.max(x, axis=axes, keepdims=True))
    return e / np.sum(e, axis=axes, keepdims=True)


NORMS = [  # shape, axes, lanes, threads
    ((2, 3, 21), (2,), 4, 1),  # the row cached, lanes with a remainder
    ((2, 3, 5), (1,), 4, 1),  # a non-last axis: accumulator arrays, no cache
    ((3, 4, 5), (1, 2), 8, 1),
    ((2, 16), (1,), 8, 1),
    ((6, 10), (1,), 4, 2),
]


@pytest.mark.parametrize("shape,axes,lanes,threads", NORMS)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_matches_numpy(op, shape, axes, lanes, threads):
    x = (np.random.default_rng(3).standard_normal(shape) * 3).astype(np.float32)
    f = row_func(RowOp(op, shape, axes), lanes, threads)
    verify_func(f)
    ref = _softmax(x.astype(np.float64), axes)
    _close(_run(f, {0: x}, shape), (ref if op == "Softmax" else np.log(ref)).astype(np.float32), rtol=1e-5)


@pytest.mark.parametrize("shape,axes,lanes,threads", NORMS)
@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_layer_and_rms_norm_match_numpy(op, shape, axes, lanes, threads):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    pshape = shape[axes[0]:]
    scale, bias = (rng.standard_normal(pshape).astype(np.float32) for _ in range(2))
    params = (pshape, pshape) if op == "LayerNormalization" else (pshape,)
    f = row_func(RowOp(op, shape, axes, eps=1e-3, params=params), lanes, threads)
    verify_func(f)
    x64 = x.astype(np.float64)
    if op == "LayerNormalization":
        mean = x64.mean(axis=axes, keepdims=True)
        ref = (x64 - mean) / np.sqrt(((x64 - mean) ** 2).mean(axis=axes, keepdims=True) + 1e-3) * scale + bias
    else:
        ref = x64 / np.sqrt((x64 ** 2).mean(axis=axes, keepdims=True) + 1e-3) * scale
    _close(_run(f, {0: x, 1: scale, 2: bias}, shape), ref.astype(np.float32), rtol=1e-5)


def test_layer_norm_broadcasts_its_scale():
    x = np.random.default_rng(5).standard_normal((2, 3, 8)).astype(np.float32)
    f = row_func(RowOp("LayerNormalization", x.shape, (1, 2), eps=1e-5, params=((1, 8), (1,))), 4)
    verify_func(f)
    scale, bias = np.arange(8, dtype=np.float32).reshape(1, 8), np.array([0.5], np.float32)
    mean = x.mean(axis=(1, 2), keepdims=True)
    ref = (x - mean) / np.sqrt(x.var(axis=(1, 2), keepdims=True) + 1e-5) * scale + bias
    _close(_run(f, {0: x, 1: scale, 2: bias}, x.shape), ref, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 40)])
def test_instance_norm_matches_numpy(shape):
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    scale, bias = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    axes = tuple(range(2, len(shape)))
    f = row_func(RowOp("InstanceNormalization", shape, axes, eps=1e-4, params=((shape[1],), (shape[1],))), 4)
    verify_func(f)
    bshape = (1, shape[1]) + (1,) * len(axes)
    ref = ((x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + 1e-4)
           * scale.reshape(bshape) + bias.reshape(bshape))
    _close(_run(f, {0: x, 1: scale, 2: bias}, shape), ref, rtol=1e-5)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape,axis,keep,last", [((3, 17), 1, True, False), ((3, 17), 1, False, True),
                                                  ((4, 7, 5), 1, False, False), ((4, 7, 5), 0, True, True),
                                                  ((13,), 0, False, False)])
def test_arg_reductions_match_numpy(op, shape, axis, keep, last):
    x = np.random.default_rng(7).integers(-3, 4, shape).astype(np.float32)  # ties: select_last_index matters
    f = arg_func(op, shape, axis, keep, last)
    verify_func(f)
    fn = np.argmax if op == "ArgMax" else np.argmin
    ref = shape[axis] - 1 - fn(np.flip(x, axis), axis=axis) if last else fn(x, axis=axis)
    ref = np.expand_dims(ref, axis) if keep else ref
    np.testing.assert_array_equal(_run(f, {0: x}, ref.shape, np.int64), ref)


@pytest.mark.parametrize("shape,size,beta,threads", [
    ((2, 5, 4, 3), 3, 0.75, 1), ((1, 6, 7), 4, 0.75, 2), ((1, 3, 2, 2), 1, 0.75, 1),
    ((1, 9, 5, 5), 5, 0.5, 2), ((2, 4, 3, 3), 3, 1.0, 2), ((1, 7, 4, 4), 5, 0.6, 1)])  # (exp and log)
def test_lrn_matches_numpy(shape, size, beta, threads):
    """beta 0.75, 0.5 and 1 through square roots and a division, others through exp and log (``lrn_scale``);
    threads over images, or channels for one image."""
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32) * 3
    xb, sb = Buf("x", "float32", Layout.strided(shape)), Buf("s", "float32", Layout.strided(shape))
    alpha, bias = 1e-1, 2.0
    f = lrn_func(xb, sb, size, alpha, beta, bias, threads=threads)
    verify_func(f)
    assert ("parallel" in print_func(f)) == (threads > 1) and "pow" not in print_func(f)
    C = shape[1]
    sq = np.zeros_like(x, dtype=np.float64)
    for c in range(C):
        lo, hi = max(0, c - (size - 1) // 2), min(C - 1, c + size - 1 - (size - 1) // 2)
        sq[:, c] = (x[:, lo:hi + 1].astype(np.float64) ** 2).sum(axis=1)
    ref = x / (bias + alpha / size * sq) ** beta
    got = _run(f, {}, shape, arrays={"x": x.ravel().copy(), "s": np.full(x.size, np.nan, np.float32)})
    _close(got, ref.astype(np.float32), rtol=1e-5)
