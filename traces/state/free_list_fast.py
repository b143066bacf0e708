"""The hot loop of scrubbing a graph: free-list changes applied with FreeList's work inlined.

`Replay.change` (replay.py, the reference) applies one event through `FreeList.take` / `give`;
this loop does the same for changes in column form with the common cases (an
alloc from a block's start, a free that fits) written out, since it is the whole
cost of scrubbing a million-event graph. tests/state/test_state_index.py compares it
with the per-event path.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from alloctrace.traces.state.free_list import CHANGE_KINDS, MISSING, Replay, pad


def apply_changes(replay: Replay, codes, chunks, offsets, sizes, names, links=None):
    """Apply free-list changes given as parallel sequences of Python ints (`codes` index
    CHANGE_KINDS; -1 marks a missing chunk, offset or size) and tensor names: what `change`
    does for each, for replays that skip every other event. The common cases (an alloc from
    a block's start, a free that fits) are inlined: this loop is the whole cost of scrubbing
    a million-event graph. `links(k)` gives (parent, view_src) of the k-th change, asked only
    for a reuse without an offset. Does not count events: the caller sets `n`."""
    live, where, al, track = replay.live, replay.where, replay.alignment, replay.track_names
    free = replay.free
    lists_of, opened = free.chunks.get, free._lists
    live_bytes, peak = replay.live_bytes, replay.peak_live
    for k, (code, chunk, offset, size, name) in enumerate(zip(codes, chunks, offsets, sizes, names)):
        if chunk < 0:
            chunk = 0
        if code == 0:  # alloc
            if offset == MISSING:
                continue  # the failed attempt before an oom
            offs, szs = lists_of(chunk) or opened(chunk, offset)
            i = bisect_right(offs, offset) - 1
            if i < 0 or offset + size > offs[i] + szs[i]:
                free.take(chunk, offset, size)  # records that the bytes are not free
                continue
            start, have = offs[i], szs[i]
            if offset == start:
                if have == size:
                    del offs[i], szs[i]
                else:
                    offs[i], szs[i] = offset + size, have - size
            else:  # carved from inside the block: both remainders stay
                szs[i] = offset - start
                rest = start + have - offset - size
                if rest:
                    offs.insert(i + 1, offset + size)
                    szs.insert(i + 1, rest)
            key = (chunk, offset)
            live[key] = [name, size]
            if track:
                where[name] = key
            live_bytes += size
            if live_bytes > peak:
                peak = live_bytes
        elif code == 1:  # free
            rec = live.pop((chunk, offset), None)
            if rec:
                live_bytes -= rec[1]
                size = rec[1]
            else:
                size = pad(size if size > 0 else 0, al)
            if size <= 0:
                continue
            offs, szs = lists_of(chunk) or opened(chunk, offset)
            i = bisect_left(offs, offset)
            n_blocks = len(offs)
            if (i > 0 and offs[i - 1] + szs[i - 1] > offset) or (i < n_blocks and offs[i] < offset + size):
                free.give(chunk, offset, size)  # records the double free
            elif i > 0 and offs[i - 1] + szs[i - 1] == offset:
                if i < n_blocks and offs[i] == offset + size:
                    szs[i - 1] += size + szs[i]
                    del offs[i], szs[i]
                else:
                    szs[i - 1] += size
            elif i < n_blocks and offs[i] == offset + size:
                offs[i] = offset
                szs[i] += size
            else:
                offs.insert(i, offset)
                szs.insert(i, size)
        elif code == 3 and offset != MISSING:  # reuse: the node takes over its parent's bytes
            reused = (chunk, offset)
            rec = live.get(reused)
            if rec is not None:
                rec[0] = name
                if track:
                    where[name] = reused
            replay._reused = reused
        elif code == 2:  # free_extra: the tail of the reused bytes goes back
            reused = replay._reused
            rec = live.get(reused) if reused else None
            if rec is not None and reused[0] == chunk:
                rec[1] = offset - reused[1]
                live_bytes -= size
            free.give(chunk, offset, size)
        else:
            replay.live_bytes, replay.peak_live = live_bytes, peak
            if code == 3:
                parent, view_src = links(k) if links is not None else (None, None)
                replay.change("reuse", chunk, None, size, name, parent, view_src)
            else:
                replay.change(CHANGE_KINDS[code], chunk, offset, size, name)
            live_bytes, peak = replay.live_bytes, replay.peak_live
            if replay.free is not free:  # a realloc starts a new free list
                free = replay.free
                lists_of, opened = free.chunks.get, free._lists
    replay.live_bytes, replay.peak_live = live_bytes, peak
