"""Where memory lives: the compute buffer and the tensors allocated elsewhere.

The 2023 allocators decide "is this tensor mine?" by comparing addresses, so
weights and KV cache need plausible addresses, not just a flag. Two layouts
cover the programs of the time: Linux (everything high in the mmap area) and
macOS/Metal (buffers low, below 1 TB, i.e. inside the measure allocator's range).
"""
from __future__ import annotations

from dataclasses import dataclass

from .tallocr import pad
from .tensor import Tensor


@dataclass(frozen=True)
class Layout:
    name: str
    buffer_base: int  # the real compute buffer
    weights_base: int  # model weights (mmap)
    kv_base: int  # KV cache
    alignment: int = 32

    def place(self, tensors, base: int) -> int:
        """Give consecutive aligned addresses to tensors that have none; returns the end."""
        addr = base
        for t in tensors:
            if not t.data:
                t.data = addr
                addr += pad(max(t.nbytes, 1), self.alignment)
        return addr


LAYOUTS = {
    "linux": Layout("linux", buffer_base=0x7F7660000000, weights_base=0x7F7674400000, kv_base=0x7F7650000000),
    "macos-metal": Layout("macos-metal", buffer_base=0x2A0000000, weights_base=0x110000000, kv_base=0x280000000),
}


def get_layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}") from None


def place_view_data(t: Tensor):
    """A view of a placed tensor shares its memory from build time on (ggml_view_*)."""
    if t.view_src is not None and t.view_src.data and not t.data:
        t.data = t.view_src.data + t.view_offs
