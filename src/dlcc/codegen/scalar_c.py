"""The C of the loop IR's scalar functions (``dlcc.lower.scalar``): small named C functions, emitted once at the top
of every generated file after the vectorizable math of ``dlcc.codegen.vmath`` (dlcc_expf, dlcc_erff, ...) they and
the templates call, and ``SCALAR_C``: each function's C, a name or a format of its arguments (``{0}``, ``{1}``;
``{T}``: the C type of the result), which ``dlcc.codegen.lir_c`` prints.
"""

from __future__ import annotations

from dlcc.codegen.cbase import c_helper
from dlcc.codegen.vmath import C_TEXT as VMATH_C

__all__ = ["SCALAR_C"]

SCALAR_C: dict[str, str] = {
    "relu": "dlcc_relu", "leaky": "dlcc_leaky", "elu": "dlcc_elu", "celu": "dlcc_celu", "selu": "dlcc_selu",
    "hardsigmoid": "dlcc_hardsigmoid", "hardswish": "dlcc_hardswish", "gelu": "dlcc_gelu",
    "gelu_tanh": "dlcc_gelu_tanh", "softplus": "dlcc_softplus", "softsign": "(({0}) / (1.0f + fabsf({0})))",
    "mish": "dlcc_mish", "erf": "dlcc_erff", "erf1p": "dlcc_erf1pf", "tanh1p": "dlcc_tanh1pf", "silu": "dlcc_siluf",
    "sin": "sinf", "cos": "cosf", "floor": "floorf", "ceil": "ceilf", "round": "nearbyintf", "sign": "dlcc_sign",
    "neg": "(-({0}))", "reciprocal": "(1.0f / ({0}))", "fmax": "dlcc_max", "fmin": "dlcc_min", "fpow": "dlcc_pow",
    "fmod": "fmodf", "mod": "dlcc_mod_f", "dpow": "pow",
    "sign_i": "((({0}) > 0) - (({0}) < 0))", "not": "(!({0}))", "xor": "((!!({0})) ^ (!!({1})))",
    "max_i": "dlcc_max_i", "min_i": "dlcc_min_i", "abs_i": "dlcc_abs_i", "div_i": "dlcc_div_i", "mod_i": "dlcc_mod_i",
    "fmod_i": "dlcc_fmod_i", "pow_i": "dlcc_pow_i",
    "f2i64": "dlcc_f2i_int64_t", "f2i32": "dlcc_f2i_int32_t", "d2i64": "dlcc_d2i_int64_t", "d2i32": "dlcc_d2i_int32_t",
    # both values into locals before the choice: a plain `c ? x[i] : y[i]` makes the loads conditional, and GCC 12
    # (-O3, x86 masked loads: SSE2 to AVX-512) miscompiles such loops when they sit in a nest with small constant
    # trip counts (wrong elements picked; tests/fuzz/test_differential.py). Unconditional loads are also what the
    # vectorizer wants: a blend instead of masked loads.
    "select": "({{ const {T} dlcc_wx_ = ({1}); const {T} dlcc_wy_ = ({2}); ({0}) ? dlcc_wx_ : dlcc_wy_; }})",
    "clamp_idx": "dlcc_clamp_idx", "edge_idx": "dlcc_edge_idx", "wrap_idx": "dlcc_wrap_idx",
    "reflect_idx": "dlcc_reflect_idx",
}

# The C helpers SCALAR_C names
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

_INDEX_HELPERS = r"""
static inline int64_t dlcc_clamp_idx(int64_t j, int64_t n) {
    j = j < 0 ? j + n : j; return j < 0 ? 0 : (j >= n ? n - 1 : j);
}
static inline int64_t dlcc_edge_idx(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
static inline int64_t dlcc_wrap_idx(int64_t i, int64_t n) { int64_t r = i % n; return r < 0 ? r + n : r; }
static inline int64_t dlcc_reflect_idx(int64_t i, int64_t n) {
    if (n <= 1) return 0;
    int64_t p = 2 * n - 2, r = i % p; r = r < 0 ? r + p : r; return r >= n ? p - r : r;
}
"""

c_helper("expr", VMATH_C + _HELPERS + _INDEX_HELPERS)
