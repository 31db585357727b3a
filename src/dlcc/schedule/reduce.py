"""The schedule of reductions and normalizations for one target: Reduce*, ArgMax/ArgMin, Softmax, LogSoftmax,
LayerNormalization, InstanceNormalization, RMSNormalization and LRN.

What goes in: a ``RowOp`` (the op, the input's shape and dtype, the reduced axes, keepdims, epsilon and the
shapes of the scale/bias inputs: hashable, so a template verifies the loop IR of each one once), the target's
lanes and the thread count; ArgMax/ArgMin and LRN take their attributes (LRN its buffers).
What comes out: the loop IR (``row_func``, ``arg_func``, ``lrn_func``). Input ``k`` of the op is the opaque input
``In(k, ...)``, which the template prints as its operand (a load, or a fused producer's expression evaluated
where it is read); every result goes to the ``Epilogue``.

The row engine (``row_func``) runs one or more passes over each reduced row, each folding the row's elements
into an accumulator (``Pass``), then hands on one result per row (reductions) or per element (normalizations).
Its loop order follows the input's memory order:

    for the kept dims before the last reduced axis ("outer"; the outermost one split over threads)
        accumulators: scalars, or arrays over the "tail" (the kept dims after the last reduced axis, at most
                      TAIL_LIMIT elements), so a reduction over a non-last axis still runs a contiguous,
                      vectorizable inner loop
        for each pass: for the reduced dims: for the tail: acc[t] = step(acc[t], x)
        for the tail (and the reduced dims): epilogue(result)

When the last axis is reduced (no tail), a pass runs over ``lanes`` partial accumulators (a vector: the loop
vectorizes without -ffast-math), merged left to right at the end. A reduced row of at most CACHE_LIMIT elements
is cached in a stack array by the first pass (and rewritten by a pass's transform, e.g. exp), so an inlined
input is evaluated once per element even when the op needs several passes. Float sums run in float with partial
accumulators, in another order than onnxruntime's (tests: rtol 1e-4 for reductions); the normalizations' mean
is summed in double.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dlcc.errors import PassError
from dlcc.lower.lir import (
    Alloc,
    Bin,
    Buf,
    Call,
    Cast,
    Const,
    Epilogue,
    Expr,
    For,
    Func,
    If,
    In,
    Layout,
    Load,
    Select,
    Stmt,
    Store,
    Var,
    simplify,
)
from dlcc.schedule.loops import numbered
from dlcc.schedule.transform import loop_names, mark, parallelize

__all__ = ["CACHE_LIMIT", "TAIL_LIMIT", "RowOp", "arg_func", "lrn_func", "row_func"]

TAIL_LIMIT = 4096  # max elements of the per-row accumulator arrays (16 KB of floats)
CACHE_LIMIT = 4096  # max elements of a cached row
CHUNKS_PER_THREAD = 4  # rows over threads: at most this many ranges per thread (the pool's chunks, codegen.threads)

Get = Callable[[str], Expr]  # the accumulator of an earlier pass (for the current tail element)
SCALAR = Layout.strided(())


def _f32(x: float) -> Const:
    return Const(float(x), "float32")


def _cast(e: Expr, dtype: str) -> Expr:
    return e if e.dtype == dtype else Cast(e, dtype)


def _max(a: Expr, v: Expr, g: Get | None = None) -> Expr:
    return Select(Bin("<", a, v), v, a)  # a NaN element is skipped, as by a vector max


def _min(a: Expr, v: Expr, g: Get | None = None) -> Expr:
    return Select(Bin("<", v, a), v, a)


def _add(a: Expr, v: Expr, g: Get | None = None) -> Expr:
    return a + v


def _mul(a: Expr, v: Expr, g: Get | None = None) -> Expr:
    return a * v


@dataclass(frozen=True)
class Pass:
    """One pass over the reduced elements: ``acc = step(acc, v, get)`` for every element ``v`` (in ``dtype``).

    ``transform(v, get)`` (optional) maps the element before the step (and is written back to the cached row);
    ``merge(a, b)`` combines two partial accumulators (None: no lane splitting); ``after(acc, get)`` is the
    accumulator's final value (e.g. sum -> 1 / sum)."""

    key: str
    init: Expr
    step: Callable[[Expr, Expr, Get], Expr]
    merge: Callable[[Expr, Expr], Expr] | None = None
    transform: Callable[[Expr, Get], Expr] | None = None
    after: Callable[[Expr, Get], Expr] | None = None
    dtype: str = "float32"


