"""Model fuzzing: a seeded mutator over valid models, and a runner that classifies what dlcc did.

What goes in: a seed and a count (``mutants``); the bytes of one model and a timeout (``run_case``).
What comes out: ``(kind, model bytes)`` pairs, each a valid kit or light model broken in one way
(truncated, bytes flipped or inserted, or a protobuf-level edit: nodes deleted/duplicated, dangling or
duplicate names, cycles, dropped inputs, absurd dims, wrong attribute types, unknown ops/domains, odd
opsets, deeply nested If subgraphs, raw_data that does not fit its dims, bad external-data entries); and
an ``Outcome`` saying whether ``dlcc optimize`` ended well (``ok``: a checker-clean output;
``user_error``: one ``dlcc: error:`` line, exit 2) or badly (``internal_error``, ``traceback``,
``crash``, ``hang``).

Each case also has a file layout (``layout``): the output beside the input, in another folder whose input
folder is removed before the output is checked, or over the input itself; and the input as one file or
with its initializers in an external data file (every size: empty, scalar, small, big). The output must
load on its own (its external data included) and pass onnx's checker.

Invariants: mutant ``i`` of seed ``s`` depends only on ``(s, i)`` (its own ``random.Random``), so any
failing case is reproduced from its seed and index alone; ``run_case`` runs dlcc in a subprocess, so a
crash in onnx's or onnxruntime's C++ code is a result, not the end of the fuzzer. ``run_case_forked`` is the
same isolation without the interpreter start: a fork of a process that has dlcc imported runs the CLI's
``main`` with its stdout/stderr file descriptors on files (C++ output included), and is killed at the timeout
(POSIX; about 20x faster, what ``make fuzz`` uses).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto, helper

__all__ = ["BAD_OUTCOMES", "KINDS", "LAYOUTS", "OUTCOMES", "Outcome", "base_models", "layout", "mutant", "mutants",
           "run_case", "run_case_forked", "run_case_inprocess"]

OUTCOMES = ("ok", "user_error", "internal_error", "traceback", "crash", "hang")
BAD_OUTCOMES = frozenset({"internal_error", "traceback", "crash", "hang"})

_LIGHT = ("squeezenet", "shufflenet")

# where the output goes (beside the input, another folder whose input folder is then removed, over the
# input) x how the input keeps its weights (one file, an external data file as torch's dynamo exporter
# writes it)
LAYOUTS = tuple(f"{where}/{data}" for where in ("same", "other", "in_place") for data in ("inline", "external"))


def layout(seed: int, index: int) -> str:
    """The file layout of case ``index`` of ``seed`` (independent of the mutation drawn for it)."""
    return random.Random(f"layout:{seed}:{index}").choice(LAYOUTS)


class _Files:
    """The files of one case in ``tmp``: ``src`` written as ``layout_`` says, ``dst`` where it says."""

    def __init__(self, tmp: str, data: bytes, layout_: str = "same/inline") -> None:
        where, kind = layout_.split("/")
        self.where = where
        self.input_dir = Path(tmp) / "in"
        self.input_dir.mkdir()
        self.src = self.input_dir / "model.onnx"
        out_dir = Path(tmp) / "out" if where == "other" else self.input_dir
        out_dir.mkdir(exist_ok=True)
        self.dst = self.src if where == "in_place" else out_dir / "model.opt.onnx"
        self.src.write_bytes(_externalized(data, self.input_dir) if kind == "external" else data)

    def done(self) -> None:
        """After the run: an output in another folder must not need the input's folder."""
        if self.where == "other":
            import shutil

            shutil.rmtree(self.input_dir, ignore_errors=True)


