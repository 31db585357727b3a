"""The schedule of a 3x3 stride-1 convolution as Winograd F(4x4, 3x3).

What goes in: the convolution's geometry (``schedule.gemm.ConvGeometry``), the output channels, the batch, the
``Target`` and the thread count. What comes out: a ``WinoPlan`` (``plan_winograd``: tile blocks, register tile,
threads, workspace), the weight transformed and packed for it at compile time (``pack_winograd``) and the loop
IR (``wino_func``).

Each 4x4 output tile is A^T [U * (B^T d B)] A over its 6x6 input tile d, U = G g G^T the transformed 3x3
kernel (``lower.micro.WINO_*``): per output pixel and input channel 36/16 = 2.25 multiply-adds instead of 9,
the products becoming 36 independent GEMMs (one per position of the 6x6 transformed tile) over the input
channels. The input is repacked per call with its zero ring as NCHW[lanes]c (``direct.repack_phase``, the
direct convolution's first phase), padded to whole tiles. Then per block of ``tr`` rows of tiles (``pb``
tiles; the threads split the blocks):
- the input transform of each tile and channel block (``wgi_``) into V[36][pb][channels];
- per transformed position, V's pb x channels rows times U's packed column micro-panels (``gemmr_``: A read
  row-major, one tile per row), into M[36][pb][output channels];
- per block of ``lanes`` output channels, the output transform of each tile (``wgo_``) into a local buffer
  holding the block's output rows (channel-major), then the fused epilogue along them.
V and M are each thread's workspace, their 36 positions an odd number of cache lines apart (``spread``). F(4x4, 3x3)
loses a few bits to the transforms' constants (up to 8 and 5/24): relative to the output's scale about 1e-5 at 256
channels, within the 1e-4 the backend promises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

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
    Var,
    simplify,
)
from dlcc.lower.micro import WINO_G, gemmr_micro, wgi_micro, wgo_micro
from dlcc.schedule.direct import repack_phase
from dlcc.schedule.gemm import ConvGeometry, register_tile, tile_rows
from dlcc.schedule.loops import PAR_MIN_FLOPS_WS, share
from dlcc.schedule.target import Target

__all__ = ["WinoPlan", "pack_winograd", "plan_winograd", "spread", "use_winograd", "wino_func", "winograd_fits"]

VM_L3_BYTES = 4 << 20  # a thread's V and M beyond this go through memory rather than L3
VM_MAX_BYTES = 8 << 20  # and blocks never make them larger than this (the arena holds them)
# a plane of at most this many rows of tiles, on threads: plan_winograd's cost has the threads share the bandwidth
# that U streams with (each block of a short row of tiles reads all of U for a few tiles, every thread at once).
# Zen 3, AVX2, 2 threads, in the model, alternated: SqueezeNet 1.1's 64 -> 256 at 13 x 13 0.315 -> 0.23 ms as one
# block with the threads over U's columns, Inception-v2's 14 x 14 layers 0.41 -> 0.28 (128 -> 160), GoogLeNet's
# 96 -> 208 at 13 x 13 0.41 -> 0.32; on 7 and 14 rows of tiles (27 x 27, 55 x 55) the same cost chose plans 10-15%
# slower, so those keep the cost without it
U_SHARED_ROWS = 4


@dataclass(frozen=True)
class WinoPlan:
    co: int
    g: ConvGeometry
    batch: int
    cbi: int  # channels per block (the vector width)
    mr: int  # tiles per register tile of the GEMMs (rows of V)
    nr: int  # output channels per register tile (a column micro-panel of U)
    tr: int  # rows of tiles per block (the last block may run past the plane: its extra tiles are zeros)
    threads: int
    split: str = "blocks"  # what the threads divide: "blocks" of tiles, or "channels" (the column micro-panels of
    # U and their output channels; every thread transforms every block's input into its own V)
    blocked: bool = False  # the input read where it is, stored as the repacking would have stored it (NCHW[cbi]c,
    # blocks outside images, each block's plane hp x wp with the zero ring: ``schedule.blocked``): no repacking

    @property
    def th(self) -> int:
        return -(-self.g.oh // 4)

    @property
    def tw(self) -> int:
        return -(-self.g.ow // 4)

    @property
    def hp(self) -> int:
        return 4 * self.nblk * self.tr + 2  # (whole blocks: the last one's rows past the plane read zeros)

    @property
    def wp(self) -> int:
        return 4 * self.tw + 2

    @property
    def ncb(self) -> int:
        return -(-self.g.ci // self.cbi)

    @property
    def cp(self) -> int:
        return self.ncb * self.cbi

    @property
    def ncp(self) -> int:
        return -(-self.co // self.nr)

    @property
    def kp(self) -> int:
        return self.ncp * self.nr

    @property
    def pb(self) -> int:
        return self.tr * self.tw

    @property
    def nblk(self) -> int:
        return -(-self.th // self.tr)

    @property
    def rh(self) -> int:
        """Rows of zero ring above the input in a block's plane (the padding)."""
        return self.g.ph

    @property
    def rw(self) -> int:
        """Columns of zero ring left of the input in a block's plane (the padding)."""
        return self.g.pw

    @property
    def blocks_floats(self) -> int:
        """The floats of the input in its channel blocks, each plane hp x wp with its ring (repacked, or read so)."""
        return self.batch * self.ncb * self.hp * self.wp * self.cbi

    @property
    def input_floats(self) -> int:
        return 0 if self.blocked else self.blocks_floats

    @property
    def ldv(self) -> int:
        """Floats from one position's V to the next: pb x cp, padded (``spread``)."""
        return spread(self.pb * self.cp)

    @property
    def ldm(self) -> int:
        """Floats from one position's M to the next: pb x kp, padded (``spread``)."""
        return spread(self.pb * self.kp)

    @property
    def thread_floats(self) -> int:
        """One thread's V and M."""
        return 36 * (self.ldv + self.ldm)

    @property
    def workspace_floats(self) -> int:
        return self.input_floats + self.threads * self.thread_floats

    @property
    def workspace_bytes(self) -> int:
        return 4 * self.workspace_floats


