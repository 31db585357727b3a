"""A small harness that compiles ONE node's C (a template or an inlined expression) and runs it.

What goes in: a one-node ONNX model with static shapes (inputs may be graph inputs or initializers) and
numpy inputs. What comes out: the node's output 0 as computed by the generated C.

This exists so templates and inline handlers can be tested in isolation against onnxruntime, below the
whole compiler (``dlcc.compile``): a mismatch here is the op's C, not lowering or memory planning.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dlcc.build.cc import compile_files, compiler, flags_for
from dlcc.codegen.cbase import C_HELPERS, Names, Operand, TensorRef, ctype, indent, vector_helpers
from dlcc.codegen.element_c import CElements
from dlcc.codegen.lir_c import print_c
from dlcc.codegen.ukernels import micro_c
from dlcc.schedule.elementwise import map_func
from dlcc.schedule.target import NAMES, Target, get_target
from dlcc.schedule.workspace import node_workspace_bytes
from dlcc.util import value_dtype, value_shape

__all__ = ["assert_close", "ort_output", "run_node", "runnable_targets"]



def prelude(target: Target) -> str:
    import dlcc.codegen.templates  # noqa: F401  (registers the templates' helpers)

    return ("#include <stdint.h>\n#include <math.h>\n#include <string.h>\n#include <float.h>\n"
            + vector_helpers(target.lanes) + "\n" + "\n".join(C_HELPERS[k] for k in sorted(C_HELPERS)))


def _source(node: ir.Node, graph: ir.Graph, target: Target) -> tuple[str, list[ir.Value], list[np.ndarray]]:
    from dlcc.codegen.templates import NEEDS_BUFFERS, TEMPLATES, TemplateCall

    names = Names()
    ins = [v for v in node.inputs if v is not None]
    params, buffers, consts = [], {}, {}
    for k, v in enumerate(ins):
        ref = TensorRef(f"in{k}", value_dtype(v), value_shape(v))
        buffers[v] = ref
        params.append(f"const {ref.ctype}* restrict in{k}")
        if v.const_value is not None:
            consts[v] = v.const_value.numpy()
    out = node.outputs[0]
    oref = TensorRef("out", value_dtype(out), value_shape(out))
    params.append(f"{oref.ctype}* restrict out")
    packed: list[np.ndarray] = []
    ws, micro = None, ""
    if node.op_type in TEMPLATES:
        operands = []
        for v in node.inputs:
            if v is None:
                operands.append(None)
            else:
                op = Operand.of(buffers[v], consts.get(v))
                if node.op_type not in NEEDS_BUFFERS:
                    op = Operand(op.shape, op.dtype, op.at, None, op.const)
                operands.append(op)
        def pack(array: np.ndarray) -> TensorRef:
            ref = TensorRef(f"w{len(packed)}", array.dtype.name, array.shape)
            packed.append(array)
            return ref

        nbytes = node_workspace_bytes(node, lambda v: v.const_value is not None, target, 1)
        if nbytes:  # the scratch the schedule stage would declare
            ws = TensorRef("ws", "float32", (nbytes // 4,))
        call = TemplateCall(node, operands, oref.shape, oref.dtype,
                            lambda idx, val: f"{oref.at(idx)} = {val};", oref, True, names, pack, target,
                            **({"workspace": ws} if ws is not None else {}))
        body = TEMPLATES[node.op_type](call)
        micro = "".join(micro_c(name, target.lanes) for name in sorted(call.micro))
    else:  # an inlined op: its element expression in the loop step production builds (verified, printed)
        gen = CElements({**buffers, out: oref}, consts, names, target.lanes)
        body, _ = print_c(gen.fill(out, map_func(tuple(oref.shape), oref.dtype, 1, "node", names)), gen.ptrs)
    params += [f"const {ctype(a.dtype)}* restrict w{k}" for k, a in enumerate(packed)]
    if ws is not None:  # the last parameter (filled with NaN: nothing may rely on its contents)
        params.append("float* restrict ws")
        packed.append(np.full(ws.shape, np.nan, dtype=np.float32))
    return f"{prelude(target)}\n{micro}\nvoid dlcc_node({', '.join(params)}) {{\n{indent(body)}\n}}\n", ins, packed


def run_node(model: onnx.ModelProto | ir.Model, feeds: dict[str, np.ndarray], *, keep: str | None = None,
             target: Target | str | None = None) -> np.ndarray:
    """Compile the single node of ``model`` for ``target`` (default native; one this machine runs) with the
    production compiler flags (``build.cc``) and run it on ``feeds`` (graph inputs by name)."""
    target = get_target(target)
    m = ir.serde.deserialize_model(model) if isinstance(model, onnx.ModelProto) else model
    nodes = list(m.graph)
    assert len(nodes) == 1, "run_node takes a one-node model"
    node = nodes[0]
    src, ins, packed = _source(node, m.graph, target)
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    with tempfile.TemporaryDirectory(prefix="dlcc-node-") as tmp:  # the loaded library outlives its file
        c_path = os.path.join(tmp, f"n{digest}.c")
        so_path = os.path.join(tmp, f"n{digest}.so")
        with open(c_path, "w") as f:
            f.write(src)
        if keep:
            with open(keep, "w") as f:
                f.write(src)
        compile_files(compiler(), flags_for(target), [Path(c_path)], Path(so_path), Path(tmp))
        lib = ctypes.CDLL(so_path)
    arrays = []
    for v in ins:
        a = v.const_value.numpy() if v.const_value is not None else feeds[v.name]
        arrays.append(np.ascontiguousarray(a, dtype=value_dtype(v)))
    out = node.outputs[0]
    result = np.empty(value_shape(out), dtype=value_dtype(out))
    ptrs = [a.ctypes.data_as(ctypes.c_void_p) for a in [*arrays, result, *packed]]
    lib.dlcc_node.restype = None
    lib.dlcc_node(*ptrs)
    return result


def runnable_targets() -> list[str]:
    """The named targets whose C this machine runs (native first), one per vector width: what a template's
    tests run it for, so every lane count a target can ask for is exercised here."""
    seen, out = set(), []
    for name in NAMES:
        t = get_target(name)
        if t.runs_here() and t.lanes not in seen:
            seen.add(t.lanes)
            out.append(name)
    return out


def ort_output(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Output 0 of ``model`` in onnxruntime: the oracle the one-node tests compare with."""
    import onnxruntime as ort

    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def assert_close(got: np.ndarray, ref: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """DESIGN.md's rule: same shape, and max|got - ref| <= rtol * max|ref| + atol (relative to the scale)."""
    assert got.shape == ref.shape
    assert np.max(np.abs(got - ref)) <= rtol * np.max(np.abs(ref)) + atol
