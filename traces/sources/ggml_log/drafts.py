"""A graph walk as logged (`Draft`) and what a log's lines say about its generation (`Features`).

Apart from split.py, so that an import the compiled fast path takes loads none of the Python path.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Draft:
    items: list = field(default_factory=list)  # Events, and ("buffer", ...) tuples
    n_exec: int = 0
    measure_before: bool = False  # program said a measure allocator comes next
    compute_after: bool = False  # program printed its compute buffer after this walk
    buffer_before: int | None = None  # `buffer size = N` printed before the walk (2023 harness)
    buffer_after: int | None = None  # `buffer size = N` printed after the walk (head harness)
    alignment: int | None = None
    vm_base: int | None = None  # measure buffer base address, when logged
    incomplete: bool = False  # the log ends inside this walk (cut, truncated, or no line after it)


@dataclass
class Features:
    """What the log's lines say about its generation (see detect.py)."""

    chunk: bool = False
    offset: bool = False
    addr: bool = False
    addr_block: bool = False  # `block K, addr 0x...`: K is the block actually used
    parent_line: bool = False
    first_block: int | None = None
    asserts: list = field(default_factory=list)
    n_alloc_lines: int = 0
    setup_allocs: int = 0  # allocations of the program's set-up, not of a graph walk (see Splitter.setup_at)
