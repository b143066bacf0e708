"""Addresses for the memory a program allocated outside the graph allocator.

The 2023 allocators compare pointers, so weights, KV cache and the compute
buffer need addresses that relate to each other as they did in the process:
a layout (allocator/layout.py) gives each region its usual base; a region that
would overlap one already placed (a 70B model's weights are bigger than the
gap the layout leaves) moves to the next free GiB above everything placed,
as a second mapping would. The relation that matters survives: on the
macOS/Metal layout everything stays below 1 TB, inside the measure range.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from alloctrace.allocator.tallocr import pad

GIB = 1 << 30


@dataclass
class AddressSpace:
    regions: dict = field(default_factory=dict)  # name -> (start, end)

    def reserve(self, name: str, preferred: int, size: int) -> int:
        """Take [start, start+size) at `preferred` if free, else above every region; returns start."""
        start = preferred
        if any(start < end and s < start + size for s, end in self.regions.values()):
            top = max(end for _, end in self.regions.values())
            start = (top + GIB - 1) // GIB * GIB
        self.regions[name] = (start, start + size)
        return start


def place_consecutive(tensors, base: int, alignment: int = 32, header: int = 0) -> int:
    """Give tensors consecutive addresses from `base`; `header` bytes precede each tensor's data
    (a ggml context stores an object header and the tensor struct before it). Returns the end."""
    addr = base
    for t in tensors:
        addr += header
        t.data = addr
        addr += pad(max(t.nbytes, 1), alignment)
    return addr


def span(tensors, alignment: int = 32, header: int = 0) -> int:
    return sum(header + pad(max(t.nbytes, 1), alignment) for t in tensors)
