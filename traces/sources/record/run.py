"""Run a program under the recorder: its stdio untouched, its exit status kept, the recordings collected."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from alloctrace.traces.util.cbuild import preload_safe
from alloctrace.traces.errors import UserError

NOT_LINUX = ("record works on Linux only for now (it preloads a library with LD_PRELOAD); "
             "docs/record.md describes the macOS plan")
STATIC = ("{prog} is statically linked, so no library can be preloaded into it: build it with shared "
          "libraries: -DBUILD_SHARED_LIBS=ON")


@dataclass
class RunResult:
    exit_status: int  # the program's, as a shell reports it (128 + signal when killed)
    recordings: list[Path]  # one per process that used ggml's allocator, in pid order


def resolve_program(argv: list[str]) -> str:
    prog = argv[0]
    path = prog if os.sep in prog else shutil.which(prog)
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


def recorder_env(library: Path | None, out_dir: Path, env: dict | None = None) -> dict:
    """The program's environment plus `env`: the recorder preloaded first (none: `library` None),
    writing into `out_dir`."""
    if library is not None and not preload_safe(library):
        raise UserError(f"cannot preload {library}: LD_PRELOAD needs an absolute path without spaces or colons")
    env = {**os.environ, **(env or {})}
    if library is not None:
        env["LD_PRELOAD"] = ":".join(p for p in (str(library), env.get("LD_PRELOAD", "")) if p)
    env["ALLOCTRACE_RECORD_DIR"] = str(out_dir)
    return env


def checked_program(argv: list[str], preload: bool = True) -> str:
    """The program's path, refused where nothing can be preloaded (not Linux, a static executable)."""
    if preload and not sys.platform.startswith("linux"):
        raise UserError(NOT_LINUX)
    prog = resolve_program(argv)
    if preload and is_static_elf(prog):
        raise UserError(STATIC.format(prog=argv[0]))
    return prog


def run_recorded(argv: list[str], library: Path | None, out_dir: Path, env: dict | None = None) -> RunResult:
    """Start `argv` with the recorder preloaded (none: `library` None), writing into `out_dir`, its
    environment plus `env`; wait for it."""
    prog = checked_program(argv, library is not None)
    env = recorder_env(library, out_dir, env)
    # Ctrl-C reaches the program (same process group); we wait for it and import what it left
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            proc = subprocess.Popen([prog, *argv[1:]], env=env)
        except OSError as e:
            raise UserError(f"cannot run {argv[0]}: {e.strerror}") from None
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
    return collect(argv, rc, out_dir)


def collect(argv: list[str], rc: int, out_dir: Path) -> RunResult:
    """What the finished program left in `out_dir`: each recording made whole and given its trailer."""
    import json  # here: a sweep imports this module before forking the workers that collect

    status = 128 - rc if rc < 0 else rc
    files = sorted(out_dir.glob("rec-*.atrec"), key=lambda p: int(p.stem.split("-")[1]))
    trailer = json.dumps({"argv": argv, "exit_status": status})
    for f in files:
        _cut_partial_line(f)
        with open(f, "ab") as fh:
            fh.write(b"Z " + trailer.encode() + b"\n")
    return RunResult(status, files)


def _cut_partial_line(path: Path):
    """A program killed mid-write may leave half a line: drop it, keep every whole one."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(pos - step + nl + 1)
                return
            pos -= step
        f.truncate(0)
