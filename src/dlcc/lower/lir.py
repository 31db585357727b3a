"""Loop-level kernel IR: loop nests over buffers with layouts, vector accesses, scoped allocations and calls
to named micro-kernels. The level between a kernel's algorithm and its C.

What goes in: built by a kernel's schedule (``dlcc.schedule.gemm``, ``dwconv``, ``reduce``) and the element
expressions of elementwise and injective ops (``dlcc.lower.element``) with the constructors below; the schedule
transformations (``dlcc.schedule.transform``: split, reorder, tile, parallelize, mark)
rewrite it.
What comes out: a ``Func`` that ``print_func`` lists, ``verify_func`` checks, ``run_func`` interprets with
numpy (slowly, for tests) and ``dlcc.codegen.lir_c`` prints as C.

    Func(name, params, body, workspace)
      params     Buf(scope="global"): the buffers the kernel reads and writes (C pointers); a Buf of scope
                 "const" is a table of constants (its ``data``), declared where it is read
      workspace  Buf(scope="workspace" | "thread_workspace"): scratch the kernel declares before memory
                 planning (the arena holds it; per thread: one copy per thread of the pool)
      body       statements:
        For(var, start, stop, body, kind)   kind: serial | parallel | vectorized | unrolled
        Store(buf, index, value, lanes)     lanes > 1: a vector store of consecutive elements of the last axis
        If(cond, then, else_)
        Alloc(buf, body)                    buf.scope: register | stack | workspace | thread_workspace
        Let(var, value)                     a local (``var``: a Var of any scalar dtype) for the statements after it
        Micro(name, args)                   a named micro-kernel (``MICRO``) with a stated contract
        Epilogue(index, value)              hands element ``index`` of the kernel's result to the fused
                                            epilogue (bias, activation, residual add, the final store)
        Epilogue(index, value, dest)        a fused producer's epilogue (``dest``: a Load naming the element):
                                            element ``index`` of the producer's result, its elementwise chain
                                            applied, stored at ``dest`` (the kernel's own scratch)
      expressions: Var, Const, Bin(op, a, b), Load(buf, index, lanes), Bcast(value, lanes), Select(cond, a, b),
                   Ptr(buf, index),
        Call(fn, args, out)                 a scalar function of ``CALLS``: float32 math (exp, log, sqrt...) and the
                                            functions of ``dlcc.lower.scalar`` (activations, integer helpers,
                                            conversions, index maps, an eager ``select``); dtype ``out`` or the
                                            first argument's
        Cast(value, dtype)                  a scalar converted between the dtypes below
        Lane(block, lane, size)             channel ``block * size + lane`` (``lane`` below ``size``): a layout in
                                            blocks of ``size`` addresses it as (block, lane), without a division
        In(k, index, shape, dtype)          element ``index`` of the kernel's opaque input ``k``: a fused producer's
                                            value computed where it is read (the symmetric of Epilogue)

Types: int64 (indices, 0/1 conditions), float32, float64 (scalars only), and the stored element types int32, int8,
uint8, bool (loads, stores, constants, casts, integer arithmetic, which wraps as C stores it). Bin's arithmetic
keeps its operands' dtype; a comparison (``<``, ``<=``, ``==``, ``!=``, ``&&``, ``||``) is an int64 0/1.

Buffers hold scalars (a register or stack buffer of rank 0 is one scalar: a C local); a vector access reads or
writes ``lanes`` consecutive elements along the last logical axis, which the layout must keep contiguous. A
``Layout`` maps a logical index to an element offset: ``offset + sum(stride * ((index[axis] // div) % ext))``
over its physical dims, so a permutation, strides, channel blocking (NCHWc: the channel axis appears twice,
``c // 16`` and ``c % 16``) and a zero padding ring (a larger physical extent, an offset) are all one form.

Invariants (``verify_func``): every variable is bound by an enclosing loop or a let; every buffer is a parameter,
an enclosing allocation, declared workspace or a constant table; indices are int64 and every access (vector lanes
and micro-kernel footprints included) stays inside its buffer for every value of the loop variables (an index
read from data only through an index function of ``dlcc.lower.scalar``, which bounds it, e.g. ``clamp_idx``);
stored values have the buffer's dtype; calls, casts and opaque inputs are scalars of the dtypes above; the
iterations of a parallel loop write disjoint element ranges of every buffer allocated outside it, and hand disjoint
boxes of indices to the epilogue.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dlcc.errors import PassError
from dlcc.lower.scalar import INDEX_FUNCTIONS, SCALAR_FUNCTIONS

__all__ = ["CALLS", "Alloc", "Bcast", "Bin", "Buf", "Call", "Cast", "Const", "Epilogue", "Expr", "For", "Func", "If",
           "In", "Lane", "Layout", "Let", "Load", "MICRO", "Micro", "MicroKernel", "Ptr", "Select", "Store", "Var",
           "print_func", "rewrite_stmts", "run_func", "verify_func"]

SCOPES = ("global", "register", "stack", "workspace", "thread_workspace", "const")
KINDS = ("serial", "parallel", "vectorized", "unrolled")
PRIVATE = ("register", "stack")  # allocated inside a parallel loop's body (its task): each thread has its own
INT_OPS = ("+", "-", "*", "//", "%", "min", "max", "<", "<=", "==", "!=", "&&", "||")
FLOAT_OPS = ("+", "-", "*", "/", "min", "max", "<", "<=", "==", "!=")
COMPARISONS = ("<", "<=", "==", "!=", "&&", "||")
DTYPES = ("int64", "float32", "float64")
STORED = ("int32", "int8", "uint8", "bool")  # further element types of tensors (loads, stores, casts, constants)
NUMERIC = (*DTYPES, *STORED)
INTS = ("int64", "int32", "int8", "uint8", "bool")

# Call(fn, args): the float32 math functions (their C forms are codegen's: dlcc.codegen.vmath where it has them)
CALLS: dict[str, tuple[int, Callable]] = {
    "exp": (1, np.exp), "expm1": (1, np.expm1), "log": (1, np.log), "log1p": (1, np.log1p), "tanh": (1, np.tanh),
    "expneg": (1, lambda x: np.where(x < -87.33, 0.0, np.exp(x))),  # x <= 0 (a softmax's x - max): no subnormals
    "sigmoid": (1, lambda x: 1 / (1 + np.exp(-x))), "sqrt": (1, np.sqrt), "abs": (1, np.abs),
    "pow": SCALAR_FUNCTIONS["fpow"], **SCALAR_FUNCTIONS,
}


# ----------------------------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]  # logical
    dims: tuple[tuple[int, int, int, int], ...]  # physical dims (axis, div, ext, stride)
    offset: int = 0

    @staticmethod
    def strided(shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0) -> Layout:
        shape = tuple(int(d) for d in shape)
        if strides is None:
            strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return Layout(shape, tuple((a, 1, d, int(s)) for a, (d, s) in enumerate(zip(shape, strides, strict=True))),
                      offset)

    @staticmethod
    def blocked(shape: Sequence[int], axis: int, block: int) -> Layout:
        """Channel blocking: ``axis`` (e.g. C of NCHW) split into ``ceil(C/block)`` outer blocks placed where
        the axis was and ``block`` inner elements innermost (NCHW -> NCHW16c); the last block is padded."""
        shape = tuple(int(d) for d in shape)
        outer = -(-shape[axis] // block)
        phys = [(a, 1, d) for a, d in enumerate(shape)]
        phys[axis] = (axis, block, outer)
        phys.append((axis, 1, block))
        strides = [math.prod(e for _, _, e in phys[p + 1:]) for p in range(len(phys))]
        return Layout(shape, tuple((a, dv, e, s) for (a, dv, e), s in zip(phys, strides, strict=True)))

    @property
    def plain_strides(self) -> tuple[int, ...] | None:
        """The strides of a plain layout (one physical dim per axis, in axis order, none blocked), else None."""
        if [d[0] for d in self.dims] != list(range(len(self.shape))) or any(d[1] != 1 for d in self.dims):
            return None
        return tuple(d[3] for d in self.dims)

    @property
    def span(self) -> int:
        """Elements from the buffer's start to one past the last addressable element."""
        return self.offset + sum((e - 1) * s for _, _, e, s in self.dims) + 1 if self.dims else self.offset + 1

    def address(self, index: Sequence[Expr]) -> Expr:
        if len(index) != len(self.shape):
            raise PassError(f"loop IR: {len(index)} indices for a rank-{len(self.shape)} layout")
        terms = _flat_again([(_address_index(index[axis], div, ext, self.shape[axis]), stride)
                             for axis, div, ext, stride in self.dims if self.shape[axis] != 1])  # (an axis of
        # one element is read at index 0)
        total: Expr = Const(self.offset)
        for i, stride in terms:
            total = total + i * Const(stride)
        return simplify(total)

    def vector_ok(self, lanes: int) -> bool:
        """Can ``lanes`` consecutive elements of the last axis be one contiguous vector access?"""
        last = len(self.shape) - 1
        inner = [d for d in self.dims if d[0] == last and d[1] == 1]
        return bool(inner) and inner[0][3] == 1 and (inner[0][2] * inner[0][1] >= self.shape[last]
                                                      or inner[0][2] % lanes == 0)


