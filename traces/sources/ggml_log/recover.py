"""Recover what a log does not print (offsets, free-list state) by replaying it through the model.

Every logged allocation and free is fed, in order, to the model's free-block
allocator of the log's generation. Where the log prints a choice (block index,
address, offset, chunk), the model's choice is compared with it: a graph is
`consistent` when they agree at every step.
"""
from __future__ import annotations

from collections import defaultdict, deque

from alloctrace.allocator.dyn_tallocr import DynOutOfSpace, DynTallocr
from alloctrace.allocator.events import Event
from alloctrace.allocator.profiles import get_profile
from alloctrace.allocator.tallocr import MEASURE_BASE, MEASURE_SIZE, LegacyTallocr, OutOfFreeBlocks, OutOfSpace

from alloctrace.traces.store.schema import GraphRecord, oom_of
from alloctrace.traces.sources.ggml_log.split import Draft

MIB = 1024 * 1024
REPLAYED = frozenset({"alloc", "free", "reuse", "oom"})
BASE_NOT_LOGGED = ("the log lacks the buffer's heap base (it prints aligned addresses only; ggml counts the bytes "
                   "from the base to the first aligned address in max_size)")


def ops_from_exec(events: list):
    """Logs name no op on allocation lines; the node's later `exec:` line does. Give each alloc
    (and inplace reuse) the op of the next exec of that name; a tensor allocated but never executed is a leaf (NONE),
    unless it is the one whose allocation failed."""
    next_op: dict = {}
    oom_next = False  # 2023 logs name no tensor in the error line: the failed alloc is the one before it
    for ev in reversed(events):
        if ev.kind == "exec":
            next_op[ev.tensor] = ev.op
        elif ev.kind == "alloc" and ev.op is None:
            ev.op = next_op.get(ev.tensor, None if oom_next else "NONE")
        elif ev.kind == "reuse" and ev.op is None:  # an inplace node: its memory's lifetime goes on as it
            ev.op = next_op.get(ev.tensor)
        oom_next = ev.kind == "oom"


