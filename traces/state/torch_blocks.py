"""The allocator's segments and blocks at any trace entry, rebuilt from the trace alone.

Segments come from segment_alloc/free (and segment_map/unmap for expandable
segments); blocks from alloc/free_requested/free_completed. The trace records
requested sizes, so a block's size follows the caching allocator's rounding and
splitting rules: sizes round up to 512 bytes, a block is split when the rest
is worth keeping (small pool: at least 512 bytes; large pool: more than 1 MiB
and the block under max_split_size), and freed blocks merge with free
neighbours. The result at the end of the trace is checked against the
snapshot's own segments (`compare_with_snapshot`).
"""
from __future__ import annotations

import bisect
import numpy as np

from alloctrace.traces.store.torch_stored import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                      SEGMENT_UNMAP)

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # requests up to this come from the small pool
SMALL_BUFFER = 2 << 20  # the small pool's segment size; large-pool segments never have it
ALLOCATED, PENDING, FREE = "allocated", "pending_free", "free"


class Block:
    """A block of a segment; blocks of one segment form a doubly linked list by address, as in the allocator."""

    __slots__ = ("addr", "size", "state", "requested", "event", "seg", "prev", "next")

    def __init__(self, addr, size, seg, state=FREE, requested=0, event=-1):
        self.addr, self.size, self.seg = addr, size, seg
        self.state, self.requested, self.event = state, requested, event
        self.prev = self.next = None


class Segment:
    __slots__ = ("addr", "size", "stream", "event", "small", "head")

    def __init__(self, addr, size, stream, event, small=None):
        self.addr, self.size, self.stream, self.event, self.small = addr, size, stream, event, small
        self.head: Block | None = None

    @property
    def end(self) -> int:
        return self.addr + self.size

    @property
    def blocks(self) -> list[Block]:
        out, b = [], self.head
        while b is not None:
            out.append(b)
            b = b.next
        return out


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


