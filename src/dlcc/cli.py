"""The ``dlcc`` command line.

    dlcc optimize IN OUT [--level N] [--input-shape NAME=1,3,224,224 ...] [--stats] [--print-after P]
                 [--emit-groups [--fusion auto|tvm|dnnfusion]]
    dlcc check A B [--input NAME=file.npy ...] [--rtol R] [--atol A] [--seed S]
    dlcc inspect MODEL [--input-shape ...] [--json] [--fusion [auto|tvm|dnnfusion]]
    dlcc report MODEL -o report.html [--fusion auto|tvm|dnnfusion] [--compiled [--bench N]]
    dlcc compile MODEL -o OUTDIR [--input-shape ...] [--fusion F] [--target T] [--build]
    dlcc run OUTDIR|MODEL [--input NAME=file.npy ...] [--compare-ort] [--bench N] [--save DIR] [--profile]

Errors caused by the user's input are one line on stderr and exit code 2 (``--debug`` shows the
traceback); a mismatch in ``dlcc check`` exits 1; an existing output file is never clobbered by a failed
run (outputs are written to a temp file and renamed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

import dlcc
from dlcc.errors import DlccError, InputError


def _console(stderr: bool) -> Console:
    c = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not c.is_terminal:  # pipes and logs: do not squeeze tables into 80 columns
        c = Console(stderr=stderr, highlight=False, soft_wrap=True, width=max(c.width, 140))
    return c


_err = _console(True)
_out = _console(False)


def _input_shapes(values: Sequence[str] | None) -> dict[str, list[int]]:
    from dlcc.frontend.shapes import parse_input_shape

    shapes: dict[str, list[int]] = {}
    for text in values or ():
        name, dims = parse_input_shape(text)
        if name in shapes:
            raise DlccError(f"--input-shape gives input '{name}' twice")
        shapes[name] = dims
    return shapes


def _input_files(values: Sequence[str] | None) -> dict[str, str]:
    files: dict[str, str] = {}
    for text in values or ():
        name, sep, path = text.partition("=")
        if not sep or not name or not path:
            raise InputError(f"--input '{text}' is not of the form NAME=file.npy")
        files[name] = path
    return files


@contextlib.contextmanager
def _progress(description: str) -> Iterator:
    """A transient spinner with elapsed time on a terminal; silent otherwise."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=_err, transient=True, disable=not _err.is_terminal)
    with progress:
        task = progress.add_task(description, total=None)

        def update(text: str) -> None:
            progress.update(task, description=f"{description}: {text}")

        yield update


def _print_notes(model) -> None:
    from dlcc.frontend.load import notes

    for note in notes(model):
        _err.print(f"dlcc: note: {note}")


def _pt2_or_path(path: str):
    """A saved torch.export program (``.pt2``) exported to ONNX (an onnx_ir model); any other path as is."""
    if path.endswith(".pt2"):
        from dlcc.frontend.torch.export import load_pt2

        return load_pt2(path)
    return path


def _load_model(path: str, **options):
    """``dlcc.load`` for ONNX files; a ``.pt2`` program is exported to ONNX (and checked by dlcc.load) first."""
    model = _pt2_or_path(path)
    return dlcc.load(model, **options) if isinstance(model, str) else model


# --------------------------------------------------------------------------------------------- commands


def cmd_optimize(args: argparse.Namespace) -> int:
    from dlcc.api import optimize
    from dlcc.frontend.save import save

    shapes = _input_shapes(args.input_shape)
    t0 = time.perf_counter()
    with _progress(f"optimizing {args.input}") as update:
        model = _load_model(args.input, keep_initializer_inputs=args.keep_initializer_inputs)
        _print_notes(model)
        before = model.graph.num_nodes()
        model = optimize(
            model, level=args.level, input_shapes=shapes, verify=args.verify,
            print_after=args.print_after or (), print_after_all=args.print_after_all,
            dump_dir=args.dump_dir, emit=_out.out, on_pass=update, target=args.target,
            allow_lossy=args.allow_lossy,
        )
        report = model.meta["dlcc.report"]
        after = model.graph.num_nodes()
        if args.emit_groups:
            from dlcc.fusion import plan_fusion
            from dlcc.fusion.emit import emit_groups

            update("planning fusion")
            plan = plan_fusion(model, args.fusion)
            model = emit_groups(model, plan)  # a new model: each group a call of a dlcc.fused function
            _err.print(f"dlcc: {after} nodes in {plan.num_kernels} fusion groups, written as dlcc.fused "
                       f"functions; {plan.reason}", markup=False)
        update("writing")
        save(model, args.output)
    if args.stats:
        _print_stats(report)
    _err.print(f"dlcc: {args.input}: {before} -> {after} nodes at level {args.level} "
               f"in {time.perf_counter() - t0:.2f} s; wrote {args.output}")
    return 0


