"""DNNFusion's fusion planner (Niu et al., PLDI 2021): mapping types, a pair table and seeded growth.

What goes in: an ``onnx_ir`` model or graph with shapes inferred (``dlcc.frontend.shapes.infer_shapes``).
The graph is never mutated: this is analysis only. What comes out: a verified ``FusionPlan`` (planner
``"dnnfusion"``), built by ``dlcc.fusion.plan.build_plan``.

The algorithm:

1. Every op has a mapping type (``dlcc.ops.table.Mapping``). Whether a producer may be fused with a
   consumer is read from a pair table over (producer group's mapping, consumer op's mapping):
   ONE_TO_ONE with anything fuses (ALWAYS); ONE_TO_MANY -> MANY_TO_MANY and MANY_TO_MANY -> MANY_TO_MANY
   never fuse (NEVER: the consumer would recompute the producer for every element it reads); every other
   pair is MEASURE, decided by a cost model (``fuse_profitable``) or by a caller's ``measure`` hook. A
   fused group's mapping is the ``more_complex`` of the two.
2. Seeds are the ONE_TO_ONE ops, smallest intermediate result (output bytes) first. A seed that is not yet
   in a group starts a group and grows it, first through its successors (consumers), then through its
   predecessors (producers), each until nothing more can be added. A candidate is taken only if it is not
   in a group already, it is not OPAQUE, the pair decision says fuse, and the group stays convex with it
   (checked before adding: no path may leave the group and come back)::

       seed ──▶ consumer ──▶ consumer        producer ──▶ producer ──▶ seed
       (successors first, to a fixpoint)     (then predecessors, to a fixpoint)

3. After all seeds, every node not in a group is a group of its own (OPAQUE ops always are). Graph
   outputs may be produced inside a group: they become group outputs.

Growing through successors a pair is (group, consumer op); through predecessors it is (producer op,
group): the table is always read producer first.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence

import onnx_ir as ir

from dlcc.fusion.plan import FusionPlan, build_plan, verify_plan
from dlcc.ops.cost import node_flops, static_shape
from dlcc.ops.table import Kind, Mapping, more_complex, op_info

__all__ = [
    "COST_PER_BYTE",
    "COST_PER_FLOP",
    "MAX_LIVE_INTERMEDIATES",
    "PAIR_TABLE",
    "SPILL_COST",
    "Decision",
    "MeasureHook",
    "bytes_moved",
    "bytes_moved_unfused",
    "decide",
    "fuse_profitable",
    "plan_dnnfusion",
]


class Decision(enum.Enum):
    """What the pair table says about fusing a producer with a consumer."""

    ALWAYS = "always"  # fuse: no recomputation, an intermediate tensor is saved
    NEVER = "never"  # do not fuse: the consumer would recompute the producer many times
    MEASURE = "measure"  # it depends on sizes: ask the cost model or the ``measure`` hook


_O, _R, _S, _M1, _MM = (Mapping.ONE_TO_ONE, Mapping.REORGANIZE, Mapping.SHUFFLE, Mapping.ONE_TO_MANY,
                        Mapping.MANY_TO_MANY)
_A, _N, _X = Decision.ALWAYS, Decision.NEVER, Decision.MEASURE

# (producer mapping, consumer mapping) -> decision. Rows: producer; columns: consumer, in the order
# one-to-one, reorganize, shuffle, one-to-many, many-to-many.
_ROWS: dict[Mapping, tuple[Decision, ...]] = {
    #        O   R   S   M1  MM
    _O:  (_A, _A, _A, _A, _A),
    _R:  (_A, _X, _X, _X, _X),
    _S:  (_A, _X, _X, _X, _X),
    _M1: (_A, _X, _X, _X, _N),
    _MM: (_A, _X, _X, _X, _N),
}
_COLUMNS = (_O, _R, _S, _M1, _MM)

PAIR_TABLE: dict[tuple[Mapping, Mapping], Decision] = {
    (first, second): row[i] for first, row in _ROWS.items() for i, second in enumerate(_COLUMNS)
}


def decide(first: Mapping, second: Mapping) -> Decision:
    """The pair table's decision for a producer of mapping ``first`` followed by a consumer ``second``."""
    return PAIR_TABLE[(first, second)]


# ------------------------------------------------------------------------------------- cost model

COST_PER_BYTE = 1.0  # cost of moving one byte to or from memory
COST_PER_FLOP = 0.25  # cost of one FLOP (a byte of memory traffic costs about four FLOPs)
MAX_LIVE_INTERMEDIATES = 8  # intermediate tensors a fused kernel can keep in registers
SPILL_COST = 1024.0  # cost of each intermediate tensor beyond MAX_LIVE_INTERMEDIATES

MeasureHook = Callable[[Sequence[ir.Node], Sequence[ir.Node]], bool]
"""``measure(producer_nodes, consumer_nodes) -> fuse?`` decides a MEASURE pair instead of the cost model.

``--fusion-tune`` is meant to pass a hook that generates both variants (the two sides as separate
kernels, and fused), times them, and answers True when the fused kernel is faster. The nodes are given in
graph order; the hook must not mutate the graph."""


