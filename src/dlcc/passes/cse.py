"""Common-subexpression elimination: equal constants and equal computations are kept once.

What goes in: a model. What comes out: the same model in which
- initializers with equal dtype, shape and bytes are one initializer (an initializer that is also a graph
  input or output is never merged: it is part of the model's interface), and
- two nodes with the same domain, op type, overload, attributes (values compared exactly; a float
  attribute by its bits) and the same input values (by identity, an omitted input as None) are one node.

The algorithm (hash-consing):

    1. initializers: bucket by (dtype, shape, blake2b(bytes)); within a bucket compare the bytes and
       reroute every use of a duplicate to the first, then delete the duplicate.
    2. nodes, in topological order: key = (domain, op, overload, attributes, input values, #outputs).
       The first node with a key is kept; a later node with the same key has every use of its outputs
       rerouted to the kept node's outputs and is removed. Its consumers come later in the order, so
       they are keyed with the kept values already: one sweep merges whole equal subgraphs.

Never merged: nodes carrying subgraphs (If/Loop/Scan), non-deterministic ops (Random*, Multinomial,
Bernoulli, Dropout and anything named like them), ops from domains whose side effects we do not know,
nodes with attributes we cannot compare, and a node whose output is a graph output when the kept node's
matching output is a graph output too (both names must survive; the two nodes stay). When only the
duplicate's output is a graph output, the kept value takes that output's name.
Each graph (main graph and every subgraph) is processed on its own. ``self.fired`` counts
"merge-initializer" and "merge-node".
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import Hashable

import numpy as np
import onnx_ir as ir

from dlcc.ops.table import ops_with
from dlcc.passes.manager import Pass
from dlcc.passes.rewrite import tensor_array
from dlcc.util import all_graphs

# Domains whose ops are pure functions of their inputs and attributes (except the ops below).
_PURE_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "dlcc", "dlcc.fused"})
# The random ops by the op table, Dropout (random in training mode) and anything named like them.
_NON_DETERMINISTIC = ops_with("deterministic", value=False) | {"Dropout"}


def is_mergeable(node: ir.Node) -> bool:
    """May this node be merged with an equal one (deterministic, no side effects, no subgraphs)?"""
    if node.domain not in _PURE_DOMAINS or not node.outputs:
        return False
    op = node.op_type
    return op not in _NON_DETERMINISTIC and "Random" not in op and "Dropout" not in op


def _float_key(v: float) -> bytes:
    return struct.pack("<d", float(v))


def _tensor_key(t) -> Hashable | None:
    if t is None or t.dtype == ir.DataType.STRING:
        return None
    return (t.dtype, tuple(t.shape), t.tobytes())


def _attr_key(a: ir.Attr) -> Hashable | None:
    """An exact, hashable key of an attribute's value; None when it cannot (or must not) be compared."""
    if a.is_ref():
        return None
    t, v = a.type, a.value
    A = ir.AttributeType
    if t == A.INT:
        return ("i", int(v))
    if t == A.FLOAT:
        return ("f", _float_key(v))
    if t == A.STRING:
        return ("s", v)
    if t == A.INTS:
        return ("is", tuple(int(x) for x in v))
    if t == A.FLOATS:
        return ("fs", tuple(_float_key(x) for x in v))
    if t == A.STRINGS:
        return ("ss", tuple(v))
    if t == A.TENSOR:
        k = _tensor_key(v)
        return None if k is None else ("t", k)
    if t == A.TENSORS:
        keys = tuple(_tensor_key(x) for x in v)
        return None if None in keys else ("ts", keys)
    return None  # graphs, sparse tensors, type protos: never merged


def node_key(node: ir.Node) -> Hashable | None:
    """The hash-consing key of a node, or None when the node must never be merged."""
    if not is_mergeable(node):
        return None
    attrs = []
    for name in sorted(node.attributes):
        k = _attr_key(node.attributes[name])
        if k is None:
            return None
        attrs.append((name, k))
    domain = "" if node.domain == "ai.onnx" else node.domain
    # ir.Value hashes and compares by identity: the key holds the values themselves, so they stay alive
    inputs = tuple(node.inputs)
    outputs = tuple(bool(o.name) for o in node.outputs)  # which optional outputs are requested
    return (domain, node.op_type, node.overload, tuple(attrs), inputs, outputs)


