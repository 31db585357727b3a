"""The compiled-model charts: one bar per kernel, escaped op names, arena lines, degenerate inputs."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from dlcc.build.profile import profile_rows
from dlcc.report.charts import CompiledFigures, arena_chart, compiled_section, kernel_chart

HOSTILE = '<script>alert("x")</script>'


def _figures(n: int, seconds=None) -> CompiledFigures:
    kernels = [{"id": i, "ops": "Conv+Relu" if i % 2 else HOSTILE, "flops": 1000 * (i + 1) if i % 3 else None,
                "bytes": 64 * (i + 1), **({"form": "conv_direct" if i % 2 else HOSTILE} if i % 4 else {})}
               for i in range(n)]  # (a bundle written before the form field has none)
    seconds = [1e-4 * (i + 1) for i in range(n)] if seconds is None else seconds
    live = [1024 * (i % 4 + 1) for i in range(n)]
    return CompiledFigures(profile_rows(kernels, seconds), 3, 50.0, 1, live, [v + 64 for v in live],
                           8192, 4096)


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.stack.append(tag)

    def handle_startendtag(self, tag, attrs) -> None:
        pass

    def handle_endtag(self, tag) -> None:
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def test_one_bar_per_kernel_and_escaped() -> None:
    fig = _figures(7)
    svg = kernel_chart(fig)
    assert len(re.findall(r'<rect class="kbar"', svg)) == 7
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    section = compiled_section(fig)
    assert "<script>" not in section and "<th>form</th>" in section and ">conv_direct</td>" in section
    tags = _Tags()
    tags.feed(section)
    assert not tags.errors and not tags.stack


def test_arena_chart_draws_the_bounds() -> None:
    svg = arena_chart(_figures(5))
    assert 'class="live"' in svg and 'class="top"' in svg
    assert "arena 8.00 KiB" in svg and "lower bound 4.00 KiB" in svg


def test_degenerate_inputs() -> None:
    for fig in (_figures(0, []), _figures(3, [0.0, 0.0, 0.0])):
        section = compiled_section(fig)
        assert section.count('class="kbar"') == len(fig.rows)
        assert "nan" not in section.lower().replace("nano", "")


def test_the_section_says_how_many_kernels_the_schedule_merged() -> None:
    fig = _figures(4)
    assert "fewer than the fusion plan" not in compiled_section(fig)
    fig.merged = 2
    assert "2 1x1 convolutions run inside the depthwise kernel that reads them, so there are 2 kernels fewer" \
        in compiled_section(fig)
    fig.planned = 7  # (4 kernels: 2 merged, 1 a view)
    assert ("2 1x1 convolutions run inside the depthwise kernel that reads them; 1 group only reshapes or "
            "transposes a tensor, which a view or the layout assignment does without a kernel, so there are 3 "
            "kernels fewer than the fusion plan's 7 groups.") in html.unescape(compiled_section(fig))
    fig.merged, fig.planned = 0, 4
    assert "fewer than the fusion plan" not in compiled_section(fig)
