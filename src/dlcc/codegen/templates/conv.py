"""Conv and ConvTranspose templates (ONNX semantics, 1-D/2-D/3-D, float32).

What goes in: a ``TemplateCall`` for a Conv or ConvTranspose node: X (a buffer), W (usually a constant),
optional bias B. What comes out: C that computes every output element once and hands it to ``store``.

Loop structure (direct convolution, any spatial rank): for each (n, group, block of up to 4 output
channels) the template accumulates the block's output planes in ``call.scratch`` (the destination):
loops (input channel, k0, t0, k1, t1, ...) where for every kernel tap ``k_d`` the range of ``t_d`` whose
input position is inside the input is precomputed at compile time (``window_dim``), so padding needs no
per-element test and the innermost ``t`` loop is branch-free and contiguous on the output (Conv) or the
input (ConvTranspose). The 4 output channels of a block share each input load. Then ``store`` is applied
to the block's elements (skipped when ``call.direct``).

A 1x1, stride 1, unpadded Conv is a GEMM per (n, group): out[oc, p] = sum_ic W[oc, ic] * X[ic, p]; it
accumulates a (4 x 128) tile in local arrays and stores from them.

Sums run in a different order than onnxruntime: tests compare with rtol 1e-4 (DESIGN: conv/matmul).
``window_dim``/``window_nest`` are shared with the pooling templates (``pool.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dlcc.codegen.cbase import Names, Operand, TemplateError, TensorRef, c_helper, indent, loops
from dlcc.codegen.templates import TemplateCall, register

c_helper("dlcc_v8", """typedef float dlcc_v8 __attribute__((vector_size(32)));
static inline dlcc_v8 dlcc_v8_load(const float* p) { dlcc_v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void dlcc_v8_store(float* p, dlcc_v8 v) { memcpy(p, &v, sizeof v); }""")

__all__ = ["WinDim", "lin", "spatial_pads", "window_dim", "window_nest"]

OC_BLOCK = 4  # output channels accumulated together (share input loads)
VEC_TILE = 16  # positions of the last spatial dim per register tile
LANES = 8  # floats per dlcc_v8 vector
UNROLL_TAPS = 8  # the taps of the last kernel dim are unrolled up to this size


def lin(*terms: int | tuple[str, int]) -> str:
    """C int64 text of a sum of ints and ``(expr, coef)`` terms, constant-folded."""
    const, parts = 0, []
    for term in terms:
        if isinstance(term, int):
            const += term
            continue
        expr, coef = term
        expr = str(expr).strip()
        if coef == 0:
            continue
        if expr.lstrip("-").isdigit():
            const += int(expr) * coef
            continue
        parts.append(expr if coef == 1 else f"({expr})*{coef}")
    if const or not parts:
        parts.append(str(const) if const >= 0 else f"({const})")
    return " + ".join(parts)


@dataclass
class WinDim:
    """One spatial dim of a windowed loop nest. For tap ``k`` (0..K-1), ``t`` runs over ``[lo[k], hi[k])``;
    the written position is ``t*o[0] + k*o[1] + o[2]`` (stride ``ostride``), the read position
    ``t*i[0] + k*i[1] + i[2]`` (stride ``istride``)."""

    K: int
    lo: list[int]
    hi: list[int]
    o: tuple[int, int, int]
    i: tuple[int, int, int]
    ostride: int
    istride: int


def window_dim(T: int, L: int, s: int, d: int, p: int, K: int, *, t_is_out: bool,
               ostride: int, istride: int) -> WinDim:
    """``t`` in [0, T) maps to the strided side ``t*s + k*d - p`` which must be in [0, L).
    Conv/pool: t is the output position (t_is_out); ConvTranspose: t is the input position."""
    lo, hi = [], []
    for k in range(K):
        a = -((k * d - p) // s)  # ceil((p - k*d) / s)
        b = (L - 1 + p - k * d) // s + 1
        a, b = max(0, a), min(T, b)
        lo.append(a)
        hi.append(max(a, b))
    strided = (s, d, -p)
    if t_is_out:
        return WinDim(K, lo, hi, (1, 0, 0), strided, ostride, istride)
    return WinDim(K, lo, hi, strided, (1, 0, 0), ostride, istride)


def _table(names: Names, decls: list[str], values: list[int], k: str) -> str:
    if len(set(values)) == 1:
        return str(values[0])
    name = names("tab")
    decls.append(f"static const int64_t {name}[{len(values)}] = {{{', '.join(map(str, values))}}};")
    return f"{name}[{k}]"


def window_nest(names: Names, dims: Sequence[WinDim], obases: Sequence[str], ibase: str,
                pre: Callable[[list[str]], str], stmt: Callable[[list[str], str], str],
                decls: list[str]) -> str:
    """The loop nest (k0, t0, k1, t1, ...) over ``dims``. ``obases``: C pointer expressions of the written
    planes (float*), ``ibase``: C pointer expression of the read plane. ``pre(ks)`` gives C statements before
    the innermost t loop (kernel tap indices ``ks``), ``stmt(out_lvalues, in_expr)`` the innermost body.
    Static range tables are appended to ``decls``."""
    last = len(dims) - 1

    def level(d: int, ks: list[str], oterms: list, iterms: list) -> str:
        dim = dims[d]
        k = names("k") if dim.K > 1 else "0"
        lo = _table(names, decls, dim.lo, k)
        hi = _table(names, decls, dim.hi, k)
        t = names("t")
        ks = [*ks, k]
        oterms = [*oterms, (k, dim.o[1] * dim.ostride), dim.o[2] * dim.ostride]
        iterms = [*iterms, (k, dim.i[1] * dim.istride), dim.i[2] * dim.istride]
        head = f"for (int64_t {t} = {lo}; {t} < {hi}; ++{t}) {{"
        if d == last:
            ops = [names("po") for _ in obases]
            ip = names("pi")
            lines = [f"float* restrict {p} = {b} + ({lin(*oterms)});" for p, b in zip(ops, obases, strict=True)]
            lines.append(f"const float* restrict {ip} = {ibase} + ({lin(*iterms)});")
            lines.append(pre(ks))
            oel = [f"{p}[{lin((t, dim.o[0] * dim.ostride))}]" for p in ops]
            iel = f"{ip}[{lin((t, dim.i[0] * dim.istride))}]"
            lines += [head, indent(stmt(oel, iel)), "}"]
            body = "\n".join(x for x in lines if x)
        else:
            inner = level(d + 1, ks, [*oterms, (t, dim.o[0] * dim.ostride)], [*iterms, (t, dim.i[0] * dim.istride)])
            body = f"{head}\n{indent(inner)}\n}}"
        if dim.K > 1:
            body = f"for (int64_t {k} = 0; {k} < {dim.K}; ++{k}) {{\n{indent(body)}\n}}"
        return body

    return level(0, [], [], [])


def _ints(call: TemplateCall, name: str, n: int, default: int) -> list[int]:
    v = call.attr(name)
    if v is None:
        return [default] * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise TemplateError(f"{call.node.op_type}: attribute {name} has {len(v)} values, expected {n}")
    return v


def spatial_pads(call: TemplateCall, ins: Sequence[int], outs: Sequence[int], ks: Sequence[int],
                 strides: Sequence[int], dils: Sequence[int]) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) of a Conv/pool node from ``pads``/``auto_pad`` and the output shape."""
    r = len(ins)
    auto = call.attr("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto == "NOTSET":
        pads = _ints(call, "pads", 2 * r, 0)
        return pads[:r], pads[r:]
    if auto == "VALID":
        return [0] * r, [0] * r
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise TemplateError(f"{call.node.op_type}: unsupported auto_pad {auto!r}")
    begin, end = [], []
    for i, o, k, s, d in zip(ins, outs, ks, strides, dils, strict=True):
        total = max(0, (o - 1) * s + (k - 1) * d + 1 - i)
        b = total // 2 if auto == "SAME_UPPER" else total - total // 2
        begin.append(b)
        end.append(total - b)
    return begin, end


def _buffer(call: TemplateCall, op: Operand | None, what: str) -> TensorRef:
    if op is None:
        raise TemplateError(f"{call.node.op_type}: missing input {what}")
    if op.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: {what} is {op.dtype}; only float32 is supported")
    if op.const is not None and call.pack is not None:
        return call.packed(np.asarray(op.const, dtype=np.float32))
    if op.ref is None:
        raise TemplateError(f"{call.node.op_type}: input {what} is not a buffer")
    return op.ref


def _plane_init(call: TemplateCall, pre_idx: list[str], value: str) -> str:
    sp = call.out_shape[len(pre_idx):]
    _, code = loops(sp, call.names, lambda idx: f"{call.scratch.at([*pre_idx, *idx])} = {value};", "s")
    return code


def _plane_store(call: TemplateCall, pre_idx: list[str]) -> str:
    if call.direct:
        return ""
    sp = call.out_shape[len(pre_idx):]
    _, code = loops(sp, call.names, lambda idx: call.store([*pre_idx, *idx], call.scratch.at([*pre_idx, *idx])), "s")
    return code


def _ptr(ref: TensorRef, idx: list[str]) -> str:
    return f"({ref.ptr} + ({ref.index(idx)}))"


def _common(call: TemplateCall):
    if call.out_dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 outputs are supported")
    x = call.inputs[0]
    w = call.inputs[1] if len(call.inputs) > 1 else None
    b = call.inputs[2] if len(call.inputs) > 2 else None
    if x is None or x.ref is None:
        raise TemplateError(f"{call.node.op_type}: input X must be a buffer")
    if x.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: only float32 inputs are supported")
    if w is None:
        raise TemplateError(f"{call.node.op_type}: missing weight")
    if len(x.shape) < 3:
        raise TemplateError(f"{call.node.op_type}: input rank {len(x.shape)} < 3 is not supported")
    if len(w.shape) != len(x.shape):
        raise TemplateError(f"{call.node.op_type}: weight rank {len(w.shape)} != input rank {len(x.shape)}")
    r = len(x.shape) - 2
    ks = list(w.shape[2:])
    kattr = call.attr("kernel_shape")
    if kattr is not None and [int(v) for v in kattr] != ks:
        raise TemplateError(f"{call.node.op_type}: kernel_shape {list(kattr)} does not match the weight {ks}")
    group = int(call.attr("group", 1))
    strides = _ints(call, "strides", r, 1)
    dils = _ints(call, "dilations", r, 1)
    if min(strides) < 1 or min(dils) < 1 or group < 1:
        raise TemplateError(f"{call.node.op_type}: strides, dilations and group must be >= 1")
    if w.dtype != "float32":
        raise TemplateError(f"{call.node.op_type}: W is {w.dtype}; only float32 is supported")
    bref = _buffer(call, b, "B") if b is not None else None
    return x.ref, w, bref, r, ks, group, strides, dils


# ----------------------------------------------------------------------------------------------- Conv

@register("Conv", needs_buffers=True)
def conv(call: TemplateCall) -> str:
    xref, w, bref, r, ks, group, strides, dils = _common(call)
    N, C, *ins = xref.shape
    M, Cg = w.shape[:2]
    outs = list(call.out_shape[2:])
    if Cg * group != C or M % group:
        raise TemplateError(f"Conv: channels {C} (weight {M}x{Cg}) do not divide into {group} groups")
    if tuple(call.out_shape[:2]) != (N, M):
        raise TemplateError(f"Conv: output shape {call.out_shape} does not match N={N}, M={M}")
    pb, pe = spatial_pads(call, ins, outs, ks, strides, dils)
    for i, o, k, s, d, a, e in zip(ins, outs, ks, strides, dils, pb, pe, strict=True):
        if (i + a + e - ((k - 1) * d + 1)) // s + 1 != o:
            raise TemplateError(f"Conv: output shape {call.out_shape} inconsistent with the attributes")
    if (all(k == 1 for k in ks) and all(s == 1 for s in strides) and not any(pb) and not any(pe)
            and _flat_ok(xref, 2) and r > 1):
        # a 1x1 conv is a GEMM: view the spatial dims as one row of length P
        P = math.prod(ins)
        flat = TensorRef(xref.ptr, xref.dtype, (N, C, P), (*xref.strides[:2], 1), xref.offset)
        return _conv_direct(call, flat, w, bref, group, [1], [1], [1], [0], lambda sp: _unflat(sp[0], outs))
    return _conv_direct(call, xref, w, bref, group, ks, strides, dils, pb, lambda sp: sp)


def _k_ranges(O: int, I: int, s: int, d: int, p: int, K: int) -> tuple[list[int], list[int]]:
    """For each output position o: the taps k whose input position o*s - p + k*d is in [0, I)."""
    lo, hi = [], []
    for o in range(O):
        a = max(0, -((o * s - p) // d))
        b = min(K, (I - 1 + p - o * s) // d + 1)
        lo.append(a)
        hi.append(max(a, b))
    return lo, hi


def _conv_direct(call: TemplateCall, xref: TensorRef, w: Operand, bref: TensorRef | None, group: int,
                 ks: list[int], strides: list[int], dils: list[int], pb: list[int],
                 out_sp: Callable[[list[str]], list[str]]) -> str:
    """Register-blocked direct convolution: a tile of (up to 4 output channels) x (up to 16 positions of
    the last spatial dim) accumulates in a local array over (input channel, kernel taps); positions whose
    window crosses the padding (the borders of the last dim) use a scalar loop with compile-time tap
    ranges; the valid taps of the outer spatial dims come from per-row tables."""
    names = call.names
    N, C, *ins = xref.shape
    r = len(ins)
    M, Cg = w.shape[:2]
    Mg = M // group
    outs = list(call.out_shape[2:]) if len(call.out_shape) - 2 == r else [math.prod(call.out_shape[2:])]
    Kp = math.prod(ks)
    KL, SL, DL, PL, IL, OL = ks[-1], strides[-1], dils[-1], pb[-1], ins[-1], outs[-1]
    xs = xref.strides
    decls: list[str] = []
    n = names("n") if N > 1 else "0"
    g = names("g") if group > 1 else "0"
    osp = [names("o") if o > 1 else "0" for o in outs[:-1]]  # outer output positions

    packed = None
    if w.const is not None and call.pack is not None:
        wc = np.asarray(w.const, dtype=np.float32).reshape(M, Cg * Kp)
        chunks = []
        for gi in range(group):
            for m0, nb in _block_list(Mg, OC_BLOCK):
                chunks.append(wc[gi * Mg + m0: gi * Mg + m0 + nb].T.reshape(-1))  # [ic, k..., j]
        packed = call.packed(np.concatenate(chunks))
    elif w.ref is None:
        raise TemplateError("Conv: weight W must be a buffer")

    def weights(ocs: list[str], gm0: str, c: str, kk: list[str]) -> tuple[list[str], Callable[[str], list[str]]]:
        """(C statements declaring a weight row pointer, tap -> per-output-channel weight expressions)."""
        nb = len(ocs)
        if packed is not None:
            wr = names("pw")
            flat = lin((c, Kp // KL * KL), *[(k, math.prod(ks[d + 1:])) for d, k in enumerate(kk)])
            decl = f"const float* restrict {wr} = {packed.ptr} + ({lin((gm0, Cg * Kp), (flat, nb))});"
            return [decl], lambda kl: [f"{wr}[{lin((kl, nb), j)}]" for j in range(nb)]
        if w.ref.rank - 2 == r:
            return [], lambda kl: [w.ref.at([oc, c, *kk, kl]) for oc in ocs]
        return [], lambda kl: [w.ref.at([oc, c, *["0"] * (w.ref.rank - 2)]) for oc in ocs]

    def outer_taps(body: Callable[[list[str]], str]) -> str:
        """Loops over the valid taps of the outer spatial dims (tables indexed by the output position)."""
        kk, tabs = [], []
        for d in range(r - 1):
            lo, hi = _k_ranges(outs[d], ins[d], strides[d], dils[d], pb[d], ks[d])
            full = all(a == 0 and b == ks[d] for a, b in zip(lo, hi, strict=True))
            kk.append("0" if ks[d] == 1 and full else names("k"))
            tabs.append((lo, hi))
        text = body(kk)
        for d in reversed(range(r - 1)):
            if kk[d] == "0":
                continue
            lo_e, hi_e = _table(names, decls, tabs[d][0], osp[d]), _table(names, decls, tabs[d][1], osp[d])
            text = f"for (int64_t {kk[d]} = {lo_e}; {kk[d]} < {hi_e}; ++{kk[d]}) {{\n{indent(text)}\n}}"
        return text

    def xrow(c: str, kk: list[str], last: str) -> str:
        """C pointer to input element (n, g*Cg + c, outer positions, last)."""
        terms = [(n, xs[0]), (lin((g, Cg), (c, 1)), xs[1])]
        for d in range(r - 1):
            terms += [(osp[d], strides[d] * xs[2 + d]), (kk[d], dils[d] * xs[2 + d]), -pb[d] * xs[2 + d]]
        return f"{xref.ptr} + ({lin(xref.offset, *terms, (last, xs[-1]))})"

    def block(m0: str, nb: int) -> str:
        gm0 = lin((g, Mg), (m0, 1))
        ocs = [lin((gm0, 1), j) for j in range(nb)]
        init = [bref.at([oc]) if bref else "0.0f" for oc in ocs]
        parts = []

        def tile(ow0: str, vt: int) -> str:
            # vt positions: vt // 8 vector accumulators (GCC vector extension) + vt % 8 scalars per channel
            c, kl, v = names("c"), names("kl"), names("v")
            nvec, rem = divmod(vt, LANES)
            accv = [[names("av") for _ in range(nvec)] for _ in ocs]
            accs = [[names("as") for _ in range(rem)] for _ in ocs]
            lines = []
            for jj in range(nb):
                lines += [f"dlcc_v8 {a} = (dlcc_v8){{0}} + {init[jj]};" for a in accv[jj]]
                lines += [f"float {a} = {init[jj]};" for a in accs[jj]]
            sx = SL * xs[-1]

            def inner(kk: list[str]) -> str:
                xr = names("px")
                wdecl, wexp = weights(ocs, gm0, c, kk)
                body = [f"const float* restrict {xr} = {xrow(c, kk, lin((ow0, SL), -PL))};", *wdecl]
                taps = [str(t) for t in range(KL)] if KL <= UNROLL_TAPS else [kl]
                loop = []
                for t in taps:
                    base = lin((t, DL * xs[-1]))
                    xv = [names("xv") for _ in range(nvec)]
                    for q, name in enumerate(xv):
                        if sx == 1:
                            loop.append(f"const dlcc_v8 {name} = dlcc_v8_load({xr} + {lin((base, 1), q * LANES)});")
                        else:
                            els = ", ".join(f"{xr}[{lin((base, 1), (q * LANES + e) * sx)}]" for e in range(LANES))
                            loop.append(f"const dlcc_v8 {name} = (dlcc_v8){{{els}}};")
                    xsc = [f"{xr}[{lin((base, 1), (nvec * LANES + e) * sx)}]" for e in range(rem)]
                    for jj, we in enumerate(wexp(t)):
                        wv = names("wv")
                        loop.append(f"const float {wv} = {we};")
                        loop += [f"{a} += {wv} * {x};" for a, x in zip(accv[jj], xv, strict=True)]
                        loop += [f"{a} += {wv} * {x};" for a, x in zip(accs[jj], xsc, strict=True)]
                text = "\n".join(loop)
                if KL > UNROLL_TAPS:
                    text = f"for (int64_t {kl} = 0; {kl} < {KL}; ++{kl}) {{\n{indent(text)}\n}}"
                return "\n".join([*body, text])

            red = outer_taps(inner)
            lines.append(f"for (int64_t {c} = 0; {c} < {Cg}; ++{c}) {{\n{indent(red)}\n}}")
            res = names("res")
            lines.append(f"float {res}[{nb}][{vt}];")
            for jj in range(nb):
                lines += [f"dlcc_v8_store(&{res}[{jj}][{q * LANES}], {a});" for q, a in enumerate(accv[jj])]
                lines += [f"{res}[{jj}][{nvec * LANES + e}] = {a};" for e, a in enumerate(accs[jj])]
            st = "\n".join(call.store([n, oc, *out_sp([*osp, lin((ow0, 1), (v, 1))])], f"{res}[{jj}][{v}]")
                           for jj, oc in enumerate(ocs))
            lines.append(f"for (int64_t {v} = 0; {v} < {vt}; ++{v}) {{\n{indent(st)}\n}}")
            return "\n".join(lines)

        def border(lo_o: int, hi_o: int) -> str:
            if hi_o <= lo_o:
                return ""
            ow, c, kl = names("ow"), names("c"), names("kl")
            klo, khi = _k_ranges(OL, IL, SL, DL, PL, KL)
            klo_e = _table(names, decls, klo[lo_o:hi_o], lin((ow, 1), -lo_o))
            khi_e = _table(names, decls, khi[lo_o:hi_o], lin((ow, 1), -lo_o))
            accs = [names("a") for _ in ocs]
            lines = [f"float {a} = {i};" for a, i in zip(accs, init, strict=True)]

            def inner(kk: list[str]) -> str:
                xr = names("px")
                wdecl, wexp = weights(ocs, gm0, c, kk)
                fma = "\n".join(f"{a} += {we} * {xr}[{lin((kl, DL * xs[-1]))}];"
                                 for a, we in zip(accs, wexp(kl), strict=True))
                return "\n".join([f"const float* restrict {xr} = {xrow(c, kk, lin((ow, SL), -PL))};", *wdecl,
                                  f"for (int64_t {kl} = {klo_e}; {kl} < {khi_e}; ++{kl}) {{\n{indent(fma)}\n}}"])

            lines.append(f"for (int64_t {c} = 0; {c} < {Cg}; ++{c}) {{\n{indent(outer_taps(inner))}\n}}")
            lines += [call.store([n, oc, *out_sp([*osp, ow])], a) for a, oc in zip(accs, ocs, strict=True)]
            return f"for (int64_t {ow} = {lo_o}; {ow} < {hi_o}; ++{ow}) {{\n{indent(chr(10).join(lines))}\n}}"

        a = min(OL, max(0, -(-PL // SL)))
        b = max(a, min(OL, (IL - 1 + PL - (KL - 1) * DL) // SL + 1))
        parts.append(border(0, a))
        if b > a:
            tb = names("tb")
            parts.append(_blocks(names, b - a, lambda s0, vt: tile(lin((s0, 1), a), vt), VEC_TILE, tb))
        parts.append(border(b, OL))
        return "\n".join(p for p in parts if p)

    code = _blocks(names, Mg, block)
    for d in reversed(range(r - 1)):
        if osp[d] != "0":
            code = f"for (int64_t {osp[d]} = 0; {osp[d]} < {outs[d]}; ++{osp[d]}) {{\n{indent(code)}\n}}"
    if group > 1:
        code = f"for (int64_t {g} = 0; {g} < {group}; ++{g}) {{\n{indent(code)}\n}}"
    if N > 1:
        code = f"for (int64_t {n} = 0; {n} < {N}; ++{n}) {{\n{indent(code)}\n}}"
    return "\n".join([*decls, code])


def _block_list(total: int, size: int) -> list[tuple[int, int]]:
    return [(m, min(size, total - m)) for m in range(0, total, size)]


def _blocks(names: Names, total: int, block: Callable[[str, int], str], size: int = OC_BLOCK,
            var: str | None = None) -> str:
    """Code running ``block(start, count)`` over [0, total) in blocks of ``size`` (a loop) plus a tail."""
    full, tail = divmod(total, size)
    parts = []
    if full == 1:
        parts.append("{\n" + indent(block("0", size)) + "\n}")
    elif full > 1:
        b = var or names("b")
        parts.append(f"for (int64_t {b} = 0; {b} < {full}; ++{b}) {{\n{indent(block(f'({b})*{size}', size))}\n}}")
    if tail:
        parts.append("{\n" + indent(block(str(full * size), tail)) + "\n}")
    return "\n".join(parts)


def _flat_ok(ref: TensorRef, lead: int) -> bool:
    """True when the dims after ``lead`` of ``ref`` are one contiguous run (flat index p works)."""
    acc = 1
    for d, s in zip(reversed(ref.shape[lead:]), reversed(ref.strides[lead:]), strict=True):
        if d != 1 and s != acc:
            return False
        acc *= d
    return True


def _unflat(p: str, shape: Sequence[int]) -> list[str]:
    """Per-dim index expressions of flat row-major position ``p`` in ``shape``."""
    idx, inner = [], math.prod(shape)
    for d in shape:
        inner //= d
        if d == 1:
            idx.append("0")
        elif inner == 1:
            idx.append(f"({p}) % {d}" if len(idx) else p)
        else:
            idx.append(f"(({p}) / {inner}) % {d}" if idx else f"({p}) / {inner}")
    return idx


# -------------------------------------------------------------------------------------- ConvTranspose

@register("ConvTranspose", needs_buffers=True)
def conv_transpose(call: TemplateCall) -> str:
    xref, w, bref, r, ks, group, strides, dils = _common(call)
    wref = _buffer(call, w, "W")
    N, C, *ins = xref.shape
    Cw, Mg = wref.shape[:2]
    M = Mg * group
    outs = list(call.out_shape[2:])
    if Cw != C or C % group:
        raise TemplateError(f"ConvTranspose: channels {C} (weight {Cw}) do not divide into {group} groups")
    Cg = C // group
    if tuple(call.out_shape[:2]) != (N, M):
        raise TemplateError(f"ConvTranspose: output shape {call.out_shape} does not match N={N}, M={M}")
    outpad = _ints(call, "output_padding", r, 0)
    auto = call.attr("auto_pad", "NOTSET")
    oshape = call.attr("output_shape")
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise TemplateError(f"ConvTranspose: unsupported auto_pad {auto!r}")
    if oshape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if oshape is not None:
            oshape = [int(v) for v in oshape][-r:]
            if oshape != outs:
                raise TemplateError(f"ConvTranspose: output_shape {oshape} does not match the output {outs}")
        pb = []
        for i, o, k, s, d, a in zip(ins, outs, ks, strides, dils, outpad, strict=True):
            total = max(0, s * (i - 1) + a + (k - 1) * d + 1 - o)
            # onnxruntime: SAME_LOWER puts the odd extra pad at the head (begin), others at the tail
            pb.append(total - total // 2 if auto == "SAME_LOWER" else total // 2)
    elif auto == "VALID":
        pb = [0] * r
    else:
        pads = _ints(call, "pads", 2 * r, 0)
        pb = pads[:r]
        for i, o, k, s, d, a, e, q in zip(ins, outs, ks, strides, dils, outpad, pads[:r], pads[r:], strict=True):
            if s * (i - 1) + a + (k - 1) * d + 1 - e - q != o:
                raise TemplateError(f"ConvTranspose: output shape {call.out_shape} inconsistent with the attributes")
    names = call.names
    sref = call.scratch
    dims = [window_dim(i, o, s, d, p, k, t_is_out=False, ostride=os_, istride=is_)
            for o, i, s, d, p, k, os_, is_ in zip(outs, ins, strides, dils, pb, ks, sref.strides[2:],
                                                  xref.strides[2:], strict=True)]
    decls: list[str] = []
    n = names("n") if N > 1 else "0"
    g = names("g") if group > 1 else "0"

    def block(m0: str, nb: int) -> str:
        ms = [lin((m0, 1), j) for j in range(nb)]
        ocs = [lin((g, Mg), (m, 1)) for m in ms]
        parts = [_plane_init(call, [n, oc], bref.at([oc]) if bref else "0.0f") for oc in ocs]
        c = names("c") if Cg > 1 else "0"
        ic = lin((g, Cg), (c, 1))
        obases = [_ptr(sref, [n, oc, *["0"] * r]) for oc in ocs]
        ibase = _ptr(xref, [n, ic, *["0"] * r])
        wv = [names("wv") for _ in range(nb)]

        def pre(kk: list[str]) -> str:
            return "\n".join(f"const float {v} = {wref.at([ic, m, *kk])};" for v, m in zip(wv, ms, strict=True))

        def stmt(oel: list[str], iel: str) -> str:
            xv = names("xv")
            return "\n".join([f"const float {xv} = {iel};",
                              *(f"{o} += {v} * {xv};" for o, v in zip(oel, wv, strict=True))])

        nest = window_nest(names, dims, obases, ibase, pre, stmt, decls)
        if Cg > 1:
            nest = f"for (int64_t {c} = 0; {c} < {Cg}; ++{c}) {{\n{indent(nest)}\n}}"
        parts.append(nest)
        parts += [_plane_store(call, [n, oc]) for oc in ocs]
        return "\n".join(p for p in parts if p)

    code = _blocks(names, Mg, block)
    if group > 1:
        code = f"for (int64_t {g} = 0; {g} < {group}; ++{g}) {{\n{indent(code)}\n}}"
    if N > 1:
        code = f"for (int64_t {n} = 0; {n} < {N}; ++{n}) {{\n{indent(code)}\n}}"
    return "\n".join([*decls, code])
