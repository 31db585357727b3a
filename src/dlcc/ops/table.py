"""One table of per-op facts: TVM pattern kind, DNNFusion mapping type and a few flags.

What goes in: an op type and its domain (``""`` and ``"ai.onnx"`` are the same default domain).
What comes out: an ``OpInfo`` (frozen): the op's ``Kind`` (TVM's OpPatternKind, ordered, combined with
``max``), its ``Mapping`` (DNNFusion's mapping type, combined with ``more_complex``), and flags:
``deterministic``, ``commutative``, ``unary`` (elementwise with one data input), ``binary``
(broadcasting elementwise with two or more data inputs of the same role) and ``broadcasting`` (elementwise,
every input broadcast against the others by numpy's rules: the binary ops and Where). ``ops_with(flag)``
is the set of op types of a domain that have a flag: the passes read their op sets from here.
``C_BACKEND_OPS``: the op keys (op type, or ``domain::op_type``) dlcc's C backend compiles, which the
``dlcc-c`` target of the graph passes runs (tests/ops/test_table.py keeps it equal to what lowering takes).

Invariants:
- Every op has both classifications. An op that is not in the table is OPAQUE and MANY_TO_MANY and is
  *not* deterministic: we know nothing about it, so nothing may fuse it, reorder it or merge two of it.
- The facts describe the op in inference (``BatchNormalization`` with running statistics, ``Dropout`` as
  identity). Training-mode attributes are handled by the passes that look at attributes, not here.
- ``Kind`` numbers match TVM's ``OpPatternKind`` (kElemWise=0 ... kOpaque=8), so TVM's fusion rules read
  the same here.

Mapping types (DNNFusion, Niu et al., PLDI 2021): how output elements depend on input elements.
ONE_TO_ONE: output element i needs input element i (elementwise, with broadcasting; also Slice, Concat,
Split, Pad, which move elements without duplicating them). REORGANIZE: the same elements in the same order
under another shape (Reshape family). SHUFFLE: a permutation of the elements (Transpose,
DepthToSpace). ONE_TO_MANY: an input element feeds several output elements (Expand, Tile, Gather,
Resize). MANY_TO_MANY: an output element needs many input elements (Conv, MatMul, pooling, reductions).
"The more complex of two" uses DNNFusion's order::

    ONE_TO_ONE < REORGANIZE < SHUFFLE < ONE_TO_MANY < MANY_TO_MANY

(reorganize and shuffle only renumber elements, so they compose with anything but many-to-many without
recomputation; one-to-many duplicates work when fused into a consumer; many-to-many is a full kernel).

Pattern kinds follow TVM's Relay registrations (``register_pattern`` / ``TOpPattern``), per family:
- unary math, activations, Cast, Clip, Identity: ELEMWISE. Binary arithmetic, comparisons, logic,
  bitwise ops, Where, PRelu: BROADCAST (Relay registers them with the broadcast schedule).
- Reshape/Flatten/Squeeze/Unsqueeze, Transpose, Slice, Concat, Split, Gather*, Pad, Resize,
  DepthToSpace/SpaceToDepth, ReverseSequence, Trilu, ConstantOfShape: INJECTIVE. Expand and Tile:
  BROADCAST (Relay's broadcast_to and tile). Unsqueeze is INJECTIVE here although Relay's expand_dims is
  BROADCAST: dlcc lowers the whole reshape family to views, so they belong together.
- Reduce*, ArgMax/ArgMin: COMM_REDUCE.
- Conv, ConvTranspose, MatMul, Gemm, pooling (global pooling too): OUT_ELEMWISE_FUSABLE.
- Softmax/LogSoftmax: OUT_ELEMWISE_FUSABLE, as in current Relay (older Relay had OPAQUE only because
  of a hand-written schedule). The normalizations (LayerNormalization, InstanceNormalization,
  GroupNormalization, RMSNormalization, MeanVarianceNormalization, LpNormalization) and LRN get the same
  kind: a kernel with reductions inside whose output has the input's shape, so an elementwise epilogue
  can be applied on the write. Relay has LRN as OPAQUE and rewrites layer/instance/group norm into
  reductions + broadcasts (SimplifyInference); dlcc keeps them as one kernel.
- BatchNormalization: BROADCAST. In inference it is ``x * scale' + bias'`` per channel, which is what
  TVM's SimplifyInference turns it into (a broadcast multiply and add).
- Einsum: OUT_ELEMWISE_FUSABLE and MANY_TO_MANY (a contraction, like MatMul). Relay registers einsum
  as INJECTIVE, which is wrong for contractions.
- OneHot: OUT_ELEMWISE_FUSABLE, as Relay registers one_hot.
- Range: INJECTIVE (Relay has arange as OPAQUE only because its FuseOps ignores dynamic shapes).
- Shape and Size: OPAQUE (as Relay's shape_of: they read metadata, not data, and fold away).
- Ops with data-dependent output shapes (NonZero, Compress, Unique, TopK, NonMaxSuppression), scatters,
  scans (CumSum), recurrences (RNN/GRU/LSTM), Attention (a whole subgraph in one op; a pass may
  decompose it), control flow, sequences, random ops: OPAQUE. So is Constant: it is a weight, not a
  kernel (TVM's FuseOps, too, makes a non-scalar constant opaque).
- QuantizeLinear/DequantizeLinear: BROADCAST, ONE_TO_ONE (per-axis scale and zero point broadcast).
  DynamicQuantizeLinear: COMM_REDUCE, MANY_TO_MANY (it reduces the whole tensor to find its range).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from collections.abc import Mapping as MappingABC
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["C_BACKEND_OPS", "KNOWN_OPS", "Kind", "Mapping", "OpInfo", "combine_kinds", "is_known", "more_complex",
           "op_info", "ops_with"]


class Kind(enum.IntEnum):
    """TVM's OpPatternKind: how an op's output indexes its inputs. Larger is harder to fuse."""

    ELEMWISE = 0  # out[i] = f(in[i]), same shapes
    BROADCAST = 1  # out[i, j] = f(in[i, j], w[j]): elementwise with broadcasting
    INJECTIVE = 2  # each output element is a function of one input index (reshape, gather, concat)
    COMM_REDUCE = 3  # commutative reduction over some axes
    OUT_ELEMWISE_FUSABLE = 4  # complex kernel whose output can take an elementwise epilogue (conv)
    TUPLE = 7  # makes a tuple; kept for numbering, ONNX has no tuple op
    OPAQUE = 8  # never fused


class Mapping(enum.Enum):
    """DNNFusion's mapping type between an op's input and output elements."""

    ONE_TO_ONE = "one-to-one"
    REORGANIZE = "reorganize"
    SHUFFLE = "shuffle"
    ONE_TO_MANY = "one-to-many"
    MANY_TO_MANY = "many-to-many"

    @property
    def complexity(self) -> int:
        """Rank in DNNFusion's order (0 = simplest); see ``more_complex``."""
        return _COMPLEXITY[self]


