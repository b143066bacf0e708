"""A point's program while it runs: its time limit (--timeout), waiting for one or any of several without
reaping them early, and what it says about flags it ignores.

Programs are prestart.Spawned (a process group each): a program past its limit is killed with its group and
its point ends as TimedOut, in place of its wait status, so the sweep goes on with the others. Before the kill
its threads are read from /proc (where_it_was), so the point's error says where the program was stuck: a
program that deadlocks (every thread blocked in futex, no CPU used) reads differently from one that computes.
One that hung (is_hung: asleep, nothing running) is run again, up to --retry-hung times: a rare deadlock of
the program's own (llama.cpp's log flush, docs/explain.md) then costs one timeout, not the point.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT = 900.0  # seconds a point's program may run (--timeout; 0: no limit)
DEFAULT_RETRY_HUNG = 1  # runs more a point gets whose program hung at its time limit (--retry-hung; 0: none)
MAX_RETRY_HUNG = 10  # a bound on the work one point can cause


@dataclass(frozen=True)
class TimedOut:
    """A status in place of the wait status: the program was killed at its time limit. `state`: where its
    threads were just before (where_it_was), empty when the system could not say; `hung`: it was stuck, not
    slow (is_hung), so it may be run again."""

    state: str = ""
    hung: bool = False


SLICE_S = 0.25  # the longest a wait blocks at once: a signal another thread took is acted on by then


def wait_any(running: dict, timeout: float | None = None) -> None:
    """Block until one of the running programs has ended (not reaping it), or `timeout` seconds pass, or at
    most SLICE_S (callers wait again): on a process file descriptor where the system has them, else polling.
    The slice matters: Ctrl-C or SIGTERM delivered to a thread other than the main one (a library's) does not
    interrupt the main thread's select, and Python acts on it only when the main thread runs again."""
    import select

    timeout = SLICE_S if timeout is None else min(timeout, SLICE_S)
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


def stop_late(proc) -> TimedOut:
    """Kill a program past its time limit (its process group too) and reap it, saying where it was."""
    state, hung = where_it_was(proc.pid), is_hung(proc.pid)
    proc.kill()
    proc.wait()
    return TimedOut(state, hung)


# system calls a stuck thread is commonly blocked in, by number (/proc/PID/task/TID/syscall), per machine
SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 23: "select", 34: "pause", 35: "nanosleep", 43: "accept",
               45: "recvfrom", 47: "recvmsg", 61: "wait4", 130: "rt_sigsuspend", 202: "futex",
               230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 270: "pselect6", 271: "ppoll",
               281: "epoll_pwait", 288: "accept4", 449: "futex_waitv"},
    "aarch64": {22: "epoll_pwait", 63: "read", 64: "write", 72: "pselect6", 73: "ppoll", 95: "waitid", 98: "futex",
                101: "nanosleep", 115: "clock_nanosleep", 133: "rt_sigsuspend", 202: "accept", 207: "recvfrom",
                212: "recvmsg", 242: "accept4", 260: "wait4", 449: "futex_waitv"},
}
MAX_THREADS_READ = 1024  # a program with more threads is described by its first ones


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _stat_fields(path: str) -> list[str]:
    """A /proc stat file's fields after the command name (which may hold spaces and parentheses): the state
    first; [] when it cannot be read."""
    stat = _read(path)
    return stat.rsplit(")", 1)[1].split() if ")" in stat else []


def _cpu_ticks(pid: int | str) -> int:
    """The CPU time a process has used, user and system, in clock ticks (ValueError when /proc cannot say)."""
    fields = _stat_fields(f"/proc/{pid}/stat")
    if len(fields) < 13:
        raise ValueError(f"no stat for process {pid}")
    return int(fields[11]) + int(fields[12])


