"""The per-op fact table: kind order, mapping order, coverage, flags, unknown ops."""

from __future__ import annotations

import dataclasses
import itertools

import onnx.defs
import pytest

from dlcc.ops import KNOWN_OPS, Kind, Mapping, OpInfo, combine_kinds, is_known, more_complex, op_info
from dlcc.ops.table import C_BACKEND_OPS, ops_with

MAPPING_ORDER = [Mapping.ONE_TO_ONE, Mapping.REORGANIZE, Mapping.SHUFFLE, Mapping.ONE_TO_MANY,
                 Mapping.MANY_TO_MANY]


def names(text: str) -> list[str]:
    return text.split()


# The ops the table must cover (default domain), family by family.
UNARY = names("""
    Abs Neg Exp Log Sqrt Reciprocal Sigmoid Tanh Relu LeakyRelu Elu Selu Celu Gelu HardSigmoid HardSwish
    Softplus Softsign Mish Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Floor Ceil Round Sign
    Not IsNaN IsInf Cast CastLike Clip Identity ThresholdedRelu Shrink""")
BINARY = names("""
    Add Sub Mul Div Pow Mod Max Min Sum Mean And Or Xor Equal Less Greater LessOrEqual GreaterOrEqual
    BitShift BitwiseAnd BitwiseOr BitwiseXor PRelu""")
COMMUTATIVE = names("Add Mul Max Min Sum Mean And Or Xor Equal BitwiseAnd BitwiseOr BitwiseXor")
INJECTIVE = names("""
    Reshape Flatten Squeeze Unsqueeze Transpose Slice Concat Split Gather GatherElements GatherND Pad
    DepthToSpace SpaceToDepth Resize Upsample ConstantOfShape Range Trilu ReverseSequence EyeLike""")
REDUCTIONS = names("""
    ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp
    ReduceSumSquare ArgMax ArgMin""")
OTHERS = names("""
    Expand Tile Shape Size OneHot ScatterND ScatterElements Compress NonZero TopK Softmax LogSoftmax Hardmax
    LayerNormalization InstanceNormalization GroupNormalization LpNormalization MeanVarianceNormalization
    CumSum GlobalAveragePool GlobalMaxPool GlobalLpPool LRN Conv ConvTranspose ConvInteger MatMul
    MatMulInteger Gemm Einsum MaxPool AveragePool LpPool MaxRoiPool BatchNormalization Attention
    QuantizeLinear DequantizeLinear DynamicQuantizeLinear If Loop Scan NonMaxSuppression RoiAlign Constant
    Dropout RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli Where""")
RANDOM = names("RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli")


# ------------------------------------------------------------------------------------------ orders


def test_kind_numbers_match_tvm_op_pattern_kind():
    assert [int(k) for k in Kind] == [0, 1, 2, 3, 4, 7, 8]
    assert Kind.ELEMWISE < Kind.BROADCAST < Kind.INJECTIVE < Kind.COMM_REDUCE
    assert Kind.COMM_REDUCE < Kind.OUT_ELEMWISE_FUSABLE < Kind.TUPLE < Kind.OPAQUE


@pytest.mark.parametrize(("a", "b"), list(itertools.product(Kind, Kind)))
def test_combine_kinds_is_max(a, b):
    combined = combine_kinds(a, b)
    assert isinstance(combined, Kind)
    assert combined == max(a, b) == combine_kinds(b, a)


def test_combine_kinds_examples():
    assert combine_kinds(Kind.ELEMWISE, Kind.BROADCAST) is Kind.BROADCAST
    assert combine_kinds(Kind.OUT_ELEMWISE_FUSABLE, Kind.ELEMWISE) is Kind.OUT_ELEMWISE_FUSABLE
    assert combine_kinds(Kind.INJECTIVE, Kind.INJECTIVE) is Kind.INJECTIVE
    assert combine_kinds(Kind.OPAQUE, Kind.ELEMWISE) is Kind.OPAQUE


def test_mapping_complexity_order_is_dnnfusion_order():
    assert sorted(Mapping, key=lambda m: m.complexity) == MAPPING_ORDER
    assert len({m.complexity for m in Mapping}) == len(Mapping)


