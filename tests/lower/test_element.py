"""Element expressions in the loop IR (dlcc.lower.element, dlcc.lower.scalar): each scalar function's C against its
numpy reference (the interpreter's), a loop step's element interpreted against onnxruntime, and the verifier
proving a data-dependent index in bounds only where it is clamped."""

from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from dlcc.build.cc import compile_files, compiler, flags_for
from dlcc.codegen.cbase import Names, TensorRef, ctype
from dlcc.codegen.element_c import c_index, ref_buf
from dlcc.codegen.lir_c import c_expr, print_c
from dlcc.errors import PassError
from dlcc.lower.element import ElementGen
from dlcc.lower.lir import (
    CALLS,
    Buf,
    Call,
    Cast,
    Const,
    For,
    Func,
    Layout,
    Let,
    Load,
    Store,
    Var,
    run_func,
    verify_func,
)
from dlcc.lower.scalar import SCALAR_FUNCTIONS
from dlcc.schedule.elementwise import fill_map, map_func
from dlcc.schedule.target import get_target
from dlcc.testing.harness import prelude
from dlcc.util import value_dtype, value_shape

F = np.float32
EDGES = np.array([-np.inf, -1e30, -100.0, -7.5, -3.5, -2.0, -1.0, -0.75, -0.5, -1e-30, -0.0, 0.0, 1e-30, 0.25, 0.5,
                  1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 6.0, 7.5, 20.0, 100.0, 1e30, np.inf, np.nan], dtype=np.float64)
INTS = np.array([-(2**40), -1000, -17, -7, -3, -2, -1, 0, 1, 2, 3, 5, 7, 64, 1000, 2**40], dtype=np.int64)

# name -> (argument dtypes, constant trailing arguments, tolerance: None exact, else rtol (and atol: functions whose
# one-piece approximations keep an absolute accuracy, codegen/vmath.py))
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple, float | None]] = {
    **{n: (("float32",), (), None) for n in ("relu", "softsign", "floor", "ceil", "round", "sign", "neg",
                                              "reciprocal", "abs", "sqrt")},
    **{n: (("float32",), (), 4e-6) for n in ("hardswish", "softplus", "mish", "erf", "exp", "expm1", "log", "log1p",
                                              "tanh", "expneg")},
    **{n: (("float32",), (), (4e-6, 1e-37)) for n in ("sigmoid", "silu")},  # (subnormals in the far tail)
    **{n: (("float32",), (), (4e-6, 1e-6)) for n in ("gelu", "gelu_tanh", "erf1p", "tanh1p", "sin", "cos")},
    "leaky": (("float32",), (F(0.1),), None),
    "elu": (("float32",), (F(1.0),), 4e-6),
    "celu": (("float32",), (F(0.5),), 4e-6),
    "selu": (("float32",), (F(1.6732632), F(1.0507010)), 4e-6),
    "hardsigmoid": (("float32",), (F(0.2), F(0.5)), None),
    **{n: (("float32", "float32"), (), None) for n in ("fmax", "fmin", "fmod", "mod")},
    "fpow": (("float32", "float32"), (), 4e-6),
    "pow": (("float32", "float32"), (), 4e-6),
    "dpow": (("float64", "float64"), (), 1e-12),
    **{n: (("int64", "int64"), (), None) for n in ("max_i", "min_i", "div_i", "mod_i", "fmod_i", "xor")},
    "pow_i": (("int64", "int64"), (), None),
    **{n: (("int64",), (), None) for n in ("abs_i", "sign_i", "not")},
    "f2i64": (("float32",), (), None), "f2i32": (("float32",), (), None),
    "d2i64": (("float64",), (), None), "d2i32": (("float64",), (), None),
    "select": (("int64", "float32", "float32"), (), None),
    **{n: (("int64",), (np.int64(7),), None) for n in ("clamp_idx", "edge_idx", "wrap_idx", "reflect_idx")},
}
OUT = {"f2i64": "int64", "f2i32": "int32", "d2i64": "int64", "d2i32": "int32", "not": "bool", "xor": "bool"}


def test_every_scalar_function_has_a_signature_here():
    assert set(SCALAR_FUNCTIONS) | {"exp", "expm1", "log", "log1p", "tanh", "expneg", "sigmoid", "sqrt", "abs",
                                    "pow"} == set(SIGNATURES) == set(CALLS)


