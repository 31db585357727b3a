"""The scalar functions the loop-level kernel IR may call (``lir.Call``), beyond its float32 math: the
activations, integer helpers, conversions and index maps of elementwise and injective ops.

What goes in: nothing (tables). What comes out: ``SCALAR_FUNCTIONS[name] = (arity, reference)``, the numpy
reference the interpreter runs (C semantics: float32 arithmetic, NaN propagating where the C propagates it,
integer division by zero giving 0), and ``INDEX_FUNCTIONS[name](intervals) -> interval``: the bounds of an index
function's result, which the verifier takes as an index's (so a clamped data-dependent index is in bounds). Their
C forms are codegen's (``dlcc.codegen.lir_c.C_CALLS``: small named C functions of ``dlcc.codegen.scalar_c`` and
``dlcc.codegen.vmath``), each tested against its reference (tests/lower/test_element.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["INDEX_FUNCTIONS", "SCALAR_FUNCTIONS", "reflect_index"]

f32 = np.float32


def _pick(cond: bool, a, b):
    return a if cond else b


def _erf(x):
    return f32(math.erf(float(x))) if math.isfinite(float(x)) else f32(np.sign(x) if not np.isnan(x) else x)


def _sigmoid(x):
    return f32(1.0 / (1.0 + np.exp(-np.float64(x))))


def _softplus(x):
    x = np.float64(x)
    return f32(max(x, 0.0) + np.log1p(np.exp(-abs(x)))) if not np.isnan(x) else f32(x)


def _hardsigmoid(x, a, b):
    y = f32(f32(a) * f32(x) + f32(b))
    return f32(y) if np.isnan(y) else f32(min(max(y, 0.0), 1.0))


def _gelu(x):  # (-inf: -inf * 0, NaN, as the C's x * (1 + erf(x / sqrt 2)))
    return f32(0.5 * np.float64(x) * (1.0 + math.erf(np.float64(x) / math.sqrt(2.0)))) if np.isfinite(x) else (
        f32(x) if x > 0 or np.isnan(x) else f32(np.nan))


def _gelu_tanh(x):
    x = np.float64(x)
    if not np.isfinite(x):
        return f32(x) if x > 0 or np.isnan(x) else f32(np.nan)
    return f32(0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))))


def _cpow(a, b):
    """C's pow (C99 Annex F: pow(-inf, 0.5) is +inf, numpy's NaN), in the type of ``a``."""
    try:
        return type(a)(math.pow(float(a), float(b)))
    except ValueError:  # (a negative base and a fractional exponent: NaN; zero and a negative one: a pole)
        if a == 0:
            odd = float(b).is_integer() and int(b) % 2 == 1
            return type(a)(math.copysign(math.inf, float(a)) if odd else math.inf)
        return type(a)(math.nan)
    except OverflowError:
        return np.power(a, type(a)(b))


def _fmax(a, b):
    return b if (a <= b or b != b) else a


def _fmin(a, b):
    return b if (a >= b or b != b) else a


def _mod_f(a, b):
    r = np.fmod(a, b)
    if r == 0:
        return np.copysign(type(r)(0), b)
    return r + b if (r < 0) != (b < 0) else r


def _div_i(a, b):
    return 0 if b == 0 else int(a / b) if (a < 0) != (b < 0) else a // b


def _fmod_i(a, b):
    return 0 if b == 0 else int(math.fmod(a, b))


def _mod_i(a, b):
    if b == 0:
        return 0
    r = int(math.fmod(a, b))
    return r + b if r != 0 and (r < 0) != (b < 0) else r


def _pow_i(a, b):
    if b < 0:
        return 1 if a == 1 else ((-1 if b & 1 else 1) if a == -1 else 0)
    r = 1
    a, b = int(a), int(b)
    while b:
        if b & 1:
            r = _wrap64(r * a)
        a, b = _wrap64(a * a), b >> 1
    return r


def _wrap64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _f2i(lo: float, hi: float, minimum: int):
    def f(x):
        x = float(x)
        return int(x) if lo <= x < hi else minimum
    return f


def reflect_index(i: int, n: int) -> int:
    """Index ``i`` reflected into ``[0, n)`` (Pad's reflect mode, without repeating the edge)."""
    if n <= 1:
        return 0
    p = 2 * n - 2
    r = i % p
    return p - r if r >= n else r


SCALAR_FUNCTIONS: dict[str, tuple[int, Callable]] = {
    # float activations (float32; C: dlcc.codegen.scalar_c)
    "relu": (1, lambda x: x if not x < 0 else type(x)(0)),
    "leaky": (2, lambda x, a: x if x >= 0 else a * x),
    "elu": (2, lambda x, a: x if x >= 0 else a * np.expm1(x)),
    "celu": (2, lambda x, a: a * np.expm1(x / a) if x < 0 else x),
    "selu": (3, lambda x, a, g: g * x if x > 0 else g * (a * np.expm1(x))),
    "hardsigmoid": (3, _hardsigmoid),
    "hardswish": (1, lambda x: f32(x * _hardsigmoid(x, f32(1 / 6), f32(0.5)))),
    "gelu": (1, _gelu),
    "gelu_tanh": (1, _gelu_tanh),
    "softplus": (1, _softplus),
    "softsign": (1, lambda x: x / (1 + abs(x))),
    "mish": (1, lambda x: f32(x * np.tanh(np.float64(_softplus(x))))),
    "erf": (1, _erf),
    "erf1p": (1, lambda x: f32(1.0 + _erf(x))),
    "tanh1p": (1, lambda x: f32(1.0 + np.tanh(x))),
    "silu": (1, lambda x: f32(x * _sigmoid(x))),
    "sin": (1, np.sin),
    "cos": (1, np.cos),
    "floor": (1, np.floor),
    "ceil": (1, np.ceil),
    "round": (1, np.rint),
    "sign": (1, lambda x: type(x)(1) if x > 0 else (type(x)(-1) if x < 0 else x)),
    "neg": (1, lambda x: -x),
    "reciprocal": (1, lambda x: type(x)(1) / x),
    "fmax": (2, _fmax),
    "fmin": (2, _fmin),
    "fpow": (2, lambda a, b: _cpow(a, b)),
    "fmod": (2, np.fmod),
    "mod": (2, _mod_f),
    "dpow": (2, lambda a, b: _cpow(np.float64(a), np.float64(b))),
    # integers and truth values (computed in int64, C's int64_t helpers)
    "sign_i": (1, lambda x: int(x > 0) - int(x < 0)),
    "not": (1, lambda x: int(not x)),
    "xor": (2, lambda a, b: int(bool(a) != bool(b))),
    "max_i": (2, max),
    "min_i": (2, min),
    "abs_i": (1, abs),
    "div_i": (2, _div_i),
    "mod_i": (2, _mod_i),
    "fmod_i": (2, _fmod_i),
    "pow_i": (2, _pow_i),
    # float -> int: out of range, NaN and infinities give the type's minimum (x86's "integer indefinite")
    "f2i64": (1, _f2i(-9.2233720368547758e18, 9.2233720368547758e18, -(2**63))),
    "f2i32": (1, _f2i(-2147483648.0, 2147483648.0, -(2**31))),
    "d2i64": (1, _f2i(-9223372036854775808.0, 9223372036854775808.0, -(2**63))),
    "d2i32": (1, _f2i(-2147483649.0, 2147483648.0, -(2**31))),
    # both values evaluated, then one chosen (no load depends on the condition)
    "select": (3, lambda c, a, b: a if c else b),
    # index maps (int64): into [0, n)
    "clamp_idx": (2, lambda j, n: min(max(j + n if j < 0 else j, 0), n - 1)),
    "edge_idx": (2, lambda i, n: min(max(i, 0), n - 1)),
    "wrap_idx": (2, lambda i, n: i % n),
    "reflect_idx": (2, reflect_index),
}


def _below(ivs):
    return 0, max(ivs[1][1] - 1, 0)  # (n: a constant in practice)


INDEX_FUNCTIONS: dict[str, Callable[[list[tuple[int, int]]], tuple[int, int]]] = {
    "clamp_idx": _below,
    "edge_idx": _below,
    "wrap_idx": _below,
    "reflect_idx": _below,
    "max_i": lambda ivs: (max(ivs[0][0], ivs[1][0]), max(ivs[0][1], ivs[1][1])),
    "min_i": lambda ivs: (min(ivs[0][0], ivs[1][0]), min(ivs[0][1], ivs[1][1])),
    "select": lambda ivs: (min(ivs[1][0], ivs[2][0]), max(ivs[1][1], ivs[2][1])),
}