def _figures(info: dict) -> str:
    mb = 1024 * 1024
    ws = info.get("workspace_peak_bytes", 0)
    scratch = f", largest kernel workspace {ws / mb:.2f}" if ws else ""
    return (f"{info['kernels']} kernels ({info['fusion']}), arena {info['arena_bytes'] / mb:.2f} MiB "
            f"(lower bound {info['lower_bound_bytes'] / mb:.2f}, no reuse {info['no_reuse_bytes'] / mb:.2f}"
            f"{scratch}), weights {info['weights_bytes'] / mb:.2f} MiB")


def _machine_target(args: argparse.Namespace):
    """The Target of --target (``--portable``: generic)."""
    from dlcc.schedule.target import get_target

    if getattr(args, "portable", False):
        if args.machine_target not in (None, "generic"):
            raise DlccError("--portable and --target name two targets", hint="give one of them")
        target = get_target("generic")
    else:
        target = get_target(args.machine_target)
    if not getattr(args, "winograd", True):  # --no-winograd
        target = dataclasses.replace(target, winograd=False)
    return target


def _stage_dumper(args: argparse.Namespace):
    """``dlcc compile --print-after STAGE`` (stdout) and ``--dump-dir DIR`` (``NN-stage.txt`` per stage)."""
    wanted = set(args.print_after or ())
    if not wanted and not args.dump_dir:
        return None
    from dlcc.frontend.save import atomic_output

    if args.dump_dir:
        try:
            Path(args.dump_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DlccError(f"cannot create the dump folder {args.dump_dir}: {e.strerror or e}") from None
    count = [0]

    def dump(stage: str, text: str) -> None:
        if stage in wanted:
            _out.out(f"; ---- after backend stage {stage} ----\n{text}")
        if args.dump_dir:
            with atomic_output(Path(args.dump_dir) / f"{count[0]:02d}-{stage}.txt") as f:
                f.write(text + "\n")
        count[0] += 1
    return dump


def cmd_compile(args: argparse.Namespace) -> int:
    from dlcc.build.bundle import build_bundle, write_bundle
    from dlcc.compiler import build_artifacts

    shapes = _input_shapes(args.input_shape)
    t0 = time.perf_counter()
    with _progress(f"compiling {args.model}") as update:
        art = build_artifacts(_pt2_or_path(args.model), input_shapes=shapes, fusion=args.fusion,
                              on_stage=update, target=_machine_target(args), threads=args.threads,
                              on_ir=_stage_dumper(args))
        update("writing the bundle")
        out = write_bundle(art, args.output, source=str(Path(args.model).resolve()))
        if args.dump_kernel_ir:
            from dlcc.frontend.save import atomic_output
            from dlcc.lower.kir import print_program

            with atomic_output(args.dump_kernel_ir) as f:  # buffers with arena offsets, kernels and their steps
                f.write(print_program(art.program, art.memory) + "\n")
        size = None
        if args.build:
            update("building with make")
            exe = build_bundle(out)
            size = exe.stat().st_size
    _err.print(f"dlcc: {args.model}: {_figures(art.info())}", markup=False)
    built = f"; built {out / 'model'} ({size / 1024:.0f} KiB without weights)" if size is not None else \
        f"; build it with: make -C {out}"
    _err.print(f"dlcc: wrote {out} in {time.perf_counter() - t0:.2f} s{built}", markup=False)
    return 0


def _run_bundle(path: Path, feeds: dict, bench: int, profile: bool = False,
                threads: int | None = None) -> tuple[dict, float | None, list[float] | None]:
    import errno
    import re
    import subprocess
    import tempfile

    import numpy as np

    from dlcc.build.bundle import build_bundle, check_runnable, not_runnable, read_manifest

    manifest = read_manifest(path)
    exe = path / "model"
    if not exe.exists():
        exe = build_bundle(path)
    check_runnable(path)
    with tempfile.TemporaryDirectory(prefix="dlcc-run-") as tmp:
        files = []
        for i, spec in enumerate(manifest["inputs"]):
            f = Path(tmp) / f"input{i}.npy"
            np.save(f, np.ascontiguousarray(feeds[spec["name"]]))
            files.append(str(f))
        cmd = [str(exe), "-q", "-o", tmp, *(["-n", str(bench)] if bench else []), *(["-p"] if profile else []),
               *(["-t", str(threads)] if threads else []), *files]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            if e.errno == errno.ENOEXEC:
                raise not_runnable(path, None) from None
            raise DlccError(f"cannot run '{exe}': {e.strerror}", hint=f"rebuild it: make -C {path}") from None
        if proc.returncode != 0:
            if profile and "usage:" in proc.stderr:
                raise DlccError(f"the bundle's executable '{exe}' has no profiling option -p",
                                hint="it predates it: rewrite the bundle with `dlcc compile` and rebuild it")
            raise DlccError(f"the bundle failed: {proc.stderr.strip()}")
        outs = {spec["name"]: np.load(Path(tmp) / spec["file"]) for spec in manifest["outputs"]}
    m = re.search(r"mean ([0-9.]+) ms", proc.stdout)
    seconds = None
    if profile:
        from dlcc.build.profile import parse_bundle_profile

        seconds = parse_bundle_profile(proc.stdout)[0]
    return outs, float(m.group(1)) if m else None, seconds


PROFILE_RUNS = 10  # profiled runs without --bench


def _bundle_kernels(path: Path, manifest: dict) -> list[dict]:
    kernels = manifest.get("figures", {}).get("per_kernel")
    if kernels is None:
        raise DlccError(f"the bundle '{path}' has no per-kernel figures in its model.json",
                        hint="it was written by an older dlcc: rewrite it with `dlcc compile`")
    return kernels


def _target_peak(target):
    """The measured FMA peak of the code generated for ``target`` (its vectors: x86-64-v3's AVX2 code on an
    AVX-512 machine is measured with AVX2's), raising DlccError where it cannot be measured."""
    from dlcc.build.cc import flags_for
    from dlcc.build.probe import fma_peak

    return fma_peak(flags=flags_for(target))


def _print_profile(kernels: list[dict], seconds, runs: int, threads: int, layouts: dict | None = None,
                   target=None) -> None:
    """The per-kernel table of ``dlcc run --profile``, slowest first, with a total line; % of the peak of
    ``target``'s code (default native)."""
    from dlcc.build.profile import profile_rows

    rows = profile_rows(kernels, list(seconds))
    try:
        peak = _target_peak(target)
    except DlccError as e:
        peak = None
        _err.print(f"dlcc: note: no % of peak: {e}", markup=False)
    gflops = peak.gflops if peak else None
    table = Table(title=f"kernels (best of {runs} profiled runs each)")
    for col in ("kernel", "ops", "form", "ms", "share", "MFLOP", "GFLOP/s", "% peak", "MB moved", "GB/s"):
        table.add_column(col, justify="left" if col in ("ops", "form") else "right")

    def fmt(ms, share, flops, moved, g, frac):
        return [f"{ms:.3f}", f"{100 * share:.1f}%", "-" if flops is None else f"{flops / 1e6:.1f}",
                "-" if g is None else f"{g:.1f}", "-" if frac is None else f"{100 * frac:.1f}%",
                f"{moved / 1e6:.2f}", f"{moved / 1e9 / (ms / 1e3):.1f}" if ms > 0 else "-"]

    for r in sorted(rows, key=lambda r: (-r.seconds, r.index)):
        ops = r.ops if len(r.ops) <= 48 else r.ops[:45] + "..."
        form = r.form if len(r.form) <= 32 else r.form[:29] + "..."
        table.add_row(f"k{r.id}", ops, form, *fmt(1e3 * r.seconds, r.share, r.flops, r.bytes, r.gflops,
                                                   r.peak_fraction(gflops, threads)))
    total = sum(r.seconds for r in rows)
    known = [r.flops for r in rows if r.flops is not None]
    flops = sum(known) if len(known) == len(rows) else None
    g = flops / total / 1e9 if flops is not None and total > 0 else None
    table.add_section()
    table.add_row("total", f"{len(rows)} kernels", "", *fmt(1e3 * total, 1.0 if total else 0.0, flops,
                                                        sum(r.bytes for r in rows), g,
                                                        g / (gflops * threads) if g is not None and gflops else None))
    _out.print(table)
    if peak:
        _out.print(f"peak: {peak.gflops:.1f} GFLOP/s float32 FMA per core (measured: {peak.accumulators} x "
                   f"{peak.vector_bytes}-byte vectors, {peak.cpu}); {threads} thread{'s' * (threads != 1)}: "
                   f"% peak = GFLOP/s / ({peak.gflops:.1f} x {threads})", markup=False)
    if any("winograd" in r.form for r in rows):
        _out.print("conv_winograd: FLOPs of the direct convolution it replaces (fewer multiply-adds run: its % peak "
                   "may pass 100)", markup=False)
    from dlcc.schedule.layouts import describe_layouts

    if describe_layouts(layouts):
        _out.print(f"layouts: {describe_layouts(layouts)}", markup=False)


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    from dlcc.check import compare, load_npy_inputs, run_ort

    target = Path(args.target)
    files = load_npy_inputs(_input_files(args.input))
    bench = args.bench or 0
    latency = None
    if target.is_dir():
        from dlcc.build.bundle import read_manifest

        manifest = read_manifest(target)
        specs = {i["name"]: (i["dtype"], i["shape"]) for i in manifest["inputs"]}
        model_path = args.model or manifest.get("source")
        feeds = _feeds(specs, files, args.seed)
        if args.profile:  # the bundle's profiled runs (best of --bench, default PROFILE_RUNS)
            kernels = _bundle_kernels(target, manifest)
            threads = manifest.get("figures", {}).get("threads", 1)
            machine = manifest.get("target") or "native"
            layouts = manifest.get("figures", {}).get("layouts")
        with _progress(f"running {target}"):
            outs, latency, seconds = _run_bundle(target, feeds, (bench or PROFILE_RUNS) if args.profile else bench,
                                                 profile=args.profile, threads=args.threads)
    else:
        with _progress(f"compiling {target}") as update:
            cm = dlcc.compile(str(target), input_shapes=_input_shapes(args.input_shape), fusion=args.fusion,
                              target=_machine_target(args), threads=args.threads,
                              on_stage=update)
        specs = {n: (d, s) for n, d, s in cm.inputs}
        feeds = _feeds(specs, files, args.seed)
        outs = cm(feeds)
        if bench:
            times = []
            for _ in range(bench):
                t = time.perf_counter()
                cm(feeds)
                times.append(time.perf_counter() - t)
            latency = 1e3 * sum(times) / len(times)
        model_path = str(target)
    table = Table(title="outputs")
    for col in ("output", "dtype", "shape", "min", "max", "mean"):
        table.add_column(col, justify="left" if col in ("output", "dtype") else "right")
    for name, a in outs.items():
        fa = a.astype(np.float64) if a.size else np.zeros(1)
        table.add_row(name, str(a.dtype), "x".join(map(str, a.shape)) or "scalar", f"{fa.min():.4g}",
                      f"{fa.max():.4g}", f"{fa.mean():.4g}")
    _out.print(table)
    if args.profile:
        if not target.is_dir():
            with _progress("profiling"):
                seconds = cm.profile(feeds, runs=bench or PROFILE_RUNS)
            kernels, threads, layouts = cm.info["per_kernel"], cm.info.get("threads", 1), cm.info.get("layouts")
            machine = cm.info.get("target") or "native"
        _print_profile(kernels, seconds, bench or PROFILE_RUNS, threads, layouts, machine)
    if args.save:
        out_dir = Path(args.save)
        if not out_dir.is_dir():
            raise DlccError(f"--save folder '{out_dir}' does not exist", hint="create it first")
        from dlcc.frontend.save import atomic_output

        for i, (name, a) in enumerate(outs.items()):
            with atomic_output(out_dir / f"output{i}.npy", "wb") as f:
                np.save(f, a)
            _err.print(f"dlcc: output {i} ({name}) -> {out_dir / f'output{i}.npy'}", markup=False)
    if latency is not None and bench:
        _err.print(f"dlcc: dlcc latency {latency:.3f} ms (mean of {bench})", markup=False)
    status = 0
    if args.compare_ort:
        if not model_path or not Path(model_path).exists():
            raise DlccError("--compare-ort needs the ONNX model", hint="pass --model MODEL.onnx")
        ref = run_ort(model_path, feeds)
        diffs = compare(ref, outs, rtol=args.rtol, atol=args.atol)
        for d in diffs:
            verdict = "ok" if d.ok else f"MISMATCH {d.reason}"
            _err.print(f"dlcc: {d.name}: max abs err {d.max_abs:.3g} (scale {d.scale:.3g}) {verdict}", markup=False)
        if bench:
            from dlcc.check import _session

            sess = _session(model_path, threads=1)
            times = []
            for _ in range(bench):
                t = time.perf_counter()
                sess.run(None, feeds)
                times.append(time.perf_counter() - t)
            _err.print(f"dlcc: onnxruntime latency {1e3 * sum(times) / len(times):.3f} ms (1 thread, mean of "
                       f"{bench})", markup=False)
        status = 0 if all(d.ok for d in diffs) else 1
    return status


def _feeds(specs: dict, files: dict, seed: int) -> dict:
    import numpy as np

    unknown = [k for k in files if k not in specs]
    if unknown:
        raise DlccError(f"unknown input(s) {', '.join(unknown)}", hint=f"the model's inputs are: {', '.join(specs)}")
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (dtype, shape) in specs.items():
        if name in files:
            feeds[name] = files[name]
        elif np.dtype(dtype).kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif np.dtype(dtype).kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feeds


def _print_stats(report) -> None:
    table = Table(title=f"passes (level {report.level}, {report.rounds} round(s))")
    for col in ("pass", "runs", "changed", "time ms", "nodes before", "nodes after", "rules fired"):
        table.add_column(col, justify="left" if col in ("pass", "rules fired") else "right")
    for rec in report.records.values():
        fired = ", ".join(f"{k}={v}" for k, v in rec.fired.most_common()) or "-"
        table.add_row(rec.name, str(rec.runs), str(rec.changed), f"{rec.seconds * 1e3:.1f}",
                      str(rec.nodes_before), str(rec.nodes_after), fired)
    _out.print(table)
    _out.print(f"nodes: {report.nodes_before} -> {report.nodes_after}; passes took {report.seconds * 1e3:.1f} ms")


def cmd_check(args: argparse.Namespace) -> int:
    from dlcc.check import check_models, load_npy_inputs

    shapes = _input_shapes(args.input_shape)
    feeds = load_npy_inputs(_input_files(args.input))
    with _progress("checking") as update:
        update(f"loading {args.reference}")
        dlcc.load(args.reference)  # validates: safe external data, checker, known domains
        update(f"loading {args.candidate}")
        dlcc.load(args.candidate)
        update("running both models in onnxruntime")
        diffs = check_models(args.reference, args.candidate, feeds=feeds, seed=args.seed, shapes=shapes,
                             rtol=args.rtol, atol=args.atol)
    table = Table(title=f"{args.candidate} vs {args.reference} (rtol {args.rtol:g}, atol {args.atol:g})")
    for col in ("output", "shape", "max abs err", "max rel err", "scale", "result"):
        table.add_column(col, justify="left" if col in ("output", "result") else "right")
    for d in diffs:
        result = "[green]ok[/]" if d.ok else f"[red]MISMATCH[/] {d.reason}".rstrip()
        table.add_row(d.name, "x".join(map(str, d.shape)) or "scalar", f"{d.max_abs:.3g}",
                      f"{d.max_rel:.3g}", f"{d.scale:.3g}", result)
    _out.print(table)
    bad = [d.name for d in diffs if not d.ok]
    if bad:
        _err.print(f"dlcc: check failed: {len(bad)} of {len(diffs)} output(s) differ beyond tolerance: "
                   f"{', '.join(bad)}")
        return 1
    _err.print(f"dlcc: check passed: {len(diffs)} output(s) match")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from dlcc.frontend.shapes import infer_shapes, set_input_shapes
    from dlcc.inspect import render, summarize, summary_dict

    with _progress(f"inspecting {args.model}"):
        model = dlcc.load(args.model, keep_initializer_inputs=args.keep_initializer_inputs)
        set_input_shapes(model, _input_shapes(args.input_shape))
        infer_shapes(model)
        summary = summarize(model)
    plan = None
    if args.fusion:
        from dlcc.api import optimize
        from dlcc.compiler import choose_fusion

        with _progress("planning fusion"):
            optimize(model, level=args.level, emit=lambda s: None)  # fusion plans the optimized graph
            plan, _ = choose_fusion(model, args.fusion, estimate_if_unlowerable=True)  # compile's choice
    if args.json:
        data = summary_dict(summary)
        if plan is not None:
            data["fusion"] = _plan_dict(plan)
        _out.out(json.dumps(data, indent=2))
    else:
        _print_notes(model)
        render(summary, _out)
        if plan is not None:
            _print_plan(plan)
    return 0


def _report_compiled(args: argparse.Namespace) -> int:
    """``dlcc report --compiled``: compile as ``dlcc run`` does, profile, and add the kernel and arena charts."""
    from dlcc.compiler import compile_model
    from dlcc.report import write_report
    from dlcc.report.charts import compiled_figures

    runs = args.bench or PROFILE_RUNS
    if runs < 1:
        raise DlccError(f"--bench must be at least 1, got {runs}")
    with _progress(f"reporting {args.model}") as update:
        model = dlcc.load(args.model, keep_initializer_inputs=args.keep_initializer_inputs)
        _print_notes(model)
        cm = compile_model(model, input_shapes=_input_shapes(args.input_shape), fusion=args.fusion, level=args.level,
                           on_stage=update)
        update(f"profiling ({runs} runs)")
        seconds = cm.profile(_feeds({n: (d, s) for n, d, s in cm.inputs}, {}, 0), runs=runs)
        update("measuring the FMA peak")
        try:
            peak = _target_peak(cm.info.get("target") or "native").gflops
        except DlccError as e:
            peak = None
            _err.print(f"dlcc: note: no % of peak: {e}", markup=False)
        update("drawing")
        art = cm.artifacts
        write_report(art.model, art.plan, args.output, title=Path(args.model).name,
                     compiled=compiled_figures(cm, seconds, runs, peak))
    _err.print(f"dlcc: wrote {args.output}: {art.model.graph.num_nodes()} nodes in {len(art.program.kernels)} "
               f"kernels, {1e3 * float(sum(seconds)):.3f} ms; {art.plan.reason}", markup=False)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from dlcc.api import optimize
    from dlcc.compiler import choose_fusion
    from dlcc.report import write_report

    if args.compiled:
        return _report_compiled(args)
    with _progress(f"reporting {args.model}") as update:
        model = dlcc.load(args.model, keep_initializer_inputs=args.keep_initializer_inputs)
        _print_notes(model)
        optimize(model, level=args.level, input_shapes=_input_shapes(args.input_shape), emit=lambda s: None,
                 on_pass=update)
        update("planning fusion")
        plan, _ = choose_fusion(model, args.fusion, estimate_if_unlowerable=True)  # the plan compile takes
        update("drawing")
        write_report(model, plan, args.output, title=Path(args.model).name)
    _err.print(f"dlcc: wrote {args.output}: {model.graph.num_nodes()} nodes in {plan.num_kernels} kernels; "
               f"{plan.reason}", markup=False)
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    from dlcc.passes.catalogue import all_rules, markdown

    rows = all_rules()
    if args.family:
        rows = [r for r in rows if r.family == args.family]
    if args.markdown:
        _out.out(markdown(rows), end="")
        return 0
    table = Table(title=f"{len(rows)} rules")
    for col in ("pass", "rule", "family", "exact", "opset", "what it does"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.pass_name, r.name, r.family, "yes" if r.exact else "no", str(r.min_opset), r.doc)
    _out.print(table, markup=False)
    return 0


def _plan_dict(plan) -> dict:
    from dlcc.fusion.dnnfusion import bytes_moved, bytes_moved_unfused

    return {
        "planner": plan.planner, "reason": plan.reason, "kernels": plan.num_kernels,
        "nodes": sum(len(g) for g in plan.groups), "fusion_rate": round(plan.fusion_rate, 3),
        "bytes_moved_before": bytes_moved_unfused(plan.graph), "bytes_moved_after": bytes_moved(plan),
        "groups": [{"id": g.id, "kind": g.kind.name, "anchor": g.anchor.op_type, "ops": g.ops} for g in plan.groups],
    }


def _print_plan(plan) -> None:
    from dlcc.fusion.dnnfusion import bytes_moved, bytes_moved_unfused

    table = Table(title=f"fusion groups ({plan.planner})")
    for col in ("group", "kind", "anchor", "nodes", "ops"):
        table.add_column(col, justify="right" if col in ("group", "nodes") else "left")
    for g in plan.groups:
        ops = " + ".join(g.ops) if len(g.ops) <= 8 else " + ".join(g.ops[:7]) + f" + ... ({len(g.ops)})"
        table.add_row(str(g.id), g.kind.name.lower(), g.anchor.op_type, str(len(g)), ops)
    _out.print(table)
    nodes = sum(len(g) for g in plan.groups)
    _out.print(f"{nodes} nodes -> {plan.num_kernels} kernels (fusion rate {plan.fusion_rate:.2f}); bytes moved "
               f"{bytes_moved_unfused(plan.graph) / 1e6:.1f} MB -> {bytes_moved(plan) / 1e6:.1f} MB; {plan.reason}",
               markup=False)


# ---------------------------------------------------------------------------------------------- parsing


def build_parser() -> argparse.ArgumentParser:
    from dlcc.check import DEFAULT_ATOL, DEFAULT_RTOL
    from dlcc.passes.pipeline import DEFAULT_LEVEL, MAX_LEVEL, pass_names
    from dlcc.passes.targets import TARGETS

    parser = argparse.ArgumentParser(
        prog="dlcc", description="dlcc: a deep-learning compiler for ONNX models.",
        epilog="Run 'dlcc COMMAND --help' for the options of a command.")
    parser.add_argument("--version", action="version", version=f"dlcc {dlcc.__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the Python traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def shape_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...",
                       help="fix the shape of an input with symbolic dims (repeatable)")

    def fusion_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--fusion", default="auto", choices=("auto", "tvm", "dnnfusion"),
                       help="fusion planner (default auto: the one whose plan moves fewer bytes)")

    def machine_target_opt(p: argparse.ArgumentParser) -> None:
        from dlcc.schedule.target import NAMES

        p.add_argument("--target", dest="machine_target", default=None, choices=NAMES,
                       help="the machine the C is generated for (default native: this one)")
        p.add_argument("--threads", type=int, default=None, metavar="N",
                       help="threads the compiled model runs on (default: the target's cores, this machine's "
                            "for native; 1 = no thread pool, no pthreads)")
        p.add_argument("--no-winograd", dest="winograd", action="store_false",
                       help="keep every 3x3 convolution direct (Winograd's transformed weights are 4x larger)")

    def legacy_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--keep-initializer-inputs", action="store_true",
                       help="legacy models (IR < 4): keep initializers listed as graph inputs as inputs "
                            "instead of treating them as constants")

    p = sub.add_parser("optimize", parents=[common], help="optimize a model and write it as ONNX",
                       description="Optimize IN and write the result to OUT (atomically).")
    p.add_argument("input", metavar="IN", help="the model to optimize (.onnx, or a .pt2 saved by torch.export.save)")
    p.add_argument("output", metavar="OUT", help="where to write the optimized model")
    p.add_argument("--level", type=int, default=DEFAULT_LEVEL, choices=range(MAX_LEVEL + 1),
                   help=f"optimization level 0..{MAX_LEVEL} (0 = load and save only; default {DEFAULT_LEVEL})")
    shape_opt(p)
    legacy_opt(p)
    p.add_argument("--target", default="onnx", choices=sorted(TARGETS),
                   help="what the output must run on: replacements apply only where the target lacks an op "
                        "or prefers another form (level 3; default onnx = portable standard ONNX)")
    p.add_argument("--allow-lossy", action="store_true",
                   help="also remove QuantizeLinear->DequantizeLinear pairs (changes values)")
    p.add_argument("--stats", action="store_true", help="print per-pass timings and rules fired")
    p.add_argument("--print-after", action="append", metavar="PASS",
                   help=f"print the IR after the named pass (one of: {', '.join(pass_names())})")
    p.add_argument("--print-after-all", action="store_true", help="print the IR after every pass")
    p.add_argument("--dump-dir", metavar="DIR", help="write the IR after every pass into DIR")
    p.add_argument("--verify", action="store_true", help="verify the IR after every pass (slower)")
    p.add_argument("--emit-groups", action="store_true",
                   help="write each fusion group as an ONNX local function (domain dlcc.fused): Netron shows the "
                        "partition, onnxruntime still runs the model")
    fusion_opt(p)
    p.set_defaults(func=cmd_optimize)

    p = sub.add_parser("check", parents=[common], help="compare two models in onnxruntime",
                       description="Run REFERENCE and CANDIDATE on the same inputs and compare outputs: "
                                   "max|got-ref| <= rtol*max|ref| + atol per output. Exit 1 on mismatch.")
    p.add_argument("reference", metavar="A", help="the reference model")
    p.add_argument("candidate", metavar="B", help="the model to check against A")
    p.add_argument("--input", action="append", metavar="NAME=file.npy", help="input data (repeatable); "
                   "inputs not given get seeded random data")
    shape_opt(p)
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL:g})")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default {DEFAULT_ATOL:g})")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("report", parents=[common], help="draw the fusion groups as a static HTML page",
                       description="Optimize MODEL (--level), plan fusion and write an HTML page (inline SVG, no "
                                   "network) with the graph and every fusion group outlined.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-o", "--output", required=True, metavar="OUT.html", help="where to write the page")
    p.add_argument("--level", type=int, default=DEFAULT_LEVEL, choices=range(MAX_LEVEL + 1),
                   help=f"optimization level before fusion planning (default {DEFAULT_LEVEL})")
    shape_opt(p)
    legacy_opt(p)
    fusion_opt(p)
    p.add_argument("--compiled", action="store_true",
                   help="also compile MODEL (as `dlcc run` does), time every kernel on seeded random inputs and "
                        "add charts of the time per kernel and of the arena's occupancy over the schedule")
    p.add_argument("--bench", type=int, metavar="N", help=f"with --compiled: profiled runs (default {PROFILE_RUNS})")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("rules", parents=[common], help="list every rewrite rule",
                       description="List every rewrite rule: pass, family, whether it is exact in "
                                   "floating point, minimum opset, what it does.")
    p.add_argument("--family", help="only this family (e.g. associative, distributive, commutative)")
    p.add_argument("--markdown", action="store_true", help="print docs/RULES.md")
    p.set_defaults(func=cmd_rules)

    p = sub.add_parser("compile", parents=[common], help="compile a model to a standalone C bundle",
                       description="Compile MODEL to OUTDIR: model.c/model.h (one C function per fused kernel, "
                                   "a dlcc_run entry point), weights.bin, main.c and a Makefile; `make -C OUTDIR` "
                                   "needs only a C compiler.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR", help="the bundle folder to write")
    shape_opt(p)
    fusion_opt(p)
    machine_target_opt(p)
    p.add_argument("--portable", action="store_true", help="the same as --target generic")
    p.add_argument("--dump-kernel-ir", metavar="FILE", help="write the kernel IR (buffers with their arena offsets, "
                   "kernels and their steps, the loop IR of the kernels built in it) to FILE")
    from dlcc.compiler import BACKEND  # (the backend's stage names: the literal list of its stages)

    stages = [n for n, _ in BACKEND]
    p.add_argument("--print-after", action="append", metavar="STAGE", choices=stages,
                   help=f"print the IR after the named backend stage (one of: {', '.join(stages)})")
    p.add_argument("--dump-dir", metavar="DIR", help="write the IR after every backend stage into DIR")
    p.add_argument("--build", action="store_true", help="also run make (a cross compiler for another "
                   "architecture's target) and report the binary size")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", parents=[common], help="run a compiled bundle or compile and run a model",
                       description="Run OUTDIR (a bundle from `dlcc compile`, built with make on first use) or "
                                   "MODEL (compiled in memory, cached). Inputs not given get seeded random data.")
    p.add_argument("target", metavar="OUTDIR|MODEL")
    p.add_argument("--input", action="append", metavar="NAME=file.npy", help="input data (repeatable)")
    shape_opt(p)
    fusion_opt(p)
    machine_target_opt(p)
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    p.add_argument("--compare-ort", action="store_true", help="compare the outputs with onnxruntime (exit 1 if "
                   "they differ beyond tolerance)")
    p.add_argument("--model", metavar="MODEL.onnx", help="the ONNX model of a bundle, for --compare-ort "
                   "(default: the model the bundle was compiled from)")
    p.add_argument("--bench", type=int, metavar="N", help="time N runs (and N onnxruntime runs with --compare-ort)")
    p.add_argument("--save", metavar="DIR", help="write the outputs as DIR/output<i>.npy")
    p.add_argument("--profile", action="store_true", help="time every kernel (best of --bench N runs, default "
                   f"{PROFILE_RUNS}) and print ms, share, GFLOP/s, %% of the measured FMA peak and bytes moved")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL:g})")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default {DEFAULT_ATOL:g})")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("inspect", parents=[common], help="summarize a model",
                       description="Opset, inputs/outputs, op histogram, parameters and a FLOPs estimate.")
    p.add_argument("model", metavar="MODEL")
    shape_opt(p)
    legacy_opt(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--fusion", nargs="?", const="auto", choices=("auto", "tvm", "dnnfusion"),
                   help="also optimize (--level) and print the fusion groups; auto (default) picks the planner "
                        "that moves fewer bytes")
    p.add_argument("--level", type=int, default=DEFAULT_LEVEL, choices=range(MAX_LEVEL + 1),
                   help="optimization level before fusion planning (with --fusion)")
    p.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        return int(args.func(args))
    except DlccError as e:
        if debug:
            raise
        _err.print(f"dlcc: error: {e}", markup=False)
        return e.exit_code
    except KeyboardInterrupt:
        _err.print("dlcc: interrupted")
        return 130
    except Exception as e:  # a bug in dlcc: one line, and the way to see more
        if debug:
            raise
        msg = " ".join(str(e).split())
        _err.print(f"dlcc: internal error: {type(e).__name__}: {msg} (a dlcc bug; rerun with --debug "
                   "for the traceback and please report it)", markup=False)
        return 3


if __name__ == "__main__":
    sys.exit(main())