@dataclass(frozen=True)
class RowOp:
    """What a row reduction computes. ``axes``: sorted and normalized (empty: nothing is reduced, the op's
    elementwise part only: ``noop_with_empty_axes``); ``params``: the shapes of inputs 1, 2... (scale, bias)."""

    op: str
    shape: tuple[int, ...]
    axes: tuple[int, ...]
    dtype: str = "float32"
    keepdims: bool = True
    eps: float = 0.0
    params: tuple[tuple[int, ...], ...] = ()

    @property
    def flops(self) -> float:
        """About the work of the loops (what a thread split is weighed against)."""
        return 10.0 * math.prod(self.shape) * len(_plan(self)[0]) if self.axes else 0.0


# -------------------------------------------------------------------------------------------- the ops
FinishReduce = Callable[[Get], Expr]
FinishElem = Callable[[Expr, Get, bool, Sequence[Expr]], Expr]  # (x element or cached row, get, cached, index)

_REDUCE: dict[str, tuple] = {
    # op: (init, step, merge, result of the accumulator and the count n, the op when nothing is reduced)
    "ReduceSum": (0.0, _add, _add, lambda a, n: a, lambda v: v),
    "ReduceMean": (0.0, _add, _add, lambda a, n: a * (_f32(1.0) / _f32(n)), lambda v: v),
    "ReduceMax": (-math.inf, _max, _max, lambda a, n: a, lambda v: v),
    "ReduceMin": (math.inf, _min, _min, lambda a, n: a, lambda v: v),
    "ReduceProd": (1.0, _mul, _mul, lambda a, n: a, lambda v: v),
    "ReduceL1": (0.0, lambda a, v, g: a + Call("abs", (v,)), _add, lambda a, n: a, lambda v: Call("abs", (v,))),
    "ReduceL2": (0.0, lambda a, v, g: a + v * v, _add, lambda a, n: Call("sqrt", (a,)), lambda v: Call("abs", (v,))),
    "ReduceSumSquare": (0.0, lambda a, v, g: a + v * v, _add, lambda a, n: a, lambda v: v * v),
    "ReduceLogSum": (0.0, _add, _add, lambda a, n: Call("log", (a,)), lambda v: Call("log", (v,))),
}
_REDUCE_INT = {"ReduceSum": (0, _add), "ReduceMax": (-(2**63), _max), "ReduceMin": (2**63 - 1, _min)}


def _mean_rstd(n: int, eps: float) -> list[Pass]:
    """The mean is summed in double: exact for a row of equal values (a float sum of them rounds, and the
    normalization then divides that rounding by sqrt(eps), far beyond float32 noise), and far more accurate
    when |mean| is much larger than the spread. The deviations are then summed in float."""
    def dev(v, g):
        return v - _mean(g)
    return [
        Pass("mean", Const(0.0, "float64"), _add, _add, after=lambda a, g: a / Const(float(n), "float64"),
             dtype="float64"),
        Pass("rstd", _f32(0.0), lambda a, v, g: a + dev(v, g) * dev(v, g), _add,
             after=lambda a, g: _f32(1.0) / Call("sqrt", (a * _f32(1.0 / n) + _f32(eps),))),
    ]


def _mean(g: Get) -> Expr:
    return Cast(g("mean"), "float32")


def _bcast(idx: Sequence[Expr], shape: Sequence[int]) -> tuple[Expr, ...]:
    """The index into an input of ``shape`` broadcast (numpy rules) to the element ``idx``."""
    tail = list(idx[len(idx) - len(shape):]) if shape else []
    return tuple(Const(0) if d == 1 else i for i, d in zip(tail, shape, strict=True))


