"""Injective ops as inlined index maps (dlcc.lower.indexmaps) in verified loop steps, compared with onnxruntime."""

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from dlcc.codegen.cbase import Names, TemplateError, TensorRef, indent
from dlcc.codegen.element_c import CElements
from dlcc.codegen.lir_c import print_c
from dlcc.schedule.elementwise import map_func
from dlcc.schedule.target import get_target
from dlcc.testing.harness import prelude, run_node
from dlcc.util import value_dtype, value_shape

INT_MAX = 2**63 - 1


def _data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _model(op, inputs, n_out=1, opset=17, domain="", inits=None, **attrs):
    """A one-node model: ``inputs`` are (name, array) runtime inputs or None (absent optional input);
    ``inits`` maps input names to constant arrays (initializers). Output shapes come from onnxruntime."""
    inits = inits or {}
    names, graph_inputs, initializers = [], [], []
    for item in inputs:
        if item is None:
            names.append("")
            continue
        name, arr = item
        names.append(name)
        if name in inits:
            initializers.append(numpy_helper.from_array(np.asarray(inits[name]), name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype), np.asarray(arr).shape))
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)

    def build(shapes, dtype):
        vis = [helper.make_tensor_value_info(o, dtype, s) for o, s in zip(outs, shapes, strict=True)]
        g = helper.make_graph([node], "g", graph_inputs, vis, initializers)
        imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
        return helper.make_model(g, opset_imports=imports, ir_version=8)

    feeds = {n: np.asarray(a) for (n, a) in (x for x in inputs if x is not None) if n not in inits}
    dtype = helper.np_dtype_to_tensor_dtype(np.asarray(inputs[0][1]).dtype)
    return build, feeds, dtype


def _ort(build, feeds, dtype, n_out=1):
    m = build([None] * n_out, dtype)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    refs = s.run(None, feeds)
    return build([r.shape for r in refs], dtype), refs


def _run(model, feeds, out_index=0, pure=False):
    """Like harness.run_node, for any output of the node, optionally in pure-expression mode."""
    if out_index == 0 and not pure:
        return run_node(model, feeds)
    m = ir.serde.deserialize_model(model)
    node = list(m.graph)[0]
    ins = [v for v in node.inputs if v is not None]
    buffers, consts, params = {}, {}, []
    for k, v in enumerate(ins):
        ref = TensorRef(f"in{k}", value_dtype(v), value_shape(v))
        buffers[v] = ref
        params.append(f"const {ref.ctype}* restrict in{k}")
        if v.const_value is not None:
            consts[v] = v.const_value.numpy()
    out = node.outputs[out_index]
    oref = TensorRef("out", value_dtype(out), value_shape(out))
    params.append(f"{oref.ctype}* restrict out")
    body = _loop_step(buffers, consts, out, oref, pure)
    src = f"{prelude(get_target())}\nvoid dlcc_node({', '.join(params)}) {{\n{indent(body)}\n}}\n"
    arrays = [np.ascontiguousarray(v.const_value.numpy() if v.const_value is not None else feeds[v.name],
                                   dtype=value_dtype(v)) for v in ins]
    return _compile_and_call(src, arrays, oref)


def _loop_step(buffers, consts, out, oref, pure=False):
    """The C of the loop step computing ``out`` into ``oref`` as production builds it: the element expression in a
    loop-IR nest, verified (every load in bounds), printed. ``pure``: one expression per element, no locals."""
    names = Names()
    gen = CElements({**buffers, out: oref}, consts, names)
    return print_c(gen.fill(out, map_func(tuple(oref.shape), oref.dtype, 1, "node", names), pure), gen.ptrs)[0]


def _compile_and_call(src, arrays, oref):
    with tempfile.TemporaryDirectory(prefix="dlcc-inj-") as tmp:  # the loaded library outlives its file
        digest = hashlib.sha256(src.encode()).hexdigest()[:16]
        c_path, so_path = os.path.join(tmp, f"n{digest}.c"), os.path.join(tmp, f"n{digest}.so")
        with open(c_path, "w") as f:
            f.write(src)
        proc = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-std=gnu11", "-Wall", "-o", so_path, c_path, "-lm"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr + src
        first = src[:src.index("void dlcc_node")].count("\n") + 1  # warnings in our function only
        assert not [w for w in re.findall(r"\.c:(\d+):\d+: warning", proc.stderr) if int(w) >= first], proc.stderr
        lib = ctypes.CDLL(so_path)
    result = np.empty(oref.shape, dtype=oref.dtype)
    lib.dlcc_node.restype = None
    lib.dlcc_node(*[a.ctypes.data_as(ctypes.c_void_p) for a in [*arrays, result]])
    return result


