"""External data safety: a model's external tensors may only be read from inside the model's folder.

What goes in: the tensors of a loaded proto (``ProtoWalk``) and the folder the model was read from.
What comes out: nothing, or an ``ExternalDataError`` saying what is wrong; ``checkable`` gives the copy
of a proto that onnx's checker may see without resolving external files itself.

Invariants: an absolute location, a ``..`` component or a symlink that resolves outside the folder is
refused, and so are offsets/lengths that do not fit the file or the tensor's size.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir

from dlcc.errors import ExternalDataError
from dlcc.frontend.walk import ProtoWalk, attr_tensors

__all__ = ["SMALL_IN_MEMORY_BYTES", "check_external_data", "check_external_tensor", "checkable", "in_memory",
           "small_into_memory"]


def check_external_data(walk: ProtoWalk, folder: Path | None) -> None:
    for t in walk.tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            check_external_tensor(t, folder)


def check_external_tensor(t: onnx.TensorProto, folder: Path | None) -> Path:
    """Validate one external tensor's location/offset/length; returns the resolved data file."""
    info = {e.key: e.value for e in t.external_data}
    name = t.name or "<unnamed>"
    loc = info.get("location", "")
    if not loc:
        raise ExternalDataError(f"tensor '{name}' is marked external but has no location")
    if folder is None:
        raise ExternalDataError(
            f"tensor '{name}' keeps its data in external file '{loc}', but the model was given as bytes "
            "with no folder to read it from", hint="load the model from its path, or pass base_dir")
    parts = loc.replace("\\", "/").split("/")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")) or (len(loc) > 1 and loc[1] == ":"):
        raise ExternalDataError(
            f"tensor '{name}' points to external data at absolute path '{loc}'; dlcc only reads external "
            "data inside the model's folder", hint="move the data next to the model and use a relative path")
    if ".." in parts:
        raise ExternalDataError(
            f"tensor '{name}' points to external data '{loc}' outside the model's folder ('..')",
            hint="move the data next to the model and use a relative path")
    root = folder.resolve()
    target = (folder / loc)
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise ExternalDataError(
            f"external data '{loc}' of tensor '{name}' resolves (through a symlink) to '{resolved}', outside "
            "the model's folder", hint="copy the data into the model's folder")
    if not resolved.is_file():
        raise ExternalDataError(f"external data file '{loc}' of tensor '{name}' is missing",
                                hint=f"put it in '{folder}' next to the model")
    size = resolved.stat().st_size
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError:
        raise ExternalDataError(f"tensor '{name}' has a non-integer external data offset or length") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise ExternalDataError(
            f"external data of tensor '{name}' (offset {offset}, length {length}) does not fit in "
            f"'{loc}' ({size} bytes)", hint="the data file is truncated or does not belong to this model")
    expected = _tensor_nbytes(t)
    if expected is not None and expected != length:
        raise ExternalDataError(
            f"tensor '{name}' needs {expected} bytes but its external data holds {length}",
            hint="the data file does not belong to this model")
    return resolved


def _tensor_nbytes(t: onnx.TensorProto) -> int | None:
    try:
        dtype = ir.DataType(t.data_type)
        itemsize = dtype.itemsize
    except (ValueError, TypeError, AttributeError):
        return None
    if dtype in (ir.DataType.STRING, ir.DataType.UNDEFINED):
        return None
    count = 1
    for d in t.dims:
        if d < 0:
            raise ExternalDataError(f"tensor '{t.name}' has a negative dimension {d}")
        count *= d
    # sub-byte types (int4, float4...) report fractional item sizes; round up
    return int(-(-count * itemsize // 1))




def checkable(proto: onnx.ModelProto, external: bool | None = None) -> onnx.ModelProto:
    """A copy the checker can see without its external data (already validated by us).

    onnx's checker resolves external files against the process's working folder; we validated them
    against the model's folder, so external initializers become typed graph inputs in the copy.
    ``external``: whether the proto has external tensors (None: look).
    """
    if external is None:
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in ProtoWalk(proto).tensors)
    if not external:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for g in ProtoWalk(copy).graphs:
        inputs = {i.name for i in g.input}
        keep = []
        for t in g.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                keep.append(t)
                continue
            if t.name not in inputs:
                g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        del g.initializer[:]
        g.initializer.extend(keep)
        for node in g.node:
            for t in attr_tensors(node):
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    zeros = onnx.numpy_helper.from_array(
                        np.zeros(tuple(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type)), t.name)
                    t.CopyFrom(zeros)
    return copy


# external initializers up to this size are read into memory at load: shape inference needs the values of
# small constants (split sizes, shapes, axes), and onnx's cannot read them from a data file
SMALL_IN_MEMORY_BYTES = 64 * 1024


def in_memory(t: ir.TensorProtocol) -> ir.TensorProtocol:
    """``t`` itself, or for an external tensor a copy of its data in memory (the mapping is not released:
    arrays already handed out stay valid)."""
    if not isinstance(t, ir.ExternalTensor):
        return t
    return ir.Tensor(t.numpy().copy(), dtype=t.dtype, name=t.name, doc_string=t.doc_string)


def small_into_memory(model: ir.Model, limit: int = SMALL_IN_MEMORY_BYTES) -> None:
    """Every external initializer of at most ``limit`` bytes read into memory."""
    for g in model.graphs():
        for v in g.initializers.values():
            t = v.const_value
            if isinstance(t, ir.ExternalTensor) and t.nbytes <= limit:
                v.const_value = in_memory(t)
