"""`alloctrace record`'s program, started by the entry point before the command imports itself
(traces/sources/early.py): which command lines it reads, that the command takes over exactly the program it
would have started, that anything else stops it, and that the program runs and is recorded as when the
command starts it itself (same answer, exit status, output, descriptors, signal dispositions)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.traces.sources import early
from alloctrace.traces.sources.record.build import recorder_library
from alloctrace.traces.store.store import open_store
from sweep_program import expected_bytes

HERE = Path(__file__).resolve().parents[1]
PROGRAM = [sys.executable, str(HERE / "sweep_program.py"), "-nh", "2"]
# a shell that notes whether the command had loaded ctypes when it started (the compiled replay's loader, which
# the command loads before it starts the program itself: absent means the entry point started it), the
# descriptors it was given and the signals it ignores; then runs the program it is given and exits with EXIT
NOTING = ('if grep -q _ctypes /proc/$PPID/maps; then echo late; else echo early; fi > "$NOTES/when"; '
          'ls /proc/$$/fd > "$NOTES/fds"; grep SigIgn /proc/$$/status > "$NOTES/ignored"; '
          '"$@"; exit ${EXIT:-$?}')


@pytest.mark.parametrize("argv", [
    ["record", "--", "prog"],
    ["record", "--store", "s", "--name=n", "--tag", "a=b", "--tag=c=d", "--ggml", "--", "prog", "-v", "--", "x"],
])
def test_a_record_command_line_it_reads_in_full(argv):
    line = early.record_argv(argv)
    assert line.program[0] == "prog" and line.program[1:] == argv[argv.index("--") + 2:]
    assert line.tags == (["a=b", "c=d"] if "--tag" in argv else [])
    assert (line.store, line.name, line.ggml) == (("s", "n", True) if "--tag" in argv else (None, None, False))


@pytest.mark.parametrize("argv", [
    ["record", "prog"],  # no --: argparse decides where the program starts
    ["record", "-o", "out.rec", "--", "prog"],  # nothing stored: the ordinary way
    ["record", "--torch", "--", "prog"],
    ["record", "--help", "--", "prog"],
    ["record", "--stor", "s", "--", "prog"],  # an abbreviation argparse takes: left to argparse
    ["record", "--store", "--", "prog"],  # a missing value
    ["record", "--"],  # no program
    ["sweep", "--vary=-c=1", "--", "prog"],
])
def test_anything_else_starts_nothing(argv):
    assert early.record_argv(argv) is None


def test_pure_python_or_asked_not_to_or_a_bad_tag_starts_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for var, value in (("ALLOCTRACE_PRESTART", "0"), ("ALLOCTRACE_PURE_PYTHON", "1")):
        monkeypatch.setenv(var, value)
        early.begin(["record", "--", "/bin/true"])
        assert early._started is None
        monkeypatch.delenv(var)
    early.begin(["record", "--tag", "not a tag", "--", "/bin/true"])
    assert early._started is None
    early.begin(["record", "--", *PROGRAM])  # a Python program: the command adds the PyTorch hook
    assert early._started is None
    assert not list(tmp_path.iterdir())


def test_the_command_takes_over_the_program_it_would_have_started(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    early.begin(["record", "--ggml", "--", *PROGRAM])
    started = early._started
    try:
        assert started is not None
        taken = early.take(PROGRAM, recorder_library(), torch=False)
        assert taken is started and early._started is None
        assert taken.wait() == 0
        assert list((Path(taken.folder) / "rec").glob("rec-*.atrec"))  # recorded, into its own folder
    finally:
        started.stop()
    assert not Path(started.folder).exists()


@pytest.mark.parametrize("other", ["argv", "torch", "environment"])
def test_a_different_program_stops_what_was_started(monkeypatch, tmp_path, other):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    early.begin(["record", "--", "/bin/sleep", "30"])
    started = early._started
    assert started is not None and started.returncode is None
    if other == "environment":
        monkeypatch.setenv("ALLOCTRACE_SOMETHING_NEW", "1")
    argv = ["/bin/sleep", "31" if other == "argv" else "30"]
    assert early.take(argv, recorder_library(), torch=other == "torch") is None
    assert started.returncode == -9 and not Path(started.folder).exists()


def command(args: list[str], tmp_path: Path, inherited=(), **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path), **env}, cwd=tmp_path, pass_fds=inherited)


def test_a_program_started_early_runs_and_is_recorded_as_one_started_late(tmp_path):
    answers = {}
    spare = os.open(os.devnull, os.O_RDONLY)  # a descriptor alloctrace inherits: the program never gets it
    try:
        for mode in ("1", "0"):
            notes = tmp_path / f"notes{mode}"
            notes.mkdir()
            run = command(["record", "--store", str(tmp_path / f"s{mode}"), "--tag", "k=v", "--", "/bin/sh", "-c",
                           NOTING, "sh", *PROGRAM], tmp_path, NOTES=str(notes), EXIT="3",
                          ALLOCTRACE_PRESTART=mode, inherited=(spare,))
            assert run.returncode == 3, run.stderr  # the program's exit status
            assert "CPU compute buffer size" in run.stdout  # its output passes through
            (trace,) = open_store(str(tmp_path / f"s{mode}")).list()
            answers[mode] = (trace["name"], trace["tags"], [(g["role"], g["buffer_size"], g["consistent"])
                                                            for g in trace["graphs"]],
                             (notes / "fds").read_text(), (notes / "ignored").read_text())
            assert (notes / "when").read_text().strip() == ("early" if mode == "1" else "late")
            assert run.stderr.splitlines()[-1].split()[1] == "sh"  # the table of what was stored
    finally:
        os.close(spare)
    assert answers["1"] == answers["0"]
    assert answers["1"][2][0][1] == expected_bytes(256, 64, 2)
    assert not list(tmp_path.glob("alloctrace-rec-*"))  # the folder went with the command


def test_a_program_that_records_nothing_is_reported_the_same(tmp_path):
    for mode in ("1", "0"):
        run = command(["record", "--store", str(tmp_path / "s"), "--", "/bin/true"], tmp_path,
                      ALLOCTRACE_PRESTART=mode)
        assert run.returncode == 2 and run.stderr.startswith("alloctrace: error: no ggml allocator calls")
    assert not list(tmp_path.glob("alloctrace-rec-*"))


def test_recording_a_ggml_program_imports_nothing_of_the_pytorch_hook_or_the_server(tmp_path):
    """The record path of a program that is not Python does without the PyTorch hook's side (its dataclasses,
    json) and the server's fork server (socket): each costs the fixed part of every recording a few ms."""
    code = ("import sys; from alloctrace.cli import main; "
            f"main(['record', '--store', {str(tmp_path / 's')!r}, '--', 'true']); "
            "print(sorted(m for m in ('alloctrace.traces.sources.torch.recorder', 'socket') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr
    code = code.replace("'true'", f"{sys.executable!r}, '-c', 'pass'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "'alloctrace.traces.sources.torch.recorder'" in out.stdout, out.stderr   # a Python program: the hook



def test_the_runs_folder_is_made_as_tempfile_makes_it_without_tempfile(tmp_path):
    """program.private_folder: in $TMPDIR, mode 0700, without importing tempfile; where $TMPDIR is not
    usable, tempfile's own search (which skips it)."""
    code = ("import os, sys; sys.modules.pop('tempfile', None); "  # a site .pth may have imported it
            "from alloctrace.traces.sources.record.program import private_folder as p; "
            "f = p('alloctrace-rec-'); print(os.path.dirname(f), oct(os.stat(f).st_mode & 0o777), "
            "os.path.basename(f).startswith('alloctrace-rec-'), 'tempfile' in sys.modules); os.rmdir(f)")
    for tmpdir, where, by_tempfile in ((tmp_path, str(tmp_path), "False"), (tmp_path / "missing", None, "True")):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "TMPDIR": str(tmpdir)})
        folder, mode, named, imported = run.stdout.split()
        assert (mode, named, imported) == ("0o700", "True", by_tempfile), run.stderr
        assert folder == where if where else folder != str(tmpdir)


