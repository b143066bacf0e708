"""Ctrl-C during `alloctrace record`: the program gets it (same process group, SIGINT at its default), the
command sits it out and reports how the program ended. A program must not inherit an ignored SIGINT from
the command (exec keeps ignored signals ignored: Ctrl-C would never stop it, and a Python program would never
raise KeyboardInterrupt), unless the command itself was started with SIGINT ignored (nohup, a background job),
which a shell passes on too. Both ways the program can start: by the entry point early, and by the command."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

SIGINT_BIT = 1 << (signal.SIGINT - 1)
# a program that notes the signals it ignores, says it is ready, and waits (a ggml program in all but name:
# --ggml records only the graph allocator, which it never uses)
WAITER = ("import sys, time; ignored = int(open('/proc/self/status').read().split('SigIgn:')[1].split()[0], 16); "
          "print(ignored, flush=True); time.sleep(60)")


def start_record(tmp_path, early: bool, sigint) -> subprocess.Popen:
    # TMPDIR: a command killed by the test (SIGKILL) leaves its run's folder there, not in the system's
    env = {**os.environ, "ALLOCTRACE_PRESTART": "1" if early else "0", "TMPDIR": str(tmp_path)}

    def as_a_shell_would():
        signal.signal(signal.SIGINT, sigint)

    return subprocess.Popen([sys.executable, "-m", "alloctrace", "record", "--ggml", "--store",
                             str(tmp_path / "store"), "--", sys.executable, "-c", WAITER],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True, preexec_fn=as_a_shell_would)


@pytest.mark.parametrize("early", [True, False], ids=["started-early", "started-by-the-command"])
def test_ctrl_c_stops_the_recorded_program_and_the_command_reports_it(tmp_path, early):
    rec = start_record(tmp_path, early, signal.SIG_DFL)
    try:
        ignored = int(rec.stdout.readline())
        assert not ignored & SIGINT_BIT  # the program was started with SIGINT at its default
        t0 = time.monotonic()
        os.killpg(rec.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, err = rec.communicate(timeout=30)
    finally:
        if rec.poll() is None:
            os.killpg(rec.pid, signal.SIGKILL)
    assert time.monotonic() - t0 < 20  # the program stopped, not its minute of sleep
    # the program (Python) raised KeyboardInterrupt and ended by SIGINT; the command sat Ctrl-C out, said so
    # in one line and returned the program's status as a shell reports it
    program_part, _, command_part = err.partition("alloctrace: error:")
    assert "KeyboardInterrupt" in program_part and "Traceback" not in command_part
    assert "killed by SIGINT" in command_part and command_part.count("\n") <= 1, err
    assert rec.returncode == 128 + signal.SIGINT


@pytest.mark.parametrize("early", [True, False], ids=["started-early", "started-by-the-command"])
def test_a_command_started_with_sigint_ignored_passes_that_on(tmp_path, early):
    rec = start_record(tmp_path, early, signal.SIG_IGN)
    try:
        ignored = int(rec.stdout.readline())
        assert ignored & SIGINT_BIT
    finally:
        os.killpg(rec.pid, signal.SIGKILL)
        rec.wait()
