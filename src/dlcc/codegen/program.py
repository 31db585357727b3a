"""C generation for a whole program: one C function per kernel, a ``dlcc_run`` entry point, a weights blob.

What goes in: a kernel-IR ``Program`` and its ``MemoryPlan`` (arena offsets of the temporaries).
What comes out: ``CSource`` — the C text of ``model.c`` (kernels + entry point), ``model.h``, the weights
blob (every weight the kernels read, 64-byte aligned, including weights that templates repacked at
compile time), and the figures the runtime needs (arena and weights bytes, inputs and outputs).

Entry point (the ABI the Python runtime and the bundle's main.c call):

    void dlcc_run(const void *const *inputs, void *const *outputs, void *arena, const void *weights);

``inputs``/``outputs`` are in graph order; ``arena`` holds ``DLCC_ARENA_BYTES`` (64-byte aligned) and is
owned by the caller, one per concurrent call; ``weights`` is the blob. Each buffer becomes a pointer into
one of these four regions; each kernel takes the buffers it touches as ``restrict`` pointers named
``p_<id>`` (ids, never model names; model names appear only in sanitized comments).

Beside it, for profilers (``dlcc run --profile``, the bundle's ``model -p``), the same calls timed one by one:

    void dlcc_run_profiled(const void *const *inputs, void *const *outputs, void *arena, const void *weights,
                           double *seconds);   /* seconds[k]: the k-th kernel call, dlcc_num_kernels() of them */
    int dlcc_num_kernels(void);
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from dlcc.codegen.cbase import (
    C_HELPERS,
    Names,
    Operand,
    TensorRef,
    contiguous_strides,
    ctype,
    indent,
    vector_helpers,
)
from dlcc.codegen.cbase import sanitize_comment as _c
from dlcc.codegen.element_c import CElements, blocked_index, c_index, ref_buf
from dlcc.codegen.lir_c import print_c
from dlcc.codegen.templates import NEEDS_BUFFERS, TEMPLATES, InputScale, Producer, TemplateCall
from dlcc.codegen.threads import KERNEL_DECLS, POOL_C, POOL_DECLS, SERIAL_C, outline
from dlcc.codegen.ukernels import micro_c
from dlcc.errors import DlccError
from dlcc.lower.indexmaps import reshape_map
from dlcc.lower.kir import Buffer, Kernel, Program, Step
from dlcc.lower.lir import Const, Expr, Let, Load, Var, print_func, verify_func
from dlcc.lower.lower import op_key
from dlcc.memory.planner import MemoryPlan
from dlcc.schedule.chscale import scale_operands
from dlcc.schedule.elementwise import fill_map, inlined_nodes, map_func
from dlcc.schedule.rings import ring_func
from dlcc.schedule.target import Target, get_target
from dlcc.util import value_dtype, value_shape

__all__ = ["ALIGN", "CSource", "generate"]

# what lowering may ask this generator to print (ops.backend: lowering sits below codegen)
from dlcc.lower.element import ELEMENTWISE, INDEXED  # noqa: E402
from dlcc.ops.backend import register as _register_backend  # noqa: E402

_register_backend(ELEMENTWISE, INDEXED, TEMPLATES, NEEDS_BUFFERS)

ALIGN = 64
_PTR = re.compile(r"\bp_(\d+)\b")


UNIT_BYTES = 250_000
# a loop step over at least this many elements runs on the pool (below, a dispatch costs more than it saves)
PAR_MIN_ELEMENTS = 1 << 15  # kernels are split into C files of about this size, compiled in parallel


@dataclass
class CSource:
    files: dict[str, str]  # model.c (entry point), kernels_<i>.c (the kernels), model.h
    header: str
    weights: bytes
    arena_bytes: int
    inputs: list[tuple[str, str, tuple[int, ...]]]  # (name, dtype, shape) in graph order
    outputs: list[tuple[str, str, tuple[int, ...]]]
    kernels: int = 0
    weight_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """All C text (every .c file, in order), e.g. to search it."""
        return "\n".join(text for name, text in self.files.items() if name.endswith(".c"))

    @property
    def digest(self) -> str:
        h = hashlib.sha256(self.source.encode())
        h.update(hashlib.sha256(self.weights).digest())
        return h.hexdigest()


def prelude(target: Target) -> str:

    return ("#include <stdint.h>\n#include <stddef.h>\n#include <math.h>\n#include <string.h>\n#include <float.h>\n"
            + vector_helpers(target.lanes) + "\n" + "\n".join(C_HELPERS[k] for k in sorted(C_HELPERS)))


class _KernelGen:
    def __init__(self, program: Program, weights: _Weights, target: Target, threads: int = 1):
        self.p = program
        self.weights = weights
        self.target = target
        self.threads = threads
        self.micro: set[str] = set()  # micro-kernels the kernels call
        self.zeroed: set[int] = set()  # buffers whose zero ring a kernel printed so far clears (``ring``)

    def ref(self, bid: int) -> TensorRef:
        b = self.p.buffers[bid]
        root, offset, strides = self.p.window(bid)
        return TensorRef(f"p_{root.id}", b.dtype, b.shape, strides, offset, b.ring, b.block, b.ring_fill)

    def kernel(self, k: Kernel) -> str:
        names = Names()
        refs: dict[ir.Value, TensorRef] = {}
        for n in k.nodes:
            for v in (*n.inputs, *n.outputs):
                if v is not None and v in self.p.value_buffer:
                    refs[v] = self.ref(self.p.value_buffer[v])
        gen = CElements(refs, self.p.consts, names, self.target.lanes)
        parts = []
        for step in k.steps:
            parts += [self.ring(step, names), self.step(step, gen, names)]
        return "\n".join(p for p in parts if p)

    def ring(self, step: Step, names: Names) -> str:
        """The zeroing of the ring of the view this step writes (``schedule.rings``), or "" where it has none."""
        bid = self.p.value_buffer.get(step.outputs[0]) if step.kind in ("template", "loop") and step.outputs else None
        root = self.p.window(bid)[0].id if bid is not None and self.p.buffers[bid].ring else None
        if root is None or root in self.zeroed:
            return ""  # (the views written over it in place later find it zero)
        self.zeroed.add(root)
        # (of all of the root's blocks: a Concat's slices in channel blocks are views of one root, which the first
        # of their writers zeroes for all of them through the Concat's result, the view with all the channels)
        view = max((b for b in self.p.buffers.values() if b.kind == "view" and b.base == root and b.ring),
                   key=lambda b: b.shape[1], default=self.p.buffers[bid])
        f = ring_func(view, f"p_{root}", names)
        verify_func(f)
        text, _ = print_c(f, {})
        what = "zero ring" if not self.p.buffers[bid].ring_fill else "ring of -inf"
        return f"/* {what} */\n{{\n{indent(text)}\n}}"

    def step(self, step: Step, gen: CElements, names: Names) -> str:
        """A copy or a loop step as the loop IR of ``schedule.elementwise.map_func`` (the element each index
        gets: a load of the source, or the element expression of the group's elementwise and injective ops,
        ``lower.element``, verified with it), else a template."""
        if step.kind == "copy":
            dst, src = self.ref(step.copy[0]), self.ref(step.copy[1])
            dbuf, sbuf = ref_buf(dst, "dst"), ref_buf(src, "src")

            def load(idx):  # (a reshape copied into a graph output: the same elements in row-major order)
                return [], Load(sbuf, tuple(idx if dst.shape == src.shape else reshape_map(idx, dst.shape, src.shape)))

            f = fill_map(map_func(tuple(dst.shape), dst.dtype, 1, "copy", names), dbuf, load, (dbuf, sbuf))
            verify_func(f)
            return f"/* copy */\n{print_c(f, {'dst': dst.ptr, 'src': src.ptr})[0]}"
        if step.kind == "loop":
            v = step.outputs[0]
            dst = gen.refs[v]

            par = self.threads if self.threads > 1 and dst.size >= PAR_MIN_ELEMENTS else 1
            order = _memory_order(dst) if not dst.block else None
            tile = _transpose_tile(_inlined(v, gen), dst.shape) if order is None and not dst.block else None
            # (a destination in channel blocks: in its memory order, the channels of a block innermost)
            f = gen.fill(v, map_func(tuple(dst.shape), dst.dtype, par, "loop", names, tile, order, dst.block))
            step.loop_ir = print_func(f)
            text, _ = print_c(f, gen.ptrs)
            return f"/* {'+'.join(n.op_type for n in step.nodes)} */\n{{\n{indent(text)}\n}}"
        return self.template(step, gen, names)

    def operands(self, node: ir.Node, gen: CElements) -> list[Operand | None]:
        """The template operands of ``node``'s inputs: buffers (with their constant, if any), else inlined."""
        operands: list[Operand | None] = []
        for v in node.inputs:
            if v is None:
                operands.append(None)
                continue
            const = gen.gen.const_of(v)
            ref = gen.refs.get(v)
            if ref is None and const is not None and (op_key(node) in NEEDS_BUFFERS or const.size > 1):
                ref = self.ref(self.p.value_buffer[v]) if v in self.p.value_buffer else self.weights.add(const)
                gen.add(v, ref)
            if ref is not None:
                operands.append(Operand.of(ref, const))
            else:
                operands.append(Operand(value_shape(v), value_dtype(v),
                                        lambda idx, v=v: gen.at(v, idx), None, const))
        return operands

    @staticmethod
    def chain(a: ir.Value, end: ir.Value, gen: CElements, names: Names) -> Callable[[Sequence, str], \
            tuple[list[str], str]]:
        """(statements, expression) of the fused elementwise chain from anchor result ``a`` to ``end`` at element
        ``idx`` (C text, or loop-IR expressions), given the anchor's value there (C text)."""
        def parts(idx: Sequence, val: str) -> tuple[list[str], str]:
            if end is a:
                return [], val
            tmp = names("e")
            gen.gen.bound[a] = Var(tmp, "float32")
            try:
                stmts, expr = gen.parts(end, idx, compute=True)
            finally:
                del gen.gen.bound[a]
            return [f"const float {tmp} = {val};", *stmts], expr
        return parts

    @staticmethod
    def _gate(g: ir.Value, gen: CElements) -> Callable[[Expr, Expr], tuple[list[Let], Expr]]:
        """The element expression (locals, value) of factor ``g`` (rank <= 4, one value per image or for all, and per
        channel) of image n's channel c."""
        shape = value_shape(g)

        def at(n: Expr, c: Expr) -> tuple[list[Let], Expr]:
            full = [n, c, Const(0), Const(0)][4 - len(shape):]
            idx = [Const(0) if d == 1 else i for d, i in zip(shape, full, strict=True)]
            lets: list[Let] = []
            with gen.gen.own_memo():
                value = gen.gen.at(g, idx, lets)
            return lets, value
        return at

    def template(self, step: Step, gen: CElements, names: Names) -> str:
        node = step.anchor
        end = step.outputs[0]
        a = node.outputs[0]
        dst = gen.refs[end]
        operands = self.operands(node, gen)
        shape = value_shape(a)
        if dst.dtype == "float32" and dst.shape == shape and (dst.contiguous or step.channels_last):
            scratch = dst
        elif step.scratch is not None:
            scratch = self.ref(step.scratch)
        else:
            raise DlccError("internal: a template step with a strided or non-float destination has no scratch")
        direct = end is a and scratch is dst and dst.contiguous
        parts = self.chain(a, end, gen, names)

        dbuf = gen.gen.bufs[end]

        def store(idx, val):
            # (image, channel block, channel in it, row, column) of a channel-blocked destination: the channel a Lane
            index = blocked_index(idx, dst.block) if len(idx) == dst.rank + 1 else [c_index(i) for i in idx]
            at = gen.c(Load(dbuf, tuple(index)))
            if end is a:
                return f"{at} = {val};"
            stmts, expr = parts(index, val)
            return "{ " + " ".join(stmts) + f" {at} = {expr}; }}"

        producer = None
        if step.producer is not None:  # a 1x1 Conv computed inside this step: its chain, bias first
            pn = step.producer.anchor
            pops = self.operands(pn, gen)
            pparts = self.chain(pn.outputs[0], step.producer.outputs[0], gen, names)
            bias = pops[2].ref if len(pops) > 2 and pops[2] is not None else None

            def pchain(idx, val, pparts=pparts, bias=bias):
                idx = [str(i) for i in idx]
                return _statement_expr(*pparts(idx, f"{val} + {bias.at([idx[1]])}" if bias is not None else val))

            identity = bias is None and step.producer.outputs[0] is pn.outputs[0]
            post = _bias_post(step.producer, gen) if bias is not None and pops[2].const is not None else None
            producer = Producer(pn, pops, pchain, identity, post)
        scale = None
        if step.input_scale is not None:  # a per-channel Mul folded into this Conv (``schedule.chscale``)
            xv, gv, _ = scale_operands(self.p, step.input_scale)
            operands[0] = Operand.of(gen.refs[xv])
            scale = InputScale(self._gate(gv, gen), *value_shape(xv)[:2], bufs=tuple(gen.gen.bufs.values()),
                               ptrs=gen.ptrs)
        ws = self.ref(step.workspace) if step.workspace is not None else None
        # the epilogue per block of channels where its destination or another tensor it reads is stored in blocks
        blocks = {gen.refs[v].block for n in step.nodes if n is not node and n is not step.input_scale
                  for v in n.inputs if v is not None and v in gen.refs} | {dst.block}  # (the scale: as it repacks)
        call = TemplateCall(node, operands, shape, value_dtype(a), store, scratch, direct, names,
                            lambda arr: self.weights.add(arr), self.target, self.threads, ws, self.micro,
                            producer=producer, input_scale=scale, epilogue_block=max(blocks))
        code = TEMPLATES[op_key(node)](call)
        step.loop_ir = "\n".join(call.loop_ir)
        return f"/* {'+'.join(n.op_type for n in step.nodes)} */\n{{\n{indent(code)}\n}}"


