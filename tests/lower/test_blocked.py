"""Channel-blocked buffers (``schedule.blocked``): a convolution's input stored by its writer in the channel blocks,
with the zero ring, that its Winograd or direct kernel reads, instead of repacked on every call. The kernel IR's
blocked views (bounds, interpreter), the C addressing, the ring's zeroing, the plan on any target, and whole
bottlenecks against onnxruntime on every target the machine runs, on an arena of NaNs."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_layouts import _bottlenecks, _ort
from test_rings import _poisoned, _without_ring_zeroing

import dlcc
import dlcc.codegen.program as program
import dlcc.schedule.blocked as blocked
from dlcc.codegen.cbase import TensorRef
from dlcc.compiler import build_artifacts
from dlcc.errors import PassError
from dlcc.lower.interp import interpret
from dlcc.lower.kir import Buffer, Program, print_program, verify_program
from dlcc.lower.lir import run_func, verify_func
from dlcc.schedule.layouts import describe_layouts, layout_figures
from dlcc.schedule.rings import ring_func
from dlcc.schedule.target import get_target
from dlcc.testing.harness import assert_close, ort_output, runnable_targets


def _bottleneck(c: int = 32, h: int = 14, n: int = 1, stride: int = 1, seed: int = 0,
                strides: tuple[int, ...] | None = None, stem: bool = False):
    """A ResNet bottleneck: 1x1 (c -> 2c, Relu), 3x3 (2c -> 2c, ``stride``, Relu), 1x1 (2c -> c), added to the input
    (through a strided 1x1 projection when ``stride`` is 2), Relu; then a second one at stride 1 (or one per
    ``strides``); ``stem``: after a 3x3 convolution (c -> c, Relu), so that the sums can be channels-last."""
    rng = np.random.default_rng(seed)
    m = 2 * c
    arrays = {}
    nodes = []

    def conv(x, y, co, ci, k, s=1, act=True, bias=True):
        w = f"w{len(arrays)}"
        arrays[w] = rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)
        ins = [x, w]
        if bias:
            arrays[f"b{w}"] = rng.standard_normal(co) / 4
            ins.append(f"b{w}")
        out = f"{y}_c" if act else y
        nodes.append(helper.make_node("Conv", ins, [out], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4))
        if act:
            nodes.append(helper.make_node("Relu", [out], [y]))

    strides = strides or (stride, 1)
    if stem:
        conv("x", "st", c, c, 3)
    for i, s in enumerate(strides):
        x = ("st" if stem else "x") if i == 0 else f"o{i - 1}"
        conv(x, f"a{i}", m, c, 1)
        conv(f"a{i}", f"b{i}", m, m, 3, s)
        conv(f"b{i}", f"c{i}", c, m, 1, act=False)
        skip = x
        if s != 1:
            conv(x, f"p{i}", c, c, 1, s, act=False, bias=False)
            skip = f"p{i}"
        nodes.append(helper.make_node("Add", [f"c{i}", skip], [f"s{i}"]))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"o{i}" if i < len(strides) - 1 else "y"]))
    ho = -(-h // math.prod(strides))
    inits = [onnx.numpy_helper.from_array(a.astype(np.float32), k) for k, a in arrays.items()]
    g = helper.make_graph(nodes, "bottleneck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, c, ho, ho])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((n, c, h, h)).astype(np.float32)}


def _graph(name: str, nodes: list, arrays: dict, x_shape: tuple[int, ...], rng, outs: tuple[str, ...] = ("y",)):
    """The model of ``nodes`` over ``arrays`` (initializers: float32, or int64 where given so) with one float input x
    of ``x_shape`` and float outputs ``outs`` (shapes inferred), and a random x."""
    inits = [onnx.numpy_helper.from_array(a.astype(np.int64 if a.dtype == np.int64 else np.float32), k)
             for k, a in arrays.items()]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in outs], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    return model, {"x": rng.standard_normal(x_shape).astype(np.float32)}


def _blocked(art) -> list[Buffer]:
    return [b for b in art.program.buffers.values() if b.block]


def test_blocked_view_bounds_and_addresses():
    """A blocked view's last element is its last block's last channel; verify_program finds one leaving its base;
    a shape whose channels are not whole blocks is refused; TensorRef addresses a channel through its block."""
    root = Buffer(0, "temp", "float32", (2, 1, 6, 7, 8))
    plane = 6 * 7 * 8
    view = Buffer(1, "view", "float32", (1, 16, 4, 5), base=0, offset=(7 + 1) * 8, strides=(plane, plane, 56, 8),
                  ring=(1, 1, 1, 1), block=8)
    assert view.offset + view.address_span() == plane + (4 * 7 + 5) * 8 + 7  # (block 1, row 4, column 5, channel 7)
    assert not view.contiguous
    p = Program({0: root, 1: view}, [], [], [], {})
    verify_program(p)
    p.buffers[1] = Buffer(1, "view", "float32", (1, 24, 4, 5), base=0, offset=(7 + 1) * 8,
                          strides=(plane, plane, 56, 8), block=8)
    with pytest.raises(PassError, match="leaves buffer 0"):
        verify_program(p)
    with pytest.raises(PassError, match="channel blocks of 8"):
        Buffer(2, "view", "float32", (1, 12, 4, 5), base=0, block=8)
    ref = TensorRef("p_0", "float32", view.shape, view.strides, view.offset, view.ring, view.block)
    assert ref.at(["0", "c", "h", "w"]) == "p_0[((((64 + ((c / 8) * 336)) + (c % 8)) + (h * 56)) + (w * 8))]"
    assert ref.at(["0", "kb", "ci", "h", "w"]) == "p_0[((((64 + (kb * 336)) + ci) + (h * 56)) + (w * 8))]"
    for c, y, x in ((0, 0, 0), (13, 3, 4), (7, 2, 1)):
        flat = view.offset + c // 8 * plane + c % 8 + y * 56 + x * 8
        assert eval(ref.index(["0", str(c), str(y), str(x)]).replace("/", "//")) == flat


def test_ring_func_zeroes_the_ring_of_every_block():
    """ring_func of a blocked view (blocks outside images, or inside them) clears every element of each block's ring
    and none of its plane."""
    for n, c, blk, h, w, ring, outer in ((2, 16, 8, 5, 7, (1, 2, 1, 3), True), (1, 12, 4, 6, 4, (1, 1, 0, 1), False)):
        nb = c // blk
        top, bottom, left, right = ring
        hr, wr = h + top + bottom, w + left + right
        plane = hr * wr * blk
        strides = (plane, n * plane, wr * blk, blk) if outer else (nb * plane, plane, wr * blk, blk)
        view = Buffer(1, "view", "float32", (n, c, h, w), base=0, offset=(top * wr + left) * blk, strides=strides,
                      ring=ring, block=blk)
        f = ring_func(view, "r")
        verify_func(f)
        a = np.ones(n * nb * plane, np.float32)
        run_func(f, {"r": a})
        a = a.reshape(n * nb, hr, wr, blk)
        inside = np.zeros_like(a, bool)
        inside[:, top:top + h, left:left + w] = True
        assert (a[inside] == 1).all() and (a[~inside] == 0).all()


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3", "aarch64"])
@pytest.mark.parametrize("h,stride,threads", [(14, 1, 1), (28, 2, 2)])
def test_plan_on_any_machine(target, h, stride, threads):
    """On each target (whatever this machine runs): the 3x3 convolutions' inputs are stored in blocks of the
    target's vector width with the ring their plan reads, their kernels repack nothing, their writers zero the ring;
    the kernel-IR interpreter matches onnxruntime; with the switch off the inputs are channels-last and repacked."""
    t = get_target(target)
    m, feeds = _bottleneck(32, h, 1, stride)
    art = build_artifacts(m, target=t, threads=threads)
    bl = _blocked(art)
    # (the second bottleneck's 3x3 input always, with the ring Winograd reads; the first one's where its 1x1
    # reading the NCHW input stores channels-last; the 3x3 outputs that the 1x1s read, with no ring)
    assert {"a1", "b0", "b1"} <= {b.name for b in bl} and all(b.block == t.lanes and b.shape[1] == 64 for b in bl)
    p = art.program
    for b in bl:
        (reader,) = [k for k in p.kernels if b.id in k.reads]
        assert reader.steps[0].loop_ir and "nchwc_" not in reader.steps[0].loop_ir
        writer = [k for k in p.kernels if b.id in k.writes][0]
        assert p.root(b.id).id in writer.writes
        assert b.ring[:1] == b.ring[2:3] == (1,) if b.name.startswith("a") else not b.ring
    assert "zero ring" in art.csource.source
    fig = layout_figures(p)
    assert fig["blocked_buffers"] == len(bl) and f"{len(bl)} stored in channel blocks" in describe_layouts(fig)
    ref = ort_output(m, feeds)
    assert_close(interpret(p, art.memory, feeds)["y"], ref, 1e-4, 1e-6)
    orig = blocked.BLOCKED
    try:
        blocked.BLOCKED = False
        plain = build_artifacts(m, target=t, threads=threads)
    finally:
        blocked.BLOCKED = orig
    assert not _blocked(plain) and "blocked_buffers" not in layout_figures(plain.program)
    # (every 3x3 reader repacked its input; the 1x1 ones read theirs in place, channels-last)
    ringed = sum(1 for b in bl if b.ring)
    assert ringed and layout_figures(plain.program)["repacking_kernels"] == fig.get("repacking_kernels", 0) + ringed
    assert art.memory.arena_bytes <= 1.05 * art.memory.lower_bound + 64


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("c,h,n,stride,threads", [(32, 14, 1, 1, 1), (32, 28, 2, 2, 2), (32, 14, 2, 1, 2)])
def test_matches_onnxruntime(target, c, h, n, stride, threads):
    """Against onnxruntime on an arena of NaNs (the ring is zeroed on every call, not found zero), and through the
    interpreter; without the zeroing the same run is wrong, so the test sees a ring left as it was."""
    t = get_target(target)
    m, feeds = _bottleneck(c, h, n, stride, seed=c + h)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    assert _blocked(cm.artifacts) or t.lanes < 4
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(cm.artifacts.program, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)
    if not any(b.ring for b in _blocked(cm.artifacts)):  # (a direct kernel's taps may all fall inside the input)
        return
    # (a NaN read from the ring may end as 0 in a Relu: wrong, not NaN)
    out = _poisoned(_without_ring_zeroing(m, target=t, threads=threads), feeds)["y"]
    assert np.isnan(out).any() or np.max(np.abs(out - ref)) > 1e-2 * np.max(np.abs(ref))


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("threads", [1, 2])
def test_residual_trunk_in_blocks(target, threads):
    """Bottlenecks with residual adds: the sums between them are stored in channel blocks too, read by the next 1x1
    convolution as its input and by a later one's epilogue (the residual), which then runs per block of channels;
    no address divides a channel by its block; outputs match onnxruntime on an arena of NaNs, and the interpreter."""
    t = get_target(target)
    m, feeds = _bottlenecks(128, 14, 2, 1)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = _blocked(cm.artifacts)
    if t.lanes < 4:
        assert not bl
    else:
        sums = [b for b in bl if len([k for k in p.kernels if b.id in k.reads]) == 2]
        assert sums and all(b.shape[1] == 128 and not b.ring for b in sums)
        assert f"% {t.lanes})" not in cm.artifacts.csource.source
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("threads", [1, 2])
def test_strided_projection_reads_blocks(target, threads):
    """A sum read by the next bottleneck's 1x1 and by its strided 1x1 projection, whose plan skips the input's last
    row and column: stored in blocks that hold them all, both read it in place (the template sets the projection's
    extent to the blocks'); the strided 3x3's input keeps the ring above and left only; outputs match."""
    t = get_target(target)
    m, feeds = _bottleneck(128, 14, 1, strides=(1, 2), stem=True, seed=3)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = {b.name: b for b in _blocked(cm.artifacts)}
    if t.vector_registers >= 32:  # (on 16 registers the projection is a GEMM over NCHW, and the sum NCHW)
        assert "o0" in bl
    if t.lanes >= 4:
        assert bl["a1"].ring == (1, 0, 1, 0)
    if "o0" in bl:
        assert bl["o0"].ring == ()
        readers = [k for k in p.kernels if bl["o0"].id in k.reads]
        strided = [k for k in readers if list(k.steps[0].anchor.attributes["strides"].value) == [2, 2]]
        assert len(readers) == 2 and strided and all("nchwc_" not in k.steps[0].loop_ir for k in readers)
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)


def _windows(c: int = 64, h: int = 14, n: int = 1, max_pad: int = 0, seed: int = 0):
    """A 3x3 convolution (16 -> ``c`` channels, Relu) read by a depthwise 3x3 (padded 1), a 3x3 average pool
    (stride 1, padded 1, the padding not counted), a 2x2 max pool (stride 2, padded ``max_pad``), a global average
    and a global max pool, each a graph output."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array((rng.standard_normal((c, 16, 3, 3)) / 12).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array((rng.standard_normal(c) / 4).astype(np.float32), "b")
    dw = onnx.numpy_helper.from_array((rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32), "dw")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["tc"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["tc"], ["t"]),
             helper.make_node("Conv", ["t", "dw"], ["y_dw"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
             helper.make_node("AveragePool", ["t"], ["y_avg"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("MaxPool", ["t"], ["y_max"], kernel_shape=[2, 2], strides=[2, 2], pads=[max_pad] * 4),
             helper.make_node("GlobalAveragePool", ["t"], ["y_gap"]),
             helper.make_node("GlobalMaxPool", ["t"], ["y_gmp"])]
    ho = (h + 2 * max_pad - 2) // 2 + 1
    outs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (
        ("y_dw", [n, c, h, h]), ("y_avg", [n, c, h, h]), ("y_max", [n, c, ho, ho]), ("y_gap", [n, c, 1, 1]),
        ("y_gmp", [n, c, 1, 1]))]
    g = helper.make_graph(nodes, "windows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 16, h, h])],
                          outs, [w, b, dw])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((n, 16, h, h)).astype(np.float32)}


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("c,h,n,threads", [(64, 14, 1, 1), (48, 13, 2, 2), (64, 7, 1, 2)])
def test_pools_and_depthwise_read_blocks(target, c, h, n, threads):
    """A convolution's result read by a depthwise convolution, an average pool, a max pool whose taps all fall inside
    the plane, a global average and a global max pool: stored in channel blocks with the zero ring the depthwise
    convolution and the average pool need, which every one of them reads in place (no repacking, no workspace);
    outputs match onnxruntime on an arena of NaNs (the ring is zeroed on every call), and the interpreter; without
    the zeroing the run is wrong."""
    t = get_target(target)
    m, feeds = _windows(c, h, n, seed=c + h)
    ref = _ort(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = _blocked(cm.artifacts)
    if t.lanes < 4 or c % t.lanes:
        assert not bl
    else:
        (b,) = bl
        assert b.name == "t" and b.ring == (1, 1, 1, 1) and b.block == t.lanes
        readers = [k for k in p.kernels if b.id in k.reads]
        assert sorted(k.steps[0].anchor.op_type for k in readers) == [
            "AveragePool", "Conv", "GlobalAveragePool", "GlobalMaxPool", "MaxPool"]
        assert all("nchwc_" not in k.steps[0].loop_ir and k.steps[0].workspace is None for k in readers)
        # (only the first convolution repacks its input: the graph's, in NCHW)
        assert layout_figures(p).get("repacking_kernels", 0) <= 1
    got = _poisoned(cm, feeds)
    back = interpret(p, cm.artifacts.memory, feeds)
    for name, r in ref.items():
        assert_close(got[name], r, 1e-4, 1e-6)
        assert_close(back[name], r, 1e-4, 1e-6)
    if bl:
        out = _poisoned(_without_ring_zeroing(m, target=t, threads=threads), feeds)
        assert any(np.isnan(out[k]).any() or np.max(np.abs(out[k] - ref[k])) > 1e-2 * np.max(np.abs(ref[k]))
                   for k in ("y_dw", "y_avg"))


def test_a_max_pool_reaching_its_padding_keeps_plain_input():
    """A max pool whose taps reach into its padding (which must hold -inf) beside readers that need a zero ring: the
    input stays as it was, and the outputs match onnxruntime."""
    m, feeds = _windows(64, 14, 1, max_pad=1, seed=5)
    ref = _ort(m, feeds)
    cm = dlcc.compile(m, threads=2)
    assert not _blocked(cm.artifacts)
    got = cm(feeds)
    for name, r in ref.items():
        assert_close(got[name], r, 1e-4, 1e-6)


def _with_zeros_for_minus_inf(m, **kw):
    """``m`` compiled with every ring of -inf filled with zeros instead."""
    orig = program.ring_func
    try:
        program.ring_func = lambda view, name, fresh=str: orig(dataclasses.replace(view, ring_fill=0.0), name, fresh)
        return dlcc.compile(m, **kw)
    finally:
        program.ring_func = orig


def _stem_pool(c: int = 32, h: int = 28, n: int = 1, k: int = 7, ceil: int = 0, seed: int = 0):
    """A ResNet stem: a k x k stride-2 convolution (3 -> ``c`` channels, no activation: its outputs take either
    sign) and a 3x3 stride-2 max pool padded by 1 (``ceil``: ceil_mode)."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array((rng.standard_normal((c, 3, k, k)) / k).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array((rng.standard_normal(c) / 4).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], kernel_shape=[k, k], strides=[2, 2], pads=[k // 2] * 4),
             helper.make_node("MaxPool", ["t"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
                              ceil_mode=ceil)]
    g = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, h, h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    model = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    return model, {"x": rng.standard_normal((n, 3, h, h)).astype(np.float32)}


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("c,h,n,k,ceil,threads", [(64, 56, 1, 7, 0, 1), (32, 30, 2, 3, 0, 2), (64, 27, 1, 7, 1, 2)])
def test_stem_writes_blocks_that_its_max_pool_reads_in_a_ring_of_minus_inf(target, c, h, n, k, ceil, threads):
    """The first convolution reads the NCHW image and writes channel blocks (its result was NCHW) with a ring of
    -inf, which the max pool reading into its padding takes in place of it (no repacking, no workspace); outputs
    match onnxruntime on an arena of NaNs, and the interpreter; the same ring filled with zeros is wrong (the
    convolution's outputs take either sign)."""
    t = get_target(target)
    m, feeds = _stem_pool(c, h, n, k, ceil, seed=c + h)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = _blocked(cm.artifacts)
    if t.lanes >= 4:
        (b,) = bl
        assert b.ring[0] == b.ring[2] == 1 and b.ring_fill == -math.inf
        pool = next(k for k in p.kernels if b.id in k.reads)
        assert pool.steps[0].anchor.op_type == "MaxPool" and pool.steps[0].workspace is None
        assert "nchwc_" not in pool.steps[0].loop_ir and "/* ring of -inf */" in cm.artifacts.csource.source
        assert "-inf ring" in print_program(p)
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-5, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-5, 1e-6)
    if bl:
        assert np.max(np.abs(_poisoned(_with_zeros_for_minus_inf(m, target=t, threads=threads), feeds)["y"] - ref)) \
            > 1e-2 * np.max(np.abs(ref))


def _fire(c1: int = 32, c2: int = 48, h: int = 13, n: int = 1, reader: str = "Conv", seed: int = 0):
    """Two 3x3 convolutions of the image (16 -> ``c1`` and 16 -> ``c2`` channels, no activation: their outputs take
    either sign), concatenated along the channels, then read by a 3x3 convolution
    (padded 1, -> 32 channels) or a 3x3 max pool (stride 1, padded 1): SqueezeNet's fire module, Inception's pool
    branch."""
    rng = np.random.default_rng(seed)
    arrays = {"w1": rng.standard_normal((c1, 16, 3, 3)) / 12, "b1": rng.standard_normal(c1) / 4,
              "w2": rng.standard_normal((c2, 16, 3, 3)) / 12, "b2": rng.standard_normal(c2) / 4}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["x", "w2", "b2"], ["b"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Concat", ["a", "b"], ["t"], axis=1)]
    if reader == "Conv":
        arrays["w3"] = rng.standard_normal((32, c1 + c2, 3, 3)) / np.sqrt(9 * (c1 + c2))
        nodes.append(helper.make_node("Conv", ["t", "w3"], ["y"], kernel_shape=[3, 3], pads=[1] * 4))
    else:
        nodes.append(helper.make_node("MaxPool", ["t"], ["y"], kernel_shape=[3, 3], pads=[1] * 4))
    return _graph("fire", nodes, arrays, (n, 16, h, h), rng)


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("c1,c2,h,n,reader,threads", [(32, 48, 13, 1, "Conv", 1), (32, 16, 14, 2, "Conv", 2),
                                                     (48, 32, 13, 2, "MaxPool", 2), (24, 40, 13, 1, "Conv", 2)])
def test_concat_slices_are_written_in_blocks(target, c1, c2, h, n, reader, threads):
    """A Concat along the channels whose inputs two convolutions write: stored in channel blocks with the ring its
    reader needs (zeros for a padded convolution, -inf for a padded max pool), each convolution storing its slice's
    blocks in place (no scratch, no copy) and the reader reading them with no repacking; outputs match onnxruntime
    on an arena of NaNs (the first writer fills the ring of every slice on every call), and the interpreter; without
    the ring filled the run is wrong. Slices that are not whole vectors (24 and 40 channels on 16 lanes) stay as they
    were."""
    t = get_target(target)
    m, feeds = _fire(c1, c2, h, n, reader, seed=c1 + h)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = _blocked(cm.artifacts)
    if t.lanes < 4 or c1 % t.lanes or c2 % t.lanes:
        assert not bl
    else:
        assert sorted(b.name for b in bl) == ["a", "b", "t"]
        (whole,) = (b for b in bl if b.name == "t")
        assert whole.ring == (1, 1, 1, 1) and whole.ring_fill == (-math.inf if reader == "MaxPool" else 0.0)
        assert len({b.base for b in bl}) == 1 and all(b.ring == whole.ring and b.strides == whole.strides for b in bl)
        a, b = sorted((b for b in bl if b.name != "t"), key=lambda b: b.offset)
        assert a.offset == whole.offset and b.offset == whole.offset + c1 // t.lanes * whole.strides[1]
        writers = [s for k in p.kernels for s in k.steps if s.outputs and p.value_buffer.get(s.outputs[0]) in (
            a.id, b.id)]
        assert len(writers) == 2 and all(s.scratch is None and s.channels_last for s in writers)
        root = [k for k in p.kernels if whole.base in k.writes]
        assert len(root) == 1 and any(s in root[0].steps for s in writers)
        reader_k = next(k for k in p.kernels if whole.id in k.reads)
        assert reader_k.steps[0].anchor.op_type == reader and "nchwc_" not in reader_k.steps[0].loop_ir
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)
    if bl and reader == "Conv":
        out = _poisoned(_without_ring_zeroing(m, target=t, threads=threads), feeds)["y"]
        assert np.isnan(out).any() or np.max(np.abs(out - ref)) > 1e-2 * np.max(np.abs(ref))
    elif bl:  # (a max over NaNs may skip them: the ring filled with zeros instead of -inf is wrong)
        assert np.max(np.abs(_poisoned(_with_zeros_for_minus_inf(m, target=t, threads=threads), feeds)["y"] - ref)) \
            > 1e-2 * np.max(np.abs(ref))


def _window_then_conv(kind: str, c: int = 32, h: int = 14, n: int = 1, first: bool = True, seed: int = 0):
    """A ``kind`` window (a 3x3 depthwise convolution padded 1 with Relu, a 2x2 stride-2 max pool, a 3x3 average pool
    padded 1, its padding not counted) whose result a 3x3 convolution (padded 1, ``c`` -> 16 channels) reads; the
    window reads a 3x3 convolution's result (16 -> ``c``, no activation) where ``first``, else the graph's input
    (``c`` channels, NCHW)."""
    rng = np.random.default_rng(seed)
    arrays = {"w2": rng.standard_normal((16, c, 3, 3)) / np.sqrt(9 * c)}
    nodes = []
    x, cin = "x", c
    if first:
        arrays["w1"], arrays["b1"] = rng.standard_normal((c, 16, 3, 3)) / 12, rng.standard_normal(c) / 4
        nodes.append(helper.make_node("Conv", ["x", "w1", "b1"], ["t"], kernel_shape=[3, 3], pads=[1] * 4))
        x, cin = "t", 16
    if kind == "Depthwise":
        arrays["dw"] = rng.standard_normal((c, 1, 3, 3)) / 3
        nodes += [helper.make_node("Conv", [x, "dw"], ["u_c"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
                  helper.make_node("Relu", ["u_c"], ["u"])]
    elif kind == "MaxPool":
        nodes.append(helper.make_node("MaxPool", [x], ["u"], kernel_shape=[2, 2], strides=[2, 2]))
    else:
        nodes.append(helper.make_node("AveragePool", [x], ["u"], kernel_shape=[3, 3], pads=[1] * 4))
    nodes.append(helper.make_node("Conv", ["u", "w2"], ["y"], kernel_shape=[3, 3], pads=[1] * 4))
    return _graph("window", nodes, arrays, (n, cin, h, h), rng)


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("kind,c,h,n,first,threads", [
    ("Depthwise", 48, 14, 1, True, 1), ("MaxPool", 48, 14, 2, True, 2), ("AveragePool", 32, 13, 1, True, 2),
    ("MaxPool", 32, 28, 1, False, 1), ("Depthwise", 48, 13, 2, False, 2)])
def test_pools_and_depthwise_write_blocks(target, kind, c, h, n, first, threads):
    """A depthwise convolution, a max pool and an average pool store their result in the channel blocks (with the
    zero ring) that the 3x3 convolution reading it takes in place: their tiles pixel-major, each pixel's block of
    channels one vector through the epilogue (``dwcp_``, ``dwcmaxp_``), reading their own input in blocks (or
    repacking the graph's NCHW input); outputs match onnxruntime on an arena of NaNs, and the interpreter; without
    the ring zeroed the run is wrong."""
    t = get_target(target)
    m, feeds = _window_then_conv(kind, c, h, n, first, seed=c + h)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = {b.name: b for b in _blocked(cm.artifacts)}
    if t.lanes < 4 or c % t.lanes:
        assert not bl
    else:
        assert sorted(bl) == (["t", "u"] if first else ["u"])
        u = bl["u"]
        assert u.ring == (1, 1, 1, 1) and u.ring_fill == 0.0
        (win,) = (k for k in p.kernels if u.id in k.writes)
        (conv,) = (k for k in p.kernels if u.id in k.reads)
        assert win.steps[0].channels_last and "nchwc_" not in conv.steps[0].loop_ir
        assert ("nchwc_" in win.steps[0].loop_ir) == (not first)
        assert ("dwcmaxp_" if kind == "MaxPool" else "dwcp_") in win.steps[0].loop_ir
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)
    if bl:
        out = _poisoned(_without_ring_zeroing(m, target=t, threads=threads), feeds)["y"]
        assert np.isnan(out).any() or np.max(np.abs(out - ref)) > 1e-2 * np.max(np.abs(ref))


def _pool_branch(c: int = 32, h: int = 13, n: int = 1, seed: int = 0):
    """Inception's module input: a 3x3 convolution (16 -> ``c`` channels, no activation: its outputs take either
    sign) read by a 1x1 convolution (-> 32 channels, output y1) and a 3x3 max pool (stride 1, padded 1) whose
    result a 1x1 convolution (-> 16 channels, output y2) reads."""
    rng = np.random.default_rng(seed)
    arrays = {"w0": rng.standard_normal((c, 16, 3, 3)) / 12, "b0": rng.standard_normal(c) / 4,
              "w1": rng.standard_normal((32, c, 1, 1)) / np.sqrt(c),
              "w2": rng.standard_normal((16, c, 1, 1)) / np.sqrt(c)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["t"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["t", "w1"], ["y1"], kernel_shape=[1, 1]),
             helper.make_node("MaxPool", ["t"], ["p"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["p", "w2"], ["y2"], kernel_shape=[1, 1])]
    return _graph("pool_branch", nodes, arrays, (n, 16, h, h), rng, outs=("y1", "y2"))


@pytest.mark.parametrize("target", ["x86-64-v4", *runnable_targets()])
@pytest.mark.parametrize("c,h,n,threads", [(32, 13, 1, 1), (64, 14, 2, 2), (48, 6, 1, 2)])
def test_one_by_one_convolutions_read_blocks_within_any_ring(target, c, h, n, threads):
    """A 1x1 convolution and a max pool reaching into its padding read the same convolution's result: stored in
    blocks with the pool's ring of -inf, which the 1x1 (tiling the plane's rows, no tap in the ring) reads in place
    as well; the pool stores its result in blocks for the next 1x1. Where the 1x1 would tile the plane as one row
    (16-register targets) the blocks keep no ring and the pool repacks. Outputs match onnxruntime through the
    interpreter (on x86-64-v4 whatever this machine runs) and, on the targets this machine runs, on an arena of
    NaNs."""
    t = get_target(target)
    m, feeds = _pool_branch(c, h, n, seed=c + h)
    ref = _ort(m, feeds)
    art = build_artifacts(m, target=t, threads=threads)
    p = art.program
    bl = {b.name: b for b in _blocked(art)}
    if t.lanes >= 4 and t.vector_registers >= 32:
        assert {"t", "p"} <= set(bl)
        assert bl["t"].ring == (1, 1, 1, 1) and bl["t"].ring_fill == -math.inf
        readers = [k.steps[0] for k in p.kernels if bl["t"].id in k.reads]
        assert sorted(s.anchor.op_type for s in readers) == ["Conv", "MaxPool"]
        assert all("nchwc_" not in s.loop_ir for s in readers)
    back = interpret(p, art.memory, feeds)
    for name, r in ref.items():
        assert_close(back[name], r, 1e-4, 1e-6)
    if target in runnable_targets():
        cm = dlcc.compile(m, target=t, threads=threads)
        got = _poisoned(cm, feeds)
        for name, r in ref.items():
            assert_close(got[name], r, 1e-4, 1e-6)


@pytest.mark.parametrize("target", ["x86-64-v4", "x86-64-v3", "aarch64"])
def test_concats_and_windows_in_blocks_on_any_machine(target):
    """Built (not run) for each vector target, whatever this machine runs: a Concat's slices, a max pool's and a
    depthwise convolution's results, a loop step's input and result, a squeeze-and-excitation's scaled input, stored
    in blocks of the target's vector width (4 on NEON, 8 on AVX2, 16 on AVX-512) that their readers take in place;
    the kernel-IR interpreter matches onnxruntime."""
    t = get_target(target)
    cases = [(_fire(32, 48, 13, 2, "Conv", seed=1), {"a", "b", "t"}),
             (_window_then_conv("MaxPool", 48, 14, 1, True, seed=2), {"t", "u"}),
             (_window_then_conv("Depthwise", 48, 13, 1, False, seed=3), {"u"}),
             (_loop_between("Silu", 48, 13, 2, seed=4), {"t", "r"}),
             (_loop_between("Shuffle", 48, 14, 1, seed=5), {"t", "shuffle__0"}),
             (_se_block(96, 14, 1, seed=6), {"d"})]
    for (m, feeds), names in cases:
        art = build_artifacts(m, target=t, threads=2)
        bl = _blocked(art)
        assert names <= {b.name for b in bl} and all(b.block == t.lanes for b in bl)
        p = art.program
        for b in bl:
            assert all("nchwc_" not in s.loop_ir for k in p.kernels if b.id in k.reads for s in k.steps
                       if s.input_scale is None)  # (a scaled input is repacked: multiplied on the way)
        assert_close(interpret(p, art.memory, feeds)["y"], _ort(m, feeds)["y"], 1e-4, 1e-6)


def _loop_between(op: str, c: int = 48, h: int = 14, n: int = 1, seed: int = 0):
    """A 3x3 convolution (16 -> ``c`` channels, no activation) whose result a 1x1 convolution (-> 16 channels, output
    y2) and a loop step read: ``op`` (Relu, Silu as x * Sigmoid(x), a per-channel Add, Clip, or a channel shuffle
    of 3 groups as Reshape, Transpose, Reshape), whose result a 3x3 convolution (padded 1, -> 16, output y) reads."""
    rng = np.random.default_rng(seed)
    arrays = {"w0": rng.standard_normal((c, 16, 3, 3)) / 12, "b0": rng.standard_normal(c) / 4,
              "w1": rng.standard_normal((16, c, 1, 1)) / np.sqrt(c),
              "w2": rng.standard_normal((16, c, 3, 3)) / np.sqrt(9 * c)}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["t"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["t", "w1"], ["y2"], kernel_shape=[1, 1])]
    if op == "Relu":
        nodes.append(helper.make_node("Relu", ["t"], ["r"]))
    elif op == "Silu":
        nodes += [helper.make_node("Sigmoid", ["t"], ["sg"]), helper.make_node("Mul", ["t", "sg"], ["r"])]
    elif op == "Add":
        arrays["k"] = rng.standard_normal((1, c, 1, 1))
        nodes.append(helper.make_node("Add", ["t", "k"], ["r"]))
    elif op == "Clip":
        arrays["lo"], arrays["hi"] = np.array(0.0), np.array(0.5)
        nodes.append(helper.make_node("Clip", ["t", "lo", "hi"], ["r"]))
    else:
        arrays["s1"] = np.array([n, 3, c // 3, h, h], np.int64)
        arrays["s2"] = np.array([n, c, h, h], np.int64)
        nodes += [helper.make_node("Reshape", ["t", "s1"], ["g1"]),
                  helper.make_node("Transpose", ["g1"], ["g2"], perm=[0, 2, 1, 3, 4]),
                  helper.make_node("Reshape", ["g2", "s2"], ["r"])]
    nodes.append(helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[3, 3], pads=[1] * 4))
    return _graph("loop", nodes, arrays, (n, 16, h, h), rng, outs=("y", "y2"))


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("op,c,h,n,threads", [("Relu", 48, 14, 1, 1), ("Silu", 48, 13, 2, 2), ("Add", 32, 14, 1, 2),
                                              ("Clip", 64, 7, 2, 1), ("Shuffle", 48, 14, 1, 2),
                                              ("Shuffle", 96, 13, 2, 1)])
def test_loop_steps_read_and_write_blocks(target, op, c, h, n, threads):
    """An activation, a per-channel Add or a channel shuffle between convolutions, as a loop step of its own: its
    input (which a 1x1 convolution reads too) and its result (which a padded 3x3 convolution reads within a zero ring)
    are stored in channel blocks, the step running over the blocks in their memory order, a block's channels one
    vector (its loop IR's channel a lane of a block); no convolution repacks; outputs match onnxruntime on an arena of
    NaNs, and the interpreter; without the ring zeroed the run is wrong."""
    t = get_target(target)
    m, feeds = _loop_between(op, c, h, n, seed=c + h)
    ref = _ort(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = {b.name: b for b in _blocked(cm.artifacts)}
    if t.lanes < 4 or c % t.lanes:
        assert not bl
    else:
        (loop,) = [s for k in p.kernels for s in k.steps if s.kind == "loop"]
        r = p.buffers[p.value_buffer[loop.outputs[0]]]
        assert "t" in bl and r.block == t.lanes and r.ring == (1, 1, 1, 1)
        assert f"lane<{t.lanes}>" in loop.loop_ir
        assert layout_figures(p).get("repacking_kernels", 0) <= 1  # (the first convolution's, from the image)
    got = _poisoned(cm, feeds)
    back = interpret(p, cm.artifacts.memory, feeds)
    for name, r in ref.items():
        assert_close(got[name], r, 1e-4, 1e-6)
        assert_close(back[name], r, 1e-4, 1e-6)
    if bl:
        out = _poisoned(_without_ring_zeroing(m, target=t, threads=threads), feeds)["y"]
        assert np.isnan(out).any() or np.max(np.abs(out - ref["y"])) > 1e-2 * np.max(np.abs(ref["y"]))


def _se_block(c: int = 96, h: int = 14, n: int = 1, seed: int = 0):
    """A MobileNetV3 block: a 1x1 expansion (16 -> ``c`` channels, Relu), a 3x3 depthwise convolution (Relu), a
    squeeze-and-excitation (global average pool, 1x1 to 8 channels, Relu, 1x1 back, Sigmoid) scaling the depthwise
    result, and the 1x1 projection to 24 channels."""
    rng = np.random.default_rng(seed)
    arrays = {"we": rng.standard_normal((c, 16, 1, 1)) / 4, "wd": rng.standard_normal((c, 1, 3, 3)) / 3,
              "w1": rng.standard_normal((8, c, 1, 1)) / np.sqrt(c), "b1": rng.standard_normal(8) / 4,
              "w2": rng.standard_normal((c, 8, 1, 1)) / 3, "wp": rng.standard_normal((24, c, 1, 1)) / np.sqrt(c)}
    nodes = [helper.make_node("Conv", ["x", "we"], ["e_c"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["e_c"], ["e"]),
             helper.make_node("Conv", ["e", "wd"], ["d_c"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
             helper.make_node("Relu", ["d_c"], ["d"]),
             helper.make_node("GlobalAveragePool", ["d"], ["g"]),
             helper.make_node("Conv", ["g", "w1", "b1"], ["g1_c"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["g1_c"], ["g1"]),
             helper.make_node("Conv", ["g1", "w2"], ["g2"], kernel_shape=[1, 1]),
             helper.make_node("Sigmoid", ["g2"], ["s"]),
             helper.make_node("Mul", ["d", "s"], ["ds"]),
             helper.make_node("Conv", ["ds", "wp"], ["y"], kernel_shape=[1, 1])]
    return _graph("se", nodes, arrays, (n, 16, h, h), rng)


@pytest.mark.parametrize("target", runnable_targets())
@pytest.mark.parametrize("c,h,n,threads", [(96, 14, 1, 1), (144, 7, 2, 2), (64, 13, 1, 2)])
def test_squeeze_and_excitation_in_blocks(target, c, h, n, threads):
    """A squeeze-and-excitation block: the fused 1x1 -> depthwise kernel (or the depthwise one, reading the 1x1's
    blocks) stores its result in channel blocks (pixel-major depthwise tiles, ``dwcp_``), the global pool reads them
    in place, and the projection repacks them multiplied by the scale on the way (``nchwc_..._s`` reading a block's
    channels as one vector); outputs match onnxruntime on an arena of NaNs, and the interpreter."""
    t = get_target(target)
    m, feeds = _se_block(c, h, n, seed=c + h)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, target=t, threads=threads)
    p = cm.artifacts.program
    bl = _blocked(cm.artifacts)
    if t.lanes >= 4 and c % t.lanes == 0:
        (d,) = [b for b in bl if b.name == "d"]
        (w,) = [s for k in p.kernels for s in k.steps if s.outputs and p.value_buffer.get(s.outputs[0]) == d.id]
        assert "dwcp_" in w.loop_ir and (w.producer is not None or "e" in {b.name for b in bl})
        readers = [s for k in p.kernels if d.id in k.reads for s in k.steps if s.kind == "template"]
        gp = [s for s in readers if s.anchor.op_type == "GlobalAveragePool"]
        proj = [s for s in readers if s.input_scale is not None]
        assert gp and proj and re.search(rf"nchwc_\w+_{t.lanes}_s\b", proj[0].loop_ir)
    else:
        assert not bl
    assert_close(_poisoned(cm, feeds)["y"], ref, 1e-4, 1e-6)
    assert_close(interpret(p, cm.artifacts.memory, feeds)["y"], ref, 1e-4, 1e-6)
