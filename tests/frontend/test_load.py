"""Loading: sources, validation, external data safety, legacy initializer inputs, atomic saving."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.parser
import onnx_ir as ir
import pytest

import dlcc
from conftest import small_model
from dlcc.check import random_inputs, run_ort
from dlcc.errors import ExternalDataError, ModelLoadError, OutputError, UnsupportedModelError
from dlcc.frontend.load import notes
from dlcc.frontend.save import save

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light"


def test_load_path_bytes_proto_agree(small_path: Path) -> None:
    a = dlcc.load(small_path)
    b = dlcc.load(small_path.read_bytes())
    c = dlcc.load(onnx.load(small_path))
    for m in (a, b, c):
        assert [n.op_type for n in m.graph] == ["MatMul", "Add", "Relu"]
        assert set(m.graph.initializers) == {"w", "b"}


@pytest.mark.parametrize("source,match", [
    (b"", "empty"),
    (b"this is not an onnx model at all, just text\n" * 3, "not"),
    (123, "cannot load a model from a int"),
])
def test_load_rejects_garbage(source, match) -> None:
    with pytest.raises(ModelLoadError, match=match):
        dlcc.load(source)


def test_load_rejects_truncated(small_path: Path) -> None:
    data = small_path.read_bytes()
    for cut in (len(data) // 3, len(data) // 2, len(data) - 7):
        with pytest.raises(ModelLoadError):
            dlcc.load(data[:cut])


def test_load_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        dlcc.load(tmp_path / "nope.onnx")
    with pytest.raises(ModelLoadError, match="is a folder"):
        dlcc.load(tmp_path)


def test_load_unknown_domain() -> None:
    m = small_model()
    m.graph.node.append(oh.make_node("Frobnicate", ["y"], ["z"], domain="com.example"))
    m.opset_import.append(oh.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedModelError, match="com.example"):
        dlcc.load(m)


def test_load_unknown_default_domain_op() -> None:
    m = small_model()
    m.graph.node[2].op_type = "NotAnOnnxOp"
    with pytest.raises(ModelLoadError, match="NotAnOnnxOp"):
        dlcc.load(m)


# -------------------------------------------------------------------------------------- external data


def _external_model(folder: Path, location: str = "weights.bin") -> Path:
    """small model whose weight 'w' lives in an external file at ``location`` (relative to folder)."""
    m = small_model()
    w = next(t for t in m.graph.initializer if t.name == "w")
    raw = w.raw_data
    data_path = folder / location
    data_path.parent.mkdir(parents=True, exist_ok=True)
    data_path.write_bytes(raw)
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
        e = w.external_data.add()
        e.key, e.value = k, v
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_external_data_loads_and_runs(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    model = dlcc.load(path)
    feeds = random_inputs(small_model(), seed=1)
    ref = run_ort(small_model(), feeds)
    # the loaded tensor reads the external bytes
    w = model.graph.initializers["w"].const_value.numpy()
    assert np.array_equal(w, onnx.numpy_helper.to_array(small_model().graph.initializer[0]))
    out = tmp_path / "out.onnx"
    save(model, out)
    np.testing.assert_array_equal(ref["y"], run_ort(str(out), feeds)["y"])


def test_external_data_missing(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(ExternalDataError, match="missing"):
        dlcc.load(path)


def test_external_data_truncated(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ExternalDataError, match="does not fit"):
        dlcc.load(path)


@pytest.mark.parametrize("location", ["../outside.bin", "sub/../../outside.bin", "/etc/passwd"])
def test_external_data_outside_folder_refused(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder)
    m = onnx.load(path, load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = location
    (tmp_path / "outside.bin").write_bytes((folder / "weights.bin").read_bytes())
    path.write_bytes(m.SerializeToString())
    with pytest.raises(ExternalDataError, match="outside the model's folder|absolute path"):
        dlcc.load(path)


def test_external_data_symlink_escape_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _external_model(folder)
    secret = tmp_path / "secret.bin"
    os.replace(folder / "weights.bin", secret)
    os.symlink(secret, folder / "weights.bin")
    with pytest.raises(ExternalDataError, match="symlink"):
        dlcc.load(path)


def test_external_data_from_bytes_needs_folder(tmp_path: Path) -> None:
    path = _external_model(tmp_path)
    with pytest.raises(ExternalDataError, match="base_dir"):
        dlcc.load(path.read_bytes())
    assert dlcc.load(path.read_bytes(), base_dir=tmp_path).graph.initializers["w"].const_value is not None


# --------------------------------------------------------------------------------------------- legacy


def test_legacy_initializer_inputs_become_constants() -> None:
    model = dlcc.load(LIGHT / "light_squeezenet.onnx")
    assert [v.name for v in model.graph.inputs] == ["data_0"]
    assert model.ir_version >= 4
    assert any("constants" in n for n in notes(model))


def test_legacy_initializer_inputs_kept_on_request() -> None:
    model = dlcc.load(LIGHT / "light_squeezenet.onnx", keep_initializer_inputs=True)
    assert len(model.graph.inputs) > 1
    assert any("kept" in n for n in notes(model))


# --------------------------------------------------------------------------------------------- saving


def test_save_is_atomic_and_valid(tmp_path: Path, small_path: Path) -> None:
    out = tmp_path / "out.onnx"
    save(dlcc.load(small_path), out)
    onnx.checker.check_model(str(out), full_check=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dlcc-tmp")]


def test_save_refuses_bad_paths(tmp_path: Path, small_path: Path) -> None:
    model = dlcc.load(small_path)
    with pytest.raises(OutputError, match="does not exist"):
        save(model, tmp_path / "no" / "such" / "dir" / "out.onnx")
    with pytest.raises(OutputError, match="folder"):
        save(model, tmp_path)
    with pytest.raises(OutputError):
        save(model, "/proc/dlcc-cannot-write-here.onnx")


def test_save_external_data(tmp_path: Path) -> None:
    out = tmp_path / "ext.onnx"
    save(dlcc.load(_conv_model().SerializeToString()), out, external_data=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    feeds = random_inputs(_conv_model(), seed=2)
    np.testing.assert_array_equal(run_ort(_conv_model(), feeds)["y"], run_ort(str(out), feeds)["y"])
    # and it loads back through the safe loader; a tensor of at most 1 KiB stays in the model file
    loaded = dlcc.load(out)
    assert isinstance(loaded.graph.initializers["w"].const_value, ir.ExternalTensor)
    assert not isinstance(loaded.graph.initializers["b"].const_value, ir.ExternalTensor)


def test_save_switches_to_external_above_threshold(tmp_path: Path, monkeypatch) -> None:
    import dlcc.frontend.save as save_mod

    monkeypatch.setattr(save_mod, "EXTERNAL_DATA_THRESHOLD", 10)
    out = tmp_path / "auto.onnx"
    save(dlcc.load(_conv_model().SerializeToString()), out)
    assert (tmp_path / "auto.onnx.data").is_file()


def _saved_equals_serialized(model, out: Path) -> onnx.ModelProto:
    """``save(model, out)`` parses to ``serialize_model(model)``; returns the file's proto."""
    import onnx_ir as ir

    save(model, out)
    got, ref = onnx.load(out), ir.serde.serialize_model(model)
    assert got.SerializeToString(deterministic=True) == ref.SerializeToString(deterministic=True)
    return got


