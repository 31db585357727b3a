"""Matching helpers for algebraic rules: commutative operands, constant captures, broadcast conditions.

What goes in: a node (the root of a pattern) and predicates. What comes out: captures (a dict) or None.
Pure functions: nothing here mutates the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx_ir as ir

from dlcc.frontend.shapes import broadcast_shapes
from dlcc.passes.rewrite import const_array, producer, single_use, static_shape

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})


def operand_orders(node: ir.Node) -> Iterator[tuple[ir.Value, ir.Value]]:
    """(a, b) for a binary node, and (b, a) as well when the op is commutative."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return
    a, b = node.inputs
    yield a, b
    if node.op_type in COMMUTATIVE and a is not b:
        yield b, a


def match_commutative(node: ir.Node, first: Callable[[ir.Value], dict | None],
                      second: Callable[[ir.Value], dict | None]) -> dict | None:
    """Captures of the first operand order for which ``first(a)`` and ``second(b)`` both match."""
    for a, b in operand_orders(node):
        ma = first(a)
        if ma is None:
            continue
        mb = second(b)
        if mb is None:
            continue
        return {**ma, **mb, "a": a, "b": b}
    return None


def constant(v: ir.Value | None) -> np.ndarray | None:
    return const_array(v)


def scalar(v: ir.Value | None) -> float | None:
    """The value of a single-element constant, else None."""
    c = const_array(v)
    if c is None or c.size != 1:
        return None
    return c.reshape(()).item()


def is_scalar_value(v: ir.Value | None, value: float) -> bool:
    s = scalar(v)
    return s is not None and s == value


def produced_by(v: ir.Value | None, op: str | tuple[str, ...], *, only_use: bool = True) -> ir.Node | None:
    """The producer of ``v`` if it is one of ``op`` (and, by default, ``v`` has no other use)."""
    p = producer(v, op)
    if p is None or (only_use and not single_use(v)):
        return None
    return p


def same_shape(a: ir.Value | None, b: ir.Value | None) -> bool:
    sa, sb = static_shape(a), static_shape(b)
    return sa is not None and sa == sb


def broadcast_keeps(out: ir.Value, *operands: ir.Value) -> bool:
    """Broadcasting ``operands`` gives exactly ``out``'s static shape (so a rewrite cannot change it)."""
    shapes = [v.shape for v in operands]
    b = broadcast_shapes(shapes)
    so = static_shape(out)
    return b is not None and so is not None and all(isinstance(d, int) for d in b) and tuple(b) == so


def float_dtype(v: ir.Value | None) -> bool:
    return v is not None and v.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16,
                                         ir.DataType.BFLOAT16)
