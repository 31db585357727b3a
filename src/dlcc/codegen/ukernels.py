"""C bodies of the loop IR's named micro-kernels (contracts and numpy references: ``dlcc.lower.micro``).

What goes in: a micro-kernel name (``gemm_{mr}x{nr}``) and the target's float lanes. What comes out: one
``static`` C function ``dlcc_uk_<name>`` per name, written with the target's float vector ``dlcc_vf``
(``cbase.vector_helpers``): GCC/Clang keep each accumulator in a vector register, so the same text is a
register-tiled kernel on AVX-512, AVX2, NEON or plain 16-byte vectors.

gemm_{mr}x{nr}: mr x (nr / lanes) vector accumulators; per k, the nr-column row of the B micro-panel is
loaded once (nr / lanes vectors) and each of the mr values of the A micro-panel is broadcast once and
feeds nr / lanes FMAs. A full-width tile is added to (``acc``) and stored into C with vector loads and
stores; a narrower one (the matrix's last columns) goes through a small local tile.
gemmt_{mr}x{nr}: the same tile stored transposed (column j of the tile is mr consecutive floats of C),
through a local tile.
dconv_{no}x{px}_...: no / lanes x px vector accumulators (output channels in the lanes); per input channel
and tap, the no output channels' weights are loaded once (no / lanes vectors) and each of the px input
pixels is broadcast once and feeds no / lanes FMAs; the tile is stored channel-major through a local tile
(so that the epilogue runs along each channel's contiguous pixels, vectorized).
nchwc_...: a transposing copy, each output pixel's cbi channels gathered from cbi planes.
attn_...: one head of attention (``lower.micro.AttnSpec``): K is packed transposed and V row-major into the
workspace (whole vectors, zero-padded), then per block of qb query rows: the qb x sk scores in register tiles of
qb rows x nv key vectors (each query value broadcast once per key vector group), scaled on the store; the
causal fill and the mask in one elementwise pass; the row maximum, exp and sum (vectorized, the sum in one
partial per lane); the product with V in tiles of qb rows x nv feature vectors, each probability broadcast
once; each row scaled by 1 / its sum on the store. Only qb rows of probabilities exist at a time.
"""

from __future__ import annotations

import re

import numpy as np

from dlcc.codegen.cbase import c_float, indent
from dlcc.lower.micro import AttnSpec

__all__ = ["micro_c"]

_GEMM = re.compile(r"gemm(t?)_(\d+)x(\d+)(?:_f(\d+)x(\d+))?$")


_IM2COL = re.compile(r"im2col_(\d+(?:_\d+){13})$")
_DWPLANE = re.compile(r"dw(max)?plane_(\d+(?:_\d+){12})$")
_DCONV = re.compile(r"dconv(a?)(p?)_(\d+)x(\d+)_(\d+(?:_\d+){8,9})(?:_n(\d+))?(?:_q(\d+)_(\d+))?(?:_f(\d+))?$")
_NCHWC = re.compile(r"nchwc_(\d+(?:_\d+){6,7})(_m)?(_s)?$")
_DWC = re.compile(r"dwc(max)?(p)?_(\d+(?:_\d+){7})(?:_x(\d+))?$")
_GEMMB = re.compile(r"gemmb_(\d+)x(\d+)_(\d+)$")
_GEMMR = re.compile(r"gemm([rq])_(\d+)x(\d+)_(\d+)(?:_v\d+)?(?:_f(\d+)x(\d+))?$")
_GEMMQE = re.compile(r"gemmqe_(\d+)x(\d+)_(\d+)_v\d+_(n|r|c[0-9a-f]{8}_[0-9a-f]{8})$")
_WGI = re.compile(r"wgi_(\d+)_(\d+)_(\d+)$")
_WGO = re.compile(r"wgo(p?)_(\d+)_(\d+)_(\d+)$")


def micro_c(name: str, lanes: int) -> str:
    """The C definition of micro-kernel ``name`` for vectors of ``lanes`` floats."""
    m = _IM2COL.match(name)
    if m is not None:
        return _im2col(name, *(int(v) for v in m.group(1).split("_")))
    m = _DWPLANE.match(name)
    if m is not None:
        return _dwplane(name, *(int(v) for v in m.group(2).split("_")), pool_max=bool(m.group(1)), lanes=lanes)
    m = _DCONV.match(name)
    if m is not None:
        return _dconv(name, int(m.group(3)), int(m.group(4)), *(int(v) for v in m.group(5).split("_")), lanes=lanes,
                      accumulate=bool(m.group(1)), pixel_major=bool(m.group(2)), prefetch=int(m.group(9) or 0),
                      flat=(int(m.group(7)), int(m.group(8))) if m.group(7) else None, xci=int(m.group(6) or 0))
    m = _NCHWC.match(name)
    if m is not None:
        return _nchwc(name, *(int(v) for v in m.group(1).split("_")), lanes=lanes, ring_min=bool(m.group(2)),
                      scaled=bool(m.group(3)))
    m = _DWC.match(name)
    if m is not None:
        return _dwc(name, *(int(v) for v in m.group(3).split("_")), lanes=lanes, pool_max=bool(m.group(1)),
                    pixel_major=bool(m.group(2)), xpix=int(m.group(4) or 0))
    m = _GEMMR.match(name)
    if m is not None:
        return _gemm(int(m.group(2)), int(m.group(3)), lanes, lda=int(m.group(4)), split=m.group(1) == "q",
                     prefetch=(int(m.group(5)), int(m.group(6))) if m.group(5) else None)
    m = _GEMMB.match(name)
    if m is not None:
        return _gemm(int(m.group(1)), int(m.group(2)), lanes, ldb=int(m.group(3)))
    m = _GEMMQE.match(name)
    if m is not None:
        return _gemm(int(m.group(1)), int(m.group(2)), lanes, lda=int(m.group(3)), split=True, post=m.group(4))
    m = _WGI.match(name)
    if m is not None:
        return _wgi(*(int(v) for v in m.groups()), lanes=lanes)
    m = _WGO.match(name)
    if m is not None:
        return _wgo(*(int(v) for v in m.groups()[1:]), lanes=lanes, pixel_major=bool(m.group(1)))
    spec = AttnSpec.parse(name)
    if spec is not None:
        return _attn(spec, lanes)
    m = _GEMM.match(name)
    if m is None:
        raise ValueError(f"no C body for micro-kernel {name}")
    return _gemm(int(m.group(2)), int(m.group(3)), lanes, bool(m.group(1)),
                 prefetch=(int(m.group(4)), int(m.group(5))) if m.group(4) else None)


