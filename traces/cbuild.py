"""Build a C source of this package into a shared library on first use: the system C compiler,
a per-user cache keyed by the source's hash (and the flags), an atomic rename into place."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from alloctrace.traces.errors import UserError


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "alloctrace"


def compiler(what: str) -> str:
    """The C compiler to use ($CC, else cc, gcc or clang); a UserError naming `what` when there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not shutil.which(cc):
        raise UserError(f"no C compiler found to build {what} (cc, gcc or clang): install one "
                        "(e.g. apt install gcc) or set CC")
    return cc


def build_library(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"", libs: tuple = (),
                  what: str | None = None) -> Path:
    """The path of `source` built as `<cache>/<stem>-<hash>.so`, compiled when not built yet.
    `digest_extra` is whatever else the build depends on (an included header's bytes)."""
    what = what or stem
    digest = hashlib.sha256(source.read_bytes())
    digest.update(digest_extra)
    digest.update(" ".join(flags).encode())
    out = cache_dir() / f"{stem}-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache (a read-only home): a per-user temporary directory
        out = Path(tempfile.gettempdir()) / f"alloctrace-{os.getuid()}" / out.name
        if out.exists():
            return out
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    import subprocess  # here: a library built before needs none

    cc = compiler(what)
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        try:
            r = subprocess.run([cc, *flags, "-o", tmp, str(source), *libs], capture_output=True, text=True)
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
