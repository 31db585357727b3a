"""Micro-kernel contracts of the loop-level kernel IR: what each named micro-kernel computes, the elements
it touches (for the verifier) and a numpy reference (for the interpreter). Their C bodies, per target, are
in ``dlcc.codegen.ukernels``; a test runs each body against its reference.

    gemm_{mr}x{nr}(kc, a, b, c, ldc, acc, ncols)
        c[r*ldc + j] = (acc ? c[r*ldc + j] : 0) + sum_{k < kc} a[k*mr + r] * b[k*nr + j]
        for r < mr, j < ncols (<= nr). ``a`` is a packed A micro-panel (kc x mr, k-major), ``b`` a packed
        B micro-panel (kc x nr, k-major; columns at or beyond ncols are never stored).

    gemm_{mr}x{nr}_f{step}x{lines}(kc, a, b, c, ldc, acc, ncols, pf), gemmr_..._f{step}x{lines}(...),
    gemmt_..._f{step}x{lines}(...)
        the same, and every step-th k < step*lines prefetches one 64-byte line of pf (pf + 16*(k/step)).

    gemmt_{mr}x{nr}(kc, a, b, c, ldc, acc, ncols)
        the same product stored transposed: c[j*ldc + r] for j < ncols, r < mr (a convolution computed with
        pixels as rows and output channels as columns, stored channel-major).

    dconv[a]_{no}x{px}_{cbi}_{kh}_{kw}_{sw}_{dh}_{dw}_{xcb}_{xrow}_{wskip}[_{kwf}](ncb, x, w, c, ldc)
        one register tile of a direct convolution over a channel-blocked input (``nchwc_``'s layout):
        c[o*ldc + p] = sum_{b < ncb, ky, kx, i < cbi} w[b*(kh*kwf*cbi*no + wskip) + ((ky*kwf + kx)*cbi + i)*no + o]
                                                    * x[b*xcb + ky*dh*xrow + (p*sw + kx*dw)*cbi + i]
        for o < no, p < px: ``no`` output channels (whole vectors) by ``px`` output pixels of a row, stored
        channel-major (each channel's pixels contiguous, as the output plane holds them; kwf, the packed kernel
        width, is kw unless the tile reads only kw of the kernel columns; dconva_: c[o*ldc + p] += instead, for the
        later blocks of input channels of a convolution whose weights are split in chunks); the elements
        c[o*ldc + p] for px <= p < px + 16 may be overwritten (the tile is stored as whole vectors), so
        ldc >= px + 16. ``wskip``: weights after each channel block's kh kernel rows that are not read (the
        kernel rows of a convolution that no output row of this tile reaches inside the input).
        ..._q{ow}_{rowstep}(ncb, x, w, c, ldc, q0): the tile's pixels are q0 + p of a plane ``ow`` wide taken as one
        row (crossing output rows): (p*sw + kx*dw)*cbi above becomes ((q0 + p)/ow)*rowstep + ((q0 + p)%ow)*sw*cbi
        + kx*dw*cbi.

    dwc_{cbi}_{px}_{kh}_{kw}_{sw}_{dh}_{dw}_{xrow}(x, w, c, ldc)
        one register tile of a depthwise convolution over a channel block of ``cbi`` channels (the vector width,
        in ``nchwc_``'s layout), every channel its own: c[o*ldc + p] = sum_{ky, kx} w[(ky*kw + kx)*cbi + o]
        * x[ky*dh*xrow + (p*sw + kx*dw)*cbi + o] for o < cbi, p < px; one vector FMA per tap and pixel; the
        elements c[o*ldc + p] for px <= p < px + 16 may be overwritten (stored as whole vectors), so
        ldc >= px + 16.

    nchwc_{cbi}_{h}_{w}_{ph}_{pw}_{hp}_{wp}(x, xc, xh, nci, y0, rows, ws)
        one channel block of an image repacked with a zero ring: ws[(yy*wp + xx)*cbi + i] =
        x[i*xc + (yy - ph)*xh + xx - pw] where 0 <= yy - ph < h, 0 <= xx - pw < w and i < nci, else 0,
        for yy < hp, xx < wp, i < cbi (rows and columns of the plane beyond hp x wp are not read).
        ..._s(x, sc, xc, xh, nci, y0, rows, ws): the same, channel i times sc[i] (a per-channel scale).

    gemmr_{mr}x{nr}_{lda}(kc, a, b, c, ldc, acc, ncols)
        as gemm_, with A read in place, row-major: a[r*lda + k] (the Winograd convolution's transformed input,
        one tile per row; a product's A where packing it would cost more than it saves).

    gemmq_{mr}x{nr}_{lda}_v{lanes}(kc, a, b, c, ldc, ldq)
        c[(j/lanes)*ldq + r*ldc + j%lanes] = sum_k a[k*lda + r] * b[k*nr + j] for r < mr, j < nr: A read in place
        with k at stride lda (a 1x1 convolution's NCHW input, pixels as rows), each vector of columns stored into
        its own channel block (the fused 1x1 -> depthwise pair, ``schedule.pwdw``).

    wgi_{cbi}_{xrow}_{ldv}(x, v)
        the Winograd F(4x4, 3x3) input transform of one 6x6 input tile of a block of cbi channels in
        ``nchwc_``'s layout: v[(r*6 + s)*ldv + i] = (B^T d B)[r, s] with d[y, z] = x[y*xrow + z*cbi + i], i < cbi
        (``WINO_BT``).

    wgo_{cbi}_{ldm}_{rp}(m, c, ldc)
        the Winograd F(4x4, 3x3) output transform of one tile for cbi channels: with M[r, s] = m[(r*6 + s)*ldm + o],
        c[o*ldc + y*rp + z] = (A^T M A)[y, z] for o < cbi, y, z < 4 (``WINO_AT``).

    wgop_{cbi}_{ldm}_{rp}(m, c, ldc)
        the same, each output pixel's channels together: c[(y*rp + z)*ldc + o] = (A^T M A)[y, z].

    attn_{sq}_{sk}_{d}_{qs}_{qd}_{ks}_{kd}_{vs}_{vd}_{os}_{od}_{mk}_{ms}_{mj}_{causal}_{scale}_{fill}_{qb}_{nv}
        (q, k, v, [m,] o, ws): one head of scaled dot-product attention (``AttnSpec``):
        s[i, j] = scale * sum_{e < d} q[i*qs + e*qd] * k[j*ks + e*kd], then s[i, j] = fill where causal and
        j > i + sk - sq, then s[i, j] += m[i*ms + j*mj] when mk; p = softmax over j < sk of s;
        o[i*os + e*od] = sum_j p[i, j] * v[j*vs + e*vd] for i < sq, e < d. scale and fill are the hex bits of
        float32 values; qb x nv is the register tile (query rows x key or feature vectors). ws holds
        ``AttnSpec.ws_floats(lanes)`` floats (K transposed and V, padded to whole vectors, and qb rows of
        probabilities); no sq x sk buffer exists.
"""

