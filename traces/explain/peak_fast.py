"""A ggml graph's peak from its list of Events in plain Python: what `peak.ggml_peak` answers, without numpy.

A sweep summarises every point it runs in a fresh worker; importing numpy costs such a worker more than
the whole program run it measures. `ggml_peak_events` walks the events the way `memmap.lifetimes.extract`
cuts lifetimes (alloc opens; a reuse closes the parent's bytes and opens the node's, its size carried
forward from the last open on the same (chunk, offset); a head free_extra, paired with the latest reuse
before it when that is on its chunk, closes the node's bytes and reopens them without the tail; free closes; realloc cuts; each buffer
of a gallocr on its own) and then marks, moments and holes as `ggml_peak` does, with its orders on ties
(lifetimes sorted by (chunk, offset), event, close before open; the earliest setter; the latest holder of
a hole first). `peak_of_events` uses it, and `ggml_peak` (numpy) where it declines (a graph too large
for a Python walk to win, values the store's columns would write differently) or where numpy is loaded
already and the graph is large enough for its column passes to win.
"""
from __future__ import annotations

import sys
from bisect import bisect_right

from alloctrace.traces.store.columns import EventColumns
from alloctrace.traces.explain.peak_types import (MAX_HOLES, GraphPeak, Live, Moment, Occurrences, display_name,
                                                  family_of, held_intervals, holes_below, unheld_bytes)

MAX_EVENTS = 200_000  # above this numpy's whole-column passes win over a walk, even counting numpy's import
NUMPY_LOADED_MAX = 40_000  # where numpy is already imported, its passes win above about this many events
MISSING = -1  # an absent integer, as the store's public columns write it
_KEY_CHUNK = 1 << 44  # a lifetime's key: chunk * 2**44 + offset, as extract() builds it
_PLACING = frozenset(("alloc", "reuse", "free", "free_extra", "realloc"))


class _Graph:
    """The event fields a peak reads, as lists with MISSING for absent integers."""

    def __init__(self, events):
        self.n = len(events)
        if isinstance(events, EventColumns):  # the columns, each decoded straight into what the walk reads
            col = events.field
            self.kind, self.tensor, self.op = col("kind"), col("tensor"), col("op")
            self.offset, self.size = events.ints("offset", MISSING), events.ints("size", MISSING)
            self.chunk = [0 if v < 0 else v for v in events.ints("chunk", 0)]
            self.buffer = events.ints("buffer", MISSING)
        else:
            self.kind = [e.kind for e in events]
            self.offset = [MISSING if e.offset is None else e.offset for e in events]
            self.size = [MISSING if e.size is None else e.size for e in events]
            self.chunk = [0 if e.chunk is None or e.chunk < 0 else e.chunk for e in events]
            self.buffer = [MISSING if e.buffer is None else e.buffer for e in events]
            self.tensor = [e.tensor for e in events]
            self.op = [e.op for e in events]
        self.events = events
        # the events that can open, close or cut a lifetime: the only ones a walk looks at
        self.placing = [i for i, k in enumerate(self.kind) if k in _PLACING]
        kind, tensor = self.kind, self.tensor
        self.names = Occurrences([(i, tensor[i]) for i in self.placing if kind[i] in ("alloc", "reuse")],
                                 [i for i in self.placing if kind[i] == "realloc"])

    def plain(self) -> bool:
        """Do these values mean here what they mean in the store's columns (ints in range)? (Columns hold
        ints only: for them only the range is looked at.)"""
        ints = isinstance(self.events, EventColumns)
        for col, top in ((self.offset, _KEY_CHUNK), (self.size, 1 << 62), (self.chunk, 1 << 18),
                         (self.buffer, 1 << 31)):
            if not ints and not set(map(type, col)) <= {int}:
                return False
            if col and (max(col) >= top or min(col) < MISSING):
                return False
        return True


class _Lifetimes:
    """One buffer's lifetimes in extract()'s order: parallel lists, `src` the event whose bytes they are."""

    def __init__(self):
        self.start, self.end, self.offset, self.size, self.chunk, self.src, self.y0 = [], [], [], [], [], [], []

    def __len__(self):
        return len(self.start)


def _active(g: _Graph, b: int | None) -> list[int]:
    """The placing events buffer `b` sees (`_only_buffer`: another buffer's events are inert)."""
    if b is None:
        return g.placing
    buf = g.buffer
    return [i for i in g.placing if buf[i] < 0 or buf[i] == b]


def _place_reuses(g: _Graph, active: list[int], offset: list, chunk: list) -> None:
    """A reuse logged without its bytes takes its parent's (or the view source's) live place."""
    kind, tensor = g.kind, g.tensor
    where: dict = {}
    live: set = set()
    for i in active:
        k = kind[i]
        if k == "free_extra":
            continue
        if k == "realloc":
            where.clear()
            live.clear()
            continue
        if k == "reuse" and offset[i] == MISSING:
            e = g.events[i]
            for name in (e.parent, e.view_src):
                key = where.get(name)
                if key is not None and key in live:
                    chunk[i], offset[i] = key
                    break
        if offset[i] == MISSING:
            continue
        key = (chunk[i], offset[i])
        if k == "free":
            live.discard(key)
        else:
            live.add(key)
            where[tensor[i]] = key


