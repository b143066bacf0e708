"""A plan stored as a PyTorch trace: the predicted run written as the memory snapshot the real run would dump.

The replay's own decisions (segments, allocations, frees, the OOM) become a snapshot's `device_traces` with each
entry's Python frames from the capture, and the model's segments at the end its `segments`; the snapshot is
then imported through the torch source like any `_dump_snapshot` pickle, so every view of a PyTorch trace
(peak by call site, flamegraph, timeline, state, report, diff against the real run's snapshot) works on it.
"""
from __future__ import annotations

import io
import pickle

from alloctrace.allocator.cuda_caching import ACTIONS, AllocatorSettings, CachingAllocator, OutOfMemory
from alloctrace.traces.preflight import torch_capture
from alloctrace.traces.whatif.torch_model import SimulatedDevice


def _frames(event) -> list[dict]:
    """Backward runs on the autograd engine's device thread: a real snapshot has no Python frames there."""
    if event.phase == "backward":
        return []
    return [{"filename": f, "line": int(line), "name": name} for f, line, name in event.frames]


def _settings_dict(s: AllocatorSettings) -> dict:
    return {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1 if s.max_split_size >= (1 << 63) else s.max_split_size,
            "garbage_collection_threshold": s.garbage_collection_threshold,
            "expandable_segments": s.expandable_segments,
            "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(s.roundup_power2_divisions)}}


def snapshot_of(cap: torch_capture.Capture, settings: AllocatorSettings, total: int | None = None) -> dict:
    """The snapshot (plain data) of the capture replayed under `settings`; stops at the first OOM."""
    model = CachingAllocator(settings, SimulatedDevice(total if total else settings.device_total), record=True)
    entries: list[dict] = []
    live: dict = {}
    t = 0

    def take(event):
        nonlocal t
        for action, addr, size, stream in model.log:
            t += 1
            entries.append({"action": ACTIONS[action], "addr": int(addr), "size": int(size), "stream": int(stream),
                            "time_us": t, "frames": _frames(event)})
        model.log.clear()

    for e in cap.events:
        if e.kind == "free":
            block = live.pop(e.key, None)
            if block is not None:
                model.free(block)
                take(e)
            continue
        try:
            live[e.key] = model.malloc(e.size, e.stream)
        except OutOfMemory:
            take(e)
            break
        take(e)
    return {"segments": [dict(seg, device=0, stream=0, frames=[]) for seg in model.segments(live.values())],
            "device_traces": [entries], "allocator_settings": _settings_dict(settings)}


def store_plan(store, cap: torch_capture.Capture, settings: AllocatorSettings, total: int | None, name: str) -> str:
    """Import the plan's snapshot into `store`; the new trace's id."""
    from alloctrace.traces.sources import import_file

    data = pickle.dumps(snapshot_of(cap, settings, total), protocol=4)
    summaries = import_file(store, io.BytesIO(data), name=name, filename="plan.pickle")
    return summaries[0]["id"]


def store_vary(store, out: dict, plans: dict, settings: AllocatorSettings, total: int | None, name: str) -> dict:
    """A `plan --vary` search stored: every point tried as its own PyTorch trace (its run replayed under the
    budget), all tagged `plan=<id>`, each with the whole search in its `extra.plan_vary` (what the pre-flight
    page draws; `stored_value` says which point the trace is). Each point's `trace` is set in `out`.
    {"plan": id, "trace": the answer's trace (the lowest value's when nothing fits)}."""
    from dataclasses import replace

    from alloctrace.traces.preflight.points import new_sweep_id
    from alloctrace.traces.sources import read_file, store_traces

    answer = out["value"] if out["value"] is not None else out["points"][0]["value"]
    capped = replace(settings, memory_limit=out["budget"])
    pid = new_sweep_id()
    keep = ("value", "fits", "peak_allocated", "peak_reserved", "fragmentation_at_peak", "categories", "oom",
            "partial", "peak_allocated_range", "peak_reserved_range", "address_orders", "oom_orders")
    kept = {"name": out["name"], "budget": out["budget"], "value": out["value"], "lo": out.get("lo"),
            "hi": out.get("hi"), "laws": out["laws"], "value_every_order": out.get("value_every_order"),
            "address_orders": out.get("address_orders"),
            "points": [{k: p.get(k) for k in keep} for p in out["points"]]}
    ids: dict = {}
    for value, plan in sorted(plans.items()):
        data = pickle.dumps(snapshot_of(plan.capture, capped, total), protocol=4)
        traces = read_file(io.BytesIO(data), name=f"{name} [{out['name']}={value}]"[:200], filename="plan.pickle",
                           tags=(f"plan={pid}", f"vary={out['name']}", f"budget={out['budget']}",
                                 f"{out['name']}={value}"))
        for t in traces:
            t.meta.extra = {**t.meta.extra, "plan_vary": {**kept, "stored_value": value}}
        ids[value] = store_traces(store, traces)[0]["id"]
    for point in out["points"]:
        point["trace"] = ids.get(point["value"])
    return {"plan": pid, "trace": ids[answer]}
