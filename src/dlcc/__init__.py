"""dlcc: a deep-learning compiler. ONNX in; an optimized graph, fused kernels, a memory plan and C out.

Public API: ``load``, ``save``, ``optimize``, ``compile``; the CLI is ``dlcc`` (see ``dlcc --help``).
"""

from dlcc.errors import DlccError
from dlcc.frontend.load import load
from dlcc.frontend.save import save

__version__ = "0.1.0"

__all__ = ["DlccError", "load", "save", "optimize", "compile", "__version__"]


def optimize(model, **kwargs):
    """Optimize an onnx_ir model in place and return it; see ``dlcc.api.optimize``."""
    from dlcc.api import optimize as _optimize

    return _optimize(model, **kwargs)


def compile(model, **kwargs):  # noqa: A001  (the public name the design asks for)
    """Compile a model to a ``CompiledModel`` callable with numpy arrays; see ``dlcc.compiler``."""
    from dlcc.compiler import compile_model

    return compile_model(model, **kwargs)
