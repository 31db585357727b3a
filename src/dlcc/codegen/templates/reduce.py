"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSumExp/LogSum, ArgMax/ArgMin.

What goes in: a ``TemplateCall`` whose input 0 may be an inlined expression (read only via ``Operand.at``);
axes as an attribute (opset < 13, < 18 for most ops) or as a constant input 1.
What comes out: C that computes each output element once and hands it to ``call.store``.

The loop engine ``row_reduce`` is shared with the normalizations (norm.py). Its loop order follows the
input's memory order: the kept dims after the last reduced axis ("tail", up to ``TAIL_LIMIT`` elements)
are the innermost loop and get an accumulator *array*, so a reduction over a non-last axis still runs a
contiguous, vectorizable inner loop; the other kept dims are outer loops. When the last axis is reduced,
the inner loop is split over ``LANES`` partial accumulators (vectorizable without -ffast-math).
The engine may cache a reduced row (after its first pass) in a stack array so an inlined input is
evaluated once per element even when the op needs several passes (norms).
Sums run in float with partial accumulators: the summation order differs from onnxruntime, so these ops
are compared with rtol 1e-4 (DESIGN tolerance for reductions).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dlcc.codegen.cbase import Operand, TemplateError, TensorRef, ctype, indent, loops
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.threads import MARK

__all__ = ["Pass", "reduce_axes", "row_reduce"]

TAIL_LIMIT = 4096  # max elements of the per-row accumulator arrays (16 KB of floats)
CACHE_LIMIT = 4096  # max elements of a cached row

Get = Callable[[str], str]


@dataclass
class Pass:
    """One pass over the reduced elements: ``acc = step(acc, v, get)`` for every element ``v``.

    ``transform(x, get)`` (optional) maps the element before the step (and is written back to the cached
    row); ``merge(a, b)`` combines two partial accumulators (None: no lane splitting); ``after(acc, get)``
    is the accumulator's final value (e.g. sum -> mean). ``get(key)`` is the C lvalue of the accumulator
    of an earlier pass for the current row."""

    key: str
    init: str
    step: Callable[[str, str, Get], str]
    merge: Callable[[str, str], str] | None = None
    transform: Callable[[str, Get], str] | None = None
    after: Callable[[str, Get], str] | None = None
    dtype: str = "float32"


def _nest(dims: Sequence[int], shape: Sequence[int], full: list, names, body: Callable[[], str]) -> str:
    """Loops over the input dims ``dims`` (in order), setting ``full[d]`` to the loop index names."""
    idx, _ = loops([shape[d] for d in dims], names, "")
    for d, i in zip(dims, idx, strict=True):
        full[d] = i
    text = body()
    for d, i in reversed(list(zip(dims, idx, strict=True))):
        if shape[d] == 1:
            continue
        text = f"for (int64_t {i} = 0; {i} < {shape[d]}; ++{i}) {{\n{indent(text)}\n}}"
    return text


