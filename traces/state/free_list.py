"""The allocator's free list and live tensors at any event, rebuilt from the events alone.

Offsets and sizes are in the events (imported logs get them from the model's
replay), so replaying `alloc`, `free`, `free_extra` and `reuse` is enough: no
profile, no graph. The free list is kept as ggml keeps it (sorted by offset,
merged with its neighbours on free), so block indices match the logged `block K`.

A buffer's end is unknown unless the caller gives its capacity (a real 2023
buffer); otherwise the last block of each chunk is endless and reported with
size None (the measure allocator's 1 TB tail, a head chunk before it is sized).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

ENDLESS = 1 << 62  # stands for the open end of a measure buffer or an unsized chunk

MUTATIONS = frozenset({"alloc", "free", "free_extra", "reuse", "realloc"})
CHANGE_KINDS = ("alloc", "free", "free_extra", "reuse", "realloc")  # the codes of free_list_fast.apply_changes
MISSING = -1  # a missing chunk, offset or size in column form


def pad(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def infer_alignment(events, limit: int = 64) -> int:
    """The largest power of two (up to `limit`) dividing every allocated size: the padding
    that head's unpadded `freeing` sizes need when no live record tells the size."""
    if isinstance(events, ColumnEvents):
        sizes = events.cols["size"][(events.cols["kind"] == "alloc") & (events.cols["size"] > 0)]
        acc = int(np.bitwise_or.reduce(sizes)) if len(sizes) else 0
    else:
        acc = 0
        for e in events:
            if e.kind == "alloc" and e.size:
                acc |= e.size
    if not acc:
        return 1
    low = acc & -acc
    return min(low, limit)


class ColumnEvents:
    """A store's columns (`Store.columns`) read as a sequence of Event, built on access, so a
    replay of a few thousand events does not decode a million."""

    FIELDS = ("kind", "tensor", "size", "offset", "chunk", "block", "parent", "view_src", "needed", "largest")

    def __init__(self, cols: dict):
        self.cols = {k: cols[k] for k in self.FIELDS if k in cols}
        self.n = len(cols["kind"])

    def __len__(self):
        return self.n

    def __getitem__(self, i: int):
        from alloctrace.allocator.events import Event

        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        kw = {}
        for k, col in self.cols.items():
            v = col[i]
            if isinstance(v, np.integer):
                v = None if v == -1 else int(v)
            if v is not None:
                kw[k] = v
        return Event(**kw)


def as_events(events):
    """Event lists pass through; a columns dict becomes a ColumnEvents."""
    return ColumnEvents(events) if isinstance(events, dict) else events