# ------------------------------------------------------------------------------------------- expressions
class Expr:
    dtype = "int64"
    lanes = 1

    def __add__(self, o):
        return Bin("+", self, _e(o))

    def __radd__(self, o):
        return Bin("+", _e(o), self)

    def __sub__(self, o):
        return Bin("-", self, _e(o))

    def __mul__(self, o):
        return Bin("*", self, _e(o))

    def __rmul__(self, o):
        return Bin("*", _e(o), self)

    def __floordiv__(self, o):
        return Bin("//", self, _e(o))

    def __truediv__(self, o):
        return Bin("/", self, _e(o))

    def __mod__(self, o):
        return Bin("%", self, _e(o))


def _e(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        raise TypeError("no bool constants")
    return Const(x, "int64" if isinstance(x, int) else "float32")


@dataclass(frozen=True, eq=True)
class Var(Expr):
    """A loop variable (int64), or a local a ``Let`` binds (any scalar dtype)."""
    name: str
    dtype: str = "int64"


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int | float
    dtype: str = "int64"


@dataclass(frozen=True, eq=True)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return "int64" if self.op in COMPARISONS else self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(self.a.lanes, self.b.lanes)


@dataclass(frozen=True, eq=True)
class Load(Expr):
    buf: Buf
    index: tuple[Expr, ...]
    lanes: int = 1

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buf.dtype


@dataclass(frozen=True, eq=True)
class Bcast(Expr):
    value: Expr
    lanes: int = 1

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.value.dtype


@dataclass(frozen=True, eq=True)
class Select(Expr):
    """``a`` where ``cond`` (an int64 0/1) holds, else ``b``: both are evaluated (a load in ``a`` must be in
    bounds on its own, e.g. through clamped indices), so the choice is branchless."""
    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.a.dtype

    @property
    def lanes(self) -> int:  # type: ignore[override]
        return max(self.a.lanes, self.b.lanes)


@dataclass(frozen=True, eq=True)
class Ptr(Expr):
    """The address of element ``index`` of ``buf`` (micro-kernel arguments)."""
    buf: Buf
    index: tuple[Expr, ...]

    dtype = "ptr"


@dataclass(frozen=True, eq=True)
class Call(Expr):
    """``fn(*args)``, a scalar function of ``CALLS``; its dtype ``out``, or its first argument's."""
    fn: str
    args: tuple[Expr, ...]
    out: str = ""

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.out or self.args[0].dtype


@dataclass(frozen=True, eq=True)
class Lane(Expr):
    """Channel ``block * size + lane`` (int64) of a kernel that runs over whole channel blocks, ``lane`` in
    ``[0, size)`` (the verifier checks it): a layout in blocks of ``size`` addresses it as (block, lane), with no
    division."""
    block: Expr
    lane: Expr
    size: int


@dataclass(frozen=True, eq=True)
class Cast(Expr):
    """``value`` converted to ``dtype`` (C's conversion: float to int truncates)."""
    value: Expr
    dtype: str = "float32"


@dataclass(frozen=True, eq=True)
class In(Expr):
    """Element ``index`` of the kernel's opaque input ``k`` of logical ``shape``: a value the kernel's user
    computes where it is read (a fused elementwise producer, or a plain load), as ``Epilogue`` hands values on."""
    k: int
    index: tuple[Expr, ...]
    shape: tuple[int, ...]
    dtype: str = "float32"


def _flat_again(terms: list[tuple[Expr, int]]) -> list[tuple[Expr, int]]:
    """Address terms (index, stride) with each pair ``(x // k, k * s), (x % k, s)`` merged into ``(x, s)``: a flat
    position a kernel split into a row and a column, whose address is the flat one again (which C compilers do not
    see, and then do not vectorize the loop). C's division and remainder keep ``(x / k) * k + x % k == x``."""
    out = list(terms)
    for q, s in terms:
        k = int(q.b.value) if isinstance(q, Bin) and q.op == "//" and isinstance(q.b, Const) else 0
        r = (Bin("%", q.a, q.b), s // k) if k and s % k == 0 else None
        if r is not None and r in out and (q, s) in out:
            out[out.index((q, s))] = (q.a, r[1])
            out.remove(r)
    return out


def _address_index(i: Expr, div: int, ext: int, axis_len: int) -> Expr:
    """Physical index of logical index ``i`` along a physical dim (``div``, ``ext``) of an axis of ``axis_len``."""
    if isinstance(i, Lane) and i.size == div:
        i = i.block
    elif isinstance(i, Lane) and div == 1 and ext == i.size:
        return i.lane
    elif div != 1:
        i = Bin("//", i, Const(div))
    if ext * div < axis_len:
        i = Bin("%", i, Const(ext))
    return i


def simplify(e: Expr) -> Expr:
    """Constant folding and the identities x+0, x*1, x*0 on int64 expressions."""
    if isinstance(e, Bin) and e.dtype == "int64" and e.op in ("+", "-", "*", "//", "%", "min", "max"):
        a, b = simplify(e.a), simplify(e.b)
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(_int_op(e.op, int(a.value), int(b.value)))
        if e.op == "+" and isinstance(a, Const) and a.value == 0:
            return b
        if e.op in ("+", "-") and isinstance(b, Const) and b.value == 0:
            return a
        if e.op == "*" and (isinstance(a, Const) and a.value == 0 or isinstance(b, Const) and b.value == 0):
            return Const(0)
        if e.op == "*" and isinstance(b, Const) and b.value == 1:
            return a
        if e.op == "*" and isinstance(a, Const) and a.value == 1:
            return b
        if e.op == "//" and isinstance(b, Const) and b.value == 1:
            return a
        return Bin(e.op, a, b)
    return e


def _int_op(op: str, a: int, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0,
            "min": min(a, b), "max": max(a, b), "<": int(a < b), "<=": int(a <= b), "==": int(a == b),
            "!=": int(a != b), "&&": int(bool(a) and bool(b)), "||": int(bool(a) or bool(b))}[op]


def _wrap(v: int, dtype: str) -> int:
    """``v`` converted to integer ``dtype`` as C stores it (two's complement wrap-around; bool: 0/1 as stored)."""
    if dtype == "bool":
        return int(v != 0)
    bits = np.iinfo(np.dtype(dtype)).bits
    v &= (1 << bits) - 1
    return v - (1 << bits) if np.iinfo(np.dtype(dtype)).min < 0 and v >= 1 << (bits - 1) else v


# -------------------------------------------------------------------------------------- buffers, statements
@dataclass(frozen=True, eq=True)
class Buf:
    name: str  # a C identifier
    dtype: str
    layout: Layout
    scope: str = "global"
    vector: int = 1  # register/stack buffers accessed as vectors: C keeps them as arrays of `vector`-lane vectors
    data: tuple = ()  # scope "const": a table of constants (its elements, in layout order)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise PassError(f"loop IR: unknown scope {self.scope}")
        if (self.scope == "const") != bool(self.data) or self.data and len(self.data) != self.layout.span:
            raise PassError(f"loop IR: buffer {self.name}: a const buffer holds exactly its elements, no other does")

    @staticmethod
    def table(name: str, values: Sequence, dtype: str) -> Buf:
        """A one-dimensional table of constants."""
        t = np.dtype(dtype).type
        return Buf(name, dtype, Layout.strided((len(values),)), "const", data=tuple(t(v).item() for v in values))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    def __getitem__(self, index) -> Load:
        index = index if isinstance(index, tuple) else (index,)
        return Load(self, tuple(_e(i) for i in index))


class Stmt:
    pass


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    start: Expr
    stop: Expr
    body: tuple[Stmt, ...]
    kind: str = "serial"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PassError(f"loop IR: unknown loop kind {self.kind}")


@dataclass(frozen=True)
class Store(Stmt):
    buf: Buf
    index: tuple[Expr, ...]
    value: Expr
    lanes: int = 1


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    else_: tuple[Stmt, ...] = ()


@dataclass(frozen=True)
class Alloc(Stmt):
    buf: Buf
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Let(Stmt):
    """``var`` (a Var of any scalar dtype) holds ``value`` in the statements after this one in its body."""
    var: Var
    value: Expr


@dataclass(frozen=True)
class Micro(Stmt):
    name: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Epilogue(Stmt):
    index: tuple[Expr, ...]
    value: Expr
    dest: Load | None = None  # a producer's epilogue: where its result goes (else the kernel's epilogue)


@dataclass
class Func:
    name: str
    params: tuple[Buf, ...]
    body: tuple[Stmt, ...]
    workspace: tuple[Buf, ...] = ()


@dataclass(frozen=True)
class MicroKernel:
    """A named micro-kernel: its contract and a numpy reference (its C body, per target, is codegen's).

    ``params``: (name, kind) with kind ``int`` (a scalar), ``in`` or ``out`` (a float pointer).
    ``footprint(args)``: for each pointer parameter, the elements it touches as (rows, row stride, columns)
    from the pointer (element ``r * row_stride + j``), given the upper bounds of the scalar arguments.
    ``reference(arrays, offsets, scalars)`` computes the contract on flat numpy arrays (pointer k =
    ``arrays[k][offsets[k]:]``)."""
    name: str
    params: tuple[tuple[str, str], ...]
    contract: str
    footprint: Callable[[dict[str, int]], dict[str, int]]
    reference: Callable[[dict[str, np.ndarray], dict[str, int], dict[str, int]], None]


MICRO: dict[str, MicroKernel] = {}


# ------------------------------------------------------------------------------------------------ printer
def _pe(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return repr(e.value) if e.dtype != "int64" else str(int(e.value))
    if isinstance(e, Bin):
        if e.op in ("min", "max"):
            return f"{e.op}({_pe(e.a)}, {_pe(e.b)})"
        return f"({_pe(e.a)} {e.op} {_pe(e.b)})"
    if isinstance(e, Load):
        v = f"<{e.lanes}>" if e.lanes > 1 else ""
        return f"{e.buf.name}{v}[{', '.join(_pe(i) for i in e.index)}]"
    if isinstance(e, Bcast):
        return f"bcast<{e.lanes}>({_pe(e.value)})"
    if isinstance(e, Select):
        return f"select({_pe(e.cond)}, {_pe(e.a)}, {_pe(e.b)})"
    if isinstance(e, Ptr):
        return f"&{e.buf.name}[{', '.join(_pe(i) for i in e.index)}]"
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(_pe(a) for a in e.args)}){':' + e.out if e.out else ''}"
    if isinstance(e, Lane):
        return f"lane<{e.size}>({_pe(e.block)}, {_pe(e.lane)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({_pe(e.value)})"
    if isinstance(e, In):
        return f"in{e.k}[{', '.join(_pe(i) for i in e.index)}]"
    raise PassError(f"loop IR: unknown expression {e!r}")


def _pbuf(b: Buf) -> str:
    lay = "" if b.layout == Layout.strided(b.shape) else f" layout{list(b.layout.dims)}+{b.layout.offset}"
    if b.scope == "const":
        vals = ", ".join(repr(v) for v in b.data[:8])
        return f"{b.name}: {b.dtype}{list(b.shape)} const {{{vals}{', ...' if len(b.data) > 8 else ''}}}"
    vec = f" vector<{b.vector}>" if b.vector > 1 else ""
    return f"{b.name}: {b.dtype}{list(b.shape)} {b.scope}{lay}{vec}"


def _pstmts(body: Sequence[Stmt], depth: int, out: list[str]) -> None:
    pad = "  " * depth
    for s in body:
        if isinstance(s, For):
            kind = "" if s.kind == "serial" else s.kind + " "
            out.append(f"{pad}{kind}for {s.var.name} in [{_pe(s.start)}, {_pe(s.stop)}):")
            _pstmts(s.body, depth + 1, out)
        elif isinstance(s, Store):
            v = f"<{s.lanes}>" if s.lanes > 1 else ""
            out.append(f"{pad}{s.buf.name}{v}[{', '.join(_pe(i) for i in s.index)}] = {_pe(s.value)}")
        elif isinstance(s, If):
            out.append(f"{pad}if {_pe(s.cond)}:")
            _pstmts(s.then, depth + 1, out)
            if s.else_:
                out.append(f"{pad}else:")
                _pstmts(s.else_, depth + 1, out)
        elif isinstance(s, Alloc):
            out.append(f"{pad}alloc {_pbuf(s.buf)}")
            _pstmts(s.body, depth + 1, out)
        elif isinstance(s, Micro):
            out.append(f"{pad}micro {s.name}({', '.join(_pe(a) for a in s.args)})")
        elif isinstance(s, Let):
            out.append(f"{pad}let {s.var.name}: {s.var.dtype} = {_pe(s.value)}")
        elif isinstance(s, Epilogue):
            to = f" -> {_pe(s.dest)}" if s.dest is not None else ""
            out.append(f"{pad}epilogue{'(producer)' if to else ''}[{', '.join(_pe(i) for i in s.index)}] <- "
                       f"{_pe(s.value)}{to}")
        else:
            raise PassError(f"loop IR: unknown statement {s!r}")


def print_func(f: Func) -> str:
    lines = [f"func {f.name}"]
    lines += [f"  param {_pbuf(b)}" for b in f.params]
    lines += [f"  workspace {_pbuf(b)}" for b in f.workspace]
    _pstmts(f.body, 1, lines)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ intervals (verifier)
Interval = tuple[int, int]


def interval(e: Expr, env: dict[str, Interval]) -> Interval:
    """Bounds of an int64 expression given bounds of its variables."""
    if isinstance(e, Const):
        return int(e.value), int(e.value)
    if isinstance(e, Var):
        if e.name not in env:
            raise PassError(f"loop IR: variable {e.name} is not bound by an enclosing loop or a let")
        return env[e.name]
    if isinstance(e, Lane):
        (bl, bh), (ll, lh) = interval(e.block, env), interval(e.lane, env)
        return bl * e.size + ll, bh * e.size + lh
    if isinstance(e, Call) and e.fn in INDEX_FUNCTIONS:
        return INDEX_FUNCTIONS[e.fn]([_any_interval(a, env) for a in e.args])
    if isinstance(e, Load) and e.buf.scope == "const" and e.buf.dtype in INTS:
        return int(min(e.buf.data)), int(max(e.buf.data))
    if isinstance(e, Select):
        (al, ah), (bl, bh) = interval(e.a, env), interval(e.b, env)
        return min(al, bl), max(ah, bh)
    if isinstance(e, Bin):
        if e.a.dtype != "int64":
            return 0, 1  # a comparison of floats
        (al, ah), (bl, bh) = interval(e.a, env), interval(e.b, env)
        if e.op == "+":
            return al + bl, ah + bh
        if e.op == "-":
            return al - bh, ah - bl
        if e.op == "*":
            c = [al * bl, al * bh, ah * bl, ah * bh]
            return min(c), max(c)
        if e.op in ("//", "%"):
            if bl <= 0:
                raise PassError(f"loop IR: division by a value that may be <= 0 in {_pe(e)}")
            if e.op == "//":
                c = [al // bl, al // bh, ah // bl, ah // bh]
                return min(c), max(c)
            if bl == bh and al >= 0 and ah < bl:
                return al, ah
            if bl == bh and al >= 0 and al // bl == ah // bl:  # one period: exact (a concrete value too)
                return al % bl, ah % bl
            return (0, bh - 1) if al >= 0 else (-(bh - 1), bh - 1)
        if e.op == "min":
            return min(al, bl), min(ah, bh)
        if e.op == "max":
            return max(al, bl), max(ah, bh)
        if e.op == "<":
            return (1, 1) if ah < bl else (0, 0) if al >= bh else (0, 1)
        if e.op == "<=":
            return (1, 1) if ah <= bl else (0, 0) if al > bh else (0, 1)
        if e.op == "==":
            return (1, 1) if al == ah == bl == bh else (0, 0) if ah < bl or bh < al else (0, 1)
        if e.op == "!=":
            return (0, 0) if al == ah == bl == bh else (1, 1) if ah < bl or bh < al else (0, 1)
        return 0, 1
    raise PassError(f"loop IR: {_pe(e)} is not an index expression")


UNBOUNDED = (-(2**62), 2**62)


def _any_interval(e: Expr, env: dict[str, Interval]) -> Interval:
    """Bounds of an int64 expression, unbounded where it is no index expression (a value loaded from data)."""
    try:
        return interval(e, env)
    except PassError:
        return UNBOUNDED


def _loop_env(s: For, env: dict[str, Interval]) -> Interval | None:
    lo, _ = interval(s.start, env)
    _, hi = interval(s.stop, env)
    return (lo, hi - 1) if hi > lo else None


# --------------------------------------------------------------------------------------------- verifier
@dataclass
class _Writes:
    """What one parallel iteration writes, per buffer name: the ranges of element addresses (up to
    ``MAX_BOXES``, then their hull: a thread's channels of each of two images are two ranges, which one hull
    would merge with the other thread's), and the boxes of the logical indices when every write could be said
    as a box (None once one could not; up to ``MAX_BOXES``, then their hull): a thread that writes whole channel
    blocks and half of another is two boxes, which its hull would merge with the other half."""
    flat: dict[str, list[Interval]] = field(default_factory=dict)
    box: dict[str, list[list[Interval]] | None] = field(default_factory=dict)
    MAX_BOXES = 256

    def add(self, name: str, lo: int, hi: int, box: list[Interval] | None) -> None:
        ranges = self.flat.setdefault(name, [])
        for i, (a, b) in enumerate(ranges):
            if a <= hi + 1 and lo <= b + 1:  # (overlapping or adjacent: one range)
                ranges[i] = (min(a, lo), max(b, hi))
                break
        else:
            ranges.append((lo, hi))
            if len(ranges) > self.MAX_BOXES:
                self.flat[name] = [(min(r[0] for r in ranges), max(r[1] for r in ranges))]
        if name not in self.box:
            self.box[name] = None if box is None else [box]
            return
        boxes = self.box[name]
        if boxes is None or box is None:
            self.box[name] = None
            return
        for i, b in enumerate(boxes):  # contained in one already, or containing it
            if all(x[0] <= y[0] and y[1] <= x[1] for x, y in zip(b, box, strict=True)):
                return
            if all(y[0] <= x[0] and x[1] <= y[1] for x, y in zip(b, box, strict=True)):
                boxes[i] = box
                return
        boxes.append(box)
        if len(boxes) > self.MAX_BOXES:
            self.box[name] = [[(min(b[d][0] for b in boxes), max(b[d][1] for b in boxes)) for d in range(len(box))]]

    def overlaps(self, other: _Writes, name: str) -> bool:
        a, b = self.box.get(name), other.box.get(name)
        if a is not None and b is not None:
            return any(all(x[0] <= y[1] and y[0] <= x[1] for x, y in zip(p, q, strict=True)) for p in a for q in b)
        return any(x[0] <= y[1] and y[0] <= x[1] for x in self.flat[name] for y in other.flat[name])


class _OutOfBounds(PassError):
    pass


class _Overlap(PassError):
    pass


def _vars(e: Expr, out: set[str]) -> None:
    if isinstance(e, Var):
        out.add(e.name)
    elif isinstance(e, Bin):
        _vars(e.a, out)
        _vars(e.b, out)
    elif isinstance(e, Lane):
        _vars(e.block, out)
        _vars(e.lane, out)


def _controlling(body: Sequence[Stmt], out: set[str]) -> set[str]:
    """Variables that appear in some loop's bounds, branch condition or micro-kernel scalar argument."""
    for s in body:
        if isinstance(s, Micro):
            for a in s.args:
                if not isinstance(a, Ptr):
                    _vars(a, out)
        if isinstance(s, For):
            _vars(s.start, out)
            _vars(s.stop, out)
            _controlling(s.body, out)
        elif isinstance(s, If):
            _vars(s.cond, out)
            _controlling(s.then, out)
            _controlling(s.else_, out)
        elif isinstance(s, Alloc):
            _controlling(s.body, out)
    return out


EXACT_SHORT_LOOP = 16  # serial loops this short run value by value when a parallel loop's writes are checked again


class _Verifier:
    def __init__(self, f: Func):
        self.f = f
        self.controlling = _controlling(f.body, set())
        self.exact = False  # enumerate every controlling variable (parallel loops' write sets)
        self.bufs: dict[str, Buf] = {b.name: b for b in f.params}
        self.declared = {b.name: b for b in f.workspace}
        self.writes: list[_Writes] = []
        self.lets: dict[str, str] = {}  # the locals bound so far (names are unique in a function): their dtypes

    def fail(self, msg: str) -> None:
        raise PassError(f"loop IR {self.f.name}: {msg}")

    def fail_bounds(self, msg: str) -> None:
        raise _OutOfBounds(f"loop IR {self.f.name}: {msg}")

    def buf(self, b: Buf) -> None:
        if b.scope == "const":  # a table: its own declaration
            if self.bufs.setdefault(b.name, b) != b:
                self.fail(f"const buffer {b.name} is declared twice with different contents")
            return
        if self.bufs.get(b.name) != b:
            self.fail(f"buffer {b.name} is not a parameter, an enclosing allocation or declared workspace")

    def index(self, name: str, shape: Sequence[int], index: Sequence[Expr], lanes: int, env) -> None:
        if len(index) != len(shape):
            self.fail(f"{len(index)} indices into {name}{list(shape)}")
        for d, i in enumerate(index):
            if i.dtype != "int64" or i.lanes != 1:
                self.fail(f"index {_pe(i)} of {name} is not a scalar int64")
            lo, hi = interval(i, env)
            if d == len(index) - 1:
                hi += lanes - 1
            if lo < 0 or hi >= shape[d]:
                self.fail_bounds(f"{name} axis {d} index {_pe(i)} spans [{lo}, {hi}] outside [0, {shape[d] - 1}]")

    def access(self, b: Buf, index: Sequence[Expr], lanes: int, env, write: bool) -> None:
        self.buf(b)
        self.index(b.name, b.shape, index, lanes, env)
        if lanes > 1 and not b.layout.vector_ok(lanes):
            self.fail(f"vector access of {lanes} lanes to {b.name}, whose layout is not contiguous on the last axis")
        if b.vector > 1 and lanes not in (1, b.vector):
            self.fail(f"{b.name} holds {b.vector}-lane vectors: a {lanes}-lane access")
        if write and self.writes and b.scope not in PRIVATE:
            lo, hi = interval(b.layout.address(index), env)
            box = [interval(i, env) for i in index]
            if box:
                box[-1] = (box[-1][0], box[-1][1] + lanes - 1)
            for w in self.writes:
                w.add(b.name, lo, hi + lanes - 1, box)

    def expr(self, e: Expr, env) -> None:
        if isinstance(e, Var):
            if e.dtype == "int64":
                interval(e, env)
            elif self.lets.get(e.name) != e.dtype:
                self.fail(f"variable {e.name} of {e.dtype} is not bound by a let")
        elif isinstance(e, Const):
            if e.dtype not in NUMERIC:
                self.fail(f"constant of dtype {e.dtype}")
        elif isinstance(e, Lane):
            self.expr(e.block, env)
            self.expr(e.lane, env)
            lo, hi = interval(e.lane, env)
            if lo < 0 or hi >= e.size:
                self.fail_bounds(f"{_pe(e)}: the lane spans [{lo}, {hi}] outside [0, {e.size - 1}]")
        elif isinstance(e, Bin):
            self.expr(e.a, env)
            self.expr(e.b, env)
            if e.a.dtype != e.b.dtype:
                self.fail(f"{_pe(e)} mixes {e.a.dtype} and {e.b.dtype}")
            if e.op not in (INT_OPS if e.a.dtype in INTS else FLOAT_OPS):
                self.fail(f"operator {e.op} on {e.a.dtype}")
            if 1 not in (e.a.lanes, e.b.lanes) and e.a.lanes != e.b.lanes:
                self.fail(f"{_pe(e)} mixes {e.a.lanes} and {e.b.lanes} lanes")
        elif isinstance(e, Load):
            self.access(e.buf, e.index, e.lanes, env, False)
        elif isinstance(e, Bcast):
            self.expr(e.value, env)
        elif isinstance(e, Select):
            for x in (e.cond, e.a, e.b):
                self.expr(x, env)
            if e.cond.dtype not in INTS or e.a.dtype != e.b.dtype:
                self.fail(f"{_pe(e)}: the condition must be int64 and both values of one dtype")
        elif isinstance(e, Ptr):
            self.access(e.buf, e.index, 1, env, False)
        elif isinstance(e, Call):
            if len(e.args) != CALLS.get(e.fn, (None,))[0]:
                self.fail(f"{_pe(e)}: unknown function or wrong number of arguments")
            for a in e.args:
                self.expr(a, env)
                if a.dtype not in NUMERIC or a.lanes != 1:
                    self.fail(f"{_pe(e)}: the arguments must be scalars")
            if e.dtype not in NUMERIC:
                self.fail(f"{_pe(e)}: result of dtype {e.dtype}")
        elif isinstance(e, Cast):
            self.expr(e.value, env)
            if e.dtype not in NUMERIC or e.value.dtype not in NUMERIC or e.value.lanes != 1:
                self.fail(f"{_pe(e)}: a cast converts a scalar between {', '.join(NUMERIC)}")
        elif isinstance(e, In):
            self.index(f"in{e.k}", e.shape, e.index, 1, env)
            if e.dtype not in (*DTYPES, *STORED):
                self.fail(f"{_pe(e)}: opaque input of dtype {e.dtype}")
        else:
            self.fail(f"unknown expression {e!r}")

    def stmts(self, body: Sequence[Stmt], env: dict[str, Interval]) -> None:
        for s in body:
            if isinstance(s, For):
                if s.var.name in env:
                    self.fail(f"loop variable {s.var.name} shadows an enclosing one")
                self.expr(s.start, env)
                self.expr(s.stop, env)
                rng = _loop_env(s, env)
                if rng is None:
                    continue
                if s.kind == "parallel":
                    self.parallel(s, env)
                    continue
                saved = [({k: list(v) for k, v in w.flat.items()}, {k: v if v is None else list(v)
                                                                      for k, v in w.box.items()})
                         for w in self.writes]
                # (exact: a parallel loop's write sets again, each value of a controlling variable on its own,
                # and of a short loop's: a thread's channels of every image are not one range)
                one_by_one = s.var.name in self.controlling or (self.exact and rng[1] - rng[0] < EXACT_SHORT_LOOP)
                try:
                    if self.exact and one_by_one and rng[1] - rng[0] <= 4096:
                        raise _OutOfBounds("(exact)")
                    self.stmts(s.body, {**env, s.var.name: rng})
                except _OutOfBounds:
                    # intervals forget how an inner loop's bounds depend on this variable (a clipped
                    # tail: r < min(MR, M - ib*MR)): check each of its values on its own
                    if not one_by_one or rng[1] - rng[0] > 4096:
                        raise
                    for w, (flat, box) in zip(self.writes, saved, strict=True):
                        w.flat, w.box = flat, box
                    for v in range(rng[0], rng[1] + 1):
                        self.stmts(s.body, {**env, s.var.name: (v, v)})
            elif isinstance(s, Let):
                self.expr(s.value, env)
                if s.var.dtype != s.value.dtype or s.value.lanes != 1:
                    self.fail(f"let {s.var.name}: {s.var.dtype} bound to a {s.value.dtype} value")
                if s.var.name in env or self.lets.get(s.var.name, s.var.dtype) != s.var.dtype:
                    self.fail(f"let {s.var.name} shadows a variable")
                self.lets[s.var.name] = s.var.dtype
                if s.var.dtype == "int64":
                    env = {**env, s.var.name: _any_interval(s.value, env)}
            elif isinstance(s, Store):
                self.expr(s.value, env)
                if s.value.dtype != s.buf.dtype:
                    self.fail(f"store of {s.value.dtype} into {s.buf.dtype} buffer {s.buf.name}")
                if s.value.lanes not in (1, s.lanes):
                    self.fail(f"store of a {s.value.lanes}-lane value as {s.lanes} lanes")
                self.access(s.buf, s.index, s.lanes, env, True)
            elif isinstance(s, If):
                self.expr(s.cond, env)
                lo, hi = interval(s.cond, env)
                if hi:  # a branch that cannot run for these variable values is not checked
                    self.stmts(s.then, env)
                if not lo:
                    self.stmts(s.else_, env)
            elif isinstance(s, Alloc):
                b = s.buf
                if b.scope == "global":
                    self.fail(f"allocation {b.name} with global scope")
                if b.scope in ("workspace", "thread_workspace") and self.declared.get(b.name) != b:
                    self.fail(f"workspace {b.name} is allocated but not declared in the function's workspace")
                if b.name in self.bufs:
                    self.fail(f"allocation {b.name} shadows a buffer")
                self.bufs[b.name] = b
                try:
                    self.stmts(s.body, env)
                finally:  # (an enclosing loop may check its body again, value by value)
                    del self.bufs[b.name]
            elif isinstance(s, Micro):
                self.micro(s, env)
            elif isinstance(s, Epilogue):
                for i in s.index:
                    self.expr(i, env)
                self.expr(s.value, env)
                if s.dest is not None:  # a producer's result: a store into the kernel's scratch
                    if s.dest.lanes != 1 or s.value.lanes != 1 or s.dest.dtype != s.value.dtype:
                        self.fail("a producer epilogue stores one scalar of its destination's dtype")
                    self.access(s.dest.buf, s.dest.index, 1, env, True)
                elif self.writes:  # the epilogue stores element ``index`` of the kernel's result
                    box = [interval(i, env) for i in s.index]
                    for w in self.writes:
                        w.add("(epilogue)", 0, 0, box)
            else:
                self.fail(f"unknown statement {s!r}")

    def micro(self, s: Micro, env) -> None:
        mk = MICRO.get(s.name)
        if mk is None:
            self.fail(f"unknown micro-kernel {s.name}")
        if len(s.args) != len(mk.params):
            self.fail(f"micro-kernel {s.name} takes {len(mk.params)} arguments, not {len(s.args)}")
        scalars: dict[str, int] = {}
        for (pname, kind), a in zip(mk.params, s.args, strict=True):
            self.expr(a, env)
            if kind == "int":
                lo, hi = interval(a, env)
                if lo < 0:
                    self.fail_bounds(f"micro-kernel {s.name}: {pname} may be negative ({_pe(a)})")
                scalars[pname] = hi
            elif not isinstance(a, Ptr):
                self.fail(f"micro-kernel {s.name}: {pname} must be a pointer")
        reach = mk.footprint(scalars)
        for (pname, kind), a in zip(mk.params, s.args, strict=True):
            if kind == "int":
                continue
            rows, row_stride, cols = reach[pname]
            lo, hi = interval(a.buf.layout.address(a.index), env)
            last = hi + (rows - 1) * row_stride + cols - 1
            if last >= a.buf.layout.span or lo < 0:
                self.fail_bounds(f"micro-kernel {s.name}: {pname} reaches element {last} of {a.buf.name} "
                                 f"(span {a.buf.layout.span})")
            if kind == "out" and self.writes and a.buf.scope not in PRIVATE:
                box = None  # rows x cols on the last two axes of a buffer whose row stride is the kernel's
                lay = a.buf.layout
                if (len(a.buf.shape) >= 2 and lay.dims[-1][1:] == (1, a.buf.shape[-1], 1)
                        and lay.dims[-2][1:] == (1, a.buf.shape[-2], row_stride)
                        and [d[0] for d in lay.dims] == list(range(len(a.buf.shape)))):
                    box = [interval(i, env) for i in a.index]
                    box[-2] = (box[-2][0], box[-2][1] + rows - 1)
                    box[-1] = (box[-1][0], box[-1][1] + cols - 1)
                    if box[-1][1] >= a.buf.shape[-1] or box[-2][1] >= a.buf.shape[-2]:
                        box = None
                for w in self.writes:
                    w.add(a.buf.name, lo, last, box)

    def parallel(self, s: For, env) -> None:
        try:
            self._parallel(s, env)
        except _Overlap:
            if self.exact:
                raise
            self.exact = True  # the hulls may be loose: again, each controlling variable value on its own
            try:
                self._parallel(s, env)
            finally:
                self.exact = False

    def _parallel(self, s: For, env) -> None:
        lo, hi = interval(s.start, env)[0], interval(s.stop, env)[1]
        if (lo, hi) != (interval(s.start, env)[1], interval(s.stop, env)[0]) or hi - lo > 4096:
            self.fail(f"parallel loop {s.var.name} needs constant bounds (at most 4096 iterations)")
        per: list[_Writes] = []
        for t in range(lo, hi):
            w = _Writes()
            self.writes.append(w)
            try:
                self.stmts(s.body, {**env, s.var.name: (t, t)})
            finally:
                self.writes.pop()
            per.append(w)
        for name in sorted({n for w in per for n in w.flat}):
            both = [(t, w) for t, w in enumerate(per) if name in w.flat]
            for i, (ta, wa) in enumerate(both):
                for tb, wb in both[i + 1:]:
                    if wa.overlaps(wb, name):
                        raise _Overlap(f"loop IR {self.f.name}: parallel loop {s.var.name}: iterations {lo + ta} "
                                       f"and {lo + tb} may both write the same elements of {name}")


def verify_func(f: Func) -> None:
    """Check the invariants of the module docstring; raise PassError naming the first broken one."""
    names = [b.name for b in (*f.params, *f.workspace)]
    if len(set(names)) != len(names):
        raise PassError(f"loop IR {f.name}: two buffers share a name")
    for b in f.params:
        if b.scope != "global":
            raise PassError(f"loop IR {f.name}: parameter {b.name} has scope {b.scope}")
    for b in f.workspace:
        if b.scope not in ("workspace", "thread_workspace"):
            raise PassError(f"loop IR {f.name}: workspace {b.name} has scope {b.scope}")
    _Verifier(f).stmts(f.body, {})


# ------------------------------------------------------------------------------------------ interpreter
class _Interp:
    def __init__(self, arrays: dict[str, np.ndarray], epilogue, inputs, producer):
        self.mem = arrays  # buffer name -> flat array (physical)
        self.epilogue = epilogue
        self.inputs = inputs
        self.producer = producer

    def ev(self, e: Expr, env: dict[str, int]):
        if isinstance(e, Const):
            return e.value if e.dtype == "int64" else np.dtype(e.dtype).type(e.value)
        if isinstance(e, Var):
            return env[e.name]
        if isinstance(e, Lane):
            return int(self.ev(e.block, env)) * e.size + int(self.ev(e.lane, env))
        if isinstance(e, Bin):
            a, b = self.ev(e.a, env), self.ev(e.b, env)
            if e.a.dtype in INTS:  # (C: computed in int or wider, stored back with wrap-around)
                r = _int_op(e.op, int(a), int(b))
                return r if e.dtype == "int64" else _wrap(r, e.dtype)
            if e.op in COMPARISONS:
                return int({"<": a < b, "<=": a <= b, "==": a == b, "!=": a != b}[e.op])
            f = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "min": np.minimum,
                 "max": np.maximum}[e.op]
            t = np.dtype(e.dtype).type
            return t(f(a, b)) if e.lanes == 1 else f(a, b).astype(t)
        if isinstance(e, Call):
            v = CALLS[e.fn][1](*(self.ev(a, env) for a in e.args))
            return int(v) if e.dtype == "int64" else np.dtype(e.dtype).type(v)
        if isinstance(e, Cast):
            v = self.ev(e.value, env)
            if e.dtype in INTS:
                return _wrap(int(v), e.dtype) if e.dtype != "bool" else int(v != 0)
            return np.dtype(e.dtype).type(v)
        if isinstance(e, In):
            idx = tuple(int(self.ev(i, env)) for i in e.index)
            src = self.inputs[e.k]
            v = src(idx) if callable(src) else src[idx]
            return int(v) if e.dtype == "int64" else np.dtype(e.dtype).type(v)
        if isinstance(e, Load):
            addr = self.addrs(e.buf, e.index, e.lanes, env)
            if e.buf.scope == "const" and e.buf.name not in self.mem:
                self.mem[e.buf.name] = np.array(e.buf.data, dtype=e.buf.dtype)
            vals = self.mem[e.buf.name][addr]
            return vals[0] if e.lanes == 1 else vals.copy()
        if isinstance(e, Bcast):
            return np.full(e.lanes, self.ev(e.value, env), dtype=e.dtype)
        if isinstance(e, Select):
            a, b = self.ev(e.a, env), self.ev(e.b, env)
            return a if self.ev(e.cond, env) else b
        if isinstance(e, Ptr):
            return e.buf.name, int(self.ev(e.buf.layout.address(e.index), env))
        raise PassError(f"loop IR: cannot interpret {e!r}")

    def addrs(self, b: Buf, index, lanes: int, env) -> np.ndarray:
        idx = [int(self.ev(i, env)) for i in index]
        out = []
        for lane in range(lanes):
            j = [*idx[:-1], idx[-1] + lane] if idx else []
            out.append(int(self.ev(b.layout.address([Const(x) for x in j]), {})))
        return np.array(out)

    def run(self, body: Sequence[Stmt], env: dict[str, int]) -> None:
        for s in body:
            if isinstance(s, Let):
                env = {**env, s.var.name: self.ev(s.value, env)}
            elif isinstance(s, For):
                for i in range(int(self.ev(s.start, env)), int(self.ev(s.stop, env))):
                    self.run(s.body, {**env, s.var.name: i})
            elif isinstance(s, Store):
                v = self.ev(s.value, env)
                self.mem[s.buf.name][self.addrs(s.buf, s.index, s.lanes, env)] = v
            elif isinstance(s, If):
                self.run(s.then if self.ev(s.cond, env) else s.else_, env)
            elif isinstance(s, Alloc):
                fill = np.nan if s.buf.dtype.startswith("float") else 0
                self.mem[s.buf.name] = np.full(s.buf.layout.span, fill, dtype=s.buf.dtype)
                self.run(s.body, env)
                del self.mem[s.buf.name]
            elif isinstance(s, Micro):
                mk = MICRO[s.name]
                arrays, offsets, scalars = {}, {}, {}
                for (pname, kind), a in zip(mk.params, s.args, strict=True):
                    if kind == "int":
                        scalars[pname] = int(self.ev(a, env))
                    else:
                        name, off = self.ev(a, env)
                        arrays[pname], offsets[pname] = self.mem[name], off
                mk.reference(arrays, offsets, scalars)
            elif isinstance(s, Epilogue) and s.dest is not None:
                v = self.producer(tuple(int(self.ev(i, env)) for i in s.index), self.ev(s.value, env))
                self.mem[s.dest.buf.name][self.addrs(s.dest.buf, s.dest.index, 1, env)] = v
            elif isinstance(s, Epilogue):
                self.epilogue(tuple(int(self.ev(i, env)) for i in s.index), self.ev(s.value, env))


def run_func(f: Func, arrays: dict[str, np.ndarray], epilogue=None, inputs=None, producer=None) -> None:
    """Interpret ``f`` on flat numpy arrays (one per parameter, by name, at least ``layout.span`` long),
    updating them in place; workspace is allocated here. ``epilogue(index, value)`` receives the Epilogue
    statements' elements; ``producer(index, value)`` returns what a producer's epilogue stores (default: the
    value); ``inputs[k]`` gives the opaque input ``k`` (``In``): an array indexed by the
    element's index, or a function of it. Float arithmetic follows C (inf and NaN without warnings)."""
    mem = dict(arrays)
    for b in f.workspace:
        mem[b.name] = np.full(b.layout.span, np.nan, dtype=b.dtype)
    with np.errstate(all="ignore"):
        _Interp(mem, epilogue or (lambda idx, v: None), inputs or {}, producer or (lambda idx, v: v)).run(f.body, {})


# ---------------------------------------------------------------------------------------- transformations
def _subst(e: Expr, var: str, new: Expr) -> Expr:
    if isinstance(e, Var):
        return new if e.name == var else e
    if isinstance(e, Lane):
        return Lane(_subst(e.block, var, new), _subst(e.lane, var, new), e.size)
    if isinstance(e, Bin):
        return Bin(e.op, _subst(e.a, var, new), _subst(e.b, var, new))
    if isinstance(e, Load):
        return Load(e.buf, tuple(_subst(i, var, new) for i in e.index), e.lanes)
    if isinstance(e, Bcast):
        return Bcast(_subst(e.value, var, new), e.lanes)
    if isinstance(e, Select):
        return Select(_subst(e.cond, var, new), _subst(e.a, var, new), _subst(e.b, var, new))
    if isinstance(e, Ptr):
        return Ptr(e.buf, tuple(_subst(i, var, new) for i in e.index))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_subst(a, var, new) for a in e.args), e.out)
    if isinstance(e, Cast):
        return Cast(_subst(e.value, var, new), e.dtype)
    if isinstance(e, In):
        return In(e.k, tuple(_subst(i, var, new) for i in e.index), e.shape, e.dtype)
    return e


