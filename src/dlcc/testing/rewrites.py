"""Checks shared by the tests of graph rewrites: run a pass, verify the IR, run onnx.checker, and compare
onnxruntime's outputs before and after on seeded random inputs.

What goes in: a model (onnx_ir) and a pass (anything callable as ``p(model) -> changed``).
What comes out: the pass's ``changed``; an AssertionError naming the output and the error when the
outputs differ beyond ``max|got - ref| <= rtol * max|ref| + atol`` (integers and bools: exactly).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def check_rule_fires(model: ir.Model, rules, name: str, *, feeds: dict | None = None,
                     seeds: Sequence[int] = (1,), transform: Callable[[np.ndarray], np.ndarray] | None = None,
                     atol: float = 1e-6) -> ir.Model:
    """``name`` fires when ``rules`` run on ``model`` (the driver choosing the best rewrite); the result
    verifies, passes the checker, matches onnxruntime (rtol 1e-5 for an exact rule, 1e-4 otherwise) on
    ``feeds`` or on seeded random inputs (each passed through ``transform``, e.g. to make them positive),
    keeps its output names, and a second run changes nothing. Returns the rewritten model."""
    from dlcc.passes.rewrite import RewriteStats, apply_rules

    rule = next(r for r in rules if r.name == name)
    before = ir.serde.serialize_model(model)
    names = [v.name for v in model.graph.outputs]
    cases = [feeds] if feeds is not None else [random_inputs(before, seed=s) for s in seeds]
    if transform is not None:
        cases = [{k: transform(v) for k, v in c.items()} for c in cases]
    refs = [run_ort(before, c) for c in cases]
    stats = RewriteStats()
    assert apply_rules(model, rules, stats=stats, choose_best=True), (name, stats.refused)
    assert stats.fired[name] >= 1, (name, stats.fired, stats.refused)
    verify_model(model)
    after = ir.serde.serialize_model(model)
    onnx.checker.check_model(after, full_check=True)
    rtol = 1e-5 if rule.exact else 1e-4
    for c, ref in zip(cases, refs, strict=True):
        got = run_ort(after, c)
        for k in ref:
            d = diff(k, ref[k], got[k], rtol=rtol, atol=atol)
            assert d.ok, (name, k, d)
    assert [v.name for v in model.graph.outputs] == names
    assert not apply_rules(model, rules, choose_best=True), f"{name}: a second run changed the model"
    return model


def check_rule_refuses(model: ir.Model, rules, name: str, reason: str) -> None:
    """``name`` does not fire on ``model`` and records ``reason`` among its refusals."""
    from dlcc.passes.rewrite import RewriteStats, apply_rules

    stats = RewriteStats()
    apply_rules(model, rules, stats=stats, choose_best=True)
    assert stats.fired[name] == 0, (name, stats.fired)
    assert stats.refused[(name, reason)] >= 1, (name, reason, stats.refused)
