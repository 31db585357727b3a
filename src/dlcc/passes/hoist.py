"""Hoisting: move data-selection ops ahead of elementwise work, and layout ops behind it so pairs meet.

What goes in: a model (shapes inferred). What comes out: the same function, with
- Slice / Gather (constant parameters) moved ahead of an elementwise op, so its arithmetic runs on the
  smaller tensor:  Slice(Add(x, y)) -> Add(Slice(x), Slice'(y))
- Transpose / Reshape moved behind elementwise ops when that makes two of them adjacent, so that the
  pair can be merged or cancelled by the redundancy passes:  Transpose(Relu(Transpose(x)))
  -> Transpose(Transpose(Relu(x))).

The algorithm, per rule:
    slice-before-elementwise / gather-before-elementwise (root: the Slice or Gather S of E's output):
        E has one output, read by S alone, and S's parameters are constants that shrink the tensor.
        For each data operand of E, aligned to E's output from the right (numpy broadcasting):
            it has the full dim on a selected axis -> select on that axis too (numpy on constants);
            it has dim 1 there -> leave it (Slice), or Gather index 0 there (Gather changes the rank);
            it lacks the axis  -> leave it.
        Emit E on the selected operands; E's old output dies.
    sink-transpose / sink-reshape (root: an elementwise E fed by a Transpose/Reshape T):
        E's operands are T's output and scalar constants; T's output is read by E alone; following
        single-use elementwise ops down from E reaches another op of T's kind. Emit T(E(x)).

No cycle: Slice/Gather only move up past elementwise ops and Transpose/Reshape only move down past
them, and no rule moves an elementwise op the other way, so each firing removes one (selection below
E) or (layout op above E) pair.

Invariants: graph input/output names and dtypes never change; a rule never duplicates work (the moved
op's old position had one consumer).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from dlcc.ops.table import ops_with
from dlcc.passes.rewrite import Builder, Rule, RulePass, attr, const_array, single_use

# Elementwise ops with one data input (others, as Clip's bounds, are scalar parameters), and elementwise
# ops whose inputs all broadcast against each other (numpy rules; PRelu's slope included): the op table's.
UNARY = ops_with("unary")
BROADCASTING = ops_with("broadcasting")
ELEMENTWISE = UNARY | BROADCASTING


def _elementwise(node: ir.Node | None) -> bool:
    return (node is not None and node.domain in ("", "ai.onnx") and node.op_type in ELEMENTWISE
            and len(node.outputs) == 1)


def _data_inputs(e: ir.Node) -> list[int]:
    """Indices of the inputs that carry data of the output's shape (broadcast), not parameters."""
    if e.op_type in UNARY:
        return [0]
    return [i for i, v in enumerate(e.inputs) if v is not None]


def _copy_attrs(node: ir.Node) -> dict[str, ir.Attr]:
    return {k: ir.Attr(a.name, a.type, a.value) for k, a in node.attributes.items()}


def _same_dim(a, b) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a is not None and b is not None and a.value is not None and a.value == b.value


def _shape(v: ir.Value | None) -> list | None:
    return None if v is None or v.shape is None else list(v.shape)


# --------------------------------------------------------------------------- Slice / Gather before E


def _slice_params(node: ir.Node) -> dict | None:
    """starts/ends/axes/steps of a Slice as int lists (attribute form < opset 10, else inputs), or None."""
    if "starts" in node.attributes:
        starts, ends = list(attr(node, "starts")), list(attr(node, "ends"))
        axes = attr(node, "axes")
        axes = list(axes) if axes is not None else list(range(len(starts)))
        return {"starts": starts, "ends": ends, "axes": axes, "steps": [1] * len(starts), "form": "attrs"}
    ins = list(node.inputs) + [None] * (5 - len(node.inputs))
    arrays = [const_array(v) for v in ins[1:5]]
    if arrays[0] is None or arrays[1] is None or (ins[3] is not None and arrays[2] is None) or (
            ins[4] is not None and arrays[3] is None):
        return None
    starts = [int(s) for s in arrays[0].reshape(-1)]
    axes = list(range(len(starts))) if arrays[2] is None else [int(a) for a in arrays[2].reshape(-1)]
    steps = [1] * len(starts) if arrays[3] is None else [int(s) for s in arrays[3].reshape(-1)]
    return {"starts": starts, "ends": [int(e) for e in arrays[1].reshape(-1)], "axes": axes, "steps": steps,
            "form": "inputs"}