def _inputs(fn: str, dtypes: tuple[str, ...]) -> list[np.ndarray]:
    """Every combination of edge values for the arguments (pairs for two; a small grid for three)."""
    if dtypes == ("int64", "float32", "float32"):
        rng = np.random.default_rng(0)
        n = 64
        return [rng.integers(0, 2, n).astype(np.int64), rng.standard_normal(n).astype(F),
                rng.standard_normal(n).astype(F)]
    base = [INTS if d == "int64" else EDGES.astype(d) for d in dtypes]
    if fn == "expneg":  # (defined for x <= 0: a softmax's x - max)
        base = [EDGES[~(EDGES > 0)].astype(F)]
    if dtypes == ("int64", "int64"):
        base = [INTS, np.array([-7, -3, -2, -1, 0, 1, 2, 3, 5, 7, 13, 62], np.int64)]
    grids = np.meshgrid(*base, indexing="ij")
    return [g.reshape(-1).copy() for g in grids]


def _func(fn: str, dtypes: tuple[str, ...], consts: tuple, n: int) -> Func:
    ins = [Buf(f"x{k}", d, Layout.strided((n,))) for k, d in enumerate(dtypes)]
    out_dtype = OUT.get(fn, "int64" if fn.endswith("_idx") else dtypes[-1] if fn == "select" else dtypes[0])
    y = Buf("y", out_dtype, Layout.strided((n,)))
    i = Var("i")
    args = [Load(b, (i,)) for b in ins] + [Const(c.item(), np.dtype(type(c)).name) for c in consts]
    value = Call(fn, tuple(args), out_dtype if fn in OUT or fn == "select" else "")
    if value.dtype != out_dtype:
        value = Cast(value, out_dtype)
    return Func(f"f_{fn}", (*ins, y), (For(i, Const(0), Const(n), (Store(y, (i,), value),)),))


