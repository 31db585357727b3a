"""Build generated C with the system compiler, with a per-user content-hash cache.

What goes in: a ``CSource`` (C text, header) and a target (``dlcc.schedule.target``: its ISA flags).
What comes out: the path of a shared library in the cache, keyed by the hash of source + header + flags +
compiler identity. The compiler runs without a shell (argument list), in a private temp directory inside
the cache; the result is moved into place atomically. Every cache entry stores the SHA-256 of its library,
checked before the library is loaded; a mismatch (a corrupted or tampered entry) is rebuilt.

The cache directory is ``$DLCC_CACHE_DIR`` or ``$XDG_CACHE_HOME/dlcc`` or ``~/.cache/dlcc``, created with
mode 0700; a cache directory that another user owns or that others may write is refused.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from dlcc.errors import DlccError
from dlcc.schedule.target import Target, get_target

__all__ = ["COMMON", "build_shared", "cache_dir", "compiler", "compile_files", "flags_for"]

COMMON = ["-O3", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-fPIC"]


def flags_for(target: Target | str | None = None, *, shared: bool = True, threads: int = 1) -> list[str]:
    """The compiler flags of generated code for ``target`` (``shared``: position-independent; ``threads`` > 1:
    the thread pool's pthreads)."""
    flags = [*COMMON, *get_target(target).cflags, *(["-pthread"] if threads > 1 else [])]
    return flags if shared else [f for f in flags if f != "-fPIC"]


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not shutil.which(cc):
        raise DlccError("no C compiler found", hint="install gcc or clang, or set CC")
    return cc


@functools.cache
def _compiler_id(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise DlccError(f"cannot run the C compiler {cc}: {e}") from None
    return out.splitlines()[0] if out else cc


def cache_dir() -> Path:
    root = os.environ.get("DLCC_CACHE_DIR")
    if root:
        path = Path(root)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "dlcc"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = path.stat()
    except OSError as e:
        raise DlccError(f"cannot create the dlcc cache directory {path}: {e.strerror}",
                        hint="set DLCC_CACHE_DIR to a writable directory") from None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise DlccError(f"the dlcc cache directory {path} belongs to another user",
                        hint="set DLCC_CACHE_DIR to a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DlccError(f"the dlcc cache directory {path} is writable by other users",
                        hint=f"chmod 700 {path}, or set DLCC_CACHE_DIR")
    return path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compile_files(cc: str, flags: list[str], sources: list[Path], out: Path, cwd: Path, *,
                  shared: bool = True) -> None:
    """Compile ``sources`` into ``out`` (objects in parallel when there are several), without a shell."""
    objs = []
    procs = []
    for src in sources:
        obj = src.with_suffix(".o")
        objs.append(obj)
        procs.append((src, subprocess.Popen([cc, *flags, "-c", "-o", str(obj), str(src)], cwd=cwd,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    errors = []
    for src, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"{src.name}: {err[-4000:]}")
    if errors:
        raise DlccError("the C compiler failed on the generated code:\n" + "\n".join(errors),
                        hint="this is a dlcc bug: report it with the model")
    link = [cc, *flags, *(["-shared"] if shared else []), "-o", str(out), *map(str, objs), "-lm"]
    proc = subprocess.run(link, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DlccError(f"linking the generated code failed:\n{proc.stderr[-4000:]}")


def build_shared(files: dict[str, str], *, target: Target | str | None = None, threads: int = 1) -> Path:
    """Build the C ``files`` (name -> text; every ``.c`` is compiled) into a cached shared library for
    ``target`` (which must run on this machine), linked with pthreads when ``threads`` > 1."""
    cc = compiler()
    flags = flags_for(target, threads=threads)
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    h.update(" ".join([_compiler_id(cc), *flags]).encode())
    key = h.hexdigest()
    root = cache_dir()
    entry = root / key[:2] / key
    lib = entry / "model.so"
    digest_file = entry / "model.so.sha256"
    if lib.exists() and digest_file.exists():
        if digest_file.read_text().strip() == _sha256(lib):
            return lib
        shutil.rmtree(entry, ignore_errors=True)  # corrupted or tampered: rebuild
    (root / key[:2]).mkdir(exist_ok=True, mode=0o700)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        sources = []
        for name, text in files.items():
            (tmp / name).write_text(text)
            if name.endswith(".c"):
                sources.append(tmp / name)
        compile_files(cc, flags, sources, tmp / "model.so", tmp)
        for obj in tmp.glob("*.o"):
            obj.unlink()
        (tmp / "model.so.sha256").write_text(_sha256(tmp / "model.so"))
        try:
            os.rename(tmp, entry)
        except OSError:
            if not lib.exists():  # another process won the race with a complete entry, else fail loudly
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if digest_file.read_text().strip() != _sha256(lib):
        raise DlccError(f"the cached library {lib} does not match its hash")
    return lib
