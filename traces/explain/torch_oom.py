"""Why an out-of-memory error happened: the GPU, or a memory cap (`set_per_process_memory_fraction`).

Before each new segment the caching allocator checks reserved + segment size against the cap; when the check
fails it frees every cached segment and tries once more (a retry), and only then raises. A snapshot never records
the cap, but every new segment the trace shows passed that check (cap ≥ reserved before it + its size) and every
release-and-retry and the OOM itself failed it (cap < reserved + the segment it needed). The cap is therefore
known to lie in [lower, upper): every cap in that range gives the same run. The OOM entry's `device_free` (the
GPU's own free memory at the failure) tells a cap from a full GPU: when the GPU had room for the segment, the cap
refused it.
"""
from __future__ import annotations

import numpy as np

from alloctrace.allocator.cuda_caching import AllocatorSettings, allocation_size

from alloctrace.traces.store.torch_stored import ALLOC, OOM, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT


def _roundest(lo: int, hi: int) -> int | None:
    """The value in [lo, hi) with the most trailing zero bits (6 GiB rather than 6,437,000,000), if any is a
    multiple of 1 MiB."""
    for bit in range(62, 19, -1):
        step = 1 << bit
        v = -(-lo // step) * step
        if v < hi:
            return v
    return None


def cap_bounds(cols: dict, extra: dict) -> dict | None:
    """{"lower", "upper" (exclusive), "roundest", "retries"} of the cap the trace's OOMs imply; None without OOM.
    Releases the model took for the program's empty_cache() (`cache_flush_events` from the import's replay)
    are no retries; with a GC threshold the releases are the collector's, so only OOMs bound the cap then."""
    action = np.asarray(cols["action"]).tolist()
    if OOM not in action:
        return None
    size = np.asarray(cols["size"]).tolist()
    st = extra.get("allocator_settings") or {}
    settings = AllocatorSettings.from_snapshot(st)
    gc = settings.garbage_collection_threshold > 0
    flushes = set(extra.get("cache_flush_events") or ())
    reserved = int(extra.get("baseline_reserved") or 0)
    lower, upper, retries = 0, None, 0
    before = reserved          # reserved when the current run of segment entries began
    releasing = False          # the current run started with releases (not the program's)
    mapped = 0                 # segment bytes made in the current run
    n = len(action)
    for i, (a, sz) in enumerate(zip(action, size)):
        if a in (SEGMENT_FREE, SEGMENT_UNMAP):
            if not releasing and not mapped:
                before, releasing = reserved, i not in flushes and not gc
            reserved -= sz
            continue
        if a in (SEGMENT_ALLOC, SEGMENT_MAP):
            mapped += sz
            reserved += sz
            continue
        if a == SNAPSHOT:
            continue
        if a == ALLOC and mapped:
            lower = max(lower, reserved)                    # reserved + the new segment passed the check
            if releasing:                                   # it had failed before the cache was released
                upper = before + mapped if upper is None else min(upper, before + mapped)
                retries += 1
        elif a == OOM:
            need = allocation_size(sz)
            upper = reserved + need if upper is None else min(upper, reserved + need)
            if releasing or (i > 0 and action[i - 1] in (SEGMENT_FREE, SEGMENT_UNMAP)):
                retries += 1
        releasing, mapped = False, 0
        before = reserved
    if upper is not None and upper <= lower:
        upper = None            # the bounds disagree (expandable pages may pass the cap): say nothing exact
    out = {"lower": lower, "upper": upper, "roundest": _roundest(lower, upper) if upper else None,
           "retries_seen": retries, "n_events": n}
    return out


def cause(card: dict, bounds: dict | None) -> dict:
    """The card's one-line cause and its kind: "cap" (the GPU had room), "device" (it had not) or "unknown"."""
    need, free = card["segment_needed"], card.get("device_free")
    if free is not None and free >= 0 and free < need:
        return {"kind": "device", "text": f"the GPU itself was full: {free:,} B free, the request needed a "
                                          f"{need:,} B segment"}
    if bounds and bounds.get("upper"):
        lo, hi, r = bounds["lower"], bounds["upper"], bounds.get("roundest")
        text = (f"a memory cap (set_per_process_memory_fraction) refused a {need:,} B segment"
                + (f" while the GPU had {free:,} B free" if free is not None and free >= 0 else "")
                + f": the cap is between {lo:,} and {hi - 1:,} B (every new segment of the run fit under it, "
                  f"the failing one did not after the cache was emptied)")
        if r is not None:
            text += f"; {r:,} B ({r / (1 << 30):g} GiB) is the roundest value in that range"
        return {"kind": "cap", "text": text}
    if free is not None and free >= need:
        return {"kind": "cap", "text": f"a memory cap (set_per_process_memory_fraction) refused a {need:,} B segment "
                                       f"while the GPU had {free:,} B free; its value cannot be bounded from this "
                                       "trace (expandable segments map pages past it)"}
    return {"kind": "unknown", "text": "the snapshot does not say whether a cap or the GPU refused the segment"}
