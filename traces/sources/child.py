"""Read one input in a forked child under RLIMIT_AS and RLIMIT_CPU, so that whatever a decoder does with
hostile bytes the worst outcome is one refusal and a caller (the server) that keeps serving.

The child inherits everything (no re-import, no arguments to pickle); only its answer comes back, pickled
plain data (encoded graphs, numpy columns) over a pipe. os.fork takes the import lock around the fork and
logging re-makes its locks in the child; the child runs only the reading and leaves with os._exit."""
from __future__ import annotations

import errno
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import threading

from alloctrace.traces.sources.bounded_io import ENV, Cancelled, LimitExceeded


def _address_space() -> int:
    """Bytes mapped by this process now (VmSize): the budget is what the reading may add to it."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _refused(label: str, budget: int) -> LimitExceeded:
    return LimitExceeded(f"{label}: refused: over the memory budget of {budget:,} bytes "
                         f"({ENV['max_memory']} raises it)")


def _limit(budget: int, cpu_s: float):
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


def read_in_child(read, label: str, budget: int, cpu_s: float, cancelled=None, spawn_args=None):
    """`read()` run in a child limited to `budget` more bytes of address space and `cpu_s` CPU seconds;
    its result, or the UserError it raised, here. Out of memory or killed: one LimitExceeded.

    From the main thread (the CLI) the child is forked. From any other thread (the server's pool) a fresh
    interpreter is started instead and given `spawn_args` (read_file's arguments): a thread's malloc arena
    in a forked child retries a 64 MiB heap on every small allocation once the limit is near."""
    if threading.current_thread() is not threading.main_thread():
        proc = subprocess.Popen([sys.executable, "-P", "-c", SPAWNED, str(budget), str(cpu_s)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        proc.stdin.write(pickle.dumps(spawn_args))
        proc.stdin.close()
        return _collect(proc.pid, proc.stdout, label, budget, cpu_s, cancelled)
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
    return _collect(pid, os.fdopen(r, "rb"), label, budget, cpu_s, cancelled)


def _collect(pid: int, f, label: str, budget: int, cpu_s: float, cancelled):
    chunks = []
    try:
        with f:
            while True:
                ready, _, _ = select.select([f], [], [], 0.25)
                if not ready:
                    if cancelled is not None and cancelled():
                        os.kill(pid, signal.SIGKILL)
                        raise Cancelled(f"{label}: import cancelled (the client went away)")
                    continue
                chunk = f.read1(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    if not data:
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
            raise LimitExceeded(f"{label}: import took more than {cpu_s:g} s of CPU time (cap: {ENV['max_cpu_s']})")
        raise _refused(label, budget)
    kind, value = pickle.loads(data)
    if kind == "ok":
        return value
    if kind == "memory":
        raise _refused(label, budget)
    raise value


SPAWNED = "from alloctrace.traces.sources import _read_file; from alloctrace.traces.sources.child import serve; " \
    "serve(_read_file)"


def serve(_read_file):
    """A fresh child: read_file's arguments (pickled) on stdin, the answer (pickled) on stdout."""
    args = pickle.loads(sys.stdin.buffer.read())
    import numpy  # noqa: F401 (loaded before the limit: its libraries are part of the base, not the budget)
    _limit(int(sys.argv[1]), float(sys.argv[2]))
    data = _answer(lambda: _read_file(*args))
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
