"""Zero padding rings (``schedule.rings``): the depthwise tile reading a channels-last input where it is against its
contract, the plan (which buffers get a ring, the repacking and its workspace gone, the arena), and whole models
against onnxruntime on every target the machine runs, with the arena poisoned so that a ring left unzeroed shows."""

from __future__ import annotations

import ctypes
import re
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_lir import PRELUDE, _assert_tile, _build

import dlcc
import dlcc.codegen.program as program
import dlcc.schedule.blocked as blocked
import dlcc.schedule.rings as rings
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.compiler import build_artifacts
from dlcc.lower.interp import interpret
from dlcc.lower.lir import MICRO, verify_func
from dlcc.lower.micro import DCONV_PAD, dwc_micro
from dlcc.schedule.layouts import describe_layouts, layout_figures
from dlcc.schedule.rings import ring_func
from dlcc.schedule.target import get_target
from dlcc.testing.harness import assert_close, ort_output, runnable_targets


@pytest.mark.parametrize("target", runnable_targets())
def test_in_place_depthwise_tiles_match_their_contract(target):
    """dwc_ and dwcp_ reading pixels ``xpix`` floats apart (a channels-last input's channels), strided too, against
    their references; the name says the stride; nothing written outside the footprint."""
    t = get_target(target)
    if t.lanes < 4:
        pytest.skip(f"{target}: one float per vector, the channel-blocked kernels do not run")
    rng = np.random.default_rng(5)
    L = t.lanes
    cases = [(5, 3, 3, 1, 1, 1, 2 * L, False), (4, 3, 3, 2, 1, 1, 3 * L, True), (3, 5, 5, 1, 2, 2, 2 * L, False)]
    src = PRELUDE + vector_helpers(L) + "\n"
    names = []
    for px, kh, kw, sw, dh, dw, xpix, pm in cases:
        xrow = ((px - 1) * sw + (kw - 1) * dw + 1) * xpix + xpix
        name = dwc_micro(L, px, kh, kw, sw, dh, dw, xrow, pixel_major=pm, xpix=xpix)
        assert name.endswith(f"_x{xpix}") and name.startswith("dwcp_" if pm else "dwc_")
        assert dwc_micro(L, px, kh, kw, sw, dh, dw, xrow, pixel_major=pm, xpix=L) == name.rsplit("_x", 1)[0]
        names.append((name, xrow, px, kh, kw, dh, pm))
        src += micro_c(name, L) + (f"void w_{name}(const float* x, const float* w, float* c, int64_t ldc) "
                                   f"{{ dlcc_uk_{name}(x, w, c, ldc); }}\n")
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for name, xrow, px, kh, kw, dh, pm in names:
            x = rng.standard_normal(((kh - 1) * dh + 1) * xrow).astype(np.float32)
            w = rng.standard_normal(kh * kw * L).astype(np.float32)
            ldc = px + DCONV_PAD + 3  # (channel-major: a row's tile stores DCONV_PAD past its pixels)
            size = px * L + 5 if pm else L * ldc
            want = np.full(size, 7.0, np.float32)
            MICRO[name].reference({"x": x, "w": w, "c": want}, {"x": 0, "w": 0, "c": 0}, {"ldc": ldc})
            got = np.full(size, 7.0, np.float32)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [ptr, ptr, ptr, i64]
            fn(x.ctypes.data_as(ptr), w.ctypes.data_as(ptr), got.ctypes.data_as(ptr), ldc)
            _assert_tile(got, want, pm, L, ldc, px)


def _w(rng, name, *shape):
    return onnx.numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                        name)