class AllocatorState:
    """Segments by address; `apply(k)` moves forward to "after entries 0..k-1".

    Free blocks are found by their start address and live blocks by theirs, so each entry costs a few
    dictionary operations (the allocator hands out a free block's start; a free names a block's start)."""

    def __init__(self, cols: dict[str, np.ndarray], max_split_size: int | None = None, expandable: bool = False):
        self.cols = cols
        self.max_split = max_split_size if max_split_size and max_split_size > 0 else None
        self.expandable = expandable     # with expandable segments every pool splits off any rest of 512 B or more
        self.segments: dict[int, Segment] = {}
        self.free_at: dict[int, Block] = {}
        self.live: dict[int, Block] = {}
        self.at = 0
        self.mismatches: list[dict] = []

    @classmethod
    def seeded(cls, cols: dict[str, np.ndarray], seed, max_split_size: int | None = None,
               expandable: bool = False) -> "AllocatorState":
        """The state at entry 0 of a trace that starts mid-run, from a wrapped.Seed (its segments and blocks)."""
        st = cls(cols, max_split_size, expandable)
        for addr, size, stream, small, blocks in getattr(seed, "segments", seed):
            s = st.segments[addr] = Segment(addr, size, stream, -1, small)
            st._chain(s, [Block(b[0], b[1], s, b[2], b[3]) for b in blocks])
        return st

    def clone(self) -> "AllocatorState":
        other = AllocatorState(self.cols, self.max_split, self.expandable)
        other.at, other.mismatches = self.at, list(self.mismatches)
        for seg in self.segments.values():
            s = other.segments[seg.addr] = Segment(seg.addr, seg.size, seg.stream, seg.event, seg.small)
            other._chain(s, [Block(b.addr, b.size, s, b.state, b.requested, b.event) for b in seg.blocks])
        return other

    def _chain(self, seg: Segment, blocks: list[Block]):
        """Make `blocks` (in address order) the segment's list of blocks, each indexed as free or live."""
        prev = None
        for b in blocks:
            b.seg, b.prev, b.next = seg, prev, None
            if prev is None:
                seg.head = b
            else:
                prev.next = b
            prev = b
            (self.free_at if b.state == FREE else self.live)[b.addr] = b

    def apply(self, k: int) -> "AllocatorState":
        if k < self.at:
            raise ValueError("AllocatorState only moves forward")
        c = self.cols
        lo = self.at
        act, addr, size, stream = (c["action"][lo:k].tolist(), c["addr"][lo:k].tolist(), c["size"][lo:k].tolist(),
                                   c["stream"][lo:k].tolist())
        alloc, mark, free, new_seg, drop = self._alloc, self._mark, self._free, self._new_segment, self._drop_segment
        for i, a, ad, sz, st in zip(range(lo, k), act, addr, size, stream):
            if a == ALLOC:
                alloc(i, ad, sz)
            elif a == FREE_REQUESTED:
                mark(i, ad)
            elif a == FREE_COMPLETED:
                free(i, ad)
            elif a == SEGMENT_ALLOC:
                new_seg(i, ad, sz, st, sz == SMALL_BUFFER)
            elif a == SEGMENT_FREE:
                drop(i, ad)
            elif a == SEGMENT_MAP:
                self._map(i, ad, sz, st)
            elif a == SEGMENT_UNMAP:
                self._unmap(i, ad, sz)
        self.at = k
        return self

    # --- segments -----------------------------------------------------------------------
    def _new_segment(self, i, addr, size, stream, small=None):
        seg = self.segments[addr] = Segment(addr, size, stream, i, small)
        seg.head = self.free_at[addr] = Block(addr, size, seg)
        return seg

    def _drop_segment(self, i, addr):
        seg = self.segments.pop(addr, None)
        if seg is None:
            self._note(i, "segment_free of an unknown segment", addr)
            return
        for b in seg.blocks:
            if b.state != FREE:
                self._note(i, "segment_free of a segment with live blocks", addr)
                self.live.pop(b.addr, None)
            else:
                self.free_at.pop(b.addr, None)

    def _map(self, i, addr, size, stream):
        seg = self._segment_at(addr - 1) if addr else None
        if seg is None or seg.end != addr:
            self._new_segment(i, addr, size, stream)
            return
        seg.size += size
        last = seg.blocks[-1]
        if last.state == FREE:
            last.size += size
        else:
            b = self.free_at[addr] = Block(addr, size, seg)
            b.prev, last.next = last, b

    def _unmap(self, i, addr, size):
        seg = self._segment_at(addr)
        if seg is None:
            self._note(i, "segment_unmap outside any segment", addr)
            return
        end = addr + size
        keep = []
        for b in seg.blocks:
            (self.free_at if b.state == FREE else self.live).pop(b.addr, None)
            if b.addr + b.size <= addr or b.addr >= end:
                keep.append(b)
                continue
            if b.state != FREE:
                self._note(i, "segment_unmap over live blocks", addr)
            if b.addr < addr:
                keep.append(Block(b.addr, addr - b.addr, seg))
            if b.addr + b.size > end:
                keep.append(Block(end, b.addr + b.size - end, seg))
        del self.segments[seg.addr]
        for part in _contiguous(keep):  # what is left may be two separate ranges
            s = self.segments[part[0].addr] = Segment(part[0].addr, sum(b.size for b in part), seg.stream, seg.event,
                                                      seg.small)
            self._chain(s, part)

    def _segment_at(self, addr) -> Segment | None:
        starts = sorted(self.segments)
        k = bisect.bisect_right(starts, addr) - 1
        if k < 0:
            return None
        seg = self.segments[starts[k]]
        return seg if addr < seg.end else None

    # --- blocks -------------------------------------------------------------------------
    def _alloc(self, i, addr, size):
        b = self.free_at.pop(addr, None)
        if b is None:  # not the start of a free block: not where the allocator would put it
            b = self._carve(i, addr)
            if b is None:
                return
        seg = b.seg
        if seg.small is None:
            seg.small = size <= SMALL_SIZE
        rounded = round_size(size)
        rest = b.size - rounded
        if rest < 0:
            self._note(i, "alloc larger than the free block it lands in", addr)
        elif (rest >= MIN_BLOCK) if seg.small or self.expandable else (rest > SMALL_SIZE and (self.max_split is None
                                                                            or rounded < self.max_split)):
            r = self.free_at[addr + rounded] = Block(addr + rounded, rest, seg)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, rounded
        b.state, b.requested, b.event = ALLOCATED, size, i
        self.live[addr] = b

    def _carve(self, i, addr) -> Block | None:
        """The free block holding addr, split so that one starts at addr (after noting the mismatch)."""
        seg = self._segment_at(addr)
        hit = next((b for b in seg.blocks if b.addr <= addr < b.addr + b.size), None) if seg else None
        if hit is None or hit.state != FREE:
            self._note(i, "alloc outside any free block", addr)
            return None
        self._note(i, "alloc inside a free block, not at its start", addr)
        del self.free_at[hit.addr]
        b = Block(addr, hit.addr + hit.size - addr, seg)
        hit.size = addr - hit.addr
        b.prev, b.next = hit, hit.next
        if hit.next is not None:
            hit.next.prev = b
        hit.next = b
        self.free_at[hit.addr] = hit
        return b

    def _mark(self, i, addr):
        b = self.live.get(addr)
        if b is None:
            self._note(i, "free of an address with no live block", addr)
        else:
            b.state = PENDING

    def _free(self, i, addr):
        b = self.live.pop(addr, None)
        if b is None:
            self._note(i, "free of an address with no live block", addr)
            return
        b.state, b.requested, b.event = FREE, 0, -1
        n = b.next
        if n is not None and n.state == FREE:
            del self.free_at[n.addr]
            b.size += n.size
            b.next = n.next
            if n.next is not None:
                n.next.prev = b
        p = b.prev
        if p is not None and p.state == FREE:
            p.size += b.size
            p.next = b.next
            if b.next is not None:
                b.next.prev = p
        else:
            self.free_at[b.addr] = b

    def _note(self, i, what, addr):
        if len(self.mismatches) < 100:
            self.mismatches.append({"event": i, "problem": what, "addr": addr})

    # --- reading ------------------------------------------------------------------------
    def ordered(self) -> list[Segment]:
        return [self.segments[a] for a in sorted(self.segments)]

    def totals(self) -> dict:
        """Reserved, allocated (block bytes), requested, pending and the largest free block per pool."""
        out = {"reserved": sum(s.size for s in self.segments.values()), "allocated": 0, "requested": 0,
               "pending_free": 0, "segments": len(self.segments), "largest_free": {"small": 0, "large": 0}}
        for b in self.live.values():
            out["allocated"] += b.size
            out["requested"] += b.requested
            if b.state == PENDING:
                out["pending_free"] += b.size
        for b in self.free_at.values():
            pool = "small" if b.seg.small else "large"
            out["largest_free"][pool] = max(out["largest_free"][pool], b.size)
        out["cached"] = out["reserved"] - out["allocated"]
        return out


