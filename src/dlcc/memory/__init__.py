"""Memory planning: buffer lifetimes from a kernel schedule, then offsets in one arena (see planner)."""

from dlcc.memory.planner import (
    STRATEGIES,
    Buffer,
    MemoryPlan,
    align_up,
    best_fit,
    liveness,
    lower_bound,
    plan_memory,
    verify_memory_plan,
)

__all__ = [
    "STRATEGIES",
    "Buffer",
    "MemoryPlan",
    "align_up",
    "best_fit",
    "liveness",
    "lower_bound",
    "plan_memory",
    "verify_memory_plan",
]
