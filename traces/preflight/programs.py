"""A point's program while it runs: its time limit (--timeout), waiting for one or any of several without
reaping them early, and what it says about flags it ignores.

Programs are prestart.Spawned (a process group each): a program past its limit is killed with its group and
its point ends as TIMED_OUT, in place of its wait status, so the sweep goes on with the others.
"""
from __future__ import annotations

import os
import time

DEFAULT_TIMEOUT = 900.0  # seconds a point's program may run (--timeout; 0: no limit)
TIMED_OUT = "timed out"  # a status in place of the wait status: the program was killed at its time limit


def wait_any(running: dict, timeout: float | None = None) -> None:
    """Block until one of the running programs has ended (not reaping it), or `timeout` seconds pass: on a
    process file descriptor where the system has them, else polling."""
    import select

    fds = []
    try:
        fds = [os.pidfd_open(proc.pid) for proc in running.values()]
        select.select(fds, [], [], timeout)
    except (AttributeError, OSError):  # no pidfd (an old kernel, a filter): look every millisecond
        end = None if timeout is None else time.monotonic() + timeout
        while all(proc.poll() is None for proc in running.values()) and (end is None or time.monotonic() < end):
            time.sleep(0.001)
    finally:
        for fd in fds:
            os.close(fd)


def deadline(proc, timeout: float | None) -> float | None:
    """When a program's time is up (monotonic seconds), None without a limit."""
    return proc.started + timeout if timeout else None


def wait_until(proc, when: float | None) -> bool:
    """Wait for one program until `when` (None: for ever), reaping it; whether it ended."""
    while proc.poll() is None:
        left = None if when is None else when - time.monotonic()
        if left is not None and left <= 0:
            return False
        wait_any({0: proc}, left)
    return True


def stop_late(proc) -> str:
    """Kill a program past its time limit (its process group too) and reap it: TIMED_OUT."""
    proc.kill()
    proc.wait()
    return TIMED_OUT


def past_deadline(running: dict, timeout: float | None) -> list:
    """The points whose program has run past `timeout`."""
    now = time.monotonic()
    return [k for k, proc in running.items() if timeout and now >= proc.started + timeout and proc.poll() is None]


def next_deadline(running: dict, timeout: float | None) -> float | None:
    """Seconds until the first running program's time is up (None without a limit)."""
    if not timeout or not running:
        return None
    return max(0.0, min(proc.started + timeout for proc in running.values()) - time.monotonic())


# what a program says about flags it ignores (llama.cpp built without a GPU backend), and the flags it means
IGNORED = (("--gpu-layers option will be ignored", "-ngl"), ("Setting a tensor split has no effect", "-ts"),
           ("Setting the split mode has no effect", "-sm"), ("Setting the main GPU has no effect", "-mg"),
           ("--override-tensor option will be ignored", "-ot"))


def ignored_flags(text: str) -> list[str]:
    """The flags a program said it ignores, in its own words (llama.cpp's warnings on a CPU-only build)."""
    head = text[:1 << 16]  # it warns while it parses its arguments, before anything else
    return [flag for said, flag in IGNORED if said in head]
