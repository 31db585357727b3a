"""Static memory planner: give every intermediate buffer an offset in one arena.

What goes in: buffers ``Buffer(id, size, first, last)``, where ``[first, last]`` (inclusive) is the
buffer's lifetime in kernel-schedule steps (``liveness`` computes it from a schedule), and an
``alignment`` in bytes. What comes out: a ``MemoryPlan`` with one aligned offset per buffer, the arena
size, the lower bound (peak of live bytes) and the no-reuse size beside it. Invariant, checked by
``verify_memory_plan``: two buffers whose lifetimes overlap never share a byte, every offset is a
multiple of the alignment, and every buffer ends inside the arena.

Algorithm (greedy by size, best fit; Pisarchyk & Lee 2020, "Greedy by Size for Offset Calculation"):
every size is first rounded up to the alignment, so all offsets and ends stay aligned. Buffers are
visited from the largest to the smallest (ties: earlier ``first``, then smaller ``id``, so the result
does not depend on the input order). For the current buffer, take the already-placed buffers whose
lifetimes overlap it and walk their ``[offset, offset + size)`` intervals by increasing offset; each
space between the running highest end and the next interval is a gap. The buffer goes into the
smallest gap it fits in (best fit); if none fits it goes right after the highest end seen. Buffers
whose lifetimes do not overlap it are ignored, which is where memory is reused.

Greedy by breadth (the second strategy) uses the same best-fit placement but a different order: steps
are visited by decreasing breadth (the sum of sizes live at the step, ties: earlier step first), and at
each step its not-yet-placed buffers are placed from the largest to the smallest. Greedy by area (the
third) orders by size x lifetime, largest first: long-lived activations settle at the bottom and the
short-lived buffers (a kernel's workspace lives for one step) fill the space above them, step by step.
The default strategy ``"auto"`` runs all three and keeps the smallest arena (the earlier one on a tie);
when that is above the lower bound, a short seeded search (``_search``) swaps nearby buffers of a greedy order and
keeps a smaller placement it finds (strategy ``"search"``), from each strategy's order in turn until the bound.

An arena over time: A (steps 0-1) and C (steps 3-4) never live at the same step, so C reuses A's
bytes; B (64 bytes, steps 1-4, placed first as the largest) overlaps both and sits below them.
Arena: 96 bytes, lower bound: 96, no reuse: 128 (this is what ``plan_memory`` returns for them)::

     offset │ step 0   1   2   3   4
    ────────┼─────────────────────────
     64..96 │      A   A   .   C   C
      0..64 │          B   B   B   B

Lower bound: at every step the buffers live at that step must be disjoint, so no plan is smaller than
the largest sum of (aligned) sizes live at one step. The arena can exceed it (the problem is NP-hard);
``no_reuse_bytes`` (every buffer in its own place) is the trivial upper bound.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from dlcc.errors import PassError

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

STRATEGIES = ("greedy-by-size", "greedy-by-breadth", "greedy-by-area")
"""Strategies ``plan_memory`` accepts by name, besides ``"auto"`` (try all, keep the smallest arena)."""


@dataclass(frozen=True, order=True)
class Buffer:
    """A buffer in the arena: ``size`` bytes, live from step ``first`` to step ``last`` (inclusive)."""

    id: int
    size: int
    first: int
    last: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise PassError(f"memory planner: buffer {self.id} has negative size {self.size}")
        if self.first < 0 or self.last < self.first:
            raise PassError(
                f"memory planner: buffer {self.id} has an empty or negative lifetime [{self.first}, {self.last}]"
            )

    def overlaps(self, other: Buffer) -> bool:
        """Whether the two lifetimes share a step."""
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets of every buffer in one arena of ``arena_bytes``, with the bounds it is judged against."""

    offsets: dict[int, int]
    arena_bytes: int
    lower_bound: int
    no_reuse_bytes: int
    alignment: int
    strategy: str = field(default="greedy-by-size")

    @property
    def ratio(self) -> float:
        """``arena_bytes / lower_bound`` (1.0 is optimal; 1.0 for an empty plan)."""
        return self.arena_bytes / self.lower_bound if self.lower_bound else 1.0


