"""Determinism: the same model and options give byte-identical outputs across runs and hash seeds.

`dlcc optimize` (the ONNX file) and `dlcc compile` (every file of the bundle: model.c, kernels_<i>.c,
model.h, main.c, weights.bin, Makefile, model.json) run in fresh interpreters with PYTHONHASHSEED 0, 1
and 12345, so set iteration order, hash-based names or id()-based orderings would show up as differing
bytes. model.json holds no timings for this reason (the bundle leaves them out).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import onnx
import pytest

from dlcc.testing import KIT_MODELS, light_model

SEEDS = ("0", "1", "12345")
MODELS = ("transformer_encoder", "residual_proj", "depthwise_separable", "squeezenet")
BUNDLE_FILES = ("model.c", "model.h", "main.c", "weights.bin", "Makefile", "model.json")  # at least these


def _model(name: str) -> onnx.ModelProto:
    return light_model(name) if name == "squeezenet" else KIT_MODELS[name]()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, bytes]]]:
    """seed -> model -> output file -> bytes; every command of one seed runs in its own interpreter."""
    root = tmp_path_factory.mktemp("determinism")
    for name in MODELS:
        onnx.save(_model(name), root / f"{name}.onnx")
    procs = []
    for seed in SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = root / f"seed{seed}"
        out.mkdir()
        # one shell per seed runs its commands one after another; the seeds run side by side
        script = " && ".join(
            f"{_q(sys.executable)} -m dlcc.cli optimize {_q(root / f'{n}.onnx')} {_q(out / f'{n}.opt.onnx')}"
            f" && {_q(sys.executable)} -m dlcc.cli compile {_q(root / f'{n}.onnx')} -o {_q(out / n)}"
            for n in MODELS)
        procs.append((seed, subprocess.Popen(["sh", "-c", script], env=env, cwd=root, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)))
    result: dict[str, dict[str, dict[str, bytes]]] = {}
    for seed, proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"PYTHONHASHSEED={seed}: {stderr}"
        out = root / f"seed{seed}"
        result[seed] = {
            n: {"opt.onnx": (out / f"{n}.opt.onnx").read_bytes(),  # every file of the bundle (kernels_<i>.c too)
                **{f.name: f.read_bytes() for f in sorted((out / n).iterdir())}}
            for n in MODELS
        }
    return result


def _q(p) -> str:
    return shlex.quote(str(p))


def test_same_bytes_across_hash_seeds(outputs) -> None:
    # one test, not one per model: under xdist each worker would run the module fixture again
    differ = []
    for name in MODELS:
        first = outputs[SEEDS[0]][name]
        assert set(first) >= {"opt.onnx", *BUNDLE_FILES}, sorted(first)
        for seed in SEEDS[1:]:
            other = outputs[seed][name]
            assert sorted(other) == sorted(first), f"{name}: different files for PYTHONHASHSEED={seed}"
            differ += [f"{name}/{f} (PYTHONHASHSEED={SEEDS[0]} vs {seed})" for f in first if first[f] != other[f]]
    assert not differ, "outputs differ: " + ", ".join(differ)
    manifest = json.loads(outputs[SEEDS[0]]["squeezenet"]["model.json"])
    assert "timings" not in manifest["figures"] and manifest["figures"]["kernels"] > 0
