"""Models declaring tensors far larger than memory are refused, before anything of that size is allocated.

ConstantOfShape / Expand / Tile / Range to terabyte shapes, a shape whose element count overflows 64
bits, a graph input with huge dims: `dlcc optimize` exits 2 with one line naming the value, its shape and
size, no traceback and no output file; `dlcc.compile` raises a ShapeError (a DlccError) the same way. A
generated tensor whose shape inference only learns after folding (an Expand of a folded shape) is not
evaluated by constant folding to find out. Each run is also bounded by RLIMIT_AS (4 GiB) in the child, so
an attempt to allocate would fail the test rather than the machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import dlcc
from dlcc.errors import DlccError, ShapeError
from dlcc.frontend.sizes import MAX_TENSOR_BYTES, max_tensor_bytes

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'

MODELS = {
    "constant_of_shape": """
g (float[1] x) => (float[1000000,1000000] y) {
    s = Constant <value = int64[2] {1000000, 1000000}> ()
    c = ConstantOfShape <value = float[1] {1.0}> (s)
    y = Add(c, x)
}""",
    "reduced_generator": """
g (float[1] x) => (float[1] y) {
    s = Constant <value = int64[2] {1000000, 1000000}> ()
    c = ConstantOfShape <value = float[1] {1.0}> (s)
    k = Constant <value = float[1] {2.0}> ()
    d = Mul(c, k)
    r = ReduceSum <keepdims = 0> (d)
    y = Add(r, x)
}""",
    "expand": """
g (float[1] x) => (float[1] y) {
    s = Constant <value = int64[3] {100000, 100000, 100}> ()
    k = Constant <value = float[1] {2.0}> ()
    e = Expand(k, s)
    r = ReduceSum <keepdims = 0> (e)
    y = Add(r, x)
}""",
    "tile": """
g (float[1] x) => (float[1] y) {
    k = Constant <value = float[1,1] {2.0}> ()
    reps = Constant <value = int64[2] {1000000, 1000000}> ()
    t = Tile(k, reps)
    r = ReduceSum <keepdims = 0> (t)
    y = Add(r, x)
}""",
    "range": """
g (float[1] x) => (float[1] y) {
    a = Constant <value = float {0.0}> ()
    b = Constant <value = float {1e12}> ()
    d = Constant <value = float {1.0}> ()
    r = Range(a, b, d)
    s = ReduceSum <keepdims = 1> (r)
    y = Add(s, x)
}""",
    # the shape is known only once Floor/Sqrt/Mul/Cast are folded: folding must not evaluate the Expand
    "expand_of_folded_shape": """
g (float[1] x) => (float[1] y) {
    s0 = Constant <value = float[2] {100000, 100000}> ()
    f = Floor(s0)
    q = Sqrt(f)
    h = Mul(q, q)
    s = Cast <to = 7> (h)
    k = Constant <value = float[1] {2.0}> ()
    e = Expand(k, s)
    r = ReduceSum <keepdims = 0> (e)
    y = Add(r, x)
}""",
    "overflow_64_bits": """
g (float[1] x) => (float[1] y) {
    s = Constant <value = int64[4] {100000000, 100000000, 100000000, 100000000}> ()
    c = ConstantOfShape <value = float[1] {1.0}> (s)
    r = ReduceSum <keepdims = 0> (c)
    y = Add(r, x)
}""",
    "huge_input": """
