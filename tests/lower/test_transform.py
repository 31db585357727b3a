"""Schedule primitives on the loop IR (``schedule.transform``): each keeps what a kernel computes (the
interpreter's result is unchanged and the verifier accepts it), does what it says to the loops, and refuses
what it cannot do."""

import numpy as np
import pytest

from dlcc.errors import PassError
from dlcc.lower.lir import Bin, Buf, Const, For, Func, Layout, Store, Var, print_func, run_func, verify_func
from dlcc.schedule.transform import drop_unit_loops, loop_names, mark, parallelize, reorder, split, tile


def _transpose(m: int, n: int) -> Func:
    """y[i, j] = 2 * x[j, i] over a plain nest (i outside j)."""
    x = Buf("x", "float32", Layout.strided((n, m)))
    y = Buf("y", "float32", Layout.strided((m, n)))
    i, j = Var("i"), Var("j")
    return Func("t", (x, y), (For(i, Const(0), Const(m), (For(j, Const(0), Const(n), (
        Store(y, (i, j), x[j, i] * Const(2.0, "float32")),)),)),))


def _run(f: Func, m: int, n: int) -> np.ndarray:
    verify_func(f)
    x = np.arange(m * n, dtype=np.float32)
    y = np.full(m * n, np.nan, np.float32)
    run_func(f, {"x": x, "y": y})
    return y.reshape(m, n)


def _want(m: int, n: int) -> np.ndarray:
    return 2 * np.arange(m * n, dtype=np.float32).reshape(n, m).T


def test_split_and_mark_keep_the_result():
    f = mark(split(_transpose(23, 5), "i", 8), "i_o", "parallel")
    assert "parallel for i_o in [0, 3):" in print_func(f)
    assert loop_names(f) == ["i_o", "i_i", "j"]
    np.testing.assert_array_equal(_run(f, 23, 5), _want(23, 5))


def test_reorder_permutes_a_perfect_nest():
    f = reorder(_transpose(7, 9), ["j", "i"])
    assert loop_names(f) == ["j", "i"]
    np.testing.assert_array_equal(_run(f, 7, 9), _want(7, 9))


def test_reorder_refuses_what_would_change_the_result():
    f = split(_transpose(7, 9), "i", 4)  # i_i's bound depends on i_o: it cannot move outside it
    with pytest.raises(PassError, match="bounds"):
        reorder(f, ["i_i", "i_o"])
    g = Func("g", f.params, (For(Var("i"), Const(0), Const(2), (
        Store(f.params[1], (Var("i"), Const(0)), Const(0.0, "float32")),
        For(Var("j"), Const(0), Const(9), ()))),))
    with pytest.raises(PassError, match="perfect nest"):
        reorder(g, ["j", "i"])
    with pytest.raises(PassError, match="no loop"):
        reorder(f, ["k", "j"])


@pytest.mark.parametrize("m,n,fa,fb", [(16, 32, 8, 16), (23, 37, 8, 16), (5, 3, 8, 8)])
def test_tile_blocks_two_loops(m, n, fa, fb):
    f = tile(_transpose(m, n), ("i", "j"), (fa, fb))
    assert loop_names(f) == ["i_o", "j_o", "i_i", "j_i"]
    np.testing.assert_array_equal(_run(f, m, n), _want(m, n))
    g = drop_unit_loops(f)  # a loop over one block is gone, its variable 0
    assert [v for v in loop_names(g) if v.endswith("_o")] == [v for v, e in (("i_o", -(-m // fa)),
                                                                          ("j_o", -(-n // fb))) if e > 1]
    np.testing.assert_array_equal(_run(g, m, n), _want(m, n))


@pytest.mark.parametrize("parts", [1, 2, 3, 100])
def test_parallelize_hands_out_disjoint_shares(parts):
    f = parallelize(_transpose(11, 4), "i", parts, "t")
    text = print_func(f)
    assert f"parallel for t in [0, {min(parts, 11)}):" in text
    np.testing.assert_array_equal(_run(f, 11, 4), _want(11, 4))


def test_parallelize_refuses_a_loop_with_a_variable_range():
    f = split(_transpose(11, 4), "i", 4)
    with pytest.raises(PassError, match="constant"):
        parallelize(f, "i_i", 2, "t")


def test_a_parallel_split_that_overlaps_fails_verification():
    """The verifier, not the primitive, guards what a hand-made parallel loop writes: both threads storing row 0."""
    f = _transpose(4, 4)
    x, y = f.params
    t, j = Var("t"), Var("j")
    bad = Func("bad", (x, y), (For(t, Const(0), Const(2), (For(j, Const(0), Const(4), (
        Store(y, (Bin("*", t, Const(0)), j), Const(0.0, "float32")),)),), "parallel"),))
    with pytest.raises(PassError):
        verify_func(bad)


def test_unknown_loops_and_kinds_are_errors():
    f = _transpose(4, 4)
    with pytest.raises(PassError, match="no loop"):
        split(f, "k", 2)
    with pytest.raises(PassError, match="kind"):
        mark(f, "i", "sideways")
    with pytest.raises(PassError, match="factor"):
        split(f, "i", 0)
