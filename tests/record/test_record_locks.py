"""The recorder's lock never turns a program's end into a hang. Its hooks ask ggml functions (a buffer type's
name) while holding the lock that orders the recording's chunks: a GGML_ASSERT there reaches the recorder's
own ggml_abort, which must write the pending lines without waiting for that lock (it used to wait for ever);
and a fork while another thread holds it must not leave the child a lock no thread of its own will release
(the child's first gallocr used to wait for ever). tests/data/record/fake_ggml.c stands in for ggml, with
buffer types that assert or answer slowly; tests/data/record/locks.c is the program."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.traces.sources.record.build import recorder_library
from alloctrace.traces.sources.record.program import RECORD_FOLDER, recorder_env

DATA = Path(__file__).parents[1] / "data" / "record"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the recorder preloads on Linux")


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("locks")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out / "libfake_ggml.so"), str(DATA / "fake_ggml.c")], check=True)
    subprocess.run([cc, "-o", str(out / "locks"), str(DATA / "locks.c"), f"-L{out}", "-l:libfake_ggml.so",
                    f"-Wl,-rpath,{out}", "-lpthread"], check=True)
    return out / "locks"


def run_recorded(program: Path, mode: str, work: Path) -> tuple[int, str, dict[str, list[str]]]:
    """(wait status as subprocess gives it, stderr, each recording's lines by file name); a program still
    running after 60 s (a deadlock: it finishes in well under a second) is killed with what it forked."""
    work.mkdir(mode=0o700)
    proc = subprocess.Popen([str(program), mode], env=recorder_env(recorder_library(), work),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"`locks {mode}` under the recorder did not finish in 60 s: a deadlock")
    folder = work / RECORD_FOLDER
    return proc.returncode, err.decode(), {f.name: f.read_text().split("\n") for f in sorted(folder.iterdir())}


def test_an_assert_inside_a_ggml_function_asked_under_the_lock_aborts_and_keeps_the_lines(program, tmp_path):
    rc, err, recordings = run_recorded(program, "assert", tmp_path / "w")
    assert rc == -signal.SIGABRT, err  # it died as the assert says, and did not hang
    assert "GGML_ASSERT(buft->iface.get_name) failed" in err
    (lines,) = recordings.values()
    # the first gallocr whole, the crash on a line of its own: the line the assert cut short is left out
    assert [line.split(" ", 1)[0] for line in lines] == ["ATREC", "T", "N", "X", ""] and lines[-2] == "X 6"
    assert lines[1].endswith(" FAKE")


def test_a_fork_while_another_thread_holds_the_lock_leaves_the_child_free_to_record(program, tmp_path):
    rc, err, recordings = run_recorded(program, "fork", tmp_path / "w")
    assert rc == 0, err
    assert len(recordings) == 2  # the program's and its child's, each with its gallocr and buffer type
    for lines in recordings.values():
        assert lines[1].endswith(" FAKE") and lines[1].startswith("T ") and lines[2].startswith("N ")
