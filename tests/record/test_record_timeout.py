"""`alloctrace record --timeout`: a program that runs too long is stopped, and what it recorded until then is
stored (real ggml through ggml-python, tests/record_program.py told to hang after two graphs)."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store
from record_program import encode

PROGRAM = Path(__file__).parents[1].joinpath("record_program.py")


def _chain(n):
    from realggml import Program, Ref, Step

    return Program((Step("new_tensor_1d", ("f32", n), "x", input=True), Step("silu", (Ref(0),), "y"),
                    Step("mul", (Ref(1), Ref(0)), "z", output=True)), (2,))


def test_a_program_past_its_timeout_is_stopped_and_what_it_recorded_is_stored(tmp_path, capsys):
    spec, out, store_dir = tmp_path / "spec.json", tmp_path / "out.json", tmp_path / "store"
    spec.write_text(json.dumps({"mode": "gallocr", "programs": [encode(_chain(n)) for n in (8, 64, 512)],
                                "hang_after": 2}))
    rc = main(["record", "--timeout", "20", "--store", str(store_dir), "--", sys.executable, str(PROGRAM),
               str(spec), str(out)])
    err = capsys.readouterr().err
    assert Path(f"{out}.hung").exists()             # it got as far as the hang, two graphs allocated
    assert rc == 124
    assert "the program ran past --timeout 20 s and was stopped (SIGTERM); what it recorded until then is kept" \
        in err
    store = open_store(store_dir)
    (summary,) = store.list()
    trace = store.summary(summary["id"])
    evals = [g for g in trace["graphs"] if g["role"] == "eval"]
    assert len(evals) == 2 and all(g["consistent"] for g in trace["graphs"])
    assert store.meta(summary["id"]).extra["recording"]["exit_status"] == 128 + signal.SIGTERM


@pytest.mark.parametrize("value", ["0", "-3", "nan"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_one_line(value, capsys):
    rc = main(["record", "--timeout", value, "--", sys.executable, "-c", "pass"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--timeout wants a number of seconds above 0" in err[0]


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, capsys, monkeypatch):
    """Nothing recorded (a Python program that never imports torch): the timeout's line, then why nothing was
    stored; still exit 124. The grace is shortened from 10 s to 1 s here."""
    from alloctrace.traces.sources.record import run as record_run

    monkeypatch.setattr(record_run, "GRACE_S", 1.0)
    rc = main(["record", "--timeout", "3", "--store", str(tmp_path / "store"), "--", sys.executable, "-c",
               "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
    err = capsys.readouterr().err
    assert rc == 124
    assert "the program ran past --timeout 3 s and was stopped (SIGKILL)" in err
    assert "alloctrace: error:" in err
