"""A compact, deterministic text form of a graph-IR model (for --print-after, --dump-dir and tests).

What goes in: an onnx_ir model. What comes out: text, one line per node:

    %y<FLOAT,[1,64,56,56]> = Conv[kernel_shape=[3,3], pads=[1,1,1,1]](%x, %w, %b)

Initializers are listed with dtype and shape only (never their data), so the text of a 100 MB model stays
small. Names are printed as they are in the model (this text is for people, never for generated code).
"""

from __future__ import annotations

import onnx_ir as ir


def _type(v: ir.Value) -> str:
    dtype = v.dtype.name if v.dtype is not None else "?"
    shape = "?" if v.shape is None else "[" + ",".join(str(d) for d in v.shape) + "]"
    return f"<{dtype},{shape}>"


def _attr(a) -> str:
    if a.type == ir.AttributeType.GRAPH:
        return f"{a.name}=<graph {a.value.name}>"
    if a.type == ir.AttributeType.TENSOR:
        t = a.value
        if t.size <= 8:
            return f"{a.name}={t.numpy().tolist()}"
        return f"{a.name}=<tensor {t.dtype.name} {list(t.shape)}>"
    return f"{a.name}={a.value!r}"


def format_graph(graph: ir.Graph, indent: str = "") -> str:
    lines = [f"{indent}graph {graph.name or ''}("]
    for v in graph.inputs:
        lines.append(f"{indent}  in  %{v.name}{_type(v)}")
    for name, v in graph.initializers.items():
        lines.append(f"{indent}  const %{name}{_type(v)}")
    lines.append(f"{indent}) {{")
    for node in graph:
        outs = ", ".join(f"%{o.name}{_type(o)}" for o in node.outputs)
        ins = ", ".join("%" + v.name if v is not None else "_" for v in node.inputs)
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        attrs = ", ".join(_attr(a) for a in node.attributes.values())
        lines.append(f"{indent}  {outs} = {op}{'[' + attrs + ']' if attrs else ''}({ins})")
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPH:
                lines.append(format_graph(a.value, indent + "    "))
    lines.append(f"{indent}  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def format_model(model: ir.Model) -> str:
    opsets = ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in sorted(model.opset_imports.items()))
    return f"model ir_version={model.ir_version} opsets=[{opsets}]\n" + format_graph(model.graph) + "\n"