def _externalized(data: bytes, folder: Path) -> bytes:
    """``data`` with every initializer of the main graph in ``model.onnx.data`` (size threshold 0: empty,
    scalar, small and big tensors alike); as it is when it does not parse or has external data already.
    Returns the model bytes; the data file is written into ``folder``."""
    try:
        m = _parse(data)
    except Exception:  # noqa: BLE001 (a mutant that does not parse is written as it is)
        return data
    if not m.HasField("graph") or any(t.data_location == TensorProto.EXTERNAL for t in m.graph.initializer):
        return data
    from onnx.external_data_helper import convert_model_to_external_data, write_external_data_tensors

    try:
        convert_model_to_external_data(m, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
        write_external_data_tensors(m, str(folder))
    except Exception:  # noqa: BLE001 (what onnx cannot write out, e.g. a tensor name that is not text: as it is)
        (folder / "model.onnx.data").unlink(missing_ok=True)
        return data
    return m.SerializeToString()


# ---------------------------------------------------------------------------------------------- bases


@functools.cache
def base_models() -> tuple[tuple[str, bytes], ...]:
    """The valid models mutants start from: every kit builder, plus the small light models."""
    from dlcc.testing import KIT_MODELS, light_model_path

    out = [(name, build().SerializeToString()) for name, build in sorted(KIT_MODELS.items())]
    out += [(f"light_{name}", light_model_path(name).read_bytes()) for name in _LIGHT]
    return tuple(out)


def _parse(data: bytes) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.ParseFromString(data)
    return m


# ------------------------------------------------------------------------------------------- mutations
# Each takes (rng, the original bytes, a parsed copy it may edit) and returns the mutant's bytes.

Mutation = Callable[[random.Random, bytes, onnx.ModelProto], bytes]
_HUGE = (0, -1, -7, 2**31, 2**40, 2**62)


def _truncate(rng: random.Random, data: bytes, m: onnx.ModelProto) -> bytes:
    return data[: rng.randrange(0, len(data))]


def _flip(rng: random.Random, data: bytes, m: onnx.ModelProto) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4, 16))):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    return bytes(b)


def _insert(rng: random.Random, data: bytes, m: onnx.ModelProto) -> bytes:
    i = rng.randrange(len(data) + 1)
    junk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 5, 17))))
    return data[:i] + junk + data[i:]


def _delete_node(rng, data, m):
    del m.graph.node[rng.randrange(len(m.graph.node))]
    return m.SerializeToString()


def _duplicate_node(rng, data, m):
    n = m.graph.node[rng.randrange(len(m.graph.node))]
    m.graph.node.append(n)  # same outputs produced twice (SSA broken)
    return m.SerializeToString()


def _dangling_input(rng, data, m):
    n = _node_with_inputs(rng, m)
    n.input[rng.randrange(len(n.input))] = f"dangling_{rng.randrange(1000)}"
    return m.SerializeToString()


def _duplicate_value_name(rng, data, m):
    g = m.graph
    names = [o for n in g.node for o in n.output if o] + [i.name for i in g.input]
    n = g.node[rng.randrange(len(g.node))]
    other = [x for x in names if x not in n.output]
    n.output[0] = rng.choice(other)
    return m.SerializeToString()


def _cycle(rng, data, m):
    g = m.graph
    i = rng.randrange(len(g.node) - 1) if len(g.node) > 1 else 0
    later = g.node[rng.randrange(i, len(g.node))]
    n = g.node[i]
    if not n.input:
        n.input.append(later.output[0])
    else:
        n.input[rng.randrange(len(n.input))] = later.output[0]
    return m.SerializeToString()


def _drop_graph_input(rng, data, m):
    g = m.graph
    if g.input:
        del g.input[rng.randrange(len(g.input))]
    else:
        del g.output[0]
    return m.SerializeToString()


def _bad_dim(rng, data, m):
    g = m.graph
    value = rng.choice(_HUGE)
    where = rng.choice(("input", "initializer", "shape_constant", "value_info"))
    if where == "initializer" and g.initializer:
        t = g.initializer[rng.randrange(len(g.initializer))]
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] = value
        else:
            t.dims.append(value)
        return m.SerializeToString()
    if where == "shape_constant":
        # an int64 tensor that feeds a shape (ConstantOfShape, Reshape, Expand, Tile) gets an absurd entry
        consts = [t for t in g.initializer if t.data_type == TensorProto.INT64 and len(t.dims) == 1]
        consts += [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute
                   if a.type == AttributeProto.TENSOR and a.t.data_type == TensorProto.INT64 and len(a.t.dims) == 1]
        if consts:
            t = rng.choice(consts)
            arr = onnx.numpy_helper.to_array(t).copy()
            if arr.size:
                arr[rng.randrange(arr.size)] = value if value < 2**63 else -1
                t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
                return m.SerializeToString()
    vis = list(g.input) if where != "value_info" or not g.value_info else list(g.value_info)
    vis = [v for v in vis if v.type.tensor_type.shape.dim] or list(g.output)
    vi = rng.choice(vis)
    dims = vi.type.tensor_type.shape.dim
    if not dims:
        dims.add()
    d = dims[rng.randrange(len(dims))]
    d.dim_value = value
    return m.SerializeToString()


