"""Read one input in a child process under RLIMIT_AS and RLIMIT_CPU, so that whatever a decoder does with
hostile bytes the worst outcome is one refusal, soon, and a caller (the server) that keeps serving.

From the main thread (the CLI) the child is forked: it inherits everything (no re-import, no arguments to
pickle). From any other thread (the server's pool) it is forked by a fork server started once, which has
the reading's modules imported already; only read_file's arguments travel to it. Either way only the
answer comes back, pickled plain data (encoded graphs, numpy columns) over a pipe.

The parent watches the child as well as waiting for it: a child whose address space stays at its limit is
ended, because a Python process that has run out of memory can spin instead of failing (CPython 3.11
retries an exception handler whose entry itself needs memory, forever), and so is a child past its CPU
time (RLIMIT_CPU stays as the backstop) or past the wall-clock limit."""
from __future__ import annotations

import atexit
import errno
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import threading
import time

from alloctrace.traces.sources.bounded_io import ENV, Cancelled, LimitExceeded

POLL_S = 0.1  # how often the parent looks at the child
AT_LIMIT_MARGIN = 4 << 20  # a child within this many bytes of its address-space limit cannot grow any more
AT_LIMIT_S = 0.5  # ... and is ended once it has stayed there this long
# what the readers import (the fork server's children inherit it); found by diffing sys.modules around reads
PRELOAD = ["alloctrace.traces.sources", "alloctrace.traces.sources.child", "numpy", "zstandard",
           "alloctrace.traces.sources.torch.source", "alloctrace.traces.sources.torch.snapshot_schema",
           "alloctrace.traces.sources.ggml_log", "alloctrace.traces.sources.jsonl", "alloctrace.traces.util.progress",
           "alloctrace.traces.whatif.torch_request", "alloctrace.traces.whatif.torch_model"]


def _address_space(pid: int | str = "self") -> int:
    """Bytes mapped by a process now (VmSize): the budget is what the reading may add to it."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _refused(label: str, budget: int) -> LimitExceeded:
    return LimitExceeded(f"{label}: refused: over the memory budget of {budget:,} bytes "
                         f"({ENV['max_memory']} raises it)")


def _limit(budget: int, cpu_s: float):
    import gc
    gc.freeze()  # what was imported before the reading is never scanned by a collection during it
    limit = _address_space() + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = int(cpu_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))


def _answer(read) -> bytes:
    try:
        answer = ("ok", read())
    except (MemoryError, ImportError):  # an extension module that cannot be mapped any more
        answer = ("memory", None)
    except OSError as e:
        answer = ("memory", None) if e.errno == errno.ENOMEM else ("error", e)
    except Exception as e:  # noqa: BLE001 (sent back whole: the parent raises it as its own)
        answer = ("memory", None) if _out_of_memory(e) else ("error", e)
    try:
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except MemoryError:
        return pickle.dumps(("memory", None))


def _out_of_memory(e: BaseException) -> bool:
    """Was `e` (a source's one-line error, say) caused by a failed allocation?"""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, MemoryError):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


WALL_SLACK_S = 30.0  # a reading waits this long past its CPU cap at least: a busy machine lends it less than a core


def read_in_child(read, label: str, budget: int, cpu_s: float, cancelled=None, spawn_args=None,
                  wall_s: float | None = None, abandon_if=None):
    """`read()` run in a child limited to `budget` more bytes of address space, `cpu_s` CPU seconds and
    `wall_s` seconds of wall-clock time (default: twice the CPU time, and WALL_SLACK_S more than it at least);
    its result, or the UserError it raised,
    here. Out of memory, at its memory limit, out of time or killed: one LimitExceeded.

    `abandon_if()` runs here while the child reads (this process would only wait): when it answers true, or
    raises, the child is killed and the reading answers None (or the error).

    From any thread but the main one the fork server's child reads `_read_file(*spawn_args)` instead: a
    thread's malloc arena in a child forked here retries a 64 MiB heap on every small allocation once the
    limit is near, and other threads' locks would be copied held."""
    wall_s = wall_s or max(2 * cpu_s, cpu_s + WALL_SLACK_S)
    if threading.current_thread() is not threading.main_thread():
        child = _ForkServerChild(budget, cpu_s, spawn_args)
        return _collect_unless(abandon_if, child, label, budget, cpu_s, wall_s, cancelled)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(r)
            _limit(budget, cpu_s)
            data = _answer(read)
            with os.fdopen(w, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(w)
    return _collect_unless(abandon_if, _ForkedChild(pid, os.fdopen(r, "rb")), label, budget, cpu_s, wall_s,
                           cancelled)


class _ForkedChild:
    """A child of this process: its answer's pipe, reaped here."""

    def __init__(self, pid: int, answer):
        self.pid, self.answer = pid, answer

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)

    def signal(self) -> int:
        """Wait for the child; the signal that ended it, or 0."""
        _, status = os.waitpid(self.pid, 0)
        return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


class _ForkServer:
    """A process started once (per server process) with the reading's modules imported, that forks one child
    per request: a child costs a fork, not an interpreter's start. Started with Python's safe path (-P), so
    nothing is imported from the working folder. A request carries read_file's arguments and the write end
    of the answer's pipe; the reply is a pidfd of the child (it can only ever signal that child)."""

    def __init__(self):
        import socket  # (the server's alone: a command reads in a child it forks itself)

        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # numpy imported there starts no thread pool
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", FORK_SERVER, str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.owner = os.getpid()  # a process forked from this one starts its own
        self.lock = threading.Lock()
        atexit.register(stop_fork_server)

    def fork(self, budget: int, cpu_s: float, args) -> tuple[int, int, object]:
        """A child reading `_read_file(*args)`: its pid, its pidfd and the read end of its answer."""
        import socket

        r, w = os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.sock, [pickle.dumps((budget, cpu_s, args))], [w])
                msg, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
        finally:
            os.close(w)
        if not msg or not fds:
            os.close(r)
            raise OSError(errno.ECHILD, "the import fork server is gone")
        return int(msg), fds[0], os.fdopen(r, "rb")

    @classmethod
    def running(cls) -> "_ForkServer":
        with _fork_server_lock:
            global _fork_server
            if _fork_server is None or _fork_server.owner != os.getpid() or _fork_server.proc.poll() is not None:
                _fork_server = cls()
            return _fork_server


