"""The schedule of a pointwise convolution fused into the depthwise convolution that reads it (MobileNet's and
EfficientNet's expand -> depthwise pair): the expanded tensor, the largest of the block (MobileNetV2's 96 x 112 x
112, 4.8 MB), never goes to memory.

What goes in: the depthwise convolution's geometry (``ConvGeometry``; ``ci`` = its channels = the pointwise
convolution's outputs), the pointwise convolution's input channels ``k``, the batch, the ``Target`` and the
thread count. What comes out: a ``PwDwPlan`` (its workspace is declared before memory planning) and its loop IR
(``pwdw_func``).

Per thread (threads split the output rows, or the channel blocks when the threads divide them), per image, per
band of output rows, per channel block of ``cbi`` channels (the target's vector):
1. the input rows the band's taps read that the previous band did not (the rows both read are moved from the
   end of the block's buffer to its start) are computed into the block's buffer in the depthwise kernel's
   channel-blocked layout (each pixel's ``cbi`` channels one vector, a zero ring around the plane): per row,
   register tiles of ``mr`` pixels x one vector of channels (``gemmc_``: the NCHW input read in place, each
   pixel's value broadcast; the weight packed at compile time as [block][k][cbi]), then the pointwise
   convolution's fused epilogue (bias, activation) on the row in place (``Epilogue`` with a destination);
2. the depthwise register tiles (``dwc_``, as ``schedule.dwconv``) over the band's rows of the block, transposed
   into a local channel-major band, then the depthwise convolution's fused epilogue along it.
The band is the most rows whose blocks' buffers stay in half of L2 (the rows of one band are read back by the
depthwise tiles while they are in cache, and the input rows of the band are read from cache by every block).
Planes whose rows are narrower than the register tile (7 x 7: a 7-pixel tile, twice the loads per FMA of the
unfused GEMM's, lost 0.18 -> 0.24 ms on EfficientNet-B0's 192 -> 1152 channels, Zen 5, 1 thread) take the flat
form: one band, the 1x1 convolution along the whole plane (its input's rows contiguous) with pixel tiles outside
and the thread's groups inside (a tile's inputs stay in L1 while the weight panels stream past, as in the
unfused GEMM) into a per-thread scratch, then per group its epilogue moves the results into the buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from dlcc.errors import TemplateError
from dlcc.lower.kir import Program, Step
from dlcc.lower.lir import (
    Alloc,
    Bin,
    Buf,
    Const,
    Epilogue,
    Expr,
    For,
    Func,
    If,
    Load,
    Micro,
    Ptr,
    Stmt,
    Store,
    Var,
    simplify,
)
from dlcc.lower.micro import gemmq_micro
from dlcc.schedule.dwconv import PLANE_BYTES, dw_threads, dwc_rows, padded_extent
from dlcc.schedule.gemm import ConvGeometry, register_tile, tile_rows
from dlcc.schedule.loops import PAR_MIN_FLOPS_WS, share
from dlcc.schedule.pads import conv_pads, node_attr
from dlcc.schedule.target import Target

__all__ = ["PwDwPlan", "depthwise_geometry", "fuse_pointwise_depthwise", "fused_plan", "pack_bias", "pack_pw",
           "pair_pays", "plan_pwdw", "pointwise_input", "pool_geometry", "pwdw_func", "window_geometry"]


@dataclass(frozen=True)
class PwDwPlan:
    g: ConvGeometry  # the depthwise convolution (g.ci: its channels, the pointwise convolution's outputs)
    k: int  # the pointwise convolution's input channels
    batch: int
    cbi: int  # channels per block: the target's vector width
    px: int  # depthwise output pixels per register tile
    mr: int  # pointwise pixels per register tile
    nv: int  # channel blocks per pointwise register tile (a group of blocks)
    band: int  # output rows per band
    threads: int
    by_rows: bool  # threads split the output rows (else the groups of channel blocks)
    flat: bool = False  # rows narrower than the register tile: the 1x1 convolution runs along the whole plane
    # (its input's rows contiguous) into a scratch per group, its epilogue moving the results into the buffers

    @property
    def ncb(self) -> int:
        return -(-self.g.ci // self.cbi)

    @property
    def groups(self) -> int:
        return -(-self.ncb // self.nv)

    @property
    def taps_h(self) -> int:
        """Input rows one output row's taps span."""
        return (self.g.kh - 1) * self.g.dh + 1

    @property
    def hb(self) -> int:
        """Rows of a block's buffer: the input rows one band's taps span."""
        return (self.band - 1) * self.g.sh + self.taps_h

    @property
    def wp(self) -> int:
        """Columns of a block's buffer (the zero ring included: every tap of every output inside)."""
        g = self.g
        return (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1

    @property
    def carry(self) -> int:
        """Input rows two consecutive bands both read."""
        return max(0, self.taps_h - self.g.sh)

    @property
    def one_band(self) -> bool:
        """Each thread's rows are one band: nothing is carried, one group's buffers serve every group in turn."""
        return self.band >= (-(-self.g.oh // self.threads) if self.by_rows else self.g.oh)

    @property
    def blocks_per_thread(self) -> int:
        """Block buffers each thread keeps: every block it runs (rows are carried from band to band), or one group."""
        if self.one_band:
            return self.nv
        return self.ncb if self.by_rows else -(-self.groups // self.threads) * self.nv

    @property
    def scratch_floats(self) -> int:
        """Per thread, the flat form's 1x1 results before their epilogue: every block the thread runs x the plane."""
        return -(-self.groups // self.threads) * self.nv * self.g.h * self.g.w * self.cbi if self.flat else 0

    @property
    def workspace_floats(self) -> int:
        return self.threads * (self.blocks_per_thread * self.hb * self.wp * self.cbi + self.scratch_floats)


ROW_FILL_MIN = 0.8  # on 16-register targets, the fused pair only where its row tiles fill at least this much


def pair_pays(plan: PwDwPlan, target: Target) -> bool:
    """Is the fused pair of this plan worth running? Not on 16-register targets where the row tiles of its 1x1
    convolution leave much of the last tile empty (``ROW_FILL_MIN``: AVX2's 5-pixel tiles on 7-pixel rows, 5 + 2),
    the loss plan_pwdw's flat form avoids on AVX-512; the unfused GEMM runs along the plane."""
    if plan.flat or target.vector_registers >= 32:
        return True
    w = plan.g.w
    return w / (-(-w // plan.mr) * plan.mr) >= ROW_FILL_MIN


def plan_pwdw(g: ConvGeometry, k: int, batch: int, target: Target, threads: int = 1,
              rows_contiguous: bool = True) -> PwDwPlan | None:
    """The fused plan, or None where it does not apply: one channel per vector (scalar targets), or input rows
    narrower than the GEMM's register tile whose input rows are not contiguous or whose plane is not one band
    (the flat form's condition: row tiles of 7 pixels, twice the loads per FMA of the unfused GEMM's, lost more
    than the fusion saved: EfficientNet-B0's 192 -> 1152 channels at 7 x 7, 0.185 -> 0.238 ms, Zen 5, 1 thread)."""
    cbi = target.lanes
    nr, mr_max = register_tile(target)  # (the GEMM's register tile: nr / cbi blocks of channels x mr pixels)
    if cbi < 4 or g.ci < 1 or k < 1:
        return None
    flat = g.w < mr_max
    if flat and not rows_contiguous:
        return None
    px = max(1, min(14, g.ow, target.vector_registers - 4))
    nv = nr // cbi
    mr = tile_rows(g.h * g.w if flat else g.w, mr_max)
    ncb = -(-g.ci // cbi)
    groups = -(-ncb // nv)
    # threads: split the groups of blocks (the busiest thread may run one group more), or the output rows (each
    # thread's first band also computes the input rows its neighbour's last band reads): whichever gives the
    # busiest thread the fewer rows of the 1x1 convolution (EfficientNet-B0's 42 blocks of 672 channels at 14 x
    # 14 with 5 x 5 taps: 11 of 21 groups, not 7 + 4 of 14 rows)
    t = threads if threads > 1 and (2.0 * batch * k * g.ci * g.h * g.w >= PAR_MIN_FLOPS_WS
                                    or dw_threads(g, batch, threads) > 1) else 1
    taps_h = (g.kh - 1) * g.dh + 1
    by_rows = False
    if t > 1:
        rows_t = -(-g.oh // t) * g.sh
        by_rows = (rows_t + max(0, taps_h - g.sh)) / rows_t < -(-groups // t) * t / groups and g.oh >= 2 * t
        by_rows = by_rows and not flat  # (the flat form runs over whole planes)
        if not by_rows and groups < t:
            t = 1
    rows = -(-g.oh // t) if by_rows else g.oh
    nbt = ncb if by_rows or t == 1 else -(-groups // t) * nv
    wp = padded_extent(g)[1]
    one = 4 * nv * ((rows - 1) * g.sh + taps_h) * wp * cbi <= target.l2_bytes // 2
    if one and 4 * cbi * rows * g.ow <= PLANE_BYTES:
        return PwDwPlan(g, k, batch, cbi, px, mr, nv, rows, t, by_rows, flat)  # one band: one group's buffers
    if flat:
        return None
    least = max(1, -(-max(0, taps_h - g.sh) // g.sh))  # the carried rows never overlap their new place
    best = least
    for band in range(least, rows + 1):
        hb = (band - 1) * g.sh + taps_h
        if band > least and (4 * nbt * hb * wp * cbi > target.l2_bytes // 2 or 4 * cbi * band * g.ow > PLANE_BYTES):
            break
        best = band
    nb = -(-rows // best)
    band = max(least, -(-rows // nb))
    return PwDwPlan(g, k, batch, cbi, px, mr, nv, band, t, by_rows)


def pack_pw(w: np.ndarray, p: PwDwPlan) -> np.ndarray:
    """The pointwise weight (C, K) as one panel per group of blocks, [k][c < the group's channels] (the last group
    may hold fewer blocks), zero beyond the last channel: flat, group ``q``'s panel at q * K * nv * cbi."""
    c, k = w.shape
    wz = np.zeros((p.ncb * p.cbi, k), np.float32)
    wz[:c] = w
    step = p.nv * p.cbi
    return np.concatenate([np.ascontiguousarray(wz[q:q + step].T).reshape(-1) for q in range(0, p.ncb * p.cbi, step)])


def _all(*conds: Expr) -> Expr:
    out = conds[0]
    for c in conds[1:]:
        out = Bin("*", out, c)
    return out


def pwdw_func(p: PwDwPlan, x: Buf, wpw: Buf, wdw: Buf, c: Buf, ws: Buf, producer_epilogue: bool, epilogue: bool,
              name: str = "pwdw", fresh: Callable[[str], str] = str, post: tuple[Buf, str] | None = None,
              channels_last: bool = False, dest_block: bool = False) -> Func:
    """The loop IR of ``c[b, ch, oy*OW + ox] = sum_taps Wdw[ch, tap] * e(sum_k Wpw[ch, k] * x[b, k, iy, ix])``
    following ``p`` (module docstring): ``x`` (N, K, H, W) with unit column stride (flat plans: (N, K, H*W) with
    unit pixel stride), ``wpw`` packed by ``pack_pw``
    (1-D), ``wdw`` by ``schedule.dwconv.pack_dwc``, ``c`` (N, C, OH*OW) with unit pixel stride, ``ws`` the
    workspace. ``e``: the pointwise convolution's epilogue (``Epilogue`` with a destination over each computed
    row, index (b, ch, iy, ix)) when ``producer_epilogue``, else none. Without ``epilogue`` the local tiles are
    copied into ``c``. ``post`` (bias, tag): instead of the producer's epilogue, the 1x1 tiles add the bias (packed
    by ``pack_bias``) and apply ``tag`` (``lower.micro.post_tag``) in registers (``gemmqe_``); not for flat plans.
    ``channels_last``: ``c``'s channels are contiguous; the depthwise tiles are stored pixel-major (``dwcp_``) and
    the epilogue (which must be on) runs per pixel along the block's channels; ``dest_block`` with it: its index is
    (image, block, channel in it, pixel), for a destination in channel blocks of ``cbi`` (``schedule.blocked``)."""
    if dest_block and not channels_last:
        raise ValueError("pwdw: a destination in channel blocks is stored pixel-major")
    g, T, cbi, nv = p.g, p.threads, p.cbi, p.nv
    if post is not None and (p.flat or producer_epilogue):
        raise ValueError("pwdw: an in-register epilogue replaces the producer's, and not in the flat form")
    t, b, ob, cg, jb, lr, xt, xx, ln, zq = (Var(fresh(v)) for v in (
        "t", "b", "ob", "cg", "jb", "lr", "xt", "xx", "l", "z"))
    tv: Expr = t if T > 1 else Const(0)
    row = p.wp * cbi  # floats per buffer row
    blk_floats = p.hb * row
    r_lo, r_hi = share(tv, g.oh, T) if p.by_rows else (Const(0), Const(g.oh))
    g0, g1 = share(tv, p.groups, T) if not p.by_rows else (Const(0), Const(p.groups))
    cb = simplify(cg * nv + jb)  # the block
    tbase = simplify(tv * (p.blocks_per_thread * blk_floats + p.scratch_floats))  # (the flat form's scratch last)
    if p.one_band:  # one group's buffers, reused by the next group
        base, gbase = simplify(tbase + jb * blk_floats), tbase
    else:
        base = simplify(tbase + (cb - g0 * nv) * blk_floats)  # its buffer
        gbase = simplify(tbase + (cg - g0) * (nv * blk_floats))  # the group's first block's buffer
    oy0 = simplify(r_lo + ob * p.band)
    oy1 = simplify(Bin("min", r_hi, oy0 + p.band))
    nblk = simplify(Bin("min", Const(nv), Const(p.ncb) - cg * nv)) if p.ncb % nv else Const(nv)
    nci = simplify(Bin("min", Const(cbi), Const(g.ci) - cb * cbi)) if g.ci % cbi else Const(cbi)
    xc = x.layout.dims[1][3]
    last_nv = p.ncb - (p.groups - 1) * nv  # blocks in the last group

    # 1. per block of the group: the rows of its buffer this band reads that the previous band did not
    carry: tuple[Stmt, ...] = ()
    if p.carry and not p.one_band:
        src = simplify(base + p.band * g.sh * row)
        carry = (If(Bin("<", Const(0), ob), (For(jb, Const(0), nblk, (For(zq, Const(0), Const(p.carry * row), (
            Store(ws, (simplify(base + zq),), Load(ws, (simplify(src + zq),))),), "vectorized"),)),)),)
    first = simplify(Bin("min", ob, Const(1)) * p.carry) if p.carry and not p.one_band else Const(0)
    nrows = simplify((oy1 - 1) * g.sh + p.taps_h - oy0 * g.sh)
    iy = simplify(oy0 * g.sh + lr - g.ph)
    rb = simplify(base + lr * row)  # (block jb's row)
    wc = max(0, min(g.w, p.wp - g.pw))  # input columns the buffer holds

    def zero(lo: int, hi: int) -> tuple[Stmt, ...]:
        if hi <= lo:
            return ()
        return (For(jb, Const(0), nblk, (For(zq, Const(lo), Const(hi), (
            Store(ws, (simplify(rb + zq),), Const(0.0, "float32")),), "vectorized"),)),)

    def pw_tile(x0: Expr, mr: int) -> Stmt:
        def call(blocks: int) -> Stmt:
            args = (Const(p.k), Ptr(x, (b, Const(0), iy, x0)), Ptr(wpw, (simplify(cg * (p.k * nv * cbi)),)),
                    Ptr(ws, (simplify(gbase + lr * row + (x0 + g.pw) * cbi),)), Const(cbi), Const(blk_floats))
            if post is not None:
                return Micro(gemmq_micro(mr, blocks * cbi, xc, cbi, post[1]),
                             (*args, Ptr(post[0], (simplify(cg * (nv * cbi)),))))
            return Micro(gemmq_micro(mr, blocks * cbi, xc, cbi), args)
        if last_nv == nv:
            return call(nv)
        return If(Bin("<", cg, Const(p.groups - 1)), (call(nv),), (call(last_nv),))

    nfull, tail = divmod(wc, p.mr)
    inside: tuple[Stmt, ...] = zero(0, g.pw * cbi) + zero((g.pw + wc) * cbi, row)
    if nfull:
        inside += (For(xt, Const(0), Const(nfull), (pw_tile(simplify(xt * p.mr), p.mr),)),)
    if tail:
        inside += (pw_tile(Const(nfull * p.mr), tail),)
    if producer_epilogue:
        at = Load(ws, (simplify(rb + (xx + g.pw) * cbi + ln),))
        inside += (For(jb, Const(0), nblk, (For(xx, Const(0), Const(wc), (For(ln, Const(0), nci, (
            Epilogue((b, simplify(cb * cbi + ln), iy, xx), at, at),), "vectorized"),)),)),)
    fill: tuple[Stmt, ...] = (For(lr, first, nrows, (If(_all(Bin("<=", Const(0), iy), Bin("<", iy, Const(g.h))),
                                                         inside, zero(0, row)),)),)
    pre: tuple[Stmt, ...] = ()
    if p.flat:
        # the 1x1 convolution along the whole plane, pixel tiles outside and the thread's groups inside (each tile's
        # inputs stay in L1 while the weight panels stream past, as in the unfused GEMM), into the scratch; then
        # per group, the ring as above and its epilogue moving the results into the blocks' buffers
        hw = g.h * g.w
        sb = simplify(tbase + p.blocks_per_thread * blk_floats)
        cq = Var(fresh("cq"))

        def flat_tile(q0: Expr, mr: int) -> Stmt:
            def call(blocks: int) -> Stmt:
                return Micro(gemmq_micro(mr, blocks * cbi, xc, cbi), (
                    Const(p.k), Ptr(x, (b, Const(0), q0)), Ptr(wpw, (simplify(cq * (p.k * nv * cbi)),)),
                    Ptr(ws, (simplify(sb + (cq - g0) * (nv * hw * cbi) + q0 * cbi),)), Const(cbi), Const(hw * cbi)))
            body = call(nv) if last_nv == nv else If(Bin("<", cq, Const(p.groups - 1)), (call(nv),), (call(last_nv),))
            return For(cq, g0, g1, (body,))

        nfull, tail = divmod(hw, p.mr)
        if nfull:
            pre += (For(xt, Const(0), Const(nfull), (flat_tile(simplify(xt * p.mr), p.mr),)),)
        if tail:
            pre += (flat_tile(Const(nfull * p.mr), tail),)
        ring = zero(0, g.pw * cbi) + zero((g.pw + wc) * cbi, row)
        fill = (For(lr, Const(0), nrows, (If(_all(Bin("<=", Const(0), iy), Bin("<", iy, Const(g.h))), ring,
                                             zero(0, row)),)),)
        yv = Var(fresh("y"))
        src = Load(ws, (simplify(sb + (cb - g0 * nv) * (hw * cbi) + (yv * g.w + xx) * cbi + ln),))
        to = Load(ws, (simplify(base + (yv + g.ph) * row + (xx + g.pw) * cbi + ln),))
        fill += (For(jb, Const(0), nblk, (For(yv, Const(0), Const(min(g.h, p.hb - g.ph)), (
            For(xx, Const(0), Const(wc), (For(ln, Const(0), nci, (
                Epilogue((b, simplify(cb * cbi + ln), yv, xx), src, to),), "vectorized"),)),)),)),)

    # 2. per block of the group: the depthwise tiles over the band's rows, then its epilogue along the band
    def at(oy: Expr, x0: Expr) -> Expr:
        return simplify(base + (oy - oy0) * (g.sh * row) + x0 * (g.sw * cbi))

    dws = For(jb, Const(0), nblk, (dwc_rows(g, cbi, p.px, row, p.band, ws, at, Ptr(wdw, (cb, Const(0))), c, b,
                                            cb * cbi, oy0, oy1, nci, epilogue, fresh, pixel_major=channels_last,
                                            block=cb if dest_block else None),))
    bands = simplify((r_hi - r_lo + (p.band - 1)) // p.band)
    band_body = (*pre, For(cg, g0, g1, (*carry, *fill, dws)))
    body: tuple[Stmt, ...] = (For(b, Const(0), Const(p.batch), (For(ob, Const(0), bands, band_body),)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (x, wpw, wdw, c, *((post[0],) if post is not None else ())), (Alloc(ws, body),), (ws,))


def pack_bias(bias: np.ndarray, p: PwDwPlan) -> np.ndarray:
    """The 1x1 convolution's bias for ``gemmqe_`` tiles: one value per channel of every block, zero past the
    channels (group ``q``'s at q * nv * cbi)."""
    out = np.zeros(p.ncb * p.cbi, np.float32)
    out[:bias.size] = bias.reshape(-1)
    return out


# ------------------------------------------------------------------------------------------- kernel merging
def _dims(v: ir.Value | None) -> tuple[int, ...] | None:
    if v is None or v.shape is None or v.dtype != ir.DataType.FLOAT:
        return None
    if not all(isinstance(d, int) for d in v.shape):
        return None
    return tuple(int(d) for d in v.shape)


def pointwise_input(p: Program, node: ir.Node) -> tuple[int, int] | None:
    """(input channels, output channels) of a 2-D Conv the fused kernel can take as its producer: 1x1, stride 1,
    unpadded, ungrouped, a weight and an optional constant bias, float32."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    xs, ws = _dims(node.inputs[0]), _dims(node.inputs[1])
    if xs is None or ws is None or len(xs) != 4 or len(ws) != 4 or ws[2:] != (1, 1):
        return None
    if not p.is_constant(node.inputs[1]):
        return None
    if len(node.inputs) > 2 and node.inputs[2] is not None and not p.is_constant(node.inputs[2]):
        return None
    attr = node_attr(node)
    if int(attr("group", 1)) != 1 or any(int(s) != 1 for s in attr("strides", [1, 1])):
        return None
    if any(int(v) for v in attr("pads", [0] * 4)) or attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID", b"NOTSET",
                                                                                         b"VALID"):
        return None
    return xs[1], ws[0]


def depthwise_geometry(p: Program, node: ir.Node) -> tuple[ConvGeometry, int] | None:
    """(geometry, batch) of a 2-D depthwise Conv with a constant weight (one channel per group), else None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    xs, ws, ys = _dims(node.inputs[0]), _dims(node.inputs[1]), _dims(node.outputs[0])
    if xs is None or ws is None or ys is None or len(xs) != 4 or len(ws) != 4 or len(ys) != 4:
        return None
    c = xs[1]
    if not (int(node_attr(node)("group", 1)) == c == ws[0] == ys[1] and c > 1 and ws[1] == 1) \
            or not p.is_constant(node.inputs[1]):
        return None
    if len(node.inputs) > 2 and node.inputs[2] is not None and not p.is_constant(node.inputs[2]):
        return None
    return window_geometry(node, (ws[2], ws[3]))


def pool_geometry(node: ir.Node) -> tuple[ConvGeometry, int] | None:
    """(geometry, batch) of a 2-D MaxPool or AveragePool as the depthwise convolution its channel-blocked kernel
    runs (``schedule.dwconv``), else None."""
    if node.op_type not in ("MaxPool", "AveragePool") or node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    return window_geometry(node)


def window_geometry(node: ir.Node, kernel: tuple[int, int] | None = None) -> tuple[ConvGeometry, int] | None:
    """(geometry, batch) of a 2-D window over (N, C, H, W): a depthwise convolution's (``kernel``: its weight's kh,
    kw) or a pool's (``kernel`` None: its kernel_shape), from the input and output shapes, strides, dilations and
    padding; None where they are not known or not consistent."""
    xs, ys = (None if v is None or v.shape is None or not all(isinstance(d, int) for d in v.shape)
              else tuple(int(d) for d in v.shape) for v in (node.inputs[0], node.outputs[0]))
    attr = node_attr(node)
    if kernel is None:
        ks = attr("kernel_shape", None)
        if ks is None or len(ks) != 2:
            return None
        kernel = (int(ks[0]), int(ks[1]))
    if xs is None or ys is None or len(xs) != 4 or len(ys) != 4 or min(*xs, *ys, *kernel) < 1:
        return None
    (sh, sw), (dh, dw) = (tuple(int(v) for v in attr(a, [1, 1])) for a in ("strides", "dilations"))
    try:
        pb, _ = conv_pads(attr, node.op_type, xs[2:], ys[2:], list(kernel), [sh, sw], [dh, dw])
    except TemplateError:
        return None
    return ConvGeometry(xs[1], xs[2], xs[3], ys[2], ys[3], *kernel, sh, sw, dh, dw, pb[0], pb[1]), xs[0]


def fused_plan(p: Program, step: Step, target: Target, threads: int) -> PwDwPlan | None:
    """The plan of a fused step (``Step.producer`` set), None for any other step."""
    if step.producer is None or step.anchor is None or step.producer.anchor is None:
        return None
    return _pair_plan(p, step.producer.anchor, step.anchor, target, threads)


def _pair_plan(p: Program, pw: ir.Node, dw: ir.Node, target: Target, threads: int) -> PwDwPlan | None:
    """The plan of the 1x1 Conv ``pw`` fused into the depthwise Conv ``dw``, None where the pair cannot fuse."""
    geo, dims, x = depthwise_geometry(p, dw), pointwise_input(p, pw), pw.inputs[0]
    if geo is None or dims is None or x not in p.value_buffer:
        return None
    strides = p.window(p.value_buffer[x])[2]
    plan = plan_pwdw(geo[0], dims[0], geo[1], target, threads, strides[2] == geo[0].w)
    return plan if plan is not None and pair_pays(plan, target) else None


def fuse_pointwise_depthwise(p: Program, target: Target, threads: int) -> int:
    """Merge each kernel that is one 1x1 Conv (with its elementwise epilogue) into the kernel of the depthwise
    Conv that alone reads its result (module docstring): the merged kernel's step computes both, with the
    producer's step as ``Step.producer``, and the intermediate tensor's buffer is gone. Returns the merges."""
    if target.lanes < 4:
        return 0
    readers: dict[int, list[int]] = {}
    for i, k in enumerate(p.kernels):
        for bid in k.reads:
            readers.setdefault(p.root(bid).id, []).append(i)
    viewed = {b.base for b in p.buffers.values() if b.kind == "view"}
    producer_of = {bid: i for i, k in enumerate(p.kernels) for bid in k.writes}
    drop: set[int] = set()
    for j, k2 in enumerate(p.kernels):
        if len(k2.steps) != 1 or k2.steps[0].kind != "template" or k2.steps[0].scratch is not None:
            continue
        s2 = k2.steps[0]
        if s2.producer is not None or s2.anchor is None:
            continue
        v = s2.anchor.inputs[0]
        bid = p.value_buffer.get(v)
        if bid is None or bid not in producer_of or bid in viewed or p.buffers[bid].kind != "temp":
            continue
        i = producer_of[bid]
        k1 = p.kernels[i]
        if i in drop or len(k1.steps) != 1 or k1.writes != [bid] or set(readers.get(bid, ())) != {j}:
            continue
        s1 = k1.steps[0]
        if s1.kind != "template" or s1.scratch is not None or s1.producer is not None or s1.anchor is None:
            continue
        if s1.outputs != [v] or p.buffers[bid].shape != _dims(v):
            continue
        if any(v in n.inputs for n in k2.nodes if n is not s2.anchor) or \
                _pair_plan(p, s1.anchor, s2.anchor, target, threads) is None:
            continue
        s2.producer = s1
        p.merge_into(k1, k2, v)
        drop.add(i)
    p.remove_kernels(drop)
    return len(drop)
