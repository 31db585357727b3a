"""The HTML fusion report: well-formed, self-contained, escaped, and quick on a 400-node graph."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser
from pathlib import Path

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
import dlcc.api
from dlcc.errors import OutputError
from dlcc.frontend.shapes import infer_shapes
from dlcc.fusion.plan import FusionPlan, build_plan
from dlcc.report import render_report, write_report
from dlcc.report.html import layout

VOID = {"meta", "br", "img", "input", "link", "hr", "col", "wbr", "area", "base", "source", "track", "embed"}
SVG_LEAVES = {"path", "rect", "line", "circle", "ellipse", "polyline", "polygon"}

DIAMOND = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
    c = Conv <pads = [1,1,1,1]> (x, w)
    r = Relu(c)
    s = Sigmoid(c)
    y = Add(r, s)
}
"""

HOSTILE = '<script>alert("x")</script>'


class Checker(HTMLParser):
    """Checks that every tag is closed in order; records tags, their attributes and the text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.starts: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def classes(self, name: str) -> list[dict[str, str | None]]:
        return [a for _, a in self.starts if name in (a.get("class") or "").split()]


def _parse(page: str) -> Checker:
    c = Checker()
    c.feed(page)
    c.close()
    assert not c.errors, c.errors[:5]
    assert c.stack == [], c.stack
    return c


def _diamond() -> ir.Model:
    return infer_shapes(ir.from_onnx_text(DIAMOND))


def test_page_is_well_formed_with_one_outline_per_group_and_one_box_per_node() -> None:
    model = _diamond()
    conv, relu, sig, add = list(model.graph)
    plan = build_plan(model.graph, [[conv, relu], [sig], [add]], "test")
    page = render_report(model, plan, title="diamond")
    c = _parse(page)
    tags = [t for t, _ in c.starts]
    assert tags.count("svg") == 1 and "style" in tags
    assert len(c.classes("group")) == 3
    assert len(c.classes("node")) == 4
    assert len(c.classes("edge")) == 4  # conv->relu, conv->sigmoid, relu->add, sigmoid->add
    assert sorted(a["data-group"] for a in c.classes("group")) == ["0", "1", "2"]
    text = " ".join(c.text)
    for word in ("Conv", "Relu", "Sigmoid", "Add", "1×4×8×8", "OUT_ELEMWISE_FUSABLE", "Conv → Relu"):
        assert word in text
    assert "nodes per group" in text


def test_no_network_references() -> None:
    model = _diamond()
    page = render_report(model, build_plan(model.graph, [list(model.graph)], "test"), title="t")
    refs = re.findall(r"https?://[^\s\"'<>]*", page)
    assert refs == ["http://www.w3.org/2000/svg"]
    assert page.count("http") == 1 and 'xmlns="http://www.w3.org/2000/svg"' in page
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page)
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert "@import" not in page and "url(" not in page


def test_hostile_model_strings_are_escaped() -> None:
    model = _diamond()
    model.graph.name = HOSTILE
    model.doc_string = "*/ </style> " + HOSTILE
    model.producer_name = '"quoted" \n newline'
    for n in model.graph:
        n.name = HOSTILE + "\n*/"
        n.doc_string = "<b onclick='x'>" + HOSTILE
    for v in model.graph.outputs:
        v.name = '"><script>bad()</script>'
    plan = build_plan(model.graph, [list(model.graph)], "test")
    plan.reason = HOSTILE
    page = render_report(model, plan, title=HOSTILE)
    assert page.count("<script") == 1  # only ours, at the end
    assert "alert" not in page.split("<script>")[-1]
    assert "</style>" in page and page.count("</style>") == 1
    assert "<b onclick" not in page and "bad()</script>" not in page
    c = _parse(page)
    text = "".join(c.text)
    assert HOSTILE in text  # shown as text, not run
    svg_titles = [a for t, a in c.starts if t == "title"]
    assert svg_titles  # tooltips are there


def test_hostile_op_type_is_escaped() -> None:
    model = _diamond()
    relu = list(model.graph)[1]
    relu.op_type = "<img src=x>"
    relu.domain = "evil<domain>"
    page = render_report(model, build_plan(model.graph, [[n] for n in model.graph], "test"), title="t")
    assert "<img" not in page and "evil<" not in page
    _parse(page)


def test_layout_layers_and_sources() -> None:
    model = _diamond()
    boxes, width, height = layout(model.graph)
    layers = {b.node.op_type: b.layer for b in boxes}
    assert layers == {"Conv": 0, "Relu": 1, "Sigmoid": 1, "Add": 2}
    relu, sig = boxes[1], boxes[2]
    assert relu.y == sig.y and relu.x != sig.x
    assert all(b.x >= 0 and b.x + 150 <= width and 0 <= b.y <= height for b in boxes)
    # a constant sits just above its consumer, not at the top
    m = infer_shapes(ir.from_onnx_text("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) {
            a = Relu(x)
            b = Neg(a)
            k = Constant <value = float[2] {1.0, 2.0}> ()
            y = Add(b, k)
        }"""))
    assert {b.node.op_type: b.layer for b in layout(m.graph)[0]} == {"Relu": 0, "Neg": 1, "Constant": 1, "Add": 2}


def test_write_report_is_atomic(tmp_path: Path) -> None:
    model = _diamond()
    plan = build_plan(model.graph, [list(model.graph)], "test")
    out = tmp_path / "r.html"
    write_report(model, plan, out, title="é <t>")
    page = out.read_text(encoding="utf-8")
    assert "<title>é &lt;t&gt;</title>" in page
    with pytest.raises(OutputError):
        write_report(model, plan, tmp_path / "missing" / "r.html", title="t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def _chains(model: ir.Model) -> FusionPlan:
    """Each node joins its producer's group when it is that producer's only user (single-use chains)."""
    parts: dict[ir.Node, list[ir.Node]] = {}
    outputs = set(model.graph.outputs)
    for n in model.graph:
        head = None
        if len(n.inputs) >= 1 and n.inputs[0] is not None:
            p = n.inputs[0].producer()
            v = n.inputs[0]
            if p is not None and p in parts and len(v.uses()) == 1 and v not in outputs and len(p.outputs) == 1:
                head = p
        if head is not None:
            parts[head].append(n)
            parts[n] = parts[head]
        else:
            parts[n] = [n]
    unique = {id(p): p for p in parts.values()}
    return build_plan(model.graph, list(unique.values()), "test")


@pytest.mark.slow
def test_densenet_renders_quickly() -> None:
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_densenet121.onnx"
    model = dlcc.api.optimize(dlcc.load(path), level=3, emit=lambda s: None)
    nodes = len(list(model.graph))
    assert nodes >= 400
    plan = _chains(model)
    assert plan.num_kernels < nodes
    start = time.perf_counter()
    page = render_report(model, plan, title="densenet121")
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, elapsed
    c = _parse(page)
    assert len(c.classes("node")) == nodes
    assert len(c.classes("group")) == plan.num_kernels


@pytest.mark.slow
def test_report_of_a_real_plan(tmp_path: Path) -> None:
    pytest.importorskip("dlcc.fusion.tvm")
    from dlcc.fusion import plan_fusion

    path = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    model = dlcc.api.optimize(dlcc.load(path), level=3, emit=lambda s: None)
    plan = plan_fusion(model)
    write_report(model, plan, tmp_path / "squeezenet.html", title="squeezenet")
    c = _parse((tmp_path / "squeezenet.html").read_text(encoding="utf-8"))
    assert len(c.classes("group")) == plan.num_kernels
    assert plan.planner in "".join(c.text)
