"""Numerical comparison of two models (or a model and reference outputs) in onnxruntime.

What goes in: models as paths, bytes, ModelProto or onnx_ir models; inputs as arrays, ``.npy`` files, or
seeded random data generated from the first model's input signature.
What comes out: one ``OutputDiff`` per output: max abs error, max error relative to the output's scale
(max |ref|), and whether ``max|got - ref| <= rtol * max|ref| + atol`` holds; integer and bool outputs
must match exactly.

The scale-relative criterion follows DESIGN.md: an elementwise relative error blows up on values near
zero, which says nothing about the model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dlcc.errors import DlccError, InputError, ModelLoadError

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6

_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float  # max_abs / max|ref|
    scale: float  # max |ref|
    ok: bool
    reason: str = ""


def _session(model, threads: int = 1, optimize: bool = True):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if isinstance(model, ir.Model):
        model = ir.serde.serialize_model(model)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    if isinstance(model, os.PathLike):
        model = str(model)
    try:
        return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types
        msg = " ".join(str(e).split())
        raise ModelLoadError(f"onnxruntime cannot load the model: {msg}",
                             hint="check that the model is valid ONNX") from None


def input_specs(model) -> list[InputSpec]:
    """The inputs a caller must feed (initializers that are overridable inputs are not listed)."""
    sess = model if hasattr(model, "get_inputs") else _session(model)
    specs = []
    for i in sess.get_inputs():
        if i.type not in _ORT_TYPES:
            raise InputError(f"input '{i.name}' has type {i.type}, which dlcc cannot generate data for",
                             hint="pass it with --input NAME=file.npy")
        specs.append(InputSpec(i.name, np.dtype(_ORT_TYPES[i.type]), tuple(i.shape)))
    return specs


def random_inputs(
    model,
    seed: int = 0,
    shapes: Mapping[str, list[int] | tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random feeds for every input of ``model``; symbolic dims take ``shapes`` or 1.

    Floats are standard normal; integers are drawn from [0, 4) (valid as small indices); bools are fair.
    """
    rng = np.random.default_rng(seed)
    shapes = dict(shapes or {})
    feeds = {}
    for spec in input_specs(model):
        if spec.name in shapes:
            shape = tuple(int(d) for d in shapes[spec.name])
        else:
            shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in spec.shape)
        if np.issubdtype(spec.dtype, np.floating):
            arr = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            arr = rng.random(shape) < 0.5
        else:
            arr = rng.integers(0, 4, size=shape).astype(spec.dtype)
        feeds[spec.name] = np.asarray(arr, dtype=spec.dtype)  # rank 0: an array, not a numpy scalar
    return feeds


def load_npy_inputs(pairs: Mapping[str, str | os.PathLike]) -> dict[str, np.ndarray]:
    feeds = {}
    for name, path in pairs.items():
        p = Path(path)
        if not p.is_file():
            raise InputError(f"input file '{p}' for '{name}' does not exist", hint="check the path")
        try:
            feeds[name] = np.load(p, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise InputError(f"cannot read '{p}' as a .npy array: {e}",
                             hint="save inputs with numpy.save") from None
    return feeds


def run_ort(model, feeds: Mapping[str, np.ndarray], *, threads: int = 1, optimize: bool = True,
            session=None) -> dict[str, np.ndarray]:
    """Run ``model`` in onnxruntime on ``feeds``; outputs by name."""
    sess = session or _session(model, threads, optimize)
    wanted = {i.name for i in sess.get_inputs()}
    given = {k: v for k, v in feeds.items() if k in wanted}
    missing = wanted - set(given)
    if missing:
        raise InputError(f"no data for input(s) {sorted(missing)}",
                         hint="pass them with --input NAME=file.npy")
    try:
        outs = sess.run(None, given)
    except Exception as e:
        msg = " ".join(str(e).split())
        raise InputError(f"onnxruntime failed to run the model: {msg}",
                         hint="check the input shapes and dtypes") from None
    return {o.name: np.asarray(v) for o, v in zip(sess.get_outputs(), outs, strict=True)}


def compare(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], *, rtol: float = DEFAULT_RTOL,
            atol: float = DEFAULT_ATOL) -> list[OutputDiff]:
    """Compare outputs by name (by position when the names differ but the counts agree)."""
    if set(ref) == set(got):
        pairs = [(n, ref[n], got[n]) for n in ref]
    elif len(ref) == len(got):
        pairs = [(n, ref[n], got[m]) for n, m in zip(ref, got, strict=True)]
    else:
        raise DlccError(f"the models have different outputs: {sorted(ref)} vs {sorted(got)}",
                        hint="compare models with the same outputs")
    return [diff(n, r, g, rtol=rtol, atol=atol) for n, r, g in pairs]


def diff(name: str, ref: np.ndarray, got: np.ndarray, *, rtol: float, atol: float) -> OutputDiff:
    ref = np.asarray(ref)
    got = np.asarray(got)
    if ref.shape != got.shape:
        return OutputDiff(name, tuple(got.shape), float("inf"), float("inf"), 0.0, False,
                          f"shape {got.shape} != {ref.shape}")
    if ref.dtype.kind in "biu" or got.dtype.kind in "biu":
        bad = int(np.count_nonzero(ref != got))
        mx = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)))) if ref.size else 0.0
        return OutputDiff(name, tuple(ref.shape), mx, mx, 0.0, bad == 0,
                          f"{bad} elements differ" if bad else "")
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    nan_mismatch = np.count_nonzero(np.isnan(r) != np.isnan(g))
    finite = np.isfinite(r) & np.isfinite(g)
    inf_mismatch = np.count_nonzero(~finite & ~np.isnan(r) & (r != g))
    scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
    max_abs = float(np.max(np.abs(r[finite] - g[finite]))) if finite.any() else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    ok = bool(max_abs <= rtol * scale + atol and nan_mismatch == 0 and inf_mismatch == 0)
    reason = ""
    if nan_mismatch or inf_mismatch:
        reason = f"{nan_mismatch} NaN and {inf_mismatch} Inf positions differ"
    return OutputDiff(name, tuple(ref.shape), max_abs, max_rel, scale, ok, reason)


def check_models(a, b, *, feeds: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                 shapes: Mapping[str, list[int]] | None = None, rtol: float = DEFAULT_RTOL,
                 atol: float = DEFAULT_ATOL, threads: int = 1) -> list[OutputDiff]:
    """Run ``a`` and ``b`` on the same inputs; ``a`` is the reference."""
    sa = _session(a, threads)
    sb = _session(b, threads)
    data = dict(random_inputs(sa, seed, shapes))
    if feeds:
        unknown = set(feeds) - {s.name for s in input_specs(sa)}
        if unknown:
            raise InputError(f"--input names unknown input(s) {sorted(unknown)}",
                             hint=f"the model's inputs are {[s.name for s in input_specs(sa)]}")
        data.update(feeds)
    return compare(run_ort(a, data, session=sa), run_ort(b, data, session=sb), rtol=rtol, atol=atol)


def interleaved_best_ms(fns, runs: int) -> list[float]:
    """Best wall time (ms) of each callable over ``runs`` rounds; each round calls them one after the
    other, so all of them see the same machine state (a latency ratio from one run is then fair)."""
    import time

    best = [float("inf")] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return [1e3 * b for b in best]
