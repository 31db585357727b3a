"""Legacy forms, normalized at load time.

What goes in: a proto (or its IR) in a form older ONNX versions or some exporters write. What comes out:
the same model in today's form, with a note saying what changed:
- IR < 4 lists every initializer as a graph input too: those inputs become constants (unless the user
  keeps them overridable), and the model is IR 4;
- a declared dim of -1 (some exporters' "dynamic") becomes an unknown dim; any other negative dim is an
  error.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from dlcc.errors import ModelLoadError
from dlcc.frontend.walk import ProtoWalk

__all__ = ["check_ir3_initializers", "negative_dims", "normalize_initializer_inputs", "strip_initializer_inputs"]


def negative_dims(walk: ProtoWalk, *, fix: bool) -> list[str]:
    """Make every -1 dim of a declared type (graph inputs, outputs, value_info) unknown; returns
    ``name[axis]`` for each (``fix=False``: only find them). ONNX dims are non-negative; -1 is some
    exporters' way of saying "dynamic", and taken literally it breaks every shape computation. Any other
    negative dim is refused."""
    found = []
    for g in walk.graphs:
        for vi in (*g.input, *g.output, *g.value_info):
            if not vi.type.HasField("tensor_type"):
                continue
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    if d.dim_value != -1:
                        raise ModelLoadError(
                            f"'{vi.name}' is declared with dim {d.dim_value} at axis {axis}; dims must be >= 0 "
                            "(or -1, which dlcc reads as dynamic)", hint="fix or re-export the model")
                    found.append(f"{vi.name}[{axis}]")
                    if fix:
                        d.ClearField("dim_value")
    return found




def check_ir3_initializers(proto: onnx.ModelProto, walk: ProtoWalk) -> None:
    """IR < 4 requires every initializer to be a graph input too: what onnx's checker refuses in that form
    before ``_strip_initializer_inputs`` turns the model into IR 4 (where that is no longer required)."""
    if proto.ir_version >= 4:
        return
    for g in walk.graphs:
        inputs = {i.name for i in g.input}
        missing = next((t.name for t in g.initializer if t.name not in inputs), None)
        if missing is not None:
            raise ModelLoadError(f"the model is not valid ONNX: {missing} in initializer but not in graph input",
                                 hint="fix or re-export the model")


def strip_initializer_inputs(proto: onnx.ModelProto) -> int:
    """Drop the main graph's inputs that are also initializers (legacy IR < 4 form) from the proto;
    returns how many. Deserializing 280 redundant typed inputs and removing them again costs more than
    the rest of loading a small model."""
    g = proto.graph
    inits = {t.name for t in g.initializer}
    if not inits or not any(i.name in inits for i in g.input):
        return 0
    keep = [i for i in g.input if i.name not in inits]
    n = len(g.input) - len(keep)
    kept = onnx.GraphProto()
    kept.input.extend(keep)
    del g.input[:]
    g.input.extend(kept.input)
    if proto.ir_version < 4:  # IR 3 requires every initializer to be an input; IR 4 is the same model without
        proto.ir_version = 4
    return n


def normalize_initializer_inputs(model: ir.Model, keep: bool, stripped: int = 0) -> str | None:
    """Initializers that are also graph inputs become constants (``keep``: stay inputs); returns the note
    saying what was done, or None."""
    graph = model.graph
    as_inputs = [v for v in graph.inputs if v.name in graph.initializers]
    if not as_inputs and not stripped:
        return None
    if keep:
        return (f"kept {len(as_inputs)} initializer(s) listed as graph inputs as overridable inputs "
                "(--keep-initializer-inputs)")
    if as_inputs:
        gone = set(as_inputs)
        kept = [v for v in graph.inputs if v not in gone]
        graph.inputs.clear()
        graph.inputs.extend(kept)
    count = len(as_inputs) + stripped
    # IR < 4 requires every initializer to be a graph input; once they are constants the model is IR 4.
    if model.ir_version < 4:
        model.ir_version = 4
    return (
        f"treated {count} initializer(s) listed as graph inputs as constants (legacy IR "
        f"{model.meta.get('dlcc.ir_version_in', '<4')} form); use --keep-initializer-inputs to keep them "
        "as inputs")
