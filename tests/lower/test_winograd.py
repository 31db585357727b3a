"""Winograd F(4x4, 3x3) (``schedule.winograd``): its loop IR verified and interpreted against a float64
convolution, its three micro-kernels (``wgi_``, ``gemmr_``, ``wgo_``) in C against their contracts on every
target this machine runs, the layer choice, and whole convolutions against onnxruntime."""

import ctypes
import dataclasses
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_lir import PRELUDE, _build, _conv_ref, _run_conv_ir

from dlcc.codegen.cbase import vector_helpers
from dlcc.codegen.ukernels import micro_c
from dlcc.lower.lir import MICRO, Buf, Layout, print_func, verify_func
from dlcc.lower.micro import WINO_AT, WINO_BT, WINO_G, gemmr_micro, wgi_micro, wgo_micro
from dlcc.schedule.gemm import ConvGeometry
from dlcc.schedule.target import get_target
from dlcc.schedule.winograd import pack_winograd, plan_winograd, use_winograd, wino_func
from dlcc.testing.harness import assert_close, ort_output, run_node, runnable_targets


def test_transform_matrices_compute_a_3x3_correlation():
    rng = np.random.default_rng(0)
    d, g = rng.standard_normal((6, 6)), rng.standard_normal((3, 3))
    y = WINO_AT @ ((WINO_G @ g @ WINO_G.T) * (WINO_BT @ d @ WINO_BT.T)) @ WINO_AT.T
    ref = np.array([[(d[i:i + 3, j:j + 3] * g).sum() for j in range(4)] for i in range(4)])
    np.testing.assert_allclose(y, ref, atol=1e-12)


CASES = [  # n, ci, h, w, co, pad, threads
    (1, 16, 9, 8, 20, 1, 1),  # a partial output-channel block; rows and columns of the last tiles past the plane
    (2, 20, 12, 13, 40, 1, 2),  # a partial input block, two images, threads over blocks
    (1, 32, 16, 16, 33, 0, 2),  # no padding (14x14 outputs)
    (1, 16, 28, 28, 64, 1, 2),  # 7 rows of tiles: blocks padded with rows of zero tiles
    (1, 24, 7, 30, 17, 1, 1),  # a wide, short plane
    (1, 64, 13, 13, 256, 1, 2),  # SqueezeNet's expand at 13x13: on AVX2, threads over U's columns
]


@pytest.mark.parametrize("target,n,ci,h,w,co,pad,threads,cl", [
    (t, *c, cl) for t in ("x86-64-v4", "x86-64-v3", "aarch64") for c in CASES for cl in (False, True)])
