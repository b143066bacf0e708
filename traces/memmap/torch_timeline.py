"""A torch device's active memory over its entries, as the official viewer draws it, and its annotations.

Bounded whatever the snapshot's size: the timeline samples a grid of at most `max_points` entries and draws
at most `max_bands` allocations (the largest in the window), the rest showing only in the total.
"""
from __future__ import annotations

import numpy as np

from alloctrace.traces.state.torch_device import DEFAULT_SKIP, Device, noted
from alloctrace.traces.state.torch_frames import is_python, short


def _grid(x0: int, x1: int, n: int) -> np.ndarray:
    if x1 - x0 <= n:
        return np.arange(x0, x1, dtype=np.int64)
    return np.unique(np.linspace(x0, x1 - 1, n).astype(np.int64))


def _envelope(curve: np.ndarray, grid: np.ndarray, x1: int) -> tuple[list, list]:
    """Max and min of the curve over each grid cell (so peaks survive the sampling)."""
    edges = np.append(grid, x1)
    mx = np.maximum.reduceat(curve[grid[0]:x1], edges[:-1] - grid[0])
    mn = np.minimum.reduceat(curve[grid[0]:x1], edges[:-1] - grid[0])
    return mx.tolist(), mn.tolist()


def timeline(dev: Device, x0: int | None = None, x1: int | None = None, max_points: int = 1000,
             max_bands: int = 120, band_points: int = 300, skip=DEFAULT_SKIP, frames: int = 0) -> dict:
    """Allocated (requested) bytes over entries, stacked by allocation in allocation order, as the official
    viewer draws it: each drawn allocation is a band from the bytes allocated before it and still live to that
    plus its size. Only the `max_bands` largest allocations live in the window are drawn; with `frames`, each
    drawn band carries the first `frames` frames of its stack (see `hover_stack`)."""
    n = dev.n
    x0 = 0 if x0 is None else max(0, min(x0, n))
    x1 = n if x1 is None else max(x0, min(x1, n))
    req, res = dev.curves()
    out = {"trace_id": dev.trace_id, "device": dev.device, "n_events": n, "x0": x0, "x1": x1,
           "grid": [], "allocated_max": [], "allocated_min": [], "reserved_max": [], "bands": [],
           "annotations": [], "omitted_allocations": 0}
    if x1 <= x0:
        return out
    grid = _grid(x0, x1, max_points)
    out["grid"] = grid.tolist()
    out["allocated_max"], out["allocated_min"] = _envelope(req, grid, x1)
    out["reserved_max"], _ = _envelope(res, grid, x1)
    out["time_us"] = dev.cols["time_us"][grid].tolist()
    al = dev.allocations()
    live = np.flatnonzero((al.start < x1) & (al.end > x0))
    pick = live[np.lexsort((al.start[live], -al.size[live]))][:max_bands]
    out["omitted_allocations"] = int(len(live) - len(pick))
    frees = np.flatnonzero(al.end < n)
    fidx = al.end[frees]
    order = np.argsort(fidx, kind="stable")
    free_at, free_start, free_size = fidx[order], al.start[frees][order], al.size[frees][order]
    bgrid = _grid(x0, x1, band_points)
    for r in sorted(pick.tolist(), key=lambda r: al.start[r]):
        s, e, z = int(al.start[r]), int(al.end[r]), int(al.size[r])
        lo, hi = max(s, x0), min(e, x1)
        xs = np.unique(np.concatenate(([lo], bgrid[(bgrid > lo) & (bgrid < hi)], [hi - 1])))
        before = int(req[s]) - z  # live bytes allocated before this one, at its alloc
        a, b = np.searchsorted(free_at, [s, hi], side="right")
        older = free_start[a:b] < s
        cum = np.concatenate(([0], np.cumsum(np.where(older, free_size[a:b], 0))))
        base = before - cum[np.searchsorted(free_at[a:b], xs, side="right")]
        out["bands"].append({"alloc": s, "free": e if e < n else None, "size": z, "x": xs.tolist(),
                             "base": base.tolist(), "site": dev.label(int(al.stack[r]), s, skip),
                             "meta": dev.meta_text(int(al.meta[r]))})
        if frames:
            out["bands"][-1]["stack"] = hover_stack(dev, int(al.stack[r]), skip, frames)
    out["annotations"] = annotation_bands(dev, x0, x1)
    return noted(dev, out)


def hover_stack(dev: Device, stack: int, skip=DEFAULT_SKIP, limit: int = 8) -> list[str]:
    """The first `limit` frames of a stack, innermost first, as `name (file:line)`: the Python frames outside
    `skip` where there are any (what the peak names), else the frames as recorded (C++ only stacks)."""
    every = dev.frames(stack) if stack >= 0 else []
    kept = [f for f in every if is_python(f) and not any(p in f["filename"] for p in skip)] or every
    return [f"{f['name']} ({short(f['filename'])}:{f['line']})" for f in kept[:limit]]


def annotation_bands(dev: Device, x0: int, x1: int, limit: int = 200) -> list[dict]:
    """External annotations and runs of user_metadata overlapping the window, the widest `limit` of each."""
    ext = [{"kind": "annotation", "name": nm, "x0": a, "x1": b} for a, b, nm in dev.annotation_intervals()
           if a < x1 and b > x0]
    meta = dev.cols["meta"]
    if "meta_runs" not in dev._cache:
        change = np.flatnonzero(np.diff(meta)) + 1
        starts = np.concatenate(([0], change)) if len(meta) else np.zeros(0, dtype=np.int64)
        ends = np.append(change, len(meta)) if len(meta) else starts
        dev._cache["meta_runs"] = (starts, ends, meta[starts] if len(meta) else starts)
    starts, ends, codes = dev._cache["meta_runs"]
    sel = np.flatnonzero((starts < x1) & (ends > x0) & (codes >= 0))
    runs = [{"kind": "metadata", "name": dev.strings[int(codes[k])], "x0": int(starts[k]), "x1": int(ends[k])}
            for k in sel.tolist()]
    widest = lambda bands: sorted(sorted(bands, key=lambda b: b["x0"] - b["x1"])[:limit], key=lambda b: b["x0"])
    return widest(ext) + widest(runs)