@pytest.mark.parametrize("odd", [None, "doc", "denotation"])
def test_saved_value_info_equals_serialized(tmp_path: Path, odd) -> None:
    """The value_info save encodes itself (known, symbolic and unknown dims, scalars, no shape) parses to
    onnx_ir's; a value onnx_ir writes more about (a doc string, a dim denotation) leaves all of them to it."""
    import onnx_ir as ir

    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float["N", 64] x) => (float["N", 64] y) {
        a = Add(x, big)
        s = ReduceSum <keepdims = 0> (a)
        r = Relu(a)
        y = Mul(r, s)
    }
    """)
    big = ir.Value(name="big", const_value=ir.Tensor(np.ones((64, 64), np.float32), name="big"))
    model.graph.register_initializer(big)
    for node in model.graph:
        for i, inp in enumerate(node.inputs):
            if inp is not None and inp.name == "big" and inp is not big:
                node.replace_input_with(i, big)
    a, s, r = (n.outputs[0] for n in list(model.graph)[:3])
    a.type, a.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(["N", 64])
    s.type, s.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([])
    r.type, r.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([None, 64])
    if odd == "doc":
        r.doc_string = "relu"
    elif odd == "denotation":
        r.shape = ir.Shape([None, 64], denotations=["DATA_BATCH", None])
    got = _saved_equals_serialized(model, tmp_path / "vi.onnx")
    assert [vi.name for vi in got.graph.value_info] == ["a", "s", "r"]


def test_streamed_save_equals_serialized_model(tmp_path: Path) -> None:
    """Initializers of several element types: the file parses to what serialize_model gives"""
    import onnx_ir as ir

    rng = np.random.default_rng(0)
    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[64,64] x) => (float[64,64] y) {
        a = Add(x, big)
        h = Cast <to = 10> (a)
        h2 = Mul(h, half)
        b = Cast <to = 1> (h2)
        c = Mul(b, small)
        i = Cast <to = 7> (c)
        j = Add(i, ints)
        y = Cast <to = 1> (j)
    }
    """)
    tensors = {
        "big": rng.standard_normal((64, 64)).astype(np.float32),
        "half": rng.standard_normal((64, 64)).astype(np.float16),
        "small": np.float32([2.0]),
        "ints": rng.integers(-5, 5, (64, 64)).astype(np.int64),
    }
    for name, arr in tensors.items():
        v = ir.Value(name=name, const_value=ir.Tensor(arr, name=name))
        model.graph.register_initializer(v)
        for node in model.graph:
            for i, inp in enumerate(node.inputs):
                if inp is not None and inp.name == name and inp is not v:
                    node.replace_input_with(i, v)
    out = tmp_path / "streamed.onnx"
    got = _saved_equals_serialized(model, out)
    assert [t.name for t in got.graph.initializer] == ["big", "half", "small", "ints"]
    onnx.checker.check_model(str(out), full_check=True)


