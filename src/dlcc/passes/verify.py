"""The graph-IR verifier: structural invariants every pass must preserve.

What goes in: an onnx_ir model. What comes out: nothing, or a ``PassError`` listing every broken
invariant (at most 10 shown), prefixed with where the check ran ("after pass 'fold'").

Checked, for the main graph and every subgraph:
- nodes are in topological order: each input is a graph input, an initializer, an outer-scope value or
  the output of an earlier node, and each such value still belongs to a graph;
- every value is produced once and value names are unique (ONNX needs it to serialize);
- every graph output is produced (by a node, an input or an initializer);
- every initializer has data; every node's domain is imported by the model.
"""

from __future__ import annotations

import onnx_ir as ir

from dlcc.errors import PassError


def verify_model(model: ir.Model, where: str = "") -> None:
    problems: list[str] = []
    _verify_graph(model.graph, set(), problems, model)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise PassError(f"IR verification failed {where}: {shown}",
                        hint="this is a dlcc bug; --level 0 skips optimization meanwhile")


def _verify_graph(graph: ir.Graph, outer: set[int], problems: list[str], model: ir.Model) -> None:
    seen: set[int] = set(outer)
    names: dict[str, str] = {}

    def define(v: ir.Value, what: str) -> None:
        if id(v) in seen and id(v) not in outer:
            problems.append(f"value '{v.name}' is defined twice")
        seen.add(id(v))
        if v.name is None:
            problems.append(f"{what} has an unnamed value")
        elif v.name in names:
            problems.append(f"name '{v.name}' is used by two values ({names[v.name]} and {what})")
        else:
            names[v.name] = what

    for v in graph.inputs:
        define(v, "a graph input")
    for name, v in graph.initializers.items():
        if v.name != name:
            problems.append(f"initializer key '{name}' differs from its value's name '{v.name}'")
        if v.const_value is None:
            problems.append(f"initializer '{name}' has no data")
        if v not in graph.inputs:
            define(v, "an initializer")
    for node in graph:
        if node.domain not in model.opset_imports and not (node.domain == "ai.onnx" and "" in model.opset_imports):
            problems.append(f"node {node.op_type} uses domain '{node.domain}' the model does not import")
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if id(v) not in seen:
                producer = v.producer()
                why = "is used before it is produced" if producer is not None else "has no producer"
                problems.append(f"input {i} ('{v.name}') of {node.op_type} node '{node.name}' {why}")
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPH:
                _verify_graph(a.value, seen | set(), problems, model)
            elif a.type == ir.AttributeType.GRAPHS:
                for g in a.value:
                    _verify_graph(g, seen | set(), problems, model)
        for v in node.outputs:
            if v.producer() is not node:
                problems.append(f"output '{v.name}' of {node.op_type} does not point back to its node")
            define(v, f"output of {node.op_type} '{node.name}'")
    for v in graph.outputs:
        if id(v) not in seen:
            problems.append(f"graph output '{v.name}' is not produced")
