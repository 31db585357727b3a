"""Safe loading and atomic saving of ONNX models.

What goes in: a path, the bytes of a model, or an ``onnx.ModelProto``.
What comes out: an ``onnx_ir.Model`` whose external tensors (if any) are memory-mapped lazily from files
inside the model's folder, with ``model.meta["dlcc.notes"]`` listing what loading changed.

Invariants:
- External data never leaves the model's folder: an absolute location, a ``..`` component or a symlink
  that resolves outside the folder is refused, and so are offsets/lengths that do not fit the file.
- A model that is not ONNX, is truncated, fails ``onnx.checker`` or uses an operator domain dlcc does
  not know is refused with a ``DlccError`` that says what to do.
- Legacy models (IR version < 4) list initializers as graph inputs; by default those are turned into
  constants (what users of these models expect), unless ``keep_initializer_inputs`` is set.
- ``save`` writes to a temporary file in the destination folder and renames it into place, so a failed
  run never clobbers an existing output; above 2 GB of tensors it switches to one external data file.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
from google.protobuf.message import DecodeError

from dlcc.errors import DlccError, ExternalDataError, ModelLoadError, OutputError, UnsupportedModelError

# Operator domains dlcc accepts. Anything else is refused at load time: we cannot optimize, check or
# compile ops whose meaning we do not know.
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training",
                           "dlcc", "dlcc.fused"})

# below this size the checker sees the proto itself; above, only its skeleton (no weight copies)
CHECK_PROTO_BYTES = 16 << 20

# protobuf cannot serialize a message of 2 GiB or more; stay clear of the limit.
EXTERNAL_DATA_THRESHOLD = 2_000_000_000

ModelSource = str | os.PathLike | bytes | onnx.ModelProto


def notes(model: ir.Model) -> list[str]:
    """The notes loading attached to the model (what it changed and why)."""
    return model.meta.setdefault("dlcc.notes", [])


def load(
    source: ModelSource,
    *,
    keep_initializer_inputs: bool = False,
    base_dir: str | os.PathLike | None = None,
) -> ir.Model:
    """Load and validate an ONNX model into onnx_ir.

    ``base_dir`` is the folder external data is read from; it defaults to the model file's folder and is
    required when ``source`` is bytes or a ModelProto that references external data.
    """
    proto, folder, size = _read_proto(source, base_dir)
    ir_version_in = proto.ir_version
    _check_structure(proto)
    walk = _Walk(proto)
    _check_text(proto, walk)
    _check_external_data(walk, folder)
    _check_tensor_data(walk)  # also: initializers listed as inputs fit their declared types
    stripped = 0
    if proto is not source and not keep_initializer_inputs:  # ours to edit: strip before the checks below
        _check_ir3_initializers(proto, walk)  # (the checker would, if it saw the IR 3 form)
        stripped = _strip_initializer_inputs(proto)  # (legacy IR 3 form; inputs cost at every step)
    unknown = _negative_dims(walk, fix=False)
    if unknown:
        if isinstance(source, onnx.ModelProto):  # never edit the caller's proto: edit a copy
            proto = onnx.ModelProto()
            proto.CopyFrom(source)
            walk = _Walk(proto)
        _negative_dims(walk, fix=True)
    _check_domains(proto, walk)
    # checker and shape inference: a small proto as it is; a big model as its skeleton (no weight copies)
    small = size < CHECK_PROTO_BYTES
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in walk.tensors)
    if small:
        skeleton = _weightless(proto, walk) if not isinstance(source, onnx.ModelProto) and not external else None
        if skeleton is None:
            _run_checker(proto, external)
            proto = _infer_small(proto, external)
        else:  # checker and inference see the graph without its float weights' bytes (3-4x cheaper)
            _run_checker(skeleton, False)
            _take_shapes(proto, _infer_small(skeleton, False))
    lean_shapes = None
    if proto is not source:  # ours to edit: cheaper before deserialization than after
        if not keep_initializer_inputs and not stripped:  # a copy made for -1 dims
            stripped = _strip_initializer_inputs(proto)
        lean_shapes = _take_value_info(proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # the checker passed: what onnx_ir cannot read is corrupt content
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        first = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), type(cause).__name__)
        raise ModelLoadError(f"the model is corrupted: {first} (in {e})",
                             hint="re-export the model") from None
    if lean_shapes:
        _apply_value_info(model.graph, lean_shapes)
    if not small:
        _run_checker(model)
    if folder is not None and external:
        ir.external_data.set_base_dir(model.graph, str(folder))
    model.meta["dlcc.notes"] = []
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        notes(model).append(f"treated dim -1 as dynamic (unknown) in {shown}")
    model.meta["dlcc.ir_version_in"] = ir_version_in
    model.meta["dlcc.source"] = str(source) if isinstance(source, str | os.PathLike) else "<memory>"
    _normalize_initializer_inputs(model, keep_initializer_inputs, stripped)
    return model


def _negative_dims(walk: _Walk, *, fix: bool) -> list[str]:
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


def _check_text(proto: onnx.ModelProto, walk: _Walk) -> None:
    """Names and doc strings must be text: a corrupted file can hold bytes that are not UTF-8 (protobuf's
    proto2 strings let them through, as bytes), which nothing downstream could read or write back. Checked
    on the proto, before anything (the weightless copy, onnx_ir) reads a name."""
    def bad(x) -> bool:
        return isinstance(x, bytes | bytearray)

    for g in walk.graphs:
        if _all_text(g):
            continue
        what = None
        if bad(g.name) or bad(g.doc_string):
            what = "the graph name"
        elif any(bad(v.name) for v in (*g.input, *g.output, *g.value_info, *g.initializer)):
            what = "a value name"
        else:
            for n in g.node:
                if bad(n.name) or bad(n.op_type) or bad(n.domain) or bad(n.doc_string):
                    what = "a node name"
                elif any(bad(x) for x in (*n.input, *n.output)):
                    what = "a value name"
                if what:
                    break
        if what:
            raise ModelLoadError(f"the model is corrupted: {what} is not valid UTF-8 text",
                                 hint="re-export the model")
    if any(bad(x) for x in (proto.producer_name, proto.producer_version, proto.domain, proto.doc_string)):
        raise ModelLoadError("the model is corrupted: its producer or doc string is not valid UTF-8 text",
                             hint="re-export the model")


def _all_text(g: onnx.GraphProto) -> bool:
    """The fast scan of ``_check_text`` (on the load path of every model): is every name of ``g`` a str?"""
    if type(g.name) is not str or type(g.doc_string) is not str:
        return False
    for values in (g.input, g.output, g.value_info, g.initializer):
        for v in values:
            if type(v.name) is not str:
                return False
    for n in g.node:
        if (type(n.name) is not str or type(n.op_type) is not str or type(n.domain) is not str
                or type(n.doc_string) is not str):
            return False
        for x in n.input:
            if type(x) is not str:
                return False
        for x in n.output:
            if type(x) is not str:
                return False
    return True


# ---------------------------------------------------------------------------------------------- reading


def _read_proto(source: ModelSource, base_dir) -> tuple[onnx.ModelProto, Path | None, int]:
    """The proto, the folder external data is read from, and the serialized size in bytes."""
    if isinstance(source, onnx.ModelProto):
        return source, Path(base_dir) if base_dir is not None else None, source.ByteSize()
    if isinstance(source, bytes | bytearray | memoryview):
        return _parse(bytes(source), "<bytes>"), Path(base_dir) if base_dir is not None else None, len(source)
    if not isinstance(source, str | os.PathLike):
        raise ModelLoadError(f"cannot load a model from a {type(source).__name__}",
                             hint="pass a path, the bytes of an .onnx file or an onnx.ModelProto")
    path = Path(source)
    if not path.exists():
        raise ModelLoadError(f"model file '{path}' does not exist", hint="check the path")
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a folder, not a model file", hint="pass the .onnx file inside it")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelLoadError(f"cannot read model file '{path}': {e.strerror}",
                             hint="check its permissions") from None
    folder = Path(base_dir) if base_dir is not None else path.resolve().parent
    return _parse(data, str(path)), folder, len(data)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"'{where}' is empty", hint="pass an ONNX model file (.onnx)")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(
            f"'{where}' is not a valid ONNX model (protobuf parse failed: {e}); the file may be truncated "
            "or not ONNX at all", hint="re-export or re-download the model") from None
    return proto


def _check_structure(proto: onnx.ModelProto) -> None:
    """Cheap sanity checks that protobuf's lenient parsing lets through (text files, truncation)."""
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise ModelLoadError(
            "the input is not an ONNX model (no graph or no IR version); the file may be truncated or of "
            "another format", hint="pass an ONNX model file (.onnx)")
    if proto.ir_version >= 3 and not proto.opset_import:
        raise ModelLoadError("the model declares no opset_import", hint="re-export the model with an opset")