class LegacyReplay:
    """ggml_allocr lives: a measure allocator, then a real one reset before each eval."""

    def __init__(self, generation: str, addr_block: bool, has_addr: bool = False):
        self.profile = get_profile(generation)
        self.has_addr = has_addr
        self.addr_block = addr_block  # the printed block is the one used, not -1 for the fallback
        self.t: LegacyTallocr | None = None
        self.life = None
        self.measure_max = None
        self.measure_align = 16
        self.measure_unsure = 0  # bytes the measured size may lack (see _base_uncertainty)
        self.base_logged = self.base_virtual = False
        self.buffer = None
        self.index = 0

    def graph(self, d: Draft) -> GraphRecord:
        role = "measure" if (self.index == 0 or d.compute_after or d.measure_before) else "eval"
        align = d.alignment or 16
        base = d.vm_base if d.vm_base is not None else (_first_addr(d) if self.has_addr else None)
        self.base_logged = d.vm_base is not None
        self.base_virtual = base is None  # the measure's own base (MEASURE_BASE), unless the log's pointers differ
        if role == "measure":
            self.t = LegacyTallocr(self.profile, MEASURE_BASE if base is None else base, MEASURE_SIZE, align, True)
            self.life, self.buffer = "measure", None
        elif self.life != "real" or d.buffer_before is not None:  # a new real allocator
            align = d.alignment or self.measure_align
            backend = align == self.profile.backend_alignment  # a CPU backend buffer, not a plain one
            pad = 0 if backend else align
            self.buffer = d.buffer_before or (self.measure_max + pad if self.measure_max else None)
            room = self.profile.backend_slack if backend else 0  # the backend's own slack beyond the size asked
            self.t = LegacyTallocr(self.profile, base or 0, (self.buffer + room) if self.buffer else MEASURE_SIZE, align)
            self.life = "real"
        else:
            self.t.reset()
        events = [e for e in d.items if isinstance(e, Event)]  # head-only items are meaningless here
        ops_from_exec(events)
        rec = GraphRecord(index=self.index, role=role, events=events, buffer_size=self.buffer)
        rec.consistent = self._replay(events)
        rec.max_size = self.t.max_size + self._base_padding()
        rec.oom = oom_summary(rec)
        unsure = self._base_uncertainty()
        if role == "measure":
            self.measure_max = rec.max_size
            self.measure_unsure = unsure
            sizes = [e.size for e in d.items if isinstance(e, Event) and e.kind == "alloc"]
            self.measure_align = d.alignment or next(
                (a for a in self.profile.alignments if sizes and all(s % a == 0 for s in sizes)), 16)
        elif self.buffer is not None and not d.buffer_before:
            unsure = max(unsure, self.measure_unsure)  # its buffer is the measured size
        if unsure:
            rec.extra = {**rec.extra, "uncertainty_bytes": unsure, "reason": BASE_NOT_LOGGED}
        self.index += 1
        return rec

    def _base_padding(self) -> int:
        """Bytes between a heap buffer's base and its first aligned address, which ggml counts in max_size.

        Logs of pointers show the aligned start only. glibc serves big buffers from mmap, 16 bytes past a
        page start: an aligned start just past such a base is taken to be one. A small heap buffer's base
        (the scheduler's 65-byte measure buffer) is 16-byte aligned and not in the log; it is taken as aligned,
        so such a max_size can be up to alignment - 16 bytes short."""
        if self.shift is None:
            return 0
        start = self.t.base + self.shift
        pad = (start - 16) % 4096
        return pad if 0 < pad < self.t.alignment else 0

    def _base_uncertainty(self) -> int:
        """How many bytes a max_size may lack: a heap base taken as its first aligned address (no mmap start
        shows) may lie that far below it, in 16-byte steps, up to the buffer's alignment."""
        if self.shift is None or self.base_logged or (self.base_virtual and self.shift == 0) or self._base_padding():
            return 0
        if (self.t.base + self.shift - 16) % 4096 == 0:  # an mmap start: the base is this address
            return 0
        return max(self.t.alignment, self.profile.backend_alignment) - 16

    def state(self) -> tuple:
        """Everything `graph` reads besides the draft (see RecoveryCache)."""
        t = self.t
        tal = None if t is None else (t.base, t.size, t.alignment, t.measure, t.max_size, tuple(t.addrs),
                                      tuple(t.sizes))
        return self.index == 0, self.life, self.measure_max, self.measure_align, self.measure_unsure, self.buffer, tal

    def restore(self, state: tuple):
        """Take the state `state()` described (the index is left alone)."""
        _, self.life, self.measure_max, self.measure_align, self.measure_unsure, self.buffer, tal = state
        if tal is None:
            self.t = None
            return
        base, size, alignment, measure, max_size, addrs, sizes = tal
        self.t = LegacyTallocr(self.profile, base, size, alignment, measure)
        self.t.max_size, self.t.addrs, self.t.sizes = max_size, list(addrs), list(sizes)

    def _replay(self, items) -> bool:
        self.ok, self.pending_oom, self.oom_tensor = True, None, None
        self.shift = None  # logged address - model address (logs that print pointers of their own heap)
        # tensor name -> its live allocations' alloc Events (offset and size say where; a tuple of
        # its own per allocation cost ~100 bytes each, a third of a long walk's replay)
        self.live: dict[str, deque] = defaultdict(deque)
        step, replayed = self._step, REPLAYED
        for ev in items:
            if ev.kind not in replayed:
                continue
            try:
                step(ev)
            except (OutOfFreeBlocks, IndexError, ValueError):
                self.ok = False
        self.live = None  # nothing reads it after the walk
        return self.ok and self.pending_oom is None

    def _step(self, ev: Event):
        t, k = self.t, ev.kind
        if k == "alloc":
            if ev.block is None:
                return
            n_before = len(t.sizes)
            try:
                ch = t.alloc(ev.size)
            except OutOfSpace as e:
                self.pending_oom, self.oom_tensor = e, ev.tensor
                self.ok = self.ok and ev.block == -1
                return
            block = ch.block if not self.addr_block or ch.block != -1 else n_before - 1
            if block != ev.block or (ev.addr is not None and ev.addr != ch.addr):
                self.ok = False
            ev.offset = ch.addr - t.base
            self.live[ev.tensor].append(ev)
            ev.n_free, ev.largest_free, ev.total_free = t.summary()
        elif k == "free":
            addr = _take(self.live, ev.tensor, ev.size, t.base)
            if ev.addr is not None:
                if addr is None:  # a name the walk handed on (view parents): the logged pointer says where
                    addr = ev.addr - (self.shift or 0)
                elif self.shift is None:
                    self.shift = ev.addr - addr
                elif ev.addr - addr != self.shift:
                    self.ok = False
            if addr is None or ev.n_free_before != len(t.sizes):
                self.ok = False
            if addr is not None:
                t.free(addr, ev.size)
                ev.offset = addr - t.base
                ev.n_free, ev.largest_free, ev.total_free = t.summary()
        elif k == "reuse":
            # the node takes over its parent's (or the view's source's) memory
            src = self.live.get(ev.view_src or ev.parent)
            if src:
                self.live[ev.tensor].append(src.popleft())
        elif k == "oom":
            if ev.tensor is None:
                ev.tensor = self.oom_tensor
            if self.pending_oom is None:  # the allocating line was lost: ask the model directly
                try:
                    t.alloc(ev.needed)
                except OutOfSpace as e:
                    self.pending_oom = e
            got = self.pending_oom
            if got is None or (got.needed, got.largest) != (ev.needed, ev.largest):
                self.ok = False
            self.pending_oom = None


