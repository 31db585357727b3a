"""``dlcc.compile``: ONNX model -> optimized graph -> fusion plan -> kernel IR -> memory plan -> C -> library.

What goes in: a model (path, bytes, ModelProto or onnx_ir model — an onnx_ir model is copied, not
changed) and options: ``input_shapes`` to fix symbolic dims, ``fusion`` (auto | tvm | dnnfusion),
``target`` (``dlcc.schedule.target``: native, x86-64-v4, x86-64-v3, aarch64, generic; ``portable`` is
``target="generic"``), ``threads`` (the generated thread pool's size; default the target's cores, 1 = no
pthreads), ``level`` (graph optimization level),
``constants`` (input name -> array: inputs that are really parameters, such as axes or scales, frozen
into the model so the code can be specialized to them), ``winograd`` (default True; False keeps every 3x3
convolution direct: slower, but the weights blob keeps the model's size).
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
from dataclasses import dataclass, field, replace

import onnx_ir as ir

from dlcc.errors import DlccError, UnsupportedModelError
from dlcc.frontend.sizes import check_tensor_sizes, check_total_bytes
from dlcc.schedule.target import Target, get_target, host_arch

__all__ = ["BACKEND", "Artifacts", "build_artifacts", "choose_fusion", "compile_model"]


@dataclass
class Artifacts:
    model: ir.Model
    plan: object  # FusionPlan
    program: object  # kir.Program
    memory: object  # MemoryPlan
    csource: object  # CSource
    timings: dict[str, float] = field(default_factory=dict)
    target: Target = field(default_factory=get_target)
    threads: int = 1

    def info(self) -> dict:
        m = self.memory
        return {
            "kernels": len(self.program.kernels),
            "nodes": len(self.model.graph),
            "fusion": self.plan.planner,
            "arena_bytes": m.arena_bytes,  # workspace included (each kernel's scratch lives in the arena)
            "lower_bound_bytes": m.lower_bound,
            "workspace_bytes": sum(self.program.buffers[s.workspace].nbytes for k in self.program.kernels
                                   for s in k.steps if s.workspace is not None),  # (summed over kernels)
            "workspace_peak_bytes": max((self.program.buffers[s.workspace].nbytes for k in self.program.kernels
                                         for s in k.steps if s.workspace is not None), default=0),
            "no_reuse_bytes": m.no_reuse_bytes,
            "weights_bytes": len(self.csource.weights),
            "target": self.target.name,
            "threads": self.threads,
            "timings": dict(self.timings),
            "per_kernel": _kernel_figures(self.program),  # [{id, ops, form, flops, bytes}] in call order: --profile
            "layouts": _layout_figures(self.program),  # channels-last buffers, Transposes removed and left
        }


def _layout_figures(program) -> dict:
    from dlcc.schedule.layouts import layout_figures

    return layout_figures(program)


def _kernel_figures(program) -> list[dict]:
    from dlcc.build.profile import kernel_figures

    return kernel_figures(program)


def _copy(model: ir.Model) -> ir.Model:
    return ir.serde.deserialize_model(ir.serde.serialize_model(model))


def build_artifacts(model, *, input_shapes: Mapping[str, Sequence[int]] | None = None, fusion: str = "auto",
                    level: int = 3, on_stage: Callable[[str], None] | None = None,
                    constants: Mapping[str, object] | None = None, target: Target | str | None = None,
                    threads: int | None = None, on_ir: Callable[[str, str], None] | None = None,
                    winograd: bool = True) -> Artifacts:
    """Run the backend stages (``BACKEND``) on ``model``. ``on_stage(name)`` is told when each stage ends;
    ``on_ir(name, listing)`` (``dlcc compile --print-after/--dump-dir``) also gets the IR the stage left:
    the graph (load, optimize), the fusion groups, the kernel IR (lower, schedule, memory: with workspace
    and arena offsets; codegen: with the loop IR of the kernels built in it)."""
    target = get_target(target)
    if not winograd:
        target = replace(target, winograd=False)
    b = _Build(model, input_shapes, fusion, level, constants, target, default_threads(target, threads))
    timings: dict[str, float] = {}
    t = time.perf_counter()
    for name, step in BACKEND:
        step(b)
        now = time.perf_counter()
        timings[name] = now - t
        if on_ir:
            on_ir(name, stage_listing(name, b))
        t = time.perf_counter()
        if on_stage:
            on_stage(name)
    return Artifacts(b.model, b.plan, b.program, b.memory, b.csource, timings, b.target, b.threads)


def stage_listing(name: str, b: _Build) -> str:
    """The IR the backend stage ``name`` left in ``b``, as text."""
    if name in ("load", "optimize"):
        from dlcc.passes.printer import format_model

        return format_model(b.model)
    if name == "fusion":
        plan = b.plan
        why = f"; {plan.reason}" if plan.reason else ""
        lines = [f"fusion plan ({plan.planner}): {len(plan.groups)} groups{why}"]
        for g in plan.groups:
            lines.append(f"  g{g.id} {getattr(g.kind, 'name', g.kind)} anchor {g.anchor.op_type} ({g.anchor.name}): "
                         + "+".join(n.op_type for n in g.nodes))
        return "\n".join(lines)
    from dlcc.lower.kir import print_program

    return print_program(b.program, b.memory if name in ("memory", "codegen") else None)


def default_threads(target: Target, threads: int | None = None) -> int:
    """``threads`` (at least 1), or by default the target's cores (native: this machine's)."""
    if threads is None:
        return max(1, target.cores)
    if int(threads) < 1:
        raise DlccError(f"threads must be at least 1, not {threads}")
    return int(threads)


@dataclass
class _Build:
    """What the backend stages hand on: the options, then each stage's result in the field it fills."""

    source: object
    input_shapes: Mapping[str, Sequence[int]] | None
    fusion: str
    level: int
    constants: Mapping[str, object] | None
    target: Target
    threads: int
    model: ir.Model | None = None
    plan: object = None  # FusionPlan
    program: object = None  # kir.Program
    memory: object = None  # MemoryPlan
    csource: object = None  # CSource


