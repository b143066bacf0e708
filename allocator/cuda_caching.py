"""A model of PyTorch's CUDA caching allocator (one device's `DeviceCachingAllocator`, PyTorch 2.4 to 2.11).

It makes the allocator's decisions: rounding, the small/large pools, best fit per stream, splitting, merging on
free, the retry path (free cached blocks, then retry) before an OOM, the garbage collector and expandable segments.
The device itself (cudaMalloc, cuMemMap, the address of each new segment) sits behind `Device`, so a replay can hand
the model the addresses a real run got and a what-if run can make some up. No I/O here.

Every decision the model takes is appended to `log` as `(action, addr, size, stream)` with the action codes of
PyTorch's trace (`ACTIONS`), so it can be compared entry by entry with a real snapshot's trace.

Its length: one model, kept in one module as PyTorch keeps it in one class; the pools, the expandable
segments and the retry path share the allocator's state and are checked together against real traces.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import Protocol

from sortedcontainers import SortedList

KMIN_BLOCK = 512                # every size is rounded to at least this
KSMALL_SIZE = 1 << 20           # largest "small" request (rounded size)
KSMALL_BUFFER = 2 << 20         # small requests are packed in 2 MiB segments
KLARGE_BUFFER = 20 << 20        # requests of 1..10 MiB share 20 MiB segments
KMIN_LARGE_ALLOC = 10 << 20     # from here on a segment is the request rounded to 2 MiB
KROUND_LARGE = 2 << 20
N_ROUNDUP_INTERVALS = 16        # roundup_power2_divisions: one value per power-of-two interval, 1 MiB .. 32 GiB+
NO_DIVISIONS = (0,) * N_ROUNDUP_INTERVALS

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot")
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM, SNAPSHOT = \
    range(len(ACTIONS))
NO_LIMIT = (1 << 64) - 1        # SIZE_MAX, the "unset" max_split_size
LIST_POOL_LIMIT = 2048          # free blocks a pool keeps in a plain sorted list; past it, a SortedList


@dataclass(frozen=True)
class AllocatorSettings:
    """What PYTORCH_CUDA_ALLOC_CONF and set_per_process_memory_fraction decide. Sizes in bytes."""
    max_split_size: int = NO_LIMIT
    roundup_power2_divisions: tuple[int, ...] = NO_DIVISIONS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    memory_limit: int | None = None          # allowed_memory_maximum; None: no per-process fraction set
    release_cached_on_oom: bool = True       # last resort before an OOM: free every cached segment and retry
    device_total: int = 150_109_880_320      # the GPU's memory: sizes an expandable segment's address space

    def __post_init__(self):
        if len(self.roundup_power2_divisions) != N_ROUNDUP_INTERVALS:
            raise ValueError(f"roundup_power2_divisions needs {N_ROUNDUP_INTERVALS} values")
        for d in self.roundup_power2_divisions:
            if d < 0 or (d & (d - 1)):
                raise ValueError(f"roundup_power2_divisions values must be 0 or powers of two, got {d}")
        if self.max_split_size != NO_LIMIT and self.max_split_size < KLARGE_BUFFER:
            raise ValueError("max_split_size must be at least 20 MiB")
        if not 0.0 <= self.garbage_collection_threshold < 1.0:
            raise ValueError("garbage_collection_threshold must be in [0, 1)")

    @classmethod
    def from_snapshot(cls, s: dict, *, memory_limit: int | None = None, **kw) -> "AllocatorSettings":
        """Settings from a snapshot's `allocator_settings` dict (as `torch.cuda.memory._snapshot()` records it)."""
        mss = int(s.get("max_split_size", -1))
        rp = s.get("roundup_power2_divisions") or {}
        if isinstance(rp, dict):
            divs = tuple(int(v) for _, v in sorted(rp.items(), key=lambda kv: int(kv[0])))
        else:
            divs = tuple(int(v) for v in rp)
        divs = (divs + (0,) * N_ROUNDUP_INTERVALS)[:N_ROUNDUP_INTERVALS]
        return cls(max_split_size=NO_LIMIT if mss < 0 or mss >= NO_LIMIT else mss,
                   roundup_power2_divisions=divs,
                   garbage_collection_threshold=float(s.get("garbage_collection_threshold", 0.0) or 0.0),
                   expandable_segments=bool(s.get("expandable_segments", False)),
                   memory_limit=memory_limit, **kw)


