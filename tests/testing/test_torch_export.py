"""Exports of small PyTorch modules by both exporters run in onnxruntime and match torch.

Tests marked ``torch`` need the ``models`` extra and are skipped without it; the others check that the
kit works without torch.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from dlcc.check import diff, run_ort
from dlcc.testing import export, has_torch, randomize
from dlcc.testing.torch_export import TorchMissingError, example_feeds, torch_modules

MODULES = ["cnn", "mlp_layernorm_gelu", "transformer_layer"]


@pytest.fixture(scope="module")
def modules():
    pytest.importorskip("torch")
    return torch_modules(seed=0)


def torch_output(module, args) -> np.ndarray:
    import torch

    with torch.no_grad():
        return module(*args).numpy()


def assert_matches(ref: np.ndarray, got: np.ndarray) -> None:
    d = diff("output", ref, got, rtol=1e-4, atol=1e-6)
    assert d.ok, f"max abs {d.max_abs:.3g} vs scale {d.scale:.3g} {d.reason}"


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name", MODULES)
def test_export_matches_torch(modules, name, dynamo):
    module, args = modules[name]
    model = export(module, args, dynamo=dynamo, opset=18)
    onnx.checker.check_model(model, full_check=True)
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 18
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    (got,) = run_ort(model, example_feeds(model, args)).values()
    assert_matches(torch_output(module, args), got)


@pytest.mark.torch
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_dynamic_batch(modules, dynamo):
    import torch

    module, _ = modules["transformer_layer"]
    g = torch.Generator().manual_seed(1)
    example = (torch.randn(2, 8, 32, generator=g), torch.zeros(2, 8, dtype=torch.bool))
    model = export(module, example, dynamo=dynamo, dynamic_batch=True)
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert isinstance(dims[0], str) and dims[1:] == [8, 32]
    padding = torch.zeros(3, 8, dtype=torch.bool)
    padding[2, 6:] = True
    args = (torch.randn(3, 8, 32, generator=g), padding)
    (got,) = run_ort(model, example_feeds(model, args)).values()
    assert_matches(torch_output(module, args), got)


@pytest.mark.torch
def test_randomize_an_exported_model(modules):
    """The TorchScript exporter's idioms (Constant nodes, ConstantOfShape, shape subgraphs) survive."""
    module, args = modules["transformer_layer"]
    model = export(module, args, dynamo=False)
    feeds = example_feeds(model, args)
    out = randomize(model, seed=0)
    onnx.checker.check_model(out, full_check=True)
    (before,) = run_ort(model, feeds).values()
    (after,) = run_ort(out, feeds).values()
    assert np.isfinite(after).all() and np.ptp(after) > 0
    assert not np.allclose(before, after)


def test_export_without_torch_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec and import see without torch
    assert not has_torch()
    with pytest.raises(TorchMissingError, match=r"dlcc\[torch\]"):
        export(object(), (), dynamo=False)


def test_kit_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import dlcc.testing as t; "
            "assert not t.has_torch(); assert 'torch' not in [m for m in sys.modules if sys.modules[m]]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
