"""Matching helpers for algebraic rules: commutative operand orders, scalar constants, single-use
producers, dtype conditions.

What goes in: a node (the root of a pattern) and predicates. What comes out: captures (a dict) or None.
Pure functions: nothing here mutates the graph.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from dlcc.ops.table import ops_with
from dlcc.passes.rewrite import const_array, producer, single_use

COMMUTATIVE = ops_with("commutative")


def operand_orders(node: ir.Node) -> Iterator[tuple[ir.Value, ir.Value]]:
    """(a, b) for a binary node, and (b, a) as well when the op is commutative."""
    if len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return
    a, b = node.inputs
    yield a, b
    if node.op_type in COMMUTATIVE and a is not b:
        yield b, a


def scalar(v: ir.Value | None) -> float | None:
    """The value of a single-element constant, else None."""
    c = const_array(v)
    if c is None or c.size != 1:
        return None
    return c.reshape(()).item()


def produced_by(v: ir.Value | None, op: str | tuple[str, ...], *, only_use: bool = True) -> ir.Node | None:
    """The producer of ``v`` if it is one of ``op`` (and, by default, ``v`` has no other use)."""
    p = producer(v, op)
    if p is None or (only_use and not single_use(v)):
        return None
    return p


def float_dtype(v: ir.Value | None) -> bool:
    return v is not None and v.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16,
                                         ir.DataType.BFLOAT16)