def _select_pattern(node: ir.Node) -> dict | None:
    e = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if not _elementwise(e):
        return None
    if node.op_type == "Slice":
        return {"e": e, "slice": _slice_params(node)}
    return {"e": e, "indices": const_array(node.inputs[1])}


def _plan(node: ir.Node, m: dict) -> str | None:
    """Decide, for each data operand of E, which selected axes it gets; store the plan in ``m``."""
    e = m["e"]
    if not single_use(e.outputs[0]):
        return "elementwise result has other uses"
    out = _shape(e.outputs[0])
    if out is None:
        return "shape unknown"
    r = len(out)
    if node.op_type == "Slice":
        p = m["slice"]
        if p is None:
            return "slice parameters are not constant"
        axes = [a + r if a < 0 else a for a in p["axes"]]
        if any(not 0 <= a < r for a in axes) or len(set(axes)) != len(axes):
            return "slice axes out of range"
        dims = [out[a] for a in axes]
        if not all(isinstance(d, int) for d in dims):
            return "sliced dims unknown"
        kept = [len(range(d)[slice(s, en, st)]) for d, s, en, st in
                zip(dims, p["starts"], p["ends"], p["steps"], strict=True)]
        if any(st == 0 for st in p["steps"]):
            return "zero step"
        if kept == dims:
            return "slice does not shrink the tensor"
    else:
        if m["indices"] is None:
            return "indices are not constant"
        a = attr(node, "axis", 0)
        axes = [a + r if a < 0 else a]
        if not 0 <= axes[0] < r or not isinstance(out[axes[0]], int):
            return "gathered dim unknown"
        if m["indices"].size >= out[axes[0]]:
            return "gather does not shrink the tensor"
    plan: dict[int, list[tuple[int, int, bool]]] = {}  # input index -> [(output axis, operand axis, full)]
    for i in _data_inputs(e):
        shape = _shape(e.inputs[i])
        if shape is None:
            return "operand shape unknown"
        q = len(shape)
        if q > r:
            return "operand rank exceeds the output rank"
        sel = []
        for a in axes:
            oa = a - (r - q)
            if oa < 0:
                continue  # the operand lacks the axis: it broadcasts over the selection as before
            if _same_dim(shape[oa], out[a]):
                sel.append((a, oa, True))
            elif shape[oa] == 1:
                sel.append((a, oa, False))
            else:
                return "operand dim unknown on the selected axis"
        plan[i] = sel
    m["plan"], m["axes"] = plan, axes
    return None


def _select_rewrite(node: ir.Node, m: dict, b: Builder):
    e = m["e"]
    new_inputs = list(e.inputs)
    done: dict[tuple[int, tuple], ir.Value] = {}
    for i, sel in m["plan"].items():
        v = e.inputs[i]
        if node.op_type == "Slice":
            sel = [s for s in sel if s[2]]  # a dim-1 operand broadcasts over the sliced dim as before
        if not sel:
            continue
        key = (id(v), tuple(sel))
        if key not in done:
            done[key] = _select_operand(node, m, b, v, sel)
        new_inputs[i] = done[key]
    y = b.op(e.op_type, new_inputs, _copy_attrs(e), domain=e.domain, hint=e.op_type.lower(),
             dtype=e.outputs[0].dtype, shape=_shape(node.outputs[0]))
    return [y]


def _select_operand(node: ir.Node, m: dict, b: Builder, v: ir.Value, sel: list) -> ir.Value:
    data = const_array(v)
    if node.op_type == "Gather":
        (_, oa, full), = sel
        idx = m["indices"] if full else np.zeros_like(m["indices"])
        if data is not None:
            return b.const(np.take(data, idx, axis=oa), "gathered")
        return b.op("Gather", [v, b.const(idx, "indices")], {"axis": oa}, hint="gather", dtype=v.dtype)
    p = m["slice"]
    by_axis = {a: k for k, a in enumerate(m["axes"])}  # normalized output axis -> position in p
    starts, ends, steps, axes = [], [], [], []
    for a, oa, _ in sel:
        k = by_axis[a]
        starts.append(p["starts"][k])
        ends.append(p["ends"][k])
        steps.append(p["steps"][k])
        axes.append(oa)
    if data is not None:
        index = [slice(None)] * data.ndim
        for s, en, st, oa in zip(starts, ends, steps, axes, strict=True):
            index[oa] = slice(s, en, st)  # Python slicing clamps like ONNX Slice does
        return b.const(np.ascontiguousarray(data[tuple(index)]), "sliced")
    if p["form"] == "attrs":
        return b.op("Slice", [v], {"starts": starts, "ends": ends, "axes": axes}, hint="slice", dtype=v.dtype)
    ints = [b.const(np.array(x, np.int64), n) for x, n in ((starts, "starts"), (ends, "ends"), (axes, "axes"))]
    if any(st != 1 for st in steps):
        ints.append(b.const(np.array(steps, np.int64), "steps"))
    return b.op("Slice", [v, *ints], hint="slice", dtype=v.dtype)


