"""Traces that start mid-run: the ring buffer wrapped (`max_entries` reached) or recording began late.

Such a trace frees blocks it never saw allocated and its snapshot holds segments older than its first entry.
The allocator's state at the first kept entry is recovered by walking the snapshot's segments and blocks (exact:
what the allocator itself listed at the end) back through the trace, undoing each entry:

- `alloc`: the block becomes free again and joins its free neighbours (the allocator only ever cuts an
  allocation from a maximal free block, so a free neighbour right after it is the rest it split off);
- `free_requested`: the block is allocated again; `free_completed`: the block is carved back out of the free range
  that swallowed it: its size is the request rounded, or the whole rest of that range when the allocator would not
  have split it (a rest of at most 1 MiB in the large pool, any rest of an oversize block); as no free block of the
  large pool is 1 MiB or smaller, such a sliver before it is the unsplit rest of the allocated block before;
- `segment_alloc`: the segment, whole and free again, goes; `segment_free`: it comes back, whole and free;
- expandable segments: `segment_map`'s pages, the free tail of their mapped range, are cut off again;
  `segment_unmap`'s come back free and join the ranges beside them; every pool then splits off any rest of
  512 B or more, so a freed block is the request rounded.

The seed is then checked by replaying the trace forward from it: the rebuilt state at the end must be the
snapshot's, entry for entry without a surprise. Only then is it `exact` (states, peaks and what-if runs are exact
for every kept entry); otherwise `reason` says why, and every view says the state is unknown rather than showing
the zeros a replay from nothing would give. With expandable segments what-if is refused even from an exact seed:
the model would also need the address ranges reserved before the first entry.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field, replace

import numpy as np
from sortedcontainers import SortedList

from alloctrace.allocator.cuda_caching import NO_LIMIT, AllocatorSettings, round_size

from alloctrace.traces.store.torch_stored import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, SEGMENT_ALLOC, SEGMENT_FREE,
                                           SEGMENT_MAP, SEGMENT_UNMAP)

ALLOCATED, PENDING, FREE = "allocated", "pending_free", "free"
SNAP_STATES = {0: ALLOCATED, 1: PENDING, 2: FREE}
SMALL_SEGMENT = 2 << 20
NO_SPLIT_REST = 1 << 20            # the large pool splits off a rest of more than 1 MiB only
OVERSIZE_REST = 20 << 20           # an oversize block serves requests up to 20 MiB smaller


@dataclass
class Seed:
    """The allocator at the first kept entry: segments [addr, size, stream, small, blocks], blocks
    [addr, size, state, requested], address order."""
    segments: list = field(default_factory=list)

    def totals(self) -> dict:
        live = [b for s in self.segments for b in s[4] if b[2] != FREE]
        return {"reserved": sum(s[1] for s in self.segments), "allocated": sum(b[1] for b in live),
                "requested": sum(b[3] for b in live if b[2] == ALLOCATED), "segments": len(self.segments)}


class _Walk(Exception):
    def __init__(self, event: int, why: str):
        super().__init__(f"entry {event}: {why}")
        self.event = event




def detect(cols: dict, tables: dict) -> dict:
    """Signs that the trace lacks its beginning: frees of addresses it never allocated, segments freed it never
    made, segments at the snapshot with no segment_alloc in it. {"partial": bool, ...counts}."""
    a, addr, size = np.asarray(cols["action"]), np.asarray(cols["addr"]), np.asarray(cols["size"])
    # a free is an orphan when the entry before it at its address (alloc/free only) is not its alloc
    idx = np.flatnonzero((a == ALLOC) | (a == FREE_REQUESTED))
    order = idx[np.lexsort((idx, addr[idx]))]
    is_free = a[order] == FREE_REQUESTED
    prev_ok = np.zeros(len(order), dtype=bool)
    prev_ok[1:] = (addr[order[1:]] == addr[order[:-1]]) & (a[order[:-1]] == ALLOC)
    orphan_frees = int((is_free & ~prev_ok).sum())
    orphan_segment_frees = 0
    made: set = set()
    ranges = []                                   # (start, end) of every segment made or mapped in the trace
    seg = np.flatnonzero((a == SEGMENT_ALLOC) | (a == SEGMENT_MAP) | (a == SEGMENT_FREE))
    for act, ad, sz in zip(a[seg].tolist(), addr[seg].tolist(), size[seg].tolist()):
        if act in (SEGMENT_ALLOC, SEGMENT_MAP):
            made.add(ad)
            ranges.append((ad, ad + sz))
        elif ad not in made:
            orphan_segment_frees += 1
    ranges.sort()
    starts = [r[0] for r in ranges]
    reach = list(itertools.accumulate((r[1] for r in ranges), max))

    def made_here(addr: int) -> bool:            # (a mapped range of an expandable segment may list apart)
        k = bisect.bisect_right(starts, addr) - 1
        return k >= 0 and reach[k] > addr
    older = sum(1 for s in tables["seg_address"].tolist() if not made_here(s))
    return {"partial": bool(orphan_frees or orphan_segment_frees or older), "orphan_frees": orphan_frees,
            "orphan_segment_frees": orphan_segment_frees, "segments_older_than_trace": older}


def _unmap_back(i: int, segs: dict, seg_starts: SortedList, ad: int, sz: int):
    """Undo a segment_map: the mapped pages are the free tail of the range they extended (or a whole free range
    of their own), as the state view's forward replay grows an expandable segment."""
    k = seg_starts.bisect_right(ad) - 1
    start = seg_starts[k] if k >= 0 else None
    seg = segs.get(start)
    if seg is None or start + seg[0] != ad + sz:
        raise _Walk(i, f"segment_map at {ad:#x} is not the end of a mapped range after it")
    keys, blocks = seg[3], seg[4]
    last = keys[-1]
    if blocks[last][1] != FREE or last > ad:
        raise _Walk(i, f"segment_map at {ad:#x}: its pages are not free after it")
    if start == ad:
        del segs[start]
        seg_starts.remove(start)
        return
    seg[0] -= sz
    blocks[last][0] -= sz
    if blocks[last][0] == 0:
        del blocks[last]
        keys.remove(last)