_COMPLEXITY = {
    Mapping.ONE_TO_ONE: 0,
    Mapping.REORGANIZE: 1,
    Mapping.SHUFFLE: 2,
    Mapping.ONE_TO_MANY: 3,
    Mapping.MANY_TO_MANY: 4,
}


def combine_kinds(a: Kind, b: Kind) -> Kind:
    """The kind of a group holding ops of kinds ``a`` and ``b``: the larger one (TVM's CombinePattern)."""
    return Kind(max(a, b))


def more_complex(m1: Mapping, m2: Mapping) -> Mapping:
    """The more complex of two mapping types in DNNFusion's order; ``m1`` on a tie."""
    return m2 if m2.complexity > m1.complexity else m1


@dataclass(frozen=True)
class OpInfo:
    """Facts about one op type."""

    op_type: str
    domain: str  # "" for the default ONNX domain
    kind: Kind
    mapping: Mapping
    deterministic: bool = True
    commutative: bool = False  # binary ops only: f(a, b) == f(b, a)
    unary: bool = False  # elementwise with one data input (other inputs are scalars/attributes)
    binary: bool = False  # broadcasting elementwise over two or more same-role data inputs
    broadcasting: bool = False  # elementwise, all inputs broadcast against each other (binary ops, Where)


# ------------------------------------------------------------------------------------- the table

_K, _M = Kind, Mapping

# One row per family: (domain, kind, mapping, flags, op types). KNOWN_OPS is built from these rows.
_UNARY = dict(unary=True)
_BINARY = dict(binary=True, broadcasting=True)
_COMMUTATIVE = dict(binary=True, commutative=True, broadcasting=True)
_RANDOM = dict(deterministic=False)