FLT_MAX = float(np.finfo(np.float32).max)


def _bias_post(step: Step, gen: CElements) -> tuple[str, float | None, float | None] | None:
    """The fused chain of a producer step (its anchor, then at most one float32 Relu or Clip with constant bounds
    reading the anchor's result) as an in-register epilogue (``Producer.post``), else None. An absent Clip bound
    is the float32 extreme, as the chain's C has it."""
    a, rest = step.anchor, [n for n in step.nodes if n is not step.anchor]
    if a is None or value_dtype(a.outputs[0]) != "float32":
        return None
    if not rest:
        return ("none", None, None) if step.outputs[0] is a.outputs[0] else None
    if len(rest) != 1 or rest[0].inputs[0] is not a.outputs[0] or step.outputs[0] is not rest[0].outputs[0]:
        return None
    n = rest[0]
    if n.domain not in ("", "ai.onnx"):
        return None
    if n.op_type == "Relu":
        return "relu", None, None
    if n.op_type != "Clip":
        return None
    bounds: list[float] = []
    for i, (name, default) in enumerate((("min", -FLT_MAX), ("max", FLT_MAX))):
        v = n.inputs[i + 1] if len(n.inputs) > i + 1 else None
        attr = n.attributes.get(name)
        if v is not None:
            c = gen.gen.const_of(v)
            if c is None or c.size != 1:
                return None
            bounds.append(float(np.float32(c.reshape(()))))
        else:
            bounds.append(float(np.float32(attr.value)) if attr is not None else default)
    return "clip", bounds[0], bounds[1]


