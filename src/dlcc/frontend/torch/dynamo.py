"""``torch.compile(model, backend="dlcc")``: each FX graph TorchDynamo captures is compiled by dlcc.

What goes in: an ``fx.GraphModule`` and its example inputs, as TorchDynamo hands them to a backend
(registered by name through the ``torch_dynamo_backends`` entry point in pyproject.toml).
What comes out: a callable that takes the graph's inputs and returns its outputs.

How: TorchDynamo passes the module's parameters and buffers as graph inputs. The backend freezes them
into the graph (they become ONNX initializers, so BatchNormalization folds into convolutions and weights
are repacked once) and compiles the rest through ``TorchCompiledModel`` at the first call, then again for
each new input shape (cached per shape). A frozen tensor that changed in place since (an optimizer step,
``load_state_dict``) is noticed by its version counter and the graph is compiled again.

Fallbacks, each announced once per graph by a ``DlccFallbackWarning`` (and the graph runs eagerly, as
PyTorch would without torch.compile): a graph dlcc cannot export or compile (the warning names the
unsupported ops, as ONNX ops and the torch calls that made them), and calls that record autograd (inputs
or parameters that require grad outside ``torch.no_grad()``; the compiled code has no backward pass).
"""

from __future__ import annotations

import warnings
from typing import Any

from dlcc.errors import DlccError
from dlcc.frontend.torch.export import TorchExportFallbackWarning, require_torch

__all__ = ["DlccFallbackWarning", "DlccGraph", "dlcc_backend"]


class DlccFallbackWarning(UserWarning):
    """A graph captured by torch.compile runs in eager PyTorch instead of dlcc's code."""


def dlcc_backend(gm: Any, example_inputs: list[Any], **options: Any) -> DlccGraph:
    """The TorchDynamo backend: ``options`` go to ``dlcc.compiler.compile_model`` (fusion, portable, level)."""
    require_torch()
    return DlccGraph(gm, example_inputs, options)