def _run_graph(model, feeds):
    """Output 0 of a whole (small) graph inlined into one loop nest: tests handlers composed."""
    m = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    buffers, consts, params, arrays = {}, {}, [], []
    for k, v in enumerate([*m.graph.inputs, *m.graph.initializers.values()]):
        ref = TensorRef(f"in{k}", value_dtype(v), value_shape(v))
        buffers[v] = ref
        params.append(f"const {ref.ctype}* restrict in{k}")
        if v.const_value is not None:
            consts[v] = v.const_value.numpy()
        arrays.append(np.ascontiguousarray(consts[v] if v in consts else feeds[v.name], dtype=value_dtype(v)))
    out = m.graph.outputs[0]
    oref = TensorRef("out", value_dtype(out), value_shape(out))
    body = _loop_step(buffers, consts, out, oref)
    params.append(f"{oref.ctype}* restrict out")
    return _compile_and_call(f"{prelude(get_target())}\nvoid dlcc_node({', '.join(params)}) {{\n{indent(body)}\n}}\n",
                             arrays, oref)


def _check(got, ref):
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if ref.dtype == np.float32:
        # DESIGN.md: relative to the output's scale
        scale = np.max(np.abs(ref)) if ref.size else 0.0
        assert ref.size == 0 or np.max(np.abs(got - ref)) <= 1e-5 * scale + 1e-6
    else:
        np.testing.assert_array_equal(got, ref)


def _case(op, inputs, *, n_out=1, opset=17, inits=None, outs=(0,), pure=False, **attrs):
    build, feeds, dtype = _model(op, inputs, n_out=n_out, opset=opset, inits=inits, **attrs)
    model, refs = _ort(build, feeds, dtype, n_out)
    for k in outs:
        _check(_run(model, feeds, k, pure), refs[k])


def _i64(*v):
    return np.array(v, dtype=np.int64)


# --------------------------------------------------------------------------------------- Transpose

@pytest.mark.parametrize("shape,dtype,perm", [
    ((2, 3, 5), "float32", None),
    ((2, 7, 3, 13), "int64", [0, 2, 3, 1]),
    ((4, 9), "bool", [1, 0]),
    ((1, 3, 1, 5, 2), "int32", [4, 2, 0, 3, 1]),
])
def test_transpose(shape, dtype, perm):
    attrs = {} if perm is None else {"perm": perm}
    _case("Transpose", [("x", _data(shape, dtype))], **attrs)


# ------------------------------------------------------------------------------------------- Slice

@pytest.mark.parametrize("shape,starts,ends,axes,steps", [
    ((7, 13), [1, 2], [5, 11], None, None),
    ((7, 13), [-3, 0], [INT_MAX, -1], [0, 1], [1, 3]),
    ((7, 13), [-1], [-INT_MAX], [1], [-1]),
    ((7, 13), [100, -100], [-100, 100], [0, -1], [-2, 5]),
    ((2, 5, 9), [8], [1], [-1], [-3]),
    ((2, 5, 9), [3], [3], [1], [1]),  # empty
    ((3, 4), [-10], [10], [0], [1]),
])
def test_slice(shape, starts, ends, axes, steps):
    x = _data(shape, "float32")
    inputs = [("x", x), ("s", _i64(*starts)), ("e", _i64(*ends))]
    inits = {"s": _i64(*starts), "e": _i64(*ends)}
    if axes is not None or steps is not None:
        a = axes if axes is not None else list(range(len(starts)))
        inputs.append(("a", _i64(*a)))
        inits["a"] = _i64(*a)
    if steps is not None:
        inputs.append(("st", _i64(*steps)))
        inits["st"] = _i64(*steps)
    _case("Slice", inputs, inits=inits, opset=13)


