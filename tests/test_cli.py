"""The dlcc CLI: commands work, bad input is one line + exit 2 + no output file, check exits 1 on mismatch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest

import dlcc
from conftest import small_model

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"


def _one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("dlcc: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err


def test_version_and_help(cli) -> None:
    with pytest.raises(SystemExit) as e:
        cli("--version")
    assert e.value.code == 0
    for cmd in ("optimize", "check", "inspect"):
        with pytest.raises(SystemExit) as e:
            cli(cmd, "--help")
        assert e.value.code == 0


def test_optimize_and_check_small(cli, small_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    code, _, err = cli("optimize", small_path, out, "--level", "1", "--stats", "--input-shape", "x=5,4")
    assert code == 0, err
    onnx.checker.check_model(str(out), full_check=True)
    assert [d.dim_value for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim] == [5, 4]
    code, stdout, err = cli("check", small_path, out, "--input-shape", "x=5,4")
    assert code == 0, err
    assert "ok" in stdout and "check passed" in err


def test_check_detects_mismatch(cli, small_path: Path, tmp_path: Path) -> None:
    m = small_model()
    w = m.graph.initializer[0]
    arr = onnx.numpy_helper.to_array(w) * 1.01
    w.CopyFrom(onnx.numpy_helper.from_array(arr, "w"))
    other = tmp_path / "other.onnx"
    onnx.save(m, other)
    code, stdout, err = cli("check", small_path, other)
    assert code == 1
    assert "MISMATCH" in stdout and "check failed" in err
    # a looser tolerance accepts it
    code, _, _ = cli("check", small_path, other, "--rtol", "0.1")
    assert code == 0


def test_check_with_npy_inputs(cli, small_path: Path, tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 4), np.float32))
    code, stdout, err = cli("check", small_path, small_path, "--input", f"x={x}")
    assert code == 0, err
    assert "2x3" in stdout
    code, _, err = cli("check", small_path, small_path, "--input", f"nope={x}")
    _one_line_error(code, err)
    code, _, err = cli("check", small_path, small_path, "--input", f"x={tmp_path / 'missing.npy'}")
    _one_line_error(code, err)


@pytest.mark.parametrize("name", ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                                  "shufflenet", "squeezenet", "vgg19", "zfnet512"])
def test_level0_round_trip_light(cli, tmp_path: Path, name: str) -> None:
    src = LIGHT / f"light_{name}.onnx"
    out = tmp_path / f"{name}.onnx"
    code, _, err = cli("optimize", src, out, "--level", "0")
    assert code == 0, err
    onnx.checker.check_model(str(out), full_check=True)
    code, _, err = cli("check", src, out, "--rtol", "0", "--atol", "0")
    assert code == 0, err


# ------------------------------------------------------------------------------------------- bad input


def _bad_models(tmp_path: Path) -> dict[str, Path]:
    good = small_model().SerializeToString()
    cases = {}
    (p := tmp_path / "truncated.onnx").write_bytes(good[: len(good) // 2])
    cases["truncated"] = p
    (p := tmp_path / "text.onnx").write_text("hello, I am not a model\n")
    cases["not onnx"] = p
    m = small_model()
    m.graph.node.append(oh.make_node("Frob", ["y"], ["z"], domain="com.example"))
    m.opset_import.append(oh.make_opsetid("com.example", 1))
    onnx.save(m, p := tmp_path / "domain.onnx")
    cases["unknown domain"] = p
    for tag, loc in (("missing external", "weights.bin"), ("external outside", "../weights.bin")):
        folder = tmp_path / tag.replace(" ", "_")
        folder.mkdir()
        m = small_model()
        w = m.graph.initializer[0]
        raw = w.raw_data
        w.ClearField("raw_data")
        w.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", loc), ("offset", "0"), ("length", str(len(raw)))):
            e = w.external_data.add()
            e.key, e.value = k, v
        if tag == "external outside":
            (tmp_path / "weights.bin").write_bytes(raw)
        (p := folder / "model.onnx").write_bytes(m.SerializeToString())
        cases[tag] = p
    cases["missing file"] = tmp_path / "does-not-exist.onnx"
    return cases


@pytest.mark.parametrize("case", ["truncated", "not onnx", "unknown domain", "missing external",
                                  "external outside", "missing file"])
def test_bad_model_is_one_line_exit_2_no_output(cli, tmp_path: Path, case: str) -> None:
    src = _bad_models(tmp_path)[case]
    out = tmp_path / "out.onnx"
    code, _, err = cli("optimize", src, out)
    _one_line_error(code, err)
    assert not out.exists()
    # an existing output is never clobbered by a failed run
    out.write_bytes(b"precious")
    code, _, err = cli("optimize", src, out)
    assert code == 2 and out.read_bytes() == b"precious"
    code, _, err = cli("check", src, src)
    _one_line_error(code, err)
    code, _, err = cli("inspect", src)
    _one_line_error(code, err)


@pytest.mark.parametrize("shape,match", [("nope=1,4", "unknown input 'nope'"), ("x=1,4,4", "rank 3"),
                                         ("x=1,5", "axis 1"), ("x=a,b", "integers")])
def test_bad_input_shape(cli, small_path: Path, tmp_path: Path, shape: str, match: str) -> None:
    out = tmp_path / "out.onnx"
    code, _, err = cli("optimize", small_path, out, "--input-shape", shape)
    _one_line_error(code, err)
    assert match in err
    assert not out.exists()


@pytest.mark.parametrize("out", ["/proc/dlcc-test.onnx", "{tmp}/no/such/folder/out.onnx", "{tmp}"])
def test_unwritable_output(cli, small_path: Path, tmp_path: Path, out: str) -> None:
    code, _, err = cli("optimize", small_path, out.format(tmp=tmp_path))
    _one_line_error(code, err)
    assert not [p for p in tmp_path.rglob(".dlcc-tmp*")]


def test_subprocess_exit_codes_and_no_traceback(small_path: Path, tmp_path: Path) -> None:
    """the installed console script behaves the same as the in-process main"""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = [sys.executable, "-m", "dlcc.cli"]
    r = subprocess.run([*run, "optimize", bad, tmp_path / "o.onnx"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = subprocess.run([*run, "optimize", small_path, tmp_path / "o.onnx"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert [n.op_type for n in dlcc.load(tmp_path / "o.onnx").graph] == ["Gemm", "Relu"]  # MatMul+Add fused


@pytest.mark.parametrize("planner", ["auto", "tvm", "dnnfusion"])
def test_inspect_fusion(cli, tmp_path: Path, planner: str) -> None:
    from dlcc.testing import KIT_MODELS, randomize

    src = tmp_path / "res.onnx"
    onnx.save(randomize(KIT_MODELS["residual"](), seed=0), src)
    code, out, err = cli("inspect", src, "--fusion", planner)
    assert code == 0, err
    assert "fusion groups" in out and "kernels" in out
    code, out, err = cli("inspect", src, "--fusion", planner, "--json")
    import json

    fusion = json.loads(out)["fusion"]
    assert fusion["kernels"] < fusion["nodes"] and fusion["bytes_moved_after"] < fusion["bytes_moved_before"]
    assert planner == "auto" or fusion["planner"] == planner


def test_report_and_emit_groups(cli, tmp_path: Path) -> None:
    from dlcc.testing import KIT_MODELS, randomize

    src = tmp_path / "res.onnx"
    onnx.save(randomize(KIT_MODELS["residual_proj"](), seed=0), src)
    page = tmp_path / "report.html"
    code, _, err = cli("report", src, "-o", page, "--fusion", "tvm")
    assert code == 0, err
    text = page.read_text()
    assert "<svg" in text and "tvm" in text and "https://" not in text
    out = tmp_path / "groups.onnx"
    code, _, err = cli("optimize", src, out, "--emit-groups")
    assert code == 0, err
    emitted = onnx.load(out)
    assert emitted.functions and all(f.domain == "dlcc.fused" for f in emitted.functions)
    code, _, err = cli("check", src, out)
    assert code == 0, err
    code, _, err = cli("report", src, "-o", tmp_path / "missing" / "r.html")
    _one_line_error(code, err)
