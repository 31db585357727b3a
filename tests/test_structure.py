"""The stages of the compiler import only downwards.

What goes in: the source of every module under ``src/dlcc``, parsed with ``ast`` (nothing is imported or
executed). Every ``import``/``from ... import`` counts, at module level, inside functions and inside
``if TYPE_CHECKING:`` blocks alike.
What comes out: the import graph between stage packages, checked against the stage order of the pipeline:

    shared (errors, ops, util)  <  frontend < passes < fusion < lower < schedule < memory < codegen < build
                                <  top (compiler, api, cli, report, inspect, check, testing, demo, dlcc/__init__)

A module may import its own stage or any stage below it. An import from an earlier stage into a later one
(or from any stage into the top layer) is a violation: it is how import cycles between stages start.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "dlcc"

STAGES = ["frontend", "passes", "fusion", "lower", "schedule", "memory", "codegen", "build"]
SHARED = {"errors", "ops", "util"}  # below everything: op facts, the error family, neutral helpers
TOP = {"", "__main__", "compiler", "api", "cli", "report", "inspect", "check", "testing", "demo"}

LEVEL = {name: 0 for name in SHARED} | {name: i + 1 for i, name in enumerate(STAGES)}
LEVEL |= {name: len(STAGES) + 1 for name in TOP}

# Edges allowed although they point upwards, each with the reason it is still there. The test fails when
# an entry is no longer needed, so this list only shrinks.
KNOWN: dict[tuple[str, str], str] = {
    ("dlcc.frontend.torch.model", "compiler"): (
        "TorchCompiledModel compiles a torch module end to end (dlcc.compiler.compile_model per input "
        "shape): it is API level, not frontend; moving it (and dynamo.py) to a top-level package changes "
        "the torch_dynamo_backends entry point in pyproject.toml, which needs a reinstall"),
    ("dlcc.frontend.torch.model", "codegen"): (
        "the same module asks codegen.cbase.CTYPES which dtypes the C backend takes; goes with the move above"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage_of(module: str) -> str:
    """``dlcc.passes.fold`` -> ``passes``; ``dlcc`` -> ``""`` (the package itself, top layer)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The dlcc modules ``module`` imports (absolute names; ``from pkg import sub`` resolves to ``pkg.sub``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name == "dlcc" or a.name.startswith("dlcc."))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base != "dlcc" and not base.startswith("dlcc."):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


def stage_edges() -> dict[tuple[str, str], list[str]]:
    """(importing module, imported stage) -> the imported modules, for every dlcc import."""
    known = modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, path in known.items():
        for target in sorted(imports_of(name, path, known)):
            edges[(name, stage_of(target))].append(target)
    return edges


def test_every_module_has_a_layer():
    unknown = sorted({stage_of(m) for m in modules()} - set(LEVEL))
    assert not unknown, f"place these top-level modules/packages in a layer of {__name__}: {unknown}"


def test_stages_import_only_downwards():
    violations, used = [], set()
    for (module, target_stage), targets in sorted(stage_edges().items()):
        source_stage = stage_of(module)
        if LEVEL[target_stage] <= LEVEL[source_stage] or target_stage == source_stage:
            continue
        if (module, target_stage) in KNOWN:
            used.add((module, target_stage))
            continue
        violations.append(f"{module} ({source_stage or 'dlcc'}) imports {', '.join(targets)}")
    assert not violations, "imports from an earlier stage into a later one:\n  " + "\n  ".join(violations)
    stale = sorted(set(KNOWN) - used)
    assert not stale, f"these KNOWN exceptions are fixed now, remove them: {stale}"


def test_no_cycles_between_stages():
    graph: dict[str, set[str]] = defaultdict(set)
    for (module, target_stage) in stage_edges():
        source_stage = stage_of(module)
        if source_stage != target_stage and (module, target_stage) not in KNOWN:
            graph[source_stage].add(target_stage)
    state: dict[str, int] = {}

    def visit(stage: str, path: list[str]) -> None:
        state[stage] = 1
        for nxt in sorted(graph[stage]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle between stages: " + " -> ".join([*path, stage, nxt]))
            if nxt not in state:
                visit(nxt, [*path, stage])
        state[stage] = 2

    for stage in sorted(graph):
        if stage not in state:
            visit(stage, [])


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "dlcc" / "lower"
    pkg.mkdir(parents=True)
    src = pkg / "x.py"
    src.write_text("def f():\n    from dlcc.codegen import cbase\n    from ..memory.planner import plan\n")
    known = {"dlcc.codegen.cbase": src, "dlcc.memory.planner": src}
    assert imports_of("dlcc.lower.x", src, known) == {"dlcc.codegen.cbase", "dlcc.memory.planner"}
