"""Benchmark: dlcc optimize against the graph optimizers users run today (light and test-kit models).

What goes in: the nine light reference models that the onnx wheel ships and the dlcc.testing kit models
(MLP, conv stacks, attention, transformer encoder, LayerNorm/GELU written out), all with seeded random
weights, so every tool sees real weights rather than all-ones generators.
What comes out: a table per model and tool — node count after, wall time of the optimization (load,
optimize, save), whether the outputs still match the original in onnxruntime (max|got-ref| <=
1e-4 * max|ref| + 1e-6), output file size, and the latency of the optimized model under onnxruntime
(1 thread, default optimizations) as a ratio to onnxslim's output measured in the same run. The table is
printed and written to docs/BENCHMARKS.md with the machine described.

Wall time: the tools take turns (round-robin, so a slow spell of the machine hits all of them) and the best
of at least --wall-repeat runs is kept (fast models get more turns, until each tool has run --wall-budget
seconds, so their best run is as well sampled as a slow model's). A full garbage collection runs before
each timed run (untimed), so no run pays for, or profits from, what an earlier run of any tool left
behind: without it, dlcc's uncollected object graphs keep the heap from being trimmed, and the next tool's
allocations reuse that memory instead of faulting in fresh pages as they would in a process of their own.

Each run writes a new output file: the previous run's output is removed first (untimed). A user runs a
tool once per output; writing over the file the last turn left would time ext4's flush of a replaced file's
delayed-allocation data (auto_da_alloc), which a tool that renames a finished file into place pays on every
run (dlcc: 2-3 ms for 5 MB) and one that truncates the old file pays only now and then.

Each model is measured in a fresh process of its own (one at a time), so its figures do not depend on the
models measured before it.

Command-line wall time: each tool's command (``dlcc optimize IN OUT``, ``onnxsim IN OUT``, ``onnxslim IN OUT``,
``python -m onnxoptimizer IN OUT``) run --cli-repeat times in turns, a fresh process each run, best kept: what a
user waits for, interpreter start and imports included (onnxruntime's BASIC level has no command line).

Peers: onnxsim (simplify), onnxslim (slim), onnxoptimizer (default passes), onnxruntime's BASIC level
saved offline. Run: ``make bench`` (or ``python bench/optimizers.py --models resnet50,vgg19``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import dlcc  # noqa: E402
from dlcc.check import check_models, random_inputs  # noqa: E402
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model, randomize  # noqa: E402
from machine import write_section  # noqa: E402

RTOL, ATOL = 1e-4, 1e-6


def _quiet(fn: Callable, *args, **kwargs):
    """Peers print a lot; keep the benchmark output readable."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args, **kwargs)


def run_dlcc(src: Path, dst: Path) -> None:
    from dlcc.api import optimize

    model = optimize(dlcc.load(src))
    dlcc.save(model, dst)


def run_onnxsim(src: Path, dst: Path) -> None:
    import onnxsim

    model, ok = _quiet(onnxsim.simplify, onnx.load(src))
    if not ok:
        raise RuntimeError("onnxsim check failed")
    onnx.save(model, dst)


def run_onnxslim(src: Path, dst: Path) -> None:
    import onnxslim

    model = _quiet(onnxslim.slim, onnx.load(src))
    onnx.save(model, dst)


def run_onnxoptimizer(src: Path, dst: Path) -> None:
    import onnxoptimizer

    onnx.save(onnxoptimizer.optimize(onnx.load(src)), dst)


def run_ort_basic(src: Path, dst: Path) -> None:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(dst)
    opts.intra_op_num_threads = 1
    ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])


TOOLS: dict[str, Callable[[Path, Path], None]] = {
    "dlcc": run_dlcc,
    "onnxsim": run_onnxsim,
    "onnxslim": run_onnxslim,
    "onnxoptimizer": run_onnxoptimizer,
    "ort-basic": run_ort_basic,
}


BIN = Path(sys.executable).parent

# the command a user types, per tool that has one (onnxruntime's offline optimization is an API, not a CLI)
CLI: dict[str, Callable[[Path, Path], list[str]]] = {
    "dlcc": lambda src, dst: [str(BIN / "dlcc"), "optimize", str(src), str(dst)],
    "onnxsim": lambda src, dst: [str(BIN / "onnxsim"), str(src), str(dst)],
    "onnxslim": lambda src, dst: [str(BIN / "onnxslim"), str(src), str(dst)],
    "onnxoptimizer": lambda src, dst: [sys.executable, "-m", "onnxoptimizer", str(src), str(dst)],
}


