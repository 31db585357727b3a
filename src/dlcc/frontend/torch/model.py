"""``dlcc.compile(module, example_inputs)``: a PyTorch module compiled by dlcc, called like the module.

What goes in: a ``torch.nn.Module`` or a ``torch.export.ExportedProgram``; example inputs (a tuple of
positional arguments, a dict of keyword arguments, or one value; tensors or numpy arrays, nested in
tuples, lists and dicts as the module wants them); ``input_names`` for the flat list of tensor inputs;
``dynamic``; the options of ``dlcc.compiler.compile_model`` (fusion, portable, level, on_stage).
What comes out: a ``TorchCompiledModel``. ``model(*args, **kwargs)`` takes what the module takes and
returns what it returns, in the module's structure (tuples, dicts, dataclasses such as Hugging Face
outputs): torch tensors in, torch tensors out (CPU tensors are read and outputs wrapped without a copy);
numpy arrays in, numpy arrays out.

How: the module is wrapped so that it takes and returns flat tuples of tensors (``tree``), exported to
ONNX at the example inputs' shapes (``export.export_model``: dynamo, TorchScript fallback) and compiled
by ``compile_model``; the wrapper remembers the structures to rebuild.

Shapes: dlcc's code is specialized to static shapes. With ``dynamic`` True or None (the default) a call
whose tensor shapes, dtypes or non-tensor arguments differ from every compiled variant exports and
compiles again (cached per signature); with ``dynamic=False`` such a call is an ``InputError``.

Invariants: the module is put in eval mode for the export and its modes restored afterwards; autograd
does not flow through the compiled model (outputs never require grad); this module imports torch only
inside the functions that need it.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlcc.errors import DlccError, InputError, UnsupportedDtypeError, UnsupportedModelError
from dlcc.frontend.torch.export import DEFAULT_OPSET, export_model, require_torch
from dlcc.frontend.torch.tree import Spec, flatten, unflatten

__all__ = ["TorchCompiledModel", "compile_torch", "is_torch_model"]


def is_torch_model(model: Any) -> bool:
    """Whether ``model`` is a torch ``nn.Module`` or ``ExportedProgram``, without importing torch."""
    import sys

    if "torch" not in sys.modules:  # nothing made from torch can exist before torch is imported
        return False
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(model).__mro__}
    return bool(names & {"torch.nn.modules.module.Module", "torch.export.exported_program.ExportedProgram"})


def _backend_dtypes() -> frozenset[str]:
    from dlcc.codegen.cbase import CTYPES

    return frozenset(CTYPES)


def _dtype_name(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return x.dtype.name
    return str(x.dtype).removeprefix("torch.")


@dataclass
class _Variant:
    compiled: Any  # CompiledModel
    names: list[str]  # flat input names, one per tensor leaf
    fed: list[bool]  # whether the compiled graph kept that input (exporters drop unused ones)
    out_spec: Spec
    exporter: str


class TorchCompiledModel:
    """A PyTorch module compiled by dlcc; call it like the module (see the module docstring)."""

    def __init__(self, module: Any, example_inputs: Any = None, *, input_names: Sequence[str] | None = None,
                 dynamic: bool | None = None, opset: int = DEFAULT_OPSET, **compile_options: Any) -> None:
        torch = require_torch()
        if "input_shapes" in compile_options:
            raise DlccError("input_shapes does not apply to a PyTorch module",
                            hint="the shapes are those of example_inputs")
        if isinstance(module, torch.export.ExportedProgram):
            if example_inputs is None and module.example_inputs is not None:
                example_inputs = _as_call(*module.example_inputs)
            module = module.module()
        elif not isinstance(module, torch.nn.Module):
            raise DlccError(f"cannot compile a {type(module).__name__} as a PyTorch model",
                            hint="pass a torch.nn.Module or a torch.export.ExportedProgram")
        if example_inputs is None:
            raise DlccError(f"compiling {type(module).__name__} needs example inputs",
                            hint="dlcc.compile(module, (x,)): a tuple of the forward's arguments, at the shapes "
                                 "to compile for")
        self.module = module
        self._torch = torch
        self._dynamic = dynamic
        self._opset = opset
        self._options = compile_options
        self._user_names = list(input_names) if input_names is not None else None
        self._variants: dict[tuple, _Variant] = {}
        self._lock = threading.Lock()
        self._check_module_dtypes()
        args, kwargs = _normalize(example_inputs)
        leaves, spec = flatten((args, kwargs), self._is_leaf)
        self._first = self._compile(leaves, spec)

    # ------------------------------------------------------------------ public figures

    @property
    def compiled(self):
        """The ``CompiledModel`` (numpy interface) for the example inputs' shapes."""
        return self._first.compiled

    @property
    def info(self) -> dict:
        return {**self._first.compiled.info, "exporter": self._first.exporter, "variants": len(self._variants)}

    @property
    def exporter(self) -> str:
        """Which torch.onnx exporter made the graph: "dynamo" or "torchscript" (the fallback)."""
        return self._first.exporter

    @property
    def input_names(self) -> list[str]:
        return list(self._first.names)

    @property
    def output_names(self) -> list[str]:
        return self._first.compiled.output_names

    # ------------------------------------------------------------------ calls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = flatten((args, kwargs), self._is_leaf)
        key = _key(spec, leaves)
        variant = self._variants.get(key)
        if variant is None:
            if self._dynamic is False:
                raise InputError(f"the model was compiled for {_describe(self._first_key)}; this call gives "
                                 f"{_describe(key)}", hint="call it with the example inputs' shapes, or compile "
                                                           "with dynamic=None to compile again for new shapes")
            variant = self._compile(leaves, spec)
        return self._run(variant, leaves)

    def _run(self, v: _Variant, leaves: list[Any]) -> Any:
        torch = self._torch
        device = None
        arrays = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                if x.device.type != "cpu":
                    device = device or x.device
                    x = x.cpu()
                x = x.detach().numpy()  # a view of the tensor's memory
            arrays.append(x)
        feeds = {n: a for n, a, fed in zip(v.names, arrays, v.fed, strict=True) if fed}
        outs = v.compiled(feeds)
        values = [outs[n] for n in v.compiled.output_names]
        if any(isinstance(x, torch.Tensor) for x in leaves):
            values = [torch.from_numpy(o) for o in values]  # shares the freshly allocated arrays
            if device is not None:
                values = [o.to(device) for o in values]
        return unflatten(v.out_spec, values)

    # ------------------------------------------------------------------ compiling

    @staticmethod
    def _is_leaf(x: Any) -> bool:
        import torch

        return isinstance(x, np.ndarray | torch.Tensor)

    def _check_module_dtypes(self) -> None:
        ok = _backend_dtypes()
        for kind, items in (("parameter", self.module.named_parameters()), ("buffer", self.module.named_buffers())):
            for name, t in items:
                if _dtype_name(t) not in ok:
                    raise UnsupportedDtypeError(
                        f"{kind} '{name}' of {type(self.module).__name__} is {t.dtype}: dlcc's C backend "
                        f"compiles {', '.join(sorted(ok))}", hint="convert the module first, e.g. module.float()")

    def _compile(self, leaves: list[Any], spec: Spec) -> _Variant:
        torch = self._torch
        key = _key(spec, leaves)
        with self._lock:
            if key in self._variants:
                return self._variants[key]
            ok = _backend_dtypes()
            for i, x in enumerate(leaves):
                if _dtype_name(x) not in ok:
                    raise UnsupportedDtypeError(
                        f"input {i} is {x.dtype}: dlcc's C backend compiles {', '.join(sorted(ok))}",
                        hint="convert it first, e.g. x.float()")
            names = self._names(spec)
            tensors = [torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray)
                       else x.detach().cpu() for x in leaves]
            out_specs: list[Spec] = []
            flat = _Flat(torch, self.module, spec, out_specs)
            with _eval_mode(self.module), torch.no_grad():
                model, exporter = export_model(flat, tensors, input_names=names, opset=self._opset,
                                               what=type(self.module).__name__)
            if not out_specs:
                raise DlccError("the exporter did not run the module's forward", hint="a dlcc bug; please report it")
            out_spec = out_specs[-1]
            from dlcc.compiler import compile_model

            try:
                compiled = compile_model(model, **self._options)
            except UnsupportedModelError as e:
                if not getattr(e, "ops", None):
                    raise
                err = UnsupportedModelError(e.message, hint="torch.compile(module, backend='dlcc') runs those ops in "
                                                             "PyTorch and compiles the rest of the module")
                err.ops = e.ops
                raise err from None
            if len(compiled.outputs) != out_spec.num_leaves:
                raise DlccError(f"the exported graph has {len(compiled.outputs)} outputs where the module returns "
                                f"{out_spec.num_leaves} tensors ({out_spec.describe()})",
                                hint="return each tensor once, or compile the exported ONNX model instead")
            kept = set(compiled.input_names)
            variant = _Variant(compiled, names, [n in kept for n in names], out_spec, exporter)
            if not self._variants:
                self._first_key = key
            self._variants[key] = variant
            return variant

    def _names(self, spec: Spec) -> list[str]:
        n = spec.num_leaves
        if self._user_names is not None:
            if len(self._user_names) != n:
                raise DlccError(f"input_names gives {len(self._user_names)} names for {n} tensor input(s)")
            return list(self._user_names)
        try:
            params = list(inspect.signature(self.module.forward).parameters)
        except (TypeError, ValueError):
            params = []
        args_spec, kwargs_spec = spec.children
        names: list[str] = []
        for i, child in enumerate(args_spec.children):
            base = params[i] if i < len(params) and not params[i].startswith("*") else f"input{i}"
            _leaf_names(child, base, names)
        for k, child in zip(kwargs_spec.keys, kwargs_spec.children, strict=True):
            _leaf_names(child, str(k), names)
        seen: dict[str, int] = {}
        unique = []
        for name in names:
            name = re.sub(r"\W", "_", name) or "input"
            if name in seen:
                seen[name] += 1
                name = f"{name}_{seen[name]}"
            seen.setdefault(name, 0)
            unique.append(name)
        return unique


