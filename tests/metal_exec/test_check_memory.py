"""`check --numeric` estimates its memory before allocating any, and refuses runs that would not fit."""
from __future__ import annotations

import re
import time
import tracemalloc

import pytest

from alloctrace.cli import main
from alloctrace.metal_exec.execute import estimate_bytes, run
from alloctrace.traces.replay.run import preset_plans

SMALL_LLAMA = {"n_layer": "1", "n_embd": "128", "n_head": "4", "n_head_kv": "4", "n_ff": "344", "n_vocab": "256"}


@pytest.mark.parametrize("preset, hparams", [("gpt2-tiny", {}), ("llama-7b", SMALL_LLAMA)])
def test_estimate_covers_the_measured_peak(preset, hparams):
    plan = preset_plans(preset, "ggml-2023-08-28", metal_concurrency=True, hparams=hparams)[0]
    estimate = estimate_bytes(plan)
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    try:
        run(plan)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= estimate <= 2 * peak


def test_too_large_a_run_is_refused_at_once_with_the_estimate(capsys):
    expected = estimate_bytes(preset_plans("llama2-70b", "ggml-2023-08-28", metal_concurrency=True)[0])
    t0 = time.monotonic()
    rc = main(["check", "--preset", "llama2-70b", "--profile", "ggml-2023-08-28", "--metal-concurrency",
               "--numeric", "--max-memory", "1G"])
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert elapsed < 15
    [line] = err.splitlines()
    assert line.startswith("alloctrace: error: --numeric would allocate")
    assert f"({expected:,} bytes)" in line and "1.00 GiB allowed (--max-memory)" in line
    assert "a reduced llama2-70b fits: --hparam" in line


def test_the_suggested_reduction_fits_and_runs(capsys):
    cap = estimate_bytes(preset_plans("gpt2-tiny", "ggml-2023-08-28")[0]) // 2
    assert main(["check", "--preset", "gpt2-tiny", "--numeric", "--max-memory", str(cap)]) == 2
    err = capsys.readouterr().err
    flags = re.search(r"fits: ((?:--hparam \S+ ?)+)", err).group(1).split()
    assert main(["check", "--preset", "gpt2-tiny", "--numeric", "--max-memory", str(cap), *flags]) == 0
    out = capsys.readouterr().out
    assert "numeric run equals the reference" in out


def test_memory_cap_needs_numeric_and_a_size(capsys):
    assert main(["check", "--preset", "gpt2-tiny", "--max-memory", "1G"]) == 2
    assert "add --numeric" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["check", "--preset", "gpt2-tiny", "--numeric", "--max-memory", "lots"])
    assert e.value.code == 2


def test_a_numeric_run_shows_progress_on_a_terminal():
    import os
    import subprocess
    import sys

    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "100"}  # rich draws its bar as on a terminal
    res = subprocess.run([sys.executable, "-m", "alloctrace", "check", "--preset", "gpt2-tiny", "--numeric"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    plan = preset_plans("gpt2-tiny", "ggml-2023-08-28")[0]
    total = 2 * len(plan.graph.nodes)
    assert "numeric run, graph 1" in res.stderr and f"{total}/{total}" in res.stderr
    assert "numeric run equals the reference" in res.stdout
