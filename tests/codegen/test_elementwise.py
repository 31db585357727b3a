"""Inline elementwise ops (``ELEMENTWISE`` in dlcc.lower.element, plus BatchNormalization) vs onnxruntime.

One-node models through ``run_node``. Floats: DESIGN tolerance relative to the output's scale (rtol 1e-5,
atol 1e-6) on the finite reference entries; NaN / +-inf must appear at exactly the same places. Integer
and bool outputs: exact.

Special values: inputs carry inf, -inf, NaN, +-0 and halves (Round is half-to-even). Where onnxruntime's
result on them is an implementation detail we pick the IEEE/numpy one and say so next to the case:
- Max/Min/Clip/Relu propagate NaN (numpy ``maximum``/``minimum``/``clip``; onnxruntime agrees).
- Cast float -> int of NaN, +-inf and out-of-range values gives the type's minimum (INT64_MIN / INT32_MIN,
  8-bit targets through int32 then wrapped): what onnxruntime and numpy produce on x86 (cvttss2si's
  "integer indefinite"). The C backend spells that out with defined C instead of an out-of-range cast.
- Integer Div/Mod by zero is undefined in onnxruntime (crash or garbage) and is not tested.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from dlcc.codegen.cbase import TemplateError
from dlcc.lower.element import ELEMENTWISE
from dlcc.lower.lir import Var
from dlcc.testing.harness import ort_output, run_node

F32, I64, I32, BOOL = np.float32, np.int64, np.int32, np.bool_


def _model(op, inputs, attrs=None, *, opset=17, consts=(), outputs=("y",)):
    """``inputs``: arrays (or None for an absent optional input) named i0, i1, ...; indices in ``consts``
    become initializers, the others graph inputs. The output type/shape comes from ONNX shape inference."""
    names, vis, inits, feeds = [], [], [], {}
    for k, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        name = f"i{k}"
        names.append(name)
        if k in consts:
            inits.append(onnx.numpy_helper.from_array(np.asarray(a), name))
        else:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
            feeds[name] = a
    while names and names[-1] == "":
        names.pop()
    node = helper.make_node(op, names, list(outputs), **(attrs or {}))
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    graph = helper.make_graph([node], "g", vis, outs, initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m, strict_mode=True), feeds


_ort = ort_output


def _check(got, ref, rtol=1e-5, atol=1e-6):
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref)
        return
    nan, inf = np.isnan(ref), np.isinf(ref)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg="NaN positions differ")
    np.testing.assert_array_equal(got[inf], ref[inf], err_msg="inf entries differ")
    fin = ~(nan | inf)
    if fin.any():
        err = np.max(np.abs(got[fin].astype(np.float64) - ref[fin]))
        assert err <= rtol * np.max(np.abs(ref[fin])) + atol, f"max error {err}\ngot {got}\nref {ref}"


def _run(op, inputs, attrs=None, *, opset=17, consts=(), rtol=1e-5, ref=None):
    """Compare run_node with onnxruntime (or with ``ref`` where onnxruntime has no kernel)."""
    m, feeds = _model(op, inputs, attrs, opset=opset, consts=consts)
    ref = _ort(m, feeds) if ref is None else ref
    got = run_node(m, feeds)
    _check(got, ref, rtol=rtol)
    return got


def _rand(shape, seed=0, scale=3.0, dtype=F32):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def _ints(shape, lo=-9, hi=10, seed=0, dtype=I64):
    return np.random.default_rng(seed).integers(lo, hi, shape).astype(dtype)


_SPECIAL = [np.inf, -np.inf, np.nan, 0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 1e-3, -30.0, 30.0, 88.0, -100.0]


def _special(shape=(3, 13), seed=0):
    """Random values with the special ones in front (Round halves, overflowing exp, +-inf, NaN, +-0)."""
    x = _rand(shape, seed).reshape(-1)
    x[:len(_SPECIAL)] = _SPECIAL
    return x.reshape(shape)


# ------------------------------------------------------------------------------------------ float unary

_UNARY = [
    ("Sigmoid", {}, 17), ("Tanh", {}, 17), ("Exp", {}, 17), ("Log", {}, 17), ("Sqrt", {}, 17),
    ("Reciprocal", {}, 17), ("Erf", {}, 17), ("Floor", {}, 17), ("Ceil", {}, 17), ("Round", {}, 17),
    ("Softplus", {}, 17), ("Softsign", {}, 17), ("Mish", {}, 18), ("Sin", {}, 17), ("Cos", {}, 17),
    ("HardSwish", {}, 17), ("Identity", {}, 17), ("Dropout", {}, 17), ("Relu", {}, 17), ("Abs", {}, 17),
    ("Neg", {}, 17), ("Sign", {}, 17),
    ("LeakyRelu", {}, 17), ("LeakyRelu", {"alpha": 0.37}, 17), ("LeakyRelu", {"alpha": -1.5}, 17),
    ("Elu", {}, 17), ("Elu", {"alpha": 0.3}, 17),
    ("Celu", {}, 17), ("Celu", {"alpha": 2.5}, 17),
    ("Selu", {}, 17), ("Selu", {"alpha": 1.2, "gamma": 0.7}, 17),
    ("HardSigmoid", {}, 17), ("HardSigmoid", {"alpha": 0.25, "beta": 0.4}, 17),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "none"}, 20), ("Gelu", {"approximate": "tanh"}, 20),
]


@pytest.mark.parametrize("op,attrs,opset", _UNARY, ids=[f"{o}-{'-'.join(map(str, a.values()))}" for o, a, _ in _UNARY])
def test_unary_float(op, attrs, opset):
    _run(op, [_special((3, 13))], attrs, opset=opset)


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 2.4999998, 2.5000002, 1e7 + 0.5, -7.5], F32)
    got = _run("Round", [x])
    np.testing.assert_array_equal(got, np.round(x))


@pytest.mark.parametrize("op", ["Abs", "Neg", "Sign", "Relu", "Identity"])
@pytest.mark.parametrize("dtype", [I64, I32])
def test_unary_int(op, dtype):
    x = _ints((2, 7), -20, 20, dtype=dtype)
    x.reshape(-1)[:3] = [0, -1, np.iinfo(dtype).max]
    # onnxruntime has no integer Relu kernel: numpy is the reference there
    _run(op, [x], opset=14, ref=np.maximum(x, 0) if op == "Relu" else None)


def test_not():
    _run("Not", [_ints((13,), 0, 2).astype(BOOL)])


# ----------------------------------------------------------------------------------------- binary ops

_BIN_FLOAT = ["Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


@pytest.mark.parametrize("op", _BIN_FLOAT)
def test_binary_float(op):
    a, b = _special((2, 13)), _special((2, 13), seed=1)
    b[0, :4] = a[0, :4]          # equal entries for the comparisons
    b[1, :3] = [np.nan, np.inf, 0.0]
    _run(op, [a, b])


@pytest.mark.parametrize("op", _BIN_FLOAT)
@pytest.mark.parametrize("dtype", [I64, I32])
def test_binary_int(op, dtype):
    a = _ints((3, 7), -50, 50, dtype=dtype)
    b = _ints((7,), -9, 10, seed=1, dtype=dtype)
    b[b == 0] = 3                # Div by zero is undefined in onnxruntime
    b[:2] = [-7, 7]
    a[0, :4] = [-7, 7, -14, 13]  # truncating division of negative numbers, exact quotients
    _run(op, [a, b], opset=14)


@pytest.mark.parametrize("op", ["And", "Or", "Xor", "Equal"])
def test_logical(op):
    a = _ints((2, 3, 5), 0, 2).astype(BOOL)
    b = _ints((3, 1), 0, 2, seed=1).astype(BOOL)
    _run(op, [a, b])


# -------------------------------------------------------------------------------------------- broadcasting

_BCAST = [
    ((2, 3, 5), ()),                 # scalar
    ((2, 3, 5, 7), (3, 1, 1)),       # per channel [C,1,1]
    ((2, 3, 5), (5,)),               # leading dims missing
    ((3, 5), (2, 1, 1, 5)),          # leading dims missing on the first input
    ((1, 3, 1, 7), (2, 1, 5, 1)),    # size-1 dims on both sides
    ((13, 1), (1, 13)),
    ((1,), (7,)),
    ((7,), (1,)),
    ((1,), ()),
]


@pytest.mark.parametrize("sa,sb", _BCAST, ids=[f"{a}x{b}" for a, b in _BCAST])
@pytest.mark.parametrize("op", ["Add", "Sub"])
def test_broadcast(op, sa, sb):
    _run(op, [_rand(sa), _rand(sb, seed=1)])


@pytest.mark.parametrize("const", [False, True])
def test_broadcast_const_operand(const):
    _run("Mul", [_rand((2, 3, 13)), _rand((3, 1), seed=1)], consts={1} if const else ())
    _run("Div", [np.array(_rand((), seed=2) + 10, F32), _rand((7, 1, 1), seed=1)], consts={0} if const else ())


# --------------------------------------------------------------------------------------------------- Clip

_CLIP = [
    ("both", (-1.0, 2.0)), ("min_only", (-1.0, None)), ("max_only", (None, 0.5)), ("none", (None, None)),
    ("min_gt_max", (1.0, -1.0)),  # onnxruntime: every output is max
]


@pytest.mark.parametrize("name,bounds", _CLIP, ids=[c[0] for c in _CLIP])
@pytest.mark.parametrize("const", [False, True])
def test_clip(name, bounds, const):
    del name
    x = _special((3, 7))  # NaN stays NaN (numpy.clip, onnxruntime)
    ins = [x] + [None if v is None else np.array(v, F32) for v in bounds]
    _run("Clip", ins, opset=13, consts={1, 2} if const else ())


@pytest.mark.parametrize("attrs", [{"min": -0.5, "max": 1.25}, {"min": 0.0}, {"max": -0.25}, {}])
def test_clip_opset6_attributes(attrs):
    _run("Clip", [_special((2, 13))], attrs, opset=6)


def test_clip_int64():
    _run("Clip", [_ints((13,), -20, 20), np.array(-3, I64), np.array(5, I64)], opset=13)


# ---------------------------------------------------------------------------------------------------- Mod

_MOD_A = np.array([5, -5, 5, -5, 7, -7, 0, 12, -12, 1, -1, 13], I64)
_MOD_B = np.array([3, 3, -3, -3, 7, 2, 5, -5, 5, -13, 13, 4], I64)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [I64, I32])
def test_mod_int(fmod, dtype):
    _run("Mod", [_MOD_A.astype(dtype), _MOD_B.astype(dtype)], {"fmod": fmod}, opset=13)


def test_mod_int_broadcast():
    _run("Mod", [_ints((3, 1, 7), -30, 30), np.array([4, -3], I64).reshape(2, 1)], {"fmod": 0})


def test_mod_float_fmod():
    a = np.concatenate([_MOD_A.astype(F32), [5.5, -5.5, 0.75, -0.0, 1e-3], _rand(7) * 10])
    b = np.concatenate([_MOD_B.astype(F32), [2.0, 2.0, -0.5, 3.0, 0.25], _rand(7, seed=1) + 0.5])
    _run("Mod", [a, b], {"fmod": 1}, opset=13)


def test_mod_float_floor():
    # fmod=0 on floats is defined from opset 28 (before, onnxruntime rejects it)
    a = np.concatenate([_MOD_A.astype(F32), [5.5, -5.5, 0.75, -0.0, 3.0], _rand(7) * 10])
    b = np.concatenate([_MOD_B.astype(F32), [2.0, 2.0, -0.5, 3.0, 1.5], _rand(7, seed=1) + 0.5])
    _run("Mod", [a, b], {"fmod": 0}, opset=28)


# --------------------------------------------------------------------------------------------------- Cast

_FLOATS_FOR_INT = np.array([-1.7, -0.5, -0.0, 0.5, 1.9, 2.5, -2.5, 127.9, 128.5, 255.5, 256.0, -129.0, 300.0,
                            16777217.0, 2147483520.0, -2147483648.0, 3e9, -3e9, 9e18, -9.2233720e18, 1e19,
                            -1e19, np.inf, -np.inf, np.nan], F32)


@pytest.mark.parametrize("to", [I64, I32, BOOL, np.int8, np.uint8, F32])
def test_cast_from_float(to):
    _run("Cast", [_FLOATS_FOR_INT], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(to))})


@pytest.mark.parametrize("to", [I64, I32, F32])
def test_cast_from_float64(to):
    x = np.concatenate([_FLOATS_FOR_INT.astype(np.float64), [2.0**40 + 0.5, -(2.0**53), 1e300, -2147483648.9]])
    _run("Cast", [x], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(to))})


_INTS = np.array([0, 1, -1, 7, -13, 2**24 + 1, 2**31 - 1, -(2**31), 2**31, 2**40 + 5, -(2**40) - 3,
                  2**62 + 2**40 + 1, -(2**63), 2**63 - 1], I64)


@pytest.mark.parametrize("src,to", [
    (I64, F32), (I64, I32), (I64, BOOL), (I64, I64),
    (I32, F32), (I32, I64), (I32, BOOL),
    (BOOL, F32), (BOOL, I64), (BOOL, I32),
])
def test_cast_from_int(src, to):
    x = _INTS.astype(src) if src is not BOOL else np.array([0, 1, 1, 0, 1, 0, 0], BOOL)
    _run("Cast", [x], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(to))}, opset=13)


@pytest.mark.parametrize("to", [onnx.TensorProto.FLOAT16, onnx.TensorProto.STRING, onnx.TensorProto.UINT64])
def test_cast_unsupported_type_raises(to):
    # the harness cannot even declare such an output buffer: call the handler on the node directly
    m, _ = _model("Cast", [_rand((3,))], {"to": to})
    node = next(iter(ir.serde.deserialize_model(m).graph))
    with pytest.raises(TemplateError, match="Cast to"):
        ELEMENTWISE["Cast"](node, [Var("x", "float32")], ["float32"])


# ---------------------------------------------------------------------------------------------------- Pow

def test_pow_float_float():
    a = np.abs(_rand((3, 13))) + 0.01
    b = _rand((3, 13), seed=1, scale=1.0)
    b.reshape(-1)[:6] = [0.5, 2.0, 1.0, 0.0, -1.0, 3.0]
    _run("Pow", [a, b])


def test_pow_float_specials_half():
    # the exponent-0.5 shortcut must keep powf's special cases: pow(-0, .5) = +0, pow(-inf, .5) = +inf
    a = np.array([-np.inf, -0.0, 0.0, 4.0, -4.0, np.inf, np.nan, 2.0], F32)
    _run("Pow", [a, np.array(0.5, F32)], consts={1})


@pytest.mark.parametrize("exp,const", [(2.0, True), (3.0, True), (0.5, True), (-1.0, False), (1.0, True)])
def test_pow_scalar_exponent(exp, const):
    _run("Pow", [_rand((2, 7)) + (3.0 if exp == 0.5 else 0.0), np.array(exp, F32)], consts={1} if const else ())


@pytest.mark.parametrize("etype", [I64, I32])
def test_pow_float_int_exponent(etype):
    a = _rand((13,))
    b = np.array([0, 1, 2, 3, -1, -2, 4, 5, 0, 3, 2, -3, 1], etype)
    _run("Pow", [a, b], opset=15)


@pytest.mark.parametrize("dtype", [I64, I32])
def test_pow_int(dtype):
    a = np.array([2, -1, -1, 1, 2, 0, 3, -2, 5, -3, 7, 1, -1, 10], dtype)
    b = np.array([-1, -1, -2, -5, 0, 0, 3, 3, 4, 5, 2, 0, 7, 9], dtype)
    _run("Pow", [a, b], opset=15)


def test_pow_int_float_exponent():
    # int base, float exponent: onnxruntime computes in floating point and truncates to the base's type
    a = np.array([4, 2, 9, 27, 10, -3, 1000, 5, 0, 7], I64)
    b = np.array([0.5, 0.5, 1.5, 1 / 3, 2.0, 3.0, 1.5, -1.0, 2.0, 2.1], F32)
    _run("Pow", [a, b], opset=15)


# -------------------------------------------------------------------------------------------------- Where

@pytest.mark.parametrize("dtype", [F32, I64, I32])
def test_where(dtype):
    c = _ints((2, 1, 7), 0, 2).astype(BOOL)
    x = _rand((3, 7), scale=50).astype(dtype)
    y = _rand((2, 3, 1), seed=1, scale=50).astype(dtype)
    _run("Where", [c, x, y], opset=16)


def test_where_scalar_branches():
    _run("Where", [_ints((13,), 0, 2).astype(BOOL), np.array(1.5, F32), np.array(-np.inf, F32)], consts={1, 2})


# ------------------------------------------------------------------------------------------ Max/Min/Sum/Mean

_VAR_SHAPES = [(2, 3, 7), (3, 1), (7,), ()]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op, n):
    ins = [_rand(s, seed=k) for k, s in enumerate(_VAR_SHAPES[:n])]
    if op in ("Max", "Min"):  # NaN in any input gives NaN (numpy maximum/minimum; onnxruntime agrees)
        ins[0].reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
        if n > 1:
            ins[1].reshape(-1)[-1] = np.nan
    _run(op, ins, opset=13)


@pytest.mark.parametrize("op", ["Max", "Min"])  # Sum/Mean are float-only in ONNX
def test_variadic_int(op):
    _run(op, [_ints((2, 7), -100, 100), _ints((7,), -100, 100, seed=1), _ints((2, 1), -100, 100, seed=2)],
         opset=13)


# -------------------------------------------------------------------------------------------------- PRelu

@pytest.mark.parametrize("slope_shape,const", [
    ((3, 1, 1), True), ((3, 1, 1), False), ((1,), True), ((5,), False), ((2, 3, 4, 5), False), ((1, 3, 1, 1), True),
])
def test_prelu(slope_shape, const):
    x = _special((2, 3, 4, 5))
    _run("PRelu", [x, _rand(slope_shape, seed=1, scale=0.5)], opset=16, consts={1} if const else ())


# -------------------------------------------------------------------------------------------- BatchNorm

def _bn_params(c, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(c).astype(F32), rng.standard_normal(c).astype(F32),
            rng.standard_normal(c).astype(F32), (rng.random(c) * 2 + 0.05).astype(F32)]


@pytest.mark.parametrize("shape,opset,eps,const", [
    ((2, 7, 5, 3), 15, 1e-5, True),
    ((2, 7, 5, 3), 15, 1e-5, False),
    ((1, 1, 13), 15, 0.1, True),
    ((1, 1, 13), 9, 0.1, False),
    ((3, 13), 14, 1e-3, True),
    ((5, 4), 9, 1e-5, False),
    ((1, 3, 2, 2, 2), 9, 1e-5, True),
])
def test_batchnorm(shape, opset, eps, const):
    x = _rand(shape, scale=2.0) + 0.5
    _run("BatchNormalization", [x, *_bn_params(shape[1])], {"epsilon": eps}, opset=opset,
         consts={1, 2, 3, 4} if const else ())


def test_batchnorm_mixed_const_and_runtime_params():
    x = _rand((2, 7, 3))
    _run("BatchNormalization", [x, *_bn_params(7)], opset=15, consts={1, 4})


def test_batchnorm_training_mode_raises():
    m, feeds = _model("BatchNormalization", [_rand((2, 3, 4)), *_bn_params(3)], {"training_mode": 1}, opset=15,
                      consts={1, 2, 3, 4}, outputs=("y", "running_mean", "running_var"))
    with pytest.raises(TemplateError, match="training"):
        run_node(m, feeds)
