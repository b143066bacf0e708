"""One graph's allocator state at any event, fast enough to scrub a million-event graph.

Only the events that change the free list or the live tensors (alloc, free,
free_extra, reuse, realloc) are replayed, selected from the store's columns in
one vectorised pass and fed to `Replay.apply_changes` (the loop the diff's
cursors use too). Replay checkpoints bound the work of any later request to the
distance between two of them. A checkpoint is a copy of the state, so the next
one comes at least as many events later as the state is large (and at least
`step` events): all checkpoints together hold no more entries than the graph has
events, and a request replays no more events than the state it answers holds
(or `step`). A graph that only allocates would otherwise keep a growing copy
every `step` events: quadratic memory.
"""
from __future__ import annotations

import threading
from bisect import bisect_right
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from alloctrace.traces.gcpause import gc_paused
from alloctrace.traces.state import CHANGE_KINDS, MISSING, ColumnEvents, Replay, free_summary, infer_alignment

CODE_OF = {k: code for code, k in enumerate(CHANGE_KINDS)}


@dataclass
class Changes:
    """A graph's free-list changes as parallel arrays, in event order."""

    event: np.ndarray  # index of the event that made the change
    code: np.ndarray  # index into CHANGE_KINDS
    chunk: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    tensor: np.ndarray  # object array of names (None: unnamed)
    parent: np.ndarray
    view_src: np.ndarray

    @property
    def needs_names(self) -> bool:
        """True when a reuse names its parent without an offset, so the replay must know where names live."""
        return bool(np.any((self.code == CODE_OF["reuse"]) & (self.offset == MISSING)))


def column_changes(cols: dict) -> Changes:
    """The rows of `cols` (Store.columns) that change the free list; an alloc without an offset
    (the failed attempt before an oom) changes nothing and is left out."""
    kind = cols["kind"]
    n = len(kind)
    code = np.fromiter(map(CODE_OF.get, kind, repeat(-1)), dtype=np.int8, count=n)
    offset = _ints(cols, "offset", n)
    event = np.flatnonzero((code >= 0) & ~((code == CODE_OF["alloc"]) & (offset == MISSING)))

    def objects(name):
        col = cols.get(name)
        return np.full(len(event), None, dtype=object) if col is None else np.asarray(col, dtype=object)[event]

    return Changes(event, code[event], _ints(cols, "chunk", n)[event], offset[event], _ints(cols, "size", n)[event],
                   objects("tensor"), objects("parent"), objects("view_src"))


def _ints(cols: dict, name: str, n: int) -> np.ndarray:
    col = cols.get(name)
    return np.full(n, MISSING, dtype=np.int64) if col is None else np.asarray(col, dtype=np.int64)


class StateIndex:
    """States after any number of events, replayed from the nearest checkpoint (every `step`
    events; built on demand, at most once each)."""

    step = 10000

    def __init__(self, cols: dict, capacity: int | None):
        self.n_events = len(cols["kind"])
        self.changes = column_changes(cols)
        first = Replay(capacity, infer_alignment(ColumnEvents(cols)), self.changes.needs_names)
        self.checkpoints: dict[int, tuple[Replay, int]] = {0: (first, 0)}  # event -> (replay there, changes applied)
        self._head = (first.copy(capacity), 0)  # the furthest replay, advanced in place
        self._marks = [0]
        self.lock = threading.Lock()

    def _advance(self, r: Replay, j: int, n: int) -> int:
        """Apply the changes of events before n to r (which has applied j of them); returns the new j."""
        c = self.changes
        end = int(np.searchsorted(c.event, n))
        if end > j:
            sl = slice(j, end)
            r.apply_changes(c.code[sl].tolist(), c.chunk[sl].tolist(), c.offset[sl].tolist(), c.size[sl].tolist(),
                            c.tensor[sl].tolist(), lambda k: (c.parent[j + k], c.view_src[j + k]))
        r.n = n
        return end

    def _checkpoint_below(self, n: int) -> tuple[Replay, int]:
        """The latest checkpoint at or before n, making the missing ones on the way (under the lock)."""
        head, j = self._head
        while head.n + self._spacing(head) <= n:
            at = head.n + self._spacing(head)
            j = self._advance(head, j, at)
            self.checkpoints[at] = (head.copy(head.capacity), j)
            self._marks.append(at)
            self._head = (head, j)
        return self.checkpoints[self._marks[bisect_right(self._marks, n) - 1]]

    def _spacing(self, r: Replay) -> int:
        """Events until the next checkpoint: at least the entries a copy of `r` holds."""
        size = len(r.live) + sum(len(offs) for offs, _ in r.free.chunks.values()) + len(r.where)
        return max(self.step, size)

    def state(self, n: int) -> dict:
        if not 0 <= n <= self.n_events:
            raise ValueError(f"event {n} is out of range (0..{self.n_events})")
        with gc_paused():  # many small live records, no cycles
            with self.lock:
                base, j = self._checkpoint_below(n)
            r = base.copy(base.capacity)  # checkpoints are never changed once made
            self._advance(r, j, n)
            return r.state()


def state_json(index: StateIndex, n: int, next_event: dict | None) -> dict:
    """The state after the first n events, with free blocks as objects and their summary."""
    st = index.state(n)
    summary = free_summary(st)
    st["free_blocks"] = [{"offset": o, "size": s, "chunk": c} for o, s, c in st["free_blocks"]]
    st["free_summary"] = summary
    st["next_event"] = next_event
    return st