def _load(b: _Build) -> None:
    from dlcc.frontend.load import load
    from dlcc.frontend.shapes import set_input_shapes, symbolic_inputs

    m = _copy(b.source) if isinstance(b.source, ir.Model) else load(b.source)
    if b.constants:
        freeze_inputs(m, b.constants)
    if b.input_shapes:
        set_input_shapes(m, b.input_shapes)
    symbolic = symbolic_inputs(m)
    if symbolic:
        name, dims = next(iter(symbolic.items()))
        example = ",".join(str(d) if isinstance(d, int) else "N" for d in dims) or "..."
        raise DlccError(f"input '{name}' has a symbolic shape {dims}: compilation needs static shapes",
                        hint=f"fix it with --input-shape {name}={example.replace('N', '1')} "
                             f"(input_shapes={{'{name}': [...]}} in Python)")
    b.model = m


def _optimize(b: _Build) -> None:
    from dlcc.api import optimize

    optimize(b.model, level=b.level, target="dlcc-c", emit=lambda s: None)
    _lift_constants(b.model)


def _fusion(b: _Build) -> None:
    import dlcc.codegen.program  # noqa: F401  (registers what the C backend prints: dlcc.ops.backend)
    from dlcc.lower.lower import unsupported_ops

    missing = unsupported_ops(b.model.graph)
    if missing:
        listing = ", ".join(f"{op} ({n})" for op, n in sorted(missing.items()))
        err = UnsupportedModelError(f"the C backend does not support {sum(missing.values())} node(s): {listing}",
                                    hint="`dlcc optimize` still writes optimized ONNX for this model")
        err.ops = dict(missing)  # op -> count, for callers that name them (the torch.compile fallback)
        raise err
    _check_static(b.model)
    _check_sizes(b.model)
    b.plan, b.program = choose_fusion(b.model, b.fusion)


def _lower(b: _Build) -> None:
    from dlcc.lower.lower import lower

    if b.program is None:  # auto lowered both plans to choose between them
        b.program = lower(b.model, b.plan)


def _schedule(b: _Build) -> None:
    from dlcc.lower.kir import verify_program
    from dlcc.schedule.blocked import block_buffers
    from dlcc.schedule.chscale import fold_channel_scales
    from dlcc.schedule.layouts import assign_layouts
    from dlcc.schedule.pwdw import fuse_pointwise_depthwise
    from dlcc.schedule.rings import add_rings
    from dlcc.schedule.target import get_target
    from dlcc.schedule.workspace import declare_workspace

    target = get_target(b.target)
    if fuse_pointwise_depthwise(b.program, target, b.threads):
        verify_program(b.program)
    if assign_layouts(b.program, target, b.threads):
        verify_program(b.program)
    if fold_channel_scales(b.program, target, b.threads):
        verify_program(b.program)
    if add_rings(b.program, target, b.threads):
        verify_program(b.program)
    if block_buffers(b.program, target, b.threads):
        verify_program(b.program)
    declare_workspace(b.program, target, b.threads)


def _memory(b: _Build) -> None:
    from dlcc.memory.schedule import plan_program_memory

    b.memory = plan_program_memory(b.program)
    check_total_bytes("arena and weights", b.memory.arena_bytes + _weights_bytes(b.model))  # before codegen copies


def _codegen(b: _Build) -> None:
    from dlcc.codegen.program import generate

    b.csource = generate(b.program, b.memory, b.target, b.threads)