def test_slice_opset9_attributes_int():
    _case("Slice", [("x", _data((5, 6, 7), "int64"))], opset=9, starts=[1, -4], ends=[100, -1], axes=[0, 2])


def test_slice_runtime_starts_rejected():
    build, feeds, dtype = _model("Slice", [("x", _data((5, 6), "float32")), ("s", _i64(1)), ("e", _i64(3))],
                                 inits={"e": _i64(3)}, opset=13)
    model, _ = _ort(build, feeds, dtype)
    with pytest.raises(TemplateError, match="constant"):
        _run(model, feeds)


# ------------------------------------------------------------------------------------------ Concat

@pytest.mark.parametrize("shapes,axis,dtype,pure", [
    ([(2, 3, 5), (2, 4, 5), (2, 1, 5)], 1, "float32", False),
    ([(3, 7), (3, 0), (3, 2)], -1, "int64", False),
    ([(3, 7), (3, 0), (3, 2)], -1, "int64", True),
    ([(1, 4), (5, 4)], 0, "bool", True),
    ([(0, 4), (3, 4)], 0, "int32", False),
])
def test_concat(shapes, axis, dtype, pure):
    inputs = [(f"x{k}", _data(s, dtype, seed=k)) for k, s in enumerate(shapes)]
    _case("Concat", inputs, axis=axis, pure=pure)


def test_concat_constant_input():
    a = _data((2, 3), "float32", 1)
    _case("Concat", [("x", _data((2, 5), "float32")), ("c", a)], inits={"c": a}, axis=1)


# ------------------------------------------------------------------------------------------- Split

def test_split_input():
    x = _data((3, 13), "float32")
    _case("Split", [("x", x), ("s", _i64(2, 7, 4))], inits={"s": _i64(2, 7, 4)}, n_out=3, outs=(0, 1, 2),
          opset=13, axis=-1)


def test_split_attribute_int():
    _case("Split", [("x", _data((7, 2), "int64"))], n_out=2, outs=(0, 1), opset=11, axis=0, split=[3, 4])


def test_split_num_outputs():
    _case("Split", [("x", _data((2, 11, 3), "float32"))], n_out=3, outs=(1, 2), opset=18, axis=1, num_outputs=3)


def test_split_equal_default():
    _case("Split", [("x", _data((6, 5), "bool"))], n_out=3, outs=(0, 2), opset=13)


# ------------------------------------------------------------------------------------------ Gather

@pytest.mark.parametrize("shape,ind,axis,const,dtype", [
    ((7, 5), np.array([[0, 6], [-1, 3], [2, -7]]), 0, False, "float32"),
    ((3, 13, 2), np.array([-13, 12, 0, 5]), 1, False, "int64"),
    ((3, 13, 2), np.array(4), 1, True, "float32"),
    ((3, 13, 2), np.array(-2), -2, False, "float32"),
    ((4, 5), np.array([[1], [3]], dtype=np.int32), -1, True, "bool"),
    ((6,), np.array([[5, -6, 0]]), 0, False, "int32"),
])
def test_gather(shape, ind, axis, const, dtype):
    ind = np.asarray(ind, dtype=ind.dtype if ind.dtype == np.int32 else np.int64)
    _case("Gather", [("x", _data(shape, dtype)), ("i", ind)], inits={"i": ind} if const else None, axis=axis)


def test_gather_bad_indices_are_clamped():
    build, feeds, dtype = _model("Gather", [("x", _data((5, 3), "float32")), ("i", _i64(1, 2))], axis=0)
    model, _ = _ort(build, feeds, dtype)
    got = _run(model, {"x": feeds["x"], "i": _i64(1000000, -99999999)})
    np.testing.assert_array_equal(got, feeds["x"][[4, 0]])


@pytest.mark.parametrize("shape,ishape,axis", [((4, 7), (3, 7), 0), ((3, 5, 2), (3, 4, 2), 1), ((3, 5), (2, 3), -1)])
def test_gather_elements(shape, ishape, axis):
    n = shape[axis]
    ind = np.random.default_rng(3).integers(-n, n, size=ishape).astype(np.int64)
    _case("GatherElements", [("x", _data(shape, "float32")), ("i", ind)], axis=axis)


