"""The optimization pipeline: one literal list of (minimum level, pass), run in order to a fixpoint.

Levels: 0 = load and save only; 1 = folding, elimination, CSE; 2 = + linear-op fusion, patterns and
hoisting; 3 = + target-driven replacement. A pass runs at every level from its minimum up.
Each entry says why it is where it is.
"""

from __future__ import annotations

from dlcc.passes.eliminate import DeadCodeElimination
from dlcc.passes.manager import Pass

MAX_LEVEL = 3
DEFAULT_LEVEL = 3  # the highest level whose output is portable ONNX for the `onnx` target

PIPELINE: list[tuple[int, type[Pass]]] = [
    # last, so that whatever earlier passes orphaned is gone before the next round starts
    (1, DeadCodeElimination),
]


def passes_for(level: int) -> list[Pass]:
    return [cls() for min_level, cls in PIPELINE if level >= min_level]


def pass_names() -> list[str]:
    return [cls.name for _, cls in PIPELINE]
