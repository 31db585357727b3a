"""``make demo``: dlcc end to end on a model that needs no download.

What goes in: nothing; the light ResNet-50 that the onnx wheel ships, with seeded random weights.
What comes out: in ./demo-out/, the model, its optimized form and an HTML page of its fusion groups; on
the terminal, what ``dlcc inspect``, ``dlcc optimize --stats``, ``dlcc check`` and ``dlcc report`` print,
then a short report. Exits non-zero if any step fails
or the optimized model does not match the original in onnxruntime.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import onnx

import dlcc
from dlcc.cli import main as dlcc_main


def _step(title: str, *argv: str) -> None:
    print(f"\n$ dlcc {' '.join(argv)}    # {title}", flush=True)
    code = dlcc_main(list(argv))
    if code != 0:
        print(f"demo: step failed with exit code {code}", file=sys.stderr)
        sys.exit(code)


def main() -> int:
    from dlcc.testing import light_model

    out = Path("demo-out")
    out.mkdir(exist_ok=True)
    src, opt = out / "resnet50.onnx", out / "resnet50.opt.onnx"
    onnx.save(light_model("resnet50", seed=0), src)
    print(f"demo: wrote {src} (the onnx wheel's light ResNet-50 with seeded random weights)")
    _step("what is in the model", "inspect", str(src))
    t0 = time.perf_counter()
    _step("optimize it", "optimize", str(src), str(opt), "--stats")
    seconds = time.perf_counter() - t0
    _step("compare with the original in onnxruntime", "check", str(src), str(opt))
    _step("draw the fusion groups", "report", str(src), "-o", str(out / "resnet50.html"))
    from dlcc.fusion import plan_fusion

    plan = plan_fusion(dlcc.load(opt), "auto")
    before = Counter(n.op_type for n in onnx.load(src).graph.node)
    after = Counter(n.op_type for n in onnx.load(opt).graph.node)
    print("\n== dlcc demo report ==")
    print(f"model      : ResNet-50 (light, random weights), {src.stat().st_size / 1e6:.1f} MB")
    print(f"nodes      : {sum(before.values())} -> {sum(after.values())}")
    changed = sorted(set(before) | set(after), key=lambda k: -before[k])
    moved = ", ".join(f"{k} {before[k]}->{after[k]}" for k in changed if before[k] != after[k])
    print(f"ops        : {moved or 'unchanged'}")
    print(f"optimize   : {seconds:.2f} s, wrote {opt} ({opt.stat().st_size / 1e6:.1f} MB)")
    print("check      : outputs match onnxruntime on the original (see table above)")
    print(f"fusion     : {plan.num_kernels} kernels ({plan.fusion_rate:.2f} nodes per kernel); {plan.reason}")
    print(f"report     : {out / 'resnet50.html'} (open it in a browser)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
