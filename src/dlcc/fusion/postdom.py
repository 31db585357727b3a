"""The indexed forward graph and its post-dominator tree (TVM FuseOps, analysis half).

What goes in: an onnx_ir graph (read only). What comes out: ``ForwardGraph`` (one ``FNode`` per graph node,
in topological order) and ``PostDomTree`` (one ``DomNode`` per ``FNode``, same indices).

The algorithm, in prose:

1. Forward graph. Number the nodes in topological (graph) order. Each node gets its pattern kind from the
   op table, with one refinement: a BROADCAST node whose operands all have the output's static shape is
   really ELEMWISE. Each node lists its output edges: one edge per use of one of its outputs by another
   node, carrying the *consumer's* kind, where (as in TVM) an edge into a BROADCAST consumer counts as
   ELEMWISE when that operand already has the consumer's output shape (``conv -> Add(conv, bias)``: the
   conv output is not broadcast). A node is ``extern_ref`` when one of its outputs is a graph output (or is
   read by a node outside this graph, e.g. a subgraph): such a node must be materialized, it is a barrier.

2. Post-dominator tree, built in reverse topological order so that every consumer is already in the tree
   when its producer is visited. A node's immediate post-dominator is the least common ancestor, in the
   tree built so far, of all its consumers; ``extern_ref`` nodes and nodes without consumers get none
   (they are roots, depth 1). The LCA walk climbs the deeper of two nodes (both when level) until they
   meet, and while climbing folds ``max`` over the kinds of the edges and tree links it passes, so each
   tree node remembers the worst kind between itself and its post-dominator::

        conv ─▶ relu ───┐            postdom(conv) = add, pattern = max(edges conv->relu, conv->sig,
          └───▶ sigmoid ┴─▶ add                            relu->add, sig->add) = ELEMWISE

   If any climb runs off a root (a consumer with no post-dominator), there is no common ancestor and the
   node has no post-dominator either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

from dlcc.fusion.plan import node_kind
from dlcc.ops.table import Kind

__all__ = ["DomNode", "Edge", "FNode", "ForwardGraph", "PostDomTree", "build_forward_graph",
           "build_postdom_tree", "effective_kind"]

KindFn = Callable[[ir.Node], Kind]


@dataclass
class Edge:
    node: FNode  # the consumer
    kind: Kind  # the consumer's kind as seen through this operand


@dataclass(eq=False)
class FNode:
    index: int
    node: ir.Node
    kind: Kind
    outputs: list[Edge] = field(default_factory=list)
    extern_ref: bool = False

    def __repr__(self) -> str:
        return f"FNode({self.index}, {self.node.op_type}, {self.kind.name}, extern_ref={self.extern_ref})"


@dataclass
class ForwardGraph:
    nodes: list[FNode]  # topological order
    index: dict[ir.Node, FNode]

    def __getitem__(self, node: ir.Node) -> FNode:
        return self.index[node]


@dataclass(eq=False)
class DomNode:
    fnode: FNode
    parent: DomNode | None  # the immediate post-dominator
    depth: int
    pattern: Kind  # max kind on all paths from this node to its parent (edges and tree links)

    def __repr__(self) -> str:
        parent = self.parent.fnode.node.op_type if self.parent else None
        return f"DomNode({self.fnode.node.op_type}, parent={parent}, depth={self.depth}, {self.pattern.name})"


@dataclass
class PostDomTree:
    nodes: list[DomNode]  # same indices as ForwardGraph.nodes

    def parent_of(self, fnode: FNode) -> FNode | None:
        parent = self.nodes[fnode.index].parent
        return parent.fnode if parent is not None else None


def _static_dims(value: ir.Value | None) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    if shape is None or not shape.is_static():
        return None
    return tuple(int(d) for d in shape.dims)


def _same_shape(operand: ir.Value, out: tuple[int, ...] | None) -> bool:
    return out is not None and _static_dims(operand) == out


def effective_kind(node: ir.Node, kind_of: KindFn = node_kind) -> Kind:
    """The node's kind, with a BROADCAST whose operands all have the output's static shape as ELEMWISE."""
    kind = kind_of(node)
    if kind == Kind.BROADCAST and node.outputs:
        out = _static_dims(node.outputs[0])
        operands = [v for v in node.inputs if v is not None]
        if operands and all(_same_shape(v, out) for v in operands):
            return Kind.ELEMWISE
    return kind


def build_forward_graph(graph: ir.Graph, kind_of: KindFn = node_kind) -> ForwardGraph:
    """Index the graph's nodes in topological order with their kinds, output edges and barriers."""
    fnodes = [FNode(i, n, effective_kind(n, kind_of)) for i, n in enumerate(graph)]
    index = {f.node: f for f in fnodes}
    graph_outputs = {id(v) for v in graph.outputs}
    for f in fnodes:
        for v in f.node.outputs:
            if id(v) in graph_outputs:
                f.extern_ref = True
            for use in v.uses():
                consumer = index.get(use.node)
                if consumer is None:  # read from a subgraph or another graph: must be materialized
                    f.extern_ref = True
                    continue
                kind = consumer.kind
                if kind == Kind.BROADCAST and consumer.node.outputs and \
                        _same_shape(v, _static_dims(consumer.node.outputs[0])):
                    kind = Kind.ELEMWISE
                f.outputs.append(Edge(consumer, kind))
    return ForwardGraph(fnodes, index)


def _lca(a: DomNode | None, b: DomNode | None, pattern: Kind) -> tuple[DomNode | None, Kind]:
    """Climb the deeper of the two (both when level) until they meet, folding the tree links' kinds."""
    while a is not b:
        if a is None or b is None:
            return None, pattern
        if a.depth < b.depth:
            pattern, b = max(pattern, b.pattern), b.parent
        elif b.depth < a.depth:
            pattern, a = max(pattern, a.pattern), a.parent
        else:
            pattern = max(pattern, a.pattern, b.pattern)
            a, b = a.parent, b.parent
    return a, pattern


def build_postdom_tree(fg: ForwardGraph) -> PostDomTree:
    """The post-dominator tree of the forward graph (see the module docstring)."""
    tree: list[DomNode | None] = [None] * len(fg.nodes)
    for f in reversed(fg.nodes):
        parent: DomNode | None = None
        pattern = Kind.ELEMWISE
        if not f.extern_ref and f.outputs:
            first, *rest = f.outputs
            parent = tree[first.node.index]
            pattern = max(pattern, first.kind)
            for edge in rest:
                parent, pattern = _lca(parent, tree[edge.node.index], pattern)
                pattern = max(pattern, edge.kind)
        elif f.extern_ref:
            pattern = Kind.OPAQUE
        tree[f.index] = DomNode(f, parent, parent.depth + 1 if parent else 1, pattern)
    return PostDomTree([d for d in tree if d is not None])
