"""The Python runtime: a compiled model loaded with ctypes, called with numpy arrays.

What goes in: the shared library built from a ``CSource`` and the source's metadata (inputs, outputs,
arena size) plus the weights blob.
What comes out: ``CompiledModel``; ``model(x=array, ...)`` or ``model({"x": array})`` returns a dict of
output arrays (freshly allocated, owned by the caller).

Threads: a model compiled for several threads runs its parallel loops on a pool in the library (one call
at a time uses it; a call made meanwhile from another thread runs on its own thread); ``model.threads``
reads or lowers the count. Every call allocates its own arena (the only mutable state besides the outputs) and ctypes
releases the GIL during the call, so one CompiledModel may be called from many threads at once.
Inputs are checked by name, shape and dtype; a wrong one raises a DlccError saying what was expected.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlcc.errors import DlccError

__all__ = ["CompiledModel", "aligned_empty"]

ALIGN = 64


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is ``align``-byte aligned."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes]


@dataclass
class CompiledModel:
    library: Path
    inputs: list[tuple[str, str, tuple[int, ...]]]
    outputs: list[tuple[str, str, tuple[int, ...]]]
    arena_bytes: int
    weights: np.ndarray  # aligned uint8 blob
    info: dict = field(default_factory=dict)  # figures: kernels, memory plan, fusion, timings

    def __post_init__(self) -> None:
        self._lib = ctypes.CDLL(str(self.library))
        self._run = self._lib.dlcc_run
        self._run.restype = None
        self._run.argtypes = [ctypes.c_void_p] * 4
        self._input_names = [n for n, _, _ in self.inputs]

    @property
    def threads(self) -> int:
        """Threads a call runs on (the pool's size is fixed at compile time: ``dlcc.compile(threads=N)``)."""
        return int(self._lib.dlcc_num_threads())

    @threads.setter
    def threads(self, n: int) -> None:
        """Run on at most ``n`` threads (1 .. the compiled count)."""
        self._lib.dlcc_set_num_threads(int(n))

    @property
    def input_names(self) -> list[str]:
        return list(self._input_names)

    @property
    def output_names(self) -> list[str]:
        return [n for n, _, _ in self.outputs]

    def _check(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        unknown = [k for k in feeds if k not in self._input_names]
        if unknown:
            raise DlccError(f"unknown input(s) {', '.join(map(repr, unknown))}",
                            hint=f"the model's inputs are: {', '.join(self._input_names)}")
        arrays = []
        for name, dtype, shape in self.inputs:
            if name not in feeds:
                raise DlccError(f"missing input '{name}' ({dtype}{list(shape)})")
            a = np.asarray(feeds[name])
            if a.dtype != np.dtype(dtype):
                raise DlccError(f"input '{name}' is {a.dtype} but the model expects {dtype}",
                                hint=f"convert it with .astype(np.{dtype})")
            if tuple(a.shape) != tuple(shape):
                raise DlccError(f"input '{name}' has shape {list(a.shape)} but the model was compiled for "
                                f"{list(shape)}", hint="recompile with --input-shape for another shape")
            arrays.append(np.ascontiguousarray(a))
        return arrays

    def __call__(self, feeds: Mapping[str, np.ndarray] | None = None, /, **kwargs: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {**(feeds or {}), **kwargs}
        arrays = self._check(feeds)
        outs = [np.empty(shape, dtype=dtype) for _, dtype, shape in self.outputs]
        arena = aligned_empty(max(self.arena_bytes, 1))
        in_ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        self._run(ctypes.cast(in_ptrs, ctypes.c_void_p), ctypes.cast(out_ptrs, ctypes.c_void_p),
                  arena.ctypes.data, self.weights.ctypes.data)
        return {name: o for (name, _, _), o in zip(self.outputs, outs, strict=True)}

    run = __call__

    # ------------------------------------------------------------------------------------- profiling

    @property
    def num_kernels(self) -> int:
        fn = self._profiled()[1]
        return int(fn())

    def _profiled(self):
        try:
            run, count = self._lib.dlcc_run_profiled, self._lib.dlcc_num_kernels
        except AttributeError:
            raise DlccError(f"the library {self.library} has no profiled entry point",
                            hint="it was built by an older dlcc: compile the model again") from None
        run.restype = None
        run.argtypes = [ctypes.c_void_p] * 5
        count.restype = ctypes.c_int
        count.argtypes = []
        return run, count

    def run_profiled(self, feeds: Mapping[str, np.ndarray] | None = None, /,
                     **kwargs: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """One call through ``dlcc_run_profiled``: (outputs, seconds per kernel in call order)."""
        run, count = self._profiled()
        arrays = self._check({**(feeds or {}), **kwargs})
        outs = [np.empty(shape, dtype=dtype) for _, dtype, shape in self.outputs]
        arena = aligned_empty(max(self.arena_bytes, 1))
        seconds = np.zeros(max(int(count()), 1), dtype=np.float64)
        in_ptrs = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(1, len(outs)))(*[o.ctypes.data for o in outs])
        run(ctypes.cast(in_ptrs, ctypes.c_void_p), ctypes.cast(out_ptrs, ctypes.c_void_p), arena.ctypes.data,
            self.weights.ctypes.data, seconds.ctypes.data)
        return ({name: o for (name, _, _), o in zip(self.outputs, outs, strict=True)},
                seconds[:int(count())].copy())

    def profile(self, feeds: Mapping[str, np.ndarray], runs: int = 10) -> np.ndarray:
        """Seconds per kernel (call order), each the best of ``runs`` profiled calls after one warm-up call."""
        if runs < 1:
            raise DlccError(f"the number of profiled runs must be at least 1, got {runs}")
        self(feeds)  # warm-up: page in the weights and the code
        best = None
        for _ in range(runs):
            _, seconds = self.run_profiled(feeds)
            best = seconds if best is None else np.minimum(best, seconds)
        return best
