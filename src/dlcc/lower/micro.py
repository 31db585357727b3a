"""Micro-kernel contracts of the loop-level kernel IR: what each named micro-kernel computes, the elements
it touches (for the verifier) and a numpy reference (for the interpreter). Their C bodies, per target, are
in ``dlcc.codegen.ukernels``; a test runs each body against its reference.

    gemm_{mr}x{nr}(kc, a, b, c, ldc, acc, ncols)
        c[r*ldc + j] = (acc ? c[r*ldc + j] : 0) + sum_{k < kc} a[k*mr + r] * b[k*nr + j]
        for r < mr, j < ncols (<= nr). ``a`` is a packed A micro-panel (kc x mr, k-major), ``b`` a packed
        B micro-panel (kc x nr, k-major; columns at or beyond ncols are never stored).

    gemmt_{mr}x{nr}(kc, a, b, c, ldc, acc, ncols)
        the same product stored transposed: c[j*ldc + r] for j < ncols, r < mr (a convolution computed with
        pixels as rows and output channels as columns, stored channel-major).

    dconv_{no}x{px}_{cbi}_{kh}_{kw}_{sw}_{dh}_{dw}_{xcb}_{xrow}_{wskip}(ncb, x, w, c, ldc)
        one register tile of a direct convolution over a channel-blocked input (``nchwc_``'s layout):
        c[o*ldc + p] = sum_{b < ncb, ky, kx, i < cbi} w[b*(kh*kw*cbi*no + wskip) + ((ky*kw + kx)*cbi + i)*no + o]
                                                    * x[b*xcb + ky*dh*xrow + (p*sw + kx*dw)*cbi + i]
        for o < no, p < px: ``no`` output channels (whole vectors) by ``px`` output pixels of a row, stored
        channel-major (each channel's pixels contiguous, as the output plane holds them); the elements
        c[o*ldc + p] for px <= p < px + 16 may be overwritten (the tile is stored as whole vectors), so
        ldc >= px + 16. ``wskip``: weights after each channel block's kh kernel rows that are not read (the
        kernel rows of a convolution that no output row of this tile reaches inside the input).

    nchwc_{cbi}_{h}_{w}_{ph}_{pw}_{hp}_{wp}(x, xc, xh, nci, ws)
        one channel block of an image repacked with a zero ring: ws[(yy*wp + xx)*cbi + i] =
        x[i*xc + (yy - ph)*xh + xx - pw] where 0 <= yy - ph < h, 0 <= xx - pw < w and i < nci, else 0,
        for yy < hp, xx < wp, i < cbi (rows and columns of the plane beyond hp x wp are not read).
"""

from __future__ import annotations

import numpy as np

from dlcc.lower.lir import MICRO, MicroKernel

__all__ = ["DCONV_PAD", "dconv_micro", "dwconv_micro", "gemm_micro", "gemmt_micro", "im2col_micro", "nchwc_micro"]


def gemm_micro(mr: int, nr: int) -> str:
    """The name of the mr x nr GEMM micro-kernel, registering its contract on first use."""
    return _gemm_contract(mr, nr, transposed=False)


def gemmt_micro(mr: int, nr: int) -> str:
    """The mr x nr GEMM micro-kernel that stores its tile transposed, registering its contract."""
    return _gemm_contract(mr, nr, transposed=True)