from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

import numpy as np

from dlcc.lower.lir import MICRO, MicroKernel

__all__ = ["ATTN_WS_LANES", "DCONV_PAD", "WINO_AT", "WINO_BT", "WINO_G", "AttnSpec", "attn_micro", "attn_reference",
           "apply_post", "dconv_micro", "dwc_micro", "dwconv_micro", "gemm_micro", "gemmb_micro", "gemmq_micro",
           "gemmr_micro", "gemmt_micro", "im2col_micro", "nchwc_micro", "post_tag", "wgi_micro", "wgo_micro"]


def gemm_micro(mr: int, nr: int, prefetch: tuple[int, int] | None = None) -> str:
    """The name of the mr x nr GEMM micro-kernel, registering its contract on first use. ``prefetch`` (step,
    lines): see ``_gemm_contract``."""
    return _gemm_contract(mr, nr, transposed=False, prefetch=prefetch)


def gemmt_micro(mr: int, nr: int, prefetch: tuple[int, int] | None = None) -> str:
    """The mr x nr GEMM micro-kernel that stores its tile transposed, registering its contract. ``prefetch``:
    see ``_gemm_contract``."""
    return _gemm_contract(mr, nr, transposed=True, prefetch=prefetch)


def gemmb_micro(mr: int, nr: int, ldb: int) -> str:
    """The name of the mr x nr GEMM tile over a packed A micro-panel reading B in place: its kc rows ``ldb`` apart,
    nr columns of each contiguous (a 1x1 convolution's NCHW input: a channel's pixels along a row), registering
    its contract."""
    return _gemm_contract(mr, nr, transposed=False, ldb=ldb)


def _gemm_contract(mr: int, nr: int, transposed: bool, lda: int | None = None,
                   prefetch: tuple[int, int] | None = None, ldb: int | None = None) -> str:
    """``prefetch`` (step, lines; name ending ``_f{step}x{lines}``, one more parameter ``pf``): every ``step``-th k
    prefetches the next of ``lines`` 64-byte lines from ``pf`` on (k < step*lines), which no value depends on (the
    B block the GEMM reads next, a few lines per call while this one computes: ``schedule.gemm``). ``ldb``: B's
    rows are that many floats apart (``gemmb_``), not packed (nr apart)."""
    name = f"gemm{'t' if transposed else ''}_{mr}x{nr}" if lda is None else f"gemmr_{mr}x{nr}_{lda}"
    if ldb is not None:
        if lda is not None or transposed or prefetch is not None:
            raise ValueError("gemmb_: B in place takes a packed A, a row-major store and no prefetch")
        name = f"gemmb_{mr}x{nr}_{ldb}"
    bstride = nr if ldb is None else ldb
    if prefetch is not None:
        name += f"_f{prefetch[0]}x{prefetch[1]}"
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        kc, nc = max(s["kc"], 1), max(s["ncols"], 1)
        c = (nc, s["ldc"], mr) if transposed else (mr, s["ldc"], nc)
        out = {"a": (1, 0, kc * mr) if lda is None else (mr, lda, kc),
               "b": (1, 0, kc * nr) if ldb is None else (kc, ldb, nr), "c": c}
        if prefetch is not None:
            out["pf"] = (1, 0, 16 * prefetch[1])
        return out

    def reference(arrays, offsets, s) -> None:
        kc, ldc, nc = s["kc"], s["ldc"], s["ncols"]
        a, ao = arrays["a"], offsets["a"]
        if lda is None:
            a = a[ao:ao + kc * mr].reshape(kc, mr).astype(np.float64)
        else:
            a = np.stack([a[ao + r * lda:ao + r * lda + kc] for r in range(mr)]).T.astype(np.float64)
        bo = offsets["b"]
        b = np.stack([arrays["b"][bo + k * bstride:bo + k * bstride + nr] for k in range(kc)]).astype(np.float64) \
            if kc else np.zeros((0, nr))
        prod = a.T @ b  # [mr, nr]
        c, o = arrays["c"], offsets["c"]
        lines = [(o + jj * ldc, prod[:, jj], mr) for jj in range(nc)] if transposed else \
            [(o + r * ldc, prod[r, :nc], nc) for r in range(mr)]
        for start, values, n in lines:
            at = slice(start, start + n)
            base = c[at].astype(np.float64) if s["acc"] else 0.0
            c[at] = (base + values).astype(c.dtype)

    where = "c[j*ldc + r]" if transposed else "c[r*ldc + j]"
    a_at = f"a[k*{mr} + r]" if lda is None else f"a[r*{lda} + k]"
    MICRO[name] = MicroKernel(
        name, (("kc", "int"), ("a", "in"), ("b", "in"), ("c", "out"), ("ldc", "int"), ("acc", "int"),
               ("ncols", "int")) + ((("pf", "in"),) if prefetch is not None else ()),
        f"{where} (acc: +)= sum_k {a_at} * b[k*{bstride} + j], r < {mr}, j < ncols <= {nr}"
        + (f"; prefetches pf[0 : {16 * prefetch[1]}]" if prefetch is not None else ""), footprint, reference)
    return name