def test_names_that_are_not_utf8_are_refused() -> None:
    """Fuzzer find (flip mutants): a flipped byte in the graph or a node name made bytes that are not
    UTF-8; loading accepted them and saving crashed. Now the loader refuses them."""
    import onnx.parser

    from dlcc.errors import ModelLoadError

    for field in (b"graphnamezz", b"nodenamezz"):
        m = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        graphnamezz (float[2] x) => (float[2] y) { y = Relu(x) }""")
        m.graph.node[0].name = "nodenamezz"
        data = m.SerializeToString().replace(field, field[:4] + b"\xdf" + field[5:])
        with pytest.raises(ModelLoadError, match="not valid UTF-8"):
            dlcc.load(data)


def _conv_model(extra_node=None, legacy: bool = False) -> onnx.ModelProto:
    """Conv + Relu with a 147 KB float weight (big enough for the weightless checker copy)."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    nodes = [oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), oh.make_node("Relu", ["c"], ["y"])]
    if extra_node is not None:
        nodes.append(extra_node)
    inputs = [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 8, 8])]
    if legacy:
        inputs += [oh.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [64, 64, 3, 3]),
                   oh.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [64])]
    g = oh.make_graph(nodes, "g", inputs, [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64, "h", "w"])],
                      initializer=[w, b])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=3 if legacy else 8)


