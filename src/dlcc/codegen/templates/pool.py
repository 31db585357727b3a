"""Pooling templates: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LRN (ONNX semantics, float32).

What goes in: a ``TemplateCall`` whose input 0 is a buffer of shape (N, C, spatial...). What comes out: C
that computes every output element once and hands it to ``store``.

MaxPool/AveragePool (any spatial rank) accumulate each (n, c) output plane in ``call.scratch`` with the
windowed loop nest of ``window_nest``: loops (k0, t0, k1, t1, ...) over kernel taps and the output
positions whose input position is inside the input (ranges precomputed at compile time), so the innermost
loop is branch-free and contiguous on the output. The output size comes from the output shape, which already
reflects ceil_mode (a window that would start in the right padding is dropped). AveragePool divides by a
per-dim count product: in-bounds taps (count_include_pad=0) or taps inside the padded input, excluding the
ceil_mode overhang (count_include_pad=1, as onnxruntime does).
Global pools and the LRN channel-window sums accumulate in local partial sums; sums run in a different
order than onnxruntime (tests use rtol 1e-4 for the averaging ops, DESIGN: reductions).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlcc.codegen.cbase import Names, TemplateError, TensorRef, c_float, indent, loops
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.templates.conv import _flat_ok, _ints, _table, lin, spatial_pads
from dlcc.lower.lir import Buf, Layout, verify_func
from dlcc.schedule.dwconv import dw_func
from dlcc.schedule.gemm import ConvGeometry


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
    lo, hi = [], []
    for k in range(K):
        a = -((k * d - p) // s)  # ceil((p - k*d) / s)
        b = (L - 1 + p - k * d) // s + 1
        a, b = max(0, a), min(T, b)
        lo.append(a)
        hi.append(max(a, b))
    return WinDim(K, lo, hi, (1, 0, 0), (s, d, -p), ostride, istride)


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
    names = call.names
    sref = call.scratch
    dims = [window_dim(o, i, s, d, p, k, ostride=os_, istride=is_)
            for o, i, s, d, p, k, os_, is_ in zip(outs, ins, strides, dils, pb, ks, sref.strides[2:],
                                                  xref.strides[2:], strict=True)]
    decls: list[str] = []
    zeros = ["0"] * r
    if op == "MaxPool":
        init, stmt = "(-INFINITY)", lambda o, x: f"{o[0]} = {x} > {o[0]} ? {x} : {o[0]};"
    else:
        init, stmt = "0.0f", lambda o, x: f"{o[0]} += {x};"
        include = int(call.attr("count_include_pad", 0))
        counts = []
        for i, o, k, s, d, a, e in zip(ins, outs, ks, strides, dils, pb, pe, strict=True):
            lo, hi = (0, i) if not include else (-a, i + e)
            counts.append([sum(1 for j in range(k) if lo <= t * s - a + j * d < hi) for t in range(o)])

    if r == 2 and call.pack is not None and xref.strides[-1] == 1 and sref.contiguous:
        return _pool_as_depthwise(call, xref, outs, ks, strides, dils, pb, counts if op == "AveragePool" else None)

    def body(n: str, c: str) -> str:
        parts = [_plane_init(call, [n, c], init)]
        parts.append(window_nest(names, dims, [_ptr(sref, [n, c, *zeros])], _ptr(xref, [n, c, *zeros]),
                                 lambda kk: "", stmt, decls))
        if op == "MaxPool":
            if not call.direct:
                _, st = loops(outs, names, lambda idx: call.store([n, c, *idx], sref.at([n, c, *idx])), "s")
                parts.append(st)
        else:
            def fin(idx: list[str]) -> str:
                cnt = [_table(names, decls, cs, i) for cs, i in zip(counts, idx, strict=True)]
                val = f"{sref.at([n, c, *idx])} / (float)({' * '.join(cnt)})"
                if call.direct:
                    return f"{sref.at([n, c, *idx])} = {val};"
                return call.store([n, c, *idx], val)
            parts.append(loops(outs, names, fin, "s")[1])
        return "\n".join(parts)

    code = _nc_loops(call, N, C, body)
    return "\n".join([*decls, code])




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
    is_max = op == "GlobalMaxPool"
    names = call.names
    ones = ["0"] * len(ins)

    def body(n: str, c: str) -> str:
        acc, res = names("acc"), names("r")
        combine = ((lambda a, x: f"{a} = {x} > {a} ? {x} : {a};") if is_max else (lambda a, x: f"{a} += {x};"))
        init = "(-INFINITY)" if is_max else "0.0f"
        lines = []
        if _flat_ok(xref, 2) and P >= LANES:
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
            lines.append(f"float {res} = {init};")
            lines.append(loops(ins, names, lambda idx: combine(res, xref.at([n, c, *idx])), "s")[1])
        val = res if is_max else f"{res} / {c_float(P)}"
        lines.append(call.store([n, c, *ones], val))
        return "\n".join(lines)

    return _nc_loops(call, N, C, body)


@register("LRN", needs_buffers=True)
def lrn(call: TemplateCall) -> str:
    if math.prod(call.out_shape) == 0:
        return ""  # empty output: nothing to compute
    xref = _input(call)
    if tuple(call.out_shape) != tuple(xref.shape):
        raise TemplateError(f"LRN: output shape {call.out_shape} != input shape {xref.shape}")
    size = call.attr("size")
    if size is None or int(size) < 1:
        raise TemplateError("LRN: attribute size (>= 1) is required")
    size = int(size)
    alpha = float(call.attr("alpha", 0.0001))
    beta = float(call.attr("beta", 0.75))
    bias = float(call.attr("bias", 1.0))
    N, C, *sp = xref.shape
    names = call.names
    sref = call.scratch
    half_lo, half_hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    scale = c_float(alpha / size)

    def body(n: str, c: str) -> str:
        cc = names("cc")
        lines = [_plane_init(call, [n, c], "0.0f")]
        lo = f"({c} - {half_lo} > 0 ? {c} - {half_lo} : 0)" if half_lo else c
        hi = f"({c} + {half_hi} < {C - 1} ? {c} + {half_hi} : {C - 1})" if half_hi else c

        def acc(idx: list[str]) -> str:
            xv = names("xv")
            return f"const float {xv} = {xref.at([n, cc, *idx])};\n{sref.at([n, c, *idx])} += {xv} * {xv};"
        inner = loops(sp, names, acc, "s")[1]
        lines.append(f"for (int64_t {cc} = {lo}; {cc} <= {hi}; ++{cc}) {{\n{indent(inner)}\n}}")

        def fin(idx: list[str]) -> str:
            val = (f"{xref.at([n, c, *idx])} * powf({c_float(bias)} + {scale} * {sref.at([n, c, *idx])}, "
                   f"{c_float(-beta)})")
            return call.store([n, c, *idx], val)
        lines.append(loops(sp, names, fin, "s")[1])
        return "\n".join(lines)

    return _nc_loops(call, N, C, body)
