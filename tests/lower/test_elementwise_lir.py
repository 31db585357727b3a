"""The loop nest of elementwise/injective steps and copies (``schedule.elementwise.map_func``): every index
handed to the epilogue once, with the opaque input's element at that index, threads or not."""

import numpy as np
import pytest

from dlcc.lower.lir import print_func, run_func, verify_func
from dlcc.schedule.elementwise import map_func


@pytest.mark.parametrize("shape,threads", [((2, 3, 4), 1), ((1, 37, 5), 2), ((1, 1, 1), 2), ((300,), 2), ((), 1)])
def test_map_func_hands_every_element_on_once(shape, threads):
    f = map_func(shape, "float32", threads)
    _every_element_once(f, shape)
    assert ("parallel" in print_func(f)) == (threads > 1 and np.prod(shape) > 1)


def _every_element_once(f, shape):
    """``f`` verifies, and hands each element of an array of ``shape`` to the epilogue once, unchanged."""
    verify_func(f)
    src = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out = np.full(shape, np.nan, np.float32)
    seen = []

    def epilogue(i, v):
        seen.append(i)
        out[tuple(i)] = v

    run_func(f, {}, epilogue, inputs={0: src})
    np.testing.assert_array_equal(out, src)
    assert len(seen) == len(set(seen)) == src.size


def test_map_func_takes_stored_element_types():
    verify_func(map_func((4, 4), "uint8"))


@pytest.mark.parametrize("shape,tile,threads", [
    ((1, 56, 56, 96), (2, 16, True), 1),  # NCHW -> NHWC: reads inner
    ((1, 96, 56, 56), (1, 16, False), 2),  # NHWC -> NCHW: writes inner, threads over channel blocks
    ((2, 20, 7, 37), (1, 16, False), 2),  # partial tiles on both axes, threads over images
    ((9, 33), (0, 16, True), 2),
])
def test_tiled_map_hands_every_element_on_once(shape, tile, threads):
    """A transposing step's nest (two axes blocked into tiles, module docstring of schedule.elementwise)."""
    _every_element_once(map_func(shape, "float32", threads, tile=tile), shape)


@pytest.mark.parametrize("perm,shape", [((0, 2, 3, 1), (1, 40, 19, 23)), ((0, 3, 1, 2), (2, 19, 23, 40))])
def test_transposing_steps_match_onnxruntime(perm, shape):
    """ConvNeXt's layer scale and residual around a layout change: Mul -> Transpose -> Add, tiled."""
    import onnx
    from onnx import TensorProto, helper

    import dlcc
    from dlcc.testing.harness import assert_close, ort_output

    rng = np.random.default_rng(2)
    out_shape = [shape[p] for p in perm]
    gamma = onnx.numpy_helper.from_array(rng.standard_normal(shape[-1]).astype(np.float32), "g")
    nodes = [helper.make_node("Mul", ["x", "g"], ["m"]), helper.make_node("Transpose", ["m"], ["t"], perm=list(perm)),
             helper.make_node("Add", ["t", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)),
                                           helper.make_tensor_value_info("r", TensorProto.FLOAT, out_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], [gamma])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "r": rng.standard_normal(out_shape).astype(np.float32)}
    ref = ort_output(m, feeds)
    for threads in (1, 2):
        cm = dlcc.compile(m, threads=threads)
        assert_close(cm(feeds)["y"], ref, 1e-6, 1e-6)
        assert "for ti" in "".join(s.loop_ir for k in cm.artifacts.program.kernels for s in k.steps)  # (tiled)