def subst_stmts(body: Sequence[Stmt], var: str, new: Expr) -> tuple[Stmt, ...]:
    """``body`` with variable ``var`` replaced by ``new``."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            out.append(replace(s, start=_subst(s.start, var, new), stop=_subst(s.stop, var, new),
                               body=subst_stmts(s.body, var, new)))
        elif isinstance(s, Store):
            out.append(Store(s.buf, tuple(_subst(i, var, new) for i in s.index), _subst(s.value, var, new), s.lanes))
        elif isinstance(s, Let):
            out.append(Let(s.var, _subst(s.value, var, new)))
        elif isinstance(s, If):
            out.append(If(_subst(s.cond, var, new), subst_stmts(s.then, var, new), subst_stmts(s.else_, var, new)))
        elif isinstance(s, Alloc):
            out.append(Alloc(s.buf, subst_stmts(s.body, var, new)))
        elif isinstance(s, Micro):
            out.append(Micro(s.name, tuple(_subst(a, var, new) for a in s.args)))
        elif isinstance(s, Epilogue):
            dest = _subst(s.dest, var, new) if s.dest is not None else None
            out.append(Epilogue(tuple(_subst(i, var, new) for i in s.index), _subst(s.value, var, new), dest))
        else:
            out.append(s)
    return tuple(out)


def rewrite_stmts(body: Sequence[Stmt], fn: Callable[[Stmt], tuple[Stmt, ...] | None]) -> tuple[Stmt, ...]:
    """``body`` with every statement that ``fn`` rewrites (it returns the statements in its place) replaced, and the
    bodies of the others (loops, branches, allocations) rewritten the same way."""
    out: list[Stmt] = []
    for s in body:
        r = fn(s)
        if r is not None:
            out.extend(r)
        elif isinstance(s, For):
            out.append(replace(s, body=rewrite_stmts(s.body, fn)))
        elif isinstance(s, If):
            out.append(If(s.cond, rewrite_stmts(s.then, fn), rewrite_stmts(s.else_, fn)))
        elif isinstance(s, Alloc):
            out.append(Alloc(s.buf, rewrite_stmts(s.body, fn)))
        else:
            out.append(s)
    return tuple(out)


def _map_loops(body: Sequence[Stmt], name: str, fn: Callable[[For], Stmt | tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For) and s.var.name == name:
            r = fn(s)
            out.extend(r if isinstance(r, tuple) else (r,))
        elif isinstance(s, For):
            out.append(replace(s, body=_map_loops(s.body, name, fn)))
        elif isinstance(s, If):
            out.append(If(s.cond, _map_loops(s.then, name, fn), _map_loops(s.else_, name, fn)))
        elif isinstance(s, Alloc):
            out.append(Alloc(s.buf, _map_loops(s.body, name, fn)))
        else:
            out.append(s)
    return tuple(out)
