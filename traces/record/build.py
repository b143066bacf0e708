"""Build the recorder library on first use: the system C compiler, a per-user cache keyed by the source hash."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from alloctrace.traces.errors import UserError

SOURCE = Path(__file__).with_name("recorder.c")
# ggml_cgraph.leafs: after nodes, grads and (since the tensor lost its grad member, late 2024) grad_accs
CGRAPH_LEAFS = {True: 32, False: 40}
TENSOR_GRAD = re.compile(rb"struct\s+ggml_tensor\s*\*\s*grad\s*;")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "alloctrace"


def find_ggml_header(path: str | os.PathLike) -> Path:
    """`--ggml-include`: a ggml.h, or a directory holding one (an include/ directory of ggml)."""
    p = Path(path)
    if p.is_dir():
        p = p / "ggml.h"
    if not p.is_file():
        raise UserError(f"--ggml-include: no ggml.h at {p}")
    return p


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc or not shutil.which(cc):
        raise UserError("no C compiler found to build the recorder (cc, gcc or clang): install one "
                        "(e.g. apt install gcc) or set CC")
    return cc


def recorder_library(ggml_header: Path | None = None) -> Path:
    """The path of the built recorder, compiling it when this source (and header) has not been built yet."""
    src = SOURCE.read_bytes()
    flags = ["-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-D_GNU_SOURCE"]
    digest = hashlib.sha256(src)
    if ggml_header is not None:
        header = ggml_header.read_bytes()
        digest.update(header)
        flags += ["-DAT_GGML_H", f"-DAT_CGRAPH_LEAFS={CGRAPH_LEAFS[bool(TENSOR_GRAD.search(header))]}",
                  "-I", str(ggml_header.parent), "-include", str(ggml_header.resolve())]
    digest.update(" ".join(flags).encode())
    out = cache_dir() / f"recorder-{digest.hexdigest()[:16]}.so"
    if out.exists():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache (a read-only home): a per-user temporary directory
        out = Path(tempfile.gettempdir()) / f"alloctrace-{os.getuid()}" / out.name
        if out.exists():
            return out
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    cc = compiler()
    fd, tmp = tempfile.mkstemp(prefix=".recorder-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-ldl", "-lpthread"], capture_output=True, text=True)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            raise UserError(f"building the recorder with {cc} failed: {first}")
        os.replace(tmp, out)  # atomic: a concurrent build of the same source yields the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