def row_reduce(call: TemplateCall, x: Operand, axes: Sequence[int], passes: list[Pass], *,
               finish_reduce: Callable[[Get], str] | None = None,
               out_index: Callable[[list[str]], list[str]] | None = None,
               finish_elem: Callable[[str, Get, bool, list[str]], str] | None = None,
               cache: bool = False) -> str:
    """C for a multi-pass reduction of ``x`` over ``axes``, followed either by one ``store`` per reduced
    row (``finish_reduce(get)`` is the value, ``out_index(full)`` the output index with reduced dims at 0)
    or by one ``store`` per input element (``finish_elem(x_expr, get, cached, idx)``; output index = input's)."""
    LANES = call.target.lanes  # partial sums (a vectorizable accumulator): one vector
    names = call.names
    shape = list(x.shape)
    r = len(shape)
    axes = sorted(set(axes))
    if not axes:
        raise TemplateError("internal: row_reduce without axes")
    tail_all = list(range(axes[-1] + 1, r))
    tdims: list[int] = []
    prod = 1
    for d in reversed(tail_all):
        if prod * shape[d] > TAIL_LIMIT:
            break
        tdims.insert(0, d)
        prod *= shape[d]
    tshape = [shape[d] for d in tdims]
    tsize = math.prod(tshape)
    vector = tsize > 1
    outer = [d for d in range(r) if d not in axes and d not in tdims]
    rshape = [shape[d] for d in axes]
    rsize = math.prod(rshape)
    cached = (cache and not vector and 0 < rsize <= CACHE_LIMIT and x.dtype == "float32")
    full: list = ["0"] * r
    accs = {p.key: names("acc") for p in passes}
    dtypes = {p.key: p.dtype for p in passes}
    row = TensorRef(names("row"), "float32", rshape) if cached else None
    lanes_ok = not vector and axes[-1] == r - 1 and shape[-1] >= 2 * LANES

    def acc_lv(key: str) -> str:
        if not vector:
            return accs[key]
        return TensorRef(accs[key], dtypes[key], tshape).at([full[d] for d in tdims])

    def row_lv() -> str:
        return row.at([full[d] for d in axes])

    def elem(k: int, p: Pass, target: str) -> str:
        ct = ctype(p.dtype)
        src = row_lv() if cached and k > 0 else x.at(list(full))
        v = names("v")
        lines = [f"const {ct} {v} = {src};"]
        if p.transform is not None:
            w = names("v")
            lines.append(f"const {ct} {w} = {p.transform(v, acc_lv)};")
            v = w
        if cached and (k == 0 or p.transform is not None):
            lines.append(f"{row_lv()} = {v};")
        lines.append(f"{target} = {p.step(target, v, acc_lv)};")
        return "\n".join(lines)

    def one_pass(k: int, p: Pass) -> str:
        ct = ctype(p.dtype)
        if lanes_ok and p.merge is not None:
            a, j, lane = names("lane"), names("j"), names("l")
            n = shape[-1]
            last = r - 1

            def lane_body() -> str:
                full[last] = f"{j} + {lane}"
                body = elem(k, p, f"{a}[{lane}]")
                main = (f"for ({j} = 0; {j} + {LANES} <= {n}; {j} += {LANES}) {{\n"
                        f"    for (int64_t {lane} = 0; {lane} < {LANES}; ++{lane}) {{\n"
                        f"{indent(body, 2)}\n    }}\n}}")
                full[last] = j
                body = elem(k, p, f"{a}[0]")
                return f"{main}\nfor (; {j} < {n}; ++{j}) {{\n{indent(body)}\n}}"

            text = _nest(axes[:-1], shape, full, names, lane_body)
            # lanes merged left to right, one statement each (a nested expression would repeat its operands:
            # max(x, y) is written with x twice, so it doubles with every lane)
            acc = accs[p.key]
            merged = [f"{acc} = {a}[0];"] + [f"{acc} = {p.merge(acc, f'{a}[{i}]')};" for i in range(1, LANES)]
            return (f"{{\n    {ct} {a}[{LANES}];\n    int64_t {j};\n"
                    f"    for (int64_t {lane} = 0; {lane} < {LANES}; ++{lane}) {a}[{lane}] = {p.init};\n"
                    f"{indent(text)}\n{indent(chr(10).join(merged))}\n}}")

        def body() -> str:
            return _nest(tdims, shape, full, names, lambda: elem(k, p, acc_lv(p.key)))
        return _nest(axes, shape, full, names, body)

    def per_row() -> str:
        parts = []
        for p in passes:
            ct = ctype(p.dtype)
            if vector:
                parts.append(f"{ct} {accs[p.key]}[{tsize}];")
                init = _nest(tdims, shape, full, names, lambda p=p: f"{acc_lv(p.key)} = {p.init};")
                parts.append(init)
            else:
                parts.append(f"{ct} {accs[p.key]} = {p.init};")
        if cached:
            parts.append(f"float {row.ptr}[{rsize}];")
        for k, p in enumerate(passes):
            parts.append(one_pass(k, p))
            if p.after is not None:
                parts.append(_nest(tdims, shape, full, names,
                                   lambda p=p: f"{acc_lv(p.key)} = {p.after(acc_lv(p.key), acc_lv)};"))
        if finish_reduce is not None:
            def fin() -> str:
                for d in axes:
                    full[d] = "0"
                return call.store(out_index(list(full)), finish_reduce(acc_lv))
            parts.append(_nest(tdims, shape, full, names, fin))
        else:
            def fin_elem() -> str:
                src = row_lv() if cached else x.at(list(full))
                return call.store(list(full), finish_elem(src, acc_lv, cached, list(full)))
            parts.append(_nest(axes, shape, full, names, lambda: _nest(tdims, shape, full, names, fin_elem)))
        return "\n".join(parts)

    text = _nest(outer, shape, full, names, per_row)
    # threads: rows are independent (each reduces and stores its own); the outermost row loop is split
    if call.parallel(10.0 * math.prod(shape) * len(passes)) and text.startswith("for (int64_t "):
        text = f"{MARK}\n{text}"
    return text


