"""Saving models: one serialization path (onnx_ir's), atomic, outputs that stand on their own.

What goes in: an ``onnx_ir.Model`` (possibly still reading its weights from the input's data file through
memory maps) and an output path.
What comes out: ``path`` (and, for a model with external data, ``<path name>.data`` beside it), written
to temporaries in the output's folder and renamed into place.

Rules (the README repeats them):
- A model whose initializers were external (as torch's dynamo exporter writes them) or that holds more
  than 2 GB of tensors is written with external data: every initializer above 1 KiB goes to the output's
  own data file ``<name>.data`` (locations relative to it); no location names any other file. Any other
  model is one file.
- Nothing is written in place: the data file and the model are written in a private temporary folder
  next to the output, then renamed, data first and model last. If renaming the model fails, the data file
  that was there before is put back, so an existing pair is never half-replaced; any other failure leaves
  neither new file behind.
- Saving over the input (``dlcc optimize m.onnx m.onnx``) works: weights are read from the old data file
  (whose memory maps stay valid after the rename) while the new one is written elsewhere; afterwards the
  model in memory reads the new file.
- The data file may replace an existing file only when that file belongs to the pair being replaced: the
  data file of the model being saved over itself, or one that the existing output model at ``path``
  names. A data file of another model that the input still reads from, or any unrelated file, is never
  overwritten: the save is refused with a message naming it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from dlcc.errors import OutputError
from dlcc.frontend.external import in_memory

__all__ = ["EXTERNAL_DATA_THRESHOLD", "atomic_output", "save", "tensor_bytes", "to_proto"]

# protobuf cannot serialize a message of 2 GiB or more; stay clear of the limit.
EXTERNAL_DATA_THRESHOLD = 2_000_000_000
# initializers at most this big stay inside the model file even when it has external data
INLINE_MAX_BYTES = 1024


def save(model: ir.Model, path: str | os.PathLike, *, external_data: bool | None = None) -> Path:
    """Write ``model`` to ``path`` atomically; returns the path written.

    ``external_data=None``: external data when the model's initializers were external or exceed 2 GB
    (see the module docstring); True/False force it either way.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    _check_output(path, folder)
    _inline_attribute_tensors(model)
    if external_data is None:
        external_data = _has_external(model) or tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    if not external_data:
        with atomic_output(path, "wb") as f:
            f.write(ir.serde.serialize_model(model).SerializeToString())
        return path
    data_name = path.name + ".data"
    _check_data_file(model, path, folder / data_name)
    try:
        tmpdir = Path(tempfile.mkdtemp(prefix=".dlcc-tmp-", dir=folder))
    except OSError as e:
        raise OutputError(f"cannot write into '{folder}': {e.strerror}", hint="choose another output path") from None
    before = [(v, v.const_value) for g in model.graphs() for v in g.initializers.values()]
    done = False
    try:
        try:
            _externalize(model, tmpdir, data_name)
            with open(tmpdir / path.name, "wb") as f:
                f.write(ir.serde.serialize_model(model).SerializeToString())
        except OSError as e:
            raise OutputError(f"cannot write '{path}': {e.strerror}", hint="check free disk space") from None
        _commit(tmpdir, path, data_name)
        done = True
    finally:
        if done:
            ir.external_data.set_base_dir(model.graph, str(folder.resolve()))
        else:  # the model in memory keeps reading what it read before
            for v, t in before:
                v.const_value = t
        shutil.rmtree(tmpdir, ignore_errors=True)
    return path


def _externalize(model: ir.Model, folder: Path, data_name: str) -> None:
    """Initializers above ``INLINE_MAX_BYTES`` become external tensors in ``folder/data_name`` (written
    now, in the model's order); smaller ones that were external are copied into memory. The tensors the
    model held before are never released: a caller may still hold arrays that view their memory maps."""
    big = []
    for g in model.graphs():
        for v in g.initializers.values():
            t = v.const_value
            if t is None:
                continue
            if t.nbytes > INLINE_MAX_BYTES:
                big.append(v)
            elif isinstance(t, ir.ExternalTensor):
                v.const_value = in_memory(t)
    if big:
        written = ir.external_data.convert_tensors_to_external([v.const_value for v in big], folder, data_name)
        for v, t in zip(big, written, strict=True):
            v.const_value = t