def _contiguous(blocks: list[Block]) -> list[list[Block]]:
    parts: list[list[Block]] = []
    for b in blocks:
        if parts and parts[-1][-1].addr + parts[-1][-1].size == b.addr:
            parts[-1].append(b)
        else:
            parts.append([b])
    return parts


def state_at(cols: dict[str, np.ndarray], k: int, max_split_size: int | None = None,
             expandable: bool = False) -> AllocatorState:
    """The state after entries 0..k-1."""
    return AllocatorState(cols, max_split_size, expandable).apply(k)


def initial_state(cols: dict[str, np.ndarray], settings: dict | None, seed=None) -> AllocatorState:
    """The state at entry 0 under the recorded allocator settings (a snapshot's `allocator_settings`): empty, or
    the seed of a trace that starts mid-run."""
    settings = settings or {}
    split = settings.get("max_split_size")
    split = split if isinstance(split, int) else None
    expandable = bool(settings.get("expandable_segments"))
    return (AllocatorState.seeded(cols, seed, split, expandable) if seed
            else AllocatorState(cols, split, expandable))


SNAPSHOT_STATE = {0: ALLOCATED, 1: PENDING, 2: FREE}


def compare_with_snapshot(state: AllocatorState, tables: dict[str, np.ndarray]) -> list[str]:
    """Differences between a rebuilt state and the snapshot's segments ([] when they agree)."""
    problems = []
    mine = {s.addr: s for s in state.ordered()}
    starts = tables["seg_block0"]
    theirs = {}
    for k, a in enumerate(tables["seg_address"].tolist()):
        blocks = [(int(tables["blk_address"][j]), int(tables["blk_size"][j]),
                   SNAPSHOT_STATE.get(int(tables["blk_state"][j]), "other"))
                  for j in range(int(starts[k]), int(starts[k + 1]))]
        theirs[a] = (int(tables["seg_total"][k]), blocks)
    for a in sorted(set(mine) | set(theirs)):
        if a not in mine:
            problems.append(f"segment {a:#x} is in the snapshot only")
            continue
        if a not in theirs:
            problems.append(f"segment {a:#x} is in the rebuilt state only")
            continue
        seg = mine[a]
        got = (seg.size, [(b.addr, b.size, b.state) for b in seg.blocks])
        if got != theirs[a]:
            problems.append(f"segment {a:#x}: rebuilt {got} != snapshot {theirs[a]}")
    return problems