g (float[1000000,1000000] x) => (float[1000000,1000000] y) {
    y = Relu(x)
}""",
}

# what the message must name, per model
EXPECT = {
    "constant_of_shape": ("'c'", "[1000000, 1000000]", "TiB"),
    "reduced_generator": ("'c'", "[1000000, 1000000]", "TiB"),
    "expand": ("'e'", "[100000, 100000, 100]", "TiB"),
    "tile": ("'t'", "[1000000, 1000000]", "TiB"),
    "range": ("'r'", "TiB"),
    "expand_of_folded_shape": ("'e'", "GiB"),
    "overflow_64_bits": ("'c'", "64 bits"),
    "huge_input": ("input 'x'", "[1000000, 1000000]", "TiB"),
}

# the child's address space is capped, so an attempt to materialize a huge tensor fails loudly here
_LIMITED = ("import resource, runpy, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
            "sys.argv = ['dlcc'] + sys.argv[1:]\n"
            "runpy.run_module('dlcc.cli', run_name='__main__')\n")


def _model(name: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(HEADER + MODELS[name])


def test_limit() -> None:
    assert 0 < max_tensor_bytes() <= MAX_TENSOR_BYTES == 1 << 34


@pytest.mark.parametrize("name", MODELS)
def test_optimize_refuses(name: str, tmp_path: Path) -> None:
    src, out = tmp_path / "huge.onnx", tmp_path / "out.onnx"
    onnx.save(_model(name), src)
    proc = subprocess.run([sys.executable, "-c", _LIMITED, "optimize", str(src), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlcc: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for part in EXPECT[name]:
        assert part in lines[0], lines[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["huge.onnx"]


@pytest.mark.parametrize("name", ["constant_of_shape", "tile", "overflow_64_bits", "huge_input"])
def test_compile_refuses(name: str) -> None:
    with pytest.raises(ShapeError) as e:
        dlcc.compile(_model(name))
    for part in EXPECT[name]:
        assert part in str(e.value), str(e.value)


def test_compile_refuses_input_shape_override() -> None:
    m = onnx.parser.parse_model(HEADER + "g (float[N,8] x) => (float[N,8] y) { y = Relu(x) }")
    with pytest.raises(DlccError, match=r"input 'x' has shape \[100000000000, 8\]"):
        dlcc.compile(m, input_shapes={"x": [10**11, 8]})


def test_compile_refuses_total(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights and the arena are judged together: every tensor fits the limit, their sum does not."""
    import dlcc.frontend.sizes as sizes

    m = onnx.parser.parse_model(HEADER + """
g (float[64,64] x) => (float[64,64] y) {
    h = MatMul(x, w1)
    r = Relu(h)
    y = MatMul(r, w2)
}""")
    rng = np.random.default_rng(0)
    for name in ("w1", "w2"):
        m.graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal((64, 64), np.float32), name))
    monkeypatch.setattr(sizes, "max_tensor_bytes", lambda: 3 * 64 * 64 * 4)
    with pytest.raises(ShapeError, match="above the limit"):
        dlcc.compile(m)


def test_below_the_limit_still_compiles() -> None:
    small = onnx.parser.parse_model(HEADER + """
g (float[1] x) => (float[1] y) {
    s = Constant <value = int64[2] {64, 64}> ()
    k = Constant <value = float[1] {2.0}> ()
    e = Expand(k, s)
    r = ReduceSum <keepdims = 0> (e)
    y = Add(r, x)
}""")
    cm = dlcc.compile(small)
    got = cm(x=np.ones(1, np.float32))
    np.testing.assert_allclose(next(iter(got.values())), [2.0 * 64 * 64 + 1])


def test_fold_does_not_evaluate_a_generator_to_learn_its_size() -> None:
    """Expand/Tile/Range/ConstantOfShape whose output shape is unknown when folded (its shape input was
    folded in the same sweep) are sized from their inputs' values, not by evaluating them."""
    from dlcc.passes.fold import ConstantFolding

    text = MODELS["expand_of_folded_shape"].replace("100000, 100000", "10000, 10000")  # 400 MB
    model = dlcc.load(onnx.parser.parse_model(HEADER + text))
    fold = ConstantFolding()
    evaluated = []
    run = fold._evaluator.run

    def spy(node, opset, args):
        evaluated.append(node.op_type)
        return run(node, opset, args)

    fold._evaluator.run = spy
    fold.run(model)
    assert "Floor" in evaluated and "Expand" not in evaluated, evaluated
    assert [n.op_type for n in model.graph if n.op_type == "Expand"] == ["Expand"]  # kept as a generator
