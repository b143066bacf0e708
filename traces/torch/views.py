"""What a torch trace looks like: active-memory timeline, state at an entry, peak by call site, OOM card.

Every answer is bounded whatever the snapshot's size: the timeline samples a
grid of at most `max_points` entries and draws at most `max_bands` allocations
(the largest in the window), the rest showing only in the total; the state view
caps blocks. Call sites are the first Python frame outside `skip` (torch internals by
default), innermost first, as the snapshot records frames; C++ frames only name stacks without Python frames
(frames.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .columns import ACTIONS, ALLOC, FREE_REQUESTED, OOM, SEGMENT_FREE
from alloctrace.allocator.cuda_caching import allocation_size

from .frames import DEFAULT_SKIP, site_label
from .oom import cap_bounds, cause
from .wrapped import note as partial_note
from .source import curves
from .state import AllocatorState
from .store import device_tables

NO_STACK = "(no Python stack)"
PREEXISTING = "(allocated before the trace began)"
CHECKPOINT_EVERY = 20_000
MAX_BLOCKS = 20_000


@dataclass
class Allocations:
    """One row per alloc entry: where it is, what it asked for, and when it was freed (n: never)."""

    start: np.ndarray  # entry index of the alloc
    end: np.ndarray  # entry index of its free_requested, or n_events
    size: np.ndarray
    addr: np.ndarray
    stack: np.ndarray
    meta: np.ndarray


@dataclass
class Device:
    trace_id: str
    device: int
    cols: dict
    strings: list
    extra: dict
    name: str = ""
    _cache: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.cols["action"])

    # --- derived columns, computed once ---------------------------------------------------
    def curves(self) -> tuple[np.ndarray, np.ndarray]:
        if "curves" not in self._cache:
            base = (self.extra.get("baseline_requested", 0), self.extra.get("baseline_reserved", 0))
            self._cache["curves"] = curves(self.cols, base)
        return self._cache["curves"]

    def allocations(self) -> Allocations:
        """Allocs paired with their free_requested: same address, next such entry after it."""
        if "allocs" in self._cache:
            return self._cache["allocs"]
        a, addr = self.cols["action"], self.cols["addr"]
        idx = np.flatnonzero((a == ALLOC) | (a == FREE_REQUESTED))
        order = idx[np.lexsort((idx, addr[idx]))]  # by address, then trace order
        is_alloc = a[order] == ALLOC
        nxt_free = np.zeros(len(order), dtype=bool)
        nxt_free[:-1] = (~is_alloc[1:]) & (addr[order[1:]] == addr[order[:-1]])
        starts = order[is_alloc]
        ends = np.where(nxt_free[is_alloc], np.append(order[1:], 0)[is_alloc], self.n)
        srt = np.argsort(starts, kind="stable")
        starts, ends = starts[srt], ends[srt]
        al = Allocations(starts, ends, self.cols["size"][starts], addr[starts], self.cols["stack"][starts],
                         self.cols["meta"][starts])
        self._cache["allocs"] = al
        return al

    def frames(self, stack: int) -> list[dict]:
        if stack < 0:
            return []
        t = self.cols
        lo, hi = int(t["stack_offsets"][stack]), int(t["stack_offsets"][stack + 1])
        s = self.strings
        return [{"name": s[t["frame_name"][f]], "filename": s[t["frame_file"][f]], "line": int(t["frame_line"][f])}
                for f in t["stack_frames"][lo:hi].tolist()]

    def site(self, stack: int, skip=DEFAULT_SKIP) -> str:
        """The call site of a stack (frames.call_site: never a C++ frame while a Python frame exists)."""
        key = ("site", stack, tuple(skip))
        if key not in self._cache:
            self._cache[key] = site_label(self.frames(stack), skip) or NO_STACK
        return self._cache[key]

    def meta_text(self, code: int) -> str:
        return "" if code < 0 else self.strings[code]

    def annotation_intervals(self) -> list[tuple[int, int, str]]:
        """External annotations as (first entry, end entry, name), START/END matched by name."""
        if "ann" in self._cache:
            return self._cache["ann"]
        t, times = self.cols, self.cols["time_us"]
        open_: dict[str, list[int]] = {}
        out = []
        for stage, name, tu in zip(t["ann_stage"].tolist(), t["ann_name"].tolist(), t["ann_time"].tolist()):
            x = int(np.searchsorted(times, tu, side="left"))
            if stage == 0:
                open_.setdefault(name, []).append(x)
            elif open_.get(name):
                out.append((open_[name].pop(), x, self.strings[name]))
        for name, xs in open_.items():
            out += [(x, self.n, self.strings[name]) for x in xs]
        out.sort()
        self._cache["ann"] = out
        return out

    def label(self, stack: int, event: int, skip=DEFAULT_SKIP) -> str:
        """The call site, or for an entry without frames (autograd thread) the innermost annotation around it."""
        s = self.site(stack, skip)
        if s != NO_STACK:
            return s
        k = int(self.innermost_annotation()[event]) if 0 <= event < self.n else -1
        return f"{NO_STACK} in {self.annotation_intervals()[k][2]}" if k >= 0 else s

    def innermost_annotation(self) -> np.ndarray:
        """Per entry, the index of the narrowest annotation interval around it (-1: none): intervals are
        painted widest first, so narrower (inner) ones overwrite."""
        if "inner" not in self._cache:
            inner = np.full(self.n, -1, dtype=np.int32)
            ivs = self.annotation_intervals()
            for k in sorted(range(len(ivs)), key=lambda k: ivs[k][0] - ivs[k][1]):
                inner[ivs[k][0]:ivs[k][1]] = k
            self._cache["inner"] = inner
        return self._cache["inner"]


def load_device(store, trace_id: str, device: int) -> Device:
    cols, strings, extra = device_tables(store, trace_id, device)
    tid = store._id(trace_id)
    return Device(tid, device, cols, strings, extra, store.meta(tid).name)


# --- peak ----------------------------------------------------------------------------------
def live_at(dev: Device, k: int) -> np.ndarray:
    """Rows of dev.allocations() live after entry k (allocated at or before k, not yet freed)."""
    al = dev.allocations()
    return np.flatnonzero((al.start <= k) & (al.end > k))


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
    return _noted(dev, {"device": dev.device, "n_events": dev.n, "peak_requested": int(req[k]) if dev.n else 0,
                        "peak_reserved": int(res.max()) if dev.n else 0, "event": k,
                        "time_us": int(dev.cols["time_us"][k]) if dev.n else None, "live_allocations": len(rows),
                        "by_call_site": by_call_site(dev, rows, k, skip, top)})


def _noted(dev: Device, out: dict) -> dict:
    """An answer about a partial trace says so (`partial`: the line to show)."""
    line = partial_note(dev.extra)
    if line:
        out["partial"] = line
    return out


# --- OOM -----------------------------------------------------------------------------------
def oom_card(dev: Device, index: "StateIndex", skip=DEFAULT_SKIP, which: int = 0) -> dict | None:
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
            "cache_releases": cache_releases(dev, k), "site": dev.label(stack, k, skip), "stack": dev.frames(stack),
            "meta": dev.meta_text(int(dev.cols["meta"][k])),
            "holders": by_call_site(dev, live_at(dev, k), k, skip, top=15),
            "largest_blocks": largest_live(dev, k, skip)}
    if "cap" not in dev._cache:
        dev._cache["cap"] = cap_bounds(dev.cols, dev.extra)
    bounds = dev._cache["cap"]
    retries = dev.extra.get("alloc_retries")
    card["retries"] = retries if retries is not None else (bounds or {}).get("retries_seen")
    card["retries_source"] = "model" if retries is not None else "trace"
    card["cap"] = None if not bounds or not bounds.get("upper") else {
        "lower": bounds["lower"], "upper": bounds["upper"], "roundest": bounds["roundest"], "source": "inferred"}
    card["cause"] = cause(card, bounds)
    return _noted(dev, card)


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


# --- state ---------------------------------------------------------------------------------
class StateIndex:
    """Allocator states at any entry: a forward replay from the nearest checkpoint (every 20k entries)."""

    def __init__(self, dev: Device):
        self.dev = dev
        settings = dev.extra.get("allocator_settings") or {}
        split = settings.get("max_split_size")
        self.split = split if isinstance(split, int) else None
        seed = (dev.extra.get("partial") or {}).get("seed")
        first = AllocatorState.seeded(dev.cols, seed, self.split) if seed else AllocatorState(dev.cols, self.split)
        self.checkpoints: dict[int, AllocatorState] = {0: first}
        self.cursor: AllocatorState | None = None

    def at(self, k: int) -> AllocatorState:
        k = max(0, min(k, self.dev.n))
        if self.cursor is None or self.cursor.at > k:
            base = max(c for c in self.checkpoints if c <= k)
            self.cursor = self.checkpoints[base].clone()
        while self.cursor.at < k:
            step = min(k, (self.cursor.at // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY)
            self.cursor.apply(step)
            if step % CHECKPOINT_EVERY == 0 and step not in self.checkpoints:
                self.checkpoints[step] = self.cursor.clone()
        return self.cursor


def entry(dev: Device, k: int, skip=DEFAULT_SKIP, frames: bool = False) -> dict | None:
    if not 0 <= k < dev.n:
        return None
    c = dev.cols
    stack = int(c["stack"][k])
    out = {"i": k, "action": ACTIONS[int(c["action"][k])], "addr": int(c["addr"][k]), "size": int(c["size"][k]),
           "stream": int(c["stream"][k]), "time_us": int(c["time_us"][k]),
           "meta": dev.meta_text(int(c["meta"][k])), "site": dev.label(stack, k, skip)}
    if frames:
        out["frames"] = dev.frames(stack)
    return out


def state(dev: Device, index: StateIndex, k: int, skip=DEFAULT_SKIP, max_blocks: int = MAX_BLOCKS) -> dict:
    """Segments and blocks after entries 0..k-1 (blocks: allocated / pending_free / free), and the totals."""
    st = index.at(k)
    segments, n_blocks = [], 0
    for seg in st.ordered():
        blocks = []
        for b in seg.blocks:
            if n_blocks >= max_blocks:
                break
            n_blocks += 1
            blocks.append({"offset": b.addr - seg.addr, "size": b.size, "state": b.state, "requested": b.requested,
                           "alloc": b.event if b.event >= 0 else None,
                           "site": dev.label(int(dev.cols["stack"][b.event]), b.event, skip) if b.event >= 0 else None})
        segments.append({"address": seg.addr, "size": seg.size, "stream": seg.stream,
                         "pool": "small" if seg.small else "large",
                         "blocks": blocks})
    return _noted(dev, {"event": st.at, "n_events": dev.n, "totals": st.totals(), "segments": segments,
                        "truncated": n_blocks >= max_blocks, "next": entry(dev, st.at, skip)})


# --- timeline ------------------------------------------------------------------------------
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
             max_bands: int = 120, band_points: int = 300, skip=DEFAULT_SKIP) -> dict:
    """Allocated (requested) bytes over entries, stacked by allocation in allocation order, as the official
    viewer draws it: each drawn allocation is a band from the bytes allocated before it and still live to that
    plus its size. Only the `max_bands` largest allocations live in the window are drawn."""
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
    out["annotations"] = annotation_bands(dev, x0, x1)
    return _noted(dev, out)


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