def _gemm(mr: int, nr: int, lanes: int, transposed: bool = False, lda: int | None = None,
          split: bool = False, post: str | None = None, prefetch: tuple[int, int] | None = None,
          ldb: int | None = None) -> str:
    """``gemm_``/``gemmt_`` over a packed A micro-panel, or with ``lda`` ``gemmr_``: A read in place, row-major
    (mr rows at a constant stride, each value broadcast from its row), or with ``split`` ``gemmq_``: A read in
    place with k at stride ``lda`` (a packed panel's order, whose k-rows are ``lda`` apart), the whole tile
    stored, each vector of columns ``ldq`` apart (no accumulation, no partial tile); with ``post`` (a
    ``lower.micro.post_tag``) ``gemmqe_``: a bias vector per column added and the epilogue applied in registers
    before the store, as selects on comparison masks (a NaN passes, as in the elementwise chain's helpers).
    ``prefetch`` (step, lines): every step-th k of the first step*lines prefetches one line of ``pf`` (GCC, Clang).
    ``ldb`` (``gemmb_``): B read in place, its rows (k) ``ldb`` floats apart, not packed nr apart.
    """
    if prefetch is not None and (split or mr == 1 or prefetch[0] & (prefetch[0] - 1)):
        raise ValueError(f"gemm micro-kernel: no prefetching variant {prefetch} of this tile")
    if nr % lanes:
        raise ValueError(f"gemm micro-kernel: {nr} columns are not whole vectors of {lanes}")
    nv = nr // lanes
    bstride = nr if ldb is None else ldb
    acc = [[f"c{r}_{q}" for q in range(nv)] for r in range(mr)]
    lines = [f"dlcc_vf {', '.join(a for row in acc for a in row)};"]
    lines += [f"{a} = (dlcc_vf){{0}};" for row in acc for a in row]

    def step(u: int, sets: list[list[str]]) -> list[str]:
        """One k (k + u) into the accumulators ``sets``."""
        out = [f"const dlcc_vf b{u}_{q} = dlcc_vf_load(b + {u * bstride + q * lanes});" for q in range(nv)]
        for r in range(mr):
            fmas = " ".join(f"{sets[r][q]} += x{u}_{r} * b{u}_{q};" for q in range(nv))
            at = (f"a[{u * mr + r}]" if lda is None else f"a[{u * lda + r}]" if split
                  else f"a[{r * lda} + k + {u}]")
            out.append(f"{{ const float x{u}_{r} = {at}; {fmas} }}")  # (scalar x vector: a broadcast load)
        return out

    a_step = lda if split else mr if lda is None else None  # (gemmr_ indexes its rows by k instead)

    def advance(ks: int) -> list[str]:
        """The pointers moved on by ``ks`` values of k."""
        return ([f"a += {ks * a_step};"] if a_step is not None else []) + [f"b += {ks * bstride};"]

    # a one-row tile (a product of one row: a classifier, a squeeze-and-excitation FC) is bound by the FMA
    # latency along k: k unrolled into independent partial sums, added at the end (one row only: a row's tile
    # height never depends on the thread count, so two threads still give the bits of one)
    unroll = min(4, -(-8 // nv)) if mr == 1 else 1
    if unroll > 1:
        sets = [acc] + [[[f"{a}_u{u}" for a in row] for row in acc] for u in range(1, unroll)]
        lines.append(f"dlcc_vf {', '.join(a for st in sets[1:] for row in st for a in row)};")
        lines += [f"{a} = (dlcc_vf){{0}};" for st in sets[1:] for row in st for a in row]
        body = [line for u in range(unroll) for line in step(u, sets[u])]
        body += advance(unroll)
        lines.append(f"int64_t k = 0;\nfor (; k + {unroll} <= kc; k += {unroll}) {{\n{indent(chr(10).join(body))}\n}}")
        rest = step(0, acc) + advance(1)
        lines.append(f"for (; k < kc; ++k) {{\n{indent(chr(10).join(rest))}\n}}")
        lines += [f"{acc[r][q]} += {' + '.join(sets[u][r][q] for u in range(1, unroll))};"
                  for r in range(mr) for q in range(nv)]
    else:
        body = step(0, acc) + advance(1)
        if prefetch is not None:  # (a line every few k: a burst would hold the miss buffers the tile's loads need)
            st, n = prefetch
            body.insert(0, _prefetch(f"if (!(k & {st - 1}) && k < {st * n}) ", f"pf + 16 * (k / {st})"))
        lines.append(f"for (int64_t k = 0; k < kc; ++k) {{\n{indent(chr(10).join(body))}\n}}")
        if prefetch is not None:
            lines.append("(void)pf;")
    name = (f"gemm{'t' if transposed else ''}_{mr}x{nr}" if lda is None
            else f"gemmq_{mr}x{nr}_{lda}_v{lanes}" if split else f"gemmr_{mr}x{nr}_{lda}")
    if ldb is not None:
        name = f"gemmb_{mr}x{nr}_{ldb}"
    if prefetch is not None:
        name += f"_f{prefetch[0]}x{prefetch[1]}"
    if split and post is not None:
        name = f"gemmqe_{mr}x{nr}_{lda}_v{lanes}_{post}"
        lines += _post(acc, post, nv, lanes)
    if split:
        stores = [f"dlcc_vf_store(c + {q} * ldq + {r} * ldc, {acc[r][q]});" for q in range(nv) for r in range(mr)]
        bias = ", const float* restrict bias" if post is not None else ""
        return (f"static void dlcc_uk_{name}(int64_t kc, const float* restrict a, const float* restrict b, "
                f"float* restrict c, int64_t ldc, int64_t ldq{bias}) {{\n{indent(chr(10).join(lines + stores))}\n}}\n")
    pfp = ", const float* restrict pf" if prefetch is not None else ""
    head = (f"static void dlcc_uk_{name}(int64_t kc, const float* restrict a, const float* restrict b, "
            f"float* restrict c, int64_t ldc, int64_t acc, int64_t ncols{pfp}) {{\n")
    if transposed:  # through a local tile: c[j*ldc + r] for each column j < ncols, rows r < mr contiguous
        tile = [f"float t[{mr * nr}];"]
        tile += [f"dlcc_vf_store(t + {r * nr + q * lanes}, {acc[r][q]});" for r in range(mr) for q in range(nv)]
        tile.append(f"for (int64_t j = 0; j < ncols; ++j)\n"
                    f"    for (int64_t r = 0; r < {mr}; ++r) c[j * ldc + r] = (acc ? c[j * ldc + r] : 0.0f) "
                    f"+ t[r * {nr} + j];")
        lines.append("\n".join(tile))
        return f"{head}{indent(chr(10).join(lines))}\n}}\n"
    full_acc, full_st = [], []
    for r in range(mr):
        for q in range(nv):
            p = f"c + {r} * ldc + {q * lanes}"
            full_acc.append(f"{acc[r][q]} += dlcc_vf_load({p});")
            full_st.append(f"dlcc_vf_store({p}, {acc[r][q]});")
    tile = [f"float t[{mr * nr}];"]
    tile += [f"dlcc_vf_store(t + {r * nr + q * lanes}, {acc[r][q]});" for r in range(mr) for q in range(nv)]
    tile.append(f"for (int64_t r = 0; r < {mr}; ++r)\n"
                f"    for (int64_t j = 0; j < ncols; ++j) c[r * ldc + j] = (acc ? c[r * ldc + j] : 0.0f) "
                f"+ t[r * {nr} + j];")
    lines.append(f"if (ncols == {nr}) {{\n"
                 f"    if (acc) {{\n{indent(chr(10).join(full_acc), 2)}\n    }}\n{indent(chr(10).join(full_st))}\n"
                 f"}} else {{\n{indent(chr(10).join(tile))}\n}}")
    return f"{head}{indent(chr(10).join(lines))}\n}}\n"


def _post(acc: list[list[str]], tag: str, nv: int, lanes: int) -> list[str]:
    """C adding the bias vectors to the accumulators ``acc[r][q]`` and applying ``tag`` (``lower.micro.post_tag``):
    x < 0 -> 0 (ReLU); x <= lo -> lo, then x >= hi -> hi (Clip); bit selects on the comparison masks."""
    out = [f"typedef int32_t dlcc_qe_vi __attribute__((vector_size({4 * lanes})));"]
    out += [f"const dlcc_vf bias{q} = dlcc_vf_load(bias + {q * lanes});" for q in range(nv)]
    sel = ("{{ const dlcc_qe_vi m = (dlcc_qe_vi)({a} {op} {k}); "
           "{a} = (dlcc_vf)((m & (dlcc_qe_vi){k}) | (~m & (dlcc_qe_vi){a})); }}")
    if tag == "r":
        out.append("const dlcc_vf zero = (dlcc_vf){0};")
        steps = [("<", "zero")]
    elif tag.startswith("c"):
        lo, hi = (c_float(float(np.array(int(b, 16), np.uint32).view(np.float32))) for b in tag[1:].split("_"))
        out.append(f"const dlcc_vf lo = (dlcc_vf){{0}} + {lo}, hi = (dlcc_vf){{0}} + {hi};")
        steps = [("<=", "lo"), (">=", "hi")]
    else:
        steps = []
    for row in acc:
        for q, a in enumerate(row):
            out.append(f"{a} += bias{q};")
            out += [sel.format(a=a, op=op, k=k) for op, k in steps]
    return out


def _im2col(name: str, h: int, w: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, ph: int,
            pw: int, xc: int, xh: int, mr: int) -> str:
    """The gather of a row micro-panel of the implicit im2col matrix (contract: ``lower.micro.im2col_micro``),
    the geometry in constants: per k, the panel's pixels are runs along output rows, each read with the
    constant stride sw from one input row (indices clamped into the row and the padding selected as 0, so
    the run vectorizes), a run whose input row is padding written as zeros. A 1x1 kernel (every k one input
    channel at the same pixels): the panel's pixel offsets once, then per k one copy per pixel, unrolled over a
    full panel of mr (runs along rows are at most mr long, and re-deriving them per k cost more than the
    copies: ResNet-50's strided projections, Zen 3, alternated, 3.38 -> 3.21 and 3.03 -> 2.93 ms)."""
    if kh == kw == 1:
        inside = f"ix >= 0 && ix < {w} && iy >= 0 && iy < {h}"
        full = "\n".join(f"            d[{r}] = s[off[{r}]];" for r in range(mr))
        return f"""static void dlcc_uk_{name}(int64_t kc, int64_t k0, int64_t p0, int64_t rows, const float* restrict x,
                                float* restrict ws) {{
    int64_t off[{mr}];
    int pad = 0;
    for (int64_t r = 0; r < rows; ++r) {{
        const int64_t oy = (p0 + r) / {ow}, ox = (p0 + r) % {ow}, iy = oy * {sh} - {ph}, ix = ox * {sw} - {pw};
        off[r] = ({inside}) ? iy * {xh} + ix : -1;
        pad |= off[r] < 0;
    }}
    if (!pad && rows == {mr}) {{
        for (int64_t kk = 0; kk < kc; ++kk) {{
            const float* restrict s = x + (k0 + kk) * {xc};
            float* restrict d = ws + kk * {mr};
{full}
        }}
        return;
    }}
    for (int64_t kk = 0; kk < kc; ++kk) {{  /* (the load's index clamped too, so the select needs no branch) */
        const float* restrict s = x + (k0 + kk) * {xc};
        for (int64_t r = 0; r < rows; ++r) ws[kk * rows + r] = off[r] < 0 ? 0.0f : s[off[r] < 0 ? 0 : off[r]];
    }}
}}
"""
    return f"""static void dlcc_uk_{name}(int64_t kc, int64_t k0, int64_t p0, int64_t rows, const float* restrict x,
                                float* restrict ws) {{
    for (int64_t kk = 0; kk < kc; ++kk) {{
        const int64_t k = k0 + kk, ci = k / {kh * kw}, ky = (k / {kw}) % {kh}, kx = k % {kw};
        float* restrict dst = ws + kk * rows;
        int64_t r = 0, oy = p0 / {ow}, ox = p0 % {ow};
        while (r < rows) {{
            const int64_t seg = (rows - r < {ow} - ox) ? rows - r : {ow} - ox;
            const int64_t iy = oy * {sh} + ky * {dh} - {ph};
            if (iy < 0 || iy >= {h}) {{
                for (int64_t q = 0; q < seg; ++q) dst[r + q] = 0.0f;
            }} else {{
                const float* restrict row = x + ci * {xc} + iy * {xh};
                const int64_t ix0 = ox * {sw} + kx * {dw} - {pw};
                if (ix0 >= 0 && ix0 + (seg - 1) * {sw} < {w}) {{
                    for (int64_t q = 0; q < seg; ++q) dst[r + q] = row[ix0 + q * {sw}];
                }} else {{
                    for (int64_t q = 0; q < seg; ++q) {{
                        const int64_t ix = ix0 + q * {sw};
                        const int64_t cl = ix < 0 ? 0 : (ix >= {w} ? {w - 1} : ix);
                        const float v = row[cl];
                        dst[r + q] = (ix >= 0 && ix < {w}) ? v : 0.0f;
                    }}
                }}
            }}
            r += seg;
            ox = 0;
            ++oy;
        }}
    }}
}}
"""


def _dwplane(name: str, h: int, w: int, oh: int, ow: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int,
             ph: int, pw: int, xh: int, pool_max: bool = False, lanes: int = 16) -> str:
    """One output plane of a depthwise convolution (contract: ``lower.micro.dwconv_micro``), the geometry in
    constants. Rows whose kernel rows are all inside the plane: the columns whose every tap is inside (a
    compile-time range) run as one loop of kh x kw FMAs on loads at constant offsets (contiguous at stride 1:
    it vectorizes; one store per output); other rows, kernel row by kernel row, kw FMAs per pass; the edge
    columns test each tap. ``pool_max`` (``dwmaxplane_``): the maximum over the taps
    inside instead of the weighted sum (-inf where none is; a NaN tap is skipped, as ``v > m ? v : m`` does)."""
    if sh == sw == 1 and ow == w == xh and ow <= DW_FLAT_MAX_OW and oh * ow <= DW_FLAT_MAX:
        return _dwflat(name, h, w, oh, ow, kh, kw, dh, dw, ph, pw, xh, pool_max)
    if (not pool_max and sh == sw == 1 and kh * kw >= DW_PAD_MIN_TAPS
            and _dwpad_floats(oh, ow, kh, kw, dh, dw) <= DW_PAD_MAX):
        return _dwpad(name, h, w, oh, ow, kh, kw, dh, dw, ph, pw, xh, lanes)
    lo = min(ow, -(-pw // sw))  # first ox whose leftmost tap is inside
    last = w - 1 + pw - (kw - 1) * dw
    hi = max(lo, min(ow, last // sw + 1 if last >= 0 else 0))
    if pool_max:
        init = "(-INFINITY)"
        taps_ = [f"r[ox * {sw} + {kx * dw - pw}]" for kx in range(kw)]
        inner = "{ float m = o[ox]; " + " ".join(f"m = {t} > m ? {t} : m;" for t in taps_) + " o[ox] = m; }"
        edge = (f"{{ float m = o[ox]; for (int64_t kx = 0; kx < {kw}; ++kx) {{ const int64_t ix = ox * {sw} + kx * {dw}"
                f" - {pw}; if (ix >= 0 && ix < {w} && r[ix] > m) m = r[ix]; }} o[ox] = m; }}")
        interior = f"for (int64_t ox = {lo}; ox < {hi}; ++ox) {inner}"
        edges = (f"for (int64_t ox = 0; ox < {lo}; ++ox) {edge}\n"
                 f"            for (int64_t ox = {hi}; ox < {ow}; ++ox) {edge}")
        wdecl = "(void)wr;"
    else:
        init = "0.0f"
        taps = " + ".join(f"w{kx} * r[ox * {sw} + {kx * dw - pw}]" for kx in range(kw))
        edge = (f"for (int64_t kx = 0; kx < {kw}; ++kx) {{ const int64_t ix = ox * {sw} + kx * {dw} - {pw}; "
                f"if (ix >= 0 && ix < {w}) s += wr[kx] * r[ix]; }}")
        interior = f"for (int64_t ox = {lo}; ox < {hi}; ++ox) o[ox] += {taps};"
        edges = (f"for (int64_t ox = 0; ox < {lo}; ++ox) {{ float s = 0.0f; {edge} o[ox] += s; }}\n"
                 f"            for (int64_t ox = {hi}; ox < {ow}; ++ox) {{ float s = 0.0f; {edge} o[ox] += s; }}")
        wdecl = " ".join(f"const float w{kx} = wr[{kx}];" for kx in range(kw))
    # rows whose every kernel row is inside the plane: their interior columns take all kh x kw taps in one
    # pass (one store per output), the rest kernel row by kernel row
    r0 = min(oh, -(-ph // sh))
    r1 = max(r0, min(oh, (h - 1 + ph - (kh - 1) * dh) // sh + 1))
    fused = ""
    if not pool_max and r0 < r1 and lo < hi:
        terms = " + ".join(f"wt[{ky * kw + kx}] * r[{ky * dh * xh} + ox * {sw} + {kx * dw - pw}]"
                           for ky in range(kh) for kx in range(kw))
        fused = f"""
        if (oy >= {r0} && oy < {r1}) {{
            const float* restrict r = x + iy0 * {xh};
            float* restrict o = out + oy * {ow};
            for (int64_t ox = {lo}; ox < {hi}; ++ox) o[ox] = {terms};
            for (int64_t ky = 0; ky < {kh}; ++ky) {{
                const float* restrict r = x + (iy0 + ky * {dh}) * {xh};
                const float* restrict wr = wt + ky * {kw};
                {wdecl}
                {edges.replace("o[ox] += s;", "o[ox] = (ky ? o[ox] : 0.0f) + s;")}
            }}
            continue;
        }}"""
    return f"""static void dlcc_uk_{name}(const float* restrict x, const float* restrict wt, float* restrict out) {{
    for (int64_t oy = 0; oy < {oh}; ++oy) {{
        const int64_t iy0 = oy * {sh} - {ph};{fused}
        float* restrict o = out + oy * {ow};
        for (int64_t ox = 0; ox < {ow}; ++ox) o[ox] = {init};
        for (int64_t ky = 0; ky < {kh}; ++ky) {{
            const int64_t iy = iy0 + ky * {dh};
            if (iy < 0 || iy >= {h}) continue;
            const float* restrict r = x + iy * {xh};
            const float* restrict wr = wt + ky * {kw};
            {wdecl}
            {interior}
            {edges}
        }}
    }}
}}
"""


DW_FLAT_MAX = 4096  # planes up to this many pixels take the flat form (a mask table of kw * pixels bytes)
DW_FLAT_MAX_OW = 16  # ... with rows of at most 16 pixels: wider rows run faster with every tap of an interior
# row in one pass (Zen 5, AVX-512, per 64 channels: 56x56 3x3 0.082 -> 0.053 ms, 28x28 5x5 0.061 -> 0.045; 7x7
# and 14x14 5x5 stay faster flat)


DW_PAD_MIN_TAPS = 25  # 5x5 and larger stride-1 kernels: the padded-plane form (``_dwpad``)
DW_PAD_MAX = 16 * 1024  # ... when the padded plane has at most this many floats (on the stack, in L1)


def _dwpad_floats(oh: int, ow: int, kh: int, kw: int, dh: int, dw: int) -> int:
    owp = -(-ow // 16) * 16
    return (oh + (kh - 1) * dh) * (owp + (kw - 1) * dw)


def _dwpad(name: str, h: int, w: int, oh: int, ow: int, kh: int, kw: int, dh: int, dw: int, ph: int, pw: int,
           xh: int, lanes: int) -> str:
    """A stride-1 depthwise plane with a large kernel (ConvNeXt's 7x7, EfficientNet's 5x5): the plane copied
    into a local one with a zero ring (and zero columns up to whole vectors of 16), so that no tap tests an edge
    (the scalar edge columns of the other form took most of its time). Per output row, groups of up to 4 vectors
    of outputs, each with two accumulators (even and odd kernel rows: two shorter FMA chains); per kernel row,
    its kw weights are broadcast once for the group; the row goes out through a local row."""
    owp = -(-ow // 16) * 16
    wp = owp + (kw - 1) * dw
    hp = oh + (kh - 1) * dh
    rows = min(h, hp - ph)  # input rows inside the padded plane
    cols = min(w, wp - pw)
    nvec = owp // lanes
    groups = [(g, min(4, nvec - g)) for g in range(0, nvec, 4)]
    body = []
    for g0, n in groups:
        acc = [[f"a{v}_{e}" for e in range(2)] for v in range(n)]
        lines = [f"dlcc_vf {', '.join(a for pair in acc for a in pair)};"]
        lines += [f"{a} = (dlcc_vf){{0}};" for pair in acc for a in pair]
        for ky in range(kh):
            lines.append(f"{{ const float* restrict r = pad + (oy + {ky * dh}) * {wp} + {g0 * lanes};")
            lines.append("  " + " ".join(f"const float w{kx} = wt[{ky * kw + kx}];" for kx in range(kw)))
            for v in range(n):
                a = acc[v][ky % 2]
                fmas = " ".join(f"{a} += w{kx} * dlcc_vf_load(r + {v * lanes + kx * dw});" for kx in range(kw))
                lines.append(f"  {fmas}")
            lines.append("}")
        lines += [f"dlcc_vf_store(orow + {(g0 + v) * lanes}, {acc[v][0]} + {acc[v][1]});" for v in range(n)]
        body.append("{\n" + indent("\n".join(lines)) + "\n}")
    return f"""static void dlcc_uk_{name}(const float* restrict x, const float* restrict wt, float* restrict out) {{
    float pad[{hp * wp}];
    float orow[{owp}];
    memset(pad, 0, sizeof pad);
    for (int64_t y = 0; y < {rows}; ++y) memcpy(pad + (y + {ph}) * {wp} + {pw}, x + y * {xh}, {4 * cols});
    for (int64_t oy = 0; oy < {oh}; ++oy) {{
{indent(chr(10).join(body), 2)}
        memcpy(out + oy * {ow}, orow, {4 * ow});
    }}
}}
"""


def _dwflat(name: str, h: int, w: int, oh: int, ow: int, kh: int, kw: int, dh: int, dw: int, ph: int, pw: int,
            xh: int, pool_max: bool = False) -> str:
    """The plane of a stride-1 depthwise convolution whose output rows are as long as the input's (``ow ==
    w``): a tap (ky, kx) reads the input at the constant flat offset (ky*dh - ph)*xh + kx*dw - pw from the
    output pixel, so each tap is one loop over the pixels of its valid output rows (compile-time bounds), a
    per-column mask table zeroing the columns whose tap falls outside the row (the read then lands in the
    neighbouring row, or is skipped where it would leave the plane). No per-row edge code: small planes
    (7x7, 14x14) vectorize whole. Needs contiguous input rows (xh == w)."""
    n = oh * ow
    masks, loops = [], []
    for kx in range(kw):
        dx = kx * dw - pw
        cols = [1 if 0 <= ox + dx < w else 0 for ox in range(ow)]
        masks.append(f"static const unsigned char m{kx}[{n}] = {{{', '.join(str(v) for v in cols * oh)}}};")
    last = (h - 1) * xh + w - 1
    for ky in range(kh):
        dy = ky * dh - ph
        oy0, oy1 = max(0, -dy), min(oh, h - dy)
        if oy0 >= oy1:
            continue
        for kx in range(kw):
            off = dy * xh + kx * dw - pw
            # pixels whose flat read leaves the plane have their tap outside the row: masked anyway
            p0, p1 = max(oy0 * ow, -off), min(oy1 * ow, last + 1 - off)
            if p0 < p1:
                if pool_max:
                    loops.append(f"for (int64_t p = {p0}; p < {p1}; ++p) "
                                 f"out[p] = (m{kx}[p] && x[p + {off}] > out[p]) ? x[p + {off}] : out[p];")
                else:
                    loops.append(f"{{ const float wk = wt[{ky * kw + kx}];\n"
                                 f"  for (int64_t p = {p0}; p < {p1}; ++p) "
                                 f"out[p] += m{kx}[p] ? wk * x[p + {off}] : 0.0f;\n}}")
    init = "(-INFINITY)" if pool_max else "0.0f"
    body = "\n".join([*masks, f"for (int64_t p = 0; p < {n}; ++p) out[p] = {init};", *loops,
                      "(void)wt;" if pool_max else ""])
    return (f"static void dlcc_uk_{name}(const float* restrict x, const float* restrict wt, float* restrict out) {{\n"
            f"{indent(body)}\n}}\n")


def _dconv(name: str, no: int, px: int, cbi: int, kh: int, kw: int, sw: int, dh: int, dw: int, xcb: int, xrow: int,
           wskip: int, kwf: int | None = None, *, lanes: int, accumulate: bool = False,
           pixel_major: bool = False, prefetch: int = 0, flat: tuple[int, int] | None = None, xci: int = 0) -> str:
    """A direct-convolution register tile (contract: ``lower.micro.dconv_micro``): accumulators a{j}_{p} hold
    output channels j*lanes.. of pixel p; the weights of one input channel and tap are no / lanes vector
    loads, each pixel's input value one broadcast (on AVX-512, the FMA's memory operand); the tile is
    transposed in registers (``_transpose_store``) into ``c``, channel-major, or with ``pixel_major`` stored
    as held (pixel p at ``c + p*ldc``). Without dilation along the row, a kernel row's taps and channels are
    one run of kw*cbi consecutive inputs per pixel. ``prefetch``: that many lines from ``pf`` prefetched per channel
    block (GCC and Clang; elsewhere ``pf`` is unread). ``flat`` (ow, rowstep): the pixels are q0 .. q0 + px - 1 of a
    plane taken as one row, each pixel's input through its own pointer (set once per call), the taps' and
    blocks' offsets shared. ``xci``: an NCHW input read in place (channel i ``xci`` floats on, a row's pixels
    adjacent): per kernel column, the block's channels in turn."""
    if no % lanes:
        raise ValueError(f"dconv micro-kernel: {no} output channels are not whole vectors of {lanes}")
    nv = no // lanes
    acc = [[f"a{j}_{p}" for p in range(px)] for j in range(nv)]
    inner = [f"const dlcc_vf w{j} = dlcc_vf_load(w + {j * lanes});" for j in range(nv)]
    for p in range(px):
        fmas = " ".join(f"{acc[j][p]} += w{j} * xv;" for j in range(nv))
        load = f"x{p}[o + i]" if flat is not None else f"xp[{p * sw} + i * {xci}]" if xci else f"xp[{p * sw * cbi} + i]"
        inner.append(f"{{ const float xv = {load}; {fmas} }}")
    inner.append(f"w += {no};")
    lines = [f"dlcc_vf {', '.join(a for row in acc for a in row)};"]
    lines += [f"{a} = (dlcc_vf){{0}};" for row in acc for a in row]
    if flat is not None:  # (each pixel's input pointer; the loops below move one offset o shared by all of them)
        ow, rowstep = flat
        lines += [f"const float* restrict x{p} = x + ((q0 + {p}) / {ow}) * {rowstep} "
                  f"+ ((q0 + {p}) % {ow}) * {sw * cbi};" for p in range(px)]
    body = indent("\n".join(inner), 3)
    at = f"b * {xcb} + ky * {dh * xrow}" + (f" + kx * {dw * cbi}" if dw != 1 else "")
    decl = f"const int64_t o = {at};" if flat is not None else f"const float* restrict xp = x + {at};"
    head = f"        {decl}\n"
    if xci:  # (per kernel column, the block's channels: the packed weight's order)
        at = f"b * {xcb} + ky * {dh * xrow} + kx * {dw}"
        taps = (f"    for (int64_t kx = 0; kx < {kw}; ++kx) {{\n        const float* restrict xp = x + {at};\n"
                f"        for (int64_t i = 0; i < {cbi}; ++i) {{\n{body}\n        }}\n    }}")
    elif dw == 1:
        taps = f"    {{\n{head}        for (int64_t i = 0; i < {kw * cbi}; ++i) {{\n{body}\n        }}\n    }}"
    else:
        taps = (f"    for (int64_t kx = 0; kx < {kw}; ++kx) {{\n"
                f"{head}        for (int64_t i = 0; i < {cbi}; ++i) {{\n{body}\n        }}\n    }}")
    skip = f"\n    w += {wskip};" if wskip else ""
    kwf = kw if kwf is None else kwf
    if kwf != kw:  # the kernel columns of each row this tile does not read
        taps = f"    {{\n{indent(taps, 1)}\n        w += {(kwf - kw) * cbi * no};\n    }}"
    ahead = ""
    if prefetch:  # (a few lines per block: a burst at once would hold the miss buffers the tile's own loads need)
        ahead = "\n" + _prefetch(f"    for (int64_t j = 0; j < {prefetch}; ++j) ", f"pf + 16 * (b * {prefetch} + j)")
    lines.append(f"for (int64_t b = 0; b < ncb; ++b) {{{ahead}\n    for (int64_t ky = 0; ky < {kh}; ++ky)\n"
                 f"{indent(taps, 2)}{skip}\n}}")
    if prefetch:
        lines.append("(void)pf;")
    if pixel_major:
        for j in range(nv):
            for p in range(px):
                at = f"c + {p} * ldc + {j * lanes}"
                val = f"{acc[j][p]} + dlcc_vf_load({at})" if accumulate else acc[j][p]
                lines.append(f"dlcc_vf_store({at}, {val});")
    for j in range(nv if not pixel_major else 0):
        for pb in range(0, px, lanes):
            rows = [acc[j][pb + r] if pb + r < px else "(dlcc_vf){0}" for r in range(lanes)]
            lines.append("{\n" + indent(_transpose_store(rows, lanes, f"c + {j * lanes} * ldc + {pb}", accumulate))
                         + "\n}")
    attr = "DLCC_NO_PCOM " if cbi < lanes else ""  # (cbase.vector_helpers)
    pfp = (", int64_t q0" if flat is not None else "") + (", const float* restrict pf" if prefetch else "")
    return (f"{attr}static void dlcc_uk_{name}(int64_t ncb, const float* restrict x, const float* restrict w, "
            f"float* restrict c, int64_t ldc{pfp}) {{\n{indent(chr(10).join(lines))}\n}}\n")


def _prefetch(head: str, at: str) -> str:
    """C prefetching the 64-byte line at ``at`` for reading, after ``head`` (a loop or a test), on GCC and Clang
    (elsewhere nothing: the micro-kernels that take a ``pf`` pointer also say ``(void)pf;``)."""
    return f"#if defined(__GNUC__) || defined(__clang__)\n{head}__builtin_prefetch({at}, 0, 3);\n#endif"


def _dwc(name: str, cbi: int, px: int, kh: int, kw: int, sw: int, dh: int, dw: int, xrow: int, *, lanes: int,
         pool_max: bool = False, pixel_major: bool = False, xpix: int = 0) -> str:
    """A depthwise-convolution register tile (contract: ``lower.micro.dwc_micro``): accumulator a{p} holds the
    cbi (= lanes) channels of pixel p; per tap, the channels' weights are one vector load and each pixel's
    inputs one vector (on AVX-512, the FMA's memory operand); the tile is transposed in registers
    (``_transpose_store``) into ``c``, channel-major. ``pool_max``: each tap's inputs replace the accumulator
    where they are greater (a compare and a bit select: NaN never replaces), from -inf. ``xpix``: the input's
    pixel stride (0: ``cbi``)."""
    xpix = xpix or cbi
    if cbi != lanes:
        raise ValueError(f"dwc micro-kernel: a block of {cbi} channels is not one vector of {lanes}")
    acc = [f"a{p}" for p in range(px)]
    init = "(dlcc_vf){0} - INFINITY" if pool_max else "(dlcc_vf){0}"
    lines = [f"dlcc_vf {', '.join(acc)};"] + [f"{a} = {init};" for a in acc]
    if pool_max:
        lines.insert(0, f"typedef int32_t dlcc_dwc_vi __attribute__((vector_size({4 * lanes})));")
    for ky in range(kh):
        for kx in range(kw):
            base = ky * dh * xrow + kx * dw * xpix
            if pool_max:
                lines.append(" ".join(
                    f"{{ const dlcc_vf v = dlcc_vf_load(x + {base + p * sw * xpix}); const dlcc_dwc_vi m = v > {a}; "
                    f"{a} = (dlcc_vf)((m & (dlcc_dwc_vi)v) | (~m & (dlcc_dwc_vi){a})); }}" for p, a in enumerate(acc)))
            else:
                fmas = " ".join(f"{acc[p]} += wv * dlcc_vf_load(x + {base + p * sw * xpix});" for p in range(px))
                lines.append(f"{{ const dlcc_vf wv = dlcc_vf_load(w + {(ky * kw + kx) * cbi}); {fmas} }}")
    if pool_max:
        lines.append("(void)w;")
    if pixel_major:  # (pixel_major: ldc unread)
        lines += [f"dlcc_vf_store(c + {p * cbi}, {a});" for p, a in enumerate(acc)] + ["(void)ldc;"]
    for pb in range(0, px if not pixel_major else 0, lanes):
        rows = [acc[pb + r] if pb + r < px else "(dlcc_vf){0}" for r in range(lanes)]
        lines.append("{\n" + indent(_transpose_store(rows, lanes, f"c + {pb}")) + "\n}")
    return (f"static void dlcc_uk_{name}(const float* restrict x, const float* restrict w, float* restrict c, "
            f"int64_t ldc) {{\n{indent(chr(10).join(lines))}\n}}\n")


def _transpose(rows: list[str], lanes: int) -> list[str]:
    """C declaring r0.. r{lanes-1}, the transpose of the lanes x lanes block whose rows are the vectors ``rows``
    (r{l}: lane l of every input row). log2(lanes) rounds of two-source shuffles, each swapping the
    off-diagonal sub-blocks of every 2h x 2h block (h = lanes/2 ... 1)."""
    out = [f"dlcc_vf r{i} = {v};" for i, v in enumerate(rows)]
    h = lanes // 2
    while h:
        for i in range(lanes):
            if i & h:
                continue
            lo = [pos if not pos & h else lanes + pos - h for pos in range(lanes)]
            hi = [pos + h if not pos & h else lanes + pos for pos in range(lanes)]
            out.append(f"{{ const dlcc_vf u = __builtin_shufflevector(r{i}, r{i + h}, {', '.join(map(str, lo))}); "
                       f"r{i + h} = __builtin_shufflevector(r{i}, r{i + h}, {', '.join(map(str, hi))}); r{i} = u; }}")
        h //= 2
    return out


def _transpose_store(rows: list[str], lanes: int, dest: str, accumulate: bool = False) -> str:
    """Store the transpose of the lanes x lanes block whose rows are the vectors ``rows``: row l of the
    transpose (lane l of every input row) as one vector at ``dest + l * ldc`` (``_transpose``)."""
    out = _transpose(rows, lanes)
    if accumulate:  # (a later block of input channels: added to what the earlier ones stored)
        out += [f"dlcc_vf_store({dest} + {i} * ldc, r{i} + dlcc_vf_load({dest} + {i} * ldc));" for i in range(lanes)]
    else:
        out += [f"dlcc_vf_store({dest} + {i} * ldc, r{i});" for i in range(lanes)]
    return "\n".join(out)


def _nchwc(name: str, cbi: int, h: int, w: int, ph: int, pw: int, hp: int, wp: int, xw: int = 1, *, lanes: int,
           ring_min: bool = False, scaled: bool = False) -> str:
    """The repacking of one channel block with its zero ring (contract: ``lower.micro.nchwc_micro``): rows in
    the ring are zeroed whole; inside, each pixel's cbi channels are gathered (stores stay contiguous). Rows
    and columns beyond hp x wp (which no tap reads) are not copied. With a full block of cbi = lanes channels,
    each run of lanes pixels is lanes vector loads (one per channel), a transpose in registers
    (``_transpose_store``) and lanes vector stores (one per pixel); from a channels-last input (column stride
    ``xw`` > 1, channel stride 1) each pixel's channels are one vector load and store. ``scaled``: channel i
    times ``sc[i]``, one vector product per vector moved (``lower.micro.nchwc_micro``)."""
    wc = max(0, min(w, wp - pw))  # columns copied
    z = "-INFINITY" if ring_min else "0.0f"  # the ring's value
    col = f" * {xw}" if xw != 1 else ""
    fast = ""
    k = " * k" if scaled else ""  # the per-channel scale: a vector of the block's channels, or channel i's float
    ki = (lambda i: f" * sc[{i}]") if scaled else (lambda i: "")
    if xw != 1 and cbi == lanes:
        kv = " const dlcc_vf k = dlcc_vf_load(sc);" if scaled else ""
        fast = f"""
        if (nci == {cbi} && xc == 1) {{{kv}
            for (int64_t xx = 0; xx < {wc}; ++xx)
                dlcc_vf_store(d + (xx + {pw}) * {cbi}, dlcc_vf_load(s + xx * {xw}){k});
            continue;
        }}"""
    elif cbi == lanes and wc >= lanes:
        rows = [f"dlcc_vf_load(s + {i} * xc + xx){ki(i)}" for i in range(lanes)]
        tr = indent(_transpose_store(rows, lanes, f"d + (xx + {pw}) * {cbi}"), 3)
        fast = f"""
        if (nci == {cbi}) {{
            const int64_t ldc = {cbi};
            int64_t xx = 0;
            for (; xx + {lanes} <= {wc}; xx += {lanes}) {{
{tr}
            }}
            for (; xx < {wc}; ++xx)
                for (int64_t i = 0; i < {cbi}; ++i) d[(xx + {pw}) * {cbi} + i] = s[i * xc + xx]{ki("i")};
            continue;
        }}"""
    elif xw == 1 and cbi < lanes:
        # a block narrower than a vector from NCHW (a 3-channel image): with every channel present, each
        # pixel's cbi values are cbi constant-indexed copies, no per-channel test (ResNet-50's stem, Zen 3,
        # alternated: within noise at 1 thread, 1.83 -> 1.72 ms at 2)
        fast = f"""
        if (nci == {cbi}) {{
            for (int64_t xx = 0; xx < {wc}; ++xx) {{
{indent(chr(10).join(f"d[(xx + {pw}) * {cbi} + {i}] = s[{i} * xc + xx]{ki(i)};" for i in range(cbi)), 4)}
            }}
            continue;
        }}"""
    sc = ", const float* restrict sc" if scaled else ""
    # The ring's rows above and below are loops of their own, not a branch in the loop over rows: GCC 12.2 -O3
    # (AVX2, AVX-512) if-converts such a loop, vectorizes it over rows and stores the wrong elements (a 7-channel
    # block on a 7 x 1 plane kept one channel per row; tests/fuzz/test_differential.py, graph seed 376). The
    # channels past nci in a block stay one loop of cbi with a masked load (a vector per pixel: split into two loops
    # at nci, ShuffleNetV2's partial blocks ran 1.5% slower).
    row = f"""float* restrict d = ws + (yy - y0) * {wp * cbi};
        for (int64_t q = 0; q < {wp * cbi}; ++q) d[q] = {z};"""
    return f"""static void dlcc_uk_{name}(const float* restrict x{sc}, int64_t xc, int64_t xh, int64_t nci,
                                int64_t y0, int64_t rows, float* restrict ws) {{
    const int64_t y1 = y0 + rows, a = y0 > {ph} ? y0 : {ph}, b = y1 < {ph + h} ? y1 : {ph + h};
    for (int64_t yy = y0; yy < (y1 < {ph} ? y1 : {ph}); ++yy) {{
        {row}
    }}
    for (int64_t yy = a; yy < b; ++yy) {{
        float* restrict d = ws + (yy - y0) * {wp * cbi};
        const int64_t iy = yy - {ph};
        for (int64_t q = 0; q < {pw * cbi}; ++q) d[q] = {z};
        for (int64_t q = {(pw + wc) * cbi}; q < {wp * cbi}; ++q) d[q] = {z};
        const float* restrict s = x + iy * xh;{fast}
        for (int64_t xx = 0; xx < {wc}; ++xx)
            for (int64_t i = 0; i < {cbi}; ++i)
                d[(xx + {pw}) * {cbi} + i] = i < nci ? s[i * xc + xx{col}]{ki("i")} : {z};
    }}
    for (int64_t yy = (y0 > {ph + h} ? y0 : {ph + h}); yy < y1; ++yy) {{
        {row}
    }}
}}
"""


def _wino_bt(d: list[str]) -> list[str]:
    """The six rows of B^T d (F(4x4, 3x3); ``lower.micro.WINO_BT``) as C expressions of the vectors ``d``."""
    return [f"{d[4]} + 4.0f * {d[0]} - 5.0f * {d[2]}", f"({d[3]} + {d[4]}) - 4.0f * ({d[1]} + {d[2]})",
            f"({d[4]} - {d[3]}) + 4.0f * ({d[1]} - {d[2]})", f"({d[4]} - {d[2]}) + 2.0f * ({d[3]} - {d[1]})",
            f"({d[4]} - {d[2]}) - 2.0f * ({d[3]} - {d[1]})", f"{d[5]} + 4.0f * {d[1]} - 5.0f * {d[3]}"]


def _wino_at(m: list[str]) -> list[str]:
    """The four rows of A^T m (``lower.micro.WINO_AT``) as C expressions of the vectors ``m``."""
    s12, d12, s34, d34 = f"({m[1]} + {m[2]})", f"({m[1]} - {m[2]})", f"({m[3]} + {m[4]})", f"({m[3]} - {m[4]})"
    return [f"{m[0]} + {s12} + {s34}", f"{d12} + 2.0f * {d34}", f"{s12} + 4.0f * {s34}",
            f"{d12} + 8.0f * {d34} + {m[5]}"]


def _wgi(cbi: int, xrow: int, ldv: int, *, lanes: int) -> str:
    """The Winograd input transform of one tile (contract: ``lower.micro.wgi_micro``): the 6x6 input vectors
    (cbi = lanes channels each), B^T along the columns, then along the rows, 36 vector stores."""
    if cbi != lanes:
        raise ValueError(f"wgi micro-kernel: a block of {cbi} channels is not one vector of {lanes}")
    lines = []
    for z in range(6):
        d = [f"dlcc_vf_load(x + {y * xrow + z * cbi})" for y in range(6)]
        lines.append(f"const dlcc_vf {', '.join(f'd{y}_{z} = {d[y]}' for y in range(6))};")
        col = [f"d{y}_{z}" for y in range(6)]
        lines.append(f"const dlcc_vf {', '.join(f't{r}_{z} = {e}' for r, e in enumerate(_wino_bt(col)))};")
    for r in range(6):
        for sx, e in enumerate(_wino_bt([f"t{r}_{z}" for z in range(6)])):
            lines.append(f"dlcc_vf_store(v + {(r * 6 + sx) * ldv}, {e});")
    return (f"static void dlcc_uk_wgi_{cbi}_{xrow}_{ldv}(const float* restrict x, float* restrict v) {{\n"
            f"{indent(chr(10).join(lines))}\n}}\n")


def _wgo(cbi: int, ldm: int, rp: int, *, lanes: int, pixel_major: bool = False) -> str:
    """The Winograd output transform of one tile (contract: ``lower.micro.wgo_micro``): A^T along the columns
    of the 6x6 vectors of M, then along the rows: 16 vectors, one per output pixel (channels in the lanes);
    transposed in registers (``_transpose``, lanes x lanes at a time) so that each channel's pixels are one
    vector, stored as 4-pixel pieces of the tile's rows; ``pixel_major`` (``wgop_``): each pixel's vector
    stored as it is."""
    if cbi != lanes or lanes < 4 or 16 % lanes:
        raise ValueError(f"wgo micro-kernel: {cbi} channels on vectors of {lanes}")
    lines = ["typedef float dlcc_wg4 __attribute__((vector_size(16)));"]
    def decl(names: list[str], exprs: list[str]) -> str:
        return "const dlcc_vf " + ", ".join(f"{n} = {e}" for n, e in zip(names, exprs, strict=True)) + ";"

    for sx in range(6):
        col = [f"m{r}_{sx}" for r in range(6)]
        lines.append(decl(col, [f"dlcc_vf_load(m + {(r * 6 + sx) * ldm})" for r in range(6)]))
        lines.append(decl([f"t{y}_{sx}" for y in range(4)], _wino_at(col)))
    for y in range(4):
        lines.append(decl([f"p{y * 4 + z}" for z in range(4)], _wino_at([f"t{y}_{sx}" for sx in range(6)])))
    if pixel_major:
        lines += [f"dlcc_vf_store(c + {y * rp + z} * ldc, p{y * 4 + z});" for y in range(4) for z in range(4)]
        return (f"static void dlcc_uk_wgop_{cbi}_{ldm}_{rp}(const float* restrict m, float* restrict c, "
                f"int64_t ldc) {{\n{indent(chr(10).join(lines[1:]))}\n}}\n")
    for gi in range(16 // lanes):
        block = _transpose([f"p{gi * lanes + j}" for j in range(lanes)], lanes)
        for o in range(lanes):
            for q in range(lanes // 4):
                row = (gi * lanes + 4 * q) // 4
                sel = ", ".join(str(4 * q + j) for j in range(4))
                block.append(f"{{ const dlcc_wg4 w = __builtin_shufflevector(r{o}, r{o}, {sel}); "
                             f"memcpy(c + {o} * ldc + {row * rp}, &w, 16); }}")
        lines.append("{\n" + indent("\n".join(block)) + "\n}")
    return (f"static void dlcc_uk_wgo_{cbi}_{ldm}_{rp}(const float* restrict m, float* restrict c, int64_t ldc) {{\n"
            f"{indent(chr(10).join(lines))}\n}}\n")


def _attn(sp: AttnSpec, lanes: int) -> str:
    """The C of one head of attention (contract: ``lower.micro.AttnSpec``), every size and stride a constant."""
    L, qb, nv = lanes, sp.qb, sp.nv
    skp, dp = -(-sp.sk // L) * L, -(-sp.d // L) * L
    nvk, nvd = skp // L, dp // L
    scale, fill = c_float(sp.scale_value), c_float(sp.fill_value)

    def tile(kind: str, n: int, start: str) -> str:
        """qb rows x n vectors of the scores (kind "qk": at key column ``start``) or of the output (kind "pv":
        at feature ``start``), accumulated over the e < d features or j < sk keys."""
        acc = [[f"a{r}_{c}" for c in range(n)] for r in range(qb)]
        lines = [f"dlcc_vf {', '.join(a for row in acc for a in row)};"]
        lines += [f"{a} = (dlcc_vf){{0}};" for row in acc for a in row]
        if kind == "qk":
            loads = [f"const dlcc_vf b{c} = dlcc_vf_load(kt + e * {skp} + {start} + {c * L});" for c in range(n)]
            bcast = [f"q{r}[e * {sp.qd}]" for r in range(qb)]
            loop = f"for (int64_t e = 0; e < {sp.d}; ++e)"
        else:
            loads = [f"const dlcc_vf b{c} = dlcc_vf_load(vp + j * {dp} + {start} + {c * L});" for c in range(n)]
            bcast = [f"p[{r * skp} + j]" for r in range(qb)]
            loop = f"for (int64_t j = 0; j < {sp.sk}; ++j)"
        body = list(loads)
        for r in range(qb):
            fmas = " ".join(f"{acc[r][c]} += x{r} * b{c};" for c in range(n))
            body.append(f"{{ const float x{r} = {bcast[r]}; {fmas} }}")
        lines.append(f"{loop} {{\n{indent(chr(10).join(body))}\n}}")
        if kind == "qk":
            lines += [f"dlcc_vf_store(p + {r * skp} + {start} + {c * L}, {acc[r][c]} * sc);"
                      for r in range(qb) for c in range(n)]
        else:
            vec = sp.od == 1 and sp.d % L == 0
            for r in range(qb):
                st = []
                for c in range(n):
                    val = f"{acc[r][c]} * rinv[{r}]"
                    if vec:
                        st.append(f"dlcc_vf_store(o + (i0 + {r}) * {sp.os} + {start} + {c * L}, {val});")
                    else:
                        e = f"{start} + {c * L} + l"
                        st.append(f"{{ float t[{L}]; dlcc_vf_store(t, {val}); for (int64_t l = 0; l < {L}; ++l) "
                                  f"if ({e} < {sp.d}) o[(i0 + {r}) * {sp.os} + ({e}) * {sp.od}] = t[l]; }}")
                guard = f"if (i0 + {r} < {sp.sq}) " if sp.sq % qb else ""
                lines.append(f"{guard}{{\n{indent(chr(10).join(st))}\n}}")
        return "{\n" + indent("\n".join(lines)) + "\n}"

    def chunks(kind: str, nvec: int, var: str) -> list[str]:
        """The nvec vectors in as few tiles of at most nv vectors as can be, of balanced widths (13 vectors:
        4, 3, 3, 3 rather than 4, 4, 4, 1)."""
        n = -(-nvec // nv)
        q, rem = divmod(nvec, n)
        out, start = [], 0
        for width, count in ((q + 1, rem), (q, n - rem)):
            if count == 1:
                out.append(tile(kind, width, str(start)))
            elif count > 1:
                stop = start + count * width * L
                out.append(f"for (int64_t {var} = {start}; {var} < {stop}; {var} += {width * L}) "
                           + tile(kind, width, var))
            start += count * width * L
        return out

    mask = ""
    if sp.mk:
        mask = f" x += m[i * {sp.ms} + j * {sp.mj}];"
    causal = f" x = (j > i + {sp.sk - sp.sq}) ? {fill} : x;" if sp.causal else ""
    m_param = "const float* restrict m, " if sp.mk else ""
    qrows = "\n".join(f"    const float* restrict q{r} = q + ((i0 + {r} < {sp.sq}) ? i0 + {r} : {sp.sq - 1}) * {sp.qs};"
                       for r in range(qb))
    kpack = (f"for (int64_t j = 0; j < {sp.sk}; ++j)\n    for (int64_t e = 0; e < {sp.d}; ++e) "
             f"kt[e * {skp} + j] = k[j * {sp.ks} + e * {sp.kd}];") if sp.kd == 1 else \
        (f"for (int64_t e = 0; e < {sp.d}; ++e)\n    for (int64_t j = 0; j < {sp.sk}; ++j) "
         f"kt[e * {skp} + j] = k[j * {sp.ks} + e * {sp.kd}];")
    kzero = (f"\nfor (int64_t e = 0; e < {sp.d}; ++e)\n    for (int64_t j = {sp.sk}; j < {skp}; ++j) "
             f"kt[e * {skp} + j] = 0.0f;") if skp > sp.sk else ""
    vzero = f"\n    for (int64_t e = {sp.d}; e < {dp}; ++e) vp[j * {dp} + e] = 0.0f;" if dp > sp.d else ""
    pad = f"\n        for (int64_t j = {sp.sk}; j < {skp}; ++j) pr[j] = -INFINITY;" if skp > sp.sk else ""
    qk = "\n".join(chunks("qk", nvk, "jc"))
    pv = "\n".join(chunks("pv", nvd, "ec"))
    return f"""static void dlcc_uk_{sp.name}(const float* restrict q, const float* restrict k, const float* restrict v,
        {m_param}float* restrict o, float* restrict ws) {{
    typedef int32_t dlcc_attn_vi __attribute__((vector_size({4 * L})));
    float* restrict kt = ws;  /* K transposed: {sp.d} rows of {skp} keys */
    float* restrict vp = ws + {sp.d * skp};  /* V: {sp.sk} rows of {dp} features */
    float* restrict p = vp + {sp.sk * dp};  /* {qb} rows of {skp} scores, then probabilities */
    const dlcc_vf sc = (dlcc_vf){{0}} + {scale};
{indent(kpack)}{indent(kzero)}
    for (int64_t j = 0; j < {sp.sk}; ++j) {{
        for (int64_t e = 0; e < {sp.d}; ++e) vp[j * {dp} + e] = v[j * {sp.vs} + e * {sp.vd}];{vzero}
    }}
    for (int64_t i0 = 0; i0 < {sp.sq}; i0 += {qb}) {{
{qrows}
        float rinv[{qb}];
{indent(qk, 2)}
        for (int64_t r = 0; r < {qb}; ++r) {{
            const int64_t i = (i0 + r < {sp.sq}) ? i0 + r : {sp.sq - 1};
            float* restrict pr = p + r * {skp};
            for (int64_t j = 0; j < {sp.sk}; ++j) {{
                float x = pr[j];{causal}{mask}
                pr[j] = x;
            }}{pad}
            dlcc_vf vmx = dlcc_vf_load(pr);
            for (int64_t jv = {L}; jv < {skp}; jv += {L}) {{
                const dlcc_vf x = dlcc_vf_load(pr + jv);
                const dlcc_attn_vi c = x > vmx;
                vmx = (dlcc_vf)((c & (dlcc_attn_vi)x) | (~c & (dlcc_attn_vi)vmx));
            }}
            float mx = vmx[0];
            for (int64_t l = 1; l < {L}; ++l) mx = vmx[l] > mx ? vmx[l] : mx;
            float lane[{L}];
            for (int64_t l = 0; l < {L}; ++l) lane[l] = 0.0f;
            for (int64_t jv = 0; jv < {skp}; jv += {L}) {{
                for (int64_t l = 0; l < {L}; ++l) {{
                    const float e = dlcc_vm_expneg(pr[jv + l] - mx);
                    pr[jv + l] = e;
                    lane[l] += e;
                }}
            }}
            float sum = 0.0f;
            for (int64_t l = 0; l < {L}; ++l) sum += lane[l];
            rinv[r] = 1.0f / sum;
        }}
{indent(pv, 2)}
    }}
}}
"""
