"""Recover each distinct graph once: logs repeat graphs (eval loops, perplexity chunks).

A graph's recovered events depend only on the replay's state when the graph
starts (the allocator's free list, max size, buffer, life) and on what the log
says about the graph (the draft's items and hints). The cache keys on exactly
those values, compared in full (no digests), so a hit is the graph the replay
would have produced: its stored form is reused and the replay jumps to the
state it would have ended in. Only the `graph` column (the graph's index)
differs between hits; it is made afresh each time.
"""
from __future__ import annotations

import json
from operator import attrgetter

from alloctrace.allocator.events import Event

from .columns import FIELDS, EncodedGraph, constant_column, encode, pack
from .split import Draft

_row = attrgetter(*FIELDS)
SRCS = FIELDS.index("srcs")
EXTRA = FIELDS.index("extra")


def item_key(item) -> tuple:
    """A hashable copy of one draft item's values."""
    if type(item) is not Event:
        return item  # ("buffer", name, from MiB, to MiB)
    row = _row(item)
    if item.srcs is not None:
        row = row[:SRCS] + (tuple(item.srcs),) + row[SRCS + 1:]
    return row[:EXTRA] + (json.dumps(item.extra, sort_keys=True) if item.extra else None,) + row[EXTRA + 1:]


def draft_key(d: Draft) -> tuple:
    return (d.measure_before, d.compute_after, d.buffer_before, d.buffer_after, d.alignment, d.vm_base, d.n_exec,
            tuple(map(item_key, d.items)))


class RecoveryCache:
    """Wraps a LegacyReplay or GallocrReplay; `graph(draft)` returns the stored form."""

    MAX_EVENTS = 1 << 18  # events held in keys; the cache starts over when it would hold more

    def __init__(self, replay, compress):
        self.replay, self.compress = replay, compress
        self.memo: dict = {}
        self.n_events = 0
        self.hits = self.misses = 0

    def graph(self, d: Draft) -> EncodedGraph:
        r = self.replay
        index = r.index
        key = (r.state(), draft_key(d))
        hit = self.memo.get(key)
        if hit is None:
            self.misses += 1
            rec = r.graph(d)
            for ev in rec.events:
                ev.graph = index
            cols, table = encode(rec.events)
            cols.pop("graph", None)
            strings, blobs = pack(cols, table, self.compress)
            hit = (rec.role, len(rec.events), rec.max_size, rec.buffer_size, rec.oom, rec.consistent, strings, blobs,
                   rec.extra, r.state())
            if self.n_events + len(d.items) > self.MAX_EVENTS:
                self.memo.clear()
                self.n_events = 0
            self.memo[key] = hit
            self.n_events += len(d.items)
        else:
            self.hits += 1
            r.restore(hit[-1])
            r.index += 1
        role, n, max_size, buffer_size, oom, consistent, strings, blobs, extra, _ = hit
        if n:
            col = constant_column("graph", index, n)
            blobs = [("graph", col.dtype.str, self.compress(col.tobytes()))] + blobs
        return EncodedGraph(index=index, role=role, n_events=n, max_size=max_size, buffer_size=buffer_size,
                            oom=None if oom is None else dict(oom), consistent=consistent, strings=strings,
                            blobs=blobs, extra=dict(extra))
