"""Seeded random weights for test models, so that layout and indexing bugs cannot hide behind equal values.

What goes in: an ``onnx.ModelProto`` (never modified) and a seed.
What comes out: a new ``onnx.ModelProto`` whose floating-point weights are random, drawn per tensor from
a generator seeded by ``(seed, crc32(tensor name))``: the same seed gives identical bytes, another seed
other weights. (BatchNormalization statistics come from an onnxruntime run, see below: identical bytes
on one machine; rounded so that other machines almost always agree.)

Algorithm: every float weight site of the main graph is found first — float initializers, float
``Constant`` nodes (``value`` / ``value_floats``) and float ``ConstantOfShape`` nodes whose shape is a
constant. Its role comes from its consumers, looked up through shape-only ops (Reshape, Transpose,
Unsqueeze, ...), whose effect on the shape is tracked so fan-in is measured on the shape the consumer
sees (weight, bias and generic values are uniform, zero-mean, with the standard deviation shown):

    role        consumers                                   values
    weight      Conv/Gemm/MatMul/RNN weight inputs          std sqrt(2 / fan_in)
    bias        Conv/Gemm/RNN bias, BN mean/bias, Add/Sub   std 0.1
    scale       BN/norm scale, Mul                          uniform [0.5, 1.5]
    positive    BN variance, divisor, Sqrt/Log/Pow base     uniform [0.5, 1.5]
    slope       PRelu slope                                 uniform [0.05, 0.3]
    generic     Gather tables and anything else             std 1
    keep        Pow exponent, Clip bounds, Resize scales,   unchanged
                Pad value, Dropout ratio, Cast to non-float

Scalars (one element) keep their value unless a parametric op (Conv, Gemm, MatMul, normalization, RNN,
PRelu, Gather) consumes them: they are eps, 0.5, sqrt(2), attention scales and mask fill values, whose
value is the point. Then the sites are rewritten: initializers in place (same position and name),
Constant attributes in place, and each such ConstantOfShape becomes an initializer named like its
output; its shape constant goes away once nothing else uses it. Last, random BN running statistics
would not normalize anything (a randomized ResNet-50 ends near 1e4 with a one-hot softmax), so each
BatchNormalization's mean/variance is set near the statistics its input really has (one onnxruntime
run of a probe copy; ``calibrate_bn=False`` skips this).

Invariants: integer and bool tensors are kept; a ConstantOfShape whose shape is an overridable
initializer (a graph input, IR >= 4) is not a constant and is kept; graph inputs (other than constant shapes that are no
longer used), outputs, node order and names are kept; the IR version is kept, and under IR < 4 (where
every initializer must be a graph input, as in the light models the onnx wheel ships) the initializers
created here are listed as graph inputs too, so onnxruntime still treats them as constants. Subgraphs
(If/Loop bodies) and functions are left as they are.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

__all__ = ["randomize"]

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16})

WEIGHT_GAIN = math.sqrt(2.0)  # He: keeps activations O(1) through Relu stacks as deep as VGG-19
BIAS_STD = 0.1

# Ops whose input 0 passes through with only its shape (or float type) changed.
_PASS_THROUGH = frozenset({"Identity", "Cast", "CastLike", "Transpose", "Unsqueeze", "Squeeze", "Reshape",
                           "Flatten", "Expand"})

# (op, input index) pairs whose float values are structure, not weights.
_KEEP_INPUTS = {
    "Pow": {1}, "Clip": {1, 2}, "Resize": {1, 2}, "Upsample": {1}, "Pad": {2}, "Dropout": {1},
    "Range": {0, 1, 2}, "RoiAlign": {1}, "NonMaxSuppression": {3, 4}, "TopK": {1}, "OneHot": {2},
}

# Priority when a value has several consumers: the most constraining role wins.
_PRIORITY = ("keep", "positive", "weight", "slope", "scale", "bias", "generic")


@dataclass(frozen=True)
class _Role:
    kind: str
    fan_in: int = 1
    param: bool = False  # consumed by a parametric op: randomized even when it is a scalar


@dataclass
class _Site:
    kind: str  # "initializer", "constant", "constant_floats", "constant_of_shape"
    name: str  # the value's name
    shape: tuple[int, ...]
    elem_type: int
    node: onnx.NodeProto | None = None
    init: onnx.TensorProto | None = None
    fill: float = 0.0  # ConstantOfShape fill value


def randomize(model: onnx.ModelProto, seed: int = 0, *, calibrate_bn: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` with seeded random float weights (see the module docstring for the rules).

    With ``calibrate_bn`` the BatchNormalization running statistics are set near the statistics the
    randomized model really produces (one onnxruntime run, see ``_calibrate_batchnorm``).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    info = _GraphInfo(graph, out.ir_version)
    sites = list(_sites(graph, info))
    new_inits: list[tuple[str, np.ndarray]] = []
    dropped_nodes: set[int] = set()
    for site in sites:
        role = info.role(site.name, site.shape)
        keep = role.kind == "keep" or (math.prod(site.shape) <= 1 and not role.param)
        if site.kind == "constant_of_shape":
            assert site.node is not None
            np_type = helper.tensor_dtype_to_np_dtype(site.elem_type)
            values = np.full(site.shape, site.fill, dtype=np_type) if keep else \
                _sample(role, site.shape, site.elem_type, _rng(seed, site.name))
            new_inits.append((site.name, values))
            dropped_nodes.add(id(site.node))
            continue
        if keep:
            continue
        values = _sample(role, site.shape, site.elem_type, _rng(seed, site.name))
        if site.kind == "initializer":
            assert site.init is not None
            _fill_tensor(site.init, values)
        else:
            assert site.node is not None
            attr = next(a for a in site.node.attribute if a.name in ("value", "value_floats"))
            if site.kind == "constant":
                _fill_tensor(attr.t, values)
            else:
                del attr.floats[:]
                attr.floats.extend(float(v) for v in values.ravel())
    if dropped_nodes:
        _replace_constant_of_shape(out, dropped_nodes, new_inits)
    if calibrate_bn:
        _calibrate_batchnorm(out, seed)
    return out


# ------------------------------------------------------------------------------------------ analysis


class _GraphInfo:
    """Consumers and constant integer values of the main graph."""

    def __init__(self, graph: onnx.GraphProto, ir_version: int) -> None:
        # Under IR >= 4 an initializer that is also a graph input can be overridden: not a constant.
        overridable = {i.name for i in graph.input} if ir_version >= 4 else set()
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        self.captured: set[str] = set()  # names used inside subgraphs
        self.int_consts: dict[str, onnx.TensorProto] = {}
        for t in graph.initializer:
            if t.data_type in (TensorProto.INT64, TensorProto.INT32) and t.name not in overridable:
                self.int_consts[t.name] = t
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, i))
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                for a in node.attribute:
                    if a.name == "value" and a.t.data_type in (TensorProto.INT64, TensorProto.INT32):
                        self.int_consts[node.output[0]] = a.t
                    elif a.name in ("value_int", "value_ints"):
                        vals = [a.i] if a.name == "value_int" else list(a.ints)
                        arr = np.asarray(vals if a.name == "value_ints" else vals[0], dtype=np.int64)
                        self.int_consts[node.output[0]] = numpy_helper.from_array(arr)
            for sub in _subgraphs(node):
                self.captured.update(_names_used(sub))
        self.graph_outputs = {o.name for o in graph.output}

    def ints(self, name: str) -> list[int] | None:
        t = self.int_consts.get(name)
        if t is None or t.data_location == TensorProto.EXTERNAL:
            return None
        return [int(v) for v in numpy_helper.to_array(t).ravel()]

    def role(self, name: str, shape: tuple[int, ...]) -> _Role:
        # Where a shape-only op's effect is unknown, measure fan-in on the tensor's own shape.
        roles = [_role_of_use(node, idx, shape if seen is None else seen)
                 for node, idx, seen in self._uses(name, shape, 0)]
        if name in self.captured or name in self.graph_outputs:
            roles.append(_Role("generic"))
        if not roles:
            return _Role("generic")
        best = min(roles, key=lambda r: _PRIORITY.index(r.kind))
        return _Role(best.kind, best.fan_in, any(r.param for r in roles))

    def _uses(self, name: str, shape: tuple[int, ...] | None,
              depth: int) -> Iterator[tuple[onnx.NodeProto, int, tuple[int, ...] | None]]:
        for node, idx in self.consumers.get(name, []):
            if idx == 0 and node.op_type in _PASS_THROUGH and node.domain in ("", "ai.onnx") and depth < 16:
                if node.op_type == "Cast" and _attr(node, "to", TensorProto.FLOAT) not in FLOAT_TYPES:
                    yield node, -1, None  # becomes an integer or bool: structure, keep
                    continue
                yield from self._uses(node.output[0], self._pass_shape(node, shape), depth + 1)
            else:
                yield node, idx, shape

    def _pass_shape(self, node: onnx.NodeProto, shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """The shape of a pass-through op's output, when it follows from constants; else None."""
        if shape is None:
            return None
        op = node.op_type
        try:
            if op in ("Identity", "Cast", "CastLike"):
                return shape
            if op == "Transpose":
                perm = _attr(node, "perm", None) or list(range(len(shape)))[::-1]
                return tuple(shape[p] for p in perm)
            if op == "Flatten":
                axis = _attr(node, "axis", 1)
                axis = axis + len(shape) if axis < 0 else axis
                return (math.prod(shape[:axis]), math.prod(shape[axis:]))
            if op in ("Unsqueeze", "Squeeze"):
                axes = _attr(node, "axes", None)
                if axes is None and len(node.input) > 1 and node.input[1]:
                    axes = self.ints(node.input[1])
                    if axes is None:
                        return None
                if op == "Squeeze":
                    if axes is None:
                        return tuple(d for d in shape if d != 1)
                    drop = {a % len(shape) for a in axes}
                    return tuple(d for i, d in enumerate(shape) if i not in drop)
                if axes is None:
                    return None
                rank = len(shape) + len(axes)
                put = {a % rank for a in axes}
                it = iter(shape)
                return tuple(1 if i in put else next(it) for i in range(rank))
            if op == "Reshape":
                target = self.ints(node.input[1])
                if target is None:
                    return None
                allowzero = _attr(node, "allowzero", 0)
                dims = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
                if -1 in dims:
                    known = math.prod(d for d in dims if d != -1)
                    dims[dims.index(-1)] = math.prod(shape) // known if known else 0
                return tuple(dims)
            if op == "Expand":
                target = self.ints(node.input[1])
                return None if target is None else tuple(np.broadcast_shapes(shape, tuple(target)))
        except (IndexError, ValueError, StopIteration, ZeroDivisionError):
            return None
        return None