class _Walk:
    """Every graph (main, subgraphs, function bodies' subgraphs) and every stored tensor of a proto, found
    in one pass over the nodes' attributes (the load checks all need them; each walk costs ~0.5 ms on a
    200-node model)."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        self.graphs: list[onnx.GraphProto] = []
        self.tensors: list[onnx.TensorProto] = []
        G, GS, T, TS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS, onnx.AttributeProto.TENSOR,
                        onnx.AttributeProto.TENSORS)
        stack = [proto.graph]

        def visit(nodes) -> None:
            for node in nodes:
                for a in node.attribute:
                    t = a.type
                    if t == T:
                        self.tensors.append(a.t)
                    elif t == TS:
                        self.tensors.extend(a.tensors)
                    elif t == G:
                        stack.append(a.g)
                    elif t == GS:
                        stack.extend(a.graphs)

        for f in proto.functions:
            visit(f.node)
        while stack:
            g = stack.pop()
            self.graphs.append(g)
            self.tensors.extend(g.initializer)
            for sp in g.sparse_initializer:
                self.tensors.append(sp.values)
                self.tensors.append(sp.indices)
            visit(g.node)


def _attr_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.TENSOR:
            yield a.t
        elif a.type == onnx.AttributeProto.TENSORS:
            yield from a.tensors


# ------------------------------------------------------------------------------------------ tensor data

# fixed-size element types: bytes per element in raw_data (4-bit and string types are left to the checker)
_ITEMSIZE = {TP: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(TP)).itemsize for TP in (
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
    onnx.TensorProto.INT32, onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128)}


def _dtype_name(elem: int) -> str:
    """The ONNX name of an element type, or a description of a number ONNX does not define."""
    try:
        return onnx.helper.tensor_dtype_to_string(elem)
    except (KeyError, ValueError):
        return f"undefined ({elem})"


def _check_tensor_data(walk: _Walk) -> None:
    """Every stored tensor's dims are non-negative and its inline data holds exactly that many elements
    (onnx's checker lets a mismatch through, and reading such a tensor fails deep inside a pass)."""
    for g in walk.graphs:  # an initializer listed as an input must fit the input's declared type
        inits = {t.name: t for t in g.initializer}
        for vi in g.input:
            t = inits.get(vi.name)
            if t is None or not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            if (not tt.elem_type or tt.elem_type == t.data_type) and (
                    not tt.HasField("shape") or _dims_fit(tt.shape.dim, t.dims)):
                continue
            dims = list(t.dims)
            declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            raise ModelLoadError(
                f"graph input '{vi.name}' is declared with dims {declared} and type "
                f"{_dtype_name(tt.elem_type)} but its initializer has dims "
                f"{dims} and type {_dtype_name(t.data_type)}",
                hint="fix or re-export the model")
    external = onnx.TensorProto.EXTERNAL
    for t in walk.tensors:
        dims = list(t.dims)
        if dims and min(dims) < 0:
            raise ModelLoadError(f"tensor '{t.name or '<unnamed>'}' has a negative dimension in its dims {dims}",
                                 hint="fix or re-export the model")
        if t.data_location == external:
            continue
        count = math.prod(dims)
        if t.HasField("raw_data"):
            size = _ITEMSIZE.get(t.data_type)
            if size is not None and len(t.raw_data) != count * size:
                raise ModelLoadError(
                    f"tensor '{t.name or '<unnamed>'}' declares dims {dims} ({count} element(s) of {size} "
                    f"byte(s)) but its raw_data holds {len(t.raw_data)} bytes",
                    hint="the model is corrupt; re-export it")
            continue
        name = t.name or "<unnamed>"
        field = onnx.helper.tensor_dtype_to_field(t.data_type) if t.data_type in _ITEMSIZE else None
        if field is None:
            continue
        held = len(getattr(t, field))
        if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
            held //= 2
        if held != count and not (held == 0 and count == 0):
            raise ModelLoadError(
                f"tensor '{name}' declares dims {dims} ({count} element(s)) but holds {held} value(s)",
                hint="the model is corrupt; re-export it")


# ---------------------------------------------------------------------------------------- external data


def _check_external_data(walk: _Walk, folder: Path | None) -> None:
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


# ----------------------------------------------------------------------------------------------- domains


def _check_domains(proto: onnx.ModelProto, walk: _Walk) -> None:
    local = {(f.domain, f.name) for f in proto.functions}
    unknown: dict[str, int] = {}
    for g in walk.graphs:
        for n in g.node:
            if n.domain not in KNOWN_DOMAINS and (n.domain, n.op_type) not in local:
                unknown[n.domain] = unknown.get(n.domain, 0) + 1
    if unknown:
        listing = ", ".join(f"'{d}' ({c} node{'s' if c > 1 else ''})" for d, c in sorted(unknown.items()))
        raise UnsupportedModelError(
            f"the model uses operators from unknown domain(s) {listing}",
            hint="dlcc handles the standard ONNX domains, ai.onnx.ml and com.microsoft; export the model "
                 "with standard operators")


def _checkable(proto: onnx.ModelProto, external: bool | None = None) -> onnx.ModelProto:
    """A copy the checker can see without its external data (already validated by us).

    onnx's checker resolves external files against the process's working folder; we validated them
    against the model's folder, so external initializers become typed graph inputs in the copy.
    ``external``: whether the proto has external tensors (None: look).
    """
    if external is None:
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in _Walk(proto).tensors)
    if not external:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for g in _Walk(copy).graphs:
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
            for t in _attr_tensors(node):
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    zeros = onnx.numpy_helper.from_array(
                        np.zeros(tuple(t.dims), onnx.helper.tensor_dtype_to_np_dtype(t.data_type)), t.name)
                    t.CopyFrom(zeros)
    return copy