class DlccGraph:
    """One captured graph: compiled lazily per input signature, eager where dlcc cannot compile it."""

    def __init__(self, gm: Any, example_inputs: list[Any], options: dict[str, Any], *,
                 can_split: bool = True) -> None:
        import torch

        self.gm = gm
        self.options = options
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.frozen = [i for i, (node, x) in enumerate(zip(placeholders, example_inputs, strict=False))
                       if isinstance(x, torch.Tensor) and _is_module_state(node, x)]
        self.model = None  # TorchCompiledModel
        self.versions: tuple | None = None
        self.fallback: str | None = None  # why this graph runs eagerly
        self.can_split = can_split  # may run the ops dlcc lacks eagerly and compile the rest
        self.split_gm = None  # the graph cut around those ops, once split
        self._warned: set[str] = set()

    def __call__(self, *args: Any) -> Any:
        import torch

        if self.fallback is not None:
            return self.gm(*args)
        if self.split_gm is not None:
            return self.split_gm(*[a for i, a in enumerate(args) if i not in set(self.frozen)])
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            self._warn("autograd is recording (inputs or parameters require grad): dlcc compiles inference "
                       "only, so this call runs in eager PyTorch; call the model under torch.no_grad() or "
                       "torch.inference_mode()")
            return self.gm(*args)
        frozen = set(self.frozen)
        state = [args[i] for i in self.frozen]
        versions = tuple((t._version, t.data_ptr()) for t in state)
        dynamic = [a for i, a in enumerate(args) if i not in frozen]
        try:
            if self.model is None or versions != self.versions:
                from dlcc.frontend.torch.model import TorchCompiledModel

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", TorchExportFallbackWarning)  # either exporter will do
                    self.model = TorchCompiledModel(_Frozen(torch, self.gm, len(args), self.frozen, state),
                                                    tuple(dynamic), dynamic=True, **self.options)
                self.versions = versions
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TorchExportFallbackWarning)
                return self.model(*dynamic)
        except DlccError as e:
            nodes = self._offending_nodes(e) if self.can_split else []
            if nodes and len(nodes) < self._num_ops():
                self._split(nodes, state, e)
                return self.split_gm(*dynamic)
            self.fallback = self._reason(e)
        except Exception as e:  # a dlcc bug must not break the user's model: run it eagerly, say so
            self.fallback = f"internal error {type(e).__name__}: {' '.join(str(e).split())[:300]} (a dlcc bug; " \
                            "please report it)"
        self._warn(self.fallback)
        return self.gm(*args)

    # ------------------------------------------------------------------ op-level fallback

    def _offending_nodes(self, error: DlccError) -> list[Any]:
        """The graph's calls behind an error: ONNX ops the C backend lacks (matched by name, CumSum ->
        cumsum) or the aten op an exporter could not translate."""
        import re

        wanted = {op.split("::")[-1].replace("_", "").lower() for op in getattr(error, "ops", None) or ()}
        for m in re.finditer(r"OpOverload\(op='aten\.(\w+)'|operator 'aten::(\w+)'", str(error)):
            wanted.add((m.group(1) or m.group(2)).replace("_", "").lower())
        return [n for n in self.gm.graph.nodes if n.op in ("call_function", "call_method")
                and _target_name(n).replace("_", "").lower() in wanted]

    def _num_ops(self) -> int:
        return sum(1 for n in self.gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))

    def _split(self, nodes: list[Any], state: list[Any], error: DlccError) -> None:
        """Run ``nodes`` eagerly and compile the runs of the graph between them, each as its own graph."""
        import copy

        import torch
        from torch.fx.passes.split_module import split_module

        graph = copy.deepcopy(self.gm.graph)
        gm = torch.fx.GraphModule(self.gm, graph)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for j, i in enumerate(self.frozen):  # parameters and buffers become attributes of the graph
            name = f"_dlcc_state{j}"
            gm.register_buffer(name, state[j].detach(), persistent=False)
            with graph.inserting_after(placeholders[-1]):
                attr = graph.get_attr(name)
            placeholders[i].replace_all_uses_with(attr)
            graph.erase_node(placeholders[i])
        eager_names = {n.name for n in nodes}
        part, last, eager_parts = 0, None, set()
        assignment: dict[str, int] = {}
        for n in graph.nodes:
            if n.op in ("placeholder", "output", "get_attr"):
                continue
            eager = n.name in eager_names
            if last is not None and eager != last:
                part += 1
            last = eager
            assignment[n.name] = part
            if eager:
                eager_parts.add(part)
        gm.recompile()
        split = split_module(gm, gm, lambda n: assignment[n.name], keep_original_order=True)
        for name, child in list(split.named_children()):
            if name.startswith("submod_") and int(name.split("_")[1]) not in eager_parts:
                setattr(split, name, _Compiled(torch, DlccGraph(child, [], self.options, can_split=False)))
        self.split_gm = split
        labels = sorted({_target_name(n) for n in nodes})
        why = self._reason(error) if getattr(error, "ops", None) else "torch.onnx has no ONNX translation for it"
        self._warn(f"{', '.join(labels)} ({len(nodes)} call(s)) runs eagerly: {why}; dlcc compiles the other "
                   f"{part + 1 - len(eager_parts)} part(s) of the graph" + _hint(labels), whole=False)

    def _reason(self, error: DlccError) -> str:
        ops = getattr(error, "ops", None)
        if ops:
            listing = ", ".join(f"{op}{self._torch_calls(op)}" for op in sorted(ops))
            return f"the C backend does not support {listing}"
        return str(error)

    def _torch_calls(self, onnx_op: str) -> str:
        """`` (torch.cumsum)``: the graph's calls whose names match an ONNX op's, to say where it came from."""
        key = onnx_op.split("::")[-1].lower()
        names = []
        for node in self.gm.graph.nodes:
            if node.op in ("call_function", "call_method"):
                target = _target_name(node)
                if target.replace("_", "").lower() == key.replace("_", "") and target not in names:
                    names.append(target)
        return f" ({', '.join(names)})" if names else ""

    def _warn(self, reason: str, *, whole: bool = True) -> None:
        if reason in self._warned:
            return
        self._warned.add(reason)
        what = "runs in eager PyTorch" if whole else "runs partly in eager PyTorch"
        warnings.warn(f"dlcc: a torch.compile graph of {self._num_ops()} ops {what}: {reason}",
                      DlccFallbackWarning, stacklevel=3)


def _is_module_state(node: Any, value: Any) -> bool:
    """Whether a graph input is a parameter or buffer (reached from a module or a global), not an
    argument of the compiled call: TorchDynamo's source of the input tells."""
    import torch

    if isinstance(value, torch.nn.Parameter):
        return True
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is None:
        return False
    while getattr(source, "base", None) is not None:
        source = source.base
    return not getattr(source, "is_input", False)


def _Frozen(torch: Any, gm: Any, n: int, frozen: list[int], state: list[Any]) -> Any:
    """``gm`` with the inputs at positions ``frozen`` held as buffers (``state``, shared, not copied):
    forward takes the remaining inputs in order."""

    class Frozen(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph_module = gm
            for j, t in enumerate(state):
                self.register_buffer(f"state{j}", t.detach(), persistent=False)

        def forward(self, *inputs: Any) -> Any:
            it = iter(inputs)
            where = {i: j for j, i in enumerate(frozen)}
            args = [getattr(self, f"state{where[i]}") if i in where else next(it) for i in range(n)]
            return self.graph_module(*args)

    return Frozen()


def _target_name(node: Any) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


def _hint(labels: list[str]) -> str:
    if any("transformer_encoder_layer" in x or "native_multi_head_attention" in x for x in labels):
        return ("; these are the inference fast paths of nn.TransformerEncoderLayer/MultiheadAttention: "
                "torch.backends.mha.set_fastpath_enabled(False) lets dlcc compile those layers whole")
    return ""


def _Compiled(torch: Any, graph: DlccGraph) -> Any:
    """A part of a split graph, compiled by dlcc (as an nn.Module, so the split graph can call it)."""

    class Compiled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.part = graph.gm

        def forward(self, *args: Any) -> Any:
            return graph(*args)

    return Compiled()
