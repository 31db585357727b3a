"""Benchmark: compiled latency and memory of dlcc against onnxruntime, on the light, test-kit and sized models.

What goes in: the nine light models of the onnx wheel, the dlcc.testing kit models (seeded random
weights) and the models at real sizes built in code (``SIZED``: BERT-base encoders at sequence 32, 128
and 512, a DistilBERT-sized encoder, GPT-2 small, ViT-B/16 and eight CNNs),
compiled with ``dlcc.compile`` (level 3 for the dlcc-c target, ``--fusion auto``, -O3 -march=native).
What comes out: per model, the compile time, the kernel count, the max error against onnxruntime
(relative to the output's scale), the latency of dlcc and of onnxruntime (1 thread, all graph
optimizations on; best of N runs after warm-up, both measured in the same process, interleaved), their
ratio, and the memory figures: dlcc's arena, its lower bound (the peak of simultaneously live bytes) and
the sum without reuse, against onnxruntime's memory: the peak RSS growth during its first inference
(/proc/self/status VmHWM, reset once the session is created, in a fresh subprocess; see ``_ort_peak``)
and its whole-process peak. Printed and written to docs/BENCHMARKS.md.

Run: ``make bench`` or ``python bench/compiled.py [--models a,b] [--runs N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

import dlcc  # noqa: E402
from dlcc.build.probe import fma_peak_gflops  # noqa: E402
from dlcc.check import _session, diff, random_inputs  # noqa: E402
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model, randomize  # noqa: E402
from dlcc.testing.models import (  # noqa: E402
    convnext_block_stack,
    deeplabv3_head,
    efficientnet_b0,
    gpt2_decoder_stack,
    mobilenet_v2,
    mobilenet_v3_small,
    resnet18,
    shufflenet_v2,
    squeezenet,
    transformer_encoder_block,
    vit_b16,
)
from machine import write_section  # noqa: E402

# VmHWM, reset after the session is created (clear_refs 5), so the growth is what the run itself needs
_PEAK = r"""
import sys, numpy as np, onnxruntime as ort
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
path, feeds_path = sys.argv[1], sys.argv[2]
feeds = dict(np.load(feeds_path))
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS: the peak below is the run's own
before = hwm()
s.run(None, feeds)
after = hwm()
print(after - before, after)
"""


def _ort_peak(proto, feeds, tmp: Path) -> tuple[int, int]:
    """(peak RSS growth during the first inference, total peak RSS) of onnxruntime, in bytes."""
    import onnx

    path = tmp / "m.onnx"
    onnx.save(proto, path)
    np.savez(tmp / "feeds.npz", **feeds)
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(tmp / "feeds.npz")], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


# models at real sizes, built in code (seeded random weights); the CNNs are the torchvision architectures
# layer for layer (BatchNormalization kept), batch 1, float32 [1, 3, 224, 224] images, opset 17. Their names
# must not be LIGHT_MODELS names (``_model`` looks those up first): hence "squeezenet1_1".
SIZED = {
    # BERT-base-sized encoder: 12 layers, hidden 768, 12 heads, FFN 3072, sequence 128, batch 1
    "bert_base_enc": lambda: transformer_encoder_block(batch=1, seq=128, vocab=1000, d_model=768, heads=12,
                                                      ffn=3072, layers=12),
    # GPT-2 small (HF eager export pattern), seq 128, vocab 1000: 86.6M parameters, 22.3 GFLOP
    "gpt2_small": gpt2_decoder_stack,
    # ViT-B/16 (torchvision), [1, 3, 224, 224] -> 1000 logits: 86.6M parameters, 35.1 GFLOP
    "vit_b16": vit_b16,
    # DistilBERT-sized encoder: BERT-base dims, 6 layers, seq 128: 43.4M parameters, 11.2 GFLOP
    "distilbert_enc": lambda: transformer_encoder_block(batch=1, seq=128, vocab=1000, d_model=768, heads=12,
                                                       ffn=3072, layers=6),
    # BERT-base encoder at sequence 32: 85.8M parameters, 5.5 GFLOP
    "bert_base_enc_s32": lambda: transformer_encoder_block(batch=1, seq=32, vocab=1000, d_model=768, heads=12,
                                                          ffn=3072, layers=12),
    # BERT-base encoder at sequence 512: 86.2M parameters, 96.6 GFLOP
    "bert_base_enc_s512": lambda: transformer_encoder_block(batch=1, seq=512, vocab=1000, d_model=768, heads=12,
                                                           ffn=3072, layers=12),
    "mobilenet_v2": mobilenet_v2,  # width 1.0, 3.50M parameters, 0.60 GFLOP
    "mobilenet_v3_small": mobilenet_v3_small,  # 2.54M parameters, 0.11 GFLOP
    "efficientnet_b0": efficientnet_b0,  # 5.29M parameters, 0.77 GFLOP
    "resnet18": resnet18,  # 11.7M parameters, 3.6 GFLOP
    "shufflenet_v2": shufflenet_v2,  # x1.0, 2.28M parameters, 0.29 GFLOP
    "squeezenet1_1": squeezenet,  # 1.24M parameters, 0.70 GFLOP (the light "squeezenet" is version 1.0)
    # ConvNeXt-T's stem and first two stages (3 blocks at 96 channels 56x56, 3 at 192 28x28), pool + FC:
    # 1.43M parameters, 3.1 GFLOP
    "convnext_block_stack": convnext_block_stack,
    # DeepLabV3's ASPP head on output-stride-8 ResNet features [1, 2048, 28, 28], 21 classes, upsampled x8 to
    # 224x224: 16.1M parameters, 24.5 GFLOP
    "deeplabv3_head": deeplabv3_head,
}


def _model(name: str):
    if name in LIGHT_MODELS:
        return light_model(name, seed=0)
    if name in SIZED:
        return SIZED[name]()
    return randomize(KIT_MODELS[name](), seed=0)


def _busy_threads() -> int | None:
    """Threads of this process other than the calling one that are running or runnable (a pool spinning
    between runs shows as one), or None where /proc cannot tell."""
    me = str(threading.get_native_id())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    busy = 0
    for tid in tids:
        if tid == me:
            continue
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        busy += stat[stat.rindex(")") + 2] == "R"
    return busy


def _quiesce(limit_s: float = 0.2) -> None:
    """Wait until no other thread of the process runs (three looks in a row, 0.5 ms apart), at most
    ``limit_s``. onnxruntime's intra-op pool spins for about 35 ms after each run on this kind of machine
    (measured); without the wait, whatever is timed next shares the second core with that spinning thread
    (dlcc's 2-thread SqueezeNet 1.1: 1.8 ms back to back, a median of 5.9 ms right after onnxruntime's)."""
    t0, quiet = time.perf_counter(), 0
    while time.perf_counter() - t0 < limit_s:
        busy = _busy_threads()
        if busy is None:
            time.sleep(0.05)
            return
        quiet = quiet + 1 if busy == 0 else 0
        if quiet >= 3:
            return
        time.sleep(0.0005)


WARM_S, WARM_MAX_CALLS = 0.01, 1000


def _interleaved(fns, runs: int) -> list[tuple[float, float]]:
    """(best, median) wall time in ms of each callable over ``runs`` rounds, called in turns each round.
    Each turn first waits until the previous configuration's threads have stopped (``_quiesce``), then calls
    its callable for ``WARM_S`` (at least once), then times one more call: an idle core takes a few
    milliseconds to come back to full speed on this VM (a 2-thread model's first calls after 100 ms idle: 3.2,
    2.3, 1.9, then 1.8 ms; a 0.6 ms model timed after 3 calls still ran at half speed), so each configuration
    is timed as it runs back to back, the way an application calls it, neither helped nor slowed by the
    other's threads."""
    times = [[] for _ in fns]
    for _ in range(runs):
        for i, fn in enumerate(fns):
            _quiesce()
            t0, calls = time.perf_counter(), 0
            while calls == 0 or (time.perf_counter() - t0 < WARM_S and calls < WARM_MAX_CALLS):
                fn()
                calls += 1
            t = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t)
    return [(1e3 * min(ts), 1e3 * float(np.median(ts))) for ts in times]


