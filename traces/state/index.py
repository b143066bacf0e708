"""One graph's allocator state at any event, fast enough to scrub a million-event graph.

Only the events that change the free list or the live tensors (alloc, free,
free_extra, reuse, realloc) are replayed, selected from the store's columns in
one vectorised pass and fed to `free_list_fast.apply_changes` (the loop the diff's
cursors use too). Replay checkpoints bound the work of any request to the
distance between two of them. A checkpoint is a copy of the state, so the next
one comes at least as many events later as the state is large (live tensors,
free blocks, names and anomalies; and at least `step` events): each checkpoint
holds no more entries than there are events up to the next one (the last one
holds what the events before it made), so all of them together stay within a
small multiple of the graph's events, and a request replays no more events
than the state it answers holds (or `step`). A graph that only allocates (or
frees twice) would otherwise keep a growing copy every `step` events: quadratic
memory.

A graph of `SAVED_MIN_EVENTS` or more has its checkpoints made once, when it is
stored (`saved_checkpoints`, the same replay), so even the first request loads
one checkpoint and replays at most one spacing. Smaller graphs, and graphs of a
store written before checkpoints were kept, make them on demand as requests go
further (a first request replays up to its event).
"""
from __future__ import annotations

import threading
from bisect import bisect_right
from dataclasses import dataclass
from itertools import repeat
from typing import Iterator

import numpy as np

from alloctrace.traces.state.free_list_fast import apply_changes
from alloctrace.traces.state.free_list import CHANGE_KINDS, MISSING, ColumnEvents, Replay, free_summary, infer_alignment

from alloctrace.traces.store.blobs import checkpoint_rows
from alloctrace.traces.store.derived import SAVED_MIN_EVENTS, Derived, Saved  # noqa: F401 (Saved: the type of saved)
from alloctrace.traces.store.graph_info import capacity_of
from alloctrace.traces.util.gcpause import gc_paused

CODE_OF = {k: code for code, k in enumerate(CHANGE_KINDS)}
REPLAYED_FIELDS = ("kind", "chunk", "offset", "size", "tensor", "parent", "view_src")  # all a replay reads
# stored checkpoints end where the state holds more entries than this: a replay holding a million live
# tensors costs ~300 MB, more than the import it would ride on may take (requests past the last one
# replay from it, as every request did before checkpoints were stored)
SAVED_MAX_ENTRIES = 1 << 17


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


def column_changes(cols: dict, lo: int = 0, hi: int | None = None) -> Changes:
    """The rows lo..hi-1 of `cols` (Store.columns) that change the free list; an alloc without an
    offset (the failed attempt before an oom) changes nothing and is left out."""
    kind = cols["kind"][lo:hi]
    n = len(kind)
    code = np.fromiter(map(CODE_OF.get, kind, repeat(-1)), dtype=np.int8, count=n)
    offset = _ints(cols, "offset", lo, n)
    rows = np.flatnonzero((code >= 0) & ~((code == CODE_OF["alloc"]) & (offset == MISSING)))

    def objects(name):
        col = cols.get(name)
        return np.full(len(rows), None, dtype=object) if col is None else np.asarray(col[lo:lo + n], dtype=object)[rows]

    return Changes(rows + lo, code[rows], _ints(cols, "chunk", lo, n)[rows], offset[rows],
                   _ints(cols, "size", lo, n)[rows], objects("tensor"), objects("parent"), objects("view_src"))


def _ints(cols: dict, name: str, lo: int, n: int) -> np.ndarray:
    col = cols.get(name)
    return np.full(n, MISSING, dtype=np.int64) if col is None else np.asarray(col[lo:lo + n], dtype=np.int64)


