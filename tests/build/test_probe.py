"""The FMA peak probe: a positive, plausible figure, measured once and then read from the build cache."""

from __future__ import annotations

import json

import pytest

from dlcc.build import probe
from dlcc.errors import DlccError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("DLCC_CACHE_DIR", str(path))
    return path


def test_peak_is_plausible_and_cached(cache, monkeypatch) -> None:
    peak = probe.fma_peak()
    # one core, float32: from an old SSE core without FMA (a few GFLOP/s) to wide AVX-512 (hundreds)
    assert 0.5 < peak.gflops < 20_000
    assert peak.vector_bytes in (16, 32, 64) and peak.accumulators in (12, 16)
    assert peak.cache_file is not None and peak.cache_file.parent == cache / "probe"
    entry = json.loads(peak.cache_file.read_text())
    assert entry["gflops"] == peak.gflops and entry["cpu"] == probe.cpu_model()

    def no_measure(*args, **kwargs):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(probe, "_measure", no_measure)
    assert probe.fma_peak_gflops() == peak.gflops  # from the cache


def test_key_depends_on_flags_and_cpu() -> None:
    base = probe._key("cc 12", ["-O3", "-march=native"], "cpu A")
    assert base != probe._key("cc 12", ["-O3"], "cpu A")
    assert base != probe._key("cc 12", ["-O3", "-march=native"], "cpu B")
    assert base != probe._key("cc 13", ["-O3", "-march=native"], "cpu A")


def test_unreadable_entry_is_measured_again(cache, monkeypatch) -> None:
    calls = []

    def fake(cc, flags, workdir):
        calls.append(flags)
        return 123.0, 32, 12

    monkeypatch.setattr(probe, "_measure", fake)
    first = probe.fma_peak()
    assert first.gflops == 123.0 and len(calls) == 1
    first.cache_file.write_text("{not json")
    assert probe.fma_peak().gflops == 123.0 and len(calls) == 2
    assert probe.fma_peak(refresh=True).gflops == 123.0 and len(calls) == 3
    assert probe.fma_peak().gflops == 123.0 and len(calls) == 3


def test_broken_probe_is_a_dlcc_error(cache, monkeypatch) -> None:
    monkeypatch.setattr(probe, "PROBE_C", "int main(void) { return 3; }\n")
    with pytest.raises(DlccError, match="probe failed"):
        probe.fma_peak()
