"""What the C backend can print, by op key: the registry lowering consults (below every stage).

What goes in: ``register(...)``, called once by the C generator when it is imported
(``dlcc.codegen.program``), with its live registries: the elementwise expression emitters, the
index-map emitters (``INDEXED``: BatchNormalization, Transpose, Gather, ...), the kernel templates, and
the template op keys whose inputs must be materialized buffers.
What comes out: ``backend_ops()``, the registered ``BackendOps`` (names only are read: lowering decides
what each node becomes, the generator prints it). Lowering sits below codegen in the pipeline, so it
reads these facts from here instead of importing codegen.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dlcc.errors import DlccError

__all__ = ["BackendOps", "backend_ops", "register"]


@dataclass(frozen=True)
class BackendOps:
    elementwise: Mapping[str, object]
    indexed: Mapping[str, object]
    templates: Mapping[str, object]
    needs_buffers: Collection[str]


_REGISTERED: list[BackendOps] = []


def register(elementwise: Mapping[str, object], indexed: Mapping[str, object], templates: Mapping[str, object],
             needs_buffers: Collection[str]) -> None:
    _REGISTERED[:] = [BackendOps(elementwise, indexed, templates, needs_buffers)]


def backend_ops() -> BackendOps:
    if not _REGISTERED:
        raise DlccError("internal: the C backend (dlcc.codegen.program) was not imported before lowering")
    return _REGISTERED[0]
