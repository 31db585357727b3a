"""ONNX models exported from small PyTorch modules, for tests that want real exporters' idioms.

What goes in: a ``torch.nn.Module`` and example positional arguments (tensors); which exporter to use
(``dynamo=False``: the TorchScript exporter; ``dynamo=True``: the torch.export-based one, which needs
onnxscript), the opset, and whether the batch dimension (axis 0 of every input) is symbolic.
What comes out: an ``onnx.ModelProto`` with every tensor loaded in memory (the export is written to a
temporary folder, external data included, loaded back and the folder removed); inputs are named
``input0``, ``input1``, ... in the order of ``example_args``.

Invariants: torch is optional (the ``torch`` or ``models`` extra, ``torch==2.13.0`` CPU): this module
imports without it and only ``export``/``torch_modules``/``example_feeds`` import it, raising
``TorchMissingError`` (a ``DlccError``) when it is absent. The exporter calls are the PyTorch frontend's
(``dlcc.frontend.torch.export``). The module is put in eval mode before export. ``torch_modules``
builds its modules from a fixed seed without touching torch's global random state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from dlcc.errors import TorchMissingError
from dlcc.frontend.torch.export import export_file, has_torch, quiet_exporter, require_torch

if TYPE_CHECKING:
    import torch

__all__ = ["TorchMissingError", "example_feeds", "export", "has_torch", "torch_modules"]


def _torch():
    return require_torch("exporting from PyTorch")


def export(module: torch.nn.Module, example_args: Sequence[Any], *, dynamo: bool, opset: int = 18,
           dynamic_batch: bool = False) -> onnx.ModelProto:
    """Export ``module`` called on ``example_args`` to ONNX and load the result back.

    With ``dynamic_batch`` axis 0 of every input is symbolic ("batch"; the outputs follow through shape
    inference); the example batch should then be at least 2, since torch.export specializes a size of 1.
    One exporter, no fallback (``dlcc.frontend.torch.export.export_file``; ``export_model`` is the
    frontend's policy with fallback and clear errors).
    """
    import tempfile

    torch = _torch()
    args = tuple(example_args)
    names = [f"input{i}" for i in range(len(args))]
    module.eval()
    with tempfile.TemporaryDirectory(prefix="dlcc-export-") as tmp:
        path = Path(tmp) / "model.onnx"
        with quiet_exporter(UserWarning, torch.jit.TracerWarning):
            export_file(module, args, path, dynamo=dynamo, opset=opset, input_names=names,
                        dynamic_batch=dynamic_batch)
        return onnx.load(str(path), load_external_data=True)


def example_feeds(model: onnx.ModelProto, example_args: Sequence[Any]) -> dict[str, np.ndarray]:
    """Name ``example_args`` (tensors) by the model's inputs ``input0``, ``input1``, ...; inputs the
    exporter dropped (unused by the graph) are left out."""
    torch = _torch()
    present = {i.name for i in model.graph.input}
    feeds = {}
    for i, a in enumerate(example_args):
        name = f"input{i}"
        if name in present:
            feeds[name] = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return feeds


def torch_modules(seed: int = 0) -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """Small modules (eval mode) and example arguments, by name.

    - ``cnn``: Conv+BN+ReLU, MaxPool, Conv(no bias)+BN+ReLU, adaptive average pool, Flatten, Linear;
      images [2, 3, 16, 16]. BN running statistics are random, so BN is not the identity.
    - ``mlp_layernorm_gelu``: Linear, LayerNorm, GELU (erf), Linear, GELU (tanh), Linear on [2, 8, 32].
    - ``transformer_layer``: ``nn.TransformerEncoderLayer`` (batch_first, 4 heads, d_model 32) on
      x [2, 8, 32] with a bool key-padding mask [2, 8] (True = padding; the second sequence has 3).
    """
    torch = _torch()
    nn = torch.nn

    class TransformerLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                                    batch_first=True)

        def forward(self, x: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
            return self.layer(x, src_key_padding_mask=padding_mask)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cnn = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
        for m in cnn.modules():
            if isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():
                    m.running_mean.copy_(0.1 * torch.randn(m.num_features))
                    m.running_var.copy_(torch.rand(m.num_features) + 0.5)
                    m.weight.copy_(torch.rand(m.num_features) + 0.5)
                    m.bias.copy_(0.1 * torch.randn(m.num_features))
        mlp = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64),
                            nn.GELU(approximate="tanh"), nn.Linear(64, 10))
        with torch.no_grad():
            ln = mlp[1]
            ln.weight.copy_(torch.rand(64) + 0.5)
            ln.bias.copy_(0.1 * torch.randn(64))
        transformer = TransformerLayer()
        images = torch.randn(2, 3, 16, 16)
        tokens = torch.randn(2, 8, 32)
        x = torch.randn(2, 8, 32)
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[1, 5:] = True
    modules: dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]] = {
        "cnn": (cnn, (images,)),
        "mlp_layernorm_gelu": (mlp, (tokens,)),
        "transformer_layer": (transformer, (x, padding)),
    }
    for module, _ in modules.values():
        module.eval()
    return modules