class FreeList:
    """Free blocks per chunk: parallel sorted lists of offsets and sizes."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity  # bytes of chunk 0 (a real buffer), None: endless
        self.chunks: dict[int, tuple[list, list]] = {}
        self.anomalies: list[str] = []  # events that did not fit the free list (broken or partial logs)

    def _lists(self, chunk: int, first_offset: int):
        lists = self.chunks.get(chunk)
        if lists is None:
            # the first block starts where the first allocation does (an unaligned base is skipped)
            end = self.capacity if (self.capacity is not None and chunk == 0) else ENDLESS
            lists = self.chunks[chunk] = ([first_offset], [max(0, end - first_offset)])
        return lists

    def end_of(self, chunk: int) -> int:
        return self.capacity if (self.capacity is not None and chunk == 0) else ENDLESS

    def take(self, chunk: int, offset: int, size: int) -> int | None:
        """Carve [offset, offset+size) out of the free list; returns the block index it came from."""
        offs, sizes = self._lists(chunk, offset)
        i = bisect_right(offs, offset) - 1
        if i < 0 or offset + size > offs[i] + sizes[i]:
            self.anomalies.append(f"chunk {chunk} offset {offset} ({size} B) is not free")
            return None
        start, have = offs[i], sizes[i]
        if offset == start:
            if have == size:
                del offs[i], sizes[i]
            else:
                offs[i], sizes[i] = offset + size, have - size
        else:  # not carved from a block start: split, keep both remainders
            sizes[i] = offset - start
            rest = start + have - (offset + size)
            if rest:
                offs.insert(i + 1, offset + size)
                sizes.insert(i + 1, rest)
        return i

    def give(self, chunk: int, offset: int, size: int):
        """Return bytes, merging with the block that ends here and/or the one that starts after."""
        if size <= 0:
            return
        offs, sizes = self._lists(chunk, offset)
        i = bisect_left(offs, offset)
        if (i > 0 and offs[i - 1] + sizes[i - 1] > offset) or (i < len(offs) and offs[i] < offset + size):
            self.anomalies.append(f"chunk {chunk} offset {offset} ({size} B) freed twice")
            return
        joins_prev = i > 0 and offs[i - 1] + sizes[i - 1] == offset
        joins_next = i < len(offs) and offs[i] == offset + size
        if joins_prev:
            sizes[i - 1] += size
            if joins_next:
                sizes[i - 1] += sizes[i]
                del offs[i], sizes[i]
        elif joins_next:
            offs[i] = offset
            sizes[i] += size
        else:
            offs.insert(i, offset)
            sizes.insert(i, size)

    def blocks(self) -> list[tuple[int, int | None, int]]:
        """(offset, size, chunk) in chunk and address order; size None for an endless last block."""
        out = []
        for c in sorted(self.chunks):
            offs, sizes = self.chunks[c]
            out.extend((o, None if o + s >= ENDLESS else s, c) for o, s in zip(offs, sizes))
        return out

    def shape(self) -> tuple:
        """What two free lists are compared by: every block's offset and size, except that the
        block reaching the end of its buffer counts only by where it starts (a measure run's
        endless tail and a real run's finite one are the same block)."""
        out = []
        for c in sorted(self.chunks):
            offs, sizes = self.chunks[c]
            if not offs:
                continue
            end = self.end_of(c)
            last = sizes[-1] if offs[-1] + sizes[-1] < end else -1
            out.append((c, tuple(offs), tuple(sizes[:-1]), last))
        return tuple(out)


class Replay:
    """Apply events one by one; keeps the free list, the live tensors and the live-byte peak."""

    def __init__(self, capacity: int | None = None, alignment: int = 1, track_names: bool = True):
        self.capacity, self.alignment = capacity, max(1, alignment)
        # `where` is only read by a reuse without an offset; a caller that knows there is none turns it off,
        # so checkpoints of a million-event replay do not each copy a million names
        self.track_names = track_names
        self.free = FreeList(capacity)
        self.live: dict[tuple[int, int], list] = {}  # (chunk, offset) -> [tensor, size]
        self.live_bytes = self.peak_live = 0
        self.n = 0  # events applied
        self._reused: tuple[int, int] | None = None  # key of the last reuse (for free_extra)
        self.where: dict[str, tuple[int, int]] = {}  # tensor -> its latest live key (imported reuse lines
        # carry names only)

    def _where_is(self, *names):
        for name in names:
            key = self.where.get(name)
            if key is not None and key in self.live:
                return key
        return None

    def copy(self, capacity: int | None = None, alignment: int | None = None) -> "Replay":
        """An independent replay in the same state, for a run that made the same changes so far in a
        buffer of `capacity` (the last block is moved to that end)."""
        r = Replay(capacity, alignment or self.alignment, self.track_names)
        for c, (o, z) in self.free.chunks.items():
            offs, sizes = list(o), list(z)
            old_end, new_end = self.free.end_of(c), r.free.end_of(c)
            if old_end != new_end:
                if offs and offs[-1] + sizes[-1] == old_end:
                    sizes[-1] = new_end - offs[-1]
                    if sizes[-1] <= 0:
                        del offs[-1], sizes[-1]
                elif new_end > old_end:
                    offs.append(old_end)
                    sizes.append(new_end - old_end)
            r.free.chunks[c] = (offs, sizes)
        r.free.anomalies = list(self.free.anomalies)
        r.live = {k: list(v) for k, v in self.live.items()}
        r.where = dict(self.where)
        r.live_bytes, r.peak_live, r.n, r._reused = self.live_bytes, self.peak_live, self.n, self._reused
        return r

    def apply(self, e):
        self.n += 1
        if e.kind in MUTATIONS:
            self.change(e.kind, e.chunk or 0, e.offset, e.size, e.tensor, e.parent, e.view_src)

    def change(self, k: str, chunk: int, offset, size, tensor, parent=None, view_src=None):
        """One free-list change (alloc, free, free_extra, reuse, realloc), from an event's fields."""
        if k == "alloc":
            if offset is None:
                return  # the failed attempt before an oom
            if self.free.take(chunk, offset, size) is not None:
                self.live[(chunk, offset)] = [tensor, size]
                if self.track_names:
                    self.where[tensor] = (chunk, offset)
                self.live_bytes += size
                if self.live_bytes > self.peak_live:
                    self.peak_live = self.live_bytes
        elif k == "free":
            rec = self.live.pop((chunk, offset), None)
            if rec:
                self.live_bytes -= rec[1]
            self.free.give(chunk, offset, rec[1] if rec else pad(size or 0, self.alignment))
        elif k == "reuse":
            key = (chunk, offset) if offset is not None else self._where_is(parent, view_src)
            rec = self.live.get(key)
            if rec is not None:
                rec[0] = tensor
                if self.track_names:
                    self.where[tensor] = key
            self._reused = key
        elif k == "free_extra":
            rec = self.live.get(self._reused) if self._reused else None
            if rec is not None and self._reused[0] == chunk:
                rec[1] = offset - self._reused[1]
                self.live_bytes -= size
            self.free.give(chunk, offset, size)
        elif k == "realloc":  # head: the plan is redone from an empty buffer
            self.free = FreeList(self.capacity)
            self.live.clear()
            self.where.clear()
            self.live_bytes = 0

    def run_to(self, events, n: int):
        """Apply events[self.n:n]."""
        apply = self.apply
        for i in range(self.n, min(n, len(events))):
            apply(events[i])

    def state(self) -> dict:
        live = [{"tensor": t, "offset": o, "size": s, "chunk": c} for (c, o), (t, s) in sorted(self.live.items())]
        return {"event": self.n, "free_blocks": self.free.blocks(), "live": live, "live_bytes": self.live_bytes,
                "anomalies": list(self.free.anomalies)}


def state_at(events, n: int, capacity: int | None = None, alignment: int | None = None) -> dict:
    """The free list and live tensors after the first `n` events (before events[n] happens).

    `events` is one graph's event list (or its store columns), replayed from an empty buffer; `capacity` is the real
    buffer's size when known. `n` may be len(events) for the final state.
    """
    events = as_events(events)
    if n < 0 or n > len(events):
        raise ValueError(f"event {n} is out of range (0..{len(events)})")
    r = Replay(capacity, alignment or infer_alignment(events))
    r.run_to(events, n)
    return r.state()


def states_at(events, points, capacity: int | None = None, alignment: int | None = None) -> dict:
    """state_at for several points in one pass: {n: state}."""
    events = as_events(events)
    r = Replay(capacity, alignment or infer_alignment(events))
    out = {}
    for n in sorted(set(points)):
        r.run_to(events, n)
        out[n] = r.state()
    return out


def free_summary(state: dict) -> dict:
    """Count, largest and total of the free blocks; an endless last block is left out."""
    sizes = [s for _, s, _ in state["free_blocks"] if s is not None]
    return {"n_blocks": len(sizes), "largest": max(sizes, default=0), "total": sum(sizes)}


def stranding(state: dict) -> list[dict]:
    """Between each two neighbouring free blocks of a chunk, the live tensors that keep them
    apart: the picture of a request that fits in the total free space but in no one block."""
    live_by_chunk: dict[int, list] = {}
    for t in state["live"]:
        live_by_chunk.setdefault(t["chunk"], []).append(t)
    out = []
    blocks = state["free_blocks"]
    for (o1, s1, c1), (o2, s2, c2) in zip(blocks, blocks[1:]):
        if c1 != c2 or s1 is None:
            continue
        lo, hi = o1 + s1, o2
        between = [t for t in live_by_chunk.get(c1, []) if t["offset"] < hi and t["offset"] + t["size"] > lo]
        out.append({"chunk": c1, "left": [o1, s1], "right": [o2, s2], "gap": hi - lo, "live": between})
    return out
