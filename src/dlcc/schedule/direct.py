"""The schedule of a group-1 2-D convolution as a direct convolution over a channel-blocked input.

What goes in: the convolution's geometry (``schedule.gemm.ConvGeometry``), the output channels, the batch,
the ``Target`` and the thread count. What comes out: a ``DirectPlan`` (``plan_direct``: channel block,
register tile, thread split, workspace), the weight packed for it (``pack_direct``) and the loop IR
(``direct_func``).

The input is repacked per call into the workspace as channel blocks of ``cbi`` channels (the target's
vector width; all the channels when there are fewer) with a zero ring as wide as the padding
(``nchwc_...``: NCHW[cbi]c, so a tap never needs a bounds test); a first convolution reads its NCHW image where
it is instead (``reads_nchw``: its tiles over the taps inside the input only). The register tile (``dconv_...``) is
``no`` output channels (whole vectors, the weights of one input channel and tap loaded once) by ``px``
pixels of an output row (each input value broadcast once, feeding no / lanes FMAs): on AVX-512 2 x 16
channels by 14 pixels (28 accumulators), 4 x 16 by 7 for 7-wide rows; on 16-register targets 2 vectors by
6 pixels, and on a small plane whose rows that tile divides badly (7 or 14 wide) 2 vectors by 5 or 6 pixels
of the plane taken as one row (``flat_tiles``: a tile may cross output rows). Each tile runs over every input
channel block and tap into a local row of outputs (channel-major), and the fused epilogue runs along that row
(vectorized); for small planes (a channel tile's plane up to 48 KiB) along the tile's whole plane. Output rows
are the outer loop while the packed weight stays in L2, else output-channel tiles ("sweep": where the input and
the weights outgrow half of L3, chunks of input blocks outside, the tiles' planes in the workspace); threads
split the input blocks (the repacking), then that outer loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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
    Lane,
    Layout,
    Load,
    Micro,
    Ptr,
    Stmt,
    Var,
    simplify,
)
from dlcc.lower.micro import DCONV_PAD, dconv_micro, nchwc_micro
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.loops import PAR_MIN_FLOPS, l2_quarter_rows, share
from dlcc.schedule.target import Target
from dlcc.schedule.transform import parallelize, reorder

__all__ = ["DirectPlan", "direct_func", "direct_pays", "flat_pointwise", "nchw_pieces", "pack_direct", "plan_direct",
           "reads_no_ring",
           "reads_in_place", "reads_nchw", "repack_phase", "streams_input", "tile_score", "trim_taps"]

MAX_PX = 14  # pixels per register tile: beyond, the tile's weights are reloaded rarely enough already
PLANE_BYTES = 48 * 1024  # a channel tile's whole output plane up to this size: one epilogue loop over it
PLANE_TAPS_BYTES = 64 * 1024  # ... and up to this size for a kernel with taps whose tile weights fit half of L2
CL_BAND_BYTES = 64 * 1024  # channels-last, rows outside: a band of rows of every channel tile up to this size
FLAT_TILES = True  # register tiles along a small plane taken as one row (``flat_tiles``) where they score better
BALANCED_MIN_ACC = 12  # accumulators a register tile keeps to stay FMA-bound (plan_direct's balance with threads)
# bytes between addresses that share an L1 set (32 KiB 8-way, 48 KiB 12-way): a register tile broadcasting from
# 14 pixels this far apart keeps 14 lines in one set and misses (ResNet-50's 512 -> 1024 channels, stride 2, read
# in place from 512 channels-last channels: 0.87 -> 0.97 ms)
L1_WAY_BYTES = 4096
L1_PASS_MIN_TILES = 8  # register tiles an L1 pass serves at least (``l1_chunk``)
L1_CHUNKS = True  # a row's register tiles in passes over chunks of input blocks whose weights stay in L1 (``l1_chunk``)
NCHW_INPUT = True  # switch: a first convolution reads its NCHW input where it is (``reads_nchw``), not repacked
NCHW_MAX_CI = 4  # ... over at most this many input channels
# ... and at most this many taps (Zen 5, 1 thread: MobileNetV2's 3x3 stem 0.130 -> 0.115 ms, EfficientNet-B0's
# 0.199 -> 0.184; ResNet-50's 7x7 1.08 -> 1.07 and 1.09 -> 1.06, ResNet-18's within 2% either way; with exact
# column segments, whose edge columns were tiles of one pixel, the 7x7 ones were up to 2% slower than the copy)
NCHW_MAX_TAPS = 49
GEMM_MIN_CI_FEW = 1024  # input channels from which a 1x1 convolution is a GEMM on 16 registers (direct_pays)
GEMM_MIN_PIXELS_FEW = 196  # on planes of at least this many pixels


@dataclass(frozen=True)
class DirectPlan:
    co: int
    g: ConvGeometry
    batch: int
    cbi: int  # input channels per block (the vector width, or all of them when fewer)
    no: int  # output channels per register tile (whole vectors)
    px: int  # output pixels per register tile
    hp: int  # rows and columns of a repacked input block (the zero ring included)
    wp: int
    threads: int
    order: str  # "rows" | "oc" | "plane" | "chunks" | "sweep": the outer loop of the compute phase (the one the
    # threads divide); "plane": output-channel tiles outside, each tile's whole output plane in the local buffer,
    # then the epilogue; "chunks": as "plane", the input channel blocks in chunks of ``chunk`` (whose weights stay
    # in L2), the later chunks added to the plane; "sweep": the chunks outside (each chunk's input stays in L2 while
    # every channel tile reads it), every tile's plane in the workspace, the epilogue at the end
    chunk: int = 0  # input channel blocks per chunk ("chunks", "sweep"), else all of them
    ring: tuple[int, int] | None = None  # the zero ring a block keeps above and left of the input: the padding
    # (None), or less where no tap reaches it (``_extent``)
    in_place: bool = False  # the input read where it is, not repacked (``reads_in_place``): no workspace
    band_rows: int = 0  # "rows": at most this many rows per band (0: no bound; ``streams_input``)
    flat: bool = False  # register tiles along the output plane taken as one row (``flat_tiles``), not along its rows
    kchunk: int = 0  # "rows", "oc", "plane": input channel blocks per pass of a row's (the plane's) register tiles,
    # whose weights stay in L1 while the tiles run along it, the later passes added (``l1_chunk``); 0: one pass
    nchw: bool = False  # the NCHW input read where it is (``reads_nchw``): tiles over the taps inside the input only
    # (per exact row segment, along a row in ``nchw_pieces``), no repacking, no workspace
    blocked: bool = False  # the input read where it is, stored as the repacking would have stored it (NCHW[cbi]c,
    # blocks outside images, each block's plane hp x wp with the ring: ``schedule.blocked``): no repacking

    @property
    def rh(self) -> int:
        return self.g.ph if self.ring is None else self.ring[0]

    @property
    def rw(self) -> int:
        return self.g.pw if self.ring is None else self.ring[1]

    @property
    def ncb(self) -> int:
        return -(-self.g.ci // self.cbi)

    @property
    def n_oct(self) -> int:
        return -(-self.co // self.no)

    @property
    def band(self) -> int:
        """"rows": output rows per band of the local buffer (up to PLANE_BYTES; its epilogue runs along the band's
        contiguous rows as one loop: a 28-pixel row alone leaves a scalar tail of 12 per channel), and at most
        ``band_rows``."""
        band = max(1, min(-(-self.g.oh // self.threads), PLANE_BYTES // (4 * self.no * self.g.ow)))
        return min(band, self.band_rows) if self.band_rows else band

    @property
    def blocks_floats(self) -> int:
        """The floats of the input in its channel blocks, each plane hp x wp with its ring (repacked, or read so)."""
        return self.batch * self.ncb * self.hp * self.wp * self.cbi

    @property
    def input_floats(self) -> int:
        """The repacked input's floats (none when read in place)."""
        return 0 if self.in_place or self.nchw or self.blocked else self.blocks_floats

    @property
    def ld_plane(self) -> int:
        """Floats from one output channel's plane to the next in a local (or "sweep": workspace) buffer."""
        return self.g.oh * self.g.ow + DCONV_PAD

    @property
    def workspace_floats(self) -> int:
        planes = self.n_oct * self.no * self.ld_plane if self.order == "sweep" else 0
        return self.input_floats + planes

    @property
    def workspace_bytes(self) -> int:
        return 4 * self.workspace_floats


