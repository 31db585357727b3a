"""The ONNX backend conformance suite (node cases shipped inside the onnx wheel) run against dlcc.compile.

What goes in: ``onnx.backend.test.case.node.collect_testcases`` (each case: a model and input/expected
output data sets).
What comes out: one ``CaseResult`` per case with a status:
    passed       compiled and every output matched the expected data (the case's own rtol/atol). A case
                 whose parameter inputs (axes, pads, scales, ...: inputs never read as an op's first
                 operand) must be compile-time constants is compiled with them frozen to the case's data
                 (``dlcc.compile(constants=...)``) and says so in its detail

    failed       the ops are claimed but the result is wrong or compilation failed unexpectedly
    excluded     on ``EXCLUDED`` (exact case name -> reason), or a claimed op met an attribute value or a
                 non-constant parameter the C backend rejects on purpose (TemplateError; the reason is its
                 message) — listed in the report so nothing is hidden
    unsupported  an op dlcc does not claim (not in the dlcc-c target), or a dtype the C backend has no type
                 for (float16, double, strings, ...)
A case is *claimed* when all its ops are claimed and all its tensors have supported dtypes.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx

__all__ = ["EXCLUDED", "CaseResult", "cases", "run_case", "summarize"]

SUPPORTED_DTYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}

# Exact case names that are claimed but excluded on purpose, each with its reason.
EXCLUDED: dict[str, str] = {
    "test_resize_downsample_scales_linear_align_corners":
        "the expected data (onnx reference: 1, 3.142857) disagrees with onnxruntime (1, 4), the oracle dlcc "
        "is tested against; dlcc gives onnxruntime's 1, 4",
}


@dataclass
class CaseResult:
    name: str
    status: str
    detail: str = ""
    ops: tuple[str, ...] = ()


def cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [c for c in collect_testcases(None) if c.kind == "node" and c.model is not None]


def _dtypes(model: onnx.ModelProto) -> set[int]:
    g = model.graph
    out = set()
    for vi in (*g.input, *g.output):
        t = vi.type
        if t.HasField("tensor_type"):
            out.add(t.tensor_type.elem_type)
        else:
            out.add(-1)  # sequences, maps, optionals
    return out


def claimed(model: onnx.ModelProto) -> tuple[bool, str]:
    import onnx_ir as ir

    import dlcc.codegen.program  # noqa: F401  (registers what the C backend prints: dlcc.ops.backend)
    from dlcc.lower.lower import supported

    try:
        m = ir.serde.deserialize_model(model)
    except Exception as e:  # noqa: BLE001  (a case the IR cannot even read)
        return False, f"unreadable: {e}"
    bad_ops = sorted({n.op_type for n in m.graph if not supported(n) and n.op_type != "Constant"})
    if bad_ops:
        return False, f"op {', '.join(bad_ops)} not claimed"
    bad = _dtypes(model) - SUPPORTED_DTYPES
    if bad:
        names = [onnx.TensorProto.DataType.Name(t) if t >= 0 else "non-tensor" for t in bad]
        return False, f"dtype {', '.join(sorted(names))}"
    return True, ""


def run_case(case) -> CaseResult:
    import dlcc
    from dlcc.codegen.cbase import TemplateError
    from dlcc.errors import DlccError

    ops = tuple(sorted({n.op_type for n in case.model.graph.node}))
    ok, why = claimed(case.model)
    if not ok:
        return CaseResult(case.name, "unsupported", why, ops)
    if case.name in EXCLUDED:
        return CaseResult(case.name, "excluded", EXCLUDED[case.name], ops)
    frozen = {}
    try:
        try:
            cm = dlcc.compile(case.model)
        except TemplateError as e:
            params = _parameter_inputs(case.model)
            if "must be a constant" not in str(e) or not params or len(case.data_sets) != 1:
                raise
            data = dict(zip([i.name for i in case.model.graph.input], case.data_sets[0][0], strict=False))
            frozen = {n: np.asarray(data[n]) for n in params if n in data}
            cm = dlcc.compile(case.model, constants=frozen)
    except TemplateError as e:
        return CaseResult(case.name, "excluded", str(e).splitlines()[0], ops)
    except DlccError as e:
        return CaseResult(case.name, "failed", f"compile: {str(e).splitlines()[0]}", ops)
    except Exception as e:  # noqa: BLE001  (a dlcc bug: reported as a failure, not a crash of the run)
        return CaseResult(case.name, "failed", f"compile crashed: {type(e).__name__}: {e}"[:300], ops)
    names = [i.name for i in case.model.graph.input]
    rtol, atol = max(case.rtol, 1e-5), max(case.atol, 1e-6)
    for inputs, expected in case.data_sets:
        feeds = {}
        for n, a in zip(names, inputs, strict=False):
            if n not in frozen:
                feeds[n] = np.asarray(a)
        try:
            got = cm(feeds)
        except DlccError as e:
            return CaseResult(case.name, "failed", f"run: {e}", ops)
        for (oname, g), ref in zip(got.items(), expected, strict=False):
            ref = np.asarray(ref)
            if g.shape != ref.shape:
                return CaseResult(case.name, "failed", f"{oname}: shape {g.shape} != {ref.shape}", ops)
            if ref.dtype.kind in "biu":
                if not np.array_equal(g, ref):
                    return CaseResult(case.name, "failed", f"{oname}: integer values differ", ops)
                continue
            r = ref.astype(np.float64)
            d = g.astype(np.float64)
            finite = np.isfinite(r)
            if not np.array_equal(np.isnan(r), np.isnan(d)) or not np.array_equal(r[~finite & ~np.isnan(r)],
                                                                                  d[~finite & ~np.isnan(r)]):
                return CaseResult(case.name, "failed", f"{oname}: nan/inf pattern differs", ops)
            if finite.any():
                err = np.max(np.abs(d[finite] - r[finite]))
                scale = np.max(np.abs(r[finite]))
                # the case's own tolerance, elementwise (onnx's runner) or relative to the scale (DESIGN.md)
                elementwise = np.all(np.abs(d[finite] - r[finite]) <= atol + rtol * np.abs(r[finite]))
                if not (elementwise or err <= rtol * scale + atol):
                    return CaseResult(case.name, "failed", f"{oname}: max abs err {err:.3g} (scale {scale:.3g})",
                                      ops)
    return CaseResult(case.name, "passed", f"frozen parameters: {', '.join(frozen)}" if frozen else "", ops)


def _parameter_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that no node reads as its first operand (axes, pads, scales, sizes, repeats...)."""
    first = {n.input[0] for n in model.graph.node if n.input}
    return [i.name for i in model.graph.input if i.name not in first]


def summarize(results: list[CaseResult]) -> Counter:
    return Counter(r.status for r in results)


if __name__ == "__main__":  # python -m dlcc.testing.conformance [substring]: run and print a summary
    import sys

    wanted = sys.argv[1] if len(sys.argv) > 1 else ""
    rs = [run_case(c) for c in cases() if wanted in c.name]
    for r in rs:
        if r.status in ("failed", "excluded") or r.detail.startswith("frozen"):
            print(f"{r.status:8} {r.name}: {r.detail}")
    print(dict(summarize(rs)))
    os._exit(0)
