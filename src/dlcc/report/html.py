"""A self-contained HTML page that draws the graph with its fusion groups outlined.

What goes in: an onnx_ir model and a FusionPlan made on its graph, and a page title.
What comes out: one static HTML document (inline ``<style>`` and SVG, a few lines of optional inline
script for hover highlighting; no network access of any kind, readable without JavaScript): a summary
header, the graph drawing, and a table of the groups. With ``compiled`` (``dlcc report --compiled``), a section
from ``dlcc.report.charts`` after the header: the time per kernel and the arena's occupancy over the schedule.

Layout (a small Sugiyama-style layered drawing, O(n log n) for n nodes and O(n) edges):
1. layering: nodes come in graph (topological) order, so one pass gives each node its longest-path
   depth from the sources, 1 + max over producers; a node with no producer (a Constant, a
   ConstantOfShape) is then moved down to just above its first consumer, so it does not sit at the top;
2. ordering: start from graph order inside each layer, then sweep down, up, down: each node's key is the
   mean x of its neighbours in the previous sweep direction (the barycenter heuristic), sorted stably;
3. coordinates: layers are rows, centred; edges are cubic Bezier curves from a producer's bottom to a
   consumer's top (bowing sideways when they skip rows); each group is the rounded bounding rectangle
   of its members' boxes.

    layer 0      [Conv]          <- one row per layer, boxes centred
                  |   \\
    layer 1   [Relu] [Sigmoid]   <- order inside a row: barycenter of the producers' x
                  \\   /
    layer 2      [Add]

Invariant: every string that comes from the model (names, op types, domains, doc strings, shapes) is
passed through ``html.escape`` before it reaches the page; nothing else from the model is emitted.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir

from dlcc.frontend.save import atomic_output
from dlcc.fusion.plan import FusionPlan
from dlcc.ops.table import Kind

__all__ = ["KIND_COLOURS", "layout", "render_report", "write_report"]

BOX_W, BOX_H = 150, 38  # a node's box
GAP_X, GAP_Y = 26, 46  # between boxes of a row, between rows
MARGIN = 30
SIDE_ROOM = 60  # extra room left and right for edges that bow around the outermost boxes
PAD = 7  # a group outline's padding around its boxes
LABEL_CHARS = 22  # longer op types and shapes are shortened (the tooltip has the full text)

KIND_COLOURS: dict[Kind, str] = {
    Kind.ELEMWISE: "#2e7d32",
    Kind.BROADCAST: "#0277bd",
    Kind.INJECTIVE: "#6a1b9a",
    Kind.COMM_REDUCE: "#ef6c00",
    Kind.OUT_ELEMWISE_FUSABLE: "#c62828",
    Kind.TUPLE: "#546e7a",
    Kind.OPAQUE: "#424242",
}

_STYLE = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .4em; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; margin: 0 0 1em; }
dl.summary dt { font-weight: 600; } dl.summary dd { margin: 0; }
.legend span { display: inline-block; margin-right: 1em; }
.legend i { display: inline-block; width: .9em; height: .9em; border-radius: 3px; margin-right: .3em;
            vertical-align: -.1em; }
.drawing { overflow: auto; border: 1px solid #ddd; max-height: 80vh; margin: 1em 0; }
.drawing svg { display: block; margin: 0 auto; }
svg text { font: 11px ui-monospace, "SFMono-Regular", Menlo, monospace; fill: #222; }
svg text.op { font-weight: 700; font-size: 12px; }
svg text.gid { font-size: 10px; font-weight: 700; }
rect.node { fill: #fff; stroke: #555; stroke-width: 1; }
rect.group { fill-opacity: .08; stroke-width: 1.6; }
rect.group.single { stroke-dasharray: 3 3; stroke-width: 1; fill-opacity: .03; }
path.edge { fill: none; stroke: #888; stroke-width: 1; }
.hl rect.node, rect.node.hl { stroke: #000; stroke-width: 2.5; }
rect.group:hover, rect.group.hl { fill-opacity: .25; stroke-width: 3; }
tr.hl, tr:hover { background: #fff3c4; }
table.groups { border-collapse: collapse; }
table.groups th, table.groups td { border: 1px solid #ccc; padding: .2em .5em; text-align: left;
                                   vertical-align: top; }
table.groups td.ops { font-family: ui-monospace, Menlo, monospace; font-size: 12px; }
"""

# Hover on a node or a group outline highlights every element of that group. Optional: the page is
# complete without it.
_SCRIPT = """
document.addEventListener("mouseover", function (e) {
  var g = e.target.closest && e.target.closest("[data-group]");
  document.querySelectorAll(".hl").forEach(function (el) { el.classList.remove("hl"); });
  if (!g) return;
  document.querySelectorAll('[data-group="' + g.getAttribute("data-group") + '"]')
    .forEach(function (el) { el.classList.add("hl"); });
});
"""


