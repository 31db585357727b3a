"""Shared by the benchmarks: a description of the machine, and writing one section of docs/BENCHMARKS.md.

What goes in: a section title and its markdown body. What comes out: docs/BENCHMARKS.md with that section
replaced (or appended), every other section kept, and the machine description at the top refreshed.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, AttributeError):
        pass
    isa = ""
    try:  # (the vector ISA the generated C targets here: AVX-512 and AVX2 machines give very different figures)
        from dlcc.schedule.target import get_target

        t = get_target("native")
        isa = f", target {t.detected_from} ({' '.join(t.features) or 'scalar'}, {8 * t.vector_bytes}-bit vectors)"
    except Exception:  # noqa: BLE001 (a description only)
        pass
    return (f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}{isa}")


def write_section(path: Path, title: str, body: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    header = f"## {title}\n"
    section = f"{header}\n{body.rstrip()}\n"
    # drop the old machine line and the old section, keep the rest
    text = re.sub(r"\nMachine: .*\n", "\n", text)
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip() + "\n\n" + section
    text = text.replace("# Benchmarks\n", f"# Benchmarks\n\nMachine: {machine_description()}\n", 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(re.sub(r"\n{3,}", "\n\n", text))
    os.replace(tmp, path)