def _statement_expr(stmts: list[str], expr: str) -> str:
    """One C expression of ``expr`` after the statements that define its variables (a GNU statement expression)."""
    return f"({{ {' '.join(stmts)} {expr}; }})" if stmts else expr


def _memory_order(dst: TensorRef) -> tuple[int, ...] | None:
    """The dims of a destination whose strides are a permutation of a contiguous layout's other than the
    row-major one (a channels-last buffer the schedule stage chose, its rows and planes further apart where it
    has a zero ring), outermost first; else None."""
    if dst.contiguous or dst.size <= 1:
        return None
    order = tuple(sorted(range(dst.rank), key=lambda d: (-dst.strides[d], d)))
    expect = 1
    for d in reversed(order):
        if dst.shape[d] > 1 and (dst.strides[d] < expect if dst.ring else dst.strides[d] != expect):
            return None  # (with a zero ring, the rows and planes are further apart)
        expect = max(expect, dst.strides[d]) * dst.shape[d] if dst.ring else expect * dst.shape[d]
    return order if order != tuple(range(dst.rank)) else None


TRANSPOSE_TILE = 16  # elements per side of a transposing loop step's tiles (16 floats: one cache line)


def _inlined(v: ir.Value, gen: CElements) -> list[ir.Node]:
    """The nodes a loop step's element expression of ``v`` computes (its producer, and theirs up to buffers)."""
    return inlined_nodes(v, lambda i: i in gen.refs or gen.gen.const_of(i) is not None)


