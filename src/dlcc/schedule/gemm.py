"""The schedule of a packed GEMM for one target: register tile, cache blocks, threads and workspace.

What goes in: the product's sizes (M rows of A and C, N columns of B and C, K), a ``Target`` and the
thread count. What comes out: a ``GemmPlan`` that the loop-IR lowering of MatMul/Gemm follows
(``dlcc.codegen.templates.gemm``) and whose workspace the memory planner places before any C exists.

Structure (BLIS, with MLAS's order of the two inner loops): B, a weight, is packed at compile time into
micro-panels of ``nr`` columns (K x nr each, zero beyond the last column). Per thread, for each K block
of ``kc``: the thread's rows of A are packed into its workspace (micro-panels of ``mr`` rows, k-major);
then for each column block of ``nc`` (B's kc x nc block stays in L2), for each row micro-panel (kc x mr,
in L1), for each column micro-panel: the mr x nr micro-kernel. The register tile: nr = 2 vectors on
x86 (3 on 32-register NEON), mr = as many rows as the remaining registers hold (AVX-512 14 x 32,
AVX2 6 x 16, NEON 8 x 12). kc keeps an A micro-panel in half of L1; nc keeps a B block in half of L2.
Threads split the row micro-panels (each thread packs only its rows); with fewer row micro-panels than
threads they split the column micro-panels instead. When a thread's column micro-panels are one block (B's
K block stays in L2 whole: ConvNeXt's 3136 x 384 x 96), each row micro-panel of A is packed right before
its tiles instead, so that it is read from L1 and the packed rows never make a pass through memory; and
when it runs against at most ``UNPACKED_A_MAX_PANELS`` column micro-panels (ConvNeXt's 3136 x 384 -> 96, 3
panels), a row-major A is not packed at all: ``gemmr_`` broadcasts each value from its row in place (the
transposing copy was a sixth of that product: 1.05 -> 0.87 ms, Zen 5, 1 thread).
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
    If,
    Load,
    Micro,
    Ptr,
    Select,
    Stmt,
    Store,
    Var,
    simplify,
)
from dlcc.lower.micro import gemm_micro, gemmb_micro, gemmr_micro, gemmt_micro, im2col_micro
from dlcc.schedule.loops import PAR_MIN_FLOPS, PAR_MIN_FLOPS_WS, share
from dlcc.schedule.target import Target

__all__ = ["MIN_N", "POINTWISE_ROWS_MAX_OW", "ConvGeometry", "GemmPlan", "b_in_place", "conv_gemm_pays",
           "gemm_batched_dims", "gemm_func", "gemm_func_batched", "gemm_func_conv", "gemm_func_wconst", "pack_a",
           "pack_b", "plan_gemm", "plan_gemm_batched", "plan_gemm_conv", "plan_gemm_wconst", "register_tile",
           "tile_rows"]

MIN_N = 8  # below this many columns a product is a set of dot products (schedule.matmul.dots_func)
# a row micro-panel of A read in place (gemmr_) rather than packed when a thread runs it against at most this
# many column micro-panels (the packing, a transposing copy, is then a large share of the panel's work)
UNPACKED_A_MAX_PANELS = 8


@dataclass(frozen=True)
class GemmPlan:
    m: int
    n: int
    k: int
    mr: int
    nr: int
    kc: int
    nc: int  # column micro-panels per column block
    tm: int  # threads over row micro-panels
    tn: int  # threads over column micro-panels
    pack: str = "a"  # run-time packing into workspace: "a" (B is a weight), "b" (A is a weight), "i" (im2col),
    # "ab" (both computed at run time, batched)
    batch: int = 1  # "b": products with the same A, one after the other (a convolution's images)

    @property
    def lanes(self) -> int:
        return self.nr // self.nvec

    @property
    def nvec(self) -> int:
        return 3 if self.nr % 3 == 0 else 2

    @property
    def row_blocks(self) -> int:
        return -(-self.m // self.mr)

    @property
    def col_panels(self) -> int:
        return -(-self.n // self.nr)

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.kc)

    @property
    def threads(self) -> int:
        return self.tm * self.tn

    def rows_per_thread(self) -> int:
        """Row micro-panels the busiest thread packs."""
        return -(-self.row_blocks // self.tm)

    @property
    def workspace_floats(self) -> int:
        """Per thread (each its own slice): "a": its packed rows of A for one K block; "b": one kc x nc-panel
        block of B; "i": one row micro-panel of the implicit im2col matrix."""
        if self.pack == "b":
            return self.kc * self.nc * self.nr
        if self.pack == "ab":  # B's K block, then one row micro-panel of A
            return self.kc * (self.col_panels * self.nr + self.mr)
        if self.pack == "I":  # the whole im2col matrix (row panels, each k-major), shared by the threads
            return self.row_blocks * self.mr * self.k // self.threads + 1
        if self.pack == "i":  # one row micro-panel, or all the thread's when B is blocked by columns
            return self.kc * self.mr * (self.rows_per_thread() if self.col_panels > self.nc else 1)
        return (1 if self.one_column_block else self.rows_per_thread()) * self.mr * self.kc

    @property
    def one_column_block(self) -> bool:
        """Each thread's column micro-panels are one block of B (they stay in L2 together): "a" packs one row
        micro-panel of A at a time, right before the tiles that read it (from L1), instead of all the thread's rows
        of the K block first (for 3136 rows, a 4.8 MB pass through memory and back)."""
        return -(-self.col_panels // self.tn) <= self.nc

    @property
    def workspace_bytes(self) -> int:
        return 4 * self.workspace_floats * self.threads


def register_tile(target: Target) -> tuple[int, int]:
    """(nr, the most rows mr) of the GEMM register tile: nr = 2 vectors (3 on 32-register NEON), as many rows as
    the registers left beside one row of B and a broadcast hold (at most 14)."""
    nvec = 3 if target.arch == "aarch64" else 2
    return nvec * target.lanes, max(1, min(14, (target.vector_registers - nvec - 1) // nvec))


MIN_ROWS = 5  # rows a tile of two vectors keeps (10 accumulators): fewer and the FMA latency shows


def tile_rows(m: int, mr_max: int, no_one_row_tail: bool = False) -> int:
    """The rows per tile that waste least on the last, partial tile of ``m`` rows (128 rows: 13, not 14 = 9 tiles
    + 2 rows), between 2/3 of ``mr_max`` (at least MIN_ROWS) and it; ``no_one_row_tail``: never a last tile of one
    row. (AVX2's 6 rows: not 4 for 128 rows, whose 8 accumulators wait on the FMA latency: Zen 3, 16 columns,
    k 256, B in L2: 4 rows 57, 5 rows 83, 6 rows 85 GFLOP/s of a measured 101.)"""
    mr = min(range(min(mr_max, max(1, mr_max * 2 // 3, MIN_ROWS)), mr_max + 1),
             key=lambda r: (no_one_row_tail and m > 1 and m % r == 1, -(-m // r) * r, -r))
    return min(mr, max(1, m))


# gemm_func_wconst reads B's micro-panels in place where its rows allow (``b_in_place``): MobileNetV2's
# projections 32 -> 16 at 112 x 112, 96 -> 24 and 144 -> 24 at 56 x 56 went 0.221 -> 0.207, 0.194 -> 0.170 and
# 0.291 -> 0.266 ms, EfficientNet-B0's 0.218 -> 0.179, 0.192 -> 0.165 and 0.283 -> 0.248 (Zen 3, 1 thread,
# kernel minima alternated in the model)
B_IN_PLACE = True
B_IN_PLACE_MIN_N = 1024
B_IN_PLACE_MAX_ROW_BLOCKS = 4
PREFETCH_CONV = True  # gemm_func_conv's tiles prefetch the next column block of B where it streams from memory
PACK_TILES = 1  # packing a row micro-panel of A costs about this many tiles (plan_gemm's thread split)
SMALL_WS_BYTES = 16 * 1024  # a thread's packed rows of A this small: threads from PAR_MIN_FLOPS (plan_gemm)


def plan_gemm(m: int, n: int, k: int, target: Target, threads: int = 1) -> GemmPlan:
    nr, mr_max = register_tile(target)
    mr = tile_rows(m, mr_max)
    kc_max = max(64, (target.l1d_bytes // 2) // (4 * mr) // 16 * 16)
    kc = -(-k // -(-k // kc_max))  # balanced blocks
    panels = -(-n // nr)
    nc_max = max(1, (target.l2_bytes // 2) // (4 * kc * nr))
    nc = -(-panels // -(-panels // nc_max))
    row_blocks = -(-m // mr)
    tm = tn = 1
    # threads from PAR_MIN_FLOPS_WS (each packs its own rows of A), or from PAR_MIN_FLOPS where those rows are a
    # few KB (a classifier's one row: ShuffleNet's 544 -> 1000, MobileNetV3-Small's 576 -> 1024)
    small = 4 * row_blocks * mr * kc <= SMALL_WS_BYTES
    if threads > 1 and 2.0 * m * n * k >= (PAR_MIN_FLOPS if small else PAR_MIN_FLOPS_WS):
        # the split whose busiest thread has the least work: its tiles, and packing its row micro-panels of A
        # (each about a tile's time: a transposing copy; split by columns, every thread packs every row), rows
        # first on a tie: 3 row micro-panels of 72 column panels (BERT at sequence 32) go by columns; 157 of 12
        # (ConvNeXt's 784 x 768 -> 192) by rows, where 157 x 6 tiles by columns are fewer than 79 x 12 but each
        # thread packed all of A, 2.4 MB (Zen 3, AVX2, 2 threads, alternated in the model: minima equal within the
        # host's noise, medians 2.78 -> 2.37 ms)
        tm, tn = min([(threads, 1), (1, min(threads, panels))],
                     key=lambda s: -(-row_blocks // s[0]) * (-(-panels // s[1]) + PACK_TILES))
    return GemmPlan(m, n, k, mr, nr, kc, nc, tm, tn)


def flops(p: GemmPlan) -> float:
    return 2.0 * p.m * p.n * p.k



def plan_gemm_wconst(m: int, n: int, k: int, batch: int, target: Target, threads: int = 1) -> GemmPlan:
    """The plan of ``C[b] = A @ B[b]`` with A a weight (packed at compile time) and each B packed at run
    time, one kc x nc block at a time: a 1x1 convolution (A = W: Co x Ci, B = X: Ci x pixels)."""
    p = plan_gemm(m, n, k, target, 1)
    tm = tn = 1
    if threads > 1 and 2.0 * m * n * k * batch >= PAR_MIN_FLOPS_WS:
        if p.col_panels >= 2 * threads or p.row_blocks < threads:
            tn = min(threads, p.col_panels)
        else:
            tm = threads
    return GemmPlan(m, n, k, p.mr, p.nr, p.kc, p.nc, tm, tn, "b", batch)


def pack_a(a: np.ndarray, mr: int) -> np.ndarray:
    """A (M x K) as row micro-panels, each k-major (K x rows, rows = mr except the last): M*K floats."""
    m = a.shape[0]
    return np.concatenate([np.ascontiguousarray(a[i:i + mr].T).reshape(-1) for i in range(0, m, mr)]
                          ).astype(np.float32)


def b_in_place(p: GemmPlan, row_stride: int) -> bool:
    """Does ``gemm_func_wconst`` read B's micro-panels in place (``gemmb_``) from an x whose rows (unit column
    stride) are ``row_stride`` floats apart, rather than pack them? Where each micro-panel is whole cache lines
    of a row (its columns and the row stride multiples of nr), rows have more than ``B_IN_PLACE_MIN_N`` columns,
    and at most ``B_IN_PLACE_MAX_ROW_BLOCKS`` row micro-panels of A (the tiles that read each B micro-panel:
    where many do, the packed copy, contiguous and in L1, pays for itself). Measured (Zen 3, 1 thread, kernel
    minima alternated in the model): on planes whose rows are not whole lines (ShuffleNetV2's 7 x 7) the tiles
    ran slower than the packing saved (0.070 -> 0.080 ms); at 28 x 28 (x in L2, the packing cheap) a wash
    (MobileNetV2's 144 -> 32: 0.095 -> 0.101 ms, 192 -> 32: 0.127 -> 0.121); with many row micro-panels slower
    (ResNet-50's 64 -> 256 at 56 x 56, 43 of them: 1.28 -> 1.62 ms; 64 -> 64: 0.35 -> 0.38; DenseNet-121's
    128-channel ones 0.87 -> 0.93)."""
    return (B_IN_PLACE and p.pack == "b" and not p.n % p.nr and not row_stride % p.nr and p.n > B_IN_PLACE_MIN_N
            and p.row_blocks <= B_IN_PLACE_MAX_ROW_BLOCKS)


def gemm_func_wconst(p: GemmPlan, ap: Buf, x: Buf, c: Buf, ws: Buf | None, epilogue: bool, name: str = "gemm_wconst",
                     fresh: Callable[[str], str] = str) -> Func:
    """The loop IR of ``c[b] = A @ x[b]`` for b < p.batch following a "b" plan: ``ap`` is A packed by
    ``pack_a`` (1-D), ``x`` (batch x K x N) and ``c`` (batch x M x N) any strides with unit column stride in
    ``c``; per thread, per K block and column block, that block of x is packed into the thread's slice of
    ``ws`` (k-major micro-panels of nr columns), then every row micro-panel of A runs against it. Where x's
    rows are contiguous along whole micro-panels (``b_in_place``), nothing is packed: the tiles read B's
    micro-panels from x (``gemmb_``), and ``ws`` may be None."""
    K, MR, NR, KC = p.k, p.mr, p.nr, p.kc
    NK, T = p.k_blocks, p.threads
    t, b, pc, jb, ib, jp, kk, r, j = (Var(fresh(v)) for v in ("t", "b", "pc", "jb", "ib", "jp", "kk", "r", "j"))
    tv: Expr = t if T > 1 else Const(0)
    rb0, rb1, cb0, cb1 = _thread_ranges(p, tv)
    k0, kcv, rows, cols = _edges(p, pc, ib, jp)
    jfirst = cb0 + jb * p.nc
    jlast = Bin("min", cb1, jfirst + p.nc)
    panel = simplify(tv * p.workspace_floats + (jp - jfirst) * (KC * NR))
    a_panel = simplify(ib * (K * MR) + k0 * rows)

    def by_width(body: Callable[[Expr], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
        # pixels not a whole number of panels: the full panels and the last one as two bodies of constant width
        # (a run-time width leaves the packing and epilogue loops unvectorized: 128 -> 16 channels at 55 x 55,
        # Zen 3, 0.55 -> 0.23 ms, where 56 x 56 ran 0.23)
        if not p.n % NR:
            return body(cols)
        return (If(Bin("<", jp, Const(p.col_panels - 1)), body(Const(NR)), body(Const(p.n % NR))),)

    def pack_panels(w: Expr) -> tuple[Stmt, ...]:
        return (For(kk, Const(0), kcv, (
            For(j, Const(0), w, (Store(ws, (panel + kk * NR + j,), Load(x, (b, k0 + kk, jp * NR + j))),),
                "vectorized"),)),)

    xs = x.layout.plain_strides
    ldb = xs[1] if xs is not None and xs[2] == 1 and b_in_place(p, xs[1]) else None
    if ldb is None and ws is None:
        raise ValueError("gemm_func_wconst: B is packed here, and there is no workspace")
    pack = For(jp, jfirst, jlast, by_width(pack_panels)) if ldb is None else None
    b_ptr = Ptr(x, (b, k0, jp * NR)) if ldb is not None else Ptr(ws, (panel,))
    tiles = by_width(lambda w: _tiles(p, ib, jp, pc, r, j, (b,), kcv, Ptr(ap, (a_panel,)), b_ptr, c,
                                      Const(c.layout.dims[1][3]), w, epilogue, ldb=ldb))
    nblocks = simplify((cb1 - cb0 + (p.nc - 1)) // p.nc)
    compute = For(ib, rb0, rb1, (For(jp, jfirst, jlast, tiles),))
    body: tuple[Stmt, ...] = (For(b, Const(0), Const(p.batch), (
        For(pc, Const(0), Const(NK), (For(jb, Const(0), nblocks, (pack, compute) if pack else (compute,)),)),)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    if ldb is not None:
        return Func(name, (ap, x, c), body, ())
    return Func(name, (ap, x, c), (Alloc(ws, body),), (ws,))


def gemm_func(p: GemmPlan, a: Buf, bp: Buf, c: Buf, ws: Buf, epilogue: bool, name: str = "gemm",
              fresh: Callable[[str], str] = str, target_l2: int | None = None) -> Func:
    """The loop IR of ``C = A @ B`` following ``p`` (module docstring): ``a`` (M x K, any strides), ``bp``
    (B packed by ``pack_b``: col_panels x K x nr; or 1-D, packed with the plan's kc: K block by K block, so
    that the B a K block reads is one contiguous stream from memory), ``c`` (M x N, row stride N), ``ws`` (the
    declared workspace, threads x workspace_floats). With ``epilogue``, every finished tile is handed to the
    fused epilogue while it is in L1. ``fresh`` names the loop variables. ``target_l2``: the target's L2 bytes,
    when known: a packed B larger than half of it streams from L3 or memory, so each tile of a column block
    prefetches its share of the next block (``_next_block``)."""
    N, MR, KC = p.n, p.mr, p.kc
    NK, T = p.k_blocks, p.threads
    t, pc, jb, ib, jp, kk, r, j = (Var(fresh(v)) for v in ("t", "pc", "jb", "ib", "jp", "kk", "r", "j"))
    tv: Expr = t if T > 1 else Const(0)
    rb0, rb1, cb0, cb1 = _thread_ranges(p, tv)
    k0, kcv, rows, cols = _edges(p, pc, ib, jp)
    one = p.one_column_block
    panel = simplify(tv * p.workspace_floats + (Const(0) if one else (ib - rb0) * (KC * MR)))
    pack_one = For(kk, Const(0), kcv, (
        For(r, Const(0), rows, (Store(ws, (panel + kk * rows + r,), Load(a, (ib * MR + r, k0 + kk))),)),))

    lda = _rowmajor_stride(a) if one and -(-p.col_panels // p.tn) <= UNPACKED_A_MAX_PANELS else None
    a_ptr = Ptr(a, (ib * MR, k0)) if lda is not None else Ptr(ws, (panel,))
    jfirst = cb0 + jb * p.nc
    ahead = None if one or lda is not None else _next_block(p, bp, pc, ib, jp, rb0, jfirst, kcv, target_l2)
    tiles = _tiles(p, ib, jp, pc, r, j, (), kcv, a_ptr, _panel(p, bp, pc, jp, k0, kcv), c, Const(N), cols,
                   epilogue, lda=lda, ahead=ahead)
    if lda is not None:  # few column micro-panels per row micro-panel: A read in place (gemmr_), not packed
        per_k: tuple[Stmt, ...] = (For(ib, rb0, rb1, (For(jp, cb0, cb1, tiles),)),)
    elif one:  # per row micro-panel: pack it, then every column micro-panel of the thread against it
        per_k = (For(ib, rb0, rb1, (pack_one, For(jp, cb0, cb1, tiles))),)
    else:  # all the thread's rows packed, then per column block every row micro-panel against it
        jlast = Bin("min", cb1, jfirst + p.nc)
        nblocks = simplify((cb1 - cb0 + (p.nc - 1)) // p.nc)
        per_k = (For(ib, rb0, rb1, (pack_one,)),
                 For(jb, Const(0), nblocks, (For(ib, rb0, rb1, (For(jp, jfirst, jlast, tiles),)),)))
    body: tuple[Stmt, ...] = (For(pc, Const(0), Const(NK), per_k),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (a, bp, c), (Alloc(ws, body),), (ws,))


def pack_b(b: np.ndarray, nr: int, kc: int | None = None) -> np.ndarray:
    """B (K x N) as column micro-panels (ceil(N/nr) x K x nr), zero beyond column N; with ``kc``, 1-D: for each
    K block of kc rows (the last one shorter), that block of every micro-panel (panels x kc x nr)."""
    k, n = b.shape
    panels = -(-n // nr)
    out = np.zeros((panels, k, nr), dtype=np.float32)
    for q in range(panels):
        w = min(nr, n - q * nr)
        out[q, :, :w] = b[:, q * nr:q * nr + w]
    if kc is None:
        return out
    return np.concatenate([out[:, k0:k0 + kc, :].reshape(-1) for k0 in range(0, k, kc)])


def gemm_dims(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_const: bool, attrs: dict) -> \
        tuple[int, int, int] | None:
    """(M, N, K) of a MatMul/Gemm the packed GEMM computes, or None when it takes the template's other
    paths: B must be a 2-D weight with at least MIN_N columns; a MatMul's leading dims of A become rows."""
    if not b_const or len(b_shape) != 2 or not a_shape:
        return None
    if op == "MatMul":
        k, n = b_shape
        m = int(np.prod(a_shape[:-1])) if len(a_shape) > 1 else 1
    elif op == "Gemm":
        if len(a_shape) != 2:
            return None
        m, k = (a_shape[1], a_shape[0]) if attrs.get("transA") else a_shape
        n = b_shape[0] if attrs.get("transB") else b_shape[1]
    else:
        return None
    if n < MIN_N or m < 1 or k < 1:
        return None
    return int(m), int(n), int(k)


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution as the product the im2col GEMM computes: per image, rows = output pixels (P = OH*OW),
    columns = output channels, K = Ci*KH*KW (k = (ci, kh, kw) row-major)."""
    ci: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    ph: int
    pw: int


# a 1x1 stride-1 convolution takes pixels as rows (im2col form) when its output rows are at most this long
# (7x7 or 14x14 planes: as columns their pixels fill vectors of 32 columns poorly), else pixels as columns
POINTWISE_ROWS_MAX_OW = 16


def conv_gemm_pays(g: ConvGeometry, co: int) -> bool:
    """Is the im2col GEMM the faster form of this convolution (``co`` output channels)? Each gathered
    im2col element feeds 2*co flops, so the gather pays where the direct kernel wastes most: a single tap
    (a strided 1x1), short output rows (<= 16 pixels, where the direct kernel's pixel vectors run part
    empty), and strided convolutions with >= 128 output channels. Measured on ResNet-50 (Zen 5, AVX-512):
    56x56 and 28x28 stride-1 3x3 layers and the 7x7 stem stay direct. (Since the blocked direct kernel,
    ``schedule.direct.direct_pays``, it is asked only about the convolutions that kernel does not take.)"""
    if g.kh * g.kw == 1 or g.ow <= 16:
        return True
    return (g.sh > 1 or g.sw > 1) and co >= 128


CL_ROWS_SPLIT = True


def plan_gemm_conv(co: int, g: ConvGeometry, batch: int, target: Target, threads: int = 1,
                   channels_last: bool = False) -> GemmPlan:
    """The plan of a group-1 convolution as a GEMM with pixels as rows (``gemm_func_conv``): per thread,
    one row micro-panel of the implicit im2col matrix packed at a time (mr x kc in workspace).
    ``channels_last``: the output is channels-last (each pixel's channels one run)."""
    p = plan_gemm(g.oh * g.ow, co, g.ci * g.kh * g.kw, target, 1)
    tm = tn = 1
    if threads > 1 and 2.0 * p.m * p.n * p.k * batch >= PAR_MIN_FLOPS_WS:
        # threads over output channels: each writes whole channel planes of the output. Split by pixels,
        # two threads would write the same cache line of every channel at their boundary, once per K block.
        # Into a channels-last output the pixels' rows are the threads' own lines: where the weight outgrows L2,
        # threads over pixels, each gathering its rows and streaming the whole weight with the next column block
        # prefetched (the shared im2col below prefetches nothing: ResNet-50's strided 1024 -> 2048 projection,
        # 8 MB of weights, 1.92 -> 1.31 ms at 2 threads, 512 -> 1024 1.41 -> 1.25; Zen 3, kernel minima
        # alternated). Smaller weights keep the column split (ResNet-18's 256 -> 512: 0.131 -> 0.144 by pixels)
        if channels_last and CL_ROWS_SPLIT and p.row_blocks >= 2 * threads and 4 * p.k * p.n > target.l2_bytes:
            tm = threads
        elif p.col_panels >= threads:
            tn = threads
        elif p.row_blocks >= threads:
            tm = threads
    shared_bytes = 4 * p.row_blocks * p.mr * p.k
    if tn > 1 and batch == 1 and p.row_blocks >= threads and shared_bytes <= 2 * target.l2_bytes:
        # the im2col matrix gathered once, split over the threads, then shared (rather than gathered again by
        # every thread for its output channels): "I". Not for matrices much larger than L2: the other core
        # reads it back from L3 then, and the big short-lived buffer costs the memory plan (zfnet512: 5.7 MB
        # took the arena from 1.00x to 1.12x its lower bound)
        return GemmPlan(p.m, p.n, p.k, p.mr, p.nr, p.kc, p.nc, tm, tn, "I", batch)
    return GemmPlan(p.m, p.n, p.k, p.mr, p.nr, p.kc, p.nc, tm, tn, "i", batch)


def gemm_func_conv(p: GemmPlan, g: ConvGeometry, x: Buf, wp: Buf, c: Buf, ws: Buf, epilogue: bool,
                   name: str = "conv_gemm", fresh: Callable[[str], str] = str, target_l2: int | None = None,
                   channels_last: bool = False) -> Func:
    """The loop IR of a convolution ``c[b, co, pix] = sum_k W[co, k] * im2col(x[b])[pix, k]``: ``x`` (N, Ci,
    H, W), ``wp`` the weight as B (K x Co) packed by ``pack_b`` (either form), ``c`` (N, Co, P) with unit pixel stride.
    Per image, K block and row micro-panel of pixels, the panel's im2col values are gathered into the
    thread's workspace (zero in the padding, read through clamped indices), then every column micro-panel
    of output channels runs the transposed-store micro-kernel against it. ``target_l2`` (the target's L2
    bytes, when known): where B is blocked by columns and larger than half of it, each tile prefetches its
    share of the next column block (``_next_block``, as ``gemm_func``): ResNet-50's strided projections read
    their weights (up to 8 MB) from memory, a block at a time (Zen 3, AVX2, alternated in the model, kernel
    minima / medians: 1024 -> 2048 channels 3.10 / 3.37 -> 2.59 / 2.86 ms at 1 thread, 1.63 / 1.97 -> 1.63 / 1.92
    at 2; 512 -> 1024 2.77 / 2.96 -> 2.69 / 2.86 and 1.37 / 1.61 -> 1.39 / 1.53). ``channels_last``: ``c`` is
    (N, P, Co) with unit channel stride instead (pixel-major: the tiles store as they are, no transpose). A
    channels-last ``x``: the gather reads each pixel's channels along its row."""
    K, MR, KC = p.k, p.mr, p.kc
    MB, NP, NK, T = p.row_blocks, p.col_panels, p.k_blocks, p.threads
    t, b, pc, ib, jp, kk, r, j = (Var(fresh(v)) for v in ("t", "b", "pc", "ib", "jp", "kk", "r", "j"))
    tv: Expr = t if T > 1 else Const(0)
    rb0, rb1, cb0, cb1 = _thread_ranges(p, tv)
    k0, kcv, rows, cols = _edges(p, pc, ib, jp)
    base = simplify(tv * p.workspace_floats)
    # im2col(pix, k): pix = (oy, ox), k = (ci, ky, kx); iy = oy*sh + ky*dh - ph, ix = ox*sw + kx*dw - pw
    pix, k = ib * MR + r, k0 + kk
    taps = g.kh * g.kw
    iy = (pix // g.ow) * g.sh + ((k // g.kw) % g.kh) * g.dh - g.ph
    ix = (pix % g.ow) * g.sw + (k % g.kw) * g.dw - g.pw
    iy, ix = simplify(iy), simplify(ix)

    def clamp(e: Expr, hi: int) -> Expr:
        return Bin("max", Const(0), Bin("min", Const(hi - 1), e))

    inside = Bin("&&", Bin("&&", Bin("<=", Const(0), iy), Bin("<", iy, Const(g.h))),
                 Bin("&&", Bin("<=", Const(0), ix), Bin("<", ix, Const(g.w))))
    unpadded = not (g.ph or g.pw) and (g.oh - 1) * g.sh + (g.kh - 1) * g.dh < g.h
    if unpadded and (g.ow - 1) * g.sw + (g.kw - 1) * g.dw < g.w:
        value: Expr = Load(x, (b, k // taps, iy, ix))  # no padding: every tap is inside
    else:
        value = Select(inside, Load(x, (b, k // taps, clamp(iy, g.h), clamp(ix, g.w))), Const(0.0, "float32"))
    shared = p.pack == "I"
    blocked = p.nc < NP  # B's kc x Co block overflows L2: column blocks outside, the thread's rows packed once
    if shared:  # row panel ib holds all of K (k-major): its K block pc starts at k0 * rows
        base = simplify(ib * (K * MR) + k0 * rows)
    elif blocked:
        base = simplify(base + (ib - rb0) * (KC * MR))
    pack: Stmt = For(kk, Const(0), kcv, (For(r, Const(0), rows, (Store(ws, (base + kk * rows + r,), value),)),))
    xd = x.layout.dims
    x_cl = x.shape[1] > 1 and xd[1][3] == 1  # (a channels-last input: a pixel's channels along a row of x)
    if x_cl:  # (read in order, stored rows apart)
        pack = For(r, Const(0), rows, (For(kk, Const(0), kcv, (Store(ws, (base + kk * rows + r,), value),)),))
    elif (xs := x.layout.plain_strides) is not None and xs[3] == 1:
        # the same gather as a micro-kernel that copies runs along output rows (the loop above divides per
        # element, which C compilers do not vectorize)
        name_ = im2col_micro(g.h, g.w, g.ow, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.ph, g.pw, xs[1], xs[2], MR)
        pack = Micro(name_, (kcv, k0, ib * MR, rows, Ptr(x, (b, Const(0), Const(0), Const(0))), Ptr(ws, (base,))))

    jb = Var(fresh("jb"))
    jfirst = cb0 + jb * p.nc
    ahead = _next_block(p, wp, pc, ib, jp, rb0, jfirst, kcv, target_l2) if blocked and not shared and \
        PREFETCH_CONV else None
    tiles = _tiles(p, ib, jp, pc, r, j, (b,), kcv, Ptr(ws, (base,)), _panel(p, wp, pc, jp, k0, kcv), c,
                   Const(c.layout.dims[1][3]), cols, epilogue, transposed=not channels_last, ahead=ahead)
    if shared:
        # phase 1: the threads gather row panels (all of K) into the shared workspace; phase 2: each runs
        # its output channels over every row panel, K block by K block
        t1, q = Var(fresh("t")), Var(fresh("ib"))
        qrows = _subst_rows(rows, ib, q)
        one = Store(ws, (q * (K * MR) + kk * qrows + r,), _subst_value(value, ib, q, k0, pc))
        if isinstance(pack, Micro):
            gather: Stmt = Micro(pack.name, (Const(K), Const(0), q * MR, qrows, pack.args[4],
                                             Ptr(ws, (q * (K * MR),))))
        elif x_cl:
            gather = For(r, Const(0), qrows, (For(kk, Const(0), Const(K), (one,)),))
        else:
            gather = For(kk, Const(0), Const(K), (For(r, Const(0), qrows, (one,)),))
        phase1 = For(t1, Const(0), Const(T), (For(q, *share(t1, MB, T), (
            For(b, Const(0), Const(1), (gather,)),)),), "parallel")
        phase2 = For(t, Const(0), Const(T), (For(b, Const(0), Const(1), (For(pc, Const(0), Const(NK), (
            For(ib, Const(0), Const(MB), (For(jp, cb0, cb1, tiles),)),)),)),), "parallel")
        return Func(name, (x, wp, c), (Alloc(ws, (phase1, phase2)),), (ws,))
    if blocked:
        jlast = Bin("min", cb1, jfirst + p.nc)
        nblocks = simplify((cb1 - cb0 + (p.nc - 1)) // p.nc)
        per_k: tuple[Stmt, ...] = (For(ib, rb0, rb1, (pack,)), For(jb, Const(0), nblocks, (
            For(ib, rb0, rb1, (For(jp, jfirst, jlast, tiles),)),)))
    else:
        per_k = (For(ib, rb0, rb1, (pack, For(jp, cb0, cb1, tiles))),)
    body: tuple[Stmt, ...] = (For(b, Const(0), Const(p.batch), (For(pc, Const(0), Const(NK), per_k),)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (x, wp, c), (Alloc(ws, body),), (ws,))


def plan_gemm_batched(batch: int, m: int, n: int, k: int, target: Target, threads: int = 1) -> GemmPlan:
    """The plan of ``C[b] = A[b] @ B[b]`` with both operands computed at run time (attention's Q K^T and
    P V): threads over the batch (heads); per product, B's K block packed whole (all its column panels)
    and A one row micro-panel at a time, into the thread's workspace."""
    p = plan_gemm(m, n, k, target, 1)
    t = threads if threads > 1 and batch >= threads and 2.0 * m * n * k * batch >= PAR_MIN_FLOPS_WS else 1
    return GemmPlan(m, n, k, p.mr, p.nr, p.kc, p.nc, t, 1, "ab", batch)


def gemm_func_batched(p: GemmPlan, a: Buf, b: Buf, c: Buf, ws: Buf, epilogue: bool, name: str = "gemm_batched",
                      fresh: Callable[[str], str] = str) -> Func:
    """The loop IR of ``c[q] = a[q] @ b[q]`` for q < p.batch: ``a`` (batch, M, K) and ``b`` (batch, K, N) any
    strides (a transposed view is read as it is: the packing absorbs it), ``c`` (batch, M, N) with unit
    column stride. The thread's workspace slice holds B's packed K block (col_panels x kc x nr) then one
    packed row micro-panel of A (kc x mr)."""
    MR, NR, KC = p.mr, p.nr, p.kc
    MB, NP, NK, T = p.row_blocks, p.col_panels, p.k_blocks, p.threads
    t, q, pc, ib, jp, kk, r, j = (Var(fresh(v)) for v in ("t", "q", "pc", "ib", "jp", "kk", "r", "j"))
    tv: Expr = t if T > 1 else Const(0)
    q0, q1 = share(tv, p.batch, T)
    k0, kcv, rows, cols = _edges(p, pc, ib, jp)
    bbase = simplify(tv * p.workspace_floats)
    abase = simplify(bbase + NP * KC * NR)
    bpanel = simplify(bbase + jp * (KC * NR))
    pack_b_ = For(jp, Const(0), Const(NP), (For(kk, Const(0), kcv, (For(j, Const(0), cols, (
        Store(ws, (bpanel + kk * NR + j,), Load(b, (q, k0 + kk, jp * NR + j))),), "vectorized"),)),))
    pack_a_ = For(kk, Const(0), kcv, (For(r, Const(0), rows, (
        Store(ws, (abase + kk * rows + r,), Load(a, (q, ib * MR + r, k0 + kk))),)),))

    tiles = _tiles(p, ib, jp, pc, r, j, (q,), kcv, Ptr(ws, (abase,)), Ptr(ws, (bpanel,)), c,
                   Const(c.layout.dims[1][3]), cols, epilogue)
    per_k = (pack_b_, For(ib, Const(0), Const(MB), (pack_a_, For(jp, Const(0), Const(NP), tiles))))
    body: tuple[Stmt, ...] = (For(q, q0, q1, (For(pc, Const(0), Const(NK), per_k),)),)
    if T > 1:
        body = (For(t, Const(0), Const(T), body, "parallel"),)
    return Func(name, (a, b, c), (Alloc(ws, body),), (ws,))


def gemm_batched_dims(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a MatMul of two run-time operands that ``gemm_func_batched`` computes: both at
    least 2-D with the same batch dims (no broadcasting), at least MIN_N columns."""
    if len(a_shape) < 2 or len(a_shape) != len(b_shape) or a_shape[:-2] != b_shape[:-2]:
        return None
    m, k = a_shape[-2:]
    k2, n = b_shape[-2:]
    if k != k2 or n < MIN_N or min(m, k) < 1:
        return None
    batch = 1
    for d in a_shape[:-2]:
        batch *= d
    return (batch, m, n, k) if batch >= 1 else None


def _subst_rows(rows: Expr, ib: Var, q: Var) -> Expr:
    from dlcc.lower.lir import _subst

    return simplify(_subst(rows, ib.name, q))


def _subst_value(value: Expr, ib: Var, q: Var, k0: Expr, pc: Var) -> Expr:
    """The im2col element expression for row panel ``q`` and absolute k (the K block's origin set to 0)."""
    from dlcc.lower.lir import _subst

    return simplify(_subst(_subst(value, ib.name, q), pc.name, Const(0)))


def _rowmajor_stride(a: Buf) -> int | None:
    """The row stride of a 2-D operand whose rows are contiguous (then ``gemmr_`` reads it in place)."""
    strides = a.layout.plain_strides
    return strides[0] if strides is not None and len(strides) == 2 and strides[1] == 1 else None


def _next_block(p: GemmPlan, bp: Buf, pc: Var, ib: Var, jp: Var, rb0: Expr, jfirst: Expr, kcv: Expr,
                l2: int | None) -> tuple[tuple[int, int], Ptr] | None:
    """(step, lines) and where tile (ib, jp) of column block ``jfirst`` prefetches: its share of the next column
    block of B (packed K block by K block, so the block after a K block's last is the next K block's first),
    ``lines`` 64-byte lines, one every ``step`` values of k. None where B is not packed that way, stays in L2
    (``l2``: the target's L2 bytes; None: unknown) or the row tiles are one row. BERT-base's 768 x 3072 weight:
    each block of 10 column panels (480 KB) came from memory while the first row tile ran against it (the
    13 x 32 tile alone with B from memory: 84-87% of the FMA peak; prefetching the next block, 91%)."""
    if l2 is None or len(bp.shape) != 1 or 4 * bp.shape[0] <= l2 // 2 or p.mr < 2 or p.m % p.mr == 1:
        return None
    calls = p.rows_per_thread() * p.nc  # a block's tiles per thread
    lines = -(-p.kc * p.nc * p.nr // (16 * calls))
    step = 1
    while 2 * step * lines <= p.kc:
        step *= 2
    span = 16 * lines
    at = simplify(pc * (p.kc * p.col_panels * p.nr) + (jfirst + p.nc) * kcv * p.nr
                  + ((ib - rb0) * p.nc + jp - jfirst) * span)
    return (step, lines), Ptr(bp, (simplify(Bin("min", at, Const(bp.shape[0] - span))),))


def _tiles(p: GemmPlan, ib: Var, jp: Var, pc: Var, r: Var, j: Var, lead: tuple[Expr, ...], kcv: Expr, a_ptr: Ptr,
           b_ptr: Ptr, c: Buf, ldc: Expr, cols: Expr, epilogue: bool, transposed: bool = False,
           lda: int | None = None, ahead: tuple[tuple[int, int], Ptr] | None = None,
           ldb: int | None = None) -> tuple[Stmt, ...]:
    """Tile (ib, jp) of C (indices ``lead`` before its two matrix axes): the micro-kernel call and, after the
    last K block, the tile's epilogue while it is in L1; the last row panel takes the tail variant.
    ``transposed``: C holds the tile transposed (columns as rows: the pixels-as-rows convolution). ``lda``: A
    is read in place, row-major with this row stride (``gemmr_``), not from a packed micro-panel; ``ldb``: B is
    read in place, its rows this many floats apart (``gemmb_``). ``ahead``
    ((step, lines), where): each call prefetches those lines (``_next_block``)."""
    M, N, MR, NR, NK, MB = p.m, p.n, p.mr, p.nr, p.k_blocks, p.row_blocks

    def tile(mr: int) -> tuple[Stmt, ...]:
        acc = Bin("<", Const(0), pc) if NK > 1 else Const(0)
        cptr = Ptr(c, (*lead, jp * NR, ib * MR) if transposed else (*lead, ib * MR, jp * NR))
        pf = ahead[0] if ahead is not None else None
        name = gemmr_micro(mr, NR, lda, pf) if lda is not None else gemmb_micro(mr, NR, ldb) if ldb is not None \
            else (gemmt_micro if transposed else gemm_micro)(mr, NR, pf)
        call = Micro(name, (kcv, a_ptr, b_ptr, cptr, ldc, acc, cols, *((ahead[1],) if ahead is not None else ())))
        if not epilogue:
            return (call,)
        if not N % NR:
            jstop = jp * NR + NR
        elif isinstance(cols, Const):  # (the panel's width a constant: ``gemm_func_wconst``'s full and last panels)
            jstop = jp * NR + cols
        else:
            jstop = Bin("min", Const(N), jp * NR + NR)
        if transposed:
            idx = (*lead, j, ib * MR + r)
            ep = For(j, jp * NR, jstop, (For(r, Const(0), Const(mr), (Epilogue(idx, Load(c, idx)),), "vectorized"),))
        else:
            idx = (*lead, ib * MR + r, j)
            ep = For(r, Const(0), Const(mr), (For(j, jp * NR, jstop, (Epilogue(idx, Load(c, idx)),), "vectorized"),))
        return (call, If(Bin("==", pc, Const(NK - 1)), (ep,)) if NK > 1 else ep)

    tail = M % MR
    return tile(MR) if not tail else (If(Bin("<", ib, Const(MB - 1)), tile(MR), tile(tail)),)


def _thread_ranges(p: GemmPlan, tv: Expr) -> tuple[Expr, Expr, Expr, Expr]:
    """Thread ``tv``'s row micro-panels [rb0, rb1) and column micro-panels [cb0, cb1) under ``p``'s split."""
    MB, NP = p.row_blocks, p.col_panels
    rb0, rb1 = (tv * MB // p.tm, (tv + 1) * MB // p.tm) if p.tm > 1 else (Const(0), Const(MB))
    cb0, cb1 = (tv * NP // p.tn, (tv + 1) * NP // p.tn) if p.tn > 1 else (Const(0), Const(NP))
    return simplify(rb0), simplify(rb1), simplify(cb0), simplify(cb1)


def _panel(p: GemmPlan, bp: Buf, pc: Var, jp: Var, k0: Expr, kcv: Expr) -> Ptr:
    """Where K block ``pc`` of B's column micro-panel ``jp`` starts: ``bp`` packed by ``pack_b`` (3-D), or with
    the plan's kc (1-D: K block by K block)."""
    if len(bp.shape) == 1:
        return Ptr(bp, (simplify(pc * (p.kc * p.col_panels * p.nr) + jp * kcv * p.nr),))
    return Ptr(bp, (jp, k0, Const(0)))


def _edges(p: GemmPlan, pc: Var, ib: Var, jp: Var) -> tuple[Expr, Expr, Expr, Expr]:
    """K block ``pc``'s first k and length, row micro-panel ``ib``'s rows and column micro-panel ``jp``'s
    columns (each clipped at the matrix's edge, a constant where the blocks divide it)."""
    k0 = pc * p.kc
    kcv = Bin("min", Const(p.kc), Const(p.k) - k0) if p.k % p.kc else Const(p.kc)
    rows = Bin("min", Const(p.mr), Const(p.m) - ib * p.mr) if p.m % p.mr else Const(p.mr)
    cols = Bin("min", Const(p.nr), Const(p.n) - jp * p.nr) if p.n % p.nr else Const(p.nr)
    return k0, kcv, rows, cols
