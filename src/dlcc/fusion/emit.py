"""Apply a FusionPlan to a copy of the model: each multi-node group becomes one call of a local ONNX function.

What goes in: an onnx_ir model and a FusionPlan made on ``model.graph`` (``plan.graph is model.graph``).
What comes out: a NEW onnx_ir model (the input is not touched) where every group of two or more nodes is
replaced by a single node ``dlcc.fused::group_<id>_<anchor op>(inputs) -> outputs`` calling a model-local
function whose body is the group's nodes (attributes included). Singleton groups stay plain nodes.

Algorithm: the model is serialized to a ModelProto (that is the clone); the plan's nodes are mapped onto
the proto's nodes by their position in graph order. The new node list is built group by group in the
plan's (topological) order, so the result is topologically sorted. For a fused group:
- function inputs  = the group's external inputs in first-read order (initializers included: a function
  cannot hold initializers, so they are passed by the call);
- function outputs = the group's outputs (values read outside the group, or graph outputs);
- the function's opset imports copy the model's; the model imports ``dlcc.fused`` version 1 and its IR
  version is raised to 8 (the first with model-local functions) when lower.
Values that now live only inside a function lose their ``value_info`` entry in the main graph.

Invariants: the result passes ``onnx.checker.check_model(full_check=True)`` and computes the same outputs
(it is the same computation, only regrouped). A group holding a node with a subgraph attribute (If, Loop,
Scan) is left unfused, since its body may read outer-scope values a function cannot see.
"""

from __future__ import annotations

import re

import onnx
import onnx_ir as ir

from dlcc.errors import DlccError
from dlcc.fusion.plan import FusionPlan, Group, verify_plan

FUSED_DOMAIN = "dlcc.fused"
FUNCTIONS_IR_VERSION = 8  # ModelProto.functions appeared in IR version 8

__all__ = ["FUSED_DOMAIN", "emit_groups", "function_name"]


def function_name(group: Group) -> str:
    """``group_<id>_<anchor op>`` with anything but letters, digits and ``_`` replaced by ``_``."""
    op = re.sub(r"[^A-Za-z0-9_]", "_", group.anchor.op_type) or "op"
    return f"group_{group.id}_{op}"


def emit_groups(model: ir.Model, plan: FusionPlan) -> ir.Model:
    """A new model in which each group of ``plan`` with more than one node is one local-function call."""
    if plan.graph is not model.graph:
        raise DlccError("the fusion plan was made for another graph than the model's",
                        hint="plan the model you emit (plan_fusion(model))")
    verify_plan(plan)  # a non-convex or incomplete plan would emit a broken model
    position = {node: i for i, node in enumerate(model.graph)}
    proto = ir.serde.serialize_model(model)
    old_nodes = list(proto.graph.node)
    if len(old_nodes) != len(position):
        raise DlccError("the model's nodes do not survive serialization one to one",
                        hint="report this model to the dlcc developers")

    new_nodes: list[onnx.NodeProto] = []
    functions: list[onnx.FunctionProto] = []
    hidden: set[str] = set()  # values now produced and consumed only inside a function
    opset_imports = [onnx.helper.make_opsetid(o.domain, o.version) for o in proto.opset_import]
    for group in plan.groups:
        members = [old_nodes[position[n]] for n in group.nodes]
        if len(members) == 1 or any(_has_subgraph(n) for n in members):
            new_nodes.extend(members)
            continue
        name = function_name(group)
        inputs = [v.name for v in group.inputs]
        outputs = [v.name for v in group.outputs]
        body = []
        for n in members:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            body.append(copy)
        functions.append(onnx.helper.make_function(
            FUSED_DOMAIN, name, inputs, outputs, body, opset_imports,
            doc_string=f"fused group {group.id} ({group.kind.name}): {len(members)} nodes"))
        new_nodes.append(onnx.helper.make_node(name, inputs, outputs, name=f"dlcc_{name}", domain=FUSED_DOMAIN))
        kept = set(outputs)
        hidden.update(o for n in members for o in n.output if o and o not in kept)

    if functions:
        del proto.graph.node[:]
        proto.graph.node.extend(new_nodes)
        kept_info = [vi for vi in proto.graph.value_info if vi.name not in hidden]
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(kept_info)
        proto.functions.extend(functions)
        if not any(o.domain == FUSED_DOMAIN for o in proto.opset_import):
            proto.opset_import.append(onnx.helper.make_opsetid(FUSED_DOMAIN, 1))
        proto.ir_version = max(proto.ir_version, FUNCTIONS_IR_VERSION)
    return ir.serde.deserialize_model(proto)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
