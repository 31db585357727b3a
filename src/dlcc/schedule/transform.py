"""Schedule primitives: transformations of a loop-IR ``Func`` that keep what it computes and change how.

What goes in: a ``Func`` (or a statement tuple) as an algorithm states it, typically a plain loop nest over
the output (``schedule.loops.nest``), and the names of its loops. What comes out: the same computation with
its loops split, reordered, tiled, handed to threads or marked for the C writer; every primitive checks that
it applies (the loop exists, the loops it moves are perfectly nested, a moved loop's bounds do not depend on
a loop it crosses) and raises ``PassError`` otherwise. Halide and TVM's TensorIR call these split, reorder,
tile, parallel, vectorize, unroll.

    split(f, var, factor, outer, inner)  var = start + outer*factor + inner; the last block clipped
    reorder(f, names)                    a perfect nest of these loops permuted into this order
    tile(f, (a, b), (fa, fb), names)     split both and move both inner loops inside both outer ones
    parallelize(f, var, parts, thread)   a parallel loop over ``parts`` contiguous shares of ``var``'s range
    mark(f, var, kind)                   serial | parallel | vectorized | unrolled
    drop_unit_loops(f)                   loops of one iteration replaced by their start

The elementwise schedule (``schedule.elementwise``) is written as a plain nest and a list of these, and so are
the threads of the reductions, the depthwise and batched products, LRN, global pooling, the repacking of a
convolution's input (over its channel blocks) and the direct convolution's output-channel tiles
(``parallelize`` then ``reorder`` to put the threads outside the images). Kernels whose threads address their own
per-thread workspace (Winograd's V and M, a GEMM's packed panels) or split output rows where the kernel rows that
reach the input change stay written per thread. The verifier (``lower.lir.verify_func``) checks a parallel
loop's disjoint writes after ``parallelize``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from dlcc.errors import PassError
from dlcc.lower.lir import (
    KINDS,
    Alloc,
    Bin,
    Const,
    Expr,
    For,
    Func,
    If,
    Stmt,
    Var,
    _map_loops,
    _vars,
    rewrite_stmts,
    simplify,
    subst_stmts,
)
from dlcc.schedule.loops import share

__all__ = ["drop_unit_loops", "loop_names", "mark", "parallelize", "reorder", "split", "tile"]

Body = tuple[Stmt, ...]


def _on(f: Func | Body, fn: Callable[[Body], Body]) -> Func | Body:
    return replace(f, body=fn(f.body)) if isinstance(f, Func) else fn(tuple(f))


def _apply(f: Func | Body, var: str, fn: Callable[[For], Stmt | Body], what: str) -> Func | Body:
    """``fn`` applied to loop ``var``, which must exist."""
    if var not in loop_names(f):
        raise PassError(f"loop IR: {what}: no loop {var!r}")
    return _on(f, lambda body: _map_loops(body, var, fn))


def loop_names(f: Func | Body) -> list[str]:
    """The loop variables of ``f``, outermost first (depth-first, in statement order)."""
    out: list[str] = []

    def walk(body: Sequence[Stmt]) -> None:
        for s in body:
            if isinstance(s, For):
                out.append(s.var.name)
                walk(s.body)
            elif isinstance(s, If):
                walk(s.then)
                walk(s.else_)
            elif isinstance(s, Alloc):
                walk(s.body)
    walk(f.body if isinstance(f, Func) else f)
    return out


def split(f: Func | Body, var: str, factor: int, outer: str | None = None, inner: str | None = None) -> Func | Body:
    """Split loop ``var`` [start, stop) into an outer loop over blocks of ``factor`` and an inner loop over
    the block (the last block clipped to stop): ``var = start + outer*factor + inner``. The outer loop keeps
    the loop's kind; ``outer`` may be ``var`` itself (the name then stands for the block)."""
    if factor < 1:
        raise PassError(f"loop IR: split: factor {factor} of loop {var!r}")
    vo, vi = Var(outer or f"{var}_o"), Var(inner or f"{var}_i")

    def fn(s: For) -> Stmt:
        n = simplify(s.stop - s.start)
        blocks = simplify((n + (factor - 1)) // factor)
        base = simplify(s.start + vo * factor)
        inner_stop = Const(factor) if isinstance(n, Const) and int(n.value) % factor == 0 else \
            simplify(Bin("min", Const(factor), simplify(s.stop - base)))
        body = subst_stmts(s.body, var, simplify(base + vi))
        return For(vo, Const(0), blocks, (For(vi, Const(0), inner_stop, body, "serial"),), s.kind)
    return _apply(f, var, fn, "split")


def mark(f: Func | Body, var: str, kind: str) -> Func | Body:
    """Set the kind of loop ``var`` (serial, parallel, vectorized, unrolled)."""
    if kind not in KINDS:
        raise PassError(f"loop IR: unknown loop kind {kind}")
    return _apply(f, var, lambda s: replace(s, kind=kind), "mark")


def _free(e: Expr) -> set[str]:
    out: set[str] = set()
    _vars(e, out)
    return out


def reorder(f: Func | Body, names: Sequence[str]) -> Func | Body:
    """Permute a perfect nest into the order ``names`` (outermost first): the loops named must form a chain
    in which each one's body is exactly the next loop of the chain (in any order), and no loop's bounds may
    use a loop variable that the permutation moves inside it."""
    want = list(names)
    if len(set(want)) != len(want) or not want:
        raise PassError(f"loop IR: reorder: loops {want} are not distinct")

    def fn(top: For) -> Stmt:
        chain, s = [top], top
        while len(chain) < len(want):
            if len(s.body) != 1 or not isinstance(s.body[0], For) or s.body[0].var.name not in want:
                raise PassError(f"loop IR: reorder: loops {want} are not a perfect nest under {top.var.name!r}")
            s = s.body[0]
            chain.append(s)
        by = {c.var.name: c for c in chain}
        inner: Body = chain[-1].body
        for pos, name in reversed(list(enumerate(want))):
            loop = by[name]
            later = set(want[pos:])  # this loop and the ones now inside it
            uses = (_free(loop.start) | _free(loop.stop)) & later
            if uses:
                raise PassError(f"loop IR: reorder: the bounds of {name!r} use {sorted(uses)}, which would be "
                                "inside it")
            inner = (replace(loop, body=inner),)
        return inner[0]

    first = next((n for n in loop_names(f) if n in want), None)
    if first is None or any(n not in loop_names(f) for n in want):
        raise PassError(f"loop IR: reorder: no loops {want}")
    return _apply(f, first, fn, "reorder")


def tile(f: Func | Body, loops: tuple[str, str], factors: tuple[int, int],
         names: tuple[str, str, str, str] | None = None) -> Func | Body:
    """Split loops ``a`` and ``b`` (``a`` outside ``b``, perfectly nested, possibly with loops between that
    stay between) by their factors and move both inner loops inside both outer ones: a ``fa`` x ``fb``
    block of (a, b) at a time. ``names``: (outer a, outer b, inner a, inner b)."""
    a, b = loops
    oa, ob, ia, ib = names or (f"{a}_o", f"{b}_o", f"{a}_i", f"{b}_i")
    g = split(split(f, a, factors[0], oa, ia), b, factors[1], ob, ib)
    seq = loop_names(g)
    lo, hi = seq.index(oa), seq.index(ib)
    chain = seq[lo:hi + 1]
    order = [n for n in chain if n not in (ia, ib)] + [ia, ib]
    return reorder(g, order)


def parallelize(f: Func | Body, var: str, parts: int, thread: str) -> Func | Body:
    """Loop ``var`` [0, n) as a parallel loop ``thread`` over ``parts`` contiguous shares of its range (part
    t: [t*n // parts, (t+1)*n // parts)), the loop itself inside over the share; ``parts`` is clipped to n.
    The verifier then checks that the shares write disjoint elements."""
    def fn(s: For) -> Stmt:
        if not (isinstance(s.start, Const) and int(s.start.value) == 0 and isinstance(s.stop, Const)):
            raise PassError(f"loop IR: parallelize: loop {var!r} does not run over a constant [0, n)")
        n = int(s.stop.value)
        k = max(1, min(parts, n))
        t = Var(thread)
        return For(t, Const(0), Const(k), (replace(s, start=share(t, n, k)[0], stop=share(t, n, k)[1]),),
                   "parallel")
    return _apply(f, var, fn, "parallelize")


def drop_unit_loops(f: Func | Body, names: set[str] | None = None) -> Func | Body:
    """Every loop of exactly one iteration (constant bounds; of those named in ``names`` when given) replaced by
    its body at its start."""
    def unit(s: Stmt) -> tuple[Stmt, ...] | None:
        if not isinstance(s, For):
            return None
        inner = rewrite_stmts(s.body, unit)
        if isinstance(s.start, Const) and isinstance(s.stop, Const) and \
                int(s.stop.value) - int(s.start.value) == 1 and (names is None or s.var.name in names):
            return subst_stmts(inner, s.var.name, s.start)
        return (replace(s, body=inner),)
    return _on(f, lambda body: rewrite_stmts(body, unit))
