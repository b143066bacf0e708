"""One device of a stored torch trace as the views read it (`Device`), and its allocator state at any entry.

The other views of a device build on this: the timeline (memmap/torch_timeline.py), the peak by call site
and the OOM card (explain/torch_peak.py), the diff (diff/torch_snapshots.py). Every answer is bounded whatever the
snapshot's size: the state view caps blocks. Call sites are the first Python frame outside `skip` (torch
internals by default), innermost first, as the snapshot records frames; C++ frames only name stacks without
Python frames (torch_frames.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alloctrace.traces.state.torch_blocks import FREE, AllocatorState, initial_state
from alloctrace.traces.state.torch_frames import DEFAULT_SKIP, site_label  # noqa: F401 (DEFAULT_SKIP: the views' default)
from alloctrace.traces.state.torch_wrapped import note as partial_note
from alloctrace.traces.store.torch_stored import (ACTIONS, ALLOC, FREE_REQUESTED, OOM, SEGMENT_ALLOC, SEGMENT_FREE,
                                                   SEGMENT_MAP, SEGMENT_UNMAP, curves, device_tables)
from alloctrace.traces.util.answer_budget import charge

NO_STACK = "(no Python stack)"
PREEXISTING = "(allocated before the trace began)"
CHECKPOINT_EVERY = 20_000
MAX_BLOCKS = 20_000
FRAME_JSON = len('{"name":"","filename":"","line":12345},')  # a frame's JSON besides its two texts


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

    def frames(self, stack: int, answer: bool = False) -> list[dict]:
        """The stack's frames, innermost first; `answer`: they go into an answer, charged against its budget
        (traces/util/answer_budget.py) before they are built."""
        t = self.cols
        if not 0 <= stack < len(t["stack_offsets"]) - 1:  # past the table: a segment's or block's stack in a trace
            return []                                       # stored by a build that dropped them (before 2026-12)
        lo, hi = int(t["stack_offsets"][stack]), int(t["stack_offsets"][stack + 1])
        if answer:
            charge(self.stack_bytes(lo, hi), "stack frames")
        s = self.strings
        return [{"name": s[t["frame_name"][f]], "filename": s[t["frame_file"][f]], "line": int(t["frame_line"][f])}
                for f in t["stack_frames"][lo:hi].tolist()]

    def stack_bytes(self, lo: int, hi: int) -> int:
        """Bytes frames lo..hi take in a JSON answer, from the columns (nothing is built)."""
        if "text_len" not in self._cache:
            self._cache["text_len"] = np.fromiter(map(len, self.strings), dtype=np.int64, count=len(self.strings))
        n, t = self._cache["text_len"], self.cols
        f = t["stack_frames"][lo:hi]
        return int(n[t["frame_name"][f]].sum() + n[t["frame_file"][f]].sum()) + FRAME_JSON * (hi - lo)

    def site(self, stack: int, skip=DEFAULT_SKIP) -> str:
        """The call site of a stack (frames.call_site: never a C++ frame while a Python frame exists)."""
        key = ("site", stack, tuple(skip))
        if key not in self._cache:
            self._cache[key] = site_label(self.frames(stack), skip) or NO_STACK
        return self._cache[key]

    def snapshot_stacks(self) -> tuple[dict[int, int], dict[int, int]]:
        """Address -> stack id of the snapshot's segments and allocated blocks that were there before the trace's
        first entry and still at its end (no entry frees them): the only frames known of what a wrapped or late
        trace never saw allocated."""
        if "snap_stacks" not in self._cache:
            c, a = self.cols, self.cols["action"]
            freed = set(c["addr"][(a == FREE_REQUESTED) | (a == ALLOC)].tolist())
            gone = set(c["addr"][(a == SEGMENT_FREE) | (a == SEGMENT_UNMAP) | (a == SEGMENT_ALLOC)
                                 | (a == SEGMENT_MAP)].tolist())
            segs = {ad: st for ad, st in zip(c["seg_address"].tolist(), c["seg_stack"].tolist())
                    if st >= 0 and ad not in gone}
            blocks = {ad: st for ad, st, state in zip(c["blk_address"].tolist(), c["blk_stack"].tolist(),
                                                      c["blk_state"].tolist())
                      if st >= 0 and state <= 1 and ad not in freed}  # active_allocated, active_pending_free
            self._cache["snap_stacks"] = (segs, blocks)
        return self._cache["snap_stacks"]

    def snapshot_site(self, stack: int | None, skip=DEFAULT_SKIP) -> str | None:
        """The call site of a snapshot segment's or block's stack; None where its frames are not known."""
        if stack is None or not self.frames(stack):
            return None
        return self.site(stack, skip)

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


def live_at(dev: Device, k: int) -> np.ndarray:
    """Rows of dev.allocations() live after entry k (allocated at or before k, not yet freed)."""
    al = dev.allocations()
    return np.flatnonzero((al.start <= k) & (al.end > k))


# --- state ---------------------------------------------------------------------------------
class StateIndex:
    """Allocator states at any entry: a forward replay from the nearest checkpoint (every 20k entries)."""

    def __init__(self, dev: Device):
        self.dev = dev
        settings = dev.extra.get("allocator_settings") or {}
        split = settings.get("max_split_size")
        self.split = split if isinstance(split, int) else None
        seed = (dev.extra.get("partial") or {}).get("seed")
        first = initial_state(dev.cols, settings, seed)
        self.unknown = unknown_start(dev.extra)
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


def unknown_start(extra: dict) -> str | None:
    """Why the allocator's totals at an entry are not known (a trace that starts mid-run from a state that could
    not be recovered), or None. Its replay starts from nothing, so its totals would read as zeros: never shown."""
    p = extra.get("partial") or {}
    if not p.get("partial") or p.get("exact"):
        return None
    return (f"the allocator before this trace's first entry could not be recovered ({p.get('reason')}), so its "
            "reserved, allocated and free blocks at any entry are unknown; the allocations the trace itself made "
            "and still holds are listed")


def entry(dev: Device, k: int, skip=DEFAULT_SKIP, frames: bool = False) -> dict | None:
    if not 0 <= k < dev.n:
        return None
    c = dev.cols
    stack = int(c["stack"][k])
    out = {"i": k, "action": ACTIONS[int(c["action"][k])], "addr": int(c["addr"][k]), "size": int(c["size"][k]),
           "stream": int(c["stream"][k]), "time_us": int(c["time_us"][k]),
           "meta": dev.meta_text(int(c["meta"][k])), "site": dev.label(stack, k, skip)}
    if frames:
        out["frames"] = dev.frames(stack, answer=True)
    return out


def state(dev: Device, index: StateIndex, k: int, skip=DEFAULT_SKIP, max_blocks: int = MAX_BLOCKS) -> dict:
    """Segments and blocks after entries 0..k-1 (blocks: allocated / pending_free / free), and the totals.
    `after_entry` (k - 1, None at the start) is the number every face shows: the same entry numbering as peak,
    flame and the OOM card, where "at entry N" means entries 0..N applied."""
    out = _state(dev, index, k, skip, max_blocks)
    out["after_entry"] = out["event"] - 1 if out["event"] > 0 else None
    return out


def _state(dev: Device, index: StateIndex, k: int, skip, max_blocks: int) -> dict:
    st = index.at(k)
    if index.unknown:
        rows = live_at(dev, st.at - 1) if st.at else np.zeros(0, dtype=np.int64)
        al = dev.allocations()
        return noted(dev, {"event": st.at, "n_events": dev.n, "totals": None, "unknown": index.unknown,
                           "held_since_start": {"allocations": int(len(rows)), "bytes": int(al.size[rows].sum())},
                           "segments": [], "truncated": False, "next": entry(dev, st.at, skip)})
    segments, n_blocks = [], 0
    snap_segs, snap_blocks = dev.snapshot_stacks()
    for seg in st.ordered():
        blocks = []
        for b in seg.blocks:
            if n_blocks >= max_blocks:
                break
            n_blocks += 1
            blocks.append({"offset": b.addr - seg.addr, "size": b.size, "state": b.state, "requested": b.requested,
                           "alloc": b.event if b.event >= 0 else None,
                           "site": _site(dev, b.event, snap_blocks.get(b.addr) if b.state != FREE else None, skip)})
        segments.append({"address": seg.addr, "size": seg.size, "stream": seg.stream,
                         "pool": "small" if seg.small else "large",
                         "site": _site(dev, seg.event, snap_segs.get(seg.addr), skip), "blocks": blocks})
    return noted(dev, {"event": st.at, "n_events": dev.n, "totals": st.totals(), "segments": segments,
                       "truncated": n_blocks >= max_blocks, "next": entry(dev, st.at, skip)})


def _site(dev: Device, event: int, snapshot_stack: int | None, skip) -> str | None:
    """Who made a block or segment: its entry's call site, or for one older than the trace the snapshot's own
    frames of it (None where neither is known)."""
    if event >= 0:
        return dev.label(int(dev.cols["stack"][event]), event, skip)
    return dev.snapshot_site(snapshot_stack, skip)


def noted(dev: Device, out: dict) -> dict:
    """An answer about a partial trace says so (`partial`: the line to show)."""
    line = partial_note(dev.extra)
    if line:
        out["partial"] = line
    return out


SUMMARY_KEYS = ("peak_requested_event", "peak_reserved_event", "reserved_at_snapshot", "allocated_at_snapshot",
                "n_segments", "n_blocks", "n_stacks", "trace_matches_snapshot", "trace_complete",
                "baseline_requested", "baseline_reserved", "allocator_settings", "rank", "cuda_device")


def device_summary(dev: Device, max_ooms: int = 10) -> dict:
    """What a trace's summary says of one device beyond the stored row: its peaks' entries, what the snapshot
    held, whether the trace is whole (and, when not, what that means), and its first OOM entries."""
    ex = dev.extra
    out = {k: ex.get(k) for k in SUMMARY_KEYS}
    part = ex.get("partial") or {}
    out["partial"] = None if not part.get("partial") else {
        **{k: v for k, v in part.items() if k != "seed"}, "note": partial_note(ex)}
    out["oom_events"] = [int(i) for i in (dev.cols["action"] == OOM).nonzero()[0][:max_ooms]]
    return out
