"""The pass manager: runs a pipeline of graph passes to a fixpoint, verifying and measuring each.

What goes in: an onnx_ir model and a list of passes (from ``dlcc.passes.pipeline``), options for
verification, printing and dumping.
What comes out: the model, changed in place, and a ``PipelineReport``: per pass, how often it ran and
changed the model, its total time, the rules it fired and the node count before/after.

The algorithm, in a few lines:

    round = 1
    repeat:
        for pass in pipeline:                # the literal list, in order
            changed = pass.run(model)        # a pass mutates in place and says whether it changed
            verify(model) if verifying       # a broken IR is blamed on the pass that broke it
            print / dump the IR if asked
        round += 1
    until no pass changed the model, or round > max_rounds -> PassError naming the passes still changing

Invariants: passes run in list order; a pass that reports ``changed=False`` must not have changed the
model (the verifier cannot see that, but the fixpoint check and the idempotence tests do).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from dlcc.errors import OutputError, PassError
from dlcc.passes.printer import format_model
from dlcc.passes.verify import verify_model


class Pass:
    """A graph pass: ``run(model) -> changed``; ``fired`` counts the rules it applied in its last run.

    Subclasses set ``name`` (used by ``--print-after``) and a one-line ``doc``. What every pass must keep
    true (a valid, shape-annotated graph) is checked by ``dlcc.passes.verify`` after each pass in tests.
    """

    name: str = "pass"
    doc: str = ""

    def __init__(self) -> None:
        self.fired: Counter[str] = Counter()

    def run(self, model: ir.Model) -> bool:
        raise NotImplementedError

    def __call__(self, model: ir.Model) -> bool:
        self.fired = Counter()
        return bool(self.run(model))

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


@dataclass
class PassRecord:
    name: str
    runs: int = 0
    changed: int = 0
    seconds: float = 0.0
    fired: Counter = field(default_factory=Counter)
    nodes_before: int = 0
    nodes_after: int = 0


@dataclass
class PipelineReport:
    level: int
    rounds: int = 0
    records: dict[str, PassRecord] = field(default_factory=dict)
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0

    @property
    def rules_fired(self) -> Counter:
        total: Counter = Counter()
        for r in self.records.values():
            total.update(r.fired)
        return total


@dataclass
class ManagerOptions:
    verify: bool = False
    print_after: Sequence[str] = ()
    print_after_all: bool = False
    dump_dir: str | Path | None = None
    max_rounds: int = 8
    emit: Callable[[str], None] = print
    on_pass: Callable[[str], None] | None = None  # progress hook: called before each pass runs
    # after a round that changed the model, e.g. refresh shapes; returns whether it changed anything
    after_round: Callable[[ir.Model], bool] | None = None


class PassManager:
    def __init__(self, passes: Sequence[Pass], options: ManagerOptions | None = None, level: int = 0) -> None:
        self.passes = list(passes)
        self.options = options or ManagerOptions()
        self.level = level
        names = [p.name for p in self.passes]
        unknown = [n for n in self.options.print_after if n not in names]
        if unknown:
            from dlcc.errors import DlccError

            raise DlccError(f"--print-after names unknown pass(es) {unknown}",
                            hint=f"passes at this level: {', '.join(names) or '(none)'}")

    def run(self, model: ir.Model) -> PipelineReport:
        opts = self.options
        report = PipelineReport(level=self.level, nodes_before=_count(model))
        dump = _DumpDir(opts.dump_dir) if opts.dump_dir else None
        if dump:
            dump.write("input", model)
        if opts.verify:
            verify_model(model, where="the input model")
        start = time.perf_counter()
        # a pass whose last run saw the graph as it is now would find nothing (passes are idempotent):
        # skip it. The fingerprint covers structure, not node metadata (no pass reads node metadata).
        # The fingerprint is recomputed only after a pass that reports a change (a pass that reports none
        # has, by contract, changed nothing).
        seen_at: dict[int, tuple] = {}
        current = _fingerprint(model)
        while self.passes:
            report.rounds += 1
            changed_now = []
            for p in self.passes:
                rec = report.records.setdefault(p.name, PassRecord(p.name))
                if seen_at.get(id(p)) == current:
                    continue
                if opts.on_pass:
                    opts.on_pass(p.name)
                before = _count(model)
                t0 = time.perf_counter()
                changed = p(model)
                rec.seconds += time.perf_counter() - t0
                rec.runs += 1
                rec.fired.update(p.fired)
                if rec.runs == 1:
                    rec.nodes_before = before
                rec.nodes_after = _count(model)
                if changed:
                    rec.changed += 1
                    changed_now.append(p.name)
                    current = _fingerprint(model)
                if opts.verify:
                    verify_model(model, where=f"after pass '{p.name}'")
                if opts.print_after_all or p.name in opts.print_after:
                    opts.emit(f"// ----- IR after {p.name} (round {report.rounds}) -----\n"
                              + format_model(model))
                if dump:
                    dump.write(f"r{report.rounds}-{p.name}", model)
                seen_at[id(p)] = current
            if not changed_now:
                break
            if opts.after_round and opts.after_round(model):
                seen_at.clear()  # new shape facts: every pass may find something again
            if report.rounds >= opts.max_rounds:
                raise PassError(
                    f"the level-{self.level} pipeline did not reach a fixpoint in {opts.max_rounds} rounds: "
                    f"{', '.join(changed_now)} kept changing the model (a dlcc bug)",
                    hint="please report it with the model; --level 0 skips optimization meanwhile")
        report.seconds = time.perf_counter() - start
        report.nodes_after = _count(model)
        return report


def _fingerprint(model: ir.Model) -> tuple:
    """Identity of the graph's structure: the nodes and the values each reads, the initializers, the graph
    outputs and the opsets. Nodes and values compare by identity, and a node's inputs are an immutable
    tuple that every rewiring replaces, so the fingerprint holds them as they are (no copies)."""
    g = model.graph
    return (
        tuple((n, n.inputs) for n in g),
        tuple(g.initializers.values()),
        tuple(g.outputs),
        tuple(sorted(model.opset_imports.items())),
    )


def _count(model: ir.Model) -> int:
    return model.graph.num_nodes()


class _DumpDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create dump folder '{self.path}': {e.strerror}",
                              hint="choose another --dump-dir") from None
        self.n = 0

    def write(self, tag: str, model: ir.Model) -> None:
        name = f"{self.n:03d}-{tag}.txt"
        self.n += 1
        (self.path / name).write_text(format_model(model))
