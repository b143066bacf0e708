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
from dataclasses import dataclass, field

import numpy as np

from .columns import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
                      SEGMENT_UNMAP)

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # requests up to this come from the small pool
ALLOCATED, PENDING, FREE = "allocated", "pending_free", "free"


@dataclass
class Block:
    addr: int
    size: int
    state: str = FREE
    requested: int = 0
    event: int = -1  # the alloc entry that made it


@dataclass
class Segment:
    addr: int
    size: int
    stream: int
    event: int
    small: bool | None = None  # known once something is allocated in it
    blocks: list[Block] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.addr + self.size


def round_size(size: int) -> int:
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


class AllocatorState:
    """Segments by address; `apply(k)` moves forward to "after entries 0..k-1"."""

    def __init__(self, cols: dict[str, np.ndarray], max_split_size: int | None = None):
        self.action = cols["action"]
        self.addr, self.size, self.stream = cols["addr"], cols["size"], cols["stream"]
        self.max_split = max_split_size if max_split_size and max_split_size > 0 else None
        self.segments: dict[int, Segment] = {}
        self.starts: list[int] = []
        self.at = 0
        self.mismatches: list[dict] = []

    def apply(self, k: int) -> "AllocatorState":
        if k < self.at:
            raise ValueError("AllocatorState only moves forward")
        act, addr, size, stream = (self.action[self.at:k].tolist(), self.addr[self.at:k].tolist(),
                                   self.size[self.at:k].tolist(), self.stream[self.at:k].tolist())
        for j, (a, ad, sz, st) in enumerate(zip(act, addr, size, stream)):
            i = self.at + j
            if a == ALLOC:
                self._alloc(i, ad, sz)
            elif a == FREE_REQUESTED:
                self._mark(i, ad, PENDING)
            elif a == FREE_COMPLETED:
                self._free(i, ad)
            elif a == SEGMENT_ALLOC:
                self._new_segment(i, ad, sz, st)
            elif a == SEGMENT_FREE:
                self._drop_segment(i, ad)
            elif a == SEGMENT_MAP:
                self._map(i, ad, sz, st)
            elif a == SEGMENT_UNMAP:
                self._unmap(i, ad, sz)
        self.at = k
        return self

    # --- segments -----------------------------------------------------------------------
    def _new_segment(self, i, addr, size, stream):
        seg = Segment(addr, size, stream, i, blocks=[Block(addr, size)])
        self.segments[addr] = seg
        bisect.insort(self.starts, addr)

    def _drop_segment(self, i, addr):
        seg = self.segments.pop(addr, None)
        if seg is None:
            self._note(i, "segment_free of an unknown segment", addr)
            return
        self.starts.remove(addr)
        if any(b.state != FREE for b in seg.blocks):
            self._note(i, "segment_free of a segment with live blocks", addr)

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
            seg.blocks.append(Block(addr, size))

    def _unmap(self, i, addr, size):
        seg = self._segment_at(addr)
        if seg is None:
            self._note(i, "segment_unmap outside any segment", addr)
            return
        end = addr + size
        keep = []
        for b in seg.blocks:
            if b.addr + b.size <= addr or b.addr >= end:
                keep.append(b)
                continue
            if b.state != FREE:
                self._note(i, "segment_unmap over live blocks", addr)
            if b.addr < addr:
                keep.append(Block(b.addr, addr - b.addr))
            if b.addr + b.size > end:
                keep.append(Block(end, b.addr + b.size - end))
        del self.segments[seg.addr]
        self.starts.remove(seg.addr)
        for part in _contiguous(keep):  # what is left may be two separate ranges
            s = Segment(part[0].addr, sum(b.size for b in part), seg.stream, seg.event, seg.small, part)
            self.segments[s.addr] = s
            bisect.insort(self.starts, s.addr)

    def _segment_at(self, addr) -> Segment | None:
        k = bisect.bisect_right(self.starts, addr) - 1
        if k < 0:
            return None
        seg = self.segments[self.starts[k]]
        return seg if addr < seg.end else None

    # --- blocks -------------------------------------------------------------------------
    def _alloc(self, i, addr, size):
        seg = self._segment_at(addr)
        if seg is None:
            self._note(i, "alloc outside any segment", addr)
            return
        if seg.small is None:
            seg.small = size <= SMALL_SIZE
        k, b = _block_at(seg, addr)
        if b.state != FREE:
            self._note(i, "alloc over a live block", addr)
        if b.addr < addr:  # not where the allocator would put it; keep the gap free
            seg.blocks.insert(k, Block(b.addr, addr - b.addr))
            b.size -= addr - b.addr
            b.addr = addr
            k += 1
        rounded = round_size(size)
        rest = b.size - rounded
        if rest < 0:
            self._note(i, "alloc larger than the free block it lands in", addr)
        elif self._splits(seg, rounded, rest):
            seg.blocks.insert(k + 1, Block(addr + rounded, rest))
            b.size = rounded
        b.state, b.requested, b.event = ALLOCATED, size, i

    def _splits(self, seg: Segment, rounded: int, rest: int) -> bool:
        if seg.small:
            return rest >= MIN_BLOCK
        return rest > SMALL_SIZE and (self.max_split is None or rounded < self.max_split)

    def _mark(self, i, addr, state):
        seg = self._segment_at(addr)
        found = _block_at(seg, addr) if seg else None
        if found is None or found[1].addr != addr or found[1].state == FREE:
            self._note(i, "free of an address with no live block", addr)
            return None
        found[1].state = state
        return seg, found[0]

    def _free(self, i, addr):
        hit = self._mark(i, addr, FREE)
        if hit is None:
            return
        seg, k = hit
        blocks = seg.blocks
        b = blocks[k]
        b.requested, b.event = 0, -1
        if k + 1 < len(blocks) and blocks[k + 1].state == FREE:
            b.size += blocks.pop(k + 1).size
        if k > 0 and blocks[k - 1].state == FREE:
            blocks[k - 1].size += blocks.pop(k).size

    def _note(self, i, what, addr):
        if len(self.mismatches) < 100:
            self.mismatches.append({"event": i, "problem": what, "addr": addr})

    # --- reading ------------------------------------------------------------------------
    def ordered(self) -> list[Segment]:
        return [self.segments[a] for a in self.starts]

    def totals(self) -> dict:
        """Reserved, allocated (block bytes), requested, pending and the largest free block per pool."""
        out = {"reserved": 0, "allocated": 0, "requested": 0, "pending_free": 0, "segments": len(self.starts),
               "largest_free": {"small": 0, "large": 0}}
        for seg in self.segments.values():
            out["reserved"] += seg.size
            pool = "small" if seg.small else "large"
            for b in seg.blocks:
                if b.state == FREE:
                    out["largest_free"][pool] = max(out["largest_free"][pool], b.size)
                else:
                    out["allocated"] += b.size
                    out["requested"] += b.requested
                    if b.state == PENDING:
                        out["pending_free"] += b.size
        out["cached"] = out["reserved"] - out["allocated"]
        return out


def _block_at(seg: Segment, addr: int):
    starts = [b.addr for b in seg.blocks]
    k = bisect.bisect_right(starts, addr) - 1
    return (k, seg.blocks[k]) if k >= 0 else (0, seg.blocks[0])


def _contiguous(blocks: list[Block]) -> list[list[Block]]:
    parts: list[list[Block]] = []
    for b in blocks:
        if parts and parts[-1][-1].addr + parts[-1][-1].size == b.addr:
            parts[-1].append(b)
        else:
            parts.append([b])
    return parts


def state_at(cols: dict[str, np.ndarray], k: int, max_split_size: int | None = None) -> AllocatorState:
    """The state after entries 0..k-1."""
    return AllocatorState(cols, max_split_size).apply(k)


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
