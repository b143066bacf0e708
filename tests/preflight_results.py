"""A store holding one of each pre-flight result, made by the real commands: a fit and a sweep of the real ggml
program of tests/kv_sweep_program.py (its compute buffer recorded, weights and two KV caches printed), and a
`plan --vary` search of a real PyTorch training step (bench/torch_plan_workloads.py's MLP) when torch is there."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

from alloctrace.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = [sys.executable, str(ROOT / "tests" / "kv_sweep_program.py"), "-ub", "32", "-nh", "2"]
FIT_BUDGET = 47 << 20  # between -c 192 (46.86 MiB) and -c 256 (47.08 MiB)
PLAN_BUDGET = 600 << 20


def _run(args: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def build(store: Path, tmp: Path) -> dict:
    """{"fit": fit --json, "sweep": sweep --json, "plan": plan --vary --json or None}."""
    got = {"fit": _run(["fit", "--store", str(store), "--budget", str(FIT_BUDGET), "--step", "64", "--json",
                        "--vary=-c=64..512", "--", *PROGRAM]),
           "sweep": _run(["sweep", "--store", str(store), "--vary=-c=128,256,512", "--json", "--", *PROGRAM]),
           "plan": None}
    if importlib.util.find_spec("torch") is not None:
        script = tmp / "train_mlp.py"
        script.write_text("import importlib.util, sys\n"
                          f"spec = importlib.util.spec_from_file_location('w', {str(ROOT / 'bench' / 'torch_plan_workloads.py')!r})\n"
                          "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
                          "w.train('mlp', int(sys.argv[1]), 'fp32')\n")
        got["plan"] = _run(["plan", "--store", str(store), "--json", "--vary", "batch=256..8192", "--budget",
                            str(PLAN_BUDGET), "--", "python", str(script), "{batch}"])
    return got