def _value_bytes(value: ir.Value | None) -> int | None:
    dims = static_shape(value)
    if value is None or dims is None or value.dtype is None:
        return None
    try:
        itemsize = value.dtype.itemsize
    except TypeError:  # STRING, UNDEFINED: no fixed size
        return None
    return math.ceil(math.prod(dims) * itemsize)


def _elements(value: ir.Value | None) -> int | None:
    dims = static_shape(value)
    return None if dims is None else math.prod(dims)


def _mapping(node: ir.Node) -> Mapping:
    return op_info(node.op_type, node.domain).mapping


def fan_out(node: ir.Node) -> float | None:
    """How many output elements a ONE_TO_MANY node makes per element of its largest input (at least 1);
    1 for every other mapping; None when a shape is unknown."""
    if _mapping(node) is not Mapping.ONE_TO_MANY:
        return 1.0
    out = _elements(node.outputs[0]) if node.outputs else None
    sizes = [_elements(v) for v in node.inputs if v is not None]
    if out is None or not sizes or any(s is None for s in sizes):
        return None
    largest = max(s for s in sizes if s is not None)
    return max(1.0, out / max(1, largest))


def fuse_profitable(producer: Sequence[ir.Node], consumer: Sequence[ir.Node]) -> bool:
    """The cost model for a MEASURE pair: fuse the ``producer`` side with the ``consumer`` side?

    ``benefit = COST_PER_BYTE * saved_bytes`` where ``saved_bytes`` sums, over each tensor the producer
    side writes and the consumer side reads, its bytes (dtype itemsize * elements) twice (the write and the
    read) when the fused group no longer needs to write it, once (the read) when it still must (read
    elsewhere or a graph output).

    ``cost = COST_PER_FLOP * recompute_flops + SPILL_COST * max(0, live - MAX_LIVE_INTERMEDIATES)`` where

    - ``recompute_flops = sum(node_flops(p) * fan_out(p) for ONE_TO_MANY p on the producer side)``: a
      one-to-many producer inlined into its consumer may compute its result again for every output
      element; plus, when the consumer side has ONE_TO_MANY ops, ``node_flops(producer side) *
      fan_out(c)`` for each such op c (it reads each producer element several times);
    - ``live`` is the number of intermediate tensors in the fused group (made and read inside it): a proxy
      for the registers the fused kernel needs.

    Fuse when ``benefit > cost``. An unknown size or FLOP count means do not fuse (no evidence).
    """
    fused = set(producer) | set(consumer)
    consumer_set = set(consumer)
    saved = 0
    for p in producer:
        for v in p.outputs:
            uses = v.uses()
            if not any(u.node in consumer_set for u in uses):
                continue
            size = _value_bytes(v)
            if size is None:
                return False
            still_written = v.is_graph_output() or any(u.node not in fused for u in uses)
            saved += size if still_written else 2 * size
    producer_flops = 0.0
    recompute = 0.0
    for p in producer:
        flops = node_flops(p)
        if flops is None:
            return False
        producer_flops += flops
        if _mapping(p) is Mapping.ONE_TO_MANY:
            factor = fan_out(p)
            if factor is None:
                return False
            recompute += flops * factor
    for c in consumer:
        if _mapping(c) is Mapping.ONE_TO_MANY:
            factor = fan_out(c)
            if factor is None:
                return False
            recompute += producer_flops * factor
    live = sum(1 for n in fused for v in n.outputs if any(u.node in fused for u in v.uses()))
    cost = COST_PER_FLOP * recompute + SPILL_COST * max(0, live - MAX_LIVE_INTERMEDIATES)
    return COST_PER_BYTE * saved > cost


# ------------------------------------------------------------------------------------- the planner


def _is_opaque(node: ir.Node) -> bool:
    return op_info(node.op_type, node.domain).kind == Kind.OPAQUE


def _producers(node: ir.Node) -> list[ir.Node]:
    return [p for v in node.inputs if v is not None and (p := v.producer()) is not None]


def _consumers(node: ir.Node) -> list[ir.Node]:
    return [u.node for v in node.outputs for u in v.uses()]


