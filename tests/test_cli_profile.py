"""``dlcc run --profile`` on a model and on a bundle, and ``dlcc report --compiled``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import onnx
import pytest

from dlcc.testing import KIT_MODELS, randomize


@pytest.fixture(scope="module")
def residual_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "residual.onnx"
    onnx.save(randomize(KIT_MODELS["residual"](), seed=0), path)
    return path


def _kernel_rows(out: str) -> list[str]:
    return re.findall(r"^\W*(k\d+)\W", out, re.M)


def test_run_model_profile(cli, residual_path: Path) -> None:
    code, out, err = cli("run", residual_path, "--profile", "--bench", "2")
    assert code == 0, err
    assert "best of 2 profiled runs" in out
    kernels = _kernel_rows(out)
    assert len(kernels) == 2 and sorted(kernels) == ["k0", "k1"]
    assert re.search(r"total\W+2 kernels", out)
    assert "Conv+Add+Relu" in out and "% peak" in out
    threads = os.cpu_count()  # compiled for the machine's cores by default
    assert re.search(rf"peak: [0-9.]+ GFLOP/s float32 FMA per core .*{threads} threads?", out)
    assert re.search(r"form\W", out)  # each kernel's loop-IR functions (conv_direct, gemm_wconst, ...)


def test_profile_peak_is_the_targets(cli, residual_path: Path) -> None:
    """Code generated for a narrower target than the machine (x86-64-v3's AVX2 on an AVX-512 machine) is measured
    against the FMA peak of that target's vectors (32 bytes), not the machine's widest."""
    from dlcc.schedule.target import get_target

    if not get_target("x86-64-v3").runs_here():
        pytest.skip("x86-64-v3 code does not run on this machine")
    code, out, err = cli("run", residual_path, "--profile", "--bench", "1", "--target", "x86-64-v3", "--threads", "1")
    assert code == 0, err
    assert re.search(r"peak: [0-9.]+ GFLOP/s float32 FMA per core \(measured: \d+ x 32-byte vectors", out)


def test_run_bundle_profile(cli, residual_path: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    code, _, err = cli("compile", residual_path, "-o", bundle)
    assert code == 0, err
    figures = json.loads((bundle / "model.json").read_text())["figures"]
    assert [k["ops"] for k in figures["per_kernel"]] == ["Conv+Relu", "Conv+Add+Relu"]
    assert all(k["form"] for k in figures["per_kernel"])  # (how each kernel runs, shown by --profile)
    code, out, err = cli("run", bundle, "--profile")
    assert code == 0, err
    assert sorted(_kernel_rows(out)) == ["k0", "k1"] and "best of 10 profiled runs" in out
    assert "latency" not in err  # no --bench: no latency line
    code, out, err = cli("run", bundle, "--profile", "--bench", "3")
    assert code == 0 and "best of 3 profiled runs" in out and "mean of 3" in err


def test_bundle_without_figures_is_refused(cli, residual_path: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "old"
    assert cli("compile", residual_path, "-o", bundle)[0] == 0
    manifest = json.loads((bundle / "model.json").read_text())
    del manifest["figures"]["per_kernel"]
    (bundle / "model.json").write_text(json.dumps(manifest))
    code, _, err = cli("run", bundle, "--profile")
    assert code == 2 and "no per-kernel figures" in err and "Traceback" not in err


def test_report_compiled_has_the_charts(cli, residual_path: Path, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    code, _, err = cli("report", residual_path, "-o", page, "--compiled", "--bench", "2")
    assert code == 0, err
    text = page.read_text()
    assert text.count('<svg xmlns="http://www.w3.org/2000/svg" class="kernel-chart"') == 1
    assert len(re.findall(r'<rect class="kbar"', text)) == 2
    assert 'class="arena-chart"' in text and "lower bound" in text and "Time per kernel" in text
    plain = tmp_path / "plain.html"
    assert cli("report", residual_path, "-o", plain)[0] == 0
    assert "kbar" not in plain.read_text()


def test_profile_says_what_the_layout_assignment_did(cli, tmp_path: Path) -> None:
    """A graph kept in NHWC around a convolution: ``--profile`` (model and bundle) and ``dlcc report --compiled``
    say how many buffers are channels-last and how many Transposes went; a model without any says nothing."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "lower"))
    from test_layouts import _nhwc_graph

    path = tmp_path / "nhwc.onnx"
    onnx.save(_nhwc_graph("direct", True, None)[0], path)
    code, out, err = cli("run", path, "--profile", "--bench", "2")
    assert code == 0, err
    assert re.search(r"layouts: 2 buffers stored channels-last, 2 NCHW <-> NHWC Transposes removed, 0 left; "
                     r"1 kernel repacks its input into channel blocks on every call", out)
    bundle = tmp_path / "b"
    assert cli("compile", path, "-o", bundle)[0] == 0
    figures = json.loads((bundle / "model.json").read_text())["figures"]
    assert figures["layouts"] == {"channels_last_buffers": 2, "transposes_removed": 2, "transposes_left": 0,
                                  "repacking_kernels": 1}
    code, out, err = cli("run", bundle, "--profile")
    assert code == 0 and "2 NCHW <-> NHWC Transposes removed" in out
    code, _, err = cli("report", path, "-o", tmp_path / "r.html", "--compiled")
    assert code == 0, err
    assert "Layout assignment: 2 buffers stored channels-last" in (tmp_path / "r.html").read_text()
    pool = tmp_path / "pool.onnx"
    onnx.save(_nhwc_graph("direct", True, "pool", h=36)[0], pool)  # (a plane wider than 32: the pool reads NCHW)
    code, out, err = cli("run", pool, "--profile", "--bench", "2")
    assert code == 0 and re.search(r"1 NCHW <-> NHWC Transpose removed, 1 left", out)


def test_no_layout_line_without_layout_changes(cli, tmp_path: Path) -> None:
    from dlcc.testing.models import mlp

    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(batch=4, in_features=64, hidden=(64,), out_features=16), path)
    code, out, err = cli("run", path, "--profile", "--bench", "2")
    assert code == 0 and "layouts:" not in out