def _transpose_tile(nodes: list[ir.Node], shape: tuple[int, ...]) -> tuple[int, int, bool] | None:
    """(destination axis, block, reads inner) to tile a loop step by when it computes (``nodes``) one Transpose
    and elementwise ops of its shape, the Transpose's input's last axis not the destination's last
    (``schedule.elementwise``: innermost the loop whose other side moves by the smaller stride), else None."""
    tr = [n for n in nodes if n.op_type == "Transpose"]
    if len(tr) != 1 or tr[0].outputs[0].shape is None or tuple(value_shape(tr[0].outputs[0])) != tuple(shape):
        return None
    r = len(shape)
    a = tr[0].attributes.get("perm")
    perm = list(a.value) if a is not None else list(reversed(range(r)))
    k = perm.index(r - 1) if len(perm) == r else r - 1
    if k == r - 1 or shape[k] < TRANSPOSE_TILE // 2 or shape[-1] < TRANSPOSE_TILE // 2:
        return None
    src = value_shape(tr[0].inputs[0])
    read_stride = math.prod(src[perm[-1] + 1:])  # of the source, along the destination's last axis
    write_stride = math.prod(shape[k + 1:])  # of the destination, along the source's last axis
    return k, TRANSPOSE_TILE, read_stride > write_stride


