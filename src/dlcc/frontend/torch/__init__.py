"""The PyTorch frontend: torch modules, ``torch.export`` programs and saved ``.pt2`` files in, through ONNX.

What goes in: a ``torch.nn.Module`` or ``torch.export.ExportedProgram`` with example inputs
(``compile_torch``, behind ``dlcc.compile``), an FX graph captured by ``torch.compile(model,
backend="dlcc")`` (``dynamo.dlcc_backend``, registered through the ``torch_dynamo_backends`` entry point),
or a ``.pt2`` path (``load_pt2``, behind ``dlcc compile/optimize model.pt2``).
What comes out: an onnx_ir model for the rest of dlcc, or a compiled model called like the module.

    module ──export (dynamo; TorchScript fallback)──▶ ONNX in a private temp folder ──dlcc.load──▶ onnx_ir
           ──compile_model──▶ CompiledModel (numpy) ──TorchCompiledModel──▶ the module's own call/return

Modules: ``export`` (the exporters, their errors), ``tree`` (nested values <-> flat tensors), ``model``
(``TorchCompiledModel``), ``dynamo`` (the torch.compile backend).

Invariant: nothing here imports torch at import time; ``import dlcc`` never imports this package's
torch-using parts, and without torch every entry point raises ``TorchMissingError`` (a ``DlccError``
saying ``pip install 'dlcc[torch]'``).
"""

from dlcc.frontend.torch.export import TorchExportFallbackWarning, export_model, has_torch, load_pt2, require_torch
from dlcc.frontend.torch.model import TorchCompiledModel, compile_torch, is_torch_model

__all__ = ["TorchCompiledModel", "TorchExportFallbackWarning", "compile_torch", "export_model", "has_torch",
           "is_torch_model", "load_pt2", "require_torch"]
