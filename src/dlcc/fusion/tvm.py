"""TVM's FuseOps grouping, as analysis over an onnx_ir graph: ``plan_tvm(model_or_graph) -> FusionPlan``.

What goes in: an ``ir.Model`` or ``ir.Graph`` with shapes inferred (shapes only refine BROADCAST into
ELEMWISE; without them fusion is just more conservative). The graph is never mutated.
What comes out: a verified ``FusionPlan`` (planner ``"tvm"``), each group's anchor being its master op
(the Conv of Conv+Add+Relu) or, without one, the group's root (the node everything else fused into).

The algorithm, in prose (Chen et al., TVM, OSDI 2018; Relay's FuseOps pass):

Every node starts as its own group in a union-find forest; a group has a root node, a pattern (its kind),
an anchor (its OUT_ELEMWISE_FUSABLE op, if any) and a size. Fusing a node into its post-dominator P
("committing") merges every group met on the paths from the node up to (not including) P into P's group.
A fusion is only tried from a node to its immediate post-dominator (see ``postdom``), and only when the
path check holds: every node on every path from the node to P (P included) has a group pattern that
satisfies a predicate, and the merged group would not exceed ``max_group_size`` nodes. Nodes are visited
in topological order, in three phases:

- phase 0: an OUT_ELEMWISE_FUSABLE op (conv, matmul, pooling) fuses into P when the post-dominator
  relation is ELEMWISE (every edge and link between them is elementwise, so the epilogue is computed on
  the op's output index) and every node on the paths, P included, is ELEMWISE or BROADCAST. The merged
  group takes the anchor and the OUT_ELEMWISE_FUSABLE pattern.
- phase 1: an ELEMWISE/BROADCAST op fuses into P when the relation is <= INJECTIVE or is COMM_REDUCE
  (a reduction absorbs its elementwise producers), the inner path nodes are <= INJECTIVE and P's group is
  anything but a TUPLE or OPAQUE; an INJECTIVE (or TUPLE) op fuses into P when everything on the path,
  P included, is <= INJECTIVE. INJECTIVE fusion waits for phase 1 so that convs finish fusing first.
  Nothing fuses into a TUPLE in phase 0 and 1.
- phase 2: INJECTIVE ops fuse into a TUPLE post-dominator that has meanwhile been fused into an
  injective consumer (Relay's ``concatenate(tuple(...))``). dlcc's Concat is one INJECTIVE node, so its
  injective producers already fused in phase 1; phase 2 acts on ops of kind TUPLE only.

Invariants that follow: a COMM_REDUCE op never starts a fusion (it is only ever a sink); an OPAQUE op is
always alone; no group holds two OUT_ELEMWISE_FUSABLE ops (an anchored group has a pattern above
INJECTIVE, so it is never an inner path node, and a phase-0 sink is <= BROADCAST); a node that produces a
graph output has no post-dominator, so it never fuses into its consumers (it can still absorb its
producers: graph outputs are produced by group roots). Group sizes are counted exactly (TVM's count is
an approximation that may count a group twice).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from dlcc.fusion.plan import FusionPlan, build_plan, node_kind, verify_plan
from dlcc.fusion.postdom import FNode, ForwardGraph, PostDomTree, build_forward_graph, build_postdom_tree
from dlcc.ops.table import Kind

__all__ = ["Grouping", "plan_tvm"]

Cond = Callable[[Kind, bool], bool]  # (group pattern, is the sink) -> allowed


class Grouping:
    """Union-find over the forward graph's nodes with TVM's per-group facts, and the three phases."""

    def __init__(self, fg: ForwardGraph, tree: PostDomTree, max_group_size: int = 256) -> None:
        self.fg, self.tree, self.max_group_size = fg, tree, max_group_size
        n = len(fg.nodes)
        self.parent = list(range(n))
        self.pattern = [f.kind for f in fg.nodes]
        self.anchor: list[FNode | None] = [f if f.kind == Kind.OUT_ELEMWISE_FUSABLE else None for f in fg.nodes]
        self.size = [1] * n

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:  # path compression
            self.parent[i], i = root, self.parent[i]
        return root

    def _merge(self, child: int, into: int) -> None:
        child, into = self.find(child), self.find(into)
        if child == into:
            return
        self.parent[child] = into
        self.size[into] += self.size[child]
        if self.anchor[child] is not None:
            self.anchor[into] = self.anchor[child]
            self.pattern[into] = max(self.pattern[into], self.pattern[child])

    def _path(self, src: FNode, sink: FNode) -> list[FNode]:
        """Every node on every path from src's consumers to sink (sink last, src excluded)."""
        seen: set[int] = set()
        order: list[FNode] = []
        stack = [e.node for e in src.outputs]
        while stack:
            f = stack.pop()
            if f.index in seen:
                continue
            seen.add(f.index)
            order.append(f)
            if f is not sink:
                stack.extend(e.node for e in f.outputs)
        return order

    def check_path(self, src: FNode, sink: FNode, cond: Cond) -> bool:
        """Every node between src and its post-dominator sink (sink included) satisfies ``cond`` on its
        group's pattern, and merging them all would keep the group within ``max_group_size``."""
        path = self._path(src, sink)
        if not all(cond(self.pattern[self.find(f.index)], f is sink) for f in path):
            return False
        roots = {self.find(f.index) for f in path} | {self.find(src.index)}
        if sum(self.size[r] for r in roots) > self.max_group_size:
            return False
        anchors = [self.anchor[r] for r in roots if self.anchor[r] is not None]
        return len(anchors) <= 1  # never two complex ops in one group (TVM asserts it; we refuse)

    def commit(self, src: FNode, sink: FNode) -> None:
        """Merge src and every group on its paths to sink into sink's group."""
        for f in [src, *self._path(src, sink)]:
            if f is not sink:
                self._merge(f.index, sink.index)

    def run_phase(self, phase: int) -> None:
        for f in self.fg.nodes:
            dom = self.tree.nodes[f.index]
            pattern = self.pattern[f.index]  # the node's own group record, as in TVM (not its root's)
            if pattern == Kind.OPAQUE or dom.parent is None:
                continue
            sink = dom.parent.fnode
            if phase == 2:
                self._phase2(f, sink, pattern)
                continue
            if self.find(f.index) == self.find(sink.index):
                continue
            if self.pattern[sink.index] == Kind.TUPLE:  # no fusing into a tuple before phase 2
                continue
            if pattern == Kind.OUT_ELEMWISE_FUSABLE:
                if phase == 0 and dom.pattern == Kind.ELEMWISE and \
                        self.check_path(f, sink, lambda k, is_sink: k <= Kind.BROADCAST):
                    self.commit(f, sink)
            elif pattern <= Kind.BROADCAST:
                if (dom.pattern <= Kind.INJECTIVE or dom.pattern == Kind.COMM_REDUCE) and \
                        self.check_path(f, sink, _elemwise_cond):
                    self.commit(f, sink)
            elif pattern in (Kind.INJECTIVE, Kind.TUPLE) and phase == 1 and \
                    self.check_path(f, sink, lambda k, is_sink: k <= Kind.INJECTIVE):
                self.commit(f, sink)
            # COMM_REDUCE: never starts a fusion; it can only be a sink.

    def _phase2(self, f: FNode, sink: FNode, pattern: Kind) -> None:
        if pattern > Kind.INJECTIVE:
            return
        root_pattern = self.pattern[self.find(sink.index)]
        if root_pattern == Kind.TUPLE:  # the tuple was not fused downstream: leave its fields alone
            return
        if self.pattern[sink.index] == Kind.TUPLE and root_pattern <= Kind.INJECTIVE and \
                self.check_path(f, sink, lambda k, is_sink: k <= Kind.INJECTIVE):
            self.commit(f, sink)

    def run(self) -> None:
        for phase in (0, 1, 2):
            self.run_phase(phase)

    def groups(self) -> tuple[list[list[ir.Node]], dict[int, ir.Node]]:
        """The partition (groups in order of their first node) and each group's anchor (by index)."""
        members: dict[int, list[ir.Node]] = {}
        for f in self.fg.nodes:
            members.setdefault(self.find(f.index), []).append(f.node)
        partition, anchors = [], {}
        for i, (root, nodes) in enumerate(members.items()):
            partition.append(nodes)
            anchor = self.anchor[root]
            anchors[i] = anchor.node if anchor is not None else self.fg.nodes[root].node
        return partition, anchors


def _elemwise_cond(kind: Kind, is_sink: bool) -> bool:
    # inner nodes on parallel branches may be injective; the sink may already hold a conv epilogue
    if not is_sink:
        return kind <= Kind.INJECTIVE
    return kind <= Kind.INJECTIVE or kind in (Kind.COMM_REDUCE, Kind.OUT_ELEMWISE_FUSABLE)


def plan_tvm(model_or_graph: ir.Model | ir.Graph, *, max_group_size: int = 256,
             kind_of: Callable[[ir.Node], Kind] = node_kind) -> FusionPlan:
    """Group the graph's nodes with TVM's FuseOps rules; ``kind_of`` overrides the op table (for tests).
    The plan is always verified (``PassError`` if an invariant broke)."""
    graph = model_or_graph.graph if isinstance(model_or_graph, ir.Model) else model_or_graph
    if max_group_size < 1:
        raise ValueError(f"max_group_size must be at least 1, not {max_group_size}")
    fg = build_forward_graph(graph, kind_of)
    grouping = Grouping(fg, build_postdom_tree(fg), max_group_size)
    grouping.run()
    partition, anchors = grouping.groups()
    plan = build_plan(graph, partition, "tvm", anchors)
    verify_plan(plan)
    return plan
