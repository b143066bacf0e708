"""A handful of worker processes forked from this one, each running one function over tasks it is handed.

`concurrent.futures.ProcessPoolExecutor` does the same, but importing it (multiprocessing, logging, queues,
sockets) costs 45 ms of CPU, two dry runs of a small model, before the first point of a sweep can start.
This is the part a sweep uses: fork, hand out tasks as workers come free, give results back in the order
they finish. Tasks and results travel pickled through a pipe pair per worker; a worker that dies without
answering is an error, not a hang. Linux and macOS only (fork), as recording is.
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
from collections.abc import Callable, Iterable, Iterator

from alloctrace.traces.errors import UserError

_LEN = struct.Struct("<Q")


class WorkerDied(UserError):
    """A worker ended (killed, out of memory) without answering its task: one line, not a hang."""


def _write(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _read(fd: int):
    """The next message, or None at end of file (the other side is gone)."""
    head = _read_exact(fd, _LEN.size)
    if head is None:
        return None
    body = _read_exact(fd, _LEN.unpack(head)[0])
    if body is None:
        return None
    return pickle.loads(body)


def _hand(fd: int, task: tuple, k: int) -> None:
    """Give a worker task k; a worker gone already is WorkerDied (a broken pipe would read as a closed stdout)."""
    try:
        _write(fd, task)
    except BrokenPipeError:
        raise WorkerDied(f"a worker process ended before it could take point {k + 1}") from None


def _serve(fn: Callable, tasks: int, results: int) -> None:
    """A worker's life: run `fn` on every task until the pool closes the task pipe."""
    while True:
        task = _read(tasks)
        if task is None:
            return
        try:
            out = (True, fn(*task))
        except BaseException as e:  # handed back and raised in the caller, as a future would
            out = (False, e)
        _write(results, out)


class ForkPool:
    """`jobs` workers forked now; `run(fn, tasks)` yields (task index, result) as each finishes."""

    def __init__(self, jobs: int, on_stop: Callable = lambda: None):
        self.jobs, self.on_stop = jobs, on_stop  # on_stop: what a worker ends before it dies of a signal
        self.workers: list[tuple[int, int, int]] = []  # (pid, task fd, result fd)
        self.fn: Callable | None = None

    def run(self, fn: Callable, tasks: Iterable[tuple]) -> Iterator[tuple[int, object]]:
        """Fork the workers and hand each its first task now; the iterator gives (task index, result) as
        each finishes, handing out the rest as workers come free."""
        todo = list(enumerate(tasks))
        self.fn = fn
        self._start(min(self.jobs, len(todo)))
        busy: dict[int, int] = {}  # result fd -> task index
        by_result = {r: t for _, t, r in self.workers}
        for r, t in by_result.items():
            k, task = todo.pop(0)
            _hand(t, task, k)
            busy[r] = k
        return self._results(todo, busy, by_result)

    def _results(self, todo: list, busy: dict[int, int], by_result: dict[int, int]) -> Iterator[tuple[int, object]]:
        with selectors.DefaultSelector() as sel:
            for r in busy:
                sel.register(r, selectors.EVENT_READ)
            while busy:
                for key, _ in sel.select():
                    r = key.fd
                    got = _read(r)
                    if got is None:
                        raise WorkerDied(f"a worker process ended without finishing point {busy[r] + 1}")
                    k = busy.pop(r)
                    if todo:
                        nk, task = todo.pop(0)
                        _hand(by_result[r], task, nk)
                        busy[r] = nk
                    else:  # nothing left for it: it exits now, while the others finish, not at close()
                        sel.unregister(r)
                        self._retire(by_result[r])
                    ok, value = got
                    if not ok:
                        raise value
                    yield k, value

    def _start(self, n: int) -> None:
        for _ in range(n):
            task_r, task_w = os.pipe()
            result_r, result_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: its own two ends only, and never back into the caller's code
                code = 1
                try:
                    os.close(task_w)
                    os.close(result_r)
                    for _, t, r in self.workers:
                        for fd in (t, r) if t >= 0 else (r,):
                            os.close(fd)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # ends quietly, its programs too
                        signal.signal(sig, self._worker_stop)
                    _serve(self.fn, task_r, result_w)
                    code = 0
                finally:
                    os._exit(code)
            os.close(task_r)
            os.close(result_w)
            self.workers.append((pid, task_w, result_r))

    def _worker_stop(self, signum, _frame) -> None:
        try:
            self.on_stop()
        finally:
            os._exit(128 + signum)

    def _retire(self, task_fd: int) -> None:
        """Close a worker's task pipe (it exits once it reads the end) and forget the number: the
        descriptor may be reused by the time close() runs."""
        os.close(task_fd)
        self.workers = [(pid, -1 if t == task_fd else t, r) for pid, t, r in self.workers]

    def close(self, stop: bool = False) -> None:
        """Close the task pipes (idle workers then exit) and reap every worker; `stop`: end busy ones too
        (the caller failed or was interrupted, nobody waits for their answers)."""
        for _, t, r in self.workers:
            for fd in (t, r) if t >= 0 else (r,):
                try:
                    os.close(fd)
                except OSError:
                    pass
        for pid, _, _ in self.workers:
            try:
                if stop:
                    os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass
        self.workers = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(stop=exc_type is not None)
        return False
