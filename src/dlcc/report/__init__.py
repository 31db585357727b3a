"""Reports about a compiled model: the HTML page that draws the fusion groups on the graph.

``render_report(model, plan, title=...)`` returns the page; ``write_report(model, plan, path, title=...)``
writes it atomically; ``compiled=`` (``dlcc.report.charts.CompiledFigures``) adds the time per kernel and the
arena occupancy charts of a compiled model.
"""

from dlcc.report.html import render_report, write_report

__all__ = ["render_report", "write_report"]