def _wrong_attr_type(rng, data, m):
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        n = m.graph.node[rng.randrange(len(m.graph.node))]
        n.attribute.append(helper.make_attribute("axis", 1.5))
        return m.SerializeToString()
    n = rng.choice(nodes)
    a = n.attribute[rng.randrange(len(n.attribute))]
    name = a.name
    choices = [helper.make_attribute(name, 3), helper.make_attribute(name, 0.25),
               helper.make_attribute(name, "bogus"), helper.make_attribute(name, [1.5, 2.5]),
               helper.make_attribute(name, [7, -3]), helper.make_attribute(name, ["a", "b"])]
    choices = [c for c in choices if c.type != a.type] or choices
    a.CopyFrom(rng.choice(choices))
    if rng.random() < 0.2:
        a.type = AttributeProto.UNDEFINED
    return m.SerializeToString()


def _unknown_op(rng, data, m):
    n = m.graph.node[rng.randrange(len(m.graph.node))]
    n.op_type = rng.choice(("FancyConv", "Relu2", "", "relu", "ConvTranspose3000"))
    n.domain = ""
    return m.SerializeToString()


def _unknown_domain(rng, data, m):
    n = m.graph.node[rng.randrange(len(m.graph.node))]
    n.domain = rng.choice(("com.example", "ai.onnx.contrib", "org.pytorch.aten"))
    if rng.random() < 0.5:
        m.opset_import.append(helper.make_opsetid(n.domain, 1))
    return m.SerializeToString()


def _opset_version(rng, data, m):
    version = rng.choice((0, 1, 999, -1))
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = version
    if rng.random() < 0.3:
        m.ir_version = rng.choice((0, 1, 99))
    return m.SerializeToString()


def _nested_if(rng, data, m):
    """Wrap one Relu-like identity in ``depth`` nested Ifs (an If whose branches are Ifs ...)."""
    g = m.graph
    depth = rng.choice((2, 8, 20, 30))  # protobuf itself refuses much deeper messages
    n = g.node[rng.randrange(len(g.node))]
    x, y = n.output[0], f"{n.output[0]}__nest"
    cond = "fuzz_cond"
    g.initializer.append(helper.make_tensor(cond, TensorProto.BOOL, [], [True]))

    def body(level: int) -> onnx.GraphProto:
        out = f"nest_out_{level}"
        if level == 0:
            inner = [helper.make_node("Identity", [x], [out])]
        else:
            inner = [helper.make_node("If", [cond], [out], then_branch=body(level - 1),
                                      else_branch=body(level - 1) if level < 6 else body_leaf(level))]
        return helper.make_graph(inner, f"b{level}", [], [helper.make_tensor_value_info(out, 0, None)])

    def body_leaf(level: int) -> onnx.GraphProto:
        out = f"nest_out_{level}"
        return helper.make_graph([helper.make_node("Identity", [x], [out])], f"l{level}", [],
                                 [helper.make_tensor_value_info(out, 0, None)])

    g.node.append(helper.make_node("If", [cond], [y], then_branch=body(depth - 1), else_branch=body_leaf(depth)))
    g.output.append(helper.make_tensor_value_info(y, 0, None))
    return m.SerializeToString()


