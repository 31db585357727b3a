"""The loop nest of elementwise/injective steps and copies (``schedule.elementwise.map_func``): every index
handed to the epilogue once, with the opaque input's element at that index, threads or not."""

import numpy as np
import pytest

from dlcc.lower.lir import print_func, run_func, verify_func
from dlcc.schedule.elementwise import map_func


@pytest.mark.parametrize("shape,threads", [((2, 3, 4), 1), ((1, 37, 5), 2), ((1, 1, 1), 2), ((300,), 2), ((), 1)])
def test_map_func_hands_every_element_on_once(shape, threads):
    f = map_func(shape, "float32", threads)
    verify_func(f)
    src = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out = np.full(shape, np.nan, np.float32)
    seen = []

    def epilogue(i, v):
        seen.append(i)
        out[tuple(i)] = v

    run_func(f, {}, epilogue, inputs={0: src})
    np.testing.assert_array_equal(out, src)
    assert len(seen) == len(set(seen)) == src.size
    assert ("parallel" in print_func(f)) == (threads > 1 and src.size > 1)


def test_map_func_takes_stored_element_types():
    verify_func(map_func((4, 4), "uint8"))
