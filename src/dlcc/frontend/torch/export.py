"""PyTorch -> ONNX for dlcc: one exporter call, the dynamo-then-TorchScript policy, and errors people hit.

What goes in: a ``torch.nn.Module`` (or anything ``torch.onnx.export`` takes, such as a
``torch.export.ExportedProgram``) and example positional tensors, or the path of a saved ``.pt2`` program.
What comes out: an ``onnx_ir`` model loaded through ``dlcc.load`` with every tensor in memory; it was
written to a private temporary folder (external data included) that is removed before returning.

Policy (``export_model``):
1. the dynamo exporter (torch.export + onnxscript), at the shapes of the example inputs;
2. if it fails, the TorchScript exporter, with a ``TorchExportFallbackWarning`` that says why;
3. if the failure is data-dependent control flow (an ``if`` on a tensor's value), there is no fallback:
   tracing would freeze the branch the example took, so ``DataDependentControlFlowError`` says where;
   the TorchScript tracer's own warning about it is an error too;
4. if both fail, ``TorchExportError``: the dynamo exporter's own message first, then what to try.

Invariants: this module imports without torch; ``require_torch`` raises ``TorchMissingError`` (a
``DlccError``: ``pip install 'dlcc[torch]'``). Exporter chatter (progress lines, deprecation notices,
log lines about torchvision) is silenced; warnings about the user's model are not.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import re
import tempfile
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from dlcc.errors import DataDependentControlFlowError, DlccError, TorchExportError, TorchMissingError

__all__ = ["DEFAULT_OPSET", "TorchExportFallbackWarning", "export_file", "export_model", "has_torch",
           "load_pt2", "quiet_exporter", "require_torch"]

DEFAULT_OPSET = 18
INSTALL_HINT = "install the torch extra: pip install 'dlcc[torch]'"


class TorchExportFallbackWarning(UserWarning):
    """The dynamo exporter failed and the TorchScript exporter was used instead."""


def has_torch() -> bool:
    """Whether torch can be imported (without importing it)."""
    return importlib.util.find_spec("torch") is not None


def require_torch(what: str = "compiling a PyTorch model"):
    """``import torch``, or a ``TorchMissingError`` that says how to install it."""
    if not has_torch():
        raise TorchMissingError(f"{what} needs torch, which is not installed", hint=INSTALL_HINT)
    import torch

    return torch


def _require_onnxscript() -> None:
    if importlib.util.find_spec("onnxscript") is None:
        raise TorchMissingError("the dynamo ONNX exporter needs onnxscript, which is not installed",
                                hint=INSTALL_HINT)


@contextlib.contextmanager
def quiet_exporter(*categories: type[Warning]) -> Iterator[None]:
    """Silence the exporters' chatter: their deprecation notices, the dynamo exporter's progress lines
    on stdout and its log lines about optional torchvision ops (plus any extra warning ``categories``)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._export",
                                                    "torch.fx.experimental.symbolic_shapes")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            for category in (DeprecationWarning, FutureWarning, *categories):
                warnings.simplefilter("ignore", category=category)
            warnings.filterwarnings("ignore", message=".*(training mode|onnxscript|torch.onnx).*")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_file(module: Any, args: Sequence[Any], path: str | os.PathLike, *, dynamo: bool,
                opset: int = DEFAULT_OPSET, input_names: Sequence[str] | None = None,
                kwargs: Mapping[str, Any] | None = None, dynamic_batch: bool = False) -> None:
    """Run one exporter: ``module(*args, **kwargs)`` to ``path`` (the dynamo exporter writes its external
    data beside it). With ``dynamic_batch`` axis 0 of every input is symbolic ("batch")."""
    torch = require_torch("exporting a PyTorch model")
    if dynamo:
        _require_onnxscript()
    args = tuple(args)
    options: dict[str, Any] = {"opset_version": opset, "dynamo": dynamo}
    if input_names is not None:
        options["input_names"] = list(input_names)
    if kwargs:
        options["kwargs"] = dict(kwargs)
    if dynamo:
        options.update(external_data=True, verbose=False)
        if dynamic_batch:
            batch = torch.export.Dim("batch")
            options["dynamic_shapes"] = tuple({0: batch} for _ in args)
    elif dynamic_batch:
        options["dynamic_axes"] = {n: {0: "batch"} for n in input_names or ()}
    torch.onnx.export(module, args, str(path), **options)


