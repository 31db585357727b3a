"""Per-kernel profile figures: what each kernel computes and moves, how long it took, how close to the peak.

What goes in: a kernel-IR ``Program`` (for ``kernel_figures``, computed once at compile time and stored in
``CompiledModel.info["per_kernel"]`` and in a bundle's model.json), the seconds per kernel that
``dlcc_run_profiled`` measured (``CompiledModel.profile`` or the bundle's ``model -p``), and the measured
FMA peak (``dlcc.build.probe``).
What comes out: ``ProfileRow`` per kernel (time, share, FLOPs, GFLOP/s, % of the single-core peak, bytes)
and, for the report, the arena occupancy over the schedule (``arena_occupancy``).

Conventions: FLOPs are ``dlcc.ops.cost.node_flops`` summed over the kernel's nodes (None when one of them
has no estimate); bytes are the bytes of the buffers the kernel reads and writes, each buffer once (views
count the bytes they cover), as ``dlcc.compiler.program_traffic`` sums them. "% of peak" divides by the
single-core peak times the thread count the code ran with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dlcc.errors import DlccError

__all__ = ["ProfileRow", "arena_occupancy", "kernel_figures", "kernel_form", "parse_bundle_profile", "profile_rows"]


_FUNC = re.compile(r"^func (\w+)", re.M)


def kernel_form(k) -> str:
    """How kernel ``k`` runs: the names of its steps' loop-IR functions in order, each once ("conv_direct",
    "conv_winograd", "gemm_wconst", "pwdw", "loop", ...; "copy" for a copy step), "" before code generation."""
    names: list[str] = []
    for s in k.steps:
        names += ["copy"] if s.kind == "copy" else _FUNC.findall(s.loop_ir or "")
    return "+".join(dict.fromkeys(names))


def kernel_figures(program) -> list[dict]:
    """``[{"id", "ops", "form", "flops", "bytes"}]`` per kernel of ``program``, in call order (JSON-ready);
    ``form``: ``kernel_form``."""
    from dlcc.ops.cost import node_flops

    rows = []
    for k in program.kernels:
        flops: int | None = 0
        for n in k.nodes:
            f = node_flops(n)
            if f is None:
                flops = None
                break
            flops += f
        moved = sum(program.buffers[b].nbytes for b in dict.fromkeys([*k.reads, *k.writes]))
        rows.append({"id": k.id, "ops": "+".join(k.ops) or "copy", "form": kernel_form(k), "flops": flops,
                     "bytes": moved})
    return rows


@dataclass
class ProfileRow:
    index: int  # position in call order
    id: int
    ops: str
    seconds: float
    share: float  # of the total over all kernels
    flops: int | None
    bytes: int
    form: str = ""  # kernel_form (a bundle written before it: "")

    @property
    def gflops(self) -> float | None:
        return self.flops / self.seconds / 1e9 if self.flops is not None and self.seconds > 0 else None

    def peak_fraction(self, peak_gflops: float | None, threads: int = 1) -> float | None:
        g = self.gflops
        return g / (peak_gflops * threads) if g is not None and peak_gflops else None


def profile_rows(kernels: Sequence[dict], seconds: Sequence[float]) -> list[ProfileRow]:
    """One row per kernel (call order), from the compile-time ``kernels`` figures and measured ``seconds``."""
    if len(kernels) != len(seconds):
        raise DlccError(f"the profile has {len(seconds)} kernel times for {len(kernels)} kernels",
                        hint="recompile the model (or rewrite the bundle) with this dlcc")
    total = sum(seconds)
    return [ProfileRow(i, int(k["id"]), str(k["ops"]), float(s), s / total if total > 0 else 0.0, k.get("flops"),
                       int(k["bytes"]), str(k.get("form", "")))
            for i, (k, s) in enumerate(zip(kernels, seconds, strict=True))]


_KERNEL_LINE = re.compile(r"^kernel (\d+) ([0-9.eE+-]+) ([0-9.eE+-]+)$", re.M)
_HEAD_LINE = re.compile(r"^profile (\d+) (\d+)$", re.M)


def parse_bundle_profile(stdout: str) -> tuple[list[float], int]:
    """(best seconds per kernel in call order, runs) from the output of a bundle's ``model -p``."""
    head = _HEAD_LINE.search(stdout)
    if head is None:
        raise DlccError("the bundle's executable printed no profile",
                        hint="it predates `-p`: rewrite the bundle with `dlcc compile` and rebuild it")
    count, runs = int(head.group(1)), int(head.group(2))
    best = [0.0] * count
    seen = 0
    for m in _KERNEL_LINE.finditer(stdout):
        k = int(m.group(1))
        if k < count:
            best[k] = float(m.group(2)) / 1e3
            seen += 1
    if seen != count:
        raise DlccError(f"the bundle's profile lists {seen} of its {count} kernels")
    return best, runs


def arena_occupancy(program, memory) -> tuple[list[int], list[int]]:
    """Per kernel in call order: (bytes of arena buffers live during it, the end of the highest of them).
    The first is at most ``memory.lower_bound`` (its peak, with aligned sizes, is the bound); the second
    at most ``memory.arena_bytes``."""
    from dlcc.memory.planner import align_up
    from dlcc.memory.schedule import program_buffers

    steps = len(program.kernels)
    live, top = [0] * steps, [0] * steps
    for b in program_buffers(program):
        size = align_up(b.size, memory.alignment)
        end = memory.offsets.get(b.id, 0) + size
        for s in range(b.first, min(b.last, steps - 1) + 1):
            live[s] += size
            top[s] = max(top[s], end)
    return live, top
