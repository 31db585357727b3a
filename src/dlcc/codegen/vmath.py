"""Vectorizable float32 math: exp, expm1, log, log1p, erf, tanh and sigmoid as branchless C that GCC -O3
auto-vectorizes when it is inlined in a loop (libm's expf/erff/tanh calls keep a loop scalar).

What goes in: nothing at run time; ``C_TEXT`` is C source (``static inline``, always inlined) that every
generated file's prelude holds (registered as a C helper by ``dlcc.codegen.scalar_c``, ahead of the helpers
that call it). It needs <stdint.h>, <string.h> (memcpy for the bit casts) and <math.h> (INFINITY, NAN).
What comes out: ``dlcc_expf``, ``dlcc_expm1f``, ``dlcc_logf``, ``dlcc_log1pf``, ``dlcc_erff``,
``dlcc_tanhf``, ``dlcc_sigmoidf``: float -> float, IEEE special values as libm gives them (NaN in ->
NaN out; exp(+-inf) = inf/0, log(0) = -inf, log(x < 0) = NaN, erf/tanh(+-inf) = +-1, sigmoid(+-inf)
= 1/0), overflow to inf and gradual underflow (subnormal results are computed, not flushed).

Method: only float arithmetic, integer operations on the bit pattern and comparisons; every special case
and every range is computed and picked with a ternary select on computed values, which GCC if-converts
into blends (no early return, no libm call, no fmaf: the code is as fast on SSE2 without FMA, and
-ffp-contract=fast fuses what it can where there is FMA).
- exp: Cody-Waite reduction x = n ln2 + r (n = round(x / ln2) by the 1.5 * 2^23 shifter, whose bit
  pattern then holds n; ln2 split in a 15-bit hi part, so n * hi and x - n * hi are exact, and a lo
  part), exp(r) = 1 + r + r^2 P(r) with P of degree 4 on |r| <= ln2/2, the sum 1 + r kept as an exact
  hi + lo pair (Fast2Sum) so that only the final addition rounds; the scaling by 2^n goes through two
  multiplications by 2^(n/2) built in the exponent field, which gives inf past 88.72 and the
  subnormals below -87.34 without a branch (x is clamped to [-104, 89] first; NaN passes the clamps).
- expm1: the same reduction, then 2 * (2^(n-1) (hi + lo) - 1/2) with the exact subtraction done first.
- log: x = 2^k m with m in [sqrt(1/2), sqrt(2)) by integer arithmetic on the bits (subnormals scaled by
  2^23 first), log(1 + f) = f + f^2 Q(f) with Q of degree 9 on f = m - 1 (exact), and k ln2 + f summed
  as an exact pair. log1p: w = 1 + x and its exact rounding error c (1 + x = w + c), log(w) as above
  plus the first-order c / w.
- erf: x + x P(x^2) (P of degree 6) for |x| < 0.921875; above, 1 - exp(Q(|x|)) with Q of degree 7 a fit
  of log(erfc) on [0.921875, 4] (|x| clamped to 4, where erf rounds to 1), sign copied from x; that exp is
  ``dlcc_vm_expneg`` (Q is in [-17.9, -1.6]; an error of 1 ulp in exp(Q) <= 0.19 is 0.2 ulp of erf): GELU's
  erf costs 30% less.
- tanh: x + x^3 P(x^2) (P of degree 5) for |x| < 0.625: P < 0 there, so |tanh(x)| <= |x| (libm's tanhf
  breaks that near 0) and tanh(x) == x for tiny x; above, 1 - 2 / (1 + exp(2|x|)) with exp as an exact
  hi + lo pair and 1 + exp(2|x|) as another, one division and a first-order correction (|x| clamped to
  9.5, where tanh rounds to 1).
- sigmoid: e = exp(-|x|) (hi + lo pair, <= 1, never overflows), then 1 / (1 + e) for x >= 0 and
  e / (1 + e) for x < 0 with one division and the same correction.

Coefficients: minimax fits in float64 (Lawson's iteratively reweighted least squares on 40001 Chebyshev
points of the interval, relative error of the function as the weight; references numpy.expm1/log1p/tanh
and math.erf/erfc), rounded to float32 one at a time from the lowest degree with the higher ones refitted
after each rounding. Their approximation errors (before float evaluation): exp 0.052 ulp, log 0.013,
erf 0.015 (small) and 0.0007 (large), tanh 0.005 (p(0) fixed to -1/3).

Accuracy (max error in ulp of the float32 result against the float64 function, over every 17th float32
bit pattern and every float in [-12, -0.125] and [0.125, 12], for x86-64 with AVX-512 and FMA, x86-64
SSE2 without FMA, and aarch64 under qemu): exp 0.78 (subnormal results near -87.7), expm1 1.16 (near
0.347), log 0.90 (near 0.70), log1p 1.19 (near 0.28), erf 1.34 (near 1.06 on SSE2; 1.07 with FMA;
1.20 and 1.10 on the coarser sweep of the test since its exp is dlcc_vm_expneg),
tanh 1.02 (near 0.77), sigmoid 1.16 (near -5.15). tests/codegen/test_vmath.py holds them to 2 ulp.

``dlcc_siluf`` is SiLU (x * sigmoid(x), which ``lower.element`` emits as this one call): x / (1 + exp(-x))
from one reduction of -x with the numerator scaled exactly and the denominator rounded once; within 2 ulp
for x >= -87.3 (every float32: 1.71 ulp near -46.8 with AVX-512, 1.70 with AVX2, 1.69 on SSE2 without FMA,
every 3rd float for the last two), -0 below (the exact result is above -1.1e-36 there), at 0.18 ns per
element (0.20 with the clamps on -x: GCC then needs more mask operations) against 0.41 for
x * dlcc_sigmoidf(x), whose error reaches 2.35 ulp (near -1.91) and 47 ulp below -87 (Zen 5, AVX-512, a
loop over 4096 floats in L1).

``dlcc_erf1pf`` and ``dlcc_tanh1pf`` are 1 + erf(x) and 1 + tanh(x), GELU's factor in its two exported forms
(``lower.element`` emits them for Add(Erf(x), 1), Add(Tanh(x), 1) and the Gelu op). The sum with 1 keeps only the
function's absolute accuracy, so each is one rational x P(x^2) / Q(x^2) (erf: degrees 4 and 6 in x^2 on |x| <=
3.92; tanh: 3 and 5 on |x| <= 9; fitted as the others, on 20000 points, Q > 0 there) on the clamped argument,
with no exp and no second range: absolute error below 3.6e-7 (test_vmath.py holds it to 4e-7, and to 4 ulp of
the sum for x >= 0), at 0.56 ns per element of a GELU against 1.3 for 1 + dlcc_erff (Zen 3, AVX2, 3136 x 384
floats). Where 1 + erf(x) is small (x < -2) the error is large relative to it, never to the GELU's scale.

``dlcc_vm_expneg`` is exp for a softmax's x - max <= 0 (attention, Softmax, LogSoftmax, ReduceLogSumExp):
the same reduction and polynomial with one rounding more (1 + (r + r^2 p)) and one scaling; 0 where the
result would be subnormal. Within 2 ulp on [-87.33, 88] (test_vmath.py).
"""

