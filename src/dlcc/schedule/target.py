"""The machine the generated C is for: one ``Target`` holds every figure a schedule derives from.

What goes in: a name (``native``, ``x86-64-v4``, ``x86-64-v3``, ``aarch64``, ``generic``) or a ``Target``.
What comes out: ``Target`` — ISA features, vector width (bytes, and float lanes), vector registers, cores,
L1d/L2 sizes, the compiler flags that select the ISA, and the cross compiler a bundle for another
architecture is built with.

Invariants: nothing here is read at import time and nothing reads an environment variable; ``native``
is detected from this machine when asked for (``/proc/cpuinfo``, ``/sys`` cache sizes, ``os.cpu_count``)
and compiled with ``-march=native``; a named target is the same on every machine that generates it, so
C generated for ``aarch64`` on an x86-64 host is the C an aarch64 host would generate for it (less the
core count and cache sizes, which a named target states as typical figures).

Every lane count, register tile and cache block of the kernels derives from these figures: ``lanes`` =
floats per vector; ``conv_oc_block`` = output channels a direct convolution accumulates together (two
vectors each, within the register file); ``gemm_panel_bytes`` = the B panel a GEMM keeps in L2.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

from dlcc.errors import DlccError

__all__ = ["NAMES", "Target", "get_target", "host_arch"]


@dataclass(frozen=True)
class Target:
    name: str
    arch: str  # x86_64 | aarch64 | any
    vector_bytes: int
    vector_registers: int
    features: tuple[str, ...] = ()
    cores: int = 1
    l1d_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 8 * 1024 * 1024  # (the last level, shared)
    winograd: bool = True  # 3x3 convolutions may run as Winograd F(4x4, 3x3) (4x the weight bytes of those layers)
    cflags: tuple[str, ...] = ()
    cross_cc: str | None = None  # the compiler a bundle for this arch is built with on another arch
    detected_from: str = field(default="", compare=False)  # native: what the detection saw

    @property
    def lanes(self) -> int:
        """float32 elements per vector."""
        return self.vector_bytes // 4

    @property
    def conv_oc_block(self) -> int:
        """Output channels a direct convolution tile accumulates (2 vectors each, inputs and weights in
        the remaining registers): 14 on 32 registers (28 accumulators, as a GEMM tile), 6 on 16."""
        return max(2, min(14, (self.vector_registers - 4) // 2))

    @property
    def gemm_rows(self) -> int:
        """Rows of A a GEMM block updates together (each B load feeds that many FMAs)."""
        return 4 if self.vector_registers >= 16 else 2

    @property
    def gemm_panel_bytes(self) -> int:
        """Bytes of the GEMM's B panel (K x nb floats): a quarter of L2, at least 64 KiB."""
        return max(64 * 1024, self.l2_bytes // 4)

    def runs_here(self) -> bool:
        """Can code generated for this target run on this machine?"""
        if self.arch == "any":
            return True
        if self.arch != host_arch():
            return False
        return all(f in _host_features() for f in self.features)

    def describe(self) -> str:
        extra = f" [{self.detected_from}]" if self.detected_from else ""
        return (f"{self.name}{extra}: {self.arch}, {self.vector_bytes * 8}-bit vectors ({self.lanes} floats), "
                f"{self.vector_registers} vector registers, {self.cores} core(s), L1d {self.l1d_bytes // 1024} KiB, "
                f"L2 {self.l2_bytes // 1024} KiB")


_NAMED = {
    # x86-64 microarchitecture levels (the psABI's): v4 = AVX-512 F/BW/CD/DQ/VL, v3 = AVX2 + FMA
    "x86-64-v4": Target("x86-64-v4", "x86_64", 64, 32, ("avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"),
                        cflags=("-march=x86-64-v4", "-mtune=generic"),
                        cross_cc="x86_64-linux-gnu-gcc"),
    "x86-64-v3": Target("x86-64-v3", "x86_64", 32, 16, ("avx2", "fma"), cflags=("-march=x86-64-v3", "-mtune=generic"),
                        cross_cc="x86_64-linux-gnu-gcc"),
    # ARMv8-A: Advanced SIMD (NEON) and FMA are part of the base ISA
    "aarch64": Target("aarch64", "aarch64", 16, 32, ("neon",), l1d_bytes=64 * 1024, cflags=("-march=armv8-a",),
                      cross_cc="aarch64-linux-gnu-gcc"),
    # any C compiler, any machine: 16-byte vectors are what GCC/Clang lower well everywhere
    "generic": Target("generic", "any", 16, 16, ()),
}
NAMES = ("native", *_NAMED)


def get_target(target: str | Target | None = None) -> Target:
    """The ``Target`` for a name (None: ``native``); a ``Target`` is returned as it is."""
    if isinstance(target, Target):
        return target
    name = target or "native"
    if name == "native":
        return _native()
    t = _NAMED.get(name)
    if t is None:
        raise DlccError(f"unknown target '{name}'", hint=f"known targets: {', '.join(NAMES)}")
    return t


_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64", "i686": "i386", "i586": "i386", "armv7l": "arm",
                 "armv6l": "arm", "ppc64le": "ppc64"}


def host_arch() -> str:
    """This machine's architecture, as ELF names it (x86_64, aarch64, ...)."""
    m = platform.machine().lower()
    return _ARCH_ALIASES.get(m, m)


@functools.cache
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@functools.cache
def _host_features() -> frozenset[str]:
    flags: set[str] = set()
    for line in _cpuinfo().splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            flags.update(line.split(":", 1)[1].split())
            break
    if host_arch() == "aarch64":
        flags.add("neon")  # (reported as asimd)
    return frozenset(flags)


def _cache_bytes(level: int, kind: str) -> int | None:
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for d in sorted(root.glob("index*")):
            if int((d / "level").read_text()) == level and (d / "type").read_text().strip() in (kind, "Unified"):
                text = (d / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
                return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return None
    return None


@functools.cache
def _native() -> Target:
    arch = host_arch()
    feats = _host_features()
    if arch == "x86_64" and {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= feats:
        base = _NAMED["x86-64-v4"]
    elif arch == "x86_64" and {"avx2", "fma"} <= feats:
        base = _NAMED["x86-64-v3"]
    elif arch == "aarch64":
        base = _NAMED["aarch64"]
    else:
        base = replace(_NAMED["generic"], arch=arch)
    flags = ("-march=native",) if arch == "x86_64" else ("-mcpu=native",) if arch == "aarch64" else ()
    return replace(base, name="native", cflags=flags, cores=os.cpu_count() or 1,
                   l1d_bytes=_cache_bytes(1, "Data") or base.l1d_bytes,
                   l2_bytes=_cache_bytes(2, "Unified") or base.l2_bytes,
                   l3_bytes=_cache_bytes(3, "Unified") or base.l3_bytes,
                   detected_from=base.name, cross_cc=None)
