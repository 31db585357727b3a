"""Shared fixtures: small models written in ONNX text, and a runner for the CLI in-process."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx.parser
import pytest

from dlcc.cli import main

SMALL = """
<ir_version: 8, opset_import: ["" : 17]>
small (float[N,4] x) => (float[N,3] y) {
    h = MatMul(x, w)
    hb = Add(h, b)
    y = Relu(hb)
}
"""


def small_model() -> onnx.ModelProto:
    import numpy as np

    m = onnx.parser.parse_model(SMALL)
    rng = np.random.default_rng(0)
    m.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.standard_normal((4, 3)).astype("float32"), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal((3,)).astype("float32"), "b"),
    ])
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.fixture(scope="session", autouse=True)
def _private_build_cache(tmp_path_factory: pytest.TempPathFactory):
    """Compiled libraries go to a cache private to the test session, never the user's ~/.cache/dlcc."""
    import os

    if "DLCC_CACHE_DIR" not in os.environ:
        path = tmp_path_factory.mktemp("dlcc-cache")
        path.chmod(0o700)
        os.environ["DLCC_CACHE_DIR"] = str(path)
    yield


@pytest.fixture
def small_path(tmp_path: Path) -> Path:
    p = tmp_path / "small.onnx"
    onnx.save(small_model(), p)
    return p


@pytest.fixture
def cli(capsys):
    """Run ``dlcc ARGS`` in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(autouse=True)
def _check_rule_promises(monkeypatch):
    """Every test that runs the rewrite driver also checks each rule's ``input_ops`` promise: the driver
    evaluates every pattern and fails on a match the promise would have skipped."""
    import dlcc.passes.rewrite

    monkeypatch.setattr(dlcc.passes.rewrite, "CHECK_PROMISES", True)