def test_the_runs_folder_is_removed_with_what_the_program_left_but_nothing_a_link_names(tmp_path):
    """program.remove_folder (the run's folder, without shutil): files, folders, links to folders and files
    outside (removed, not followed), a broken link, an empty folder."""
    from alloctrace.traces.sources.record.program import remove_folder

    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("kept")
    folder = tmp_path / "alloctrace-rec-x"
    (folder / "rec" / "deep" / "er").mkdir(parents=True)
    (folder / "rec" / "deep" / "er" / "rec-1.atrec").write_bytes(b"x" * 100)
    (folder / "rec" / "rec-2.atrec").write_bytes(b"y")
    (folder / "empty").mkdir()
    (folder / "rec" / "to-folder").symlink_to(outside / "keep")
    (folder / "to-file").symlink_to(outside / "keep" / "file")
    (folder / "broken").symlink_to(tmp_path / "nothing")
    remove_folder(str(folder))
    assert not os.path.lexists(folder)
    assert (outside / "keep" / "file").read_text() == "kept"
    remove_folder(str(folder))  # gone already: nothing to do, no error


def test_a_command_that_ends_before_taking_the_program_kills_it_and_removes_its_folder(tmp_path):
    """The command fails after the entry point started the program (here: it raises before `take`): the
    program is killed (it would sleep 30 s) and its folder removed, at exit."""
    code = ("import sys; from alloctrace.traces.sources import early; "
            "early.begin(['record', '--', '/bin/sleep', '30']); s = early._started; "
            "print(s.proc.pid, s.folder, flush=True); raise SystemExit('failed before take')")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 1 and "failed before take" in run.stderr
    pid, folder = run.stdout.split()
    assert Path(folder).parent == tmp_path and not Path(folder).exists()
    try:
        assert b"sleep" not in Path(f"/proc/{pid}/cmdline").read_bytes()  # gone, or its number reused
    except FileNotFoundError:
        pass
    assert not list(tmp_path.iterdir())


