"""Build a C source of this package into a shared library: at install time when a C compiler is there
(setup.py puts it beside its source), else on first use into a per-user cache; either way named by the
source's hash and the flags, so a library never outlives the source it was built from.

This module imports nothing of the package at its top: setup.py loads it by path to name what it builds."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path


SHARED_FLAGS = ["-shared", "-fPIC", "-O2", "-fvisibility=hidden"]  # a plain library loaded with ctypes
INSTALL_TIME = [("traces/sources/ggml_log/fastlog.c", "fastlog")]  # (source in the tree, stem): built by setup.py


def library_name(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"") -> str:
    """`<stem>-<hash>.so`: the hash of the source, `digest_extra` and the flags."""
    digest = hashlib.sha256(source.read_bytes())
    digest.update(digest_extra)
    digest.update(" ".join(flags).encode())
    return f"{stem}-{digest.hexdigest()[:16]}.so"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "alloctrace"


def find_compiler() -> str | None:
    """The C compiler to use ($CC, else cc, gcc or clang), None when there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return cc if cc and shutil.which(cc) else None


def compiler(what: str) -> str:
    """find_compiler's, or a UserError naming `what` when there is none."""
    from alloctrace.traces.errors import UserError

    cc = find_compiler()
    if cc is None:
        raise UserError(f"no C compiler found to build {what} (cc, gcc or clang): install one "
                        "(e.g. apt install gcc) or set CC")
    return cc


def compile_library(cc: str, source: Path, out: Path, flags: list[str], libs: tuple = ()):
    """Run the compiler; its CompletedProcess (the library at `out` when it succeeded)."""
    import subprocess  # here: a library built before needs none

    return subprocess.run([cc, *flags, "-o", str(out), str(source), *libs], capture_output=True, text=True)


def build_library(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"", libs: tuple = (),
                  what: str | None = None) -> Path:
    """The path of `source` built as `<stem>-<hash>.so`: beside the source when it was built at install
    time, else in the cache, compiled when not built yet. `digest_extra` is whatever else the build
    depends on (an included header's bytes)."""
    from alloctrace.traces.errors import UserError

    what = what or stem
    name = library_name(source, stem, flags, digest_extra)
    if (source.parent / name).exists():
        return source.parent / name
    out = cache_dir() / name
    if out.exists():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache (a read-only home): a per-user temporary directory
        out = Path(tempfile.gettempdir()) / f"alloctrace-{os.getuid()}" / out.name
        if out.exists():
            return out
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    cc = compiler(what)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        try:
            r = compile_library(cc, source, Path(tmp), flags, libs)
        except OSError as e:
            raise UserError(f"building {what} with {cc} failed: {e}") from None
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            raise UserError(f"building {what} with {cc} failed: {first}")
        os.replace(tmp, out)  # atomic: a concurrent build of the same source yields the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
