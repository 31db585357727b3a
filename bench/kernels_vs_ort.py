"""Per kernel: dlcc's time against onnxruntime's for the same ONNX nodes, to find where a model loses.

What goes in: a bench model name (bench/compiled.py's: light, kit or sized) or an .onnx path, the thread count
and the number of runs. What comes out: for each dlcc kernel, its best time over the runs (``run_profiled``),
the best time onnxruntime's profiler gives the nodes it ran for the same ONNX nodes, and the difference; sorted
by the difference, dlcc's losses first, with the totals of both and what could not be matched.

Matching: onnxruntime names a node it creates after the value it writes (``<value>_nchwc``, its fused
Conv+activation), else keeps the ONNX node's name; a dlcc kernel holds ONNX nodes (and their output values).
An onnxruntime node counts for the first dlcc kernel that holds a node or a value of that name. Where dlcc's
optimizer folded that node away (a BatchNormalization into its Conv: onnxruntime calls the fused Conv
``<bn output>_nchwc``), it counts for the kernel holding the nearest node up its data input in the ONNX graph
(``upstream``). What still matches nothing stays in a row of its own. Both sides run interleaved in one
process, best of N each (kernel by kernel for dlcc, node by node for onnxruntime): sums of per-kernel minima, not
a latency (bench/compiled.py measures that).

Run: ``.venv/bin/python bench/kernels_vs_ort.py mobilenet_v2 --threads 1 --runs 30``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import dlcc  # noqa: E402
from dlcc.check import random_inputs  # noqa: E402


def _load(name: str) -> onnx.ModelProto:
    if name.endswith(".onnx"):
        return onnx.load(name)
    import compiled  # (bench/compiled.py: the models it builds)

    return compiled._model(name)


def ort_node_times(profile: str) -> dict[str, float]:
    """Best seconds per onnxruntime node over the runs in its profile (JSON trace events)."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for e in json.loads(Path(profile).read_text()):
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            times[e["name"][: -len("_kernel_time")]].append(e["dur"] * 1e-6)
    return {k: min(v) for k, v in times.items()}


def upstream(model: onnx.ModelProto, depth: int = 3) -> dict[str, list[str]]:
    """Per name of an ONNX node or of a value it writes: that name (a node's: then the values it writes and the
    node reading each, where one does), then its data input's value and producer, and theirs, up to ``depth``
    nodes up. A node dlcc's optimizer rebuilt under another name still writes its value, or is fused with its
    reader. A node dlcc's optimizer folded away (a BatchNormalization into its Conv) is held by no kernel, but
    its producer is: onnxruntime names its fused Conv after the BatchNormalization's output (``<bn
    output>_nchwc``), which this leads back to the Conv."""
    producer = {v: n for n in model.graph.node for v in n.output if v}
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for n in model.graph.node:
        for v in n.input:
            readers[v].append(n.name)
    chains: dict[str, list[str]] = {}
    for n in model.graph.node:
        chain, node = [], n
        for _ in range(depth):
            chain.append(node.name)
            data = node.input[0] if node.input else ""
            if not data:
                break
            chain.append(data)
            if data not in producer:
                break
            node = producer[data]
        outs = [v for v in n.output if v]
        # (its result next: a node dlcc rebuilt writes it still; then the one node reading it, which an onnxruntime
        # fusion named after this node may hold too: ConvNeXt's MatMul + Add as "<MatMul>/MatMulAddFusion")
        after = [r for v in outs if len(readers[v]) == 1 for r in readers[v]]
        chains[n.name] = [n.name, *outs, *after, *chain[1:]]
        for v in outs:
            chains[v] = [v, *chain]
    return chains


def match(kernels: list[set[str]], ort_names: list[str],
          chains: dict[str, list[str]] | None = None) -> tuple[dict[int, list[str]], list[str]]:
    """onnxruntime node names per dlcc kernel index (``kernels``: the node and value names each holds), and the
    names no kernel holds. Each onnxruntime name counts for the first kernel holding its name, the name without
    ``_nchwc`` (or before a ``/``: onnxruntime's "<node>/<fusion>"), or failing both the next name up its
    ``chains`` (``upstream``) that some kernel holds."""
    where: dict[int, list[str]] = collections.defaultdict(list)
    missing = []
    chains = chains or {}
    first: dict[str, int] = {}  # name -> the first kernel holding it
    for i, names in enumerate(kernels):
        for name in names:
            first.setdefault(name, i)
    for on in ort_names:
        base = on.removesuffix("_nchwc").split("/", 1)[0]  # (a fusion's node: "<ONNX node>/MatMulAddFusion")
        hit = next((first[key] for key in (on, base, *chains.get(base, ())) if key in first), None)
        if hit is None:
            missing.append(on)
        else:
            where[hit].append(on)
    return where, missing


def compare(model: onnx.ModelProto, threads: int, runs: int) -> list[dict]:
    feeds = random_inputs(model, seed=1)
    cm = dlcc.compile(model, threads=threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        cm(feeds)
        best = None
        for _ in range(runs):
            sess.run(None, feeds)
            _, secs = cm.run_profiled(feeds)
            best = secs if best is None else np.minimum(best, secs)
        node_t = ort_node_times(sess.end_profiling())
    kernels = cm.artifacts.program.kernels
    names = [{n.name for s in k.steps for n in s.nodes} | {v.name for s in k.steps for n in s.nodes
                                                            for v in n.outputs if v is not None}
             for k in kernels]
    where, missing = match(names, list(node_t), upstream(model))
    rows = [{"kernel": k.id, "ops": "+".join(k.ops) if not isinstance(k.ops, str) else k.ops,
             "first_node": next((n.name for s in k.steps for n in s.nodes), ""), "dlcc_s": float(t),
             "ort_s": sum(node_t[o] for o in where.get(i, [])), "ort_nodes": where.get(i, [])}
            for i, (k, t) in enumerate(zip(kernels, best, strict=True))]
    rows.append({"kernel": None, "ops": "(onnxruntime nodes no kernel holds)", "first_node": ", ".join(missing[:4]),
                 "dlcc_s": 0.0, "ort_s": sum(node_t[o] for o in missing), "ort_nodes": missing})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="a bench/compiled.py model name or an .onnx path")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--top", type=int, default=20, help="rows to print (the largest losses and gains)")
    args = parser.parse_args(argv)
    rows = compare(_load(args.model), args.threads, args.runs)
    d, o = sum(r["dlcc_s"] for r in rows), sum(r["ort_s"] for r in rows)
    print(f"{args.model}, {args.threads} thread(s), best of {args.runs} per kernel / node: dlcc {d * 1e3:.3f} ms, "
          f"onnxruntime {o * 1e3:.3f} ms (sums of per-kernel minima)")
    rows.sort(key=lambda r: r["ort_s"] - r["dlcc_s"])
    print(f"{'kernel':>6}  {'ops':34s} {'dlcc ms':>8} {'ort ms':>8} {'dlcc-ort':>9}  first node")
    shown = rows[: args.top // 2] + (rows[-(args.top - args.top // 2):] if len(rows) > args.top else [])
    for i, r in enumerate(shown):
        if i == args.top // 2 and len(rows) > args.top:
            print("   ...")
        kid = f"k{r['kernel']}" if r["kernel"] is not None else "-"
        print(f"{kid:>6}  {r['ops'][:34]:34s} {r['dlcc_s'] * 1e3:8.3f} {r['ort_s'] * 1e3:8.3f} "
              f"{(r['dlcc_s'] - r['ort_s']) * 1e3:+9.3f}  {r['first_node'][:40]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
