"""`alloctrace plan` follows activation checkpointing (torch.utils.checkpoint, reentrant and not): the
recomputation in backward is captured and replayed, checked against an H200: each step in a fresh process
(tests/data/torch/plan/fresh_variants.json, `bench/record_torch_plan_truths.py --fresh-variants`), as a user's run
starts, and one after another in one process (more.json, `--more`), whose peaks the plan's range holds
(test_torch_plan_address_orders.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from alloctrace.traces.preflight import torch_capture, torch_plan  # noqa: E402
from torchsnap import plan_answer, plan_workloads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MORE = json.loads((ROOT / "tests" / "data" / "torch" / "plan" / "more.json").read_text())
FRESH = json.loads((ROOT / "tests" / "data" / "torch" / "plan" / "fresh_variants.json").read_text())["runs"]


W = plan_workloads()


def _plan(run):
    if run["variant"] == "checkpoint_reentrant":
        return plan_answer(W.train_checkpoint_reentrant, run["model"], run["batch"], run["dtype"])
    return plan_answer(W.train_variant, run["model"], run["batch"], run["dtype"],
                                    **W.VARIANTS_MORE[run["variant"]])


CHECKPOINTED = {(r["model"], r["dtype"], r["variant"]): r for r in FRESH
                if r.get("variant") in W.VARIANTS_MORE}           # "checkpoint" was run twice: the same peaks
CASES = [pytest.param(r, id="-".join(k)) for k, r in CHECKPOINTED.items()]


@pytest.mark.parametrize("run", CASES)
def test_checkpointed_step_peak_allocated_within_one_percent(run):
    p = _plan(run)
    assert not p.partial, p.error
    assert p.peak_allocated == pytest.approx(run["max_memory_allocated"], rel=0.01)


@pytest.mark.parametrize("run", CASES)
def test_checkpointed_step_peak_reserved_within_three_percent(run):
    p = _plan(run)
    assert not p.partial, p.error
    assert p.peak_reserved == pytest.approx(run["max_memory_reserved"], rel=0.03)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointing_recomputes_once_in_backward_and_frees_what_it_recomputed(reentrant):
    import torch.utils.checkpoint as ck

    with torch_capture.capture() as cap:
        with torch.device("cuda"):
            l1, l2 = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        x = torch.randn(8, 64, device="cuda", requires_grad=True)
        y = x
        for _ in range(3):
            y = ck.checkpoint(lambda t: l2(torch.relu(l1(t))), y, use_reentrant=reentrant)
        y.sum().backward()
    assert not cap.partial, cap.error
    relu = [e for e in cap.events if e.kind == "alloc" and e.op == "relu"]
    # three regions: once in forward, once recomputed in backward (not once per saved tensor read)
    assert [e.phase for e in relu].count("forward") == 3
    assert [e.phase for e in relu].count("backward") == 3
    allocs = {e.key for e in cap.events if e.kind == "alloc" and e.phase == "backward" and e.op == "relu"}
    freed = {e.key for e in cap.events if e.kind == "free"}
    assert allocs <= freed
    assert torch._C._current_graph_task_id() == -1          # put back after the capture


def test_a_checkpointed_regions_saved_input_is_freed_once_its_backward_has_run():
    """The region's frame (which holds its input) lives as long as the checkpoint's hooks in the saved variables
    of its nodes; the engine drops those as each node runs, so a region's input goes before the region below
    it is recomputed (on an H200 the ViT-like step's peak was 7 % lower than when it stayed to the end)."""
    import torch.utils.checkpoint as ck

    with torch_capture.capture() as cap:
        with torch.device("cuda"):
            l1, l2 = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        x = torch.randn(8, 64, device="cuda", requires_grad=True)
        outs = []
        y = x
        for _ in range(3):
            y = ck.checkpoint(lambda t: l2(torch.relu(l1(t))), y, use_reentrant=False)
            outs.append([e.key for e in cap.events if e.kind == "alloc"][-1])    # the region's output
        y.sum().backward()
        del y
    assert not cap.partial, cap.error
    index = {(e.kind, e.key): i for i, e in enumerate(cap.events)}
    relus = [i for i, e in enumerate(cap.events) if e.kind == "alloc" and e.op == "relu" and e.phase == "backward"]
    assert len(relus) == 3
    # the first region's output is the second region's saved input: gone before the first region is recomputed
    assert index[("free", outs[0])] < relus[2]
    assert index[("free", outs[1])] < relus[1]


def test_a_programs_own_saved_tensor_hooks_let_go_of_what_they_packed_when_the_node_has_run():
    with torch_capture.capture() as cap:
        with torch.device("cuda"):
            layers = [torch.nn.Linear(64, 64) for _ in range(3)]
        x = torch.randn(8, 64, device="cuda")
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            y = x
            for layer in layers:
                y = torch.relu(layer(y))
            loss = y.sum()
        loss.backward()
        last = len(cap.events)
        del loss, y
    assert not cap.partial, cap.error
    clones = {e.key for e in cap.events if e.kind == "alloc" and e.op == "clone"}
    freed_in_backward = {e.key for e in cap.events[:last] if e.kind == "free"}
    assert clones and clones <= freed_in_backward
    assert type(torch._C._autograd._push_saved_tensors_default_hooks).__name__ == "builtin_function_or_method"


def test_vit_non_reentrant_step_follows_the_real_snapshot_event_by_event():
    """The ViT-like fp32 step, every block checkpointed (non-reentrant), against an H200's memory snapshot
    (vit_fp32_b32_checkpoint.pickle.gz): its allocations and frees aligned by size, the bytes allocated after each
    aligned event agree within 1 MiB all along (each region's input goes when the region's backward is done)."""
    import difflib
    import gzip
    import pickle

    snap = pickle.load(gzip.open(ROOT / "tests" / "data" / "torch" / "plan" / "vit_fp32_b32_checkpoint.pickle.gz"))
    def rounded(size):                                   # the allocator's 512-byte blocks
        return max(512, -(-size // 512) * 512)

    real, real_live, live = [], [], 0
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_requested"):
            live += rounded(e["size"]) if e["action"] == "alloc" else -rounded(e["size"])
            real.append((e["action"][:5], e["size"]))
            real_live.append(live)
    with torch_capture.capture() as cap:
        W.train_variant("vit", 32, "fp32", **W.VARIANTS_MORE["checkpoint"])
    assert not cap.partial, cap.error
    sizes, mine, mine_live, live = {}, [], [], 0
    for e in cap.events:
        if e.kind == "alloc":
            sizes[e.key] = e.size
        live += rounded(sizes[e.key]) if e.kind == "alloc" else -rounded(sizes[e.key])
        mine.append(("alloc" if e.kind == "alloc" else "free_", sizes[e.key]))
        mine_live.append(live)
    ops = difflib.SequenceMatcher(None, real, mine, autojunk=False).get_opcodes()
    pairs = [(i, j1 + i - i1) for tag, i1, i2, j1, _ in ops if tag == "equal" for i in range(i1, i2)]
    assert len(pairs) >= 0.99 * len(real)
    assert max(abs(real_live[i] - mine_live[j]) for i, j in pairs) < 1 << 20


def test_the_gpus_spread_on_a_reentrant_step_is_where_its_segments_landed():
    """GPT bf16 reentrant, recorded three times on the H200: 597,688,320 reserved in more.json (after other steps
    in one process), 473,031,168 allocated and 564,133,888 reserved in gpt_bf16_b8_checkpoint_reentrant.pickle.gz
    and in a fresh process (fresh_variants.json). That snapshot's own requests through the allocator model give
    its peaks when each segment gets the address it had there (best fit breaks ties by address), the same when
    segments go where the driver puts them in a fresh process (the plan's answer), and more.json's reserved when
    every new segment goes below the older ones."""
    import gzip
    import pickle

    from alloctrace.allocator.cuda_caching import AllocatorSettings, CachingAllocator
    from alloctrace.traces.whatif.torch_model import SimulatedDevice

    path = ROOT / "tests" / "data" / "torch" / "plan" / "gpt_bf16_b8_checkpoint_reentrant.pickle.gz"
    trace = pickle.load(gzip.open(path))["device_traces"][0]

    def replayed(recorded, order="driver"):
        settings = AllocatorSettings()
        model = CachingAllocator(settings, SimulatedDevice(settings.device_total, recorded, order), record=False)
        blocks, peaks = {}, [0, 0]
        for e in trace:
            if e["action"] == "alloc":
                blocks[e["addr"]] = model.malloc(e["size"], 0)
                peaks = [max(peaks[0], model.allocated), max(peaks[1], model.reserved)]
            elif e["action"] == "free_requested":
                model.free(blocks.pop(e["addr"]))
        return peaks

    run = next(r for r in MORE["variants"] if (r["model"], r["dtype"], r["variant"]) == ("gpt", "bf16",
                                                                                       "checkpoint_reentrant"))
    fresh = CHECKPOINTED[("gpt", "bf16", "checkpoint_reentrant")]
    p = _plan(run)
    real = replayed([(e["addr"], e["size"]) for e in trace if e["action"] == "segment_alloc"])
    assert real == [473_031_168, 564_133_888] == [fresh["max_memory_allocated"], fresh["max_memory_reserved"]]
    assert replayed(()) == [p.peak_allocated, p.peak_reserved] == real
    assert replayed((), "down")[1] == run["max_memory_reserved"] == 597_688_320
