"""Tensor-size limits: refuse a model that declares tensors no machine here could hold, before any work.

What goes in: an onnx_ir model after shape inference (and, for the compiler, its weights and arena).
What comes out: nothing, or a ``ShapeError`` naming the first value that is too large, with its shape
and size, and saying what to do.

The limit for one tensor is ``max_tensor_bytes()``: the smaller of ``MAX_TENSOR_BYTES`` (2^34 bytes,
16 GiB) and the machine's physical memory. Sizes are computed with Python integers from static shapes
only (a value with a symbolic or unknown dim is not judged), so a shape whose element count does not fit
in 64 bits is reported as such instead of wrapping around. Nothing is allocated: this is shape
arithmetic, run before constant folding or lowering could try to materialize such a tensor.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import onnx_ir as ir

from dlcc.errors import ShapeError
from dlcc.util import all_graphs

__all__ = ["MAX_TENSOR_BYTES", "check_tensor_sizes", "check_total_bytes", "max_tensor_bytes", "value_bytes"]

MAX_TENSOR_BYTES = 1 << 34  # 16 GiB: far above any weight or activation of a model dlcc targets
_INT64_MAX = (1 << 63) - 1


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX, or the value is not known
        return None


def max_tensor_bytes() -> int:
    """The largest tensor accepted: 2^34 bytes, or the physical memory if that is smaller."""
    phys = physical_memory()
    return min(MAX_TENSOR_BYTES, phys) if phys else MAX_TENSOR_BYTES


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def value_bytes(v: ir.Value) -> tuple[int, int] | None:
    """(elements, bytes) of a value with a static shape and a fixed-size dtype; None otherwise."""
    shape = v.shape
    if shape is None or v.dtype is None:
        return None
    dims = shape.dims  # a tuple: ints for static dims (cheaper than iterating the Shape)
    if not all(type(d) is int for d in dims):
        return None
    count = math.prod(dims)
    try:
        itemsize = v.dtype.itemsize
    except (TypeError, ValueError):  # strings have no fixed size
        return None
    return count, int(math.ceil(count * itemsize))


def _values(graph: ir.Graph) -> Iterator[ir.Value]:
    """Inputs, initializers and node outputs of ``graph`` and its subgraphs (a plain walk: onnx_ir's
    RecursiveGraphIterator costs more than the whole size check)."""
    for g in all_graphs(graph):
        yield from g.inputs
        yield from g.initializers.values()
        for node in g:
            yield from node.outputs


def check_tensor_sizes(model: ir.Model, *, limit: int | None = None) -> None:
    """Refuse the model when one of its values (graph inputs, initializers, node outputs, in subgraphs
    too) has a static shape whose element count overflows 64 bits or whose size is above ``limit``."""
    limit = max_tensor_bytes() if limit is None else limit
    cheap = limit // 16  # no dtype is wider than 16 bytes: fewer elements than this cannot be too large
    for v in _values(model.graph):
        shape = v.shape
        if shape is None:
            continue
        n = math.prod(shape.dims)  # a SymbolicDim (or None) when a dim is symbolic
        if type(n) is int and n < cheap:
            continue
        sized = value_bytes(v)
        if sized is None:
            continue
        count, nbytes = sized
        dims = list(v.shape)
        what = _describe(v)
        if count > _INT64_MAX:
            raise ShapeError(f"{what} '{v.name}' has shape {dims}: its element count ({count:.3g}) does not fit "
                             "in 64 bits", hint=_HINT)
        if nbytes > limit:
            raise ShapeError(f"{what} '{v.name}' has shape {dims} ({v.dtype}): {_fmt_bytes(nbytes)}, above the "
                             f"limit of {_fmt_bytes(limit)} for one tensor", hint=_HINT)


def check_total_bytes(what: str, nbytes: int, *, limit: int | None = None) -> None:
    """Refuse a total (weights, arena) above the physical memory (or 2^34 bytes, if that is smaller)."""
    limit = max_tensor_bytes() if limit is None else limit
    if nbytes > limit:
        raise ShapeError(f"the model needs {_fmt_bytes(nbytes)} of {what}, above the limit of "
                         f"{_fmt_bytes(limit)}", hint=_HINT)


_HINT = "check the model's shapes, or give smaller ones with --input-shape"


def _describe(v: ir.Value) -> str:
    if v.is_graph_input():
        return "input"
    if v.is_initializer():
        return "initializer"
    node = v.producer()
    return f"the output of {node.op_type}" if node is not None else "value"
