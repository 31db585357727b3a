"""Benchmark: what algebraic simplification does to FLOPs and node counts.

What goes in: the nine light models (seeded random weights) and the test-kit transformer encoder block.
What comes out: per model, nodes and FLOPs (ops/cost) after the level-2 pipeline without the algebra pass
and with it, so the table shows what the rule families add on top of folding, elimination and fusion, and
the rules fired most. Printed and written to docs/BENCHMARKS.md. Run: ``make bench`` or
``python bench/algebra.py``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import dlcc  # noqa: E402
from dlcc.frontend.shapes import refresh_shapes  # noqa: E402
from dlcc.ops.cost import model_flops  # noqa: E402
from dlcc.passes.manager import ManagerOptions, PassManager  # noqa: E402
from dlcc.passes.pipeline import PipelineOptions, passes_for  # noqa: E402
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model, randomize  # noqa: E402
from machine import write_section  # noqa: E402


def _run(proto, with_algebra: bool) -> tuple[int, int, Counter]:
    model = dlcc.load(proto)
    refresh_shapes(model)
    passes = [p for p in passes_for(2, PipelineOptions()) if with_algebra or p.name != "algebra"]
    report = PassManager(passes, ManagerOptions(after_round=refresh_shapes), level=2).run(model)
    refresh_shapes(model)
    fired = report.records["algebra"].fired if "algebra" in report.records else Counter()
    return model.graph.num_nodes(), model_flops(model)[0], fired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join([*LIGHT_MODELS, "transformer_encoder", "attention"]))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    lines = ["| model | original nodes | original GFLOPs | nodes without algebra | nodes with | GFLOPs without | "
             "GFLOPs with | rules fired |",
             "|---|---|---|---|---|---|---|---|"]
    for name in [m for m in args.models.split(",") if m]:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        proto = light_model(name, seed=0) if name in LIGHT_MODELS else randomize(KIT_MODELS[name](), seed=0)
        raw = dlcc.load(proto)
        refresh_shapes(raw)
        n0, f0, _ = _run(proto, False)
        n1, f1, fired = _run(proto, True)
        top = ", ".join(f"{k} {v}" for k, v in fired.most_common(4)) or "-"
        lines.append(f"| {name} | {raw.graph.num_nodes()} | {model_flops(raw)[0] / 1e9:.4f} | {n0} | {n1} | "
                     f"{f0 / 1e9:.4f} | {f1 / 1e9:.4f} | {top} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        write_section(ROOT / "docs" / "BENCHMARKS.md", "Algebraic simplification",
                      "Run: `make bench` (bench/algebra.py). The level-2 pipeline with and without the algebra "
                      "pass; FLOPs from dlcc.ops.cost (a multiply-add is 2).\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
