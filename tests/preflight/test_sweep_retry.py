"""A point whose program hung at --timeout (every thread asleep, no CPU used: a deadlock such as llama.cpp's rare
one in its log flush) is run once more and says so; a program that was still computing is not (it is slow, not
stuck); --retry-hung 0 keeps one run per point. Through both paths: programs run and read in this process (the
compiled replay, -j 2) and in forked workers (pure Python, or -j 1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_sweep_runs import _env, _sweep

from alloctrace.traces.preflight.programs import hung_note, is_hung
from alloctrace.traces.preflight.sweeps import load
from alloctrace.traces.store.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sweep_program import expected_bytes  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sweeps record on Linux")
HANGS_ONCE = Path(__file__).parents[1] / "data" / "record" / "hangs_once.py"
FIRST_HUNG = "its first run hung: blocked in futex"
BUSY = "import os\nopen(os.environ['COUNT'], 'a').write('run\\n')\nwhile 1: pass"


def _hangs_once(tmp_path, pure):
    """The environment for HANGS_ONCE (its files in tmp_path/markers) and the files' line counts, by -c."""
    _pids, _tmp, env = _env(tmp_path, pure)
    (tmp_path / "markers").mkdir()
    env["MARKER"] = str(tmp_path / "markers" / "m")

    def runs() -> dict[str, int]:
        return {p.name.rsplit("_", 1)[1]: len(p.read_text().splitlines()) for p in (tmp_path / "markers").iterdir()}
    return env, runs


@pytest.mark.parametrize("pure,jobs", [("0", "2"), ("1", "2"), ("0", "1")])
def test_a_program_that_hangs_on_its_first_run_is_run_again(tmp_path, pure, jobs):
    """Each point's program deadlocks on its first run and ends normally on its second: both points are ok,
    with the second run's exact buffer stored as their trace, and each says its first run hung."""
    env, runs = _hangs_once(tmp_path, pure)
    r = _sweep(tmp_path, env, "--vary=-c=128,256", "-j", jobs, "--timeout", "2", "--json", "--", sys.executable,
               str(HANGS_ONCE), "-nh", "1")
    assert r.returncode == 0, r.stderr + r.stdout
    out = json.loads(r.stdout)
    assert [p["values"]["-c"] for p in out["points"]] == ["128", "256"]  # the points' order is kept
    for p in out["points"]:
        assert p["status"] == "ok" and p["error"] is None and p["trace"]
        assert p["buffers"] == {"CPU": expected_bytes(int(p["values"]["-c"]), 64, 1)}
        assert p["retried"].startswith(FIRST_HUNG) and " in 3 threads, " in p["retried"], p["retried"]
    assert runs() == {"128": 2, "256": 2}
    stored = load(open_store(tmp_path / "s"), out["sweep"])  # the stored traces say it too
    assert [(p["trace"], p["retried"]) for p in stored["points"]] == [(p["trace"], p["retried"]) for p in out["points"]]


def test_the_table_names_the_point_run_again_and_retry_hung_zero_runs_once(tmp_path):
    env, runs = _hangs_once(tmp_path, "0")
    r = _sweep(tmp_path, env, "--vary=-c=128", "--timeout", "2", "--", sys.executable, str(HANGS_ONCE), "-nh", "1")
    assert r.returncode == 0, r.stderr
    (line,) = [line for line in r.stdout.splitlines() if "--retry-hung" in line]
    assert line.startswith("  -c=128: run again (--retry-hung): " + FIRST_HUNG), line
    (said,) = [x for x in r.stderr.splitlines() if x.startswith("[1/1] -c=128: ")]    # the progress line too
    assert said.endswith(")") and f" (run again: {FIRST_HUNG}" in said, said
    assert runs() == {"128": 2}
    (tmp_path / "zero").mkdir()
    env, runs = _hangs_once(tmp_path / "zero", "0")
    r = _sweep(tmp_path / "zero", env, "--vary=-c=128", "--timeout", "2", "--retry-hung", "0", "--json", "--",
               sys.executable, str(HANGS_ONCE), "-nh", "1")
    assert r.returncode == 1
    (p,) = json.loads(r.stdout)["points"]
    assert p["status"] == "timed out" and p["retried"] is None and p["trace"] is None
    assert p["error"].startswith("timed out after 2 s: the program was killed (--timeout); it was blocked in futex")
    assert runs() == {"128": 1}


@pytest.mark.parametrize("pure", ["0", "1"])
def test_a_busy_program_past_its_time_is_not_run_again(tmp_path, pure):
    """A program that computes until it is killed is slow, not stuck: each point runs it once."""
    _pids, _tmp, env = _env(tmp_path, pure)
    env["COUNT"] = str(tmp_path / "runs")
    r = _sweep(tmp_path, env, "--vary=-n=1,2", "-j", "2", "--timeout", "1", "--json", "--", sys.executable, "-c",
               BUSY)
    assert r.returncode == 1
    for p in json.loads(r.stdout)["points"]:
        assert p["status"] == "timed out" and p["retried"] is None
        assert " it was running in 1 thread, " in p["error"], p["error"]
    assert (tmp_path / "runs").read_text() == "run\nrun\n"


def test_fit_runs_a_hung_probe_again(tmp_path):
    """fit's probes at -c 128 and 256 each hang once and are run again; the answer's run (into the store)
    ends at once. JSON and text name the probes run again."""
    env, runs = _hangs_once(tmp_path, "0")
    cmd = [sys.executable, "-m", "alloctrace", "fit", "--store", str(tmp_path / "s"), "--budget", "1GiB",
           "--vary=-c=128..256", "--step", "128", "--timeout", "2", "--json", "--", sys.executable, str(HANGS_ONCE),
           "-nh", "1"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["value"] == 256 and out["point"]["retried"] is None
    assert [p["value"] for p in out["probes"]] == [128, 256]
    assert all(p["retried"].startswith(FIRST_HUNG) for p in out["probes"]), out["probes"]
    assert runs() == {"128": 2, "256": 3}
    from alloctrace.commands.fit import report_lines

    assert [line.split(": run again")[0] for line in report_lines(out) if "--retry-hung" in line] == \
        ["  -c 128", "  -c 256"]


def test_retry_hung_out_of_range_is_one_line(tmp_path):
    _pids, _tmp, env = _env(tmp_path)
    for n in ("-1", "11"):
        r = _sweep(tmp_path, env, "--vary=-c=1", "--retry-hung", n, "--", "true")
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--retry-hung wants 0 to 10" in r.stderr
    assert not (tmp_path / "s").exists()  # refused before a store is made


def test_is_hung_tells_a_sleeping_program_from_a_busy_one():
    asleep = subprocess.Popen(["sleep", "60"])
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        deadline = time.monotonic() + 30
        while not is_hung(asleep.pid) and time.monotonic() < deadline:  # until it sleeps
            time.sleep(0.01)
        assert is_hung(asleep.pid)
        assert not is_hung(busy.pid)
    finally:
        for proc in (asleep, busy):
            proc.kill()
            proc.wait()
    assert not is_hung(asleep.pid)  # gone: nothing to say it hung
    assert hung_note([]) is None and hung_note(["blocked in futex in 2 threads"]) == \
        "its first run hung: blocked in futex in 2 threads"
    assert hung_note(["a", "b"]) == "its first 2 runs hung: a"