@pytest.mark.parametrize("legacy", [False, True])
def test_shapes_inferred_without_the_weights_match_the_full_model(legacy) -> None:
    """Checker and inference run on a copy without the big weights; every shape still arrives, the output's
    type is filled in, and the weights themselves are untouched."""
    m = _conv_model(legacy=legacy)
    loaded = dlcc.load(m.SerializeToString())
    values = {v.name: v for n in loaded.graph for v in n.outputs}
    assert list(values["c"].shape) == [1, 64, 8, 8] and list(values["y"].shape) == [1, 64, 8, 8]
    assert list(loaded.graph.outputs[0].shape) == [1, 64, 8, 8]
    w = loaded.graph.initializers["w"].const_value.numpy()
    assert np.array_equal(w, onnx.numpy_helper.to_array(m.graph.initializer[0]))
    assert [v.name for v in loaded.graph.inputs] == ["x"]  # no weight became an input


def test_checker_still_sees_errors_next_to_big_weights() -> None:
    bad = _conv_model(oh.make_node("Relu", ["nowhere"], ["z"]))
    with pytest.raises(ModelLoadError, match="not valid ONNX"):
        dlcc.load(bad.SerializeToString())
    dup = _conv_model(oh.make_node("Relu", ["x"], ["c"]))  # 'c' defined twice
    with pytest.raises(ModelLoadError, match="not valid ONNX"):
        dlcc.load(dup.SerializeToString())


def _with_input_dim(dim: int) -> onnx.ModelProto:
    m = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] x) => (float[2, 3] y) { s = Shape (x)
    y = Reshape (x, s) }""")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = dim
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_value = dim
    return m


def test_minus_one_dims_are_dynamic_and_other_negatives_refused(tmp_path: Path) -> None:
    """Mutant fuzzer, seed 0 #2478: an input declared [-1, 16] reached a shape fold, which crashed on the
    negative dim. -1 now reads as dynamic (with a note); any other negative dim is a load error."""
    m = _with_input_dim(-1)
    loaded = dlcc.load(m)
    assert loaded.graph.inputs[0].shape[0] is None or not isinstance(loaded.graph.inputs[0].shape[0], int)
    assert any("-1 as dynamic" in n and "x[0]" in n for n in notes(loaded))
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1  # the caller's proto is untouched
    dlcc.optimize(loaded, emit=lambda s: None)
    out = tmp_path / "o.onnx"
    save(loaded, out)
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    assert np.array_equal(run_ort(str(out), {"x": x})["y"], x)
    with pytest.raises(ModelLoadError, match="dim -7 at axis 0"):
        dlcc.load(_with_input_dim(-7).SerializeToString())


def _ir3_model(declared: list[int]) -> onnx.ModelProto:
    """IR 3: the weight is also a graph input, declared with ``declared`` dims (it holds [4, 3])."""
    w = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    g = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4]),
                       oh.make_tensor_value_info("w", onnx.TensorProto.FLOAT, declared)],
                      [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])], [w])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 8)])
    m.ir_version = 3
    return m


@pytest.mark.parametrize("declared", [[4, 3], [-1, 3]])
def test_ir3_initializer_inputs_are_checked_then_stripped(declared: list[int]) -> None:
    """Initializers listed as inputs (IR 3) are checked against their declared types, then dropped from the
    inputs before the other checks (IR 4 from then on); -1 is a dynamic dim and fits; a real mismatch is a
    load error; --keep-initializer-inputs keeps them as inputs."""
    data = _ir3_model(declared).SerializeToString()
    m = dlcc.load(data)
    assert [v.name for v in m.graph.inputs] == ["x"] and m.ir_version == 4
    assert m.meta["dlcc.ir_version_in"] == 3 and any("legacy IR 3" in n for n in notes(m))
    kept = dlcc.load(data, keep_initializer_inputs=True)
    assert [v.name for v in kept.graph.inputs] == ["x", "w"]
    with pytest.raises(ModelLoadError, match="declared with dims \\[4, 4\\]"):
        dlcc.load(_ir3_model([4, 4]).SerializeToString())
    unlisted = _ir3_model(declared)  # IR 3 and an initializer that is not an input: still invalid
    del unlisted.graph.input[1]
    with pytest.raises(ModelLoadError, match="w in initializer but not in graph input"):
        dlcc.load(unlisted.SerializeToString())


def test_saved_loaded_initializers_equal_serialized_model(tmp_path: Path) -> None:
    """Loaded initializers, big and small: the file parses to what serialize_model gives (names, dims,
    dtypes, data)."""

    m = _conv_model()
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.float32([1.5, -2.0]), "tiny"))
    m.graph.node.append(oh.make_node("Identity", ["tiny"], ["t_out"]))
    m.graph.output.append(oh.make_tensor_value_info("t_out", onnx.TensorProto.FLOAT, [2]))
    _saved_equals_serialized(dlcc.load(m.SerializeToString()), tmp_path / "o.onnx")


@pytest.mark.parametrize("everywhere", [True, False])
def test_big_weight_named_in_bad_utf8_is_a_load_error(everywhere) -> None:
    """Mutant fuzzer, seed 1 #9541: a flipped byte in a big weight's name crashed the weightless checker
    copy (the name went through a Python string). Now it is a load error like any other bad name."""
    m = _conv_model()
    m.graph.initializer[0].name = "weightzz"
    m.graph.node[0].input[1] = "weightzz"
    data = m.SerializeToString()
    bad = b"weig\xdftzz"  # same length: one byte flipped
    data = data.replace(b"weightzz", bad) if everywhere else data.replace(b"weightzz", bad, 1)
    with pytest.raises(ModelLoadError):
        dlcc.load(data)


@pytest.mark.parametrize("where", ["value_info", "output"])
def test_unknown_element_type_is_a_load_error(where) -> None:
    """Mutant fuzzer, seed 2 #9386: a flipped byte made an element type 65, which onnx's checker lets
    through and onnx_ir cannot read. It is a load error naming the problem, not an internal error."""
    m = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) { h = Relu(x)
    y = Neg(h) }""")
    if where == "value_info":
        m.graph.value_info.append(oh.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [2]))
        m.graph.value_info[0].type.tensor_type.elem_type = 65
    else:
        m.graph.output[0].type.tensor_type.elem_type = 65
    with pytest.raises(ModelLoadError, match="corrupted|not valid ONNX"):
        dlcc.load(m.SerializeToString())


