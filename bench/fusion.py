"""Benchmark: fusion planning (TVM FuseOps vs DNNFusion) on the light and test-kit models.

What goes in: the nine light models of the onnx wheel and the dlcc.testing kit models, with seeded
random weights, optimized at the default level (folding runs first, so BN is already in the convs).
What comes out: per model, the ONNX node count of the original and of the optimized graph, the number of
groups (kernels) under each planner, the fusion rate (optimized nodes / kernels, and original nodes /
kernels — DNNFusion's papers count the model's original operators), the estimated bytes moved by
kernels before fusion and after it under each planner (group inputs + outputs, from shapes), and the
planner ``--fusion auto`` picks. Printed and written to docs/BENCHMARKS.md.

Reference: Apache TVM 0.27's FuseOps leaves 145 kernels on the light ResNet-50 (its BN parameters are
graph inputs there, so nothing folds first). Run: ``make bench`` or ``python bench/fusion.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import dlcc  # noqa: E402
from dlcc.api import optimize  # noqa: E402
from dlcc.fusion import plan_fusion  # noqa: E402
from dlcc.fusion.dnnfusion import bytes_moved, bytes_moved_unfused  # noqa: E402
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model, randomize  # noqa: E402
from machine import write_section  # noqa: E402


def bench_model(name: str) -> dict:
    proto = light_model(name, seed=0) if name in LIGHT_MODELS else randomize(KIT_MODELS[name](), seed=0)
    original = len(proto.graph.node)
    model = optimize(dlcc.load(proto), emit=lambda s: None)
    row = {"model": name, "onnx": original, "optimized": model.graph.num_nodes(),
           "unfused MB": bytes_moved_unfused(model.graph) / 1e6}
    for planner in ("tvm", "dnnfusion"):
        t0 = time.perf_counter()
        plan = plan_fusion(model, planner)
        row[f"{planner} s"] = time.perf_counter() - t0
        row[f"{planner} kernels"] = plan.num_kernels
        row[f"{planner} MB"] = bytes_moved(plan) / 1e6
    row["auto"] = plan_fusion(model, "auto").planner
    return row


def render(rows: list[dict]) -> str:
    head = ["model", "ONNX nodes", "optimized nodes", "TVM kernels", "DNNFusion kernels",
            "rate TVM (opt / orig)", "rate DNNFusion (opt / orig)", "MB moved unfused", "MB TVM",
            "MB DNNFusion", "auto picks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tk, dk = r["tvm kernels"], r["dnnfusion kernels"]
        lines.append("| " + " | ".join([
            r["model"], str(r["onnx"]), str(r["optimized"]), str(tk), str(dk),
            f"{r['optimized'] / tk:.2f} / {r['onnx'] / tk:.2f}", f"{r['optimized'] / dk:.2f} / {r['onnx'] / dk:.2f}",
            f"{r['unfused MB']:.1f}", f"{r['tvm MB']:.1f}", f"{r['dnnfusion MB']:.1f}", r["auto"],
        ]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join([*LIGHT_MODELS, *KIT_MODELS]))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for name in [m for m in args.models.split(",") if m]:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(name))
    table = render(rows)
    print(table)
    if not args.no_write:
        body = ("Run: `make bench` (bench/fusion.py). Kernels = fusion groups after `dlcc optimize` (default "
                "level); bytes moved = what the kernels read and write (group inputs + outputs). For reference, "
                "TVM 0.27's FuseOps leaves 145 kernels on the light ResNet-50, where nothing is folded first.\n\n"
                + table)
        write_section(ROOT / "docs" / "BENCHMARKS.md", "Fusion planners", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