class _Planner:
    def __init__(self, graph: ir.Graph, measure: MeasureHook | None, max_group_size: int) -> None:
        self.graph = graph
        self.measure = measure
        self.max_group_size = max_group_size
        self.order = {n: i for i, n in enumerate(graph)}
        self.taken: set[ir.Node] = set()
        self.group_of: dict[ir.Node, tuple[ir.Node, ...]] = {}  # taken node -> its group
        self.spans: list[tuple[int, int]] = []  # (first, last) graph position of each taken group

    def convex_with(self, group: set[ir.Node], node: ir.Node) -> bool:
        """Would ``group | {node}`` be convex, with the groups already taken as units (kernels)? Walk forward
        from the set through outside nodes; reaching the set again means a path leaves and comes back.
        Reaching a member of a taken group continues from all its members: the group runs as one kernel,
        so a path into one member and out of another is a path (two groups each convex alone can still
        need each other). Only nodes at or before ``bound`` in graph order (topological) can lead back: the
        set's last node, widened to the last member of every taken group starting before the bound."""
        members = group | {node}
        bound = max(self.order[n] for n in members)
        changed = True
        while changed:
            changed = False
            for lo, hi in self.spans:
                if lo <= bound < hi:
                    bound, changed = hi, True
        stack = [c for m in members for c in _consumers(m) if c not in members]
        seen: set[ir.Node] = set()
        while stack:
            n = stack.pop()
            if n in seen or self.order.get(n, bound + 1) > bound:
                continue
            unit = self.group_of.get(n, (n,))
            seen.update(unit)
            for c in (c for u in unit for c in _consumers(u)):
                if c in members:
                    return False
                stack.append(c)
        return True

    def fuses(self, producer: Sequence[ir.Node], first: Mapping, consumer: Sequence[ir.Node],
              second: Mapping) -> bool:
        decision = decide(first, second)
        if decision is Decision.MEASURE:
            if self.measure is not None:
                return bool(self.measure(self._sorted(producer), self._sorted(consumer)))
            return fuse_profitable(self._sorted(producer), self._sorted(consumer))
        return decision is Decision.ALWAYS

    def _sorted(self, nodes: Iterable[ir.Node]) -> list[ir.Node]:
        return sorted(nodes, key=self.order.__getitem__)

    def can_take(self, group: set[ir.Node], node: ir.Node) -> bool:
        return (node not in self.taken and node not in group and node.graph is self.graph
                and not _is_opaque(node) and len(group) < self.max_group_size)

    def grow(self, seed: ir.Node) -> list[ir.Node]:
        group = {seed}
        mapping = _mapping(seed)
        changed = True
        while changed:  # successors, to a fixpoint
            changed = False
            for c in self._sorted({c for m in group for c in _consumers(m)}):
                if not self.can_take(group, c):
                    continue
                if self.fuses(group, mapping, [c], _mapping(c)) and self.convex_with(group, c):
                    group.add(c)
                    mapping = more_complex(mapping, _mapping(c))
                    changed = True
        changed = True
        while changed:  # then predecessors, to a fixpoint
            changed = False
            for p in reversed(self._sorted({p for m in group for p in _producers(m)})):
                if not self.can_take(group, p):
                    continue
                if self.fuses([p], _mapping(p), group, mapping) and self.convex_with(group, p):
                    group.add(p)
                    mapping = more_complex(_mapping(p), mapping)
                    changed = True
        return self._sorted(group)

    def seeds(self) -> list[ir.Node]:
        """ONE_TO_ONE, non-opaque ops, smallest output bytes first (unknown sizes last), then graph order."""
        def size(n: ir.Node) -> float:
            sizes = [_value_bytes(v) for v in n.outputs]
            if not sizes or any(s is None for s in sizes):
                return math.inf
            return float(sum(s for s in sizes if s is not None))

        candidates = [n for n in self.graph if _mapping(n) is Mapping.ONE_TO_ONE and not _is_opaque(n)]
        return sorted(candidates, key=lambda n: (size(n), self.order[n]))

    def partition(self) -> list[list[ir.Node]]:
        groups: list[list[ir.Node]] = []
        for seed in self.seeds():
            if seed in self.taken:
                continue
            group = self.grow(seed)
            self.taken.update(group)
            self.group_of.update((n, tuple(group)) for n in group)
            self.spans.append((self.order[group[0]], self.order[group[-1]]))
            groups.append(group)
        groups.extend([n] for n in self.graph if n not in self.taken)
        return groups


def _graph_of(model_or_graph: ir.Model | ir.Graph) -> ir.Graph:
    return model_or_graph.graph if isinstance(model_or_graph, ir.Model) else model_or_graph


def plan_dnnfusion(model_or_graph: ir.Model | ir.Graph, *, measure: MeasureHook | None = None,
                   max_group_size: int = 256) -> FusionPlan:
    """Plan fusion groups for the top-level graph with DNNFusion's algorithm (module docstring).

    ``measure``, when given, decides the MEASURE pairs instead of the cost model (``fuse_profitable``);
    see ``MeasureHook``. ``max_group_size`` caps the nodes in one group. The plan is always verified
    (``verify_plan``; a broken invariant raises PassError)."""
    if max_group_size < 1:
        raise ValueError(f"max_group_size must be at least 1, not {max_group_size}")
    graph = _graph_of(model_or_graph)
    plan = build_plan(graph, _Planner(graph, measure, max_group_size).partition(), "dnnfusion")
    verify_plan(plan)
    return plan


# ------------------------------------------------------------------------------------- bytes moved


def bytes_moved(plan: FusionPlan) -> int:
    """Bytes the plan's kernels read and write: the sum over groups of the sizes of the group's inputs
    (weights included) and outputs. Values of unknown size count 0."""
    return sum(_value_bytes(v) or 0 for g in plan.groups for v in [*g.inputs, *g.outputs])


def bytes_moved_unfused(model_or_graph: ir.Model | ir.Graph) -> int:
    """``bytes_moved`` of the plan with one group per node: the figure before fusion."""
    graph = _graph_of(model_or_graph)
    return bytes_moved(build_plan(graph, [[n] for n in graph], "unfused"))