# ------------------------------------------------------------------------- Transpose / Reshape after E


def _scalar_const(v: ir.Value | None) -> np.ndarray | None:
    c = const_array(v)
    return c if c is not None and c.size == 1 else None


def _sink_operand(e: ir.Node, v: ir.Value) -> bool:
    """Is ``v`` the one data operand of elementwise ``e`` whose other operands are scalar constants?"""
    if not _elementwise(e):
        return False
    data = _data_inputs(e)
    if sum(e.inputs[i] is v for i in data) != 1:
        return False
    return all(e.inputs[i] is v or _scalar_const(e.inputs[i]) is not None for i in data)


def _meets(start: ir.Value, kind: str, limit: int = 64) -> bool:
    """Does the single-use chain of sinkable elementwise ops below ``start`` end at an op of ``kind``?"""
    v = start
    for _ in range(limit):
        if not single_use(v):
            return False
        c = v.uses()[0].node
        if c.op_type == kind and c.domain in ("", "ai.onnx") and c.inputs[0] is v:
            return True
        if not _sink_operand(c, v):
            return False
        v = c.outputs[0]
    return False


def _sink_rule(kind: str) -> Rule:
    def pattern(node: ir.Node) -> dict | None:
        if not _elementwise(node):
            return None
        for i in _data_inputs(node):
            t = node.inputs[i].producer() if node.inputs[i] is not None else None
            if t is not None and t.op_type == kind and t.domain in ("", "ai.onnx"):
                return {"t": t, "i": i}
        return None

    def check(node: ir.Node, m: dict) -> str | None:
        t = m["t"]
        tv = t.outputs[0]
        if not single_use(tv):
            return f"{kind} result has other uses"
        if not _sink_operand(node, tv):
            return "other operands are not scalar constants"
        x = t.inputs[0]
        if x is None or x.shape is None or tv.shape is None:
            return "shape unknown"
        low = min(len(x.shape), len(tv.shape))
        if any(_scalar_const(node.inputs[i]).ndim > low for i in _data_inputs(node) if node.inputs[i] is not tv):
            return "scalar operand raises the rank"
        if not _meets(node.outputs[0], kind):
            return f"no {kind} below to meet"
        return None

    def rewrite(node: ir.Node, m: dict, b: Builder):
        t = m["t"]
        x = t.inputs[0]
        inputs = [x if v is t.outputs[0] else v for v in node.inputs]
        e = b.op(node.op_type, inputs, _copy_attrs(node), domain=node.domain, hint=node.op_type.lower(),
                 dtype=node.outputs[0].dtype, shape=_shape(x))
        return [b.op(kind, [e, *t.inputs[1:]], _copy_attrs(t), hint=kind.lower())]

    return Rule(f"sink-{kind.lower()}", tuple(sorted(ELEMENTWISE)), pattern, check, rewrite,
                doc=f"{kind}(x) -> elementwise -> {kind}: move the first {kind} below the elementwise op",
                family="hoist", exact=True)


RULES: list[Rule] = [
    Rule("slice-before-elementwise", ("Slice",), _select_pattern, _plan, _select_rewrite,
         doc="Slice(elementwise(x, y)) -> elementwise(Slice(x), Slice(y)): compute only what is kept",
         family="hoist", exact=True),
    Rule("gather-before-elementwise", ("Gather",), _select_pattern, _plan, _select_rewrite,
         doc="Gather(elementwise(x, y)) -> elementwise(Gather(x), Gather(y)): compute only what is kept",
         family="hoist", exact=True),
    _sink_rule("Transpose"),
    _sink_rule("Reshape"),
]


class Hoisting(RulePass):
    """Slice/Gather up past elementwise ops; Transpose/Reshape down past them to meet their pair."""

    name = "hoist"
    doc = "move Slice/Gather ahead of elementwise ops and Transpose/Reshape behind them"
    rules = RULES