def test_graph_name_in_bad_utf8_next_to_big_weights_is_a_load_error() -> None:
    """Mutant fuzzer, seed 3 #3394: the weightless checker copy tripped over a graph name that is not
    UTF-8 (the model has big weights, so the copy is made). It is the usual load error."""
    m = _conv_model()
    m.graph.name = "graphnamezz"
    data = m.SerializeToString().replace(b"graphnamezz", b"grap\xf1namezz")
    with pytest.raises(ModelLoadError, match="not valid UTF-8"):
        dlcc.load(data)


def test_initializer_of_undefined_type_next_to_its_input_is_a_load_error() -> None:
    """Mutant fuzzer, seed 5 #2063: an initializer's data type flipped to 0 (undefined) next to a graph
    input that declares it; building the error message itself failed. It names the type as undefined."""
    m = _conv_model(legacy=True)
    m.graph.initializer[1].data_type = 0
    with pytest.raises(ModelLoadError, match=r"undefined \(0\)"):
        dlcc.load(m.SerializeToString())


def test_tensor_bytes_counts_loaded_and_new_tensors() -> None:
    """tensor_bytes of loaded and new tensors: onnx_ir's nbytes, for every element type (4-bit types packed
    two to a byte)."""
    import onnx_ir as ir

    from dlcc.frontend.save import tensor_bytes

    rng = np.random.default_rng(0)
    arrays = {"f": rng.standard_normal((3, 5)).astype(np.float32), "h": np.ones((7,), np.float16),
              "b": np.zeros((2, 3), bool), "l": np.arange(4, dtype=np.int64)}
    graph = oh.make_graph([oh.make_node("Add", ["x", "f"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5])],
                          [onnx.numpy_helper.from_array(a, k) for k, a in arrays.items()])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    loaded = dlcc.load(model.SerializeToString())
    want = sum(v.const_value.nbytes for v in loaded.graph.initializers.values())
    assert tensor_bytes(loaded) == want == sum(a.nbytes for a in arrays.values())
    packed = ir.Value(name="q", const_value=ir.Tensor(np.array([1, 2, 3], np.int8), dtype=ir.DataType.INT4))
    loaded.graph.register_initializer(packed)
    assert tensor_bytes(loaded) == want + 2


