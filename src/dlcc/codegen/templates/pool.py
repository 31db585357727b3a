"""Pooling templates: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LRN (ONNX semantics, float32).

What goes in: a ``TemplateCall`` whose input 0 is a buffer of shape (N, C, spatial...). What comes out: C
that computes every output element once and hands it to ``store``.

2-D MaxPool/AveragePool over a unit-stride plane are the depthwise plane kernel of the loop IR
(``schedule.dwconv``). The other MaxPools and AveragePools (1-D, 3-D, strided layouts) are the loop IR of
``schedule.pool.pool_func``: each (n, c) output plane accumulated (maximum or sum) in ``call.scratch`` by
loops (k0, t0, k1, t1, ...) over kernel taps and the output positions whose input position is inside the input, so the
innermost loop is branch-free and contiguous on the output. The output size comes from the output shape,
which already reflects ceil_mode (a window that would start in the right padding is dropped). AveragePool
divides by a per-dim count product (``pool_counts``: in-bounds taps for count_include_pad=0, taps inside the
padded input without the ceil_mode overhang for 1, as onnxruntime does; a count that varies along a dim is
a compile-time table). The maximum is ``acc < x ? x : acc``: a NaN element is skipped, a window with no
element inside the input gives -inf. GlobalAveragePool and GlobalMaxPool are ``schedule.pool.global_pool_func``
(partial results in one vector). LRN is ``schedule.reduce.lrn_func``.
Sums run in a different order than onnxruntime (tests use rtol 1e-4 for the averaging ops, DESIGN:
reductions).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dlcc.codegen.cbase import TemplateError, TensorRef
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.templates.conv import _flat_ok, _ints, _pixel_store, _verify_dwc_once, dest_in_blocks, spatial_pads
from dlcc.lower.kir import blocked_strides
from dlcc.lower.lir import Buf, Layout, verify_func
from dlcc.schedule.dwconv import POOL_BLOCKED_MAX_W, dw_func, dwc_func, pack_dwc, plan_dwc, pool_max_inside
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.pool import PoolGeometry, global_pool_blocked_func, global_pool_func, pool_counts, pool_func


def _input(call: TemplateCall):
    if call.out_dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 outputs are supported")
    x = call.inputs[0] if call.inputs else None
    if x is None or x.ref is None:
        raise TemplateError(f"{call.node.op_type}: input X must be a buffer")
    if x.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 inputs are supported")
    if len(x.shape) < 3:
        raise TemplateError(f"{call.node.op_type}: input rank {len(x.shape)} < 3 is not supported")
    if tuple(call.out_shape[:2]) != tuple(x.shape[:2]):
        raise TemplateError(f"{call.node.op_type}: output shape {call.out_shape} does not match input {x.shape}")
    return x.ref


@register("MaxPool", "AveragePool", needs_buffers=True)
def pool(call: TemplateCall) -> str:
    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    op = call.node.op_type
    xref = _input(call)
    if op == "MaxPool" and len(call.node.outputs) > 1:
        idx_out = call.node.outputs[1]
        if idx_out is not None and idx_out.name and (idx_out.uses() or idx_out.is_graph_output()):
            raise TemplateError("MaxPool: the Indices output is not supported")
    N, C, *ins = xref.shape
    outs = list(call.out_shape[2:])
    r = len(ins)
    ks = call.attr("kernel_shape")
    if ks is None:
        raise TemplateError(f"{op}: kernel_shape is required")
    ks = [int(k) for k in ks]
    if len(ks) != r:
        raise TemplateError(f"{op}: kernel_shape has {len(ks)} dims for {r} spatial dims")
    strides = _ints(call, "strides", r, 1)
    dils = _ints(call, "dilations", r, 1)
    if min(strides) < 1 or min(dils) < 1 or min(ks) < 1:
        raise TemplateError(f"{op}: kernel_shape, strides and dilations must be >= 1")
    pb, pe = spatial_pads(call, ins, outs, ks, strides, dils)
    ceil_mode = int(call.attr("ceil_mode", 0))
    for i, o, k, s, d, a, e in zip(ins, outs, ks, strides, dils, pb, pe, strict=True):
        span = i + a + e - ((k - 1) * d + 1)
        expect = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (expect - 1) * s >= i + a:
            expect -= 1  # the last window would start in the right padding: dropped
        if expect != o:
            raise TemplateError(f"{op}: output shape {call.out_shape} inconsistent with the attributes")
    g = PoolGeometry(tuple(ins), tuple(outs), tuple(ks), tuple(strides), tuple(dils), tuple(pb))
    counts = pool_counts(g, pe, bool(call.attr("count_include_pad", 0))) if op == "AveragePool" else None
    if r == 2 and call.pack is not None and (xref.strides[-1] == 1 or xref.channels_last or xref.block) \
            and (call.scratch.contiguous or call.scratch.block):
        pooled = _pool_as_depthwise(call, xref, outs, ks, strides, dils, pb, counts)
        if pooled is not None:
            return pooled
    if xref.block:
        raise TemplateError(f"{op}: internal: an input in channel blocks that this pool cannot read")
    return _windowed_pool(call, xref, g, counts)


def _windowed_pool(call: TemplateCall, xref: TensorRef, g: PoolGeometry, counts: list[list[int]] | None) -> str:
    """MaxPool and AveragePool in the loop IR (``schedule.pool.pool_func``): maxima or sums in the scratch, the
    sums divided by the window counts (``counts``: per dim a constant, or a compile-time table)."""
    factors: list[Buf | float] = []
    for cs in counts or ():
        if len(set(cs)) == 1:
            factors.append(float(cs[0]))
            continue
        if call.pack is None:
            raise TemplateError("AveragePool: these window counts need a compile-time table (call.pack)")
        table = call.packed(np.array(cs, dtype=np.float32))
        factors.append(Buf(table.ptr, "float32", Layout.strided(table.shape)))
    sref = call.scratch
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    s = Buf(sref.ptr, "float32", Layout.strided(sref.shape, sref.strides, sref.offset))
    is_max = counts is None
    f = pool_func(g, x, s, None if is_max else factors, not call.direct,
                  name="max_pool" if is_max else "average_pool", fresh=call.names)
    _verify_pool_func_once(g, xref.shape, xref.strides, sref.strides,
                           None if is_max else tuple(c if isinstance(c, float) else None for c in factors),
                           not call.direct)
    return call.emit(f, call.store)


@functools.lru_cache(maxsize=256)
def _verify_pool_func_once(g: PoolGeometry, shape: tuple[int, ...], x_strides: tuple[int, ...],
                           s_strides: tuple[int, ...], factors: tuple[float | None, ...] | None,
                           epilogue: bool) -> None:
    x = Buf("x", "float32", Layout.strided(shape, x_strides))
    s = Buf("s", "float32", Layout.strided((*shape[:2], *g.outs), s_strides))
    tables = None if factors is None else [
        c if c is not None else Buf(f"cnt{d}", "float32", Layout.strided((g.outs[d],))) for d, c in enumerate(factors)]
    verify_func(pool_func(g, x, s, tables, epilogue))


def _pool_as_depthwise(call: TemplateCall, xref: TensorRef, outs: list[int], ks: list[int], strides: list[int],
                       dils: list[int], pb: list[int], counts: list[list[int]] | None) -> str | None:
    """A 2-D pool as a depthwise convolution of the loop IR (``schedule.dwconv``): channel-blocked on planes up to
    POOL_BLOCKED_MAX_W wide (when the workspace has room), else the plane kernel. AveragePool (``counts``): unit
    weights (the plane kernel's one row shared by every channel: channel stride 0), then the epilogue divides
    by the window's count (a compile-time table of reciprocals per output pixel, as count_include_pad and the
    padding give it). MaxPool: the maximum forms. An input stored in channel blocks (``schedule.blocked``) is read
    where it is: a zero ring holding every tap outside the plane (AveragePool), a ring of -inf or no tap outside it
    (MaxPool)."""
    N, C, H, W = xref.shape
    oh, ow = outs
    g = ConvGeometry(C, H, W, oh, ow, ks[0], ks[1], strides[0], strides[1], dils[0], dils[1], pb[0], pb[1])
    recip = None
    if counts is not None:
        recip = call.packed(np.array([1.0 / (cy * cx) if cy * cx else 0.0 for cy in counts[0] for cx in counts[1]],
                                     dtype=np.float32))
    sref = call.scratch
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    epilogue = recip is not None or not call.direct
    if xref.block:
        plan = plan_dwc(g, N, call.target, call.threads, xref.strides, xref.ring, xref.block)
        # (a max pool reaching into its padding reads -inf there; the others zeros, or nothing)
        ring_ok = pool_max_inside(g) or xref.ring_fill == (-math.inf if recip is None else 0.0)
        if plan is None or not plan.blocked or not ring_ok:
            raise TemplateError(f"{call.node.op_type}: internal: an input in channel blocks (strides {xref.strides}, "
                                f"ring {xref.ring}) that the pool does not read in place")
    else:
        plan = plan_dwc(g, N, call.target, call.threads) if W <= POOL_BLOCKED_MAX_W or sref.block else None
    # a destination in channel blocks (``schedule.blocked``): the tiles kept pixel-major, each pixel's block of
    # channels stored as one vector through the epilogue
    dest_block = dest_in_blocks(sref, plan.cbi if plan is not None else None, f"the {call.node.op_type}")
    ws = call.workspace
    in_place = plan is not None and plan.blocked
    if plan is not None and (in_place or (ws is not None and plan.workspace_floats <= ws.size)):
        # channel-blocked (schedule.dwconv): the block repacked with a -inf (max) or zero (average) ring (or read
        # where it is), one vector maximum or sum per tap and pixel
        wpk = call.packed(pack_dwc(np.ones((C, ks[0] * ks[1]), np.float32), plan))
        wsb = None if in_place else Buf(call.names("ws"), "float32", Layout.strided((ws.size,)), "workspace")
        flat = Buf(sref.ptr, "float32", Layout.strided((N, C, oh * ow), None, sref.offset))
        f = dwc_func(plan, x, Buf(wpk.ptr, "float32", Layout.strided(wpk.shape)), flat, wsb,
                     epilogue or dest_block, name="pool", fresh=call.names, pool_max=recip is None,
                     channels_last=dest_block, dest_block=dest_block)
        _verify_dwc_once(plan, xref.shape, xref.strides, epilogue or dest_block, 0 if in_place else ws.size,
                         recip is None, offset=xref.offset, channels_last=dest_block, dest_block=dest_block)

        def flat_store(idx, v):
            return _pixel_store(call, None, [oh, ow], idx, f"{v} * {recip.ptr}[{idx[-1]}]" if recip is not None else v)

        return call.emit(f, flat_store, {} if in_place else {wsb.name: ws.base()})
    dest_in_blocks(sref, None, f"the {call.node.op_type} with no workspace")
    if xref.strides[-1] != 1:  # (a channels-last input: the plane kernel reads rows with unit stride only)
        return None
    ones = call.packed(np.ones(ks[0] * ks[1], dtype=np.float32))
    wt = Buf(ones.ptr, "float32", Layout.strided((C, ks[0] * ks[1]), (0, 1)))
    cb = Buf(sref.ptr, "float32", Layout.strided((N, C, oh, ow), None, sref.offset))
    f = dw_func(g, N, x, wt, cb, epilogue, call.threads, name="pool", fresh=call.names, pool_max=recip is None)
    _verify_pool_once(g, N, xref.shape, xref.strides, call.threads, epilogue, recip is None)

    def store(idx, v):
        n, ch, oy, ox = idx
        return call.store([n, ch, oy, ox], f"{v} * {recip.ptr}[({oy}) * {ow} + ({ox})]" if recip is not None else v)

    return call.emit(f, store)


@functools.lru_cache(maxsize=256)
def _verify_pool_once(g: ConvGeometry, batch: int, shape: tuple[int, ...], strides: tuple[int, ...],
                      threads: int, epilogue: bool, pool_max: bool) -> None:
    x = Buf("x", "float32", Layout.strided(shape, strides))
    wt = Buf("w", "float32", Layout.strided((g.ci, g.kh * g.kw), (0, 1)))
    c = Buf("c", "float32", Layout.strided((batch, g.ci, g.oh, g.ow)))
    verify_func(dw_func(g, batch, x, wt, c, epilogue, threads, pool_max=pool_max))


@register("GlobalAveragePool", "GlobalMaxPool", needs_buffers=True)
def global_pool(call: TemplateCall) -> str:
    LANES = call.target.lanes  # partial sums (a vectorizable accumulator): one vector
    op = call.node.op_type
    xref = _input(call)
    N, C, *ins = xref.shape
    if any(d != 1 for d in call.out_shape[2:]) or len(call.out_shape) != xref.rank:
        raise TemplateError(f"{op}: output shape {call.out_shape} is not (N, C, 1, ...)")
    P = math.prod(ins)
    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    if P == 0:
        raise TemplateError(f"{op}: empty spatial extent")
    ones = ["0"] * len(ins)
    is_max = op == "GlobalMaxPool"
    name = "global_max_pool" if is_max else "global_pool"
    # threads over the planes where the read is worth a dispatch (each element a load: counted as 4 flops; DeepLab's
    # 2048 x 28 x 28 mean, 6.4 MB, 0.17 ms at 1 thread)
    threads = call.threads if call.parallel(4.0 * N * C * P) else 1
    if xref.block:  # stored in channel blocks (``schedule.blocked``): per block, one vector of running results
        if xref.block != LANES or len(ins) != 2:
            raise TemplateError(f"{op}: internal: an input in channel blocks of {xref.block} that it cannot read")
        top, bottom, left, right = xref.ring or (0, 0, 0, 0)
        expect = blocked_strides(ins[0] + top + bottom, ins[1] + left + right, N, LANES)
        plane, _, row, _ = expect
        base = xref.offset - top * row - left * LANES
        if xref.strides != expect or base < 0:
            raise TemplateError(f"{op}: internal: an input in channel blocks (strides {xref.strides}) it cannot read")
        x = Buf(xref.ptr, "float32", Layout.strided((C // LANES * N * plane,), None, base))
        f = global_pool_blocked_func(x, N, C, (ins[0], ins[1]), (top, bottom, left, right), LANES, is_max, name,
                                     call.names, threads)
        _verify_global_blocked_once(N, C, (ins[0], ins[1]), (top, bottom, left, right), LANES, is_max, threads)
        return call.emit(f, lambda idx, v: call.store([*idx, *ones], v))
    flat = _flat_ok(xref, 2) and P >= LANES
    shape, strides = ((N, C, P), (*xref.strides[:2], 1)) if flat else (xref.shape, xref.strides)
    x = Buf(xref.ptr, "float32", Layout.strided(shape, strides, xref.offset))
    f = global_pool_func(x, LANES, is_max, name=name, fresh=call.names, threads=threads)
    _verify_global_once(shape, strides, LANES, is_max, threads)
    return call.emit(f, lambda idx, v: call.store([*idx, *ones], v))


@functools.lru_cache(maxsize=256)
def _verify_global_once(shape: tuple[int, ...], strides: tuple[int, ...], lanes: int, is_max: bool,
                        threads: int = 1) -> None:
    verify_func(global_pool_func(Buf("x", "float32", Layout.strided(shape, strides)), lanes, is_max,
                                 threads=threads))


@functools.lru_cache(maxsize=256)
def _verify_global_blocked_once(batch: int, channels: int, plane: tuple[int, int], ring: tuple[int, int, int, int],
                                lanes: int, is_max: bool, threads: int) -> None:
    size = channels * batch * (plane[0] + ring[0] + ring[1]) * (plane[1] + ring[2] + ring[3])
    verify_func(global_pool_blocked_func(Buf("x", "float32", Layout.strided((size,))), batch, channels, plane, ring,
                                         lanes, is_max, threads=threads))


@register("LRN", needs_buffers=True)
def lrn(call: TemplateCall) -> str:
    """The loop IR of ``dlcc.schedule.reduce.lrn_func``: per image and channel, the window's sum of squares
    accumulated in the scratch (the output), then the epilogue of every element."""
    from dlcc.schedule.reduce import lrn_func

    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    xref = _input(call)
    if tuple(call.out_shape) != tuple(xref.shape):
        raise TemplateError(f"LRN: output shape {call.out_shape} != input shape {xref.shape}")
    size = call.attr("size")
    if size is None or int(size) < 1:
        raise TemplateError("LRN: attribute size (>= 1) is required")
    args = (int(size), float(call.attr("alpha", 0.0001)), float(call.attr("beta", 0.75)), float(call.attr("bias", 1.0)))
    sref = call.scratch
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    s = Buf(sref.ptr, "float32", Layout.strided(sref.shape, sref.strides, sref.offset))
    threads = call.threads if call.parallel(math.prod(xref.shape) * (2.0 * int(size) + 12)) else 1
    f = lrn_func(x, s, *args, fresh=call.names, threads=threads)
    _verify_lrn_once(xref.shape, xref.strides, sref.strides, args, threads)
    return call.emit(f, call.store)


@functools.lru_cache(maxsize=256)
def _verify_lrn_once(shape: tuple[int, ...], x_strides: tuple[int, ...], s_strides: tuple[int, ...], args,
                     threads: int = 1) -> None:
    from dlcc.schedule.reduce import lrn_func

    verify_func(lrn_func(Buf("x", "float32", Layout.strided(shape, x_strides)),
                         Buf("s", "float32", Layout.strided(shape, s_strides)), *args, threads=threads))