def _lifetimes(g: _Graph, b: int | None) -> _Lifetimes:
    """extract() for one buffer's view of the graph (lifetimes, offsets, chunks and stacked y0)."""
    kind, size, n = g.kind, g.size, g.n
    active = _active(g, b)
    offset, chunk = g.offset, g.chunk
    if any(kind[i] == "reuse" and offset[i] == MISSING for i in active):
        offset, chunk = list(offset), list(chunk)
        _place_reuses(g, active, offset, chunk)
    items = []  # (key, event, opens, source event, own size or MISSING)
    append = items.append
    reallocs = []
    last_reuse = -1
    for i in active:
        k = kind[i]
        if k == "realloc":
            reallocs.append(i)
            continue
        off = offset[i]
        if off == MISSING:
            continue
        if k == "alloc":
            append((chunk[i] * _KEY_CHUNK + off, i, 1, i, size[i]))
        elif k == "reuse":
            key = chunk[i] * _KEY_CHUNK + off
            append((key, i, 0, i, MISSING))
            append((key, i, 1, i, MISSING))
            last_reuse = i
        elif k == "free":
            append((chunk[i] * _KEY_CHUNK + off, i, 0, i, MISSING))
        elif last_reuse >= 0 and chunk[last_reuse] == chunk[i]:  # a head free_extra of the last reuse
            r = last_reuse
            key = chunk[r] * _KEY_CHUNK + offset[r]
            append((key, i, 0, r, MISSING))
            append((key, i, 1, r, off - offset[r]))
    items.sort()  # (key, event, opens) is unique, so the rest of an item never decides

    lt = _Lifetimes()
    opened = None  # the open waiting for the next item on its key
    prev_key, known = None, MISSING
    for key, i, opens, src, own in items:
        if key != prev_key:
            if opened is not None:
                lt.end[opened] = n
                opened = None
            prev_key, known = key, MISSING
        elif opened is not None:
            lt.end[opened] = i
            opened = None
        if own != MISSING:
            known = own
        if opens and known > 0:
            opened = len(lt.start)
            lt.start.append(i)
            lt.end.append(n)
            lt.size.append(known)
            lt.src.append(src)
    if reallocs:
        for j, s in enumerate(lt.start):
            k = bisect_right(reallocs, s)
            if k < len(reallocs) and reallocs[k] < lt.end[j]:
                lt.end[j] = reallocs[k]
    lt.offset = [offset[s] for s in lt.src]
    lt.chunk = [chunk[s] for s in lt.src]
    extent: dict[int, int] = {}
    for c, off, sz in zip(lt.chunk, lt.offset, lt.size):
        if off + sz > extent.get(c, 0):
            extent[c] = off + sz
    bases, base = {}, 0
    for c in range(max(lt.chunk) + 1 if lt.chunk else 0):
        bases[c] = base
        base += extent.get(c, 0)
    lt.y0 = [bases[c] + off for c, off in zip(lt.chunk, lt.offset)]
    return lt


def _live_at(lt: _Lifetimes, event: int, chunk: int | None = None) -> list[int]:
    """Lifetimes holding bytes once `event` has happened."""
    start, end, ch = lt.start, lt.end, lt.chunk
    return [j for j in range(len(start)) if start[j] <= event < end[j] and (chunk is None or ch[j] == chunk)]


def _moment(g: _Graph, lt: _Lifetimes, idx: list[int], event: int, top: int, chunk: int | None = None,
            holes: bool = True) -> Moment:
    tensor, op, names = g.tensor, g.op, g.names
    live = []
    for j in idx:
        s = lt.src[j]
        live.append(Live(str(tensor[s] or ""), family_of(tensor[s], op[s]), op[s], lt.size[j], lt.offset[j],
                         lt.chunk[j], lt.y0[j], lt.start[j], lt.end[j], names.of(tensor[s], lt.start[j])))
    used = sum(t.bytes for t in live)
    gaps = holes_below(live, top)
    m = Moment(event, top, live, top - used, max((n for _, n in gaps), default=0))
    if holes:
        done = _done(lt, event, chunk)
        held = held_intervals([lt.offset[j] for j in done], [lt.size[j] for j in done])
        m.unattributed = sum(unheld_bytes(off, n, held) for off, n in gaps)
        m.holes = _freed_in(g, lt, sorted(gaps, key=lambda x: (-x[1], x[0]))[:MAX_HOLES], done, held)
    return m


def _done(lt: _Lifetimes, event: int, chunk: int | None) -> list[int]:
    """Lifetimes over before `event` (on `chunk`)."""
    end = lt.end
    return [j for j in range(len(end)) if end[j] <= event and (chunk is None or lt.chunk[j] == chunk)]


