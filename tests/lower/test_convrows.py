"""The row kernel of Conv and ConvTranspose (``schedule.convrows``): its loop IR verified and interpreted against
a float64 numpy evaluation of the ONNX definitions (groups, 1-D to 3-D, strides, dilations, asymmetric pads,
ConvTranspose output padding; packed and run-time weights; contiguous and strided inputs; threads)."""

import itertools
import math

import numpy as np
import pytest

from dlcc.lower.lir import Buf, Layout, print_func, run_func, verify_func
from dlcc.schedule.convrows import (
    UNIT,
    conv_phases,
    conv_rows_plan,
    convt_phases,
    pack_rows,
    plan_rows,
    rows_func,
    weight_layout,
)
from dlcc.schedule.target import get_target


def conv_ref(x, w, group, s, d, pb, pe):
    """ONNX Conv (any rank) in float64: w (M, Cg, *K)."""
    n, c, *ins = x.shape
    m, cg, *ks = w.shape
    mg = m // group
    outs = [(i + a + e - (k - 1) * dd - 1) // ss + 1 for i, k, ss, dd, a, e in zip(ins, ks, s, d, pb, pe, strict=True)]
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(pb, pe, strict=True)])
    y = np.zeros((n, m, *outs))
    for k in itertools.product(*(range(kk) for kk in ks)):
        sl = tuple(slice(kk * dd, kk * dd + ss * (o - 1) + 1, ss) for kk, dd, ss, o in zip(k, d, s, outs, strict=True))
        patch = xp[(slice(None), slice(None), *sl)]
        for g in range(group):
            y[:, g * mg:(g + 1) * mg] += np.einsum("nc...,mc->nm...", patch[:, g * cg:(g + 1) * cg],
                                                   w[(slice(g * mg, (g + 1) * mg), slice(None), *k)])
    return y


def convt_ref(x, w, group, s, d, pb, outs):
    """ONNX ConvTranspose (any rank) in float64 by scattering: w (C, Mg, *K); output (N, Mg*group, *outs)."""
    n, c, *ins = x.shape
    _, mg, *ks = w.shape
    cg = c // group
    full = [(i - 1) * ss + (k - 1) * dd + 1 for i, k, ss, dd in zip(ins, ks, s, d, strict=True)]
    y = np.zeros((n, mg * group, *[max(f, o + a) for f, o, a in zip(full, outs, pb, strict=True)]))
    for i in itertools.product(*(range(ii) for ii in ins)):
        for k in itertools.product(*(range(kk) for kk in ks)):
            o = tuple(ii * ss + kk * dd for ii, kk, ss, dd in zip(i, k, s, d, strict=True))
            for g in range(group):
                xv = x[(slice(None), slice(g * cg, (g + 1) * cg), *i)].astype(np.float64)  # (n, cg)
                y[(slice(None), slice(g * mg, (g + 1) * mg), *o)] += xv @ w[(slice(g * cg, (g + 1) * cg), slice(None),
                                                                              *k)]
    return y[(slice(None), slice(None), *(slice(a, a + o) for a, o in zip(pb, outs, strict=True)))]