def compile_torch(model: Any, example_inputs: Any = None, *, input_names: Sequence[str] | None = None,
                  dynamic: bool | None = None, **compile_options: Any) -> TorchCompiledModel:
    """Compile a PyTorch module or ExportedProgram (see the module docstring)."""
    return TorchCompiledModel(model, example_inputs, input_names=input_names, dynamic=dynamic, **compile_options)


# ---------------------------------------------------------------------------------------------- helpers


def _as_call(args: Any, kwargs: Any) -> tuple | dict:
    if kwargs:
        if args:
            raise DlccError("the ExportedProgram's example inputs mix positional and keyword arguments",
                            hint="pass example_inputs to dlcc.compile")
        return dict(kwargs)
    return tuple(args)


def _normalize(example_inputs: Any) -> tuple[tuple, dict]:
    """example_inputs -> (args, kwargs): a tuple or list is the positional arguments, a dict the keyword
    arguments, anything else the one positional argument."""
    if isinstance(example_inputs, tuple | list):
        return tuple(example_inputs), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    return (example_inputs,), {}


def _key(spec: Spec, leaves: list[Any]) -> tuple:
    return spec, tuple((tuple(x.shape), _dtype_name(x)) for x in leaves)


def _describe(key: tuple) -> str:
    spec, sig = key
    tensors = ", ".join(f"{dtype}{list(shape)}" for shape, dtype in sig)
    consts = []

    def walk(s: Spec) -> None:
        if s.kind == "const":
            consts.append(repr(s.value))
        for c in s.children:
            walk(c)

    walk(spec)
    text = f"tensors ({tensors})"
    if consts:
        text += f" and constants ({', '.join(consts)})"
    return text


def _leaf_names(spec: Spec, base: str, out: list[str]) -> None:
    if spec.kind == "leaf":
        out.append(base)
        return
    keys = spec.keys or range(len(spec.children))
    for k, child in zip(keys, spec.children, strict=True):
        _leaf_names(child, f"{base}_{k}", out)


class _eval_mode:
    """Eval mode for the export; every submodule's mode restored afterwards."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.module.modules()]
        for m, _ in self.modes:
            m.training = False  # (not .eval(): modules from ExportedProgram.module() refuse it)

    def __exit__(self, *exc: object) -> None:
        for m, mode in self.modes:
            m.training = mode


def _Flat(torch: Any, module: Any, in_spec: Spec, out_specs: list[Spec]) -> Any:
    """``module`` behind flat tuples: forward(*tensors) rebuilds the arguments from ``in_spec``, calls the
    module and returns its tensors as a tuple, recording the output's structure in ``out_specs``."""

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *tensors: Any) -> tuple:
            args, kwargs = unflatten(in_spec, list(tensors))
            out = self.inner(*args, **kwargs)
            leaves, spec = flatten(out, lambda x: isinstance(x, torch.Tensor))
            out_specs.append(spec)
            return tuple(leaves)

    return Flat()
