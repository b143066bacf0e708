"""`alloctrace plan` against the real runs: accuracy table and wall time.

    python bench/bench_plan.py [--markdown]

For every model x dtype x batch of tests/data/torch/plan/truths.json (recorded on an H200 by
bench/record_torch_plan_truths.py): the real max_memory_allocated / max_memory_reserved, the predicted ones and
the errors; the wall time of `plan` (capture + replay, two training steps) as a ratio to the real two steps'
wall time on the GPU (from the truths) and to the same steps' plain CPU run at batch 1 measured here.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import time
import types
from pathlib import Path

from alloctrace.traces.preflight import torch_plan

ROOT = Path(__file__).resolve().parent.parent
TRUTHS = json.loads((ROOT / "tests" / "data" / "torch" / "plan" / "truths.json").read_text())


def _load(device: str):
    path = ROOT / "bench" / "torch_plan_workloads.py"
    if device == "cuda":
        spec = importlib.util.spec_from_file_location("torch_plan_workloads", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    mod = types.ModuleType("torch_plan_workloads_cpu")     # the same steps, every "cuda" made "cpu"
    exec(compile(path.read_text().replace('"cuda"', '"cpu"'), str(path), "exec"), mod.__dict__)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    w, cpu = _load("cuda"), _load("cpu")
    cpu_wall = {}
    for name in w.MODELS:
        t0 = time.perf_counter()
        cpu.train(name, 1, "fp32")
        cpu_wall[name] = time.perf_counter() - t0
    rows = []
    for r in TRUTHS["runs"]:
        t0 = time.perf_counter()
        p = torch_plan.plan_callable(w.train, r["model"], r["batch"], r["dtype"])
        wall = time.perf_counter() - t0
        ea = (p.peak_allocated - r["max_memory_allocated"]) / r["max_memory_allocated"] * 100
        er = (p.peak_reserved - r["max_memory_reserved"]) / r["max_memory_reserved"] * 100
        rows.append((r["model"], r["dtype"], r["batch"], r["max_memory_allocated"], p.peak_allocated, ea,
                     r["max_memory_reserved"], p.peak_reserved, er, wall, wall / r["wall_s"],
                     wall / cpu_wall[r["model"]]))
    head = ("model", "dtype", "batch", "real allocated", "predicted", "error", "real reserved", "predicted",
            "error", "plan wall", "/ GPU steps", "/ CPU batch 1")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for x in rows:
        cells = [x[0], x[1], str(x[2]), f"{x[3]:,}", f"{x[4]:,}", f"{x[5]:+.2f}%", f"{x[6]:,}", f"{x[7]:,}",
                 f"{x[8]:+.2f}%", f"{x[9]:.2f} s", f"{x[10]:.0f}x", f"{x[11]:.2f}x"]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))


if __name__ == "__main__":
    main()