def _run(x, w, group, phases, transposed, *, target, threads, packed, x_stride, stage):
    """Build, verify and interpret the row kernel; returns (outputs (N, M, *spatial), listing)."""
    r = x.ndim - 2
    n, c, *ins = x.shape
    ks = w.shape[2:]
    cg = c // group
    mg = w.shape[1] if transposed else w.shape[0] // group
    pad = 3 - r
    ins3, ks3 = (1,) * pad + tuple(ins), (1,) * pad + tuple(ks)
    phases3 = ((UNIT,),) * pad + tuple(phases)
    p = plan_rows(n, group, cg, mg, ins3, ks3, phases3, get_target(target), threads, stage)
    xs = [math.prod(x.shape[dd + 1:]) * x_stride for dd in range(x.ndim - 1)] + [x_stride]
    flat = np.full((x.size - 1) * x_stride + 1 + 3, np.nan, np.float32)  # NaN between elements: never read
    np.lib.stride_tricks.as_strided(flat, x.shape, [4 * v for v in xs])[...] = x
    xb = Buf("x", "float32", Layout.strided((n, c, *ins3), (xs[0], xs[1], *[0] * pad, *xs[2:])))
    if packed:
        wg = w.reshape(group, cg, mg, *ks).transpose(0, 2, 1, *range(3, 3 + r)) if transposed else \
            w.reshape(group, mg, cg, *ks)
        warr = pack_rows(wg.reshape(group, mg, cg, *ks3), p).ravel()
        wb = Buf("w", "float32", Layout.strided(p.weight_shape))
    else:
        wst = [math.prod(w.shape[dd + 1:]) for dd in range(w.ndim)]
        lay = weight_layout((wst[0], wst[1], *[0] * pad, *wst[2:]), transposed, p)
        warr = np.full(max(lay.span, w.size), np.nan, np.float32)
        warr[:w.size] = w.ravel()
        wb = Buf("w", "float32", lay)
    ws = Buf("ws", "float32", Layout.strided(p.stage_shape), "workspace") if p.staged else None
    f = rows_func(p, xb, wb, ws)
    verify_func(f)
    outs = [sum(ph.count for ph in phs) for phs in phases]
    y = np.full((n, mg * group, *outs), np.nan)
    seen = set()

    def take(idx, v):
        idx = (idx[0], idx[1], *idx[2 + pad:])
        assert idx not in seen
        seen.add(idx)
        y[idx] = v

    run_func(f, {"x": flat, "w": warr}, take)
    assert len(seen) == y.size  # every output handed to the epilogue once
    return y, print_func(f)


# per target (16, 8, 4, 4 lanes) one variant: the input staged or read along rows (then interior tiles read it
# directly, border tiles through a window; an input with every other element: every tile through a window),
# one thread or two, the weight packed or the run-time weight read through its strides
VARIANTS = {"x86-64-v4": {"threads": 1, "packed": True, "x_stride": 1, "stage": True},
            "x86-64-v3": {"threads": 2, "packed": False, "x_stride": 1, "stage": False},
            "generic": {"threads": 2, "packed": True, "x_stride": 2, "stage": True},
            "aarch64": {"threads": 1, "packed": False, "x_stride": 2, "stage": False}}

CONVS = [  # x shape, M, kernel, group, strides, dilations, begin pads, end pads
    ((1, 3, 9, 20), 5, (3, 3), 1, (1, 1), (1, 1), (1, 1), (1, 1)),
    ((2, 6, 7, 21), 6, (3, 3), 3, (1, 1), (1, 1), (1, 1), (1, 1)),  # groups, batch
    ((1, 4, 13, 11), 6, (3, 3), 2, (2, 2), (1, 1), (1, 0), (1, 2)),  # strided, asymmetric pads
    ((1, 4, 12, 30), 8, (3, 3), 4, (1, 1), (2, 3), (2, 3), (2, 3)),  # dilations
    ((1, 2, 5, 5), 3, (7, 7), 1, (1, 1), (1, 1), (3, 3), (3, 3)),  # kernel larger than the input
    ((2, 3, 17), 4, (5,), 1, (2,), (1,), (2,), (1,)),  # 1-D
    ((1, 4, 40), 20, (4,), 2, (3,), (1,), (1,), (2,)),  # 1-D, strided, 10 channels per group: a tail block
    ((1, 2, 5, 6, 7), 3, (3, 3, 3), 1, (1, 2, 1), (1, 1, 1), (1, 0, 1), (1, 1, 0)),  # 3-D
    ((1, 4, 4, 5, 6), 4, (2, 3, 3), 2, (2, 1, 1), (1, 2, 1), (1, 1, 1), (0, 1, 1)),  # 3-D, groups, dilation
    ((1, 8, 6, 37), 16, (1, 1), 4, (1, 1), (1, 1), (0, 0), (0, 0)),  # grouped 1x1, long row
    ((1, 3, 4, 37), 6, (2, 3), 1, (1, 3), (1, 1), (0, 2), (1, 1)),  # stride 3 along the row
]


