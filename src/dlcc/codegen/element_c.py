"""Element expressions (``dlcc.lower.element``) over a kernel's C buffers, printed as C.

What goes in: the kernel's values held in buffers (``TensorRef``s: C pointers with strides, offsets, channel
blocks), its constants, fresh names, the target's lanes. What comes out: an ``ElementGen`` over loop-IR buffers
with the same layouts (``bufs``; ``ptrs``: each buffer's C pointer), and C text of its expressions for the
templates, which take an element's index as C text (``at``, ``compute``: the index parsed into loop-IR
expressions by ``c_index``, the result and the locals it binds printed by ``dlcc.codegen.lir_c``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from dlcc.codegen.cbase import Names, TensorRef
from dlcc.codegen.lir_c import c_expr, c_stmts
from dlcc.lower.element import ElementGen
from dlcc.lower.lir import Bin, Buf, Const, Expr, Func, Lane, Layout, Let, Var, verify_func
from dlcc.schedule.elementwise import fill_map

__all__ = ["CElements", "c_index", "ref_buf"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT = re.compile(r"\(?(-?\d+)\)?\Z")
_DIVMOD = re.compile(r"\((\w+)\) ([/%]) (\d+)")
_SPLIT = re.compile(r"\((.+)\)\*(\d+) \+ \((\w+)\)")  # ``cbase.split_channel``'s form


def ref_buf(ref: TensorRef, name: str) -> Buf:
    """A loop-IR buffer named ``name`` with the layout of ``ref`` (its strides and offset; a channel-blocked ref:
    channel c at (c // block) * strides[1] + c % block)."""
    if not ref.block:
        return Buf(name, ref.dtype, Layout.strided(ref.shape, ref.strides, ref.offset))
    n, c, h, w = ref.shape
    sn, sc, sh, sw = ref.strides
    b = ref.block
    dims = ((0, 1, n, sn), (1, b, -(-c // b), sc), (1, 1, b, 1), (2, 1, h, sh), (3, 1, w, sw))
    return Buf(name, ref.dtype, Layout(tuple(int(d) for d in ref.shape), dims, ref.offset))


def c_index(text: str | Expr) -> Expr:
    """A template's index (C text) as a loop-IR int64 expression: a constant, a name, a channel as ``split_channel``
    writes it (a ``Lane``), or the text parenthesized."""
    if isinstance(text, Expr):
        return text
    text = str(text).strip()
    m = _INT.match(text)
    if m is not None:
        return Const(int(m.group(1)))
    m = _SPLIT.fullmatch(text)
    if m is not None:  # ``split_channel``'s (block)*size + (lane): a Lane, which a layout in blocks reads undivided
        return Lane(c_index(m.group(1)), c_index(m.group(3)), int(m.group(2)))
    m = _DIVMOD.fullmatch(text)
    if m is not None:  # a flat position's row or column, (p) / W or (p) % W: what a layout's address folds back
        return Bin("//" if m.group(2) == "/" else "%", c_index(m.group(1)), Const(int(m.group(3))))
    return Var(text if _IDENT.match(text) else f"({text})")


class CElements:
    """The element expressions of one kernel: ``gen`` over its buffers, printed as C for its templates."""

    def __init__(self, refs: dict[ir.Value, TensorRef], consts: dict[ir.Value, np.ndarray], names: Names,
                 lanes: int = 4):
        self.refs: dict[ir.Value, TensorRef] = {}
        self.ptrs: dict[str, str] = {}
        self.lanes = lanes
        self.gen = ElementGen({}, consts, names)
        for v, ref in refs.items():
            self.add(v, ref)

    def add(self, v: ir.Value, ref: TensorRef) -> None:
        """``v`` is held in ``ref``."""
        self.refs[v] = ref
        name = f"{ref.ptr}_v{len(self.ptrs)}"
        self.ptrs[name] = ref.ptr
        self.gen.bufs[v] = ref_buf(ref, name)

    def c(self, e: Expr) -> str:
        return c_expr(e, self.ptrs, self.lanes)

    def c_lets(self, lets: Sequence[Let]) -> list[str]:
        return [c_stmts([s], self.ptrs, self.lanes) for s in lets]

    def at(self, v: ir.Value, idx: Sequence[str | Expr]) -> str:
        """C of element ``idx`` (C text) of ``v``, one pure expression."""
        return self.c(self.gen.at(v, [c_index(i) for i in idx], None))

    def fill(self, v: ir.Value, f: Func, pure: bool = False) -> Func:
        """``f``, a ``map_func`` nest over ``v``'s buffer, with ``v``'s element computed by its producer at every index
        (``schedule.elementwise.fill_map``; ``pure``: one expression per element, no locals), verified: every load
        in bounds."""
        def element(idx):
            self.gen.reset()
            lets: list[Let] | None = None if pure else []
            value = self.gen.compute(v, list(idx), lets)
            return lets or [], value

        f = fill_map(f, self.gen.bufs[v], element, self.gen.bufs.values())
        verify_func(f)
        return f

    def parts(self, v: ir.Value, idx: Sequence[str | Expr], compute: bool = False) -> tuple[list[str], str]:
        """(C statements, C expression) of element ``idx`` of ``v`` (``compute``: by its producer even where it has a
        buffer), the statements binding its sub-results (a memo of their own)."""
        lets: list[Let] = []
        index = [c_index(i) for i in idx]
        with self.gen.own_memo():
            e = self.gen.compute(v, index, lets) if compute else self.gen.at(v, index, lets)
        return self.c_lets(lets), self.c(e)


def blocked_index(idx: Sequence[str], block: int) -> list[Expr]:
    """The logical index of element (image, channel block, channel in it, row, column) of a kernel storing whole
    channel blocks of ``block``: the channel a ``Lane``."""
    n, kb, ci, h, w = (c_index(i) for i in idx)
    return [n, Lane(kb, ci, block), h, w]

