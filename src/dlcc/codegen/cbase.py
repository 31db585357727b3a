"""The contract between the kernel generator and the op templates: tensor references, operands, C types.

What goes in: buffers of the kernel IR (a C pointer name, dtype, shape, element strides, element offset).
What comes out: C expressions and statements as strings.

- ``TensorRef`` is a strided window on a C pointer: ``ref.at(["n", "c", "3", "w"])`` is the C lvalue of
  one element. Shapes, strides and offsets are Python ints, baked into the C as literals (kernels are
  specialized to their shapes), so ``at`` folds constant index parts at generation time.
- ``Operand`` is what a template reads: ``at(idx)`` gives a C *expression* for one element. It may be a
  load from a buffer (``ref`` is set: templates that need raw pointers, e.g. a GEMM inner loop, use it) or
  an inlined computation (a fused elementwise/injective prologue; ``ref`` is None).
- ``Store`` is the epilogue callback a template calls for every output element it finishes:
  ``store(idx, value_expr)`` returns C statements that apply the fused epilogue (bias, activation,
  residual add, ...) and write the result, so a template never knows what follows it.
- ``Names`` hands out fresh C identifiers (``t0``, ``t1``...). Identifiers never come from the model.

Invariants: all generated identifiers match ``[a-z_][a-z0-9_]*``; every index expression is a C
``int64_t`` expression; float values are C ``float`` expressions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dlcc.errors import DlccError, TemplateError  # noqa: F401  (TemplateError re-exported for the templates)
from dlcc.util import contiguous_strides, sanitize_comment  # noqa: F401  (re-exported for codegen)

# dtype name (numpy) -> C type. bool is one byte holding 0 or 1, like numpy's.
CTYPES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "int64": "int64_t",
    "int32": "int32_t",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "bool": "uint8_t",
}


def ctype(dtype: str | np.dtype) -> str:
    name = np.dtype(dtype).name
    if name not in CTYPES:
        raise DlccError(f"the C backend has no type for {name} tensors",
                        hint="dlcc compiles float32 tensors with int64/int32 indices and bool masks")
    return CTYPES[name]


def c_float(x: float) -> str:
    """A float32 literal that round-trips exactly (inf/nan as macros from math.h)."""
    x = float(np.float32(x))
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    text = repr(x)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}f" if not text.startswith("-") else f"({text}f)"


def c_int(x: int) -> str:
    x = int(x)
    if x == -(2**63):
        return "INT64_MIN"
    return f"INT64_C({x})" if abs(x) > 2**31 - 1 else (str(x) if x >= 0 else f"({x})")


def c_literal(x, dtype: str | np.dtype) -> str:
    """A C literal of ``x`` in ``dtype``."""
    name = np.dtype(dtype).name
    if name in ("float32", "float64"):
        return c_float(x)
    if name == "bool":
        return "1" if bool(x) else "0"
    return c_int(int(x))


_IDENT = re.compile(r"[a-z_][a-z0-9_]*\Z")


def split_channel(block: str, lane: str, size: int) -> str:
    """The C text of channel ``block * size + lane`` (``lane`` a loop variable below ``size``) as kernels that store
    whole channel blocks write it: a layout in blocks of ``size`` reads it back as (block, lane), no division
    (``element_c.c_index``: a ``Lane``; so no other channel index may take this form with a lane of ``size`` or
    more)."""
    return f"({block})*{size} + ({lane})"


def _lin(terms: Sequence[tuple[str, int]], const: int) -> str:
    """C text of ``const + sum(expr * coef)``, with constant folding of literal terms."""
    parts = []
    for expr, coef in terms:
        if coef == 0:
            continue
        expr = expr.strip()
        if re.fullmatch(r"-?\d+", expr):
            const += int(expr) * coef
            continue
        parts.append(f"({expr})" if coef == 1 else f"({expr})*{coef}")
    if const or not parts:
        parts.append(str(const))
    return " + ".join(parts)


@dataclass(frozen=True)
class TensorRef:
    """A strided window on the C pointer ``ptr``: element ``idx`` is ``ptr[offset + sum(idx[d]*strides[d])]``."""

    ptr: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...] = ()
    offset: int = 0
    ring: tuple[int, ...] = ()  # a zero ring around the planes (``kir.Buffer.ring``: rows above, below, columns
    # left, right), which a reader may take as the padding
    block: int = 0  # rank 4: channels in blocks of this many (``kir.Buffer.block``: channel c at (c / block) *
    # strides[1] + c % block)
    ring_fill: float = 0.0  # what the ring holds (``kir.Buffer.ring_fill``): 0, or -inf for a max pool's padding

    def __post_init__(self) -> None:
        if not _IDENT.match(self.ptr):
            raise ValueError(f"bad C identifier {self.ptr!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.strides:
            object.__setattr__(self, "strides", contiguous_strides(self.shape))
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)

    @property
    def ctype(self) -> str:
        return ctype(self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def contiguous(self) -> bool:
        return not self.block and (self.strides == contiguous_strides(self.shape) or self.size <= 1)

    def index(self, idx: Sequence[str | int]) -> str:
        """The C expression of the element offset of ``idx`` (one index per dim; a channel-blocked ref also takes
        (n, channel block, channel in it, h, w), the channel split as its blocks are stored)."""
        if self.block and len(idx) in (4, 5):  # through its loop-IR layout, as every element expression reads it
            from dlcc.codegen.element_c import blocked_index, c_index, ref_buf
            from dlcc.codegen.lir_c import c_expr

            index = blocked_index(idx, self.block) if len(idx) == 5 else [c_index(i) for i in idx]
            return c_expr(ref_buf(self, self.ptr).layout.address(index), {})
        if len(idx) != self.rank:
            raise ValueError(f"{self.ptr}: {len(idx)} indices for rank {self.rank}")
        terms = [(str(i), s if d != 1 else 0) for i, s, d in zip(idx, self.strides, self.shape, strict=False)]
        return _lin(terms, self.offset)

    def at(self, idx: Sequence[str | int]) -> str:
        """The C lvalue of element ``idx``."""
        return f"{self.ptr}[{self.index(idx)}]"

    @property
    def channels_last(self) -> bool:
        """A rank-4 (N, C, H, W) window whose channels are contiguous and whose pixels follow in row-major order
        (NHWC memory: a layout the schedule stage chose, ``schedule.layouts``)."""
        if self.rank != 4:
            return False
        n, c, h, w = self.shape
        return self.strides[1:] == (1, w * c, c) or (c == 1 and self.strides[2:] == (w, 1))

    @property
    def pixel_major(self) -> bool:
        """Channels-last, or channels-last with a zero ring around the planes (rows and planes further apart)."""
        if self.channels_last:
            return True
        if self.rank != 4 or len(self.ring) != 4:
            return False
        n, c, h, w = self.shape
        return self.strides[1] == 1 and self.strides[3] == c and self.strides[2] >= w * c \
            and self.strides[0] >= h * self.strides[2]

    def base(self) -> str:
        """A C pointer expression to element 0 of the window."""
        return f"({self.ptr} + {self.offset})" if self.offset else self.ptr


@dataclass
class Operand:
    """What a template reads: ``at(idx)`` is a C expression of one element (a load or an inlined computation)."""

    shape: tuple[int, ...]
    dtype: str
    at: Callable[[Sequence[str]], str]
    ref: TensorRef | None = None  # set when the operand is a buffer the template may address directly
    const: np.ndarray | None = None  # set when the operand is a compile-time constant (a weight)

    @staticmethod
    def of(ref: TensorRef, const: np.ndarray | None = None) -> Operand:
        return Operand(ref.shape, ref.dtype, ref.at, ref, const)


Store = Callable[[Sequence[str], str], str]
"""``store(idx, value)``: C statements applying the fused epilogue to ``value`` (element ``idx`` of the
template's output) and writing the result."""


@dataclass
class Names:
    """Fresh C identifiers for one generated function."""

    counter: dict[str, int] = field(default_factory=dict)

    def __call__(self, prefix: str = "t") -> str:
        if not _IDENT.match(prefix):
            raise ValueError(f"bad identifier prefix {prefix!r}")
        n = self.counter.get(prefix, 0)
        self.counter[prefix] = n + 1
        return f"{prefix}{n}"


def loops(shape: Sequence[int], names: Names, body: str, prefix: str = "i") -> tuple[list[str], str]:
    """A row-major loop nest over ``shape`` around ``body`` (a callable of the index names, or text using
    them). Returns (index names, C code). Dims of size 1 get the literal index ``0`` and no loop."""
    idx = [names(prefix) if d != 1 else "0" for d in shape]
    text = body(idx) if callable(body) else body
    for i, d in reversed(list(zip(idx, shape, strict=False))):
        if d == 1:
            continue
        text = f"for (int64_t {i} = 0; {i} < {d}; ++{i}) {{\n{indent(text)}\n}}"
    return idx, text


def indent(text: str, n: int = 1) -> str:
    pad = "    " * n
    return "\n".join(pad + line if line else line for line in text.splitlines())


C_HELPERS: dict[str, str] = {}
"""Static inline C helpers by name; every generated file includes all of them (modules register theirs
at import with ``c_helper``)."""


def c_helper(name: str, code: str) -> None:
    if C_HELPERS.get(name, code) != code:
        raise ValueError(f"two different C helpers named {name}")
    C_HELPERS[name] = code


def vector_helpers(lanes: int) -> str:
    """The float vector type of a target (``dlcc_vf``: ``lanes`` floats, GCC/Clang vector extension) and
    its unaligned load/store through memcpy. Macros, not functions: returning a wide vector from a function
    changes the ABI where the ISA lacks the registers (-Wpsabi)."""
    n = 4 * lanes
    return (f"typedef float dlcc_vf __attribute__((vector_size({n})));\n"
            # GCC's predictive commoning keeps overlapping loads of a small channel block's register tile (the
            # first convolution's 3 channels) in rotating registers and spills the accumulators: off there
            "#if defined(__GNUC__) && !defined(__clang__)\n"
            "#define DLCC_NO_PCOM __attribute__((optimize(\"no-predictive-commoning\")))\n"
            "#else\n#define DLCC_NO_PCOM\n#endif\n"
            "#define dlcc_vf_load(p) __extension__ ({ dlcc_vf dlcc_vf_l_; "
            f"memcpy(&dlcc_vf_l_, (p), {n}); dlcc_vf_l_; }})\n"
            f"#define dlcc_vf_store(p, v) do {{ dlcc_vf dlcc_vf_s_ = (v); memcpy((p), &dlcc_vf_s_, {n}); }} while (0)")

