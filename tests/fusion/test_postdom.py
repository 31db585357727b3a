"""The indexed forward graph (kinds, edges, barriers) and the post-dominator tree."""

from __future__ import annotations

import onnx_ir as ir

from dlcc.frontend.shapes import infer_shapes
from dlcc.fusion.postdom import build_forward_graph, build_postdom_tree, effective_kind
from dlcc.ops.table import Kind

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'


def _graph(body: str) -> ir.Graph:
    return infer_shapes(ir.from_onnx_text(HEAD + body)).graph


def _by_name(graph: ir.Graph) -> dict[str, ir.Node]:
    return {n.outputs[0].name: n for n in graph}


DIAMOND = """
g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
    c = Conv <pads = [1,1,1,1]> (x, w)
    r = Relu(c)
    s = Sigmoid(c)
    y = Add(r, s)
}
"""


def test_forward_graph_of_a_diamond() -> None:
    g = _graph(DIAMOND)
    fg = build_forward_graph(g)
    assert [f.node.op_type for f in fg.nodes] == ["Conv", "Relu", "Sigmoid", "Add"]
    assert [f.index for f in fg.nodes] == [0, 1, 2, 3]
    conv, relu, sig, add = fg.nodes
    assert conv.kind == Kind.OUT_ELEMWISE_FUSABLE
    assert add.kind == Kind.ELEMWISE  # a BROADCAST whose operands all have the output's shape
    assert [(e.node.node.op_type, e.kind) for e in conv.outputs] == [("Relu", Kind.ELEMWISE),
                                                                       ("Sigmoid", Kind.ELEMWISE)]
    assert [e.node for e in relu.outputs] == [add] and [e.node for e in sig.outputs] == [add]
    assert add.extern_ref and not any(f.extern_ref for f in (conv, relu, sig))
    assert add.outputs == []


def test_postdom_tree_of_a_diamond() -> None:
    fg = build_forward_graph(_graph(DIAMOND))
    tree = build_postdom_tree(fg)
    conv, relu, sig, add = fg.nodes
    assert tree.parent_of(conv) is add and tree.parent_of(relu) is add and tree.parent_of(sig) is add
    assert tree.parent_of(add) is None
    assert [d.depth for d in tree.nodes] == [2, 2, 2, 1]
    assert tree.nodes[conv.index].pattern == Kind.ELEMWISE
    assert tree.nodes[add.index].pattern == Kind.OPAQUE  # a graph output is a barrier


def test_fork_with_a_graph_output_has_no_postdominator() -> None:
    g = _graph("""
    g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] r, float[1,4,8,8] y) {
        c = Conv <pads = [1,1,1,1]> (x, w)
        r = Relu(c)
        s = Sigmoid(c)
        y = Add(r, s)
    }
    """)
    fg = build_forward_graph(g)
    tree = build_postdom_tree(fg)
    conv, relu, sig, add = fg.nodes
    assert relu.extern_ref and add.extern_ref
    assert tree.parent_of(relu) is None  # its value must be materialized
    assert tree.parent_of(sig) is add
    assert tree.parent_of(conv) is None  # one path ends at a barrier: no common post-dominator


def test_lca_walk_carries_the_worst_kind() -> None:
    g = _graph("""
    g (float[1,4,8,8] x) => (float[1,4,8,8] y) {
        r = Relu(x)
        t = Transpose <perm = [0,1,3,2]> (r)
        e = Exp(t)
        s = Sigmoid(r)
        y = Add(e, s)
    }
    """)
    fg = build_forward_graph(g)
    tree = build_postdom_tree(fg)
    nodes = {f.node.outputs[0].name: f for f in fg.nodes}
    assert tree.parent_of(nodes["r"]) is nodes["y"]
    assert tree.nodes[nodes["r"].index].pattern == Kind.INJECTIVE  # through the Transpose edge
    assert tree.nodes[nodes["s"].index].pattern == Kind.ELEMWISE
    assert tree.parent_of(nodes["t"]) is nodes["e"]


def test_broadcast_edges_and_kinds() -> None:
    g = _graph("""
    g (float[1,4,8,8] x, float[1,4,1,1] b, float[1,4,8,8] z) => (float[1,4,8,8] y) {
        r = Relu(x)
        a = Add(r, b)
        y = Mul(a, z)
    }
    """)
    nodes = _by_name(g)
    assert effective_kind(nodes["a"]) == Kind.BROADCAST  # b is broadcast
    assert effective_kind(nodes["y"]) == Kind.ELEMWISE
    fg = build_forward_graph(g)
    # r already has the Add's output shape: the edge into the broadcasting Add is elementwise (as in TVM)
    assert [e.kind for e in fg[nodes["r"]].outputs] == [Kind.ELEMWISE]
    assert build_postdom_tree(fg).nodes[fg[nodes["r"]].index].pattern == Kind.ELEMWISE


def test_node_without_consumers_has_no_postdominator() -> None:
    g = _graph("""
    g (float[1,4] x) => (float[1,4] y) {
        d = Exp(x)
        y = Relu(x)
    }
    """)
    fg = build_forward_graph(g)
    tree = build_postdom_tree(fg)
    dead = fg[_by_name(g)["d"]]
    assert dead.outputs == [] and not dead.extern_ref
    assert tree.parent_of(dead) is None and tree.nodes[dead.index].depth == 1


def test_graph_is_not_mutated() -> None:
    g = _graph(DIAMOND)
    before = [(n.op_type, [v.name for v in n.outputs]) for n in g]
    build_postdom_tree(build_forward_graph(g))
    assert [(n.op_type, [v.name for v in n.outputs]) for n in g] == before