@pytest.mark.parametrize(("i", "j"), list(itertools.combinations(range(len(MAPPING_ORDER)), 2)))
def test_more_complex_picks_the_later_one(i, j):
    simple, complex_ = MAPPING_ORDER[i], MAPPING_ORDER[j]
    assert more_complex(simple, complex_) is complex_
    assert more_complex(complex_, simple) is complex_


@pytest.mark.parametrize("m", list(Mapping))
def test_more_complex_tie(m):
    assert more_complex(m, m) is m


# ---------------------------------------------------------------------------------------- coverage


def test_every_entry_has_both_classifications():
    assert len(KNOWN_OPS) > 200
    for (domain, op_type), info in KNOWN_OPS.items():
        assert isinstance(info, OpInfo)
        assert (info.domain, info.op_type) == (domain, op_type)
        assert isinstance(info.kind, Kind), op_type
        assert isinstance(info.mapping, Mapping), op_type
        assert domain in ("", "ai.onnx.ml", "com.microsoft", "dlcc")


@pytest.mark.parametrize("op_type", UNARY + BINARY + INJECTIVE + REDUCTIONS + OTHERS)
def test_required_ops_are_known(op_type):
    assert is_known(op_type)
    assert ("", op_type) in KNOWN_OPS


def test_every_default_domain_schema_of_onnx_is_known():
    # A new onnx release with new ops fails here on purpose: decide their kind and mapping.
    names = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    missing = sorted(n for n in names if not is_known(n))
    assert missing == []


def test_ai_onnx_is_the_default_domain():
    assert op_info("Relu", "ai.onnx") == op_info("Relu") == op_info("Relu", "")
    assert op_info("Relu", "ai.onnx").domain == ""


def test_unknown_op_is_opaque_many_to_many():
    for info in (op_info("NoSuchOp"), op_info("Conv", "com.example"), op_info("TreeEnsembleClassifier",
                                                                              "ai.onnx.ml")):
        assert info.kind is Kind.OPAQUE
        assert info.mapping is Mapping.MANY_TO_MANY
        assert not info.deterministic
        assert not (info.commutative or info.unary or info.binary)
    assert not is_known("NoSuchOp")
    assert op_info("NoSuchOp", "x.y").domain == "x.y"


def test_table_is_read_only_and_entries_frozen():
    with pytest.raises(TypeError):
        KNOWN_OPS[("", "Relu")] = op_info("Add")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        op_info("Relu").kind = Kind.OPAQUE  # type: ignore[misc]


# ------------------------------------------------------------------------------------------- flags


@pytest.mark.parametrize("op_type", BINARY)
def test_commutative_flags(op_type):
    info = op_info(op_type)
    assert info.binary
    assert info.commutative == (op_type in COMMUTATIVE)


def test_commutative_implies_binary_and_unary_excludes_binary():
    for info in KNOWN_OPS.values():
        assert not (info.unary and info.binary), info.op_type
        if info.commutative:
            assert info.binary, info.op_type


@pytest.mark.parametrize("op_type", UNARY)
def test_unary_ops_are_elementwise_one_to_one(op_type):
    info = op_info(op_type)
    assert info.unary and not info.binary
    assert info.kind is Kind.ELEMWISE
    assert info.mapping is Mapping.ONE_TO_ONE


@pytest.mark.parametrize("op_type", BINARY)
def test_binary_ops_broadcast_one_to_one(op_type):
    info = op_info(op_type)
    assert info.kind is Kind.BROADCAST
    assert info.mapping is Mapping.ONE_TO_ONE


def test_deterministic_flags():
    for op_type in RANDOM:
        assert not op_info(op_type).deterministic, op_type
        assert op_info(op_type).kind is Kind.OPAQUE
    for op_type in ("Dropout", "Add", "Conv", "Softmax", "Constant"):
        assert op_info(op_type).deterministic, op_type
    nondeterministic = {k[1] for k, v in KNOWN_OPS.items() if not v.deterministic}
    assert nondeterministic == set(RANDOM)


