"""Normalizations: Softmax, LogSoftmax, LayerNormalization, InstanceNormalization, RMSNormalization.

What goes in: a ``TemplateCall`` whose inputs may be inlined expressions (read via ``Operand.at``).
What comes out: C that computes each row's statistics (max / sum of exp, mean / inverse std...) with the
shared reduction engine (reduce.py: vectorized, partial accumulators, the row cached in a stack array
when it is small so an inlined input is evaluated once), then ``call.store``s every element of the row.

Softmax/LogSoftmax axis semantics: opset >= 13 (one axis, default -1) unless the node carries
``node.meta["dlcc.opset"] < 13`` (set by the lowering from the model's opset), in which case the input is
coerced to 2-D at ``axis`` (default 1): the reduction runs over all dims from ``axis`` on.
Softmax is numerically stable (the row's max is subtracted). Float sums run in a different order than
onnxruntime: compared with rtol 1e-4 where rows are long (DESIGN tolerance for reductions).
"""

from __future__ import annotations

from dlcc.codegen.cbase import TemplateError, c_float
from dlcc.codegen.expr import broadcast_index
from dlcc.codegen.templates import TemplateCall, register
from dlcc.codegen.templates.reduce import Pass, row_reduce


def _plus(a, b):
    return f"{a} + {b}"


def _max(a, v, g=None):
    return f"({v} > {a} ? {v} : {a})"


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


@register("Softmax", "LogSoftmax")
def softmax(call: TemplateCall) -> str:
    _float_input(call)
    x = call.inputs[0]
    r = len(x.shape)
    opset = call.node.meta.get("dlcc.opset")
    if r == 0:
        raise TemplateError(f"{call.node.op_type}: scalar input")
    old = opset is not None and int(opset) < 13
    axes = list(range(_axis(call, r, 1), r)) if old else [_axis(call, r, -1)]
    m = Pass("m", "(-INFINITY)", _max, _max)
    if call.node.op_type == "Softmax":
        s = Pass("s", "0.0f", lambda a, v, g: f"{a} + {v}", _plus, transform=lambda v, g: f"dlcc_expf({v} - {g('m')})",
                 after=lambda a, g: f"1.0f / {a}")

        def fin(xe, g, cached, idx):
            return f"{xe} * {g('s')}" if cached else f"dlcc_expf({xe} - {g('m')}) * {g('s')}"
    else:
        s = Pass("s", "0.0f", lambda a, v, g: f"{a} + dlcc_expf({v} - {g('m')})", _plus,
                 after=lambda a, g: f"dlcc_logf({a}) + {g('m')}")

        def fin(xe, g, cached, idx):
            return f"{xe} - {g('s')}"
    return row_reduce(call, x, axes, [m, s], finish_elem=fin, cache=True)


def _mean_rstd(n: int, eps: float) -> list[Pass]:
    """The mean is summed in double: exact for a row of equal values (a float sum of them rounds, and the
    normalization then divides that rounding by sqrt(eps), far beyond float32 noise), and far more accurate
    when |mean| is much larger than the spread. The deviations are then summed in float."""
    inv_n = c_float(1.0 / n)
    return [
        Pass("mean", "0.0", lambda a, v, g: f"{a} + {v}", _plus, after=lambda a, g: f"{a} / {float(n)!r}",
             dtype="float64"),
        Pass("rstd", "0.0f", lambda a, v, g: f"{a} + ({v} - {_mean(g)}) * ({v} - {_mean(g)})", _plus,
             after=lambda a, g: f"1.0f / sqrtf({a} * {inv_n} + {c_float(eps)})"),
    ]


def _mean(g) -> str:
    return f"((float){g('mean')})"


@register("LayerNormalization")
def layer_norm(call: TemplateCall) -> str:
    _float_input(call)
    _only_output0(call)
    x = call.inputs[0]
    r = len(x.shape)
    axes = list(range(_axis(call, r, -1), r))
    n = 1
    for d in axes:
        n *= x.shape[d]
    scale = call.inputs[1]
    bias = call.inputs[2] if len(call.inputs) > 2 else None
    passes = _mean_rstd(n, float(call.attr("epsilon", 1e-5)))

    def fin(xe, g, cached, idx):
        v = f"({xe} - {_mean(g)}) * {g('rstd')} * {scale.at(broadcast_index(idx, scale.shape))}"
        return f"{v} + {bias.at(broadcast_index(idx, bias.shape))}" if bias is not None else v
    return row_reduce(call, x, axes, passes, finish_elem=fin, cache=True)


@register("InstanceNormalization")
def instance_norm(call: TemplateCall) -> str:
    _float_input(call)
    x = call.inputs[0]
    r = len(x.shape)
    if r < 3:
        raise TemplateError("InstanceNormalization: the input needs rank >= 3 (N, C, spatial...)")
    axes = list(range(2, r))
    n = 1
    for d in axes:
        n *= x.shape[d]
    scale, bias = call.inputs[1], call.inputs[2]
    passes = _mean_rstd(n, float(call.attr("epsilon", 1e-5)))

    def fin(xe, g, cached, idx):
        return f"({xe} - {_mean(g)}) * {g('rstd')} * {scale.at([idx[1]])} + {bias.at([idx[1]])}"
    return row_reduce(call, x, axes, passes, finish_elem=fin, cache=True)


@register("RMSNormalization")
def rms_norm(call: TemplateCall) -> str:
    _float_input(call)
    x = call.inputs[0]
    r = len(x.shape)
    axes = list(range(_axis(call, r, -1), r))
    n = 1
    for d in axes:
        n *= x.shape[d]
    scale = call.inputs[1]
    inv_n, eps = c_float(1.0 / n), c_float(float(call.attr("epsilon", 1e-5)))
    passes = [Pass("ss", "0.0f", lambda a, v, g: f"{a} + {v} * {v}", _plus,
                   after=lambda a, g: f"1.0f / sqrtf({a} * {inv_n} + {eps})")]

    def fin(xe, g, cached, idx):
        return f"{xe} * {g('ss')} * {scale.at(broadcast_index(idx, scale.shape))}"
    return row_reduce(call, x, axes, passes, finish_elem=fin, cache=True)
