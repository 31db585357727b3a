"""The vectorizable float32 math of codegen/vmath.py (dlcc_expf, dlcc_erff, dlcc_tanhf, ...) against float64.

Each function runs in a vectorized loop compiled with the production flags for the native target
(``build.cc.flags_for``) over a sweep of float32 bit patterns (every 2039th, both signs: every binade,
NaNs, infinities, subnormals), a denser sweep of [-12, 12], and the special values (+-0, +-inf, NaN, the
extreme normals and subnormals, the overflow / underflow thresholds, the branch splits and their
neighbours). The error is in ulp of the float32 result against the float64 function (numpy; math.erf),
and must be <= 2; results that round to +-inf or are NaN in float64 must be exactly that. The assembly of
the loops for x86-64-v4 must use zmm registers and call nothing (GCC vectorized the inlined functions).
"""

from __future__ import annotations

import ctypes
import math
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dlcc.build.cc import compile_files, compiler, flags_for
from dlcc.codegen.vmath import C_TEXT, FUNCTIONS

PRELUDE = "#include <stdint.h>\n#include <string.h>\n#include <math.h>\n"


def _loops(names=FUNCTIONS) -> str:
    return "".join(f"void loop_{f}(const float* restrict x, float* restrict y, int64_t n) {{\n"
                   f"    for (int64_t i = 0; i < n; ++i) y[i] = {f}(x[i]);\n}}\n" for f in names)


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    tmp = tmp_path_factory.mktemp("vmath")
    src = tmp / "vmath.c"
    src.write_text(PRELUDE + C_TEXT + _loops())
    compile_files(compiler(), flags_for("native"), [src], tmp / "vmath.so", tmp)
    return ctypes.CDLL(str(tmp / "vmath.so"))