def _freed_in(g: _Graph, lt: _Lifetimes, gaps: list, done: list[int], held: list) -> list[dict]:
    """Each hole, the (up to 3) latest lifetimes that held its bytes before the moment (`done`), and its
    bytes none of them held."""
    end, off_, size = lt.end, lt.offset, lt.size
    out = []
    for off, n in gaps:
        hit = [j for j in done if off_[j] < off + n and off_[j] + size[j] > off]
        hit.sort(key=lambda j: -end[j])  # stable: index order among equal ends
        out.append({"offset": off, "bytes": n, "unattributed": unheld_bytes(off, n, held), "freed": [
            _freed(g, lt, j) for j in hit[:3]]})
    return out


def _freed(g: _Graph, lt: _Lifetimes, j: int) -> dict:
    name = g.tensor[lt.src[j]]
    return {"tensor": str(name or ""), "occurrence": g.names.of(name, lt.start[j]), "bytes": lt.size[j],
            "freed_at": lt.end[j]}


def ggml_peak_events(events, capacity: int | None = None, buffer_names: list[str] | None = None,
                     buffer_sizes: list[int] | None = None) -> GraphPeak | None:
    """`ggml_peak(events, ...)` for a list of Events (or their EventColumns), or None where this walk does not
    answer."""
    events = events if isinstance(events, (list, EventColumns)) else list(events)
    if len(events) > MAX_EVENTS:
        return None
    g = _Graph(events)
    if not g.plain():
        return None
    ids = sorted({b for b in g.buffer if b >= 0})
    per_buffer = {b: _lifetimes(g, b) for b in ids} or {None: _lifetimes(g, None)}
    last_plan = max((i for i in g.placing if g.kind[i] == "realloc"), default=-1)
    buffers = []
    for b, lt in per_buffer.items():
        tops = [o + s for o, s in zip(lt.offset, lt.size)]
        after = [j for j in range(len(lt)) if lt.start[j] > last_plan]
        for c in sorted({lt.chunk[j] for j in after}):
            mine = [j for j in after if lt.chunk[j] == c]
            mark = max(tops[j] for j in mine)
            k = min((j for j in mine if tops[j] == mark), key=lambda j: lt.start[j])  # first of the earliest
            event = lt.start[k]
            name = buffer_names[b] if b is not None and buffer_names and b < len(buffer_names) else None
            setter = g.tensor[lt.src[k]]
            buffers.append({"buffer": b, "chunk": c, "name": name,
                            "tensor": display_name(setter, g.names.of(setter, lt.start[k])),
                            "moment": _moment(g, lt, _live_at(lt, event, c), event, mark, c)})
    peak = GraphPeak(buffers, g.n)
    e = next((i for i, k in enumerate(g.kind) if k == "oom"), None)
    if e is not None:
        b = g.buffer[e] if g.buffer[e] >= 0 else None
        if b is not None:  # the failing buffer's own lifetimes and real size
            capacity = buffer_sizes[b] if buffer_sizes and b < len(buffer_sizes) else None
        lt = per_buffer[b] if b in per_buffer else _lifetimes(g, None)
        peak.failure = _failure(g, e, lt, capacity, b)
    return peak


def _failure(g: _Graph, e: int, lt: _Lifetimes, capacity: int | None, buffer: int | None) -> dict:
    """The first out-of-space event `e`, with what filled chunk 0 of the buffer just before it."""
    ev = g.events[e]
    idx = _live_at(lt, e - 1, 0) if e > 0 else []
    top = capacity if capacity else max([0] + [lt.offset[j] + lt.size[j] for j in idx])
    m = _moment(g, lt, idx, e, top, holes=False)  # a failure names no holes
    need, largest = ev.needed, ev.largest
    out = {"event": e, "tensor": ev.tensor, "needed": need if need is not None and need >= 0 else None,
           "largest_available": largest if largest is not None and largest >= 0 else None,
           "capacity": capacity, "live_bytes": top - m.free_below, "free": m.free_below,
           "largest_hole": m.largest_hole, "families": m.families()}
    if buffer is not None:
        out["buffer"] = buffer
    return out


def peak_of_events(events, capacity: int | None = None, buffer_names: list[str] | None = None,
                   buffer_sizes: list[int] | None = None) -> GraphPeak:
    """A graph's peak: the plain walk where it answers, else `ggml_peak` (numpy, imported only then)."""
    events = events if isinstance(events, (list, EventColumns)) else list(events)
    if len(events) <= NUMPY_LOADED_MAX or "numpy" not in sys.modules:
        peak = ggml_peak_events(events, capacity, buffer_names, buffer_sizes)
        if peak is not None:
            return peak
    from alloctrace.traces.explain.peak import ggml_peak

    return ggml_peak(list(events), capacity, buffer_names, buffer_sizes)
