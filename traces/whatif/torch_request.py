"""A what-if request as the faces give it: settings as `key=value` text, a memory cap, and the answer's shape.

The replay itself is torch.py (replay_check, what_if, compare_settings); this turns text into
AllocatorSettings, infers the device's cap from an OOM, checks a device at import, and downsamples curves.
"""
from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np

from alloctrace.allocator.cuda_caching import (ALLOC, N_ROUNDUP_INTERVALS, NO_LIMIT, OOM, SEGMENT_ALLOC, SEGMENT_FREE,
                                               SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, AllocatorSettings, allocation_size,
                                               round_size)
from alloctrace.traces.util.sizes import parse_size  # noqa: F401 (the faces' size parser, also from here)
from alloctrace.traces.whatif.torch_model import compare_settings, replay_check, seed_reserved, settings_dict


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def apply_overrides(base: AllocatorSettings, items: dict[str, str], cap: str | None = None) -> AllocatorSettings:
    """`base` with PYTORCH_CUDA_ALLOC_CONF-style overrides (max_split_size_mb, expandable_segments,
    roundup_power2_divisions, garbage_collection_threshold, release_cached_on_oom; device_memory: the GPU's
    memory, default an H200's) and a memory cap."""
    kw = {}
    for key, value in items.items():
        k = key.strip().lower()
        if k == "expandable_segments":
            kw["expandable_segments"] = _bool(value)
        elif k in ("max_split_size_mb", "max_split_size"):
            v = str(value).strip().lower()
            if v in ("none", "-1", "unlimited", ""):
                kw["max_split_size"] = NO_LIMIT
            else:
                mb = float(v)
                kw["max_split_size"] = int(mb * (1 << 20)) if k.endswith("_mb") else int(mb)
        elif k == "roundup_power2_divisions":
            parts = [p for p in str(value).replace("[", "").replace("]", "").split(",") if p.strip()]
            if any(":" in p for p in parts):
                raise ValueError(f"roundup_power2_divisions={value!r}: the per-size form ([256:1,512:2,>:4]) is "
                                 "not read here; give one value for every size (4) or 16 values, one per "
                                 "power-of-two interval from 1 MiB ([8,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2])")
            if not all(p.strip().isdecimal() for p in parts):
                raise ValueError(f"roundup_power2_divisions={value!r}: give one value (4) or 16 values "
                                 "([8,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2]), each 0 or a power of two")
            vals = [int(p) for p in parts]
            if len(vals) == 1:
                vals = vals * N_ROUNDUP_INTERVALS
            kw["roundup_power2_divisions"] = tuple(vals)
        elif k == "garbage_collection_threshold":
            kw["garbage_collection_threshold"] = float(value)
        elif k == "release_cached_on_oom":
            kw["release_cached_on_oom"] = _bool(value)
        elif k == "device_memory":
            kw["device_total"] = parse_size(value)
        else:
            raise ValueError(f"unknown setting {key!r} (expandable_segments, max_split_size_mb, "
                             "roundup_power2_divisions, garbage_collection_threshold, release_cached_on_oom, "
                             "device_memory)")
    if cap is not None:
        c = str(cap).strip().lower()
        if c in ("none", "0"):
            kw["memory_limit"] = None
        elif c.startswith("fraction:") or c.endswith("%"):
            # set_per_process_memory_fraction(f): allowed = int(f × the GPU's memory), as PyTorch computes it
            f = float(c[len("fraction:"):]) if c.startswith("fraction:") else float(c[:-1]) / 100
            if not 0.0 < f <= 1.0:
                raise ValueError(f"a memory fraction is in (0, 1], got {cap!r}")
            kw["memory_limit"] = int(f * kw.get("device_total", base.device_total))
        else:
            kw["memory_limit"] = parse_size(cap)
    return replace(base, **kw)


def infer_memory_limit(cols: dict, settings: AllocatorSettings | None = None, base_reserved: int = 0) -> int | None:
    """A cap that explains a trace's OOMs when the snapshot does not say which fraction was set (None: no OOM).

    Before each new segment the allocator checks reserved + segment size ≤ cap C. Every request that got one
    passed the check, so C ≥ L, the largest reserved + segment size among them; every release-and-retry and OOM
    happened because the check failed, at a sum > C ≥ L. Using L as the cap therefore gives each comparison the
    run made the same answer. (With expandable segments the mapped pages can exceed C, so L is not simply the
    peak reserved. The GC threshold depends on C itself: give the cap when it matters.)"""
    action = np.asarray(cols["action"]).tolist()
    if OOM not in action:
        return None
    s = settings or AllocatorSettings()
    size = np.asarray(cols["size"]).tolist()
    reserved, before, mapping, limit = base_reserved, 0, False, 0
    for a, sz in zip(action, size):
        if a == SEGMENT_ALLOC or a == SEGMENT_MAP:
            if not mapping:
                before, mapping = reserved, True
            reserved += sz
        elif a == SEGMENT_FREE or a == SEGMENT_UNMAP:
            reserved -= sz
            mapping = False
        elif a == ALLOC:
            if mapping:
                limit = max(limit, before + allocation_size(round_size(sz, s)))
            mapping = False
        elif a != SNAPSHOT:
            mapping = False
    return max(limit, 1)


