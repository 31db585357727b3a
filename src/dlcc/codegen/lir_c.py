"""The C printer of the loop-level kernel IR (``dlcc.lower.lir``).

What goes in: a verified ``Func``, the C pointer expression of each of its parameter and workspace
buffers (by name), the fused epilogue (``store(index, value)`` -> C statements, the template's callback),
the target's lanes and fresh names.
What comes out: C statements (the kernel step's body) and the names of the micro-kernels they call (their
C bodies come from ``dlcc.codegen.ukernels`` and go once into every file's prelude). ``inputs[k](index)`` is the
C expression of element ``index`` of the opaque input ``k`` (``In``: a template's ``Operand.at``).

Loops print as C ``for`` loops; an ``unrolled`` loop is printed once per iteration with its variable
replaced by the constant (so register-tile indices are constants and the compiler keeps the tile in
registers); a ``vectorized`` loop gets ``#pragma GCC ivdep``; a ``parallel`` loop becomes the pool's
``par_for`` (it must be the outermost statement: ``threads.outline`` turns it into a task). Vector loads
and stores use ``dlcc_vf_load/store``; a register or stack buffer accessed as vectors is an array of
``dlcc_vf``; one of rank 0 is a C scalar. A thread-workspace allocation inside a parallel loop over ``t`` is the
declared workspace at ``t * span``. ``Call`` prints the C function of ``C_CALLS``: the branchless, vectorizable
float32 functions of ``dlcc.codegen.vmath`` where it has them, libm's otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from dlcc.codegen.cbase import c_float, c_int, c_literal, ctype, indent
from dlcc.codegen.scalar_c import SCALAR_C
from dlcc.codegen.threads import par_for
from dlcc.errors import DlccError
from dlcc.lower.lir import (
    Alloc,
    Bcast,
    Bin,
    Buf,
    Call,
    Cast,
    Const,
    Epilogue,
    Expr,
    For,
    Func,
    If,
    In,
    Lane,
    Let,
    Load,
    Micro,
    Ptr,
    Select,
    Stmt,
    Store,
    Var,
    simplify,
    subst_stmts,
)

__all__ = ["C_CALLS", "c_expr", "c_stmts", "print_c"]

# A name, or a format of the arguments ({0}, {1}, ...; {T}: the C type of the result)
C_CALLS = {"exp": "dlcc_expf", "expneg": "dlcc_vm_expneg",
           "expm1": "dlcc_expm1f", "log": "dlcc_logf", "log1p": "dlcc_log1pf", "tanh": "dlcc_tanhf",
           "sigmoid": "dlcc_sigmoidf", "sqrt": "sqrtf", "abs": "fabsf", "pow": "powf", **SCALAR_C}

Index = Callable[[Sequence[str]], str]


class _Printer:
    def __init__(self, ptrs: dict[str, str], store: Callable[[Sequence[str], str], str] | None, lanes: int,
                 inputs: dict[int, Index], chain: Callable[[Sequence[str], str], str] | None = None):
        self.ptrs = dict(ptrs)
        self.store = store
        self.chain = chain
        self.lanes = lanes
        self.inputs = inputs
        self.micro: set[str] = set()
        self.par_var: str | None = None

    def e(self, x: Expr) -> str:
        if isinstance(x, Var):
            return x.name
        if isinstance(x, Lane):
            return f"(({self.e(x.block)})*{x.size} + ({self.e(x.lane)}))"
        if isinstance(x, Const):
            if x.dtype not in ("int64", "float32", "float64"):
                return c_literal(x.value, x.dtype)
            if x.dtype == "int64":
                return str(int(x.value)) if abs(int(x.value)) < 2**31 else c_int(int(x.value))
            if x.dtype == "float64" and math.isfinite(x.value):
                return repr(float(x.value))
            return c_float(float(x.value))  # (float64 infinities and NaN: the float macros convert exactly)
        if isinstance(x, Bin):
            if x.dtype == "int64":
                x = simplify(x)
                if not isinstance(x, Bin):
                    return self.e(x)
            a, b = self.e(x.a), self.e(x.b)
            if x.op in ("min", "max"):
                if x.dtype != "int64":
                    raise DlccError("internal: loop IR float min/max has no C form yet")
                cmp = "<" if x.op == "min" else ">"
                return f"(({a}) {cmp} ({b}) ? ({a}) : ({b}))"
            op = {"//": "/"}.get(x.op, x.op)
            return f"({a} {op} {b})"
        if isinstance(x, Load):
            return self.ref(x.buf, x.index, x.lanes)
        if isinstance(x, Select):
            return f"(({self.e(x.cond)}) ? ({self.e(x.a)}) : ({self.e(x.b)}))"
        if isinstance(x, Bcast):
            return f"(({self.e(x.value)}) - (dlcc_vf){{0}})"  # x - 0 is x (also -0): a broadcast, no add
        if isinstance(x, Ptr):
            return f"({self.base(x.buf)} + {self.e(x.buf.layout.address(x.index))})"
        if isinstance(x, Call):
            fn, args = C_CALLS[x.fn], [self.e(a) for a in x.args]
            if "{" in fn:
                return fn.format(*args, T=ctype(x.dtype))
            return f"{fn}({', '.join(args)})"
        if isinstance(x, Cast):
            if x.dtype == "bool":  # (C's bool of any value: not a truncation to 8 bits)
                return f"(({self.e(x.value)}) != 0)"
            return f"(({ctype(x.dtype)})({self.e(x.value)}))"
        if isinstance(x, In):
            if x.k not in self.inputs:
                raise DlccError(f"internal: loop IR opaque input {x.k} has no C form")
            return self.inputs[x.k]([self.e(i) for i in x.index])
        raise DlccError(f"internal: loop IR expression {x!r} has no C form")

    def base(self, b: Buf) -> str:
        if b.name not in self.ptrs:
            raise DlccError(f"internal: loop IR buffer {b.name} has no C pointer")
        return self.ptrs[b.name]

    def ref(self, b: Buf, index: Sequence[Expr], lanes: int) -> str:
        if not b.shape and b.scope in ("register", "stack"):
            return b.name
        if b.scope == "const":  # a table: declared where it is read (a GNU statement expression)
            vals = ", ".join(c_literal(v, b.dtype) for v in b.data)
            return (f"({{ static const {ctype(b.dtype)} {b.name}[{len(b.data)}] = {{{vals}}}; "
                    f"{b.name}[{self.e(b.layout.address(index))}]; }})")
        if b.vector > 1:  # an array of vectors: the last index counts elements, the array vectors
            *lead, last = index
            sub = "".join(f"[{self.e(i)}]" for i in lead)
            vec = f"{sub}[{self.e(simplify(last // b.vector))}]"
            if lanes == b.vector:
                return f"{b.name}{vec}"
            return f"{b.name}{vec}[{self.e(simplify(last % b.vector))}]"
        addr = self.e(b.layout.address(index))
        if lanes > 1:
            return f"dlcc_vf_load({self.base(b)} + {addr})"
        return f"{self.base(b)}[{addr}]"

    def stmts(self, body: Sequence[Stmt]) -> str:
        return "\n".join(self.stmt(s) for s in body)

    def block(self, body: Sequence[Stmt]) -> str:
        """The statements of an allocation's C block: nested allocations that are all of it declare in it."""
        if len(body) == 1 and isinstance(body[0], Alloc) and body[0].buf.scope in ("register", "stack"):
            return self.alloc(body[0].buf) + "\n" + self.block(body[0].body)
        return self.stmts(body)

    def stmt(self, s: Stmt) -> str:
        if isinstance(s, For):
            if s.kind == "unrolled":
                if not (isinstance(s.start, Const) and isinstance(s.stop, Const)):
                    raise DlccError("internal: an unrolled loop needs constant bounds")
                return "\n".join(self.stmts(subst_stmts(s.body, s.var.name, Const(i)))
                                 for i in range(int(s.start.value), int(s.stop.value)))
            v = s.var.name
            if s.kind == "parallel":
                if not (isinstance(s.start, Const) and s.start.value == 0 and isinstance(s.stop, Const)):
                    raise DlccError("internal: a parallel loop needs bounds [0, constant)")
                outer, self.par_var = self.par_var, v
                try:
                    return par_for(v, int(s.stop.value), self.stmts(s.body))
                finally:
                    self.par_var = outer
            head = f"for (int64_t {v} = {self.e(s.start)}; {v} < {self.e(s.stop)}; ++{v}) {{"
            pragma = "#pragma GCC ivdep\n" if s.kind == "vectorized" else ""
            return f"{pragma}{head}\n{indent(self.stmts(s.body))}\n}}"
        if isinstance(s, Let):
            return f"const {ctype(s.var.dtype)} {s.var.name} = {self.e(s.value)};"
        if isinstance(s, Store):
            val = self.e(s.value)
            if s.lanes > 1 and s.buf.vector <= 1:
                return f"dlcc_vf_store({self.base(s.buf)} + {self.e(s.buf.layout.address(s.index))}, {val});"
            return f"{self.ref(s.buf, s.index, s.lanes)} = {val};"
        if isinstance(s, If):
            text = f"if ({self.e(s.cond)}) {{\n{indent(self.stmts(s.then))}\n}}"
            if s.else_:
                text += f" else {{\n{indent(self.stmts(s.else_))}\n}}"
            return text
        if isinstance(s, Alloc):
            if s.buf.scope == "workspace":  # a pointer declaration: no block (a parallel loop may follow)
                if sum(isinstance(x, For) and x.kind == "parallel" for x in s.body) > 1:
                    # one block per statement, each declaring the pointer (the pool outlines one parallel
                    # loop per block, with the declarations before it)
                    decl = self.alloc(s.buf)
                    return "\n".join("{\n" + indent(decl + "\n" + self.stmt(x)) + "\n}" for x in s.body)
                return self.alloc(s.buf) + "\n" + self.stmts(s.body)
            return "{\n" + indent(self.alloc(s.buf) + "\n" + self.block(s.body)) + "\n}"
        if isinstance(s, Micro):
            self.micro.add(s.name)
            return f"dlcc_uk_{s.name}({', '.join(self.e(a) for a in s.args)});"
        if isinstance(s, Epilogue) and s.dest is not None:  # a fused producer's result into scratch
            val = self.e(s.value)
            if self.chain is not None:
                val = self.chain([self.e(i) for i in s.index], val)
            return f"{self.ref(s.dest.buf, s.dest.index, 1)} = {val};"
        if isinstance(s, Epilogue):
            if self.store is None:
                raise DlccError("internal: a loop IR epilogue without a store")
            return self.store([self.e(i) for i in s.index], self.e(s.value))
        raise DlccError(f"internal: loop IR statement {s!r} has no C form")

    def alloc(self, b: Buf) -> str:
        ct = ctype(b.dtype)
        if b.scope in ("register", "stack"):
            if not b.shape:
                return f"{ct} {b.name};"
            if b.vector > 1:
                *lead, last = b.shape
                dims = "".join(f"[{d}]" for d in lead) + f"[{-(-last // b.vector)}]"
                return f"dlcc_vf {b.name}{dims};"
            self.ptrs[b.name] = b.name
            return f"{ct} {b.name}[{b.layout.span}];"
        # workspace: the declared region (a parameter pointer); per thread: this thread's slice of it
        base = self.base(b)
        if b.scope == "thread_workspace":
            if self.par_var is None:
                raise DlccError("internal: thread workspace outside a parallel loop")
            base = f"({base} + {self.par_var} * (int64_t){b.layout.span})"
        self.ptrs[b.name] = b.name
        return f"{ct}* restrict {b.name} = {base};"