def _dims_fit(declared, dims) -> bool:
    """Do the declared dims (``TensorShapeProto.dim``) fit the tensor's ``dims``? A dim without a value, or
    with -1 (some exporters' "dynamic"), fits any size (the default value 0 is only read when it differs)."""
    return len(declared) == len(dims) and all(
        d.dim_value == e or d.dim_value == -1 or not d.HasField("dim_value")
        for d, e in zip(declared, dims, strict=True))


# float initializers at least this big are left out of the copy the checker and inference see
_WEIGHTLESS_MIN_BYTES = 4096
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _weightless(proto: onnx.ModelProto, walk: _Walk) -> onnx.ModelProto | None:
    """A copy of ``proto`` whose big float initializers are typed graph inputs instead (their data was
    validated by ``_check_tensor_data``; nothing shape-deciding is a big float tensor), or None when there is
    nothing to leave out or the model has subgraphs (their inferred shapes could not be copied back)."""
    g = proto.graph
    if len(walk.graphs) > 1 or proto.functions:
        return None
    # raw_data already matches dims x itemsize (``_check_tensor_data``): size it without copying the bytes
    big = {i for i, t in enumerate(g.initializer) if t.data_type in _FLOATS and t.HasField("raw_data")
           and math.prod(t.dims) * _ITEMSIZE[t.data_type] >= _WEIGHTLESS_MIN_BYTES}
    if not big:
        return None
    copy = _copy_fields(proto, onnx.ModelProto(), skip="graph")
    cg = _copy_fields(g, copy.graph, skip="initializer")
    cg.initializer.extend(t for i, t in enumerate(g.initializer) if i not in big)
    inputs = {i.name for i in cg.input}
    for i in sorted(big):
        t = g.initializer[i]
        if t.name not in inputs:  # a typed input (built field by field: make_tensor_value_info is slower)
            inputs.add(t.name)
            vi = cg.input.add()
            vi.name = t.name
            tt = vi.type.tensor_type
            tt.elem_type = t.data_type
            tt.shape.SetInParent()  # a known rank even without dims
            dims = tt.shape.dim
            for d in t.dims:
                dims.add().dim_value = d
    return copy


