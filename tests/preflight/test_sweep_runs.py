"""Program runs reported as they happened: a point whose program hangs ends as "timed out" (killed with what it
started, the sweep goes on) saying where its threads were (blocked in futex: a deadlock), a failing program's
own last lines and exit status are in its point (never a guess about static linking), -j follows the
program's -t, and flags a build says it ignores are named."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_sweep_stopped import SLEEPER, SWEEP_PROGRAM, alive

from alloctrace.traces.preflight.prestart import default_jobs, program_threads
from alloctrace.traces.preflight.programs import ignored_flags, where_it_was
from alloctrace.traces.sources.record.source import last_lines, no_allocator_calls

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sweeps record on Linux")
FAILING = Path(__file__).parents[1] / "data" / "record" / "failing.sh"
DEADLOCKED = Path(__file__).parents[1] / "data" / "record" / "deadlocked.py"
KILLED = "the program was killed (--timeout); it was blocked in "  # the sleeper's shell, waiting for its child


def _env(tmp_path, pure="0"):
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return pids, tmp, {**os.environ, "PIDS": str(pids), "TMPDIR": str(tmp), "ALLOCTRACE_PURE_PYTHON": pure,
                       "PYTHON": sys.executable, "SWEEP_PROGRAM": str(SWEEP_PROGRAM)}


def _sweep(tmp_path, env, *args):
    cmd = [sys.executable, "-m", "alloctrace", "sweep", "--store", str(tmp_path / "s"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("pure,jobs", [("0", "2"), ("1", "2"), ("0", "1")])
def test_a_hung_point_times_out_and_the_sweep_goes_on(tmp_path, pure, jobs):
    """c=1 ends at once; c=2 would sleep for 300 s: killed at --timeout 2 (its child too), reported as timed out
    in the table and in JSON, while c=1 is stored. pure 1: the programs run in forked workers; -j 1: one by one."""
    pids, tmp, env = _env(tmp_path, pure)
    t0 = time.monotonic()
    r = _sweep(tmp_path, env, "--vary=-c=1,2", "-j", jobs, "--timeout", "2", "--json", "--", str(SLEEPER))
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    pts = {p["values"]["-c"]: p for p in json.loads(r.stdout)["points"]}
    assert pts["1"]["status"] == "ok" and pts["1"]["trace"] and pts["1"]["buffers"]
    assert pts["2"]["status"] == "timed out" and pts["2"]["trace"] is None
    assert pts["2"]["error"].startswith("timed out after 2 s: " + KILLED) and " in 1 thread, " in pts["2"]["error"]
    # asleep (the shell waits for its sleeping child), so it hung: run once more (--retry-hung), and hung again
    assert pts["2"]["retried"].startswith("its first run hung: blocked in ") and pts["1"]["retried"] is None
    assert took < 120            # not the sleeper's 300 s
    started = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started and not [p for p in started if alive(p)], "the timed-out program or its child still runs"
    assert list(tmp.iterdir()) == []


def test_the_table_says_timed_out_and_timeout_zero_is_refused_negative(tmp_path):
    _pids, _tmp, env = _env(tmp_path)
    r = _sweep(tmp_path, env, "--vary=-c=2", "--timeout", "1", "--", str(SLEEPER))
    assert r.returncode == 1 and "timed out after 1 s: " + KILLED in r.stdout
    r = _sweep(tmp_path, env, "--vary=-c=2", "--timeout", "-1", "--", str(SLEEPER))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--timeout" in r.stderr


def test_fit_reports_a_run_that_timed_out(tmp_path):
    _pids, _tmp, env = _env(tmp_path)
    cmd = [sys.executable, "-m", "alloctrace", "fit", "--store", str(tmp_path / "s"), "--budget", "1GiB",
           "--vary=-c=2..8", "--timeout", "1", "--", str(SLEEPER)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("alloctrace: error: fit: the run with -c 2 failed: timed out after 1 s: " + KILLED)
    assert last.endswith(" s of CPU time used")


@pytest.mark.parametrize("pure", ["0", "1"])
def test_a_timed_out_point_says_where_its_threads_were(tmp_path, pure):
    """A deadlocked program (three threads each waiting on a lock nobody releases) and a busy one, both killed
    at --timeout: each point's error says what its threads were doing then, so a hang tells its cause."""
    _pids, _tmp, env = _env(tmp_path, pure)
    r = _sweep(tmp_path, env, "--vary=-n=1", "--timeout", "1", "--json", "--", sys.executable, str(DEADLOCKED))
    (p,) = json.loads(r.stdout)["points"]
    assert p["status"] == "timed out", r.stderr
    assert p["error"].startswith("timed out after 1 s: the program was killed (--timeout); it was blocked in futex")
    assert " in 3 threads, " in p["error"] and p["error"].endswith(" s of CPU time used")
    assert p["retried"].startswith("its first run hung: blocked in futex")  # deadlocked twice
    r = _sweep(tmp_path, env, "--vary=-n=1", "--timeout", "1", "--json", "--", sys.executable, "-c", "while 1: pass")
    (p,) = json.loads(r.stdout)["points"]
    assert p["error"].startswith("timed out after 1 s: the program was killed (--timeout); it was running in 1 "
                                 "thread, "), p["error"]
    assert float(p["error"].split(", ")[-1].split()[0]) > 0  # its CPU time
    assert p["retried"] is None  # busy, not hung: run once


