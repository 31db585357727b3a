"""Elimination of nodes and initializers whose results nobody uses.

What goes in: a model. What comes out: the same model without nodes whose outputs reach no graph output
(non-deterministic and side-effect-free alike: an unused random draw changes nothing observable) and
without initializers no node or output reads. Graph inputs are never removed (they are the model's
interface).
"""

from __future__ import annotations

import onnx_ir as ir

from dlcc.passes.manager import Pass
from dlcc.util import all_graphs


class DeadCodeElimination(Pass):
    name = "dead-code"
    doc = "remove nodes whose outputs are unused and initializers nobody reads"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in all_graphs(model.graph):
            changed |= self._graph(graph)
        return changed

    def _graph(self, graph: ir.Graph) -> bool:
        changed = False
        outputs = set(map(id, graph.outputs))
        for node in reversed(list(graph)):
            if any(id(o) in outputs or o.uses() for o in node.outputs):
                continue
            graph.remove(node, safe=True)
            self.fired["unused-node"] += 1
            changed = True
        for name, v in list(graph.initializers.items()):
            if not v.uses() and id(v) not in outputs and v not in graph.inputs:
                del graph.initializers[name]
                self.fired["unused-initializer"] += 1
                changed = True
        return changed