def _plan(spec: RowOp) -> tuple[list[Pass], FinishReduce | None, FinishElem | None]:
    """The passes of ``spec.op`` and how its results are made: one per row (FinishReduce) or per element."""
    op, shape = spec.op, spec.shape
    n = math.prod(shape[d] for d in spec.axes)

    def param(k: int, idx: Sequence[Expr]) -> Expr:
        return In(k, _bcast(idx, spec.params[k - 1]), spec.params[k - 1])

    if op in ("Softmax", "LogSoftmax"):
        m = Pass("m", _f32(-math.inf), _max, _max)
        if op == "Softmax":
            s = Pass("s", _f32(0.0), _add, _add, transform=lambda v, g: Call("expneg", (v - g("m"),)),
                     after=lambda a, g: _f32(1.0) / a)
            return [m, s], None, lambda x, g, cached, idx: (x if cached else Call("expneg", (x - g("m"),))) * g("s")
        s = Pass("s", _f32(0.0), lambda a, v, g: a + Call("expneg", (v - g("m"),)), _add,
                 after=lambda a, g: Call("log", (a,)) + g("m"))
        return [m, s], None, lambda x, g, cached, idx: x - g("s")
    if op == "LayerNormalization":
        def layer(x, g, cached, idx):
            v = (x - _mean(g)) * g("rstd") * param(1, idx)
            return v + param(2, idx) if len(spec.params) > 1 else v
        return _mean_rstd(n, spec.eps), None, layer
    if op == "InstanceNormalization":
        def instance(x, g, cached, idx):
            return (x - _mean(g)) * g("rstd") * In(1, (idx[1],), spec.params[0]) + In(2, (idx[1],), spec.params[1])
        return _mean_rstd(n, spec.eps), None, instance
    if op == "RMSNormalization":
        ss = Pass("ss", _f32(0.0), lambda a, v, g: a + v * v, _add,
                  after=lambda a, g: _f32(1.0) / Call("sqrt", (a * _f32(1.0 / n) + _f32(spec.eps),)))
        return [ss], None, lambda x, g, cached, idx: x * g("ss") * param(1, idx)
    if op == "ReduceLogSumExp":
        m = Pass("m", _f32(-math.inf), _max, _max)
        s = Pass("s", _f32(0.0), lambda a, v, g: a + Call("expneg", (v - g("m"),)), _add)
        # an all -inf row gives log(0) + -inf = -inf, like numpy; an infinite max is the result (inf - inf = nan)
        return [m, s], lambda g: Select(Bin("<", Call("abs", (g("m"),)), _f32(math.inf)),
                                        Call("log", (g("s"),)) + g("m"), g("m")), None
    if spec.dtype == "int64":
        init, step = _REDUCE_INT[op]
        return [Pass("a", Const(init), step, step, dtype="int64")], lambda g: g("a"), None
    init, step, merge, result, _ = _REDUCE[op]
    return [Pass("a", _f32(init), step, merge)], lambda g: result(g("a"), n), None


# -------------------------------------------------------------------------------------------- the engine
def _let(fresh: Callable[[str], str], value: Expr, dtype: str, body: Callable[[Expr], Sequence[Stmt]]) -> Alloc:
    """``body(v)`` with ``v`` a register scalar holding ``value`` (evaluated once)."""
    b = Buf(fresh("v"), dtype, SCALAR, "register")
    return Alloc(b, (Store(b, (), _cast(value, dtype)), *body(Load(b, ()))))


class _Nest:
    """Loops over the dims of one shape; ``full[d]`` is the current index of dim ``d`` (a dim of extent 1 gets
    index 0 and no loop)."""

    def __init__(self, shape: Sequence[int], fresh: Callable[[str], str]):
        self.shape, self.fresh = shape, fresh
        self.full: list[Expr] = [Const(0)] * len(shape)

    def __call__(self, dims: Sequence[int], body: Callable[[], Sequence[Stmt]]) -> tuple[Stmt, ...]:
        loops = []
        for d in dims:
            self.full[d] = Const(0)
            if self.shape[d] > 1:
                self.full[d] = Var(self.fresh("i"))
                loops.append((self.full[d], self.shape[d]))
        stmts = tuple(body())
        for v, n in reversed(loops):
            stmts = (For(v, Const(0), Const(n), stmts),)
        return stmts

    def at(self, dims: Sequence[int]) -> tuple[Expr, ...]:
        return tuple(self.full[d] for d in dims)