# --------------------------------------------------------------------------------------------- Pad

@pytest.mark.parametrize("shape,pads,mode,value,dtype,pure", [
    ((3, 5), [1, 2, 2, 0], "constant", 1.5, "float32", False),
    ((3, 5), [1, 2, 2, 0], "constant", 1.5, "float32", True),
    ((2, 3, 7), [0, 1, -2, 0, 2, 3], "constant", None, "float32", False),
    ((2, 3, 7), [0, 1, 2, 1, 0, 3], "edge", None, "int64", False),
    ((4, 7), [3, 6, 2, 5], "reflect", None, "float32", False),
    ((4, 7), [2, 1, 3, 6], "wrap", None, "float32", False),
    ((1, 2, 5, 5), [0, 0, 1, 1, 0, 0, 1, 1], "reflect", None, "float32", True),
    ((3, 4), [1, 1, 1, 1], "constant", 7, "int32", False),
])
def test_pad(shape, pads, mode, value, dtype, pure):
    inputs = [("x", _data(shape, dtype)), ("p", _i64(*pads))]
    inits = {"p": _i64(*pads)}
    if value is not None:
        inputs.append(("v", np.array(value, dtype=dtype)))
    _case("Pad", inputs, inits=inits, opset=19, mode=mode, pure=pure)


def test_pad_runtime_value():
    x = _data((3, 4), "float32")
    _case("Pad", [("x", x), ("p", _i64(0, 1, 2, 3)), ("v", np.array(-2.5, np.float32))],
          inits={"p": _i64(0, 1, 2, 3)}, opset=13)


def test_pad_axes():
    x = _data((2, 3, 5), "float32")
    _case("Pad", [("x", x), ("p", _i64(1, 2, 3, 0)), None, ("a", _i64(-1, 0))],
          inits={"p": _i64(1, 2, 3, 0), "a": _i64(-1, 0)}, opset=18, mode="edge")


def test_pad_opset2_attributes():
    _case("Pad", [("x", _data((3, 4), "float32"))], opset=2, pads=[1, 0, 0, 2], value=3.0)


def test_pad_runtime_pads_rejected():
    build, feeds, dtype = _model("Pad", [("x", _data((5, 6), "float32")), ("p", _i64(0, 1, 0, 1))], opset=13)
    model, _ = _ort(build, feeds, dtype)
    with pytest.raises(TemplateError, match="constant"):
        _run(model, feeds)


# ----------------------------------------------------------------------------- Expand, Tile, ...

@pytest.mark.parametrize("shape,to,dtype", [((3, 1), (2, 3, 5), "float32"), ((1, 4), (7, 1), "bool"),
                                            ((5,), (2, 1, 5), "int64")])
def test_expand(shape, to, dtype):
    _case("Expand", [("x", _data(shape, dtype)), ("s", _i64(*to))], inits={"s": _i64(*to)})


def test_expand_runtime_shape_rejected():
    build, feeds, dtype = _model("Expand", [("x", _data((3, 1), "float32")), ("s", _i64(3, 4))])
    model, _ = _ort(build, feeds, dtype)
    with pytest.raises(TemplateError, match="constant"):
        _run(model, feeds)


@pytest.mark.parametrize("shape,reps,dtype", [((2, 3), (3, 1), "float32"), ((1, 5, 7), (2, 3, 2), "int32")])
def test_tile(shape, reps, dtype):
    _case("Tile", [("x", _data(shape, dtype)), ("r", _i64(*reps))], inits={"r": _i64(*reps)})


@pytest.mark.parametrize("mode,b,shape", [("DCR", 2, (2, 12, 3, 5)), ("CRD", 2, (1, 8, 3, 5)),
                                          ("DCR", 3, (1, 18, 2, 1)), ("CRD", 3, (2, 9, 1, 3))])
def test_depth_to_space(mode, b, shape):
    _case("DepthToSpace", [("x", _data(shape, "float32"))], opset=13, blocksize=b, mode=mode)