def _sample(t) -> bytes:
    """A few hundred bytes of ``t``'s little-endian data (the same for equal tensors however stored)."""
    arr = tensor_array(t)
    if not arr.flags.c_contiguous or arr.dtype.byteorder == ">":
        return arr.tobytes()[:128]  # rare: the merge compares whole bytes anyway
    data = arr.reshape(-1).view(np.uint8)
    n = len(data)
    if n <= 384:
        return bytes(data)
    mid = n // 2
    return bytes(data[:128]) + bytes(data[mid:mid + 128]) + bytes(data[-128:])


class CommonSubexpressionElimination(Pass):
    name = "cse"
    doc = "merge equal initializers and nodes computing the same op on the same inputs"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in all_graphs(model.graph):
            changed |= merge_initializers(graph, self.fired)
            changed |= self._nodes(graph)
        return changed

    def _nodes(self, graph: ir.Graph) -> bool:
        changed = False
        seen: dict[Hashable, ir.Node] = {}
        for node in list(graph):
            key = node_key(node)
            if key is None:
                continue
            kept = seen.setdefault(key, node)
            if kept is node:
                continue
            pairs = list(zip(kept.outputs, node.outputs, strict=True))
            if any(k.is_graph_output() and d.is_graph_output() for k, d in pairs):
                continue  # both names must survive: keep both nodes
            for k, d in pairs:
                if d.is_graph_output():
                    name = d.name
                    d.replace_all_uses_with(k, replace_graph_outputs=True)
                    d.name = None
                    k.name = name
                else:
                    d.replace_all_uses_with(k)
            graph.remove(node, safe=True)
            self.fired["merge-node"] += 1
            changed = True
        return changed


def merge_initializers(graph: ir.Graph, fired: Counter) -> bool:
    """Merge the initializers of ``graph`` that hold equal tensors (same dtype, shape and bytes); counts each
    merge as ``merge-initializer`` in ``fired``. Returns whether any was merged."""
    # bucket by dtype and shape first: only tensors that share both are sampled (weights rarely do)
    by_type: dict[tuple, list[tuple[str, ir.Value]]] = {}
    for name, v in graph.initializers.items():
        t = v.const_value
        if t is None or v.is_graph_input() or v.is_graph_output():
            continue
        key = _type_key(t)
        if key is not None:
            by_type.setdefault(key, []).append((name, v))
    changed = False
    for group in by_type.values():
        if len(group) < 2:
            continue
        # 128 bytes from the start, the middle and the end tell random weights apart without decoding them
        samples: dict[bytes, list[tuple[str, ir.Value]]] = {}
        for name, v in group:
            samples.setdefault(_sample(v.const_value), []).append((name, v))
        for same_sample in samples.values():
            if len(same_sample) > 1:
                changed |= _merge_equal(same_sample, graph, fired)
    return changed


def _type_key(t) -> tuple | None:
    """(element type, dims) of a tensor that may be merged by value; None for strings."""
    dtype = t.dtype
    return None if dtype == ir.DataType.STRING else (int(dtype), tuple(t.shape))


def _merge_equal(group: list[tuple[str, ir.Value]], graph: ir.Graph, fired: Counter) -> bool:
    changed = False
    buckets: dict[bytes, list[tuple[ir.Value, bytes]]] = {}
    for name, v in group:
        data = v.const_value.tobytes()
        same = buckets.setdefault(hashlib.blake2b(data, digest_size=16).digest(), [])
        kept = next((k for k, kdata in same if kdata == data), None)
        if kept is None:
            same.append((v, data))
            continue
        v.replace_all_uses_with(kept)
        del graph.initializers[name]
        fired["merge-initializer"] += 1
        changed = True
    return changed