def _copy_fields(src, dst, *, skip: str):
    """``dst`` with every field of ``src`` but ``skip`` copied in (the weights are never copied)."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)
    return dst


def _take_shapes(proto: onnx.ModelProto, inferred: onnx.ModelProto) -> None:
    """The value_info and output types that inference found on the weightless copy, onto ``proto``."""
    if inferred.graph is proto.graph:
        return
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(inferred.graph.value_info)
    for mine, theirs in zip(proto.graph.output, inferred.graph.output, strict=False):
        if mine.name == theirs.name:
            mine.type.CopyFrom(theirs.type)


def _infer_small(proto: onnx.ModelProto, external: bool) -> onnx.ModelProto:
    """Shapes for a small model come cheapest from the proto itself (no IR round trip); a model whose
    inference fails is left as it is (``dlcc.frontend.shapes.infer_shapes`` reports why later).
    ``external``: whether the proto has external tensors (then inference waits for the IR)."""
    if external:
        return proto
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
        return proto


def _run_checker(model: onnx.ModelProto | ir.Model, external: bool | None = None) -> None:
    """onnx's checker. A big model is checked as its skeleton (big tensors passed as typed inputs) so the
    checker does not serialize every weight once more, and its shapes are inferred in the same call; a
    small proto is checked as it is (cheaper)."""
    from dlcc.frontend.shapes import check_and_infer

    def check(proto: onnx.ModelProto) -> None:
        onnx.checker.check_model(_checkable(proto, external if proto is model else None), full_check=False)

    try:
        if isinstance(model, onnx.ModelProto):
            check(model)
        else:
            check_and_infer(model, check)  # one skeleton call for both
    except onnx.checker.ValidationError as e:
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "validation failed")
        raise ModelLoadError(f"the model is not valid ONNX: {first}",
                             hint="fix or re-export the model") from None
    except (ValueError, RuntimeError) as e:
        raise ModelLoadError(f"the model is not valid ONNX: {e}", hint="fix or re-export the model") from None


# --------------------------------------------------------------------------------------- normalization


def _take_value_info(proto: onnx.ModelProto) -> list[tuple[str, int, list]] | None:
    """The main graph's value_info as (name, elem_type, dims) when every entry is a plain tensor type
    (no doc string or metadata), removed from the proto; else None and the proto is left as it is.
    Setting these on the IR ourselves costs a third of onnx_ir's general value_info deserialization."""
    out = []
    for vi in proto.graph.value_info:
        t = vi.type
        if not t.HasField("tensor_type") or t.denotation or vi.doc_string or vi.metadata_props:
            return None
        tt = t.tensor_type
        if not tt.HasField("shape"):
            dims = None
        else:
            dims = []
            for d in tt.shape.dim:
                if d.denotation:
                    return None
                dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        out.append((vi.name, tt.elem_type, dims))
    if out:
        del proto.graph.value_info[:]
    return out


