"""Recover each distinct graph once: logs repeat graphs (eval loops, perplexity chunks).

A graph's recovered events depend only on the replay's state when the graph
starts (the allocator's free list, max size, buffer, life) and on what the log
says about the graph (the draft's items and hints). The cache keys on exactly
those values - items by their LineMemo numbers, each standing for one set of
field values - so a hit is the graph the replay would have produced (no
digests, no collisions): its stored form is reused and the replay jumps to
the state it would have ended in. Only the `graph` column (the graph's index)
differs between hits; it is made afresh each time.
"""
from __future__ import annotations

from dataclasses import replace
from itertools import repeat

from alloctrace.traces.store.columns import EncodedGraph, constant_column
from alloctrace.traces.store.columns_fast import ColumnEncoder
from alloctrace.traces.sources.ggml_log.parse_log import LineMemo, item_key, own
from alloctrace.traces.sources.ggml_log.split import Draft


FILLED_IN = frozenset({"alloc", "free", "free_extra", "oom", "reuse"})  # kinds recover.py changes


def draft_key(d: Draft, memo: LineMemo) -> tuple:
    """The draft's hints and its items' values (as LineMemo numbers)."""
    items = d.items
    found = list(map(memo.keys.get, map(id, items), repeat(-1)))  # numbers are >= 0
    if -1 in found:  # items of their own (graph headers, aborts, copies, lines the memo forgot): one pass
        number = memo.number
        found = [k if k >= 0 else number(item_key(it)) for k, it in zip(found, items)]
    return d.measure_before, d.compute_after, d.buffer_before, d.buffer_after, d.alignment, d.vm_base, d.n_exec, \
        tuple(found)


class RecoveryCache:
    """Wraps a LegacyReplay or GallocrReplay; `graph(draft)` returns the stored form."""

    MAX_EVENTS = 1 << 18  # events held in keys; the cache starts over when it would hold more

    def __init__(self, replay, compress, memo: LineMemo):
        self.replay, self.compress, self.memo_lines = replay, compress, memo
        self.memo: dict = {}
        self.encoder = ColumnEncoder(compress)  # misses of a long run differ from the last one in a few columns
        self.n_events = 0
        self.hits = self.misses = 0

    def graph(self, d: Draft) -> EncodedGraph:
        r = self.replay
        index = r.index
        key = (r.state(), draft_key(d, self.memo_lines))
        hit = self.memo.get(key)
        if hit is None:
            self.misses += 1
            # the draft's items stay as logged; events the replay does not fill in stay shared,
            # which is why they are not numbered: the `graph` column is made below
            rec = r.graph(replace(d, items=own(d.items, FILLED_IN)))
            strings, blobs = self.encoder.pack(rec.events)
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
