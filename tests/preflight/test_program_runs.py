"""How `alloctrace sweep` and `alloctrace fit` report their programs' runs: a failing program's own last lines
and exit status (not a guess), a hung one killed with its process group at --timeout while the other points
go on, the -j a program's own -t leaves room for, and flags a CPU build ignores named in the answer."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.preflight import ignored, prestart
from alloctrace.traces.store.store import open_store

PROGRAM = [sys.executable, str(Path(__file__).parents[1].joinpath("sweep_program.py"))]
MODEL_ERROR = "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within the file bounds"


def sweep_json(capsys, store: Path, *args) -> tuple[int, dict, str]:
    rc = main(["sweep", "--store", str(store), "--json", *args])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def test_a_failing_program_is_reported_with_its_own_words_and_status(tmp_path, capsys):
    rc, out, _ = sweep_json(capsys, tmp_path, "--vary=-c=64,128", "--", *PROGRAM, "--fail", MODEL_ERROR)
    assert rc == 1
    for p in out["points"]:
        assert p["status"] == "failed" and p["exit_status"] == 3 and p["trace"] is None
        assert MODEL_ERROR in p["error"] and "exited with status 3" in p["error"]
        assert "statically" not in p["error"] and "BUILD_SHARED_LIBS" not in p["error"]
    assert not open_store(tmp_path).list()
    assert main(["sweep", "--store", str(tmp_path), "--vary=-c=64", "--", *PROGRAM, "--fail", MODEL_ERROR]) == 1
    text = capsys.readouterr().out
    assert MODEL_ERROR in text and "nothing stored" in text and "stored as 1 traces" not in text


def test_a_failing_points_tail_is_bounded(tmp_path, capsys):
    rc, out, _ = sweep_json(capsys, tmp_path, "--vary=-c=64", "--", *PROGRAM, "--fail", "x" * 5000 + " the end")
    (p,) = out["points"]
    assert rc == 1 and p["error"].endswith("x the end") and len(p["error"]) < 800


def test_a_fit_probe_that_fails_says_what_the_program_printed(tmp_path, capsys):
    assert main(["fit", "--store", str(tmp_path), "--budget", "1MiB", "--vary=-c=64..128", "--", *PROGRAM,
                 "--fail", MODEL_ERROR]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: fit: the run with -c 64 failed: ") and MODEL_ERROR in err


@pytest.mark.parametrize("jobs, here", [("1", True), ("2", True), ("2", False)])
def test_a_hung_point_times_out_and_the_others_are_stored(tmp_path, capsys, monkeypatch, jobs, here):
    from alloctrace.traces.preflight import points

    monkeypatch.setattr(points, "reads_are_cheap", lambda: here)  # False: forked workers run and read the points
    t0 = time.monotonic()
    rc, out, _ = sweep_json(capsys, tmp_path, "-j", jobs, "--timeout", "3", "--vary=--sleep=0,60,0.01", "--",
                            *PROGRAM, "-c", "64")  # 3 s: the quick points' 0.3 s, on a busy machine
    assert rc == 1 and time.monotonic() - t0 < 30
    ok, hung, ok2 = out["points"]
    assert ok["status"] == ok2["status"] == "ok" and ok["trace"] and ok2["trace"]
    assert hung["status"] == "timed out after 3 s" and hung["trace"] is None and "timed out after 3 s" in hung["error"]
    assert len(open_store(tmp_path).list()) == 2


def test_a_timeout_kills_the_programs_whole_process_group(tmp_path, capsys):
    script = tmp_path / "hangs.sh"
    script.write_text('sleep 60 &\necho $! > "$1.$$"\nwait\n')
    rc, out, _ = sweep_json(capsys, tmp_path / "s", "--timeout", "1", "-j", "2", "--vary=--x=1,2", "--",
                            "/bin/sh", str(script), str(tmp_path / "pid"))
    assert rc == 1 and [p["status"] for p in out["points"]] == ["timed out after 1 s"] * 2
    pids = [int(f.read_text()) for f in tmp_path.glob("pid.*")]
    assert len(pids) == 2
    time.sleep(0.2)
    for pid in pids:  # the program's own child, in its group, is gone too (or a zombie nobody of ours holds)
        try:
            with open(f"/proc/{pid}/stat") as f:
                assert f.read().split(") ")[1][0] == "Z"
        except FileNotFoundError:
            pass


def test_fit_times_out_a_hung_probe(tmp_path, capsys):
    assert main(["fit", "--store", str(tmp_path), "--timeout", "1", "--budget", "1MiB", "--vary=-c=64..128", "--",
                 *PROGRAM, "--sleep", "60"]) == 2
    assert "timed out after 1 s" in capsys.readouterr().err


@pytest.mark.parametrize("seconds", ["-1", "nan"])
def test_a_bad_timeout_is_one_line(tmp_path, capsys, seconds):
    assert main(["sweep", "--store", str(tmp_path), "--timeout", seconds, "--vary=-c=1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: --timeout wants seconds") and err.count("\n") == 1


@pytest.mark.parametrize("cores, argv, jobs", [
    (2, ["p", "-m", "m.gguf"], 1),  # llama.cpp without -t takes every core itself
    (2, ["p", "-t", "1"], 2),
    (2, ["p", "-t=4"], 1),
    (8, ["p", "--threads", "2", "-tb", "4"], 2),
    (16, ["p", "--threads=2"], 8),
    (2, ["/opt/llama/bin/llama-fit-params", "-m", "m.gguf"], 2),  # a dry run computes nothing
])
def test_default_jobs_leave_room_for_the_programs_own_threads(monkeypatch, cores, argv, jobs):
    monkeypatch.setattr(prestart, "cores_available", lambda: cores)
    assert prestart.default_jobs([argv]) == jobs


def test_the_chosen_jobs_are_said_under_verbose(tmp_path, capsys):
    assert main(["sweep", "-v", "--store", str(tmp_path), "--vary=-c=64,128", "--", *PROGRAM, "-nh", "1"]) == 0
    err = capsys.readouterr().err
    assert "programs at once (-j): 1 (default: the program has no -t" in err
    assert main(["sweep", "-v", "--store", str(tmp_path), "--vary=-c=64,128", "--", *PROGRAM, "-nh", "1", "-t",
                 "1"]) == 0
    cores = prestart.cores_available()
    assert f"programs at once (-j): {min(cores, 2)} (default: {cores} cores / 1 threads each)" in \
        capsys.readouterr().err


def test_a_sweep_over_ngl_on_a_cpu_build_says_it_is_ignored(tmp_path, capsys):
    rc, out, _ = sweep_json(capsys, tmp_path, "--vary=-ngl=0,99", "--", *PROGRAM, "-c", "64")
    assert rc == 0
    assert out["ignored"]["flags"] == ["-ngl"] and out["ignored"]["identical"] is True
    assert "ignored by this CPU build: -ngl" in out["ignored"]["message"]
    assert main(["sweep", "--store", str(tmp_path), "--vary=-ngl=0,99", "--", *PROGRAM, "-c", "64"]) == 0
    text = capsys.readouterr().out
    assert "ignored by this CPU build: -ngl" in text and "so they are identical" in text


def test_a_given_gpu_flag_is_named_while_another_flag_varies(tmp_path, capsys):
    rc, out, _ = sweep_json(capsys, tmp_path, "--vary=-c=64,128", "--", *PROGRAM, "-ngl", "99")
    assert rc == 0 and out["ignored"]["flags"] == ["-ngl"] and out["ignored"]["identical"] is None
    rc, out, _ = sweep_json(capsys, tmp_path, "--vary=-c=64,128", "--", *PROGRAM)
    assert out["ignored"] is None


def test_fit_over_ngl_on_a_cpu_build_says_it_is_ignored(tmp_path, capsys):
    assert main(["fit", "--store", str(tmp_path), "--budget", "1MiB", "--vary=-ngl=1..64", "--", *PROGRAM,
                 "-c", "64"]) == 0
    assert "ignored by this CPU build: -ngl" in capsys.readouterr().out


def test_a_gpu_build_is_not_called_cpu_only():
    gpu = [{"buffers": {"CUDA0": 10, "CPU": 2}}, {"buffers": {"CUDA0": 10, "CPU": 2}}]
    assert ignored.ignored(gpu, ["p", "-ngl", "99"], []) is None
    cpu = [{"buffers": {"CPU": 2}}, {"buffers": {"CPU": 3}}]
    got = ignored.ignored(cpu, ["p"], ["-ts"])
    assert got["why"] == "every compute buffer was made on the CPU" and got["identical"] is False
    assert ignored.ignored(cpu, ["p", "-c", "5"], ["-ub"]) is None


@pytest.mark.skipif(not os.environ.get("ALLOCTRACE_LLAMA_BIN"), reason="ALLOCTRACE_LLAMA_BIN is not set")
def test_the_real_cpu_build_ignores_ngl(tmp_path, capsys, monkeypatch):
    binary = Path(os.environ["ALLOCTRACE_LLAMA_BIN"]).resolve()
    model = binary.parent.parent / "models" / "tiny-llama.gguf"
    if not model.exists():
        pytest.skip(f"needs {model}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(binary.parent))
    rc, out, err = sweep_json(capsys, tmp_path, "--vary=-ngl=0,99", "--", str(binary), "-m", str(model), "-p", "hi",
                              "-n", "1", "-no-cnv")
    assert rc == 0, err[-2000:]
    assert out["ignored"]["flags"] == ["-ngl"] and out["ignored"]["identical"] is True
    assert "no usable GPU found" in out["ignored"]["why"]
    rc, out, _ = sweep_json(capsys, tmp_path, "--vary=-c=256", "--", str(binary), "-m", str(tmp_path / "no.gguf"))
    (p,) = out["points"]
    assert rc == 1 and p["status"] == "failed" and "exited with status 1" in p["error"]
    assert "statically" not in p["error"]
    # llama.cpp logs from a thread of its own, which an early exit(1) may end before it wrote anything
    assert "no.gguf" in p["error"] or p["error"].endswith("it printed nothing")