_fork_server: _ForkServer | None = None
_fork_server_lock = threading.Lock()
FORK_SERVER = "import sys; from alloctrace.traces.sources import _read_file; " \
    "from alloctrace.traces.sources.child import fork_server; fork_server(int(sys.argv[1]), _read_file)"


def fork_server(fd: int, _read_file):
    """The fork server's loop: for each request fork a child that reads under the limits and answers into the
    pipe it was given; reply with the child's pid and pidfd. Ends when the server's end of the socket closes,
    killing the readings still running (nobody waits for their answers) and reaping every child, so their
    resource use is this process's children's (RUSAGE_CHILDREN, as for a CLI's forked child)."""
    import importlib
    import socket

    for name in PRELOAD:
        importlib.import_module(name)
    sock = socket.socket(fileno=fd)
    children: set[int] = set()
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        _reap(children, block=False)
        if not msg:
            for pid in children:
                os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
            _reap(children, block=True)
            return
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                sock.close()
                budget, cpu_s, args = pickle.loads(msg)
                _limit(budget, cpu_s)
                data = _answer(lambda: _read_file(*args))
                with os.fdopen(fds[0], "wb") as f:
                    f.write(data)
                status = 0
            finally:
                os._exit(status)
        children.add(pid)
        os.close(fds[0])
        pidfd = os.pidfd_open(pid)  # not reaped until a later request: it cannot be gone
        try:
            socket.send_fds(sock, [str(pid).encode()], [pidfd])
        finally:
            os.close(pidfd)


def _reap(children: set[int], block: bool):
    for pid in list(children):
        if os.waitpid(pid, 0 if block else os.WNOHANG)[0]:
            children.discard(pid)


def stop_fork_server():
    """End this process's fork server (it kills the readings it still runs) and wait for it."""
    global _fork_server
    with _fork_server_lock:
        server, _fork_server = _fork_server, None
    if server is not None and server.owner == os.getpid():
        server.sock.close()
        server.proc.wait(timeout=30)


class _ForkServerChild:
    """A child of the fork server: killed through its pidfd; its CPU time is watched, not its exit status."""

    def __init__(self, budget: int, cpu_s: float, args):
        self.pid, self.pidfd, self.answer = _ForkServer.running().fork(budget, cpu_s, args)

    def kill(self):
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass

    def signal(self) -> int:
        os.close(self.pidfd)
        return 0


def _limit_of(pid: int) -> int | None:
    """The child's address-space limit once it has set it (RLIM_INFINITY before)."""
    try:
        soft, _ = resource.prlimit(pid, resource.RLIMIT_AS)
    except (ProcessLookupError, PermissionError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _collect_unless(abandon_if, child, *collect_args):
    abandon = True  # until abandon_if has answered: it may raise
    try:
        abandon = abandon_if is not None and bool(abandon_if())
    finally:
        if abandon:
            child.kill()
            child.answer.close()
            child.signal()
    return None if abandon else _collect(child, *collect_args)


def _collect(child, label: str, budget: int, cpu_s: float, wall_s: float, cancelled):
    chunks = []
    started = time.monotonic()
    at_limit_since = None
    ended_for = None  # why we ended the child: "memory", "cpu" or "wall"
    cpu = 0.0  # the child's CPU seconds when last looked at
    try:
        with child.answer as f:
            while True:
                ready, _, _ = select.select([f], [], [], POLL_S)
                if ready:
                    chunk = f.read1(1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    continue
                if cancelled is not None and cancelled():
                    child.kill()
                    raise Cancelled(f"{label}: import cancelled (the client went away)")
                now = time.monotonic()
                cpu = _cpu_seconds(child.pid) or cpu
                if cpu > cpu_s:
                    ended_for = "cpu"
                elif now - started > wall_s:
                    ended_for = "wall"
                elif _stuck_at_limit(child.pid):
                    at_limit_since = at_limit_since or now
                    if now - at_limit_since >= AT_LIMIT_S:
                        ended_for = "memory"
                else:
                    at_limit_since = None
                if ended_for:
                    child.kill()
                    break
    finally:
        signum = child.signal()
    data = b"".join(chunks) if ended_for is None else b""
    if not data and (ended_for == "cpu" or signum == signal.SIGXCPU or cpu > cpu_s):
        raise LimitExceeded(f"{label}: import took more than {cpu_s:g} s of CPU time (cap: {ENV['max_cpu_s']})")
    if ended_for == "wall":
        raise LimitExceeded(f"{label}: import took more than {wall_s:g} s (wall-clock cap: twice the CPU cap and "
                            f"{WALL_SLACK_S:g} s past it at least, {ENV['max_cpu_s']})")
    if not data:
        raise _refused(label, budget)
    kind, value = pickle.loads(data)
    if kind == "ok":
        return value
    if kind == "memory":
        raise _refused(label, budget)
    raise value


def _cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of a process so far (/proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _stuck_at_limit(pid: int) -> bool:
    limit = _limit_of(pid)
    if limit is None:
        return False
    try:
        return _address_space(pid) >= limit - AT_LIMIT_MARGIN
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return False
