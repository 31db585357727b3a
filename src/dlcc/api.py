"""The Python API behind ``dlcc.optimize`` (and, later, ``dlcc.compile``).

What goes in: a model (path, bytes, ModelProto or onnx_ir model) and options.
What comes out: the optimized onnx_ir model (the same object when one was passed), with the pipeline's
report in ``model.meta["dlcc.report"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx_ir as ir

from dlcc.errors import DlccError
from dlcc.frontend.load import load
from dlcc.frontend.shapes import infer_shapes, refresh_shapes, set_input_shapes
from dlcc.frontend.sizes import check_tensor_sizes
from dlcc.passes.manager import ManagerOptions, PassManager, PipelineReport
from dlcc.passes.pipeline import DEFAULT_LEVEL, MAX_LEVEL, PipelineOptions, passes_for


def optimize(
    model,
    *,
    level: int = DEFAULT_LEVEL,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    verify: bool = False,
    print_after: Sequence[str] = (),
    print_after_all: bool = False,
    dump_dir: str | Path | None = None,
    emit: Callable[[str], None] = print,
    on_pass: Callable[[str], None] | None = None,
    keep_initializer_inputs: bool = False,
    target: str = "onnx",
    allow_lossy: bool = False,
) -> ir.Model:
    if not isinstance(level, int) or not 0 <= level <= MAX_LEVEL:
        raise DlccError(f"optimization level must be 0..{MAX_LEVEL}, not {level!r}")
    if not isinstance(model, ir.Model):
        model = load(model, keep_initializer_inputs=keep_initializer_inputs)
    if input_shapes:
        set_input_shapes(model, input_shapes)
        infer_shapes(model)
    else:
        refresh_shapes(model)  # infers unless every value already has a static shape (small models: load did)
    check_tensor_sizes(model)  # a tensor larger than memory is refused before any pass could materialize it
    from dlcc.passes.targets import get_target

    get_target(target)  # an unknown target is the user's error, before any work
    manager = PassManager(
        passes_for(level, PipelineOptions(target=target, allow_lossy=allow_lossy)),
        ManagerOptions(verify=verify, print_after=print_after, print_after_all=print_after_all,
                       dump_dir=dump_dir, emit=emit, on_pass=on_pass,
                       after_round=_refresh_and_check),
        level=level,
    )
    # every round that changed the model was followed by _refresh_and_check, and the last round changed
    # nothing: the values' shapes are current
    report: PipelineReport = manager.run(model)
    model.meta["dlcc.report"] = report
    return model


def _refresh_and_check(model: ir.Model) -> bool:
    """After each round: shapes for new values, and folding may have made a huge shape static."""
    changed = refresh_shapes(model)
    check_tensor_sizes(model)
    return changed
