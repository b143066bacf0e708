"""Run a program under the recorder: its stdio untouched, its exit status kept, the recordings collected."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from alloctrace.traces.errors import UserError

from .program import NOT_LINUX, STATIC, checked_program, is_static_elf, recorder_env, resolve_program  # noqa: F401


@dataclass
class RunResult:
    exit_status: int  # the program's, as a shell reports it (128 + signal when killed)
    recordings: list[Path]  # one per process that used ggml's allocator, in pid order


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
