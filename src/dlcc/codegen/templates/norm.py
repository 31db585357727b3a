"""Normalizations: Softmax, LogSoftmax, LayerNormalization, InstanceNormalization, RMSNormalization.

What goes in: a ``TemplateCall`` whose inputs may be inlined expressions (read via ``Operand.at``).
What comes out: C that computes each row's statistics (max / sum of exp, mean / inverse std...) with the
shared reduction engine (``dlcc.schedule.reduce.row_func``: vectorized, partial accumulators, the row cached in a
stack array when it is small so an inlined input is evaluated once), then ``call.store``s every element of the
row; the loop IR printed by ``call.emit`` (``reduce.emit_row``), inputs 0..2 (x, scale, bias) as their operands.

Softmax/LogSoftmax axis semantics: opset >= 13 (one axis, default -1) unless the node carries
``node.meta["dlcc.opset"] < 13`` (set by the lowering from the model's opset), in which case the input is
coerced to 2-D at ``axis`` (default 1): the reduction runs over all dims from ``axis`` on.
Softmax is numerically stable (the row's max is subtracted). Float sums run in a different order than
onnxruntime: compared with rtol 1e-4 where rows are long (DESIGN tolerance for reductions).
"""

from __future__ import annotations

from dlcc.codegen.cbase import TemplateError
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.templates.reduce import emit_row
from dlcc.schedule.reduce import RowOp


def _axis(call: TemplateCall, rank: int, default: int) -> int:
    axis = int(call.attr("axis", default))
    if not -rank <= axis < rank:
        raise TemplateError(f"{call.node.op_type}: axis {axis} out of range for rank {rank}")
    return axis % rank


def _float_input(call: TemplateCall) -> None:
    x = call.inputs[0]
    if x.dtype != "float32" or call.out_dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 tensors are supported, not {x.dtype}")
    if 0 in x.shape:
        raise TemplateError(f"{call.node.op_type}: empty tensors are not supported")


def _only_output0(call: TemplateCall) -> None:
    for o in list(call.node.outputs)[1:]:
        if o is not None and o.name and (len(list(o.uses())) or o.is_graph_output()):
            raise TemplateError(f"{call.node.op_type}: only output 0 is supported (Mean/InvStdDev are used)")


def _emit(call: TemplateCall, axes: list[int], nparams: int) -> str:
    """The row engine over ``axes`` with inputs 1..nparams (scale, bias) as parameters."""
    params = tuple(tuple(call.inputs[k].shape) for k in range(1, 1 + nparams))
    for k, shape in enumerate(params, 1):
        if len(shape) > len(call.inputs[0].shape):
            raise TemplateError(f"{call.node.op_type}: input {k} of shape {list(shape)} does not broadcast")
    spec = RowOp(call.node.op_type, tuple(call.inputs[0].shape), tuple(axes), eps=float(call.attr("epsilon", 1e-5)),
                 params=params)
    return emit_row(call, spec)


@register("Softmax", "LogSoftmax")
def softmax(call: TemplateCall) -> str:
    _float_input(call)
    x = call.inputs[0]
    r = len(x.shape)
    opset = call.node.meta.get("dlcc.opset")
    if r == 0:
        raise TemplateError(f"{call.node.op_type}: scalar input")
    old = opset is not None and int(opset) < 13
    return _emit(call, list(range(_axis(call, r, 1), r)) if old else [_axis(call, r, -1)], 0)


@register("LayerNormalization")
def layer_norm(call: TemplateCall) -> str:
    _float_input(call)
    _only_output0(call)
    r = len(call.inputs[0].shape)
    bias = len(call.inputs) > 2 and call.inputs[2] is not None
    return _emit(call, list(range(_axis(call, r, -1), r)), 2 if bias else 1)


@register("InstanceNormalization")
def instance_norm(call: TemplateCall) -> str:
    _float_input(call)
    r = len(call.inputs[0].shape)
    if r < 3:
        raise TemplateError("InstanceNormalization: the input needs rank >= 3 (N, C, spatial...)")
    return _emit(call, list(range(2, r)), 2)


@register("RMSNormalization")
def rms_norm(call: TemplateCall) -> str:
    _float_input(call)
    r = len(call.inputs[0].shape)
    return _emit(call, list(range(_axis(call, r, -1), r)), 1)
