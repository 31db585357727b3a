"""Fuzz ``dlcc optimize`` with mutated models and report what went wrong.

    python bench/fuzz.py [--seed S] [--n N] [--timeout T] [--jobs J] [--out DIR] [--kind K] [--graphs G]

Every mutant (``dlcc.testing.fuzz.mutant(seed, i)``) runs in its own process (``--isolation fork``, the
default: a fork of a worker that has dlcc imported, so a crash or hang of one case is a result; or
``subprocess``: a fresh ``python -m dlcc.cli``, about 20x slower); the table counts the
outcomes per mutation kind; each bad case (internal error, traceback, crash, hang) is listed with its kind,
seed index and first stderr line, and its bytes are written to ``DIR/<seed>-<index>-<kind>.onnx`` so
``dlcc optimize DIR/... out.onnx --debug`` reproduces it.

``--graphs G`` then runs G random well-formed graphs (``dlcc.testing.graphs.random_graph(seed + i)``) through
``dlcc.testing.differential.check_graph`` (dlcc.optimize at levels 0-3 and dlcc.compile against onnxruntime)
in J worker processes and prints the counts: graphs, agree, mismatch, near_miss (within 100x the tolerance),
ill_conditioned (dlcc's answer is no further from the model run in float64 than 10x onnxruntime's own
float32 answer is: float32 cannot decide the output; not a failure, listed), dlcc errors, crashes (and clean
"unsupported" errors); each failing or ill-conditioned graph is written to ``DIR/graph-<seed>.onnx`` with its
problems in ``DIR/graph-<seed>.txt``. ``--n 0`` skips the mutants.
"""

from __future__ import annotations

import argparse
import collections
import functools
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from dlcc.testing.fuzz import KINDS, OUTCOMES, run_indexed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=2, help="subprocesses at a time (default 2)")
    p.add_argument("--out", default="build/fuzz-failures", help="folder for failing inputs")
    p.add_argument("--kind", choices=sorted(KINDS), help="only this mutation kind")
    p.add_argument("--isolation", choices=("fork", "subprocess"), default="fork" if hasattr(os, "fork") else
                   "subprocess", help="how each mutant is isolated (default fork where the OS has it)")
    p.add_argument("--graphs", type=int, default=0, help="random graphs for differential testing (default 0)")
    args = p.parse_args(argv)
    status = run_mutants(args) if args.n else 0
    if args.graphs:
        status = max(status, run_graphs(args))
    return status


def run_graphs(args) -> int:
    from dlcc.testing.differential import run
    from dlcc.testing.graphs import random_graph

    out = Path(args.out)
    failures = []
    t0 = time.perf_counter()
    done = 0

    def on_result(seed: int, outcome: str, lines: list[str]) -> None:
        nonlocal done
        done += 1
        if outcome not in ("agree", "unsupported"):
            failures.append((seed, outcome, lines))
            out.mkdir(parents=True, exist_ok=True)
            (out / f"graph-{seed}.onnx").write_bytes(random_graph(seed).SerializeToString())
            (out / f"graph-{seed}.txt").write_text("\n".join(lines) + "\n")
        if done % 100 == 0:
            print(f"  graphs {done}/{args.graphs} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    counts = run(range(args.seed, args.seed + args.graphs), jobs=args.jobs, on_result=on_result)
    dt = time.perf_counter() - t0
    print(f"dlcc differential fuzz: seeds {args.seed}..{args.seed + args.graphs - 1}, {counts['graphs']} graphs in "
          f"{dt:.0f} s ({dt / max(counts['graphs'], 1):.2f} s per graph, {args.jobs} jobs)")
    cols = ("graphs", "agree", "mismatch", "near_miss", "ill_conditioned", "dlcc_error", "crash", "unsupported")
    print("".join(f"{c:>16}" for c in cols))
    print("".join(f"{counts[c]:>16}" for c in cols))
    for seed, outcome, lines in failures:
        tag = "ILL-CONDITIONED (not a failure)" if outcome == "ill_conditioned" else f"FAIL {outcome}"
        print(f"{tag}: graph seed {seed}: {lines[0] if lines else ''}")
    failures = [f for f in failures if f[1] != "ill_conditioned"]
    if failures:
        print(f"{len(failures)} failing graph(s) written to {out}/")
    return 1 if failures else 0


def run_mutants(args) -> int:

    out = Path(args.out)
    counts: collections.Counter = collections.Counter()
    per_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    t0 = time.perf_counter()

    # worker processes (single-threaded, so forking them is safe), each running its share of the mutants
    one = functools.partial(run_indexed, args.seed, timeout=args.timeout, kind=args.kind, isolation=args.isolation)
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for done, (i, kind, base, data, outcome) in enumerate(pool.map(one, range(args.n), chunksize=8), 1):
            counts[outcome.kind] += 1
            per_kind[kind][outcome.kind] += 1
            if outcome.bad:
                failures.append((i, kind, base, outcome))
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{args.seed}-{i}-{kind}.onnx").write_bytes(data)
            if done % 100 == 0:
                print(f"  {done}/{args.n} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    cols = list(OUTCOMES)
    print(f"dlcc fuzz: seed {args.seed}, {args.n} mutants in {time.perf_counter() - t0:.0f} s")
    print(f"{'kind':22}" + "".join(f"{c:>15}" for c in cols))
    for kind in sorted(per_kind):
        print(f"{kind:22}" + "".join(f"{per_kind[kind][c]:>15}" for c in cols))
    print(f"{'total':22}" + "".join(f"{counts[c]:>15}" for c in cols))
    for i, kind, base, outcome in failures:
        print(f"FAIL {outcome.kind}: seed {args.seed} index {i} kind {kind} base {base}: {outcome.first_line}")
    if failures:
        print(f"{len(failures)} failing input(s) written to {out}/")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