# ---------------------------------------------------------------- the Reduce* ops


def reduce_axes(call: TemplateCall, rank: int) -> list[int] | None:
    """The reduced axes (normalized, sorted), [] for "no reduction" (noop_with_empty_axes), None for all."""
    axes = None
    if len(call.inputs) > 1 and call.inputs[1] is not None:
        op = call.inputs[1]
        if op.const is None:
            raise TemplateError(f"{call.node.op_type}: the axes input must be a constant")
        axes = [int(a) for a in op.const.reshape(-1)]
    elif call.attr("axes") is not None:
        axes = [int(a) for a in call.attr("axes")]
    if not axes:
        if int(call.attr("noop_with_empty_axes", 0)):
            return []
        return None
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise TemplateError(f"{call.node.op_type}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise TemplateError(f"{call.node.op_type}: repeated axes {axes}")
    return sorted(out)


def _add(a, v, g):
    return f"{a} + {v}"


def _plus(a, b):
    return f"{a} + {b}"


def _max(a, v, g=None):
    return f"({v} > {a} ? {v} : {a})"


def _min(a, v, g=None):
    return f"({v} < {a} ? {v} : {a})"


_FLOAT_OPS = {
    # op: (init, step, merge, identity map for noop_with_empty_axes, finish(acc, n))
    "ReduceSum": ("0.0f", _add, _plus, "{}", "{}"),
    "ReduceMean": ("0.0f", _add, _plus, "{}", "{} * (1.0f / {n}.0f)"),
    "ReduceMax": ("(-INFINITY)", _max, _max, "{}", "{}"),
    "ReduceMin": ("INFINITY", _min, _min, "{}", "{}"),
    "ReduceProd": ("1.0f", lambda a, v, g: f"{a} * {v}", lambda a, b: f"{a} * {b}", "{}", "{}"),
    "ReduceL1": ("0.0f", lambda a, v, g: f"{a} + fabsf({v})", _plus, "fabsf({})", "{}"),
    "ReduceL2": ("0.0f", lambda a, v, g: f"{a} + {v} * {v}", _plus, "fabsf({})", "sqrtf({})"),
    "ReduceSumSquare": ("0.0f", lambda a, v, g: f"{a} + {v} * {v}", _plus, "(({0}) * ({0}))", "{}"),
    "ReduceLogSum": ("0.0f", _add, _plus, "dlcc_logf({})", "dlcc_logf({})"),
}

_INT_OPS = {
    "ReduceSum": ("0", _add, _plus),
    "ReduceMax": ("INT64_MIN", _max, _max),
    "ReduceMin": ("INT64_MAX", _min, _min),
}


@register("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")
def reduce_op(call: TemplateCall) -> str:
    op = call.node.op_type
    x = call.inputs[0]
    r = len(x.shape)
    if x.dtype not in ("float32", "int64") or (x.dtype == "int64" and op not in _INT_OPS):
        raise TemplateError(f"{op}: {x.dtype} input is not supported (float32; int64 for Sum/Max/Min)")
    if x.dtype != call.out_dtype:
        raise TemplateError(f"{op}: output type {call.out_dtype} differs from the input's {x.dtype}")
    axes = reduce_axes(call, r)
    keep = int(call.attr("keepdims", 1))
    if axes == []:  # noop_with_empty_axes: the output is the input (elementwise part of the op applied)
        fmt = "{}" if x.dtype == "int64" or op == "ReduceLogSumExp" else _FLOAT_OPS[op][3]
        idx, text = loops(x.shape, call.names, lambda idx: call.store(idx, fmt.format(x.at(idx))))
        return text
    if axes is None:
        axes = list(range(r))
    if math.prod(x.shape) == 0:
        raise TemplateError(f"{op}: empty input tensors are not supported")
    n = math.prod(x.shape[d] for d in axes)

    def out_index(full: list[str]) -> list[str]:
        if keep:
            return ["0" if d in axes else full[d] for d in range(r)]
        return [full[d] for d in range(r) if d not in axes]

    if op == "ReduceLogSumExp":
        passes = [Pass("m", "(-INFINITY)", _max, _max),
                  Pass("s", "0.0f", lambda a, v, g: f"{a} + dlcc_expf({v} - {g('m')})", _plus)]
        # an all -inf row gives log(0) + -inf = -inf, like numpy; guard the inf - inf = nan in dlcc_expf
        def fin(g):
            return f"(isinf({g('m')}) ? {g('m')} : dlcc_logf({g('s')}) + {g('m')})"
        return row_reduce(call, x, axes, passes, finish_reduce=fin, out_index=out_index)
    if x.dtype == "int64":
        init, step, merge = _INT_OPS[op]
        passes = [Pass("a", init, step, merge, dtype="int64")]
        return row_reduce(call, x, axes, passes, finish_reduce=lambda g: g("a"), out_index=out_index)
    init, step, merge, _, fin = _FLOAT_OPS[op]
    passes = [Pass("a", init, step, merge)]
    return row_reduce(call, x, axes, passes, finish_reduce=lambda g: fin.format(g("a"), n=n), out_index=out_index)


@register("ArgMax", "ArgMin")
def arg_op(call: TemplateCall) -> str:
    op = call.node.op_type
    x = call.inputs[0]
    if x.dtype not in ("float32", "int64"):
        raise TemplateError(f"{op}: {x.dtype} input is not supported")
    r = len(x.shape)
    axis = int(call.attr("axis", 0))
    if not -r <= axis < r:
        raise TemplateError(f"{op}: axis {axis} out of range for rank {r}")
    axis %= r
    keep = int(call.attr("keepdims", 1))
    last = int(call.attr("select_last_index", 0))
    n = x.shape[axis]
    if n == 0:
        raise TemplateError(f"{op}: empty reduction axis")
    cmp = (">" if op == "ArgMax" else "<") + ("=" if last else "")
    ct = ctype(x.dtype)
    names = call.names
    # best value and index, as a two-accumulator pass; index of the reduced axis comes from the loop
    shape = list(x.shape)
    full: list = ["0"] * r
    tdims = list(range(axis + 1, r))
    while tdims and math.prod(shape[d] for d in tdims) > TAIL_LIMIT:
        tdims.pop(0)
    tshape = [shape[d] for d in tdims]
    tsize = math.prod(tshape)
    outer = [d for d in range(r) if d != axis and d not in tdims]
    best, bi = names("best"), names("bi")

    def lv(name, dt):
        if tsize == 1:
            return name
        return TensorRef(name, dt, tshape).at([full[d] for d in tdims])

    def per_row() -> str:
        parts = []
        if tsize > 1:
            parts.append(f"{ct} {best}[{tsize}];\nint64_t {bi}[{tsize}];")
        else:
            parts.append(f"{ct} {best};\nint64_t {bi};")

        def init() -> str:
            full[axis] = "0"
            return f"{lv(best, x.dtype)} = {x.at(list(full))};\n{lv(bi, 'int64')} = 0;"
        parts.append(_nest(tdims, shape, full, names, init))
        if n > 1:
            k = names("k")

            def step() -> str:
                full[axis] = k
                v = names("v")
                b, i = lv(best, x.dtype), lv(bi, "int64")
                return (f"const {ct} {v} = {x.at(list(full))};\n"
                        f"if ({v} {cmp} {b}) {{ {b} = {v}; {i} = {k}; }}")
            inner = _nest(tdims, shape, full, names, step)
            parts.append(f"for (int64_t {k} = 1; {k} < {n}; ++{k}) {{\n{indent(inner)}\n}}")

        def fin() -> str:
            full[axis] = "0"
            oidx = [full[d] for d in range(r)] if keep else [full[d] for d in range(r) if d != axis]
            return call.store(oidx, lv(bi, "int64"))
        parts.append(_nest(tdims, shape, full, names, fin))
        return "\n".join(parts)

    return _nest(outer, shape, full, names, per_row)
