"""`alloctrace record` of Python programs: the sitecustomize hook's logic, run for real in child processes
against a stand-in `torch` (tests/data/faketorch) that keeps a history only while recording is on."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store
from alloctrace.traces.sources.record.program import is_python_program
from alloctrace.traces.store.torch_stored import device_columns, device_info

FAKE = Path(__file__).parents[1] / "data" / "faketorch"


@pytest.fixture
def fake_torch(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(FAKE))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)


def program(tmp_path, body: str) -> Path:
    p = tmp_path / "train.py"
    p.write_text(body if body.startswith("import") else textwrap.dedent(body))
    return p


def record(tmp_path, prog, *opts):
    return main(["record", "--store", str(tmp_path / "store"), *opts, "--", sys.executable, str(prog)])


def only_trace(tmp_path):
    store = open_store(str(tmp_path / "store"))
    [t] = store.list()
    return store, t["id"]


TRAIN = textwrap.dedent("""\
    import os, torch
    calls = torch.ALLOCATOR.calls
    # importing torch touches no CUDA: no history call, no device query, the hook gone from the environment
    assert calls == [] and torch.is_available_calls == [] and not torch.cuda.is_initialized(), calls
    assert not [k for k in os.environ if k.startswith("ALLOCTRACE_TORCH")], os.environ
    assert "sources/torch/hook" not in os.environ.get("PYTHONPATH", ""), os.environ["PYTHONPATH"]
    a = torch.empty(3 << 20)
    assert len(calls) == 1 and calls[0]["entries_before"] == 0, calls   # on before the first allocation
    print("stacks", calls[0]["stacks"], "max", calls[0]["max_entries"])
    b = torch.empty(1000)
    a.free()
    print("trained")
