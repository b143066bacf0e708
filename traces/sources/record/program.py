"""The program a recording runs: found, checked that a library can be preloaded into it, and its environment
with the recorder preloaded. Apart from run.py (which also waits for it and collects what it wrote) because a
sweep's first programs start from here before the command imports anything else (preflight/prestart.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.cbuild import preload_safe

NOT_LINUX = ("record works on Linux only for now (it preloads a library with LD_PRELOAD); "
             "docs/record.md describes the macOS plan")
STATIC = ("{prog} is statically linked, so no library can be preloaded into it: build it with shared "
          "libraries: -DBUILD_SHARED_LIBS=ON")


PYTHON_NAMES = ("python", "pypy", "torchrun", "accelerate", "deepspeed")


def _python_name(name: str) -> bool:
    """python, python3.12, pypy3, torchrun, accelerate, deepspeed (without a regular expression: this runs
    before the program starts, where every import delays it)."""
    for base in PYTHON_NAMES:
        if name == base or (base in ("python", "pypy") and name.startswith(base)
                            and all(c in "0123456789." for c in name[len(base):])):
            return True
    return False


def is_python_program(argv: list[str]) -> bool:
    """A Python interpreter, a launcher of Python workers (torchrun), or a script whose #! line names Python."""
    if not argv:
        return False
    prog = argv[0]
    if os.path.basename(prog) == "env":  # env VAR=... PROGRAM
        rest = [w for w in argv[1:] if "=" not in w and not w.startswith("-")]
        return is_python_program(rest)
    if _python_name(os.path.basename(prog)):
        return True
    path = prog if os.sep in prog else _which(prog)
    try:
        with open(path or prog, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _which(name: str) -> str | None:
    import shutil  # here: a program named by its path (the usual case) needs none

    return shutil.which(name)


def resolve_program(argv: list[str]) -> str:
    prog = argv[0]
    path = prog if os.sep in prog else _which(prog)
    if not path or not os.path.exists(path):
        raise UserError(f"program not found: {prog}")
    return path


def is_static_elf(path: str) -> bool:
    """An ELF executable without a program interpreter: the dynamic loader never runs, nothing is preloaded."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only; anything else: let it run
                return False
            little = head[5] == 1
            order = "little" if little else "big"
            phoff = int.from_bytes(head[32:40], order)
            phentsize = int.from_bytes(head[54:56], order)
            phnum = int.from_bytes(head[56:58], order)
            if phnum == 0 or phnum > 4096:
                return False
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    types = [int.from_bytes(table[i * phentsize:i * phentsize + 4], order) for i in range(phnum)]
    PT_INTERP, PT_DYNAMIC = 3, 2
    return PT_INTERP not in types and PT_DYNAMIC not in types


def holds_ggml_allocator(path: str, limit: int = 1 << 30) -> bool:
    """Whether the executable itself contains ggml's graph allocator (its symbol names): ggml linked into it
    statically, so its calls to the allocator never pass through a preloaded library."""
    want, keep = b"ggml_gallocr_", 32
    try:
        with open(path, "rb") as f:
            tail, read = b"", 0
            while read < limit:
                block = f.read(1 << 20)
                if not block:
                    return False
                if want in tail + block:
                    return True
                tail, read = block[-keep:], read + len(block)
    except OSError:
        return False
    return False


def private_folder(prefix: str) -> str:
    """A new folder only this user may enter, where tempfile.mkdtemp(prefix=prefix) makes it: made here
    directly in the first of $TMPDIR, $TEMP, $TMP and /tmp (tempfile's first choice), by tempfile itself
    when that fails or tempfile is already imported (it may have settled on another folder). Importing
    tempfile (random, weakref, shutil) costs a record's start 1-2 ms."""
    if "tempfile" not in sys.modules:
        base = next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "/tmp")
        try:
            path = os.path.join(os.path.abspath(base), prefix + os.urandom(6).hex())
            os.mkdir(path, 0o700)
            return path
        except OSError:
            pass  # no such folder, not writable, a name taken: tempfile's own search and retries
    import tempfile

    return tempfile.mkdtemp(prefix=prefix)


def remove_folder(path) -> None:
    """Remove a folder of the run's (`private_folder`'s, or one in it) with whatever the program left there
    (files, folders, links, never followed). Walked here: no other user can write in it; what this cannot
    remove is left to shutil.rmtree, ignoring errors, whose import (bz2, lzma) costs a record 1-2 ms."""
    try:
        for root, folders, files in os.walk(path, topdown=False):
            for name in files:
                os.unlink(os.path.join(root, name))
            for name in folders:
                inner = os.path.join(root, name)
                if os.path.islink(inner):  # a link to a folder: the link goes, not what it names
                    os.unlink(inner)
                else:
                    os.rmdir(inner)
        os.rmdir(path)
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


RECORD_FOLDER = "rec"  # inside the run's private folder: where the recorder may create files, until collected


def recorder_env(library: Path | None, out_dir: Path, env: dict | None = None) -> dict:
    """The program's environment plus `env`: the recorder preloaded first (none: `library` None), writing
    into a folder of its own made now in `out_dir` (a private folder made for the run), 0700 as the
    recorder requires."""
    if library is not None and not preload_safe(library):
        raise UserError(f"cannot preload {library}: LD_PRELOAD needs an absolute path without spaces or colons")
    folder = os.path.join(out_dir, RECORD_FOLDER)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    env = {**os.environ, **(env or {})}
    if library is not None:
        env["LD_PRELOAD"] = ":".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    env["ALLOCTRACE_RECORD_DIR"] = folder
    return env


def checked_program(argv: list[str], preload: bool = True) -> str:
    """The program's path, refused where nothing can be preloaded (not Linux, a static executable)."""
    if preload and not sys.platform.startswith("linux"):
        raise UserError(NOT_LINUX)
    prog = resolve_program(argv)
    if preload and is_static_elf(prog):
        raise UserError(STATIC.format(prog=argv[0]))
    return prog




def _program_has_it(signum, frame):
    """SIGINT (Ctrl-C) while the program runs: the program's to act on, in the same process group; this
    process goes on waiting for it and imports what it left."""


def leave_sigint_to_the_program():
    """Make this process sit out Ctrl-C while its program runs, without the program inheriting that: a
    handler, not SIG_IGN (an ignored signal stays ignored across exec, so the program, and a Python program's
    KeyboardInterrupt, would never see Ctrl-C); a handled one starts the program at its default. Where this
    process was started with SIGINT ignored (nohup, a background job), it stays ignored for both, as a shell
    would pass it on. Returns the handler to put back (signal.signal(signal.SIGINT, old))."""
    import signal

    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN if old == signal.SIG_IGN else _program_has_it)
    return old