def _map_back(segs: dict, seg_starts: SortedList, ad: int, sz: int, stream: int):
    """Undo a segment_unmap: the pages come back free, joining the mapped ranges that end and start at them."""
    k = seg_starts.bisect_left(ad) - 1
    before = seg_starts[k] if k >= 0 and seg_starts[k] + segs[seg_starts[k]][0] == ad else None
    after = ad + sz if ad + sz in segs else None
    seg = [sz, stream, False, SortedList([ad]), {ad: [sz, FREE, 0]}]
    if after is not None:
        nxt = segs.pop(after)
        seg_starts.remove(after)
        seg[0] += nxt[0]
        seg[3].update(nxt[3])
        seg[4].update(nxt[4])
        if nxt[4][after][1] == FREE:
            seg[4][ad][0] += seg[4].pop(after)[0]
            seg[3].remove(after)
    if before is not None:
        prev = segs[before]
        prev[0] += seg[0]
        last = prev[3][-1]
        if prev[4][last][1] == FREE:
            prev[4][last][0] += seg[4][ad][0]
            del seg[4][ad]
            seg[3].remove(ad)
        prev[3].update(seg[3])
        prev[4].update(seg[4])
        return
    segs[ad] = seg
    seg_starts.add(ad)


def seed_from_snapshot(cols: dict, tables: dict, settings: AllocatorSettings | None = None) -> Seed:
    """Walk the snapshot's segments back through the trace to its first entry. Raises ValueError (with the
    entry) where the walk finds something the allocator could not have done."""
    settings = settings or AllocatorSettings()
    segs: dict[int, list] = {}                 # addr -> [size, stream, small, SortedList(starts), {start: [size, st, req]}]
    starts = tables["seg_block0"].tolist()
    expandable = settings.expandable_segments or bool(np.asarray(tables["seg_expandable"]).any())
    for k, sa in enumerate(tables["seg_address"].tolist()):
        blocks = {}
        for j in range(starts[k], starts[k + 1]):
            st = SNAP_STATES.get(int(tables["blk_state"][j]))
            if st is None:
                raise ValueError(f"block {int(tables['blk_address'][j]):#x} has an unknown state")
            req = int(tables["blk_requested"][j]) if st != FREE else 0     # (torch keeps a stale one on free blocks)
            blocks[int(tables["blk_address"][j])] = [int(tables["blk_size"][j]), st, req]
        segs[sa] = [int(tables["seg_total"][k]), int(tables["seg_stream"][k]), bool(tables["seg_small"][k]),
                    SortedList(blocks), blocks]
    seg_starts = SortedList(segs)
    mss = settings.max_split_size if settings.max_split_size != NO_LIMIT else None

    def segment_of(i: int, ad: int) -> list:
        k = seg_starts.bisect_right(ad) - 1
        if k < 0 or ad >= seg_starts[k] + segs[seg_starts[k]][0]:
            raise _Walk(i, f"address {ad:#x} outside every segment")
        return segs[seg_starts[k]]

    def merge_free(seg: list, start: int):
        keys, blocks = seg[3], seg[4]
        k = keys.index(start)
        if k + 1 < len(keys) and blocks[keys[k + 1]][1] == FREE:
            blocks[start][0] += blocks.pop(keys[k + 1])[0]
            keys.remove(keys[k + 1])
        if k > 0 and blocks[keys[k - 1]][1] == FREE:
            prev = keys[k - 1]
            blocks[prev][0] += blocks.pop(start)[0]
            keys.remove(start)

    action, addr, size = cols["action"].tolist(), cols["addr"].tolist(), cols["size"].tolist()
    i = None
    try:
        for i in range(len(action) - 1, -1, -1):
            a, ad, sz = action[i], addr[i], size[i]
            if a == ALLOC:
                seg = segment_of(i, ad)
                b = seg[4].get(ad)
                if b is None or b[1] != ALLOCATED:
                    raise _Walk(i, f"alloc at {ad:#x} is not an allocated block after it")
                b[1], b[2] = FREE, 0
                merge_free(seg, ad)
            elif a == FREE_REQUESTED:
                b = segment_of(i, ad)[4].get(ad)
                if b is None or b[1] != PENDING:
                    raise _Walk(i, f"free_requested at {ad:#x} is not a block waiting to be freed after it")
                b[1], b[2] = ALLOCATED, sz
            elif a == FREE_COMPLETED:
                seg = segment_of(i, ad)
                keys, blocks = seg[3], seg[4]
                f0 = keys[keys.bisect_right(ad) - 1]
                f = blocks[f0]
                end = f0 + f[0]
                if f[1] != FREE or ad >= end:
                    raise _Walk(i, f"free_completed at {ad:#x} is not inside a free range after it")
                rounded = round_size(sz, settings)
                rest = end - ad - rounded
                if rest < 0:
                    raise _Walk(i, f"free_completed at {ad:#x}: {rounded} B do not fit the free range")
                if rest and not seg[2] and not expandable and (
                        rest <= NO_SPLIT_REST or (mss and rounded >= mss and rest < OVERSIZE_REST)):
                    rounded += rest                 # the allocator kept that rest in the block
                if ad > f0 and not seg[2] and not expandable and ad - f0 <= NO_SPLIT_REST:
                    # no free block of the large pool is that small: it is the unsplit rest of the block before
                    k = keys.index(f0)
                    before = blocks[keys[k - 1]] if k > 0 else None
                    if before is None or before[1] == FREE or keys[k - 1] + before[0] != f0:
                        raise _Walk(i, f"free_completed at {ad:#x} leaves a free sliver of {ad - f0} B")
                    before[0] += ad - f0
                    del blocks[f0]
                    keys.remove(f0)
                elif ad > f0:
                    f[0] = ad - f0
                else:
                    del blocks[f0]
                    keys.remove(f0)
                blocks[ad] = [rounded, PENDING, sz]
                keys.add(ad)
                if ad + rounded < end:
                    blocks[ad + rounded] = [end - ad - rounded, FREE, 0]
                    keys.add(ad + rounded)
            elif a == SEGMENT_ALLOC:
                seg = segs.get(ad)
                if seg is None or len(seg[3]) != 1 or seg[4][ad][1] != FREE or seg[0] != sz:
                    raise _Walk(i, f"segment {ad:#x} is not whole and free right after its segment_alloc")
                del segs[ad]
                seg_starts.remove(ad)
            elif a == SEGMENT_FREE:
                k = seg_starts.bisect_right(ad + sz - 1) - 1
                if k >= 0 and seg_starts[k] + segs[seg_starts[k]][0] > ad:
                    raise _Walk(i, f"segment {ad:#x} overlaps another one before its segment_free")
                segs[ad] = [sz, int(cols["stream"][i]), sz == SMALL_SEGMENT, SortedList([ad]), {ad: [sz, FREE, 0]}]
                seg_starts.add(ad)
            elif a == SEGMENT_MAP:
                _unmap_back(i, segs, seg_starts, ad, sz)
            elif a == SEGMENT_UNMAP:
                _map_back(segs, seg_starts, ad, sz, int(cols["stream"][i]))
            elif a == OOM:
                continue
        i = None
        return Seed([[sa, segs[sa][0], segs[sa][1], segs[sa][2],
                      [[b, *segs[sa][4][b]] for b in segs[sa][3]]] for sa in seg_starts])
    except _Walk as e:
        raise ValueError(str(e)) from None
    except (KeyError, IndexError) as e:     # ranges no allocator makes (empty, overlapping): the walk loses them
        at = "the snapshot" if i is None else f"entry {i}"
        raise ValueError(f"{at}: the segments and blocks no longer add up walking back ({type(e).__name__} "
                         f"{e})") from None


