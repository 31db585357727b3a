"""The standalone bundle: `dlcc compile MODEL -o DIR`, `make -C DIR`, the driver's I/O, `dlcc run`."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import onnx
import pytest

from dlcc.check import diff, random_inputs, run_ort
from dlcc.cli import main
from dlcc.testing import KIT_MODELS, LIGHT_MODELS, light_model
from dlcc.testing.randomize import randomize

needs_make = pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None,
                                reason="needs make and cc")
RTOL, ATOL = 1e-4, 1e-6  # as in test_compile.py: level-3 folding and another summation order


def _run_bundle(model: onnx.ModelProto, tmp_path, name: str) -> None:
    src = tmp_path / f"{name}.onnx"
    onnx.save(model, src)
    out = tmp_path / f"{name}-bundle"
    assert main(["compile", str(src), "-o", str(out), "--build"]) == 0
    for f in ("model.c", "model.h", "main.c", "weights.bin", "Makefile", "model.json", "model"):
        assert (out / f).exists(), f
    manifest = json.loads((out / "model.json").read_text())
    feeds = random_inputs(model, seed=4)
    files = []
    for i, spec in enumerate(manifest["inputs"]):
        p = tmp_path / f"in{i}.npy"
        np.save(p, feeds[spec["name"]])
        files.append(str(p))
    proc = subprocess.run([str(out / "model"), "-q", "-o", str(tmp_path), *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ref = run_ort(model, feeds)
    for spec in manifest["outputs"]:
        got = np.load(tmp_path / spec["file"])
        d = diff(spec["name"], ref[spec["name"]], got, rtol=RTOL, atol=ATOL)
        assert d.ok, d.reason


@needs_make
@pytest.mark.parametrize("name", ["mlp", "residual_proj", "transformer_encoder", "transformer_encoder_where"])
def test_kit_bundles_build_with_make_and_match(name, tmp_path) -> None:
    _run_bundle(randomize(KIT_MODELS[name](), seed=0), tmp_path, name)


@needs_make
@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_bundles_build_with_make_and_match(name, tmp_path) -> None:
    _run_bundle(light_model(name, seed=0), tmp_path, name)


@needs_make
def test_driver_checks_inputs_and_times(tmp_path) -> None:
    model = randomize(KIT_MODELS["mlp"](), seed=0)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    out = tmp_path / "b"
    assert main(["compile", str(src), "-o", str(out), "--build"]) == 0
    x = random_inputs(model, seed=0)["x"]
    bad = tmp_path / "bad.npy"
    np.save(bad, x[:1])
    proc = subprocess.run([str(out / "model"), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "shape" in proc.stderr
    np.save(bad, x.astype(np.float64))
    proc = subprocess.run([str(out / "model"), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "dtype" in proc.stderr
    raw = tmp_path / "x.raw"
    x.tofile(raw)
    proc = subprocess.run([str(out / "model"), "-n", "3", "-o", str(tmp_path), str(raw)], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "latency: mean" in proc.stdout
    ref = run_ort(model, {"x": x})
    got = np.load(tmp_path / "output0.npy")
    assert diff("y", next(iter(ref.values())), got, rtol=RTOL, atol=ATOL).ok
    proc = subprocess.run([str(out / "model")], capture_output=True, text=True)
    assert proc.returncode == 2 and "input" in proc.stderr


@needs_make
def test_cli_run_bundle_and_model_compare_with_onnxruntime(tmp_path, capsys) -> None:
    model = randomize(KIT_MODELS["residual"](), seed=0)
    src = tmp_path / "r.onnx"
    onnx.save(model, src)
    out = tmp_path / "rb"
    assert main(["compile", str(src), "-o", str(out)]) == 0
    assert main(["run", str(out), "--compare-ort", "--bench", "2"]) == 0
    assert main(["run", str(src), "--compare-ort", "--bench", "2", "--save", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "onnxruntime latency" in err and "dlcc latency" in err
    assert (tmp_path / "output0.npy").exists()


def test_compile_refuses_to_overwrite_a_folder_that_is_not_a_bundle(tmp_path, capsys, small_path) -> None:
    other = tmp_path / "precious"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert main(["compile", str(small_path), "-o", str(other), "--input-shape", "x=2,4"]) == 2
    assert (other / "notes.txt").read_text() == "keep me"
    assert "not a dlcc bundle" in capsys.readouterr().err
    out = tmp_path / "b"
    assert main(["compile", str(small_path), "-o", str(out), "--input-shape", "x=2,4"]) == 0
    assert main(["compile", str(small_path), "-o", str(out), "--input-shape", "x=3,4"]) == 0  # a bundle: replaced
    assert json.loads((out / "model.json").read_text())["inputs"][0]["shape"] == [3, 4]
    assert main(["compile", str(small_path), "-o", str(tmp_path / "missing" / "b"), "--input-shape", "x=2,4"]) == 2


def test_compile_errors_are_one_line(tmp_path, capsys, small_path) -> None:
    assert main(["compile", str(small_path), "-o", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "symbolic" in err and "--input-shape" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()
    assert main(["run", str(tmp_path / "nothing.onnx")]) == 2


def _elf_header(machine: int) -> bytes:
    """The first 64 bytes of a 64-bit little-endian ELF executable for ``machine`` (e_machine)."""
    return (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + (2).to_bytes(2, "little") + machine.to_bytes(2, "little")
            + b"\0" * 44)


@pytest.mark.parametrize("binary", ["aarch64", "riscv64", "not-elf"])
def test_run_a_bundle_built_for_another_machine_says_how_to_rebuild(tmp_path, capsys, small_path, binary) -> None:
    from dlcc.schedule.target import host_arch

    out = tmp_path / "b"
    assert main(["compile", str(small_path), "-o", str(out), "--input-shape", "x=2,4"]) == 0
    machine = {"aarch64": 183, "riscv64": 243}.get(binary)
    if machine is not None and host_arch() == binary:
        pytest.skip(f"this machine is {binary}")
    exe = out / "model"
    exe.write_bytes(_elf_header(machine) if machine else b"\x00\x01binary of some other format\n")
    exe.chmod(0o755)
    capsys.readouterr()
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    assert f"make -C {out}" in err
    assert (f"built for {binary}" if machine else "not an executable for this machine") in err


def test_compile_dumps_the_kernel_ir(tmp_path, small_path) -> None:
    out, dump = tmp_path / "b", tmp_path / "kir.txt"
    assert main(["compile", str(small_path), "-o", str(out), "--input-shape", "x=2,4", "--dump-kernel-ir",
                 str(dump)]) == 0
    text = dump.read_text()
    assert text.startswith("program: 1 kernels") and "template(Gemm) [Gemm+Relu]" in text and "output" in text


def test_compile_prints_and_dumps_every_backend_stage(tmp_path, capsys) -> None:
    """--print-after STAGE and --dump-dir reach every backend stage, the loop IR of codegen included."""
    from dlcc.compiler import BACKEND
    from dlcc.testing.models import mlp

    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(batch=4, in_features=64, hidden=(64,), out_features=16), model)
    dump = tmp_path / "ir"
    capsys.readouterr()
    assert main(["compile", str(model), "-o", str(tmp_path / "b"), "--dump-dir", str(dump), "--print-after",
                 "schedule"]) == 0
    out = capsys.readouterr().out
    assert "after backend stage schedule" in out and "program:" in out
    files = sorted(p.name for p in dump.iterdir())
    assert files == [f"{i:02d}-{name}.txt" for i, (name, _) in enumerate(BACKEND)]
    codegen = (dump / files[-1]).read_text()
    assert "micro gemm" in codegen and "workspace" in codegen  # the packed GEMM's loop IR (gemm_ or gemmr_ tiles)
    assert "fusion plan" in (dump / "02-fusion.txt").read_text()
    with pytest.raises(SystemExit) as e:  # (argparse: a usage error, exit 2)
        main(["compile", str(model), "-o", str(tmp_path / "c"), "--print-after", "nonsense"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err
