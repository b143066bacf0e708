"""A sweep ended by a signal kills its programs and what they started (each runs in a process group of its
own), removes its temporary folders, says that it was stopped, with an exit status of 128 + the signal, and
the points it stored read as those of a stopped sweep."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alloctrace.traces.preflight.sweeps import load, sweep_ids
from alloctrace.traces.store.store import open_store

SLEEPER = Path(__file__).parents[1] / "data" / "record" / "sleeper.sh"
SWEEP_PROGRAM = Path(__file__).parents[1] / "sweep_program.py"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sweeps record on Linux")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("sig,pure", [(signal.SIGTERM, "0"), (signal.SIGHUP, "0"), (signal.SIGINT, "0"),
                                      (signal.SIGTERM, "1")])
def test_a_stopped_sweep_kills_its_programs_removes_its_folders_and_says_so(tmp_path, sig, pure):
    """Point c=1 ends at once and is stored; c=2 and c=3 run until killed. pure 1: no compiled replay, the
    programs run in forked workers."""
    pids, tmp, err_file = tmp_path / "pids", tmp_path / "tmp", tmp_path / "stderr"
    tmp.mkdir()
    env = {**os.environ, "PIDS": str(pids), "TMPDIR": str(tmp), "ALLOCTRACE_PURE_PYTHON": pure,
           "PYTHON": sys.executable, "SWEEP_PROGRAM": str(SWEEP_PROGRAM)}
    cmd = [sys.executable, "-m", "alloctrace", "sweep", "--store", str(tmp_path / "s"), "--vary=-c=1,2,3", "-j", "2",
           "--", str(SLEEPER)]
    with open(err_file, "w") as err_out:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err_out)
    try:
        # compiled replay: this process runs the points and stores c=1 while c=2 and c=3 run; without it the
        # first two points run while the readers are imported, and the workers fork once those end (never)
        want, stored_first = (4, "[1/3]") if pure == "0" else (2, "")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                pids.exists() and len(pids.read_text().split()) >= want and stored_first in err_file.read_text()):
            time.sleep(0.05)
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) >= want and all(alive(p) for p in started), err_file.read_text()
        proc.send_signal(sig)
        try:
            proc.wait(timeout=120)    # (a loaded CI machine has been slow here: the diagnosis says where it was)
        except subprocess.TimeoutExpired:
            where = {k: Path(f"/proc/{proc.pid}/{k}").read_text(errors="replace")[:400] for k in ("wchan", "status")}
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
            pytest.fail(f"the sweep did not end after signal {sig}: {where}; children {children!r}; stderr "
                        f"{err_file.read_text()[-2000:]!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err_file.read_text()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err
    listed = sweep_ids(open_store(tmp_path / "s"))
    stored, sid = (1, listed[0]["sweep"]) if pure == "0" else (0, err.split()[3])
    assert [(x["points"], x["stopped"]) for x in listed] == ([(1, name)] if stored else [])
    assert err.splitlines()[-1] == (
        f"alloctrace: error: sweep {sid} stopped by signal {int(sig)} ({name}) after {stored} of 3 points were "
        f"stored (tagged sweep={sid} and sweep-stopped={name}); its programs were killed"), err
    if stored:
        assert load(open_store(tmp_path / "s"), sid)["stopped"] == name
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in started if alive(p)], "programs of the stopped sweep still run"
    assert list(tmp.iterdir()) == []  # no sweep folder, no record folder, no build folder left


def test_a_sweep_stopped_before_the_command_took_its_programs_over_says_so(tmp_path):
    """The first programs start before the command has imported itself (prestart.py): a signal then ends them
    and the command at once."""
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PIDS": str(pids), "TMPDIR": str(tmp), "ALLOCTRACE_PURE_PYTHON": "0"}
    code = ("import os, sys, time; from alloctrace.traces.preflight import prestart; prestart.begin(sys.argv[1:]); "
            "print(len(prestart._started.running), flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", "--store", str(tmp_path / "s"), "--vary=-c=2,3",
                             "-j", "2", "--", str(SLEEPER)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "2"
    deadline = time.monotonic() + 60
    while (not pids.exists() or len(pids.read_text().split()) < 4) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(p) for p in pids.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err == "alloctrace: error: sweep stopped by signal 15 before any point was stored; its programs were killed\n"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in started if alive(p)]
    assert list(tmp.iterdir()) == []
