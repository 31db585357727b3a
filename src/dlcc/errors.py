"""The DlccError family: every error a user can cause ends here.

What goes in: a message that says what was wrong with the user's input and what to do about it.
What comes out: the CLI prints ``str(err)`` on one line and exits with ``err.exit_code`` (2), with no
traceback unless ``--debug`` is given.

Invariant: code that raises one of these never leaves a partially written output file behind.
"""

from __future__ import annotations


class DlccError(Exception):
    """Base of every error caused by the user's input (model, options, paths)."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message.rstrip(".")
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        text = self.message
        if self.hint:
            text += f". {self.hint.rstrip('.')}."
        else:
            text += "."
        return " ".join(text.split())  # one line, whatever the message held


class ModelLoadError(DlccError):
    """The file or bytes are not a readable, well-formed ONNX model."""


class ExternalDataError(ModelLoadError):
    """External tensor data is missing, malformed or points outside the model's folder."""


class UnsupportedModelError(DlccError):
    """The model uses an operator, domain or feature dlcc does not handle."""


class ShapeError(DlccError):
    """An input-shape override or the model's shapes are inconsistent."""


class OutputError(DlccError):
    """The output cannot be written where the user asked."""


class InputError(DlccError):
    """Input data given to a run (arrays, .npy files) does not fit the model."""


class TemplateError(DlccError):
    """A kernel template met an attribute value or a shape it does not handle (reported as unsupported)."""


class PassError(DlccError):
    """A pass broke the IR or failed to reach a fixpoint: a bug in dlcc, reported with the pass's name."""

    exit_code = 3


class TorchMissingError(DlccError):
    """torch (or onnxscript, which its ONNX exporter needs) is not installed."""


class TorchExportError(UnsupportedModelError):
    """PyTorch could not export the module to ONNX (both exporters failed): the exporter's message first."""


class DataDependentControlFlowError(TorchExportError):
    """The module branches on tensor values: an ONNX graph (and dlcc's code) would freeze one branch."""


class UnsupportedDtypeError(UnsupportedModelError):
    """A tensor's dtype has no counterpart in dlcc's C backend (bfloat16, complex, ...)."""
