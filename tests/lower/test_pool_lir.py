"""The loop IR of the windowed and global pools (``dlcc.schedule.pool``): verified, then interpreted against
a direct numpy evaluation of the ONNX definition (pads, strides, dilations, ceil_mode, count_include_pad,
1-D to 3-D, strided inputs)."""

import itertools
import math

import numpy as np
import pytest

from dlcc.lower.lir import Buf, Layout, print_func, run_func, verify_func
from dlcc.schedule.pool import (
    PoolGeometry,
    global_pool_channels_last,
    global_pool_func,
    pool_counts,
    pool_func,
    window_range,
)


def _out_len(i, k, s, d, a, e, ceil):
    span = i + a + e - ((k - 1) * d + 1)
    o = (-(-span // s) if ceil else span // s) + 1
    return o - 1 if ceil and (o - 1) * s >= i + a else o


def _reference(x, g, end_pads, is_max, include):
    out = np.zeros((*x.shape[:2], *g.outs), np.float32)
    for t in itertools.product(*(range(o) for o in g.outs)):
        taps, count = [], 1
        for d in range(len(t)):
            lo, hi = (-g.pads[d], g.ins[d] + end_pads[d]) if include else (0, g.ins[d])
            count *= sum(lo <= t[d] * g.strides[d] - g.pads[d] + j * g.dils[d] < hi for j in range(g.ks[d]))
        for k in itertools.product(*(range(kk) for kk in g.ks)):
            pos = [t[d] * g.strides[d] + k[d] * g.dils[d] - g.pads[d] for d in range(len(t))]
            if all(0 <= p < n for p, n in zip(pos, g.ins, strict=True)):
                taps.append(x[(slice(None), slice(None), *pos)])
        at = (slice(None), slice(None), *t)
        if is_max:
            out[at] = np.max(taps, axis=0) if taps else -np.inf
        else:
            out[at] = (np.sum(taps, axis=0) if taps else 0) / count
    return out


def _physical(x, strides):
    """``x`` laid out at element ``strides`` in a flat array (NaN between its elements)."""
    flat = np.full(sum((n - 1) * s for n, s in zip(x.shape, strides, strict=True)) + 1, np.nan, np.float32)
    np.lib.stride_tricks.as_strided(flat, x.shape, [4 * s for s in strides])[...] = x
    return flat


POOLS = [
    # x shape, kernel, strides, dilations, begin pads, end pads, ceil_mode
    ((1, 2, 17), [4], [3], [1], [2], [1], 0),
    ((2, 3, 18), [3], [2], [1], [1], [1], 1),
    ((1, 2, 30), [3], [1], [4], [5], [5], 0),  # dilated taps entirely in the padding
    ((1, 1, 7), [3], [3], [1], [1], [0], 1),
    ((1, 2, 6, 5, 7), [2, 3, 2], [2, 1, 2], [1, 1, 1], [0, 1, 1], [1, 1, 0], 0),
    ((1, 2, 5, 7), [2, 2], [2, 2], [1, 1], [1, 1], [1, 1], 1),
    ((2, 1, 10, 9), [2, 3], [2, 2], [2, 1], [0, 0], [0, 0], 1),
    ((1, 2, 11, 12), [3, 3], [1, 1], [2, 2], [2, 1], [2, 1], 0),
]


@pytest.mark.parametrize("epilogue", [False, True])
@pytest.mark.parametrize("kind", ["avg", "avg_pad", "max"])
@pytest.mark.parametrize("pad_last", [1, 2])
@pytest.mark.parametrize(("xs", "ks", "st", "dl", "pb", "pe", "ceil"), POOLS)
def test_pool_func_matches_numpy(xs, ks, st, dl, pb, pe, ceil, pad_last, kind, epilogue):
    outs = [_out_len(i, k, s, d, a, e, ceil) for i, k, s, d, a, e in zip(xs[2:], ks, st, dl, pb, pe, strict=True)]
    g = PoolGeometry(tuple(xs[2:]), tuple(outs), tuple(ks), tuple(st), tuple(dl), tuple(pb))
    x = np.random.default_rng(sum(xs)).standard_normal(xs).astype(np.float32)
    strides = [math.prod(xs[d + 1:]) * pad_last for d in range(len(xs) - 1)] + [pad_last]  # every pad_last-th
    xb = Buf("x", "float32", Layout.strided(xs, strides))
    sb = Buf("s", "float32", Layout.strided((*xs[:2], *outs)))
    arrays = {"x": _physical(x, strides), "s": np.full(math.prod(sb.shape), np.nan, np.float32)}
    counts = None
    if kind != "max":
        counts = []
        for d, cs in enumerate(pool_counts(g, pe, kind == "avg_pad")):
            if len(set(cs)) == 1:
                counts.append(float(cs[0]))
            else:
                counts.append(Buf(f"cnt{d}", "float32", Layout.strided((len(cs),))))
                arrays[f"cnt{d}"] = np.array(cs, np.float32)
    f = pool_func(g, xb, sb, counts, epilogue)
    verify_func(f)
    got: dict = {}

    def take(idx, v):
        assert idx not in got
        got[idx] = v

    run_func(f, arrays, take)
    ref = _reference(x, g, pe, kind == "max", kind == "avg_pad")
    if epilogue:
        assert len(got) == ref.size
        res = np.zeros_like(ref)
        for idx, v in got.items():
            res[idx] = v
    else:
        assert not got
        res = arrays["s"].reshape(ref.shape)
    np.testing.assert_allclose(res, ref, rtol=1e-5, atol=1e-6)


def test_window_range_bounds_every_geometry():
    """The loop bounds pool_func computes from the tap equal window_range's (a sweep of 1-D geometries)."""
    for L, K, s, d, p in itertools.product([1, 4, 9], [1, 2, 3, 5], [1, 2, 3], [1, 2, 4], [0, 1, 3, 6]):
        if (K - 1) * d + 1 > L + 2 * p:
            continue
        T = (L + 2 * p - (K - 1) * d - 1) // s + 1
        g = PoolGeometry((L,), (T,), (K,), (s,), (d,), (p,))
        x = np.arange(1, L + 1, dtype=np.float32)
        xb = Buf("x", "float32", Layout.strided((1, 1, L)))
        sb = Buf("s", "float32", Layout.strided((1, 1, T)))
        arrays = {"x": x.copy(), "s": np.full(T, np.nan, np.float32)}
        run_func(pool_func(g, xb, sb, [1.0], False), arrays)
        ref = np.zeros(T, np.float32)
        for k in range(K):
            lo, hi = window_range(T, L, s, d, p, k)
            for t in range(lo, hi):
                ref[t] += x[t * s + k * d - p]
        np.testing.assert_array_equal(arrays["s"], ref, err_msg=str((L, K, s, d, p)))


@pytest.mark.parametrize("is_max", [False, True])
@pytest.mark.parametrize(("shape", "strides", "flat"), [
    ((2, 3, 35), None, True),         # partial sums, a tail
    ((1, 2, 64), None, True),         # partial sums, no tail
    ((2, 3, 5, 7), None, False),
    ((1, 13, 1, 1), None, False),
    ((1, 2, 7, 6), (168, 84, 12, 2), False),  # strided
    ((1, 2, 3), None, False),         # fewer elements than lanes
])
@pytest.mark.parametrize("threads", [1, 2])
def test_global_pool_func_matches_numpy(shape, strides, flat, is_max, threads):
    lanes = 16
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    xb = Buf("x", "float32", Layout.strided(shape, strides))
    xflat = _physical(x, strides) if strides else x.ravel().copy()
    f = global_pool_func(xb, lanes, is_max, threads=threads)
    verify_func(f)
    assert ("alloc acc" in print_func(f)) == flat
    assert ("parallel for" in print_func(f)) == (threads > 1)  # images, or channels of one image, in shares
    got = np.full(shape[:2], np.nan, np.float32)
    run_func(f, {"x": xflat}, lambda idx, v: got.__setitem__(idx, v))
    axes = tuple(range(2, len(shape)))
    ref = x.max(axis=axes) if is_max else x.mean(axis=axes)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("is_max", [False, True])
@pytest.mark.parametrize(("shape", "threads"), [((2, 20, 5, 7), 1), ((1, 37, 3, 3), 2), ((2, 16, 1, 9), 2),
                                                ((1, 3, 4), 1)])
def test_global_pool_reads_channels_last_pixel_by_pixel(shape, threads, is_max):
    """A channels-last input (channel stride 1): per image a stack row of running results, one vectorized loop
    over the channels per pixel, threads over shares of the channels; every (n, c) handed on once."""
    n, c, *sp = shape
    x = np.random.default_rng(c).standard_normal(shape).astype(np.float32)
    perm = (0, *range(2, len(shape)), 1)
    phys = np.ascontiguousarray(x.transpose(perm))
    strides = [0] * len(shape)
    for axis, st in zip(perm, (np.array(phys.strides) // 4).tolist(), strict=True):
        strides[axis] = st
    xb = Buf("x", "float32", Layout.strided(shape, strides))
    assert global_pool_channels_last(xb) and not global_pool_channels_last(Buf("x", "float32", Layout.strided(shape)))
    f = global_pool_func(xb, 8, is_max, threads=threads)
    verify_func(f)
    text = print_func(f)
    assert "acc" in text and "stack" in text and ("parallel for" in text) == (threads > 1)
    got = np.full(shape[:2], np.nan, np.float32)
    seen = []
    run_func(f, {"x": phys.ravel().copy()}, lambda idx, v: (seen.append(tuple(idx)), got.__setitem__(idx, v)))
    assert len(seen) == len(set(seen)) == n * c
    axes = tuple(range(2, len(shape)))
    np.testing.assert_allclose(got, x.max(axis=axes) if is_max else x.mean(axis=axes), rtol=1e-5, atol=1e-6)


def test_max_skips_nan():
    """The running maximum ``acc < x ? x : acc`` (a select of a float comparison): a NaN element is skipped, a
    window of NaNs gives -inf."""
    g = PoolGeometry((6,), (3,), (2,), (2,), (1,), (0,))
    x = np.array([np.nan, 1.0, np.nan, np.nan, 2.0, np.nan], np.float32)
    xb, sb = Buf("x", "float32", Layout.strided((1, 1, 6))), Buf("s", "float32", Layout.strided((1, 1, 3)))
    f = pool_func(g, xb, sb, None, False)
    verify_func(f)
    assert "select((s[" in print_func(f)
    arrays = {"x": x, "s": np.zeros(3, np.float32)}
    run_func(f, arrays)
    np.testing.assert_array_equal(arrays["s"], [1.0, -np.inf, 2.0])