class _Weights:
    """The weights blob: arrays placed at 64-byte aligned offsets; returns TensorRefs on new buffers."""

    def __init__(self, program: Program):
        self.p = program
        self.offsets: dict[int, int] = {}
        self.size = 0

    def add(self, array: np.ndarray) -> TensorRef:
        array = np.ascontiguousarray(array)
        bid = max(self.p.buffers) + 1
        self.p.buffers[bid] = Buffer(bid, "weight", array.dtype.name, array.shape, "packed", data=array)
        return TensorRef(f"p_{bid}", array.dtype.name, array.shape)

    def layout(self, used: set[int]) -> bytes:
        chunks = []
        for bid in sorted(used):
            b = self.p.buffers[bid]
            if b.kind != "weight":
                continue
            self.offsets[bid] = self.size
            data = np.ascontiguousarray(b.data, dtype=b.dtype).tobytes()
            pad = (-len(data)) % ALIGN
            chunks.append(data + b"\0" * pad)
            self.size += len(data) + pad
        return b"".join(chunks)


def generate(program: Program, memory: MemoryPlan, target: Target | str | None = None, threads: int = 1) -> CSource:
    """The C source, header and weights blob of ``program`` placed by ``memory``, for ``target`` (default
    native), run on up to ``threads`` threads (1: no thread pool, no pthreads)."""
    target = get_target(target)
    threads = max(1, int(threads))
    weights = _Weights(program)
    kgen = _KernelGen(program, weights, target, threads)
    bodies = []
    for k in program.kernels:
        bodies.append(kgen.kernel(k))
    used_per_kernel = [sorted({int(m) for m in _PTR.findall(body)}) for body in bodies]
    used = {bid for u in used_per_kernel for bid in u}
    for bid in program.inputs + program.outputs:
        used.add(bid)
    blob = weights.layout(used)

    written = {program.root(b).id for k in program.kernels for b in k.writes}
    funcs, calls, protos = [], [], []
    for k, body, roots in zip(program.kernels, bodies, used_per_kernel, strict=True):
        params, args = [], []
        for rid in roots:
            b = program.buffers[rid]
            ct = ctype(b.dtype)
            const = "const " if rid not in written and b.kind != "output" else ""
            params.append(f"{const}{ct}* restrict p_{rid}")
            args.append(f"({const}{ct}*)({_address(b, program, memory, weights)})")
        what = "+".join(k.ops) or "copy"
        names_ = ", ".join(_c(n.name or "", 40) for n in k.nodes[:4])
        signature = f"void dlcc_k{k.id}({', '.join(params) or 'void'})"
        protos.append(f"{signature};")
        tasks = ""
        if threads > 1:  # each loop a template or step marked parallel becomes a task for the pool
            tasks, body = outline(f"dlcc_k{k.id}", body, params)
        funcs.append(f"/* kernel {k.id}: {_c(what, 120)} ({names_}) */\n{tasks}{signature} {{\n{indent(body)}\n}}\n")
        calls.append(f"dlcc_k{k.id}({', '.join(args)});")
    arena = memory.arena_bytes
    head = prelude(target) + "".join("\n" + micro_c(name, target.lanes) for name in sorted(kgen.micro))
    files: dict[str, str] = {}
    units: list[list[str]] = [[]]
    size = 0
    for f in funcs:  # contiguous chunks of about UNIT_BYTES: the C compiler builds them in parallel
        if size > UNIT_BYTES:
            units.append([])
            size = 0
        units[-1].append(f)
        size += len(f)
    for i, unit in enumerate(units):
        files[f"kernels_{i}.c"] = (f"/* generated by dlcc: kernels, part {i + 1} of {len(units)} */\n{head}\n"
                                   + (KERNEL_DECLS if threads > 1 else "")
                                   + "#include \"model.h\"\n\n" + "\n".join(unit))
    source = (f"/* generated by dlcc: {len(program.kernels)} kernels, arena {arena} bytes, "
              f"weights {weights.size} bytes */\n" + PROFILE_INCLUDES
              + "#include <stddef.h>\n#include <stdint.h>\n#include \"model.h\"\n"
              + (f"#define DLCC_THREADS {threads}\n{POOL_C}" if threads > 1 else SERIAL_C) + "\n"
              + "\n".join(protos)
              + "\n\nvoid dlcc_run(const void *const *inputs, void *const *outputs, void *arena, "
                "const void *weights) {\n"
              + "    char *A = (char *)arena; const char *W = (const char *)weights;\n"
              + "    (void)A; (void)W; (void)inputs; (void)outputs;\n"
              + "    const int pool = dlcc_pool_enter();\n"
              + indent("\n".join(calls)) + "\n    dlcc_pool_leave(pool);\n}\n"
              + f"size_t dlcc_arena_bytes(void) {{ return {arena}; }}\n"
              + f"size_t dlcc_weights_bytes(void) {{ return {weights.size}; }}\n"
              + profiled_entry(calls))
    ins = [(n, program.buffers[b].dtype, program.buffers[b].shape) for n, b in
           zip(program.input_names, program.inputs, strict=True)]
    outs = [(n, program.buffers[b].dtype, program.buffers[b].shape) for n, b in
            zip(program.output_names, program.outputs, strict=True)]
    header = _header(ins, outs, arena, weights.size, threads)
    files = {"model.c": source, **files, "model.h": header}
    return CSource(files, header, blob, arena, ins, outs, len(program.kernels), dict(weights.offsets))


