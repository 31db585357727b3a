"""``make demo``: dlcc end to end on a model that needs no download.

What goes in: nothing; the light ResNet-50 that the onnx wheel ships, with seeded random weights.
What comes out: in ./demo-out/, the model, its optimized form, an HTML page of its fusion groups and a
standalone C bundle; on the terminal, what ``dlcc inspect``, ``dlcc optimize --stats``, ``dlcc check``,
``dlcc report``, ``dlcc compile`` and ``dlcc run --compare-ort --bench`` print, then a short report with
the latency of dlcc and onnxruntime, the fusion and memory figures and the max error. Exits non-zero if
any step fails or an output does not match the original in onnxruntime.
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
    bundle = out / "resnet50-c"
    _step("compile it to a standalone C bundle", "compile", str(src), "-o", str(bundle), "--build")
    _step("run the bundle, compare with onnxruntime", "run", str(bundle), "--compare-ort")
    compiled = _compiled_figures(src)
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
    print(f"fusion     : {plan.num_kernels} groups ({plan.fusion_rate:.2f} nodes per group); {plan.reason}")
    print(f"report     : {out / 'resnet50.html'} (open it in a browser)")
    c = compiled
    mib = 1024 * 1024
    print(f"compile    : {c['kernels']} C kernels ({c['fusion']}), compiled in {c['compile']:.1f} s; "
          f"bundle {bundle} ({c['binary'] / 1024:.0f} KiB binary + {c['weights'] / mib:.1f} MiB weights.bin)")
    print(f"memory     : arena {c['arena'] / mib:.2f} MiB, lower bound {c['bound'] / mib:.2f} MiB "
          f"({c['arena'] / c['bound']:.3f}x), {c['noreuse'] / mib:.2f} MiB without reuse")
    print(f"latency    : dlcc {c['dlcc']:.1f} ms, onnxruntime {c['ort']:.1f} ms (1 thread, best of 5; "
          f"dlcc/ort {c['dlcc'] / c['ort']:.2f})")
    print(f"max error  : {c['err']:.2e} of the output's scale against onnxruntime (tolerance 1e-4)")
    if c["err"] > 1e-4:
        print("demo: the compiled model does not match onnxruntime", file=sys.stderr)
        return 1
    return 0


def _compiled_figures(src: Path) -> dict:
    import numpy as np

    from dlcc.check import _session, interleaved_best_ms, random_inputs

    proto = onnx.load(src)
    t0 = time.perf_counter()
    cm = dlcc.compile(proto, threads=1)  # the latency line compares one thread with one thread
    compile_s = time.perf_counter() - t0
    feeds = random_inputs(proto, seed=7)
    sess = _session(proto, threads=1)
    ref = sess.run(None, feeds)
    got = list(cm(feeds).values())
    err = max(float(np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-30)) for g, r in zip(got, ref, strict=True))
    dlcc_ms, ort_ms = interleaved_best_ms([lambda: cm(feeds), lambda: sess.run(None, feeds)], 5)
    info = cm.info
    binary = Path("demo-out/resnet50-c/model")
    return {"kernels": info["kernels"], "fusion": cm.artifacts.plan.reason, "compile": compile_s,
            "arena": info["arena_bytes"], "bound": info["lower_bound_bytes"], "noreuse": info["no_reuse_bytes"],
            "weights": info["weights_bytes"], "binary": binary.stat().st_size if binary.exists() else 0,
            "dlcc": dlcc_ms, "ort": ort_ms, "err": err}


if __name__ == "__main__":
    sys.exit(main())