def im2col_micro(h: int, w: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, ph: int, pw: int,
                 xc: int, xh: int, mr: int) -> str:
    """The name of the im2col gather of one convolution geometry, registering its contract on first use.

    im2col_...(kc, k0, p0, rows, x, ws): ws[kk*rows + r] = im2col(p0 + r, k0 + kk) for kk < kc, r < rows
    (<= mr): im2col(pix, k) = x[ci*xc + iy*xh + ix] for pix = (oy, ox) (ow per row), k = (ci, ky, kx),
    iy = oy*sh + ky*dh - ph, ix = ox*sw + kx*dw - pw, and 0 where (iy, ix) is outside h x w."""
    geo = (h, w, ow, kh, kw, sh, sw, dh, dw, ph, pw, xc, xh, mr)
    name = "im2col_" + "_".join(str(v) for v in geo)
    if name in MICRO:
        return name
    taps = kh * kw

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        kc = max(s["kc"], 1)
        ci_max = (s["k0"] + kc - 1) // taps
        return {"x": (1, 0, ci_max * xc + (h - 1) * xh + w), "ws": (1, 0, kc * max(s["rows"], 1))}

    def reference(arrays, offsets, s) -> None:
        kc, k0, p0, rows = s["kc"], s["k0"], s["p0"], s["rows"]
        x, xo, ws, wo = arrays["x"], offsets["x"], arrays["ws"], offsets["ws"]
        for kk in range(kc):
            k = k0 + kk
            ci, ky, kx = k // taps, (k // kw) % kh, k % kw
            for r in range(rows):
                oy, ox = divmod(p0 + r, ow)
                iy, ix = oy * sh + ky * dh - ph, ox * sw + kx * dw - pw
                inside = 0 <= iy < h and 0 <= ix < w
                ws[wo + kk * rows + r] = x[xo + ci * xc + iy * xh + ix] if inside else 0.0

    MICRO[name] = MicroKernel(
        name, (("kc", "int"), ("k0", "int"), ("p0", "int"), ("rows", "int"), ("x", "in"), ("ws", "out")),
        "ws[kk*rows + r] = im2col(p0 + r, k0 + kk), zero in the padding", footprint, reference)
    return name


def dwconv_micro(h: int, w: int, oh: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, ph: int,
                 pw: int, xh: int, pool_max: bool = False) -> str:
    """The name of one output plane of a depthwise (one channel) convolution, registering its contract.

    dwplane_...(x, w, out): out[oy*ow + ox] = sum_{ky, kx} w[ky*kw + kx] * x[iy*xh + ix] over the taps inside
    the h x w plane, iy = oy*sh + ky*dh - ph, ix = ox*sw + kx*dw - pw (0 where no tap is inside);
    ``pool_max`` (dwmaxplane_...): the maximum of those x values instead (-inf where none is, NaN skipped)."""
    geo = (h, w, oh, ow, kh, kw, sh, sw, dh, dw, ph, pw, xh)
    name = ("dwmaxplane_" if pool_max else "dwplane_") + "_".join(str(v) for v in geo)
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        return {"x": (1, 0, (h - 1) * xh + w), "w": (1, 0, kh * kw), "out": (1, 0, oh * ow)}

    def reference(arrays, offsets, s) -> None:
        x, xo = arrays["x"], offsets["x"]
        wt = arrays["w"][offsets["w"]:offsets["w"] + kh * kw].astype(np.float64)
        out, oo = arrays["out"], offsets["out"]
        for oy in range(oh):
            for ox in range(ow):
                acc = -np.inf if pool_max else 0.0
                for ky in range(kh):
                    for kx in range(kw):
                        iy, ix = oy * sh + ky * dh - ph, ox * sw + kx * dw - pw
                        if 0 <= iy < h and 0 <= ix < w:
                            v = float(x[xo + iy * xh + ix])
                            if pool_max:
                                acc = v if v > acc else acc
                            else:
                                acc += wt[ky * kw + kx] * v
                out[oo + oy * ow + ox] = acc

    MICRO[name] = MicroKernel(
        name, (("x", "in"), ("w", "in"), ("out", "out")),
        "out[oy*ow + ox] = sum over the taps inside the plane of w[ky*kw + kx] * x[iy*xh + ix]", footprint,
        reference)
    return name