def _check_output(path: Path, folder: Path) -> None:
    if path.is_dir():
        raise OutputError(f"output path '{path}' is a folder", hint="give a file name such as model.onnx")
    if not folder.is_dir():
        raise OutputError(f"output folder '{folder}' does not exist", hint="create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"output folder '{folder}' is not writable", hint="choose another output path")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"output file '{path}' is not writable", hint="choose another output path")


def _inline_attribute_tensors(model: ir.Model) -> None:
    """Tensor attributes (a Constant's value) that still read the input's data file are loaded into the
    model: only initializers go to the output's data file, and no location may name another file."""
    for g in model.graphs():
        for node in g:
            for a in node.attributes.values():
                if a.type == ir.AttributeType.TENSOR and isinstance(a.value, ir.ExternalTensor):
                    node.attributes[a.name] = ir.AttrTensor(a.name, in_memory(a.value))
                elif a.type == ir.AttributeType.TENSORS and any(isinstance(t, ir.ExternalTensor) for t in a.value):
                    node.attributes[a.name] = ir.AttrTensors(a.name, [in_memory(t) for t in a.value])


def _has_external(model: ir.Model) -> bool:
    return any(isinstance(v.const_value, ir.ExternalTensor) for g in model.graphs() for v in g.initializers.values())


def _read_files(model: ir.Model) -> set[Path]:
    """The data files the model in memory reads its external initializers from."""
    out = set()
    for g in model.graphs():
        for v in g.initializers.values():
            t = v.const_value
            if isinstance(t, ir.ExternalTensor):
                out.add(Path(t.base_dir or ".", t.location).resolve())
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_data_file(model: ir.Model, path: Path, data: Path) -> None:
    """Refuse to replace a ``data`` file that is not part of the pair being written (module docstring)."""
    if not data.exists() and not data.is_symlink():
        return
    if data.is_dir():
        raise OutputError(f"the output's data file '{data}' is a folder", hint="choose another output name")
    source = model.meta.get("dlcc.source")
    in_place = source not in (None, "<memory>") and _same(Path(source), path)
    if any(_same(data, f) for f in _read_files(model)):
        if in_place:
            return
        raise OutputError(
            f"the output's data file '{data}' is the file the input model reads its weights from; replacing it "
            "would break the input", hint="write the output under another name or into another folder")
    if path.exists() and data.name in _locations(path):
        return  # the data file of the output being replaced
    raise OutputError(f"the output's data file '{data}' already exists and is not part of '{path}'",
                      hint="remove it, or write the output under another name or into another folder")


def _locations(path: Path) -> set[str]:
    """The external-data locations an existing model file names (empty when it is not a readable model)."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 (whatever is there, it does not name our data file)
        return set()
    found = set()
    stack = [proto.graph]
    while stack:
        g = stack.pop()
        for t in g.initializer:
            found.update(e.value for e in t.external_data if e.key == "location")
        for n in g.node:
            for a in n.attribute:
                stack.extend([a.g] if a.HasField("g") else list(a.graphs))
    return found


def _commit(tmpdir: Path, path: Path, data_name: str) -> None:
    """Rename the written data file, then the model, into place; a failed model rename puts back the
    data file that was there before (or removes the new one)."""
    folder = path.parent if str(path.parent) else Path(".")
    data = folder / data_name
    new_data = tmpdir / data_name
    if not new_data.exists():  # every initializer fit inline: a single file after all
        os.replace(tmpdir / path.name, path)
        return
    backup = None
    if data.exists():
        backup = tmpdir / ".previous.data"
        os.link(data, backup)
    try:
        os.replace(new_data, data)
        os.replace(tmpdir / path.name, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            if backup is not None:
                os.replace(backup, data)
            else:
                os.unlink(data)
        raise OutputError(f"cannot write '{path}': {e.strerror}", hint="check the output folder") from None


def tensor_bytes(model: ir.Model) -> int:
    """Bytes held by all initializers of the model (main graph and subgraphs)."""
    return sum(v.const_value.nbytes for g in model.graphs() for v in g.initializers.values()
               if v.const_value is not None)


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
        try:
            with os.fdopen(fd, mode) as f:
                yield f
        except OSError as e:
            raise OutputError(f"cannot write '{path}': {e.strerror}", hint="check free disk space") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; an output is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