def _first_addr(d: Draft):
    for ev in d.items:
        if isinstance(ev, Event) and ev.kind == "alloc" and ev.addr:
            return ev.addr
    return None


def _take(live: dict, name: str, size: int, base: int):
    """The address of the live tensor a `freeing NAME` line means; explicit allocations
    logged before the graph named them are matched by size, oldest first."""
    for key in (name, ""):
        q = live.get(key)
        if q:
            for i, alloc in enumerate(q):
                if alloc.size == size:
                    del q[i]
                    return base + alloc.offset
    return None


class GallocrReplay:
    """ggml_gallocr plans: the dyn_tallocr is reset for each plan; the buffer only grows."""

    def __init__(self, generation: str):
        self.profile = get_profile(generation)
        self.chunk_sizes: list[int] | None = None
        self.index = 0

    def graph(self, d: Draft) -> GraphRecord:
        first = next((e for e in d.items if isinstance(e, Event)), None)
        role = "eval" if first is not None and first.kind == "realloc" else "reserve"
        sizes = [e.size for e in d.items if isinstance(e, Event) and e.kind == "alloc"]
        align = d.alignment or (32 if all(s % 32 == 0 for s in sizes) else 16)
        dyn = DynTallocr(align, max_free_blocks=self.profile.max_free_blocks)
        events, ok = self._replay(d.items, dyn)
        ops_from_exec(events)
        new = [ch.max_size for ch in dyn.chunks]
        cur = self.chunk_sizes
        before = sum(cur) if cur else 0
        if cur is None or any(n > (cur[c] if c < len(cur) else 0) for c, n in enumerate(new)):
            self.chunk_sizes = new
        after = sum(self.chunk_sizes)
        for ev in events:
            if ev.kind == "buffer":
                ev.size, ev.extra = after, {"from": before}
        rec = GraphRecord(index=self.index, role=role, events=events, max_size=sum(new),
                          buffer_size=d.buffer_after if d.buffer_after is not None else after + self.profile.buffer_pad,
                          consistent=ok)
        rec.oom = oom_summary(rec)
        self.index += 1
        return rec

    def state(self) -> tuple:
        """Everything `graph` reads besides the draft (see RecoveryCache)."""
        return (None if self.chunk_sizes is None else tuple(self.chunk_sizes),)

    def restore(self, state: tuple):
        self.chunk_sizes = None if state[0] is None else list(state[0])

    def _replay(self, items, dyn: DynTallocr):
        ok, events = True, []
        where: dict[str, tuple] = {}  # tensor name -> (chunk, offset, padded size)
        pending_oom = None
        for ev in items:
            if not isinstance(ev, Event):  # ("buffer", name, from MiB, to MiB)
                events.append(Event("buffer", reason=ev[1], size=int(ev[3] * MIB), extra={"from": int(ev[2] * MIB)}))
                continue
            events.append(ev)
            k = ev.kind
            try:
                if k == "alloc":
                    c, b, o = dyn.alloc(ev.size)
                    if (b, o, c) != (ev.block, ev.offset, ev.chunk if ev.chunk is not None else 0):
                        ok = False
                    if ev.offset is None:
                        ev.offset = o
                    where[ev.tensor] = (c, o, ev.size)
                    ev.n_free, ev.largest_free, ev.total_free = dyn.summary()
                elif k == "free":
                    c = ev.chunk if ev.chunk is not None else 0
                    if ev.offset is None or c >= len(dyn.chunks):
                        ok = False
                        continue
                    if ev.n_free_before != len(dyn.chunks[c].sizes):
                        ok = False
                    dyn.free(c, ev.offset, ev.size)
                    ev.n_free, ev.largest_free, ev.total_free = dyn.summary()
                elif k == "reuse" and ev.parent in where:
                    where[ev.tensor] = where[ev.parent]
                elif k == "free_extra":
                    p = where.get(ev.tensor)
                    if p is None:
                        ok = False
                        continue
                    c, o, s = p
                    ev.chunk, ev.offset = c, o + s - ev.size
                    dyn.free(c, ev.offset, ev.size)
                    where[ev.tensor] = (c, o, s - ev.size)
                elif k == "oom":
                    if pending_oom is None:
                        dyn.alloc(ev.needed)
                        ok = False
                    elif (pending_oom.needed, pending_oom.largest) != (ev.needed, ev.largest):
                        ok = False
                    pending_oom = None
            except DynOutOfSpace as e:
                if k == "alloc":
                    pending_oom = e
                ok = False if k != "oom" else ok and (e.needed, e.largest) == (ev.needed, ev.largest)
            except (OutOfFreeBlocks, IndexError):
                ok = False
        return events, ok and pending_oom is None


def oom_summary(rec: GraphRecord) -> dict | None:
    for ev in rec.events:
        if ev.kind == "oom":
            return oom_of(ev)
    return None