def _run(lib: ctypes.CDLL, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    fn = getattr(lib, f"loop_{name}")
    fn.restype = None
    fn(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
    return y


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


REFERENCE = {
    "dlcc_expf": np.exp,
    "dlcc_expm1f": np.expm1,
    "dlcc_logf": np.log,
    "dlcc_log1pf": np.log1p,
    "dlcc_erff": _erf,
    "dlcc_tanhf": np.tanh,
    "dlcc_sigmoidf": _sigmoid,
}

# Max error measured on this sweep, x86-64 AVX-512 with FMA (generic SSE2 without FMA where it differs), and
# where: expf 0.72 (subnormal results near -87.97), expm1f 1.08 (near 0.347: n = 1), logf 0.84 (0.87) (near
# 0.70: k = -1), log1pf 1.10 (near 0.284), erff 0.99 (1.20) (near 1.06: the 1 - exp branch), tanhf 1.00 (near
# 0.78: the exp branch), sigmoidf 1.13 (near -5.14). The docstring of codegen/vmath.py has a denser sweep's.


def _sweep() -> np.ndarray:
    bits = np.arange(0, 1 << 32, 2039, dtype=np.uint64).astype(np.uint32)
    coarse = bits.view(np.float32)
    lo, hi = np.array([0.125, 12.0], np.float32).view(np.uint32)
    dense = np.arange(lo, hi, 61, dtype=np.uint32).view(np.float32)
    return np.concatenate([coarse, dense, -dense])


def _specials() -> np.ndarray:
    f = np.float32
    tiny, fmin, fmax = 2.0 ** -149, float(np.finfo(f).tiny), float(np.finfo(f).max)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, fmax, -fmax, fmin, -fmin, tiny, -tiny, 3 * tiny,
            fmin - tiny, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-30, -1e-30, 1e-10, -1e-10, 2.0 ** -12, 2.0 ** -25,
            # exp: largest finite result, overflow, smallest normal result, the subnormals, underflow to 0
            float.fromhex("0x1.62e42ep+6"), float.fromhex("0x1.62e430p+6"), 88.0, 89.0, 100.0, -87.33654,
            -87.5, -100.0, -103.0, float.fromhex("-0x1.9fe368p+6"), float.fromhex("-0x1.9fe36ap+6"), -104.0, -110.0,
            # branch splits (erf 0.921875, tanh 0.625, the clamps 4 and 9.5, expm1 -17.4) and the ends of exp's
            # reduction (ln2 / 2)
            0.921875, 4.0, 3.92, 0.625, 9.0, 9.5, 10.0, 0.34657359, 0.34657362, -17.4, -30.0, -40.0]
    near = []
    for v in (0.921875, 0.625, 4.0, 9.5, 0.34657359, 1.0, 2.0 ** -126):
        u = np.array([v], f).view(np.uint32)[0]
        near += list(np.arange(u - 4, u + 5, dtype=np.uint32).view(f))
    x = np.array(vals + near, dtype=f)
    subnormals = np.arange(1, 1 << 23, 4099, dtype=np.uint32).view(f)
    return np.concatenate([x, -x, subnormals, -subnormals])


def _ulp_errors(got: np.ndarray, x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Error of ``got`` in ulp of the float32 result; inf where a NaN / infinity does not match."""
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
    err = np.zeros(got.shape)
    nan = np.isnan(ref)
    err[nan != np.isnan(got)] = np.inf
    inf = np.isinf(ref32)
    err[inf & (got != ref32)] = np.inf
    fin = ~nan & ~inf
    if np.any(fin & ~np.isfinite(got)):
        err[fin & ~np.isfinite(got)] = np.inf
    ok = fin & np.isfinite(got)
    _, e = np.frexp(ref[ok])  # |ref| in [2^(e-1), 2^e)
    ulp = np.maximum(np.ldexp(1.0, e - 24), 2.0 ** -149)
    err[ok] = np.abs(got[ok].astype(np.float64) - ref[ok]) / ulp
    return err


def test_expneg_within_2_ulp_and_zero_below_the_normal_range(tmp_path):
    """dlcc_vm_expneg (a softmax's exp of x - max): within 2 ulp where exp is normal, 0 below, NaN passes."""
    src = tmp_path / "expneg.c"
    src.write_text(PRELUDE + C_TEXT + _loops(("dlcc_vm_expneg",)))
    compile_files(compiler(), flags_for("native"), [src], tmp_path / "expneg.so", tmp_path)
    lib = ctypes.CDLL(str(tmp_path / "expneg.so"))
    lo, hi = np.array([-87.33, 88.0], np.float32)
    sweep = np.concatenate([_sweep(), _specials()])
    x = sweep[(sweep >= lo) & (sweep <= hi)]
    x = np.concatenate([x, np.linspace(-87.33, 0.0, 200001, dtype=np.float32)])
    err = _ulp_errors(_run(lib, "dlcc_vm_expneg", x), x, np.exp(x.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, f"expneg({x[worst]!r}): {err[worst]} ulp"
    special = np.array([-87.34, -100.0, -np.inf, np.nan, 0.0, -0.0], np.float32)
    got = _run(lib, "dlcc_vm_expneg", special)
    assert list(got[:3]) == [0.0, 0.0, 0.0] and np.isnan(got[3]) and list(got[4:]) == [1.0, 1.0]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_within_2_ulp(lib, name):
    x = np.concatenate([_sweep(), _specials()])
    got = _run(lib, name, x)
    with np.errstate(all="ignore"):
        ref = REFERENCE[name](x.astype(np.float64))
    err = _ulp_errors(got, x, ref)
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, f"{name}({x[worst]!r}) = {got[worst]!r}, float64 {ref[worst]!r}: {err[worst]} ulp"


def test_special_values_exactly(lib):
    inf, nan = np.inf, np.nan
    x = np.array([0.0, -0.0, inf, -inf, nan, 1.0, -1.0, -2.0], np.float32)
    expect = {  # None: not a special value (test_within_2_ulp covers it)
        "dlcc_expf": [1, 1, inf, 0, nan, None, None, None],
        "dlcc_expm1f": [0.0, -0.0, inf, -1, nan, None, None, None],
        "dlcc_logf": [-inf, -inf, inf, nan, nan, 0, nan, nan],
        "dlcc_log1pf": [0.0, -0.0, inf, nan, nan, None, -inf, nan],
        "dlcc_erff": [0.0, -0.0, 1, -1, nan, None, None, None],
        "dlcc_tanhf": [0.0, -0.0, 1, -1, nan, None, None, None],
        "dlcc_sigmoidf": [0.5, 0.5, 1, 0, nan, None, None, None],
    }
    for name, want in expect.items():
        got = _run(lib, name, x)
        keep = np.array([w is not None for w in want])
        want = np.array([w for w in want if w is not None], np.float32)
        assert np.array_equal(got[keep], want, equal_nan=True), (name, got, want)
        assert np.array_equal(np.signbit(got[:2]), np.signbit(want[:2])), (name, "sign of zero")


def test_tanh_never_exceeds_its_argument(lib):
    """|tanh(x)| <= |x| (glibc tanhf breaks it near 0), and tanh(x) == x where x^3/3 is below half an ulp."""
    x = _sweep()
    x = x[np.isfinite(x)]
    y = _run(lib, "dlcc_tanhf", x)
    assert np.all(np.abs(y) <= np.abs(x))
    tiny = np.abs(x) < 2.0 ** -13
    assert np.array_equal(y[tiny], x[tiny])


def _x86_gcc() -> str | None:
    if platform.machine() in ("x86_64", "AMD64") and shutil.which("gcc"):
        return "gcc"
    return shutil.which("x86_64-linux-gnu-gcc")


def _asm(cc: str, flags: list[str], tmp: Path) -> dict[str, str]:
    """The assembly of each loop_* function, by function name."""
    src = tmp / "loops.c"
    src.write_text(PRELUDE + C_TEXT + _loops())
    out = subprocess.run([cc, *flags, "-S", "-o", "-", str(src)], capture_output=True, text=True, check=True).stdout
    funcs = {}
    for name in FUNCTIONS:
        start = out.index(f"loop_{name}:")
        funcs[name] = out[start:out.index(f".size\tloop_{name},", start)]
    return funcs


@pytest.mark.skipif(_x86_gcc() is None, reason="no gcc for x86-64 on this machine")
def test_vectorizes_with_avx512(tmp_path):
    for name, asm in _asm(_x86_gcc(), flags_for("x86-64-v4"), tmp_path).items():
        assert "zmm" in asm, f"{name} was not vectorized for x86-64-v4"
        assert "call" not in asm, f"{name} calls a function"


@pytest.mark.skipif(_x86_gcc() is None, reason="no gcc for x86-64 on this machine")
def test_vectorizes_without_march(tmp_path):
    """The generic build (SSE2, no FMA): 4-float vectors, no libm call."""
    for name, asm in _asm(_x86_gcc(), flags_for("generic"), tmp_path).items():
        assert "mulps" in asm, f"{name} was not vectorized for generic x86-64"
        assert "call" not in asm, f"{name} calls a function"


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="no aarch64-linux-gnu-gcc")
def test_vectorizes_for_aarch64(tmp_path):
    for name, asm in _asm("aarch64-linux-gnu-gcc", flags_for("aarch64"), tmp_path).items():
        assert ".4s" in asm, f"{name} was not vectorized for aarch64"
        assert "\tbl\t" not in asm, f"{name} calls a function"


def test_silu_within_2_ulp_above_the_underflow_and_x_times_sigmoid_below(tmp_path):
    """dlcc_siluf (x * sigmoid(x) as one call): within 2 ulp of x / (1 + exp(-x)) for x >= -87.3; below,
    -0 (the exact value is in (-1.1e-36, 0)); NaN for NaN and -inf (as x * sigmoid(x)), inf for inf."""
    src = tmp_path / "silu.c"
    src.write_text(PRELUDE + C_TEXT + _loops(("dlcc_siluf",)))
    compile_files(compiler(), flags_for("native"), [src], tmp_path / "silu.so", tmp_path)
    lib = ctypes.CDLL(str(tmp_path / "silu.so"))
    sweep = np.concatenate([_sweep(), _specials(), np.linspace(-87.3, 20.0, 400001, dtype=np.float32)])
    x = sweep[np.isfinite(sweep)]
    got = _run(lib, "dlcc_siluf", x)
    xd = x.astype(np.float64)
    with np.errstate(over="ignore"):
        ref = np.where(xd >= 0, xd / (1.0 + np.exp(-xd)), xd * np.exp(xd) / (1.0 + np.exp(xd)))
    main = x >= np.float32(-87.3)
    err = _ulp_errors(got[main], x[main], ref[main])
    worst = int(np.argmax(err))
    assert err[worst] <= 2.0, f"silu({x[main][worst]!r}): {err[worst]} ulp"
    low = got[~main]
    assert np.all(low == 0.0) and np.all(np.signbit(low))
    special = _run(lib, "dlcc_siluf", np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 17.0, 17.5], np.float32))
    assert np.isnan(special[0]) and np.isnan(special[1]) and special[2] == np.inf
    assert special[3] == 0.0 and np.signbit(special[3]) and special[4] == 0.0 and not np.signbit(special[4])
    assert list(special[5:]) == [np.float32(17.0 / (1 + np.exp(-17.0))), np.float32(17.5)]


@pytest.mark.parametrize("name,fn,edge", [("dlcc_erf1pf", math.erf, 3.92), ("dlcc_tanh1pf", math.tanh, 9.0)])
def test_one_plus_within_4e_7(tmp_path, name, fn, edge):
    """dlcc_erf1pf and dlcc_tanh1pf (1 + erf(x), 1 + tanh(x): GELU's factor, one rational each): absolute error
    <= 4e-7 on the sweep and densely on [-12, 12], within 4 ulp of the sum for x >= 0; in [0, 2]; 0 and 2 past the
    clamps (as 1 + the float32 function rounds there); NaN passes; vectorized, no call, with the production flags."""
    src = tmp_path / "onep.c"
    src.write_text(PRELUDE + C_TEXT + _loops((name,)))
    compile_files(compiler(), flags_for("native"), [src], tmp_path / "onep.so", tmp_path)
    lib = ctypes.CDLL(str(tmp_path / "onep.so"))
    sweep = np.concatenate([_sweep(), _specials(), np.linspace(-12, 12, 1200001, dtype=np.float32)])
    x = sweep[np.isfinite(sweep)]
    got = _run(lib, name, x)
    ref = 1.0 + np.frompyfunc(fn, 1, 1)(x.astype(np.float64)).astype(np.float64)
    err = np.abs(got - ref)
    worst = int(np.argmax(err))
    assert err[worst] <= 4e-7, f"{name}({x[worst]!r}) = {got[worst]!r}, float64 {ref[worst]!r}"
    pos = x >= 0
    ulp = np.spacing(ref[pos].astype(np.float32)).astype(np.float64)
    assert np.max(err[pos] / ulp) <= 4.0
    assert got.min() >= 0.0 and got.max() <= 2.0
    past = np.array([edge, 2 * edge, np.inf, -edge, -2 * edge, -np.inf, np.nan], np.float32)
    out = _run(lib, name, past)
    assert list(out[:6]) == [2.0, 2.0, 2.0, 0.0, 0.0, 0.0] and np.isnan(out[6])
    if _x86_gcc() is not None and platform.machine() in ("x86_64", "AMD64"):
        asm = subprocess.run([_x86_gcc(), *flags_for("x86-64-v3"), "-S", "-o", "-", str(src)], capture_output=True,
                             text=True, check=True).stdout
        body = asm[asm.index(f"loop_{name}:"):]
        assert "ymm" in body and "call" not in body[:body.index(".size")]
