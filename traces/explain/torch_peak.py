"""What held a torch device's memory: the requested-bytes peak by call site, and the card of an OOM.

Call sites are the first frame outside `skip` (torch internals by default); groups past `top` are summed.
"""
from __future__ import annotations

import numpy as np

from alloctrace.allocator.cuda_caching import allocation_size
from alloctrace.traces.explain.torch_oom import cap_bounds, cause
from alloctrace.traces.state.torch_device import DEFAULT_SKIP, PREEXISTING, Device, StateIndex, live_at, noted
from alloctrace.traces.store.torch_stored import ACTIONS, OOM, SEGMENT_FREE


def by_call_site(dev: Device, rows: np.ndarray, event: int, skip=DEFAULT_SKIP, top: int = 50) -> list[dict]:
    """Live allocations grouped by call site, largest first; the last group sums what `top` leaves out."""
    al = dev.allocations()
    groups: dict[str, list[int]] = {}
    for stack, start, size in zip(al.stack[rows].tolist(), al.start[rows].tolist(), al.size[rows].tolist()):
        g = groups.setdefault(dev.label(stack, start, skip), [0, 0, stack])
        g[0] += size
        g[1] += 1
    before = int(dev.curves()[0][event]) - sum(g[0] for g in groups.values()) if dev.n else 0
    if before:  # live bytes the trace never saw allocated (it wrapped or began late)
        groups[PREEXISTING] = [before, 0, -1]
    total = sum(g[0] for g in groups.values())
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    out = [{"site": site, "bytes": b, "share": b / total if total else 0.0, "count": c,
            "stack": dev.frames(stack)[:8]} for site, (b, c, stack) in ranked[:top]]
    rest = ranked[top:]
    if rest:
        b = sum(g[0] for _, g in rest)
        out.append({"site": f"({len(rest)} other call site{'s' if len(rest) > 1 else ''})", "bytes": b,
                    "share": b / total if total else 0.0, "count": sum(g[1] for _, g in rest), "stack": []})
    return out


def peak(dev: Device, skip=DEFAULT_SKIP, top: int = 50) -> dict:
    """The requested-bytes peak and the live allocations at it, by call site (their bytes add up to the peak)."""
    req, res = dev.curves()
    k = int(np.argmax(req)) if dev.n else 0
    rows = live_at(dev, k)
    return noted(dev, {"device": dev.device, "n_events": dev.n, "peak_requested": int(req[k]) if dev.n else 0,
                       "peak_reserved": int(res.max()) if dev.n else 0, "event": k,
                       "time_us": int(dev.cols["time_us"][k]) if dev.n else None, "live_allocations": len(rows),
                       "by_call_site": by_call_site(dev, rows, k, skip, top)})


def oom_card(dev: Device, index: StateIndex, skip=DEFAULT_SKIP, which: int = 0) -> dict | None:
    """The failing request, the allocator's totals just before it, and who held the memory."""
    ooms = np.flatnonzero(dev.cols["action"] == OOM)
    if not len(ooms):
        return None
    k = int(ooms[min(which, len(ooms) - 1)])
    t = index.at(k).totals()
    stack = int(dev.cols["stack"][k])
    free = dev.cols.get("device_free")
    card = {"event": k, "n_ooms": len(ooms), "oom_events": ooms[:200].tolist(), "requested": int(dev.cols["size"][k]),
            "segment_needed": allocation_size(int(dev.cols["size"][k])),
            "stream": int(dev.cols["stream"][k]), "allocated": t["allocated"], "requested_live": t["requested"],
            "reserved": t["reserved"], "cached": t["cached"], "largest_free": t["largest_free"],
            "device_free": None if free is None else int(free[k]),
            "cache_releases": cache_releases(dev, k), "site": dev.label(stack, k, skip), "stack": dev.frames(stack, answer=True),
            "meta": dev.meta_text(int(dev.cols["meta"][k])),
            "holders": by_call_site(dev, live_at(dev, k), k, skip, top=15),
            "largest_blocks": largest_live(dev, k, skip)}
    if index.unknown:       # totals replayed from an unrecoverable start would read as zeros: not facts
        card.update({k: None for k in ("allocated", "requested_live", "reserved", "cached", "largest_free")})
        card["unknown"] = index.unknown
    if "cap" not in dev._cache:
        dev._cache["cap"] = cap_bounds(dev.cols, dev.extra)
    bounds = dev._cache["cap"]
    retries = dev.extra.get("alloc_retries")
    card["retries"] = retries if retries is not None else (bounds or {}).get("retries_seen")
    card["retries_source"] = "model" if retries is not None else "trace"
    card["cap"] = None if not bounds or not bounds.get("upper") else {
        "lower": bounds["lower"], "upper": bounds["upper"], "roundest": bounds["roundest"], "source": "inferred"}
    card["cause"] = cause(card, bounds)
    return noted(dev, card)


def largest_live(dev: Device, k: int, skip=DEFAULT_SKIP, top: int = 10) -> list[dict]:
    """The largest allocations live at entry k, with who made them."""
    al = dev.allocations()
    rows = live_at(dev, k)
    rows = rows[np.argsort(-al.size[rows], kind="stable")[:top]]
    return [{"bytes": int(al.size[r]), "entry": int(al.start[r]), "addr": int(al.addr[r]),
             "site": dev.label(int(al.stack[r]), int(al.start[r]), skip)} for r in rows.tolist()]


def cache_releases(dev: Device, k: int, last: int = 5) -> list[dict]:
    """The last runs of consecutive segment_free entries before entry k: the allocator emptying its cache to
    retry a failed cudaMalloc (or an explicit empty_cache()), with what came right after each run."""
    a = dev.cols["action"][:k]
    sf = a == SEGMENT_FREE
    starts = np.flatnonzero(sf & ~np.r_[False, sf[:-1]])
    ends = np.flatnonzero(sf & ~np.r_[sf[1:], False]) + 1
    out = []
    for s, e in list(zip(starts.tolist(), ends.tolist()))[-last:]:
        out.append({"first": s, "end": e, "segments": e - s, "bytes": int(dev.cols["size"][s:e].sum()),
                    "then": ACTIONS[int(dev.cols["action"][e])] if e < dev.n else None})
    return out