_FAMILIES: list[tuple[str, Kind, Mapping, dict, str]] = [
    ("", _K.ELEMWISE, _M.ONE_TO_ONE, _UNARY,
     # unary math and activations (transcendentals included)
     "Abs Neg Exp Log Sqrt Reciprocal Sigmoid Tanh Relu LeakyRelu Elu Selu Celu Gelu HardSigmoid "
     "HardSwish Softplus Softsign Mish Swish Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh "
     "Floor Ceil Round Sign Not BitwiseNot IsNaN IsInf ThresholdedRelu Shrink Clip "
     # conversions and identities (Dropout is the identity in inference)
     "Cast CastLike Identity Dropout"),
    ("", _K.BROADCAST, _M.ONE_TO_ONE, _COMMUTATIVE,
     "Add Mul Max Min Sum Mean And Or Xor Equal BitwiseAnd BitwiseOr BitwiseXor"),
    ("", _K.BROADCAST, _M.ONE_TO_ONE, _BINARY,
     "Sub Div Pow Mod Less Greater LessOrEqual GreaterOrEqual BitShift PRelu"),
    ("", _K.BROADCAST, _M.ONE_TO_ONE, dict(broadcasting=True), "Where"),
    ("", _K.BROADCAST, _M.ONE_TO_ONE, {}, "BatchNormalization QuantizeLinear DequantizeLinear"),
    ("", _K.BROADCAST, _M.ONE_TO_MANY, {}, "Expand Tile"),
    # same elements, same order, another shape (BitCast reinterprets the bytes the same way)
    ("", _K.INJECTIVE, _M.REORGANIZE, {}, "Reshape Flatten Squeeze Unsqueeze BitCast"),
    ("", _K.INJECTIVE, _M.SHUFFLE, {}, "Transpose DepthToSpace SpaceToDepth ReverseSequence"),
    ("", _K.INJECTIVE, _M.ONE_TO_ONE, {},
     # move or mask elements without duplicating them; EyeLike only uses its input's shape;
     # SwiGLU is silu(first half) * second half along an axis
     "Slice Concat Split Pad CenterCropPad Trilu EyeLike SwiGLU"),
    ("", _K.INJECTIVE, _M.ONE_TO_MANY, {},
     # gathers and interpolation read an input element for several outputs; generators fill outputs
     "Gather GatherElements GatherND Resize Upsample GridSample ConstantOfShape Range"),
    ("", _K.OUT_ELEMWISE_FUSABLE, _M.ONE_TO_MANY, {}, "OneHot"),
    ("", _K.COMM_REDUCE, _M.MANY_TO_MANY, {},
     "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
     "ReduceLogSumExp ReduceSumSquare ArgMax ArgMin DynamicQuantizeLinear"),
    ("", _K.OUT_ELEMWISE_FUSABLE, _M.MANY_TO_MANY, {},
     # contractions
     "Conv ConvTranspose ConvInteger QLinearConv DeformConv MatMul MatMulInteger QLinearMatMul Gemm "
     "Einsum "
     # pooling, global pooling and ROI pooling
     "MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool GlobalLpPool MaxRoiPool RoiAlign "
     # softmax and normalizations: reductions inside, input-shaped output
     "Softmax LogSoftmax Hardmax LayerNormalization InstanceNormalization GroupNormalization "
     "RMSNormalization MeanVarianceNormalization LpNormalization LRN"),
    ("", _K.OPAQUE, _M.MANY_TO_MANY, _RANDOM,
     "RandomNormal RandomUniform Multinomial Bernoulli"),
    ("", _K.OPAQUE, _M.ONE_TO_ONE, _RANDOM, "RandomNormalLike RandomUniformLike"),
    ("", _K.OPAQUE, _M.MANY_TO_MANY, {},
     # metadata, constants, data-dependent shapes, scatters and scans
     "Shape Size Constant NonZero Compress Unique TopK NonMaxSuppression "
     "ScatterND ScatterElements Scatter TensorScatter MaxUnpool Col2Im CumSum CumProd "
     # many ops in one: attention, recurrences, signal processing, losses
     "Attention LinearAttention RotaryEmbedding CausalConvWithState RNN GRU LSTM Det AffineGrid "
     "DFT STFT BlackmanWindow HammingWindow HannWindow MelWeightMatrix "
     "NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss "
     # control flow, sequences, optionals, strings, images
     "If Loop Scan SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert "
     "SequenceLength SequenceMap ConcatFromSequence SplitToSequence Optional OptionalGetElement "
     "OptionalHasElement StringConcat StringNormalizer StringSplit RegexFullMatch TfIdfVectorizer "
     "ImageDecoder"),
    # ai.onnx.ml: only the obvious ones; the rest (trees, SVMs, linear models, ZipMap) are unknown.
    ("ai.onnx.ml", _K.ELEMWISE, _M.ONE_TO_ONE, _UNARY, "Binarizer Imputer LabelEncoder"),
    ("ai.onnx.ml", _K.BROADCAST, _M.ONE_TO_ONE, {}, "Scaler"),
    ("ai.onnx.ml", _K.INJECTIVE, _M.ONE_TO_MANY, {}, "ArrayFeatureExtractor"),
    ("ai.onnx.ml", _K.OUT_ELEMWISE_FUSABLE, _M.MANY_TO_MANY, {}, "Normalizer"),
    # com.microsoft (onnxruntime contrib ops): the common fused forms exporters emit.
    ("com.microsoft", _K.ELEMWISE, _M.ONE_TO_ONE, _UNARY, "Gelu FastGelu QuickGelu"),
    ("com.microsoft", _K.BROADCAST, _M.ONE_TO_ONE, {},
     "BiasGelu BiasAdd QuantizeLinear DequantizeLinear QLinearAdd QLinearMul"),
    ("com.microsoft", _K.OUT_ELEMWISE_FUSABLE, _M.MANY_TO_MANY, {},
     "FusedConv FusedGemm FusedMatMul QLinearConv SkipLayerNormalization SimplifiedLayerNormalization "
     "SkipSimplifiedLayerNormalization"),
    ("com.microsoft", _K.OPAQUE, _M.MANY_TO_MANY, {},
     "Attention MultiHeadAttention GroupQueryAttention RotaryEmbedding"),
    # dlcc's own attention (dlcc.passes.replace): contractions inside, an elementwise epilogue on the write
    ("dlcc", _K.OUT_ELEMWISE_FUSABLE, _M.MANY_TO_MANY, {}, "Attention"),
]