@pytest.mark.parametrize("target", list(VARIANTS))
@pytest.mark.parametrize(("xs", "m", "ks", "group", "st", "dl", "pb", "pe"), CONVS)
def test_conv_rows_match_numpy(xs, m, ks, group, st, dl, pb, pe, target):
    rng = np.random.default_rng(sum(xs) + m)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((m, xs[1] // group, *ks)).astype(np.float32)
    ref = conv_ref(x, w, group, st, dl, pb, pe)
    phases = [conv_phases(o, k, s, d, a) for o, k, s, d, a in zip(ref.shape[2:], ks, st, dl, pb, strict=True)]
    got, _ = _run(x, w, group, phases, False, target=target, **VARIANTS[target])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


CONVTS = [  # x shape, Mg, kernel, group, strides, dilations, begin pads, end pads, output padding
    ((1, 3, 5, 5), 4, (3, 3), 1, (1, 1), (1, 1), (0, 0), (0, 0), (0, 0)),
    ((2, 3, 5, 4), 2, (3, 3), 1, (2, 2), (1, 1), (1, 1), (1, 1), (0, 0)),
    ((1, 4, 5, 5), 3, (3, 3), 2, (2, 3), (1, 1), (0, 0), (0, 0), (1, 2)),  # groups, output padding
    ((1, 4, 6, 5), 1, (3, 3), 4, (1, 1), (2, 1), (1, 0), (2, 1), (0, 0)),  # one channel per group, dilation
    ((1, 3, 5, 9), 4, (3, 5), 1, (3, 2), (2, 3), (1, 2), (0, 3), (0, 0)),  # steps of taps and offsets
    ((1, 2, 2, 2), 3, (1, 1), 1, (4, 4), (1, 1), (0, 0), (0, 0), (0, 0)),  # outputs no tap reaches
    ((1, 3, 7), 2, (4,), 1, (3,), (1,), (1,), (2,), (0,)),  # 1-D
    ((1, 2, 3, 4, 3), 2, (2, 3, 2), 1, (2, 1, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0), (1, 0, 1)),  # 3-D
    ((1, 5, 2, 20), 9, (2, 3), 1, (1, 2), (1, 1), (0, 0), (0, 0), (0, 1)),  # a long row, a tail block
]


@pytest.mark.parametrize("target", list(VARIANTS))
@pytest.mark.parametrize(("xs", "mg", "ks", "group", "st", "dl", "pb", "pe", "op"), CONVTS)
def test_conv_transpose_rows_match_numpy(xs, mg, ks, group, st, dl, pb, pe, op, target):
    rng = np.random.default_rng(sum(xs) + mg)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((xs[1], mg, *ks)).astype(np.float32)
    outs = [s * (i - 1) + a + (k - 1) * d + 1 - b - e
            for i, k, s, d, b, e, a in zip(xs[2:], ks, st, dl, pb, pe, op, strict=True)]
    ref = convt_ref(x, w, group, st, dl, pb, outs)
    phases = [convt_phases(o, k, s, d, b) for o, k, s, d, b in zip(outs, ks, st, dl, pb, strict=True)]
    got, _ = _run(x, w, group, phases, True, target=target, **VARIANTS[target])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_convt_phases_cover_every_output():
    """The phases of a ConvTranspose dim partition its outputs, and their taps are the (k, i) with
    o = i*s - p + k*d."""
    for o_len, k, s, d, p in itertools.product([1, 5, 9], [1, 2, 3, 5], [1, 2, 3, 4], [1, 2, 3], [0, 1, 2]):
        seen = []
        for ph in convt_phases(o_len, k, s, d, p):
            for u in range(ph.count):
                o = ph.oo + ph.os * u
                seen.append(o)
                got = {(ph.k0 + j * ph.kstep, u * ph.sl + ph.off0 + j * ph.dstep) for j in range(ph.n)}
                want = {(kk, (o + p - kk * d) // s) for kk in range(k) if (o + p - kk * d) % s == 0}
                assert got == want, (o_len, k, s, d, p, o)
        assert sorted(seen) == list(range(o_len))


def test_rows_listing_shows_the_tile_kinds():
    """A padded row: border tiles through a zero-ringed window, interior tiles read the input directly."""
    x = np.zeros((1, 2, 2, 120), np.float32)
    w = np.zeros((4, 2, 3, 3), np.float32)
    phases = [conv_phases(2, 3, 1, 1, 1), conv_phases(120, 3, 1, 1, 1)]
    _, text = _run(x, w, 1, phases, False, target="x86-64-v3", threads=1, packed=True, x_stride=1, stage=False)
    assert "alloc win" in text and "for xt" in text and "x<8>[" in text


def test_staged_listing_reads_only_the_workspace():
    """Staged: the input copied once with its zero ring; the tiles run along the flattened plane, no window."""
    x = np.zeros((1, 4, 9, 9), np.float32)
    w = np.zeros((8, 2, 3, 3), np.float32)
    phases = [conv_phases(5, 3, 2, 1, 1), conv_phases(5, 3, 2, 1, 1)]
    _, text = _run(x, w, 2, phases, False, target="x86-64-v3", threads=1, packed=True, x_stride=1, stage=True)
    assert "workspace ws: float32[1, 4, 4, 1," in text  # 2 x 2 input phases of a stride-2 convolution
    assert "alloc win" not in text and "ws<8>[" in text


def _node(op, xs, ws, ys, **attrs):
    import onnx_ir as ir

    x, w = ir.Value(name="x", shape=ir.Shape(xs)), ir.Value(name="w", shape=ir.Shape(ws))
    node = ir.Node("", op, [x, w], [ir.AttrInt64(k, v) if isinstance(v, int) else ir.AttrInt64s(k, v)
                                    for k, v in attrs.items()])
    node.outputs[0].shape = ir.Shape(ys)
    return node


def test_plan_choices_and_declared_workspace():
    """What the schedule stage declares (``node_workspace_bytes``) is what the row kernel's plan stages."""
    from dlcc.schedule.pads import node_attr
    from dlcc.schedule.workspace import node_workspace_bytes

    t = get_target("x86-64-v4")

    def plan(op, xs, ws, ys, threads=1, **attrs):
        node = _node(op, xs, ws, ys, **attrs)
        p = conv_rows_plan(op, node_attr(node), xs, ws, ys, t, threads, flat=True)
        assert node_workspace_bytes(node, lambda v: v.name == "w", t, threads) == p.workspace_bytes
        return p

    p = plan("Conv", (1, 128, 56, 56), (128, 4, 3, 3), (1, 128, 56, 56), group=32, pads=[1, 1, 1, 1])
    assert p.staged and (p.nb, p.pv) == (4, 4) and p.stage_shape == (1, 128, 1, 1, p.plane)
    p = plan("Conv", (1, 256, 28, 28), (256, 8, 3, 3), (1, 256, 14, 14), 2, group=32, pads=[1, 1, 1, 1],
             strides=[2, 2])
    assert p.staged and p.par == "g" and p.stage_shape[2] == 4  # 2 x 2 input phases
    p = plan("Conv", (1, 240, 28, 28), (240, 80, 1, 1), (1, 240, 28, 28), group=3)
    assert not p.staged and p.ins == (1, 1, 784)  # a 1x1 convolution: the pixels as one row, read in place
    p = plan("ConvTranspose", (1, 32, 20, 20), (32, 16, 4, 4), (1, 16, 40, 40), 2, strides=[2, 2], pads=[1, 1, 1, 1])
    assert not p.staged and p.par == "rows"  # only rows to split: along rows, not a flattened plane
    p = plan("Conv", (1, 8, 6, 20, 20), (16, 8, 3, 3, 3), (1, 16, 6, 20, 20), 2, pads=[1] * 6)
    assert p.staged and p.par == "rows" and p.row_dim == 0  # threads over depth
    depthwise = _node("Conv", (1, 8, 9, 9), (8, 1, 3, 3), (1, 8, 9, 9), group=8, pads=[1, 1, 1, 1])
    # depthwise: the channel-blocked form's one repacked block (9 x 9 with its ring: 11 x 11 pixels of lanes floats)
    assert node_workspace_bytes(depthwise, lambda v: v.name == "w", t, 1) == 4 * 11 * 11 * t.lanes