class PartialTrace(ValueError):
    """A trace that starts mid-run whose starting state could not be recovered: no what-if from it."""


def starting_seed(info: dict, trace: str = "the trace") -> list | None:
    """The allocator at a partial trace's first entry (wrapped.analyse), None for a complete trace; raises
    PartialTrace when it could not be recovered exactly."""
    p = info.get("partial") or {}
    if not p.get("partial"):
        return None
    if not p.get("exact"):
        raise PartialTrace(f"{trace} starts mid-run (its ring buffer wrapped: {p.get('orphan_frees', 0):,} frees of "
                           f"blocks it never allocated) and the allocator before its first entry cannot be recovered "
                           f"exactly ({p.get('reason')}); a what-if from it would start from an unknown state")
    if p.get("whatif_refused"):
        raise PartialTrace(f"{trace} starts mid-run (its ring buffer wrapped); its states and peaks are exact, but no "
                           f"what-if from it: {p['whatif_refused']}")
    return p["seed"]


def check_device(cols: dict, info: dict, *, memory_limit: int | None = None, progress=None) -> dict:
    """The importer's check of one device: {"consistent", "first_mismatch", ...} from the recorded settings.
    `progress(done, total)` is called now and then."""
    try:
        seed = starting_seed(info)
    except PartialTrace as e:
        return {"consistent": False, "first_mismatch": {"event": 0, "expected": {}, "model": None,
                                                        "reason": str(e)}, "cache_flushes": 0, "alloc_retries": 0}
    base = AllocatorSettings.from_snapshot(info.get("allocator_settings") or {})
    base = replace(base, memory_limit=memory_limit or infer_memory_limit(cols, base, seed_reserved(seed)))
    r = replay_check(cols, base, seed=seed, progress=progress)
    return {"consistent": bool(r.consistent), "first_mismatch": asdict(r.mismatch) if r.mismatch else None,
            "cache_flushes": len(r.cache_flushes), "alloc_retries": r.alloc_retries,
            "cache_flush_events": r.cache_flushes[:10_000], "memory_limit": base.memory_limit}


def parse_pairs(items: list[str]) -> dict[str, str]:
    """['expandable_segments=true', ...] -> {key: value}."""
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set wants KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def whatif_request(cols: dict, info: dict, settings: list[str], cap: str | None = None,
                   recorded_cap: str | None = None, *, keep_series: bool = False, progress=None) -> dict:
    """What `alloctrace whatif` and the API answer: the recorded settings (from the snapshot, with the cap
    given or inferred) against the same with `settings` (KEY=VALUE strings) and `cap` applied.
    Raises ValueError for bad settings."""
    seed = starting_seed(info)
    recorded = AllocatorSettings.from_snapshot(info.get("allocator_settings") or {})
    recorded = replace(recorded, memory_limit=parse_size(recorded_cap) if recorded_cap
                       else infer_memory_limit(cols, recorded, seed_reserved(seed)))
    changed = apply_overrides(recorded, parse_pairs(settings), cap)
    out = compare_settings(cols, recorded, changed, keep_series=keep_series, progress=progress, seed=seed)
    out["recorded_settings"] = settings_dict(recorded)
    notes = inert_settings(recorded, changed)
    if notes:
        out["notes"] = notes
    if seed is not None:
        out["partial"] = {"exact_from": 0, "seed_reserved": seed_reserved(seed),
                          "note": "the trace starts mid-run: both runs start from the allocator at its first entry "
                                  "(the snapshot's segments walked back through the trace), as recorded"}
    return out


def inert_settings(recorded: AllocatorSettings, changed: AllocatorSettings) -> list[str]:
    """What a what-if changes that cannot act in its run, said instead of a result that looks like one."""
    notes = []
    if changed.garbage_collection_threshold != recorded.garbage_collection_threshold and changed.memory_limit is None:
        notes.append("garbage_collection_threshold acts only under a memory cap (PyTorch: "
                     "set_per_process_memory_fraction): without one (no --cap, none recorded or inferred) it "
                     "changes nothing here")
    return notes


def downsample(series: dict, points: int) -> dict:
    """The reserved/allocated curves of `compare_settings(..., keep_series=True)` in at most `points` buckets,
    each the bucket's maximum (peaks survive), with the first entry index of each bucket."""
    real = series["real_reserved"]
    n = len(real)
    points = max(1, min(points, n)) if n else 0
    edges = np.linspace(0, n, points + 1).astype(np.int64) if n else np.zeros(1, dtype=np.int64)
    starts = edges[:-1]

    def bucket_max(a):
        if a is None or not n:
            return []
        return np.maximum.reduceat(np.asarray(a, dtype=np.int64), starts).tolist()
    return {"n_events": n, "event": starts.tolist(),
            "real_reserved": bucket_max(real), "real_allocated": bucket_max(series["real_allocated"]),
            "whatif_reserved": bucket_max(series["whatif_reserved"]),
            "whatif_allocated": bucket_max(series["whatif_allocated"]),
            "whatif_stopped_at": series.get("whatif_stopped_at")}
