"""The 2023 free-block allocator (`struct ggml_allocr`), over real addresses.

Free blocks are kept sorted by address in two parallel lists. Every method
returns what the C code would print, so the graph walk can emit events.
"""
from __future__ import annotations

from .record_class import record_class

from .profiles import Profile

MEASURE_BASE = 0x1000
MEASURE_SIZE = 1 << 40


def pad(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def aligned_offset(base: int, offset: int, alignment: int) -> int:
    return offset + (alignment - (base + offset) % alignment) % alignment


class OutOfSpace(Exception):
    def __init__(self, needed: int, largest: int):
        super().__init__(f"not enough space in the buffer (needed {needed}, largest block available {largest})")
        self.needed, self.largest = needed, largest


class OutOfFreeBlocks(Exception):
    pass


def release(starts: list, sizes: list, at: int, size: int, max_blocks: int):
    """Give [at, at + size) back to an address-sorted free list, as every ggml generation does:
    grow the block that ends at `at` (and swallow the next one if they now touch), or the block
    that starts right after (and merge into the previous one), else insert a new block."""
    n = len(starts)
    for i in range(n):
        if starts[i] + sizes[i] == at:
            sizes[i] += size
            if i < n - 1 and starts[i] + sizes[i] == starts[i + 1]:
                sizes[i] += sizes[i + 1]
                del starts[i + 1], sizes[i + 1]
            return
        if at + size == starts[i]:
            starts[i] = at
            sizes[i] += size
            if i > 0 and starts[i - 1] + sizes[i - 1] == starts[i]:
                sizes[i - 1] += sizes[i]
                del starts[i], sizes[i]
            return
    if n >= max_blocks:
        raise OutOfFreeBlocks()
    pos = 0
    while pos < n and starts[pos] < at:
        pos += 1
    starts.insert(pos, at)
    sizes.insert(pos, size)


@record_class
class Choice:
    addr: int
    block: int  # index printed by AT_PRINTF (-1 when the last-block fallback was taken)


class LegacyTallocr:
    def __init__(self, profile: Profile, base: int, size: int, alignment: int, measure: bool = False):
        self.profile = profile
        self.base, self.size, self.alignment, self.measure = base, size, alignment, measure
        self.max_size = 0
        self.addrs: list[int] = []
        self.sizes: list[int] = []
        self.reset()

    @classmethod
    def new_measure(cls, profile: Profile, alignment: int):
        return cls(profile, MEASURE_BASE, MEASURE_SIZE, alignment, measure=True)

    def reset(self):
        """One free block from the aligned base to the end; max_size survives, as in ggml."""
        off = aligned_offset(self.base, 0, self.alignment)
        self.addrs = [self.base + off]
        self.sizes = [self.size - off]

    def best_fit_block(self, size: int) -> tuple[int, int]:
        """Smallest block that fits, the later one on ties; returns (index, largest seen)."""
        n = len(self.sizes) - 1 if self.profile.best_fit_skips_last else len(self.sizes)
        best, best_size, max_avail = -1, None, 0
        sizes = self.sizes
        for i in range(n):
            s = sizes[i]
            if s > max_avail:
                max_avail = s
            if s >= size and (best_size is None or s <= best_size):
                best, best_size = i, s
        return best, max_avail

    def alloc(self, nbytes: int) -> Choice:
        """Carve `nbytes` (padded) from the best block; raises OutOfSpace with the printed numbers."""
        size = pad(nbytes, self.alignment)
        best, max_avail = self.best_fit_block(size)
        printed = best
        if best == -1:
            last = len(self.sizes) - 1
            if self.profile.best_fit_skips_last and last >= 0 and self.sizes[last] >= size:
                best = last
            else:
                raise OutOfSpace(size, max_avail)
        addr = self.addrs[best]
        self.addrs[best] += size
        self.sizes[best] -= size
        if self.sizes[best] == 0:
            del self.addrs[best]
            del self.sizes[best]
        self.max_size = max(self.max_size, addr - self.base + size)
        return Choice(addr, printed)

    def owns(self, addr: int) -> bool:
        """ggml_allocator_free_tensor's test: inside [base, base + max_size)."""
        return self.base <= addr < self.base + self.max_size

    def inside(self, addr: int) -> bool:
        """The inplace test: inside [base, base + size) (note: size, not max_size)."""
        return self.base <= addr < self.base + self.size

    def free(self, addr: int, nbytes: int) -> int:
        """Return bytes to the free list, merging neighbours; returns n_free_blocks before."""
        before = len(self.addrs)
        release(self.addrs, self.sizes, addr, pad(nbytes, self.alignment), self.profile.max_free_blocks)
        return before

    def summary(self) -> tuple[int, int, int]:
        """(free blocks, largest, total); a measure allocator's endless tail counts up to max_size."""
        s = self.sizes
        if self.measure and s:
            tail = max(0, self.base + self.max_size - self.addrs[-1])
            s = s[:-1] + ([tail] if tail else [])
        return len(s), (max(s) if s else 0), sum(s)

    def blocks(self) -> list[tuple[int, int]]:
        """Free blocks as (offset from base, size)."""
        return [(a - self.base, s) for a, s in zip(self.addrs, self.sizes)]
