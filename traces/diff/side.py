"""One run as the diff sees it: its placements, its buffer, and a forward-only replay of it.

Split from diff.py so each reads in one sitting; diff.py is the public API.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alloctrace.traces.diff.align import NONE, SCANNED, Placements, placements
from alloctrace.traces.state.free_list_fast import apply_changes
from alloctrace.traces.state.free_list import CHANGE_KINDS, Replay, as_events


@dataclass
class Side:
    """One run as the diff sees it."""

    label: str
    events: list
    placements: Placements
    capacity: int | None
    alignment: int
    meta: dict
    key: str = "a"  # "a" or "b": what the diff's sentences call this run (the header says which is which)


def meta_dict(meta) -> dict:
    """What the diff reads from a GraphRecord (its fields and `extra`), a dict, or nothing."""
    if meta is None:
        return {}
    if isinstance(meta, dict):
        return dict(meta)
    out = {k: getattr(meta, k) for k in ("role", "max_size", "buffer_size", "index", "name", "generation")
           if hasattr(meta, k)}
    out.update(getattr(meta, "extra", None) or {})
    return out


def make_side(events, meta, default_label: str) -> Side:
    """Scan one run; a 2023 run that is not a measure run ends at its `buffer_size`."""
    m = meta_dict(meta)
    p = placements(events)
    events = as_events(events)
    legacy = not bool(np.any(p.chunk[p.kind == 0] != NONE))
    capacity = m.get("capacity")
    if capacity is None and legacy and m.get("role") != "measure":
        capacity = m.get("buffer_size")  # a real 2023 buffer ends there; measure and head chunks do not
    label = m.get("label") or m.get("role") or default_label
    return Side(label, events, p, capacity, m.get("alignment") or _alignment(p), m, default_label)


def _alignment(p: Placements, limit: int = 64) -> int:
    """As state.infer_alignment, from the placement arrays."""
    sizes = p.size[(p.kind == 0) & (p.size > 0)]
    acc = int(np.bitwise_or.reduce(sizes)) if len(sizes) else 0
    return min(acc & -acc, limit) if acc else 1


# --- snapshots ------------------------------------------------------------------------------
MUTATION_NAMES = {code: name for name, code in SCANNED.items()}
assert all(SCANNED[k] == code for code, k in enumerate(CHANGE_KINDS))  # the scan's codes are the replay's


class Cursor:
    """Replays one side's free-list changes forward (never its other events), keeping the
    states at the points asked for in advance, so each side is replayed once."""

    def __init__(self, side: Side, points=()):
        self.side = side
        self.mutations = m = side.placements.mutations
        # names are only looked up by a reuse without an offset (imported head logs)
        self.replay = Replay(side.capacity, side.alignment, bool(np.any((m[:, 1] == 3) & (m[:, 3] == NONE))))
        self.j = 0
        self.pending = sorted(set(points))
        self.saved: dict[int, dict] = {}

    def run_to(self, n: int):
        """Apply every change of an event before event n."""
        while self.pending and self.pending[0] <= n:
            p = self.pending.pop(0)
            self._advance(p)
            self.saved[p] = self.replay.state()
        self._advance(n)

    def _advance(self, n: int):
        m, j, r = self.mutations, self.j, self.replay
        end = int(np.searchsorted(m[:, 0], n))  # changes of events before n
        if end > j:
            p = self.side.placements
            rows = m[j:end]
            apply_changes(r, rows[:, 1].tolist(), rows[:, 2].tolist(), rows[:, 3].tolist(), rows[:, 4].tolist(),
                             p.mutation_names[j:end], lambda k: p.mutation_links.get(j + k, (None, None)))
            self.j = end
        if n > r.n:
            r.n = n

    def event_of_change(self, j: int) -> int:
        """The event number of this side's j-th free-list change (the event count past the last)."""
        return int(self.mutations[j, 0]) if j < len(self.mutations) else len(self.side.events)

    def adopt(self, other: "Cursor", j: int) -> bool:
        """Start from `other`'s state after the first j changes, which this side shares; refused
        when a state was asked for before that point."""
        n = self.event_of_change(j)
        if other.j != j or self.j or (self.pending and self.pending[0] < n):
            return False
        self.replay, self.j = other.replay.copy(self.side.capacity, self.side.alignment), j
        self.replay.n = n
        return True

    def state(self, n: int) -> dict:
        if n not in self.saved:
            if n < self.replay.n:  # not asked for in advance: replay that side again
                again = Cursor(self.side, [n])
                again.run_to(n)
                return again.saved[n]
            self.pending.append(n)
            self.pending.sort()
            self.run_to(n)
        return self.saved[n]


def _live_peak(side: Side) -> int:
    """Running maximum of allocated minus freed bytes (head's unpadded frees padded back)."""
    m = side.placements.mutations
    if not len(m):
        return 0
    kind, size = m[:, 1], m[:, 4]
    delta = np.zeros(len(m), dtype=np.int64)
    delta[kind == 0] = size[kind == 0]
    frees = kind == 1
    al = side.alignment
    delta[frees] = -((size[frees] + al - 1) // al * al)
    delta[kind == 2] = -size[kind == 2]
    return int(max(0, np.cumsum(delta).max()))


def summary(side: Side) -> dict:
    """Sizes and counts of one run; `max_size` is the recorded one when the caller gave it."""
    p, m = side.placements, side.placements.mutations
    allocs = p.kind == 0
    ends = p.offset[allocs] + p.size[allocs]
    chunks = np.maximum(p.chunk[allocs], 0)
    high = 0
    for c in np.unique(chunks):
        high += int(ends[chunks == c].max())
    return {"label": side.label, "events": len(side.events), "placements": len(p), "allocs": int(allocs.sum()),
            "reuses": int((p.kind == 1).sum()), "frees": int((m[:, 1] == 1).sum()) if len(m) else 0,
            "high_water": high, "max_size": side.meta.get("max_size") or high, "peak_live": _live_peak(side),
            "capacity": side.capacity}
