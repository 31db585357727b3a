"""Algebraic simplification: rule families (associative, distributive, commutative, identity,
transpose/layout, reduction, other) run by the rewrite driver, which picks, among the rules that apply at
a node, the one that saves the most work (FLOPs + bytes, from shapes).

Rules that are exact in floating point run from level 1; rules that reassociate (``exact=False``) run
from level 2 (see ``pipeline.py``). ``ALL_RULES`` lists every rule; ``dlcc rules`` prints them.
"""

from __future__ import annotations

import importlib

from dlcc.passes.rewrite import Rule, RulePass

FAMILIES = ("associative", "distributive", "commutative", "identity", "layout", "reduction", "other")


def _family_rules() -> list[Rule]:
    rules: list[Rule] = []
    for fam in FAMILIES:
        try:
            module = importlib.import_module(f"dlcc.passes.algebra.{fam}")
        except ModuleNotFoundError as e:
            if e.name != f"dlcc.passes.algebra.{fam}":
                raise
            continue
        rules.extend(module.RULES)
    return rules


ALL_RULES: list[Rule] = _family_rules()


class AlgebraicSimplification(RulePass):
    """The algebra rule families; ``exact_only`` keeps the rules that do not reassociate (level 1)."""

    name = "algebra"
    doc = "algebraic simplification: associative, distributive, commutative, identity, layout, reduction rules"
    choose_best = True

    def __init__(self, *, exact_only: bool = False) -> None:
        super().__init__()
        self.exact_only = exact_only
        self.rules = [r for r in ALL_RULES if r.exact or not exact_only]