def _raw_data_mismatch(rng, data, m):
    ts = [t for t in m.graph.initializer if t.dims] or list(m.graph.initializer)
    ts += [a.t for n in m.graph.node if n.op_type == "Constant" for a in n.attribute if a.type == AttributeProto.TENSOR]
    if not ts:
        m.graph.initializer.append(TensorProto(name="fuzz_w", dims=[4, 4], data_type=TensorProto.FLOAT,
                                               raw_data=b"\0" * 16))
        return m.SerializeToString()
    t = rng.choice(ts)
    arr = onnx.numpy_helper.to_array(t)
    raw = arr.tobytes()
    cut = rng.choice(("short", "long", "empty", "odd"))
    raw = {"short": raw[: len(raw) // 2], "long": raw + raw[:8] + b"\0" * 8, "empty": b"",
           "odd": raw[:-1] if raw else b"\1"}[cut]
    name, dims, dt = t.name, list(t.dims), t.data_type
    t.Clear()
    t.name, t.data_type = name, dt
    t.dims.extend(dims)
    t.raw_data = raw
    return m.SerializeToString()


def _bad_external_data(rng, data, m):
    t = m.graph.initializer[rng.randrange(len(m.graph.initializer))] if m.graph.initializer else None
    if t is None:
        t = helper.make_tensor("fuzz_ext", TensorProto.FLOAT, [2], [0.0, 0.0])
        m.graph.initializer.append(t)
        t = m.graph.initializer[-1]
    t.ClearField("raw_data")
    for f in ("float_data", "int64_data", "int32_data", "double_data", "uint64_data", "string_data"):
        t.ClearField(f)
    t.data_location = TensorProto.EXTERNAL
    entries = rng.choice([
        {"location": "weights.bin", "offset": "0", "length": "16"},
        {"location": "/etc/passwd"},
        {"location": "../../secret.bin"},
        {"location": ""},
        {"location": "w.bin", "offset": "-5"},
        {"location": "w.bin", "offset": "abc", "length": "2**40"},
        {"location": "w.bin", "length": str(2**62)},
        {"location": "C:\\\\w.bin"},
        {"offset": "0"},
        {"location": "w.bin", "checksum": "x", "offset": "99999999999999999999"},
    ])
    del t.external_data[:]
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    return m.SerializeToString()


def _node_with_inputs(rng, m):
    nodes = [n for n in m.graph.node if n.input]
    return rng.choice(nodes)


KINDS: dict[str, Mutation] = {
    "truncate": _truncate,
    "flip": _flip,
    "insert": _insert,
    "delete_node": _delete_node,
    "duplicate_node": _duplicate_node,
    "dangling_input": _dangling_input,
    "duplicate_value_name": _duplicate_value_name,
    "cycle": _cycle,
    "drop_graph_input": _drop_graph_input,
    "bad_dim": _bad_dim,
    "wrong_attr_type": _wrong_attr_type,
    "unknown_op": _unknown_op,
    "unknown_domain": _unknown_domain,
    "opset_version": _opset_version,
    "nested_if": _nested_if,
    "raw_data_mismatch": _raw_data_mismatch,
    "bad_external_data": _bad_external_data,
}


def mutant(seed: int, index: int, kind: str | None = None) -> tuple[str, str, bytes]:
    """Mutant ``index`` of ``seed``: (kind, base model name, bytes). ``kind`` forces the mutation."""
    rng = random.Random(f"dlcc-fuzz:{seed}:{index}")
    bases = base_models()
    # the light models are 10x bigger and slower to optimize: one mutant in six uses them
    light = [b for b in bases if b[0].startswith("light_")]
    kit = [b for b in bases if not b[0].startswith("light_")]
    name, data = rng.choice(light) if rng.random() < 1 / 6 else rng.choice(kit)
    k = kind or rng.choice(sorted(KINDS))
    return k, name, KINDS[k](rng, data, _parse(data))


def mutants(seed: int, n: int) -> Iterator[tuple[str, bytes]]:
    """``n`` mutants of seed ``seed`` as (kind, model bytes); mutant i is ``mutant(seed, i)``."""
    for i in range(n):
        kind, _, data = mutant(seed, i)
        yield kind, data


# ---------------------------------------------------------------------------------------------- runner


@dataclass
class Outcome:
    """What one run of ``dlcc optimize`` did with a mutant."""

    kind: str  # one of OUTCOMES
    returncode: int | None
    stderr: str

    @property
    def bad(self) -> bool:
        return self.kind in BAD_OUTCOMES

    @property
    def first_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        key = next((ln for ln in lines if "dlcc: error" in ln or "internal error" in ln or "Error" in ln), None)
        return (key or (lines[-1] if lines else "")).strip()[:300]


def classify(returncode: int | None, stderr: str, output: Path | None) -> Outcome:
    if returncode is None:
        return Outcome("hang", None, stderr)
    if returncode < 0:
        return Outcome("crash", returncode, stderr)
    if "Traceback" in stderr:
        return Outcome("traceback", returncode, stderr)
    if returncode == 3 or "dlcc: internal error" in stderr:
        return Outcome("internal_error", returncode, stderr)
    if returncode == 0:
        try:
            onnx.checker.check_model(onnx.load(str(output)))
        except Exception as e:  # the output must be valid ONNX: anything else is a dlcc bug
            return Outcome("internal_error", returncode, f"{stderr}\noutput fails onnx.checker: {e}")
        return Outcome("ok", 0, stderr)
    errors = [ln for ln in stderr.splitlines() if ln.startswith("dlcc: error:")]
    if returncode == 2 and len(errors) == 1:
        return Outcome("user_error", 2, stderr)
    return Outcome("crash" if returncode > 128 else "internal_error", returncode, stderr)


def run_case(data: bytes, timeout: float = 30.0, *, level: int = 3, layout: str = "same/inline") -> Outcome:
    """Run ``python -m dlcc.cli optimize IN OUT --level N`` on ``data`` in a subprocess and classify it."""
    with tempfile.TemporaryDirectory(prefix="dlcc-fuzz-") as tmp:
        files = _Files(tmp, data, layout)
        src, dst = files.src, files.dst
        env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="200")
        try:
            proc = subprocess.run([sys.executable, "-m", "dlcc.cli", "optimize", str(src), str(dst),
                                   "--level", str(level)], cwd=tmp, capture_output=True, text=True,
                                  errors="replace", timeout=timeout, env=env)
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            return Outcome("hang", None, err)
        files.done()
        return classify(proc.returncode, proc.stderr, dst)