def _apply_value_info(graph: ir.Graph, shapes: list[tuple[str, int, list]]) -> None:
    values = {v.name: v for v in graph.inputs}
    for node in graph:
        for o in node.outputs:
            values[o.name] = o
    for name, elem, dims in shapes:
        v = values.get(name)
        if v is None:
            continue
        if elem and v.dtype is None:
            try:
                v.dtype = ir.DataType(elem)
            except ValueError:
                raise ModelLoadError(f"the model is corrupted: '{name}' is declared with element type {elem}, "
                                     "which ONNX does not define", hint="re-export the model") from None
        if dims is not None and v.shape is None:
            v.shape = ir.Shape(dims)


def _check_ir3_initializers(proto: onnx.ModelProto, walk: _Walk) -> None:
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


def _strip_initializer_inputs(proto: onnx.ModelProto) -> int:
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


def _normalize_initializer_inputs(model: ir.Model, keep: bool, stripped: int = 0) -> None:
    graph = model.graph
    as_inputs = [v for v in graph.inputs if v.name in graph.initializers]
    if not as_inputs and not stripped:
        return
    if keep:
        notes(model).append(
            f"kept {len(as_inputs)} initializer(s) listed as graph inputs as overridable inputs "
            "(--keep-initializer-inputs)")
        return
    if as_inputs:
        gone = set(as_inputs)
        kept = [v for v in graph.inputs if v not in gone]
        graph.inputs.clear()
        graph.inputs.extend(kept)
    count = len(as_inputs) + stripped
    # IR < 4 requires every initializer to be a graph input; once they are constants the model is IR 4.
    if model.ir_version < 4:
        model.ir_version = 4
    notes(model).append(
        f"treated {count} initializer(s) listed as graph inputs as constants (legacy IR "
        f"{model.meta.get('dlcc.ir_version_in', '<4')} form); use --keep-initializer-inputs to keep them "
        "as inputs")


# ------------------------------------------------------------------------------------------------ saving


