"""The model summary behind ``dlcc inspect``: what a model is, what it holds, what it costs.

What goes in: an ``onnx_ir.Model`` (run shape inference first if FLOPs are wanted: nodes whose shapes
are unknown are counted as "unknown cost", not guessed). The model is only read, never changed.
What comes out: a ``ModelSummary`` (``summarize``), printed with rich tables (``render``) or turned into
a JSON-serializable dict (``summary_dict``).

Invariants and conventions:
- Parameters are the elements of every initializer plus the tensors of top-level ``Constant`` nodes
  (some exporters store weights that way). Sizes come from shapes: external or large tensors are never
  loaded to be counted. Sub-byte types round up to whole bytes per tensor; strings count elements but no
  bytes.
- The node count, the op histogram and the FLOPs cover the top-level graph; If/Loop/Scan bodies are not
  entered (such a node counts as one node of unknown cost). Ops outside the default domain are listed
  as ``domain::OpType``.
- Opset domains are named as in ONNX, with the default domain spelled ``ai.onnx``.
- Shapes are lists of ints and dim names (``"?"`` for an unnamed unknown dim), or None for unknown rank.
- Everything a model names (inputs, ops, producer) is printed as plain text, never as rich markup.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import onnx_ir as ir
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlcc.ops.cost import model_flops

__all__ = ["ModelSummary", "human_bytes", "human_count", "human_flops", "render", "summarize", "summary_dict"]

ShapeList = list[int | str] | None
IOEntry = tuple[str, str, ShapeList]


@dataclass
class ModelSummary:
    """What ``dlcc inspect`` reports about a model."""

    producer: str
    ir_version: int
    opsets: dict[str, int]
    inputs: list[IOEntry]
    outputs: list[IOEntry]
    op_histogram: Counter[str]  # most frequent first, ties by name
    node_count: int
    parameter_count: int
    parameter_bytes: int
    flops: int  # over the nodes whose cost is known
    unknown_cost_nodes: int
    graph_name: str = ""
    notes: list[str] = field(default_factory=list)  # what loading changed (from dlcc.load)


# ------------------------------------------------------------------------------------------ summarize


def summarize(model: ir.Model) -> ModelSummary:
    """Summarize ``model`` without changing it."""
    graph = model.graph
    ops = Counter(_op_name(node) for node in graph)
    histogram = Counter(dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))))
    params, param_bytes = _parameters(model)
    flops, unknown = model_flops(model)
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return ModelSummary(
        producer=producer,
        ir_version=int(model.ir_version),
        opsets={(domain or "ai.onnx"): int(version) for domain, version in model.opset_imports.items()},
        inputs=[_io_entry(v) for v in graph.inputs],
        outputs=[_io_entry(v) for v in graph.outputs],
        op_histogram=histogram,
        node_count=len(graph),
        parameter_count=params,
        parameter_bytes=param_bytes,
        flops=flops,
        unknown_cost_nodes=unknown,
        graph_name=graph.name or "",
        notes=[str(n) for n in model.meta.get("dlcc.notes", [])],
    )


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def _io_entry(value: ir.Value) -> IOEntry:
    return (value.name or "", _dtype_name(value), _shape_list(value.shape))


def _dtype_name(value: ir.Value) -> str:
    if value.type is None:
        return "?"
    if not isinstance(value.type, ir.TensorType):
        return str(value.type)
    return _dtype_str(value.dtype)


def _dtype_str(dtype: ir.DataType | None) -> str:
    if dtype is None:
        return "?"
    if dtype == ir.DataType.STRING:
        return "string"
    try:
        return str(dtype.numpy())
    except TypeError:
        return dtype.name.lower()


def _shape_list(shape: ir.Shape | None) -> ShapeList:
    if shape is None:
        return None
    return [d if isinstance(d, int) else (d.value if isinstance(d.value, str) else "?") for d in shape]


def _tensor_size(shape: ir.Shape | None, dtype: ir.DataType | None) -> tuple[int, int] | None:
    """(elements, bytes) from a shape and a dtype, or None when the shape is not static."""
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    elements = math.prod(shape)
    try:
        nbytes = math.ceil(elements * dtype.itemsize) if dtype is not None else 0
    except TypeError:  # STRING: no fixed size
        nbytes = 0
    return elements, nbytes


def _parameters(model: ir.Model) -> tuple[int, int]:
    count = nbytes = 0
    sizes: list[tuple[int, int] | None] = []
    for value in model.graph.initializers.values():
        tensor = value.const_value
        size = _tensor_size(value.shape, value.dtype)
        if size is None and tensor is not None:  # the value lacks type info: the tensor has it
            size = _tensor_size(tensor.shape, tensor.dtype)
        sizes.append(size)
    for node in model.graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" in node.attributes:
            tensor = node.attributes["value"].as_tensor()
            sizes.append(_tensor_size(tensor.shape, tensor.dtype))
        elif (node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx") and node.inputs
              and node.inputs[0] is not None and node.inputs[0].const_value is not None):
            # weights generated at load time (the light reference models do this): they are parameters
            out = node.outputs[0]
            sizes.append(_tensor_size(out.shape, out.dtype))
    for size in sizes:
        if size is not None:
            count += size[0]
            nbytes += size[1]
    return count, nbytes


# --------------------------------------------------------------------------------------------- units

_PREFIXES = ("", "K", "M", "G", "T", "P", "E")


def _scaled(n: int | float) -> tuple[str, str]:
    """(number, SI prefix): 25_557_032 -> ("25.6", "M"); below 1000 the number is printed whole."""
    if abs(n) < 1000:
        return f"{n:g}" if isinstance(n, float) else str(n), ""
    value, i = float(n), 0
    while i < len(_PREFIXES) - 1 and abs(round(value, 1)) >= 1000:
        value /= 1000
        i += 1
    return f"{value:.1f}", _PREFIXES[i]


def human_count(n: int) -> str:
    """25_557_032 -> ``25.6 M``."""
    number, prefix = _scaled(n)
    return f"{number} {prefix}".rstrip()


def human_bytes(n: int) -> str:
    """102_228_128 -> ``102.2 MB`` (decimal units)."""
    number, prefix = _scaled(n)
    return f"{number} {prefix}B"


def human_flops(n: int) -> str:
    """7_717_000_000 -> ``7.7 GFLOPs``."""
    number, prefix = _scaled(n)
    return f"{number} {prefix}FLOPs"


# -------------------------------------------------------------------------------------------- render


def _shape_text(shape: ShapeList) -> str:
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def render(summary: ModelSummary, console: Console) -> None:
    """Print the summary: a header line, inputs/outputs, the op histogram and the totals."""
    opsets = ", ".join(f"{domain} {version}" for domain, version in sorted(summary.opsets.items()))
    header = Text()
    header.append(summary.graph_name or "model", style="bold")
    header.append(f"  ·  {summary.producer or 'unknown producer'}  ·  IR {summary.ir_version}")
    header.append(f"  ·  opset {opsets or 'none'}")
    console.print(header)

    io = Table(title="Inputs and outputs", box=box.SIMPLE, title_justify="left")
    io.add_column("")
    io.add_column("name")
    io.add_column("dtype")
    io.add_column("shape")
    for role, entries in (("in", summary.inputs), ("out", summary.outputs)):
        for name, dtype, shape in entries:
            io.add_row(role, Text(name), Text(dtype), Text(_shape_text(shape)))
    console.print(io)

    ops = Table(title="Operators", box=box.SIMPLE, title_justify="left")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    ops.add_column("share", justify="right")
    for op, count in summary.op_histogram.items():
        share = 100.0 * count / summary.node_count if summary.node_count else 0.0
        ops.add_row(Text(op), str(count), f"{share:.1f}%")
    console.print(ops)

    totals = Table(title="Totals", box=box.SIMPLE, title_justify="left", show_header=False)
    totals.add_column("what")
    totals.add_column("value", justify="right")
    totals.add_row("nodes", str(summary.node_count))
    totals.add_row("parameters", f"{human_count(summary.parameter_count)} params")
    totals.add_row("parameter bytes", human_bytes(summary.parameter_bytes))
    flops = human_flops(summary.flops)
    if summary.unknown_cost_nodes:
        flops += f" (+ {summary.unknown_cost_nodes} node(s) of unknown cost)"
    totals.add_row("compute", flops)
    console.print(totals)
    for note in summary.notes:
        console.print(Text(f"note: {note}", style="dim"))


def summary_dict(summary: ModelSummary) -> dict:
    """The summary as plain JSON-serializable data (for ``--json``)."""

    def io(entries: list[IOEntry]) -> list[dict]:
        return [{"name": name, "dtype": dtype, "shape": shape} for name, dtype, shape in entries]

    return {
        "graph_name": summary.graph_name,
        "producer": summary.producer,
        "ir_version": summary.ir_version,
        "opsets": dict(summary.opsets),
        "inputs": io(summary.inputs),
        "outputs": io(summary.outputs),
        "ops": dict(summary.op_histogram),
        "node_count": summary.node_count,
        "parameter_count": summary.parameter_count,
        "parameter_bytes": summary.parameter_bytes,
        "flops": summary.flops,
        "unknown_cost_nodes": summary.unknown_cost_nodes,
        "notes": list(summary.notes),
    }
