import numpy as np
import onnx

from dlcc.testing.harness import assert_close, ort_output, run_node

_ort = ort_output


def _close(got, ref, rtol=1e-5, atol=1e-6):
    assert_close(got, ref, rtol, atol)


def test_inline_chain_broadcast():
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3,5] x, float[3,1] y) => (float[2,3,5] z) { z = Add(x, y) }""")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 5), dtype=np.float32), "y": rng.standard_normal((3, 1), dtype=np.float32)}
    _close(run_node(m, feeds), _ort(m, feeds))


def test_inline_unary():
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[7] x) => (float[7] z) { z = Sigmoid(x) }""")
    feeds = {"x": np.linspace(-30, 30, 7, dtype=np.float32)}
    _close(run_node(m, feeds), _ort(m, feeds))
