"""The ONNX backend node-test suite against dlcc.compile: every case whose ops and dtypes dlcc claims
passes, or is excluded with its reason (see dlcc.testing.conformance)."""

from __future__ import annotations

import pytest

from dlcc.testing.conformance import EXCLUDED, cases, claimed, run_case

CASES = {c.name: c for c in cases()}


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if claimed(c.model)[0]))
def test_claimed_case(name: str) -> None:
    result = run_case(CASES[name])
    assert result.status in ("passed", "excluded"), f"{result.status}: {result.detail}"
    if result.status == "excluded":
        assert result.detail, "an excluded case must give its reason"


def test_claimed_cases_are_most_of_the_suite_for_our_ops() -> None:
    names = [n for n, c in CASES.items() if claimed(c.model)[0]]
    assert len(names) >= 600  # a regression that stops claiming ops would hide failures as "unsupported"
    assert set(EXCLUDED) <= set(CASES)