def _build(families: Iterable[tuple[str, Kind, Mapping, dict, str]]) -> dict[tuple[str, str], OpInfo]:
    table: dict[tuple[str, str], OpInfo] = {}
    for domain, kind, mapping, flags, ops in families:
        for op_type in ops.split():
            key = (domain, op_type)
            if key in table:
                raise AssertionError(f"op {domain or 'ai.onnx'}::{op_type} is listed twice")
            table[key] = OpInfo(op_type, domain, kind, mapping, **flags)
    return table


# (domain, op_type) -> OpInfo for every op the table knows; the default domain is "".
KNOWN_OPS: MappingABC[tuple[str, str], OpInfo] = MappingProxyType(_build(_FAMILIES))


def _normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def op_info(op_type: str, domain: str = "") -> OpInfo:
    """The facts for ``domain::op_type``; an unknown op is OPAQUE, MANY_TO_MANY and non-deterministic."""
    domain = _normalize_domain(domain)
    info = KNOWN_OPS.get((domain, op_type))
    if info is not None:
        return info
    return OpInfo(op_type, domain, Kind.OPAQUE, Mapping.MANY_TO_MANY, deterministic=False)


def is_known(op_type: str, domain: str = "") -> bool:
    """Whether the table has an entry for ``domain::op_type``."""
    return (_normalize_domain(domain), op_type) in KNOWN_OPS


def ops_with(flag: str, domain: str = "", value: bool = True) -> frozenset[str]:
    """The op types of ``domain`` whose ``OpInfo.<flag>`` is ``value``, e.g. ``ops_with("unary")``, or
    ``ops_with("deterministic", value=False)`` for the random ops. Unknown ops are in no set."""
    if flag not in _FLAGS:
        raise ValueError(f"unknown op flag '{flag}' (flags: {', '.join(_FLAGS)})")
    domain = _normalize_domain(domain)
    return frozenset(op for (d, op), info in KNOWN_OPS.items() if d == domain and getattr(info, flag) is value)


_FLAGS = ("deterministic", "commutative", "unary", "binary", "broadcasting")


# The ops dlcc's C backend compiles: the graph passes' ``dlcc-c`` target reads it (they run before the
# backend and cannot ask it); a test compares it with ``dlcc.lower.lower.supported``.
C_BACKEND_OPS = frozenset({
    # linear and pooling
    "Conv", "ConvTranspose", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "LRN",
    # elementwise unary
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Neg",
    "Erf", "Floor", "Ceil", "Round", "Sign", "Clip", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
    "Softplus", "Softsign", "Gelu", "Mish", "Sin", "Cos", "Not", "Cast", "Identity", "Dropout",
    # elementwise binary / variadic
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Mod", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where",
    # reductions and normalization
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ArgMax", "ArgMin",
    "Softmax", "LogSoftmax", "LayerNormalization", "ReduceL1", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
    "BatchNormalization", "InstanceNormalization", "RMSNormalization",
    # data movement
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Concat", "Split", "Gather",
    "Pad", "Resize", "Expand", "Tile", "Shape", "Constant", "ConstantOfShape", "DepthToSpace", "SpaceToDepth",
    "GatherElements", "Upsample",
    # dlcc's own: the channel shuffle idiom as one op, attention as one op
    "dlcc::ChannelShuffle", "dlcc::Attention",
})
