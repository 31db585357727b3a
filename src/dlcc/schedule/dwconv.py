"""The schedule of a depthwise convolution (one input channel per output channel) for one target.

What goes in: the convolution's geometry (``schedule.gemm.ConvGeometry``; ``ci`` = channels), the batch,
the ``Target`` and the thread count. What comes out: the loop IR, in one of two forms.

- Channel-blocked (``DwcPlan``, ``dwc_func``; where a target vector holds several channels and the workspace
  has room): threads over blocks of ``lanes`` channels (with fewer blocks than a multiple of the threads, over
  halves of blocks, each half repacking the input rows it reads: MobileNetV2's 144 channels, 9 blocks, at 2
  threads 0.061 -> 0.053 ms at 56x56; with an input larger than half of L2, over parts of output rows with the
  blocks inside each part, so that the part's input rows come from memory once and from L2 for the other
  blocks, where the block-outer order read the whole input once per block: MobileNetV2's first depthwise, 32
  channels channels-last at 112x112, Zen 3, 0.348 -> 0.297 ms at 1 thread, 0.288 -> 0.247 at 2); per image and
  block, the block repacked with its zero
  ring into the thread's workspace (``nchwc_...``: every pixel's channels one vector, no tap ever outside),
  then per output row register tiles of up to ``px`` pixels (``dwc_...``: one vector FMA per tap and pixel,
  the tile transposed into a local channel-major buffer that holds a band of rows), then the fused epilogue
  along the band's rows as one loop (the whole plane when it is small: rows of 7, 14 or 28 pixels alone are
  short loops). Every tap of every
  pixel is one FMA on a full vector, whatever the plane's width: the form that pays on 14 x 14 and 28 x 28
  planes and 5 x 5 kernels, where a plane's rows fill vectors poorly.
- Per plane (``dw_func``): threads over channel ranges; per image, channel, the plane micro-kernel
  ``dwplane_...`` (``lower.micro.dwconv_micro``: per output row, the kernel rows inside the plane, the
  interior columns one vectorizable loop of kw FMAs at constant offsets, the edges tested tap by tap), then
  the fused epilogue over the plane while it is in L1/L2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlcc.lower.kir import blocked_strides
from dlcc.lower.lir import (
    Alloc,
    Bin,
    Buf,
    Const,
    Epilogue,
    Expr,
    For,
    Func,
    Layout,
    Load,
    Micro,
    Ptr,
    Stmt,
    Store,
    Var,
    simplify,
)
from dlcc.lower.micro import DCONV_PAD, dwc_micro, dwconv_micro, nchwc_micro
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.loops import l2_quarter_rows, share
from dlcc.schedule.target import Target
from dlcc.schedule.transform import parallelize, reorder

__all__ = ["DW_PAR_MIN_OUTPUTS", "POOL_BLOCKED_MAX_W", "DwcPlan", "dw_func", "dw_threads", "dwc_func", "dwc_rows",
           "pack_dwc", "padded_extent", "plan_dwc", "pool_max_inside", "reads_ring"]

PLANE_BYTES = 48 * 1024  # a block's whole output plane up to this size: one epilogue loop over it
# pools (MaxPool, AveragePool) over planes up to this wide take the channel-blocked form; wider ones the plane
# kernel: a pool does a few operations per output, fewer than the repacking and transposes cost on a large plane
# (SqueezeNet's 3x3 max pools: 55-wide 0.042 -> 0.047 ms blocked, 27-wide 0.025 -> 0.021)
POOL_BLOCKED_MAX_W = 32

DW_PAR_MIN_OUTPUTS = 1 << 14  # fewer outputs than this: one thread (a dispatch costs more than it saves;
# MobileNetV2's 576 channels at 7x7, 28224 outputs: 0.018 ms on one thread, 0.009 on two)


def dw_threads(g: ConvGeometry, batch: int, threads: int) -> int:
    if threads > 1 and g.ci >= threads and batch * g.ci * g.oh * g.ow >= DW_PAR_MIN_OUTPUTS:
        return threads
    return 1


def dw_func(g: ConvGeometry, batch: int, x: Buf, wt: Buf, c: Buf, epilogue: bool, threads: int = 1,
            name: str = "dwconv", fresh: Callable[[str], str] = str, pool_max: bool = False,
            flat: bool = False) -> Func:
    """``c[b, ch, oy, ox] = sum_taps wt[ch, ky*kw + kx] * x[b, ch, iy, ix]`` (zero padding): ``x`` (N, C, H, W)
    with unit column stride, ``wt`` (C, kh*kw), ``c`` (N, C, OH, OW) with unit column stride. ``pool_max``: the
    maximum over the taps inside instead (MaxPool; ``wt`` unread). ``flat``: the epilogue runs as one loop over
    each plane, ``c`` then (N, C, OH*OW) and the epilogue's index (image, channel, oy*OW + ox)."""
    C = g.ci
    T = dw_threads(g, batch, threads)
    t, b, ch, oy, ox = (Var(fresh(v)) for v in ("t", "b", "ch", "oy", "ox"))
    micro = dwconv_micro(g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.ph, g.pw, x.layout.dims[2][3],
                         pool_max)
    plane: tuple[Stmt, ...] = (Micro(micro, (Ptr(x, (b, ch, Const(0), Const(0))), Ptr(wt, (ch, Const(0))),
                                             Ptr(c, (b, ch, *[Const(0)] * (len(c.shape) - 2))))),)
    if epilogue and flat:  # one loop over the plane (rows of 7 or 14 pixels are too short to vectorize)
        q = Var(fresh("q"))
        plane += (For(q, Const(0), Const(g.oh * g.ow), (
            Epilogue((b, ch, q), Load(c, (b, ch, q))),), "vectorized"),)
    elif epilogue:
        plane += (For(oy, Const(0), Const(g.oh), (For(ox, Const(0), Const(g.ow), (
            Epilogue((b, ch, oy, ox), Load(c, (b, ch, oy, ox))),), "vectorized"),)),)
    f = Func(name, (x, wt, c), (For(b, Const(0), Const(batch), (For(ch, Const(0), Const(C), plane),)),))
    if T > 1:  # the channels in T shares, the threads' loop outermost
        f = reorder(parallelize(f, ch.name, T, t.name), [t.name, b.name])
    return f