@pytest.mark.parametrize("odd", [None, "tensor-attr", "subgraph", "node-doc", "quant"])
def test_saved_nodes_equal_serialized(tmp_path: Path, odd) -> None:
    """Every plain attribute kind, negative and 64-bit ints, missing optional inputs, unused trailing
    outputs, names and domains, tensor attributes, subgraphs, doc strings and quantization annotations: the
    file parses to onnx_ir's serialization."""
    import onnx_ir as ir

    model = ir.from_onnx_text("""
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[64,64] x, bool c) => (float[64,64] y, float[64,64] z) {
        a = Add(x, big)
        p = Pad <mode = "reflect"> (a, pads, )
        y, mask = Dropout(p)
        z = com.microsoft.Custom <i = -7, j = 9000000000, f = -2.5, s = "text", ints = [-1, 0, 1],
                                  floats = [0.5, -3.25], strings = ["a", "bc"]> (a)
    }
    """)
    big = ir.Value(name="big", const_value=ir.Tensor(np.ones((64, 64), np.float32), name="big"))
    pads = ir.Value(name="pads", const_value=ir.Tensor(np.zeros(4, np.int64), name="pads"))
    for v in (big, pads):
        model.graph.register_initializer(v)
        for node in model.graph:
            for i, inp in enumerate(node.inputs):
                if inp is not None and inp.name == v.name and inp is not v:
                    node.replace_input_with(i, v)
    nodes = list(model.graph)
    nodes[0].name = "first"
    drop = nodes[2]
    drop.outputs[1].name = ""  # an unused optional output: left out of the file
    nodes[3].attributes["empty"] = ir.AttrInt64s("empty", [])
    nodes[1].resize_inputs(3)  # a missing optional input (constant_value): written as ""
    if odd == "tensor-attr":
        nodes[3].attributes["t"] = ir.AttrTensor("t", ir.tensor(np.float32([1, 2])))
    elif odd == "subgraph":
        branches = []
        for name in ("then", "else"):
            one = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(np.float32(1)))],
                          outputs=[ir.Value(name=f"{name}_one")])
            branches.append(ir.Graph([], one.outputs, nodes=[one], name=name))
        model.graph.append(ir.Node("", "If", [model.graph.inputs[1]], [ir.AttrGraph("then_branch", branches[0]),
                                                                       ir.AttrGraph("else_branch", branches[1])],
                                   outputs=[ir.Value(name="unused")]))
    elif odd == "node-doc":
        nodes[1].doc_string = "pad it"
    elif odd == "quant":
        nodes[0].outputs[0].meta["quant_parameter_tensor_names"] = {"SCALE_TENSOR": "big"}
        big.meta["quant_parameter_tensor_names"] = {"SCALE_TENSOR": "pads"}
    got = _saved_equals_serialized(model, tmp_path / "nodes.onnx")
    assert [n.op_type for n in got.graph.node][:4] == ["Add", "Pad", "Dropout", "Custom"]
    assert list(got.graph.node[2].output) == ["y"]
    assert list(got.graph.node[1].input) == ["a", "pads", ""]
    if odd == "quant":
        assert sorted(a.tensor_name for a in got.graph.quantization_annotation) == ["a", "big"]
