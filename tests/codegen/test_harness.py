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


def _kernels(cm) -> str:
    """The generated C from the first kernel on (the helpers before it define every vmath function)."""
    src = cm.artifacts.csource.source
    return src[src.index("/* kernel 0:"):]


def test_one_plus_erf_and_tanh_are_one_call_and_match_onnxruntime():
    """Add(Erf(x), 1) and Add(Tanh(x), 1), either order (GELU's factor in its two exported forms), compile to
    dlcc_erf1pf / dlcc_tanh1pf (codegen/vmath.py); Add(Erf(x), 2) and an Erf that is also an output keep their
    own expressions. Whole GELUs match onnxruntime within rtol 1e-5 of the output's scale; NaN passes."""
    import dlcc

    x = np.concatenate([np.linspace(-12, 12, 4001, dtype=np.float32), np.array([np.nan, np.inf, -np.inf], np.float32)])
    n = x.size
    for fn, body in (("dlcc_erf1pf", "e = Erf(h)\n o = Add(e, one)"), ("dlcc_erf1pf", "e = Erf(h)\n o = Add(one, e)"),
                     ("dlcc_tanh1pf", "e = Tanh(h)\n o = Add(e, one)")):
        m = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{n}] x) => (float[{n}] z) {{
            one = Constant <value = float {{1.0}}> ()
            k = Constant <value = float {{0.70710678}}> ()
            h = Mul(x, k)
            {body}
            z = Mul(x, o)
        }}""")
        cm = dlcc.compile(m.SerializeToString(), threads=1)
        assert f"{fn}(" in _kernels(cm), fn
        got, ref = cm({"x": x})["z"], _ort(m, {"x": x})
        _close(got[:-3], ref[:-3])
        assert np.isnan(got[-3]) and got[-2] == np.inf and np.isnan(got[-1])  # (-inf * 0 is NaN, as in onnxruntime)
        assert np.isnan(ref[-1])
    for outputs, body in (("float[{n}] z", "e = Erf(x)\n z = Add(e, two)"),
                          ("float[{n}] z, float[{n}] e", "e = Erf(x)\n z = Add(e, one)")):
        m = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{n}] x) => ({outputs.format(n=n)}) {{
            one = Constant <value = float {{1.0}}> ()
            two = Constant <value = float {{2.0}}> ()
            {body}
        }}""")
        cm = dlcc.compile(m.SerializeToString(), threads=1)
        xf = np.concatenate([x[:-3], np.array([0.5, 1.5, -2.5], np.float32)])  # (finite: assert_close's max)
        got, ref = cm({"x": xf}), _ort_all(m, {"x": xf})
        for g, r in zip(got.values(), ref, strict=True):
            _close(g, r)
        if "two" in body:
            assert "dlcc_erf1pf(" not in _kernels(cm)