def save(model: ir.Model, path: str | os.PathLike, *, external_data: bool | None = None) -> Path:
    """Write ``model`` to ``path`` atomically; returns the path written.

    ``external_data=None`` switches to an external data file (``<name>.data``) when the tensors exceed
    2 GB. The model file and its data appear together or not at all.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OutputError(f"output path '{path}' is a folder", hint="give a file name such as model.onnx")
    if not folder.is_dir():
        raise OutputError(f"output folder '{folder}' does not exist", hint="create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"output folder '{folder}' is not writable", hint="choose another output path")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"output file '{path}' is not writable", hint="choose another output path")
    if external_data is None:
        external_data = tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    if not external_data:
        _save_one_file(model, path, folder)
        return path
    data_name = path.name + ".data"
    try:
        tmpdir = Path(tempfile.mkdtemp(prefix=".dlcc-tmp-", dir=folder))
    except OSError as e:
        raise OutputError(f"cannot write into '{folder}': {e.strerror}",
                          hint="choose another output path") from None
    try:
        tmp_model = tmpdir / path.name
        try:
            if external_data:
                ir.save(model, tmp_model, external_data=data_name, size_threshold_bytes=1024)
            else:
                _save_inline(model, tmp_model)
        except OSError as e:
            raise OutputError(f"cannot write '{path}': {e.strerror}", hint="check free disk space") from None
        if external_data:
            os.replace(tmpdir / data_name, folder / data_name)
        os.replace(tmp_model, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return path


def _save_one_file(model: ir.Model, path: Path, folder: Path) -> None:
    """The inline case of ``save``: a temporary file next to ``path`` (created exclusively, with the
    permissions a new file gets), renamed over ``path`` once complete, removed on any failure."""
    for _ in range(100):
        tmp = folder / f".dlcc-tmp-{os.urandom(6).hex()}-{path.name}"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise OutputError(f"cannot write into '{folder}': {e.strerror}",
                              hint="choose another output path") from None
    else:
        raise OutputError(f"cannot create a temporary file in '{folder}'", hint="choose another output path")
    try:
        try:
            _save_inline(model, tmp)
        except OSError as e:
            raise OutputError(f"cannot write '{path}': {e.strerror}", hint="check free disk space") from None
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# numpy dtypes whose in-memory bytes are ONNX's raw_data as they are (little-endian, one element each)
_STREAMABLE = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.INT8,
                         ir.DataType.UINT8, ir.DataType.INT16, ir.DataType.UINT16, ir.DataType.INT32,
                         ir.DataType.UINT32, ir.DataType.INT64, ir.DataType.UINT64, ir.DataType.BOOL})
_STREAM_MIN_BYTES = 4096


def _save_inline(model: ir.Model, path: Path) -> None:
    """Write the model as one protobuf file without building it in memory twice.

    Protobuf concatenates: the file is the model without its graph, then the graph field, whose bytes are
    the graph without its initializers followed by one ``initializer`` entry per tensor in the model's
    order; a big one is written as a small header (name, dims, dtype) and its ``raw_data`` taken straight
    from the array. The value_info of the nodes' outputs (plain tensor types) is encoded here too, after the
    skeleton, in the order onnx_ir gives it. It parses to ``serialize_model(model)`` (less the redundant
    value_info entries of initializers), minus two in-memory copies of every weight.
    """
    graph = model.graph
    order = list(graph.initializers.values())
    if (sys.byteorder != "little" or not any(_streamable(v) for v in order)
            or any(_QUANT in v.meta for v in _all_values(graph))):  # (annotations onnx_ir writes beside values)
        with open(path, "wb") as f:
            f.write(ir.serde.serialize_model(model).SerializeToString())
        return
    typed = _plain_value_info(graph)
    nodes = _node_entries(graph) if typed is not None else None
    if nodes is not None:  # the graph's other fields from onnx_ir: a view of the graph without its nodes
        model.graph = ir.GraphView(graph.inputs, graph.outputs, nodes=(), doc_string=graph.doc_string,
                                   opset_imports=graph.opset_imports, name=graph.name,
                                   metadata_props=dict(graph.metadata_props) or None)
        try:
            proto = ir.serde.serialize_model(model)
        finally:
            model.graph = graph
        graph_bytes = nodes + proto.graph.SerializeToString() + _value_info_entries(typed)
    else:
        typed = typed or []
        graph.initializers.clear()  # every initializer is written after the skeleton, in the model's order
        for v, _, _ in typed:  # their value_info is encoded below (onnx_ir's field-by-field path is slower)
            v.type, v.shape = None, None
        try:
            proto = ir.serde.serialize_model(model)
        finally:
            graph.initializers.clear()
            for v in order:
                graph.initializers.add(v)
            for v, t, shape in typed:
                v.type, v.shape = t, shape
        graph_bytes = proto.graph.SerializeToString() + _value_info_entries(typed)
    proto.ClearField("graph")
    entries = []
    for v in order:
        t = v.const_value
        if not _streamable(v):
            body = _small_tensor_bytes(v)
            entries.append((_tag(5) + _varint(len(body)) + body, np.empty(0, np.uint8)))
            continue
        header = onnx.TensorProto(name=v.name, dims=list(t.shape), data_type=int(t.dtype)).SerializeToString()
        data = np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)
        raw_len = data.nbytes
        body_len = len(header) + 1 + _varint_size(raw_len) + raw_len  # + raw_data tag/length/bytes
        entries.append((_tag(5) + _varint(body_len) + header + _tag(9) + _varint(raw_len), data))
    graph_len = len(graph_bytes) + sum(len(h) + d.nbytes for h, d in entries)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
        f.write(_tag(7) + _varint(graph_len))
        f.write(graph_bytes)
        for head, data in entries:
            f.write(head)
            f.write(memoryview(data))


def _plain_value_info(graph: ir.Graph) -> list[tuple[ir.Value, ir.TensorType, ir.Shape | None]] | None:
    """The node outputs onnx_ir would write a value_info for, with their types and shapes, when every one
    is a named plain tensor (no denotation, doc string or metadata, dims that are ints >= 0 or symbols);
    else None (then onnx_ir writes them all, so the order stays its own)."""
    out = []
    for node in graph:
        for v in node.outputs:
            t, shape = v.type, v.shape
            if (t is None and shape is None and not v.metadata_props and not v.doc_string) or v.is_graph_output():
                continue
            if (type(t) is not ir.TensorType or t.denotation or not v.name or v.metadata_props or v.doc_string
                    or (shape is not None and not _plain_dims(shape))):
                return None
            out.append((v, t, shape))
    return out


def _plain_dims(shape: ir.Shape) -> bool:
    for i, d in enumerate(shape):
        if shape.get_denotation(i) or (d < 0 if type(d) is int else type(d) is not ir.SymbolicDim):
            return False
    return True


def _value_info_entries(typed: list[tuple[ir.Value, ir.TensorType, ir.Shape | None]]) -> bytes:
    """``GraphProto.value_info`` (field 13) entries holding each value's name, element type and shape,
    encoded; the type part is encoded once per distinct (element type, dims)."""
    types: dict[tuple, bytes] = {}
    out = []
    for v, t, shape in typed:
        key = (t.dtype, None if shape is None else tuple(d if type(d) is int else ("?", d.value) for d in shape))
        type_bytes = types.get(key)
        if type_bytes is None:
            type_bytes = types[key] = _tensor_type_bytes(t.dtype.value, shape)
        name = v.name.encode()
        info = b"\x0a" + _varint(len(name)) + name + b"\x12" + _varint(len(type_bytes)) + type_bytes
        out.append(_tag(13) + _varint(len(info)) + info)
    return b"".join(out)


_QUANT = "quant_parameter_tensor_names"  # onnx_ir's meta key for a value's TensorAnnotation
_INT64 = range(-(1 << 63), 1 << 63)
_FLOAT32 = struct.Struct("<f")


def _all_values(graph: ir.Graph) -> Iterator[ir.Value]:
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def _node_entries(graph: ir.Graph) -> bytes | None:
    """``GraphProto.node`` (field 1) entries of every node, encoded as onnx_ir would (same fields, protobuf's
    field order); None when some node needs what only onnx_ir writes (subgraphs, tensors, references,
    doc strings, metadata, device configurations). 3x cheaper than onnx_ir's field-by-field building."""
    out = []
    for node in graph:
        body = _node_bytes(node)
        if body is None:
            return None
        out.append(b"\x0a" + _varint(len(body)) + body)
    return b"".join(out)


