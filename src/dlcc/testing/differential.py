"""Differential testing: ``dlcc.optimize`` (levels 0-3) and ``dlcc.compile`` against onnxruntime.

What goes in: a model (``check_graph(model, seed)``; ``seed`` picks the input data, the fusion planner
and graph level of the compile run, and the file layout of the run through saved files) or seeds of
``dlcc.testing.graphs.random_graph`` (``run(seeds)``).
What comes out: one line per disagreement (pipeline, output, error vs scale; a dlcc error or a crash is a
line too), and for ``run`` the counts of graphs, agree, mismatch, dlcc errors, crashes and unsupported.

The oracle is onnxruntime on the ORIGINAL model, with its own graph optimizations off; optimized models run
in onnxruntime the same way, so only dlcc's changes are judged. Tolerance (DESIGN.md): per output, relative
to its scale, max|got - ref| <= RTOL * max|ref| + ATOL; integer and bool outputs exact.
"""

from __future__ import annotations

import collections
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx

__all__ = ["ATOL", "RTOL", "Problem", "check_graph", "check_graph_problems", "run"]

# 1e-4, not the 1e-5 of exact rewrites: the pipelines fold constants (BN into Conv, scalar chains),
# reassociate arithmetic, and the compiled C sums reductions, convolutions and matmuls in another order.
RTOL = 1e-4
ATOL = 1e-5

LEVELS = (0, 1, 2, 3)
FUSIONS = ("auto", "tvm", "dnnfusion")
COMPILE_LEVELS = (3, 3, 0, 2, 1)


# A disagreement is judged against the exact answer: the model run in float64 (onnxruntime, or onnx's
# reference evaluator where onnxruntime has no double kernel) is the truth. When dlcc's float32 result is
# no further from the truth than TRUTH_FACTOR times onnxruntime's own float32 result is (plus the usual
# tolerance), the output is ill-conditioned: float32 cannot decide it (a normalization of nearly constant
# rows, a comparison of x with tanh(x) that a 1-ulp difference flips), both answers are as right as float32
# allows, and it is counted apart, not as a failure. Otherwise dlcc is less accurate than onnxruntime: a
# failure.
TRUTH_FACTOR = 10.0


@dataclass(frozen=True)
class Problem:
    # "mismatch" | "near_miss" (within 100x the tolerance, not explained by conditioning) |
    # "ill_conditioned" (within 100x and within SENSITIVITY_FACTOR x the reference's rounding spread) |
    # "dlcc_error" | "crash" | "unsupported"
    kind: str
    text: str


