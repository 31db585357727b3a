"""Memory planning for a kernel-IR program: liveness over the call schedule, then arena offsets.

What goes in: a ``Program`` (kernels in call order, each with the buffers it reads and writes).
What comes out: a verified ``MemoryPlan`` over the program's arena buffers (the roots of kind ``temp``:
views resolve to the buffer they look into, so a Concat written in place by several kernels lives from
its first writer to its last reader). Graph inputs, outputs and weights live outside the arena.
"""

from __future__ import annotations

from dlcc.lower.kir import Program
from dlcc.memory.planner import MemoryPlan, liveness, plan_memory, verify_memory_plan

__all__ = ["program_buffers", "plan_program_memory"]


def program_buffers(program: Program):
    """The arena buffers (``memory.planner.Buffer``) of ``program`` with their lifetimes in kernel steps."""
    schedule = []
    sizes: dict[int, int] = {}
    for k in program.kernels:
        reads = [program.root(b).id for b in k.reads]
        writes = [program.root(b).id for b in k.writes]
        schedule.append((reads, writes))
    pinned = set()
    for b in program.buffers.values():
        if b.kind == "temp":
            sizes[b.id] = max(b.nbytes, 1)
        elif b.kind != "view":
            pinned.add(b.id)
    return liveness(schedule, sizes, pinned=pinned)


def plan_program_memory(program: Program, *, alignment: int = 64, strategy: str = "auto") -> MemoryPlan:
    buffers = program_buffers(program)
    plan = plan_memory(buffers, alignment=alignment, strategy=strategy)
    verify_memory_plan(buffers, plan)
    return plan