def _text(tag: bytes, s: str) -> bytes:
    b = s.encode()
    return tag + _varint(len(b)) + b


def _node_bytes(node: ir.Node) -> bytes | None:
    if node.overload or node.doc_string or node.metadata_props or getattr(node, "device_configurations", None):
        return None
    parts = []
    for v in node.inputs:  # NodeProto.input (1); a missing optional input is ""
        if v is None:
            parts.append(b"\x0a\x00")
        elif v.name is None:
            return None
        else:
            parts.append(_text(b"\x0a", v.name))
    outputs = list(node.outputs)
    while outputs and not outputs[-1].name:  # trailing unnamed (unused optional) outputs are left out
        outputs.pop()
    for v in outputs:  # NodeProto.output (2)
        if v.name is None:
            return None
        parts.append(_text(b"\x12", v.name))
    if node.name:
        parts.append(_text(b"\x1a", node.name))  # name (3)
    parts.append(_text(b"\x22", node.op_type))  # op_type (4)
    for a in node.attributes.values():  # attribute (5)
        kind = a.type
        key = None
        if kind in _CACHED and not a.doc_string and not a.is_ref():
            key = (a.name, kind, a.value if kind is ir.AttributeType.INT or kind is ir.AttributeType.STRING
                   else tuple(a.value))
            entry = _ATTR_ENTRIES.get(key)
            if entry is not None:
                parts.append(entry)
                continue
        body = _attr_bytes(a)
        if body is None:
            return None
        entry = b"\x2a" + _varint(len(body)) + body
        if key is not None:
            if len(_ATTR_ENTRIES) > 4096:
                _ATTR_ENTRIES.clear()
            _ATTR_ENTRIES[key] = entry
        parts.append(entry)
    if node.domain:
        parts.append(_text(b"\x3a", node.domain))  # domain (7)
    return b"".join(parts)


# encoded int and string attribute entries by (name, type, value): models repeat the same few (strides, pads,
# axes...), and encoding one costs 10x its lookup. Not floats: 0.0 and -0.0 are equal keys, not equal bytes
_ATTR_ENTRIES: dict[tuple, bytes] = {}
_CACHED = frozenset({ir.AttributeType.INT, ir.AttributeType.INTS, ir.AttributeType.STRING,
                     ir.AttributeType.STRINGS})


def _attr_bytes(a: ir.Attr) -> bytes | None:
    """An encoded ``AttributeProto`` of a plain attribute (numbers, strings and lists of them), or None."""
    if a.is_ref() or a.doc_string:
        return None
    kind, v = a.type, a.value
    A = ir.AttributeType
    try:
        if kind == A.INT:
            if v not in _INT64:
                return None
            body = b"\x18" + _varint(v & 0xFFFFFFFFFFFFFFFF)  # i (3): a negative int64 is 10 bytes
        elif kind == A.FLOAT:
            body = b"\x15" + _FLOAT32.pack(v)  # f (2), fixed32
        elif kind == A.STRING:
            raw = v if type(v) is bytes else v.encode()
            body = b"\x22" + _varint(len(raw)) + raw  # s (4)
        elif kind == A.INTS:
            if any(x not in _INT64 for x in v):
                return None
            body = b"".join([b"\x40" + _varint(x & 0xFFFFFFFFFFFFFFFF) for x in v])  # ints (8), unpacked (proto2)
        elif kind == A.FLOATS:
            body = b"".join([b"\x3d" + _FLOAT32.pack(x) for x in v])  # floats (7), unpacked
        elif kind == A.STRINGS:
            body = b"".join([_text(b"\x4a", x) for x in v])  # strings (9)
        else:
            return None
    except (OverflowError, TypeError, struct.error):  # what onnx_ir would refuse or round: let it decide
        return None
    return _text(b"\x0a", a.name) + body + b"\xa0\x01" + _varint(int(kind))  # name (1), ..., type (20)


