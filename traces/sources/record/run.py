"""Run a program under the recorder: its stdio untouched, its exit status kept, the recordings collected."""
from __future__ import annotations

import os
import signal
import stat
import sys
from alloctrace.allocator.record_class import record_class
from pathlib import Path

from alloctrace.traces.errors import UserError

from .program import (NOT_LINUX, RECORD_FOLDER, STATIC, checked_program, is_static_elf,  # noqa: F401
                      leave_sigint_to_the_program, recorder_env, remove_folder, resolve_program)


@record_class
class RunResult:
    exit_status: int  # the program's, as a shell reports it (128 + signal when killed)
    recordings: list[Path]  # one per process that used ggml's allocator, in pid order
    stopped_by: str = ""  # how a program past its time limit was stopped ("SIGTERM", "SIGKILL"), else ""


GRACE_S = 10.0  # a program past its time limit has this long after SIGTERM (a PyTorch snapshot is dumped then)


def run_recorded(argv: list[str], library: Path | None, out_dir: Path, env: dict | None = None,
                 started=None, timeout: float | None = None) -> RunResult:
    """Start `argv` with the recorder preloaded (none: `library` None), writing into `out_dir`, its
    environment plus `env`; wait for it. `started`: the program already started so (traces/sources/early.py),
    writing into `out_dir`: only waited for. `timeout`: seconds after which the program is sent SIGTERM, and
    SIGKILL GRACE_S later; what it recorded until then is collected as usual."""
    if started is not None:
        return collect(argv, started.wait(), out_dir)
    import subprocess  # here: a program the entry point started (the usual record) needs none of it

    prog = checked_program(argv, library is not None)
    env = recorder_env(library, out_dir, env)
    old = leave_sigint_to_the_program()  # Ctrl-C reaches the program (same process group); we wait for it
    try:
        try:
            proc = subprocess.Popen([prog, *argv[1:]], env=env)
        except OSError as e:
            raise UserError(f"cannot run {argv[0]}: {e.strerror}") from None
        rc, stopped_by = _wait(proc, timeout)
    finally:
        signal.signal(signal.SIGINT, old)
    result = collect(argv, rc, out_dir)
    result.stopped_by = stopped_by
    return result


def _wait(proc, timeout: float | None) -> tuple[int, str]:
    """The program's exit code, and how it was stopped when it ran past `timeout` ("" when it ended itself)."""
    import subprocess

    try:
        return proc.wait(timeout=timeout), ""
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        return proc.wait(timeout=GRACE_S), "SIGTERM"
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(), "SIGKILL"


def collect(argv: list[str], rc: int, out_dir: Path) -> RunResult:
    """What the finished program left in `out_dir`: each recording made whole and given its trailer.

    The record folder is renamed away first, so no process the program left running can create a file
    there any more (the recorder opens the folder by its name); each recording's whole lines, as long as it
    is now, are copied into a new file (O_EXCL, no link followed) and the old one removed: a process still
    writing writes into a file nobody reads."""
    import json  # here: a sweep imports this module before forking the workers that collect

    status = 128 - rc if rc < 0 else rc
    closed, done = out_dir / "closed", out_dir / "collected"
    try:
        os.rename(out_dir / RECORD_FOLDER, closed)
    except FileNotFoundError:
        return RunResult(status, [])
    os.mkdir(done, 0o700)
    trailer = b"Z " + json.dumps({"argv": argv, "exit_status": status}).encode() + b"\n"
    files = []
    for name in sorted(os.listdir(closed), key=_pid_order):
        if _pid_order(name) is None:
            continue
        if _seal(closed / name, done / name, trailer):
            files.append(done / name)
    remove_folder(closed)
    return RunResult(status, files)


def _pid_order(name: str):
    """rec-PID.atrec, rec-PID-K.atrec (the K-th program a process exec'd): (PID, K); None for anything else."""
    if not (name.startswith("rec-") and name.endswith(".atrec")):
        return None
    parts = name[4:-6].split("-")
    if len(parts) > 2 or not all(p.isdecimal() for p in parts):
        return None
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 1)


def _seal(src: Path, dst: Path, trailer: bytes) -> bool:
    """`src`'s whole lines (a program killed mid-write may leave half a line) and `trailer` into a new file
    `dst`; False when `src` is not a regular file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(src, flags)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        end = _whole_lines_end(fd, st.st_size)
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            pos = 0
            while pos < end:
                try:
                    n = os.copy_file_range(fd, out, end - pos, pos)
                except (AttributeError, OSError):
                    n = 0
                if n <= 0:  # no copy_file_range here (or it declined): plain reads and writes
                    chunk = os.pread(fd, min(1 << 20, end - pos), pos)
                    if not chunk:
                        break
                    n = os.write(out, chunk)
                pos += n
            os.write(out, trailer)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    os.unlink(src)
    return True


def _whole_lines_end(fd: int, size: int) -> int:
    """The length of the file's first `size` bytes up to and including their last newline."""
    pos = size
    while pos > 0:
        step = min(65536, pos)
        chunk = os.pread(fd, step, pos - step)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return pos - step + nl + 1
        pos -= step
    return 0