class StateIndex:
    """States after any number of events, replayed from the nearest checkpoint (stored ones, or
    ones made on demand as requests go further, each at most once)."""

    step = 10000

    def __init__(self, cols: dict, capacity: int | None, saved: Saved | None = None):
        self.cols = cols
        self.n_events = len(cols["kind"])
        self.lock = threading.Lock()
        self._saved = None
        first = first_saved(saved, self.n_events, capacity)
        if first is not None:
            self._saved, self._marks = saved, list(saved.marks)
            self.checkpoints: dict[int, Replay] = {0: first}  # event -> the replay there (never changed)
            return
        first = Replay(capacity, infer_alignment(ColumnEvents(cols)), column_changes(cols).needs_names)
        self.checkpoints = {0: first}
        self._head = first.copy(capacity)  # the furthest replay, advanced in place
        self._marks = [0]

    def _advance(self, r: Replay, n: int):
        """Apply the changes of events r.n..n-1 to r."""
        if n > r.n:
            c = column_changes(self.cols, r.n, n)
            apply_changes(r, c.code.tolist(), c.chunk.tolist(), c.offset.tolist(), c.size.tolist(),
                             c.tensor.tolist(), lambda k: (c.parent[k], c.view_src[k]))
        r.n = n

    def _next_mark(self, r: Replay) -> int | None:
        """Where the checkpoint after one at `r` goes: at least as many events on as a copy of `r`
        holds entries (live tensors, free blocks, names, anomalies; and `step`); None past the end."""
        size = len(r.live) + sum(len(offs) for offs, _ in r.free.chunks.values()) + len(r.where) \
            + len(r.free.anomalies)
        at = r.n + max(self.step, size)
        return at if at <= self.n_events else None

    def _checkpoint_below(self, n: int) -> Replay:
        """The latest checkpoint at or before n: loaded from the store, or made on the way (under the lock)."""
        if self._saved is None:
            head = self._head
            while (at := self._next_mark(head)) is not None and at <= n:
                self._advance(head, at)
                self.checkpoints[at] = head.copy(head.capacity)
                self._marks.append(at)
        mark = self._marks[bisect_right(self._marks, n) - 1]
        if mark not in self.checkpoints:
            self.checkpoints[mark] = replay_from(self._saved.load(mark))
        return self.checkpoints[mark]

    def state(self, n: int) -> dict:
        if not 0 <= n <= self.n_events:
            raise ValueError(f"event {n} is out of range (0..{self.n_events})")
        with gc_paused():  # many small live records, no cycles
            with self.lock:
                base = self._checkpoint_below(n)
            r = base.copy(base.capacity)  # checkpoints are never changed once made
            self._advance(r, n)
            return r.state()


def first_saved(saved: Saved | None, n_events: int, capacity: int | None) -> Replay | None:
    """The replay at the first stored checkpoint, when the stored ones fit the graph (they cover it
    and were made for this capacity); None when states must be replayed on demand instead. With
    stored checkpoints a StateIndex reads its columns only from the last one before an event on."""
    if saved is None or not saved.marks or saved.marks[0] != 0 or saved.marks[-1] > n_events:
        return None
    first = replay_from(saved.load(0))
    return first if first.capacity == capacity else None


def saved_checkpoints(cols: dict, capacity: int | None) -> Iterator[dict]:
    """The checkpoints a StateIndex makes on its way to the end, as checkpoint_dict, one at a time
    (what the store keeps for a long graph; nothing but the replay itself stays in memory), up to
    the first whose state holds more than SAVED_MAX_ENTRIES entries."""
    with gc_paused():
        index = StateIndex(cols, capacity)
        head = index._head
        yield checkpoint_dict(head)
        while (at := index._next_mark(head)) is not None and at - head.n <= SAVED_MAX_ENTRIES:
            index._advance(head, at)
            yield checkpoint_dict(head)


def checkpoint_dict(r: Replay) -> dict:
    """A replay's whole state as JSON-ready lists (names may be None, so no name is a key)."""
    return {"n": r.n, "capacity": r.capacity, "alignment": r.alignment, "track_names": r.track_names,
            "free": [[c, offs, sizes] for c, (offs, sizes) in r.free.chunks.items()],
            "anomalies": r.free.anomalies, "live": [[c, o, t, s] for (c, o), (t, s) in r.live.items()],
            "where": [[t, c, o] for t, (c, o) in r.where.items()], "live_bytes": r.live_bytes,
            "peak_live": r.peak_live, "reused": r._reused}


def replay_from(d: dict) -> Replay:
    """The Replay that checkpoint_dict(d) was made from."""
    r = Replay(d["capacity"], d["alignment"], d["track_names"])
    r.free.chunks = {c: (offs, sizes) for c, offs, sizes in d["free"]}
    r.free.anomalies = list(d["anomalies"])
    r.live = {(c, o): [t, s] for c, o, t, s in d["live"]}
    r.where = {t: (c, o) for t, c, o in d["where"]}
    r.live_bytes, r.peak_live, r.n = d["live_bytes"], d["peak_live"], d["n"]
    r._reused = None if d["reused"] is None else tuple(d["reused"])
    return r


def state_json(index: StateIndex, n: int, next_event: dict | None) -> dict:
    """The state after the first n events, with free blocks as objects and their summary."""
    st = index.state(n)
    summary = free_summary(st)
    st["free_blocks"] = [{"offset": o, "size": s, "chunk": c} for o, s, c in st["free_blocks"]]
    st["free_summary"] = summary
    st["next_event"] = next_event
    return st


def _stored_rows(cols: dict, graph: dict, compressor) -> Iterator[tuple[int, bytes]]:
    return checkpoint_rows(saved_checkpoints(cols, capacity_of(graph, cols)), compressor.compress)


DERIVED = Derived("state_checkpoints", ("event", "data"), REPLAYED_FIELDS, _stored_rows)
