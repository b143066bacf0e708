"""Where the CUDA driver puts a new `cudaMalloc` segment in the address space: the order the caching allocator
sees when best fit breaks a tie between equal free blocks by address.

Read off the segment addresses of 36 fresh processes on an H200 (tests/data/torch/plan/segments.json and
held_out.json; driver 580, torch 2.11.0+cu130). The driver sub-allocates ranges it already reserved, always at the
lowest free address that fits, and reserves a new range below every older one when nothing fits, rounded up to
CHUNK, whose tail later small segments fill. One range exists before the step's first segment: what is free of
it is FIRST_RANGE, above the new ones (it sits among the CUDA context's and the libraries' own mappings).

Only the order matters to the allocator, so the addresses are made up; the two sizes are fitted (FIRST_RANGE:
any value from 288 to 448 MiB kept all 36 answers within 1 % / 3 %, 368-384 MiB made 35 of them exact). Another
driver may differ: a plan replays other orders too and shows the range (preflight/torch_plan.py).
"""
from __future__ import annotations

import bisect

PAGE = 2 << 20                       # the granule of a segment's range
CHUNK = 32 << 20                     # a new reservation is a multiple of this
FIRST_RANGE = 384 << 20              # free in the range that exists before the first segment
SOURCE = "the driver did in 36 fresh processes on an H200, driver 580.159.04, torch 2.11.0+cu130"
_TOP = 1 << 52                       # made-up addresses, above any real one: new reservations go down from here


class DriverAddresses:
    """Addresses for segments as the driver hands them out: `place(size)` and `release(addr, size)`."""

    def __init__(self, first_range: int = FIRST_RANGE):
        self.free: list[tuple[int, int]] = [(_TOP, _TOP + first_range)] if first_range else []  # (start, end)
        self.low = _TOP
        self.given: dict[int, int] = {}                       # address -> span of the segments handed out

    def place(self, size: int) -> int:
        span = -(-size // PAGE) * PAGE
        for i, (start, end) in enumerate(self.free):          # the lowest address that fits
            if end - start >= span:
                if end - start == span:
                    del self.free[i]
                else:
                    self.free[i] = (start + span, end)
                self.given[start] = span
                return start
        reserved = -(-span // CHUNK) * CHUNK
        self.low -= reserved
        if reserved > span:
            bisect.insort(self.free, (self.low + span, self.low + reserved))
        self.given[self.low] = span
        return self.low

    def release(self, addr: int, size: int):
        """A segment given back (`empty_cache`, a retry after an OOM): its range is free again. An address this
        did not hand out (a recorded one) is not its to take back."""
        span = self.given.pop(addr, None)
        if span is None:
            return
        start, end = addr, addr + span
        i = bisect.bisect_left(self.free, (start, end))
        if i < len(self.free) and self.free[i][0] == end:      # join the free range right above
            end = self.free.pop(i)[1]
        if i > 0 and self.free[i - 1][1] == start:              # and the one right below
            i -= 1
            start = self.free.pop(i)[0]
        self.free.insert(i, (start, end))