def spread(n: int) -> int:
    """``n`` floats (a multiple of 16) padded to an odd number of 64-byte lines: the 36 positions of V (or M),
    this far apart, then fall in 36 different sets of an L1 cache whose way is 4 KiB, where the input
    transform writes (the output transform reads) one tile's 36 values. Unpadded, 256 channels x 8 tiles (8 KiB)
    put all 36 in one set; 128 x 14 (7 KiB), 9 per set."""
    return n + 16 if n % 16 == 0 and (n // 16) % 2 == 0 else n


def winograd_fits(g: ConvGeometry, co: int, target: Target) -> bool:
    """Can this group-1 convolution run as Winograd F(4x4, 3x3)? 3x3, stride 1, no dilation, vectors of 4 to 16
    floats, at least a vector of input and output channels, planes of at least 5 x 5 (2 x 2 tiles)."""
    return ((g.kh, g.kw, g.sh, g.sw, g.dh, g.dw) == (3, 3, 1, 1, 1, 1) and 4 <= target.lanes <= 16
            and 16 % target.lanes == 0 and g.ci >= target.lanes and co >= target.lanes
            and g.oh >= 5 and g.ow >= 5)


WINO_MIN_FLOPS = 50e6  # with fewer than 64 output channels, only convolutions this large (direct FLOPs)
# the share of its 4x4 tiles' outputs a plane must use: GoogLeNet's 6 x 6 planes use 36 of 64 (2 x 2 tiles), and
# there the direct convolution was faster at 1 thread (160 -> 320 channels 0.21 -> 0.16 ms, 192 -> 384 0.30 ->
# 0.23, Zen 5) and twice as fast at 2 (each thread's Winograd block reads all of U for 2 tiles); 7 x 7 uses 49 of
# 64, 13 x 13 169 of 256
WINO_MIN_COVER = 0.6


def use_winograd(g: ConvGeometry, co: int, batch: int, target: Target, threads: int = 1) -> bool:
    """Does this convolution run as Winograd rather than as the direct convolution? Never when the target has it off
    (``dlcc.compile(..., winograd=False)``, ``--no-winograd``: the transformed weight is 4x the 3x3 weight, e.g.
    VGG-19's weights blob 548 -> 778 MiB); else where it fits, unless the input transform (per tile, as costly as
    the products of about 4 output channels) dominates, i.e. few output channels on a small plane, or the
    transformed weight (4x the weight) is larger than L2 and the plane too small (under 16 tiles) to reuse it:
    inside a model, U then streams from L3 or memory on every call (Inception-v2's 192 -> 320 and 224 -> 224 at 7 x
    7, U 8.8 and 7.2 MB: as the direct convolution 0.271 -> 0.257 and 0.205 -> 0.213 ms at 1 thread, 0.27 -> 0.13
    and 0.21 -> 0.13 at 2, profiled in the model; the figures below are of one layer alone, repeated, where U stays
    in the caches). Measured on Zen 5 (AVX-512), one layer at a time against the direct convolution, 1 and 2
    threads: 64 channels at 56x56 2.97x / 2.62x faster, 128 at 28x28 2.84x / 1.41x, 256 at 14x14 2.38x / 4.40x, 256
    at 7x7 1.84x / 1.29x, 512 at 28x28 2.82x / 1.98x, SqueezeNet's expand layers 1.8-2.2x / 1.0-1.9x; but 128 -> 32
    channels at 14x14 1.11x / 0.68x, 512 at 7x7 1.02x / 0.54x."""
    if not target.winograd or not winograd_fits(g, co, target):
        return False
    if co < 64 and 2.0 * batch * co * g.oh * g.ow * g.ci * 9 < WINO_MIN_FLOPS:
        return False
    cp, kp = -(-g.ci // target.lanes) * target.lanes, -(-co // target.lanes) * target.lanes
    tiles = -(-g.oh // 4) * -(-g.ow // 4)
    if g.oh * g.ow < WINO_MIN_COVER * 16 * tiles:
        return False  # most of the tiles' outputs past the plane (module docstring of WINO_MIN_COVER)
    return 4 * 36 * cp * kp <= target.l2_bytes or tiles >= 16


def plan_winograd(co: int, g: ConvGeometry, batch: int, target: Target, threads: int = 1) -> WinoPlan:
    """Tile blocks of whole rows of tiles, as many rows as cost least (``cost``: each block reads all of U, so
    a few large blocks where U is large, small ones that keep V and M in L2 where it is small); the register
    tile as the packed GEMM's (``gemm.plan_gemm``), its rows chosen to waste least on a block's last tile."""
    lanes = target.lanes
    nr, mr_max = register_tile(target)
    th, tw = -(-g.oh // 4), -(-g.ow // 4)
    cp = -(-g.ci // lanes) * lanes
    kp = -(-co // nr) * nr
    flops = 2.0 * batch * co * g.oh * g.ow * g.ci * 9
    t = threads if threads > 1 and flops >= PAR_MIN_FLOPS_WS else 1
    u_bytes = 4 * 36 * cp * kp
    shared = t > 1 and th <= U_SHARED_ROWS
    ncp = kp // nr

    def cost(tr: int, split: str = "blocks") -> float:
        """Seconds per image for blocks of tr rows of tiles (the last block padded with rows of zero tiles):
        the products at the peak of the vector units, slower with short register tiles; U read once per block
        (prefetched from L3 alongside the products, or from memory when larger than half of L3); V and M
        through the caches beyond half of L2 (slower beyond 2 MB). Fitted to Zen 5 measurements: ResNet's
        layers at 56x56 best with blocks of one row of tiles, VGG's 512 channels at 28x28 with one block.
        "channels": each thread its share of U's column micro-panels over every block, and every block's input
        transform (as costly as the products of about 4 output channels)."""
        nblk = -(-th // tr)
        pb = tr * tw
        mr = min(pb, mr_max)
        gemm = 2.0 * 36 * -(-pb // mr) * mr * cp * kp / (4.0 * lanes * 3e9) * (1 + 2 / mr)
        u = u_bytes / (200e9 if u_bytes <= target.l3_bytes // 2 else 25e9) * (t if shared else 1)
        vm = 4 * 36 * pb * (cp + kp)
        spill = 0.0 if vm <= target.l2_bytes // 2 else 2 * vm / (50e9 if vm <= 2 << 20 else 20e9)
        if split == "channels":
            part = -(-ncp // t) / ncp
            return nblk * ((gemm + u + spill) * part + gemm * 4 / kp)
        return -(-nblk // t) * (gemm + u + spill)

    def best(split: str) -> int:
        return min([d for d in range(1, th + 1) if d == 1 or 4 * 36 * d * tw * (cp + kp) <= VM_MAX_BYTES],
                   key=lambda d: (cost(d, split), d))

    tr, split = best("blocks"), "blocks"
    if t > 1 and ncp >= t:
        # threads over output channels where that costs less: a small plane's few blocks each read all of U
        # (ResNet-50's 256 channels at 14 x 14 on 2 threads: 4 blocks of one row of 4 tiles, 4 x 4 register tiles,
        # U 9.4 MB read 4 times; as 2 halves of U over one block of 16 tiles, 6 x 16 register tiles: 1.72-1.86 ->
        # 1.58-1.65 ms per layer in the model, Zen 3, AVX2, alternated. Those layers stream U from memory, since
        # the model's weights outgrow L3, and 2 threads gain little over 1 either way)
        trc = best("channels")
        if cost(trc, "channels") < cost(tr):
            tr, split = trc, "channels"
    if split == "blocks" and -(-th // tr) < t:
        t = 1
    pb = tr * tw
    # (never a last tile of one row: one-row tiles sum in another order, and the blocks change with the threads)
    return WinoPlan(co, g, batch, lanes, tile_rows(pb, mr_max, no_one_row_tail=True), nr, tr, t,
                    split if t > 1 else "blocks")


def pack_winograd(w: np.ndarray, p: WinoPlan) -> np.ndarray:
    """The weight (Co, Ci, 3, 3) transformed (U = G g G^T, in float64, rounded once) and packed as
    [position < 36][column micro-panel][input channel < cp][o < nr], zero beyond the channels."""
    co, ci = w.shape[:2]
    u = np.einsum("ay,kcyz,bz->abck", WINO_G, w.astype(np.float64), WINO_G).reshape(36, ci, co)
    uz = np.zeros((36, p.cp, p.kp))
    uz[:, :ci, :co] = u
    t = uz.reshape(36, p.cp, p.ncp, p.nr).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(t).reshape(36 * p.ncp, p.cp * p.nr).astype(np.float32)


def wino_func(p: WinoPlan, x: Buf, up: Buf, c: Buf, ws: Buf, name: str = "conv_winograd",
              fresh: Callable[[str], str] = str, channels_last: bool = False, dest_block: int = 0) -> Func:
    """The loop IR of ``c[b, o, oy*OW + ox] = sum W[o, i, ky, kx] * x[b, i, oy + ky - ph, ox + kx - pw]`` (zero
    padding) following ``p`` (module docstring): ``x`` (N, Ci, H, W) with unit column stride or channels-last,
    ``up`` the weight packed by ``pack_winograd``, ``c`` (N, Co, OH*OW) with unit pixel stride, ``ws`` the
    workspace (the repacked input, then each thread's V and M). ``channels_last``: ``c``'s channels are
    contiguous instead; the output transform keeps each pixel's channels together (``wgop_``) and the epilogue
    runs along them. A plan that reads ``x`` in its channel blocks (``WinoPlan.blocked``) takes ``x`` as its whole
    base, flat. ``dest_block`` (channels-last, blocks of ``cbi``): the destination, or a tensor the epilogue reads,
    stores its channels in blocks (``kir.Buffer.block``): the epilogue's index is (image, channel block, channel in
    it, pixel)."""
    g, T, cbi, mr, nr = p.g, p.threads, p.cbi, p.mr, p.nr
    if dest_block and (not channels_last or dest_block != cbi):
        raise ValueError("Winograd convolution: a destination in channel blocks takes channels-last tiles of its "
                         "blocks")
    t1, t2, b, cb, blk, cbx, ty, tx, xi, jp, rp, kb, o, yy, q = (
        Var(fresh(v)) for v in ("t", "t", "b", "cb", "blk", "cbx", "ty", "tx", "xi", "jp", "rp", "kb", "o", "yy", "q"))
    tv2: Expr = t2 if T > 1 else Const(0)
    phase1 = repack_phase(g, cbi, p.batch, p.hp, p.wp, x, ws, t1, T, cb, b) if not p.blocked else None
    src = x if p.blocked else ws  # (where the channel blocks are: ``x`` itself, its whole base from its start)

    pb, cp, kp, tw = p.pb, p.cp, p.kp, p.tw
    ldv, ldm = p.ldv, p.ldm
    vbase = simplify(Const(p.input_floats) + tv2 * p.thread_floats)
    mbase = simplify(vbase + 36 * ldv)
    ty0 = blk * p.tr  # the block's first row of tiles
    block = p.hp * p.wp * cbi
    # the input transform of every tile of the block, per channel block
    xoff = simplify((cbx * p.batch + b) * block + (ty0 + ty) * (4 * p.wp * cbi) + tx * (4 * cbi))
    voff = simplify(vbase + (ty * tw + tx) * cp + cbx * cbi)
    transform_in = For(cbx, Const(0), Const(p.ncb), (For(ty, Const(0), Const(p.tr), (For(tx, Const(0), Const(tw), (
        Micro(wgi_micro(cbi, p.wp * cbi, ldv), (Ptr(src, (xoff,)), Ptr(ws, (voff,)))),)),)),))

    # per position: V's rows (tiles) x U's column micro-panels
    def gemm(r0: Expr, rows: int) -> Stmt:
        a = simplify(vbase + xi * ldv + r0 * cp)
        cc = simplify(mbase + xi * ldm + r0 * kp + jp * nr)
        return Micro(gemmr_micro(rows, nr, cp), (Const(cp), Ptr(ws, (a,)), Ptr(up, (simplify(xi * p.ncp + jp),
                                                                                     Const(0))),
                                                 Ptr(ws, (cc,)), Const(kp), Const(0), Const(nr)))

    nfull, tail = divmod(pb, mr)
    panel: tuple[Stmt, ...] = ()
    if nfull:
        panel += (For(rp, Const(0), Const(nfull), (gemm(simplify(rp * mr), mr),)),)
    if tail:
        panel += (gemm(Const(nfull * mr), tail),)
    if p.split == "channels":  # (each thread its column micro-panels and their output channel blocks)
        j0, j1 = share(tv2, p.ncp, T)
        per = nr // cbi
        kb0, kb1 = simplify(j0 * per), simplify(Bin("min", j1 * per, Const(-(-p.co // cbi))))
        b0, b1 = Const(0), Const(p.nblk)
    else:
        j0, j1, kb0, kb1 = Const(0), Const(p.ncp), Const(0), Const(-(-p.co // cbi))
        b0, b1 = share(tv2, p.nblk, T)
    products = For(xi, Const(0), Const(36), (For(jp, j0, j1, panel),))

    # per block of cbi output channels: the output transform of every tile into the block's rows, the epilogue
    rpitch = 4 * tw
    span = 4 * p.tr * rpitch
    rows: Expr = Const(4 * p.tr)
    if g.oh != 4 * p.tr * p.nblk:
        rows = simplify(Bin("min", rows, Const(g.oh) - ty0 * 4))
    nch = simplify(Bin("min", Const(cbi), Const(p.co) - kb * cbi)) if p.co % cbi else Const(cbi)
    moff = simplify(mbase + (ty * tw + tx) * kp + kb * cbi)
    if channels_last:
        # per tile, per block of output channels: the tile's 16 pixels (each its channels together) through the
        # epilogue, so that the blocks of a pixel's channels are stored one after the other
        tile = Buf(fresh("acc"), "float32", Layout.strided((16, cbi)), "stack")
        ny = Bin("min", Const(4), rows - ty * 4)
        nx = Bin("min", Const(4), Const(g.ow) - tx * 4) if g.ow % 4 else Const(4)
        pix = simplify((ty0 * 4 + ty * 4 + yy) * g.ow + tx * 4 + q)
        epi_t = For(yy, Const(0), simplify(ny), (For(q, Const(0), nx, (For(o, Const(0), nch, (
            Epilogue((b, kb, o, pix) if dest_block else (b, simplify(kb * cbi + o), pix),
                     Load(tile, (simplify(yy * 4 + q), o))),), "vectorized"),)),))
        outputs: Stmt = For(ty, Const(0), Const(p.tr), (For(tx, Const(0), Const(tw), (For(kb, kb0, kb1, (
            Alloc(tile, (Micro(wgo_micro(cbi, ldm, 4, True), (Ptr(ws, (moff,)), Ptr(tile, (Const(0), Const(0))),
                                                             Const(cbi))), epi_t)),)),)),))
    else:
        # per block of cbi output channels: the output transform of every tile into the block's rows, the epilogue
        rpitch = 4 * tw
        span = 4 * p.tr * rpitch
        acc = Buf(fresh("acc"), "float32", Layout.strided((cbi, span)), "stack")
        transform_out = For(ty, Const(0), Const(p.tr), (For(tx, Const(0), Const(tw), (
            Micro(wgo_micro(cbi, ldm, rpitch), (Ptr(ws, (moff,)), Ptr(acc, (Const(0), simplify(ty * (4 * rpitch)
                                                                                                     + tx * 4))),
                                                  Const(span))),)),))
        if g.ow == rpitch:  # the block's rows are contiguous in the output plane: one loop along them
            epi: Stmt = For(q, Const(0), simplify(rows * g.ow), (
                Epilogue((b, simplify(kb * cbi + o), simplify(ty0 * (4 * g.ow) + q)), Load(acc, (o, q))),),
                "vectorized")
        else:
            epi = For(yy, Const(0), rows, (For(q, Const(0), Const(g.ow), (
                Epilogue((b, simplify(kb * cbi + o), simplify((ty0 * 4 + yy) * g.ow + q)),
                         Load(acc, (o, simplify(yy * rpitch + q)))),), "vectorized"),))
        outputs = For(kb, kb0, kb1, (Alloc(acc, (transform_out, For(o, Const(0), nch, (epi,)))),))

    phase2: Stmt = For(b, Const(0), Const(p.batch), (For(blk, b0, b1, (transform_in, products, outputs)),))
    if T > 1:  # (each thread its blocks or its channels, in its own V and M: the thread index addresses them)
        phase2 = For(t2, Const(0), Const(T), (phase2,), "parallel")
    return Func(name, (x, up, c), (Alloc(ws, (phase1, phase2) if phase1 is not None else (phase2,)),), (ws,))
