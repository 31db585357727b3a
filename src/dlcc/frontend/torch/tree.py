"""Nested values <-> flat lists of tensors, so a compiled graph (flat inputs, flat outputs) can take and
return what the PyTorch module takes and returns.

What goes in: a value built of tuples, lists, named tuples, dicts (and dict subclasses), dataclasses
(Hugging Face ``ModelOutput`` is both a dataclass and an OrderedDict), tensors/arrays (the leaves, told
apart by a predicate) and other plain values (ints, floats, strings, None: constants).
What comes out: ``flatten`` -> (leaves in depth-first order, ``Spec``); ``unflatten(spec, leaves)``
rebuilds a value of the same structure and types around new leaves.

Invariants: this module imports no torch. Dicts keep their insertion order (as torch.export's pytree
does); a dataclass is flattened by its fields in declaration order, None fields included (they come
back as None). Two specs are equal when the structure and the constants are: the constants of an input
are baked into an exported graph, so a call with other constants needs another graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from dlcc.errors import InputError

__all__ = ["Spec", "flatten", "unflatten"]


@dataclasses.dataclass(frozen=True)
class Spec:
    """The structure of a value: ``kind`` is leaf | const | tuple | list | namedtuple | dict | dataclass."""

    kind: str
    type: type | None = None
    keys: tuple = ()
    children: tuple[Spec, ...] = ()
    value: Any = None  # a constant's value (hashable)

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def describe(self) -> str:
        if self.kind == "leaf":
            return "tensor"
        if self.kind == "const":
            return repr(self.value)
        inner = ", ".join(c.describe() if not self.keys else f"{k}: {c.describe()}"
                          for k, c in zip(self.keys or [None] * len(self.children), self.children, strict=True))
        return f"{self.type.__name__ if self.type else self.kind}({inner})"


LEAF = Spec("leaf")


def flatten(value: Any, is_leaf: Callable[[Any], bool]) -> tuple[list[Any], Spec]:
    leaves: list[Any] = []
    spec = _flatten(value, is_leaf, leaves)
    return leaves, spec


def _flatten(value: Any, is_leaf: Callable[[Any], bool], leaves: list[Any]) -> Spec:
    if is_leaf(value):
        leaves.append(value)
        return LEAF
    t = type(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = tuple(f.name for f in dataclasses.fields(value))
        return Spec("dataclass", t, names, tuple(_flatten(getattr(value, n), is_leaf, leaves) for n in names))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return Spec("namedtuple", t, (), tuple(_flatten(v, is_leaf, leaves) for v in value))
    if isinstance(value, tuple | list):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return Spec(kind, t, (), tuple(_flatten(v, is_leaf, leaves) for v in value))
    if isinstance(value, dict):
        keys = tuple(value)
        return Spec("dict", t, keys, tuple(_flatten(value[k], is_leaf, leaves) for k in keys))
    try:
        hash(value)
    except TypeError:
        raise InputError(f"cannot pass a {t.__name__} into or out of a compiled module",
                         hint="use tensors, arrays, tuples, lists, dicts, dataclasses or plain numbers") from None
    return Spec("const", t, (), (), value)


def unflatten(spec: Spec, leaves: list[Any]) -> Any:
    it = iter(leaves)
    value = _unflatten(spec, it)
    if next(it, _END) is not _END:
        raise ValueError("more leaves than the structure holds")
    return value


_END = object()


def _unflatten(spec: Spec, it: Iterator[Any]) -> Any:
    kind = spec.kind
    if kind == "leaf":
        v = next(it, _END)
        if v is _END:
            raise ValueError("fewer leaves than the structure holds")
        return v
    if kind == "const":
        return spec.value
    children = [_unflatten(c, it) for c in spec.children]
    t = spec.type
    if kind == "tuple":
        return tuple(children) if t is tuple else _build(t, children, tuple)
    if kind == "list":
        return children if t is list else _build(t, children, list)
    if kind == "namedtuple":
        return t(*children)
    if kind == "dict":
        pairs = dict(zip(spec.keys, children, strict=True))
        return pairs if t is dict else _build(t, pairs, dict)
    if kind == "dataclass":
        fields = {f.name: f for f in dataclasses.fields(t)}
        init = {k: v for k, v in zip(spec.keys, children, strict=True) if fields[k].init}
        obj = t(**init)
        for k, v in zip(spec.keys, children, strict=True):
            if not fields[k].init:
                object.__setattr__(obj, k, v)
        return obj
    raise ValueError(f"unknown spec kind {kind!r}")


def _build(t: type, items: Any, plain: type) -> Any:
    """An instance of a tuple/list/dict subclass ``t`` holding ``items``, or the plain type if ``t``'s
    constructor wants something else."""
    try:
        return t(items)
    except Exception:
        return plain(items)
