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


def store_points(store, plans: dict, settings: AllocatorSettings, budget: int, name: str) -> dict[int, str]:
    """Each point of a `--vary` search stored as its own trace (replayed under the budget): {value: trace id}."""
    from dataclasses import replace

    capped = replace(settings, memory_limit=budget)
    return {v: store_plan(store, p.capture, capped, None, f"{name} [{v}]"[:200]) for v, p in sorted(plans.items())}