def _role_of_use(node: onnx.NodeProto, idx: int, seen: tuple[int, ...] | None) -> _Role:
    op = node.op_type
    if idx < 0 or idx in _KEEP_INPUTS.get(op, ()):
        return _Role("keep")
    shape = seen or ()
    if op in ("Conv", "ConvTranspose", "ConvInteger"):
        if idx == 1:
            fan = math.prod(shape[1:]) if op != "ConvTranspose" else \
                (shape[0] if shape else 1) * math.prod(shape[2:])
            return _Role("weight", fan, True)
        return _Role("bias", param=True)
    if op == "Gemm":
        if idx == 2:
            return _Role("bias", param=True)
        trans = _attr(node, "transA" if idx == 0 else "transB", 0)
        if len(shape) == 2:  # the K dimension: A is [M, K] and B is [K, N] before transposition
            k_axis = (1 if idx == 0 else 0) if not trans else (0 if idx == 0 else 1)
            fan = shape[k_axis]
        else:
            fan = math.prod(shape[1:])
        return _Role("weight", fan, True)
    if op in ("MatMul", "MatMulInteger"):
        # B is [..., K, N] (a vector B is [K]); A is [..., M, K]
        k_axis = -2 if idx == 1 and len(shape) >= 2 else -1
        return _Role("weight", shape[k_axis] if shape else 1, True)
    if op in ("LSTM", "GRU", "RNN"):
        if idx in (1, 2):
            return _Role("weight", shape[-1] if shape else 1, True)
        return _Role("bias", param=True)
    if op == "BatchNormalization":
        return {1: _Role("scale", param=True), 4: _Role("positive", param=True)}.get(
            idx, _Role("bias", param=True))
    if op in ("InstanceNormalization", "LayerNormalization", "GroupNormalization",
              "SimplifiedLayerNormalization", "SkipLayerNormalization", "RMSNormalization"):
        return _Role("scale", param=True) if idx == 1 else _Role("bias", param=True)
    if op == "PRelu":
        return _Role("slope", param=True)
    if op == "Gather":
        return _Role("generic", param=idx == 0)
    if op == "Mul":
        return _Role("scale")
    if op in ("Add", "Sub", "Sum"):
        return _Role("bias")
    if op in ("Div", "Mod") and idx == 1:
        return _Role("positive")
    if op in ("Sqrt", "Log", "Reciprocal", "Pow"):
        return _Role("positive")
    return _Role("generic")