from __future__ import annotations

__all__ = ["C_TEXT", "FUNCTIONS"]

FUNCTIONS = ("dlcc_expf", "dlcc_expm1f", "dlcc_logf", "dlcc_log1pf", "dlcc_erff", "dlcc_tanhf", "dlcc_sigmoidf")
"""The float -> float functions ``C_TEXT`` defines (the rest are internal: ``dlcc_vm_*``)."""

C_TEXT = r"""
/* ---- dlcc vector math (dlcc/codegen/vmath.py): branchless float32, within 2 ulp, vectorizable ---- */
#define DLCC_VM_FN static inline __attribute__((always_inline))
DLCC_VM_FN uint32_t dlcc_vm_f2u(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
DLCC_VM_FN float dlcc_vm_u2f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
/* c ? a : b as a select of bits (a branch where a loop stays scalar is mispredicted on mixed signs) */
DLCC_VM_FN float dlcc_vm_sel(int c, float a, float b) {
    uint32_t m = -(uint32_t)c; return dlcc_vm_u2f((dlcc_vm_f2u(a) & m) | (dlcc_vm_f2u(b) & ~m));
}
/* exp(x) = 2^n (hi + lo) for x in [-104, 89]; hi = 1 + r rounded, lo the rest */
DLCC_VM_FN float dlcc_vm_exp_core(float x, float* lo, int32_t* n) {
    float t = x * 0x1.715476p+0f + 0x1.8p23f;  /* round(x / ln2) in the low mantissa bits of t */
    float nf = t - 0x1.8p23f;
    float rh = x - nf * 0x1.62e4p-1f;          /* exact: ln2 hi has 15 bits */
    float c = nf * 0x1.7f7d1cp-20f;            /* n * ln2 lo */
    float r = rh - c;
    /* exp(r) = 1 + r + r^2 p(r) on |r| <= ln2/2: approximation error 0.052 ulp */
    float p = 0x1.fffffcp-2f + r * (0x1.555492p-3f + r * (0x1.5558acp-5f + r * (0x1.123978p-7f
              + r * 0x1.6a50aep-10f)));
    float hi = 1.0f + rh;
    *lo = ((1.0f - hi) + rh) + ((r * r) * p - c);  /* Fast2Sum: the rounding error of 1 + rh, exact */
    *n = (int32_t)(dlcc_vm_f2u(t) - 0x4b400000u);
    return hi;
}
DLCC_VM_FN float dlcc_expf(float x) {
    float xc = dlcc_vm_sel(x > 89.0f, 89.0f, x);  /* NaN passes both clamps */
    xc = dlcc_vm_sel(xc < -104.0f, -104.0f, xc);
    float lo; int32_t n;
    float hi = dlcc_vm_exp_core(xc, &lo, &n);
    int32_t n1 = n >> 1, n2 = n - n1;          /* 2^n in two normal factors: inf and subnormals */
    return (hi + lo) * dlcc_vm_u2f((uint32_t)(n1 + 127) << 23) * dlcc_vm_u2f((uint32_t)(n2 + 127) << 23);
}
/* exp(x) for x <= 88 where the result is normal, 0 below (x < -87.33: a softmax's x - max, whose sum is at
   least 1, loses nothing): one reduction, the polynomial, 1 + (r + r^2 p) and one exact scaling by 2^n (about
   half of expf's work); NaN passes */
DLCC_VM_FN float dlcc_vm_expneg(float x) {
    int under = x < -87.33f;
    float xc = dlcc_vm_sel(under, 0.0f, x);
    float t = xc * 0x1.715476p+0f + 0x1.8p23f;
    float nf = t - 0x1.8p23f;
    float r = (xc - nf * 0x1.62e4p-1f) - nf * 0x1.7f7d1cp-20f;
    float p = 0x1.fffffcp-2f + r * (0x1.555492p-3f + r * (0x1.5558acp-5f + r * (0x1.123978p-7f
              + r * 0x1.6a50aep-10f)));
    float e = 1.0f + (r + (r * r) * p);
    float y = e * dlcc_vm_u2f((uint32_t)((int32_t)(dlcc_vm_f2u(t) - 0x4b400000u) + 127) << 23);
    return dlcc_vm_sel(under, 0.0f, y);
}
/* exp(x) = hi + lo for x in [-104, 89], |lo| <= ulp(hi) / 2 where the result is normal */
DLCC_VM_FN float dlcc_vm_exp_hl(float x, float* lo) {
    float l; int32_t n;
    float hi = dlcc_vm_exp_core(x, &l, &n);
    int32_t n1 = n >> 1, n2 = n - n1;
    float s1 = dlcc_vm_u2f((uint32_t)(n1 + 127) << 23), s2 = dlcc_vm_u2f((uint32_t)(n2 + 127) << 23);
    float h = hi + l;
    *lo = ((hi - h) + l) * s1 * s2;
    return h * s1 * s2;
}
DLCC_VM_FN float dlcc_expm1f(float x) {
    float xc = dlcc_vm_sel(x > 89.0f, 89.0f, x);
    xc = dlcc_vm_sel(xc < -30.0f, -30.0f, xc);            /* expm1 rounds to -1 below -17.4 */
    float lo; int32_t n;
    float hi = dlcc_vm_exp_core(xc, &lo, &n);
    float h = dlcc_vm_u2f((uint32_t)(n + 126) << 23);  /* 2^(n-1): finite up to n = 128 */
    float a = h * hi, b = h * lo;              /* exact */
    float y = 2.0f * dlcc_vm_sel(n > 1, a + (b - 0.5f), (a - 0.5f) + b);  /* the exact subtraction first */
    return dlcc_vm_sel(__builtin_fabsf(x) < 0x1p-25f, x, y);  /* expm1(x) rounds to x: keeps -0 and subnormals */
}
/* log(w + c) for the bits iw of a normal w > 0 (times 2^-kadj) and |c| <= ulp(w) / 2 (0 unless withc) */
DLCC_VM_FN float dlcc_vm_log_core(uint32_t iw, int32_t kadj, float c, int withc) {
    uint32_t tmp = iw - 0x3f3504f3u;           /* w = 2^k m, m in [sqrt(1/2), sqrt(2)) */
    int32_t k = (int32_t)tmp >> 23;
    float f = dlcc_vm_u2f(iw - (tmp & 0xff800000u)) - 1.0f;  /* m - 1, exact */
    /* log(1 + f) = f + f^2 q(f): approximation error 0.013 ulp */
    float q = -0x1p-1f + f * (0x1.555548p-2f + f * (-0x1.000006p-2f + f * (0x1.99a478p-3f
              + f * (-0x1.555c48p-3f + f * (0x1.233b68p-3f + f * (-0x1.fc27b6p-4f + f * (0x1.e6c3p-4f
              + f * (-0x1.de0ac4p-4f + f * 0x1.147712p-4f))))))));
    float kf = (float)(k + kadj);
    float small = (f * f) * q + kf * 0x1.7f7d1cp-20f;
    int32_t ks = k > 126 ? 126 : k;
    float cm = c * dlcc_vm_u2f((uint32_t)(127 - ks) << 23);  /* c / 2^k; c / m = cm (1 - f) to first order */
    small = dlcc_vm_sel(withc, small + (cm - cm * f), small);
    float kh = kf * 0x1.62e4p-1f;              /* exact */
    float s = kh + f;
    return s + (((kh - s) + f) + small);       /* Fast2Sum: |kh| >= |f| or kh = 0 */
}
DLCC_VM_FN float dlcc_vm_log_special(float w, float y) {
    float special = dlcc_vm_sel(w == 0.0f, -INFINITY, dlcc_vm_sel(w < 0.0f, NAN, w));  /* -inf, NaN, +inf, NaN */
    return dlcc_vm_sel((w > 0.0f) & (w < INFINITY), y, special);
}
DLCC_VM_FN float dlcc_logf(float x) {
    int sub = x < 0x1p-126f;                   /* subnormals scaled by 2^23 */
    float y = dlcc_vm_log_core(dlcc_vm_f2u(dlcc_vm_sel(sub, x * 0x1p23f, x)), sub ? -23 : 0, 0.0f, 0);
    return dlcc_vm_log_special(x, y);
}
DLCC_VM_FN float dlcc_log1pf(float x) {
    float w = 1.0f + x;
    float c = x - (w - 1.0f);                  /* 1 + x = w + c exactly (w >= 2^-24 when x > -1) */
    float y = dlcc_vm_log_core(dlcc_vm_f2u(w), 0, c, 1);
    return dlcc_vm_sel(x == 0.0f, x, dlcc_vm_log_special(w, y));  /* log1p(-0) = -0 */
}
DLCC_VM_FN float dlcc_erff(float x) {
    /* |x| < 0.921875: erf(x) = x + x p(x^2), approximation error 0.015 ulp */
    float t = x * x;
    float small = x + x * (0x1.06eba8p-3f + t * (-0x1.81274p-2f + t * (0x1.ce2d64p-4f + t * (-0x1.b80112p-6f
                  + t * (0x1.544954p-8f + t * (-0x1.a5fe4ap-11f + t * 0x1.4f2db8p-14f))))));
    /* above: erf(|x|) = 1 - exp(q(|x|)), q a fit of log(erfc) on [0.921875, 4]: 0.0007 ulp of erf */
    float a = __builtin_fabsf(x);
    float ac = a > 4.0f ? 4.0f : a;            /* NaN passes */
    float q = 0x1.71ce34p-13f + ac * (-0x1.21286cp+0f + ac * (-0x1.4443dap-1f + ac * (-0x1.bb97a8p-4f
              + ac * (0x1.9bc2d4p-6f + ac * (-0x1.11ac4cp-8f + ac * (0x1.c8a568p-12f + ac * -0x1.6373aep-16f))))));
    float large = __builtin_copysignf(1.0f - dlcc_vm_expneg(q), x);  /* q in [-17.9, -1.6]: normal results */
    return a < 0.921875f ? small : large;      /* (plain ternaries: GCC's blends take 7% less than dlcc_vm_sel's) */
}
DLCC_VM_FN float dlcc_tanhf(float x) {
    /* |x| < 0.625: tanh(x) = x + x^3 p(x^2), p < 0 (so |tanh(x)| <= |x|), p(0) = -1/3 rounded (tiny x round
       like tanh), approximation error 0.005 ulp */
    float t = x * x;
    float small = x + x * (t * (-0x1.555556p-2f + t * (0x1.1110f8p-3f + t * (-0x1.ba06a2p-5f
                  + t * (0x1.647p-6f + t * (-0x1.0fe164p-7f + t * 0x1.25dd8p-9f))))));
    /* above: 1 - 2 / (1 + E), E = exp(2|x|) = eh + el >= 1, 1 + E = d + dl */
    float a = __builtin_fabsf(x);
    float ac = dlcc_vm_sel(a > 9.5f, 9.5f, a);            /* NaN passes */
    float el, eh = dlcc_vm_exp_hl(2.0f * ac, &el);
    float d = eh + 1.0f, dl = ((eh - d) + 1.0f) + el;
    float u = 2.0f / d;
    u = u - (u * dl) * (0.5f * u);             /* 2 / (d + dl) to first order */
    return __builtin_copysignf(dlcc_vm_sel(a < 0.625f, small, 1.0f - u), x);  /* small keeps the sign, but of -0 */
}
DLCC_VM_FN float dlcc_sigmoidf(float x) {
    float m = -__builtin_fabsf(x);
    m = dlcc_vm_sel(m < -104.0f, -104.0f, m);             /* NaN passes */
    float el, eh = dlcc_vm_exp_hl(m, &el);     /* e = exp(-|x|) = eh + el <= 1, 1 + e = d + dl */
    float d = 1.0f + eh, dl = ((1.0f - d) + eh) + el;
    int pos = x >= 0.0f;
    float num = dlcc_vm_sel(pos, 1.0f, eh), numl = dlcc_vm_sel(pos, 0.0f, el);
    float y = num / d;                         /* 1 / d is y for x >= 0 and 1 - y for x < 0 */
    return y + (numl - y * dl) * dlcc_vm_sel(pos, y, 1.0f - y);
}
/* 1 + erf(x) and 1 + tanh(x), GELU's factor (its erf form and its tanh form): absolute accuracy is all a sum
   with 1 keeps of the function, so one rational x P(x^2) / Q(x^2) on the clamped argument (erf: |x| <= 3.92,
   where erf rounds to 1; tanh: 9) instead of two ranges and an exp: 1.58 -> 0.67 ms for GELU on 3136 x 384
   floats (Zen 3, AVX2). The result is clamped to [0, 2], and is 0 and 2 past the clamps (as 1 + the float32
   function rounds there; -inf * that factor is then NaN, as it is in onnxruntime); NaN passes. */
DLCC_VM_FN float dlcc_vm_one_plus(float x, float xc, float p, float q, float edge) {
    float y = 1.0f + xc * p / q;               /* x: the argument, xc: it clamped to [-edge, edge] */
    y = y < 0.0f ? 0.0f : y;
    y = y > 2.0f ? 2.0f : y;
    y = x <= -edge ? 0.0f : y;
    return x >= edge ? 2.0f : y;
}
DLCC_VM_FN float dlcc_erf1pf(float x) {
    float xc = x > 3.92f ? 3.92f : x;
    xc = xc < -3.92f ? -3.92f : xc;            /* NaN passes */
    float t = xc * xc;
    float p = 0x1.20dd72p+0f + t * (0x1.8bbfb6p-3f + t * (0x1.a9cbf2p-5f + t * (0x1.e9b71p-9f + t * 0x1.ec9066p-13f)));
    float q = 1.0f + t * (0x1.0258a2p-1f + t * (0x1.d409b6p-4f + t * (0x1.e2d866p-7f + t * (0x1.1e9168p-10f
              + t * (0x1.86dbacp-16f + t * -0x1.dca3b4p-24f)))));
    return dlcc_vm_one_plus(x, xc, p, q, 3.92f);
}
DLCC_VM_FN float dlcc_tanh1pf(float x) {
    float xc = x > 9.0f ? 9.0f : x;
    xc = xc < -9.0f ? -9.0f : xc;              /* NaN passes */
    float t = xc * xc;
    float p = 0x1.fffffcp-1f + t * (0x1.0ee1f2p-3f + t * (0x1.b0b584p-9f + t * 0x1.15879ap-16f));
    float q = 1.0f + t * (0x1.dcc62cp-2f + t * (0x1.9c5c2ap-6f + t * (0x1.343f6p-12f + t * (0x1.fa95eap-22f
              + t * -0x1.1b24c4p-32f))));
    return dlcc_vm_one_plus(x, xc, p, q, 9.0f);
}
/* SiLU, x * sigmoid(x) = x / (1 + exp(-x)), in one piece (sigmoid then a product rounds twice more and costs
   twice as much): exp(-x) = 2^n (1 + s) with x clamped to [-87.3, 17], then x / (1 + exp(-x)) =
   (x 2^-n) / (2^-n + 1 + s), the numerator exact and the denominator rounded once where it matters: 2^-n + 1
   is exact for n <= 23, and for n > 0 its rounding error c (exact: Fast2Sum) is taken off s before the last
   addition. Above 17 the result rounds to x; below -87.3 it is -0 (|x e^x| < 1.1e-36 there) and NaN for -inf,
   as x * sigmoid(x) gives. The clamps are plain ternaries (NaN passes), which compile to min / max. */
DLCC_VM_FN float dlcc_siluf(float x) {
    float xc = x < -87.3f ? -87.3f : x;        /* (clamping x, not -x, saves GCC a quarter of the masks) */
    xc = xc > 17.0f ? 17.0f : xc;
    float m = -xc;
    float t = m * 0x1.715476p+0f + 0x1.8p23f;
    float nf = t - 0x1.8p23f;
    float r = (m - nf * 0x1.62e4p-1f) - nf * 0x1.7f7d1cp-20f;
    float p = 0x1.fffffcp-2f + r * (0x1.555492p-3f + r * (0x1.5558acp-5f + r * (0x1.123978p-7f
              + r * 0x1.6a50aep-10f)));
    float s = r + (r * r) * p;                 /* exp(r) - 1 */
    float inv = dlcc_vm_u2f((0x4b400000u + 127u - dlcc_vm_f2u(t)) << 23);  /* 2^-n, n in [-25, 126] */
    float t1 = inv + 1.0f;
    float c = (t1 - 1.0f) - inv;               /* t1 - (2^-n + 1), exact */
    float y = (xc * inv) / (t1 + (s - c));
    y = dlcc_vm_sel(x > 17.0f, x, y);          /* +inf passes */
    return dlcc_vm_sel(x < -87.3f, x * 0.0f, y);
}
"""
