"""Fusion: graph IR -> FusionPlan (analysis only; the graph is not mutated).

``plan_fusion(model, planner)`` runs TVM's FuseOps (``tvm``), DNNFusion's planner (``dnnfusion``) or both
(``auto``, the default), in which case the plan that moves fewer bytes (group inputs + outputs, from
shapes) is chosen and ``plan.reason`` says why.
"""

from __future__ import annotations

import onnx_ir as ir

from dlcc.errors import DlccError
from dlcc.fusion.plan import FusionPlan

PLANNERS = ("auto", "tvm", "dnnfusion")


def plan_fusion(model: ir.Model | ir.Graph, planner: str = "auto") -> FusionPlan:
    from dlcc.fusion.dnnfusion import bytes_moved, plan_dnnfusion
    from dlcc.fusion.tvm import plan_tvm

    if planner not in PLANNERS:
        raise DlccError(f"unknown fusion planner '{planner}'", hint=f"use one of: {', '.join(PLANNERS)}")
    if planner == "tvm":
        plan = plan_tvm(model)
        plan.reason = "chosen with --fusion tvm"
        return plan
    if planner == "dnnfusion":
        plan = plan_dnnfusion(model)
        plan.reason = "chosen with --fusion dnnfusion"
        return plan
    tvm, dnn = plan_tvm(model), plan_dnnfusion(model)
    bt, bd = bytes_moved(tvm), bytes_moved(dnn)
    plan = tvm if bt <= bd else dnn
    plan.reason = (f"auto: {plan.planner} moves fewer bytes (tvm {bt / 1e6:.1f} MB in {tvm.num_kernels} kernels, "
                   f"dnnfusion {bd / 1e6:.1f} MB in {dnn.num_kernels} kernels)")
    return plan


__all__ = ["FusionPlan", "PLANNERS", "plan_fusion"]