def export_model(module: Any, args: Sequence[Any], *, input_names: Sequence[str], opset: int = DEFAULT_OPSET,
                 what: str | None = None) -> tuple[ir.Model, str]:
    """Export ``module(*args)`` to ONNX (dynamo, else TorchScript; see the module docstring) and load it.

    Returns the model (every tensor in memory) and the exporter that made it: "dynamo" or "torchscript".
    ``what`` names the module in messages (default: its class name).
    """
    torch = require_torch()
    what = what or type(module).__name__
    with tempfile.TemporaryDirectory(prefix="dlcc-torch-") as tmp:
        path = Path(tmp) / "model.onnx"
        try:
            with quiet_exporter():
                export_file(module, args, path, dynamo=True, opset=opset, input_names=input_names)
            exporter = "dynamo"
        except TorchMissingError:
            raise
        except Exception as first:  # the exporter's own error types vary by torch release
            _raise_if_data_dependent(first, what)
            summary = exporter_message(first)
            warnings.warn(f"dlcc: the dynamo exporter failed on {what} ({_shorten(summary)}); "
                          "falling back to the TorchScript exporter", TorchExportFallbackWarning, stacklevel=3)
            for f in Path(tmp).iterdir():
                f.unlink()
            try:
                with quiet_exporter(), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", torch.jit.TracerWarning)
                    export_file(module, args, path, dynamo=False, opset=opset, input_names=input_names)
            except Exception as second:
                raise TorchExportError(
                    f"exporting {what} to ONNX failed: {summary} (the TorchScript exporter also failed: "
                    f"{_shorten(exporter_message(second))})", hint=_what_to_try(summary)) from first
            for w in caught:
                if issubclass(w.category, torch.jit.TracerWarning) and "to a Python" in str(w.message):
                    raise DataDependentControlFlowError(
                        f"{what} uses a tensor's value as a Python value ({_shorten(str(w.message), 120)} at "
                        f"{w.filename}:{w.lineno}): a traced graph would freeze what the example inputs "
                        "gave there (a branch taken, a number)", hint=DATA_DEPENDENT_HINT) from first
            exporter = "torchscript"
        from dlcc.frontend.load import load

        model = load(path)
        ir.external_data.load_to_model(model)  # into memory before the folder goes
    model.meta["dlcc.exporter"] = exporter
    return model, exporter


def load_pt2(path: str | os.PathLike, *, opset: int = DEFAULT_OPSET) -> ir.Model:
    """A program saved by ``torch.export.save`` (``.pt2``), exported to ONNX by the dynamo exporter.

    The inputs keep the program's names; dims the program left dynamic stay symbolic (compile with
    ``--input-shape`` / ``input_shapes``)."""
    torch = require_torch(f"reading {os.fspath(path)} (a saved torch.export program)")
    p = Path(path)
    if not p.is_file():
        raise DlccError(f"'{p}' does not exist or is not a file")
    try:
        with quiet_exporter():
            program = torch.export.load(str(p))
    except Exception as e:
        raise TorchExportError(f"'{p}' is not a readable torch.export program: {_shorten(exporter_message(e))}",
                               hint="write it with torch.export.save(torch.export.export(module, args), path)") from e
    with tempfile.TemporaryDirectory(prefix="dlcc-pt2-") as tmp:
        out = Path(tmp) / "model.onnx"
        try:
            with quiet_exporter():
                export_file(program, (), out, dynamo=True, opset=opset)
        except TorchMissingError:
            raise
        except Exception as e:
            summary = exporter_message(e)
            raise TorchExportError(f"exporting {p.name} to ONNX failed: {summary}", hint=_what_to_try(summary)) from e
        from dlcc.frontend.load import load

        model = load(out)
        ir.external_data.load_to_model(model)
    model.meta["dlcc.exporter"] = "dynamo"
    return model