# ---------------------------------------------------------------------------------------- sampling


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(name.encode("utf-8"))])


def _sample(role: _Role, shape: tuple[int, ...], elem_type: int, rng: np.random.Generator) -> np.ndarray:
    np_type = helper.tensor_dtype_to_np_dtype(elem_type)
    work = np.float64 if elem_type == TensorProto.DOUBLE else np.float32
    if role.kind in ("scale", "positive"):
        arr = rng.uniform(0.5, 1.5, shape).astype(work)
    elif role.kind == "slope":
        arr = rng.uniform(0.05, 0.3, shape).astype(work)
    else:  # uniform with the standard deviation of the role: as fast to draw as it gets
        std = {"weight": WEIGHT_GAIN / math.sqrt(max(role.fan_in, 1)), "bias": BIAS_STD}.get(role.kind, 1.0)
        arr = rng.random(shape, dtype=work)
        arr -= work(0.5)
        arr *= work(2.0 * math.sqrt(3.0) * std)
    return arr.astype(np_type, copy=False)


# ------------------------------------------------------------------------------ BN calibration


def _calibrate_batchnorm(model: onnx.ModelProto, seed: int) -> None:
    """Set each BatchNormalization's running mean/variance near the real statistics of its input.

    Random running statistics do not normalize anything: residual sums then double the variance block
    after block (ResNet-50 ends with activations around 1e4 and a one-hot softmax). A trained network's
    statistics do match its activations, so: one onnxruntime run of a probe copy in which every BN uses
    the per-channel mean/variance of its actual input (over batch and spatial axes) and reports them;
    then running mean = that mean + 0.05 std noise, running variance = that variance * U[0.7, 1.4],
    both drawn from the seeded generator. The measured statistics are rounded to 10 mantissa bits first,
    so other machines' last-bit differences in onnxruntime rarely change the bytes.

    Best effort: models whose probe onnxruntime cannot build or run are left as they are.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = defaultdict(int)
    for node in graph.node:
        for name in node.input:
            uses[name] += 1
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    bns = [n for n in graph.node
           if n.op_type == "BatchNormalization" and n.domain in ("", "ai.onnx") and len(n.input) == 5
           and sum(1 for o in n.output if o) == 1 and _attr(n, "spatial", 1) == 1
           and all(n.input[i] in inits and inits[n.input[i]].data_type in FLOAT_TYPES
                   and uses[n.input[i]] == 1 for i in (3, 4))]
    if not bns or opset < 7:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    position = {id(n): i for i, n in enumerate(graph.node)}
    stats = _add_probe_statistics(probe, opset, {position[id(n)]: k for k, n in enumerate(bns)})
    feeds = _probe_feeds(probe.graph, seed)
    if feeds is None:
        return
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        del probe
        results = dict(zip(stats, sess.run(stats, feeds), strict=True))
    except Exception:  # best effort: onnxruntime raises its own exception types
        return
    for k, bn in enumerate(bns):
        mean_t, var_t = inits[bn.input[3]], inits[bn.input[4]]
        mean = _round_mantissa(np.asarray(results[f"__dlcc_calib{k}_mean"], dtype=np.float64).ravel())
        var = _round_mantissa(np.asarray(results[f"__dlcc_calib{k}_var"], dtype=np.float64).ravel())
        if mean.shape != tuple(mean_t.dims) or var.shape != tuple(var_t.dims) or \
                not (np.isfinite(mean).all() and np.isfinite(var).all()):
            continue
        rng = _rng(seed, bn.input[4] + "#calibration")
        var = np.maximum(var, 0.0)
        floor = 1e-4 * float(var.max()) + 1e-6
        new_var = (var + floor) * rng.uniform(0.7, 1.4, var.shape)
        new_mean = mean + 0.05 * np.sqrt(var + floor) * rng.standard_normal(mean.shape)
        for t, values in ((mean_t, new_mean), (var_t, new_var)):
            np_type = helper.tensor_dtype_to_np_dtype(t.data_type)
            _fill_tensor(t, values.astype(np_type))


def _add_probe_statistics(probe: onnx.ModelProto, opset: int, bn_at: dict[int, int]) -> list[str]:
    """Make every BN listed in ``bn_at`` (node index -> number k) of ``probe`` use the statistics of its
    actual input, and expose them as outputs ``__dlcc_calib{k}_mean`` / ``_var``."""
    graph = probe.graph
    shape = "__dlcc_calib_shape"
    graph.initializer.append(numpy_helper.from_array(np.asarray([0, 0, -1], dtype=np.int64), shape))
    if probe.ir_version < 4:
        graph.input.append(helper.make_tensor_value_info(shape, TensorProto.INT64, [3]))
    axes_name = "__dlcc_calib_axes"
    if opset >= 18:
        graph.initializer.append(numpy_helper.from_array(np.asarray([0, 2], dtype=np.int64), axes_name))
        if probe.ir_version < 4:
            graph.input.append(helper.make_tensor_value_info(axes_name, TensorProto.INT64, [2]))

    def mean(x: str, out: str, keep: int) -> onnx.NodeProto:
        if opset >= 18:
            return helper.make_node("ReduceMean", [x, axes_name], [out], keepdims=keep)
        return helper.make_node("ReduceMean", [x], [out], axes=[0, 2], keepdims=keep)

    nodes: list[onnx.NodeProto] = []
    outputs: list[str] = []
    for i, node in enumerate(graph.node):
        k = bn_at.get(i)
        if k is None:
            nodes.append(node)
            continue
        p = f"__dlcc_calib{k}"
        x = node.input[0]
        nodes += [
            helper.make_node("Reshape", [x, shape], [f"{p}_x3"]),
            mean(f"{p}_x3", f"{p}_mean_keep", 1),
            helper.make_node("Sub", [f"{p}_x3", f"{p}_mean_keep"], [f"{p}_centered"]),
            helper.make_node("Mul", [f"{p}_centered", f"{p}_centered"], [f"{p}_sq"]),
            mean(f"{p}_sq", f"{p}_var", 0),
            mean(f"{p}_x3", f"{p}_mean", 0),
        ]
        bn = onnx.NodeProto()
        bn.CopyFrom(node)
        bn.input[3] = f"{p}_mean"
        bn.input[4] = f"{p}_var"
        nodes.append(bn)
        elem = next(t.data_type for t in graph.initializer if t.name == node.input[3])
        for suffix in ("mean", "var"):
            outputs.append(f"{p}_{suffix}")
            graph.output.append(helper.make_tensor_value_info(f"{p}_{suffix}", elem, None))
    del graph.node[:]
    graph.node.extend(nodes)
    return outputs


def _probe_feeds(graph: onnx.GraphProto, seed: int) -> dict[str, np.ndarray] | None:
    """Seeded inputs for the probe run: floats standard normal, integers in [0, 4), bools False."""
    inits = {t.name for t in graph.initializer}
    rng = _rng(seed, "#probe-inputs")
    feeds = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            return None
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim)
        np_type = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if tt.elem_type in FLOAT_TYPES:
            feeds[vi.name] = rng.standard_normal(shape).astype(np_type)
        elif tt.elem_type == TensorProto.BOOL:
            feeds[vi.name] = np.zeros(shape, dtype=bool)
        else:
            feeds[vi.name] = rng.integers(0, 4, shape).astype(np_type)
    return feeds


def _round_mantissa(x: np.ndarray, bits: int = 10) -> np.ndarray:
    mant, exp = np.frexp(x)
    return np.ldexp(np.round(mant * (1 << bits)) / (1 << bits), exp)


# --------------------------------------------------------------------------------- finding the sites


def _sites(graph: onnx.GraphProto, info: _GraphInfo) -> Iterator[_Site]:
    for t in graph.initializer:
        if t.data_type in FLOAT_TYPES:
            yield _Site("initializer", t.name, tuple(int(d) for d in t.dims), t.data_type, init=t)
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and a.t.data_type in FLOAT_TYPES and \
                        a.t.data_location != TensorProto.EXTERNAL:
                    yield _Site("constant", node.output[0], tuple(int(d) for d in a.t.dims), a.t.data_type,
                                node=node)
                elif a.name == "value_floats":
                    yield _Site("constant_floats", node.output[0], (len(a.floats),), TensorProto.FLOAT,
                                node=node)
        elif node.op_type == "ConstantOfShape" and node.input and node.output[0]:
            elem_type, fill = TensorProto.FLOAT, 0.0
            for a in node.attribute:
                if a.name == "value" and a.type == AttributeProto.TENSOR:
                    elem_type = a.t.data_type
                    vals = numpy_helper.to_array(a.t).ravel()
                    fill = float(vals[0]) if vals.size and elem_type in FLOAT_TYPES else 0.0
            shape = info.ints(node.input[0])
            if elem_type in FLOAT_TYPES and shape is not None and all(d >= 0 for d in shape):
                yield _Site("constant_of_shape", node.output[0], tuple(shape), elem_type, node=node,
                            fill=fill)


def _replace_constant_of_shape(model: onnx.ModelProto, dropped: set[int],
                               new_inits: list[tuple[str, np.ndarray]]) -> None:
    """Drop the materialized ConstantOfShape nodes, add their initializers, and remove shape constants
    (initializer + graph input + value_info, or Constant node) that nothing uses any more."""
    graph = model.graph
    kept = [n for n in graph.node if id(n) not in dropped]
    shape_names = {n.input[0] for n in graph.node if id(n) in dropped}
    used = {name for n in kept for name in n.input} | {o.name for o in graph.output}
    for n in kept:
        for sub in _subgraphs(n):
            used |= _names_used(sub)
    unused = shape_names - used
    kept = [n for n in kept if not (n.op_type == "Constant" and n.output[0] in unused)]
    del graph.node[:]
    graph.node.extend(kept)
    for field in (graph.initializer, graph.input, graph.value_info):
        items = [x for x in field if x.name not in unused]
        if len(items) != len(field):
            del field[:]
            field.extend(items)
    made = set()
    for name, values in new_inits:
        t = graph.initializer.add()  # filled in place: no copy of what may be hundreds of megabytes
        t.name = name
        _fill_tensor(t, values)
        made.add(name)
        if model.ir_version < 4:  # IR 3: every initializer must be a graph input (and is a constant)
            graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    # The produced values are initializers now; a stale value_info entry would only repeat their type.
    infos = [v for v in graph.value_info if v.name not in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)


# ------------------------------------------------------------------------------------------- helpers


def _fill_tensor(t: onnx.TensorProto, values: np.ndarray) -> None:
    """Make ``t`` hold ``values`` as raw little-endian data (same name; dims and type from ``values``)."""
    name = t.name
    t.Clear()
    t.name = name
    t.dims.extend(values.shape)
    t.data_type = helper.np_dtype_to_tensor_dtype(values.dtype)
    t.raw_data = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    subs: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            subs.append(a.g)
        elif a.type == AttributeProto.GRAPHS:
            subs.extend(a.graphs)
    return subs


def _names_used(graph: onnx.GraphProto) -> set[str]:
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
        for sub in _subgraphs(node):
            names |= _names_used(sub)
    return names