def _address(b: Buffer, p: Program, memory: MemoryPlan, weights: _Weights) -> str:
    if b.kind == "input":
        return f"inputs[{p.inputs.index(b.id)}]"
    if b.kind == "output":
        return f"outputs[{p.outputs.index(b.id)}]"
    if b.kind == "weight":
        return f"W + {weights.offsets[b.id]}"
    if b.kind == "temp":
        return f"A + {memory.offsets[b.id]}"
    raise DlccError(f"internal: kernel parameter {b.id} is a view")


def _header(ins, outs, arena: int, wbytes: int, threads: int = 1) -> str:
    lines = ["/* generated by dlcc */", "#ifndef DLCC_MODEL_H", "#define DLCC_MODEL_H", "#include <stddef.h>",
             "#include <stdint.h>", "",
             f"#define DLCC_NUM_INPUTS {len(ins)}", f"#define DLCC_NUM_OUTPUTS {len(outs)}",
             f"#define DLCC_ARENA_BYTES ((size_t){arena}ULL)", f"#define DLCC_WEIGHTS_BYTES ((size_t){wbytes}ULL)",
             f"#define DLCC_COMPILED_THREADS {threads}", ""]
    for kind, items in (("INPUT", ins), ("OUTPUT", outs)):
        for i, (name, dtype, shape) in enumerate(items):
            size = int(np.prod(shape)) if shape else 1
            lines.append(f"/* {kind.lower()} {i}: {_c(name)} {dtype}{list(shape)} */")
            lines.append(f"#define DLCC_{kind}{i}_SIZE {size}")
            lines.append(f"#define DLCC_{kind}{i}_BYTES {size * np.dtype(dtype).itemsize}")
    lines += ["",
              "void dlcc_run(const void *const *inputs, void *const *outputs, void *arena, const void *weights);",
              "size_t dlcc_arena_bytes(void);", "size_t dlcc_weights_bytes(void);", "", *POOL_DECLS, *PROFILE_DECLS,
              "", "#endif", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------- the profiled entry point
# dlcc_run_profiled: the same kernel calls as dlcc_run, each followed by a CLOCK_MONOTONIC reading, the
# seconds of call k going to seconds[k] (k in call order, which is the order of Program.kernels). Kept apart
# from generate(): it only wraps the call statements generate() builds.

PROFILE_INCLUDES = "#ifndef _POSIX_C_SOURCE\n#define _POSIX_C_SOURCE 200809L\n#endif\n#include <time.h>\n"
PROFILE_DECLS = [
    "/* like dlcc_run, and seconds[k] = the time of the k-th kernel call (dlcc_num_kernels() of them) */",
    "void dlcc_run_profiled(const void *const *inputs, void *const *outputs, void *arena, const void *weights, "
    "double *seconds);",
    "int dlcc_num_kernels(void);",
]


def profiled_entry(calls: list[str]) -> str:
    """The C of ``dlcc_run_profiled`` and ``dlcc_num_kernels`` around ``calls`` (one statement per kernel)."""
    timed = []
    for k, call in enumerate(calls):
        timed.append(f"{call}\nt1 = dlcc_now_(); seconds[{k}] = t1 - t0; t0 = t1;")
    return ("\nstatic double dlcc_now_(void) {\n"
            "    struct timespec t;\n    clock_gettime(CLOCK_MONOTONIC, &t);\n"
            "    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;\n}\n\n"
            "void dlcc_run_profiled(const void *const *inputs, void *const *outputs, void *arena, "
            "const void *weights, double *seconds) {\n"
            "    char *A = (char *)arena; const char *W = (const char *)weights;\n"
            "    (void)A; (void)W; (void)inputs; (void)outputs; (void)seconds;\n"
            "    const int pool = dlcc_pool_enter();\n"
            "    double t0 = dlcc_now_(), t1;\n    (void)t1;\n"
            + indent("\n".join(timed)) + "\n    dlcc_pool_leave(pool);\n}\n"
            + f"int dlcc_num_kernels(void) {{ return {len(calls)}; }}\n")


del contiguous_strides