def cli_seconds(src: Path, work: Path, tools: list[str], repeat: int) -> dict[str, float | str]:
    """Best wall time of each tool's command line over ``repeat`` runs taken in turns: a fresh process per
    run (interpreter start, imports, load, optimize, save), writing a new file each time; a tool whose
    command fails gets the error instead."""
    best: dict[str, float | str] = {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(repeat):
        for tool in tools:
            if tool not in CLI or isinstance(best.get(tool), str):
                continue
            dst = work / f"{src.stem}.{tool}.cli.onnx"
            dst.unlink(missing_ok=True)
            t0 = time.perf_counter()
            done = subprocess.run(CLI[tool](src, dst), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=env, check=False)
            seconds = time.perf_counter() - t0
            if done.returncode != 0 or not dst.exists():
                best[tool] = f"error (exit {done.returncode})"
                continue
            best[tool] = min(seconds, best.get(tool, seconds))
            dst.unlink()
    return best


def latencies_ms(paths: dict[str, Path], feeds: dict, repeat: int) -> dict[str, float]:
    """Median latency per model file, measured round-robin (one run of each in turn) so that a noisy
    moment of the machine hits every tool alike."""
    import onnxruntime as ort

    sessions = {}
    for tool, path in paths.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        data = {k: v for k, v in feeds.items() if k in names}
        sess.run(None, data)  # warm-up
        sessions[tool] = (sess, data)
    times: dict[str, list[float]] = {tool: [] for tool in sessions}
    for _ in range(repeat):
        for tool, (sess, data) in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, data)
            times[tool].append(time.perf_counter() - t0)
    return {tool: statistics.median(ts) * 1e3 for tool, ts in times.items()}


MAX_TURNS = 61


def bench_model(name: str, work: Path, repeat: int, tools: list[str], wall_repeat: int = 3,
                wall_budget: float = 0.0, cli_repeat: int = 0) -> list[dict]:
    src = work / f"{name}.onnx"
    onnx.save(light_model(name, seed=0) if name in LIGHT_MODELS else randomize(KIT_MODELS[name](), seed=0), src)
    nodes0 = len(onnx.load(src, load_external_data=False).graph.node)
    feeds = random_inputs(str(src), seed=1)
    rows = [{"model": name, "tool": "original", "nodes": nodes0, "seconds": 0.0, "match": "-",
             "bytes": src.stat().st_size, "latency_ms": None, "path": src}]
    # the tools take turns (round-robin), so a slow spell of the machine hits every tool alike; the best
    # of the runs is kept
    seconds: dict[str, list[float]] = {tool: [] for tool in tools}
    failed: dict[str, str] = {}
    # at least wall_repeat turns; fast models get more (until every tool has spent wall_budget seconds, at
    # most MAX_TURNS turns), so the best run of a 15 ms optimization is as well sampled as a 2 s one
    turns = 0
    while turns < wall_repeat or (turns < MAX_TURNS and any(
            sum(seconds[t]) < wall_budget for t in tools if t not in failed)):
        turns += 1
        for tool in tools:
            if tool in failed:
                continue
            dst = work / f"{name}.{tool}.onnx"
            dst.unlink(missing_ok=True)  # every run writes a new file, as a user's one run does (docstring)
            gc.collect()  # every run starts from the same heap state (see the module docstring)
            t0 = time.perf_counter()
            try:
                TOOLS[tool](src, dst)
            except Exception as e:  # a peer failing on a model is a result, not a crash
                failed[tool] = f"error: {type(e).__name__}"
                continue
            seconds[tool].append(time.perf_counter() - t0)
    for tool in tools:
        dst = work / f"{name}.{tool}.onnx"
        row = {"model": name, "tool": tool}
        if tool in failed:
            row.update(nodes=None, seconds=None, match=failed[tool], bytes=None, latency_ms=None)
            rows.append(row)
            continue
        row["seconds"] = min(seconds[tool])
        model = onnx.load(dst, load_external_data=False)
        row["nodes"] = len(model.graph.node)
        row["bytes"] = dst.stat().st_size
        try:
            diffs = check_models(str(src), str(dst), feeds=feeds, rtol=RTOL, atol=ATOL)
            row["match"] = "yes" if all(d.ok for d in diffs) else \
                f"NO ({max(d.max_rel for d in diffs):.1e})"
        except Exception as e:
            row["match"] = f"error: {type(e).__name__}"
        row["latency_ms"] = None
        row["path"] = dst
        rows.append(row)
    if cli_repeat:
        cli = cli_seconds(src, work, tools, cli_repeat)
        for r in rows:
            r["cli"] = cli.get(r["tool"])
    if repeat:
        timed = {r["tool"]: r["path"] for r in rows if r.get("path") and r["match"] in ("yes", "-")}
        lat = latencies_ms(timed, feeds, repeat)
        for r in rows:
            r["latency_ms"] = lat.get(r["tool"])
    return rows


