"""The Python runtime: a compiled model loaded with ctypes, called with numpy arrays.

What goes in: the shared library built from a ``CSource`` and the source's metadata (inputs, outputs,
arena size) plus the weights blob.
What comes out: ``CompiledModel``; ``model(x=array, ...)`` or ``model({"x": array})`` returns a dict of
output arrays (freshly allocated, owned by the caller).

Threads: a model compiled for several threads runs its parallel loops on a pool in the library (one call
at a time uses it; a call made meanwhile from another thread runs on its own thread); ``model.threads``
reads or lowers the count. Each Python thread that calls the model gets its own arena (the only mutable state
besides the outputs), kept for its next calls, and ctypes releases the GIL during the call, so one CompiledModel
may be called from many threads at once.
Inputs are checked by name, shape and dtype; a wrong one raises a DlccError saying what was expected.

The Python around the C is kept to about half a microsecond a call, since a model of a few microseconds (a
LayerNorm, a small MLP) would otherwise spend more time in it than in its kernels: the arena and the two pointer
tables are made once per thread, addresses are taken through the buffer protocol (``_address``: a quarter of
``ndarray.ctypes.data``'s cost), and inputs that are already C-contiguous arrays of their dtype and shape are
used as they are. A thread's arena lives as long as the thread (a pool of many threads calling one large model
holds one arena each).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlcc.errors import DlccError

__all__ = ["CompiledModel", "aligned_empty"]

ALIGN = 64


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array: through the buffer protocol where it is writable and not empty
    (``ctypes.c_char.from_buffer``, about 0.2 us), else ``a.ctypes.data`` (about 0.9 us)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):  # (read-only, or no bytes)
        return a.ctypes.data


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
        self._in_specs = [(n, np.dtype(d), tuple(s)) for n, d, s in self.inputs]
        self._out_specs = [(n, np.dtype(d), tuple(s)) for n, d, s in self.outputs]
        self._out_names = [n for n, _, _ in self.outputs]
        self._weights_at = _address(self.weights)
        self._local = threading.local()  # per calling thread: its arena and pointer tables (``_state``)

    def _state(self) -> tuple[int, ctypes.Array, ctypes.Array]:
        """This thread's (arena address, input pointer table, output pointer table), made on its first call."""
        st = getattr(self._local, "state", None)
        if st is None:
            arena = aligned_empty(max(self.arena_bytes, 1))
            st = (arena, _address(arena), (ctypes.c_void_p * max(1, len(self.inputs)))(),
                  (ctypes.c_void_p * max(1, len(self.outputs)))())
            self._local.state = st
        return st[1], st[2], st[3]

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
        if len(feeds) == len(self._in_specs):  # the usual call: every input, as a C-contiguous array of its type
            arrays = []
            for name, dtype, shape in self._in_specs:
                a = feeds.get(name)
                if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                    break
                arrays.append(a)
            else:
                return arrays
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
        arrays, outs, in_ptrs, out_ptrs, arena = self._prepare(feeds, kwargs)
        self._run(in_ptrs, out_ptrs, arena, self._weights_at)  # (``arrays``: the inputs alive through the call)
        return dict(zip(self._out_names, outs, strict=True))

    def _prepare(self, feeds: Mapping[str, np.ndarray] | None, kwargs: dict[str, np.ndarray]):
        """(checked inputs, fresh outputs, this thread's input and output pointer tables filled, its arena)."""
        feeds = {**(feeds or {}), **kwargs} if kwargs or not isinstance(feeds, Mapping) else feeds
        arrays = self._check(feeds)
        outs = [np.empty(shape, dtype=dtype) for _, dtype, shape in self._out_specs]
        arena, in_ptrs, out_ptrs = self._state()
        for i, a in enumerate(arrays):
            in_ptrs[i] = _address(a)
        for i, o in enumerate(outs):
            out_ptrs[i] = _address(o)
        return arrays, outs, in_ptrs, out_ptrs, arena

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
        arrays, outs, in_ptrs, out_ptrs, arena = self._prepare(feeds, kwargs)
        seconds = np.zeros(max(int(count()), 1), dtype=np.float64)
        run(in_ptrs, out_ptrs, arena, self._weights_at, seconds.ctypes.data)
        return dict(zip(self._out_names, outs, strict=True)), seconds[:int(count())].copy()

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
