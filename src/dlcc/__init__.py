"""dlcc: a deep-learning compiler. ONNX in; an optimized graph, fused kernels, a memory plan and C out.

Public API: ``load``, ``save``, ``optimize``, ``compile``; the CLI is ``dlcc`` (see ``dlcc --help``).
"""

import os

from dlcc.errors import DlccError
from dlcc.frontend.load import load
from dlcc.frontend.save import save

__version__ = "0.1.0"

__all__ = ["DlccError", "load", "save", "optimize", "compile", "__version__"]


def optimize(model, **kwargs):
    """Optimize an onnx_ir model in place and return it; see ``dlcc.api.optimize``."""
    from dlcc.api import optimize as _optimize

    return _optimize(model, **kwargs)


def compile(model, example_inputs=None, **kwargs):  # noqa: A001  (the public name the design asks for)
    """Compile a model; see ``dlcc.compiler``.

    An ONNX model (path, bytes, ModelProto, onnx_ir model) gives a ``CompiledModel`` called with numpy
    arrays by input name. A ``torch.nn.Module`` or ``torch.export.ExportedProgram`` with
    ``example_inputs`` (options ``input_names``, ``dynamic``) gives a model called like the module, torch
    tensors or numpy arrays in, the same kind out (``dlcc.frontend.torch.model``). A ``.pt2`` path (a
    saved torch.export program) is exported to ONNX first. torch is imported only for torch inputs.
    """
    from dlcc.frontend.torch.model import is_torch_model

    if is_torch_model(model):
        from dlcc.frontend.torch.model import compile_torch

        return compile_torch(model, example_inputs, **kwargs)
    if example_inputs is not None:
        raise DlccError("example_inputs is for PyTorch models",
                        hint="an ONNX model takes input_shapes={name: [dims]} to fix symbolic shapes")
    from dlcc.compiler import compile_model

    if isinstance(model, str | os.PathLike) and os.fspath(model).endswith(".pt2"):
        from dlcc.frontend.torch.export import load_pt2

        model = load_pt2(model)
    return compile_model(model, **kwargs)