def thread_state(pid: int, tid: str) -> str:
    """One thread as a phrase: `running`, `blocked in futex (futex_do_wait)` (the system call it is in, by
    name where known, and the kernel function it sleeps in), `stopped`, `exited`; "" when it is gone."""
    fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
    if not fields:
        return ""
    state = fields[0]
    if state == "R":
        return "running"
    if state in "Tt":
        return "stopped"
    if state in "ZX":
        return "exited"
    call = _read(f"/proc/{pid}/task/{tid}/syscall").split(" ", 1)[0]
    if call.isdecimal():
        import platform

        call = SYSCALLS.get(platform.machine(), {}).get(int(call), f"system call {call}")
    else:
        call = ""
    wchan = _read(f"/proc/{pid}/task/{tid}/wchan").split(".", 1)[0]  # futex_wait.isra.0: a compiler's copy
    wchan = "" if wchan == "0" else wchan
    where = f"{call} ({wchan})" if call and wchan else call or wchan
    return "blocked in " + where if where else "blocked"


def where_it_was(pid: int) -> str:
    """Where a running program's threads are, counted by state, and the CPU time it has used: `blocked in
    futex (futex_do_wait) in 3 threads, 0.02 s of CPU time used`. Read just before a program is killed at its
    time limit, so a hang names its cause (a deadlock blocks in futex, a lost child in wait4, a computation
    is running). "" where /proc cannot say (not Linux, the program gone)."""
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except (OSError, ValueError):
        return ""
    counts: dict[str, int] = {}  # in the order first seen: the main thread's state first
    for tid in tids[:MAX_THREADS_READ]:
        said = thread_state(pid, tid)
        if said:
            counts[said] = counts.get(said, 0) + 1
    if not counts:
        return ""
    parts = [f"{what} in {n} thread{'s' if n > 1 else ''}" for what, n in counts.items()]
    if len(tids) > MAX_THREADS_READ:
        parts.append(f"{len(tids) - MAX_THREADS_READ} more threads not read")
    try:
        parts.append(f"{_cpu_ticks(pid) / os.sysconf('SC_CLK_TCK'):.2f} s of CPU time used")
    except (ValueError, OSError):
        pass
    return ", ".join(parts)


HUNG_LOOK_S = 0.1  # a program past its limit is looked at twice this far apart: a hang is the same in both


def _asleep(pid: int) -> tuple | None:
    """The program's processes (it and those it started, where /proc lists them) with the CPU time each has
    used, when every one of their threads sleeps in the kernel (state S: a futex, a pipe, a child, a timer;
    not a disk, state D), else None."""
    todo, seen, asleep = [str(pid)], 0, []
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            return None  # a process that ended meanwhile: the program moves
        for tid in tids:
            seen += 1
            stat = _stat_fields(f"/proc/{p}/task/{tid}/stat")
            if seen > MAX_THREADS_READ or not stat or stat[0] not in ("S", "Z"):  # Z: a thread that has ended
                return None
            todo += _read(f"/proc/{p}/task/{tid}/children").split()
        try:
            asleep.append((p, _cpu_ticks(p)))
        except ValueError:
            return None
    return tuple(sorted(asleep))


def is_hung(pid: int) -> bool:
    """Whether a program past its time limit is stuck rather than slow: every thread of it and of the
    programs it started asleep, at two looks HUNG_LOOK_S apart, and no CPU time used in between. A deadlock
    (threads waiting on each other in futex) reads so; a computation, or a read from a slow disk, does not."""
    first = _asleep(pid)
    if first is None:
        return False
    time.sleep(HUNG_LOOK_S)
    return _asleep(pid) == first


def hung_note(states: list[str]) -> str | None:
    """What a point says of its runs that hung and were run again (--retry-hung): `its first run hung:
    blocked in futex (futex_do_wait) in 2 threads, ...` (where the first one's threads were); None if none."""
    if not states:
        return None
    runs = "its first run hung" if len(states) == 1 else f"its first {len(states)} runs hung"
    return f"{runs}: {states[0] or 'every thread asleep'}"


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