def bench_model(name: str, runs: int, tmp: Path) -> dict:
    proto = _model(name)
    feeds = random_inputs(proto, seed=1)
    t0 = time.perf_counter()
    cm = dlcc.compile(proto, threads=2)
    compile_s = time.perf_counter() - t0
    cm1 = dlcc.compile(proto, threads=1)  # one thread: the build a one-thread user gets (no pool, no pthreads)
    sess = _session(proto, threads=1)
    sess2 = _session(proto, threads=2)
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = cm(feeds)
    err = max(diff(k, ref[k], got[k], rtol=1e-4, atol=1e-6).max_abs / max(float(np.max(np.abs(ref[k]))), 1e-30)
              for k in ref)

    fns = [lambda: cm1(feeds), lambda: sess.run(None, feeds), lambda: cm(feeds), lambda: sess2.run(None, feeds)]
    for _ in range(2):  # warm-up
        for fn in fns:
            fn()
    (d1, d1m), (o1, o1m), (d2, d2m), (o2, o2m) = _interleaved(fns, runs)
    dlcc_ms, ort_ms = d1, o1
    info = cm.info
    ort_delta, ort_total = _ort_peak(proto, feeds, tmp)
    return {"model": name, "compile s": compile_s, "cc s": info["timings"].get("cc", 0.0),
            "kernels": info["kernels"], "err": err,
            "dlcc ms": dlcc_ms, "ort ms": ort_ms, "dlcc med": d1m, "ort med": o1m, "dlcc2 ms": d2, "dlcc2 med": d2m,
            "ort2 ms": o2, "ort2 med": o2m, "arena": info["arena_bytes"],
            "lb": info["lower_bound_bytes"], "noreuse": info["no_reuse_bytes"], "ort delta": ort_delta,
            "ort total": ort_total, "fusion": info["fusion"],
            "gflop": sum(k["flops"] or 0 for k in info["per_kernel"]) / 1e9}