def print_c(f: Func, ptrs: dict[str, str], store: Callable[[Sequence[str], str], str] | None = None,
            lanes: int = 4, inputs: dict[int, Index] | None = None,
            chain: Callable[[Sequence[str], str], str] | None = None) -> tuple[str, set[str]]:
    """C statements computing ``f`` and the micro-kernels it calls. A parameter is the C pointer of its name
    unless ``ptrs`` says otherwise; workspace buffers are at ``ptrs``; ``inputs[k]`` prints opaque input ``k``;
    ``chain(index, value)``: the C expression of a fused producer's elementwise chain on its element ``index``
    (the Epilogues with a destination; none: the value itself)."""
    p = _Printer({**{b.name: b.name for b in f.params}, **ptrs}, store, lanes, inputs or {}, chain)
    return p.stmts(f.body), p.micro


def c_expr(e: Expr, ptrs: dict[str, str], lanes: int = 4) -> str:
    """The C of expression ``e`` (buffers at ``ptrs``, by name)."""
    return _Printer(ptrs, None, lanes, {}).e(e)


def c_stmts(body: Sequence[Stmt], ptrs: dict[str, str], lanes: int = 4) -> str:
    """The C of statements ``body`` (buffers at ``ptrs``, by name; no epilogue, no parallel loop)."""
    return _Printer(ptrs, None, lanes, {}).stmts(body)