@dataclass
class Box:
    """Where a node is drawn: top-left corner, in SVG pixels."""

    node: ir.Node
    layer: int
    x: float = 0.0
    y: float = 0.0


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _short(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shape_text(value: ir.Value | None) -> str:
    if value is None or value.shape is None:
        return "?"
    dims = [str(d) if d is not None else "?" for d in value.shape]
    return "×".join(dims) if dims else "scalar"


def layout(graph: ir.Graph, sweeps: int = 3) -> tuple[list[Box], float, float]:
    """Boxes for the graph's nodes (in graph order) and the drawing's width and height."""
    nodes = list(graph)
    index = {n: i for i, n in enumerate(nodes)}
    preds: list[list[int]] = [[] for _ in nodes]
    succs: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        seen: set[int] = set()
        for v in n.inputs:
            p = v.producer() if v is not None else None
            j = index.get(p) if p is not None else None
            if j is not None and j not in seen:
                seen.add(j)
                preds[i].append(j)
                succs[j].append(i)
    layer = [0] * len(nodes)
    for i in range(len(nodes)):  # graph order is topological
        if preds[i]:
            layer[i] = 1 + max(layer[j] for j in preds[i])
    for i in reversed(range(len(nodes))):  # sources sit just above their first consumer
        if not preds[i] and succs[i]:
            layer[i] = max(0, min(layer[j] for j in succs[i]) - 1)
    depth = max(layer, default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(depth)]
    for i in range(len(nodes)):
        rows[layer[i]].append(i)
    x = [0.0] * len(nodes)  # centred slot coordinate: rows of different widths line up on their middle

    def place(row: list[int]) -> None:
        mid = (len(row) - 1) / 2
        for k, i in enumerate(row):
            x[i] = k - mid

    for row in rows:
        place(row)
    for s in range(sweeps):
        down = s % 2 == 0
        order = range(1, depth) if down else range(depth - 2, -1, -1)
        for r in order:
            row = rows[r]
            if len(row) < 2:
                continue

            def key(i: int, down: bool = down) -> float:
                nb = preds[i] if down else succs[i]
                return sum(x[j] for j in nb) / len(nb) if nb else x[i]

            row.sort(key=key)
            place(row)
    widest = max((len(r) for r in rows), default=1)
    width = 2 * (MARGIN + SIDE_ROOM) + widest * BOX_W + (widest - 1) * GAP_X
    height = 2 * MARGIN + depth * BOX_H + max(0, depth - 1) * GAP_Y
    centre = width / 2
    boxes = [Box(n, layer[i]) for i, n in enumerate(nodes)]
    for i, b in enumerate(boxes):
        b.x = centre + x[i] * (BOX_W + GAP_X) - BOX_W / 2
        b.y = MARGIN + layer[i] * (BOX_H + GAP_Y)
    return boxes, width, height


def _node_tooltip(node: ir.Node) -> str:
    lines = [f"{node.domain + '::' if node.domain else ''}{node.op_type}  {node.name or '(unnamed)'}"]
    for v in node.inputs:
        if v is not None:
            lines.append(f"in  {v.name}: {_shape_text(v)}")
    for v in node.outputs:
        lines.append(f"out {v.name}: {_shape_text(v)}")
    if node.doc_string:
        lines.append(node.doc_string)
    return _esc("\n".join(lines))


def _svg(graph: ir.Graph, plan: FusionPlan) -> str:
    boxes, width, height = layout(graph)
    where = {b.node: b for b in boxes}
    member = plan.group_of()
    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="graph with fusion groups">'
    ]
    # group outlines first: they lie under the edges and boxes
    for g in plan.groups:
        members = [where[n] for n in g.nodes if n in where]
        if not members:
            continue
        x0 = min(b.x for b in members) - PAD
        y0 = min(b.y for b in members) - PAD - 10
        x1 = max(b.x for b in members) + BOX_W + PAD
        y1 = max(b.y for b in members) + BOX_H + PAD
        colour = KIND_COLOURS.get(g.kind, "#424242")
        single = " single" if len(g) == 1 else ""
        parts.append(
            f'<g data-group="{g.id}"><rect class="group kind-{g.kind.name.lower()}{single}" data-group="{g.id}" '
            f'x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" rx="9" stroke="{colour}" '
            f'fill="{colour}"><title>group {g.id} ({g.kind.name}): {_esc(" ".join(g.ops))}</title></rect>'
            f'<text class="gid" x="{x0 + 5:.1f}" y="{y0 + 11:.1f}" fill="{colour}" style="fill:{colour}">'
            f"g{g.id}</text></g>"
        )
    for b in boxes:
        seen: set[ir.Node] = set()
        for v in b.node.inputs:
            p = v.producer() if v is not None else None
            if p is None or p not in where or p in seen:
                continue
            seen.add(p)
            a = where[p]
            sx, sy = a.x + BOX_W / 2, a.y + BOX_H
            tx, ty = b.x + BOX_W / 2, b.y
            bend = max(GAP_Y / 2, (ty - sy) / 3)
            span = b.layer - a.layer
            # an edge that skips rows bows out sideways, so it does not hide behind a straight chain
            side = 0.0 if span <= 1 else (1.0 if tx >= sx else -1.0) * (0.7 * BOX_W + 3 * min(span, 20))
            parts.append(f'<path class="edge" d="M{sx:.1f},{sy:.1f} C{sx + side:.1f},{sy + bend:.1f} '
                         f'{tx + side:.1f},{ty - bend:.1f} {tx:.1f},{ty:.1f}"/>')
    for b in boxes:
        n = b.node
        gid = member[n].id if n in member else -1
        op = _short(n.op_type)
        shape = _short(_shape_text(n.outputs[0]) if n.outputs else "")
        cx = b.x + BOX_W / 2
        parts.append(
            f'<g data-group="{gid}"><rect class="node" x="{b.x:.1f}" y="{b.y:.1f}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="4"><title>{_node_tooltip(n)}</title></rect>'
            f'<text class="op" x="{cx:.1f}" y="{b.y + 15:.1f}" text-anchor="middle">{_esc(op)}</text>'
            f'<text x="{cx:.1f}" y="{b.y + 30:.1f}" text-anchor="middle">{_esc(shape)}</text></g>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _values(values: Sequence[ir.Value]) -> str:
    return ", ".join(f"{_esc(v.name)} ({_esc(_shape_text(v))})" for v in values) or "none"


def _group_table(plan: FusionPlan) -> str:
    rows = ['<table class="groups"><thead><tr><th>id</th><th>kind</th><th>anchor</th><th>nodes</th>'
            "<th>ops</th><th>inputs</th><th>outputs</th></tr></thead><tbody>"]
    for g in plan.groups:
        colour = KIND_COLOURS.get(g.kind, "#424242")
        anchor = f"{_esc(g.anchor.op_type)} <small>{_esc(g.anchor.name or '')}</small>"
        rows.append(
            f'<tr data-group="{g.id}"><td>g{g.id}</td><td style="color:{colour}">{_esc(g.kind.name)}</td>'
            f"<td>{anchor}</td><td>{len(g)}</td><td class=\"ops\">{_esc(' → '.join(g.ops))}</td>"
            f"<td>{len(g.inputs)}</td><td>{len(g.outputs)}</td></tr>"
        )
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _summary(model: ir.Model, plan: FusionPlan) -> str:
    graph = plan.graph
    nodes = sum(len(g) for g in plan.groups)
    fused = sum(1 for g in plan.groups if len(g) > 1)
    items = [
        ("model", graph.name or "(unnamed)"),
        ("producer", " ".join(x for x in (model.producer_name, model.producer_version) if x) or "unknown"),
        ("inputs", None, _values(graph.inputs)),
        ("outputs", None, _values(graph.outputs)),
        ("planner", plan.planner),
        ("why this plan", plan.reason or "-"),
        ("nodes", str(nodes)),
        ("fusion groups", f"{plan.num_kernels} ({fused} of more than one node)"),
        ("fusion rate", f"{plan.fusion_rate:.2f} nodes per group"),
    ]
    if model.doc_string:
        items.append(("description", model.doc_string))
    out = ['<dl class="summary">']
    for item in items:
        label, text = item[0], item[1]
        body = item[2] if len(item) > 2 else _esc(text)  # _values escapes by itself
        out.append(f"<dt>{_esc(label)}</dt><dd>{body}</dd>")
    out.append("</dl>")
    legend = "".join(f'<span><i style="background:{c}"></i>{k.name.lower()}</span>'
                     for k, c in KIND_COLOURS.items() if k != Kind.TUPLE)
    out.append(f'<p class="legend">group kinds: {legend} (dashed: a single-node kernel)</p>')
    return "\n".join(out)


def render_report(model: ir.Model, plan: FusionPlan, *, title: str, compiled=None) -> str:
    """The complete HTML page for ``model`` and its fusion ``plan`` (drawn on ``plan.graph``); with
    ``compiled`` (``dlcc.report.charts.CompiledFigures``) also the time per kernel and the arena charts."""
    from dlcc.report.charts import CHART_STYLE, compiled_section

    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_STYLE}{CHART_STYLE if compiled is not None else ''}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        _summary(model, plan),
        compiled_section(compiled) if compiled is not None else "",
        "<h2>Graph</h2>" if compiled is not None else "",
        '<div class="drawing">',
        _svg(plan.graph, plan),
        "</div>",
        "<h2>Groups</h2>",
        _group_table(plan),
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
        "",
    ])


def write_report(model: ir.Model, plan: FusionPlan, path: str | os.PathLike, *, title: str,
                 compiled=None) -> None:
    """Render the report and write it to ``path`` atomically (UTF-8; no partial file on failure)."""
    page = render_report(model, plan, title=title, compiled=compiled)
    with atomic_output(path, "wb") as f:
        f.write(page.encode("utf-8"))