def test_a_program_that_cannot_be_executed_is_reported_the_same_either_way(tmp_path):
    """A program file without execute permission passes the early checks but its exec fails: the entry point
    starts nothing (its child's exec error comes back, it is reaped, the folder removed) and the command
    reports it as when it starts the program itself."""
    prog = tmp_path / "not-executable"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o644)
    errors = {}
    for mode in ("1", "0"):
        run = command(["record", "--store", str(tmp_path / "s"), "--", str(prog)], tmp_path,
                      ALLOCTRACE_PRESTART=mode)
        errors[mode] = (run.returncode, run.stderr)
    assert errors["1"] == errors["0"]
    assert errors["1"][0] == 2 and "cannot run" in errors["1"][1] and "Permission denied" in errors["1"][1]
    assert not list(tmp_path.glob("alloctrace-rec-*"))


def test_spawn_starts_the_program_as_subprocess_would(tmp_path):
    """early.spawn against subprocess.Popen: the same exit codes (a signal's as -N), descriptors and ignored
    signals, and an exec that fails raised as the same OSError."""
    spare = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(spare, True)
    script = f'ls /proc/$$/fd > "$1"; grep SigIgn /proc/$$/status >> "$1"; kill -${{2:-0}} $$; exit 7'
    try:
        got = {}
        for how in ("spawn", "popen"):
            out = tmp_path / how
            for sig in ("0", "TERM"):
                argv = ["/bin/sh", "-c", script, "sh", str(out), sig]
                proc = early.spawn(argv, dict(os.environ)) if how == "spawn" else subprocess.Popen(argv)
                got[how, sig] = proc.wait()
            got[how] = out.read_text()
            with pytest.raises(OSError) as e:
                early.spawn([str(tmp_path / "missing")], {}) if how == "spawn" else \
                    subprocess.Popen([str(tmp_path / "missing")])
            got[how, "error"] = (type(e.value), e.value.errno)
    finally:
        os.close(spare)
    assert (got["spawn", "0"], got["spawn", "TERM"]) == (7, -15)
    assert got["spawn", "error"] == (FileNotFoundError, 2)
    assert str(spare) not in got["spawn"].split("\n")[:-2] and "SigIgn" in got["spawn"]
    for what in ("0", "TERM", "error"):
        assert got["spawn", what] == got["popen", what]
    assert got["spawn"] == got["popen"]
