"""Squeeze-and-excitation scales folded into the convolution that reads them (``schedule.chscale``): the scaled
repacking against its contract on every target the machine runs, and EfficientNet-B0 / MobileNetV3-Small (whose
SE blocks end in a Mul that a 1x1 Conv reads) against onnxruntime and the kernel-IR interpreter."""

from __future__ import annotations

import ctypes
import tempfile

import numpy as np
import pytest
from test_lir import PRELUDE, _build

import dlcc
from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.lower.interp import interpret
from dlcc.lower.lir import MICRO
from dlcc.lower.micro import nchwc_micro
from dlcc.schedule.chscale import scale_operands
from dlcc.schedule.target import get_target
from dlcc.testing.harness import assert_close, runnable_targets
from dlcc.testing.models import efficientnet_b0, mobilenet_v3_small


@pytest.mark.parametrize("target", runnable_targets())
def test_scaled_repack_matches_its_contract(target):
    """nchwc_..._s: each channel times its factor, from NCHW (whole vectors transposed, and the scalar tail) and
    from channels-last, full and partial blocks and a band of rows; the ring stays 0; nothing outside written."""
    t = get_target(target)
    L = t.lanes
    rng = np.random.default_rng(5)
    geos = [(L, 5, L + 3, 1, 1, 7, L + 5, 1), (L, 4, 3, 0, 2, 4, 7, 1), (L, 5, 6, 1, 2, 7, 9, 3 * L),
            (3, 4, 5, 1, 1, 6, 7, 1)]  # (a block narrower than a vector: constant-indexed copies)
    src = PRELUDE + vector_helpers(L) + "\n"
    for geo in geos:
        name = nchwc_micro(*geo[:7], xw=geo[7], scaled=True)
        assert name.endswith("_s")
        src += micro_c(name, L) + (f"void w_{name}(const float* x, const float* sc, int64_t xc, int64_t xh, "
                                   f"int64_t nci, int64_t y0, int64_t rows, float* ws) "
                                   f"{{ dlcc_uk_{name}(x, sc, xc, xh, nci, y0, rows, ws); }}\n")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        for geo in geos:
            cbi, h, w, ph, pw, hp, wp, xw = geo
            name = nchwc_micro(*geo[:7], xw=xw, scaled=True)
            xc, xh = (1, w * xw) if xw != 1 else (h * (w + 2) + 1, w + 2)
            x = rng.standard_normal(cbi * xc + h * xh + xw).astype(np.float32)
            sc = rng.standard_normal(cbi).astype(np.float32)
            fn = getattr(lib, f"w_{name}")
            fn.argtypes = [ptr, ptr, i64, i64, i64, i64, i64, ptr]
            for nci, y0, y1 in ((cbi, 0, hp), (cbi - 2, 0, hp), (cbi, 1, hp - 1)):
                want = np.full(hp * wp * cbi + 3, 7.0, np.float32)
                MICRO[name].reference({"x": x, "sc": sc, "ws": want}, {"x": 0, "sc": 0, "ws": 0},
                                      {"xc": xc, "xh": xh, "nci": nci, "y0": y0, "rows": y1 - y0})
                got = np.full(hp * wp * cbi + 3, 7.0, np.float32)
                fn(x.ctypes.data_as(ptr), sc.ctypes.data_as(ptr), xc, xh, nci, y0, y1 - y0, got.ctypes.data_as(ptr))
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
                assert (got[-3:] == 7.0).all()


def _feeds(m, batch):
    rng = np.random.default_rng(0)
    return {m.graph.input[0].name: rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}


def _ort(m, feeds):
    import onnxruntime as ort

    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def _folded(program) -> int:
    return sum(1 for k in program.kernels for s in k.steps if s.input_scale is not None)


def _se_muls(program) -> int:
    """Kernels that are one loop step of a per-channel Mul (an SE scale left on its own)."""
    return sum(1 for k in program.kernels if len(k.steps) == 1 and k.steps[0].kind == "loop"
               and scale_operands(program, k.steps[0].outputs[0].producer()) is not None)


@pytest.mark.parametrize("builder,blocks,batch,threads", [(efficientnet_b0, 16, 1, 1), (efficientnet_b0, 16, 2, 2),
                                                          (mobilenet_v3_small, 9, 1, 2), (mobilenet_v3_small, 9, 2, 1)])
def test_se_scales_fold_into_the_direct_convolution(builder, blocks, batch, threads):
    """The SE blocks' Mul kernels go into the 1x1 Convs after them where those run as the direct kernel (all but
    EfficientNet's first at this size, whose 32 x 32 plane takes the pointwise GEMM); the arena stays at its lower
    bound; outputs match onnxruntime and the interpreter (which runs the folded Mul as a node of the Conv's step)."""
    m = builder(batch=batch, size=64, seed=1)
    feeds = _feeds(m, batch)
    ref = _ort(m, feeds)
    cm = dlcc.compile(m, threads=threads)
    art = cm.artifacts
    assert _folded(art.program) + _se_muls(art.program) == blocks and _se_muls(art.program) <= 1
    assert "_s(" in art.csource.source  # the scaled repacking
    assert_close(list(cm(feeds).values())[0], ref, 1e-4, 1e-6)
    assert_close(list(interpret(art.program, art.memory, feeds).values())[0], ref, 1e-4, 1e-6)
    assert art.memory.arena_bytes <= 1.05 * art.memory.lower_bound + 64


def test_se_scales_every_target():
    """On every target the machine runs: folded where there are vectors (the blocked direct kernel), left as its
    own kernel on the scalar one; the same outputs."""
    m = efficientnet_b0(size=32, seed=2)
    feeds = {m.graph.input[0].name: np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    ref = _ort(m, feeds)
    for target in runnable_targets():
        cm = dlcc.compile(m, target=target, threads=1)
        assert (_folded(cm.artifacts.program) > 0) == (get_target(target).lanes >= 4)
        assert_close(list(cm(feeds).values())[0], ref, 1e-4, 1e-6)
