"""The padding of a Conv, pool or ConvTranspose node from its ONNX attributes (``pads``, ``auto_pad``,
``output_padding``, ``output_shape``) and its shapes.

What goes in: ``attr(name, default)``, the node's attribute getter (a template's ``call.attr``, or one over an
``onnx_ir`` node for the schedule stage), and per spatial dim the input and output lengths, kernel, stride and
dilation. What comes out: the begin (and for Conv and pools the end) pads per spatial dim; a value the kernels
do not handle raises ``TemplateError``. The templates and the workspace declaration (``schedule.workspace``)
read the same pads from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dlcc.errors import TemplateError

__all__ = ["attr_ints", "conv_pads", "convt_pads", "node_attr"]

Attr = Callable[[str, Any], Any]


def node_attr(node) -> Attr:
    """The attribute getter of an ``onnx_ir`` node."""
    def attr(name: str, default: Any = None) -> Any:
        a = node.attributes.get(name)
        return default if a is None else a.value
    return attr


def attr_ints(attr: Attr, op: str, name: str, n: int, default: int) -> list[int]:
    v = attr(name, None)
    if v is None:
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise TemplateError(f"{op}: attribute {name} has {len(v)} values, expected {n}")
    return v


def _auto(attr: Attr) -> str:
    auto = attr("auto_pad", "NOTSET")
    return auto.decode() if isinstance(auto, bytes) else auto


def conv_pads(attr: Attr, op: str, ins: Sequence[int], outs: Sequence[int], ks: Sequence[int],
              strides: Sequence[int], dils: Sequence[int]) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) of a Conv or pool node."""
    r = len(ins)
    auto = _auto(attr)
    if auto == "NOTSET":
        pads = attr_ints(attr, op, "pads", 2 * r, 0)
        return pads[:r], pads[r:]
    if auto == "VALID":
        return [0] * r, [0] * r
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise TemplateError(f"{op}: unsupported auto_pad {auto!r}")
    begin, end = [], []
    for i, o, k, s, d in zip(ins, outs, ks, strides, dils, strict=True):
        total = max(0, (o - 1) * s + (k - 1) * d + 1 - i)
        b = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begin.append(b)
        end.append(total - b)
    return begin, end


def convt_pads(attr: Attr, ins: Sequence[int], outs: Sequence[int], ks: Sequence[int], strides: Sequence[int],
               dils: Sequence[int]) -> list[int]:
    """The begin pads of a ConvTranspose node (output ``i*s - pad + k*d``), checked against its output shape."""
    r = len(ins)
    outpad = attr_ints(attr, "ConvTranspose", "output_padding", r, 0)
    auto = _auto(attr)
    oshape = attr("output_shape", None)
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise TemplateError(f"ConvTranspose: unsupported auto_pad {auto!r}")
    if oshape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if oshape is not None and [int(v) for v in oshape][-r:] != list(outs):
            raise TemplateError(f"ConvTranspose: output_shape {list(oshape)} does not match the output {list(outs)}")
        pb = []
        for i, o, k, s, d, a in zip(ins, outs, ks, strides, dils, outpad, strict=True):
            total = max(0, s * (i - 1) + a + (k - 1) * d + 1 - o)
            # onnxruntime: SAME_LOWER puts the odd extra pad at the head (begin), others at the tail
            pb.append(total - total // 2 if auto == "SAME_LOWER" else total // 2)
        return pb
    if auto == "VALID":
        return [0] * r
    pads = attr_ints(attr, "ConvTranspose", "pads", 2 * r, 0)
    for i, o, k, s, d, a, b, e in zip(ins, outs, ks, strides, dils, outpad, pads[:r], pads[r:], strict=True):
        if s * (i - 1) + a + (k - 1) * d + 1 - b - e != o:
            raise TemplateError(f"ConvTranspose: output shape {list(outs)} inconsistent with the attributes")
    return pads[:r]
