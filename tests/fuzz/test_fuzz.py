"""Model fuzzing in CI: a seeded share of mutants through ``dlcc optimize`` in subprocesses, unit tests of
the mutator, and regression tests for every bug the fuzzer found (the minimized mutant, built in code)."""

from __future__ import annotations

import collections
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnx.parser
import pytest

import dlcc
from dlcc.errors import ModelLoadError
from dlcc.testing.fuzz import (
    KINDS,
    LAYOUTS,
    base_models,
    layout,
    mutant,
    mutants,
    run_case,
    run_case_forked,
    run_case_inprocess,
)

CI_SEED = 1
CI_COUNT = 120  # about 40 s on 2 cores


def test_ci_share_of_mutants_ends_well():
    cases = list(mutants(CI_SEED, CI_COUNT))
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda ikd: run_case(ikd[1][1], timeout=60, layout=layout(CI_SEED, ikd[0])),
                                 enumerate(cases)))
    pairs = enumerate(zip(cases, outcomes, strict=True))
    bad = [f"#{i} {kind}: {o.kind}: {o.first_line}" for i, ((kind, _), o) in pairs if o.bad]
    assert not bad, "\n".join(bad)
    assert collections.Counter(o.kind for o in outcomes)["user_error"] > 0


@pytest.mark.parametrize("where", LAYOUTS)
def test_every_layout_of_a_valid_model_ends_well(where):
    """The output beside the input, in another folder (the input's folder then removed) or over the input,
    from a model in one file or with external data: the output loads on its own and passes the checker."""
    for name in ("mlp", "light_squeezenet"):
        assert run_case_inprocess(dict(base_models())[name], layout=where).kind == "ok", (name, where)


def test_layouts_cover_every_kind_and_are_seeded():
    assert layout(1, 5) == layout(1, 5)
    assert {layout(1, i) for i in range(200)} == set(LAYOUTS)


def test_mutants_are_deterministic_by_seed():
    assert list(mutants(7, 20)) == list(mutants(7, 20))
    assert list(mutants(7, 20)) != list(mutants(8, 20))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_changes_the_model(kind):
    originals = {name: data for name, data in base_models()}
    for i in range(5):
        k, base, data = mutant(3, i, kind)
        assert k == kind
        assert data != originals[base]


def test_runner_classifies_ok_and_user_error():
    good = dict(base_models())["mlp"]
    assert run_case(good, timeout=60).kind == "ok"
    assert run_case(b"not a model", timeout=60).kind == "user_error"
    assert run_case_inprocess(good).kind == "ok"
    assert run_case_inprocess(good[:10]).kind == "user_error"
    assert run_case_forked(good, timeout=60).kind == "ok"
    assert run_case_forked(b"not a model", timeout=60).kind == "user_error"


def _abort(argv):
    os.abort()


def _sleep(argv):
    time.sleep(30)


def _raise(argv):
    raise RuntimeError("boom")


def _internal(argv):
    print("dlcc: internal error: something", file=sys.stderr)
    return 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this OS")
@pytest.mark.parametrize("main,kind", [(_abort, "crash"), (_sleep, "hang"), (_raise, "traceback"),
                                       (_internal, "internal_error")])
def test_forked_runner_reports_what_went_wrong(monkeypatch, main, kind):
    """The forked child runs whatever ``dlcc.cli.main`` is: a stand-in that aborts, hangs, raises or reports
    an internal error must come back as that outcome, and the fuzzer must live on."""
    from dlcc import cli

    monkeypatch.setattr(cli, "main", main)
    t0 = time.monotonic()
    out = run_case_forked(b"irrelevant", timeout=1.0)
    assert out.kind == kind, out
    assert time.monotonic() - t0 < 10
    if kind == "traceback":
        assert "RuntimeError: boom" in out.stderr


# ------------------------------------------------------------------------------------- regression tests


def _model_with(tensor: onnx.TensorProto) -> onnx.ModelProto:
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4] x) => (float[4] y) { y = Add(x, w) }
    """)
    m.graph.initializer.append(tensor)
    return m


def test_raw_data_longer_than_dims_is_a_load_error():
    # fuzz seed 0 #62 (raw_data_mismatch): reading the tensor failed inside a pass with a numpy ValueError
    t = onnx.TensorProto(name="w", dims=[4], data_type=onnx.TensorProto.FLOAT,
                         raw_data=np.zeros(5, np.float32).tobytes())
    with pytest.raises(ModelLoadError, match="'w' declares dims \\[4\\].*holds 20 bytes"):
        dlcc.load(_model_with(t).SerializeToString())


def test_raw_data_shorter_than_dims_is_a_load_error():
    t = onnx.TensorProto(name="w", dims=[4], data_type=onnx.TensorProto.FLOAT, raw_data=b"\0" * 6)
    with pytest.raises(ModelLoadError, match="raw_data holds 6 bytes"):
        dlcc.load(_model_with(t).SerializeToString())


def test_typed_data_count_mismatch_and_negative_dims_are_load_errors():
    t = onnx.TensorProto(name="w", dims=[4], data_type=onnx.TensorProto.FLOAT, float_data=[1.0, 2.0])
    with pytest.raises(ModelLoadError, match="holds 2 value"):
        dlcc.load(_model_with(t).SerializeToString())
    t = onnx.TensorProto(name="w", dims=[-4], data_type=onnx.TensorProto.FLOAT)
    with pytest.raises(ModelLoadError, match="negative dimension"):
        dlcc.load(_model_with(t).SerializeToString())


def test_initializer_input_whose_declared_shape_differs_is_a_load_error():
    # fuzz seed 0 #573 (bad_dim on light squeezenet): a legacy initializer-as-input declared [2**40] while its
    # initializer is [64]; a pass then built a value with no dtype and saving failed with a SerdeError
    m = onnx.parser.parse_model("""
    <ir_version: 3, opset_import: ["" : 9]>
    g (float[4] x, float[1099511627776] w) => (float[4] y) { y = Add(x, w) }
    """)
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(4, np.float32), "w"))
    with pytest.raises(ModelLoadError, match="graph input 'w' is declared with dims \\[1099511627776\\]"):
        dlcc.load(m.SerializeToString())
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 4
    dlcc.load(m.SerializeToString())  # a matching declaration still loads


def test_a_mutant_onnx_cannot_externalize_is_written_as_it_is(tmp_path):
    """A tensor name that is not UTF-8 (fuzz seed 0: onnx's external-data writer refuses it) leaves the
    external layouts' input as the mutant itself, with no data file beside it."""
    from dlcc.testing.fuzz import _externalized

    m = onnx.load_from_string(dict(base_models())["mlp"])
    name = m.graph.initializer[0].name
    data = m.SerializeToString().replace(name.encode(), b"\xff\xfe" + name.encode()[2:])
    assert _externalized(data, tmp_path) == data
    assert list(tmp_path.iterdir()) == []
    assert run_case_inprocess(data, layout="other/external").kind in ("ok", "user_error")
