"""Split repeated stretches of a log once: a body of lines seen before is not parsed again.

A *body* is the run of lines between two `#######` lines (graph headers). Once
the log has shown a graph header, what feeding a body's lines does to the
Splitter depends only on a few small values (the open draft's counters and
hints, pending hints, blank-line bookkeeping, the generation features) and on
the lines themselves; the body only appends items to the open draft. The memo
keys on exactly those values and the body's full text (compared in full, no
digests), and remembers what feeding changed: a hit appends the same items and
sets the same values, as feeding would have.

Bodies that would do more (start or end a draft, hold a graph header, patch
an earlier item's address) are fed line by line and not remembered. The
Splitter's `live` set is left alone on hits: with graph headers it is never read.
"""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Iterator

from alloctrace.traces.sources.ggml_log.parse_log import LineMemo
from alloctrace.traces.sources.ggml_log.split import Draft, Features, Splitter

UNREMEMBERED = ("graph", "data_addr")  # items that reach back into earlier items or drafts
# the state a body's outcome depends on, from the dataclasses themselves (a new field joins the key)
DRAFT_STATE = tuple(f.name for f in fields(Draft) if f.name != "items")
FEATURE_DELTAS = ("n_alloc_lines", "asserts")  # counted and appended to: remembered as what a body added
FEATURE_STATE = tuple(f.name for f in fields(Features) if f.name not in FEATURE_DELTAS)
_draft_state, _feature_state = attrgetter(*DRAFT_STATE), attrgetter(*FEATURE_STATE)
_splitter_state = attrgetter(*Splitter.FEED_STATE)


class BodyMemo:
    MAX_CHARS = 1 << 23  # text held in keys; the memo starts over when it would hold more

    def __init__(self, split: Splitter, parse: LineMemo):
        self.split, self.parse = split, parse
        self.memo: dict = {}
        self.chars = 0
        self.lineno = 0  # lines fed so far (for error messages)
        self.hits = self.misses = 0

    def _state(self) -> tuple:
        sp = self.split
        return (_draft_state(sp.cur), _feature_state(sp.features), _splitter_state(sp), tuple(sp.pending.items()))

    def _set_state(self, state: tuple):
        sp = self.split
        draft, features, splitter, pending = state
        for obj, names, values in ((sp.cur, DRAFT_STATE, draft), (sp.features, FEATURE_STATE, features),
                                   (sp, Splitter.FEED_STATE, splitter)):
            for name, value in zip(names, values):
                setattr(obj, name, value)
        sp.pending = dict(pending)

    def feed(self, lines: list[str]) -> Iterator[Draft]:
        """Feed the body's lines to the Splitter; yields the drafts that ends."""
        if not lines:
            return
        sp = self.split
        key = None
        if sp.headers_seen and sp.cur is not None:
            key = (self._state(), "\n".join(lines))
            hit = self.memo.get(key)
            if hit is not None:
                self.hits += 1
                self._apply(hit)
                self.lineno += len(lines)
                return
        self.misses += 1
        cur, f = sp.cur, sp.features
        n_items = len(cur.items) if cur is not None else 0
        last, n_alloc, n_asserts = sp.last_alloc, f.n_alloc_lines, len(f.asserts)
        remember = key is not None
        parse, feed = self.parse, sp.feed
        for line in lines:
            self.lineno += 1
            item = parse(line)
            if type(item) is tuple and item[0] in UNREMEMBERED:
                remember = False
            draft = feed(item)
            if draft is not None:
                remember = False
                yield draft
        if not remember or sp.cur is not cur:
            return
        added = cur.items[n_items:]
        last_at = None
        if sp.last_alloc is not last:
            last_at = max(i for i, it in enumerate(added) if it is sp.last_alloc)
        if self.chars + len(key[1]) > self.MAX_CHARS:
            self.memo.clear()
            self.chars = 0
        self.memo[key] = (added, self._state(), f.n_alloc_lines - n_alloc, f.asserts[n_asserts:], last_at,
                          len(lines))
        self.chars += len(key[1])

    def _apply(self, hit: tuple):
        added, state, n_alloc, asserts, last_at, _ = hit
        sp = self.split
        sp.cur.items.extend(added)
        self._set_state(state)
        sp.features.n_alloc_lines += n_alloc
        sp.features.asserts.extend(asserts)
        if last_at is not None:
            sp.last_alloc = added[last_at]
