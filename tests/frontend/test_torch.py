"""The PyTorch frontend: dlcc.compile(module, example_inputs), torch.compile(backend="dlcc"), .pt2 files.

Every module is compared with eager PyTorch: max|got - ref| <= 1e-4 * max|ref| + 1e-6 per output (the
compiled graph folds BN and reassociates sums: rtol 1e-4, DESIGN.md). Shapes are tiny to keep the suite
quick. Tests marked ``torch`` need the ``torch`` extra and are skipped without it; the others check that
dlcc works, and says what to install, without torch.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dlcc
from dlcc.errors import (
    DataDependentControlFlowError,
    InputError,
    TorchExportError,
    TorchMissingError,
    UnsupportedDtypeError,
    UnsupportedModelError,
)

RTOL, ATOL = 1e-4, 1e-6


# ------------------------------------------------------------------------------------------- modules


@dataclasses.dataclass
class HeadOutput:  # what Hugging Face models return: a dataclass, some fields None
    logits: object
    hidden: object = None
    aux: object = None


def _modules():
    """name -> (module in eval mode, example args), all built from a fixed seed."""
    import torch
    from torch import nn

    from dlcc.testing.torch_export import torch_modules

    kit = torch_modules(seed=0)

    class ResidualDepthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
            self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(8),
                                    nn.ReLU6(), nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))
            self.pool = nn.AvgPool2d(2)
            self.head = nn.Linear(8, 5)

        def forward(self, x):
            h = self.stem(x)
            h = torch.relu(h + self.dw(h))  # residual
            return self.head(self.pool(h).mean(dim=(2, 3)))

    class TupleOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 4)

        def forward(self, x, y):
            h = self.a(x)
            return h.softmax(-1), torch.sigmoid(h) * y

    class DictOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 4)

        def forward(self, x):
            h = self.a(x)
            return {"scores": h.tanh(), "parts": (h.relu(), h.abs().sum(-1))}

    class DataclassOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 4)

        def forward(self, x):
            h = self.a(x)
            return HeadOutput(logits=h, aux=h * 2)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        res = ResidualDepthwise()
        for m in res.modules():
            if isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():
                    m.running_mean.copy_(0.1 * torch.randn(8))
                    m.running_var.copy_(torch.rand(8) + 0.5)
                    m.weight.copy_(torch.rand(8) + 0.5)
        mods = {
            "cnn": kit["cnn"],
            "residual_depthwise": (res, (torch.randn(1, 3, 8, 8),)),
            "mlp_gelu": kit["mlp_layernorm_gelu"],
            "transformer_layer": kit["transformer_layer"],
            "tuple_out": (TupleOut(), (torch.randn(2, 6), torch.randn(2, 4))),
            "dict_out": (DictOut(), (torch.randn(3, 6),)),
            "dataclass_out": (DataclassOut(), (torch.randn(3, 6),)),
        }
    for m, _ in mods.values():
        m.eval()
    return mods


NAMES = ["cnn", "residual_depthwise", "mlp_gelu", "transformer_layer", "tuple_out", "dict_out", "dataclass_out"]


@pytest.fixture(scope="module")
def modules():
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    return _modules()


@pytest.fixture
def fresh_dynamo():
    """torch.compile caches compiled frames per code object: start and end each test without them, with
    the multi-head-attention fast path as it was."""
    import torch

    fast = torch.backends.mha.get_fastpath_enabled()
    torch._dynamo.reset()
    yield torch
    torch._dynamo.reset()
    torch.backends.mha.set_fastpath_enabled(fast)


def eager(module, args, kwargs=None):
    import torch

    with torch.no_grad():
        return module(*args, **(kwargs or {}))


def leaves(value) -> list:
    from dlcc.frontend.torch.tree import flatten

    return flatten(value, lambda x: hasattr(x, "shape"))[0]


def assert_same_structure_and_values(ref, got, *, kind) -> None:
    from dlcc.frontend.torch.tree import flatten

    ref_leaves, ref_spec = flatten(ref, lambda x: hasattr(x, "shape"))
    got_leaves, got_spec = flatten(got, lambda x: hasattr(x, "shape"))
    assert got_spec == ref_spec
    if ref_spec.kind != "leaf":
        assert type(got) is type(ref)
    for r, g in zip(ref_leaves, got_leaves, strict=True):
        assert isinstance(g, kind), type(g)
        r = r.detach().numpy()
        g = g.detach().numpy() if not isinstance(g, np.ndarray) else g
        assert g.shape == r.shape and g.dtype == r.dtype
        err = float(np.max(np.abs(g.astype(np.float64) - r))) if r.size else 0.0
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        assert err <= RTOL * scale + ATOL, f"max abs err {err:.3g} vs scale {scale:.3g}"


# ----------------------------------------------------------------------------------- dlcc.compile(module)


@pytest.mark.torch
@pytest.mark.parametrize("name", NAMES)
def test_compile_module_matches_eager(modules, name):
    import torch

    module, args = modules[name]
    compiled = dlcc.compile(module, args)
    assert compiled.exporter == "dynamo"
    ref = eager(module, args)
    got = compiled(*args)
    assert_same_structure_and_values(ref, got, kind=torch.Tensor)
    # numpy in, numpy out, in the same structure
    got_np = compiled(*[a.numpy() for a in args])
    assert_same_structure_and_values(ref, got_np, kind=np.ndarray)
    assert not module.training  # its modes are restored (eval as given)


@pytest.mark.torch
def test_outputs_wrap_dlcc_arrays_and_modes_are_restored(modules):
    import torch

    module, args = modules["cnn"]
    module.train()
    try:
        compiled = dlcc.compile(module, args)
        assert module.training and all(m.training for m in module.modules())
    finally:
        module.eval()
    out = compiled(*args)
    assert out.is_contiguous() and out.device.type == "cpu" and not out.requires_grad
    out.numpy()[...] = 0  # the tensor is the array dlcc wrote: no copy between them
    assert float(out.abs().sum()) == 0
    assert compiled.input_names == ["input"] and isinstance(compiled.info["kernels"], int)
    assert torch.equal(compiled(*args), compiled(*args))


@pytest.mark.torch
def test_new_shapes_compile_again_unless_static(modules):
    import torch

    module, _ = modules["cnn"]
    g = torch.Generator().manual_seed(3)
    x1, x3 = torch.randn(1, 3, 16, 16, generator=g), torch.randn(3, 3, 16, 16, generator=g)
    compiled = dlcc.compile(module, (x1,))
    assert_same_structure_and_values(eager(module, (x3,)), compiled(x3), kind=torch.Tensor)
    assert compiled.info["variants"] == 2
    static = dlcc.compile(module, (x1,), dynamic=False)
    with pytest.raises(InputError, match=r"compiled for tensors \(float32\[1, 3, 16, 16\]\)"):
        static(x3)


@pytest.mark.torch
def test_keyword_inputs_and_input_names(modules):
    import torch

    module, (x, y) = modules["tuple_out"]
    compiled = dlcc.compile(module, {"x": x, "y": y}, input_names=["a", "b"])
    assert compiled.input_names == ["a", "b"]
    assert_same_structure_and_values(eager(module, (x, y)), compiled(x=x, y=y), kind=torch.Tensor)
    with pytest.raises(dlcc.DlccError, match="input_names gives 1 names for 2"):
        dlcc.compile(module, (x, y), input_names=["a"])


@pytest.mark.torch
def test_exported_program(modules):
    import torch

    module, args = modules["residual_depthwise"]
    program = torch.export.export(module, args)
    compiled = dlcc.compile(program)  # example inputs from the program
    assert_same_structure_and_values(eager(module, args), compiled(*args), kind=torch.Tensor)


# ------------------------------------------------------------------------ torch.compile(backend="dlcc")


@pytest.mark.torch
@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_matches_eager(modules, fresh_dynamo, name):
    from dlcc.frontend.torch.dynamo import DlccFallbackWarning

    torch = fresh_dynamo
    module, args = modules[name]
    if name == "transformer_layer":  # the fused inference kernel has no ONNX form (see the next test)
        torch.backends.mha.set_fastpath_enabled(False)
    compiled = torch.compile(module, backend="dlcc")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DlccFallbackWarning)  # all of it compiled by dlcc
        got = eager(compiled, args)
    assert_same_structure_and_values(eager(module, args), got, kind=torch.Tensor)


@pytest.mark.torch
def test_torch_compile_runs_an_op_without_onnx_form_eagerly(modules, fresh_dynamo):
    from dlcc.frontend.torch.dynamo import DlccFallbackWarning

    torch = fresh_dynamo
    module, args = modules["transformer_layer"]
    torch.backends.mha.set_fastpath_enabled(True)
    compiled = torch.compile(module, backend="dlcc")
    with pytest.warns(DlccFallbackWarning, match=r"_transformer_encoder_layer_fwd .*set_fastpath_enabled\(False\)"):
        got = eager(compiled, args)
    assert_same_structure_and_values(eager(module, args), got, kind=torch.Tensor)


@pytest.mark.torch
def test_torch_compile_recompiles_per_shape(modules, fresh_dynamo):
    torch = fresh_dynamo
    module, _ = modules["cnn"]
    compiled = torch.compile(module, backend="dlcc")
    g = torch.Generator().manual_seed(4)
    for batch in (1, 2, 3, 1):
        x = torch.randn(batch, 3, 16, 16, generator=g)
        assert_same_structure_and_values(eager(module, (x,)), eager(compiled, (x,)), kind=torch.Tensor)


@pytest.mark.torch
def test_torch_compile_notices_changed_weights(fresh_dynamo):
    torch = fresh_dynamo
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    compiled = torch.compile(module, backend="dlcc")
    x = torch.randn(2, 4)
    eager(compiled, (x,))
    with torch.no_grad():
        module[0].bias.add_(1.0)
    assert_same_structure_and_values(eager(module, (x,)), eager(compiled, (x,)), kind=torch.Tensor)


# -------------------------------------------------------------------------------------- unsupported


def _cumsum_module():
    import torch

    class Cumulative(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(torch.cumsum(self.a(x), dim=1)) * 2

    torch.manual_seed(0)
    return Cumulative().eval(), (torch.randn(2, 8),)


@pytest.mark.torch
def test_unsupported_op_is_a_clear_error_in_dlcc_compile():
    pytest.importorskip("onnxscript")
    module, args = _cumsum_module()
    with pytest.raises(UnsupportedModelError, match=r"does not support 1 node\(s\): CumSum .*torch.compile"):
        dlcc.compile(module, args)


@pytest.mark.torch
def test_unsupported_op_runs_eagerly_under_torch_compile(fresh_dynamo):
    from dlcc.frontend.torch.dynamo import DlccFallbackWarning

    torch = fresh_dynamo
    module, args = _cumsum_module()
    compiled = torch.compile(module, backend="dlcc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [eager(compiled, args) for _ in range(3)]
    fallbacks = [w for w in caught if issubclass(w.category, DlccFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in fallbacks]
    assert "cumsum" in str(fallbacks[0].message) and "CumSum" in str(fallbacks[0].message)
    for g in got:
        assert_same_structure_and_values(eager(module, args), g, kind=torch.Tensor)


@pytest.mark.torch
def test_data_dependent_control_flow_is_named():
    torch = pytest.importorskip("torch")

    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 1

    with pytest.raises(DataDependentControlFlowError, match=r"Branchy branches on a tensor's value at "
                                                             r".*test_torch.py:\d+ `if x.sum\(\) > 0:`.*torch.cond"):
        dlcc.compile(Branchy(), (torch.ones(3),))


@pytest.mark.torch
def test_exporter_failure_gives_the_exporters_message_first():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from dlcc.frontend.torch import TorchExportFallbackWarning

    class Eigen(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.eigh(x @ x.T)[0]

    with pytest.warns(TorchExportFallbackWarning), \
            pytest.raises(TorchExportError, match=r"^exporting Eigen to ONNX failed: DispatchError: No ONNX function "
                                                  r"found for .*aten\._linalg_eigh.*has no ONNX translation") as info:
        dlcc.compile(Eigen(), (torch.randn(3, 3),))
    assert "\n" not in str(info.value)


@pytest.mark.torch
def test_torchscript_exporter_is_the_stated_fallback(modules, monkeypatch):
    import torch

    from dlcc.frontend.torch import TorchExportFallbackWarning, export

    real = export.export_file

    def dynamo_fails(*a, dynamo, **k):
        if dynamo:
            raise RuntimeError("simulated dynamo exporter failure")
        return real(*a, dynamo=dynamo, **k)

    monkeypatch.setattr(export, "export_file", dynamo_fails)
    module, args = modules["dict_out"]
    with pytest.warns(TorchExportFallbackWarning, match="simulated dynamo exporter failure.*TorchScript"):
        compiled = dlcc.compile(module, args)
    assert compiled.exporter == "torchscript"
    assert_same_structure_and_values(eager(module, args), compiled(*args), kind=torch.Tensor)


@pytest.mark.torch
def test_unsupported_dtypes(modules):
    import torch

    module, (x,) = modules["cnn"]
    with pytest.raises(UnsupportedDtypeError, match=r"input 0 is torch.bfloat16.*float32"):
        dlcc.compile(module, (x.to(torch.bfloat16),))
    half = torch.nn.Linear(4, 2).to(torch.bfloat16)
    with pytest.raises(UnsupportedDtypeError, match=r"parameter 'weight' of Linear is torch.bfloat16"):
        dlcc.compile(half, (torch.randn(1, 4),))


# --------------------------------------------------------------------------------------------- .pt2


@pytest.fixture
def pt2_path(modules, tmp_path):
    import torch

    module, args = modules["cnn"]
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(module, args), str(path))
    return path


@pytest.mark.torch
def test_pt2_through_the_api(modules, pt2_path):
    module, args = modules["cnn"]
    compiled = dlcc.compile(str(pt2_path))
    (name,) = compiled.input_names
    (got,) = compiled({name: args[0].numpy()}).values()
    assert_same_structure_and_values(eager(module, args), got, kind=np.ndarray)


@pytest.mark.torch
def test_pt2_through_the_cli(modules, pt2_path, tmp_path, cli):
    from dlcc.check import run_ort

    module, args = modules["cnn"]
    code, _, err = cli("compile", pt2_path, "-o", tmp_path / "bundle")
    assert code == 0, err
    assert (tmp_path / "bundle" / "model.c").exists()
    code, _, err = cli("optimize", pt2_path, tmp_path / "cnn.onnx")
    assert code == 0, err
    import onnx

    onnx_model = onnx.load(str(tmp_path / "cnn.onnx"))
    (got,) = run_ort(onnx_model, {onnx_model.graph.input[0].name: args[0].numpy()}).values()
    assert_same_structure_and_values(eager(module, args), got, kind=np.ndarray)


@pytest.mark.torch
def test_bad_pt2_is_one_line_and_exit_2(tmp_path, cli):
    pytest.importorskip("torch")
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    code, _, err = cli("compile", bad, "-o", tmp_path / "out")
    assert code == 2
    assert err.startswith("dlcc: error: ") and "not a readable torch.export program" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- no torch


def test_import_dlcc_does_not_import_torch():
    code = ("import sys, dlcc, dlcc.frontend.torch, dlcc.frontend.torch.dynamo, dlcc.cli; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_without_torch_the_error_says_what_to_install(tmp_path, monkeypatch, cli):
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec and import see without torch
    path = tmp_path / "model.pt2"
    path.write_bytes(b"")
    with pytest.raises(TorchMissingError, match=r"pip install 'dlcc\[torch\]'"):
        dlcc.compile(str(path))
    code, _, err = cli("optimize", path, tmp_path / "out.onnx")
    assert code == 2 and "dlcc[torch]" in err and len(err.strip().splitlines()) == 1


def test_example_inputs_are_for_torch_models(small_path):
    with pytest.raises(dlcc.DlccError, match="example_inputs is for PyTorch models"):
        dlcc.compile(str(small_path), ({"x": np.zeros((1, 4), np.float32)},))
