"""The plan's remaining misses are the CUDA driver's choice of segment addresses: with the addresses a real run
got (tests/data/torch/plan/segments.json, one fresh process per point on an H200) the replay of the captured
step gives every real peak to the byte."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from alloctrace.allocator.cuda_caching import AllocatorSettings  # noqa: E402
from alloctrace.traces.preflight import torch_capture, torch_plan  # noqa: E402
from torchsnap import plan_workloads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "torch" / "plan"
SEGMENTS = json.loads((DATA / "segments.json").read_text())


W = plan_workloads()


def test_fresh_processes_reproduce_the_recorded_peaks():
    truths = {(r["model"], r["dtype"], r["batch"]): r for r in
              json.loads((DATA / "truths.json").read_text())["runs"]}
    assert len(SEGMENTS["runs"]) == len(truths) == 18
    for run in SEGMENTS["runs"]:
        t = truths[(run["model"], run["dtype"], run["batch"])]
        assert (run["max_memory_allocated"], run["max_memory_reserved"]) == \
            (t["max_memory_allocated"], t["max_memory_reserved"])


@pytest.mark.parametrize("run", [pytest.param(r, id=f"{r['model']}-{r['dtype']}-b{r['batch']}")
                                 for r in SEGMENTS["runs"]])
def test_with_the_real_segment_addresses_every_peak_is_exact(run):
    with torch_capture.capture() as c:
        W.train(run["model"], run["batch"], run["dtype"])
    real = torch_plan.replay(c, AllocatorSettings(), segments=[tuple(s) for s in run["segments"]], orders=("down",))
    assert (real.peak_allocated, real.peak_reserved) == (run["max_memory_allocated"], run["max_memory_reserved"])
