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



def _ort_all(m, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_silu_is_one_call_and_matches_onnxruntime():
    """Mul(x, Sigmoid(x)) in either order compiles to dlcc_siluf (codegen/vmath.py); a Sigmoid that is also an
    output keeps its own expression. Special values as x * sigmoid(x): NaN for -inf and NaN, inf for inf."""
    import dlcc

    x = np.linspace(-120, 40, 4001, dtype=np.float32)
    specials = np.array([np.nan, -np.inf, np.inf, -0.0, 1e30, -1e30], np.float32)
    n = x.size + specials.size
    for body in ("s = Sigmoid(x)\n z = Mul(x, s)", "s = Sigmoid(x)\n z = Mul(s, x)"):
        m = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{n}] x) => (float[{n}] z) {{ {body} }}""")
        cm = dlcc.compile(m.SerializeToString(), threads=1)
        assert "dlcc_siluf(" in cm.artifacts.csource.source
        feeds = {"x": np.concatenate([x, specials])}
        got, ref = cm(feeds)["z"], _ort(m, feeds)
        _close(got[:x.size], ref[:x.size])
        assert np.isnan(got[-6]) and np.isnan(got[-5]) and got[-4] == np.inf and got[-3] == 0.0
        assert got[-2] == np.float32(1e30) and got[-1] == 0.0
    m = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[{x.size}] x) => (float[{x.size}] z, float[{x.size}] s) {{ s = Sigmoid(x)\n z = Mul(x, s) }}""")
    cm = dlcc.compile(m.SerializeToString(), threads=1)
    got = cm({"x": x})
    ref_z, ref_s = _ort_all(m, {"x": x})
    _close(got["z"], ref_z)
    _close(got["s"], ref_s)