""")


def test_records_from_import_and_dumps_at_exit(tmp_path, fake_torch, capfd):
    prog = program(tmp_path, TRAIN + "raise SystemExit(3)\n")
    assert record(tmp_path, prog, "--torch", "--stacks", "all", "--max-entries", "5000") == 3
    out, err = capfd.readouterr()
    assert "stacks all max 5000" in out and "trained" in out  # the program's output passes through
    assert "dumped at exit" in err
    store, tid = only_trace(tmp_path)
    cols = device_columns(store, tid, 0)
    assert cols["action"].tolist() == [3, 0, 3, 0, 1, 2]  # segment_alloc, alloc x2, then a's two frees
    assert cols["size"].tolist()[1] == 3 << 20
    assert device_info(store, tid, 0)["peak_requested"] == (3 << 20) + 1000


def test_uncaught_oom_dumps_then_the_traceback_shows(tmp_path, fake_torch, capfd):
    prog = program(tmp_path, TRAIN + "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n")
    assert record(tmp_path, prog, "--torch") == 1
    _, err = capfd.readouterr()
    assert "dumped at oom" in err and "OutOfMemoryError: CUDA out of memory" in err
    store, tid = only_trace(tmp_path)
    assert len(device_columns(store, tid, 0)["action"]) == 6


def test_sigterm_dumps_and_the_program_still_dies_of_it(tmp_path, fake_torch, capfd):
    prog = program(tmp_path, TRAIN + "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n"
                   "print('survived')\n")
    assert record(tmp_path, prog, "--torch") == 128 + 15
    out, err = capfd.readouterr()
    assert "survived" not in out and "dumped at sigterm" in err
    store, tid = only_trace(tmp_path)
    assert device_info(store, tid, 0)["peak_requested"] == (3 << 20) + 1000


def test_the_programs_own_sigterm_handler_still_runs(tmp_path, fake_torch, capfd):
    prog = program(tmp_path, """
        import os, signal, sys
        import torch
        signal.signal(signal.SIGTERM, lambda *a: (print("own handler"), sys.exit(7)))
        torch.empty(4096)
        os.kill(os.getpid(), signal.SIGTERM)
    """)
    # the program set its handler after import torch, before its first CUDA use, where the hook arms its own:
    # the hook dumps, then hands the signal on to the program's handler
    assert record(tmp_path, prog, "--torch") == 7
    out, err = capfd.readouterr()
    assert "own handler" in out and "dumped at sigterm" in err


def test_processes_with_ranks_make_one_trace_with_a_device_per_rank(tmp_path, fake_torch, capfd):
    worker = program(tmp_path, """
        import os, torch
        rank = int(os.environ["RANK"])
        torch.empty((rank + 1) << 20)
    """)
    (tmp_path / "distributed").mkdir()
    launcher = tmp_path / "distributed" / "run.py"  # named like torch's launcher: it hands the hook on
    launcher.write_text(textwrap.dedent(f"""
        import os, subprocess, sys
        import torch  # a launcher that imports torch but allocates nothing writes no snapshot
        procs = [subprocess.Popen([sys.executable, {str(worker)!r}], env={{**os.environ, "RANK": str(r),
                 "WORLD_SIZE": "2"}}) for r in (1, 0)]
        sys.exit(max(p.wait() for p in procs))
    """))
    assert record(tmp_path, launcher, "--name", "ddp") == 0
    _, err = capfd.readouterr()
    assert "rank 0" in err and "rank 1" in err
    store, tid = only_trace(tmp_path)
    s = store.summary(tid)
    assert s["name"] == "ddp" and [g["index"] for g in s["graphs"]] == [0, 1]
    for r in (0, 1):
        info = device_info(store, tid, r)
        assert info["rank"] == r and info["peak_requested"] == (r + 1) << 20


def test_a_shadowed_sitecustomize_still_runs(tmp_path, fake_torch, monkeypatch, capfd):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    monkeypatch.setenv("PYTHONPATH", f"{FAKE}{os.pathsep}{theirs}")
    prog = program(tmp_path, TRAIN + "import os\nprint('theirs', os.environ.get('THEIRS_RAN'))\n")
    assert record(tmp_path, prog, "--torch") == 0
    assert "theirs 1" in capfd.readouterr().out


def test_nothing_recorded_is_one_line_and_the_status(tmp_path, fake_torch, capfd):
    prog = program(tmp_path, "print('no torch here')\n")
    assert record(tmp_path, prog, "--torch") == 2
    err = capfd.readouterr().err
    assert "alloctrace: error: no CUDA memory was recorded: the program never imported torch\n" in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert record(tmp_path, prog) == 2  # both recorders: it says torch was never imported, not only ggml
    err = capfd.readouterr().err
    assert "never imported torch; nor did it use ggml's graph allocator" in err, err
    prog = program(tmp_path, "import torch\nraise SystemExit(4)\n")  # imported, allocated nothing
    assert record(tmp_path, prog, "--torch") == 4
    assert "imported torch but CUDA was not available to it or it allocated nothing" in capfd.readouterr().err


def test_output_file_is_the_snapshot_pickle(tmp_path, fake_torch, capfd):
    prog = program(tmp_path, TRAIN)
    out = tmp_path / "snap.pickle"
    assert record(tmp_path, prog, "--torch", "-o", str(out)) == 0
    capfd.readouterr()
    assert not (tmp_path / "store").exists() or not open_store(str(tmp_path / "store")).list()
    assert main(["import", "--store", str(tmp_path / "s2"), "--json", str(out)]) == 0
    report = json.loads(capfd.readouterr().out)
    assert report["traces"][0]["devices"][0]["peak_requested"] == (3 << 20) + 1000


def test_which_programs_are_python(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/usr/bin/env python3\nprint(1)\n")
    assert is_python_program([sys.executable, "x.py"]) and is_python_program(["torchrun", "x.py"])
    assert is_python_program(["env", "A=1", "python3.12", "-m", "m"]) and is_python_program([str(script)])
    assert not is_python_program(["/bin/ls"]) and not is_python_program(["./llama-cli"])