def _stem(c=32, h=56, n=1, s=1, act="Clip", seed=0):
    """A MobileNet-style start: a 3x3 stride-2 convolution from 3 channels, its activation, the first depthwise 3x3
    (stride ``s``) and its activation, then a 1x1 projection to 16 channels."""
    rng = np.random.default_rng(seed)
    inits = [_w(rng, "ws", c, 3, 3, 3), _w(rng, "bs", c), _w(rng, "wd", c, 1, 3, 3), _w(rng, "bd", c),
             _w(rng, "wp", 16, c, 1, 1)]
    inits += [onnx.numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("lo", 0), ("hi", 6))]

    def act_(src, dst):
        if act == "Clip":
            return [helper.make_node("Clip", [src, "lo", "hi"], [dst])]
        return [helper.make_node("Sigmoid", [src], [dst + "_s"]), helper.make_node("Mul", [src, dst + "_s"], [dst])]

    nodes = [helper.make_node("Conv", ["x", "ws", "bs"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             *act_("a", "aa"),
             helper.make_node("Conv", ["aa", "wd", "bd"], ["d"], kernel_shape=[3, 3], strides=[s, s], pads=[1] * 4,
                              group=c), *act_("d", "da"),
             helper.make_node("Conv", ["da", "wp"], ["y"])]
    oh = (h // 2 - 1) // s + 1
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 16, oh, oh])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return m, {"x": rng.standard_normal((n, 3, h, h)).astype(np.float32)}


def _body(src: str, k: int) -> str:
    """The definition of kernel ``k``'s C function."""
    m = re.search(rf"void dlcc_k{k}\([^)]*\) \{{", src)
    end = src.find("\n}\n", m.end())
    return src[m.start():end]


def _ringed(art) -> list:
    return [b for b in art.program.buffers.values() if b.ring]


def _no_rings(build):
    """``build()`` with no zero rings (nor channel blocks with one for the depthwise convolution: ``schedule.blocked``,
    which takes the buffers the rings leave)."""
    orig = rings.RINGS, blocked.BLOCKED_WINDOWS
    try:
        rings.RINGS = blocked.BLOCKED_WINDOWS = False
        return build()
    finally:
        rings.RINGS, blocked.BLOCKED_WINDOWS = orig


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3", "aarch64"])
@pytest.mark.parametrize("s", [1, 2])
def test_plan_on_any_machine(target, s):
    """Built (not run) for each vector target: the stem's result gets the ring the depthwise convolution's padding
    needs (none below and right for stride 2, where no tap reaches), the depthwise kernel no longer repacks it and
    declares no workspace, its tiles read the input's pixels all its channels apart, the stem's kernel zeroes the
    ring first, and the arena grows by at most the ring (the workspace it saves may be smaller on a small plane)."""
    t = get_target(target)
    m, _ = _stem(c=32, h=56, s=s)
    for threads in (1, 2):
        art = build_artifacts(m, target=t, threads=threads)
        plain = _no_rings(lambda: build_artifacts(m, target=t, threads=threads))  # noqa: B023
        (b,) = _ringed(art)
        assert not _ringed(plain)
        assert b.ring == ((1, 1, 1, 1) if s == 1 else (1, 0, 1, 0)) and b.shape == (1, 32, 28, 28)
        root = art.program.root(b.id)
        assert root.shape == (1, 28 + b.ring[0] + b.ring[1], 28 + b.ring[2] + b.ring[3], 32)
        dw = art.program.kernels[1]
        assert dw.steps[0].anchor.op_type == "Conv" and dw.steps[0].workspace is None
        assert plain.program.kernels[1].steps[0].workspace is not None
        src = art.csource.source
        micro = set(re.findall(r"static void dlcc_uk_(\w+)\(", src))
        assert not any(u.startswith("nchwc_") for u in micro)  # (the stem reads the image in place too)
        assert any(u.endswith("_x32") for u in micro)
        assert src.count("/* zero ring */") == 1 and "/* zero ring */" in _body(src, 0)
        fig = layout_figures(art.program)  # (what ``dlcc run --profile`` and ``dlcc report`` say)
        assert fig["zero_rings"] == 1 and "zero_rings" not in layout_figures(plain.program)
        # (no kernel repacks its input: the stem reads the image, the depthwise one its input, where they are)
        assert "repacking_kernels" not in fig and layout_figures(plain.program)["repacking_kernels"] == 1
        # (at stride 2 the depthwise result may be stored in channel blocks for the projection: said after it)
        assert ", 1 with a zero ring read in place by depthwise convolutions" in describe_layouts(fig)
        # (the ring's rows and columns against the workspace that goes: 30 x 30 pixels for 28 x 28 here, a few KB
        # of workspace on one thread; at 112 x 112 the ring is 3.6% of the tensor and the arena smaller)
        assert art.memory.arena_bytes <= 1.0 * plain.memory.arena_bytes + 4 * 32 * (28 * 4 + 4)
        assert art.memory.arena_bytes <= 1.05 * art.memory.lower_bound + 64


def test_ring_func_zeroes_exactly_the_ring():
    """ring_func's loop IR verifies and, interpreted, clears every element of the ring and none of the plane."""
    from dlcc.lower.kir import Buffer
    from dlcc.lower.lir import run_func

    for n, c, h, w, ring in ((2, 8, 5, 7, (1, 1, 1, 1)), (1, 16, 6, 4, (1, 0, 1, 0)), (1, 4, 1, 3, (3, 2, 0, 3))):
        top, bottom, left, right = ring
        hr, wr = h + top + bottom, w + left + right
        view = Buffer(1, "view", "float32", (n, c, h, w), base=0, offset=(top * wr + left) * c,
                      strides=(hr * wr * c, 1, wr * c, c), ring=ring)
        f = ring_func(view, "r")
        verify_func(f)
        a = np.ones(n * hr * wr * c, np.float32)
        run_func(f, {"r": a})
        a = a.reshape(n, hr, wr, c)
        inside = np.zeros_like(a, bool)
        inside[:, top:top + h, left:left + w] = True
        assert (a[inside] == 1).all() and (a[~inside] == 0).all()


def _without_ring_zeroing(m, **kw):
    """``m`` compiled with no kernel zeroing a ring (``program._KernelGen.ring`` printing nothing)."""
    orig = program._KernelGen.ring
    try:
        program._KernelGen.ring = lambda self, step, names: ""
        return dlcc.compile(m, **kw)
    finally:
        program._KernelGen.ring = orig


def _poisoned(cm, feeds):
    """The compiled model's outputs on an arena filled with NaN bytes (after a first call made it)."""
    cm(feeds)
    cm._local.state[0][:] = 0xFF
    return cm(feeds)


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("c,h,n,s,act,threads", [(32, 56, 1, 1, "Clip", 1), (16, 30, 2, 2, "Silu", 2),
                                                 (32, 36, 1, 1, "Silu", 2)])
def test_matches_onnxruntime(target, c, h, n, s, act, threads):
    """Against onnxruntime on an arena of NaNs (the ring is zeroed on every call, not found zero), and through the
    kernel-IR interpreter; without the zeroing the same run gives NaNs, so the test sees a ring left as it was."""
    t = get_target(target)
    m, feeds = _stem(c, h, n, s, act)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    assert len(_ringed(cm.artifacts)) == (1 if t.lanes >= 4 and c % t.lanes == 0 else 0)
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(cm.artifacts.program, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)
    if not _ringed(cm.artifacts):
        return
    assert np.isnan(_poisoned(_without_ring_zeroing(m, target=t, threads=threads), feeds)["y"]).any()


def test_convnext_blocks_read_within_the_ring():
    """ConvNeXt-style blocks at 32 channels: a depthwise 7x7's input, which the residual add reads too (element by
    element, through the ring's strides, in another kernel), gets a 3-wide ring; the outputs match on an arena of
    NaNs."""
    from test_layouts import _convnext

    m, feeds = _convnext(c=32, h=14, blocks=3)
    ref = ort_output(m, feeds)
    t = get_target("native")
    cm = dlcc.compile(m, threads=2)
    ringed = _ringed(cm.artifacts)
    if t.lanes >= 4 and 32 % t.lanes == 0:
        assert ringed and all(b.ring == (3, 3, 3, 3) for b in ringed)
        readers = [k for b in ringed for k in cm.artifacts.program.kernels if b.id in k.reads]
        assert len(readers) > len(ringed)  # (the residual add's kernel besides the depthwise convolution's)
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