def align_up(size: int, alignment: int) -> int:
    """``size`` rounded up to a multiple of ``alignment``."""
    return -(-size // alignment) * alignment


def _check_alignment(alignment: int) -> None:
    if not isinstance(alignment, int) or alignment < 1:
        raise PassError(f"memory planner: alignment must be a positive integer, got {alignment!r}")


def _check_ids(buffers: Sequence[Buffer]) -> None:
    seen: set[int] = set()
    for b in buffers:
        if b.id in seen:
            raise PassError(f"memory planner: buffer id {b.id} appears twice")
        seen.add(b.id)


def lower_bound(buffers: Iterable[Buffer], alignment: int = 64) -> int:
    """The largest sum of aligned sizes of the buffers live at one step (0 without buffers)."""
    _check_alignment(alignment)
    delta: dict[int, int] = {}
    for b in buffers:
        size = align_up(b.size, alignment)
        delta[b.first] = delta.get(b.first, 0) + size
        delta[b.last + 1] = delta.get(b.last + 1, 0) - size
    live = peak = 0
    for step in sorted(delta):
        live += delta[step]
        peak = max(peak, live)
    return peak


def liveness(
    schedule: Sequence[tuple[Sequence[int], Sequence[int]]],
    sizes: Mapping[int, int],
    *,
    pinned: AbstractSet[int] = frozenset(),
) -> list[Buffer]:
    """Lifetimes of the arena buffers of a schedule of ``(ids read, ids written)`` per step.

    A buffer lives from the first step that touches it (normally its writer) to the last step that
    touches it (normally its last reader), inclusive. Buffers in ``pinned`` (graph inputs, outputs and
    weights, which live outside the arena) are left out. Buffers named in ``sizes`` but never used
    by the schedule are left out too. Returns the buffers sorted by id.
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for step, (reads, writes) in enumerate(schedule):
        for bid in (*reads, *writes):
            if bid in pinned:
                continue
            first.setdefault(bid, step)
            last[bid] = step
    missing = sorted(bid for bid in first if bid not in sizes)
    if missing:
        raise PassError(f"memory planner: the schedule uses buffers {missing} whose sizes are unknown")
    return [Buffer(bid, sizes[bid], first[bid], last[bid]) for bid in sorted(first)]


def best_fit(size: int, intervals: Iterable[tuple[int, int]]) -> int:
    """The offset where ``size`` bytes go among the occupied ``[start, end)`` ``intervals``: the start
    of the smallest gap that fits them (the lowest such gap on a tie), else the highest end (0 if none).

    Gaps are the spaces between the running highest end and the next start, walking by start.
    """
    best_offset: int | None = None
    best_gap = -1
    top = 0  # highest end seen so far: the start of the next gap
    for start, end in sorted(intervals):
        gap = start - top
        if gap >= size and (best_offset is None or gap < best_gap):
            best_offset, best_gap = top, gap
        top = max(top, end)
    return top if best_offset is None else best_offset


def _place(order: Sequence[Buffer], alignment: int) -> dict[int, int]:
    placed: list[tuple[int, int, Buffer]] = []
    offsets: dict[int, int] = {}
    for b in order:
        size = align_up(b.size, alignment)
        offset = best_fit(size, ((off, off + sz) for off, sz, other in placed if other.overlaps(b)))
        offsets[b.id] = offset
        placed.append((offset, size, b))
    return offsets


def _order_by_size(buffers: Sequence[Buffer]) -> list[Buffer]:
    return sorted(buffers, key=lambda b: (-b.size, b.first, b.id))


def _order_by_area(buffers: Sequence[Buffer]) -> list[Buffer]:
    return sorted(buffers, key=lambda b: (-b.size * (b.last - b.first + 1), b.first, b.id))


def _order_by_breadth(buffers: Sequence[Buffer], alignment: int) -> list[Buffer]:
    live_at: dict[int, list[Buffer]] = {}
    for b in buffers:
        for step in range(b.first, b.last + 1):
            live_at.setdefault(step, []).append(b)
    breadth = {step: sum(align_up(b.size, alignment) for b in bs) for step, bs in live_at.items()}
    order: list[Buffer] = []
    done: set[int] = set()
    for step in sorted(live_at, key=lambda s: (-breadth[s], s)):
        for b in _order_by_size(live_at[step]):
            if b.id not in done:
                done.add(b.id)
                order.append(b)
    return order


def plan_memory(buffers: Iterable[Buffer], alignment: int = 64, strategy: str = "auto") -> MemoryPlan:
    """Place ``buffers`` in one arena with ``strategy`` (one of ``STRATEGIES``, or ``"auto"``: each of them,
    keeping the smallest arena, the earlier strategy on a tie)."""
    _check_alignment(alignment)
    bufs = list(buffers)
    _check_ids(bufs)
    if strategy == "auto":
        plans = [plan_memory(bufs, alignment, name) for name in STRATEGIES]
        best = min(plans, key=lambda p: p.arena_bytes)  # min keeps the first of equals
        # above the bound: the search from each strategy's order, the smallest first, until one reaches the bound
        # (the best greedy order is not always the best start: EfficientNet-B0 at 2 threads on AVX-512, 1.029x
        # the bound greedy by area, where no swap helped; from the order by size the search reaches the bound)
        found, size = None, best.arena_bytes
        for start in sorted(plans, key=lambda p: p.arena_bytes) if best.arena_bytes > best.lower_bound else ():
            trial = _search(bufs, alignment, _order(bufs, alignment, start.strategy), size, best.lower_bound)
            if trial is not None:
                found, size = trial
            if size <= best.lower_bound:
                break
        return _plan(bufs, alignment, found, "search") if found is not None else best
    if strategy not in STRATEGIES:
        raise PassError(f"memory planner: unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)} or auto")
    return _plan(bufs, alignment, _order(bufs, alignment, strategy), strategy)


def _order(bufs: Sequence[Buffer], alignment: int, strategy: str) -> list[Buffer]:
    if strategy == "greedy-by-size":
        return _order_by_size(bufs)
    if strategy == "greedy-by-breadth":
        return _order_by_breadth(bufs, alignment)
    return _order_by_area(bufs)


def _arena(bufs: Sequence[Buffer], alignment: int, offsets: Mapping[int, int]) -> int:
    return max((offsets[b.id] + align_up(b.size, alignment) for b in bufs), default=0)


def _plan(bufs: Sequence[Buffer], alignment: int, order: Sequence[Buffer], strategy: str) -> MemoryPlan:
    offsets = _place(order, alignment)
    return MemoryPlan(
        offsets=dict(sorted(offsets.items())),
        arena_bytes=_arena(bufs, alignment, offsets),
        lower_bound=lower_bound(bufs, alignment),
        no_reuse_bytes=sum(align_up(b.size, alignment) for b in bufs),
        alignment=alignment,
        strategy=strategy,
    )


SEARCH_WORK = 2_000_000  # the search's budget: tries x buffers^2 (about 180 tries of ResNet-50's 106 buffers)


def _search(bufs: Sequence[Buffer], alignment: int, order: list[Buffer], arena: int,
            bound: int) -> tuple[list[Buffer], int] | None:
    """An order whose best-fit placement is smaller than ``arena`` and that placement's arena, or None: the greedy
    ``order`` with a few nearby buffers swapped (seeded, so a model always gets the same plan), keeping each
    improvement, until the lower bound or the budget. Greedy orders miss the bound where equal large buffers land
    in the wrong slots: ResNet-50 at 2 threads on AVX2 1.26x the bound (three 4.5 MB workspaces above the activations),
    ResNet-18 at 1 thread 1.11x; both reach it within 30 tries."""
    rng = random.Random(0)
    found = None
    n = len(order)
    if n < 2:
        return None
    for _ in range(max(20, min(500, SEARCH_WORK // (n * n)))):
        trial = list(found or order)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(n - 1)
            j = min(n - 1, i + rng.randint(1, 6))
            trial[i], trial[j] = trial[j], trial[i]
        size = _arena(bufs, alignment, _place(trial, alignment))
        if size < arena:
            found, arena = trial, size
            if arena <= bound:
                break
    return (found, arena) if found is not None else None


def verify_memory_plan(buffers: Iterable[Buffer], plan: MemoryPlan) -> None:
    """Raise ``PassError`` listing every fault of ``plan`` for ``buffers``: a buffer without an offset,
    a negative or misaligned offset, a buffer that ends beyond ``arena_bytes``, or two buffers live at
    the same step whose ``[offset, offset + aligned size)`` intervals overlap."""
    bufs = list(buffers)
    _check_alignment(plan.alignment)
    _check_ids(bufs)
    faults: list[str] = []
    placed: list[tuple[Buffer, int, int]] = []
    for b in sorted(bufs, key=lambda b: (b.first, b.id)):
        if b.id not in plan.offsets:
            faults.append(f"buffer {b.id} has no offset")
            continue
        offset = plan.offsets[b.id]
        end = offset + align_up(b.size, plan.alignment)
        if offset < 0 or offset % plan.alignment:
            faults.append(f"buffer {b.id} at offset {offset} is not aligned to {plan.alignment}")
        if end > plan.arena_bytes:
            faults.append(f"buffer {b.id} ends at {end}, beyond the arena of {plan.arena_bytes} bytes")
        placed.append((b, offset, end))
    # Sorted by first step: a later buffer overlaps b in time iff it starts before b ends.
    for i, (b, start, end) in enumerate(placed):
        for c, c_start, c_end in placed[i + 1 :]:
            if c.first > b.last:
                break
            if start < c_end and c_start < end:
                faults.append(
                    f"buffers {b.id} [{start}, {end}) and {c.id} [{c_start}, {c_end}) overlap in memory "
                    f"while both are live (steps {max(b.first, c.first)}..{min(b.last, c.last)})"
                )
    if faults:
        raise PassError("memory plan is invalid: " + "; ".join(faults))