def _over_threads(body: tuple[Stmt, ...], threads: int, fresh: Callable[[str], str]) -> tuple[Stmt, ...]:
    """The outermost loop of ``body`` (rows: independent) split over threads: parallel itself when it has at
    most CHUNKS_PER_THREAD iterations per thread, else over that many contiguous ranges per thread (the ranges
    the pool would cut the rows into)."""
    if threads <= 1 or len(body) != 1 or not isinstance(body[0], For):
        return body
    loop = body[0]
    rows = int(loop.stop.value)
    chunks = min(rows, CHUNKS_PER_THREAD * threads)
    if chunks == rows:
        return mark(body, loop.var.name, "parallel")
    return parallelize(body, loop.var.name, chunks, fresh("c"))


def row_func(spec: RowOp, lanes: int, threads: int = 1, fresh: Callable[[str], str] | None = None) -> Func:
    """The loop IR of ``spec`` (module docstring): ``lanes`` partial accumulators where the last axis is
    reduced, the rows over ``threads`` threads (1: none)."""
    fresh = fresh or numbered()
    shape, r, axes = spec.shape, len(spec.shape), list(spec.axes)
    nest = _Nest(shape, fresh)
    full = nest.full

    def x() -> In:
        return In(0, tuple(full), shape, spec.dtype)

    if not axes:  # noop_with_empty_axes: the op's elementwise part
        fn = _REDUCE[spec.op][4] if spec.dtype == "float32" and spec.op in _REDUCE else (lambda v: v)
        return Func(spec.op, (), nest(range(r), lambda: (Epilogue(tuple(full), fn(x())),)))
    passes, finish_reduce, finish_elem = _plan(spec)
    tdims: list[int] = []
    for d in reversed(range(axes[-1] + 1, r)):
        if math.prod(shape[t] for t in [d, *tdims]) > TAIL_LIMIT:
            break
        tdims.insert(0, d)
    tshape = [shape[d] for d in tdims]
    vector = math.prod(tshape) > 1
    outer = [d for d in range(r) if d not in axes and d not in tdims]
    rshape = [shape[d] for d in axes]
    cached = (finish_elem is not None and not vector and math.prod(rshape) <= CACHE_LIMIT
              and spec.dtype == "float32")
    lanes_ok = not vector and axes[-1] == r - 1 and shape[-1] >= 2 * lanes
    accs = {p.key: Buf(fresh("acc"), p.dtype, Layout.strided(tshape), "stack") if vector
            else Buf(fresh("acc"), p.dtype, SCALAR, "register") for p in passes}
    row = Buf(fresh("row"), "float32", Layout.strided(rshape), "stack") if cached else None

    def tail() -> tuple[Expr, ...]:
        return nest.at(tdims) if vector else ()

    def get(key: str) -> Expr:
        return Load(accs[key], tail())

    def elem(k: int, p: Pass, acc: Buf, at: tuple[Expr, ...]) -> tuple[Stmt, ...]:
        """One element into accumulator ``acc[at]``: read (the cached row after the first pass), transform,
        write back to the cached row, step."""
        def use(v: Expr) -> list[Stmt]:
            out: list[Stmt] = []
            if cached and (k == 0 or p.transform is not None):
                out.append(Store(row, nest.at(axes), _cast(v, "float32")))
            return [*out, Store(acc, at, p.step(Load(acc, at), v, get))]

        def transformed(v: Expr) -> list[Stmt]:
            return [_let(fresh, p.transform(v, get), p.dtype, use)] if p.transform is not None else use(v)
        src = Load(row, nest.at(axes)) if cached and k > 0 else x()
        return (_let(fresh, src, p.dtype, transformed),)

    def one_pass(k: int, p: Pass) -> tuple[Stmt, ...]:
        acc = accs[p.key]
        if not (lanes_ok and p.merge is not None):
            return nest(axes, lambda: nest(tdims, lambda: elem(k, p, acc, tail())))
        lane = Buf(fresh("lane"), p.dtype, Layout.strided((lanes,)), "register")
        n, li, lj, lm = shape[-1], Var(fresh("l")), Var(fresh("l")), Var(fresh("l"))

        def lane_loops() -> list[Stmt]:
            jo, j = Var(fresh("j")), Var(fresh("j"))
            full[r - 1] = simplify(jo * lanes + lj)
            out: list[Stmt] = [For(jo, Const(0), Const(n // lanes), (For(lj, Const(0), Const(lanes),
                                                                         elem(k, p, lane, (lj,))),))]
            if n % lanes:
                full[r - 1] = j
                out.append(For(j, Const(n - n % lanes), Const(n), elem(k, p, lane, (Const(0),))))
            return out
        merge = Store(acc, (), p.merge(Load(acc, ()), Load(lane, (lm,))))
        return (Alloc(lane, (For(li, Const(0), Const(lanes), (Store(lane, (li,), p.init),)),
                             *nest(axes[:-1], lane_loops),
                             Store(acc, (), Load(lane, (Const(0),))),
                             For(lm, Const(1), Const(lanes), (merge,), "unrolled"))),)  # left to right

    def per_row() -> tuple[Stmt, ...]:
        stmts: list[Stmt] = []
        for p in passes:
            stmts += nest(tdims, lambda p=p: (Store(accs[p.key], tail(), p.init),))
        for k, p in enumerate(passes):
            stmts += one_pass(k, p)
            if p.after is not None:
                stmts += nest(tdims, lambda p=p: (Store(accs[p.key], tail(), p.after(get(p.key), get)),))
        if finish_reduce is not None:
            def result() -> tuple[Stmt, ...]:
                for d in axes:
                    full[d] = Const(0)
                out = tuple(full[d] for d in range(r) if spec.keepdims or d not in axes)
                return (Epilogue(out, finish_reduce(get)),)
            stmts += nest(tdims, result)
        else:
            def normalized() -> tuple[Stmt, ...]:
                src = Load(row, nest.at(axes)) if cached else x()
                return (Epilogue(tuple(full), finish_elem(src, get, cached, tuple(full))),)
            stmts += nest(axes, lambda: nest(tdims, normalized))
        body = tuple(stmts)
        for b in reversed([*accs.values(), *([row] if row else [])]):
            body = (Alloc(b, body),)
        return body

    return Func(spec.op, (), _over_threads(nest(outer, per_row), threads, fresh))


