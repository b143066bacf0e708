"""A sweep ended by a signal kills its programs and what they started (each runs in a process group of its
own), removes its temporary folders, and says that it was stopped, with an exit status of 128 + the signal."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SLEEPER = Path(__file__).parent / "data" / "record" / "sleeper.sh"
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
    """pure 1: no compiled replay, the programs run in forked workers."""
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PIDS": str(pids), "TMPDIR": str(tmp), "ALLOCTRACE_PURE_PYTHON": pure}
    cmd = [sys.executable, "-m", "alloctrace", "sweep", "--store", str(tmp_path / "s"), "--vary=-c=1,2,3,4", "-j", "2",
           "--", str(SLEEPER)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (not pids.exists() or len(pids.read_text().split()) < 4) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) >= 4 and all(alive(p) for p in started)
        time.sleep(0.5)  # wherever the command is by now
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.startswith("alloctrace: error: sweep ") and err.count("\n") == 1, err
    assert "stopped by signal" in err or "interrupted" in err
    assert "0 of 4 points were stored" in err or "before any point was stored" in err
    deadline = time.monotonic() + 10
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in started if alive(p)], "programs of the stopped sweep still run"
    assert list(tmp.iterdir()) == []  # no sweep folder, no record folder, no build folder left