DCONV_PAD = 16  # elements after each row of a dconv tile it may overwrite (a whole vector of the widest target)


def dconv_micro(no: int, px: int, cbi: int, kh: int, kw: int, sw: int, dh: int, dw: int, xcb: int, xrow: int,
                wskip: int = 0, kwf: int | None = None, accumulate: bool = False, pixel_major: bool = False,
                prefetch: int = 0, flat: tuple[int, int] | None = None, xci: int = 0) -> str:
    """The name of a direct-convolution register tile (``no`` output channels x ``px`` pixels) over a
    channel-blocked input, registering its contract on first use (see the module docstring). ``kwf``: the
    packed weight's kernel width when the tile reads only ``kw`` of its columns (a row's pixels that only those
    kernel columns reach inside the input); the name then ends in ``_{kwf}``. ``accumulate`` (``dconva_``): the
    tile is added to c (a later block of input channels) instead of stored. ``pixel_major`` (``dconvp_``,
    ``dconvap_``): the tile stored as it is held, pixel p's ``no`` channels at ``c + p*ldc`` (no transpose: for a
    channels-last output). ``prefetch`` (name ending ``_f{prefetch}``, one more parameter ``pf``): per block of input
    channels, that many 64-byte lines from ``pf`` on are prefetched (``pf + 16*(b*prefetch + j)``), which no value
    depends on: the next output-channel tile's weights, fetched from memory a few lines at a time while this tile
    computes (``schedule.direct``). ``flat`` (name ending ``_q{ow}_{rowstep}`` before any ``_f``, one more
    parameter ``q0`` after ``ldc``): the tile's pixels are pixels q0 .. q0 + px - 1 of an output plane ``ow``
    wide taken as one row (they may span output rows), pixel q's input at ``(q / ow)*rowstep + (q % ow)*sw*cbi``
    from ``x`` (``rowstep``: floats between the inputs of consecutive output rows), so a small plane (7 x 7) runs
    whole tiles where its rows alone would leave a short one. ``xci`` (name ending ``_n{xci}`` before any ``_f``;
    not with ``flat``): the input read where it is in NCHW, input channel i of a block ``xci`` floats on and a row's
    pixels adjacent (the input channel at ``x[b*xcb + ky*dh*xrow + p*sw + kx*dw + i*xci]``), where the blocked
    input has them at ``(p*sw + kx*dw)*cbi + i``: a first convolution of a few channels, its taps trimmed to the
    input (``schedule.direct``)."""
    kwf = kw if kwf is None else kwf
    if xci and flat is not None:
        raise ValueError("dconv micro-kernel: an NCHW input is not read along a flat plane")
    geo = (cbi, kh, kw, sw, dh, dw, xcb, xrow, wskip) + ((kwf,) if kwf != kw else ())
    name = f"dconv{'a' if accumulate else ''}{'p' if pixel_major else ''}_{no}x{px}_" + "_".join(str(v) for v in geo)
    unit = 1 if xci else cbi  # floats between a row's adjacent input pixels
    if xci:
        name += f"_n{xci}"
    if flat is not None:
        name += f"_q{flat[0]}_{flat[1]}"
    if prefetch:
        name += f"_f{prefetch}"
    wcb = kh * kwf * cbi * no + wskip  # weights per channel block
    if name in MICRO:
        return name

    def pix(p: int, s: dict[str, int]) -> int:
        """Floats from ``x`` to the input of the tile's pixel p."""
        if flat is None:
            return p * sw * unit
        q = s["q0"] + p
        return (q // flat[0]) * flat[1] + (q % flat[0]) * sw * cbi

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        ncb = max(s["ncb"], 1)
        reach = max(pix(p, s) for p in range(px)) if flat is not None else (px - 1) * sw * unit  # (q0's bound)
        last = (kw - 1) * dw + (cbi - 1) * xci + 1 if xci else ((kw - 1) * dw + 1) * cbi
        span = (ncb - 1) * xcb + (kh - 1) * dh * xrow + reach + last
        out = {"x": (1, 0, span), "w": (1, 0, (ncb - 1) * wcb + ((kh - 1) * kwf + kw) * cbi * no),
               "c": (px, s["ldc"], no) if pixel_major else (no, s["ldc"], px + DCONV_PAD)}
        if prefetch:
            out["pf"] = (1, 0, 16 * prefetch * ncb)
        return out

    def reference(arrays, offsets, s) -> None:
        ncb = s["ncb"]
        x, xo = arrays["x"], offsets["x"]
        bb, ky_, kx_, ii, oo = np.ix_(range(ncb), range(kh), range(kw), range(cbi), range(no))
        wt = arrays["w"][offsets["w"] + bb * wcb + ((ky_ * kwf + kx_) * cbi + ii) * no + oo]
        acc = np.zeros((px, no))
        for b in range(ncb):
            for ky in range(kh):
                for kx in range(kw):
                    for p in range(px):
                        at = xo + b * xcb + ky * dh * xrow + pix(p, s) + kx * dw * unit
                        v = x[at:at + (cbi - 1) * xci + 1:xci] if xci else x[at:at + cbi]
                        acc[p] += v.astype(np.float64) @ wt[b, ky, kx].astype(np.float64)
        c, co, ldc = arrays["c"], offsets["c"], s["ldc"]
        for o in range(no):
            at = slice(co + o * ldc, co + o * ldc + px) if not pixel_major else slice(co + o, co + o + px * ldc, ldc)
            c[at] = (c[at].astype(np.float64) if accumulate else 0.0) + acc[:, o]

    MICRO[name] = MicroKernel(
        name, (("ncb", "int"), ("x", "in"), ("w", "in"), ("c", "out"), ("ldc", "int"))
        + ((("q0", "int"),) if flat is not None else ()) + ((("pf", "in"),) if prefetch else ()),
        f"c[{'p*ldc + o' if pixel_major else 'o*ldc + p'}] {'+' if accumulate else ''}= sum over {cbi}-channel blocks "
        f"b < ncb and taps of w[...][o] * "
        f"x[b*{xcb} + ky*{dh * xrow} "
        + (f"+ ((q0 + p)/{flat[0]})*{flat[1]} + ((q0 + p)%{flat[0]})*{sw * cbi} + kx*{dw * cbi} + i]"
           if flat is not None else f"+ p*{sw} + kx*{dw} + i*{xci}]" if xci else f"+ (p*{sw} + kx*{dw})*{cbi} + i]")
        + f", o < {no}, p < {px}"
        + (f"; prefetches pf[0 : {16 * prefetch}*ncb]" if prefetch else ""), footprint, reference)
    return name


def dwc_micro(cbi: int, px: int, kh: int, kw: int, sw: int, dh: int, dw: int, xrow: int,
              pool_max: bool = False, pixel_major: bool = False, xpix: int = 0) -> str:
    """The name of a depthwise-convolution register tile (``cbi`` channels x ``px`` pixels of an output row)
    over a channel block in ``nchwc_``'s layout, registering its contract on first use (module docstring).
    ``pool_max`` (``dwcmax_``): the maximum of the taps' inputs instead (w unread; a NaN never replaces the
    running maximum, which starts at -inf). ``pixel_major`` (``dwcp_``, ``dwcmaxp_``): the tile stored as it is
    held, each pixel's ``cbi`` channels one vector at ``c + p*cbi`` (``ldc`` unread): for a channels-last output,
    or one in channel blocks.
    ``xpix``: the input's pixels this many floats apart (0: ``cbi``, a repacked block; name ending ``_x{xpix}``
    otherwise: a channels-last input with a zero ring read where it is, its pixels all its channels apart)."""
    xpix = xpix or cbi
    if xpix < cbi:
        raise ValueError("dwc micro-kernel: pixels closer than a block of channels")
    kind = "dwc" + ("max" if pool_max else "") + ("p" if pixel_major else "") + "_"
    name = kind + "_".join(str(v) for v in (cbi, px, kh, kw, sw, dh, dw, xrow)) + (f"_x{xpix}" if xpix != cbi else "")
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        span = (kh - 1) * dh * xrow + ((px - 1) * sw + (kw - 1) * dw) * xpix + cbi
        out = (1, 0, px * cbi) if pixel_major else (cbi, s["ldc"], px + DCONV_PAD)
        return {"x": (1, 0, span), "w": (1, 0, kh * kw * cbi), "c": out}

    def reference(arrays, offsets, s) -> None:
        x, xo = arrays["x"], offsets["x"]
        wt = arrays["w"][offsets["w"]:offsets["w"] + kh * kw * cbi].reshape(kh, kw, cbi).astype(np.float64)
        acc = np.full((px, cbi), -np.inf) if pool_max else np.zeros((px, cbi))
        for ky in range(kh):
            for kx in range(kw):
                for p in range(px):
                    at = xo + ky * dh * xrow + (p * sw + kx * dw) * xpix
                    v = x[at:at + cbi].astype(np.float64)
                    if pool_max:
                        acc[p] = np.where(v > acc[p], v, acc[p])
                    else:
                        acc[p] += v * wt[ky, kx]
        c, co, ldc = arrays["c"], offsets["c"], s["ldc"]
        if pixel_major:
            c[co:co + px * cbi] = acc.ravel()
            return
        for o in range(cbi):
            c[co + o * ldc:co + o * ldc + px] = acc[:, o]

    MICRO[name] = MicroKernel(
        name, (("x", "in"), ("w", "in"), ("c", "out"), ("ldc", "int")),
        f"c[{f'p*{cbi} + o' if pixel_major else 'o*ldc + p'}] = {'max' if pool_max else 'sum'} over taps of "
        f"{'' if pool_max else f'w[(ky*{kw} + kx)*{cbi} + o] * '}x[ky*{dh * xrow} + (p*{sw} + kx*{dw})*{xpix} + o], "
        f"o < {cbi}, p < {px}", footprint, reference)
    return name


def nchwc_micro(cbi: int, h: int, w: int, ph: int, pw: int, hp: int, wp: int, ring_min: bool = False,
                xw: int = 1, scaled: bool = False) -> str:
    """The name of the repacking of one channel block of an image into rows of ``cbi``-channel pixels with a
    zero ring (``ph``/``pw`` before, up to ``hp`` x ``wp``), registering its contract on first use. A call
    writes ``rows`` rows of the block from row y0, ``ws`` pointing at row y0 (threads may split a block).
    ``ring_min`` (name ending ``_m``): the ring (and the channels past nci) hold -inf instead (max pooling).
    ``xw``: the input's column stride (1 for NCHW; the channels for a channels-last input, whose pixels' channels
    are then contiguous), in the name only when it is not 1. ``scaled`` (name ending ``_s``): each channel i is
    multiplied by ``sc[i]`` as it is copied (a squeeze-and-excitation scale folded into the convolution that
    reads its result: ``schedule.chscale``); the ring stays 0."""
    if scaled and ring_min:
        raise ValueError("nchwc micro-kernel: a scaled repacking has a zero ring")
    dims = (cbi, h, w, ph, pw, hp, wp) + ((xw,) if xw != 1 else ())
    name = "nchwc_" + "_".join(str(v) for v in dims) + ("_m" if ring_min else "") + ("_s" if scaled else "")
    fill = -np.inf if ring_min else 0.0
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        out = {"x": (max(s["nci"], 1), s["xc"], (h - 1) * s["xh"] + (w - 1) * xw + 1),
               "ws": (1, 0, max(1, min(hp, s["rows"])) * wp * cbi)}
        if scaled:
            out["sc"] = (1, 0, max(s["nci"], 1))
        return out

    def reference(arrays, offsets, s) -> None:
        x, xo, xc, xh, nci = arrays["x"], offsets["x"], s["xc"], s["xh"], s["nci"]
        y0, y1 = s["y0"], s["y0"] + s["rows"]
        out = np.full((hp, wp, cbi), fill, arrays["ws"].dtype)
        wc = max(0, min(w, wp - pw))
        for i in range(nci):
            k = arrays["sc"][offsets["sc"] + i] if scaled else None
            for y in range(min(h, hp - ph)):
                at = xo + i * xc + y * xh
                row = x[at:at + (wc - 1) * xw + 1:xw] if wc else x[at:at]
                out[ph + y, pw:pw + wc, i] = row * k if scaled else row
        if y0 < y1:
            o = offsets["ws"]
            arrays["ws"][o:o + (y1 - y0) * wp * cbi] = out[y0:y1].ravel()

    MICRO[name] = MicroKernel(
        name, (("x", "in"), *((("sc", "in"),) if scaled else ()), ("xc", "int"), ("xh", "int"), ("nci", "int"),
               ("y0", "int"), ("rows", "int"), ("ws", "out")),
        f"ws[((yy - y0)*{wp} + xx)*{cbi} + i] = x[i*xc + (yy - {ph})*xh + (xx - {pw})*{xw}]"
        f"{' * sc[i]' if scaled else ''} inside the {h}x{w} plane and "
        f"i < nci, else {'-inf' if ring_min else '0'}, for y0 <= yy < y0 + rows", footprint, reference)
    return name


# Winograd F(4x4, 3x3) (Lavin and Gray; interpolation points 0, 1, -1, 2, -2 and infinity): a 4x4 output tile of a
# 3x3 correlation is A^T [(G g G^T) * (B^T d B)] A over the 6x6 input tile d
WINO_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                    [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
WINO_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                   [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
WINO_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64)


def gemmq_micro(mr: int, nr: int, lda: int, lanes: int, post: str | None = None) -> str:
    """The name of the mr x nr GEMM tile reading A in place, column-major (k at stride ``lda``: a 1x1 convolution's
    NCHW input with pixels as rows), that stores each vector of ``lanes`` columns of its tile ``ldq`` apart (the
    blocks of channels of a channel-blocked layout), registering its contract. The name holds ``lanes`` (``_v8``),
    on which the contract depends: the contract of another target's tile of the same name was registered first
    when one process generated code for two targets (a latent wrong verification: AVX-512's 8-column tile is
    half a vector, AVX2's one). ``post`` (a ``post_tag``): ``gemmqe_``, the tile plus a bias per column (one more
    parameter) and that epilogue in registers before its store: the 1x1 convolution of a fused 1x1 -> depthwise
    pair with its bias and ReLU or Clip, without the pass over its rows the elementwise chain would make."""
    name = f"gemmq_{mr}x{nr}_{lda}_v{lanes}" if post is None else f"gemmqe_{mr}x{nr}_{lda}_v{lanes}_{post}"
    if name in MICRO:
        return name
    nv = nr // lanes

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        kc = max(s["kc"], 1)
        out = {"a": (kc, lda, mr), "b": (1, 0, kc * nr), "c": (nv, s["ldq"], (mr - 1) * s["ldc"] + lanes)}
        return out if post is None else {**out, "bias": (1, 0, nr)}

    def reference(arrays, offsets, s) -> None:
        kc, ldc, ldq = s["kc"], s["ldc"], s["ldq"]
        a, ao = arrays["a"], offsets["a"]
        a = np.stack([a[ao + k * lda:ao + k * lda + mr] for k in range(kc)]).astype(np.float64)
        b = arrays["b"][offsets["b"]:offsets["b"] + kc * nr].reshape(kc, nr).astype(np.float64)
        prod = a.T @ b  # [mr, nr]
        if post is not None:
            bias = arrays["bias"][offsets["bias"]:offsets["bias"] + nr].astype(np.float32)
            prod = apply_post(prod.astype(np.float32) + bias, post)
        c, o = arrays["c"], offsets["c"]
        for q in range(nv):
            for r in range(mr):
                at = o + q * ldq + r * ldc
                c[at:at + lanes] = prod[r, q * lanes:(q + 1) * lanes].astype(c.dtype)

    params = (("kc", "int"), ("a", "in"), ("b", "in"), ("c", "out"), ("ldc", "int"), ("ldq", "int"))
    value = f"sum_k a[k*{lda} + r] * b[k*{nr} + j]"
    MICRO[name] = MicroKernel(
        name, params + ((("bias", "in"),) if post is not None else ()),
        f"c[(j/{lanes})*ldq + r*ldc + j%{lanes}] = "
        + (value if post is None else f"post_{post}({value} + bias[j])") + f", r < {mr}, j < {nr}",
        footprint, reference)
    return name


def post_tag(kind: str, lo: float | None = None, hi: float | None = None) -> str:
    """The name part of an in-register epilogue after a per-column bias: ``n`` (none), ``r`` (ReLU: 0 where x < 0)
    or ``c{lo}_{hi}`` (Clip: lo where x <= lo, then hi where x >= hi; the float32 bounds' bit patterns in hex).
    A NaN passes all three, as the elementwise chain's dlcc_relu, dlcc_max and dlcc_min let it."""
    if kind == "clip":
        bits = [int(np.array(v, np.float32).view(np.uint32)) for v in (lo, hi)]
        return f"c{bits[0]:08x}_{bits[1]:08x}"
    return {"none": "n", "relu": "r"}[kind]


def apply_post(v: np.ndarray, tag: str) -> np.ndarray:
    """``post_tag``'s epilogue on float32 values (the reference of ``gemmqe_``)."""
    v = v.astype(np.float32)
    if tag == "r":
        return np.where(v < 0, np.float32(0), v)
    if tag.startswith("c"):
        lo, hi = (np.array(int(b, 16), np.uint32).view(np.float32) for b in tag[1:].split("_"))
        v = np.where(v <= lo, lo, v)
        return np.where(v >= hi, hi, v)
    return v


def gemmr_micro(mr: int, nr: int, lda: int, prefetch: tuple[int, int] | None = None) -> str:
    """The name of the mr x nr GEMM tile reading A in place, row-major (row stride ``lda``), registering its
    contract. ``prefetch``: see ``_gemm_contract``."""
    return _gemm_contract(mr, nr, transposed=False, lda=lda, prefetch=prefetch)


def wgi_micro(cbi: int, xrow: int, ldv: int) -> str:
    """The name of the Winograd input transform of one tile (``cbi`` channels), registering its contract."""
    name = f"wgi_{cbi}_{xrow}_{ldv}"
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        return {"x": (6, xrow, 6 * cbi), "v": (36, ldv, cbi)}

    def reference(arrays, offsets, s) -> None:
        x, xo = arrays["x"], offsets["x"]
        d = np.stack([x[xo + y * xrow:xo + y * xrow + 6 * cbi].reshape(6, cbi) for y in range(6)]).astype(np.float64)
        t = np.einsum("ry,yzi,sz->rsi", WINO_BT, d, WINO_BT).reshape(36, cbi)
        v, vo = arrays["v"], offsets["v"]
        for e in range(36):
            v[vo + e * ldv:vo + e * ldv + cbi] = t[e].astype(v.dtype)

    MICRO[name] = MicroKernel(
        name, (("x", "in"), ("v", "out")),
        f"v[(r*6 + s)*{ldv} + i] = (B^T d B)[r, s], d[y, z] = x[y*{xrow} + z*{cbi} + i], i < {cbi}", footprint,
        reference)
    return name


def wgo_micro(cbi: int, ldm: int, rp: int, pixel_major: bool = False) -> str:
    """The name of the Winograd output transform of one tile (``cbi`` channels), registering its contract.
    ``pixel_major``: each output pixel's channels together (``wgop_``), for a channels-last destination."""
    name = f"wgo{'p' * pixel_major}_{cbi}_{ldm}_{rp}"
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        if pixel_major:
            return {"m": (36, ldm, cbi), "c": (3 * rp + 4, s["ldc"], cbi)}
        return {"m": (36, ldm, cbi), "c": (cbi, s["ldc"], 3 * rp + 4)}

    def reference(arrays, offsets, s) -> None:
        m, mo = arrays["m"], offsets["m"]
        mm = np.stack([m[mo + e * ldm:mo + e * ldm + cbi] for e in range(36)]).reshape(6, 6, cbi).astype(np.float64)
        y = np.einsum("yr,rsi,zs->iyz", WINO_AT, mm, WINO_AT)
        c, co, ldc = arrays["c"], offsets["c"], s["ldc"]
        for r in range(4):
            for z in range(4):
                if pixel_major:
                    c[co + (r * rp + z) * ldc:co + (r * rp + z) * ldc + cbi] = y[:, r, z].astype(c.dtype)
                else:
                    c[co + r * rp + z:co + cbi * ldc + r * rp + z:ldc] = y[:, r, z].astype(c.dtype)

    where = f"c[(y*{rp} + z)*ldc + o]" if pixel_major else f"c[o*ldc + y*{rp} + z]"
    MICRO[name] = MicroKernel(
        name, (("m", "in"), ("c", "out"), ("ldc", "int")),
        f"{where} = (A^T M A)[y, z], M[r, s] = m[(r*6 + s)*{ldm} + o], o < {cbi}", footprint, reference)
    return name


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(np.float32(x))))[0]


