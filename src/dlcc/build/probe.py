"""The measured single-core float32 FMA peak: the yardstick of ``dlcc run --profile``'s "% of peak".

What goes in: nothing but the machine, the C compiler and its flags (``cc.flags_for()`` by default: the flags of
the generated code, -O3 -march=native).
What comes out: ``fma_peak_gflops()``, the float32 GFLOP/s one core reaches on a loop of nothing but
independent fused multiply-adds (an FMA counts 2 FLOPs, as in ``dlcc.ops.cost``); ``fma_peak()`` returns
it with what it was measured with (vector width, accumulators, cache file).

How: a tiny C program, compiled like the generated code (GCC/Clang vector extensions, no intrinsics),
keeps ``ACC`` independent accumulators of the widest vector the compiler targets (64 bytes with
``__AVX512F__``, 32 with ``__AVX__``, 16 with ``__ARM_NEON``/SSE, 16 elsewhere) and updates each one with
``acc = acc * m + c`` in a long loop: enough independent chains to hide the FMA latency on every FMA
port, few enough to stay in registers (16 with 32 vector registers, 12 with 16). ``m`` and ``c`` come
from the command line so nothing folds; ``acc`` converges to ``c / (1 - m)``, far from denormals and
infinities. The program calibrates its loop count to ~12 ms per run and prints the best of 12 runs (about
0.2 s in all: short runs, so that one of them is likely undisturbed on a busy machine). Without an FMA
unit the compiler emits a multiply and an add, and the figure is what that machine reaches with them.

The figure is cached in the build cache (``cc.cache_dir()/probe/``), keyed by the compiler's identity, the
flags, the probe's source and the CPU model (``/proc/cpuinfo``), so it is measured once per machine and
compiler. Failures (no compiler, a program that does not run) raise ``DlccError``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dlcc.errors import DlccError

__all__ = ["FmaPeak", "cpu_model", "fma_peak", "fma_peak_gflops"]

PROBE_C = r"""/* dlcc FMA peak probe: best GFLOP/s of independent float32 multiply-adds on one core */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
#define VBYTES 64
#define ACC 16
#elif defined(__AVX__)
#define VBYTES 32
#define ACC 12
#elif defined(__ARM_NEON) || defined(__aarch64__)
#define VBYTES 16
#define ACC 16
#else
#define VBYTES 16
#define ACC 12
#endif
#define LANES (VBYTES / 4)

typedef float vf __attribute__((vector_size(VBYTES)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) MORE(X)
#if ACC == 16
#define MORE(X) X(12) X(13) X(14) X(15)
#else
#define MORE(X)
#endif
#define DECL(i) vf a##i = m * (float)(i + 1);
#define STEP(i) a##i = a##i * m + c;
#define SUM(i) s += a##i;

static float kernel(long iters, float mf, float cf) {
    vf m = mf - (vf){0}, c = cf - (vf){0};
    ALL(DECL)
    for (long n = 0; n < iters; ++n) {
        ALL(STEP)
        __asm__ volatile("" : : : "memory");  /* one loop trip per iteration: no reassociation across trips */
    }
    vf s = {0};
    ALL(SUM)
    float r = 0;
    for (int l = 0; l < LANES; ++l) r += s[l];
    return r;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    float mf = (float)atof(argv[1]), cf = (float)atof(argv[2]);
    double sink = 0, t;
    long iters = 1 << 14;
    for (;;) {  /* calibrate: double until one run takes 5 ms */
        t = now(); sink += kernel(iters, mf, cf); t = now() - t;
        if (t > 0.005 || iters > (1L << 40)) break;
        iters *= 2;
    }
    iters = (long)(iters * (0.012 / (t > 1e-9 ? t : 1e-9))) + 1;
    double best = 1e300;
    for (int r = 0; r < 12; ++r) {  /* best of many short runs: the least disturbed one on a busy machine */
        t = now(); sink += kernel(iters, mf, cf); t = now() - t;
        if (t < best) best = t;
    }
    double flops = 2.0 * ACC * LANES * (double)iters;
    printf("%.6f %d %d %g\n", flops / best / 1e9, VBYTES, ACC, sink);
    return 0;
}
"""

VERSION = 1  # bump when the measurement changes meaning


@dataclass(frozen=True)
class FmaPeak:
    gflops: float  # single core, float32, an FMA = 2 FLOPs
    vector_bytes: int
    accumulators: int
    cpu: str
    compiler: str
    flags: tuple[str, ...]
    cache_file: Path | None = None


def cpu_model() -> str:
    """The CPU from /proc/cpuinfo: ``model name`` with family, model and stepping (``Hardware``, ``CPU
    implementer`` and ``CPU part`` on ARM)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    keys = ("model name", "cpu family", "model", "stepping", "Hardware", "CPU implementer", "CPU part")
    parts = [f"{k}={fields[k]}" if k != "model name" else fields[k] for k in keys if fields.get(k)]
    return " ".join(p for p in parts if p) or platform.machine()


def _key(cc_id: str, flags: list[str], cpu: str) -> str:
    h = hashlib.sha256()
    for part in (str(VERSION), cc_id, " ".join(flags), cpu, PROBE_C):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:32]


def _measure(cc: str, flags: list[str], workdir: Path) -> tuple[float, int, int]:
    from dlcc.build.cc import compile_files

    src = workdir / "probe.c"
    src.write_text(PROBE_C)
    exe = workdir / "probe"
    compile_files(cc, [f for f in flags if f != "-fPIC"], [src], exe, workdir, shared=False)
    try:
        proc = subprocess.run([str(exe), "0.9999", "0.0001"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise DlccError(f"cannot run the FMA peak probe: {e}") from None
    try:
        gflops, vbytes, acc = proc.stdout.split()[:3]
        result = float(gflops), int(vbytes), int(acc)
    except ValueError:
        raise DlccError(f"the FMA peak probe failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}") from None
    if not result[0] > 0:
        raise DlccError(f"the FMA peak probe measured {result[0]} GFLOP/s")
    return result


def fma_peak(*, flags: list[str] | None = None, refresh: bool = False) -> FmaPeak:
    """The measured peak (cached; ``refresh`` measures again and rewrites the cache entry)."""
    from dlcc.build.cc import _compiler_id, cache_dir, compiler, flags_for

    cc = compiler()
    flags = list(flags_for() if flags is None else flags)
    cc_id, cpu = _compiler_id(cc), cpu_model()
    folder = cache_dir() / "probe"
    path = folder / f"fma-{_key(cc_id, flags, cpu)}.json"
    if not refresh:
        try:
            data = json.loads(path.read_text())
            if data.get("gflops", 0) > 0:
                return FmaPeak(float(data["gflops"]), int(data["vector_bytes"]), int(data["accumulators"]), cpu,
                               cc_id, tuple(flags), path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # missing or unreadable: measure
    folder.mkdir(exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix="probe-", dir=folder) as tmp:
        gflops, vbytes, acc = _measure(cc, flags, Path(tmp))
        data = {"gflops": gflops, "vector_bytes": vbytes, "accumulators": acc, "cpu": cpu, "compiler": cc_id,
                "flags": flags, "version": VERSION}
        staged = Path(tmp) / "entry.json"
        staged.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(staged, path)
    return FmaPeak(gflops, vbytes, acc, cpu, cc_id, tuple(flags), path)


def fma_peak_gflops(*, flags: list[str] | None = None, refresh: bool = False) -> float:
    """The single-core float32 FMA peak in GFLOP/s (see the module docstring)."""
    return fma_peak(flags=flags, refresh=refresh).gflops
