"""FusionPlan: the result of fusion analysis (groups of graph nodes that become one kernel each), and its
verifier.

What goes in: an onnx_ir graph (not mutated: fusion is analysis only) and a partition of its nodes.
What comes out: ``FusionPlan`` — groups in a topological order of the group graph, each with its nodes in
graph order, its external inputs and outputs, its anchor (the node that decides the kernel: the
"master" op, e.g. the Conv of Conv+Add+Relu) and its kind (the max TVM pattern kind over its nodes).

Invariants (checked by ``verify_plan``):
- every node of the graph is in exactly one group;
- each group is convex: no path leaves the group and comes back into it;
- the group graph (an edge when a group reads a value another group produces) is acyclic, and the
  groups are listed in a topological order of it;
- an OPAQUE op is alone in its group; a group holds at most one op of kind OUT_ELEMWISE_FUSABLE or above
  unless the planner says why (TVM never fuses two complex ops).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from dlcc.errors import PassError
from dlcc.ops.table import Kind, op_info


@dataclass
class Group:
    id: int
    nodes: list[ir.Node]  # in graph order
    anchor: ir.Node
    kind: Kind
    inputs: list[ir.Value] = field(default_factory=list)  # read by the group, produced outside it
    outputs: list[ir.Value] = field(default_factory=list)  # produced inside, read outside or graph outputs

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def ops(self) -> list[str]:
        return [n.op_type for n in self.nodes]


@dataclass
class FusionPlan:
    planner: str  # "tvm" | "dnnfusion"
    groups: list[Group]
    graph: ir.Graph
    reason: str = ""  # why this planner's plan was chosen (plan_fusion fills it)

    def group_of(self) -> dict[ir.Node, Group]:
        return {n: g for g in self.groups for n in g.nodes}

    @property
    def num_kernels(self) -> int:
        return len(self.groups)

    @property
    def fusion_rate(self) -> float:
        return sum(len(g) for g in self.groups) / max(1, len(self.groups))


def node_kind(node: ir.Node) -> Kind:
    return op_info(node.op_type, node.domain).kind


def build_plan(graph: ir.Graph, partition: Iterable[Sequence[ir.Node]], planner: str,
               anchors: dict[int, ir.Node] | None = None) -> FusionPlan:
    """Make a FusionPlan from a partition of the graph's nodes: fills order, inputs/outputs, anchor, kind,
    and sorts the groups topologically. ``anchors`` maps a group's index in ``partition`` to its anchor
    (default: its node of the highest kind, the last one on ties)."""
    order = {n: i for i, n in enumerate(graph)}
    parts = [sorted(p, key=order.__getitem__) for p in partition if p]
    groups = []
    for i, nodes in enumerate(parts):
        anchor = (anchors or {}).get(i)
        if anchor is None:
            anchor = max(reversed(nodes), key=lambda n: node_kind(n))
        kind = max(node_kind(n) for n in nodes)
        groups.append(Group(i, nodes, anchor, kind))
    member = {n: g for g in groups for n in g.nodes}
    graph_outputs = set(map(id, graph.outputs))
    for g in groups:
        inside = set(g.nodes)
        seen_in: set[int] = set()
        for n in g.nodes:
            for v in n.inputs:
                if v is None or id(v) in seen_in:
                    continue
                p = v.producer()
                if p is None or p not in inside:
                    seen_in.add(id(v))
                    g.inputs.append(v)
            for v in n.outputs:
                if id(v) in graph_outputs or any(u.node not in inside for u in v.uses()):
                    g.outputs.append(v)
    groups = _topological(groups, member, order)
    for i, g in enumerate(groups):
        g.id = i
    return FusionPlan(planner, groups, graph)


def _topological(groups: list[Group], member: dict[ir.Node, Group], order: dict[ir.Node, int]) -> list[Group]:
    """Groups in a topological order of the group graph, ties broken by graph order. A cyclic group graph
    (a non-convex partition) keeps the rest in graph order; ``verify_plan`` reports it."""
    deps: dict[int, set[int]] = {id(g): set() for g in groups}
    for g in groups:
        for v in g.inputs:
            p = v.producer()
            if p is not None and p in member and member[p] is not g:
                deps[id(g)].add(id(member[p]))
    pending = sorted(groups, key=lambda g: order[g.nodes[0]])
    done: list[Group] = []
    placed: set[int] = set()
    while pending:
        ready = next((g for g in pending if deps[id(g)] <= placed), pending[0])
        done.append(ready)
        placed.add(id(ready))
        pending.remove(ready)
    return done


def verify_plan(plan: FusionPlan) -> None:
    """Raise PassError listing every broken invariant (see the module docstring)."""
    problems: list[str] = []
    graph = plan.graph
    count: dict[ir.Node, int] = {}
    for g in plan.groups:
        for n in g.nodes:
            count[n] = count.get(n, 0) + 1
    for n in graph:
        c = count.get(n, 0)
        if c != 1:
            problems.append(f"node {n.op_type} '{n.name}' is in {c} groups")
    extra = [n for n in count if n.graph is not graph]
    if extra:
        problems.append(f"{len(extra)} planned node(s) are not in the graph")
    member = plan.group_of()
    position = {id(g): i for i, g in enumerate(plan.groups)}
    for g in plan.groups:
        if not g.nodes:
            problems.append(f"group {g.id} is empty")
            continue
        if g.anchor not in g.nodes:
            problems.append(f"group {g.id}: anchor is not a member")
        if len(g.nodes) > 1 and any(node_kind(n) == Kind.OPAQUE for n in g.nodes):
            problems.append(f"group {g.id}: an opaque op is fused with others ({', '.join(g.ops)})")
        for v in g.inputs:  # group order is topological
            p = v.producer()
            if p is not None and p in member and position[id(member[p])] >= position[id(g)]:
                problems.append(f"group {g.id} reads '{v.name}' from a group that comes later")
        if not _convex(g, member):
            problems.append(f"group {g.id} is not convex ({', '.join(g.ops)})")
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise PassError(f"fusion plan ({plan.planner}) is invalid: {shown}")


def _convex(g: Group, member: dict[ir.Node, Group]) -> bool:
    """No path from a group output, through nodes outside the group, back into the group."""
    inside = set(g.nodes)
    stack = [u.node for v in g.outputs for u in v.uses() if u.node not in inside]
    seen: set[ir.Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for v in n.outputs:
            for u in v.uses():
                if u.node in inside:
                    return False
                stack.append(u.node)
    return True
