"""The optimization pipeline: one literal list of (minimum level, pass factory), run in order to a fixpoint.

Levels: 0 = load and save only; 1 = folding, elimination, CSE; 2 = + linear-op fusion, patterns and
hoisting; 3 = + target-driven replacement. A pass runs at every level from its minimum up. Rules that
reassociate floating point (linear fusion) start at level 2. Each entry says why it is where it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from dlcc.passes.algebra import AlgebraicSimplification
from dlcc.passes.cse import CommonSubexpressionElimination
from dlcc.passes.eliminate import DeadCodeElimination
from dlcc.passes.fold import ConstantFolding, ConstantParams
from dlcc.passes.fuse_linear import LinearFusion
from dlcc.passes.hoist import Hoisting
from dlcc.passes.manager import Pass
from dlcc.passes.patterns import PatternFusion
from dlcc.passes.redundant import InversePairs, NoOpElimination, ReshapeChains
from dlcc.passes.replace import OpReplacement

MAX_LEVEL = 3
DEFAULT_LEVEL = 3  # the highest level whose output is portable ONNX for the `onnx` target


@dataclass(frozen=True)
class PipelineOptions:
    target: str = "onnx"  # see dlcc.passes.targets.TARGETS
    allow_lossy: bool = False  # QuantizeLinear->DequantizeLinear removal changes values
    level: int = DEFAULT_LEVEL  # set by passes_for


PIPELINE: list[tuple[int, Callable[[PipelineOptions], Pass]]] = [
    # constants first: every later rule sees folded initializers and static shape arithmetic
    (1, lambda o: ConstantFolding()),
    # level 2: exact algebra on constant weights (reassociates floating point). Early: its rewrites (a new
    # Conv per BatchNormalization) would otherwise make every pass before it run a second round
    (2, lambda o: LinearFusion()),
    # ops that mean nothing, then chains and inverse pairs that cancel
    (1, lambda o: NoOpElimination()),
    (1, lambda o: ReshapeChains()),
    (1, lambda o: InversePairs(allow_lossy=o.allow_lossy)),
    # after elimination, identical subexpressions are easier to see
    (1, lambda o: CommonSubexpressionElimination()),
    # algebra: the rule that saves most wins; rules that reassociate floating point only from level 2
    (1, lambda o: AlgebraicSimplification(exact_only=o.level < 2)),
    # level 2: idioms (LayerNormalization, GELU...) once algebra has put them in canonical form
    (2, lambda o: PatternFusion()),
    # move Slice/Gather up and Transpose/Reshape down so inverse pairs meet in the next round
    (2, lambda o: Hoisting()),
    # level 3: what the target lacks or prefers (the `onnx` target keeps standard ONNX)
    (3, lambda o: OpReplacement(o.target)),
    # constant axes/pads/... inputs into the attribute form where the model's opset defines one
    (1, lambda o: ConstantParams()),
    # last, so that whatever earlier passes orphaned is gone before the next round starts
    (1, lambda o: DeadCodeElimination()),
]


def passes_for(level: int, options: PipelineOptions | None = None) -> list[Pass]:
    options = dataclasses.replace(options or PipelineOptions(), level=level)
    return [factory(options) for min_level, factory in PIPELINE if level >= min_level]


def pass_names() -> list[str]:
    return [p.name for p in passes_for(MAX_LEVEL)]
