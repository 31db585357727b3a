"""Conv and ConvTranspose as a direct convolution with output pixels in the vector lanes: the kernel of the
convolutions the others do not take (grouped ones, 1-D and 3-D ones, a weight computed at run time,
ConvTranspose, inputs in any layout).

What goes in: a ``RowsPlan`` (``plan_rows``, or ``conv_rows_plan`` from a node's attributes and shapes: batch,
groups, channels per group, the input's extents, per spatial dim the output phases (``conv_phases``,
``convt_phases``), the register tile and the threads from the ``Target``), the input ``x`` (N, C, D, H, W) in
any layout (a 1-D or 2-D convolution has unit leading dims), the weight as the kernel reads it, ``w`` (groups,
channel blocks, KD, KH, Cg, KW, nb): packed at compile time (``pack_rows``) or a strided view of the run-time
weight (``weight_layout``), and when the plan stages the input, the workspace (``stage_shape``, declared by
``schedule.workspace`` before memory planning).
What comes out: a ``Func`` (``rows_func``) that hands every output element (n, m, z, y, x) once to the
epilogue.

Phases: the outputs of a spatial dim are split into phases, positions ``oo + os*u`` (u < count), whose taps
j < n read the input position ``u*sl + off0 + j*dstep`` with kernel index ``k0 + j*kstep``. A Conv has one
phase per dim (os 1, sl the stride, tap k at ``k*dilation - pad``); a ConvTranspose (o = i*s - p + k*d) one
per residue r = o mod s: a stride-1 correlation over the taps with r + p - k*d divisible by s (the gather
form: no scatter, no zero stuffing).

The register tile: nb output channels x pv vectors of output positions (as the registers allow), summed over
the taps and the group's input channels; each input vector feeds nb FMAs, each broadcast weight pv. It goes
through a local array to the epilogue, channel by channel along contiguous runs of outputs.

Staged (when the workspace has room): each (image, channel) plane of the input is copied per call into the
workspace, split into the phases of the strides (input position ``e*sl + f + omin`` at staged position e of
phase f) with a zero ring as far as the taps reach, so that no tap tests bounds and every tap reads a
contiguous run. A plane of output phases is then one flattened row (``uy*Wq + ux``, Wq a staged row: the
positions past a row's outputs are computed and dropped), run in tiles per (image, group, output depth,
channel block):

    staged plane (Wq wide)   0 0 0 0 0 0 0 0
                             0 x x x x x x 0      tiles: [0, V) [V, 2V) ... along the flattened rows;
                             0 x x x x x x 0      a lane over a 0 column is an output dropped
                             0 0 0 0 0 0 0 0

Along rows (no workspace: the input read in place; also a 1x1 convolution's pixels, one row no tap reads
past): per (image, group, output row (z, y), channel block), the outer taps inside the input (loop bounds
that are functions of the row), then tiles along the row: a tile whose reads stay inside the row loads it
directly when the row is contiguous and sl is 1; the others (the row's borders, every tile of a strided or
non-contiguous row) first copy their window of each input row into a local buffer split into sl phases, zero
outside the input:

    input row   . . [x x x x x x x x x x x x x x x x x x x x] . .      (. padding, never read)
    tiles        [ border ][ interior ][ interior ][ border ]          (border: through the local window)

Threads: over images, groups, rows of the first outer output dim (staged: only depth) or channel blocks,
the first with at least as many iterations as threads; staging splits the channels.
Sums run in a different order than onnxruntime (tests: rtol 1e-4).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from dlcc.errors import PassError
from dlcc.lower.lir import (
    Alloc,
    Bcast,
    Bin,
    Buf,
    Const,
    Epilogue,
    Expr,
    For,
    Func,
    If,
    Layout,
    Load,
    Stmt,
    Store,
    Var,
    simplify,
)
from dlcc.schedule.loops import PAR_MIN_FLOPS, numbered, share
from dlcc.schedule.pads import Attr, attr_ints, conv_pads, convt_pads
from dlcc.schedule.target import Target

__all__ = ["UNIT", "Phase", "RowsPlan", "conv_phases", "conv_rows_plan", "convt_phases", "pack_rows", "plan_rows",
           "rows_func", "weight_layout"]


@dataclass(frozen=True)
class Phase:
    """Output positions ``oo + os*u`` (u < count) of one spatial dim; tap j < n reads the input position
    ``u*sl + off0 + j*dstep`` with kernel index ``k0 + j*kstep``."""
    oo: int
    os: int
    count: int
    sl: int
    n: int
    k0: int = 0
    kstep: int = 1
    off0: int = 0
    dstep: int = 1

    def offsets(self) -> list[int]:
        return [self.off0 + j * self.dstep for j in range(self.n)]


UNIT = Phase(0, 1, 1, 1, 1)  # a unit spatial dim (put in front of a 1-D or 2-D convolution's)


def conv_phases(o: int, k: int, s: int, d: int, p: int) -> tuple[Phase, ...]:
    """A Conv dim: output o reads input ``o*s + k*d - p`` at tap k."""
    return (Phase(0, 1, o, s, k, 0, 1, -p, d),)


def convt_phases(o: int, k: int, s: int, d: int, p: int) -> tuple[Phase, ...]:
    """A ConvTranspose dim (output ``i*s - p + k*d``): output ``r + s*u`` gathers input ``u + (r + p - k*d)/s``
    over the taps k where that divides; they step by s / gcd(s, d)."""
    phases = []
    for r in range(min(s, o)):
        ks = [kk for kk in range(k) if (r + p - kk * d) % s == 0]
        count = -(-(o - r) // s)
        if not ks:
            phases.append(Phase(r, s, count, 1, 0))
            continue
        step = ks[1] - ks[0] if len(ks) > 1 else 1
        phases.append(Phase(r, s, count, 1, len(ks), ks[0], step, (r + p - ks[0] * d) // s, -(step * d) // s))
    return tuple(phases)


@dataclass(frozen=True)
class RowsPlan:
    batch: int
    groups: int
    cg: int  # input channels per group
    mg: int  # output channels per group
    ins: tuple[int, int, int]  # input D, H, W
    ks: tuple[int, int, int]  # kernel KD, KH, KW
    phases: tuple[tuple[Phase, ...], tuple[Phase, ...], tuple[Phase, ...]]
    lanes: int
    nb: int  # output channels per register tile
    pv: int  # vectors of output positions per register tile
    threads: int
    par: str  # the loop the threads split: "n", "g", "rows" (of the first outer dim with outputs) or "blocks"
    staged: bool = False  # the input staged in the workspace; tiles over flattened output planes

    @property
    def nmb(self) -> int:
        return -(-self.mg // self.nb)

    @property
    def outs(self) -> tuple[int, ...]:
        return tuple(sum(ph.count for ph in phs) for phs in self.phases)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.groups, self.nmb, self.ks[0], self.ks[1], self.cg, self.ks[2], self.nb)

    @property
    def row_dim(self) -> int:
        """The outer spatial dim whose rows the threads may split (depth when there is one)."""
        return 0 if self.outs[0] > 1 else 1

    def sl(self, d: int) -> int:
        return self.phases[d][0].sl  # (one per dim: a Conv has one phase, a ConvTranspose's are all 1)

    def span(self, d: int) -> tuple[int, int]:
        """(smallest tap offset of dim d, staged positions past a phase's outputs: the taps' reach)."""
        offs = [o for ph in self.phases[d] for o in ph.offsets()]
        return (min(offs), (max(offs) - min(offs)) // self.sl(d)) if offs else (0, 0)

    def ext(self, d: int) -> int:
        """Staged positions of dim d per input phase: the most outputs of a phase, then the taps' reach."""
        return max(ph.count for ph in self.phases[d]) + self.span(d)[1]

    def flat(self, py: Phase, px: Phase) -> int:
        """Flattened positions ``uy*ext(2) + ux`` of a plane of phases py x px (the last row's garbage columns
        left out)."""
        return (py.count - 1) * self.ext(2) + px.count

    @property
    def plane(self) -> int:
        """Floats of a staged plane: its rows, or what the last tile's reads reach if further."""
        V, wq = self.pv * self.lanes, self.ext(2)
        tiles = max(-(-self.flat(py, px) // V) for py in self.phases[1] for px in self.phases[2])
        return max(self.ext(1) * wq, tiles * V + self.span(1)[1] * wq + self.span(2)[1])

    @property
    def stage_shape(self) -> tuple[int, ...]:
        """The staged input: (N, C, input phases, depth, plane)."""
        return (self.batch, self.groups * self.cg, self.sl(0) * self.sl(1) * self.sl(2), self.ext(0), self.plane)

    @property
    def workspace_floats(self) -> int:
        return math.prod(self.stage_shape) if self.staged else 0

    @property
    def workspace_bytes(self) -> int:
        return 4 * self.workspace_floats


def plan_rows(batch: int, groups: int, cg: int, mg: int, ins: tuple[int, int, int], ks: tuple[int, int, int],
              phases: tuple[tuple[Phase, ...], ...], target: Target, threads: int = 1, stage: bool = True) -> RowsPlan:
    """The register tile: ``conv_oc_block`` output channels (fewer when the group has fewer), and as many
    vectors (at most 4, no more than a row, or a flattened plane, needs) as the registers hold beside one input
    vector per vector and a broadcast weight. ``stage``: stage the input in the workspace (unless it is one
    row that no tap reads past, or the threads could only split the rows of a plane). ``threads``: the pool's
    (used when the work is worth them)."""
    lanes, regs = target.lanes, target.vector_registers
    nb = min(mg, target.conv_oc_block)
    if all(sum(ph.count for ph in phases[d]) == 1 for d in (0, 1)) and all(
            ph.sl == 1 and min(ph.offsets(), default=0) >= 0 and ph.count - 1 + max(ph.offsets(), default=0) < ins[2]
            for ph in phases[2]):
        stage = False  # one row read inside the input (a 1x1 convolution's pixels): nothing to stage
    flops = 2.0 * batch * groups * mg * cg * math.prod(ks) * math.prod(sum(ph.count for ph in phs) for phs in phases)
    threads = threads if flops >= PAR_MIN_FLOPS else 1
    p = RowsPlan(batch, groups, cg, mg, tuple(ins), tuple(ks), tuple(tuple(x) for x in phases), lanes, nb, 1, 1, "",
                 stage)
    longest = max(p.flat(py, px) if stage else px.count for py in p.phases[1] for px in p.phases[2])
    p = replace(p, pv=max(1, min(4, (regs - 1) // (nb + 1), -(-longest // lanes))))
    if threads > 1:
        for par, extent in (("n", batch), ("g", groups), ("rows", p.outs[p.row_dim]), ("blocks", p.nmb)):
            if extent < threads:
                continue
            if par == "rows" and p.row_dim == 1 and stage:  # (the rows of a flattened plane: not staged)
                return plan_rows(batch, groups, cg, mg, ins, ks, phases, target, threads, False)
            return replace(p, threads=threads, par=par)
    return p


def conv_rows_plan(op: str, attr: Attr, x_shape: Sequence[int], w_shape: Sequence[int], y_shape: Sequence[int],
                   target: Target, threads: int = 1, flat: bool = False, stage: bool = True) -> RowsPlan:
    """The plan of a Conv or ConvTranspose node (``attr``: its attribute getter) from its input, weight and output
    shapes; the spatial dims padded in front to three. ``flat``: a 1x1, stride-1, unpadded Conv's pixels are one
    row (its input's spatial dims are contiguous)."""
    N, C, *ins = x_shape
    ks, outs, r = list(w_shape[2:]), list(y_shape[2:]), len(ins)
    group = int(attr("group", 1))
    strides, dils = (attr_ints(attr, op, a, r, 1) for a in ("strides", "dilations"))
    if op == "Conv":
        pb, pe = conv_pads(attr, op, ins, outs, ks, strides, dils)
        cg, mg = w_shape[1], w_shape[0] // group
        if flat and r > 1 and set(ks) == set(strides) == {1} and not any(pb) and not any(pe):
            ins, outs, ks, strides, dils, pb = [math.prod(ins)], [math.prod(outs)], [1], [1], [1], [0]
        phases = [conv_phases(o, k, s, d, a) for o, k, s, d, a in zip(outs, ks, strides, dils, pb, strict=True)]
    else:
        pb = convt_pads(attr, ins, outs, ks, strides, dils)
        cg, mg = C // group, w_shape[1]
        phases = [convt_phases(o, k, s, d, a) for o, k, s, d, a in zip(outs, ks, strides, dils, pb, strict=True)]
    pad = 3 - len(ks)
    return plan_rows(N, group, cg, mg, (1,) * pad + tuple(ins), (1,) * pad + tuple(ks),
                     ((UNIT,),) * pad + tuple(phases), target, threads, stage)


def pack_rows(w: np.ndarray, p: RowsPlan) -> np.ndarray:
    """The weight in gather form (groups, Mg, Cg, KD, KH, KW) as the kernel reads it: [group][channel
    block][kz][ky][input channel][kx][channel in the block], zero past the group's channels."""
    g, mg = w.shape[:2]
    wz = np.zeros((g, p.nmb * p.nb, *w.shape[2:]), np.float32)
    wz[:, :mg] = w
    t = wz.reshape(g, p.nmb, p.nb, p.cg, *p.ks).transpose(0, 1, 4, 5, 3, 6, 2)
    return np.ascontiguousarray(t)


def weight_layout(strides: tuple[int, ...], transposed: bool, p: RowsPlan, offset: int = 0) -> Layout:
    """The run-time weight seen as ``w[g, block, kz, ky, c, kx, j]``: ``strides`` are those of a Conv weight
    (M, Cg, KD, KH, KW), or with ``transposed`` of a ConvTranspose weight (C, Mg, KD, KH, KW)."""
    s0, s1, sz, sy, sx = strides
    if transposed:  # W[g*Cg + c, block*nb + j, ...]
        return Layout.strided(p.weight_shape, (p.cg * s0, p.nb * s1, sz, sy, s0, sx, s1), offset)
    return Layout.strided(p.weight_shape, (p.mg * s0, p.nb * s0, sz, sy, s1, sx, s0), offset)


def _tap_range(base: Expr, ds: int, n: int, extent: int) -> tuple[Expr, Expr]:
    """The taps j in [lo, hi) of [0, n) whose input position ``base + j*ds`` is in [0, extent) (numerators
    kept >= 0: C divides toward zero)."""
    zero = Const(0)
    if ds > 0:
        lo = (Bin("max", zero - base, zero) + (ds - 1)) // ds
        hi = Bin("min", Const(n), Bin("max", Const(extent - 1 + ds) - base, zero) // ds)
    else:
        e = -ds
        lo = (Bin("max", base - (extent - 1), zero) + (e - 1)) // e
        hi = Bin("min", Const(n), Bin("max", base + e, zero) // e)
    return simplify(lo), simplify(hi)


def _f32(v: float) -> Const:
    return Const(float(v), "float32")


def rows_func(p: RowsPlan, x: Buf, w: Buf, ws: Buf | None = None, name: str = "conv_rows",
              fresh: Callable[[str], str] | None = None) -> Func:
    """``y[n, g*Mg + m, oz, oy, ox] = sum over c < Cg and the taps of w[g, m // nb, kz, ky, c, kx, m % nb] *
    x[n, g*Cg + c, iz, iy, ix]`` with the taps and input positions of each output phase (module docstring);
    positions outside the input read zero. Every output element goes once to the epilogue. ``ws``: the
    workspace (``stage_shape``) when the plan stages the input."""
    k = _Conv(p, x, w, ws, fresh or numbered())
    if not p.staged:
        return Func(name, (x, w), k.compute())
    if ws is None or ws.shape != p.stage_shape:
        raise PassError(f"loop IR {name}: a staged plan needs a workspace of shape {p.stage_shape}")
    return Func(name, (x, w), (Alloc(ws, (*k.stage(), *k.compute())),), (ws,))


@dataclass(frozen=True)
class _Row:
    """One output row (or flattened plane) being built: image, group, channel block (``nbt`` channels from
    ``mb*nb``), and per outer dim its phase and position."""
    n: Expr
    g: Expr
    mb: Expr
    nbt: int
    rows: tuple[tuple[Phase, Expr], tuple[Phase, Expr]]

    def out(self, p: RowsPlan, jj: Expr, ox: Expr, oy: Expr | None = None) -> tuple[Expr, ...]:
        (phz, uz), (phy, uy) = self.rows
        return (self.n, simplify(self.g * p.mg + self.mb * p.nb + jj), simplify(uz * phz.os + phz.oo),
                simplify(uy * phy.os + phy.oo) if oy is None else oy, ox)


class _Conv:
    def __init__(self, p: RowsPlan, x: Buf, w: Buf, ws: Buf | None, fresh: Callable[[str], str]):
        self.p, self.x, self.w, self.ws, self.fresh = p, x, w, ws, fresh
        self.direct = x.layout.vector_ok(p.lanes)  # interior tiles of unit-stride phases read x as vectors
        self.t: Var | None = None  # the variable of the parallel loop being built

    def threaded(self, body: Callable[[], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        """``body()`` inside a parallel loop over the plan's threads (when it has more than one)."""
        if self.p.threads == 1:
            return body()
        self.t = Var(self.fresh("t"))
        try:
            return (For(self.t, Const(0), Const(self.p.threads), body(), "parallel"),)
        finally:
            self.t = None

    def part(self, extent: int, mine: bool) -> tuple[Expr, Expr]:
        """This thread's share of range(extent) when the threads split it, else all of it."""
        if not mine or self.t is None:
            return Const(0), Const(extent)
        return share(self.t, extent, self.p.threads)

    def loop(self, prefix: str, lo: Expr, hi: Expr, body: Callable[[Expr], tuple[Stmt, ...]],
             kind: str = "serial") -> tuple[Stmt, ...]:
        """``body(v)`` for v in [lo, hi), without a loop when that is one constant value."""
        if isinstance(lo, Const) and isinstance(hi, Const) and hi.value - lo.value <= 1:
            return body(lo) if hi.value > lo.value else ()
        v = Var(self.fresh(prefix))
        return (For(v, lo, hi, body(v), kind),)

    def stage(self) -> tuple[Stmt, ...]:
        """The input copied into the workspace, per image and channel (the threads split the channels): per input
        phase (fz, fy, fx), the positions ``e*sl + f + omin`` inside the input, zeros around them."""
        p = self.p
        N, C = p.stage_shape[:2]

        def body() -> tuple[Stmt, ...]:
            c_lo, c_hi = self.part(C, True)
            return self.loop("n", Const(0), Const(N), lambda n: self.loop("c", c_lo, c_hi, lambda c: tuple(
                s for fs in itertools.product(*(range(p.sl(d)) for d in range(3))) for s in self.copy(n, c, fs))))
        return self.threaded(body)

    def copy(self, n: Expr, c: Expr, fs: tuple[int, int, int]) -> tuple[Stmt, ...]:
        """Input phase ``fs`` of channel c: staged position (ez, ey*ext(2) + ex) holds the input position
        ``e*sl + f + omin`` in each dim for the e inside the input, zero elsewhere (the ring, the rows' ends, the
        plane's tail)."""
        p = self.p
        Dq, Pl, wq = p.ext(0), p.plane, p.ext(2)
        f = Const((fs[0] * p.sl(1) + fs[1]) * p.sl(2) + fs[2])
        (z0, z1), (y0, y1), (x0, x1) = (self.inside(d, fd) for d, fd in enumerate(fs))

        def zero(z: Expr, lo: Expr, hi: Expr) -> tuple[Stmt, ...]:
            return self.loop("e", lo, hi, lambda e: (Store(self.ws, (n, c, f, z, e), _f32(0)),), "vectorized")

        def at(es: tuple[Expr, ...]) -> tuple[Stmt, ...]:
            src = Load(self.x, (n, c, *(simplify(e * p.sl(d) + (fs[d] + p.span(d)[0])) for d, e in enumerate(es))))
            return (Store(self.ws, (n, c, f, es[0], simplify(es[1] * wq + es[2])), src),)

        if z0 == z1 or y0 == y1 or x0 == x1:  # nothing of the input in this phase
            return self.loop("z", Const(0), Const(Dq), lambda z: zero(z, Const(0), Const(Pl)))

        def plane(ez: Expr) -> tuple[Stmt, ...]:
            return (*zero(ez, Const(0), Const(y0 * wq + x0)),
                    *self.loop("ey", Const(y0), Const(y1), lambda ey: (
                        *self.loop("ex", Const(x0), Const(x1), lambda ex: at((ez, ey, ex)), "vectorized"),
                        *zero(ez, simplify(ey * wq + x1), simplify(Bin("min", ey * wq + (wq + x0), Const(y1 * wq)))))),
                    *zero(ez, Const(y1 * wq), Const(Pl)))

        ring = [*self.loop("z", Const(0), Const(z0), lambda z: zero(z, Const(0), Const(Pl))),
                *self.loop("z", Const(z1), Const(Dq), lambda z: zero(z, Const(0), Const(Pl)))]
        return (*ring, *self.loop("ez", Const(z0), Const(z1), plane))

    def inside(self, d: int, f: int) -> tuple[int, int]:
        """The staged positions e < ext(d) of input phase f of dim d whose input position is inside the input."""
        sl, omin = self.p.sl(d), self.p.span(d)[0]
        start = f + omin  # input position of e = 0
        lo = max(0, -(start // sl))
        hi = min(self.p.ext(d), (self.p.ins[d] - 1 - start) // sl + 1) if self.p.ins[d] - 1 - start >= 0 else 0
        return lo, max(lo, hi)

    def compute(self) -> tuple[Stmt, ...]:
        p = self.p

        def body() -> tuple[Stmt, ...]:
            n_lo, n_hi = self.part(p.batch, p.par == "n")
            g_lo, g_hi = self.part(p.groups, p.par == "g")
            return self.loop("n", n_lo, n_hi, lambda n: self.loop("g", g_lo, g_hi, lambda g: self.rows(n, g, 0, [])))
        return self.threaded(body)

    def rows(self, n: Expr, g: Expr, d: int, rows: list[tuple[Phase, Expr]]) -> tuple[Stmt, ...]:
        """The loops over the phases and rows of outer dims d.. (the threads may split dim ``row_dim``'s
        output rows: each takes a range of output positions, in every phase), then the channel blocks: each
        row in tiles along it, or (staged) each plane of phases in tiles along the flattened plane."""
        p = self.p
        if d == 2:
            return self.blocks(n, g, (rows[0], rows[1]), self.row)
        if d == 1 and p.staged:
            out: list[Stmt] = []
            for py in p.phases[1]:
                for px in p.phases[2]:
                    out += self.blocks(n, g, (rows[0], (py, Const(0))), lambda r, px=px: self.plane(r, px))
            return tuple(out)
        out = []
        split = p.par == "rows" and d == p.row_dim and self.t is not None
        for ph in p.phases[d]:
            lo, hi = Const(0), Const(ph.count)
            if split:  # output positions [o_lo, o_hi): u with oo + os*u in it
                o_lo, o_hi = self.part(p.outs[d], True)
                lo, hi = (simplify((o - ph.oo + ph.os - 1) // ph.os) for o in (o_lo, o_hi))
            out += self.loop("u", lo, hi, lambda u, ph=ph: self.rows(n, g, d + 1, [*rows, (ph, u)]))
        return tuple(out)

    def blocks(self, n: Expr, g: Expr, rows, fn: Callable[[_Row], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        """``fn`` on every channel block of group g: full blocks of nb, then the tail."""
        p = self.p
        full, tail = divmod(p.mg, p.nb)
        if p.par == "blocks" and self.t is not None:
            lo, hi = self.part(p.nmb, True)

            def one(mb: Expr) -> tuple[Stmt, ...]:
                body = fn(_Row(n, g, mb, p.nb, rows))
                if not tail:
                    return body
                return (If(Bin("<", mb, Const(full)), body, fn(_Row(n, g, Const(full), tail, rows))),)
            return self.loop("mb", lo, hi, one)
        out = self.loop("mb", Const(0), Const(full), lambda mb: fn(_Row(n, g, mb, p.nb, rows)))
        if tail:
            out += fn(_Row(n, g, Const(full), tail, rows))
        return out

    def outer(self, d: int, ph: Phase, u: Expr, body: Callable[[Expr, Expr], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        """``body(k, i)`` over the taps of outer dim d at row u whose input position i is inside the input."""
        if ph.n == 0:
            return ()
        base = simplify(u * ph.sl + ph.off0)
        ds = ph.dstep if ph.n > 1 else 1
        lo, hi = _tap_range(base, ds, ph.n, self.p.ins[d])
        return self.loop("j", lo, hi, lambda j: body(simplify(j * ph.kstep + ph.k0), simplify(base + j * ds)))

    def reduce(self, r: _Row, inner: Callable[[Expr, Expr, Expr, Expr, Expr], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        """``inner(kz, iz, ky, iy, c)`` over the outer taps inside the input and the group's input channels."""
        (phz, uz), (phy, uy) = r.rows
        return self.outer(0, phz, uz, lambda kz, iz: self.outer(1, phy, uy, lambda ky, iy: self.loop(
            "c", Const(0), Const(self.p.cg), lambda c: inner(kz, iz, ky, iy, c))))

    def row(self, r: _Row) -> tuple[Stmt, ...]:
        """Every phase of the last dim of row ``r``: tiles of pv vectors (module docstring)."""
        p, L = self.p, self.p.lanes
        V = p.pv * L
        out: list[Stmt] = []
        for ph in p.phases[2]:
            U = ph.count
            if ph.n == 0:  # outputs no tap reaches: zeros
                jj, q = Var(self.fresh("j")), Var(self.fresh("q"))
                out.append(For(jj, Const(0), Const(r.nbt), (For(q, Const(0), Const(U), (
                    Epilogue(r.out(p, jj, simplify(q * ph.os + ph.oo)), _f32(0)),), "vectorized"),)))
                continue
            # tiles inside [a, b) read no input position outside the row
            a = max(0, -(min(ph.offsets()) // ph.sl))
            room = p.ins[2] - 1 - max(ph.offsets())
            b = min(U, room // ph.sl + 1) if room >= 0 else 0
            mode = "direct" if self.direct and ph.sl == 1 else "copy"
            inside = [k for k in range(-(-U // V)) if k * V >= a and (k + 1) * V <= b]
            for k in range(-(-U // V)):
                if k not in inside:
                    nv = min(p.pv, -(-(U - k * V) // L))
                    out.append(self.tile(r, ph, Const(k * V), nv, min(nv * L, U - k * V), "ring"))
                elif k == inside[0]:
                    out += self.loop("xt", Const(k), Const(inside[-1] + 1), lambda kt, ph=ph, mode=mode: (
                        self.tile(r, ph, simplify(kt * V), p.pv, V, mode),))
        return tuple(out)

    def register_tile(self, r: _Row, nv: int, reduction: Callable[[Callable[..., Stmt], Var], tuple[Stmt, ...]],
                      epilogue: Callable[[Buf, Var], tuple[Stmt, ...]]) -> Stmt:
        """An nbt x nv-vector register tile: zeroed, ``reduction(fma, q)`` (``fma(xv, kz, ky, c, kx)``: the FMAs
        of one tap and input channel, ``xv`` the input vector of the tile's vector q), then copied to a local
        array ``res`` for ``epilogue(res, jj)`` (jj: a variable for the channel in the block)."""
        L = self.p.lanes
        acc = Buf(self.fresh("acc"), "float32", Layout.strided((r.nbt, nv * L)), "register", vector=L)
        res = Buf(self.fresh("res"), "float32", Layout.strided((r.nbt, nv * L)), "stack")
        jj, q = Var(self.fresh("j")), Var(self.fresh("q"))

        def each(stmt: Stmt) -> Stmt:
            return For(jj, Const(0), Const(r.nbt), (For(q, Const(0), Const(nv), (stmt,), "unrolled"),), "unrolled")

        def fma(xv: Expr, kz: Expr, ky: Expr, c: Expr, kx: Expr) -> Stmt:
            wv = Bcast(Load(self.w, (r.g, r.mb, kz, ky, c, kx, jj)), L)
            return each(Store(acc, (jj, q * L), Load(acc, (jj, q * L), L) + wv * xv, L))

        return Alloc(acc, (each(Store(acc, (jj, q * L), Bcast(_f32(0), L), L)), *reduction(fma, q), Alloc(res, (
            each(Store(res, (jj, q * L), Load(acc, (jj, q * L), L), L)), *epilogue(res, jj)))))

    def tile(self, r: _Row, ph: Phase, u0: Expr, nv: int, count: int, mode: str) -> Stmt:
        """The register tile of nv vectors of phase ``ph``'s positions from ``u0`` along a row: ``mode`` direct
        (vector loads from x), copy (each input row's window copied first: a strided or non-contiguous row) or
        ring (a border tile at a constant u0: the window's positions outside the input are zeros)."""
        p, x, fresh, L = self.p, self.x, self.fresh, self.p.lanes
        sl, offs, V = ph.sl, ph.offsets(), nv * L
        omin = min(offs)
        jx, e = Var(fresh("jx")), Var(fresh("e"))
        kx, off = simplify(jx * ph.kstep + ph.k0), simplify(jx * ph.dstep + ph.off0)
        # the window of a copied row: phase f = (position - u0*sl - omin) % sl holds the input positions
        # u0*sl + omin + f + e*sl, e < ext[f] (what the taps of that phase read)
        ext = [V + max([(o - omin) // sl for o in offs if (o - omin) % sl == f], default=-V) for f in range(sl)]
        win = Buf(fresh("win"), "float32", Layout.strided((sl, max(ext))), "stack") if mode != "direct" else None
        ring: list[Stmt] = []
        bounds = []
        for f in range(sl):
            lo, hi = 0, ext[f]
            if mode == "ring":  # e with 0 <= u0*sl + omin + f + e*sl < W
                start = int(u0.value) * sl + omin + f
                lo = min(hi, max(0, -(start // sl)))
                hi = max(lo, min(hi, (p.ins[2] - 1 - start) // sl + 1)) if p.ins[2] - 1 - start >= 0 else lo
                if lo:
                    ring.append(For(e, Const(0), Const(lo), (Store(win, (Const(f), e), _f32(0)),)))
                if hi < ext[f]:
                    ring.append(For(e, Const(hi), Const(ext[f]), (Store(win, (Const(f), e), _f32(0)),)))
            bounds.append((lo, hi))

        def reduction(fma: Callable[..., Stmt], q: Var) -> tuple[Stmt, ...]:
            def inner(kz: Expr, iz: Expr, ky: Expr, iy: Expr, c: Expr) -> tuple[Stmt, ...]:
                ch = simplify(r.g * p.cg + c)
                body: list[Stmt] = []
                if win is not None:
                    for f, (lo, hi) in enumerate(bounds):
                        if hi > lo:
                            pos = simplify(u0 * sl + (omin + f) + e * sl)
                            body.append(For(e, Const(lo), Const(hi), (
                                Store(win, (Const(f), e), Load(x, (r.n, ch, iz, iy, pos))),), "vectorized"))
                    rel = simplify(jx * ph.dstep + (ph.off0 - omin))  # >= 0: the tap's place in the window
                    f_e = (Const(0), rel) if sl == 1 else (simplify(rel % sl), simplify(rel // sl))
                    xv = Load(win, (f_e[0], simplify(q * L + f_e[1])), L)
                else:
                    xv = Load(x, (r.n, ch, iz, iy, simplify(u0 + q * L + off)), L)
                return (*body, For(jx, Const(0), Const(ph.n), (fma(xv, kz, ky, c, kx),), "unrolled"))

            taps = self.reduce(r, inner)
            return (Alloc(win, (*ring, *taps)),) if win is not None else taps

        def epilogue(res: Buf, jj: Var) -> tuple[Stmt, ...]:
            q = Var(fresh("q"))
            return (For(jj, Const(0), Const(r.nbt), (For(q, Const(0), Const(count), (
                Epilogue(r.out(p, jj, simplify((u0 + q) * ph.os + ph.oo)), Load(res, (jj, q))),), "vectorized"),)),)

        return self.register_tile(r, nv, reduction, epilogue)

    def plane(self, r: _Row, px: Phase) -> tuple[Stmt, ...]:
        """The plane of phases (py, px) of row ``r``'s depth, flattened (``uy*ext(2) + ux``, the positions past a
        row's outputs computed and dropped), in tiles of pv vectors read from the staged input."""
        p = self.p
        V = p.pv * p.lanes
        ntiles = -(-p.flat(r.rows[1][0], px) // V)
        return self.loop("xt", Const(0), Const(ntiles), lambda kt: (self.plane_tile(r, px, simplify(kt * V)),))

    def plane_tile(self, r: _Row, px: Phase, u0: Expr) -> Stmt:
        p, L, fresh = self.p, self.p.lanes, self.fresh
        (phz, uz), (py, _) = r.rows
        V, wq = p.pv * L, p.ext(2)

        def tap(d: int, ph: Phase, j: Expr) -> tuple[Expr, Expr, Expr]:
            """(kernel index, staged input phase, staged position offset) of tap j of dim d."""
            sl = p.sl(d)
            rel = simplify(j * ph.dstep + (ph.off0 - p.span(d)[0]))
            return (simplify(j * ph.kstep + ph.k0), *((Const(0), rel) if sl == 1 else
                                                     (simplify(rel % sl), simplify(rel // sl))))

        def reduction(fma: Callable[..., Stmt], q: Var) -> tuple[Stmt, ...]:
            jx = Var(fresh("jx"))

            def inner(jz: Expr, jy: Expr, c: Expr) -> tuple[Stmt, ...]:
                (kz, fz, ez), (ky, fy, ey), (kx, fx, ex) = tap(0, phz, jz), tap(1, py, jy), tap(2, px, jx)
                f = simplify((fz * p.sl(1) + fy) * p.sl(2) + fx)
                xv = Load(self.ws, (r.n, simplify(r.g * p.cg + c), f, simplify(uz + ez),
                                    simplify(u0 + q * L + ey * wq + ex)), L)
                return (For(jx, Const(0), Const(px.n), (fma(xv, kz, ky, c, kx),), "unrolled"),)

            return self.loop("jz", Const(0), Const(phz.n), lambda jz: self.loop(
                "jy", Const(0), Const(py.n), lambda jy: self.loop(
                    "c", Const(0), Const(p.cg), lambda c: inner(jz, jy, c))))

        def epilogue(res: Buf, jj: Var) -> tuple[Stmt, ...]:
            """Per output row rr the tile meets, its positions [qs, qe) of the tile (a contiguous run)."""
            rr, q = Var(fresh("r")), Var(fresh("q"))
            qs = simplify(Bin("max", Const(0), rr * wq - u0))
            qe = simplify(Bin("min", Const(V), rr * wq + px.count - u0))
            ox, oy = simplify((u0 + q - rr * wq) * px.os + px.oo), simplify(rr * py.os + py.oo)
            rows = (simplify(u0 // wq), simplify(Bin("min", Const(py.count), (u0 + (V - 1)) // wq + 1)))
            return (For(rr, *rows, (For(jj, Const(0), Const(r.nbt), (For(q, qs, qe, (
                Epilogue(r.out(p, jj, ox, oy), Load(res, (jj, q))),), "vectorized"),)),)),)

        return self.register_tile(r, p.pv, reduction, epilogue)