@pytest.mark.parametrize("fn", sorted(SIGNATURES))
def test_scalar_function_c_matches_its_reference(fn):
    dtypes, consts, rtol = SIGNATURES[fn]
    xs = _inputs(fn, dtypes)
    n = len(xs[0])
    f = _func(fn, dtypes, consts, n)
    verify_func(f)
    y = f.params[-1]
    want = np.zeros(n, y.dtype)
    run_func(f, {**{f"x{k}": x.copy() for k, x in enumerate(xs)}, "y": want})
    target = get_target()
    body, _ = print_c(f, {}, lanes=target.lanes)
    params = ", ".join([*(f"const {ctype(b.dtype)}* restrict {b.name}" for b in f.params[:-1]),
                        f"{ctype(y.dtype)}* restrict y"])
    src = prelude(target) + f"\nvoid k({params}) {{\n{body}\n}}\n"
    got = np.zeros(n, y.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        c, so = Path(tmp, "k.c"), Path(tmp, "k.so")
        c.write_text(src)
        compile_files(compiler(), flags_for(target), [c], so, Path(tmp))
        lib = ctypes.CDLL(str(so))
        lib.k(*[a.ctypes.data_as(ctypes.c_void_p) for a in [*xs, got]])
    if rtol is None:
        np.testing.assert_array_equal(got, want, err_msg=f"{fn} at {[x[got != want] for x in xs]}")
    else:
        rtol, atol = rtol if isinstance(rtol, tuple) else (rtol, 0.0)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _model(nodes, inputs, output, inits=()):
    g = helper.make_graph(nodes, "g", inputs, [output], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_step_element_interprets_like_onnxruntime():
    """Slice -> Resize (linear) -> Add of a Gather -> Pad -> Relu: one element expression, interpreted."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 6, 8)).astype(F)
    ind = np.array([2, 0, -1], np.int64)
    inits = [helper.make_tensor("starts", TensorProto.INT64, [2], [1, 2]),
             helper.make_tensor("ends", TensorProto.INT64, [2], [5, 8]),
             helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3]),
             helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 1.5]),
             helper.make_tensor("pads", TensorProto.INT64, [8], [0, 0, 1, 2, 0, 0, 2, 1])]
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
             helper.make_node("Resize", ["s", "", "scales"], ["r"], mode="linear"),
             helper.make_node("Gather", ["r", "ind"], ["g"], axis=1),
             helper.make_node("Add", ["r", "g"], ["a"]),
             helper.make_node("Pad", ["a", "pads"], ["p"]),
             helper.make_node("Relu", ["p"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                       helper.make_tensor_value_info("ind", TensorProto.INT64, ind.shape)],
               helper.make_tensor_value_info("y", TensorProto.FLOAT, None), inits)
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "ind": ind})[0]
    g = ir.serde.deserialize_model(m).graph
    xv, iv, out = g.inputs[0], g.inputs[1], g.outputs[0]
    bufs = {v: Buf(v.name, value_dtype(v), Layout.strided(value_shape(v))) for v in (xv, iv, out)}
    consts = {v: v.const_value.numpy() for v in g.initializers.values()}
    gen = ElementGen(dict(bufs), consts, Names())

    def element(idx):
        lets: list[Let] = []
        value = gen.compute(out, list(idx), lets)
        return lets, value

    f = fill_map(map_func(value_shape(out), "float32", 2, "step"), bufs[out], element, bufs.values())
    verify_func(f)  # (every load in bounds, the index into the Gather's data clamped)
    got = np.zeros(want.size, F)
    run_func(f, {"x": x.reshape(-1).copy(), "ind": ind.copy(), "y": got})
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
    body, _ = print_c(f, {})
    assert "dlcc_clamp_idx" in body and "static const" in body  # (the Resize's taps as tables)


def test_verifier_needs_a_data_index_clamped():
    x = Buf("x", "float32", Layout.strided((10,)))
    ind = Buf("ind", "int64", Layout.strided((4,)))
    y = Buf("y", "float32", Layout.strided((4,)))
    i = Var("i")

    def func(index):
        return Func("g", (x, ind, y), (For(i, Const(0), Const(4), (Store(y, (i,), Load(x, (index,))),)),))

    with pytest.raises(PassError, match="not an index expression|outside"):
        verify_func(func(Load(ind, (i,))))
    verify_func(func(Call("clamp_idx", (Load(ind, (i,)), Const(10)))))


def test_a_flat_position_split_by_a_template_is_addressed_flat_again():
    """A GEMM-form convolution hands its epilogue pixel p as (p) / W and (p) % W: the address of a residual read
    there is p's again, with no division (which C compilers do not see through, and then do not vectorize)."""
    ptrs = {"r": "r"}
    plain = Buf("r", "float32", Layout.strided((1, 8, 4, 6)))
    idx = [c_index("0"), c_index("c0"), c_index("(p0) / 6"), c_index("(p0) % 6")]
    assert c_expr(Load(plain, tuple(idx)), ptrs) == "r[((c0 * 24) + p0)]"
    last = Buf("r", "float32", Layout.strided((1, 8, 4, 6), (192, 1, 48, 8)))  # channels-last
    assert c_expr(Load(last, tuple(idx)), ptrs) == "r[(c0 + (p0 * 8))]"
    blocked = ref_buf(TensorRef("r", "float32", (1, 32, 4, 6), (768, 24 * 16, 6 * 16, 16), block=16), "r")
    idx[1] = c_index("(kb0)*16 + (o0)")  # (split_channel's form: a Lane)
    assert c_expr(Load(blocked, tuple(idx)), ptrs) == "r[(((kb0 * 384) + o0) + (p0 * 16))]"


@pytest.mark.parametrize("threads", [1, 2])
def test_outputs_copied_from_inputs_and_their_views(threads):
    """Graph outputs that are an input, a reshape of one, or a transposed view's reshape are copy steps (a loop-IR
    nest, verified), with the elements in row-major order."""
    import dlcc
    from dlcc.compiler import build_artifacts

    x = np.arange(2 * 3 * 4 * 5, dtype=F).reshape(2, 3, 4, 5)
    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Reshape", ["x", "shape"], ["b"]),
             helper.make_node("Flatten", ["x"], ["c"], axis=2)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"],
                          [helper.make_tensor("shape", TensorProto.INT64, [3], [6, 5, 4])])
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    c = "".join(build_artifacts(m, threads=threads).csource.files.values())
    assert c.count("/* copy */") == 3
    got = dlcc.compile(m, threads=threads)({"x": x})
    np.testing.assert_array_equal(got["a"], x)
    np.testing.assert_array_equal(got["b"], x.reshape(6, 5, 4))
    np.testing.assert_array_equal(got["c"], x.reshape(6, 20))
