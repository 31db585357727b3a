"""Layout rules: move Transpose (and Squeeze/Unsqueeze, DepthToSpace) through other layout and reduction
ops so that it runs on fewer elements, meets its inverse, or vanishes.

What goes in: a model with inferred shapes. What comes out: the same function (bit for bit for rules
marked ``exact``; a reduction over a transposed tensor may sum in another order, so those are not).

Directions (each firing removes a node or shrinks the tensor a Transpose copies, so the set is finite;
Transpose only moves down past ops that shrink or combine, and up past ops that enlarge):

    down:  Concat(T(a), T(b))             -> T(Concat(a, b))        axis remapped through the perm
           Slice/Gather(T(x))             -> T'(Slice/Gather(x))    axes remapped; transposes less
           Reduce*/ArgMax/ArgMin(T(x))    -> T'(Reduce(x))          T' dropped when it is the identity
           Softmax(T(x)) feeding a Transpose -> T(Softmax(x))       they meet and cancel
           op(T(x), C) feeding a Transpose -> T(op(x, C'))          C' = C permuted back (C not scalar)
    up:    T(Expand/Tile/Pad(x))          -> Expand/Tile/Pad(T(x))  transposes the small tensor
    gone:  T that only moves size-1 dims  -> Reshape;  Reshape/Flatten(such T(x)) -> Reshape(x)
           Squeeze(T(x)) / T(Unsqueeze(x)) whose remaining perm is the identity -> one Squeeze/Unsqueeze
           SpaceToDepth(DepthToSpace-DCR(x)) -> x and the reverse
           Concat(Unsqueeze(a), Unsqueeze(b)) / Concat(Squeeze(a), Squeeze(b)) -> one (Un)Squeeze
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dlcc.passes.hoist import BROADCASTING, UNARY
from dlcc.passes.rewrite import Builder, Rule, attr, const_array, producer, static_shape

FAMILY = "layout"
REDUCE_EXACT = ("ReduceMax", "ReduceMin")
REDUCE_SUMS = ("ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
               "ReduceLogSum", "ReduceLogSumExp")


# ------------------------------------------------------------------------------------------ helpers


def _uses(v: ir.Value) -> list:
    """Uses by nodes in a graph (a candidate rewrite the driver did not apply leaves detached readers)."""
    return [u for u in v.uses() if u.node.graph is not None]


def _used_only_by(v: ir.Value | None, node: ir.Node) -> bool:
    return v is not None and not v.is_graph_output() and bool(_uses(v)) and all(
        u.node is node for u in _uses(v))


def _rank(v: ir.Value | None) -> int | None:
    return None if v is None or v.shape is None else len(v.shape)


def _perm(t: ir.Node) -> list[int] | None:
    p = attr(t, "perm")
    if p is not None:
        return [int(i) for i in p]
    r = _rank(t.inputs[0])
    return None if r is None else list(range(r))[::-1]


def _copy_attrs(node: ir.Node, drop: tuple[str, ...] = ()) -> dict[str, ir.Attr]:
    return {k: ir.Attr(a.name, a.type, a.value) for k, a in node.attributes.items() if k not in drop}


def _ints(v: ir.Value | None) -> list[int] | None:
    c = const_array(v)
    return None if c is None else [int(i) for i in c.reshape(-1)]


def _axes(node: ir.Node, index: int = 1) -> tuple[list[int] | None, bool]:
    """(axes, given): from the attribute or constant input ``index``; given=False if absent."""
    a = attr(node, "axes")
    if a is not None:
        return [int(i) for i in a], True
    if len(node.inputs) > index and node.inputs[index] is not None:
        return _ints(node.inputs[index]), True
    return None, False


def _norm(axes: list[int], rank: int) -> list[int] | None:
    out = [a + rank if a < 0 else a for a in axes]
    return out if all(0 <= a < rank for a in out) and len(set(out)) == len(out) else None


def _transpose(b: Builder, x: ir.Value, perm: list[int], **kw) -> ir.Value:
    if perm == list(range(len(perm))):
        return x
    return b.op("Transpose", [x], {"perm": perm}, hint="transpose", **kw)


def _axes_op(b: Builder, op: str, x: ir.Value, axes: list[int], **kw) -> ir.Value:
    if b.opset >= 13:
        return b.op(op, [x, b.const(np.array(axes, np.int64), "axes")], hint=op.lower(), **kw)
    return b.op(op, [x], {"axes": axes}, hint=op.lower(), **kw)


def _reshape(b: Builder, x: ir.Value, shape, **kw) -> ir.Value:
    return b.op("Reshape", [x, b.const(np.array(list(shape), np.int64), "shape")], hint="reshape", **kw)


def _t_input(node: ir.Node) -> dict | None:
    t = producer(node.inputs[0] if node.inputs else None, "Transpose")
    if t is None:
        return None
    p = _perm(t)
    return None if p is None else {"t": t, "p": p, "x": t.inputs[0]}


def _t_single(node: ir.Node, m: dict) -> str | None:
    return None if _used_only_by(m["t"].outputs[0], node) else "Transpose result has other uses"


def _unit_only(x_shape: tuple[int, ...], p: list[int]) -> bool:
    """The transpose moves only size-1 dims: the others keep their relative order."""
    kept = [a for a in p if x_shape[a] != 1]
    return kept == sorted(kept)


def _remaining_perm(p: list[int], removed_out: set[int]) -> list[int]:
    """Perm over the axes left after removing output axes ``removed_out`` (and x axes p[removed_out])."""
    removed_in = {p[i] for i in removed_out}
    left = [a for a in range(len(p)) if a not in removed_in]
    pos = {a: k for k, a in enumerate(left)}
    return [pos[p[i]] for i in range(len(p)) if i not in removed_out]


# ------------------------------------------------------------------- Concat of transposes / views


def _concat_t_pattern(node: ir.Node) -> dict | None:
    ts = [producer(v, "Transpose") for v in node.inputs]
    if len(ts) < 2 or any(t is None for t in ts):
        return None
    return {"ts": ts}


def _concat_t_check(node: ir.Node, m: dict) -> str | None:
    ts = m["ts"]
    perms = [_perm(t) for t in ts]
    if perms[0] is None or any(p != perms[0] for p in perms):
        return "permutations differ or unknown"
    if not all(_used_only_by(t.outputs[0], node) for t in ts):
        return "a Transpose result has other uses"
    axis = _norm([attr(node, "axis", 0)], len(perms[0]))
    if axis is None:
        return "axis out of range"
    m["p"], m["axis"] = perms[0], axis[0]
    return None


def _concat_t_rewrite(node: ir.Node, m: dict, b: Builder):
    c = b.op("Concat", [t.inputs[0] for t in m["ts"]], {"axis": m["p"][m["axis"]]}, hint="concat",
             dtype=node.outputs[0].dtype)
    return [b.op("Transpose", [c], {"perm": m["p"]}, hint="transpose")]


def _concat_view_pattern(op: str) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        vs = [producer(v, op) for v in node.inputs]
        if len(vs) < 2 or any(v is None for v in vs):
            return None
        return {"vs": vs}
    return pattern


def _concat_view_check(node: ir.Node, m: dict) -> str | None:
    vs = m["vs"]
    if not all(_used_only_by(v.outputs[0], node) for v in vs):
        return "a view result has other uses"
    ranks = {_rank(v.inputs[0]) for v in vs}
    if len(ranks) != 1 or None in ranks:
        return "operand ranks differ or unknown"
    r_in = ranks.pop()
    axes_all = [_axes(v)[0] for v in vs]
    if any(a is None for a in axes_all):
        return "axes absent or not constant"
    squeeze = vs[0].op_type == "Squeeze"
    r_full = r_in if squeeze else r_in + len(axes_all[0])
    axes = _norm(axes_all[0], r_full)
    if axes is None or any(_norm(a, r_full) is None or sorted(_norm(a, r_full)) != sorted(axes) for a in axes_all):
        return "axes differ"
    r_out = _rank(node.outputs[0])
    if r_out is None:
        return "rank unknown"
    k = _norm([attr(node, "axis", 0)], r_out)
    if k is None:
        return "axis out of range"
    if squeeze:
        left = [a for a in range(r_full) if a not in axes]
        m["axis"] = left[k[0]]
    else:
        if k[0] in axes:
            return "concat runs along an inserted axis"
        m["axis"] = k[0] - sum(1 for a in axes if a < k[0])
    m["axes"] = sorted(axes)
    return None


def _concat_view_rewrite(node: ir.Node, m: dict, b: Builder):
    vs = m["vs"]
    c = b.op("Concat", [v.inputs[0] for v in vs], {"axis": m["axis"]}, hint="concat", dtype=node.outputs[0].dtype)
    return [_axes_op(b, vs[0].op_type, c, m["axes"])]


# ------------------------------------------------------------------------ Slice / Gather of transpose


def _slice_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    if len(node.inputs) < 3:
        return "slice parameters absent"
    params = [_ints(v) if v is not None else None for v in node.inputs[1:5]]
    if params[0] is None or params[1] is None or any(
            v is not None and p is None for v, p in zip(node.inputs[3:5], params[2:], strict=False)):
        return "slice parameters are not constant"
    si, so = static_shape(m["x"]), static_shape(node.outputs[0])
    if si is None or so is None:
        return "shapes unknown"
    if np.prod(so) >= np.prod(si):
        return "slice does not shrink the tensor"
    axes = params[2] if len(params) > 2 and params[2] is not None else list(range(len(params[0])))
    axes = _norm(axes, len(si))
    if axes is None:
        return "axes out of range"
    m["axes"] = [m["p"][a] for a in axes]
    return None


def _slice_t_rewrite(node: ir.Node, m: dict, b: Builder):
    ins = list(node.inputs[:5]) + [None] * (5 - len(node.inputs[:5]))
    ins[3] = b.const(np.array(m["axes"], np.int64), "axes")
    while ins[-1] is None:
        ins.pop()
    s = b.op("Slice", [m["x"], *ins[1:]], hint="slice", dtype=node.outputs[0].dtype)
    return [b.op("Transpose", [s], {"perm": m["p"]}, hint="transpose")]


def _gather_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    si, sidx = static_shape(m["x"]), static_shape(node.inputs[1])
    if si is None or sidx is None:
        return "shapes unknown"
    k = _norm([attr(node, "axis", 0)], len(si))
    if k is None:
        return "axis out of range"
    k = k[0]
    if int(np.prod(sidx)) >= si[m["p"][k]]:
        return "gather does not shrink the tensor"
    p, q, ax = m["p"], len(sidx), m["p"][k]

    def pos(a: int) -> int:
        return a if a < ax else a + q - 1
    m["axis"] = ax
    m["perm"] = [pos(p[i]) for i in range(k)] + list(range(ax, ax + q)) + [pos(p[i]) for i in range(k + 1, len(p))]
    return None


def _gather_t_rewrite(node: ir.Node, m: dict, b: Builder):
    g = b.op("Gather", [m["x"], node.inputs[1]], {"axis": m["axis"]}, hint="gather", dtype=node.outputs[0].dtype)
    return [_transpose(b, g, m["perm"])]


# ------------------------------------------------------------------------ reductions of transpose


def _reduce_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    r = len(m["p"])
    if node.op_type in ("ArgMax", "ArgMin"):
        axes, given = [attr(node, "axis", 0)], True
    else:
        axes, given = _axes(node)
        if given and axes is None:
            return "axes are not constant"
    if not given or not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return "empty axes reduce nothing"
        axes = list(range(r))
    axes = _norm(axes, r)
    if axes is None:
        return "axes out of range"
    m["new_axes"] = sorted(m["p"][a] for a in axes)
    m["given"] = given
    keep = attr(node, "keepdims", 1)
    m["perm"] = m["p"] if keep else _remaining_perm(m["p"], set(axes))
    return None


def _reduce_t_rewrite(node: ir.Node, m: dict, b: Builder):
    attrs = _copy_attrs(node, drop=("axes", "axis"))
    ins = [m["x"]]
    if node.op_type in ("ArgMax", "ArgMin"):
        attrs["axis"] = ir.AttrInt64("axis", m["new_axes"][0])
    elif not m["given"]:
        pass
    elif attr(node, "axes") is not None:
        attrs["axes"] = ir.AttrInt64s("axes", m["new_axes"])
    else:
        ins.append(b.const(np.array(m["new_axes"], np.int64), "axes"))
    y = b.op(node.op_type, ins, attrs, hint=node.op_type.lower(), dtype=node.outputs[0].dtype)
    return [_transpose(b, y, m["perm"])]


def _softmax_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    out = node.outputs[0]
    if out.is_graph_output() or len(_uses(out)) != 1 or _uses(out)[0].node.op_type != "Transpose":
        return "no Transpose below to meet"
    k = _norm([attr(node, "axis", -1)], len(m["p"]))
    if k is None:
        return "axis out of range"
    m["axis"] = m["p"][k[0]]
    return None


def _softmax_t_rewrite(node: ir.Node, m: dict, b: Builder):
    y = b.op(node.op_type, [m["x"]], {"axis": m["axis"]}, hint=node.op_type.lower(), dtype=node.outputs[0].dtype)
    return [b.op("Transpose", [y], {"perm": m["p"]}, hint="transpose")]


# -------------------------------------------------------------- Transpose above Expand / Tile / Pad


def _t_of_pattern(op: str) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        e = producer(node.inputs[0], op)
        p = _perm(node)
        return None if e is None or p is None else {"e": e, "p": p, "x": e.inputs[0]}
    return pattern


def _t_of_check(node: ir.Node, m: dict) -> str | None:
    e, p, x = m["e"], m["p"], m["x"]
    if not _used_only_by(e.outputs[0], node):
        return f"{e.op_type} result has other uses"
    sx, so = static_shape(x), static_shape(e.outputs[0])
    if sx is None or so is None:
        return "shapes unknown"
    if len(sx) != len(so):
        return "operand rank differs from the output rank"
    if np.prod(sx) >= np.prod(so):
        return f"{e.op_type} does not enlarge the tensor"
    param = _ints(e.inputs[1]) if len(e.inputs) > 1 else None
    if param is None:
        return "parameter is not constant"
    r = len(p)
    if e.op_type == "Pad":
        if len(e.inputs) > 3 and e.inputs[3] is not None:
            return "pad axes given"
        if len(param) != 2 * r:
            return "pads do not cover every axis"
        m["param"] = [param[a] for a in p] + [param[r + a] for a in p]
    else:
        if len(param) != r:
            return "parameter length differs from the rank"
        m["param"] = [param[a] for a in p]
    return None


def _t_of_rewrite(node: ir.Node, m: dict, b: Builder):
    e = m["e"]
    t = b.op("Transpose", [m["x"]], {"perm": m["p"]}, hint="transpose", dtype=m["x"].dtype)
    name = {"Expand": "shape", "Tile": "repeats", "Pad": "pads"}[e.op_type]
    ins = [t, b.const(np.array(m["param"], np.int64), name), *e.inputs[2:]]
    return [b.op(e.op_type, ins, _copy_attrs(e), hint=e.op_type.lower(), dtype=node.outputs[0].dtype)]


# ---------------------------------------------------------------- transposes that only move unit dims


def _unit_t_check(node: ir.Node, m: dict) -> str | None:
    sx = static_shape(node.inputs[0])
    p = _perm(node)
    if sx is None or p is None or static_shape(node.outputs[0]) is None:
        return "shapes unknown"
    if p == list(range(len(p))):
        return "identity permutation"
    if not _unit_only(sx, p):
        return "transpose moves data"
    out = node.outputs[0]
    if not out.is_graph_output() and _uses(out) and all(
            u.node.op_type in ("Reshape", "Flatten", "Squeeze") and u.idx == 0 for u in _uses(out)):
        return "the view op below absorbs it"
    if producer(node.inputs[0], "Unsqueeze") is not None and _used_only_by(node.inputs[0], node):
        return "the Unsqueeze above absorbs it"
    return None


def _view_of_unit_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    sx = static_shape(m["x"])
    if sx is None or static_shape(node.outputs[0]) is None:
        return "shapes unknown"
    if not _unit_only(sx, m["p"]):
        return "transpose moves data"
    return None


def _squeeze_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    axes, given = _axes(node)
    if not given or axes is None:
        return "axes absent or not constant"
    axes = _norm(axes, len(m["p"]))
    if axes is None:
        return "axes out of range"
    if _remaining_perm(m["p"], set(axes)) != list(range(len(m["p"]) - len(axes))):
        return "transpose still needed after the squeeze"
    m["axes"] = sorted(m["p"][a] for a in axes)
    return None


def _t_unsqueeze_pattern(node: ir.Node) -> dict | None:
    u = producer(node.inputs[0], "Unsqueeze")
    p = _perm(node)
    return None if u is None or p is None else {"u": u, "p": p}


def _t_unsqueeze_check(node: ir.Node, m: dict) -> str | None:
    u, p = m["u"], m["p"]
    if not _used_only_by(u.outputs[0], node):
        return "Unsqueeze result has other uses"
    axes, given = _axes(u)
    if not given or axes is None:
        return "axes absent or not constant"
    axes = _norm(axes, len(p))
    if axes is None:
        return "axes out of range"
    kept = [a for a in p if a not in axes]
    if kept != sorted(kept):
        return "transpose moves data"
    m["axes"] = [i for i in range(len(p)) if p[i] in axes]
    return None


# ---------------------------------------------------------------------- DepthToSpace / SpaceToDepth


def _d2s_pair_pattern(inner: str) -> Callable[[ir.Node], dict | None]:
    def pattern(node: ir.Node) -> dict | None:
        d = producer(node.inputs[0], inner)
        return None if d is None else {"d": d}
    return pattern


def _d2s_pair_check(node: ir.Node, m: dict) -> str | None:
    d = m["d"]
    d2s = d if d.op_type == "DepthToSpace" else node
    mode = attr(d2s, "mode", "DCR")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "DCR":
        return "DepthToSpace mode is not DCR"
    if attr(d, "blocksize") != attr(node, "blocksize"):
        return "block sizes differ"
    return None


# ------------------------------------------------------------- op(T(x), C) sinks to meet a Transpose


def _meets_transpose(v: ir.Value, limit: int = 32) -> bool:
    for _ in range(limit):
        if v.is_graph_output() or len(_uses(v)) != 1:
            return False
        c = _uses(v)[0].node
        if c.op_type == "Transpose" and c.domain in ("", "ai.onnx"):
            return True
        if c.op_type not in UNARY | BROADCASTING or len(c.outputs) != 1:
            return False
        if any(w is not v and const_array(w) is None for w in c.inputs if w is not None):
            return False
        v = c.outputs[0]
    return False


def _const_t_pattern(node: ir.Node) -> dict | None:
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    for i in (0, 1):
        t = producer(node.inputs[i], "Transpose")
        c = const_array(node.inputs[1 - i])
        if t is not None and c is not None and c.size > 1:
            p = _perm(t)
            if p is not None:
                return {"t": t, "i": i, "c": c, "p": p, "x": t.inputs[0]}
    return None


def _const_t_check(node: ir.Node, m: dict) -> str | None:
    why = _t_single(node, m)
    if why:
        return why
    r = len(m["p"])
    if m["c"].ndim > r:
        return "constant raises the rank"
    if static_shape(node.outputs[0]) != static_shape(m["t"].outputs[0]) or static_shape(node.outputs[0]) is None:
        return "constant broadcasts the output"
    if not _meets_transpose(node.outputs[0]):
        return "no Transpose below to meet"
    return None


def _const_t_rewrite(node: ir.Node, m: dict, b: Builder):
    r, c = len(m["p"]), m["c"]
    c = c.reshape((1,) * (r - c.ndim) + c.shape).transpose(np.argsort(m["p"]))
    ins = [m["x"], None]
    ins[m["i"]], ins[1 - m["i"]] = m["x"], b.const(np.ascontiguousarray(c), "const_t")
    y = b.op(node.op_type, ins, _copy_attrs(node), hint=node.op_type.lower(), dtype=node.outputs[0].dtype)
    return [b.op("Transpose", [y], {"perm": m["p"]}, hint="transpose")]


_BINARY_ROOTS = tuple(sorted({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Mod", "Equal", "Less", "Greater",
                              "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "PRelu"}))


def _rule(name: str, roots, pattern, check, rewrite, doc: str, exact: bool = True, min_opset: int = 1) -> Rule:
    return Rule(f"layout-{name}", tuple(roots), pattern, check, rewrite, doc=doc, family=FAMILY, exact=exact,
                min_opset=min_opset)


RULES: list[Rule] = [
    _rule("concat-of-transposes", ("Concat",), _concat_t_pattern, _concat_t_check, _concat_t_rewrite,
          "Concat(T(a, p), T(b, p), k) -> T(Concat(a, b, p[k]), p)"),
    _rule("concat-of-unsqueezes", ("Concat",), _concat_view_pattern("Unsqueeze"), _concat_view_check,
          _concat_view_rewrite, "Concat(Unsqueeze(a, u), Unsqueeze(b, u)) -> Unsqueeze(Concat(a, b), u)"),
    _rule("concat-of-squeezes", ("Concat",), _concat_view_pattern("Squeeze"), _concat_view_check,
          _concat_view_rewrite, "Concat(Squeeze(a, s), Squeeze(b, s)) -> Squeeze(Concat(a, b), s)"),
    _rule("slice-of-transpose", ("Slice",), _t_input, _slice_t_check, _slice_t_rewrite,
          "Slice(T(x, p), axes) -> T(Slice(x, p[axes]), p): transpose only what is kept", min_opset=10),
    _rule("gather-of-transpose", ("Gather",), _t_input, _gather_t_check, _gather_t_rewrite,
          "Gather(T(x, p), i, k) -> T'(Gather(x, i, p[k])): transpose only what is kept"),
    _rule("reduce-minmax-of-transpose", REDUCE_EXACT, _t_input, _reduce_t_check, _reduce_t_rewrite,
          "ReduceMax/Min(T(x, p), axes) -> T'(ReduceMax/Min(x, p[axes]))"),
    _rule("reduce-of-transpose", REDUCE_SUMS, _t_input, _reduce_t_check, _reduce_t_rewrite,
          "ReduceSum/Mean/...(T(x, p), axes) -> T'(Reduce(x, p[axes])) (summation order may change)",
          exact=False),
    _rule("argmax-of-transpose", ("ArgMax", "ArgMin"), _t_input, _reduce_t_check, _reduce_t_rewrite,
          "ArgMax/ArgMin(T(x, p), k) -> T'(ArgMax/ArgMin(x, p[k]))"),
    _rule("softmax-of-transpose", ("Softmax", "LogSoftmax"), _t_input, _softmax_t_check, _softmax_t_rewrite,
          "Softmax(T(x, p), k) -> T(Softmax(x, p[k]), p) when a Transpose follows (they meet)",
          exact=False, min_opset=13),
    _rule("transpose-of-expand", ("Transpose",), _t_of_pattern("Expand"), _t_of_check, _t_of_rewrite,
          "T(Expand(x, s), p) -> Expand(T(x, p), s[p]): transpose the small tensor", min_opset=8),
    _rule("transpose-of-tile", ("Transpose",), _t_of_pattern("Tile"), _t_of_check, _t_of_rewrite,
          "T(Tile(x, r), p) -> Tile(T(x, p), r[p]): transpose the small tensor", min_opset=6),
    _rule("transpose-of-pad", ("Transpose",), _t_of_pattern("Pad"), _t_of_check, _t_of_rewrite,
          "T(Pad(x, pads), p) -> Pad(T(x, p), pads[p]): transpose the small tensor", min_opset=11),
    _rule("transpose-unit-to-reshape", ("Transpose",), lambda n: {}, _unit_t_check,
          lambda n, m, b: [_reshape(b, n.inputs[0], static_shape(n.outputs[0]))],
          "Transpose that only moves size-1 dims -> Reshape (a view)", min_opset=5),
    _rule("reshape-of-unit-transpose", ("Reshape",), _t_input, _view_of_unit_t_check,
          lambda n, m, b: [_reshape(b, m["x"], static_shape(n.outputs[0]))],
          "Reshape(T(x)) where T only moves size-1 dims -> Reshape(x)", min_opset=5),
    _rule("flatten-of-unit-transpose", ("Flatten",), _t_input, _view_of_unit_t_check,
          lambda n, m, b: [_reshape(b, m["x"], static_shape(n.outputs[0]))],
          "Flatten(T(x)) where T only moves size-1 dims -> Reshape(x)", min_opset=5),
    _rule("squeeze-of-transpose", ("Squeeze",), _t_input, _squeeze_t_check,
          lambda n, m, b: [_axes_op(b, "Squeeze", m["x"], m["axes"])],
          "Squeeze(T(x, p), s) -> Squeeze(x, p[s]) when the remaining perm is the identity"),
    _rule("transpose-of-unsqueeze", ("Transpose",), _t_unsqueeze_pattern, _t_unsqueeze_check,
          lambda n, m, b: [_axes_op(b, "Unsqueeze", m["u"].inputs[0], m["axes"])],
          "T(Unsqueeze(x, u), p) -> Unsqueeze(x, u') when T keeps the order of x's dims"),
    _rule("space-to-depth-of-depth-to-space", ("SpaceToDepth",), _d2s_pair_pattern("DepthToSpace"),
          _d2s_pair_check, lambda n, m, b: [m["d"].inputs[0]], "SpaceToDepth(DepthToSpace-DCR(x, k), k) -> x"),
    _rule("depth-to-space-of-space-to-depth", ("DepthToSpace",), _d2s_pair_pattern("SpaceToDepth"),
          _d2s_pair_check, lambda n, m, b: [m["d"].inputs[0]], "DepthToSpace-DCR(SpaceToDepth(x, k), k) -> x"),
    _rule("sink-transpose-past-const-op", _BINARY_ROOTS, _const_t_pattern, _const_t_check, _const_t_rewrite,
          "op(T(x, p), C) -> T(op(x, C'), p) when a Transpose follows: C' = C permuted back"),
]