def arg_func(op: str, shape: tuple[int, ...], axis: int, keepdims: bool, last: bool, dtype: str = "float32",
             fresh: Callable[[str], str] | None = None) -> Func:
    """ArgMax/ArgMin of input 0 over ``axis`` (normalized; ``last``: the last of equal extremes): the best
    value and its index per row, the tail of kept dims after the axis as accumulator arrays (as ``row_func``)."""
    fresh = fresh or numbered()
    r, n = len(shape), shape[axis]
    if n == 0:
        raise PassError(f"{op}: empty reduction axis")
    tdims = list(range(axis + 1, r))
    while tdims and math.prod(shape[d] for d in tdims) > TAIL_LIMIT:
        tdims.pop(0)
    tshape = [shape[d] for d in tdims]
    vector = math.prod(tshape) > 1
    outer = [d for d in range(r) if d != axis and d not in tdims]
    nest = _Nest(shape, fresh)
    full = nest.full
    lay, scope = (Layout.strided(tshape), "stack") if vector else (SCALAR, "register")
    best, bi = Buf(fresh("best"), dtype, lay, scope), Buf(fresh("bi"), "int64", lay, scope)

    def tail() -> tuple[Expr, ...]:
        return nest.at(tdims) if vector else ()

    def better(v: Expr, b: Expr) -> Expr:
        return Bin("<=" if last else "<", *((b, v) if op == "ArgMax" else (v, b)))

    def init() -> tuple[Stmt, ...]:
        full[axis] = Const(0)
        return Store(best, tail(), In(0, tuple(full), shape, dtype)), Store(bi, tail(), Const(0))

    def per_row() -> tuple[Stmt, ...]:
        stmts = list(nest(tdims, init))
        if n > 1:
            k = Var(fresh("k"))

            def step() -> tuple[Stmt, ...]:
                full[axis] = k
                return (_let(fresh, In(0, tuple(full), shape, dtype), dtype, lambda v: (
                    If(better(v, Load(best, tail())), (Store(best, tail(), v), Store(bi, tail(), k))),)),)
            stmts.append(For(k, Const(1), Const(n), nest(tdims, step)))

        def result() -> tuple[Stmt, ...]:
            full[axis] = Const(0)
            return (Epilogue(tuple(full[d] for d in range(r) if keepdims or d != axis), Load(bi, tail())),)
        stmts += nest(tdims, result)
        return (Alloc(best, (Alloc(bi, tuple(stmts)),)),)

    return Func(op, (), nest(outer, per_row))