# ------------------------------------------------------------------------------------------ messages

DATA_DEPENDENT_HINT = ("make the branch independent of tensor values (torch.where, or torch.cond for both "
                       "branches), or compile the parts on each side of it separately; torch.compile(model, "
                       "backend='dlcc') does the latter and runs the branch in PyTorch")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def exporter_message(error: BaseException) -> str:
    """The line of an exporter error that says what went wrong, without colour codes or advice.

    The dynamo exporter wraps the real error in a page of next steps; its "Exception summary" section
    names the cause (and, for a missing translation, the aten op)."""
    text = _ANSI.sub("", str(error))
    summary = text.partition("## Exception summary")[2]
    lines = [ln.strip() for ln in (summary or text).splitlines() if ln.strip()]
    # prefer the innermost cause: a missing translation, then anything that is not the wrapper's phrasing
    for line in lines:
        if "No ONNX function found" in line or "not supported" in line:
            return _strip_class(line)
    for line in lines:
        if not line.startswith(("-", "#", "Failed to ", "For ", "If you", "consider ", "Caused by")):
            return _strip_class(line)
    return _strip_class(lines[0]) if lines else type(error).__name__


def _strip_class(line: str) -> str:
    m = re.match(r"<class '([\w.]+)'>:\s*(.*)", line)
    if m:
        line = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
    return line.rstrip(".")


def _shorten(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _what_to_try(summary: str) -> str:
    m = re.search(r"OpOverload\(op='([\w.]+)'", summary) or re.search(r"operator '([\w:]+)'", summary)
    if m:
        op = m.group(1).replace("::", ".")
        return (f"the op {op} has no ONNX translation: replace it in the module, or give torch.onnx a "
                "translation (custom_translation_table); torch.compile(model, backend='dlcc') runs it in "
                "PyTorch and compiles the rest")
    if "pytree" in summary or "not a known type" in summary:
        return ("register the class of that value with torch.utils._pytree.register_dataclass (or return a "
                "tuple or dict)")
    return ("check that torch.export.export(module, args) succeeds on its own and fix what it reports; "
            "torch.compile(model, backend='dlcc') runs what cannot be exported in PyTorch")


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [error]
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)


def _raise_if_data_dependent(error: BaseException, what: str) -> None:
    chain = list(_chain(error))
    for e in chain:
        if "DataDependent" in type(e).__name__ or "data-dependent" in str(e).lower():
            # the innermost error's traceback runs through the user's forward; the wrappers' do not
            inner = [x for x in chain if "DataDependent" in type(x).__name__] or [e]
            where = next((w for w in map(_user_frame, inner) if w), None)
            at = f" at {where}" if where else ""
            raise DataDependentControlFlowError(
                f"{what} branches on a tensor's value{at} ({_shorten(exporter_message(e), 160)}): an exported "
                "graph cannot hold that branch", hint=DATA_DEPENDENT_HINT) from error


def _user_frame(error: BaseException) -> str | None:
    """``file:line (code)`` of the innermost frame of ``error``'s traceback outside torch and dlcc."""
    import torch

    skip = (str(Path(torch.__file__).parent), str(Path(__file__).parents[2]), "<")
    found = None
    for frame in traceback.extract_tb(error.__traceback__):
        if not frame.filename.startswith(skip) and "site-packages" not in frame.filename:
            found = f"{frame.filename}:{frame.lineno}" + (f" `{frame.line.strip()}`" if frame.line else "")
    return found
