"""``dlcc.compile``: ONNX model -> optimized graph -> fusion plan -> kernel IR -> memory plan -> C -> library.

What goes in: a model (path, bytes, ModelProto or onnx_ir model — an onnx_ir model is copied, not
changed) and options: ``input_shapes`` to fix symbolic dims, ``fusion`` (auto | tvm | dnnfusion),
``target`` (``dlcc.schedule.target``: native, x86-64-v4, x86-64-v3, aarch64, generic; ``portable`` is
``target="generic"``), ``level`` (graph optimization level),
``constants`` (input name -> array: inputs that are really parameters, such as axes or scales, frozen
into the model so the code can be specialized to them).
What comes out: ``Artifacts`` (every stage's result, for the bundle writer, reports and tests), from
``build_artifacts``; ``compile`` returns the loaded ``CompiledModel``.

Errors before any C is generated: symbolic dims name the input and suggest ``--input-shape``; every
unsupported op is listed at once with its count; a tensor above ``dlcc.frontend.sizes.max_tensor_bytes()``
(2^34 bytes or the physical memory), or weights, inputs and outputs, or arena and weights, above it
together, are refused after shape inference and memory planning, before anything of that size exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from dlcc.errors import DlccError, UnsupportedModelError
from dlcc.frontend.sizes import check_tensor_sizes, check_total_bytes
from dlcc.schedule.target import Target, get_target, host_arch

__all__ = ["Artifacts", "build_artifacts", "compile_model"]


@dataclass
class Artifacts:
    model: ir.Model
    plan: object  # FusionPlan
    program: object  # kir.Program
    memory: object  # MemoryPlan
    csource: object  # CSource
    timings: dict[str, float] = field(default_factory=dict)
    target: Target = field(default_factory=get_target)

    def info(self) -> dict:
        m = self.memory
        return {
            "kernels": len(self.program.kernels),
            "nodes": len(self.model.graph),
            "fusion": self.plan.planner,
            "arena_bytes": m.arena_bytes,
            "lower_bound_bytes": m.lower_bound,
            "no_reuse_bytes": m.no_reuse_bytes,
            "weights_bytes": len(self.csource.weights),
            "target": self.target.name,
            "timings": dict(self.timings),
            "per_kernel": _kernel_figures(self.program),  # [{id, ops, flops, bytes}] in call order: --profile
        }


def _kernel_figures(program) -> list[dict]:
    from dlcc.build.profile import kernel_figures

    return kernel_figures(program)


def _copy(model: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def build_artifacts(model, *, input_shapes: Mapping[str, Sequence[int]] | None = None, fusion: str = "auto",
                    level: int = 3, on_stage: Callable[[str], None] | None = None,
                    constants: Mapping[str, object] | None = None, target: Target | str | None = None) -> Artifacts:
    from dlcc.api import optimize
    from dlcc.codegen.program import generate
    from dlcc.frontend.load import load
    from dlcc.frontend.shapes import set_input_shapes, symbolic_inputs
    from dlcc.fusion import plan_fusion
    from dlcc.lower.lower import lower, unsupported_ops
    from dlcc.memory.schedule import plan_program_memory

    target = get_target(target)
    timings: dict[str, float] = {}
    t = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        timings[name] = now - t
        t = now
        if on_stage:
            on_stage(name)

    m = _copy(model) if isinstance(model, ir.Model) else load(model)
    if constants:
        freeze_inputs(m, constants)
    if input_shapes:
        set_input_shapes(m, input_shapes)
    symbolic = symbolic_inputs(m)
    if symbolic:
        name, dims = next(iter(symbolic.items()))
        example = ",".join(str(d) if isinstance(d, int) else "N" for d in dims) or "..."
        raise DlccError(f"input '{name}' has a symbolic shape {dims}: compilation needs static shapes",
                        hint=f"fix it with --input-shape {name}={example.replace('N', '1')} "
                             f"(input_shapes={{'{name}': [...]}} in Python)")
    stage("load")
    optimize(m, level=level, target="dlcc-c", emit=lambda s: None)
    _lift_constants(m)
    stage("optimize")
    missing = unsupported_ops(m.graph)
    if missing:
        listing = ", ".join(f"{op} ({n})" for op, n in sorted(missing.items()))
        err = UnsupportedModelError(f"the C backend does not support {sum(missing.values())} node(s): {listing}",
                                    hint="`dlcc optimize` still writes optimized ONNX for this model")
        err.ops = dict(missing)  # op -> count, for callers that name them (the torch.compile fallback)
        raise err
    _check_static(m)
    _check_sizes(m)
    if fusion == "auto":
        # both planners, judged by what the backend really moves: the bytes each kernel reads and writes
        # once lowered (a group whose ops must be materialized inside it costs what it costs)
        candidates = []
        for name in ("tvm", "dnnfusion"):
            plan = plan_fusion(m, name)
            program = lower(m, plan)
            candidates.append((program_traffic(program), name, plan, program))
        candidates.sort(key=lambda c: (c[0], c[1]))
        traffic, _, plan, program = candidates[0]
        plan.reason = "auto: " + ", ".join(f"{n} {t / 1e6:.1f} MB in {len(p.kernels)} kernels"
                                           for t, n, _, p in sorted(candidates, key=lambda c: c[1])) + \
            f" of kernel traffic; chose {plan.planner}"
        stage("fusion")
    else:
        plan = plan_fusion(m, fusion)
        stage("fusion")
        program = lower(m, plan)
    stage("lower")
    memory = plan_program_memory(program)
    check_total_bytes("arena and weights", memory.arena_bytes + _weights_bytes(m))  # before codegen copies
    stage("memory")
    csource = generate(program, memory, target)
    stage("codegen")
    return Artifacts(m, plan, program, memory, csource, timings, target)


def program_traffic(program) -> int:
    """Bytes the kernels of ``program`` read and write (each buffer once per kernel; views count as the
    bytes they cover): the memory traffic the fusion plan leaves to the generated code."""
    total = 0
    for k in program.kernels:
        for bid in dict.fromkeys([*k.reads, *k.writes]):
            total += program.buffers[bid].nbytes
    return total


def freeze_inputs(m: ir.Model, constants: Mapping[str, object]) -> None:
    """Turn graph inputs into constants (initializers) with the given values: for inputs that are really
    parameters (axes, pads, scales...), which the compiled code needs at compile time."""
    import numpy as np

    by_name = {v.name: v for v in m.graph.inputs}
    for name, value in constants.items():
        v = by_name.get(name)
        if v is None:
            raise DlccError(f"cannot freeze unknown input '{name}'", hint=f"inputs: {', '.join(by_name)}")
        array = np.asarray(value)
        if v.dtype is not None and np.dtype(v.dtype.numpy()) != array.dtype:
            raise DlccError(f"the value for input '{name}' is {array.dtype}, the input is {v.dtype}")
        m.graph.inputs.remove(v)
        v.const_value = ir.Tensor(array)
        v.shape = ir.Shape(array.shape)
        m.graph.register_initializer(v)


def _lift_constants(m: ir.Model) -> None:
    from onnx_ir.passes.common import LiftConstantsToInitializersPass

    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(m)


def _feeding_inputs(values, inputs: set) -> list[str]:
    """Names of the graph inputs that ``values`` are computed from."""
    seen, stack, found = set(), [v for v in values if v is not None], []
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in inputs:
            found.append(v.name)
        elif v.producer() is not None:
            stack.extend(x for x in v.producer().inputs if x is not None)
    return sorted(set(found))


def _check_static(m: ir.Model) -> None:
    from dlcc.codegen.cbase import TemplateError

    inputs = set(m.graph.inputs)
    for node in m.graph:
        for v in node.outputs:
            if v.shape is None or not all(isinstance(d, int) for d in v.shape) or v.dtype is None:
                params = _feeding_inputs(node.inputs[1:], inputs)
                if params:
                    raise TemplateError(
                        f"the shape of '{v.name}' ({node.op_type}) depends on the value of input(s) "
                        f"{', '.join(params)}: they must be a constant for compilation",
                        hint="freeze them: dlcc.compile(model, constants={name: array})")
                raise DlccError(f"the shape of '{v.name}' (output of {node.op_type}) is not static after "
                                "shape inference", hint="fix the input shapes with --input-shape")


def _weights_bytes(m: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in m.graph.initializers.values() if v.const_value is not None)


def _check_sizes(m: ir.Model) -> None:
    """Every value (static now) fits the one-tensor limit; the weights and the graph's inputs and outputs
    (which the caller allocates) fit it together. Shape arithmetic only: nothing is allocated yet."""
    from dlcc.frontend.sizes import value_bytes

    check_tensor_sizes(m)
    io = sum((value_bytes(v) or (0, 0))[1] for v in [*m.graph.inputs, *m.graph.outputs])
    check_total_bytes("weights, inputs and outputs", _weights_bytes(m) + io)


def compile_model(model, *, input_shapes: Mapping[str, Sequence[int]] | None = None, fusion: str = "auto",
                  portable: bool = False, level: int = 3, on_stage: Callable[[str], None] | None = None,
                  constants: Mapping[str, object] | None = None, target: Target | str | None = None):
    """Compile ``model`` to a ``CompiledModel`` (see the module docstring)."""
    target = get_target("generic" if portable and target is None else target)
    if not target.runs_here():
        raise DlccError(f"code for target {target.name} ({target.arch}) cannot run on this machine "
                        f"({host_arch()}) to be called from Python",
                        hint=f"write a bundle instead: dlcc compile MODEL -o DIR --target {target.name}")
    import numpy as np

    from dlcc.build.cc import build_shared
    from dlcc.build.runtime import CompiledModel, aligned_empty

    art = build_artifacts(model, input_shapes=input_shapes, fusion=fusion, level=level, on_stage=on_stage,
                          constants=constants, target=target)
    t = time.perf_counter()
    lib = build_shared(art.csource.files, target=target)
    art.timings["cc"] = time.perf_counter() - t
    blob = art.csource.weights
    weights = aligned_empty(max(len(blob), 1))
    weights[:len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    cm = CompiledModel(lib, art.csource.inputs, art.csource.outputs, art.csource.arena_bytes, weights, art.info())
    cm.artifacts = art  # type: ignore[attr-defined]
    return cm