def trim_taps(g: ConvGeometry) -> tuple[ConvGeometry, tuple[int, int], tuple[int, int]]:
    """The geometry without the kernel rows and columns that no output reaches inside the input (a dilation
    as large as the plane: DeepLab's ASPP leaves only the centre tap), and the kept [first, last) kernel
    rows and columns; the padding shrinks with them, so the result is the same convolution."""
    def keep(k: int, o: int, s: int, d: int, p: int, n: int) -> tuple[int, int]:
        inside = [t for t in range(k) if any(0 <= y * s + t * d - p < n for y in range(o))]
        return (inside[0], inside[-1] + 1) if inside else (0, 1)

    (y0, y1), (x0, x1) = keep(g.kh, g.oh, g.sh, g.dh, g.ph, g.h), keep(g.kw, g.ow, g.sw, g.dw, g.pw, g.w)
    t = ConvGeometry(g.ci, g.h, g.w, g.oh, g.ow, y1 - y0, x1 - x0, g.sh, g.sw, g.dh, g.dw, g.ph - y0 * g.dh,
                     g.pw - x0 * g.dw)
    return t, (y0, y1), (x0, x1)


def flat_pointwise(g: ConvGeometry, co: int, target: Target, threads: int = 1) -> ConvGeometry:
    """A 1x1 stride-1 unpadded convolution's plane as one row of OH*OW pixels where, on a 16-register target,
    the register tile runs along it better than along its rows (``tile_score``), else ``g``: the pixels of a 1x1
    convolution are independent, and a plane whose rows are contiguous is one row. Zen 3, AVX2, 1 thread, one
    layer: ResNet-50's 512 -> 2048 at 7 x 7 (rows of 6 + 1 pixels) 66 -> 82 GFLOP/s, 1024 -> 256 at 14 x 14 65 ->
    69, 128 -> 512 at 28 x 28 75 -> 83. (On AVX-512 the 3 x 7 and 2 x 14 tiles fill 7-, 14- and 28-wide rows.)
    With threads that the one row would have split its channel tiles ("plane": each thread reads the whole
    input) and that divide the pixels: one row per thread where each thread then takes its row
    with every channel tile ("rows": the whole weight in L2)."""
    if ((g.kh, g.kw, g.sh, g.sw, g.ph, g.pw) != (1, 1, 1, 1, 0, 0) or (g.oh, g.ow) != (g.h, g.w) or g.oh == 1
            or target.vector_registers >= 32):  # (padded at the end: more output pixels than input ones)
        return g
    n = g.oh * g.ow
    flat = replace(g, h=1, w=n, oh=1, ow=n)
    here = _best_tile(g.ow, co, target)[0]
    if _best_tile(flat.ow, co, target)[0] <= here:
        return g
    one = plan_direct(co, flat, 1, target, threads)
    if threads > 1 and n % threads == 0 and n // threads >= g.ow:
        split = replace(g, h=threads, w=n // threads, oh=threads, ow=n // threads)
        if one.order == "plane" and plan_direct(co, split, 1, target, threads).order == "rows":
            return split
    if streams_input(flat, target) and 4 * one.n_oct * one.no * one.ncb * one.cbi <= target.l2_bytes // 2:
        # the input beyond half of L2, the weight within: rows whose input stays in a quarter of L2, each read by
        # every channel tile ("rows"), the rows as long as the register tile runs best along, a number the threads
        # divide evenly (``plan_direct``'s balance)
        fits = [(_best_tile(n // r, co, target)[0], -r) for r in range(2, n + 1)
                if n % r == 0 and l2_quarter_rows(target.l2_bytes, 4 * one.ncb * one.cbi * (n // r)) >= 1
                and (r % threads == 0 or r >= 8 * threads)]
        if fits and max(fits)[0] > here:
            r = -max(fits)[1]
            return replace(g, h=r, w=n // r, oh=r, ow=n // r)
    return flat


def streams_input(g: ConvGeometry, target: Target) -> bool:
    """Does this 1x1 convolution's input (per image) outgrow half of L2 on a 16-register target? Then output
    rows go outside ("rows", in bands whose input stays in a quarter of L2), not the channel tiles, each of which
    would stream the whole input from L3 ("plane", "oc"). Zen 3, AVX2, alternated in the model, with its plane as
    rows of 64, 49 or 196 pixels (``flat_pointwise``): ResNet-50's 256 -> 64 at 56 x 56 1.77 -> 1.43 ms, 256 ->
    128 3.35 -> 2.70 at 1 thread, 1.14 -> 0.83 and 2.01 -> 1.46 at 2 (the model 92.3 -> 91.3 and 57.2 -> 56.0
    ms, sums of kernel minima); DenseNet-121 64.3 -> 62.7 and 41.9 -> 39.4; MobileNetV2, Inception-v2 and
    EfficientNet-B0 within 1%."""
    cbi = min(target.lanes, g.ci)
    return (g.kh * g.kw == 1 and target.vector_registers < 32
            and 4 * -(-g.ci // cbi) * cbi * g.h * g.w > target.l2_bytes // 2)


def _inside(y: int, k: int, s: int, d: int, p: int, n: int) -> list[int]:
    """The kernel positions of output position ``y`` (kernel size ``k``, stride, dilation, padding) that reach
    inside an input of ``n`` positions."""
    return [t for t in range(k) if 0 <= y * s + t * d - p < n]


def _segments(o: int, k: int, s: int, d: int, p: int, n: int, exact: bool = False) -> list[tuple[int, int, int, int]]:
    """Output positions [s0, s1) along one axis (``o`` of them, kernel size ``k``, stride, dilation, padding,
    input size ``n``) with the same kernel positions [k0, k1) reaching inside the input; one segment of the
    whole kernel unless splitting saves at least a quarter of the work: more tile variants cost more than the
    few padding rows of an ordinary convolution (ResNet-18: 6% slower split at its 3x3 layers' border rows).
    ``exact``: always split (an input without a zero ring: a tap outside must not be read)."""
    segs: list[tuple[int, int, int, int]] = []
    for y in range(o):
        inside = _inside(y, k, s, d, p, n) or [0]
        kk = (inside[0], inside[-1] + 1)
        if segs and segs[-1][2:] == kk:
            segs[-1] = (segs[-1][0], y + 1, *kk)
        else:
            segs.append((y, y + 1, *kk))
    if not exact and sum((s1 - s0) * (k1 - k0) for s0, s1, k0, k1 in segs) > 0.75 * o * k:
        return [(0, o, 0, k)]
    return segs


def _extent(o: int, k: int, s: int, d: int, p: int, n: int) -> tuple[int, int]:
    """(zero ring before the input, positions) a repacked block keeps along one axis for ``_segments``'s taps:
    the padding and the padded extent, or none and up to the last position read where no segment's tap reaches
    outside the input (DeepLab's ASPP, dilation 12 on 28 x 28: blocks of 28 x 28 instead of 52 x 52, its 2048
    input channels 6.4 MB instead of 22)."""
    reads = [y * s + t * d - p for s0, s1, k0, k1 in _segments(o, k, s, d, p, n) for y in range(s0, s1)
             for t in range(k0, k1)]
    if all(0 <= r < n for r in reads):
        return 0, max(reads) + 1
    return p, (o - 1) * s + (k - 1) * d + 1


def row_segments(g: ConvGeometry, exact: bool = False) -> list[tuple[int, int, int, int]]:
    """Output rows [s0, s1) with the same kernel rows [k0, k1) reaching inside the input (padding rows read
    only the zero ring; with a large dilation most rows reach one kernel row); see ``_segments``."""
    return _segments(g.oh, g.kh, g.sh, g.dh, g.ph, g.h, exact)


def col_segments(g: ConvGeometry, exact: bool = False) -> list[tuple[int, int, int, int]]:
    """Output columns [s0, s1) with the same kernel columns [k0, k1) reaching inside the input (DeepLab's
    ASPP, dilation 12 on 28 columns: 2, 3 and 2 of the 3 kernel columns on 12, 4 and 12 columns)."""
    return _segments(g.ow, g.kw, g.sw, g.dw, g.pw, g.w, exact)


def reads_no_ring(g: ConvGeometry) -> bool:
    """Does no tap of this convolution reach outside its input (an unpadded 1x1, at any stride)? It then reads an
    input in channel blocks within any ring, whatever the ring holds (``schedule.blocked``)."""
    return g.kh * g.kw == 1 and not (g.ph or g.pw)


def direct_pays(g: ConvGeometry, co: int, target: Target) -> bool:
    """Does this group-1 2-D convolution (``co`` output channels) take the blocked direct kernel? Every one
    with more than one tap; 1x1 ones too, except on planes wider than 16 pixels reductions over fewer than
    128 channels or to fewer than 64, which stay GEMMs over the pixels (``schedule.gemm``): there the
    repacking and the tile's transpose are a large share, or the channel tile runs part empty (Zen 5,
    AVX-512: ResNet-50's 64 -> 256 channels at 56x56 90% of the FMA peak as a GEMM, 74% direct; MobileNetV2's
    144 -> 24 73% -> 54%; but 512 -> 128 at 28x28 82% -> 91%, 256 -> 512 strided 74% -> 87%). On 16-register
    targets (AVX2), strided 1x1 ones and reductions over ``GEMM_MIN_CI_FEW`` channels or more on planes of
    ``GEMM_MIN_PIXELS_FEW`` pixels or more stay GEMMs too:
    the direct tile there (2 vectors x 5 pixels) loads a broadcast per 2 FMAs and streams its input from L3
    once per 16 output channels, where the packed GEMM's 5 x 16 tile reads packed panels from L1 (Zen 3, 1
    thread, in the model: ResNet-50's 1024 -> 2048 strided projection 4.4 -> 3.2 ms, 256 -> 512 3.6 -> 3.3,
    1024 -> 256 at 14 x 14 1.57 -> 1.42, 1024 -> 512 3.2 -> 2.7; DeepLab's 2048 -> 256 at 28 x 28 13.5 -> 10.0;
    but its 256 -> 1024 expansions with the residual add 1.3 -> 1.7, and EfficientNet-B0's 1152 -> 192 at 7 x 7,
    with the residual add and its input's SE scale then in a kernel of its own, 0.98 -> 1.35 ms: not every 1x1)."""
    if g.kh * g.kw == 1 and target.vector_registers < 32 and (
            g.sh > 1 or g.sw > 1 or (g.ci >= GEMM_MIN_CI_FEW and g.oh * g.ow >= GEMM_MIN_PIXELS_FEW)):
        return False
    return g.kh * g.kw > 1 or g.ow <= 16 or (g.ci >= 128 and co >= 64)


def reads_in_place(g: ConvGeometry, strides: Sequence[int] | None, lanes: int) -> bool:
    """Can the direct kernel read this convolution's input where it is (``strides``: the input's, NCHW order),
    without the repacked copy? A 1x1 unpadded convolution (any stride) whose input keeps each pixel's channels
    contiguous (channels-last) and pixels a whole number of channel blocks apart: one pixel's block of input
    channels is then what the register tile broadcasts from, as from a repacked block (ResNet-50's 1x1
    convolutions between channels-last buffers; a strided one reads only the pixels it uses, where the copy
    moved all of them), except where the pixels it reads are a whole number of ``L1_WAY_BYTES`` apart."""
    cbi = min(lanes, g.ci)
    inside = (g.oh - 1) * g.sh < g.h and (g.ow - 1) * g.sw < g.w  # (no padding at the end either)
    return (strides is not None and len(strides) == 4 and g.kh == g.kw == 1 and g.ph == g.pw == 0 and inside
            and strides[1] == 1 and g.ci % cbi == 0 and strides[3] % cbi == 0
            and (4 * g.sw * strides[3]) % L1_WAY_BYTES != 0)


def nchw_pieces(g: ConvGeometry, px: int) -> list[list[tuple[int, int, int, int, bool]]] | None:
    """An output row of a convolution reading its NCHW input in place, in chunks of ``px`` pixels (the last one
    shorter), each as register tiles (x0, x1, j0, j1, add): the chunk's pixels [x0, x1) over kernel columns
    [j0, j1). The first covers the chunk over the columns every pixel of it reaches inside the input; each further
    one (``add``: added to the first) the pixels that reach one more run of columns inside, which are contiguous
    (at the left edge the chunk's later pixels, at the right edge its first ones). So no tap reads outside the
    input and the edge pixels ride in long tiles, where exact column segments would make them tiles of one pixel.
    None where a chunk has no column all its pixels reach (a dilation past the plane): the exact segments then."""
    def inside(ox: int) -> tuple[int, int]:
        cols = _inside(ox, g.kw, g.sw, g.dw, g.pw, g.w)
        return (cols[0], cols[-1] + 1) if cols else (0, 0)

    out = []
    for a in range(0, g.ow, px):
        b = min(a + px, g.ow)
        spans = [inside(ox) for ox in range(a, b)]
        lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
        if lo >= hi:
            return None
        pieces = [(a, b, lo, hi, False)]
        for j in (*range(lo), *range(hi, g.kw)):
            pix = [ox for ox, s in zip(range(a, b), spans, strict=True) if s[0] <= j < s[1]]
            if not pix:
                continue
            last = pieces[-1]
            if last[4] and (last[0], last[1]) == (pix[0], pix[-1] + 1) and last[3] == j:
                pieces[-1] = (last[0], last[1], last[2], j + 1, True)
            else:
                pieces.append((pix[0], pix[-1] + 1, j, j + 1, True))
        out.append(pieces)
    return out


def reads_nchw(g: ConvGeometry, strides: Sequence[int] | None, lanes: int) -> bool:
    """Can the direct kernel read this convolution's NCHW input (``strides``) where it is? A first convolution: up
    to ``NCHW_MAX_TAPS`` taps over at most ``NCHW_MAX_CI`` input channels (an image's RGB), one block of at most a
    vector, whose repacked copy (3 channels a pixel, with a zero ring) only moved the image; every output row and
    column reaching the input with at least one tap. Its register tiles then read each input channel's plane at its
    stride, a row's pixels adjacent, over the taps inside the input only: per row segment with the same kernel rows
    inside (``row_segments``, exact), along a row in chunks (``nchw_pieces``), so no tap reads outside the input
    and none tests bounds."""
    def reaches(o: int, k: int, s: int, d: int, p: int, n: int) -> bool:
        return all(_inside(y, k, s, d, p, n) for y in range(o))

    return (NCHW_INPUT and strides is not None and len(strides) == 4 and 1 < g.kh * g.kw <= NCHW_MAX_TAPS
            and g.ci <= min(lanes, NCHW_MAX_CI) and strides[3] == 1 and strides[2] >= g.w
            and strides[1] >= g.h * strides[2] and strides[0] >= g.ci * strides[1]
            and reaches(g.oh, g.kh, g.sh, g.dh, g.ph, g.h) and reaches(g.ow, g.kw, g.sw, g.dw, g.pw, g.w))


def tile_score(nv: int, px: int, ow: int, co: int, lanes: int, few: bool) -> float:
    """How useful a register tile of ``nv`` channel vectors x ``px`` pixels is on rows of ``ow`` pixels and ``co``
    output channels: its accumulators times the share of them the row (its last tile may be shorter) and the
    channels (the last channel tile may run past them) keep busy. ``few`` (16 registers: AVX2): its share of
    the FMA peak instead, 1 from 10 accumulators on and while a step's loads (a broadcast per pixel, a weight
    per vector) are at most one per FMA, rounded so that ties go to the longer pixel run. Zen 3, AVX2, 512
    channels 3x3 at 7 x 7: 1 x 7 pixels 76 GFLOP/s, 2 x 5 (5 + 2) 69, 2 x 4 (4 + 3) 57, 2 x 6 (6 + 1) 57, 3 x 3
    51; 1x1 on a 7 x 7 plane as one row of 49: 2 x 5 ahead of 2 x 6 by 4-8%."""
    row = ow / (-(-ow // px) * px)
    chans = co / (-(-co // (nv * lanes)) * nv * lanes)
    if not few:
        return nv * px * row * chans
    return round(min(1.0, nv * px / 10, 1 / (1 / nv + 1 / px)) * row * chans, 6)


def _best_tile(ow: int, co: int, target: Target, max_nv: int = 4) -> tuple[float, int, int]:
    """(score, channel vectors, pixels) of the best register tile (``tile_score``) for rows of ``ow`` pixels."""
    lanes, regs = target.lanes, target.vector_registers
    spare = 1 if "avx512f" in target.features else 2
    best = (0.0, 0, 0)
    vectors = -(-co // lanes)
    few = regs < 32
    for nv in range(1, max_nv + 1):
        if nv > vectors or (nv < min(2, vectors) and not few):  # one channel vector only when there is only one
            continue
        for px in range(min(ow, MAX_PX, (regs - spare - nv) // nv), 0, -1):
            score = tile_score(nv, px, ow, co, lanes, few)
            if (score, px) > (best[0], best[2]):
                best = (score, nv, px)
            if not few:
                break  # (the most pixels that fit)
    return best


def flat_tiles(n: int, px: int) -> tuple[int, int, int]:
    """The ``n`` pixels of a plane taken as one row in register tiles of at most ``px``: as few tiles as that
    allows, their sizes as even as possible: (tiles, tiles of the larger size, the smaller size); the larger ones
    first, one pixel more."""
    tiles = -(-n // px)
    small, big = divmod(n, tiles)
    return tiles, big, small


def _flat_tile(g: ConvGeometry, co: int, target: Target, max_nv: int) -> tuple[float, int, int]:
    """(score, channel vectors, pixels) of the best register tile along the output plane taken as one row
    (``flat_tiles``: every tile whole, one pixel shorter at most), scored by its shortest tile (``tile_score``);
    (0, 0, 0) where the plane cannot be taken so: a target with 32 registers (its tiles fill 7-, 14- and 28-wide
    rows), one row, or rows whose kernel rows or columns reaching inside the input differ (``row_segments``).
    Zen 3, AVX2, ResNet-50 in the model, alternated, kernel minima at 1 and 2 threads: 512 channels 3x3 at 7 x 7
    (1 x 7 tiles before, 2 x 6 and 2 x 5 now) 2.96 -> 2.65 and 2.41 -> 1.72 ms; strided to 7 x 7 3.24 -> 2.85 and
    2.37 -> 2.04; 256 channels strided to 14 x 14 (2 x 5 + 2 x 4 before) 3.09 -> 2.61 and 2.00 -> 1.72; the sum of
    its kernels 87.6 -> 83.3 and 56.9 -> 54.1 ms."""
    if (not FLAT_TILES or target.vector_registers >= 32 or g.oh == 1 or row_segments(g) != [(0, g.oh, 0, g.kh)]
            or col_segments(g) != [(0, g.ow, 0, g.kw)]):
        return 0.0, 0, 0
    n, lanes, regs = g.oh * g.ow, target.lanes, target.vector_registers
    best = (0.0, 0, 0)
    for nv in range(1, min(max_nv, -(-co // lanes)) + 1):
        for px in range(min(n, MAX_PX, (regs - 2 - nv) // nv), 1, -1):
            _, big, small = flat_tiles(n, px)
            score = min(tile_score(nv, k, k, co, lanes, True) for k in ((small + 1,) if big else ()) + (small,))
            if (score, px) > (best[0], best[2]):
                best = (score, nv, px)
    return best


def l1_chunk(g: ConvGeometry, cbi: int, no: int, target: Target, tiles: int) -> int:
    """Input channel blocks per pass of a row's (a flat plane's) register tiles (``DirectPlan.kchunk``), or 0 for
    one pass. Each register tile runs over all input blocks, so a channel tile's weights stream into L1 once per
    tile; where they outgrow half of L2 (ResNet's 512 channels 3x3: 288 KiB, the input beside them) the row's tiles
    go in passes over chunks of blocks whose weights stay in half of L1, each pass adding to what the earlier ones
    stored. Zen 3, AVX2, in the model, alternated in both orders, kernel minima at 1 / 2 threads: ResNet-50's 512
    channels 3x3 strided into 7 x 7 2.94 -> 2.67 / 1.59 -> 1.45 ms, at 7 x 7 2.67 -> 2.60; ResNet-18's at 7 x 7
    2.66 -> 2.62 / 1.40 -> 1.34. Smaller weights lost 2-4%: AlexNet's 384 channels at 13 x 13 (216 KiB), Inception-v2's
    7 x 7 convolutions (about 110), ResNet-50's 128 channels strided (72); so did 1x1s (ResNet-50's 2048 -> 512 at
    7 x 7, 128 KiB: 4% at 2 threads), and so did passes over fewer than ``L1_PASS_MIN_TILES`` register tiles
    (``tiles``: a row's, or a flat plane's), whose weights then serve too few tiles (ZFNet's 512 -> 1024 channels on
    13-pixel rows of 3 tiles: 7% at 2 threads). Only on 16-register targets, where it was measured (32 registers:
    tiles of 28 accumulators, whose loads and stores per pass weigh more; not measured)."""
    ncb = -(-g.ci // cbi)
    tile_w = 4 * cbi * g.kh * g.kw * no  # bytes of one input block's weights for one channel tile
    per = max(1, (target.l1d_bytes // 2) // tile_w)
    if (not L1_CHUNKS or target.vector_registers >= 32 or g.kh * g.kw == 1 or ncb * tile_w <= target.l2_bytes // 2
            or per >= ncb or tiles < L1_PASS_MIN_TILES):
        return 0
    passes = -(-ncb // per)
    return -(-ncb // passes)


def plan_direct(co: int, g: ConvGeometry, batch: int, target: Target, threads: int = 1,
                strides: Sequence[int] | None = None, max_nv: int = 4, flat_ok: bool = True) -> DirectPlan:
    """The plan (``_plan_direct``), reading an NCHW input where it is where ``reads_nchw`` allows (its tiles then
    along rows: no flat tiles)."""
    if reads_nchw(g, strides, target.lanes):
        return replace(_plan_direct(co, g, batch, target, threads, strides, max_nv, False), nchw=True)
    return _plan_direct(co, g, batch, target, threads, strides, max_nv, flat_ok)


def _plan_direct(co: int, g: ConvGeometry, batch: int, target: Target, threads: int = 1,
                 strides: Sequence[int] | None = None, max_nv: int = 4, flat_ok: bool = True) -> DirectPlan:
    """The register tile: channel vectors x pixels, the best by ``tile_score`` of those that fit the register
    file beside one weight vector per channel vector and the broadcast input (one register; two where the
    FMA cannot take a broadcast from memory, i.e. without AVX-512); 1 to 4 channel vectors (1 only when the
    channels fill only one, or on 16 registers) and at most 14 pixels; ties go to the longer pixel run.
    AVX-512: 2 x 14 (4 x 6 would leave 7-wide rows a 1-pixel tail: 3 x 7). ``strides``:
    the input's, when known: read in place where ``reads_in_place`` allows. With threads splitting channel tiles
    unevenly, one channel vector less where that splits them evenly and still fills ``BALANCED_MIN_ACC``
    accumulators (ResNet-50's 512 channels at 7 x 7, 2 threads: 11 tiles of 3 x 7 as 6 + 5, 0.63 ms; 16 tiles of
    2 x 7 as 8 + 8, 0.56; at 1 thread within 3% either way)."""
    lanes = target.lanes
    score, nv, px = _best_tile(g.ow, co, target, max_nv)
    cbi = min(lanes, g.ci)
    inplace = reads_in_place(g, strides, lanes)
    flat = False
    if flat_ok and not inplace:  # (the plane as one row where its tiles beat the rows'; kept if the order is "plane")
        fscore, fnv, fpx = _flat_tile(g, co, target, max_nv)
        if fscore > score:
            nv, px, flat = fnv, fpx, True
    (rh, hp), (rw, wp) = _extent(g.oh, g.kh, g.sh, g.dh, g.ph, g.h), _extent(g.ow, g.kw, g.sw, g.dw, g.pw, g.w)
    no = nv * lanes
    t = threads if threads > 1 and 2.0 * batch * co * g.oh * g.ow * g.ci * g.kh * g.kw >= PAR_MIN_FLOPS else 1
    n_oct = -(-co // no)
    ncb = -(-g.ci // cbi)
    tile_w = 4 * cbi * g.kh * g.kw * no  # bytes of one input block's weights for one channel tile
    # output rows outside while the whole packed weight stays in L2 (each row's inputs are then read from
    # L1 by every channel tile); else the channel tiles outside, so that each tile's weights are read from
    # memory once and then from L2/L3 for every row (row by row, all the weights would stream from memory
    # during the first row, with 1/OH of the work to hide it)
    order = "rows" if n_oct * ncb * tile_w <= target.l2_bytes // 2 else "oc"
    streams = streams_input(g, target) and g.oh > 1  # (one row: "plane" or "rows" alike)
    rows_first = streams or (g.kh * g.kw == 1 and g.oh == t > 1)  # (a 1x1 plane as one row per thread)
    # (a plane up to PLANE_TAPS_BYTES where the kernel has taps and a channel tile's weights stay in half of L2:
    # ResNet-50's 128 channels 3x3 strided into 28 x 28 (50 KB) then takes flat tiles along its plane, 2.96 ->
    # 2.77 ms, and ResNet-18's 64 -> 128 2.3% faster (Zen 3, AVX2, alternated, both orders); 1x1s measured either
    # way within the noise, and DeepLab's ASPP (2.4 MB of weights a tile) needs "oc" for its chunks of input blocks)
    wide_plane = g.kh * g.kw > 1 and ncb * tile_w <= target.l2_bytes // 2
    if 4 * no * g.oh * g.ow <= (PLANE_TAPS_BYTES if wide_plane else PLANE_BYTES) and n_oct >= t and not rows_first:
        order = "plane"  # a small plane: channel tiles outside, the whole plane of a tile before its epilogue
    # (a 1x1 plane as one row per thread, ``flat_pointwise``: each thread its pixels, where threads splitting the
    # channel tiles each read the whole input (MobileNetV2's 576 -> 96 at 14 x 14 with the residual add, Zen 3,
    # AVX2, 2 threads, in the model: 0.22 -> 0.15 ms))
    extent = {"rows": g.oh, "oc": n_oct, "plane": n_oct}
    if extent[order] < t or extent[order] % t and extent[order] < 8 * t:
        other = "rows" if order != "rows" else "oc"
        if extent[other] >= t and (extent[other] % t == 0 or extent[other] >= 8 * t):
            order = other
    if extent[order] < t:
        t = 1
    if t > 1 and order != "rows" and n_oct % t and n_oct < 8 * t and nv > 2:
        alt = plan_direct(co, g, batch, target, threads, strides, nv - 1, flat_ok)
        if alt.order != "rows" and alt.threads == t and alt.n_oct % t == 0 and \
                alt.no // lanes * alt.px >= BALANCED_MIN_ACC:
            return alt
    # a channel tile's weights beyond half of L2 (DeepLab's ASPP: 2048 input channels x 9 taps x 32 = 2.4 MB):
    # every output row would stream them from L3 again; in chunks of input blocks that stay in L2, the tile's
    # whole plane accumulating in L1/L2 instead
    if order == "oc" and ncb * tile_w > target.l2_bytes // 2 and 4 * no * g.oh * g.ow <= target.l2_bytes // 4:
        chunk = max(1, (target.l2_bytes // 4) // tile_w)
        block_bytes = 4 * batch * hp * wp * cbi
        if not inplace and ncb * block_bytes + n_oct * ncb * tile_w > target.l3_bytes // 2:
            # the input and the weights together beyond half of L3: the input (read once per channel tile)
            # would stream from memory; chunks of it that stay in L2 outside instead, every channel tile's plane
            # in the workspace (DeepLab's ASPP at 2048 channels, 6.4 MB of input and 19 MB of weights, Zen 3, AVX2,
            # in the model, alternated: dilation 12 122 -> 71 ms, dilation 24 111 -> 39 at 1 thread; 59 -> 37 and
            # 53 -> 19 at 2. Its plane buffers, 0.8 MB of workspace, are what the arena pays)
            sweep = max(1, (target.l2_bytes // 2) // block_bytes)
            if sweep < ncb:
                return DirectPlan(co, g, batch, cbi, no, px, hp, wp, t if n_oct >= t else 1, "sweep", sweep,
                                  (rh, rw), inplace, flat=flat)
        if chunk < ncb:
            return DirectPlan(co, g, batch, cbi, no, px, hp, wp, t, "chunks", chunk, (rh, rw), inplace, flat=flat)
    if flat and order != "plane":  # (flat tiles fill a whole plane in the local buffer: "plane", "chunks", "sweep")
        return plan_direct(co, g, batch, target, threads, strides, max_nv, False)
    band_rows = max(1, l2_quarter_rows(target.l2_bytes, 4 * ncb * cbi * g.w)) if streams and order == "rows" else 0
    tiles = flat_tiles(g.oh * g.ow, px)[0] if flat else -(-g.ow // px)  # (register tiles per pass)
    return DirectPlan(co, g, batch, cbi, no, px, hp, wp, t, order, ncb, (rh, rw), inplace, band_rows, flat,
                      l1_chunk(g, cbi, no, target, tiles))


def pack_direct(w: np.ndarray, p: DirectPlan) -> np.ndarray:
    """The weight (Co, Ci, kh, kw) as [output-channel tile][input block][ky][kx][i < cbi][o < no], zero
    where a tile or a block runs past the channels."""
    co, ci, kh, kw = w.shape
    wz = np.zeros((p.n_oct * p.no, p.ncb * p.cbi, kh, kw), np.float32)
    wz[:co, :ci] = w
    t = wz.reshape(p.n_oct, p.no, p.ncb, p.cbi, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    return np.ascontiguousarray(t).reshape(p.n_oct, -1)


def repack_phase(g: ConvGeometry, cbi: int, batch: int, hp: int, wp: int, x: Buf, ws: Buf, t: Var, T: int,
                 cb: Var, b: Var, scale: Buf | None = None, ring: tuple[int, int] | None = None) -> Stmt:
    """Repacking every image's input channel blocks (``cbi`` channels, NCHW[cbi]c, a zero ring from ``g``'s
    padding to hp x wp) into ``ws`` at [block][image], on ``T`` threads (loop variable ``t``): the loop over the
    blocks parallelized (``schedule.transform``); with fewer blocks than threads (a first convolution's 3
    channels), each thread repacks its share of every block's rows. ``scale`` (N, Ci): each image's channels
    multiplied by it on the way (``schedule.chscale``). ``ring``: the zero ring above and left of the input,
    when not ``g``'s padding."""
    rh, rw = ring if ring is not None else (g.ph, g.pw)
    ncb = -(-g.ci // cbi)
    xd = x.layout.dims
    # (channel, row, column strides; an input in channel blocks of cbi, ``schedule.blocked``: a block's channels
    # contiguous, its pixels a block apart, the block where the address of its first channel is)
    xc, xh, xw = (xd[2][3], xd[3][3], xd[4][3]) if len(xd) == 5 and xd[1][1] == cbi else (xd[1][3], xd[2][3],
                                                                                            xd[3][3])
    block = hp * wp * cbi
    by_rows = ncb * batch < T
    y0, y1 = share(t, hp, T) if by_rows else (Const(0), Const(hp))
    sc = (Ptr(scale, (b, cb * cbi)),) if scale is not None else ()
    first = Lane(cb, Const(0), cbi) if len(xd) == 5 else cb * cbi
    pack = Micro(nchwc_micro(cbi, g.h, g.w, rh, rw, hp, wp, xw=xw, scaled=scale is not None), (
        Ptr(x, (b, first, Const(0), Const(0))), *sc, Const(xc), Const(xh),
        Bin("min", Const(cbi), Const(g.ci) - cb * cbi), y0, simplify(y1 - y0),
        Ptr(ws, (simplify((cb * batch + b) * block + y0 * (wp * cbi)),))))
    loop = For(cb, Const(0), Const(ncb), (For(b, Const(0), Const(batch), (pack,)),))
    if T == 1:
        return loop
    if by_rows or ncb < T:  # (each thread its rows of every block; fewer blocks than threads: theirs, some none)
        c0, c1 = (Const(0), Const(ncb)) if by_rows else share(t, ncb, T)
        return For(t, Const(0), Const(T), (replace(loop, start=c0, stop=c1),), "parallel")
    return parallelize((loop,), cb.name, T, t.name)[0]


def direct_func(p: DirectPlan, x: Buf, wp: Buf, c: Buf, ws: Buf, name: str = "conv_direct",
                fresh: Callable[[str], str] = str, channels_last: bool = False, scale: Buf | None = None,
                dest_block: int = 0) -> Func:
    """The loop IR of ``c[b, o, oy*OW + ox] = sum W[o, i, ky, kx] * x[b, i, oy*sh + ky*dh - ph, ox*sw + kx*dw
    - pw]`` (zero padding): ``x`` (N, Ci, H, W) with unit column stride or channels-last, ``wp`` the weight
    packed by ``pack_direct``, ``c`` (N, Co, OH*OW), ``ws`` the workspace (the repacked input).
    ``channels_last``: the local buffer pixel-major (``dconvp_`` tiles, no transpose) and the epilogue per
    pixel along its channels, for a destination whose channels are contiguous. ``scale`` (N, Ci): the input
    multiplied by it per image and channel as it is repacked (a squeeze-and-excitation scale). A plan that reads
    ``x`` in place (``DirectPlan.in_place``) has no repacking phase and leaves ``ws`` unused; one that reads it in its
    channel blocks (``DirectPlan.blocked``) takes ``x`` as its whole base, flat. ``dest_block`` (channels-last
    only): the epilogue per block of this many channels (the destination, or a tensor the epilogue reads, stores
    its channels in such blocks: ``kir.Buffer.block``), its index (image, channel block, channel in it, pixel), a
    block's channels along one vector loop."""
    g, T, cbi, ncb = p.g, p.threads, p.cbi, p.ncb
    if dest_block and (not channels_last or p.co % dest_block or p.no % dest_block):
        raise ValueError("direct convolution: a destination in channel blocks takes channels-last tiles of whole "
                         "blocks")
    t1, t2, b, cb, oy, oct, xt, o, q = (Var(fresh(v)) for v in ("t", "t", "b", "cb", "oy", "oct", "xt", "o", "q"))
    tv2: Expr = t2 if T > 1 else Const(0)
    block = p.hp * p.wp * cbi
    if p.in_place and scale is not None:
        raise ValueError("direct convolution: an input read in place cannot be scaled on the way")
    if p.nchw and (scale is not None or p.flat or ncb != 1):
        raise ValueError("direct convolution: an NCHW input read in place is one block, unscaled, along rows")
    if p.blocked and scale is not None:
        raise ValueError("direct convolution: an input read in its channel blocks cannot be scaled on the way")
    phase1 = repack_phase(g, cbi, p.batch, p.hp, p.wp, x, ws, t1, T, cb, b, scale, (p.rh, p.rw)) \
        if not p.in_place and not p.nchw and not p.blocked else None
    src = x if p.blocked else ws  # (where the channel blocks are: ``x`` itself, its whole base from its start)

    # phase 2: per output-channel tile and output row (in the plan's order), the row's register tiles into a
    # local row of outputs (or, "plane", the tile's whole output plane), then the epilogue along it (a loop
    # as long as the row or the plane: it vectorizes)
    sweep = p.order == "sweep" and not channels_last  # (channels-last destinations take "chunks")
    order = "chunks" if p.order == "sweep" and not sweep else p.order
    whole = order in ("plane", "chunks", "sweep")  # the tile's whole output plane in the local buffer
    band = p.band if order == "rows" else 1  # "rows": a band of output rows of a tile in the local buffer
    cl = channels_last
    # channels-last with output rows outside: every channel tile of a band's pixels in one local buffer, then the
    # epilogue per pixel along all its channels (one contiguous run of the destination; per tile, a pixel's run
    # would be one tile's channels, a destination row apart: ResNet-50's 512-channel residual adds read and wrote
    # 128 bytes every 2 KB, 7% slower than NCHW)
    wide = cl and order == "rows"
    width = p.n_oct * p.no if wide else p.no
    if wide:
        band = max(1, min(-(-g.oh // T), CL_BAND_BYTES // (4 * g.ow * width)))
    ob = Var(fresh("ob"))
    ko = Var(fresh("ko")) if dest_block else ob  # (a destination's channel block in the epilogue)
    r0, r1 = share(tv2, g.oh, T) if order == "rows" else (Const(0), Const(g.oh))
    o0, o1 = Const(0), Const(p.n_oct)  # (the channel tiles' orders: threads by parallelize, at the end)
    first = simplify(r0 + ob * band)  # the band's first row (band > 1)
    span = g.oh * g.ow if whole else band * g.ow
    acc = Buf(fresh("acc"), "float32", Layout.strided((span, width) if cl else (p.no, span + DCONV_PAD)), "stack")
    ldc = width if cl else span + DCONV_PAD
    at0 = oy * g.ow if whole else (oy - first) * g.ow if band > 1 else Const(0)
    Chunk = tuple[Expr, Expr, bool] | None  # (first input block, blocks, accumulate), or all blocks
    # channel tiles outside (each tile's rows, then the next tile): the tiles' weights come from memory where the
    # model's weights outgrow L3, each the first time its first row reads it; every call prefetches its row's share
    # of the next tile's weights a few lines per input block instead (ResNet-50's 512 -> 2048 channels at 7 x 7:
    # 78% -> 98% of the FMA peak for the tile alone with its weights from memory)
    wlen = ncb * g.kh * g.kw * cbi * p.no  # floats of one channel tile's packed weight
    ntiles, nbig, small = flat_tiles(g.oh * g.ow, p.px) if p.flat else (0, 0, 0)
    calls = ntiles if p.flat else g.oh  # register tiles of a channel tile that share the prefetching
    pf_lines = -(-wlen // (16 * ncb * calls)) if order in ("plane", "oc") and p.n_oct > 1 else 0
    planes0 = p.input_floats  # ("sweep": every channel tile's plane in the workspace after the repacked input)
    nchw_cols = nchw_pieces(g, p.px) if p.nchw else None

    def tile(x0: Expr, px: int, k0: int, k1: int, j0: int, j1: int, chunked: Chunk, q0: Expr | None = None,
             call: Expr | None = None) -> Stmt:
        """The register tile at column x0 over kernel rows [k0, k1) and columns [j0, j1) (the others reach only
        the zero ring), over all input blocks or the chunk's; ``q0`` (flat tiles): at pixel q0 of the plane taken
        as one row instead, the tile's ``call``-th of the channel tile's."""
        row = Const(0) if q0 is not None else oy
        xoff = b * block + (row * g.sh + (k0 * g.dh + p.rh - g.ph)) * (p.wp * cbi) + x0 * (g.sw * cbi)
        if p.rw != g.pw:
            xoff = xoff + (p.rw - g.pw) * cbi
        if j0:
            xoff = xoff + j0 * g.dw * cbi
        per_row = g.kw * cbi * p.no
        woff: Expr = Const(k0 * per_row + j0 * cbi * p.no)
        nblk: Expr = Const(ncb)
        accumulate = False
        if chunked is not None:
            cb0, nblk, accumulate = chunked
            xoff = xoff + cb0 * (p.batch * block)
            woff = woff + cb0 * (g.kh * per_row)
        at = simplify(at0 + x0) if q0 is None else q0
        where = (at, simplify(oct * p.no) if wide else Const(0)) if cl else (Const(0), at)
        ahead = pf_lines if chunked is None or p.kchunk else 0  # (L1 passes prefetch; "chunks", "sweep" do not)
        if p.nchw:  # (the input itself: the segment's taps all inside it, from kernel row k0 and column j0)
            xs = x.layout.dims
            uk = dconv_micro(p.no, px, cbi, k1 - k0, j1 - j0, g.sw, g.dh, g.dw, cbi * xs[1][3], xs[2][3],
                             (g.kh - (k1 - k0)) * per_row, kwf=g.kw, accumulate=accumulate, pixel_major=cl,
                             prefetch=ahead, xci=xs[1][3])
            xin = Ptr(x, (b, Const(0), simplify(oy * g.sh + (k0 * g.dh - g.ph)), simplify(x0 * g.sw + (j0 * g.dw
                                                                                                          - g.pw))))
        elif p.in_place:  # (1x1, unpadded: the tile's pixels in the input itself, a block cbi floats on)
            xs = x.layout.dims
            uk = dconv_micro(p.no, px, cbi, 1, 1, g.sw * xs[3][3] // cbi, g.dh, g.dw, cbi, g.sh * xs[2][3], 0,
                             accumulate=accumulate, pixel_major=cl, prefetch=ahead)
            c0 = simplify(chunked[0] * cbi) if chunked is not None else Const(0)
            xin = Ptr(x, (b, c0, simplify(oy * g.sh), simplify(x0 * g.sw)))
        else:
            uk = dconv_micro(p.no, px, cbi, k1 - k0, j1 - j0, g.sw, g.dh, g.dw, p.batch * block, p.wp * cbi,
                             (g.kh - (k1 - k0)) * per_row, kwf=g.kw, accumulate=accumulate, pixel_major=cl,
                             prefetch=ahead, flat=(g.ow, g.sh * p.wp * cbi) if q0 is not None else None)
            xin = Ptr(src, (simplify(xoff),))
        dest = Ptr(ws, (simplify(planes0 + oct * (p.no * ldc) + at),)) if sweep else Ptr(acc, where)
        args = (simplify(nblk), xin, Ptr(wp, (oct, simplify(woff))), dest, Const(ldc))
        if q0 is not None:
            args += (q0,)
        if ahead:  # this row's (tile's) share of the next channel tile's weights (the last tile: its own again)
            nxt = simplify(Bin("min", oct + 1, Const(p.n_oct - 1)))
            i = oy if call is None else call
            if chunked is None:
                span = 16 * ahead * ncb
                at = Bin("min", i * span, Const(wlen - span))
            else:  # (an L1 pass of blocks [cb0, cb0 + n): its calls' shares side by side, after the earlier passes')
                cb0, n, _ = chunked
                at = Bin("min", (cb0 * calls + i * n) * (16 * ahead), Const(wlen) - n * (16 * ahead))
            args += (Ptr(wp, (nxt, simplify(at))),)
        return Micro(uk, args)

    def l1_passes(make: Callable[[Chunk], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        """``make``'s register tiles over all input blocks, or (``p.kchunk``) in passes over chunks of them whose
        weights stay in L1: the first pass stored, the later ones added."""
        if not p.kchunk:
            return make(None)
        kc, ch = p.kchunk, Var(fresh("kc"))
        n = Const(kc) if ncb % kc == 0 else Bin("min", Const(kc), Const(ncb) - ch * kc)
        return (*make((Const(0), Const(kc), False)), For(ch, Const(1), Const(-(-ncb // kc)),
                                                          make((simplify(ch * kc), n, True))))

    def nchw_tiles(k0: int, k1: int, pieces: list[list[tuple[int, int, int, int, bool]]]) -> tuple[Stmt, ...]:
        """A row's tiles over an NCHW input read in place (``nchw_pieces``): each chunk's first tile over the
        kernel columns every pixel of it reaches inside the input, then the others added; chunks of the whole
        kernel in one loop."""
        def whole(chunk: list[tuple[int, int, int, int, bool]]) -> bool:  # (a full chunk over the whole kernel)
            return len(chunk) == 1 and chunk[0][2:4] == (0, g.kw) and chunk[0][1] - chunk[0][0] == p.px

        out: tuple[Stmt, ...] = ()
        i = 0
        while i < len(pieces):
            run = 0
            while i + run < len(pieces) and whole(pieces[i + run]):
                run += 1
            if run > 1:
                first = pieces[i][0][0]
                out += (For(xt, Const(0), Const(run), (tile(simplify(xt * p.px + first), p.px, k0, k1, 0, g.kw,
                                                             None),)),)
                i += run
                continue
            for x0, x1, c0, c1, add in pieces[i]:
                out += (tile(Const(x0), x1 - x0, k0, k1, c0, c1, (Const(0), Const(ncb), True) if add else None),)
            i += 1
        return out

    def tiles(k0: int, k1: int, chunked: Chunk) -> tuple[Stmt, ...]:
        if chunked is None and p.kchunk:
            return l1_passes(lambda c: tiles(k0, k1, c))
        if p.nchw and chunked is None and nchw_cols is not None:
            return nchw_tiles(k0, k1, nchw_cols)
        out: tuple[Stmt, ...] = ()
        for x0, x1, j0, j1 in col_segments(g, p.nchw):  # (NCHW: where a chunk has no column all its pixels reach)
            full, tail = divmod(x1 - x0, p.px)
            if full:
                x0t = simplify(xt * p.px + x0)
                out += (For(xt, Const(0), Const(full), (tile(x0t, p.px, k0, k1, j0, j1, chunked),)),)
            if tail:
                out += (tile(Const(x0 + full * p.px), tail, k0, k1, j0, j1, chunked),)
        return out

    def flat(chunked: Chunk) -> tuple[Stmt, ...]:
        """The whole plane as one row (``flat_tiles``: ``nbig`` tiles of small + 1 pixels, then small ones)."""
        if chunked is None and p.kchunk:
            return l1_passes(flat)
        out: tuple[Stmt, ...] = ()
        for first, count, size in ((0, nbig, small + 1), (nbig, ntiles - nbig, small)):
            if count:
                call = simplify(xt + first)
                q0 = simplify(xt * size + first * (small + 1))
                out += (For(xt, Const(0), Const(count), (tile(Const(0), size, 0, g.kh, 0, g.kw, chunked, q0, call),)),)
        return out

    def rows(lo: Expr, hi: Expr, body: Callable[[tuple[Stmt, ...]], tuple[Stmt, ...]],
             chunked: Chunk = None) -> tuple[Stmt, ...]:
        """Output rows [lo, hi), split where the kernel rows that reach inside the input change (flat tiles:
        the whole plane, ``body`` not applied: only the orders with the whole plane in the buffer take them)."""
        if p.flat:
            return flat(chunked)
        out: tuple[Stmt, ...] = ()
        for s0, s1, k0, k1 in row_segments(g, p.nchw):
            a, z = simplify(Bin("max", lo, Const(s0))), simplify(Bin("min", hi, Const(s1)))
            if isinstance(a, Const) and isinstance(z, Const) and a.value >= z.value:
                continue
            out += (For(oy, a, z, body(tiles(k0, k1, chunked))),)
        return out

    def per_block(n: Expr, base: Expr, kb0: Expr, nbk: Expr) -> Stmt:
        """The epilogue of n pixels of the pixel-major local buffer from output pixel ``base``, per block of
        ``dest_block`` channels (blocks [kb0, kb0 + nbk), each one vector loop; its columns from the first block's)."""
        return For(q, Const(0), n, (For(ko, Const(0), nbk, (For(o, Const(0), Const(dest_block), (
            Epilogue((b, simplify(kb0 + ko), o, simplify(base + q)), Load(acc, (q, simplify(ko * dest_block + o)))),),
            "vectorized"),)),))

    def along(base: Expr, n: Expr, plane: bool = False) -> Stmt:
        """The epilogue of the tile's n pixels in the local buffer (``plane``: the tile's plane in the
        workspace, "sweep"), from output pixel ``base`` (one loop: it vectorizes)."""
        nco = Const(p.no) if p.co % p.no == 0 else Bin("min", Const(p.no), Const(p.co) - oct * p.no)
        if cl and dest_block:  # (per block of the tile's channels)
            per = p.no // dest_block
            nbk = Const(per) if p.co % p.no == 0 else Bin("min", Const(per), Const(p.co // dest_block) - oct * per)
            return per_block(n, base, oct * per, nbk)
        if cl:
            return For(q, Const(0), n, (For(o, Const(0), nco, (
                Epilogue((b, oct * p.no + o, simplify(base + q)), Load(acc, (q, o))),), "vectorized"),))
        src = Load(ws, (simplify(planes0 + oct * (p.no * ldc) + o * ldc + q),)) if plane else Load(acc, (o, q))
        return For(o, Const(0), nco, (
            For(q, Const(0), n, (Epilogue((b, oct * p.no + o, simplify(base + q)), src),), "vectorized"),))

    def passes(wrap: Callable[[tuple[Stmt, ...]], tuple[Stmt, ...]]) -> tuple[tuple[Stmt, ...], Stmt]:
        """"chunks", "sweep": the first chunk of input blocks stored, then a loop adding the later ones; ``wrap``
        takes each pass's rows (into the thread's channel tiles, "sweep")."""
        ch = Var(fresh("ch"))
        first = wrap(rows(Const(0), Const(g.oh), lambda t: t, (Const(0), Const(min(p.chunk, ncb)), False)))
        rest = (ch * p.chunk, Bin("min", Const(p.chunk), Const(ncb) - ch * p.chunk), True)
        return first, For(ch, Const(1), Const(-(-ncb // p.chunk)), wrap(rows(Const(0), Const(g.oh), lambda t: t,
                                                                           rest)))

    epilogue = along(Const(0) if whole else oy * g.ow, Const(span))
    if wide:  # per band of rows: every channel tile's rows, then the epilogue per pixel along all channels
        last = simplify(Bin("min", r1, first + band))
        base = simplify(first * g.ow)
        if dest_block:  # (per block of channels)
            epi = per_block(simplify((last - first) * g.ow), base, Const(0), Const(p.co // dest_block))
        else:
            epi = For(q, Const(0), simplify((last - first) * g.ow), (For(o, Const(0), Const(p.co), (
                Epilogue((b, o, simplify(base + q)), Load(acc, (q, o))),), "vectorized"),))
        tiles_all = For(oct, Const(0), Const(p.n_oct), rows(first, last, lambda t: t))
        nest = (For(ob, Const(0), simplify((r1 - r0 + (band - 1)) // band), (Alloc(acc, (tiles_all, epi)),)),)
    elif order == "rows" and band > 1:  # per band of rows: every channel tile's rows, then its epilogue along them
        last = simplify(Bin("min", r1, first + band))
        epi = along(simplify(first * g.ow), simplify((last - first) * g.ow))
        per_tile = For(oct, Const(0), Const(p.n_oct), (Alloc(acc, (*rows(first, last, lambda t: t), epi)),))
        nest = (For(ob, Const(0), simplify((r1 - r0 + (band - 1)) // band), (per_tile,)),)
    elif order == "rows":
        nest = rows(r0, r1, lambda t: (For(oct, Const(0), Const(p.n_oct), (Alloc(acc, (*t, epilogue)),)),))
    elif order == "oc":
        nest = (For(oct, o0, o1, rows(Const(0), Const(g.oh), lambda t: (Alloc(acc, (*t, epilogue)),))),)
    elif order == "plane":
        nest = (For(oct, o0, o1, (Alloc(acc, (*rows(Const(0), Const(g.oh), lambda t: t), epilogue)),)),)
    elif order == "chunks":  # the first chunk of input blocks stored, the later ones added, then the epilogue
        first, later = passes(lambda t: t)
        nest = (For(oct, o0, o1, (Alloc(acc, (*first, later, epilogue)),)),)
    else:  # "sweep": per chunk of input blocks, every channel tile (the thread's) into its plane in the workspace
        o0, o1 = share(tv2, p.n_oct, T)
        first, later = passes(lambda t: (For(oct, o0, o1, t),))
        nest = (*first, later, For(oct, o0, o1, (along(Const(0), Const(span), plane=True),)))
    phase2: Stmt = For(b, Const(0), Const(p.batch), nest)
    if T > 1 and order in ("rows", "sweep"):  # (each thread its rows or ("sweep") its channel tiles)
        phase2 = For(t2, Const(0), Const(T), (phase2,), "parallel")
    elif T > 1:  # the channel tiles' loop parallelized, the threads outside the images
        phase2 = reorder(parallelize((phase2,), oct.name, T, t2.name), [t2.name, b.name])[0]
    params = (x, wp, c, *((scale,) if scale is not None else ()))
    if phase1 is None and not sweep:  # read in place (NCHW, in channel blocks): no repacking, no workspace
        return Func(name, params, (phase2,))
    return Func(name, params, (Alloc(ws, (phase1, phase2) if phase1 is not None else (phase2,)),), (ws,))