def _bits_f32(b: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", b))[0])


@dataclass(frozen=True)
class AttnSpec:
    """One head of attention, every size and element stride a constant (see the module docstring): queries
    q[i*qs + e*qd] (i < sq, e < d), keys k[j*ks + e*kd] (j < sk), values v[j*vs + e*vd], output o[i*os + e*od];
    ``mk``: an additive mask m[i*ms + j*mj] is read; ``causal``: s[i, j] = fill for j > i + sk - sq (before the
    mask is added); ``scale``/``fill``: float32 bits; ``qb`` x ``nv``: query rows x vectors of the register tile."""
    sq: int
    sk: int
    d: int
    qs: int
    qd: int
    ks: int
    kd: int
    vs: int
    vd: int
    os: int
    od: int
    mk: int
    ms: int
    mj: int
    causal: int
    scale: int
    fill: int
    qb: int
    nv: int

    @staticmethod
    def make(*, scale: float, fill: float, **kw) -> AttnSpec:
        return AttnSpec(scale=_f32_bits(scale), fill=_f32_bits(fill), **kw)

    @property
    def name(self) -> str:
        vals = astuple(self)
        return "attn_" + "_".join(f"{v:08x}" if f in ("scale", "fill") else str(v)
                                  for f, v in zip(self.__dataclass_fields__, vals, strict=True))

    @staticmethod
    def parse(name: str) -> AttnSpec | None:
        if not name.startswith("attn_"):
            return None
        parts = name[5:].split("_")
        fields = list(AttnSpec.__dataclass_fields__)
        if len(parts) != len(fields):
            return None
        try:
            return AttnSpec(*(int(p, 16) if f in ("scale", "fill") else int(p)
                              for f, p in zip(fields, parts, strict=True)))
        except ValueError:
            return None

    @property
    def scale_value(self) -> float:
        return _bits_f32(self.scale)

    @property
    def fill_value(self) -> float:
        return _bits_f32(self.fill)

    def ws_floats(self, lanes: int) -> int:
        """Workspace of one call: K transposed (d x skp), V (sk x dp), qb rows of skp probabilities."""
        skp, dp = -(-self.sk // lanes) * lanes, -(-self.d // lanes) * lanes
        return self.d * skp + self.sk * dp + self.qb * skp


# the widest target's lanes bound the workspace the verifier and interpreter assume for a contract
ATTN_WS_LANES = 16


def attn_reference(spec: AttnSpec, q: np.ndarray, k: np.ndarray, v: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """The contract on [sq, d], [sk, d], [sk, d] arrays (and the mask as [sq, sk]) in float64: [sq, d]."""
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * spec.scale_value
    if spec.causal:
        i = np.arange(spec.sq)[:, None]
        j = np.arange(spec.sk)[None, :]
        s = np.where(j > i + spec.sk - spec.sq, spec.fill_value, s)
    if spec.mk:
        s = s + m.astype(np.float64)
    s = s - s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def attn_micro(spec: AttnSpec) -> str:
    """The name of the attention micro-kernel of ``spec``, registering its contract on first use."""
    name = spec.name
    if name in MICRO:
        return name
    sp = spec

    def gather(arr, off, rows, rs, cols, cs):
        r = np.arange(rows)[:, None] * rs + np.arange(cols)[None, :] * cs
        return arr[off + r]

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        fp = {"q": (sp.sq, sp.qs, (sp.d - 1) * sp.qd + 1), "k": (sp.sk, sp.ks, (sp.d - 1) * sp.kd + 1),
              "v": (sp.sk, sp.vs, (sp.d - 1) * sp.vd + 1), "o": (sp.sq, sp.os, (sp.d - 1) * sp.od + 1),
              "ws": (1, 0, sp.ws_floats(ATTN_WS_LANES))}
        if sp.mk:
            fp["m"] = (sp.sq, sp.ms, (sp.sk - 1) * sp.mj + 1)
        return fp

    def reference(arrays, offsets, s) -> None:
        q = gather(arrays["q"], offsets["q"], sp.sq, sp.qs, sp.d, sp.qd)
        k = gather(arrays["k"], offsets["k"], sp.sk, sp.ks, sp.d, sp.kd)
        v = gather(arrays["v"], offsets["v"], sp.sk, sp.vs, sp.d, sp.vd)
        m = gather(arrays["m"], offsets["m"], sp.sq, sp.ms, sp.sk, sp.mj) if sp.mk else None
        out = attn_reference(sp, q, k, v, m)
        o = arrays["o"]
        idx = offsets["o"] + np.arange(sp.sq)[:, None] * sp.os + np.arange(sp.d)[None, :] * sp.od
        o[idx] = out.astype(o.dtype)

    params = (("q", "in"), ("k", "in"), ("v", "in"), *((("m", "in"),) if sp.mk else ()), ("o", "out"), ("ws", "out"))
    MICRO[name] = MicroKernel(
        name, params,
        f"o[i*{sp.os} + e*{sp.od}] = softmax_j({sp.scale_value!r} * q_i . k_j{' causal' if sp.causal else ''}"
        f"{f' + m[i*{sp.ms} + j*{sp.mj}]' if sp.mk else ''}) . v_j, i < {sp.sq}, j < {sp.sk}, e < {sp.d}",
        footprint, reference)
    return name
