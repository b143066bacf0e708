"""ggml-head's dynamic allocator (`ggml_dyn_tallocr`): offsets in up to 16 chunks."""
from __future__ import annotations

from .record_class import record_class, field

from .tallocr import pad, release

MAX_CHUNKS = 16
SIZE_MAX = (1 << 64) - 1


@record_class
class Chunk:
    offsets: list = field(default_factory=list)
    sizes: list = field(default_factory=list)
    max_size: int = 0


class DynOutOfSpace(Exception):
    def __init__(self, needed, largest):
        super().__init__(f"not enough space to allocate {needed} bytes, largest block available {largest} bytes")
        self.needed, self.largest = needed, largest


class DynTallocr:
    def __init__(self, alignment: int = 32, max_buffer_size: int = SIZE_MAX, max_free_blocks: int = 256):
        self.alignment = alignment
        self.max_chunk_size = min(max_buffer_size, SIZE_MAX // 2)
        self.max_free_blocks = max_free_blocks
        self.chunks: list[Chunk] = []

    def reset(self):
        self.chunks = []

    def _new_chunk(self, min_size: int) -> int:
        if len(self.chunks) >= MAX_CHUNKS:
            return -1
        size = max(min_size, self.max_chunk_size)
        if len(self.chunks) == MAX_CHUNKS - 1:
            size = SIZE_MAX // 2
        self.chunks.append(Chunk([0], [size]))
        return len(self.chunks) - 1

    def alloc(self, nbytes: int) -> tuple[int, int, int]:
        """Returns (chunk, block index, offset): best fit among non-last blocks of every chunk,
        else the last block of the chunk with the best reuse factor, else a new chunk."""
        size = pad(nbytes, self.alignment)
        best_chunk = best_block = -1
        max_avail = 0
        for c, ch in enumerate(self.chunks):
            best_fit_size = SIZE_MAX  # reset per chunk, as in ggml: a later chunk's fit wins
            sizes = ch.sizes
            for i in range(len(sizes) - 1):
                s = sizes[i]
                if s > max_avail:
                    max_avail = s
                if size <= s <= best_fit_size:
                    best_chunk, best_block, best_fit_size = c, i, s
        if best_block == -1:
            best_reuse = None  # INT64_MIN
            for c, ch in enumerate(self.chunks):
                if not ch.sizes:
                    continue
                last = len(ch.sizes) - 1
                max_avail = max(max_avail, ch.sizes[last])
                reuse = ch.max_size - ch.offsets[last] - size
                if best_reuse is None:
                    better = True  # INT64_MIN < 0 and anything > INT64_MIN
                else:
                    better = (best_reuse < 0 and reuse > best_reuse) or (reuse >= 0 and reuse < best_reuse)
                if ch.sizes[last] >= size and better:
                    best_chunk, best_block, best_reuse = c, last, reuse
        if best_block == -1:
            best_chunk = self._new_chunk(size)
            best_block = 0
        if best_chunk == -1:
            raise DynOutOfSpace(size, max_avail)
        ch = self.chunks[best_chunk]
        off = ch.offsets[best_block]
        ch.offsets[best_block] += size
        ch.sizes[best_block] -= size
        if ch.sizes[best_block] == 0:
            del ch.offsets[best_block], ch.sizes[best_block]
        ch.max_size = max(ch.max_size, off + size)
        return best_chunk, best_block, off

    def free(self, chunk: int, offset: int, nbytes: int):
        ch = self.chunks[chunk]
        release(ch.offsets, ch.sizes, offset, pad(nbytes, self.alignment), self.max_free_blocks)

    def max_size(self, chunk: int) -> int:
        return self.chunks[chunk].max_size if chunk < len(self.chunks) else 0

    def summary(self) -> tuple[int, int, int]:
        """(free blocks, largest, total) over all chunks, the last block of each clipped to max_size."""
        n = largest = total = 0
        for ch in self.chunks:
            sizes = ch.sizes
            if not sizes:
                continue
            k = len(sizes) - 1
            if k:  # the blocks before the last, as they are
                n += k
                largest = max(largest, max(sizes[:k]))
                total += sum(sizes) - sizes[k]
            s = max(0, min(sizes[k], ch.max_size - ch.offsets[k]))
            if s:
                n += 1
                largest = max(largest, s)
                total += s
        return n, largest, total