def _unsupported(err: Exception) -> bool:
    from dlcc.errors import UnsupportedModelError

    return isinstance(err, UnsupportedModelError) or "does not support" in str(err)


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every float32 tensor, type and Cast target made float64 (the exact-arithmetic twin)."""
    from onnx import TensorProto, numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    F, D = TensorProto.FLOAT, TensorProto.DOUBLE

    def tensor(t: TensorProto) -> None:
        if t.data_type == F:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    def graph(g: onnx.GraphProto) -> None:
        for t in g.initializer:
            tensor(t)
        for vi in [*g.input, *g.output, *g.value_info]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == F:
                vi.type.tensor_type.elem_type = D
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    tensor(a.t)
                elif a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph(sub)
                elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == F:
                    a.i = D

    graph(m.graph)
    return m


class _Truth:
    """Per output, the float64 answer and how far onnxruntime's float32 result is from it (computed once,
    lazily; None where no float64 run is possible)."""

    def __init__(self, model: onnx.ModelProto, feeds: dict, ref: dict) -> None:
        self.model, self.feeds, self.ref = model, feeds, ref
        self._exact: dict | None = None

    def exact(self) -> dict:
        if self._exact is None:
            self._exact = {}
            m = as_float64(self.model)
            feeds = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in self.feeds.items()}
            try:
                from dlcc.check import run_ort

                self._exact = run_ort(m.SerializeToString(), feeds, optimize=False)
            except Exception:  # noqa: BLE001  (no double kernel for some op: the reference evaluator)
                try:
                    from onnx.reference import ReferenceEvaluator

                    names = [o.name for o in m.graph.output]
                    outs = ReferenceEvaluator(m).run(None, feeds)
                    self._exact = {n: np.asarray(v) for n, v in zip(names, outs, strict=True)}
                except Exception:  # noqa: BLE001  (no truth: the disagreement stays a failure)
                    self._exact = {}
        return self._exact

    def judge(self, name: str, got: np.ndarray, scale: float) -> tuple[float, float] | None:
        """(dlcc's error, onnxruntime's error) against the float64 answer, or None when unknown."""
        exact = self.exact().get(name)
        if exact is None or np.shape(exact) != np.shape(got):
            return None
        t = np.asarray(exact, np.float64)

        def err(x) -> float:
            x = np.asarray(x, np.float64)
            same_nan = np.isnan(x) & np.isnan(t)
            e = np.where(same_nan, 0.0, np.abs(x - t))
            e = np.where(np.isnan(e), np.inf, e)
            return float(e.max()) if e.size else 0.0

        return err(got), err(self.ref[name])


def _compare(pipeline: str, ref: dict, got: dict, truth: _Truth | None = None) -> list[Problem]:
    from dlcc.check import diff

    out = []
    if len(got) != len(ref):
        return [Problem("mismatch", f"{pipeline}: outputs {sorted(got)} != {sorted(ref)}")]
    for name, r in ref.items():
        g = got.get(name)
        if g is None:
            out.append(Problem("mismatch", f"{pipeline}: output '{name}' missing"))
            continue
        d = diff(name, r, g, rtol=RTOL, atol=ATOL)
        if not d.ok:
            why = d.reason or f"max|err| {d.max_abs:.3g} vs scale {d.scale:.3g} (rel {d.max_rel:.3g})"
            # within 100x the tolerance: most often an ill-conditioned graph (a normalization of values that
            # a clamp made (nearly) constant amplifies rounding), counted apart so real bugs stand out
            near = not d.reason and d.max_abs <= 100 * (RTOL * d.scale + ATOL)
            text = f"{pipeline}: output '{name}' {list(d.shape)}: {why}" + (" (near miss)" if near else "")
            errors = truth.judge(name, g, d.scale) if truth is not None and not d.reason else None
            if errors is not None and errors[0] <= TRUTH_FACTOR * errors[1] + RTOL * d.scale + ATOL:
                out.append(Problem("ill_conditioned", text + f"; against float64: dlcc {errors[0]:.3g}, "
                                                              f"onnxruntime {errors[1]:.3g} (ill-conditioned)"))
            else:
                if errors is not None:
                    text += f"; against float64: dlcc {errors[0]:.3g}, onnxruntime {errors[1]:.3g}"
                out.append(Problem("near_miss" if near else "mismatch", text))
    return out


def _guard(pipeline: str, fn) -> tuple[object, list[Problem]]:
    from dlcc.errors import DlccError

    try:
        return fn(), []
    except DlccError as e:
        kind = "unsupported" if _unsupported(e) else "dlcc_error"
        return None, [Problem(kind, f"{pipeline}: {type(e).__name__}: {e}")]
    except Exception as e:  # noqa: BLE001  (any other exception is a dlcc bug: report it)
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
        return None, [Problem("crash", f"{pipeline}: {type(e).__name__}: {e}{where}")]


def check_graph_problems(model: onnx.ModelProto, seed: int = 0, *, levels=LEVELS, compile: bool = True,  # noqa: A002
                         fusion: str | None = None, compile_level: int | None = None,
                         saved: bool | None = None) -> list[Problem]:
    """``saved``: also optimize through files (``SAVE_LAYOUTS``); by default when ``levels`` are checked."""
    import dlcc
    from dlcc.check import random_inputs, run_ort

    data = model.SerializeToString()
    feeds = random_inputs(model, seed)
    ref = run_ort(data, feeds, optimize=False)
    truth = _Truth(model, feeds, ref)
    problems: list[Problem] = []
    for level in levels:
        def opt(level=level):
            m = dlcc.optimize(data, level=level, emit=lambda s: None)
            return run_ort(m, feeds, optimize=False)

        got, errs = _guard(f"level {level}", opt)
        problems += errs
        if got is not None:
            problems += _compare(f"level {level}", ref, got, truth)
    if saved if saved is not None else bool(levels):
        where = SAVE_LAYOUTS[seed % len(SAVE_LAYOUTS)]
        got, errs = _guard(f"saved ({where})", lambda: _optimized_through_files(model, feeds, where))
        problems += errs
        if got is not None:
            problems += _compare(f"saved ({where})", ref, got, truth)
    if compile:
        fusion = fusion or FUSIONS[seed % len(FUSIONS)]
        clevel = COMPILE_LEVELS[seed % len(COMPILE_LEVELS)] if compile_level is None else compile_level
        name = f"compile (level {clevel}, fusion {fusion})"

        def comp():
            cm = dlcc.compile(data, fusion=fusion, level=clevel)
            return {k: np.asarray(v) for k, v in cm(feeds).items()}

        got, errs = _guard(name, comp)
        problems += errs
        if got is not None:
            problems += _compare(name, ref, got, truth)
    return problems


# how the "saved" pipeline goes through files: the input in one file or with external data (every
# initializer, whatever its size), the output in another folder (the input's then removed) or over the input
SAVE_LAYOUTS = ("other/external", "in_place/external", "other/inline", "in_place/inline")


def _optimized_through_files(model: onnx.ModelProto, feeds: dict, where: str) -> dict:
    """``dlcc.load`` from a file laid out as ``where`` says, level 3, ``dlcc.save``, then onnxruntime on the
    saved file alone (an output in another folder is run after the input's folder is removed)."""
    import shutil
    import tempfile
    from pathlib import Path

    import dlcc
    from dlcc.check import run_ort

    place, data = where.split("/")
    with tempfile.TemporaryDirectory(prefix="dlcc-diff-") as tmp:
        src_dir = Path(tmp) / "in"
        src_dir.mkdir()
        src = src_dir / "model.onnx"
        m = onnx.ModelProto()
        m.CopyFrom(model)
        if data == "external":
            from onnx.external_data_helper import convert_model_to_external_data

            convert_model_to_external_data(m, location="model.onnx.data", size_threshold=0)
        onnx.save(m, str(src))
        dst = src if place == "in_place" else Path(tmp) / "out" / "model.opt.onnx"
        dst.parent.mkdir(exist_ok=True)
        loaded = dlcc.load(src)
        dlcc.save(dlcc.optimize(loaded, level=3, emit=lambda s: None), dst)
        del loaded
        if place == "other":
            shutil.rmtree(src_dir)
        return run_ort(str(dst), feeds, optimize=False)


def check_graph(model: onnx.ModelProto, seed: int = 0, **kwargs) -> list[str]:
    """Empty when every pipeline agrees with onnxruntime; else one line per disagreement. A clean
    "unsupported" error from dlcc is not a disagreement, nor is an ill-conditioned near miss."""
    return [p.text for p in check_graph_problems(model, seed, **kwargs)
            if p.kind not in ("unsupported", "ill_conditioned")]


def classify(problems: list[Problem]) -> str:
    """The outcome of one graph: the worst kind of problem (crash > dlcc_error > mismatch > near_miss >
    ill_conditioned > unsupported), or "agree"."""
    kinds = {p.kind for p in problems}
    for k in ("crash", "dlcc_error", "mismatch", "near_miss", "ill_conditioned", "unsupported"):
        if k in kinds:
            return k
    return "agree"


def check_seed(seed: int) -> tuple[int, str, list[str]]:
    """The outcome of random graph ``seed`` (for worker processes)."""
    from dlcc.testing.graphs import random_graph

    try:
        model = random_graph(seed)
    except Exception as e:  # noqa: BLE001
        return seed, "crash", [f"generator: {type(e).__name__}: {e}"]
    problems = check_graph_problems(model, seed)
    return seed, classify(problems), [p.text for p in problems]


def run(seeds: Iterable[int], *, jobs: int = 1, on_result=None) -> collections.Counter:
    """Counts over random graphs: graphs, agree, mismatch, near_miss, ill_conditioned, dlcc_error, crash,
    unsupported.
    ``on_result(seed, outcome, lines)`` sees every graph (to save failing ones)."""
    counts: collections.Counter = collections.Counter()
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
        results = pool.map(check_seed, seeds, chunksize=4)
    else:
        pool = None
        results = map(check_seed, seeds)
    try:
        for seed, outcome, lines in results:
            counts["graphs"] += 1
            counts[outcome] += 1
            if on_result is not None:
                on_result(seed, outcome, lines)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return counts


def prune(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the nodes, initializers and graph inputs no output needs."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    need = {o.name for o in g.output}
    keep = []
    for node in reversed(list(g.node)):
        if any(o in need for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    del g.node[:]
    g.node.extend(reversed(keep))
    inits = [t for t in g.initializer if t.name in need]
    del g.initializer[:]
    g.initializer.extend(inits)
    inputs = [i for i in g.input if i.name in need] or [g.input[0]]
    del g.input[:]
    g.input.extend(inputs)
    return m


def shrink(model: onnx.ModelProto, fails, *, rounds: int = 20) -> onnx.ModelProto:
    """A smaller model on which ``fails(model)`` still holds: keep one output, move it up the graph
    (each node's first output in turn), prune what it does not need."""
    from onnx import shape_inference

    best = prune(model)
    for _ in range(rounds):
        changed = False
        inferred = shape_inference.infer_shapes(best)
        types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
        candidates = [[o] for o in best.graph.output] if len(best.graph.output) > 1 else []
        candidates += [[types[n.output[0]]] for n in best.graph.node
                       if n.output[0] in types and n.output[0] not in {o.name for o in best.graph.output}]
        for outs in candidates:
            m = onnx.ModelProto()
            m.CopyFrom(best)
            del m.graph.output[:]
            m.graph.output.extend(outs)
            m = prune(m)
            if len(m.graph.node) >= len(best.graph.node) and len(m.graph.output) >= len(best.graph.output):
                continue
            try:
                ok = fails(m)
            except Exception:  # noqa: BLE001
                ok = False
            if ok:
                best, changed = m, True
                break
        if not changed:
            break
    return best
