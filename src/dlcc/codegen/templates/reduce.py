"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/SumSquare/LogSumExp/LogSum, ArgMax/ArgMin.

What goes in: a ``TemplateCall`` whose input 0 may be an inlined expression (read only via ``Operand.at``);
axes as an attribute (opset < 13, < 18 for most ops) or as a constant input 1.
What comes out: C that computes each output element once and hands it to ``call.store``: the loop IR of
``dlcc.schedule.reduce`` (the row engine ``row_func``, shared with the normalizations of norm.py, and
``arg_func``) printed by ``call.emit``, input k printed as ``call.inputs[k].at``. This module checks the
attributes and dtypes, describes the op as a ``RowOp``, and splits the rows over threads when
``call.parallel`` says the work is worth it.
Sums run in float with partial accumulators: the summation order differs from onnxruntime, so these ops
are compared with rtol 1e-4 (DESIGN tolerance for reductions).
"""

from __future__ import annotations

import functools
import math

from dlcc.codegen.cbase import TemplateError
from dlcc.codegen.templates import TemplateCall, register
from dlcc.lower.lir import verify_func
from dlcc.schedule.reduce import RowOp, arg_func, row_func

__all__ = ["emit_row", "reduce_axes"]


def emit_row(call: TemplateCall, spec: RowOp) -> str:
    """The C of ``spec``'s loop IR; input k (0: x, then scale, bias) is ``call.inputs[k]``."""
    threads = call.threads if call.parallel(spec.flops) else 1
    f = row_func(spec, call.target.lanes, threads, fresh=call.names)
    _verify_row_once(spec, call.target.lanes, threads)
    return call.emit(f, call.store, inputs={k: call.inputs[k].at for k in range(1 + len(spec.params))})


@functools.lru_cache(maxsize=256)
def _verify_row_once(spec: RowOp, lanes: int, threads: int) -> None:
    verify_func(row_func(spec, lanes, threads))


# ---------------------------------------------------------------- the Reduce* ops


def reduce_axes(call: TemplateCall, rank: int) -> list[int] | None:
    """The reduced axes (normalized, sorted), [] for "no reduction" (noop_with_empty_axes), None for all."""
    axes = None
    if len(call.inputs) > 1 and call.inputs[1] is not None:
        op = call.inputs[1]
        if op.const is None:
            raise TemplateError(f"{call.node.op_type}: the axes input must be a constant")
        axes = [int(a) for a in op.const.reshape(-1)]
    elif call.attr("axes") is not None:
        axes = [int(a) for a in call.attr("axes")]
    if not axes:
        if int(call.attr("noop_with_empty_axes", 0)):
            return []
        return None
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise TemplateError(f"{call.node.op_type}: axis {a} out of range for rank {rank}")
        out.append(a % rank)
    if len(set(out)) != len(out):
        raise TemplateError(f"{call.node.op_type}: repeated axes {axes}")
    return sorted(out)


_INT_OPS = ("ReduceSum", "ReduceMax", "ReduceMin")


@register("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")
def reduce_op(call: TemplateCall) -> str:
    op = call.node.op_type
    x = call.inputs[0]
    r = len(x.shape)
    if x.dtype not in ("float32", "int64") or (x.dtype == "int64" and op not in _INT_OPS):
        raise TemplateError(f"{op}: {x.dtype} input is not supported (float32; int64 for Sum/Max/Min)")
    if x.dtype != call.out_dtype:
        raise TemplateError(f"{op}: output type {call.out_dtype} differs from the input's {x.dtype}")
    axes = reduce_axes(call, r)
    if axes is None:
        axes = list(range(r))
    if axes and math.prod(x.shape) == 0:
        raise TemplateError(f"{op}: empty input tensors are not supported")
    return emit_row(call, RowOp(op, tuple(x.shape), tuple(axes), x.dtype, bool(int(call.attr("keepdims", 1)))))


@register("ArgMax", "ArgMin")
def arg_op(call: TemplateCall) -> str:
    op = call.node.op_type
    x = call.inputs[0]
    if x.dtype not in ("float32", "int64"):
        raise TemplateError(f"{op}: {x.dtype} input is not supported")
    r = len(x.shape)
    axis = int(call.attr("axis", 0))
    if not -r <= axis < r:
        raise TemplateError(f"{op}: axis {axis} out of range for rank {r}")
    if x.shape[axis % r] == 0:
        raise TemplateError(f"{op}: empty reduction axis")
    args = (op, tuple(x.shape), axis % r, bool(int(call.attr("keepdims", 1))),
            bool(int(call.attr("select_last_index", 0))), x.dtype)
    f = arg_func(*args, fresh=call.names)
    _verify_arg_once(args)
    return call.emit(f, call.store, inputs={0: x.at})


@functools.lru_cache(maxsize=256)
def _verify_arg_once(args: tuple) -> None:
    verify_func(arg_func(*args))
