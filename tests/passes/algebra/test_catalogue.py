"""Every rule is listed once, documented, in a known family; docs/RULES.md matches the code; the final
graph does not depend on the order of the rules (the driver picks by savings, ties by name)."""

from __future__ import annotations

import random
from pathlib import Path

import onnx_ir as ir
import pytest

import dlcc
from dlcc.api import optimize
from dlcc.passes import algebra
from dlcc.passes.catalogue import all_rules, markdown
from dlcc.passes.printer import format_model
from dlcc.testing import KIT_MODELS, randomize

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = {"associative", "distributive", "commutative", "identity", "layout", "reduction", "other"}


def test_rule_names_unique_and_documented() -> None:
    rows = all_rules()
    names = [r.name for r in rows]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(r.doc for r in rows)
    assert all(r.family in FAMILIES for r in rows if r.pass_name == "algebra")


def test_at_least_150_algebra_rules() -> None:
    assert len(algebra.ALL_RULES) >= 150, len(algebra.ALL_RULES)


def test_rules_md_is_generated_from_the_code() -> None:
    committed = (ROOT / "docs" / "RULES.md").read_text()
    assert committed == markdown(all_rules()), "regenerate: dlcc rules --markdown > docs/RULES.md"


def _optimized_text(name: str, seed: int | None) -> str:
    proto = randomize(KIT_MODELS[name](), seed=3)
    saved = list(algebra.ALL_RULES)
    try:
        if seed is not None:
            random.Random(seed).shuffle(algebra.ALL_RULES)
        model = optimize(dlcc.load(proto), level=2, emit=lambda s: None)
    finally:
        algebra.ALL_RULES[:] = saved
    return format_model(ir.serde.deserialize_model(ir.serde.serialize_model(model)))


@pytest.mark.parametrize("name", sorted(KIT_MODELS))
def test_rule_order_does_not_change_the_result(name: str) -> None:
    reference = _optimized_text(name, None)
    for seed in (1, 2, 3):
        assert _optimized_text(name, seed) == reference, f"seed {seed}"