# The backend, in order. Each step fills one field of _Build; its name is its key in ``Artifacts.timings``
# and what ``on_stage`` is told when it ends.
BACKEND: list[tuple[str, Callable[[_Build], None]]] = [
    # read the model, freeze parameter inputs, fix input shapes: the C is specialized to static shapes
    ("load", _load),
    # the graph pipeline for the C target, then every constant an initializer (weights go in one blob)
    ("optimize", _optimize),
    # refuse what the C backend cannot compile (all unsupported ops at once, sizes) before any backend
    # work, then group the nodes into kernels (auto: the plan whose lowered kernels move fewer bytes)
    ("fusion", _fusion),
    # kernel IR: one loop-nest kernel per group, views for reshape-like ops, epilogues in their template
    ("lower", _lower),
    # per target and thread count: 1x1 convolutions merged into the depthwise convolution that reads them
    # (schedule.pwdw), buffers stored channels-last where that removes a layout change (schedule.layouts),
    # per-channel scales folded into the convolution reading them (schedule.chscale), a zero ring around the
    # buffers a depthwise convolution then reads in place (schedule.rings), channel blocks with a zero ring for the
    # inputs a Winograd or direct convolution then reads in place (schedule.blocked), then the scratch each kernel asks
    # for (packed GEMM panels), declared before memory planning so the arena holds it
    ("schedule", _schedule),
    # one arena for every temporary, checked against the size limit before codegen copies the weights
    ("memory", _memory),
    # print the kernel IR as C (one function per kernel, the run entry point, the weight blob)
    ("codegen", _codegen),
]


def choose_fusion(m: ir.Model, fusion: str = "auto", *, estimate_if_unlowerable: bool = False):
    """The fusion plan ``dlcc.compile`` uses for the optimized graph of ``m``: ``(plan, program)``.

    ``tvm``/``dnnfusion``: that planner's plan, and no program (lowering is the next stage). ``auto``: both
    planners, judged by what the backend really moves: the bytes each kernel reads and writes once lowered
    (a group whose ops must be materialized inside it costs what it costs); the chosen plan's program comes
    along. ``dlcc report`` and ``dlcc inspect --fusion`` call this too, so they show the plan compile takes;
    with ``estimate_if_unlowerable``, a graph the C backend cannot lower (unsupported ops, shapes not
    static, an attribute no template handles) falls back to the planners' byte estimate, and the plan's
    reason says so.
    """
    import dlcc.codegen.program  # noqa: F401  (registers what the C backend prints: dlcc.ops.backend)
    from dlcc.codegen.cbase import TemplateError
    from dlcc.fusion import plan_fusion
    from dlcc.lower.lower import lower, unsupported_ops

    if fusion != "auto":
        return plan_fusion(m, fusion), None

    def estimate(why: str):
        plan = plan_fusion(m, "auto")
        plan.reason += f"; by the bytes estimate, as the C backend cannot lower this graph ({why})"
        return plan, None

    if estimate_if_unlowerable:
        missing = unsupported_ops(m.graph)
        if missing:
            return estimate("unsupported: " + ", ".join(sorted(missing)))
        if not _is_static(m):
            return estimate("shapes not static")
    candidates = []
    for name in ("tvm", "dnnfusion"):
        plan = plan_fusion(m, name)
        try:
            program = lower(m, plan)
        except TemplateError as e:
            if not estimate_if_unlowerable:
                raise
            return estimate(str(e))
        candidates.append((program_traffic(program), name, plan, program))
    candidates.sort(key=lambda c: (c[0], c[1]))
    traffic, _, plan, program = candidates[0]
    plan.reason = "auto: " + ", ".join(f"{n} {t / 1e6:.1f} MB in {len(p.kernels)} kernels"
                                       for t, n, _, p in sorted(candidates, key=lambda c: c[1])) + \
        f" of kernel traffic; chose {plan.planner}"
    return plan, program


def _is_static(m: ir.Model) -> bool:
    return all(v.shape is not None and all(isinstance(d, int) for d in v.shape) and v.dtype is not None
               for node in m.graph for v in node.outputs)


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
                  constants: Mapping[str, object] | None = None, target: Target | str | None = None,
                  threads: int | None = None, winograd: bool = True):
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
                          constants=constants, target=target, threads=threads, winograd=winograd)
    t = time.perf_counter()
    lib = build_shared(art.csource.files, target=target, threads=art.threads)
    art.timings["cc"] = time.perf_counter() - t
    blob = art.csource.weights
    weights = aligned_empty(max(len(blob), 1))
    weights[:len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    cm = CompiledModel(lib, art.csource.inputs, art.csource.outputs, art.csource.arena_bytes, weights, art.info())
    cm.artifacts = art  # type: ignore[attr-defined]
    return cm
