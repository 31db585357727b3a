"""Checks shared by the tests of graph rewrites: run a pass, verify the IR, run onnx.checker, and compare
onnxruntime's outputs before and after on seeded random inputs.

What goes in: a model (onnx_ir) and a pass (anything callable as ``p(model) -> changed``).
What comes out: the pass's ``changed``; an AssertionError naming the output and the error when the
outputs differ beyond ``max|got - ref| <= rtol * max|ref| + atol`` (integers and bools: exactly).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir

from dlcc.check import diff, random_inputs, run_ort
from dlcc.passes.verify import verify_model


def assert_equivalent(before: onnx.ModelProto, after: ir.Model | onnx.ModelProto, *, rtol: float = 1e-5,
                      atol: float = 1e-6, seed: int = 0,
                      compare: Callable[[str, np.ndarray, np.ndarray], None] | None = None) -> None:
    """``after`` passes onnx.checker (full) and computes what ``before`` computes on random inputs."""
    if isinstance(after, ir.Model):
        after = ir.serde.serialize_model(after)
    onnx.checker.check_model(after, full_check=True)
    feeds = random_inputs(before, seed=seed)
    ref, got = run_ort(before, feeds), run_ort(after, feeds)
    assert list(got) == list(ref), f"outputs {list(got)} != {list(ref)}"
    for name in ref:
        if compare is not None:
            compare(name, ref[name], got[name])
            continue
        d = diff(name, ref[name], got[name], rtol=rtol, atol=atol)
        assert d.ok, f"{name}: max abs error {d.max_abs:.3g} at scale {d.scale:.3g} {d.reason}".rstrip()


def run_checked(model: ir.Model, p: Callable[[ir.Model], bool], *, rtol: float = 1e-5, atol: float = 1e-6,
                seed: int = 0, ort: bool = True,
                compare: Callable[[str, np.ndarray, np.ndarray], None] | None = None) -> bool:
    """Run ``p`` on ``model`` (in place); verify the IR; check equivalence with the model before."""
    before = ir.serde.serialize_model(model)
    changed = bool(p(model))
    verify_model(model)
    if ort:
        assert_equivalent(before, model, rtol=rtol, atol=atol, seed=seed, compare=compare)
    else:
        onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
    return changed
