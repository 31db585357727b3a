"""Target descriptions: which operators a target runs, and which of two equivalent forms it prefers.

What goes in: a target name (``--target``) or a ``Target``.
What comes out: a ``Target(name, supports, prefers, doc, lacks)`` that the op-replacement pass
(``dlcc.passes.replace``) consults: a replacement applies only when the target lacks an op or prefers
the other form.

Capabilities are strings: a standard op type (``"Conv"``), a custom op as ``"domain::Op"``
(``"dlcc::ChannelShuffle"``), or a feature of an op as ``"Op:feature"`` (``"Conv:grouped"``: Conv with
``group > 1``, depthwise included). ``supports=None`` means every standard ONNX op and feature (custom
domains excluded); ``lacks`` takes capabilities away from either form.

Preference keys (absent = no preference):
    "batchnorm":        "mul_add"    BatchNormalization as a per-channel Mul + Add
    "shared_prelu":     "LeakyRelu"  PRelu with one slope as LeakyRelu(alpha)
    "linear":           "conv"       Gemm / MatMul with a constant weight as a 1x1 Conv
                        "gemm"       a 1x1 Conv on a 1x1 spatial map as Flatten + Gemm
    "channel_shuffle":  "op"         the Reshape/Transpose/Reshape idiom as dlcc::ChannelShuffle
    "attention":        "fused"      MatMul -> scale -> mask -> Softmax -> MatMul as one dlcc::Attention
    "siblings":         "merged"     MatMuls of one input by constant weights (Q, K, V projections) as one
                                     MatMul (+ one bias Add) and a Slice per former product

Invariants: a target never prefers a form it cannot run (checked at construction), so a rule and its
reverse cannot both apply for one target.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dlcc.errors import DlccError
from dlcc.ops.table import C_BACKEND_OPS

GROUPED_CONV = "Conv:grouped"
CHANNEL_SHUFFLE = "dlcc::ChannelShuffle"
ATTENTION = "dlcc::Attention"

_PREFERENCES: dict[str, tuple[str, ...]] = {
    "batchnorm": ("mul_add",),
    "shared_prelu": ("LeakyRelu",),
    "linear": ("conv", "gemm"),
    "channel_shuffle": ("op",),
    "attention": ("fused",),
    "siblings": ("merged",),
}


@dataclass(frozen=True)
class Target:
    """What a target runs (``supports``; None = all standard ONNX) and which forms it ``prefers``."""

    name: str
    supports: frozenset[str] | None
    prefers: Mapping[str, str] = field(default_factory=dict)
    doc: str = ""
    lacks: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefers", MappingProxyType(dict(self.prefers)))
        if self.supports is not None:
            object.__setattr__(self, "supports", frozenset(self.supports))
        object.__setattr__(self, "lacks", frozenset(self.lacks))
        for key, value in self.prefers.items():
            if value not in _PREFERENCES.get(key, ()):
                raise ValueError(f"target {self.name}: unknown preference {key}={value!r}")
        needs = {"mul_add": ("Mul", "Add"), "LeakyRelu": ("LeakyRelu",), "conv": ("Conv", "Reshape"),
                 "gemm": ("Gemm", "Flatten", "Reshape"), "op": (CHANNEL_SHUFFLE,),
                 "fused": (ATTENTION,), "merged": ("MatMul", "Slice")}
        for value in self.prefers.values():
            missing = [op for op in needs[value] if not self.has(op)]
            if missing:
                raise ValueError(f"target {self.name} prefers {value!r} but lacks {', '.join(missing)}")

    def has(self, capability: str) -> bool:
        """Does the target run ``capability`` (an op type, ``domain::Op`` or ``Op:feature``)?"""
        if capability in self.lacks:
            return False
        if self.supports is None:
            return "::" not in capability
        return capability in self.supports

    def prefer(self, key: str) -> str | None:
        return self.prefers.get(key)


# The ops dlcc's C backend implements (the op table's list), with Conv's grouped form.
DLCC_C_OPS = C_BACKEND_OPS | {GROUPED_CONV}

TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("onnx", None, {},
           "portable ONNX: every standard op, no preference (the default for `dlcc optimize`)"),
    Target("dlcc-c", DLCC_C_OPS,
           {"batchnorm": "mul_add", "shared_prelu": "LeakyRelu", "linear": "gemm", "channel_shuffle": "op",
            "attention": "fused", "siblings": "merged"},
           "dlcc's C backend: common CNN/transformer ops; BatchNormalization as Mul+Add, shared-slope PRelu "
           "as LeakyRelu, classifier 1x1 Convs as Gemm, channel shuffles as one dlcc::ChannelShuffle, "
           "attention as one dlcc::Attention, sibling MatMuls of one input as one"),
    Target("conv-centric", None, {"linear": "conv"},
           "an example accelerator that runs everything as convolutions: Gemm/MatMul become 1x1 Convs"),
    Target("no-groups", None, {}, "an example target without grouped Conv: split into per-group Convs",
           lacks=frozenset({GROUPED_CONV})),
)}


def get_target(name: str | Target) -> Target:
    """The target called ``name`` (a ``Target`` passes through); a DlccError lists the known names."""
    if isinstance(name, Target):
        return name
    target = TARGETS.get(name)
    if target is None:
        raise DlccError(f"unknown target '{name}'", hint=f"known targets: {', '.join(TARGETS)}")
    return target
