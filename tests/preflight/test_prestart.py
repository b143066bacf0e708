"""The first programs of a sweep, started by the entry point before the command imports itself
(traces/preflight/prestart.py): which command lines it reads, that the command takes over exactly the programs
it would have started, that anything else stops them, and that a sweep's answer is the same either way."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alloctrace.traces.preflight import prestart
from alloctrace.traces.preflight.vary import parse_vary, points, with_values
from alloctrace.traces.sources.record.build import recorder_library
from sweep_program import expected_bytes

HERE = Path(__file__).resolve().parents[1]
PROGRAM = [sys.executable, str(HERE / "sweep_program.py")]
# a shell that notes, as soon as it starts, whether the command had loaded ctypes (the compiled replay's loader,
# which the command loads before it starts any program itself: absent means the entry point started this one),
# then runs the program it is given
EARLY = 'if grep -q _ctypes /proc/$PPID/maps; then w=late; else w=early; fi; echo $w > "$NOTES/$$"; exec "$@"'
# the sweep's program under it, noting when it ran
NOTING = """
import atexit, os, sys, time
began = time.monotonic()
def note_span():
    with open(os.path.join(os.environ["NOTES"], f"span-{os.getpid()}"), "w") as f:
        f.write(f"{began} {time.monotonic()}")
atexit.register(note_span)
sys.argv[0] = sys.argv.pop(1)
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"), {"__name__": "__main__", "__file__": sys.argv[0]})
"""


@pytest.mark.parametrize("argv", [
    ["sweep", "--vary=-c=1,2", "--", "prog"],
    ["sweep", "--vary", "-c=1,2", "-j", "2", "--json", "--", "prog", "-v"],
    ["sweep", "-j2", "--jobs=3", "--name", "n", "--store=s", "--tag", "a=b", "--vary=-c=1", "--", "prog"],
])
def test_a_sweep_it_reads_in_full(argv):
    texts, _jobs, program = prestart.sweep_argv(argv)
    assert texts and program[0] == "prog"


@pytest.mark.parametrize("argv", [
    ["sweep", "--preset", "llama-7b", "--profile", "ggml-head"],  # another mode
    ["sweep", "--vary=-c=1,2", "prog"],  # no --: argparse decides where the program starts
    ["sweep", "--help", "--vary=-c=1", "--", "prog"],
    ["sweep", "--var=-c=1", "--", "prog"],  # an abbreviation argparse takes: left to argparse
    ["sweep", "--", "prog"],  # nothing varied
    ["record", "--", "prog"],
])
def test_anything_else_starts_nothing(argv):
    assert prestart.sweep_argv(argv) is None


def expected_argvs(program: list[str], texts: list[str]) -> list[list[str]]:
    return [[program[0], *with_values(program, v)[1:]] for v in points([parse_vary(t) for t in texts])]


def test_the_command_takes_over_the_programs_it_would_have_started():
    texts = ["-c=64,128,192,256"]
    prestart.begin(["sweep", f"--vary={texts[0]}", "-j", "2", "--", *PROGRAM, "-nh", "2"])
    try:
        started = prestart._started
        assert started is not None and len(started.running) == 2
        deadline = time.monotonic() + 60
        while len(started.running) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)  # ended programs are followed by the next points' (two at a time)
        assert sum(1 for p in started.running.values() if p.poll() is None) <= 2  # never more than -j at once
        taken = prestart.take(expected_argvs([*PROGRAM, "-nh", "2"], texts), recorder_library(), 2)
        assert taken is started and prestart._started is None
        assert len(taken.running) >= 3
        for k, proc in taken.running.items():
            assert proc.wait() == 0
            assert list((Path(taken.folder) / str(k) / "rec").glob("rec-*.atrec"))  # recorded, into its point's folder
    finally:
        prestart.abandon()
        if started is not None:
            started.stop()
    assert not Path(started.folder).exists()


def test_a_different_sweep_stops_what_was_started():
    prestart.begin(["sweep", "--vary=-c=64,128", "-j", "2", "--", *PROGRAM])
    started = prestart._started
    assert started is not None
    procs = list(started.running.values())
    assert prestart.take(expected_argvs(PROGRAM, ["-c=64,256"]), recorder_library(), 2) is None
    assert all(p.returncode is not None for p in procs)  # killed and reaped
    assert not Path(started.folder).exists()


def test_pure_python_or_asked_not_to_starts_nothing(monkeypatch):
    for var, value in (("ALLOCTRACE_PURE_PYTHON", "1"), ("ALLOCTRACE_PRESTART", "0")):
        monkeypatch.setenv(var, value)
        prestart.begin(["sweep", "--vary=-c=64,128", "--", *PROGRAM])
        assert prestart._started is None
        monkeypatch.delenv(var)


def command(args: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path), **env}, cwd=tmp_path)


def test_a_sweep_started_early_answers_as_one_started_late(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    noting = tmp_path / "noting.py"
    noting.write_text(NOTING)
    args = ["sweep", "--json", "--vary=-ub=32,64,96", "--vary=-fa=off", "-j", "2", "--",  # (sh has a -c of its own)
            "/bin/sh", "-c", EARLY, "sh", sys.executable, str(noting), str(HERE / "sweep_program.py"), "-nh", "2"]
    answers = {}
    for mode in ("1", "0"):
        run = command([*args[:1], "--store", str(tmp_path / f"s{mode}"), *args[1:]], tmp_path,
                      NOTES=str(notes), ALLOCTRACE_PRESTART=mode)
        assert run.returncode == 0, run.stderr
        answers[mode] = [(p["values"], p["buffers"], p["consistent"]) for p in json.loads(run.stdout)["points"]]
        when = sorted(f.read_text().strip() for f in notes.iterdir() if not f.name.startswith("span-"))
        spans = [tuple(map(float, f.read_text().split())) for f in notes.iterdir() if f.name.startswith("span-")]
        at_once = max(sum(1 for b, e in spans if b <= t < e) for t, _ in spans)
        assert len(spans) == 3 and at_once <= 2, spans  # -j 2: never more than two programs at once
        for f in notes.iterdir():
            f.unlink()
        # early: the first programs started before the command loaded what it reads with; without: none did
        assert ("early" in when) if mode == "1" else when == ["late"] * 3, (mode, when)
    assert answers["1"] == answers["0"]
    assert [b for _, b, _ in answers["1"]] == [{"CPU": expected_bytes(256, ub, 2)} for ub in (32, 64, 96)]
    assert not list(tmp_path.glob("alloctrace-sweep-*"))  # the folder went with the sweep


def test_a_command_that_fails_after_they_started_leaves_nothing_running(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    noting = tmp_path / "noting.py"
    noting.write_text(NOTING)
    run = command(["sweep", "--tag", "not a tag", "--vary=-c=64,128", "-j", "2", "--", sys.executable, str(noting),
                   str(HERE / "sweep_program.py")], tmp_path, NOTES=str(notes))
    assert run.returncode == 2 and "tag" in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1  # one line
    assert not list(tmp_path.glob("alloctrace-sweep-*"))
    for f in notes.iterdir():  # whatever was started has ended (stopped at exit, not left running)
        pid = int(f.name.removeprefix("span-"))
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