def _gemm_contract(mr: int, nr: int, transposed: bool) -> str:
    name = f"gemm{'t' if transposed else ''}_{mr}x{nr}"
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        kc, nc = max(s["kc"], 1), max(s["ncols"], 1)
        c = (nc, s["ldc"], mr) if transposed else (mr, s["ldc"], nc)
        return {"a": (1, 0, kc * mr), "b": (1, 0, kc * nr), "c": c}

    def reference(arrays, offsets, s) -> None:
        kc, ldc, nc = s["kc"], s["ldc"], s["ncols"]
        a = arrays["a"][offsets["a"]:offsets["a"] + kc * mr].reshape(kc, mr).astype(np.float64)
        b = arrays["b"][offsets["b"]:offsets["b"] + kc * nr].reshape(kc, nr).astype(np.float64)
        prod = a.T @ b  # [mr, nr]
        c, o = arrays["c"], offsets["c"]
        lines = [(o + jj * ldc, prod[:, jj], mr) for jj in range(nc)] if transposed else \
            [(o + r * ldc, prod[r, :nc], nc) for r in range(mr)]
        for start, values, n in lines:
            at = slice(start, start + n)
            base = c[at].astype(np.float64) if s["acc"] else 0.0
            c[at] = (base + values).astype(c.dtype)

    where = "c[j*ldc + r]" if transposed else "c[r*ldc + j]"
    MICRO[name] = MicroKernel(
        name, (("kc", "int"), ("a", "in"), ("b", "in"), ("c", "out"), ("ldc", "int"), ("acc", "int"),
               ("ncols", "int")),
        f"{where} (acc: +)= sum_k a[k*{mr} + r] * b[k*{nr} + j], r < {mr}, j < ncols <= {nr}", footprint, reference)
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
                wskip: int = 0) -> str:
    """The name of a direct-convolution register tile (``no`` output channels x ``px`` pixels) over a
    channel-blocked input, registering its contract on first use (see the module docstring)."""
    geo = (cbi, kh, kw, sw, dh, dw, xcb, xrow, wskip)
    name = f"dconv_{no}x{px}_" + "_".join(str(v) for v in geo)
    wcb = kh * kw * cbi * no + wskip  # weights per channel block
    if name in MICRO:
        return name
    taps = kh * kw

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        ncb = max(s["ncb"], 1)
        span = (ncb - 1) * xcb + (kh - 1) * dh * xrow + ((px - 1) * sw + (kw - 1) * dw + 1) * cbi
        return {"x": (1, 0, span), "w": (1, 0, ncb * wcb - wskip), "c": (no, s["ldc"], px + DCONV_PAD)}

    def reference(arrays, offsets, s) -> None:
        ncb = s["ncb"]
        x, xo = arrays["x"], offsets["x"]
        wall = arrays["w"][offsets["w"]:offsets["w"] + ncb * wcb]
        wt = np.stack([wall[b * wcb:b * wcb + taps * cbi * no] for b in range(ncb)]).reshape(ncb, kh, kw, cbi, no)
        acc = np.zeros((px, no))
        for b in range(ncb):
            for ky in range(kh):
                for kx in range(kw):
                    for p in range(px):
                        at = xo + b * xcb + ky * dh * xrow + (p * sw + kx * dw) * cbi
                        acc[p] += x[at:at + cbi].astype(np.float64) @ wt[b, ky, kx].astype(np.float64)
        c, co, ldc = arrays["c"], offsets["c"], s["ldc"]
        for o in range(no):
            c[co + o * ldc:co + o * ldc + px] = acc[:, o]

    MICRO[name] = MicroKernel(
        name, (("ncb", "int"), ("x", "in"), ("w", "in"), ("c", "out"), ("ldc", "int")),
        f"c[o*ldc + p] = sum over {cbi}-channel blocks b < ncb and taps of w[...][o] * x[b*{xcb} + ky*{dh * xrow} "
        f"+ (p*{sw} + kx*{dw})*{cbi} + i], o < {no}, p < {px}", footprint, reference)
    return name


def nchwc_micro(cbi: int, h: int, w: int, ph: int, pw: int, hp: int, wp: int) -> str:
    """The name of the repacking of one channel block of an image into rows of ``cbi``-channel pixels with a
    zero ring (``ph``/``pw`` before, up to ``hp`` x ``wp``), registering its contract on first use."""
    name = "nchwc_" + "_".join(str(v) for v in (cbi, h, w, ph, pw, hp, wp))
    if name in MICRO:
        return name

    def footprint(s: dict[str, int]) -> dict[str, tuple[int, int, int]]:
        return {"x": (max(s["nci"], 1), s["xc"], (h - 1) * s["xh"] + w), "ws": (1, 0, hp * wp * cbi)}

    def reference(arrays, offsets, s) -> None:
        x, xo, xc, xh, nci = arrays["x"], offsets["x"], s["xc"], s["xh"], s["nci"]
        out = np.zeros((hp, wp, cbi), arrays["ws"].dtype)
        wc = max(0, min(w, wp - pw))
        for i in range(nci):
            for y in range(min(h, hp - ph)):
                out[ph + y, pw:pw + wc, i] = x[xo + i * xc + y * xh:xo + i * xc + y * xh + wc]
        arrays["ws"][offsets["ws"]:offsets["ws"] + out.size] = out.ravel()

    MICRO[name] = MicroKernel(
        name, (("x", "in"), ("xc", "int"), ("xh", "int"), ("nci", "int"), ("ws", "out")),
        f"ws[(yy*{wp} + xx)*{cbi} + i] = x[i*xc + (yy - {ph})*xh + xx - {pw}] inside the {h}x{w} plane and "
        "i < nci, else 0", footprint, reference)
    return name
