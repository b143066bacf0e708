"""Replay a PyTorch snapshot's requests through the caching-allocator model: check it, then ask "what if".

Input: one device's trace entries as columns (`action` codes = index in `ACTIONS`, `addr`, `size`, `stream`), the
layout the torch snapshot source stores. Requests are the program's: `alloc` (size, stream), `free_requested`,
the completion of a deferred free (a `free_completed` not right after its `free_requested`: the block was used on
another stream), and `torch.cuda.empty_cache()` (a run of `segment_free`/`segment_unmap` the allocator did not need
for the next request). Everything else (segments, addresses, OOMs) is the allocator's decision, which the model
must make the same way: `replay_check` compares the model's own trace with the recorded one entry by entry.

Its length: the replay loop (`_run`) is one function that walks the trace in the allocator's order, and the two
devices it drives a model with sit beside it; the request side (text settings, caps) is torch_request.py.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import numpy as np
from sortedcontainers import SortedList

from alloctrace.allocator.cuda_caching import (
    ACTIONS, ALLOC, FREE_COMPLETED, FREE_REQUESTED, NO_LIMIT, OOM, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP,
    SEGMENT_UNMAP, SNAPSHOT, AllocatorSettings, Block, CachingAllocator, OutOfMemory)
from alloctrace.allocator.cuda_driver_va import DriverAddresses

SEGMENT_ACTIONS = (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)


class TraceDevice:
    """The device of a replay: each new segment (or expandable address range) gets the address the trace
    recorded for the next one; nothing ever fails below the allocator (a cap is the model's business)."""

    def __init__(self, action: list, addr: list):
        self.action, self.addr = action, addr
        self.cursor = 0                      # first trace index the current request may take segments from
        self.fresh = 1 << 60                 # addresses for segments the trace does not have (a mismatch follows)

    def _next(self, codes: tuple) -> int:
        a = self.action
        i = self.cursor
        while i < len(a) and a[i] not in (ALLOC, FREE_REQUESTED, FREE_COMPLETED, OOM):
            if a[i] in codes:
                self.cursor = i + 1
                return self.addr[i]
            i += 1
        self.fresh += 1 << 40
        return self.fresh

    def malloc(self, size, stream):
        return self._next((SEGMENT_ALLOC,))

    def reserve(self, size, stream):
        # a new expandable segment's first mapping starts at its base
        base = self._next((SEGMENT_MAP,))
        self.cursor -= 1                     # the map itself is still to come
        return base

    def map(self, addr, size):
        return True

    def free(self, addr, size):
        pass

    def unmap(self, addr, size):
        pass


class SimulatedDevice:
    """The device of a what-if run; cudaMalloc / mapping fail past `total` bytes in use.

    Addresses matter to the allocator only through best fit's tie-break (equal sizes go to the lower address), so
    a new segment takes the address the recorded run got for its next segment of the same size when that range is
    free here, else a fresh one above every recorded address. Under the recorded settings a what-if run therefore
    makes exactly the recorded run's choices.

    Without a recorded address, `order` says where a new segment goes: "driver" (as the CUDA driver was seen to
    place them, allocator/cuda_driver_va.py), "down" (below every older one), "up" (above) or an int (a seeded
    random place): the driver's choice, which a plan cannot see, tried several ways to show how much a peak
    depends on it."""

    def __init__(self, total: int, recorded: list[tuple[int, int]] = (), order: str | int = "down"):
        self.total = total
        self.order = order
        self.rng = random.Random(order) if isinstance(order, int) else None
        self.driver = DriverAddresses() if order == "driver" else None
        self.used = 0
        self.by_size: dict[int, list[int]] = {}
        for addr, size in reversed(recorded):
            self.by_size.setdefault(size, []).append(addr)   # popped from the end: trace order
        top = max((a + s for a, s in recorded), default=0)
        self.next_addr = max(0x7F00_0000_0000, -(-top // (1 << 30)) * (1 << 30) + (1 << 30))
        low = min((a for a, _ in recorded), default=0x7F00_0000_0000)
        self.low_addr = max(1 << 40, low // (1 << 30) * (1 << 30) - (1 << 30))
        self.live = SortedList()                              # (start, end) of segments in use

    def occupy(self, addr: int, size: int):
        """A segment that exists before the trace's first entry (a trace that starts mid-run)."""
        self.used += size
        self.live.add((addr, addr + size))
        self.low_addr = min(self.low_addr, addr // (1 << 30) * (1 << 30) - (1 << 30))

    def _free_range(self, addr: int, size: int) -> bool:
        i = self.live.bisect_left((addr, addr))
        if i > 0 and self.live[i - 1][1] > addr:
            return False
        return not (i < len(self.live) and self.live[i][0] < addr + size)

    def malloc(self, size, stream):
        if self.used + size > self.total:
            return None
        self.used += size
        queue = self.by_size.get(size)
        addr = None
        while queue:
            cand = queue.pop()
            if self._free_range(cand, size):
                addr = cand
                break
        if addr is None:
            addr = self._new_address(size)
        self.live.add((addr, addr + size))
        return addr

    def _new_address(self, size: int) -> int:
        if self.driver is not None:
            return self.driver.place(size)
        span = -(-size // (2 << 20)) * (2 << 20)
        if self.rng is not None:             # a random 1 GiB-aligned place in a 2^50-byte range
            while True:
                addr = (1 << 50) + self.rng.randrange(1 << 20) * (1 << 30)
                if self._free_range(addr, span):
                    return addr
        if self.order == "up":
            self.next_addr += span
            return self.next_addr - span
        self.low_addr -= span                # the driver hands out new ranges below the older ones
        return self.low_addr

    def free(self, addr, size):
        self.used -= size
        self.live.discard((addr, addr + size))
        if self.driver is not None:
            self.driver.release(addr, size)

    def reserve(self, size, stream):
        addr = self.next_addr
        self.next_addr += size
        return addr

    def map(self, addr, size):
        if self.used + size > self.total:
            return False
        self.used += size
        return True

    def unmap(self, addr, size):
        self.used -= size


@dataclass
class Mismatch:
    event: int                 # trace index
    expected: dict             # the recorded entry
    model: dict | None         # what the model did there (None: the model did nothing more)
    reason: str = ""


@dataclass
class RunResult:
    """One pass over a trace. Sizes in bytes; `oom`: first failed request {event, size} or None."""
    consistent: bool | None            # None for what-if runs (nothing to compare)
    mismatch: Mismatch | None
    peak_reserved: int
    peak_allocated: int
    fragmentation_at_peak: int         # reserved − allocated right after the request that set the peak reserved
    peak_event: int
    oom: dict | None
    ooms: list = field(default_factory=list)
    cache_flushes: list = field(default_factory=list)   # trace indices where the program emptied the cache
    n_requests: int = 0
    events_checked: int = 0
    stopped_at: int | None = None      # a what-if run stops at an OOM the real run did not have
    avoided_ooms: list = field(default_factory=list)    # real OOMs that the what-if run survived
    alloc_retries: int = 0             # num_alloc_retries: releases of the whole cache before a retry
    segments: list | None = None       # the model's segments at the end (as `_snapshot()` lists them)
    reserved: np.ndarray | None = None  # reserved bytes after each trace index (for plots)
    allocated: np.ndarray | None = None


def _entry(action, addr, size, stream) -> dict:
    return {"action": ACTIONS[action], "addr": int(addr), "size": int(size), "stream": int(stream)}


def _lists(cols: dict) -> tuple[list, list, list, list]:
    n = len(cols["action"])
    stream = cols.get("stream")
    return (np.asarray(cols["action"]).tolist(), np.asarray(cols["addr"]).tolist(),
            np.asarray(cols["size"]).tolist(),
            np.asarray(stream).tolist() if stream is not None else [0] * n)


def _seed(model: CachingAllocator, device, seed, live: dict, deferred: dict):
    """Put a trace's starting state (wrapped.Seed segments: the allocator at its first entry, for a trace that
    starts mid-run) into the model: its segments, its free blocks in the pools, its allocations by address."""
    for addr, size, stream, small, blocks in seed:
        if hasattr(device, "occupy"):
            device.occupy(addr, size)
        model.reserved += size
        prev = None
        for b_addr, b_size, state, requested in blocks:
            b = Block(b_addr, b_size, stream, small)
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            if state == "free":
                (model.small if small else model.large).insert(b)
            elif state == "pending_free":
                b.event_count = 1              # freed by the program, waiting for its stream events
                b.requested = requested
                deferred[b_addr] = b
            else:
                b.allocated, b.requested = True, requested
                model.allocated += b_size
                model.requested += requested
                live[b_addr] = b


def _run(cols: dict, settings: AllocatorSettings, *, check: bool, flushes: set | None = None,
         keep_series: bool = False, progress=None, seed=None) -> RunResult:
    action, addr, size, stream = _lists(cols)
    n = len(action)
    # the next alloc/oom request at or after each index, -1 past the last one
    next_req = [-1] * (n + 1)
    nxt = -1
    for i in range(n - 1, -1, -1):
        if action[i] == ALLOC or action[i] == OOM:
            nxt = i
        next_req[i] = nxt

    if check:
        device = TraceDevice(action, addr)
    else:
        device = SimulatedDevice(settings.device_total,
                                 [(addr[i], size[i]) for i in range(n) if action[i] == SEGMENT_ALLOC])
    model = CachingAllocator(settings, device, record=check)
    log = model.log
    live: dict[int, object] = {}           # trace address of a live allocation -> the model's block
    deferred: dict[int, object] = {}       # trace address of a block waiting for its stream events
    if seed:
        _seed(model, device, seed, live, deferred)
    reserved_s = np.zeros(n, dtype=np.int64) if keep_series else None
    allocated_s = np.zeros(n, dtype=np.int64) if keep_series else None
    res = RunResult(consistent=True if check else None, mismatch=None, peak_reserved=0, peak_allocated=0,
                    fragmentation_at_peak=0, peak_event=-1, oom=None)
    if seed:
        res.peak_reserved, res.peak_allocated = model.reserved, model.allocated
        res.fragmentation_at_peak = model.reserved - model.allocated
    flush_at = set() if flushes is None else flushes
    logged = 0                             # model log entries already compared
    t = 0
    last = 0

    def compare(t: int) -> int:
        """Match new model log entries against the trace from index t; returns the next unmatched index."""
        nonlocal logged
        while logged < len(log):
            while t < n and action[t] == SNAPSHOT:
                t += 1
            a, ad, sz, st = log[logged]
            if t >= n:
                raise _Diverged(Mismatch(n, {}, _entry(a, ad, sz, st), "the model did more than the trace"))
            same = (a == action[t] and sz == size[t] and st == stream[t] and (a == OOM or ad == addr[t]))
            if not same:
                raise _Diverged(Mismatch(t, _entry(action[t], addr[t], size[t], stream[t]),
                                         _entry(a, ad, sz, st)))
            logged += 1
            t += 1
        return t

    def request_malloc(r: int):
        """Serve the alloc/oom request at trace index r."""
        res.n_requests += 1
        try:
            b = model.malloc(size[r], stream[r])
        except OutOfMemory:
            if res.oom is None:
                res.oom = {"event": r, "size": size[r]}
            res.ooms.append({"event": r, "size": size[r]})
            if action[r] == ALLOC and not check:   # the real run got this memory: a what-if run ends here
                raise _Stopped(r)
            return                         # (a checked replay reports the model's oom entry as the mismatch)
        if action[r] == OOM:               # the real run failed here and did not use the memory
            res.avoided_ooms.append(r)
            model.free(b)
            return
        live[addr[r]] = b

    try:
        while t < n:
            a = action[t]
            if a == SNAPSHOT:
                t += 1
                continue
            start = t
            tried = False                  # a trial request already compared its entries
            if a == ALLOC or a == OOM:
                if check:
                    device.cursor = t
                request_malloc(t)
                nt = t + 1
            elif a == FREE_REQUESTED:
                b = live.pop(addr[t], None)
                if b is None:
                    raise _Diverged(Mismatch(t, _entry(a, addr[t], size[t], stream[t]), None,
                                             "free of an address with no live allocation"))
                j = t + 1
                while j < n and action[j] == SNAPSHOT:
                    j += 1
                waits = not (j < n and action[j] == FREE_COMPLETED and addr[j] == addr[t])
                res.n_requests += 1
                model.free(b, deferred=waits)
                if waits:
                    deferred[addr[t]] = b
                nt = j + 1 if not waits else t + 1
            elif a == FREE_COMPLETED:
                b = deferred.pop(addr[t], None)
                if b is None:
                    raise _Diverged(Mismatch(t, _entry(a, addr[t], size[t], stream[t]), None,
                                             "free_completed of a block that was not waiting for events"))
                model.complete_free(b)
                nt = t + 1
            elif a in (SEGMENT_ALLOC, SEGMENT_MAP):
                r = next_req[t]
                if r < 0:
                    raise _Diverged(Mismatch(t, _entry(a, addr[t], size[t], stream[t]), None,
                                             "a segment with no request after it"))
                if check:
                    device.cursor = t
                request_malloc(r)
                nt = r + 1
            else:                          # SEGMENT_FREE / SEGMENT_UNMAP: the allocator's release, or empty_cache
                j = t
                while j < n and (action[j] in SEGMENT_ACTIONS or action[j] == SNAPSHOT):
                    j += 1
                r = j if j < n and action[j] in (ALLOC, OOM) else -1
                is_flush = r < 0 or (t in flush_at if flushes is not None
                                     else not model.would_release(size[r], stream[r]))
                if not is_flush and check:
                    # the request itself would release memory (GC, cap retry); the program may also have
                    # emptied the cache just before it. Try the request; if its releases differ, it was the latter.
                    backup, moved = model.clone(list(live.values()) + list(deferred.values()))
                    backup = (backup, {k: moved[id(b)] for k, b in live.items()},
                              {k: moved[id(b)] for k, b in deferred.items()})
                    mark, n_ooms, first_oom = len(log), len(res.ooms), res.oom
                    try:
                        device.cursor = t
                        request_malloc(r)
                        nt = compare(start)
                        tried = True
                    except _Diverged:
                        del log[mark:]
                        logged = mark
                        model, live, deferred = backup
                        del res.ooms[n_ooms:]
                        res.oom = first_oom
                        res.n_requests -= 1
                        is_flush = True
                if is_flush:
                    res.cache_flushes.append(t)
                    model.empty_cache()
                    nt = t
                    if not check:          # what-if: the real run's release entries are not ours
                        nt = t + 1
                        while nt < n and action[nt] in (SEGMENT_FREE, SEGMENT_UNMAP):
                            nt += 1
                elif not check:
                    request_malloc(r)
                    nt = r + 1
            if check and not tried:
                nt = compare(start)
            if nt <= t:                    # nothing the model did accounts for this entry (e.g. the release of a
                raise _Diverged(Mismatch(  # segment it never had): a mismatch, and the loop always moves on
                    t, _entry(a, addr[t], size[t], stream[t]), None, "the model makes no such decision here"))
            if keep_series:
                reserved_s[last:nt] = model.reserved
                allocated_s[last:nt] = model.allocated
            last = nt
            if model.reserved > res.peak_reserved:
                res.peak_reserved = model.reserved
                res.fragmentation_at_peak = model.reserved - model.allocated
                res.peak_event = nt - 1
            if model.allocated > res.peak_allocated:
                res.peak_allocated = model.allocated
            if progress is not None and (t >> 16) != (nt >> 16):
                progress(nt, n)
            t = nt
        if check and logged < len(log):
            compare(t)
    except _Diverged as d:
        res.consistent = False
        res.mismatch = d.mismatch
        res.stopped_at = d.mismatch.event
    except _Stopped as s:
        res.stopped_at = s.event
    if keep_series and last < n:
        reserved_s[last:] = model.reserved
        allocated_s[last:] = model.allocated
    res.events_checked = t if res.consistent is not False else res.mismatch.event
    res.alloc_retries = model.num_alloc_retries
    if check and res.consistent:
        res.segments = model.segments(list(live.values()) + list(deferred.values()))
    res.reserved, res.allocated = reserved_s, allocated_s
    return res


class _Diverged(Exception):
    def __init__(self, mismatch: Mismatch):
        self.mismatch = mismatch


class _Stopped(Exception):
    def __init__(self, event: int):
        self.event = event


def replay_check(cols: dict, settings: AllocatorSettings, *, keep_series: bool = False, progress=None,
                 seed=None) -> RunResult:
    """Replay one device's trace under the settings it was recorded with and compare every decision:
    each segment request (size, and the recorded address used), each allocation's address, each release and OOM.
    `consistent` is False at the first difference, which `mismatch` describes (trace index, both choices)."""
    return _run(cols, settings, check=True, keep_series=keep_series, progress=progress, seed=seed)


def what_if(cols: dict, settings: AllocatorSettings, *, flushes: list[int] | None = None, keep_series: bool = False,
            progress=None, seed=None) -> RunResult:
    """Run the trace's requests under other settings. `flushes`: the trace indices where the program emptied the
    cache (from `replay_check(...).cache_flushes`); without them every unexplained release run counts as one."""
    fl = set(flushes) if flushes is not None else _flush_guess(cols)
    return _run(cols, settings, check=False, flushes=fl, keep_series=keep_series, progress=progress, seed=seed)


def _flush_guess(cols: dict) -> set:
    """Release runs not directly followed by a request: the program's empty_cache() calls."""
    action = np.asarray(cols["action"]).tolist()
    out, n, i = set(), len(action), 0
    while i < n:
        if action[i] in (SEGMENT_FREE, SEGMENT_UNMAP):
            j = i
            while j < n and action[j] in SEGMENT_ACTIONS:
                j += 1
            if not (j < n and action[j] in (ALLOC, OOM)):
                out.add(i)
            i = j
        else:
            i += 1
    return out


def trace_peaks(cols: dict, base_reserved: int = 0) -> dict:
    """What the trace itself says: peak reserved (Σ segment sizes, on top of `base_reserved` for a trace that
    starts mid-run) and the first OOM."""
    action = np.asarray(cols["action"])
    size = np.asarray(cols["size"], dtype=np.int64)
    delta = np.where((action == SEGMENT_ALLOC) | (action == SEGMENT_MAP), size,
                     np.where((action == SEGMENT_FREE) | (action == SEGMENT_UNMAP), -size, 0))
    reserved = np.cumsum(delta) + base_reserved
    ooms = np.flatnonzero(action == OOM)
    return {"peak_reserved": int(reserved.max(initial=base_reserved)),
            "oom": {"event": int(ooms[0]), "size": int(size[ooms[0]])} if len(ooms) else None,
            "reserved": reserved}


def seed_reserved(seed) -> int:
    return sum(s[1] for s in seed or ())


def compare_settings(cols: dict, recorded: AllocatorSettings, changed: AllocatorSettings, *,
                     keep_series: bool = False, progress=None, seed=None) -> dict:
    """Real run (checked replay under the recorded settings) next to the what-if run under `changed`.
    `progress(phase, done, total)` is called now and then ("recorded", then "what-if")."""
    def phase(name):
        return None if progress is None else (lambda i, n: progress(name, i, n))
    real = replay_check(cols, recorded, keep_series=keep_series, progress=phase("recorded"), seed=seed)
    tp = trace_peaks(cols, seed_reserved(seed))
    flushes = real.cache_flushes if real.consistent else None
    wi = what_if(cols, changed, flushes=flushes, keep_series=keep_series, progress=phase("what-if"), seed=seed)

    def block(r: RunResult, *, is_real: bool) -> dict:
        d = {"peak_reserved": r.peak_reserved, "peak_allocated": r.peak_allocated,
             "fragmentation_at_peak": r.fragmentation_at_peak, "oom": r.oom}
        if is_real:
            d["peak_reserved"] = tp["peak_reserved"]       # straight from the trace
            d["oom"] = tp["oom"]
            d["consistent"] = r.consistent
            d["mismatch"] = asdict(r.mismatch) if r.mismatch else None
        else:
            d["stopped_at"] = r.stopped_at
            d["avoided_ooms"] = r.avoided_ooms
        return d

    out = {"settings": settings_dict(changed), "real": block(real, is_real=True), "whatif": block(wi, is_real=False)}
    if keep_series:
        out["series"] = {"real_reserved": tp["reserved"], "real_allocated": real.allocated,
                         "whatif_reserved": wi.reserved, "whatif_allocated": wi.allocated,
                         "whatif_stopped_at": wi.stopped_at}
    return out


def settings_dict(s: AllocatorSettings) -> dict:
    d = asdict(s)
    d["max_split_size"] = None if s.max_split_size >= NO_LIMIT else s.max_split_size
    d["roundup_power2_divisions"] = list(s.roundup_power2_divisions)
    return d
