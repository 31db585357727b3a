"""The whole pipeline, per level, on the test-kit and light models (random weights).

Checks, for each model: the IR verifies after every pass; the output passes onnx.checker (full) and keeps
input/output names; outputs match the original in onnxruntime (rtol 1e-5 at level 1, whose rewrites are
exact; 1e-4 from level 2, which folds BN and reassociates); a second run on the output changes nothing.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

import dlcc
from dlcc.api import optimize
from dlcc.check import diff, random_inputs, run_ort
from dlcc.passes.printer import format_model
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model, randomize

RTOL = {1: 1e-5, 2: 1e-4, 3: 1e-4}


def _run(proto: onnx.ModelProto, level: int, target: str = "onnx") -> onnx.ModelProto:
    model = optimize(dlcc.load(proto), level=level, verify=True, emit=lambda s: None, target=target)
    out = ir.serde.serialize_model(model)
    onnx.checker.check_model(out, full_check=True)
    return out


def _equivalent(before: onnx.ModelProto, after: onnx.ModelProto, rtol: float) -> None:
    assert [i.name for i in after.graph.input] == [i.name for i in before.graph.input
                                                   if i.name not in {t.name for t in before.graph.initializer}]
    assert [o.name for o in after.graph.output] == [o.name for o in before.graph.output]
    feeds = random_inputs(before, seed=3)
    ref, got = run_ort(before, feeds), run_ort(after, feeds)
    for name in ref:
        d = diff(name, ref[name], got[name], rtol=rtol, atol=1e-6)
        assert d.ok, f"{name}: max abs {d.max_abs:.3g} vs scale {d.scale:.3g} {d.reason}"


def _stable(out: onnx.ModelProto, level: int) -> None:
    again = optimize(dlcc.load(out), level=level, emit=lambda s: None)
    assert format_model(again) == format_model(dlcc.load(out)), "a second run changed the model"


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(KIT_MODELS))
def test_kit_models(name: str, level: int) -> None:
    before = randomize(KIT_MODELS[name](), seed=7)
    after = _run(before, level)
    assert len(after.graph.node) <= len(before.graph.node)
    _equivalent(before, after, RTOL[level])
    _stable(after, level)


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "shufflenet", "inception_v1"])
def test_light_models_default_level(name: str) -> None:
    before = light_model(name, seed=0)
    after = _run(before, 3)
    _equivalent(before, after, RTOL[3])
    _stable(after, 3)


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in LIGHT_MODELS if m not in
                                  ("resnet50", "squeezenet", "shufflenet", "inception_v1")])
def test_light_models_default_level_slow(name: str) -> None:
    test_light_models_default_level(name)


def test_expected_node_counts() -> None:
    """the figures bench/optimizers.py reports, pinned where dlcc already reaches the best peer"""
    expected = {"resnet50": 123, "squeezenet": 65, "shufflenet": 154}
    for name, count in expected.items():
        assert len(_run(light_model(name, seed=0), 3).graph.node) <= count, name


@pytest.mark.parametrize("target", ["dlcc-c", "conv-centric"])
def test_other_targets_run(target: str) -> None:
    before = randomize(KIT_MODELS["residual"](), seed=1)
    model = optimize(dlcc.load(before), level=3, verify=True, emit=lambda s: None, target=target)
    assert model.graph.num_nodes() > 0
