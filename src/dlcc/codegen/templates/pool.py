"""Pooling templates: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LRN (ONNX semantics, float32).

What goes in: a ``TemplateCall`` whose input 0 is a buffer of shape (N, C, spatial...). What comes out: C
that computes every output element once and hands it to ``store``.

2-D MaxPool/AveragePool over a unit-stride plane are the depthwise plane kernel of the loop IR
(``schedule.dwconv``). The other AveragePools (1-D, 3-D, strided layouts) are the loop IR of
``schedule.pool.pool_func``: each (n, c) output plane accumulated in ``call.scratch`` by loops (k0, t0, k1,
t1, ...) over kernel taps and the output positions whose input position is inside the input, so the
innermost loop is branch-free and contiguous on the output. The output size comes from the output shape,
which already reflects ceil_mode (a window that would start in the right padding is dropped). AveragePool
divides by a per-dim count product (``pool_counts``: in-bounds taps for count_include_pad=0, taps inside the
padded input without the ceil_mode overhang for 1, as onnxruntime does; a count that varies along a dim is
a compile-time table). GlobalAveragePool is ``schedule.pool.global_pool_func`` (partial sums in one vector).
The other MaxPools and GlobalMaxPool keep the same loop nests written as C here (``window_nest``): the loop
IR has no C form of a float maximum yet. LRN is ``schedule.reduce.lrn_func``.
Sums run in a different order than onnxruntime (tests use rtol 1e-4 for the averaging ops, DESIGN:
reductions).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlcc.codegen.cbase import Names, TemplateError, TensorRef, indent, loops
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.templates.conv import _flat_ok, _ints, _table, lin, spatial_pads
from dlcc.lower.lir import Buf, Layout, verify_func
from dlcc.schedule.dwconv import dw_func
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.pool import PoolGeometry, global_pool_func, pool_counts, pool_func, window_range


@dataclass
class WinDim:
    """One spatial dim of a windowed loop nest. For tap ``k`` (0..K-1), ``t`` runs over ``[lo[k], hi[k])``;
    the written position is ``t*o[0] + k*o[1] + o[2]`` (stride ``ostride``), the read position
    ``t*i[0] + k*i[1] + i[2]`` (stride ``istride``)."""

    K: int
    lo: list[int]
    hi: list[int]
    o: tuple[int, int, int]
    i: tuple[int, int, int]
    ostride: int
    istride: int


def window_dim(T: int, L: int, s: int, d: int, p: int, K: int, *, ostride: int, istride: int) -> WinDim:
    """Output position ``t`` in [0, T) reads the input position ``t*s + k*d - p`` at tap k, when in [0, L)."""
    lo, hi = zip(*(window_range(T, L, s, d, p, k) for k in range(K)), strict=True)
    return WinDim(K, list(lo), list(hi), (1, 0, 0), (s, d, -p), ostride, istride)


def window_nest(names: Names, dims: Sequence[WinDim], obases: Sequence[str], ibase: str,
                pre: Callable[[list[str]], str], stmt: Callable[[list[str], str], str],
                decls: list[str]) -> str:
    """The loop nest (k0, t0, k1, t1, ...) over ``dims``. ``obases``: C pointer expressions of the written
    planes (float*), ``ibase``: C pointer expression of the read plane. ``pre(ks)`` gives C statements before
    the innermost t loop (kernel tap indices ``ks``), ``stmt(out_lvalues, in_expr)`` the innermost body.
    Static range tables are appended to ``decls``."""
    last = len(dims) - 1

    def level(d: int, ks: list[str], oterms: list, iterms: list) -> str:
        dim = dims[d]
        k = names("k") if dim.K > 1 else "0"
        lo = _table(names, decls, dim.lo, k)
        hi = _table(names, decls, dim.hi, k)
        t = names("t")
        ks = [*ks, k]
        oterms = [*oterms, (k, dim.o[1] * dim.ostride), dim.o[2] * dim.ostride]
        iterms = [*iterms, (k, dim.i[1] * dim.istride), dim.i[2] * dim.istride]
        head = f"for (int64_t {t} = {lo}; {t} < {hi}; ++{t}) {{"
        if d == last:
            ops = [names("po") for _ in obases]
            ip = names("pi")
            lines = [f"float* restrict {p} = {b} + ({lin(*oterms)});" for p, b in zip(ops, obases, strict=True)]
            lines.append(f"const float* restrict {ip} = {ibase} + ({lin(*iterms)});")
            lines.append(pre(ks))
            oel = [f"{p}[{lin((t, dim.o[0] * dim.ostride))}]" for p in ops]
            iel = f"{ip}[{lin((t, dim.i[0] * dim.istride))}]"
            lines += [head, indent(stmt(oel, iel)), "}"]
            body = "\n".join(x for x in lines if x)
        else:
            inner = level(d + 1, ks, [*oterms, (t, dim.o[0] * dim.ostride)], [*iterms, (t, dim.i[0] * dim.istride)])
            body = f"{head}\n{indent(inner)}\n}}"
        if dim.K > 1:
            body = f"for (int64_t {k} = 0; {k} < {dim.K}; ++{k}) {{\n{indent(body)}\n}}"
        return body

    return level(0, [], [], [])


def _plane_init(call: TemplateCall, pre_idx: list[str], value: str) -> str:
    sp = call.out_shape[len(pre_idx):]
    _, code = loops(sp, call.names, lambda idx: f"{call.scratch.at([*pre_idx, *idx])} = {value};", "s")
    return code


def _ptr(ref: TensorRef, idx: list[str]) -> str:
    return f"({ref.ptr} + ({ref.index(idx)}))"


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


def _nc_loops(call: TemplateCall, N: int, C: int, body) -> str:
    n = call.names("n") if N > 1 else "0"
    c = call.names("c") if C > 1 else "0"
    code = body(n, c)
    if C > 1:
        code = f"for (int64_t {c} = 0; {c} < {C}; ++{c}) {{\n{indent(code)}\n}}"
    if N > 1:
        code = f"for (int64_t {n} = 0; {n} < {N}; ++{n}) {{\n{indent(code)}\n}}"
    return code


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
    if r == 2 and call.pack is not None and xref.strides[-1] == 1 and call.scratch.contiguous:
        return _pool_as_depthwise(call, xref, outs, ks, strides, dils, pb, counts)
    if counts is not None:
        return _average_pool(call, xref, g, counts)
    # MaxPool: the loop IR's float max has no C form yet (schedule.pool.pool_func builds it)
    names = call.names
    sref = call.scratch
    dims = [window_dim(o, i, s, d, p, k, ostride=os_, istride=is_)
            for o, i, s, d, p, k, os_, is_ in zip(outs, ins, strides, dils, pb, ks, sref.strides[2:],
                                                  xref.strides[2:], strict=True)]
    decls: list[str] = []
    zeros = ["0"] * r

    def body(n: str, c: str) -> str:
        parts = [_plane_init(call, [n, c], "(-INFINITY)")]
        parts.append(window_nest(names, dims, [_ptr(sref, [n, c, *zeros])], _ptr(xref, [n, c, *zeros]),
                                 lambda kk: "", lambda o, x: f"{o[0]} = {x} > {o[0]} ? {x} : {o[0]};", decls))
        if not call.direct:
            _, st = loops(outs, names, lambda idx: call.store([n, c, *idx], sref.at([n, c, *idx])), "s")
            parts.append(st)
        return "\n".join(parts)

    code = _nc_loops(call, N, C, body)
    return "\n".join([*decls, code])


def _average_pool(call: TemplateCall, xref: TensorRef, g: PoolGeometry, counts: list[list[int]]) -> str:
    """AveragePool in the loop IR (``schedule.pool.pool_func``): sums in the scratch, divided by the window
    counts (per dim a constant, or a compile-time table)."""
    factors: list[Buf | float] = []
    for cs in counts:
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
    f = pool_func(g, x, s, factors, not call.direct, name="average_pool", fresh=call.names)
    _verify_average_once(g, xref.shape, xref.strides, sref.strides,
                         tuple(c if isinstance(c, float) else None for c in factors), not call.direct)
    return call.emit(f, call.store)


@functools.lru_cache(maxsize=256)
def _verify_average_once(g: PoolGeometry, shape: tuple[int, ...], x_strides: tuple[int, ...],
                         s_strides: tuple[int, ...], factors: tuple[float | None, ...], epilogue: bool) -> None:
    x = Buf("x", "float32", Layout.strided(shape, x_strides))
    s = Buf("s", "float32", Layout.strided((*shape[:2], *g.outs), s_strides))
    tables = [c if c is not None else Buf(f"cnt{d}", "float32", Layout.strided((g.outs[d],)))
              for d, c in enumerate(factors)]
    verify_func(pool_func(g, x, s, tables, epilogue))


def _pool_as_depthwise(call: TemplateCall, xref: TensorRef, outs: list[int], ks: list[int], strides: list[int],
                       dils: list[int], pb: list[int], counts: list[list[int]] | None) -> str:
    """A 2-D pool as the loop IR's depthwise plane kernel (``schedule.dwconv``). AveragePool (``counts``):
    unit weights (one row shared by every channel: channel stride 0), then the epilogue divides by the
    window's count (a compile-time table of reciprocals per output pixel, as count_include_pad and the
    padding give it). MaxPool: the kernel's maximum form."""
    N, C, H, W = xref.shape
    oh, ow = outs
    g = ConvGeometry(C, H, W, oh, ow, ks[0], ks[1], strides[0], strides[1], dils[0], dils[1], pb[0], pb[1])
    ones = call.packed(np.ones(ks[0] * ks[1], dtype=np.float32))
    recip = None
    if counts is not None:
        recip = call.packed(np.array([1.0 / (cy * cx) if cy * cx else 0.0 for cy in counts[0] for cx in counts[1]],
                                     dtype=np.float32))
    sref = call.scratch
    x = Buf(xref.ptr, "float32", Layout.strided(xref.shape, xref.strides, xref.offset))
    wt = Buf(ones.ptr, "float32", Layout.strided((C, ks[0] * ks[1]), (0, 1)))
    cb = Buf(sref.ptr, "float32", Layout.strided((N, C, oh, ow), None, sref.offset))
    epilogue = recip is not None or not call.direct
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
    names = call.names
    ones = ["0"] * len(ins)
    flat = _flat_ok(xref, 2) and P >= LANES
    if op == "GlobalAveragePool":  # the loop IR (schedule.pool.global_pool_func)
        shape, strides = ((N, C, P), (*xref.strides[:2], 1)) if flat else (xref.shape, xref.strides)
        x = Buf(xref.ptr, "float32", Layout.strided(shape, strides, xref.offset))
        f = global_pool_func(x, LANES, False, fresh=names)
        _verify_global_once(shape, strides, LANES)
        return call.emit(f, lambda idx, v: call.store([*idx, *ones], v))

    # GlobalMaxPool: the loop IR's float max has no C form yet (schedule.pool.global_pool_func builds it)
    def combine(a: str, x: str) -> str:
        return f"{a} = {x} > {a} ? {x} : {a};"

    def body(n: str, c: str) -> str:
        acc, res = names("acc"), names("r")
        lines = []
        if flat:
            xp, i, j = names("px"), names("p"), names("l")
            full = P // LANES * LANES
            lines += [f"const float* restrict {xp} = {_ptr(xref, [n, c, *ones])};",
                      f"float {acc}[{LANES}];",
                      f"for (int64_t {j} = 0; {j} < {LANES}; ++{j}) {acc}[{j}] = {xp}[{j}];",
                      f"for (int64_t {i} = {LANES}; {i} < {full}; {i} += {LANES}) {{",
                      indent(f"for (int64_t {j} = 0; {j} < {LANES}; ++{j}) {{\n"
                             f"{indent(combine(f'{acc}[{j}]', f'{xp}[{i} + {j}]'))}\n}}"),
                      "}",
                      f"float {res} = {acc}[0];",
                      f"for (int64_t {j} = 1; {j} < {LANES}; ++{j}) {combine(res, f'{acc}[{j}]')}"]
            if full < P:
                lines.append(f"for (int64_t {i} = {full}; {i} < {P}; ++{i}) {combine(res, f'{xp}[{i}]')}")
        else:
            lines.append(f"float {res} = (-INFINITY);")
            lines.append(loops(ins, names, lambda idx: combine(res, xref.at([n, c, *idx])), "s")[1])
        lines.append(call.store([n, c, *ones], res))
        return "\n".join(lines)

    return _nc_loops(call, N, C, body)


@functools.lru_cache(maxsize=256)
def _verify_global_once(shape: tuple[int, ...], strides: tuple[int, ...], lanes: int) -> None:
    verify_func(global_pool_func(Buf("x", "float32", Layout.strided(shape, strides)), lanes, False))


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
    f = lrn_func(x, s, *args, fresh=call.names)
    _verify_lrn_once(xref.shape, xref.strides, sref.strides, args)
    return call.emit(f, call.store)


@functools.lru_cache(maxsize=256)
def _verify_lrn_once(shape: tuple[int, ...], x_strides: tuple[int, ...], s_strides: tuple[int, ...], args) -> None:
    from dlcc.schedule.reduce import lrn_func

    verify_func(lrn_func(Buf("x", "float32", Layout.strided(shape, x_strides)),
                         Buf("s", "float32", Layout.strided(shape, s_strides)), *args))