def _divisions(settings: AllocatorSettings, size: int) -> int:
    log_size = size.bit_length() - 1
    index = log_size - 20 if log_size > 20 else 0          # intervals start at 1 MiB
    return settings.roundup_power2_divisions[min(index, N_ROUNDUP_INTERVALS - 1)]


def round_size(size: int, settings: AllocatorSettings) -> int:
    """The block size a request of `size` bytes asks the pools for."""
    if size < KMIN_BLOCK:
        return KMIN_BLOCK
    if settings.roundup_power2_divisions == NO_DIVISIONS:
        return -(-size // KMIN_BLOCK) * KMIN_BLOCK
    divisions = _divisions(settings, size)
    if divisions > 1 and size > KMIN_BLOCK * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)
        if step == 0:
            return floor << 1
        lower = size & ~(step - 1)
        return size if lower == size else lower + step
    return -(-size // KMIN_BLOCK) * KMIN_BLOCK


def allocation_size(size: int) -> int:
    """The segment size cudaMalloc is asked for when no cached block fits a rounded `size`."""
    if size <= KSMALL_SIZE:
        return KSMALL_BUFFER
    if size < KMIN_LARGE_ALLOC:
        return KLARGE_BUFFER
    return -(-size // KROUND_LARGE) * KROUND_LARGE


class Device(Protocol):
    """The driver below the allocator: where new memory comes from."""
    def malloc(self, size: int, stream: int) -> int | None: ...      # cudaMalloc: an address, or None (OOM)
    def free(self, addr: int, size: int) -> None: ...                # cudaFree
    def reserve(self, size: int, stream: int) -> int: ...            # cuMemAddressReserve for an expandable segment
    def map(self, addr: int, size: int) -> bool: ...                 # cuMemCreate+cuMemMap; False: OOM
    def unmap(self, addr: int, size: int) -> None: ...


class Block:
    __slots__ = ("addr", "size", "requested", "stream", "small", "allocated", "prev", "next", "mapped",
                 "segment", "event_count", "gc_base")

    def __init__(self, addr: int, size: int, stream: int, small: bool, segment=None):
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.requested = 0
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.mapped = True
        self.segment: ExpandableSegment | None = segment
        self.event_count = 0
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self):
        return f"Block({self.addr:#x}, {self.size}, {'alloc' if self.allocated else 'free'})"


class Pool:
    """Free blocks ordered by (stream, size, address) and unmapped expandable ranges by (stream, address).

    The free blocks sit in a plain sorted list while there are few (a training step's pools hold tens to
    hundreds: bisect and insort in C are several times cheaper than a SortedList's Python), and move to a
    SortedList past LIST_POOL_LIMIT, where shifting the list on each insert would cost more."""
    __slots__ = ("small", "blocks", "by_key", "unmapped", "unmapped_by_key", "free_calls")

    def __init__(self, small: bool):
        self.small = small
        self.blocks: list | SortedList = []
        self.by_key: dict[tuple, Block] = {}
        self.unmapped = SortedList()
        self.unmapped_by_key: dict[tuple, Block] = {}
        self.free_calls = 0                     # get_free_blocks_call_count (ages blocks for the GC)

    def insert(self, b: Block):
        b.gc_base = self.free_calls
        key = (b.stream, b.size, b.addr)
        blocks = self.blocks
        if type(blocks) is list:
            insort(blocks, key)
            if len(blocks) > LIST_POOL_LIMIT:
                self.blocks = SortedList(blocks)
        else:
            blocks.add(key)
        self.by_key[key] = b

    def erase(self, b: Block):
        key = (b.stream, b.size, b.addr)
        blocks = self.blocks
        if type(blocks) is list:
            i = bisect_left(blocks, key)
            if i == len(blocks) or blocks[i] != key:
                raise ValueError(f"{key} is not in the pool")    # as SortedList.remove says it
            del blocks[i]
        else:
            blocks.remove(key)
        del self.by_key[key]

    def bisect(self, key: tuple) -> int:
        """Index of the first free block at or after `key` in `blocks`."""
        blocks = self.blocks
        return bisect_left(blocks, key) if type(blocks) is list else blocks.bisect_left(key)

    def insert_unmapped(self, b: Block):
        key = (b.stream, b.addr)
        self.unmapped.add(key)
        self.unmapped_by_key[key] = b

    def erase_unmapped(self, b: Block):
        key = (b.stream, b.addr)
        self.unmapped.remove(key)
        del self.unmapped_by_key[key]


@dataclass
class ExpandableSegment:
    """A reserved address range mapped in `chunk`-sized pages (2 MiB small pool, 20 MiB large pool)."""
    base: int
    chunk: int
    n_chunks: int
    stream: int
    mapped: set = field(default_factory=set)

    @property
    def size(self) -> int:
        return self.chunk * self.n_chunks

    def map_range(self, addr: int, size: int) -> tuple[int, int]:
        begin = (addr - self.base) // self.chunk
        end = -(-(addr + size - self.base) // self.chunk)
        return self.base + begin * self.chunk, (end - begin) * self.chunk

    def unmap_range(self, addr: int, size: int) -> tuple[int, int]:
        begin = -(-(addr - self.base) // self.chunk)
        end = (addr + size - self.base) // self.chunk
        if begin >= end:
            return addr, 0
        return self.base + begin * self.chunk, (end - begin) * self.chunk


class OutOfMemory(Exception):
    """The request could not be met (the model logged an `oom` entry)."""

    def __init__(self, size: int, alloc_size: int):
        super().__init__(f"out of memory: tried to allocate {alloc_size} bytes")
        self.size, self.alloc_size = size, alloc_size


class CachingAllocator:
    """One device's caching allocator. `malloc`, `free`, `complete_free`, `empty_cache` are the requests."""

    def __init__(self, settings: AllocatorSettings, device: Device, *, record: bool = True):
        self.settings = settings
        self.device = device
        self.small = Pool(True)
        self.large = Pool(False)
        self.reserved = 0                       # total_allocated_memory: every segment / mapped page
        self.allocated = 0                      # Σ sizes of allocated blocks (allocated_bytes)
        self.requested = 0                      # Σ requested sizes of allocated blocks
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.expandable: list[ExpandableSegment] = []
        self.log: list[tuple[int, int, int, int]] = []
        self.record = record

    # -- tracing -------------------------------------------------------------------------------------------
    def _trace(self, action: int, addr: int, size: int, stream: int):
        if self.record:
            self.log.append((action, addr, size, stream))

    # -- requests --------------------------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        """Allocate `orig_size` bytes for `stream`; raises OutOfMemory after logging an `oom` entry."""
        s = self.settings
        size = round_size(orig_size, s)
        pool = self.small if size <= KSMALL_SIZE else self.large
        alloc_size = allocation_size(size)
        block = self._get_free_block(pool, size, stream)
        if block is None:
            if s.memory_limit is not None and s.garbage_collection_threshold > 0.0:
                self._garbage_collect()
            block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None and self._release_available_cached_blocks(pool, size, stream):
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None and s.release_cached_on_oom:
                self.release_cached_blocks()
                self.num_alloc_retries += 1
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None:
                self.num_ooms += 1
                self._trace(OOM, 0, size, stream)
                raise OutOfMemory(orig_size, alloc_size)
        return self._alloc_found_block(block, pool, size, orig_size, stream)

    def free(self, block: Block, *, deferred: bool = False):
        """The program frees `block`. `deferred`: it was used on other streams, so it waits for their events
        (`complete_free` finishes it, as process_events would)."""
        if not block.allocated:
            raise ValueError(f"double free of {block!r}")
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        self._trace(FREE_REQUESTED, block.addr, block.requested, block.stream)
        if deferred:
            block.event_count += 1
        else:
            self._free_block(block)

    def complete_free(self, block: Block):
        """The stream events of a deferred free completed."""
        if block.event_count <= 0:
            raise ValueError(f"no outstanding events on {block!r}")
        block.event_count -= 1
        if block.event_count == 0:
            self._free_block(block)

    def empty_cache(self):
        """torch.cuda.empty_cache(): release every cached segment (and unmap free expandable pages)."""
        self.release_cached_blocks()

    # -- internals, one per step of the real allocator ----------------------------------------------------------
    def would_release(self, orig_size: int, stream: int = 0) -> bool:
        """Would `malloc(orig_size)` free cached memory before it gets a segment (GC, cap retry)? Changes nothing.
        A replay uses it to tell a program's empty_cache() from the allocator's own release before a request."""
        s = self.settings
        size = round_size(orig_size, s)
        pool = self.small if size <= KSMALL_SIZE else self.large
        if self._find_free_block(pool, size, stream) is not None:
            return False
        if s.memory_limit is None:
            return False
        threshold = int(s.garbage_collection_threshold * s.memory_limit)
        if s.garbage_collection_threshold > 0.0 and self.reserved > threshold:
            return True
        return self.reserved + allocation_size(size) > s.memory_limit

    def _get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        s = self.settings
        if s.memory_limit is not None and s.garbage_collection_threshold > 0.0:
            pool.free_calls += 1
        b = self._find_free_block(pool, size, stream)
        if b is not None:
            pool.erase(b)
        return b

    def _find_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        s = self.settings
        blocks = pool.blocks
        i = pool.bisect((stream, size, -1))
        if i == len(blocks) or blocks[i][0] != stream:
            return None
        b = pool.by_key[blocks[i]]
        if b.segment is not None:
            if s.expandable_segments:
                # best fit counts what an expandable block can grow into (its unmapped neighbour)
                def grow(x: Block) -> int:
                    return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)
                j = i + 1
                while b.segment is not None and j < len(blocks) and blocks[j][0] == stream:
                    nb = pool.by_key[blocks[j]]
                    if grow(nb) >= grow(b):
                        break
                    b = nb
                    j += 1
            else:
                j = i + 1
                while j < len(blocks) and blocks[j][0] == stream and pool.by_key[blocks[j]].segment is not None:
                    j += 1
                if j == len(blocks) or blocks[j][0] != stream:
                    return None
                b = pool.by_key[blocks[j]]
        mss = s.max_split_size
        if size < mss and b.size >= mss:
            return None                                 # no oversize block for a small request
        if size >= mss and b.size >= size + KLARGE_BUFFER:
            return None                                 # oversize blocks serve requests within 20 MiB only
        return b

    def _alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int) -> Block | None:
        s = self.settings
        if s.memory_limit is not None and self.reserved + alloc_size > s.memory_limit:
            return None
        if s.expandable_segments:
            return self._try_allocate_expandable(pool, size, stream)
        addr = self.device.malloc(alloc_size, stream)
        if addr is None:
            return None
        self.reserved += alloc_size
        b = Block(addr, alloc_size, stream, pool.small)
        self._trace(SEGMENT_ALLOC, addr, alloc_size, stream)
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.small or self.settings.expandable_segments:
            return remaining >= KMIN_BLOCK
        return size < self.settings.max_split_size and remaining > KSMALL_SIZE

    def _alloc_found_block(self, b: Block, pool: Pool, size: int, orig_size: int, stream: int) -> Block:
        if self._should_split(b, size):
            remaining = b
            b = Block(remaining.addr, size, stream, pool.small, remaining.segment)
            b.prev = remaining.prev
            if b.prev is not None:
                b.prev.next = b
            b.next = remaining
            remaining.prev = b
            remaining.addr += size
            remaining.size -= size
            pool.insert(remaining)
        b.allocated = True
        b.requested = orig_size
        self.allocated += b.size
        self.requested += orig_size
        self._trace(ALLOC, b.addr, orig_size, stream)
        return b

    def _free_block(self, b: Block):
        self._trace(FREE_COMPLETED, b.addr, b.requested, b.stream)
        pool = self.small if b.small else self.large
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert(b)

    @staticmethod
    def _try_merge(dst: Block, src: Block | None, pool: Pool) -> int:
        if src is None or src.allocated or src.event_count > 0 or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        if src.mapped:
            pool.erase(src)
        else:
            pool.erase_unmapped(src)
        dst.size += src.size
        return src.size

    def _release_block(self, b: Block, pool: Pool):
        self._trace(SEGMENT_FREE, b.addr, b.size, b.stream)
        self.device.free(b.addr, b.size)
        self.reserved -= b.size
        pool.erase(b)

    def _release_available_cached_blocks(self, pool: Pool, size: int, stream: int) -> bool:
        mss = self.settings.max_split_size
        if mss == NO_LIMIT:
            return False
        want = max(size, mss)
        blocks = pool.blocks
        i = pool.bisect((stream, want, -1))
        if i == len(blocks) or blocks[i][0] != stream or pool.by_key[blocks[i]].segment is not None:
            # no single (unexpandable) block is large enough: free oversize blocks from the largest down
            if i == 0:
                return False
            released = 0
            i -= 1
            while released < want and i >= 0:
                b = pool.by_key[blocks[i]]
                if b.size < mss or b.stream != stream:
                    break
                i -= 1
                if b.segment is None:
                    released += b.size
                    self._release_block(b, pool)
            return released >= want
        self._release_block(pool.by_key[blocks[i]], pool)
        return True

    def release_cached_blocks(self):
        """Free every unsplit cached segment, large pool first, each in (stream, size, address) order."""
        self._synchronize_events()
        self._release_blocks(self.large)
        self._release_blocks(self.small)

    def _synchronize_events(self):
        # a real run waits for the outstanding events here; the trace shows their free_completed entries,
        # which the replay feeds as complete_free before this point
        pass

    def _release_blocks(self, pool: Pool):
        to_unmap = []
        for key in list(pool.blocks):
            b = pool.by_key[key]
            if b.segment is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b, pool)
        for b in to_unmap:
            self._unmap_block(b, pool)
            if b.prev is None and b.next is None and not b.mapped:
                self._release_expandable_segment(b, pool)

    def _garbage_collect(self):
        s = self.settings
        threshold = int(s.garbage_collection_threshold * s.memory_limit)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pool = self.large
        freeable = [pool.by_key[k] for k in pool.blocks if not pool.by_key[k].is_split()]
        total_age = sum(pool.free_calls - b.gc_base for b in freeable)
        count = len(freeable)
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for key in list(pool.blocks):
                b = pool.by_key.get(key)
                if b is None or b.is_split() or b.segment is not None:
                    continue
                age = pool.free_calls - b.gc_base
                if age >= age_threshold:
                    freed = True
                    reclaimed += b.size
                    total_age -= age
                    count -= 1
                    self._release_block(b, pool)

    # -- expandable segments ---------------------------------------------------------------------------------
    def _find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
        def allocatable(x: Block | None) -> bool:
            return x is not None and not x.allocated and x.event_count == 0

        def room(x: Block | None) -> bool:
            got = 0
            while got < size and allocatable(x):
                got += x.size
                x = x.next
            return got >= size

        unmapped = pool.unmapped
        i = unmapped.bisect_left((stream, -1))
        while i < len(unmapped) and unmapped[i][0] == stream:
            c = pool.unmapped_by_key[unmapped[i]]
            if allocatable(c.prev):
                c = c.prev
            if room(c):
                return c
            i += 1
        chunk = KSMALL_BUFFER if pool.small else KLARGE_BUFFER
        total = self.settings.device_total
        n_chunks = -(-(total + total // 8) // chunk)
        base = self.device.reserve(n_chunks * chunk, stream)
        seg = ExpandableSegment(base, chunk, n_chunks, stream)
        self.expandable.append(seg)
        c = Block(base, seg.size, stream, pool.small, seg)
        c.mapped = False
        pool.insert_unmapped(c)
        return c

    def _map_block(self, b: Block, size: int, pool: Pool) -> bool:
        seg = b.segment
        addr, mapped = seg.map_range(b.addr, size)
        if mapped == 0 or not self.device.map(addr, mapped):
            return False
        pool.erase_unmapped(b)
        b.mapped = True
        if mapped < b.size:
            rest = Block(b.addr + mapped, b.size - mapped, b.stream, b.small, seg)
            rest.mapped = False
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            pool.insert_unmapped(rest)
            b.size = mapped
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert(b)
        self.reserved += mapped
        self._trace(SEGMENT_MAP, addr, mapped, b.stream)
        return True

    def _try_allocate_expandable(self, pool: Pool, size: int, stream: int) -> Block | None:
        c = self._find_expandable_block(pool, size, stream)
        if not c.mapped and not self._map_block(c, min(c.size, size), pool):
            return None
        while c.size < size:
            nxt = c.next
            if not self._map_block(nxt, min(size - c.size, nxt.size), pool):
                return None
            c = nxt
        pool.erase(c)
        return c

    def _unmap_block(self, b: Block, pool: Pool):
        seg = b.segment
        addr, size = seg.unmap_range(b.addr, b.size)
        if size == 0:
            return
        pool.erase(b)
        before = addr - b.addr
        if before > 0:
            f = Block(b.addr, before, b.stream, b.small, seg)
            f.prev, f.next = b.prev, b
            if b.prev is not None:
                b.prev.next = f
            b.prev = f
            pool.insert(f)
        after = b.size - before - size
        if after > 0:
            f = Block(addr + size, after, b.stream, b.small, seg)
            f.prev, f.next = b, b.next
            if b.next is not None:
                b.next.prev = f
            b.next = f
            pool.insert(f)
        b.addr, b.size, b.mapped = addr, size, False
        self._try_merge(b, b.prev, pool)
        self._try_merge(b, b.next, pool)
        pool.insert_unmapped(b)
        self.device.unmap(addr, size)
        self.reserved -= size
        self._trace(SEGMENT_UNMAP, addr, size, b.stream)

    def _release_expandable_segment(self, b: Block, pool: Pool):
        pool.erase_unmapped(b)
        self.expandable.remove(b.segment)

    # -- copies --------------------------------------------------------------------------------------------------
    def clone(self, held_blocks) -> tuple["CachingAllocator", dict]:
        """A copy to try a request on (the log is shared, the device too). `held_blocks`: blocks only the caller
        knows (allocated, or waiting for events). Returns the copy and {id(old block): new block}."""
        seen: dict[int, Block] = {}
        segs = {id(g): ExpandableSegment(g.base, g.chunk, g.n_chunks, g.stream, set(g.mapped))
                for g in self.expandable}
        starts = list(held_blocks) + [p.by_key[k] for p in (self.small, self.large) for k in p.blocks] + \
            [p.unmapped_by_key[k] for p in (self.small, self.large) for k in p.unmapped]
        for b in starts:
            if id(b) in seen:
                continue
            while b.prev is not None:
                b = b.prev
            prev_new = None
            while b is not None:
                nb = Block(b.addr, b.size, b.stream, b.small, segs.get(id(b.segment)) if b.segment else None)
                nb.requested, nb.allocated, nb.mapped = b.requested, b.allocated, b.mapped
                nb.event_count, nb.gc_base = b.event_count, b.gc_base
                nb.prev = prev_new
                if prev_new is not None:
                    prev_new.next = nb
                seen[id(b)] = nb
                prev_new = nb
                b = b.next
        other = CachingAllocator.__new__(CachingAllocator)
        other.__dict__.update(self.__dict__)
        other.expandable = list(segs.values())
        for name in ("small", "large"):
            old, new = getattr(self, name), Pool(getattr(self, name).small)
            new.free_calls = old.free_calls
            new.blocks = list(old.blocks) if type(old.blocks) is list else SortedList(old.blocks)
            new.by_key = {k: seen[id(b)] for k, b in old.by_key.items()}
            new.unmapped = SortedList(old.unmapped)
            new.unmapped_by_key = {k: seen[id(b)] for k, b in old.unmapped_by_key.items()}
            setattr(other, name, new)
        return other, seen

    # -- views -------------------------------------------------------------------------------------------------
    def segments(self, allocated_blocks) -> list[dict]:
        """The state as `_snapshot()` reports it: one entry per segment (per mapped range of an expandable one),
        address order, with its blocks. `allocated_blocks`: the live blocks (the model keeps no list of them)."""
        heads = {}
        for b in list(allocated_blocks) + [p.by_key[k] for p in (self.small, self.large) for k in p.blocks]:
            while b.prev is not None and b.prev.mapped:
                b = b.prev
            heads[b.addr] = b
        out = []
        for addr in sorted(heads):
            b, blocks = heads[addr], []
            while b is not None and b.mapped:
                blocks.append({"address": b.addr, "size": b.size, "allocated": b.allocated,
                               "requested_size": b.requested if b.allocated else 0})
                b = b.next
            out.append({"address": addr, "total_size": sum(x["size"] for x in blocks),
                        "segment_type": "small" if heads[addr].small else "large",
                        "is_expandable": heads[addr].segment is not None, "blocks": blocks})
        return out