def test_where_it_was_of_a_sleeping_child_and_of_no_process():
    child = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 30
        while "blocked" not in where_it_was(child.pid) and time.monotonic() < deadline:  # until it sleeps
            time.sleep(0.01)
        said = where_it_was(child.pid)
        assert said.startswith("blocked in ") and "sleep" in said and " in 1 thread, " in said, said
    finally:
        child.kill()
        child.wait()
    assert where_it_was(child.pid) == ""  # reaped: nothing to read


def test_a_failing_program_is_reported_with_its_last_lines_and_status(tmp_path):
    """A program that fails before any ggml graph (a model that does not load): its point says its exit status
    and its own last lines, not "is the program statically linked?"."""
    _pids, _tmp, env = _env(tmp_path)
    r = _sweep(tmp_path, env, "--vary=-c=5,6", "--json", "--", str(FAILING), "-m", "missing.gguf")
    assert r.returncode == 1
    for p in json.loads(r.stdout)["points"]:
        assert p["status"] == "failed" and p["exit_status"] == 3
        assert "statically" not in p["error"]
        assert p["error"].startswith("no ggml allocator calls were seen: the program exited with status 3 before")
        assert p["error"].endswith(f"its last lines: loading model (args: -m missing.gguf -c {p['values']['-c']}) | "
                                   "error: failed to open missing.gguf | exiting")


def test_record_of_a_failing_program_names_its_status(tmp_path):
    cmd = [sys.executable, "-m", "alloctrace", "record", "--store", str(tmp_path / "s"), "--", str(FAILING), "-c", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3
    assert "error: failed to open" in r.stderr          # the program's own output passes through
    assert r.stderr.strip().splitlines()[-1] == ("alloctrace: error: no ggml allocator calls were seen: the program "
                                                 "exited with status 3 before using ggml's graph allocator; its "
                                                 "output is above")
    r = subprocess.run([sys.executable, "-m", "alloctrace", "record", "--store", str(tmp_path / "s"), "--", "true"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "ended normally (exit status 0) without allocating a ggml graph" in r.stderr


def test_messages_from_status_and_output(tmp_path):
    assert "killed by SIGKILL" in no_allocator_calls(137, "")
    assert "exited with status 1" in no_allocator_calls(1, "a\n\n b \nc\nd\n") and \
        no_allocator_calls(1, "a\n\n b \nc\nd\n").endswith("its last lines: b | c | d")
    assert len(last_lines("x" * 5000)) == 603 and last_lines("x" * 5000).startswith("...")
    static = tmp_path / "prog"        # an executable whose own symbols hold ggml's allocator, across a 1 MiB block
    static.write_bytes(b"\x7fELF" + b"\0" * ((1 << 20) - 10) + b"ggml_gallocr_alloc_graph\0")
    assert "linked in statically" in no_allocator_calls(0, "", str(static))
    assert "ended normally" in no_allocator_calls(0, "", "/bin/true")


def test_jobs_follow_the_programs_threads(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert program_threads(["llama", "-m", "x", "-t", "2"]) == 2 and program_threads(["llama", "--threads=4"]) == 4
    assert default_jobs(["llama", "-m", "x"]) == 1            # not told: it uses every core itself
    assert default_jobs(["llama", "-t", "2"]) == 4 and default_jobs(["llama", "-t", "16"]) == 1
    assert default_jobs(["llama", "--threads", "1"]) == 8
    assert default_jobs(["/opt/bin/llama-fit-params", "-m", "x"]) == 8   # a dry run computes nothing


def test_ignored_flags_are_read_from_what_the_program_says():
    said = ("warning: no usable GPU found, --gpu-layers option will be ignored\n"
            "warning: llama.cpp was compiled without support for GPU offload. Setting a tensor split has no effect.\n")
    assert ignored_flags(said) == ["-ngl", "-ts"]
    assert ignored_flags("load_tensors: offloaded 33/33 layers to GPU\n") == []


@pytest.mark.skipif(not os.environ.get("ALLOCTRACE_LLAMA_BIN"), reason="ALLOCTRACE_LLAMA_BIN is not set")
def test_a_cpu_build_says_it_ignores_gpu_layers(tmp_path):
    """The real CPU build, swept over -ngl: the answer names -ngl as ignored and says the points are one run."""
    bindir = Path(os.environ["ALLOCTRACE_LLAMA_BIN"]).parent
    model = next(p for p in (bindir.parent / "models").glob("*.gguf"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(bindir)}
    r = _sweep(tmp_path, env, "--vary=-ngl=0,99", "--", str(bindir / "llama-fit-params"), "-m", str(model))
    assert r.returncode == 0, r.stderr
    assert "ignored by this build of the program (it says so in its output): -ngl" in r.stdout
    assert "the points along -ngl are the same run" in r.stdout
    r = _sweep(tmp_path, env, "--vary=-ngl=0,99", "--json", "--", str(bindir / "llama-fit-params"), "-m", str(model))
    out = json.loads(r.stdout)
    assert out["ignored"] == ["-ngl"] and all(p["ignored"] == ["-ngl"] for p in out["points"])


def test_verbose_says_the_jobs_chosen_and_why(tmp_path):
    _pids, _tmp, env = _env(tmp_path)
    run = _sweep(tmp_path, env, "-v", "--vary=-c=64,128", "--", sys.executable, str(SWEEP_PROGRAM), "-nh", "1")
    assert run.returncode == 0, run.stderr
    assert "programs at once (-j): 1 (default: the program has no -t, so it uses every core itself)" in run.stderr
    run = _sweep(tmp_path, env, "-v", "-j", "2", "--vary=-c=64,128", "--", sys.executable, str(SWEEP_PROGRAM))
    assert "programs at once (-j): 2 (given with -j)" in run.stderr
