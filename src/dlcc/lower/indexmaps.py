"""Injective ops as index maps: the element of the output at ``idx`` is an input at a remapped index.

What goes in: an ``ElementGen``, the node, which output (``out_index``) and the output multi-index ``idx``
(loop-IR int64 expressions, one per output dim). What comes out: a loop-IR expression of that element, built
with ``gen.at(input, remapped_index, lets)``.

Registered in ``dlcc.lower.element.INDEXED`` at import: Transpose, Slice, Concat, Split, Gather,
GatherElements, Pad, Expand, Tile, DepthToSpace, SpaceToDepth, Resize, Upsample, dlcc::ChannelShuffle,
Reshape, Flatten, Squeeze, Unsqueeze, Shape, ConstantOfShape (Identity is an elementwise op).

Safety rule: a load that depends on a condition (Pad's in-range test, Concat's choice of input) is built in
pure-expression mode (``lets=None``), at an index clamped into range, and evaluated unconditionally before the
choice (the scalar function ``select``, ``_choose``): a load inside a C ternary branch becomes a masked load,
which GCC 12 -O3 with AVX2/AVX-512 miscompiles in some loop nests. Indices read from data (Gather,
GatherElements) are normalized for negatives and clamped (``clamp_idx``), so a bad index never reads out of
bounds, and the verifier sees every index in range. Shapes are static: index arithmetic is folded where an index is
a constant (``lir.simplify``), and per-axis maps that are not affine (Resize) become constant tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from dlcc.errors import TemplateError
from dlcc.lower.element import INDEXED, ElementGen, literal
from dlcc.lower.lir import Bin, Call, Cast, Const, Expr, simplify
from dlcc.lower.scalar import reflect_index
from dlcc.passes.rewrite import attr
from dlcc.util import value_dtype, value_shape

__all__ = ["reshape_map"]


# ------------------------------------------------------------------------------ index arithmetic

def _add(a: Expr, k: int) -> Expr:
    return simplify(Bin("+", a, Const(k))) if k >= 0 else simplify(Bin("-", a, Const(-k)))


def _mul(a: Expr, k: int) -> Expr:
    return simplify(Bin("*", a, Const(k)))


def _div(a: Expr, k: int) -> Expr:
    """``a / k`` for ``a >= 0``, ``k > 0``."""
    return simplify(Bin("//", a, Const(k)))


def _mod(a: Expr, k: int) -> Expr:
    """``a % k`` for ``a >= 0``, ``k > 0``."""
    return Const(0) if k == 1 else simplify(Bin("%", a, Const(k)))


def _sum(terms: Sequence[Expr]) -> Expr:
    const, parts = 0, []
    for t in terms:
        if isinstance(t, Const):
            const += int(t.value)
        else:
            parts.append(t)
    if const or not parts:
        parts.append(Const(const))
    out = parts[0]
    for p in parts[1:]:
        out = Bin("+", out, p)
    return out


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _linearize(idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
    return _sum([_mul(i, s) for i, s, d in zip(idx, _strides(shape), shape, strict=True) if d != 1])


def _delinearize(lin: Expr, shape: Sequence[int]) -> list[Expr]:
    out: list[Expr] = []
    for k, (s, d) in enumerate(zip(_strides(shape), shape, strict=True)):
        if d == 1:
            out.append(Const(0))
            continue
        e = _div(lin, s)
        if k > 0:  # the leading dim needs no modulo (the index is in range)
            e = _mod(e, d)
        out.append(e)
    return out


def _lt(a: Expr, k: int) -> Expr:
    return Bin("<", a, Const(k))


def _ge0(a: Expr) -> Expr:
    return Bin("<=", Const(0), a)


def _and(conds: Sequence[Expr]) -> Expr:
    out = conds[0]
    for c in conds[1:]:
        out = Bin("&&", out, c)
    return out


def _opset(node: ir.Node) -> int:
    v = node.version
    if v is None:
        graph = node.graph
        model_opsets = graph.opset_imports if graph is not None else {}
        v = model_opsets.get("" if node.domain in ("", "ai.onnx") else node.domain)
    return int(v) if v is not None else 21


def _input(node: ir.Node, k: int) -> ir.Value | None:
    return node.inputs[k] if len(node.inputs) > k else None


def _const_input(gen: ElementGen, node: ir.Node, k: int, what: str) -> np.ndarray | None:
    """The constant array of optional input ``k`` (None when absent); TemplateError when not constant."""
    v = _input(node, k)
    if v is None:
        return None
    a = gen.const_of(v)
    if a is None:
        raise TemplateError(f"{node.op_type}: the {what} input must be a constant")
    return a


def _axis(a: int, rank: int, node: ir.Node) -> int:
    a = int(a)
    if not -rank <= a < max(rank, 1):
        raise TemplateError(f"{node.op_type}: axis {a} out of range for rank {rank}")
    return a + rank if a < 0 else a


def _in_shape(node: ir.Node, k: int = 0) -> tuple[int, ...]:
    return value_shape(node.inputs[k])


def _out_shape(node: ir.Node, k: int = 0) -> tuple[int, ...]:
    return value_shape(node.outputs[k])


def _set(idx: Sequence[Expr], axis: int, value: Expr) -> list[Expr]:
    new = list(idx)
    new[axis] = value
    return new


def _choose(gen: ElementGen, node: ir.Node, cases: list[tuple[Expr | None, ir.Value | Expr, list[Expr]]]) -> Expr:
    """``cond_0 ? value_0 : cond_1 ? value_1 : ... value_last`` with every value evaluated first (``select``): no
    load sits in a branch. A value is an input read at an index that must be in range whatever the condition, or
    an expression. The last condition is not tested."""
    dtype = value_dtype(node.outputs[0])
    vals = [v if isinstance(v, Expr) else gen.at(v, new, None) for _, v, new in cases]
    vals = [x if x.dtype == dtype else Cast(x, dtype) for x in vals]
    expr = vals[-1]
    for (cond, _, _), val in zip(reversed(cases[:-1]), reversed(vals[:-1]), strict=True):
        expr = Call("select", (cond, val, expr), dtype)
    return expr


# ---------------------------------------------------------------------------------------- handlers

def _transpose(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    rank = len(_in_shape(node))
    perm = attr(node, "perm")
    perm = list(range(rank))[::-1] if perm is None else [_axis(p, rank, node) for p in perm]
    new: list[Expr] = [Const(0)] * rank
    for o, p in enumerate(perm):
        new[p] = idx[o]
    return gen.at(node.inputs[0], new, lets)


def _slice(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    shape = _in_shape(node)
    rank = len(shape)
    if _opset(node) < 10 and len(node.inputs) == 1:
        starts = list(attr(node, "starts"))
        ends = list(attr(node, "ends"))
        axes = attr(node, "axes")
        axes = list(range(len(starts))) if axes is None else list(axes)
        steps = [1] * len(starts)
    else:
        s = _const_input(gen, node, 1, "starts")
        e = _const_input(gen, node, 2, "ends")
        if s is None or e is None:
            raise TemplateError("Slice: the starts and ends inputs must be constants")
        starts, ends = [int(x) for x in s.reshape(-1)], [int(x) for x in e.reshape(-1)]
        a = _const_input(gen, node, 3, "axes")
        axes = list(range(len(starts))) if a is None else [int(x) for x in a.reshape(-1)]
        st = _const_input(gen, node, 4, "steps")
        steps = [1] * len(starts) if st is None else [int(x) for x in st.reshape(-1)]
    new = list(idx)
    for a, b, e, st in zip(axes, starts, ends, steps, strict=True):
        a = _axis(a, rank, node)
        if st == 0:
            raise TemplateError("Slice: step 0 is invalid")
        start, _, _ = slice(b, e, st).indices(shape[a])  # the same clamping rules as ONNX
        new[a] = _add(_mul(idx[a], st), start)
    return gen.at(node.inputs[0], new, lets)


def _concat(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    out_shape = _out_shape(node)
    axis = _axis(attr(node, "axis", 0), len(out_shape), node)
    parts, off = [], 0
    for v in node.inputs:
        if v is None:
            continue
        n = value_shape(v)[axis]
        if n > 0:
            parts.append((v, off, n))
        off += n
    i = idx[axis]
    lv = int(i.value) if isinstance(i, Const) else None
    if lv is not None or len(parts) == 1:
        for v, o, n in parts:
            if lv is None or o <= lv < o + n:
                return gen.at(v, _set(idx, axis, _add(i, -o)), lets)
        raise TemplateError("Concat: index out of range")
    # Every input is read (pure-expression loads) at its index clamped into range, unconditionally, and the
    # value is chosen afterwards (``_choose``: GCC 12's masked loads).
    return _choose(gen, node, [(_lt(i, o + n), v, _set(idx, axis, Call("edge_idx", (_add(i, -o), Const(n)))))
                               for v, o, n in parts])


def _split(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    rank = len(_in_shape(node))
    axis = _axis(attr(node, "axis", 0), rank, node)
    off = sum(value_shape(node.outputs[k])[axis] for k in range(out_index))  # static output shapes
    return gen.at(node.inputs[0], _set(idx, axis, _add(idx[axis], off)), lets)


def _data_index(gen: ElementGen, v: ir.Value, idx: list[Expr], n: int, lets) -> Expr:
    """Element ``idx`` of the index tensor ``v``, normalized for negatives and clamped to ``[0, n)``."""
    const = gen.const_of(v)
    if const is not None and 0 < const.size <= 4096:  # normalized at compile time (often an affine map)
        flat = const.astype(np.int64).reshape(-1)
        flat = np.clip(np.where(flat < 0, flat + n, flat), 0, max(n - 1, 0))
        shape = const.shape
        return gen.table(flat.tolist(), _linearize(idx, shape) if shape else Const(0))
    j = gen.at(v, idx, lets)
    return Call("clamp_idx", (j if j.dtype == "int64" else Cast(j, "int64"), Const(n)))


def _gather(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    data, ind = node.inputs[0], node.inputs[1]
    shape = value_shape(data)
    axis = _axis(attr(node, "axis", 0), len(shape), node)
    q = len(value_shape(ind))
    if shape[axis] == 0 and math.prod(_out_shape(node)) > 0:
        raise TemplateError("Gather: indexing an empty axis")
    j = _data_index(gen, ind, idx[axis:axis + q], shape[axis], lets)
    return gen.at(data, [*idx[:axis], j, *idx[axis + q:]], lets)


def _gather_elements(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    data, ind = node.inputs[0], node.inputs[1]
    shape = value_shape(data)
    axis = _axis(attr(node, "axis", 0), len(shape), node)
    ishape = value_shape(ind)
    if any(i > d for k, (i, d) in enumerate(zip(ishape, shape, strict=True)) if k != axis) or (
            shape[axis] == 0 and math.prod(ishape) > 0):
        raise TemplateError(f"GatherElements: indices of shape {ishape} do not fit data of shape {shape}")
    return gen.at(data, _set(idx, axis, _data_index(gen, ind, idx, shape[axis], lets)), lets)


def _pad(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    x = node.inputs[0]
    shape = value_shape(x)
    rank = len(shape)
    dtype = value_dtype(x)
    mode = attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if _opset(node) < 11 and len(node.inputs) == 1:
        pads = [int(p) for p in attr(node, "pads")]
        value: Expr = literal(float(attr(node, "value", 0.0)), dtype)
        axes = list(range(rank))
    else:
        p = _const_input(gen, node, 1, "pads")
        if p is None:
            raise TemplateError("Pad: the pads input must be a constant")
        pads = [int(v) for v in p.reshape(-1)]
        cv = _input(node, 2)
        if cv is None:
            value = literal(0, dtype)
        else:
            cconst = gen.const_of(cv)
            if cconst is not None and cconst.size == 1:
                value = literal(cconst.reshape(-1)[0].item(), dtype)
            elif cconst is not None and cconst.size == 0:
                value = literal(0, dtype)
            else:
                value = gen.at(cv, [Const(0)] * len(value_shape(cv)), lets) if mode == "constant" else literal(0, dtype)
        a = _const_input(gen, node, 3, "axes")
        axes = list(range(rank)) if a is None else [_axis(int(v), rank, node) for v in a.reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise TemplateError(f"Pad: {len(pads)} pads for {len(axes)} axes")
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    new: list[Expr] = []
    conds: list[Expr] = []
    padded = [False] * rank  # axes whose index is tested against the input's range
    for d in range(rank):
        n = shape[d]
        i = _add(idx[d], -begin[d])
        if begin[d] <= 0 and end[d] <= 0:  # no padding here (maybe cropping): always in range
            new.append(i)
            continue
        lv = int(i.value) if isinstance(i, Const) else None
        if mode == "constant":
            if lv is not None:
                if not 0 <= lv < n:
                    return value
            else:
                if begin[d] > 0:
                    conds.append(_ge0(i))
                if end[d] > 0:
                    conds.append(_lt(i, n))
                padded[d] = True
            new.append(i)
        elif n == 0:
            raise TemplateError(f"Pad: mode {mode} needs a non-empty input along axis {d}")
        elif mode == "edge":
            new.append(Const(min(max(lv, 0), n - 1)) if lv is not None else Call("edge_idx", (i, Const(n))))
        elif mode == "reflect":
            new.append(Const(reflect_index(lv, n)) if lv is not None else Call("reflect_idx", (i, Const(n))))
        elif mode == "wrap":
            new.append(Const(lv % n) if lv is not None else Call("wrap_idx", (i, Const(n))))
        else:
            raise TemplateError(f"Pad: mode {mode!r} is not supported")
    if not conds:
        return gen.at(x, new, lets)
    if 0 in shape:  # (nothing to read: every element is padding)
        return value
    # the load at the index clamped into range, unconditionally, then the choice (see _concat: GCC 12)
    clamped = [Call("edge_idx", (e, Const(n))) if guarded else e for e, n, guarded in zip(new, shape, padded,
                                                                                         strict=True)]
    return _choose(gen, node, [(_and(conds), x, clamped), (None, value, [])])


def _expand(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    _const_input(gen, node, 1, "shape")
    shape = _in_shape(node)
    tail = idx[len(idx) - len(shape):] if shape else []
    return gen.at(node.inputs[0], [Const(0) if d == 1 else i for i, d in zip(tail, shape, strict=True)], lets)


def _tile(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    r = _const_input(gen, node, 1, "repeats")
    if r is None:
        raise TemplateError("Tile: the repeats input must be a constant")
    shape = _in_shape(node)
    reps = [int(v) for v in r.reshape(-1)]
    new = [i if rep == 1 else _mod(i, d) for i, d, rep in zip(idx, shape, reps, strict=True)]
    return gen.at(node.inputs[0], new, lets)


def _blocksize(node: ir.Node) -> int:
    b = attr(node, "blocksize")
    if b is None or int(b) < 1 or len(_in_shape(node)) != 4:
        raise TemplateError(f"{node.op_type}: needs a 4-D input and a positive blocksize")
    return int(b)


def _depth_to_space(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    b = _blocksize(node)
    mode = attr(node, "mode", "DCR")
    n, c, h, w = idx
    cout = _out_shape(node)[1]
    i, j = _mod(h, b), _mod(w, b)
    if mode == "DCR":
        ch = _sum([_mul(i, b * cout), _mul(j, cout), c])
    elif mode == "CRD":
        ch = _sum([_mul(c, b * b), _mul(i, b), j])
    else:
        raise TemplateError(f"DepthToSpace: mode {mode!r} is not supported")
    return gen.at(node.inputs[0], [n, ch, _div(h, b), _div(w, b)], lets)


def _space_to_depth(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    b = _blocksize(node)
    n, oc, h, w = idx
    cin = _in_shape(node)[1]
    mode = attr(node, "mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode == "DCR":  # out channel = (i*b + j)*C + c
        c, ij = _mod(oc, cin), _div(oc, cin)
    elif mode == "CRD":  # out channel = c*b*b + i*b + j (opset 28)
        c, ij = _div(oc, b * b), _mod(oc, b * b)
    else:
        raise TemplateError(f"SpaceToDepth: mode {mode!r} is not supported")
    i, j = _div(ij, b), _mod(ij, b)
    return gen.at(node.inputs[0], [n, c, _sum([_mul(h, b), i]), _sum([_mul(w, b), j])], lets)


def _channel_shuffle(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    g = int(attr(node, "group"))
    shape = _in_shape(node)
    if len(shape) < 2 or shape[1] % g:
        raise TemplateError(f"ChannelShuffle: {shape[1] if len(shape) > 1 else '?'} channels, group {g}")
    cg = shape[1] // g
    return gen.at(node.inputs[0], _set(idx, 1, _sum([_mul(_mod(idx[1], g), cg), _div(idx[1], g)])), lets)


def reshape_map(idx: Sequence[Expr], out_shape: Sequence[int], in_shape: Sequence[int]) -> list[Expr]:
    """Input index of a row-major reshape. Dims are matched in groups of equal product, so a reshape
    that only inserts/removes 1s or splits/merges a few dims becomes a direct map."""
    result: list[Expr] = [Const(0)] * len(in_shape)
    if math.prod(in_shape) == 0:
        return result
    outs = [(i, d) for i, d in zip(idx, out_shape, strict=True) if d != 1]
    ins = [k for k, d in enumerate(in_shape) if d != 1]
    oi = ii = 0
    while oi < len(outs) and ii < len(ins):
        og, ig = [outs[oi]], [ins[ii]]
        oi, ii = oi + 1, ii + 1
        po, pi = og[0][1], in_shape[ig[0]]
        while po != pi:
            if po < pi:
                og.append(outs[oi])
                po *= outs[oi][1]
                oi += 1
            else:
                ig.append(ins[ii])
                pi *= in_shape[ins[ii]]
                ii += 1
        if len(og) == 1 and len(ig) == 1:
            result[ig[0]] = og[0][0]
            continue
        lin = _linearize([i for i, _ in og], [d for _, d in og])
        for k, e in zip(ig, _delinearize(lin, [in_shape[k] for k in ig]), strict=True):
            result[k] = e
    return result


def _reshape(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    in_shape, out_shape = _in_shape(node), _out_shape(node)
    if math.prod(in_shape) != math.prod(out_shape):
        raise TemplateError(f"{node.op_type}: {in_shape} and {out_shape} differ in size")
    return gen.at(node.inputs[0], reshape_map(idx, out_shape, in_shape), lets)


# ------------------------------------------------------------------------------------ Resize

def _nearest(x: np.float32, mode: str, down: bool) -> int:
    x = float(x)
    if mode == "round_prefer_floor":
        return math.floor(x) if x == math.floor(x) + 0.5 else _round_half_away(x)
    if mode == "round_prefer_ceil":
        return _round_half_away(x)
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    if mode == "simple":  # Upsample / Resize-10
        return math.ceil(x) if down else int(x)
    raise TemplateError(f"Resize: nearest_mode {mode!r} is not supported")


def _round_half_away(x: float) -> int:  # std::round
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def _orig_coord(mode: str, i: int, scale: np.float32, n_out: int, n_in: int) -> np.float32:
    f = np.float32
    xr = f(i)
    if mode == "half_pixel":
        return (xr + f(0.5)) / scale - f(0.5)
    if mode == "half_pixel_symmetric":
        adj = f(n_out) / (scale * f(n_in))
        center = f(n_in) / f(2)
        offset = center * (f(1) - adj)
        return offset + (xr + f(0.5)) / scale - f(0.5)
    if mode == "asymmetric":
        return xr / scale
    if mode == "pytorch_half_pixel":
        return (xr + f(0.5)) / scale - f(0.5) if n_out > 1 else f(0)
    if mode == "tf_half_pixel_for_nn":
        return (xr + f(0.5)) / scale
    if mode == "align_corners":
        return f(0) if n_out == 1 else xr * f(n_in - 1) / f(n_out - 1)
    raise TemplateError(f"Resize: coordinate_transformation_mode {mode!r} is not supported")


def _resize_common(gen: ElementGen, node: ir.Node, idx: list[Expr], lets, *, mode: str, coord: str,
                   nearest_mode: str, scales: list[np.float32]) -> Expr:
    x = node.inputs[0]
    in_shape, out_shape = value_shape(x), _out_shape(node)
    rank = len(in_shape)
    if mode == "nearest":
        new = []
        for d in range(rank):
            n_in, n_out = in_shape[d], out_shape[d]
            if n_in == n_out and scales[d] == 1:
                new.append(idx[d])
                continue
            tab = []
            for i in range(n_out):
                xo = _orig_coord(coord, i, scales[d], n_out, n_in)
                j = _nearest(xo, nearest_mode, bool(scales[d] < 1))
                tab.append(min(max(j, 0), n_in - 1))
            new.append(gen.bind(gen.table(tab, idx[d]), lets))
        return gen.at(x, new, lets)
    if mode != "linear":
        raise TemplateError(f"Resize: mode {mode!r} is not supported (nearest and linear are)")
    dtype = value_dtype(x)
    if dtype not in ("float32", "float64"):
        raise TemplateError("Resize: linear mode needs a float input")
    # per axis: two taps (i0, i1) with weights (w0, w1), as onnxruntime computes them (float32)
    taps: list[tuple[Expr, Expr, Expr, Expr] | None] = []
    f = np.float32
    for d in range(rank):
        n_in, n_out = in_shape[d], out_shape[d]
        if n_in == n_out and scales[d] == 1:
            taps.append(None)
            continue
        i0s, i1s, w0s, w1s = [], [], [], []
        for i in range(n_out):
            xo = _orig_coord(coord, i, scales[d], n_out, n_in)
            xo = f(max(f(0), min(xo, f(n_in - 1))))
            i0 = min(int(xo), n_in - 1)
            i1 = min(i0 + 1, n_in - 1)
            w1, w0 = abs(xo - f(i0)), abs(xo - f(i1))
            if i0 == i1:
                w0, w1 = f(0.5), f(0.5)
            i0s.append(i0)
            i1s.append(i1)
            w0s.append(f(w0))
            w1s.append(f(w1))
        taps.append((gen.bind(gen.table(i0s, idx[d]), lets), gen.bind(gen.table(i1s, idx[d]), lets),
                     gen.bind(gen.table(w0s, idx[d], "float32"), lets),
                     gen.bind(gen.table(w1s, idx[d], "float32"), lets)))
    resized = [d for d in range(rank) if taps[d] is not None]
    if not resized:
        return gen.at(x, list(idx), lets)
    total: Expr | None = None
    for corner in range(1 << len(resized)):
        new, weight = list(idx), None
        for k, d in enumerate(resized):
            i0, i1, w0, w1 = taps[d]
            hi = (corner >> (len(resized) - 1 - k)) & 1
            new[d] = i1 if hi else i0
            w = w1 if hi else w0
            weight = w if weight is None else Bin("*", weight, w)
        if dtype != "float32":  # (the weights' product in float32, as C promotes it)
            weight = Cast(weight, dtype)
        # indices are clamped into range: the loads are unconditional
        term = Bin("*", weight, gen.at(x, new, lets))
        total = term if total is None else Bin("+", total, term)
    return total


def _resize(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    in_shape = value_shape(node.inputs[0])
    rank = len(in_shape)
    opset = _opset(node)
    mode = attr(node, "mode", "nearest")
    if opset < 11:
        s = _const_input(gen, node, 1, "scales")
        scales = [f for f in s.astype(np.float32).reshape(-1)]
        return _resize_common(gen, node, idx, lets, mode=mode, coord="asymmetric", nearest_mode="simple",
                              scales=scales)
    coord = attr(node, "coordinate_transformation_mode", "half_pixel")
    if coord == "tf_crop_and_resize":
        raise TemplateError("Resize: coordinate_transformation_mode tf_crop_and_resize is not supported")
    if attr(node, "antialias", 0):
        raise TemplateError("Resize: antialias is not supported")
    nearest_mode = attr(node, "nearest_mode", "round_prefer_floor")
    axes = attr(node, "axes")
    axes = list(range(rank)) if axes is None else [_axis(a, rank, node) for a in axes]
    scales_in = _const_input(gen, node, 2, "scales")
    sizes = _const_input(gen, node, 3, "sizes")
    scales = [np.float32(1)] * rank
    if scales_in is not None and scales_in.size:
        for a, s in zip(axes, scales_in.astype(np.float32).reshape(-1), strict=True):
            scales[a] = np.float32(s)
    elif sizes is not None and sizes.size:
        ratios = [np.float32(np.float32(int(s)) / np.float32(in_shape[a]))
                  for a, s in zip(axes, sizes.reshape(-1), strict=True)]
        policy = attr(node, "keep_aspect_ratio_policy", "stretch")
        if policy == "not_larger":
            ratios = [min(ratios)] * len(axes)
        elif policy == "not_smaller":
            ratios = [max(ratios)] * len(axes)
        elif policy != "stretch":
            raise TemplateError(f"Resize: keep_aspect_ratio_policy {policy!r} is not supported")
        for a, r in zip(axes, ratios, strict=True):
            scales[a] = r
    else:
        raise TemplateError("Resize: one of the scales or sizes inputs must be a non-empty constant")
    return _resize_common(gen, node, idx, lets, mode=mode, coord=coord, nearest_mode=nearest_mode, scales=scales)


def _upsample(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    if len(node.inputs) > 1:
        s = _const_input(gen, node, 1, "scales")
    else:
        s = np.asarray(attr(node, "scales"), dtype=np.float32)
    scales = [f for f in s.astype(np.float32).reshape(-1)]
    mode = attr(node, "mode", "nearest")
    return _resize_common(gen, node, idx, lets, mode=mode, coord="asymmetric", nearest_mode="simple",
                          scales=scales)


# ------------------------------------------------------------------------- generators of static data

def _shape_op(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    """Shape: the input's static shape (start/end attributes, opset 15) as a table indexed by idx[0]."""
    shape = list(_in_shape(node))
    rank = len(shape)
    start = int(attr(node, "start", 0))
    end = attr(node, "end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(int(end) + rank if int(end) < 0 else int(end), 0), rank)
    dims = shape[start:end]
    if not dims:
        raise TemplateError("Shape: empty result")
    return gen.table(dims, idx[0])


def _constant_of_shape(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    value = attr(node, "value")
    out = node.outputs[0]
    if value is None:
        return literal(0, value_dtype(out))
    array = value.numpy().reshape(-1)
    return literal(array[0], array.dtype.name)


INDEXED.update({
    "Transpose": _transpose,
    "Slice": _slice,
    "Concat": _concat,
    "Split": _split,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "Pad": _pad,
    "Expand": _expand,
    "Tile": _tile,
    "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _space_to_depth,
    "Resize": _resize,
    "Upsample": _upsample,
    "dlcc::ChannelShuffle": _channel_shuffle,
    "Reshape": _reshape,
    "Flatten": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "Shape": _shape_op,
    "ConstantOfShape": _constant_of_shape,
})
