"""The schedule of a depthwise convolution (one input channel per output channel) for one target.

What goes in: the convolution's geometry (``schedule.gemm.ConvGeometry``; ``ci`` = channels), the batch
and the thread count. What comes out: the loop IR (``dw_func``): threads over channel ranges; per image,
channel, the plane micro-kernel ``dwplane_...`` (``lower.micro.dwconv_micro``: per output row, the kernel
rows inside the plane, the interior columns one vectorizable loop of kw FMAs at constant offsets, the edges
tested tap by tap), then the fused epilogue over the plane while it is in L1/L2.
"""

from __future__ import annotations

from collections.abc import Callable

from dlcc.lower.lir import Buf, Const, Epilogue, Expr, For, Func, Load, Micro, Ptr, Stmt, Var
from dlcc.lower.micro import dwconv_micro
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.loops import share

__all__ = ["DW_PAR_MIN_OUTPUTS", "dw_func", "dw_threads"]

DW_PAR_MIN_OUTPUTS = 1 << 15  # fewer outputs than this: one thread (a dispatch costs more than it saves)


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
    tv: Expr = t if T > 1 else Const(0)
    c0, c1 = share(tv, C, T)
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
    body: tuple[Stmt, ...] = (For(b, Const(0), Const(batch), (For(ch, c0, c1, plane),)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (x, wt, c), body)
