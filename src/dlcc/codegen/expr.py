"""Inlining: C expressions for the elements of values computed by elementwise and injective ops.

What goes in: a value of a fusion group and a multi-index (C expressions); the values the kernel holds
in buffers (``TensorRef``s) and the group's small constants.
What comes out: a C expression for that element. A value held in a buffer is a load; a value produced
by an elementwise op is the op applied to its inputs' elements (broadcast index maps: dims of size 1 read
index 0, missing leading dims are dropped); a value produced by an injective op (Transpose, Slice,
Concat, Gather, Pad, ...) is its input at a remapped index. So a whole elementwise/injective chain
becomes one expression evaluated in registers inside the consumer's loop nest.

Two modes: with ``stmts`` (a list) the generator may bind sub-results to local variables (``float t3 =
...;``) appended there — used in a loop body where every index is in range, so a value read twice at the
same index is computed once. Without ``stmts`` it returns one pure expression (used inside templates'
loops and inside conditional branches, where a hoisted statement could read out of range).

Handlers: ``ELEMENTWISE[op](node, args, dtypes) -> expr`` for ops whose output element depends on the
inputs at the same (broadcast) index; ``INDEXED[op](gen, node, out_index, idx, stmts) -> expr`` for the
rest (index maps, per-channel ops such as BatchNormalization).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import onnx_ir as ir

from dlcc.codegen.cbase import CTYPES, Names, TemplateError, TensorRef, c_float, c_helper, c_literal, ctype
from dlcc.codegen.vmath import C_TEXT as VMATH_C
from dlcc.errors import DlccError
from dlcc.util import value_dtype, value_shape

__all__ = ["ELEMENTWISE", "INDEXED", "ExprGen", "broadcast_index", "value_dtype", "value_shape"]

ONE_PLUS = True  # 1 + erf(x), 1 + tanh(x) as one call of the one-piece rational (``ExprGen._one_plus``)

ElementwiseFn = Callable[[ir.Node, list[str], list[str]], str]
IndexedFn = Callable[["ExprGen", ir.Node, int, list[str], "list[str] | None"], str]

ELEMENTWISE: dict[str, ElementwiseFn] = {}
INDEXED: dict[str, IndexedFn] = {}


def broadcast_index(idx: Sequence[str], in_shape: Sequence[int]) -> list[str]:
    """The index into an input of shape ``in_shape`` broadcast to the output indexed by ``idx``."""
    rank = len(in_shape)
    tail = list(idx[len(idx) - rank:]) if rank else []
    return ["0" if d == 1 else i for i, d in zip(tail, in_shape, strict=False)]


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


class ExprGen:
    """Generates element expressions for one kernel. ``buffers`` maps values to their TensorRef;
    ``consts`` maps constant values (weights) to their arrays (scalars become literals)."""

    def __init__(self, buffers: dict[ir.Value, TensorRef], consts: dict[ir.Value, np.ndarray], names: Names):
        self.buffers = buffers
        self.consts = consts
        self.names = names
        self._memo: dict[tuple[int, int, tuple[str, ...]], str] = {}
        self.bound: dict[ir.Value, str] = {}  # values replaced by a C expression (a template's result)

    def reset(self) -> None:
        """Forget bound local variables (call when a new loop body starts)."""
        self._memo.clear()

    @contextmanager
    def own_memo(self) -> Iterator[None]:
        """Inside: a memo of local variables of its own (an expression printed at another place than the loop body
        being generated, e.g. a template's epilogue), the body's back after."""
        saved, self._memo = self._memo, {}
        try:
            yield
        finally:
            self._memo = saved

    def at(self, v: ir.Value, idx: Sequence[str], stmts: list[str] | None = None) -> str:
        """A C expression of element ``idx`` of ``v``."""
        idx = [str(i) for i in idx]
        if v in self.bound:
            return self.bound[v]
        ref = self.buffers.get(v)
        if ref is not None:
            return ref.at(idx)
        const = self.consts.get(v)
        if const is not None and const.size == 1:
            return c_literal(const.reshape(-1)[0], const.dtype)
        node = v.producer()
        if node is None:
            raise DlccError(f"internal: value '{v.name}' is neither in a buffer nor computed in this kernel")
        key = (id(v), v.index() or 0, tuple(idx))
        if stmts is not None and key in self._memo:
            return self._memo[key]
        expr = self._compute(node, v.index() or 0, idx, stmts)
        if stmts is not None and not _trivial(expr):
            name = self.names("v")
            stmts.append(f"const {ctype(value_dtype(v))} {name} = {expr};")
            self._memo[key] = name
            return name
        return expr

    def compute(self, v: ir.Value, idx: Sequence[str], stmts: list[str] | None = None) -> str:
        """Element ``idx`` of ``v`` computed by its producer (even when ``v`` has a buffer: used to fill it)."""
        node = v.producer()
        if node is None:
            raise DlccError(f"internal: value '{v.name}' has no producer to compute it")
        return self._compute(node, v.index() or 0, [str(i) for i in idx], stmts)

    def _compute(self, node: ir.Node, out_index: int, idx: list[str], stmts: list[str] | None) -> str:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        if op == "Mul":
            x = self._silu_input(node)
            if x is not None:  # x * Sigmoid(x): SiLU in one call (codegen/vmath.py: cheaper, rounds once)
                return f"dlcc_siluf({self.at(x, broadcast_index(idx, value_shape(x)), stmts)})"
        if op == "Add":
            one_plus = self._one_plus(node)
            if one_plus is not None:  # 1 + erf(x), 1 + tanh(x): GELU's factor in one call (codegen/vmath.py)
                fn, x = one_plus
                return f"{fn}({self.at(x, broadcast_index(idx, value_shape(x)), stmts)})"
        fn = ELEMENTWISE.get(op)
        if fn is not None:
            out_shape = value_shape(node.outputs[out_index])
            args, dtypes = [], []
            for inp in node.inputs:
                if inp is None:
                    args.append("")
                    dtypes.append("")
                    continue
                args.append(self.at(inp, broadcast_index(idx, value_shape(inp)), stmts))
                dtypes.append(value_dtype(inp))
            del out_shape
            return fn(node, args, dtypes)
        fn = INDEXED.get(op)
        if fn is None:
            raise DlccError(f"internal: no inline code for {op}")
        return fn(self, node, out_index, idx, stmts)

    def _computed_here(self, v: ir.Value, ops: tuple[str, ...]) -> ir.Node | None:
        """The producer of ``v`` when it is one of ``ops`` (default domain) and ``v`` is computed in this kernel
        (neither read from a buffer nor bound to a template's result), else None."""
        f = v.producer()
        if f is None or f.op_type not in ops or f.domain not in ("", "ai.onnx") or v in self.buffers or v in self.bound:
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
        """(``dlcc_erf1pf`` or ``dlcc_tanh1pf``, x) when ``node`` is Add(Erf(x), 1) or Add(Tanh(x), 1) (either order)
        on float32 of one shape, the Erf or Tanh computed in this kernel: GELU's factor, where the sum with 1 keeps
        only the function's absolute accuracy, which the one-piece rational of codegen/vmath.py gives at less than
        half the cost. Else None."""
        if not ONE_PLUS or not self._float32_pair(node):
            return None
        for g, c in (node.inputs, node.inputs[::-1]):
            f = self._computed_here(g, ("Erf", "Tanh"))
            one = self.const_of(c)
            if (f is not None and one is not None and one.size == 1 and float(one.reshape(-1)[0]) == 1.0
                    and value_shape(g) == value_shape(node.outputs[0])):
                return ("dlcc_erf1pf" if f.op_type == "Erf" else "dlcc_tanh1pf"), f.inputs[0]
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
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    return op in ELEMENTWISE or op in INDEXED


def _trivial(expr: str) -> bool:
    return expr.replace("_", "").isalnum() or expr.replace(".", "").replace("f", "").lstrip("(-").rstrip(")").isdigit()


# ----------------------------------------------------------------------------------------- elementwise

def _unary(op: str, fmt: str) -> None:
    ELEMENTWISE[op] = lambda node, a, t, fmt=fmt: fmt.format(x=a[0])


for _op, _fmt in {
    # codegen/vmath.py: vectorizable, within 2 ulp (libm calls keep the loop scalar). Its tanh keeps
    # |tanh(x)| <= |x| near 0, which glibc tanhf breaks (1 ulp off: flips x <= tanh(x)).
    "Sigmoid": "dlcc_sigmoidf({x})",
    "Tanh": "dlcc_tanhf({x})",
    "Exp": "dlcc_expf({x})",
    "Log": "dlcc_logf({x})",
    "Sqrt": "sqrtf({x})",
    "Reciprocal": "(1.0f / ({x}))",
    "Erf": "dlcc_erff({x})",
    "Floor": "floorf({x})",
    "Ceil": "ceilf({x})",
    "Round": "nearbyintf({x})",
    "Softplus": "dlcc_softplus({x})",
    "Softsign": "(({x}) / (1.0f + fabsf({x})))",
    "Mish": "dlcc_mish({x})",
    "Sin": "sinf({x})",
    "Cos": "cosf({x})",
    "Not": "(!({x}))",
    "HardSwish": "dlcc_hardswish({x})",
}.items():
    _unary(_op, _fmt)


def _is_float(t: str) -> bool:
    return t in ("float32", "float64")


ELEMENTWISE["Identity"] = lambda node, a, t: a[0]
ELEMENTWISE["Dropout"] = lambda node, a, t: a[0]
ELEMENTWISE["Relu"] = lambda node, a, t: f"dlcc_relu({a[0]})" if _is_float(t[0]) else f"dlcc_max_i({a[0]}, 0)"
ELEMENTWISE["Abs"] = lambda node, a, t: f"fabsf({a[0]})" if _is_float(t[0]) else f"dlcc_abs_i({a[0]})"
ELEMENTWISE["Neg"] = lambda node, a, t: f"(-({a[0]}))"
ELEMENTWISE["Sign"] = lambda node, a, t: (
    f"dlcc_sign({a[0]})" if _is_float(t[0]) else f"((({a[0]}) > 0) - (({a[0]}) < 0))")
ELEMENTWISE["LeakyRelu"] = lambda node, a, t: f"dlcc_leaky({a[0]}, {c_float(_attr(node, 'alpha', 0.01))})"
ELEMENTWISE["PRelu"] = lambda node, a, t: f"dlcc_leaky({a[0]}, {a[1]})"
ELEMENTWISE["Elu"] = lambda node, a, t: f"dlcc_elu({a[0]}, {c_float(_attr(node, 'alpha', 1.0))})"
ELEMENTWISE["Celu"] = lambda node, a, t: f"dlcc_celu({a[0]}, {c_float(_attr(node, 'alpha', 1.0))})"
ELEMENTWISE["Selu"] = lambda node, a, t: (
    f"dlcc_selu({a[0]}, {c_float(_attr(node, 'alpha', 1.67326319217681884765625))}, "
    f"{c_float(_attr(node, 'gamma', 1.05070102214813232421875))})")
ELEMENTWISE["HardSigmoid"] = lambda node, a, t: (
    f"dlcc_hardsigmoid({a[0]}, {c_float(_attr(node, 'alpha', 0.2))}, {c_float(_attr(node, 'beta', 0.5))})")
ELEMENTWISE["Gelu"] = lambda node, a, t: (
    f"dlcc_gelu_tanh({a[0]})" if _attr(node, "approximate", "none") == "tanh" else f"dlcc_gelu({a[0]})")


def _clip(node: ir.Node, a: list[str], t: list[str]) -> str:
    # Absent bounds default to numeric_limits lowest()/max() (spec): a float clip maps +-inf to -+FLT_MAX.
    x = a[0]
    fl = _is_float(t[0])
    lo = a[1] if len(a) > 1 and a[1] else (c_float(_attr(node, "min")) if _attr(node, "min") is not None else None)
    hi = a[2] if len(a) > 2 and a[2] else (c_float(_attr(node, "max")) if _attr(node, "max") is not None else None)
    if fl:
        lo = "(-FLT_MAX)" if lo is None else lo
        hi = "FLT_MAX" if hi is None else hi
    if lo is not None:
        x = f"dlcc_max({x}, {lo})" if fl else f"dlcc_max_i({x}, {lo})"
    if hi is not None:
        x = f"dlcc_min({x}, {hi})" if fl else f"dlcc_min_i({x}, {hi})"
    return x


ELEMENTWISE["Clip"] = _clip


def _cast(node: ir.Node, a: list[str], t: list[str]) -> str:
    # Float -> int out of range (and NaN, +-inf) gives INT64_MIN / INT32_MIN like onnxruntime and numpy on
    # x86 (the "integer indefinite" of cvttss2si); 8-bit targets convert through int32 and wrap, as there.
    to = ir.DataType(_attr(node, "to"))
    try:
        target = np.dtype(to.numpy()).name
    except Exception:  # noqa: BLE001  (string, float8, 4-bit types: no numpy dtype)
        target = to.name
    if target not in CTYPES:
        raise TemplateError(f"Cast to {to.name} is not supported by the C backend")
    if target == "bool":
        return f"(({a[0]}) != 0)"
    if _is_float(t[0]) and not _is_float(target):
        pre = "dlcc_d2i" if t[0] == "float64" else "dlcc_f2i"
        if target == "int64":
            return f"{pre}_int64_t({a[0]})"
        return f"(({ctype(target)}){pre}_int32_t({a[0]}))"
    return f"(({ctype(target)})({a[0]}))"


ELEMENTWISE["Cast"] = _cast


def _binary(op: str, ffmt: str, ifmt: str | None = None) -> None:
    def fn(node, a, t, ffmt=ffmt, ifmt=ifmt):
        fmt = ffmt if (_is_float(t[0]) or ifmt is None) else ifmt
        return fmt.format(a=a[0], b=a[1])
    ELEMENTWISE[op] = fn


_binary("Add", "(({a}) + ({b}))")
_binary("Sub", "(({a}) - ({b}))")
_binary("Mul", "(({a}) * ({b}))")
_binary("Div", "(({a}) / ({b}))", "dlcc_div_i({a}, {b})")
_binary("Pow", "dlcc_pow({a}, {b})")
_binary("Equal", "(({a}) == ({b}))")
_binary("Less", "(({a}) < ({b}))")
_binary("Greater", "(({a}) > ({b}))")
_binary("LessOrEqual", "(({a}) <= ({b}))")
_binary("GreaterOrEqual", "(({a}) >= ({b}))")
_binary("And", "(({a}) && ({b}))")
_binary("Or", "(({a}) || ({b}))")
_binary("Xor", "((!!({a})) ^ (!!({b})))")


def _const_scalar(v) -> float | None:
    if v is None or v.const_value is None or v.const_value.size != 1:
        return None
    return float(v.const_value.numpy().reshape(-1)[0])


def _pow(node, a, t):
    e = _const_scalar(node.inputs[1]) if _is_float(t[0]) and len(node.inputs) > 1 else None
    if e in (2.0, 3.0):  # x * x (* x), as onnxruntime computes these two: the loop stays vectorizable
        return f"(({a[0]}) * ({a[0]}))" if e == 2.0 else f"((({a[0]}) * ({a[0]})) * ({a[0]}))"
    if not _is_float(t[0]):
        if _is_float(t[1]):  # int base, float exponent: computed in double, truncated (as onnxruntime)
            d2i = "dlcc_d2i_int64_t" if t[0] == "int64" else f"({ctype(t[0])})dlcc_d2i_int32_t"
            return f"{d2i}(pow((double)({a[0]}), (double)({a[1]})))"
        return f"dlcc_pow_i({a[0]}, {a[1]})"
    return f"dlcc_pow({a[0]}, (float)({a[1]}))"


ELEMENTWISE["Pow"] = _pow


def _mod(node, a, t):
    if _attr(node, "fmod", 0):
        return f"fmodf({a[0]}, {a[1]})" if _is_float(t[0]) else f"dlcc_fmod_i({a[0]}, {a[1]})"
    return f"dlcc_mod_f({a[0]}, {a[1]})" if _is_float(t[0]) else f"dlcc_mod_i({a[0]}, {a[1]})"


ELEMENTWISE["Mod"] = _mod


def _variadic(fname_f: str, fname_i: str):
    def fn(node, a, t):
        f = fname_f if _is_float(t[0]) else fname_i
        args = [x for x in a if x]
        out = args[0]
        for x in args[1:]:
            out = f"{f}({out}, {x})"
        return out
    return fn


ELEMENTWISE["Max"] = _variadic("dlcc_max", "dlcc_max_i")
ELEMENTWISE["Min"] = _variadic("dlcc_min", "dlcc_min_i")
ELEMENTWISE["Sum"] = lambda node, a, t: "(" + " + ".join(f"({x})" for x in a if x) + ")"
ELEMENTWISE["Mean"] = lambda node, a, t: (
    "((" + " + ".join(f"({x})" for x in a if x) + f") * {c_float(1.0 / len([x for x in a if x]))})")


def _where(node, a, t):
    # Both branches are evaluated into locals before the select: a plain `c ? x[i] : y[i]` makes the loads
    # conditional, and GCC 12 (-O3, x86 masked loads: SSE2 to AVX-512) miscompiles such loops when they sit
    # in a nest with small constant trip counts (wrong elements picked; tests/fuzz/test_differential.py).
    # Unconditional loads are also what the vectorizer wants: a blend instead of masked loads.
    ct = ctype(t[1])
    return (f"({{ const {ct} dlcc_wx_ = ({a[1]}); const {ct} dlcc_wy_ = ({a[2]}); "
            f"({a[0]}) ? dlcc_wx_ : dlcc_wy_; }})")


ELEMENTWISE["Where"] = _where


# --------------------------------------------------------------------------- per-channel (indexed) ops

def _batchnorm(gen: ExprGen, node: ir.Node, out_index: int, idx: list[str], stmts) -> str:
    if out_index != 0 or _attr(node, "training_mode", 0):
        raise TemplateError("BatchNormalization in training mode (outputs 1-2 used) is not supported by the C backend")
    x, scale, bias, mean, var = node.inputs[:5]
    if not _attr(node, "spatial", 1) and len(value_shape(scale)) != 1:
        raise TemplateError("BatchNormalization with spatial=0 (per-element params) is not supported by the C backend")
    eps = float(_attr(node, "epsilon", 1e-5))
    c = [idx[1]] if len(idx) > 1 else ["0"]
    consts = [gen.const_of(v) for v in (scale, bias, mean, var)]
    xe = gen.at(x, idx, stmts)
    if all(k is not None for k in consts):
        s, b, m, va = (k.astype(np.float64).reshape(-1) for k in consts)
        mul = (s / np.sqrt(va + eps)).astype(np.float32)
        add = (b - m * mul.astype(np.float64)).astype(np.float32)
        if mul.size == 1:
            return f"(({xe}) * {c_float(mul[0])} + {c_float(add[0])})"
        # Per-channel tables as static arrays in GNU statement expressions (valid in expression-only mode
        # too): a block-scope compound literal would be re-stored to the stack on every element.
        tables = []
        for prefix, vals in (("bnm", mul), ("bna", add)):
            name = gen.names(prefix)
            tables.append(f"({{ static const float {name}[{vals.size}] = {{{', '.join(c_float(v) for v in vals)}}}; "
                          f"{name}[{c[0]}]; }})")
        return f"(({xe}) * {tables[0]} + {tables[1]})"
    se, be, me, ve = (gen.at(v, c, stmts) for v in (scale, bias, mean, var))
    return f"((({xe}) - ({me})) * ({se}) / sqrtf(({ve}) + {c_float(eps)}) + ({be}))"


INDEXED["BatchNormalization"] = _batchnorm

# The C helpers the expressions above call; emitted once at the top of every generated file, after the
# vectorizable math of codegen/vmath.py (dlcc_expf, dlcc_erff, ...) they and the templates call.
_HELPERS = r"""
/* max/min, a NaN in either operand propagating, as a select of bits on a mask of two comparisons: no
   branch even where the compiler leaves a loop scalar (GCC turned `(a > b || a != a) ? a : b`, and
   plain float ternaries, into branches in fully unrolled short loops, mispredicted on data that
   saturates a Clip: MobileNetV2's 7x7 1x1 convolutions ran 3x slower) */
static inline float dlcc_pick(float a, float b, int take_b) {
    uint32_t ia, ib, m = -(uint32_t)take_b; float f; memcpy(&ia, &a, 4); memcpy(&ib, &b, 4);
    ia = (ib & m) | (ia & ~m); memcpy(&f, &ia, 4); return f;
}
static inline float dlcc_max(float a, float b) { return dlcc_pick(a, b, (a <= b) | (b != b)); }
static inline float dlcc_min(float a, float b) { return dlcc_pick(a, b, (a >= b) | (b != b)); }
static inline int64_t dlcc_max_i(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t dlcc_min_i(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t dlcc_abs_i(int64_t a) { return a < 0 ? -a : a; }
static inline float dlcc_relu(float x) { return dlcc_pick(x, 0.0f, x < 0.0f); }  /* NaN propagates */
static inline float dlcc_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
static inline float dlcc_leaky(float x, float a) { return dlcc_pick(a * x, x, x >= 0.0f); }
static inline float dlcc_softplus(float x) {  /* max(x, 0) + log1p(exp(-|x|)); NaN propagates */
    return (x > 0.0f ? x : 0.0f) + dlcc_log1pf(dlcc_expf(-fabsf(x)));
}
static inline float dlcc_mish(float x) { return x * dlcc_tanhf(dlcc_softplus(x)); }
static inline float dlcc_hardsigmoid(float x, float a, float b) {
    float y = a * x + b; return dlcc_pick(dlcc_pick(y, 1.0f, y > 1.0f), 0.0f, y < 0.0f);
}
static inline float dlcc_hardswish(float x) { return x * dlcc_hardsigmoid(x, 1.0f / 6.0f, 0.5f); }
static inline float dlcc_elu(float x, float a) { return x >= 0.0f ? x : a * dlcc_expm1f(x); }
static inline float dlcc_celu(float x, float a) { return x < 0.0f ? a * dlcc_expm1f(x / a) : x; }
static inline float dlcc_selu(float x, float a, float g) { return x > 0.0f ? g * x : g * (a * dlcc_expm1f(x)); }
static inline float dlcc_gelu(float x) { return 0.5f * x * dlcc_erf1pf(x * 0.70710678118654752f); }
static inline float dlcc_gelu_tanh(float x) {
    return 0.5f * x * dlcc_tanh1pf(0.79788456080286536f * (x + 0.044715f * x * x * x));
}
static inline float dlcc_pow(float a, float b) {
    if (b == 2.0f) return a * a;
    if (b == 1.0f) return a;
    if (b == 0.5f && a != -INFINITY) return sqrtf(a) + 0.0f;  /* powf: +0 for -0, +inf for -inf */
    return powf(a, b);
}
static inline int64_t dlcc_pow_i(int64_t a, int64_t b) {
    int64_t r = 1;
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
static inline int64_t dlcc_div_i(int64_t a, int64_t b) { return b == 0 ? 0 : a / b; }
static inline int64_t dlcc_fmod_i(int64_t a, int64_t b) { return b == 0 ? 0 : a % b; }
static inline int64_t dlcc_mod_i(int64_t a, int64_t b) {
    if (b == 0) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline float dlcc_mod_f(float a, float b) {
    float r = fmodf(a, b);
    if (r == 0.0f) return copysignf(0.0f, b);
    return ((r < 0.0f) != (b < 0.0f)) ? r + b : r;
}
/* float -> int: out of range, NaN and +-inf give the minimum (x86 cvtt* "integer indefinite", as
   onnxruntime and numpy produce there); defined C, unlike a bare out-of-range cast. */
static inline int64_t dlcc_f2i_int64_t(float x) {
    return (x >= -9.2233720368547758e18f && x < 9.2233720368547758e18f) ? (int64_t)x : INT64_MIN;
}
static inline int32_t dlcc_f2i_int32_t(float x) {
    return (x >= -2147483648.0f && x < 2147483648.0f) ? (int32_t)x : INT32_MIN;
}
static inline int64_t dlcc_d2i_int64_t(double x) {
    return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (int64_t)x : INT64_MIN;
}
static inline int32_t dlcc_d2i_int32_t(double x) {
    return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : INT32_MIN;
}
static inline int8_t dlcc_f2i_int8_t(float x) { return (int8_t)dlcc_f2i_int32_t(x); }
static inline uint8_t dlcc_f2i_uint8_t(float x) { return (uint8_t)dlcc_f2i_int32_t(x); }
"""

c_helper("expr", VMATH_C + _HELPERS)

del math