def _tensor_type_bytes(elem: int, shape: ir.Shape | None) -> bytes:
    """An encoded ``TypeProto`` holding a tensor type."""
    tensor = b"\x08" + _varint(elem)  # TypeProto.Tensor.elem_type
    if shape is not None:
        dims = []
        for d in shape:
            if type(d) is int:
                body = b"\x08" + _varint(d)  # Dimension.dim_value
            elif d.value is None:
                body = b""  # an unknown dim: neither value nor param
            else:
                param = str(d.value).encode()
                body = b"\x12" + _varint(len(param)) + param  # Dimension.dim_param
            dims.append(b"\x0a" + _varint(len(body)) + body)  # TensorShapeProto.dim
        shape_bytes = b"".join(dims)
        tensor += b"\x12" + _varint(len(shape_bytes)) + shape_bytes  # TypeProto.Tensor.shape
    return b"\x0a" + _varint(len(tensor)) + tensor  # TypeProto.tensor_type


def _small_tensor_bytes(v: ir.Value) -> bytes:
    """The serialized TensorProto of a small initializer: the loaded proto itself when it is unchanged
    (protobuf's C serializer, not onnx_ir's Python one), raw bytes for a folded numpy tensor."""
    t = v.const_value
    raw = getattr(t, "raw", None)
    if isinstance(raw, onnx.TensorProto) and raw.name == v.name and raw.data_location != onnx.TensorProto.EXTERNAL:
        return raw.SerializeToString()
    if type(t) is ir.Tensor and t.dtype in _STREAMABLE and sys.byteorder == "little" and v.name is not None:
        data = np.ascontiguousarray(t.numpy()).tobytes()
        proto = onnx.TensorProto(name=v.name, dims=list(t.shape), data_type=int(t.dtype), raw_data=data)
        if t.doc_string:
            proto.doc_string = t.doc_string
        return proto.SerializeToString()
    small = ir.serde.serialize_tensor(t)
    small.name = v.name
    return small.SerializeToString()


def _streamable(v: ir.Value) -> bool:
    t = v.const_value
    return (t is not None and not isinstance(t, ir.ExternalTensor) and t.dtype in _STREAMABLE
            and _nbytes(t) >= _STREAM_MIN_BYTES and v.name is not None)


def _nbytes(t: ir.TensorProtocol) -> int:
    """``t.nbytes``; for a loaded tensor of a fixed-size type, from its proto's dims (onnx_ir builds a Shape
    and a DataType for every call: 10x slower, and saving asks for every initializer)."""
    kind = type(t)
    if kind is ir.serde.TensorProtoTensor:
        proto = t.raw
        size = _ITEMSIZE.get(proto.data_type)
        if size is not None:
            return math.prod(proto.dims) * size
    elif kind is ir.Tensor and t.dtype in _STREAMABLE:  # one element per item: the array's own size
        return t.numpy().nbytes
    return t.nbytes


def _tag(field: int) -> bytes:
    return _varint(field << 3 | 2)  # wire type 2: length-delimited


_SMALL_VARINTS = [bytes([n]) for n in range(128)]


def _varint(n: int) -> bytes:
    if 0 <= n < 128:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _varint_size(n: int) -> int:
    return len(_varint(n))


def tensor_bytes(model: ir.Model) -> int:
    """Bytes held by all initializers of the model (main graph and subgraphs)."""
    from dlcc.passes.rewrite import all_graphs

    total = 0
    for g in all_graphs(model.graph):
        for v in g.initializers.values():
            if v.const_value is not None:
                total += _nbytes(v.const_value)
    return total


def to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialize to a ModelProto (external tensors stay external)."""
    return ir.serde.serialize_model(model)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "w") -> Iterator:
    """Open a temp file beside ``path`` and rename it into place only if the block succeeds."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"output folder '{folder}' does not exist", hint="create it first")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".dlcc-tmp-", dir=folder)
    except OSError as e:
        raise OutputError(f"cannot write into '{folder}': {e.strerror}",
                          hint="choose another output path") from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report or table is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


__all__ = ["DlccError", "load", "save", "notes", "to_proto", "tensor_bytes", "atomic_output",
           "check_external_tensor", "KNOWN_DOMAINS"]