# -------------------------------------------------------------------------------------- families


@pytest.mark.parametrize(("op_type", "kind", "mapping"), [
    ("Conv", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("ConvTranspose", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("MatMul", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("Gemm", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("Einsum", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("MaxPool", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("GlobalAveragePool", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("Softmax", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("LayerNormalization", Kind.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY),
    ("ReduceMean", Kind.COMM_REDUCE, Mapping.MANY_TO_MANY),
    ("ArgMax", Kind.COMM_REDUCE, Mapping.MANY_TO_MANY),
    ("BatchNormalization", Kind.BROADCAST, Mapping.ONE_TO_ONE),
    ("Where", Kind.BROADCAST, Mapping.ONE_TO_ONE),
    ("Expand", Kind.BROADCAST, Mapping.ONE_TO_MANY),
    ("Tile", Kind.BROADCAST, Mapping.ONE_TO_MANY),
    ("Gather", Kind.INJECTIVE, Mapping.ONE_TO_MANY),
    ("Resize", Kind.INJECTIVE, Mapping.ONE_TO_MANY),
    ("Reshape", Kind.INJECTIVE, Mapping.REORGANIZE),
    ("Flatten", Kind.INJECTIVE, Mapping.REORGANIZE),
    ("Squeeze", Kind.INJECTIVE, Mapping.REORGANIZE),
    ("Unsqueeze", Kind.INJECTIVE, Mapping.REORGANIZE),
    ("Transpose", Kind.INJECTIVE, Mapping.SHUFFLE),
    ("DepthToSpace", Kind.INJECTIVE, Mapping.SHUFFLE),
    ("SpaceToDepth", Kind.INJECTIVE, Mapping.SHUFFLE),
    ("Concat", Kind.INJECTIVE, Mapping.ONE_TO_ONE),
    ("Slice", Kind.INJECTIVE, Mapping.ONE_TO_ONE),
    ("QuantizeLinear", Kind.BROADCAST, Mapping.ONE_TO_ONE),
    ("DynamicQuantizeLinear", Kind.COMM_REDUCE, Mapping.MANY_TO_MANY),
    ("If", Kind.OPAQUE, Mapping.MANY_TO_MANY),
    ("NonMaxSuppression", Kind.OPAQUE, Mapping.MANY_TO_MANY),
    ("TopK", Kind.OPAQUE, Mapping.MANY_TO_MANY),
    ("Shape", Kind.OPAQUE, Mapping.MANY_TO_MANY),
])
def test_family_classification(op_type, kind, mapping):
    info = op_info(op_type)
    assert (info.kind, info.mapping) == (kind, mapping)


def test_other_domains_only_where_obvious():
    assert op_info("FusedConv", "com.microsoft").kind is Kind.OUT_ELEMWISE_FUSABLE
    assert op_info("Gelu", "com.microsoft").unary
    assert op_info("Scaler", "ai.onnx.ml").mapping is Mapping.ONE_TO_ONE
    assert not is_known("ZipMap", "ai.onnx.ml")


def test_ops_with_reads_the_flags():
    assert ops_with("deterministic", value=False) == {
        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
    assert ops_with("broadcasting") == ops_with("binary") | {"Where"}
    assert {"Relu", "Clip", "Cast", "Identity"} <= ops_with("unary")
    assert "BatchNormalization" not in ops_with("broadcasting")  # per channel, not numpy broadcasting
    assert ops_with("unary", "com.microsoft") == {"Gelu", "FastGelu", "QuickGelu"}
    with pytest.raises(ValueError):
        ops_with("elementwise")


def test_c_backend_ops_are_what_lowering_takes():
    from dlcc.codegen.templates import TEMPLATES
    from dlcc.lower.element import ELEMENTWISE, INDEXED
    from dlcc.lower.lower import RESHAPE_LIKE

    lowered = set(ELEMENTWISE) | set(INDEXED) | set(TEMPLATES) | set(RESHAPE_LIKE) | {"Constant"}
    assert lowered == C_BACKEND_OPS