def run_case_inprocess(data: bytes, *, level: int = 3, layout: str = "same/inline") -> Outcome:
    """The fast mode: ``dlcc.cli.main`` in this process with stderr captured. Only for cases known not to
    reach C++ code that could crash (a crash here ends the caller); no timeout."""
    from dlcc import cli

    with tempfile.TemporaryDirectory(prefix="dlcc-fuzz-") as tmp:
        files = _Files(tmp, data, layout)
        src, dst = files.src, files.dst
        buf = io.StringIO()
        old = cli._err._file  # None: the console follows sys.stderr; restoring ``.file`` would pin it
        cli._err.file = buf
        try:
            with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(io.StringIO()):
                try:
                    code = cli.main(["optimize", str(src), str(dst), "--level", str(level)])
                except BaseException as e:  # what main let through would be a traceback
                    import traceback

                    buf.write("Traceback (most recent call last):\n" + "".join(traceback.format_exception(e)))
                    code = 1
        finally:
            cli._err._file = old
        files.done()
        return classify(code, buf.getvalue(), dst)


def run_case_forked(data: bytes, timeout: float = 30.0, *, level: int = 3, layout: str = "same/inline") -> Outcome:
    """``run_case`` in a forked child of this process (which must be single-threaded: a fork copies no
    other thread, so a lock one of them held would stay held). The child runs ``dlcc.cli.main`` with file
    descriptors 1 and 2 on files; a signal is a crash, no exit within ``timeout`` a hang (the child is
    killed)."""
    import signal
    import time

    from dlcc import cli

    with tempfile.TemporaryDirectory(prefix="dlcc-fuzz-") as tmp:
        files = _Files(tmp, data, layout)
        src, dst, err = files.src, files.dst, Path(tmp) / "stderr.txt"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(fd, 2)
                os.dup2(null, 1)
                sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), errors="replace",
                                              line_buffering=True)
                sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False))
                cli._err._file = None  # the console follows sys.stderr
                import faulthandler

                faulthandler.enable(file=sys.stderr)  # a crash's Python stack goes with the case's stderr
                os.chdir(tmp)
                try:
                    code = cli.main(["optimize", str(src), str(dst), "--level", str(level)])
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
                except BaseException as e:  # what main let through is a traceback
                    import traceback

                    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_exception(e)))
                    code = 1
                sys.stderr.flush()
                sys.stdout.flush()
            finally:
                os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
        deadline = time.monotonic() + timeout
        status = None
        delay = 0.001
        while True:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        text = err.read_text(errors="replace") if err.exists() else ""
        files.done()
        if status is None:
            return classify(None, text, dst)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        return classify(code, text, dst)


@functools.cache
def warm() -> None:
    """Import everything ``dlcc optimize`` uses, once, before forking (each child would import it again)."""
    _, data = base_models()[0]
    run_case_inprocess(data)


def run_indexed(seed: int, index: int, timeout: float, kind: str | None = None,
                isolation: str = "fork") -> tuple[int, str, str, bytes, Outcome]:
    """Mutant ``index`` of ``seed`` and what dlcc did with it (for worker processes)."""
    kind, base, data = mutant(seed, index, kind)
    where = layout(seed, index)
    if isolation == "fork":
        warm()
        return index, kind, base, data, run_case_forked(data, timeout, layout=where)
    return index, kind, base, data, run_case(data, timeout, layout=where)