def render(rows: list[dict], tools: list[str]) -> str:
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["tool"]] = r
    lines = []
    head = ["model", "orig nodes"] + [f"{t} nodes" for t in tools]
    lines.append("### Node count after optimization (lower is better; * = smallest)\n")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for model, r in by_model.items():
        counts = {t: r[t]["nodes"] for t in tools if r.get(t, {}).get("nodes") is not None
                  and r[t]["match"] == "yes"}
        best = min(counts.values()) if counts else None
        cells = [model, str(r["original"]["nodes"])]
        for t in tools:
            n = r.get(t, {}).get("nodes")
            ok = r.get(t, {}).get("match") == "yes"
            cells.append("-" if n is None else f"{n}{'*' if ok and n == best else ''}{'' if ok else ' (mismatch)'}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\n### Optimization wall time in seconds (load + optimize + save in this process; the tools take "
                 "turns, a full garbage collection before each run; best of at least --wall-repeat runs, more for "
                 f"fast models: until each tool has run --wall-budget seconds, at most {MAX_TURNS} runs)\n")
    ratio = "dlcc" in tools and "onnxsim" in tools
    head = ["model"] + tools + (["dlcc / onnxsim"] if ratio else [])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))

    def secs(row: dict | None) -> str:
        return "-" if row is None or row.get("seconds") is None else f"{row['seconds']:.3g}"

    for model, r in by_model.items():
        cells = [model] + [secs(r.get(t)) for t in tools]
        if ratio:
            a, b = r.get("dlcc", {}).get("seconds"), r.get("onnxsim", {}).get("seconds")
            cells.append(f"{a / b:.2f}" if a and b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    cli_tools = [t for t in tools if t in CLI and any(r.get(t, {}).get("cli") is not None for r in by_model.values())]
    if cli_tools:
        lines.append("\n### Command-line wall time in seconds (what a user waits for: a fresh process per run, "
                     "so interpreter start and imports count too; best of --cli-repeat runs taken in turns)\n")
        head = ["model"] + [f"`{t}` CLI" for t in cli_tools] + (["dlcc / onnxsim"] if ratio else [])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for model, r in by_model.items():
            vals = {t: r.get(t, {}).get("cli") for t in cli_tools}
            cells = [model] + ["-" if v is None else v if isinstance(v, str) else f"{v:.3g}" for v in vals.values()]
            if ratio:
                a, b = vals.get("dlcc"), vals.get("onnxsim")
                cells.append(f"{a / b:.2f}" if isinstance(a, float) and isinstance(b, float) else "-")
            lines.append("| " + " | ".join(cells) + " |")
    head = ["model"] + tools
    lines.append("\n### Outputs match the original (rtol 1e-4 of each output's scale, atol 1e-6)\n")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for model, r in by_model.items():
        lines.append("| " + " | ".join([model] + [r[t]["match"] if t in r else "-" for t in tools]) + " |")
    lines.append("\n### Output size (MB) and onnxruntime latency (1 thread, median of --repeat runs taken "
                 "round-robin) relative to onnxslim's output\n")
    head = ["model", "orig MB"] + [f"{t} MB" for t in tools] + [f"{t} latency / onnxslim" for t in tools]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for model, r in by_model.items():
        cells = [model, f"{r['original']['bytes'] / 1e6:.1f}"]
        cells += [f"{r[t]['bytes'] / 1e6:.1f}" if r.get(t, {}).get("bytes") else "-" for t in tools]
        anchor = r.get("onnxslim", {}).get("latency_ms")
        for t in tools:
            lat = r.get(t, {}).get("latency_ms")
            cells.append(f"{lat / anchor:.2f}" if lat and anchor else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join([*LIGHT_MODELS, *KIT_MODELS]),
                        help="light models of the onnx wheel and dlcc.testing kit models (default: all)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--repeat", type=int, default=10, help="latency runs per model (0 = skip latency)")
    parser.add_argument("--wall-repeat", type=int, default=11,
                        help="optimization runs per tool at least, taken in turns (best is kept; the machine is noisy)")
    parser.add_argument("--wall-budget", type=float, default=1.5,
                        help=f"more turns (up to {MAX_TURNS}) until each tool has run this many seconds")
    parser.add_argument("--cli-repeat", type=int, default=3,
                        help="command-line runs per tool (a fresh process each; 0 = skip)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    tools = [t for t in args.tools.split(",") if t]
    rows: list[dict] = []
    # one fresh process per model (one at a time): a model's figures must not depend on which models ran
    # before it in the same process (their heap is what the next model's allocations find)
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(max_workers=1, mp_context=ctx,
                                                                    max_tasks_per_child=1) as pool:
        for name in models:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
            rows.extend(pool.submit(bench_model, name, Path(tmp), args.repeat, tools, args.wall_repeat,
                                    args.wall_budget, args.cli_repeat).result())
    table = render(rows, tools)
    print(table)
    if not args.no_write:
        body = (f"Run: `make bench` (bench/optimizers.py). dlcc {dlcc.__version__}, "
                f"{_versions()}.\nModels: the nine light models of the onnx wheel with seeded random "
                "weights (dlcc.testing.light_model(name, seed=0)) and the dlcc.testing kit models "
                "(randomize(builder(), seed=0)).\n\n" + table)
        write_section(ROOT / "docs" / "BENCHMARKS.md", "Graph optimizers", body)
    return 0


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("onnx", "onnxruntime", "onnxsim", "onnxslim", "onnxoptimizer"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} (absent)")
    return ", ".join(out)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