@pytest.mark.parametrize("b,shape,dtype", [(2, (2, 3, 6, 4), "float32"), (3, (1, 5, 9, 3), "float32")])
def test_space_to_depth(b, shape, dtype):
    _case("SpaceToDepth", [("x", _data(shape, dtype))], blocksize=b)


@pytest.mark.parametrize("shape,g", [((2, 12, 3, 5), 3), ((1, 6, 1, 7), 2), ((1, 5, 2, 2), 5)])
def test_channel_shuffle(shape, g):
    x = _data(shape, "float32")
    vi = helper.make_tensor_value_info
    node = helper.make_node("ChannelShuffle", ["x"], ["y"], domain="dlcc", group=g)
    graph = helper.make_graph([node], "g", [vi("x", TensorProto.FLOAT, shape)], [vi("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dlcc", 1)])
    n, c, h, w = shape
    ref = x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(shape)
    _check(run_node(model, {"x": x}), ref)


# --------------------------------------------------------------------------- reshape-like views

@pytest.mark.parametrize("shape,to", [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, 3, 2)), ((6, 35), (2, 3, 5, 7)),
                                      ((1, 12, 1), (3, 1, 4)), ((5, 7), (35,))])
def test_reshape(shape, to):
    _case("Reshape", [("x", _data(shape, "float32")), ("s", _i64(*to))], inits={"s": _i64(*to)})


def test_reshape_pure():
    _case("Reshape", [("x", _data((6, 10), "int64")), ("s", _i64(4, 15))], inits={"s": _i64(4, 15)}, pure=True)


def test_flatten_squeeze_unsqueeze():
    _case("Flatten", [("x", _data((2, 3, 5, 7), "float32"))], axis=2)
    _case("Squeeze", [("x", _data((1, 3, 1, 5), "bool")), ("a", _i64(0, -2))], inits={"a": _i64(0, -2)})
    _case("Unsqueeze", [("x", _data((3, 5), "int32")), ("a", _i64(0, 3))], inits={"a": _i64(0, 3)})


# ------------------------------------------------------------------------------------------ Resize

def _resize(shape, *, scales=None, sizes=None, opset=19, dtype="float32", pure=False, **attrs):
    x = _data(shape, dtype)
    inputs = [("x", x), None]
    inits = {}
    if opset < 13:  # roi was not optional yet
        inputs[1] = ("roi", np.zeros(0, np.float32))
        inits["roi"] = inputs[1][1]
    if scales is not None:
        inputs.append(("sc", np.array(scales, np.float32)))
        inits["sc"] = np.array(scales, np.float32)
    else:
        inputs += [("sc", np.zeros(0, np.float32)) if opset < 13 else None, ("sz", _i64(*sizes))]
        if opset < 13:
            inits["sc"] = inputs[2][1]
        inits["sz"] = _i64(*sizes)
    _case("Resize", inputs, inits=inits, opset=opset, pure=pure, **attrs)


@pytest.mark.parametrize("coord,nearest", [
    ("half_pixel", "round_prefer_floor"),
    ("half_pixel", "round_prefer_ceil"),
    ("asymmetric", "floor"),
    ("asymmetric", "ceil"),
    ("align_corners", "round_prefer_ceil"),
    ("pytorch_half_pixel", "floor"),
    ("tf_half_pixel_for_nn", "round_prefer_floor"),
    ("half_pixel_symmetric", "round_prefer_ceil"),
])
@pytest.mark.parametrize("scales,sizes", [([1, 1, 2, 3], None), (None, [1, 2, 7, 5]), ([1, 1, 0.6, 1.7], None)])
def test_resize_nearest(coord, nearest, scales, sizes):
    _resize((1, 2, 4, 3), scales=scales, sizes=sizes, mode="nearest", coordinate_transformation_mode=coord,
            nearest_mode=nearest)


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("scales,sizes", [([1, 1, 2, 2], None), (None, [2, 3, 3, 13]), ([1, 1, 0.5, 1.5], None)])
def test_resize_bilinear(coord, scales, sizes):
    _resize((2, 3, 5, 7), scales=scales, sizes=sizes, mode="linear", coordinate_transformation_mode=coord)


def test_resize_trilinear_pure():
    _resize((1, 2, 3, 4, 5), scales=[1, 1, 2, 1.5, 0.6], mode="linear", pure=True)


