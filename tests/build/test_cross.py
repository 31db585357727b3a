"""A bundle generated for another architecture: C for aarch64 (NEON-width vectors, ARMv8-A flags) generated
on this machine, cross-compiled with Debian's gcc-aarch64-linux-gnu and run under qemu-user, matches
onnxruntime. `.ci/run` installs the two packages when it can; without them the test is skipped, saying so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import onnx
import pytest

from dlcc.check import diff, random_inputs, run_ort
from dlcc.cli import main
from dlcc.schedule.target import host_arch
from dlcc.testing import KIT_MODELS
from dlcc.testing.randomize import randomize

CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
RTOL, ATOL = 1e-4, 1e-6  # as in test_bundle.py: level-3 folding and another summation order


def _missing() -> str | None:
    if host_arch() == "aarch64":
        return "this machine is aarch64: the native bundle tests cover it"
    gone = [tool for tool in (CROSS_CC, QEMU, "make") if shutil.which(tool) is None]
    if gone:
        return (f"needs {', '.join(gone)} (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user; .ci/run "
                "installs them when it runs as root with apt)")
    return None


def _winograd_conv() -> onnx.ModelProto:
    """A 3x3 convolution (16 -> 64 channels, 13x11, bias and ReLU fused) that takes Winograd F(4x4, 3x3) on
    NEON (its micro-kernels run only under qemu on an x86 machine)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    w = onnx.numpy_helper.from_array((rng.standard_normal((64, 16, 3, 3)) / 12).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 13, 11])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 13, 11])], [w, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _expand_depthwise() -> onnx.ModelProto:
    """A 1x1 convolution (8 -> 28 channels, bias and Clip) whose result only a 3x3 depthwise convolution reads:
    fused into one kernel on NEON (``gemmq``-family tiles of 3 vectors, 7 blocks of 4 channels: a partial group)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    arrays = {"we": rng.standard_normal((28, 8, 1, 1)) / 3, "be": rng.standard_normal(28),
              "wd": rng.standard_normal((28, 1, 3, 3)) / 3, "lo": np.array(0.0), "hi": np.array(6.0)}
    inits = [onnx.numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "we", "be"], ["e"]), helper.make_node("Clip", ["e", "lo", "hi"], ["c"]),
             helper.make_node("Conv", ["c", "wd"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=28),
             helper.make_node("Relu", ["d"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 13])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 28, 12, 13])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _nhwc_block() -> onnx.ModelProto:
    """An NHWC input around a depthwise 3x3 (22 channels: 5 blocks of 4, the last partial) and a 5x5 convolution,
    Transposes at both ends: on NEON the channels-last layouts (``schedule.layouts``) remove both, the depthwise
    kernel reads the input channels-last and the 5x5 one writes channels-last (``dconvp_``)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(8)
    arrays = {"wd": rng.standard_normal((22, 1, 3, 3)) / 3, "bd": rng.standard_normal(22),
              "wc": rng.standard_normal((12, 22, 5, 5)) / 20}
    inits = [onnx.numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xc", "wd", "bd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=22),
             helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("Conv", ["r", "wc"], ["c"], kernel_shape=[5, 5], pads=[2] * 4),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10, 9, 22])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10, 9, 12])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _stem_ring() -> onnx.ModelProto:
    """A MobileNet start: a 3x3 stride-2 convolution from 3 channels (Clip), then a 3x3 depthwise one over its 16
    channels (Clip) and a 1x1 projection: on NEON the stem reads the NCHW image where it is (``dconv_..._n``) and
    writes into a buffer with a zero ring, which the depthwise kernel reads in place (``dwc_..._x16``)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(6)
    arrays = {"ws": rng.standard_normal((16, 3, 3, 3)) / 5, "bs": rng.standard_normal(16),
              "wd": rng.standard_normal((16, 1, 3, 3)) / 3, "wp": rng.standard_normal((8, 16, 1, 1)) / 4,
              "lo": np.array(0.0), "hi": np.array(6.0)}
    inits = [onnx.numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "ws", "bs"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("Clip", ["a", "lo", "hi"], ["ac"]),
             helper.make_node("Conv", ["ac", "wd"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=16),
             helper.make_node("Clip", ["d", "lo", "hi"], ["dc"]), helper.make_node("Conv", ["dc", "wp"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 29, 30])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 15, 15])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _bottlenecks() -> onnx.ModelProto:
    """Two ResNet bottlenecks at 32 channels (1x1 to 64, 3x3, 1x1 back, residual add): on NEON the second one's
    3x3 input is stored by its 1x1 in blocks of 4 channels with the zero ring its kernel reads in place
    (``schedule.blocked``)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(9)
    inits, nodes = [], []

    def conv(x, y, co, ci, k, act):
        w = f"w{len(inits)}"
        inits.append(onnx.numpy_helper.from_array((rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k))
                                                  .astype(np.float32), w))
        nodes.append(helper.make_node("Conv", [x, w], [y + "c" if act else y], kernel_shape=[k, k], pads=[k // 2] * 4))
        if act:
            nodes.append(helper.make_node("Relu", [y + "c"], [y]))

    for i in range(2):
        x = "x" if i == 0 else "o0"
        conv(x, f"a{i}", 64, 32, 1, True)
        conv(f"a{i}", f"b{i}", 64, 64, 3, True)
        conv(f"b{i}", f"c{i}", 32, 64, 1, False)
        nodes += [helper.make_node("Add", [f"c{i}", x], [f"s{i}"]),
                  helper.make_node("Relu", [f"s{i}"], ["o0" if i == 0 else "y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 14, 14])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


BUILT = {"winograd": _winograd_conv, "expand_depthwise": _expand_depthwise, "nhwc_block": _nhwc_block,
         "stem_ring": _stem_ring, "bottlenecks": _bottlenecks}


def _bottlenecks_repacks() -> int:
    """The repacking calls in the aarch64 C of ``_bottlenecks`` with the channel blocks switched off."""
    import dlcc.schedule.blocked as blocked
    from dlcc.compiler import build_artifacts

    orig = blocked.BLOCKED
    try:
        blocked.BLOCKED = False
        return build_artifacts(_bottlenecks(), target="aarch64").csource.source.count("dlcc_uk_nchwc_")
    finally:
        blocked.BLOCKED = orig


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
@pytest.mark.parametrize("name", ["residual_proj", "depthwise_separable", "transformer_encoder", "winograd",
                                  "expand_depthwise", "nhwc_block", "stem_ring", "bottlenecks"])
def test_aarch64_bundle_under_qemu_matches_onnxruntime(name, tmp_path, capsys) -> None:
    model = BUILT[name]() if name in BUILT else randomize(KIT_MODELS[name](), seed=0)
    src = tmp_path / f"{name}.onnx"
    onnx.save(model, src)
    out = tmp_path / "b"
    assert main(["compile", str(src), "-o", str(out), "--target", "aarch64", "--build"]) == 0, capsys.readouterr().err
    assert "-march=armv8-a" in (out / "Makefile").read_text()
    kernels = "".join(p.read_text() for p in out.glob("kernels_*.c"))
    assert "vector_size(16)" in kernels
    assert ("dlcc_uk_wgi_4_" in kernels) == (name in ("winograd", "bottlenecks"))
    assert ("dlcc_uk_gemmq" in kernels) == (name == "expand_depthwise")
    if name == "nhwc_block":
        assert "dlcc_uk_dconvp_" in kernels
    if name == "stem_ring":
        assert re.search(r"dlcc_uk_dconvp?_\w+_n870\(", kernels) and "_x16(" in kernels and "zero ring" in kernels
    if name == "bottlenecks":  # (the second 3x3's input in blocks: one repacking fewer, its ring zeroed)
        assert kernels.count("dlcc_uk_nchwc_") < _bottlenecks_repacks() and "zero ring" in kernels
    manifest = json.loads((out / "model.json").read_text())
    assert manifest["target"] == "aarch64"
    feeds = random_inputs(model, seed=1)
    files = []
    for i, spec in enumerate(manifest["inputs"]):
        p = tmp_path / f"in{i}.npy"
        np.save(p, feeds[spec["name"]])
        files.append(str(p))
    proc = subprocess.run([QEMU, "-L", SYSROOT, str(out / "model"), "-q", "-o", str(tmp_path), *files],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ref = run_ort(model, feeds)
    for spec in manifest["outputs"]:
        d = diff(spec["name"], ref[spec["name"]], np.load(tmp_path / spec["file"]), rtol=RTOL, atol=ATOL)
        assert d.ok, d.reason
    capsys.readouterr()
    assert main(["run", str(out)]) == 2  # this machine cannot run it: a clear error, how to rebuild
    assert "built for aarch64" in capsys.readouterr().err


def test_a_model_for_another_architecture_is_not_loaded_in_python(small_path, capsys) -> None:
    import dlcc
    from dlcc.errors import DlccError

    other = "aarch64" if host_arch() != "aarch64" else "x86-64-v3"
    with pytest.raises(DlccError, match="cannot run on this machine"):
        dlcc.compile(str(small_path), input_shapes={"x": [2, 4]}, target=other)
