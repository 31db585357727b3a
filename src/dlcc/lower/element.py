"""Element expressions: the elements of values computed by elementwise and injective ops, as loop-IR expressions.

What goes in: a value of a fusion group and a multi-index (loop-IR int64 expressions); the values the kernel holds
in buffers (loop-IR ``Buf``s with their layouts) and the group's small constants.
What comes out: a loop-IR expression (``dlcc.lower.lir``) of that element. A value held in a buffer is a
``Load`` through its layout; a value produced by an elementwise op is the op applied to its inputs' elements
(``Bin``, ``Cast``, or a ``Call`` of a scalar function of ``dlcc.lower.scalar``; broadcast index maps: dims of
size 1 read index 0, missing leading dims are dropped); a value produced by an injective op (Transpose, Slice,
Concat, Gather, Pad, ...: ``dlcc.lower.indexmaps``) is its input at a remapped index. So a whole
elementwise/injective chain becomes one expression evaluated in registers inside the consumer's loop nest: the
loop step's element (``dlcc.schedule.elementwise.map_func``), a template's epilogue, an operand read where it is
used.

Two modes: with ``lets`` (a list) the generator may bind sub-results to locals (``Let``) appended there, used in a
loop body where every index is in range, so a value read twice at the same index is computed once. Without
``lets`` it returns one pure expression (used inside templates' loops and inside the branches of a choice, where
a hoisted statement could read out of range).

Handlers: ``ELEMENTWISE[op](node, args, dtypes) -> Expr`` for ops whose output element depends on the inputs at
the same (broadcast) index; ``INDEXED[op](gen, node, out_index, idx, lets) -> Expr`` for the rest (index maps,
per-channel ops such as BatchNormalization). Every expression a handler returns has its output's dtype
(``ElementGen`` casts comparisons to bool and the like).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import onnx_ir as ir

from dlcc.errors import DlccError, TemplateError
from dlcc.lower.lir import NUMERIC, Bin, Buf, Call, Cast, Const, Expr, Let, Load, Var, simplify
from dlcc.lower.lower import op_key
from dlcc.passes.rewrite import attr
from dlcc.util import value_dtype, value_shape

__all__ = ["ELEMENTWISE", "INDEXED", "ElementGen", "broadcast_index", "can_inline", "literal"]

ONE_PLUS = True  # 1 + erf(x), 1 + tanh(x) as one call of the one-piece rational (``ElementGen._one_plus``)
FLT_MAX = float(np.finfo(np.float32).max)

ElementwiseFn = Callable[[ir.Node, list, list[str]], Expr]
IndexedFn = Callable[["ElementGen", ir.Node, int, list[Expr], "list[Let] | None"], Expr]

ELEMENTWISE: dict[str, ElementwiseFn] = {}
INDEXED: dict[str, IndexedFn] = {}


def literal(x, dtype: str) -> Const:
    """A constant of ``dtype`` (a numpy or Python scalar)."""
    dtype = np.dtype(dtype).name
    if dtype not in NUMERIC:
        raise TemplateError(f"the C backend has no {dtype} elements")
    if dtype.startswith("float"):
        return Const(float(x), dtype)
    return Const(int(bool(x)) if dtype == "bool" else int(x), dtype)


def f32(x) -> Const:
    """A float32 constant (rounded to float32)."""
    return Const(float(np.float32(x)), "float32")


def broadcast_index(idx: Sequence[Expr], in_shape: Sequence[int]) -> list[Expr]:
    """The index into an input of shape ``in_shape`` broadcast to the output indexed by ``idx``."""
    rank = len(in_shape)
    tail = list(idx[len(idx) - rank:]) if rank else []
    return [Const(0) if d == 1 else i for i, d in zip(tail, in_shape, strict=False)]


def _index(i) -> Expr:
    return i if isinstance(i, Expr) else Const(int(i))


class ElementGen:
    """Builds element expressions for one kernel. ``bufs`` maps values to their loop-IR buffer; ``consts`` maps
    constant values (weights) to their arrays (scalars become constants); ``fresh(prefix)`` gives new names (of
    locals and tables)."""

    def __init__(self, bufs: dict[ir.Value, Buf], consts: dict[ir.Value, np.ndarray], fresh: Callable[[str], str]):
        self.bufs = bufs
        self.consts = consts
        self.fresh = fresh
        self._memo: dict[tuple, Expr] = {}
        self.bound: dict[ir.Value, Expr] = {}  # values replaced by an expression (a template's result)

    def reset(self) -> None:
        """Forget bound locals (call when a new loop body starts)."""
        self._memo.clear()

    @contextmanager
    def own_memo(self) -> Iterator[None]:
        """Inside: a memo of locals of its own (an expression printed at another place than the loop body
        being generated, e.g. a template's epilogue), the body's back after."""
        saved, self._memo = self._memo, {}
        try:
            yield
        finally:
            self._memo = saved

    def at(self, v: ir.Value, idx: Sequence[Expr | int], lets: list[Let] | None = None) -> Expr:
        """Element ``idx`` of ``v``."""
        idx = [_index(i) for i in idx]
        if v in self.bound:
            return self.bound[v]
        buf = self.bufs.get(v)
        if buf is not None:
            return Load(buf, tuple(idx))
        const = self.consts.get(v)
        if const is not None and const.size == 1:
            return literal(const.reshape(-1)[0], const.dtype.name)
        node = v.producer()
        if node is None:
            raise DlccError(f"internal: value '{v.name}' is neither in a buffer nor computed in this kernel")
        key = (id(v), v.index() or 0, tuple(idx))
        if lets is not None and key in self._memo:
            return self._memo[key]
        expr = self._compute(node, v.index() or 0, idx, lets)
        if lets is not None and not isinstance(expr, (Var, Const)):
            expr = self.bind(expr, lets, "v")
            self._memo[key] = expr
        return expr

    def compute(self, v: ir.Value, idx: Sequence[Expr | int], lets: list[Let] | None = None) -> Expr:
        """Element ``idx`` of ``v`` computed by its producer (even when ``v`` has a buffer: used to fill it)."""
        node = v.producer()
        if node is None:
            raise DlccError(f"internal: value '{v.name}' has no producer to compute it")
        return self._compute(node, v.index() or 0, [_index(i) for i in idx], lets)

    def bind(self, e: Expr, lets: list[Let] | None, prefix: str = "r") -> Expr:
        """``e`` bound to a local in statement mode (computed once), else ``e`` itself."""
        if lets is None or isinstance(e, (Var, Const)):
            return e
        var = Var(self.fresh(prefix), e.dtype)
        lets.append(Let(var, e))
        return var

    def table(self, values: Sequence, i: Expr, dtype: str = "int64") -> Expr:
        """``values[i]``: folded for a constant ``i``, a uniform or (integer) affine table, else a constant table."""
        vals = list(values)
        if isinstance(i, Const):
            return literal(vals[int(i.value)], dtype)
        if len(vals) == 1 or len({float(x) for x in vals}) == 1:
            return literal(vals[0], dtype)
        if dtype == "int64":
            ints = [int(x) for x in vals]
            step = ints[1] - ints[0]
            if all(ints[k] == ints[0] + k * step for k in range(len(ints))):
                return simplify(i * Const(step) + Const(ints[0]))
        return Load(Buf.table(self.fresh("tab"), vals, dtype), (i,))

    def _compute(self, node: ir.Node, out_index: int, idx: list[Expr], lets: list[Let] | None) -> Expr:
        op = op_key(node)
        out_dtype = value_dtype(node.outputs[out_index])
        expr = None
        if op == "Mul":
            x = self._silu_input(node)
            if x is not None:  # x * Sigmoid(x): SiLU in one call (codegen/vmath.py: cheaper, rounds once)
                expr = Call("silu", (self.at(x, broadcast_index(idx, value_shape(x)), lets),))
        if op == "Add" and expr is None:
            one_plus = self._one_plus(node)
            if one_plus is not None:  # 1 + erf(x), 1 + tanh(x): GELU's factor in one call (codegen/vmath.py)
                fn, x = one_plus
                expr = Call(fn, (self.at(x, broadcast_index(idx, value_shape(x)), lets),))
        fn = ELEMENTWISE.get(op)
        if expr is None and fn is not None:
            args: list[Expr | None] = []
            dtypes: list[str] = []
            for inp in node.inputs:
                if inp is None:
                    args.append(None)
                    dtypes.append("")
                    continue
                args.append(self.at(inp, broadcast_index(idx, value_shape(inp)), lets))
                dtypes.append(value_dtype(inp))
            expr = fn(node, args, dtypes)
        if expr is None:
            ifn = INDEXED.get(op)
            if ifn is None:
                raise DlccError(f"internal: no element expression for {op}")
            expr = ifn(self, node, out_index, idx, lets)
        return expr if expr.dtype == out_dtype else Cast(expr, out_dtype)

    def _computed_here(self, v: ir.Value, ops: tuple[str, ...]) -> ir.Node | None:
        """The producer of ``v`` when it is one of ``ops`` (default domain) and ``v`` is computed in this kernel
        (neither read from a buffer nor bound to a template's result), else None."""
        f = v.producer()
        if f is None or f.op_type not in ops or f.domain not in ("", "ai.onnx") or v in self.bufs or v in self.bound:
            return None
        return f

    @staticmethod
    def _float32_pair(node: ir.Node) -> bool:
        return len(node.inputs) == 2 and all(v is not None and value_dtype(v) == "float32" for v in node.inputs)

    def _silu_input(self, node: ir.Node) -> ir.Value | None:
        """x when ``node`` is Mul(x, Sigmoid(x)) (either order) on float32 of one shape, with the Sigmoid
        computed in this kernel (not read from a buffer), else None."""
        if not self._float32_pair(node):
            return None
        for x, g in (node.inputs, node.inputs[::-1]):
            sig = self._computed_here(g, ("Sigmoid",))
            if sig is not None and sig.inputs[0] is x and value_shape(x) == value_shape(node.outputs[0]):
                return x
        return None

    def _one_plus(self, node: ir.Node) -> tuple[str, ir.Value] | None:
        """(``erf1p`` or ``tanh1p``, x) when ``node`` is Add(Erf(x), 1) or Add(Tanh(x), 1) (either order) on
        float32 of one shape, the Erf or Tanh computed in this kernel: GELU's factor, where the sum with 1 keeps
        only the function's absolute accuracy, which the one-piece rational of codegen/vmath.py gives at less than
        half the cost. Else None."""
        if not ONE_PLUS or not self._float32_pair(node):
            return None
        for g, c in (node.inputs, node.inputs[::-1]):
            f = self._computed_here(g, ("Erf", "Tanh"))
            one = self.const_of(c)
            if (f is not None and one is not None and one.size == 1 and float(one.reshape(-1)[0]) == 1.0
                    and value_shape(g) == value_shape(node.outputs[0])):
                return ("erf1p" if f.op_type == "Erf" else "tanh1p"), f.inputs[0]
        return None

    def const_of(self, v: ir.Value | None) -> np.ndarray | None:
        """The constant array of ``v`` (a weight or a small constant), or None."""
        if v is None:
            return None
        if v in self.consts:
            return self.consts[v]
        if v.const_value is not None:
            return v.const_value.numpy()
        return None


def can_inline(node: ir.Node) -> bool:
    op = op_key(node)
    return op in ELEMENTWISE or op in INDEXED


# ----------------------------------------------------------------------------------------- elementwise

def _is_float(t: str) -> bool:
    return t in ("float32", "float64")


def _unary(op: str, fn: str) -> None:
    ELEMENTWISE[op] = lambda node, a, t, fn=fn: Call(fn, (a[0],))


for _op, _fn in {
    # codegen/vmath.py: vectorizable, within 2 ulp (libm calls keep the loop scalar). Its tanh keeps
    # |tanh(x)| <= |x| near 0, which glibc tanhf breaks (1 ulp off: flips x <= tanh(x)).
    "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Softplus": "softplus", "Softsign": "softsign",
    "Mish": "mish", "Sin": "sin", "Cos": "cos", "HardSwish": "hardswish", "Neg": "neg",
}.items():
    _unary(_op, _fn)

ELEMENTWISE["Identity"] = lambda node, a, t: a[0]
ELEMENTWISE["Dropout"] = lambda node, a, t: a[0]
ELEMENTWISE["Not"] = lambda node, a, t: Call("not", (a[0],), "bool")
ELEMENTWISE["Relu"] = lambda node, a, t: (
    Call("relu", (a[0],)) if _is_float(t[0]) else Call("max_i", (a[0], literal(0, t[0]))))
ELEMENTWISE["Abs"] = lambda node, a, t: Call("abs" if _is_float(t[0]) else "abs_i", (a[0],))
ELEMENTWISE["Sign"] = lambda node, a, t: Call("sign" if _is_float(t[0]) else "sign_i", (a[0],))
ELEMENTWISE["LeakyRelu"] = lambda node, a, t: Call("leaky", (a[0], f32(attr(node, "alpha", 0.01))))
ELEMENTWISE["PRelu"] = lambda node, a, t: Call("leaky", (a[0], a[1]))
ELEMENTWISE["Elu"] = lambda node, a, t: Call("elu", (a[0], f32(attr(node, "alpha", 1.0))))
ELEMENTWISE["Celu"] = lambda node, a, t: Call("celu", (a[0], f32(attr(node, "alpha", 1.0))))
ELEMENTWISE["Selu"] = lambda node, a, t: Call("selu", (
    a[0], f32(attr(node, "alpha", 1.67326319217681884765625)), f32(attr(node, "gamma", 1.05070102214813232421875))))
ELEMENTWISE["HardSigmoid"] = lambda node, a, t: Call("hardsigmoid", (
    a[0], f32(attr(node, "alpha", 0.2)), f32(attr(node, "beta", 0.5))))
ELEMENTWISE["Gelu"] = lambda node, a, t: Call(
    "gelu_tanh" if attr(node, "approximate", "none") == "tanh" else "gelu", (a[0],))


def _clip(node: ir.Node, a: list, t: list[str]) -> Expr:
    # Absent bounds default to numeric_limits lowest()/max() (spec): a float clip maps +-inf to -+FLT_MAX.
    x = a[0]
    fl = _is_float(t[0])
    lo = a[1] if len(a) > 1 and a[1] is not None else (f32(attr(node, "min")) if attr(node, "min") is not None
                                                       else None)
    hi = a[2] if len(a) > 2 and a[2] is not None else (f32(attr(node, "max")) if attr(node, "max") is not None
                                                       else None)
    if fl:
        lo = f32(-FLT_MAX) if lo is None else lo
        hi = f32(FLT_MAX) if hi is None else hi
    if lo is not None:
        x = Call("fmax" if fl else "max_i", (x, lo))
    if hi is not None:
        x = Call("fmin" if fl else "min_i", (x, hi))
    return x


ELEMENTWISE["Clip"] = _clip


def _cast(node: ir.Node, a: list, t: list[str]) -> Expr:
    # Float -> int out of range (and NaN, +-inf) gives INT64_MIN / INT32_MIN like onnxruntime and numpy on
    # x86 (the "integer indefinite" of cvttss2si); 8-bit targets convert through int32 and wrap, as there.
    to = ir.DataType(attr(node, "to"))
    try:
        target = np.dtype(to.numpy()).name
    except Exception:  # noqa: BLE001  (string, float8, 4-bit types: no numpy dtype)
        target = to.name
    if target not in NUMERIC:
        raise TemplateError(f"Cast to {to.name} is not supported by the C backend")
    if target == "bool":
        return Cast(a[0], "bool")
    if _is_float(t[0]) and not _is_float(target):
        pre = "d2i" if t[0] == "float64" else "f2i"
        if target == "int64":
            return Call(f"{pre}64", (a[0],), "int64")
        wide = Call(f"{pre}32", (a[0],), "int32")
        return wide if target == "int32" else Cast(wide, target)
    return a[0] if t[0] == target else Cast(a[0], target)


ELEMENTWISE["Cast"] = _cast


def _bin(op: str, swap: bool = False) -> ElementwiseFn:
    return lambda node, a, t: Bin(op, a[1], a[0]) if swap else Bin(op, a[0], a[1])


ELEMENTWISE.update({
    "Add": _bin("+"), "Sub": _bin("-"), "Mul": _bin("*"),
    "Div": lambda node, a, t: Bin("/", a[0], a[1]) if _is_float(t[0]) else Call("div_i", (a[0], a[1])),
    "Equal": _bin("=="), "Less": _bin("<"), "Greater": _bin("<", True), "LessOrEqual": _bin("<="),
    "GreaterOrEqual": _bin("<=", True), "And": _bin("&&"), "Or": _bin("||"),
    "Xor": lambda node, a, t: Call("xor", (a[0], a[1]), "bool"),
})


def _const_scalar(v) -> float | None:
    if v is None or v.const_value is None or v.const_value.size != 1:
        return None
    return float(v.const_value.numpy().reshape(-1)[0])


def _pow(node: ir.Node, a: list, t: list[str]) -> Expr:
    e = _const_scalar(node.inputs[1]) if _is_float(t[0]) and len(node.inputs) > 1 else None
    if e in (2.0, 3.0):  # x * x (* x), as onnxruntime computes these two: the loop stays vectorizable
        return Bin("*", a[0], a[0]) if e == 2.0 else Bin("*", Bin("*", a[0], a[0]), a[0])
    if not _is_float(t[0]):
        if _is_float(t[1]):  # int base, float exponent: computed in double, truncated (as onnxruntime)
            p = Call("dpow", (Cast(a[0], "float64"), a[1] if t[1] == "float64" else Cast(a[1], "float64")))
            return Call("d2i64", (p,), "int64") if t[0] == "int64" else Call("d2i32", (p,), "int32")
        return Call("pow_i", (a[0], a[1]))
    return Call("fpow", (a[0], a[1] if t[1] == "float32" else Cast(a[1], "float32")))


ELEMENTWISE["Pow"] = _pow


def _mod(node: ir.Node, a: list, t: list[str]) -> Expr:
    if attr(node, "fmod", 0):
        return Call("fmod" if _is_float(t[0]) else "fmod_i", (a[0], a[1]))
    return Call("mod" if _is_float(t[0]) else "mod_i", (a[0], a[1]))


ELEMENTWISE["Mod"] = _mod


def _variadic(fn_f: str, fn_i: str) -> ElementwiseFn:
    def fn(node, a, t):
        f = fn_f if _is_float(t[0]) else fn_i
        args = [x for x in a if x is not None]
        out = args[0]
        for x in args[1:]:
            out = Call(f, (out, x))
        return out
    return fn


def _sum(node: ir.Node, a: list, t: list[str]) -> Expr:
    args = [x for x in a if x is not None]
    out = args[0]
    for x in args[1:]:
        out = Bin("+", out, x)
    return out


ELEMENTWISE["Max"] = _variadic("fmax", "max_i")
ELEMENTWISE["Min"] = _variadic("fmin", "min_i")
ELEMENTWISE["Sum"] = _sum
ELEMENTWISE["Mean"] = lambda node, a, t: Bin(
    "*", _sum(node, a, t), literal(np.float32(1.0 / len([x for x in a if x is not None])), t[0]))
ELEMENTWISE["Where"] = lambda node, a, t: Call("select", (a[0], a[1], a[2]), t[1])


# --------------------------------------------------------------------------- per-channel (indexed) ops

def _batchnorm(gen: ElementGen, node: ir.Node, out_index: int, idx: list[Expr], lets) -> Expr:
    if out_index != 0 or attr(node, "training_mode", 0):
        raise TemplateError("BatchNormalization in training mode (outputs 1-2 used) is not supported by the C backend")
    x, scale, bias, mean, var = node.inputs[:5]
    if not attr(node, "spatial", 1) and len(value_shape(scale)) != 1:
        raise TemplateError("BatchNormalization with spatial=0 (per-element params) is not supported by the C backend")
    eps = float(attr(node, "epsilon", 1e-5))
    c = idx[1] if len(idx) > 1 else Const(0)
    consts = [gen.const_of(v) for v in (scale, bias, mean, var)]
    xe = gen.at(x, idx, lets)
    if all(k is not None for k in consts):
        s, b, m, va = (k.astype(np.float64).reshape(-1) for k in consts)
        mul = (s / np.sqrt(va + eps)).astype(np.float32)
        add = (b - m * mul.astype(np.float64)).astype(np.float32)
        if mul.size == 1:
            return Bin("+", Bin("*", xe, f32(mul[0])), f32(add[0]))
        tm = Load(Buf.table(gen.fresh("bnm"), mul, "float32"), (c,))
        ta = Load(Buf.table(gen.fresh("bna"), add, "float32"), (c,))
        return Bin("+", Bin("*", xe, tm), ta)
    se, be, me, ve = (gen.at(v, [c], lets) for v in (scale, bias, mean, var))
    return Bin("+", Bin("/", Bin("*", Bin("-", xe, me), se), Call("sqrt", (Bin("+", ve, f32(eps)),))), be)


INDEXED["BatchNormalization"] = _batchnorm

import dlcc.lower.indexmaps  # noqa: E402, F401  (registers the index maps in INDEXED)