def _ms(v: float) -> str:
    """Milliseconds with 3 significant digits at least (a kit model's 0.0033 ms is not "0.00")."""
    return f"{v:.2f}" if v >= 1 else f"{v:.3f}" if v >= 0.1 else f"{v:.4f}"


def render(rows: list[dict], peak: float) -> str:
    """The table; ``peak`` is the measured single-core FMA peak (dlcc.build.probe) in GFLOP/s."""
    mb = 1024 * 1024
    head = ["model", "kernels (planner)", "compile s (cc)", "max rel err", "dlcc 1T ms", "ort 1T ms",
            "ort/dlcc 1T", "dlcc 2T ms", "ort 2T ms", "ort/dlcc 2T", "dlcc 2T speedup", "dlcc 1T GFLOP/s",
            "% of measured FMA peak (1T)", "arena MiB",
            "lower bound MiB", "arena / bound", "no reuse MiB",
            "ort peak RSS growth MiB", "ort peak RSS MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r["model"], f"{r['kernels']} ({r['fusion']})", f"{r['compile s']:.1f} ({r['cc s']:.1f})", f"{r['err']:.1e}",
            f"{_ms(r['dlcc ms'])} / {_ms(r['dlcc med'])}", f"{_ms(r['ort ms'])} / {_ms(r['ort med'])}",
            f"{r['ort ms'] / r['dlcc ms']:.2f}", f"{_ms(r['dlcc2 ms'])} / {_ms(r['dlcc2 med'])}",
            f"{_ms(r['ort2 ms'])} / {_ms(r['ort2 med'])}", f"{r['ort2 ms'] / r['dlcc2 ms']:.2f}",
            f"{r['dlcc ms'] / r['dlcc2 ms']:.2f}",
            f"{r['gflop'] / (r['dlcc ms'] / 1e3):.1f}", f"{100 * r['gflop'] / (r['dlcc ms'] / 1e3) / peak:.1f}",
            f"{r['arena'] / mb:.2f}", f"{r['lb'] / mb:.2f}", f"{r['arena'] / r['lb']:.3f}" if r["lb"] else "-",
            f"{r['noreuse'] / mb:.2f}", f"{r['ort delta'] / mb:.1f}", f"{r['ort total'] / mb:.0f}",
        ]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join([*LIGHT_MODELS, *KIT_MODELS, *SIZED]))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DLCC_CACHE_DIR"] = str(Path(tmp) / "cache")  # a cold cache: compile times include cc
        for name in [m for m in args.models.split(",") if m]:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            rows.append(bench_model(name, args.runs, Path(tmp)))
    peak = fma_peak_gflops()  # the same probe and cache as `dlcc run --profile`
    table = render(rows, peak)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if not args.no_write:
        body = ("Run: `make bench` (bench/compiled.py). dlcc.compile (level 3, dlcc-c target, --fusion auto, "
                "-O3 -march=native, compiled for 1 thread and for 2) against onnxruntime (1 and 2 "
                "intra-op threads, all graph optimizations); times are best / median ms of "
                f"{args.runs} interleaved runs in one process (the four configurations take turns; each turn waits "
                "until the other's threads have stopped spinning, warms up for 10 ms, then times one call); ratios "
                "are onnxruntime's best over dlcc's (above 1: dlcc is faster). GFLOP/s: dlcc.ops.cost FLOPs of "
                "the compiled kernels over dlcc's time; % of the measured single-core float32 FMA peak "
                f"({peak:.1f} GFLOP/s, "
                "dlcc.build.probe, as in `dlcc run --profile`). Memory: dlcc's arena (all intermediate "
                "tensors) and its lower bound (peak of simultaneously live bytes); onnxruntime's peak RSS "
                "growth during its first inference (VmHWM reset after the session is created; onnxruntime "
                "sets up much of its arena while creating the session, so this understates its activation "
                "memory) and its whole-process peak RSS (Python, onnxruntime, weights), in a subprocess.\n\n"
                + table)
        write_section(ROOT / "docs" / "BENCHMARKS.md", "Compiled models (dlcc.compile vs onnxruntime)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
