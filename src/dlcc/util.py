"""Small neutral helpers shared by several stages (below every stage, like ``errors`` and ``ops``).

What goes in / comes out: plain values (shapes, text, graphs); nothing here knows a stage.
- ``contiguous_strides(shape)``: row-major element strides (a zero dimension counts as one).
- ``sanitize_comment(text)``: model text made safe to print inside a C block comment.
- ``all_graphs(graph)``: a graph and all its subgraphs, outermost first.
- ``value_shape(v)`` / ``value_dtype(v)``: a value's static shape and numpy dtype name (DlccError if unknown).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from dlcc.errors import DlccError

__all__ = ["all_graphs", "contiguous_strides", "sanitize_comment", "value_dtype", "value_shape"]


def value_shape(v: ir.Value) -> tuple[int, ...]:
    if v.shape is None or not all(isinstance(d, int) for d in v.shape):
        raise DlccError(f"value '{v.name}' has no static shape", hint="pass --input-shape for symbolic inputs")
    return tuple(int(d) for d in v.shape)


def value_dtype(v: ir.Value) -> str:
    if v.dtype is None:
        raise DlccError(f"value '{v.name}' has no known element type")
    return np.dtype(v.dtype.numpy()).name


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


def sanitize_comment(text: str, limit: int = 80) -> str:
    """Model text made safe for a C block comment: printable ASCII only, no ``*/``, no backslash, one line."""
    text = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in str(text))
    text = text.replace("*/", "*?").replace("/*", "/?").replace("\\", "?")
    return text[:limit]


def all_graphs(graph: ir.Graph) -> list[ir.Graph]:
    """``graph`` and every subgraph under it (If/Loop/Scan bodies), outermost first. Cheaper than
    ``Graph.subgraphs()`` on the common graph that has none."""
    out = [graph]
    for g in out:
        for node in g:
            if not node.attributes:
                continue
            for a in node.attributes.values():
                if a.type == ir.AttributeType.GRAPH:
                    out.append(a.value)
                elif a.type == ir.AttributeType.GRAPHS:
                    out.extend(a.value)
    return out