def check_seed(cols: dict, tables: dict, seed: Seed, settings: AllocatorSettings) -> str | None:
    """None when replaying the trace forward from `seed` rebuilds the snapshot exactly, else the first problem.
    The state view's replay (512-byte rounding) decides first; where it is too plain for the settings
    (roundup_power2_divisions), the caching-allocator model's checked replay from the seed decides."""
    from alloctrace.traces.state.torch_blocks import AllocatorState, compare_with_snapshot
    split = settings.max_split_size if settings.max_split_size != NO_LIMIT else None
    st = AllocatorState.seeded(cols, seed, split, settings.expandable_segments).apply(len(cols["action"]))
    problem = (f"entry {st.mismatches[0]['event']}: {st.mismatches[0]['problem']}" if st.mismatches
               else next(iter(compare_with_snapshot(st, tables)), None))
    if problem is None or settings.expandable_segments:
        return problem
    from alloctrace.traces.whatif.torch_request import infer_memory_limit
    from alloctrace.traces.whatif.torch_model import replay_check, seed_reserved
    limit = infer_memory_limit(cols, settings, seed_reserved(seed.segments))
    r = replay_check(cols, replace(settings, memory_limit=limit), seed=seed.segments)
    return None if r.consistent else problem


def analyse(cols: dict, tables: dict, allocator_settings: dict | None = None) -> dict:
    """What the importer stores in a device's extra: {"partial", signs..., "exact", "reason", "seed"}."""
    out = detect(cols, tables)
    if not out["partial"]:
        return out
    try:
        settings = AllocatorSettings.from_snapshot(allocator_settings or {})
        seed = seed_from_snapshot(cols, tables, settings)
        problem = check_seed(cols, tables, seed, settings)
    except ValueError as e:
        seed, problem = None, str(e)
    except (KeyError, IndexError) as e:     # a start no allocator could have had: replaying it forward trips
        seed, problem = None, f"the rebuilt start does not replay ({type(e).__name__} {e})"
    out["exact"] = problem is None
    out["reason"] = problem
    if problem is None and settings.expandable_segments:
        # the model's expandable segments also need the address ranges they reserved and the pages unmapped
        # before the first entry, which no snapshot lists
        out["whatif_refused"] = ("with expandable segments, the caching-allocator model cannot start mid-run: the "
                                 "address ranges reserved before the first entry are not in the snapshot")
    out["seed"] = seed.segments if problem is None else None
    out["seed_totals"] = seed.totals() if problem is None else None
    return out


def note(extra: dict) -> str | None:
    """The line every output prints for a partial trace (None for a complete one)."""
    p = extra.get("partial") or {}
    if not p.get("partial"):
        return None
    signs = (f"{p['orphan_frees']:,} frees of blocks it never allocated, "
             f"{p['segments_older_than_trace']:,} segments older than its first entry")
    if p.get("exact"):
        t = p["seed_totals"]
        views = "states and peaks are" if p.get("whatif_refused") else "states, peaks and what-if are"
        return (f"partial trace (its ring buffer wrapped or recording began late: {signs}); {views} "
                f"exact from entry 0 on, the allocator there seeded from the snapshot's segments walked "
                f"back through the trace ({t['segments']:,} segments, {t['reserved']:,} B reserved, "
                f"{t['allocated']:,} B allocated at entry 0)")
    return (f"partial trace ({signs}); the allocator before its first entry cannot be recovered exactly "
            f"({p.get('reason')}): its allocator totals at any entry are unknown (never shown as zeros) and what-if "
            f"is refused")