def test_resize_nearest_int_and_opset11():
    _resize((1, 1, 3, 5), scales=[1, 1, 3, 2], dtype="int32", opset=11, mode="nearest")
    _resize((1, 1, 3, 5), sizes=[1, 1, 4, 9], opset=11, mode="linear")


def test_resize_nearest_pure():
    _resize((1, 3, 5, 4), scales=[1, 1, 0.6, 2.5], mode="nearest", pure=True)


def test_gather_pure():
    ind = _i64(2, -1, 0)
    _case("Gather", [("x", _data((2, 5, 3), "float32")), ("i", ind)], axis=1, pure=True)


def test_resize_keep_aspect_ratio():
    _resize((1, 1, 4, 6), sizes=[5, 7], opset=19, mode="nearest", axes=[2, 3], keep_aspect_ratio_policy="not_larger")


def test_resize_opset10():
    x = _data((1, 2, 3, 4), "float32")
    sc = np.array([1, 1, 2, 1.5], np.float32)
    _case("Resize", [("x", x), ("sc", sc)], inits={"sc": sc}, opset=10, mode="nearest")


@pytest.mark.parametrize("mode,scales", [("nearest", [1, 1, 2, 3]), ("nearest", [1, 2, 1.5, 2.5]),
                                         ("linear", [1, 1, 2, 3]), ("linear", [1, 1, 1.5, 2.5])])
def test_upsample(mode, scales):
    sc = np.array(scales, np.float32)
    _case("Upsample", [("x", _data((1, 2, 3, 4), "float32")), ("sc", sc)], inits={"sc": sc}, opset=9, mode=mode)


def test_upsample_opset7_attribute():
    _case("Upsample", [("x", _data((1, 1, 3, 4), "float32"))], opset=7, mode="nearest", scales=[1.0, 1.0, 2.0, 1.5])


@pytest.mark.parametrize("attrs", [{"mode": "cubic"}, {"mode": "nearest", "coordinate_transformation_mode":
                                                       "tf_crop_and_resize"}])
def test_resize_unsupported(attrs):
    sc = np.array([1, 1, 2, 2], np.float32)
    build, feeds, dtype = _model("Resize", [("x", _data((1, 1, 3, 3), "float32")), None, ("sc", sc)],
                                 inits={"sc": sc}, opset=13, **attrs)
    model = build([(1, 1, 6, 6)], dtype)
    with pytest.raises(TemplateError):
        _run(model, feeds)


# ------------------------------------------------------------------------------- composed handlers

def test_chain_pad_of_gather_concat_transpose():
    """Pad's out-of-range branch wraps a Gather of a Concat: the loads under the guards must not be hoisted."""
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3,5] a, float[2,5] b, int64[4] i) => (float[9,8] z) {
        c = Concat<axis=0>(a, b)
        g1 = Gather<axis=0>(c, i)
        t = Transpose(g1)
        p = Constant<value=int64[4] {2, 1, 2, 3}>()
        r = Relu(t)
        z = Pad<mode="constant">(r, p)
    }""")
    rng = np.random.default_rng(5)
    feeds = {"a": rng.standard_normal((3, 5), dtype=np.float32), "b": rng.standard_normal((2, 5), dtype=np.float32),
             "i": _i64(4, -5, 2, 3)}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    # the Constant node is folded into an initializer so that the kernel sees the pads as a constant
    m.graph.initializer.append(numpy_helper.from_array(_i64(2, 1, 2, 3), "p"))
    del m.graph.node[3]
    _check(_run_graph(m, feeds), ref)


def test_chain_resize_of_slice():
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 19]>
    g (float[1,2,6,7] x) => (float[1,2,8,7] z) {
        y = Slice(x, s, e, ax)
        z = Resize<mode="linear">(y, , sc)
    }""")
    consts = {"s": _i64(1, 1), "e": _i64(5, -1), "ax": _i64(2, 3), "sc": np.array([1, 1, 2, 1.5], np.float32)}
    for name, arr in consts.items():
        m.graph.initializer.append(numpy_helper.from_array(arr, name))
    feeds = {"x": _data((1, 2, 6, 7), "float32")}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    _check(_run_graph(m, feeds), ref)