def lrn_scale(x: Expr, base: Expr, beta: float) -> Expr:
    """``x * base ** -beta`` as vectorizable C (libm's powf kept the loop scalar: GoogLeNet's 192 x 56 x 56 LRN
    took 2.2 ms, 3.7 ns per element; now 0.5): beta 0.75 (AlexNet, GoogLeNet, ZFNet) as x / sqrt(b * sqrt(b)),
    within 2.3 ulp as x * powf(b, -0.75) is (2.2; mean 0.39 against 0.41 ulp, b in [1, 31]; x / (sqrt(b) *
    sqrt(sqrt(b))) was 3.4 and moved GoogLeNet's outputs 6x further from onnxruntime's), 0.5 as x / sqrt(b), 1 as
    x / b, others as x * exp(-beta * log(b)) with the vector math's exp and log."""
    if beta == 0.75:
        return x / Call("sqrt", (base * Call("sqrt", (base,)),))
    if beta == 0.5:
        return x / Call("sqrt", (base,))
    if beta == 1.0:
        return x / base
    return x * Call("exp", (_f32(-beta) * Call("log", (base,)),))


def lrn_func(x: Buf, s: Buf, size: int, alpha: float, beta: float, bias: float,
             fresh: Callable[[str], str] | None = None, threads: int = 1) -> Func:
    """LRN of ``x`` (N, C, spatial...): per image and channel, the sum of squares over the channel window
    accumulated in ``s`` (the output's shape: the destination itself), then the epilogue gets
    ``x * (bias + alpha / size * sum) ** -beta`` (``lrn_scale``). ``threads`` > 1: the outer loop over images (or,
    for one image, channels) in that many shares (``schedule.transform.parallelize``)."""
    fresh = fresh or numbered()
    N, C, *sp = x.shape
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    nest = _Nest(x.shape, fresh)
    full = nest.full
    spatial = range(2, len(x.shape))

    def plane() -> list[Stmt]:
        n, c = full[0], full[1]
        cc = Var(fresh("cc"))

        def square() -> tuple[Stmt, ...]:
            at = (n, c, *full[2:])
            return (_let(fresh, Load(x, (n, cc, *full[2:])), "float32",
                         lambda v: (Store(s, at, Load(s, at) + v * v),)),)

        def result() -> tuple[Stmt, ...]:
            at = tuple(full)
            base = _f32(bias) + _f32(alpha / size) * Load(s, at)
            return (Epilogue(at, lrn_scale(Load(x, at), base, beta)),)
        return [*nest(spatial, lambda: (Store(s, tuple(full), _f32(0.0)),)),
                For(cc, simplify(Bin("max", c - lo, Const(0))) if lo else c,
                    simplify(Bin("min", c + (hi + 1), Const(C))) if hi else simplify(c + 1), nest(spatial, square)),
                *nest(spatial, result)]

    thread = fresh("t") if threads > 1 and N * C > 1 else ""
    f = Func("LRN", (x, s), nest((0, 1), plane))
    if thread:
        f = parallelize(f, loop_names(f)[0], threads, thread)
    return f
