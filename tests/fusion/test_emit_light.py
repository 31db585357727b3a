"""The emitted-groups ONNX (each fusion group a dlcc.fused local function) of every light model runs in
onnxruntime with the outputs of the optimized model (the same computation: rtol 1e-6 of the output's
scale) and of the original (rtol 1e-4: level 3 folds BN)."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

import dlcc
from dlcc.api import optimize
from dlcc.check import diff, random_inputs, run_ort
from dlcc.fusion import plan_fusion
from dlcc.fusion.emit import emit_groups
from dlcc.testing import LIGHT_MODELS, light_model


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_emitted_groups_match(name: str) -> None:
    original = light_model(name, seed=0)
    model = optimize(dlcc.load(original), emit=lambda s: None)
    plan = plan_fusion(model, "auto")
    emitted = ir.serde.serialize_model(emit_groups(model, plan))
    onnx.checker.check_model(emitted, full_check=True)
    assert len(emitted.functions) == sum(1 for g in plan.groups if len(g) > 1)
    feeds = random_inputs(original, seed=5)
    ref = run_ort(original, feeds)
    opt = run_ort(ir.serde.serialize_model(model), feeds)
    got = run_ort(emitted, feeds)
    for k in ref:
        assert diff(k, opt[k], got[k], rtol=1e-6, atol=0).ok
        assert diff(k, ref[k], got[k], rtol=1e-4, atol=1e-6).ok