@dataclass(frozen=True)
class DwcPlan:
    g: ConvGeometry
    batch: int
    cbi: int  # channels per block: the target's vector width
    px: int  # output pixels per register tile
    hp: int  # rows and columns of a repacked block (the zero ring included: every tap of every output inside)
    wp: int
    threads: int
    splits: int = 1  # parts of a block's output rows that are separate work items (the threads divide
    # blocks x parts: 9 blocks over 2 threads run 9 + 9 half blocks, not 5 + 4 blocks; each part repacks the
    # input rows it reads)
    rows_outer: bool = False  # the parts outermost and the blocks inside each: the part's input rows, every
    # channel, read from memory once and from L2 by the other blocks
    ring: tuple[int, int] | None = None  # the input read where it is (``reads_ring``): the rows above and the
    # columns left of it in its zero ring (a channels-last buffer, ``schedule.rings``); None: repacked per block
    blocked: tuple[int, int] = ()  # read where it is from channel blocks (``schedule.blocked``): the rows and
    # columns of each block's plane with its ring, blocks outside images (as a repacked block, in place)

    @property
    def ncb(self) -> int:
        return -(-self.g.ci // self.cbi)

    @property
    def band(self) -> int:
        """Output rows per band: the local buffer holds a band's rows of the block (at most PLANE_BYTES, the
        whole plane when it fits), and the epilogue runs along them as one loop (a band's rows are contiguous
        in the output plane: rows of 7, 14 or 28 pixels alone are short loops with a scalar tail)."""
        g = self.g
        most = max(1, min(g.oh, PLANE_BYTES // (4 * self.cbi * g.ow)))
        nb = -(-g.oh // most)
        return -(-g.oh // nb)

    @property
    def part_rows(self) -> int:
        """Input rows a work item repacks at most: the whole block's, or a part's (its output rows and the
        kernel's reach below them)."""
        g = self.g
        if self.splits == 1:
            return self.hp
        return min(self.hp, (-(-g.oh // self.splits) - 1) * g.sh + (g.kh - 1) * g.dh + 1)

    @property
    def workspace_floats(self) -> int:
        return 0 if self.ring is not None else self.threads * self.part_rows * self.wp * self.cbi


def padded_extent(g: ConvGeometry) -> tuple[int, int]:
    """(rows, columns) the taps of every output reach, from the first padded row and column: a repacked block's
    size with its zero ring (less than the padded input where the stride leaves the last ones unread)."""
    return (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1


def pool_max_inside(g: ConvGeometry) -> bool:
    """Does every tap of every output of this max pool fall inside the plane? Then its channel-blocked kernel reads
    an input's blocks where they are (``schedule.blocked``) whatever their ring holds (zeros, not the -inf a max
    pool's padding takes)."""
    hp, wp = padded_extent(g)
    return g.ph == g.pw == 0 and hp <= g.h and wp <= g.w


def reads_ring(g: ConvGeometry, strides: Sequence[int] | None, ring: Sequence[int], lanes: int,
               block: int = 0, batch: int = 1) -> bool:
    """Can the channel-blocked kernel read this depthwise convolution's input where it is, without the repacked
    block? A channels-last input (``strides``, NCHW order) whose channels fill whole vectors, stored with a zero
    ``ring`` (rows above, below, columns left, right: ``schedule.rings``) that holds every tap of every output
    outside the plane: its pixels' channel blocks are then what the tiles read from a repacked block, at a
    pixel stride of all the channels instead of one block. Or an input stored in channel blocks of one vector
    (``block``; ``schedule.blocked``: each block's plane with its ring, blocks outside the ``batch`` images):
    each block is then the repacked block itself."""
    if strides is None or len(strides) != 4 or len(ring) != 4 or lanes < 4 or g.ci % lanes:
        return False
    top, bottom, left, right = ring
    hp, wp = padded_extent(g)
    inside = top >= g.ph and left >= g.pw and g.h + bottom >= hp - g.ph and g.w + right >= wp - g.pw
    if block:
        return block == lanes and tuple(strides) == blocked_strides(g.h + top + bottom, g.w + left + right, batch,
                                                                    lanes) and inside
    row = (g.w + left + right) * g.ci
    return tuple(strides[1:]) == (1, row, g.ci) and strides[0] == (g.h + top + bottom) * row and inside


def plan_dwc(g: ConvGeometry, batch: int, target: Target, threads: int = 1, strides: Sequence[int] | None = None,
             ring: Sequence[int] = (), block: int = 0) -> DwcPlan | None:
    """The channel-blocked plan, or None where it does not apply: one channel per vector (scalar targets). With
    the input's ``strides`` and zero ``ring`` where it has one (and its channel ``block``, where it is stored in
    channel blocks): read in place where ``reads_ring`` allows."""
    cbi = target.lanes
    if cbi < 4:
        return None
    ring = tuple(ring) or ((0, 0, 0, 0) if block else ())
    if reads_ring(g, strides, ring, cbi, block, batch):
        top, bottom, left, right = ring
        plane = (g.h + top + bottom, g.w + left + right) if block else ()
        return dataclasses.replace(plan_dwc(g, batch, target, threads), ring=(top, left), blocked=plane)
    hp, wp = padded_extent(g)
    px = max(1, min(14, g.ow, target.vector_registers - 4))
    t = dw_threads(g, batch, threads)
    ncb = -(-g.ci // cbi)
    splits = t if t > 1 and ncb % t and g.oh >= 4 * t else 1
    # a large input: parts of output rows outermost, the blocks inside (``rows_outer``), each part's input (every
    # channel) within a quarter of L2, where the rows a part reads past its own (the kernel's overlap) are
    # at most a quarter of them (7x7 kernels on ConvNeXt's 56 x 56 x 96 would repack twice their rows)
    overlap = max(0, (g.kh - 1) * g.dh + 1 - g.sh)
    rows = l2_quarter_rows(target.l2_bytes, 4 * g.ci * g.w * g.sh)
    if ncb > 1 and 4 * g.ci * g.h * g.w > target.l2_bytes // 2 and rows * g.sh >= 4 * overlap:
        parts = -(-g.oh // max(1, rows))
        parts = -(-parts // t) * t  # (a number the threads divide)
        if parts > 1 and g.oh >= 2 * parts:
            return DwcPlan(g, batch, cbi, px, hp, wp, t, parts, True)
    return DwcPlan(g, batch, cbi, px, hp, wp, t, splits)


def pack_dwc(w: np.ndarray, p: DwcPlan) -> np.ndarray:
    """The weight (C, kh*kw) as [channel block][tap][c < cbi], zero beyond the last channel."""
    c, taps = w.shape
    wz = np.zeros((p.ncb * p.cbi, taps), np.float32)
    wz[:c] = w
    return np.ascontiguousarray(wz.reshape(p.ncb, p.cbi, taps).transpose(0, 2, 1)).reshape(p.ncb, taps * p.cbi)


def dwc_func(p: DwcPlan, x: Buf, wp: Buf, c: Buf, ws: Buf | None, epilogue: bool, name: str = "dwconv_blocked",
             fresh: Callable[[str], str] = str, pool_max: bool = False, channels_last: bool = False,
             dest_block: bool = False) -> Func:
    """The loop IR of ``c[b, ch, oy*OW + ox] = sum_taps W[ch, ky*kw + kx] * x[b, ch, oy*sh + ky*dh - ph, ox*sw +
    kx*dw - pw]`` (zero padding) following ``p`` (module docstring): ``x`` (N, C, H, W) with unit column stride,
    or channels-last (unit channel stride), ``wp`` the weight packed by ``pack_dwc``, ``c`` (N, C, OH*OW) with
    unit pixel stride, ``ws`` the workspace (each thread's repacked block; None for a plan reading ``x`` in
    place). Without ``epilogue`` the local tiles are copied into ``c``. ``pool_max``: the maximum over the taps
    inside instead (MaxPool: the ring holds -inf; ``wp`` unread). ``channels_last``: the epilogue (which must be
    on) gets each pixel's channels innermost, for a destination whose channels are contiguous (the tiles stored
    pixel-major, ``dwcp_``); ``dest_block`` with it: the epilogue's index is (image, block, channel in it, pixel),
    for a destination in channel blocks of ``cbi`` (``schedule.blocked``), addressed with no division."""
    if dest_block and not channels_last:
        raise ValueError("dwc: a destination in channel blocks is stored pixel-major")
    g, T, cbi, S = p.g, p.threads, p.cbi, p.splits
    if ws is None and p.ring is None:
        raise ValueError("dwc: a plan that repacks its input needs the workspace")
    t, b, cb = (Var(fresh(v)) for v in ("t", "b", "cb"))
    w = Var(fresh("w")) if S > 1 else cb
    tv: Expr = t if T > 1 else Const(0)
    xd = x.layout.dims
    wsb = tv * (p.part_rows * p.wp * cbi)
    # the work item: a block, or with splits a part of its output rows [r_lo, r_hi) (input rows [y0, y1))
    blk: Expr = cb
    r_lo, r_hi, y0, rows_in = Const(0), Const(g.oh), Const(0), Const(p.hp)
    if S > 1:  # (parts outermost: block w % ncb of part w // ncb; else part w % S of block w // S)
        blk, part = (w % p.ncb, w // p.ncb) if p.rows_outer else (w // S, w % S)
        r_lo, r_hi = share(part, g.oh, S)
        y0 = simplify(r_lo * g.sh)
        rows_in = simplify(Bin("min", Const(p.hp), (r_hi - 1) * g.sh + ((g.kh - 1) * g.dh + 1)) - y0)
    nci = Bin("min", Const(cbi), Const(g.ci) - blk * cbi) if g.ci % cbi else Const(cbi)
    band = p.band
    nb = -(-g.oh // band)
    ob = Var(fresh("ob"))
    oy0 = simplify(r_lo + ob * band) if S > 1 else ob * band if nb > 1 else Const(0)
    if p.ring is not None:  # read where it is: the input as the flat run of its ring buffer (image 0's ring first)
        pack: tuple[Stmt, ...] = ()
        if p.blocked:  # (channel blocks of one vector, each block's plane with its ring: blocks outside images)
            xrow, xpix = p.blocked[1] * cbi, cbi
            xn = p.blocked[0] * xrow
            xblk, size = p.batch * xn, p.ncb * p.batch * xn
        else:
            xn, xrow, xpix = xd[0][3], xd[2][3], g.ci
            xblk, size = cbi, p.batch * xn
        src = Buf(x.name, x.dtype, Layout.strided((size,), None, x.layout.offset - p.ring[0] * xrow
                                                  - p.ring[1] * xpix))

        def at(oy: Expr, x0: Expr) -> Expr:
            return simplify(b * xn + (oy * g.sh + (p.ring[0] - g.ph)) * xrow + (x0 * g.sw + (p.ring[1] - g.pw)) * xpix
                            + blk * xblk)
    else:
        pack = (Micro(nchwc_micro(cbi, g.h, g.w, g.ph, g.pw, p.hp, p.wp, ring_min=pool_max, xw=xd[3][3]), (
            Ptr(x, (b, blk * cbi, Const(0), Const(0))), Const(xd[1][3]), Const(xd[2][3]), simplify(nci), y0,
            rows_in, Ptr(ws, (simplify(wsb),)))),)
        src, xrow, xpix = ws, p.wp * cbi, 0

        def at(oy: Expr, x0: Expr) -> Expr:
            # (with parts: the row within the part's repacked rows, from the band's row, which the loop bounds)
            rowoff = (oy - oy0 + ob * band) * (g.sh * p.wp * cbi) if S > 1 else oy * (g.sh * p.wp * cbi)
            return simplify(wsb + rowoff + x0 * (g.sw * cbi))

    if S > 1:
        last = simplify(Bin("min", r_hi, oy0 + band))
    else:
        last = simplify(Bin("min", Const(g.oh), oy0 + band)) if g.oh % band else simplify(oy0 + band)
    rows = dwc_rows(g, cbi, p.px, xrow, band, src, at, Ptr(wp, (blk, Const(0))), c, b, blk * cbi, oy0, last,
                    simplify(nci), epilogue, fresh, pool_max, channels_last, xpix, blk if dest_block else None)
    if S > 1:
        nest: tuple[Stmt, ...] = (For(ob, Const(0), simplify((r_hi - r_lo + (band - 1)) // band), (rows,)),)
        w0, w1 = share(tv, p.ncb * S, T)
        body: tuple[Stmt, ...] = (For(w, w0, w1, (For(b, Const(0), Const(p.batch), (*pack, *nest)),)),)
    else:
        nest = (For(ob, Const(0), Const(nb), (rows,)),) if nb > 1 else (rows,)
        c0, c1 = share(tv, p.ncb, T)
        body = (For(cb, c0, c1, (For(b, Const(0), Const(p.batch), (*pack, *nest)),)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    if p.ring is not None:
        return Func(name, (src, wp, c), body)
    return Func(name, (x, wp, c), (Alloc(ws, body),), (ws,))


def dwc_rows(g: ConvGeometry, cbi: int, px: int, xrow: int, band: int, ws: Buf, at: Callable[[Expr, Expr], Expr],
             wptr: Ptr, c: Buf, b: Expr, ch0: Expr, oy0: Expr, oy1: Expr, nci: Expr, epilogue: bool,
             fresh: Callable[[str], str] = str, pool_max: bool = False, pixel_major: bool = False,
             xpix: int = 0, block: Expr | None = None) -> Stmt:
    """Output rows [oy0, oy1) (at most ``band``) of the channel block from channel ``ch0`` of image ``b``: ``dwc_``
    register tiles of up to ``px`` pixels over the block in ``ws`` (``at(oy, x0)``: the element where output row
    ``oy``'s tile from column ``x0`` reads; rows ``xrow`` apart), transposed into a local channel-major band, then
    the fused epilogue along the band's rows as one loop (or, without ``epilogue``, a copy into ``c``), for the
    block's ``nci`` channels. The channel-blocked depthwise convolution's and the fused 1x1 -> depthwise pair's.
    ``pixel_major``: the band held pixel-major (``dwcp_`` tiles, no transpose) and the epilogue run per pixel
    along its channels (a channels-last destination). ``xpix``: the pixels of ``ws`` this many floats apart (0:
    ``cbi``, a repacked block; else the input itself, read where it is). ``block`` (pixel-major only): the epilogue
    gets (image, ``block``, channel in it, pixel), a destination in channel blocks of ``cbi``."""
    if pixel_major and not epilogue:
        raise ValueError("dwc rows: a pixel-major band is stored through the epilogue only")
    oy, xt, o, q = (Var(fresh(v)) for v in ("oy", "xt", "o", "q"))
    span = band * g.ow
    shape = (span, cbi) if pixel_major else (cbi, span + DCONV_PAD)
    acc = Buf(fresh("acc"), "float32", Layout.strided(shape), "stack")  # (tiles store vectors)

    def tile(x0: Expr, n: int) -> Stmt:
        uk = dwc_micro(cbi, n, g.kh, g.kw, g.sw, g.dh, g.dw, xrow, pool_max, pixel_major, xpix)
        at0 = simplify((oy - oy0) * g.ow + x0)
        where = Ptr(acc, (at0, Const(0))) if pixel_major else Ptr(acc, (Const(0), at0))
        return Micro(uk, (Ptr(ws, (at(oy, x0),)), wptr, where, Const(span + DCONV_PAD)))

    nfull, tail = divmod(g.ow, px)
    row: tuple[Stmt, ...] = ()
    if nfull:
        row += (For(xt, Const(0), Const(nfull), (tile(simplify(xt * px), px),)),)
    if tail:
        row += (tile(Const(nfull * px), tail),)
    idx = (b, ch0 + o, simplify(oy0 * g.ow + q))
    npx = simplify((oy1 - oy0) * g.ow)
    if pixel_major:
        if block is not None:
            idx = (b, block, o, simplify(oy0 * g.ow + q))
        finish = For(q, Const(0), npx, (For(o, Const(0), nci, (Epilogue(idx, Load(acc, (q, o))),), "vectorized"),))
        return Alloc(acc, (For(oy, oy0, oy1, row), finish))
    store: Stmt = Epilogue(idx, Load(acc, (o, q))) if epilogue else Store(c, idx, Load(acc, (o, q)))
    finish = For(o, Const(0), nci, (For(q, Const(0), npx, (store,), "vectorized"),))
    return Alloc(acc, (For(oy, oy0, oy1, row), finish))
