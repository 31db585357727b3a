"""A model above 2 GB (external data) optimizes without holding two copies of its weights in memory.

The model is a chain of 9 MatMul + Relu layers with [8192, 8192] float32 weights (256 MiB each, 2.25 GiB
in all), written by the test straight into one external data file (never held whole in memory here).
`dlcc optimize` runs in a child process whose peak RSS is measured (getrusage of a wrapper whose only
child it is); it must stay below 1.5x the weights' size. The output must keep its weights in external
data, byte for byte (SHA-256 per initializer, read in chunks).

Needs ~7 GiB of free disk (input and output) and ~5 GiB of available memory; skipped otherwise. Marked
``slow`` and ``large``: ``make fuzz`` runs it, ``-m "not large"`` deselects it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytestmark = [pytest.mark.slow, pytest.mark.large]

N = 8192
LAYERS = 9
LAYER_BYTES = N * N * 4
WEIGHT_BYTES = LAYERS * LAYER_BYTES  # 2.25 GiB
RSS_BOUND = 1.5  # peak RSS of `dlcc optimize`, as a multiple of the weights' size
CHUNK = 64 << 20

# a wrapper whose only child is the command: RUSAGE_CHILDREN's ru_maxrss is then that command's peak (KiB)
_MEASURE = ("import resource, subprocess, sys\n"
            "rc = subprocess.call(sys.argv[1:])\n"
            "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)\n")


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _write_model(folder: Path) -> dict[str, str]:
    """model.onnx + model.data in ``folder``; returns initializer name -> SHA-256 of its bytes."""
    rng = np.random.default_rng(0)
    base = (rng.standard_normal((N, N), dtype=np.float32) / np.float32(np.sqrt(N))).astype(np.float32)
    digests, inits, nodes = {}, [], []
    x = "x"
    with open(folder / "model.data", "wb") as f:
        for i in range(LAYERS):
            w = np.roll(base, i, axis=0)  # distinct weights from one random draw (CSE must not merge them)
            name = f"w{i}"
            offset = f.tell()
            w.tofile(f)
            digests[name] = hashlib.sha256(memoryview(w).cast("B")).hexdigest()
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[N, N],
                            data_location=TensorProto.EXTERNAL)
            for k, v in (("location", "model.data"), ("offset", str(offset)), ("length", str(LAYER_BYTES))):
                t.external_data.add(key=k, value=v)
            inits.append(t)
            h, y = f"h{i}", ("y" if i == LAYERS - 1 else f"r{i}")
            nodes += [helper.make_node("MatMul", [x, name], [h]), helper.make_node("Relu", [h], [y])]
            x = y
            del w
    graph = helper.make_graph(nodes, "large_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save_model(model, folder / "model.onnx")  # the data is already external: a small file
    return digests


def _external_digests(path: Path) -> dict[str, str]:
    """Initializer name -> SHA-256 of its external bytes (read in chunks); every initializer must be
    external."""
    model = onnx.load(path, load_external_data=False)
    out = {}
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            out[t.name] = "inline"
            continue
        info = {e.key: e.value for e in t.external_data}
        h = hashlib.sha256()
        with open(path.parent / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            left = int(info["length"])
            while left:
                chunk = f.read(min(CHUNK, left))
                assert chunk, f"external data of '{t.name}' is truncated"
                h.update(chunk)
                left -= len(chunk)
        out[t.name] = h.hexdigest()
    return out


def test_large_model_optimizes_without_two_copies(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    if free < 3 * WEIGHT_BYTES:
        pytest.skip(f"needs {3 * WEIGHT_BYTES / 2**30:.1f} GiB of free disk, {free / 2**30:.1f} GiB free")
    avail = _available_memory()
    if avail is not None and avail < 2 * WEIGHT_BYTES:
        pytest.skip(f"needs {2 * WEIGHT_BYTES / 2**30:.1f} GiB of available memory, {avail / 2**30:.1f} GiB")
    try:
        digests = _write_model(tmp_path)
        out = tmp_path / "out" / "model.opt.onnx"
        out.parent.mkdir()
        cmd = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "dlcc.cli", "optimize",
               str(tmp_path / "model.onnx"), str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr
        peak = int(proc.stderr.rsplit("peak_rss_kib", 1)[1].split()[0]) * 1024
        ratio = peak / WEIGHT_BYTES
        figures = {"weights_gib": WEIGHT_BYTES / 2**30, "peak_rss_gib": round(peak / 2**30, 3),
                   "ratio": round(ratio, 3)}
        print("large model:", json.dumps(figures))  # shown with -s; the assertion message carries it too
        assert ratio < RSS_BOUND, f"peak RSS {peak / 2**30:.2f} GiB is {ratio:.2f}x the weights (bound {RSS_BOUND}x)"
        ops = [n.op_type for n in onnx.load(out, load_external_data=False).graph.node]
        assert sorted(ops) == sorted(["MatMul", "Relu"] * LAYERS), ops
        got = _external_digests(out)
        assert sorted(got.values()) == sorted(digests.values()), "the optimized model's weights differ"
        assert (out.parent / (out.name + ".data")).stat().st_size >= WEIGHT_BYTES
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
