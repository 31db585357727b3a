"""The pass manager: fixpoint, verification, timings, rules fired, printing and dumping."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import pytest

from dlcc.errors import DlccError, PassError
from dlcc.passes.eliminate import DeadCodeElimination
from dlcc.passes.manager import ManagerOptions, Pass, PassManager
from dlcc.passes.printer import format_model
from dlcc.passes.verify import verify_model

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
    a = Relu(x)
    unused = Neg(a)
    y = Sigmoid(a)
}
"""


def _model() -> ir.Model:
    return ir.from_onnx_text(TEXT)


class Counting(Pass):
    """changes the model (adds an unused Identity of the input) the first ``n`` times it runs"""

    name = "counting"

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def run(self, model: ir.Model) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        g = model.graph
        g.append(ir.Node("", "Identity", [g.inputs[0]], name=f"added{self.left}"))
        self.fired["add"] += 1
        return True


class Renaming(Pass):
    """renames the first node every time it runs (metadata: enables no rewrite)"""

    name = "renaming"

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def run(self, model: ir.Model) -> bool:
        self.n += 1
        model.graph.node(0).name = f"renamed{self.n}"
        return True


class Breaker(Pass):
    """breaks the IR: moves the last node to the front"""

    name = "breaker"

    def run(self, model: ir.Model) -> bool:
        g = model.graph
        last = g.node(len(g) - 1)
        g.remove(last)
        g.insert_before(g.node(0), last)
        return True


def test_runs_to_fixpoint_and_counts() -> None:
    model = _model()
    report = PassManager([Counting(2), DeadCodeElimination()], level=1).run(model)
    # rounds 1 and 2: counting adds a dead node, dead-code removes it (and, in round 1, the model's own);
    # round 3: counting runs (dead-code changed the graph after it) and finds nothing; dead-code is skipped:
    # nothing changed since its last run (passes are idempotent), and the fixpoint is reached
    assert report.rounds == 3
    assert report.records["counting"].runs == 3 and report.records["counting"].changed == 2
    assert report.records["counting"].fired["add"] == 2
    assert report.records["dead-code"].runs == 2
    assert report.records["dead-code"].fired["unused-node"] == 3
    assert report.nodes_before == 3 and report.nodes_after == 2
    assert all(r.seconds >= 0 for r in report.records.values())


class Naming(Pass):
    """"a" adds an unused node and "b" removes it: together they undo each other forever"""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.name = f"name-{label}"
        self.label = label

    def run(self, model: ir.Model) -> bool:
        g = model.graph
        extra = [n for n in g if n.name.startswith("extra-")]
        if self.label == "a":  # a adds an unused node, b removes it: the two never agree
            if extra:
                return False
            g.append(ir.Node("", "Identity", [g.inputs[0]], name="extra-a"))
            return True
        for n in extra:
            g.remove(n, safe=True)
        return bool(extra)


def test_non_converging_pipeline_fails_loudly() -> None:
    with pytest.raises(PassError, match="name-a, name-b kept changing"):
        PassManager([Naming("a"), Naming("b")], ManagerOptions(max_rounds=5)).run(_model())


def test_verifier_blames_the_pass() -> None:
    with pytest.raises(PassError, match="after pass 'breaker'.*used before it is produced"):
        PassManager([Breaker()], ManagerOptions(verify=True)).run(_model())


def test_verifier_accepts_valid_and_catches_dangling_output() -> None:
    model = _model()
    verify_model(model)
    model.graph.outputs.append(ir.Value(name="ghost", type=ir.TensorType(ir.DataType.FLOAT)))
    with pytest.raises(PassError, match="ghost"):
        verify_model(model)


def test_print_after_and_dump_dir(tmp_path: Path) -> None:
    lines: list[str] = []
    opts = ManagerOptions(print_after=["dead-code"], dump_dir=tmp_path / "dump", emit=lines.append)
    PassManager([Counting(1), DeadCodeElimination()], opts).run(_model())
    assert lines and all("IR after dead-code" in text for text in lines)
    assert "Neg" not in lines[-1] and "Sigmoid" in lines[-1]
    dumped = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert dumped[0] == "000-input.txt" and any("dead-code" in n for n in dumped)
    assert "Neg" in (tmp_path / "dump" / "000-input.txt").read_text()


def test_print_after_unknown_pass() -> None:
    with pytest.raises(DlccError, match="unknown pass"):
        PassManager([DeadCodeElimination()], ManagerOptions(print_after=["nope"]))


def test_printer_is_deterministic_and_hides_weights() -> None:
    import numpy as np

    model = _model()
    big = ir.tensor(np.arange(1000, dtype=np.float32).reshape(10, 100), name="big")
    v = ir.Value(name="big", const_value=big, shape=ir.Shape([10, 100]), type=ir.TensorType(ir.DataType.FLOAT))
    model.graph.register_initializer(v)
    text = format_model(model)
    assert text == format_model(model)
    assert "const %big<FLOAT,[10,100]>" in text and "999" not in text


def test_dead_code_is_idempotent_and_keeps_inputs() -> None:
    model = _model()
    p = DeadCodeElimination()
    assert p(model) is True
    assert p(model) is False
    assert [v.name for v in model.graph.inputs] == ["x"]


def test_metadata_changes_do_not_rerun_passes() -> None:
    """Node names and other metadata enable no rewrite: a pass that only renames does not make the others
    run again (the fingerprint is the wiring: nodes, the values they read, initializers, outputs)."""
    model = _model()
    report = PassManager([DeadCodeElimination(), Renaming()], level=1).run(model)
    assert report.records["dead-code"].runs == 1
    assert report.rounds == 2  # round 2: the wiring is as both passes last saw it: both skipped, stop
