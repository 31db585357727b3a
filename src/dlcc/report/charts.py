"""Charts of a compiled model for the HTML report: time per kernel, and the arena's occupancy over time.

What goes in: ``CompiledFigures`` — the profile rows of every kernel in call order
(``dlcc.build.profile.ProfileRow``), the measured single-core FMA peak and thread count, and the memory
plan's figures over the schedule (``dlcc.build.profile.arena_occupancy``: bytes live during each kernel,
end of the highest live buffer), the arena size and its lower bound.
What comes out: ``compiled_section(fig)``, an HTML fragment with two inline SVG charts (no script, no
network) and a table of the slowest kernels:

    kernel chart: one horizontal bar per kernel, in call order, length = its best time
        k0  Conv+Relu      ██████████████            0.81 ms  12.0%  96 GFLOP/s  38% peak
        k1  MaxPool        ██                        0.10 ms   1.5%
    arena chart: x = kernels in call order; filled steps = bytes live during the kernel, line = end of the
        highest live buffer (what the plan's offsets use), flat lines = arena size and lower bound

Invariant: every text that comes from the model (op types) goes through ``html.escape``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dlcc.build.profile import ProfileRow

__all__ = ["CHART_STYLE", "CompiledFigures", "arena_chart", "compiled_figures", "compiled_section", "kernel_chart"]

CHART_STYLE = """
.chart { overflow: auto; border: 1px solid #ddd; margin: .6em 0 1.2em; }
.chart svg { display: block; }
.chart svg text { font: 11px ui-monospace, "SFMono-Regular", Menlo, monospace; fill: #222; }
.chart svg text.axis { fill: #666; font-size: 10px; }
table.kernels { border-collapse: collapse; margin-bottom: 1.5em; }
table.kernels th, table.kernels td { border: 1px solid #ccc; padding: .15em .5em; text-align: right; }
table.kernels th:nth-child(2) { text-align: left; }
table.kernels td.ops { text-align: left; font-family: ui-monospace, Menlo, monospace; font-size: 12px; }
"""

BAR = "#1565c0"
LIVE = "#90caf9"
TOP = "#0d47a1"
ARENA = "#c62828"
BOUND = "#2e7d32"


@dataclass
class CompiledFigures:
    rows: list[ProfileRow]  # call order
    runs: int
    peak_gflops: float | None
    threads: int
    live: list[int]  # per kernel: bytes of arena buffers live during it
    top: list[int]  # per kernel: end of the highest live buffer
    arena_bytes: int
    lower_bound: int
    merged: int = 0  # 1x1 convolutions run inside the depthwise kernel that reads them: kernels fewer than planned
    layouts: dict | None = None  # schedule.layouts.layout_figures: channels-last buffers, Transposes removed/left
    planned: int = 0  # the fusion plan's groups (the page's header counts them), when known


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.3f} ms" if ms < 10 else f"{ms:.1f} ms"


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def kernel_chart(fig: CompiledFigures) -> str:
    """One ``rect.kbar`` per kernel (call order), bar length proportional to its best time."""
    rows = fig.rows
    label_w, bar_w, note_w, row_h, top_pad = 250, 520, 330, 17, 26
    width = label_w + bar_w + note_w
    height = top_pad + row_h * len(rows) + 10
    longest = max((r.seconds for r in rows), default=0.0)
    step = _nice_step(longest * 1e3)
    scale = bar_w / (longest * 1e3) if longest > 0 else 0.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="kernel-chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="time per kernel">']
    k = 0
    while k * step <= longest * 1e3 * (1 + 1e-9) and scale > 0:  # vertical grid lines with ms labels
        tick = round(k * step, 9)
        x = label_w + tick * scale
        parts.append(f'<line x1="{x:.1f}" y1="{top_pad - 6}" x2="{x:.1f}" y2="{height - 6}" stroke="#e0e0e0"/>')
        parts.append(f'<text class="axis" x="{x:.1f}" y="{top_pad - 10}" text-anchor="middle">{tick:g} ms</text>')
        k += 1
    for i, r in enumerate(rows):
        y = top_pad + i * row_h
        w = max(r.seconds * 1e3 * scale, 1.0)
        frac = r.peak_fraction(fig.peak_gflops, fig.threads)
        note = [_ms(r.seconds), f"{100 * r.share:.1f}%"]
        if r.gflops is not None and r.flops:
            note.append(f"{r.gflops:.1f} GFLOP/s")
        if frac is not None and r.flops:
            note.append(f"{100 * frac:.0f}% peak")
        form = f" ({r.form})" if r.form else ""
        tip = (f"k{r.id} {r.ops}{form}: {_ms(r.seconds)} ({100 * r.share:.1f}% of the total); "
               f"{'-' if r.flops is None else f'{r.flops / 1e6:.2f} MFLOP'}; {_bytes(r.bytes)} moved")
        parts.append(f'<g><title>{_esc(tip)}</title>'
                     f'<text x="{label_w - 8}" y="{y + 12}" text-anchor="end">{_esc(_short(f"k{r.id} {r.ops}", 34))}'
                     f'</text><rect class="kbar" x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row_h - 4}" '
                     f'fill="{BAR}" rx="2"/>'
                     f'<text x="{label_w + w + 6:.1f}" y="{y + 12}">{_esc("  ".join(note))}</text></g>')
    parts.append("</svg>")
    return "\n".join(parts)


def _step_path(values: Sequence[int], x, y, close: bool) -> str:
    n = len(values)
    d = [f"M{x(0):.1f},{y(0):.1f}"] if close else []
    for i, v in enumerate(values):
        cmd = "L" if (close or i) else "M"
        d.append(f"{cmd}{x(i):.1f},{y(v):.1f}H{x(i + 1):.1f}")
    if close:
        d.append(f"V{y(0):.1f}Z")
    return "".join(d) if n else ""


def arena_chart(fig: CompiledFigures) -> str:
    """Bytes live during each kernel (filled steps) and the end of the highest live buffer (line), under the
    arena size and the lower bound (horizontal lines)."""
    n = len(fig.live)
    left, right, top_pad, bottom = 80, 190, 16, 34
    plot_w, plot_h = max(520, min(1100, 12 * n)), 240
    width, height = left + plot_w + right, top_pad + plot_h + bottom
    ymax = max(fig.arena_bytes, max(fig.top, default=0), 1) * 1.08

    def x(i: float) -> float:
        return left + plot_w * i / max(n, 1)

    def y(v: float) -> float:
        return top_pad + plot_h * (1 - v / ymax)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="arena-chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="arena occupancy over the schedule">']
    unit, name = next((u, n) for u, n in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))
                      if ymax >= 2 * u or u == 1)
    step = _nice_step(ymax / unit) * unit  # round ticks in the unit of the axis
    k = 0
    while k * step <= ymax:
        v = k * step
        parts.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}" stroke="#eee"/>')
        parts.append(f'<text class="axis" x="{left - 6}" y="{y(v) + 3:.1f}" text-anchor="end">{v / unit:g} {name}'
                     "</text>")
        k += 1
    kstep = max(1, int(_nice_step(n, 10)))
    for i in range(0, n, kstep):
        xi = x(i + 0.5)
        parts.append(f'<line x1="{xi:.1f}" y1="{top_pad + plot_h}" x2="{xi:.1f}" y2="{top_pad + plot_h + 4}" '
                     'stroke="#999"/>')
        parts.append(f'<text class="axis" x="{xi:.1f}" y="{top_pad + plot_h + 15}" text-anchor="middle">{i}</text>')
    parts.append(f'<text class="axis" x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle">'
                 "kernel (call order)</text>")
    if n:
        parts.append(f'<path class="live" d="{_step_path(fig.live, x, y, True)}" fill="{LIVE}" fill-opacity=".7" '
                     'stroke="none"><title>bytes live during the kernel</title></path>')
        parts.append(f'<path class="top" d="{_step_path(fig.top, x, y, False)}" fill="none" stroke="{TOP}" '
                     'stroke-width="1.5"><title>end of the highest live buffer</title></path>')
    for value, colour, dash, label in ((fig.arena_bytes, ARENA, "", "arena"),
                                       (fig.lower_bound, BOUND, ' stroke-dasharray="6 4"', "lower bound")):
        yy = y(value)
        parts.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" stroke="{colour}" '
                     f'stroke-width="1.5"{dash}/>')
        dy = -4 if label == "arena" else 12
        parts.append(f'<text x="{left + plot_w + 6}" y="{yy + dy:.1f}" fill="{colour}" style="fill:{colour}">'
                     f"{label} {_esc(_bytes(value))}</text>")
    parts.append(f'<rect x="{left}" y="{top_pad}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    parts.append("</svg>")
    return "\n".join(parts)


def _slowest_table(fig: CompiledFigures, limit: int = 15) -> str:
    rows = sorted(fig.rows, key=lambda r: (-r.seconds, r.index))[:limit]
    out = ['<table class="kernels"><thead><tr><th>kernel</th><th>ops</th><th>form</th><th>ms</th><th>share</th>'
           "<th>MFLOP</th>"
           "<th>GFLOP/s</th><th>% peak</th><th>bytes moved</th></tr></thead><tbody>"]
    for r in rows:
        frac = r.peak_fraction(fig.peak_gflops, fig.threads)
        out.append(f"<tr><td>k{r.id}</td><td class=\"ops\">{_esc(r.ops)}</td><td class=\"ops\">{_esc(r.form)}</td>"
                   f"<td>{1e3 * r.seconds:.3f}</td>"
                   f"<td>{100 * r.share:.1f}%</td><td>{'-' if r.flops is None else f'{r.flops / 1e6:.1f}'}</td>"
                   f"<td>{'-' if r.gflops is None else f'{r.gflops:.1f}'}</td>"
                   f"<td>{'-' if frac is None else f'{100 * frac:.1f}%'}</td><td>{_esc(_bytes(r.bytes))}</td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def compiled_section(fig: CompiledFigures) -> str:
    """The report's section about the compiled code: kernel times, the slowest kernels, arena occupancy."""
    total = sum(r.seconds for r in fig.rows)
    flops = [r.flops for r in fig.rows]
    known = None if any(f is None for f in flops) else sum(flops)
    peak = (f"{fig.peak_gflops:.1f} GFLOP/s float32 FMA per core (measured), {fig.threads} "
            f"thread{'s' * (fig.threads != 1)}" if fig.peak_gflops else "not measured")
    summary = (f"{len(fig.rows)} kernels, {_ms(total)} in all (sum of each kernel's best of {fig.runs} profiled "
               f"runs)" + (f", {known / 1e6:.1f} MFLOP ({known / total / 1e9:.1f} GFLOP/s)"
                           if known and total > 0 else "") + f"; peak: {peak}.")
    fewer = fig.planned - len(fig.rows) if fig.planned else fig.merged
    if fewer > 0:
        why = []
        if fig.merged:
            why.append(f"{fig.merged} 1x1 convolution{'s' * (fig.merged != 1)} run{'s' * (fig.merged == 1)} inside the "
                       "depthwise kernel that "
                       f"reads {'them' if fig.merged != 1 else 'it'}")
        if fewer > fig.merged:
            n = fewer - fig.merged
            why.append(f"{n} group{'s' * (n != 1)} only reshape{'s' * (n == 1)} or transpose{'s' * (n == 1)} a "
                       "tensor, which a view or the layout assignment does without a kernel")
        summary += (f" {'; '.join(why)}, so there {'is' if fewer == 1 else 'are'} {fewer} kernel{'s' * (fewer != 1)} "
                    "fewer than the fusion plan's" + (f" {fig.planned} groups." if fig.planned else "."))
    from dlcc.schedule.layouts import describe_layouts

    if describe_layouts(fig.layouts):
        summary += f" Layout assignment: {describe_layouts(fig.layouts)}."
    return "\n".join([
        "<h2>Time per kernel</h2>",
        f"<p>{_esc(summary)} Bars in call order; hover a bar for FLOPs and bytes.</p>",
        '<div class="chart">', kernel_chart(fig), "</div>",
        "<h3>Slowest kernels</h3>", _slowest_table(fig),
        "<h2>Arena over the schedule</h2>",
        f"<p>{_esc(f'Arena {_bytes(fig.arena_bytes)}, lower bound {_bytes(fig.lower_bound)}')} (the largest sum of "
        "buffers live at one kernel). Filled: bytes live during each kernel; line: the end of the highest live "
        "buffer, which is what the plan's offsets need.</p>",
        '<div class="chart">', arena_chart(fig), "</div>",
    ])


def compiled_figures(compiled, seconds: Sequence[float], runs: int, peak_gflops: float | None) -> CompiledFigures:
    """The figures of a ``CompiledModel`` from ``dlcc.compile`` (it keeps its ``artifacts``) and its profile."""
    from dlcc.build.profile import arena_occupancy, profile_rows

    art = compiled.artifacts
    live, top = arena_occupancy(art.program, art.memory)
    return CompiledFigures(profile_rows(compiled.info["per_kernel"], list(seconds)), runs, peak_gflops,
                           int(compiled.info.get("threads", 1)), live, top, art.memory.arena_bytes,
                           art.memory.lower_bound,
                           sum(s.producer is not None for k in art.program.kernels for s in k.steps),
                           compiled.info.get("layouts"), art.plan.num_kernels)
