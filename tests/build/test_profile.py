"""The profiled entry point and the per-kernel figures: one time per kernel, the same outputs as
``dlcc_run``, FLOPs and bytes from the cost model, the bundle's ``-p`` output parsed, arena occupancy."""

from __future__ import annotations

import time

import numpy as np
import pytest

import dlcc
from dlcc.build.profile import arena_occupancy, kernel_figures, parse_bundle_profile, profile_rows
from dlcc.check import random_inputs
from dlcc.compiler import program_traffic
from dlcc.errors import DlccError
from dlcc.ops.cost import node_flops
from dlcc.testing import KIT_MODELS, randomize


@pytest.fixture(scope="module")
def residual():
    model = randomize(KIT_MODELS["residual"](), seed=0)
    return dlcc.compile(model), random_inputs(model, seed=1)


def test_profiled_entry_times_every_kernel(residual) -> None:
    cm, feeds = residual
    program = cm.artifacts.program
    assert "void dlcc_run_profiled(" in cm.artifacts.csource.source
    assert "int dlcc_num_kernels(void);" in cm.artifacts.csource.header
    assert cm.num_kernels == len(program.kernels) == cm.info["kernels"] == len(cm.info["per_kernel"])
    t = time.perf_counter()
    outs, seconds = cm.run_profiled(feeds)
    wall = time.perf_counter() - t
    assert seconds.shape == (len(program.kernels),)
    assert (seconds >= 0).all() and seconds.sum() > 0
    assert seconds.sum() <= wall  # the kernel intervals lie inside the call
    plain = cm(feeds)
    for name in plain:
        np.testing.assert_array_equal(outs[name], plain[name])
    best = cm.profile(feeds, runs=3)
    assert best.shape == seconds.shape and (best >= 0).all()
    with pytest.raises(DlccError, match="at least 1"):
        cm.profile(feeds, runs=0)


def test_kernel_figures_follow_the_cost_model(residual) -> None:
    cm, _ = residual
    program = cm.artifacts.program
    figures = kernel_figures(program)
    assert figures == cm.info["per_kernel"]
    assert [f["id"] for f in figures] == [k.id for k in program.kernels]
    for f, k in zip(figures, program.kernels, strict=True):
        assert f["ops"] == "+".join(k.ops)
        assert f["flops"] == sum(node_flops(n) for n in k.nodes)
    assert any(f["ops"].startswith("Conv") and f["flops"] > 0 for f in figures)
    assert sum(f["bytes"] for f in figures) == program_traffic(program)


def test_profile_rows_and_peak_fraction() -> None:
    kernels = [{"id": 0, "ops": "Conv+Relu", "flops": 2_000_000, "bytes": 100},
               {"id": 1, "ops": "Reshape", "flops": None, "bytes": 50}]
    rows = profile_rows(kernels, [0.003, 0.001])
    assert [r.share for r in rows] == pytest.approx([0.75, 0.25])
    assert rows[0].gflops == pytest.approx(2e6 / 0.003 / 1e9)
    assert rows[0].peak_fraction(10.0, threads=2) == pytest.approx(rows[0].gflops / 20.0)
    assert rows[1].gflops is None and rows[1].peak_fraction(10.0) is None
    assert profile_rows([{"id": 0, "ops": "Add", "flops": 1, "bytes": 1}], [0.0])[0].gflops is None
    with pytest.raises(DlccError, match="2 kernel times for 1 kernels"):
        profile_rows(kernels[:1], [0.1, 0.2])


def test_parse_bundle_profile() -> None:
    text = ("latency: mean 1.0 ms, best 0.9 ms over 3 profiled runs (first run 2.0 ms)\n"
            "profile 2 3\nkernel 0 0.250000 0.300000\nkernel 1 0.750000 0.800000\nwrote x\n")
    seconds, runs = parse_bundle_profile(text)
    assert seconds == pytest.approx([0.00025, 0.00075]) and runs == 3
    with pytest.raises(DlccError, match="no profile"):
        parse_bundle_profile("latency: mean 1.0 ms\n")
    with pytest.raises(DlccError, match="1 of its 2 kernels"):
        parse_bundle_profile("profile 2 1\nkernel 0 0.1 0.1\n")


def test_arena_occupancy_meets_the_bounds() -> None:
    model = randomize(KIT_MODELS["conv_bn_relu"](), seed=0)
    from dlcc.compiler import build_artifacts

    art = build_artifacts(model)
    live, top = arena_occupancy(art.program, art.memory)
    assert len(live) == len(top) == len(art.program.kernels)
    assert max(live) == art.memory.lower_bound
    assert all(lv <= tp <= art.memory.arena_bytes for lv, tp in zip(live, top, strict=True))
