"""Random well-formed ONNX graphs for differential testing (``dlcc.testing.differential``).

What goes in: a seed (``random_graph(seed)``, plain ``random.Random``: deterministic) or hypothesis's
draws (``graphs()``, a strategy built on the same building blocks, so hypothesis can shrink a failure).
What comes out: an ``onnx.ModelProto`` (opset 17 or 18, float32, static shapes, 1-4 graph inputs, 1-3 graph
outputs, some taken from the middle of the graph) that passes ``onnx.checker.check_model(full_check=True)``.

Contents: elementwise and broadcast chains (Add/Sub/Mul/Div with safe divisors, Relu, Sigmoid, Tanh, Exp of
clipped values, Abs, Neg, Sqrt of Abs, Max/Min, Where with a comparison mask, Clip, LeakyRelu, Gelu-like
chains), reductions (ReduceSum/Mean/Max, axes, keepdims), Softmax, Reshape/Transpose/Slice/Concat/Split/
Squeeze/Unsqueeze/Flatten, Conv (1x1, 3x3, pads, strides, dilations, groups), MatMul, Gemm (constant
weights), BatchNormalization (positive var), LayerNormalization, MaxPool/AveragePool/GlobalAveragePool,
shared subexpressions (a node duplicated on the same inputs; values with several consumers), constants
(scalars and small tensors) as initializers.

Invariants: every value's shape is tracked here (and declared for the graph outputs, so a wrong formula
fails the checker's full check); no tensor exceeds ``MAX_ELEMS`` elements; values stay finite for standard
normal inputs (Exp only of clipped values, divisors bounded away from zero, Sqrt of Abs).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["MAX_ELEMS", "MAX_NODES", "OPS", "Chooser", "build_graph", "graphs", "random_graph"]

MAX_ELEMS = 4096
MAX_NODES = 25


class Chooser:
    """The source of every decision the builder takes: ``random.Random`` or hypothesis draws."""

    def int(self, lo: int, hi: int) -> int:  # inclusive
        raise NotImplementedError

    def choice(self, seq: Sequence):
        return seq[self.int(0, len(seq) - 1)]

    def bool(self, p: float = 0.5) -> bool:  # noqa: ARG002  (hypothesis ignores p)
        return self.int(0, 1) == 1

    def float(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.int(0, 1000) / 1000


class _RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def bool(self, p: float = 0.5) -> bool:
        return self.rng.random() < p


class _DrawChooser(Chooser):
    def __init__(self, draw):
        from hypothesis import strategies as st

        self.draw = draw
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi))


@dataclass(frozen=True)
class Val:
    name: str
    shape: tuple[int, ...]


def _size(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    r = max(len(a), len(b))
    a = (1,) * (r - len(a)) + tuple(a)
    b = (1,) * (r - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            return None
        out.append(max(x, y))
    return tuple(out)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class _Builder:
    def __init__(self, ch: Chooser):
        self.ch = ch
        self.opset = ch.choice((17, 18))
        self.np = np.random.default_rng(ch.int(0, 2**31 - 1))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[Val] = []
        self.pool: list[Val] = []  # float values a new node may read
        self.computed: list[Val] = []  # node outputs (candidates for graph outputs)
        self.count = 0
        self.shapes: dict[str, tuple[int, ...]] = {}  # every single-output node's result

    # ---- names, constants, nodes -----------------------------------------------------------------------
    def fresh(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, array, prefix: str = "c") -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), "i")

    def fconst(self, shape: Sequence[int], scale: float = 1.0, positive: bool = False) -> str:
        a = self.np.standard_normal(tuple(shape)).astype(np.float32) * np.float32(scale)
        if positive:
            a = np.abs(a) + np.float32(0.5)
        return self.const(a.astype(np.float32), "w")

    def scalar(self, value: float) -> str:
        return self.const(np.asarray(value, dtype=np.float32), "s")

    def node(self, op: str, inputs: Sequence[str], shape: Sequence[int], n_out: int = 1, **attrs) -> Val:
        outs = [self.fresh() for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, **attrs))
        self.shapes[outs[0]] = tuple(shape)
        return Val(outs[0], tuple(shape))

    def emit(self, v: Val) -> Val:
        """Publish a node output: later nodes may read it, it may become a graph output."""
        self.pool.append(v)
        self.computed.append(v)
        return v

    # ---- picking operands -----------------------------------------------------------------------------
    def pick(self, where: Callable[[Val], bool] = lambda v: True) -> Val | None:
        cands = [v for v in self.pool if where(v)]
        if not cands:
            return None
        if self.ch.bool(0.6):  # mostly one of the newest: deep chains
            return cands[len(cands) - 1 - self.ch.int(0, min(3, len(cands) - 1))]
        return self.ch.choice(cands)

    def partner(self, x: Val) -> tuple[str, tuple[int, ...]] | None:
        """A second operand broadcastable with ``x``: x itself, a pool value or a constant."""
        kind = self.ch.int(0, 3)
        if kind == 0:
            return x.name, x.shape
        if kind == 1:
            y = self.pick(lambda v: v is not x and (s := _broadcast(x.shape, v.shape)) is not None
                          and _size(s) <= MAX_ELEMS)
            if y is not None:
                return y.name, y.shape
        # a constant: scalar, a suffix of x's shape, or x's shape with some dims 1
        form = self.ch.int(0, 2)
        if form == 0 or not x.shape:
            shape: tuple[int, ...] = ()
        elif form == 1:
            shape = x.shape[self.ch.int(0, len(x.shape) - 1):]
        else:
            shape = tuple(1 if self.ch.bool() else d for d in x.shape)
        return self.fconst(shape), shape


# ---- the building blocks: each appends nodes and returns the value it made (or None: not applicable) ---
def _unary(b: _Builder) -> Val | None:
    x = b.pick()
    op = b.ch.choice(("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Sqrt", "LeakyRelu", "Clip", "Erf"))
    if op == "Exp":  # of clipped values: finite
        c = b.node("Clip", [x.name, b.scalar(-4.0), b.scalar(3.0)], x.shape)
        return b.node("Exp", [c.name], x.shape)
    if op == "Sqrt":  # of Abs
        a = b.node("Abs", [x.name], x.shape)
        return b.node("Sqrt", [a.name], x.shape)
    if op == "LeakyRelu":
        return b.node(op, [x.name], x.shape, alpha=b.ch.choice((0.01, 0.1, 0.2, 1.5)))
    if op == "Clip":
        lo = b.ch.choice((-1.0, -0.5, 0.0, None))
        hi = b.ch.choice((1.0, 0.5, 6.0, None))
        ins = [x.name, "" if lo is None else b.scalar(lo), "" if hi is None else b.scalar(hi)]
        while ins[-1] == "":
            ins.pop()
        return b.node(op, ins, x.shape)
    return b.node(op, [x.name], x.shape)


def _binary(b: _Builder) -> Val | None:
    x = b.pick()
    p = b.partner(x)
    name, shape = p
    out = _broadcast(x.shape, shape)
    if out is None or _size(out) > MAX_ELEMS:
        return None
    op = b.ch.choice(("Add", "Mul", "Sub", "Div", "Max", "Min"))
    if op == "Div":  # a safe divisor: |y| + c (c >= 0.5), or a constant away from zero
        if b.ch.bool():
            a = b.node("Abs", [name], shape)
            d = b.node("Add", [a.name, b.scalar(b.ch.choice((0.5, 1.0, 2.0)))], shape)
            name = d.name
        else:
            vals = b.np.uniform(0.5, 2.0, shape) * b.np.choice((-1.0, 1.0), shape)
            name = b.const(np.asarray(vals, dtype=np.float32), "w")
    first, second = (x.name, name) if b.ch.bool() or op == "Div" else (name, x.name)
    return b.node(op, [first, second], out)


def _where(b: _Builder) -> Val | None:
    x = b.pick()
    lhs, rhs = x.name, None
    y = b.pick(lambda v: (s := _broadcast(x.shape, v.shape)) is not None and _size(s) <= MAX_ELEMS)
    rhs = y.name if y is not None and b.ch.bool() else b.scalar(b.ch.choice((0.0, 0.5, -0.25)))
    rshape = y.shape if y is not None and rhs == y.name else ()
    mshape = _broadcast(x.shape, rshape)
    cmp = b.ch.choice(("Greater", "Less", "GreaterOrEqual", "LessOrEqual"))
    mask = b.node(cmp, [lhs, rhs], mshape)
    p = b.partner(x)
    out = _broadcast(mshape, p[1])
    other = b.pick(lambda v: (s := _broadcast(out, v.shape)) is not None and _size(s) <= MAX_ELEMS) \
        if out is not None else None
    if out is None or other is None:
        return None
    out = _broadcast(out, other.shape)
    if _size(out) > MAX_ELEMS:
        return None
    return b.node("Where", [mask.name, p[0], other.name], out)


def _gelu(b: _Builder) -> Val | None:
    x = b.pick()
    s = x.shape
    form = b.ch.int(0, 2)
    if form == 0:  # 0.5 x (1 + erf(x / sqrt 2))
        d = b.node("Div", [x.name, b.scalar(math.sqrt(2.0))], s)
        e = b.node("Erf", [d.name], s)
        a = b.node("Add", [e.name, b.scalar(1.0)], s)
        m = b.node("Mul", [x.name, a.name], s)
        return b.node("Mul", [m.name, b.scalar(0.5)], s)
    if form == 1:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x2 = b.node("Mul", [x.name, x.name], s)
        x3 = b.node("Mul", [x2.name, x.name], s)
        c = b.node("Mul", [x3.name, b.scalar(0.044715)], s)
        a = b.node("Add", [x.name, c.name], s)
        k = b.node("Mul", [a.name, b.scalar(math.sqrt(2 / math.pi))], s)
        t = b.node("Tanh", [k.name], s)
        o = b.node("Add", [t.name, b.scalar(1.0)], s)
        h = b.node("Mul", [x.name, b.scalar(0.5)], s)
        return b.node("Mul", [h.name, o.name], s)
    k = b.node("Mul", [x.name, b.scalar(1.702)], s)  # x sigmoid(1.702 x)
    g = b.node("Sigmoid", [k.name], s)
    return b.node("Mul", [x.name, g.name], s)


def _reduce(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    op = b.ch.choice(("ReduceSum", "ReduceMean", "ReduceMax"))
    r = len(x.shape)
    axes = sorted({b.ch.int(0, r - 1) for _ in range(b.ch.int(1, r))})
    keep = b.ch.int(0, 1)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    axes_given = [a - r if b.ch.bool() else a for a in axes]
    if op == "ReduceSum" or b.opset >= 18:
        return b.node(op, [x.name, b.ints(axes_given)], shape, keepdims=keep)
    return b.node(op, [x.name], shape, axes=axes_given, keepdims=keep)


def _softmax(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    r = len(x.shape)
    return b.node("Softmax", [x.name], x.shape, axis=b.ch.int(-r, r - 1))


def _factor(b: _Builder, n: int, rank: int) -> list[int]:
    dims = []
    for _ in range(rank - 1):
        d = b.ch.choice(_divisors(n))
        dims.append(d)
        n //= d
    dims.append(n)
    return dims


def _reshape(b: _Builder) -> Val | None:
    x = b.pick()
    shape = _factor(b, _size(x.shape), b.ch.int(1, 4))
    given = list(shape)
    if b.ch.bool(0.3):
        given[b.ch.int(0, len(given) - 1)] = -1
    elif b.ch.bool(0.2):  # 0 copies the input's dim
        i = b.ch.int(0, len(given) - 1)
        if i < len(x.shape) and x.shape[i] == shape[i]:
            given[i] = 0
    return b.node("Reshape", [x.name, b.ints(given)], shape)


def _to_image(b: _Builder) -> Val | None:
    """Reshape a value to NCHW (for Conv, pools, BN)."""
    x = b.pick(lambda v: len(v.shape) != 4)
    if x is None:
        return None
    shape = _factor(b, _size(x.shape), 4)
    return b.node("Reshape", [x.name, b.ints(shape)], shape)


def _transpose(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 2)
    if x is None:
        return None
    perm = list(range(len(x.shape)))
    for i in range(len(perm) - 1, 0, -1):
        j = b.ch.int(0, i)
        perm[i], perm[j] = perm[j], perm[i]
    return b.node("Transpose", [x.name], [x.shape[p] for p in perm], perm=perm)


def _slice(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1 and max(v.shape) >= 2)
    if x is None:
        return None
    r = len(x.shape)
    axes = sorted({b.ch.int(0, r - 1) for _ in range(b.ch.int(1, r))})
    shape = list(x.shape)
    starts, ends, steps = [], [], []
    for a in axes:
        d = x.shape[a]
        step = b.ch.choice((1, 1, 2, -1))
        if step > 0:
            s = b.ch.int(0, d - 1)
            e = b.ch.int(s + 1, d)
            n = len(range(s, e, step))
            s_given = s - d if b.ch.bool(0.3) else s
            e_given = 2**62 if e == d and b.ch.bool(0.3) else (e - d if b.ch.bool(0.3) and e < d else e)
        else:
            s = b.ch.int(0, d - 1)
            e = b.ch.int(-1, s - 1)
            n = len(range(s, e, step))
            s_given = s
            e_given = -(2**62) if e == -1 else e
        shape[a] = n
        starts.append(s_given)
        ends.append(e_given)
        steps.append(step)
    axes_given = [a - r if b.ch.bool(0.3) else a for a in axes]
    ins = [x.name, b.ints(starts), b.ints(ends), b.ints(axes_given)]
    if any(s != 1 for s in steps) or b.ch.bool():
        ins.append(b.ints(steps))
    return b.node("Slice", ins, shape)


def _concat(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    r = len(x.shape)
    axis = b.ch.int(0, r - 1)

    def fits(v: Val) -> bool:
        return len(v.shape) == r and all(v.shape[i] == x.shape[i] for i in range(r) if i != axis)

    parts = [x]
    for _ in range(b.ch.int(1, 2)):
        y = b.pick(fits)
        parts.append(y if y is not None else x)
    shape = list(x.shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    if _size(shape) > MAX_ELEMS:
        return None
    return b.node("Concat", [p.name for p in parts], shape, axis=axis - r if b.ch.bool(0.3) else axis)


def _split(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1 and max(v.shape) >= 2)
    if x is None:
        return None
    r = len(x.shape)
    axis = b.ch.choice([i for i in range(r) if x.shape[i] >= 2])
    d = x.shape[axis]
    n = b.ch.int(2, min(3, d))
    chunk = -(-d // n)
    if b.opset >= 18 and d - chunk * (n - 1) > 0 and b.ch.bool(0.4):  # num_outputs: the last chunk smaller
        sizes = [chunk] * (n - 1) + [d - chunk * (n - 1)]
        attrs = {"num_outputs": n}
        ins = [x.name]
    else:
        cuts = sorted(b.ch.int(1, d - 1) for _ in range(n - 1))
        sizes = [c1 - c0 for c0, c1 in zip([0, *cuts], [*cuts, d], strict=True)]
        sizes = [s for s in sizes if s > 0]
        if len(sizes) < 2:
            sizes = [1, d - 1]
        attrs = {}
        ins = [x.name, b.ints(sizes)]
    outs = [b.fresh() for _ in sizes]
    b.nodes.append(helper.make_node("Split", ins, outs, axis=axis - r if b.ch.bool(0.3) else axis, **attrs))
    vals = []
    for name, s in zip(outs, sizes, strict=True):
        shape = list(x.shape)
        shape[axis] = s
        vals.append(Val(name, tuple(shape)))
    for v in vals[:-1]:
        b.emit(v)
    return vals[-1]


def _squeeze(b: _Builder) -> Val | None:
    x = b.pick(lambda v: 1 in v.shape)
    if x is None:
        return None
    r = len(x.shape)
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    axes = sorted({b.ch.choice(ones) for _ in range(b.ch.int(1, len(ones)))})
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    if b.ch.bool(0.2) and len(axes) == len(ones):
        return b.node("Squeeze", [x.name], shape)
    return b.node("Squeeze", [x.name, b.ints([a - r if b.ch.bool(0.3) else a for a in axes])], shape)


def _unsqueeze(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) <= 3)
    if x is None:
        return None
    r = len(x.shape) + 1
    axis = b.ch.int(0, r - 1)
    shape = list(x.shape)
    shape.insert(axis, 1)
    return b.node("Unsqueeze", [x.name, b.ints([axis - r if b.ch.bool(0.3) else axis])], shape)


def _flatten(b: _Builder) -> Val | None:
    x = b.pick()
    r = len(x.shape)
    axis = b.ch.int(0, r)
    shape = [_size(x.shape[:axis]), _size(x.shape[axis:])]
    return b.node("Flatten", [x.name], shape, axis=axis - r if b.ch.bool(0.2) and axis < r else axis)


def _conv(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) == 4)
    if x is None:
        return _to_image(b)
    n, c, h, w = x.shape
    k = b.ch.choice((1, 3, 3, 2))
    kh, kw = (k, k) if b.ch.bool(0.8) else (k, 1)
    s = b.ch.choice((1, 1, 2))
    dil = 2 if b.ch.bool(0.15) else 1
    pads = [b.ch.int(0, 1) for _ in range(4)] if b.ch.bool(0.7) else [0, 0, 0, 0]
    m = b.ch.int(1, 8)
    g = b.ch.choice([d for d in _divisors(c) if m % d == 0]) if b.ch.bool(0.4) else 1
    if b.ch.bool(0.15):  # depthwise
        g, m = c, c
    oh = (h + pads[0] + pads[2] - dil * (kh - 1) - 1) // s + 1
    ow = (w + pads[1] + pads[3] - dil * (kw - 1) - 1) // s + 1
    if oh < 1 or ow < 1 or n * m * oh * ow > MAX_ELEMS:
        return None
    fan_in = (c // g) * kh * kw
    ins = [x.name, b.fconst((m, c // g, kh, kw), 1.0 / math.sqrt(fan_in))]
    if b.ch.bool(0.6):
        ins.append(b.fconst((m,), 0.5))
    attrs = {"kernel_shape": [kh, kw], "strides": [s, s], "pads": pads}
    if dil != 1:
        attrs["dilations"] = [dil, dil]
    if g != 1:
        attrs["group"] = g
    return b.node("Conv", ins, (n, m, oh, ow), **attrs)


def _matmul(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    kdim = x.shape[-1]
    form = b.ch.int(0, 2)
    if form == 1 and len(x.shape) >= 2:  # x @ x^T (batched): a shared operand
        r = len(x.shape)
        perm = [*range(r - 2), r - 1, r - 2]
        t = b.node("Transpose", [x.name], [x.shape[p] for p in perm], perm=perm)
        shape = (*x.shape[:-1], x.shape[-2])
        if _size(shape) > MAX_ELEMS:
            return None
        return b.node("MatMul", [x.name, t.name], shape)
    if form == 2 and b.ch.bool(0.3):  # a 1-D weight: the last dim goes
        return b.node("MatMul", [x.name, b.fconst((kdim,), 1 / math.sqrt(kdim))], x.shape[:-1])
    ncols = b.ch.int(1, 16)
    shape = (*x.shape[:-1], ncols) if len(x.shape) >= 2 else (ncols,)
    if _size(shape) > MAX_ELEMS:
        return None
    if b.ch.bool(0.2) and len(x.shape) >= 2:  # a batched constant
        wshape = (x.shape[-3] if len(x.shape) >= 3 else 1, kdim, ncols)
        if len(x.shape) == 2:
            shape = (1, *shape)
        return b.node("MatMul", [x.name, b.fconst(wshape, 1 / math.sqrt(kdim))], shape)
    return b.node("MatMul", [x.name, b.fconst((kdim, ncols), 1 / math.sqrt(kdim))], shape)


def _gemm(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) == 2)
    if x is None:
        return _flatten(b)
    trans_a = b.ch.int(0, 1)
    trans_b = b.ch.int(0, 1)
    m, k = (x.shape[1], x.shape[0]) if trans_a else x.shape
    n = b.ch.int(1, 16)
    if m * n > MAX_ELEMS:
        return None
    ins = [x.name, b.fconst((n, k) if trans_b else (k, n), 1 / math.sqrt(k))]
    if b.ch.bool(0.7):
        ins.append(b.fconst(b.ch.choice(((n,), (1, n), (m, n), (), (m, 1))), 0.5))
    attrs = {}
    if trans_a:
        attrs["transA"] = 1
    if trans_b:
        attrs["transB"] = 1
    if b.ch.bool(0.3):
        attrs["alpha"] = b.ch.choice((0.5, 2.0))
    if b.ch.bool(0.3) and len(ins) == 3:
        attrs["beta"] = b.ch.choice((0.5, 2.0))
    return b.node("Gemm", ins, (m, n), **attrs)


def _batchnorm(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 2)
    if x is None:
        return None
    c = x.shape[1]
    ins = [x.name, b.fconst((c,), 0.5, positive=True), b.fconst((c,), 0.5), b.fconst((c,), 0.5),
           b.fconst((c,), 0.5, positive=True)]
    return b.node("BatchNormalization", ins, x.shape, epsilon=b.ch.choice((1e-5, 1e-3)))


def _layernorm(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    r = len(x.shape)
    axis = b.ch.int(-r, r - 1)
    norm = x.shape[axis:]
    ins = [x.name, b.fconst(norm, 0.5, positive=True)]
    if b.ch.bool(0.7):
        ins.append(b.fconst(norm, 0.5))
    return b.node("LayerNormalization", ins, x.shape, axis=axis, epsilon=b.ch.choice((1e-5, 1e-3)))


def _pool(b: _Builder) -> Val | None:
    x = b.pick(lambda v: len(v.shape) == 4)
    if x is None:
        return _to_image(b)
    op = b.ch.choice(("MaxPool", "AveragePool", "GlobalAveragePool"))
    n, c, h, w = x.shape
    if op == "GlobalAveragePool":
        return b.node(op, [x.name], (n, c, 1, 1))
    k = b.ch.choice((2, 3, 1))
    s = b.ch.choice((1, 2, 2))
    pads = [b.ch.int(0, k // 2) for _ in range(4)] if b.ch.bool(0.5) else [0, 0, 0, 0]
    ceil = b.ch.int(0, 1) if b.ch.bool(0.3) else 0
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": pads}
    if ceil:
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and b.ch.bool():
        attrs["count_include_pad"] = 1

    def out(d: int, pb: int, pe: int, up: bool) -> int:
        span = d + pb + pe - k
        return (-(-span // s) if up else span // s) + 1

    oh, ow = out(h, pads[0], pads[2], ceil), out(w, pads[1], pads[3], ceil)
    if ceil and ((oh - 1) * s >= h + pads[0] or (ow - 1) * s >= w + pads[1]):
        # a last window starting in the right pad: onnx's shape inference and onnxruntime disagree on it
        del attrs["ceil_mode"]
        oh, ow = out(h, pads[0], pads[2], False), out(w, pads[1], pads[3], False)
    if oh < 1 or ow < 1 or h + pads[0] + pads[2] < k or w + pads[1] + pads[3] < k:
        return None
    return b.node(op, [x.name], (n, c, oh, ow), **attrs)


_COMPARE = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual"})


def _duplicate(b: _Builder) -> Val | None:
    """The same op applied twice to the same inputs (a common subexpression)."""
    cands = [(i, nd) for i, nd in enumerate(b.nodes) if len(nd.output) == 1 and nd.op_type not in _COMPARE]
    if not cands:
        return None
    i, nd = b.ch.choice(cands)
    shape = b.shapes.get(nd.output[0])
    if shape is None:
        return None
    new = onnx.NodeProto()
    new.CopyFrom(nd)
    del new.output[:]
    name = b.fresh()
    new.output.append(name)
    b.nodes.append(new)
    return Val(name, shape)


OPS: tuple[tuple[str, Callable[[_Builder], Val | None], int], ...] = (
    # name, block, weight (random_graph); hypothesis's sampled_from shrinks toward the first
    ("unary", _unary, 6),
    ("binary", _binary, 8),
    ("where", _where, 2),
    ("gelu", _gelu, 1),
    ("reduce", _reduce, 2),
    ("softmax", _softmax, 1),
    ("reshape", _reshape, 2),
    ("transpose", _transpose, 2),
    ("slice", _slice, 2),
    ("concat", _concat, 2),
    ("split", _split, 1),
    ("squeeze", _squeeze, 1),
    ("unsqueeze", _unsqueeze, 1),
    ("flatten", _flatten, 1),
    ("conv", _conv, 3),
    ("matmul", _matmul, 2),
    ("gemm", _gemm, 1),
    ("batchnorm", _batchnorm, 2),
    ("layernorm", _layernorm, 1),
    ("pool", _pool, 2),
    ("duplicate", _duplicate, 2),
)
_WEIGHTED = tuple(name for name, _, w in OPS for _ in range(w))
_BLOCKS = {name: fn for name, fn, _ in OPS}


def _input_shape(b: _Builder) -> tuple[int, ...]:
    if b.ch.bool(0.5):  # an image
        shape = (b.ch.int(1, 2), b.ch.int(1, 8), b.ch.int(1, 10), b.ch.int(1, 10))
    else:
        shape = tuple(b.ch.int(1, 8) for _ in range(b.ch.int(1, 4)))
    while _size(shape) > MAX_ELEMS // 2:
        shape = shape[1:]
    return shape


def build_graph(ch: Chooser) -> onnx.ModelProto:
    """One random model; every decision comes from ``ch``."""
    b = _Builder(ch)
    first = _input_shape(b)
    for i in range(ch.int(1, 4)):
        if i == 0:
            shape = first
        else:
            kind = ch.int(0, 2)
            if kind == 0:
                shape = first
            elif kind == 1:  # broadcast-compatible: a suffix with some dims 1
                shape = tuple(1 if ch.bool(0.3) else d for d in first[ch.int(0, len(first) - 1):]) if first else ()
            else:
                shape = _input_shape(b)
        v = Val(f"x{i}", tuple(shape))
        b.inputs.append(v)
        b.pool.append(v)
    target = ch.int(1, MAX_NODES - 5)
    attempts = 0
    while len(b.nodes) < target and attempts < 4 * MAX_NODES:
        attempts += 1
        name = ch.choice(_WEIGHTED) if isinstance(ch, _RandomChooser) else ch.choice([n for n, _, _ in OPS])
        mark = (len(b.nodes), len(b.inits), len(b.pool), len(b.computed))
        v = _BLOCKS[name](b)
        if v is None or _size(v.shape) > MAX_ELEMS or len(b.nodes) > MAX_NODES:
            del b.nodes[mark[0]:], b.inits[mark[1]:], b.pool[mark[2]:], b.computed[mark[3]:]
            continue
        b.emit(v)
    if not b.computed:  # at least one node
        x = b.inputs[0]
        b.emit(b.node("Relu", [x.name], x.shape))
    outs = [b.computed[-1]]
    for _ in range(ch.int(0, 2)):
        v = ch.choice(b.computed)
        if v not in outs:
            outs.append(v)
    graph = helper.make_graph(
        b.nodes, "random_graph",
        [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, list(v.shape)) for v in b.inputs],
        [helper.make_tensor_value_info(v.name, TensorProto.FLOAT, list(v.shape)) for v in outs],
        initializer=b.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)],
                              producer_name="dlcc.testing.graphs")
    model.ir_version = 8
    return model


def random_graph(seed: int) -> onnx.ModelProto:
    """The random model of ``seed`` (deterministic: plain ``random.Random(seed)``)."""
    return build_graph(_RandomChooser(random.Random(seed)))


def graphs():
    """A hypothesis strategy of random models (the same building blocks as ``random_graph``)."""
    from hypothesis import strategies as st

    @st.composite
    def _graphs(draw):
        return build_graph(_DrawChooser(draw))

    return _graphs()