def test_winograd_loop_ir_matches_numpy(target, n, ci, h, w, co, pad, threads, cl):
    """Against a float64 convolution; ``cl``: channels-last input and output (``channels_last``), per tile and
    block of output channels the tile's pixels through the epilogue (``wgop_``), nothing handed for the tiles
    past the plane's last rows and columns."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, ci, h, w)).astype(np.float32)
    wt = rng.standard_normal((co, ci, 3, 3)).astype(np.float32)
    ref = _conv_ref(x, wt, (1, 1), (1, 1), (pad, pad))
    oh, ow = ref.shape[2:]
    g = ConvGeometry(ci, h, w, oh, ow, 3, 3, 1, 1, 1, 1, pad, pad)
    p = plan_winograd(co, g, n, get_target(target), threads)
    up = pack_winograd(wt, p)
    xs = (h * w * ci, 1, w * ci, ci) if cl else None
    cs = (oh * ow * co, 1, co) if cl else None
    f = wino_func(p, Buf("x", "float32", Layout.strided((n, ci, h, w), xs)),
                  Buf("up", "float32", Layout.strided(up.shape)),
                  Buf("c", "float32", Layout.strided((n, co, oh * ow), cs)),
                  Buf("ws", "float32", Layout.strided((p.workspace_floats,)), "workspace"), channels_last=cl)
    verify_func(f)
    assert ("wgop_" in print_func(f)) == cl
    out, seen = _run_conv_ir(f, x.transpose(0, 2, 3, 1) if cl else x, "up", up, (n, co, oh * ow),
                             p.workspace_floats)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(out.reshape(ref.shape) / scale, ref / scale, atol=1e-5)
    assert len(seen) == len(set(seen)) == out.size  # every output handed to the epilogue once


@pytest.mark.parametrize("target", runnable_targets())
def test_winograd_micro_kernels_match_their_contracts(target):
    t = get_target(target)
    if not 4 <= t.lanes <= 16:
        pytest.skip(f"{target}: {t.lanes} floats per vector, Winograd does not run")
    rng = np.random.default_rng(9)
    cbi = t.lanes
    nr = 2 * cbi
    xrow, ldv, ldm, rp, lda = 9 * cbi, 3 * cbi, 2 * cbi + 4, 12, 37
    names = {"wgi": wgi_micro(cbi, xrow, ldv), "wgo": wgo_micro(cbi, ldm, rp), "gemmr": gemmr_micro(5, nr, lda),
             "gemmr1": gemmr_micro(1, nr, lda),  # (one row: k unrolled into partial sums)
             "wgop": wgo_micro(cbi, ldm, 5, pixel_major=True)}
    src = PRELUDE + vector_helpers(t.lanes) + "\n" + "".join(micro_c(n, t.lanes) for n in names.values())
    src += (f"void w_wgi(const float* x, float* v) {{ dlcc_uk_{names['wgi']}(x, v); }}\n"
            f"void w_wgo(const float* m, float* c, int64_t ldc) {{ dlcc_uk_{names['wgo']}(m, c, ldc); }}\n"
            f"void w_wgop(const float* m, float* c, int64_t ldc) {{ dlcc_uk_{names['wgop']}(m, c, ldc); }}\n"
            f"void w_gemmr(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t acc, "
            f"int64_t ncols) {{ dlcc_uk_{names['gemmr']}(kc, a, b, c, ldc, acc, ncols); }}\n"
            f"void w_gemmr1(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int64_t acc, "
            f"int64_t ncols) {{ dlcc_uk_{names['gemmr1']}(kc, a, b, c, ldc, acc, ncols); }}\n")
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64

    def p(a):
        return a.ctypes.data_as(ptr)

    with tempfile.TemporaryDirectory() as tmp:
        lib = _build(src, tmp, t)
        # input transform
        x = rng.standard_normal(6 * xrow).astype(np.float32)
        want, got = (np.full(36 * ldv, 7.0, np.float32) for _ in range(2))
        MICRO[names["wgi"]].reference({"x": x, "v": want}, {"x": 0, "v": 0}, {})
        lib.w_wgi.argtypes = [ptr, ptr]
        lib.w_wgi(p(x), p(got))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        # output transform: the 4 x 4 pixels of each channel, nothing else
        m = rng.standard_normal(36 * ldm).astype(np.float32)
        ldc = 3 * rp + 4 + 5
        want, got = (np.full(cbi * ldc, 7.0, np.float32) for _ in range(2))
        MICRO[names["wgo"]].reference({"m": m, "c": want}, {"m": 0, "c": 0}, {"ldc": ldc})
        lib.w_wgo.argtypes = [ptr, ptr, i64]
        lib.w_wgo(p(m), p(got), ldc)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert (got.reshape(cbi, ldc)[:, 4:rp] == 7.0).all()
        # pixel-major: each pixel's channels together, ldc apart; the row's fifth pixel and the gaps untouched
        ldc = cbi + 3
        want, got = (np.full(20 * ldc, 7.0, np.float32) for _ in range(2))
        MICRO[names["wgop"]].reference({"m": m, "c": want}, {"m": 0, "c": 0}, {"ldc": ldc})
        lib.w_wgop.argtypes = [ptr, ptr, i64]
        lib.w_wgop(p(m), p(got), ldc)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert (got.reshape(20, ldc)[:, cbi:] == 7.0).all() and (got.reshape(4, 5, ldc)[:, 4] == 7.0).all()
        mm = m.reshape(36, ldm)[:, :cbi].astype(np.float64).reshape(6, 6, cbi)
        y = np.einsum("yr,rsi,zs->yzi", WINO_AT, mm, WINO_AT)
        np.testing.assert_allclose(got.reshape(4, 5, ldc)[:, :4, :cbi], y, rtol=1e-4, atol=1e-4)
        # the GEMM tile over a row-major A: stored, added, a partial tile of columns
        kc, ldc = 29, nr + 3
        a = rng.standard_normal(5 * lda).astype(np.float32)
        b = rng.standard_normal(kc * nr).astype(np.float32)
        for key in ("gemmr", "gemmr1"):
            fn = getattr(lib, f"w_{key}")
            fn.argtypes = [i64, ptr, ptr, ptr, i64, i64, i64]
            for acc, ncols in ((0, nr), (1, nr), (1, nr - 3), (0, 1)):
                start = rng.standard_normal(5 * ldc).astype(np.float32)
                want, got = start.copy(), start.copy()
                MICRO[names[key]].reference({"a": a, "b": b, "c": want}, {"a": 0, "b": 0, "c": 0},
                                            {"kc": kc, "ldc": ldc, "acc": acc, "ncols": ncols})
                fn(kc, p(a), p(b), p(got), ldc, acc, ncols)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("ci,h,co", [(256, 14, 256), (128, 28, 128), (64, 56, 64), (512, 7, 512), (96, 20, 48)])
def test_positions_of_v_and_m_fall_in_different_l1_sets(ci, h, co):
    """The 36 positions of a thread's V and M are an odd number of 64-byte lines apart (``spread``): with 4 KiB
    per L1 way, one tile's 36 values then sit in 36 different sets (256 channels x 8 tiles unpadded: all in one)."""
    p = plan_winograd(co, ConvGeometry(ci, h, h, h, h, 3, 3, 1, 1, 1, 1, 1, 1), 1, get_target("x86-64-v4"))
    for ld, unpadded in ((p.ldv, p.pb * p.cp), (p.ldm, p.pb * p.kp)):
        assert unpadded <= ld <= unpadded + 16
        assert len({(4 * ld * q // 64) % 64 for q in range(36)}) == 36
    assert p.thread_floats == 36 * (p.ldv + p.ldm)


def test_layer_choice():
    t = get_target("x86-64-v4")

    def g(c, h):
        return ConvGeometry(c, h, h, h, h, 3, 3, 1, 1, 1, 1, 1, 1)

    assert use_winograd(g(64, 56), 64, 1, t) and use_winograd(g(256, 14), 256, 1, t)
    big_l3 = dataclasses.replace(t, l3_bytes=32 << 20)
    assert not use_winograd(g(256, 7), 256, 1, big_l3)  # a 9.4 MB transformed weight streamed for 4 tiles
    assert use_winograd(g(64, 7), 64, 1, big_l3)  # (0.6 MB: stays in L2)
    assert not use_winograd(g(512, 7), 512, 1, t)  # 4 tiles cannot reuse a 37.7 MB transformed weight
    assert not use_winograd(g(128, 14), 32, 1, t)  # few output channels on a small plane: the transform dominates
    assert not use_winograd(g(3, 224), 64, 1, t)  # fewer input channels than a vector
    strided = ConvGeometry(64, 56, 56, 28, 28, 3, 3, 2, 2, 1, 1, 1, 1)
    assert not use_winograd(strided, 64, 1, t)
    assert not use_winograd(g(160, 6), 320, 1, big_l3)  # 36 of the 2 x 2 tiles' 64 outputs inside the plane
    assert use_winograd(g(128, 13), 128, 1, big_l3)  # 169 of 256


def test_small_plane_threads_split_the_output_channels():
    """On 2 threads, a plane of 4 rows of tiles (SqueezeNet's 64 -> 256 at 13 x 13, AVX2) runs as one block of 16
    tiles with each thread its half of U's columns, not as 4 blocks of one row of tiles each reading all of U for 4
    tiles; at 1 thread, one block; the larger planes' plans are not those."""
    v3 = get_target("x86-64-v3")

    def g(c, h):
        return ConvGeometry(c, h, h, h, h, 3, 3, 1, 1, 1, 1, 1, 1)

    two = plan_winograd(256, g(64, 13), 1, v3, 2)
    assert (two.split, two.tr, two.threads) == ("channels", 4, 2)
    one = plan_winograd(256, g(64, 13), 1, v3, 1)
    assert (one.split, one.tr, one.threads) == ("blocks", 4, 1)
    assert plan_winograd(192, g(128, 27), 1, v3, 2).split == "blocks"  # (7 rows of tiles: blocks of 4 rows)


def _conv_model(x_shape, co, pads, residual):
    rng = np.random.default_rng(4)
    ci = x_shape[1]
    w = (rng.standard_normal((co, ci, 3, 3)) / np.sqrt(9 * ci)).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads), helper.make_node("Relu", ["c"], ["r"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    oh, ow = x_shape[2] + pads[0] + pads[2] - 2, x_shape[3] + pads[1] + pads[3] - 2
    if residual:
        nodes.append(helper.make_node("Add", ["r", "s"], ["y"]))
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [x_shape[0], co, oh, ow]))
        feeds["s"] = rng.standard_normal((x_shape[0], co, oh, ow)).astype(np.float32)
    else:
        nodes[-1] = helper.make_node("Relu", ["c"], ["y"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], co, oh, ow])
    graph = helper.make_graph(nodes, "g", inputs, [out],
                              [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


@pytest.mark.parametrize("x_shape,co,pads,residual,threads", [
    ((1, 64, 56, 56), 64, [1, 1, 1, 1], True, 2),  # ResNet's first stage, bias, ReLU and residual Add fused
    ((1, 256, 14, 14), 256, [1, 1, 1, 1], False, 1),  # 256 input channels (the transforms' rounding adds up)
    ((2, 24, 19, 23), 72, [1, 0, 2, 1], False, 2),  # asymmetric padding, two images, partial blocks
])
def test_winograd_convolution_matches_onnxruntime(x_shape, co, pads, residual, threads):
    import dlcc

    m, feeds = _conv_model(x_shape, co, pads, residual)
    ref = ort_output(m, feeds)
    cm = dlcc.compile(m, threads=threads)
    assert "dlcc_uk_wgi_" in cm.artifacts.csource.source  # (the layer took Winograd)
    assert_close(next(iter(cm(feeds).values())), ref, 1e-4, 1e-6)


def test_winograd_single_node_every_target():
    x_shape, w_shape = (1, 16, 11, 13), (20, 16, 3, 3)
    rng = np.random.default_rng(2)
    w = rng.standard_normal(w_shape).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 20, 11, 13])],
                              [onnx.numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    ref = ort_output(m, feeds)
    for target in runnable_targets():
        assert_close(run_node(m, feeds, target=target), ref, 1e-4, 1e-6)


def test_winograd_can_be_switched_off(tmp_path):
    """dlcc.compile(..., winograd=False) and --no-winograd keep every 3x3 convolution direct: the same outputs,
    the weights blob at the model's size (Winograd's transformed weight is 36/9 = 4x the 3x3 weight)."""
    import dlcc
    from dlcc.cli import main

    m, feeds = _conv_model((1, 64, 28, 28), 64, [1, 1, 1, 1], False)
    ref = ort_output(m, feeds)
    on, off = dlcc.compile(m, threads=1), dlcc.compile(m, threads=1, winograd=False)
    assert "dlcc_uk_wgi_" in on.artifacts.csource.source
    assert "dlcc_uk_wgi_" not in off.artifacts.csource.source
    assert len(off.artifacts.csource.weights) < len(on.artifacts.csource.weights) / 3
    for cm in (on, off):
        assert_close(next(iter(cm(feeds).values())), ref, 1e-4, 1e-6)
    src = tmp_path / "conv.onnx"
    onnx.save(m, src)
    assert main(["compile", str(src), "-o", str(tmp_path / "b"), "--threads", "1", "--no-winograd"]) == 0
    assert "dlcc_uk_wgi_" not in "".join(p.read_text() for p in (tmp_path / "b").glob("kernels_*.c"))
