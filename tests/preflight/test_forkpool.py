"""The sweep's fork pool: every task's result once, in the order tasks finish; a task's exception reaches the
caller; a worker that dies is one clear error; no worker outlives the pool."""
from __future__ import annotations

import os
import signal
import time

import pytest

from alloctrace.traces.preflight.forkpool import ForkPool, WorkerDied


def square_after(x: int, delay: float) -> tuple[int, int]:
    time.sleep(delay)
    return x * x, os.getpid()


def test_every_result_once_in_finishing_order():
    tasks = [(k, 0.2 if k == 0 else 0.01) for k in range(7)]
    with ForkPool(3) as pool:
        got = list(pool.run(square_after, tasks))
        pids = [w[0] for w in pool.workers]
    assert sorted(k for k, _ in got) == list(range(7))
    assert all(v[0] == k * k for k, v in got)
    assert got[-1][0] == 0  # the slow first task finished last
    assert {v[1] for _, v in got} <= set(pids) and os.getpid() not in pids
    for pid in pids:  # reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def fail(x):
    raise ValueError(f"bad {x}")


def test_an_exception_in_a_task_is_raised_in_the_caller():
    with pytest.raises(ValueError, match="bad 2"):
        with ForkPool(2) as pool:
            list(pool.run(fail, [(2,)]))


def die(x):
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_that_dies_is_one_error_and_the_others_are_stopped():
    with pytest.raises(WorkerDied, match=r"ended without finishing point [12]$"):
        with ForkPool(2) as pool:
            for _ in pool.run(die, [(1,), (2,)]):
                pass
    assert not pool.workers


def test_large_results_come_back_whole():
    with ForkPool(2) as pool:
        got = dict(pool.run(bytes, [(3 << 20,), (5,)]))
    assert got == {0: bytes(3 << 20), 1: bytes(5)}


def test_a_worker_gone_before_its_next_task_is_one_error_not_a_broken_pipe():
    """Handing a task to a worker that has exited is WorkerDied: the CLI reads a bare BrokenPipeError as its
    own stdout closed, and would end quietly with half the points."""
    pool = ForkPool(1)
    try:
        it = pool.run(square_after, [(1, 0.0), (2, 0.0)])
        pid = pool.workers[0][0]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        with pytest.raises(WorkerDied):
            list(it)
    finally:
        pool.close(stop=True)


def test_handing_a_task_to_a_closed_pipe_is_worker_died():
    from alloctrace.traces.preflight.forkpool import _hand

    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(WorkerDied, match="before it could take point 3"):
            _hand(w, (1, 2), 2)
    finally:
        os.close(w)


def test_a_worker_with_no_task_left_exits_before_the_pool_closes():
    tasks = [(0, 0.6), (1, 0.01), (2, 0.01)]  # worker A: the slow one; worker B: the two quick ones
    with ForkPool(2) as pool:
        results = pool.run(square_after, tasks)
        first, second = next(results), next(results)
        quick = first[1][1]
        assert second[1][1] == quick and {first[0], second[0]} == {1, 2}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # B has ended while A still works: reaped here, not by close()
            pid, _ = os.waitpid(quick, os.WNOHANG)
            if pid:
                break
            time.sleep(0.01)
        assert pid == quick
        assert [k for k, _ in results] == [0]  # B's end is not read as a worker that died
    assert pool.workers == []
