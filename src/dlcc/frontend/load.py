"""Safe loading of ONNX models.

What goes in: a path, the bytes of a model, or an ``onnx.ModelProto``.
What comes out: an ``onnx_ir.Model`` whose external tensors (if any) are memory-mapped lazily from files
inside the model's folder, with ``model.meta["dlcc.notes"]`` listing what loading changed.

Invariants:
- External data never leaves the model's folder (``dlcc.frontend.external``).
- A model that is not ONNX, is truncated, fails ``onnx.checker`` or uses an operator domain dlcc does
  not know is refused with a ``DlccError`` that says what to do.
- Legacy forms are normalized (``dlcc.frontend.legacy``): initializers listed as graph inputs (IR < 4)
  become constants unless ``keep_initializer_inputs`` is set; a declared dim of -1 becomes unknown.
- Saving is ``dlcc.frontend.save``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
from google.protobuf.message import DecodeError

from dlcc.errors import ModelLoadError, UnsupportedModelError
from dlcc.frontend.external import check_external_data, checkable, small_into_memory
from dlcc.frontend.legacy import (
    check_ir3_initializers,
    negative_dims,
    normalize_initializer_inputs,
    strip_initializer_inputs,
)
from dlcc.frontend.walk import ProtoWalk

# Operator domains dlcc accepts. Anything else is refused at load time: we cannot optimize, check or
# compile ops whose meaning we do not know.
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training",
                           "dlcc", "dlcc.fused"})

# below this size the checker sees the proto itself; above, only its skeleton (no weight copies)
CHECK_PROTO_BYTES = 16 << 20

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
    walk = ProtoWalk(proto)
    _check_text(proto, walk)
    check_external_data(walk, folder)
    _check_tensor_data(walk)  # also: initializers listed as inputs fit their declared types
    stripped = 0
    if proto is not source and not keep_initializer_inputs:  # ours to edit: strip before the checks below
        check_ir3_initializers(proto, walk)  # (the checker would, if it saw the IR 3 form)
        stripped = strip_initializer_inputs(proto)  # (legacy IR 3 form; inputs cost at every step)
    unknown = negative_dims(walk, fix=False)
    if unknown:
        if isinstance(source, onnx.ModelProto):  # never edit the caller's proto: edit a copy
            proto = onnx.ModelProto()
            proto.CopyFrom(source)
            walk = ProtoWalk(proto)
        negative_dims(walk, fix=True)
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
    if proto is not source and not keep_initializer_inputs and not stripped:  # a copy made for -1 dims
        stripped = strip_initializer_inputs(proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as e:  # the checker passed: what onnx_ir cannot read is corrupt content
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        first = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), type(cause).__name__)
        raise ModelLoadError(f"the model is corrupted: {first} (in {e})",
                             hint="re-export the model") from None
    if folder is not None and external:
        ir.external_data.set_base_dir(model.graph, str(folder))
        small_into_memory(model)  # (inference reads small constants' values; onnx's cannot read a data file)
    if not small:
        _run_checker(model)
    elif external:  # the proto's inference above waited for the IR
        from dlcc.frontend.shapes import infer_shapes

        infer_shapes(model, strict=False)
    model.meta["dlcc.notes"] = []
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        notes(model).append(f"treated dim -1 as dynamic (unknown) in {shown}")
    model.meta["dlcc.ir_version_in"] = ir_version_in
    model.meta["dlcc.source"] = str(source) if isinstance(source, str | os.PathLike) else "<memory>"
    note = normalize_initializer_inputs(model, keep_initializer_inputs, stripped)
    if note:
        notes(model).append(note)
    return model


def _check_text(proto: onnx.ModelProto, walk: ProtoWalk) -> None:
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


def _check_tensor_data(walk: ProtoWalk) -> None:
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


# ----------------------------------------------------------------------------------------------- domains


def _check_domains(proto: onnx.ModelProto, walk: ProtoWalk) -> None:
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


def _dims_fit(declared, dims) -> bool:
    """Do the declared dims (``TensorShapeProto.dim``) fit the tensor's ``dims``? A dim without a value, or
    with -1 (some exporters' "dynamic"), fits any size (the default value 0 is only read when it differs)."""
    return len(declared) == len(dims) and all(
        d.dim_value == e or d.dim_value == -1 or not d.HasField("dim_value")
        for d, e in zip(declared, dims, strict=True))


# float initializers at least this big are left out of the copy the checker and inference see
_WEIGHTLESS_MIN_BYTES = 4096
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _weightless(proto: onnx.ModelProto, walk: ProtoWalk) -> onnx.ModelProto | None:
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
        onnx.checker.check_model(checkable(proto, external if proto is model else None), full_check=False)

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


__all__ = ["KNOWN_DOMAINS", "load", "notes"]
