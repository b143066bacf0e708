"""Static memory-hazard check of an allocation plan.

Walks the plan's steps with a shadow map that labels every written byte range
with the tensor whose data it holds (the root of the writer: a view's or a
CPY's bytes belong to the tensor they alias) and the node that wrote it. Then:

- overwrite live: a node writes bytes holding another tensor's data that a
  later step still reads. An inplace op overwriting its own source is legal,
  because that source has no reader after it (the allocator only reuses a
  parent whose last child is this node);
- stale read: a node reads bytes that no longer hold the data of the tensor it
  reads (overwritten since, or never written);
- concurrent overlap: within a concurrently dispatched level, one node's
  written range meets another node's read or written range (PR #2757: frees
  must wait for the barrier). Strided views whose ranges interleave (a fused
  QKV row holds Q, K and V heads side by side) are compared element run by
  element run, so only bytes both really touch count.

Interval structures only, so 70B-sized graphs take milliseconds, not a per-byte array.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from alloctrace.allocator.events import Event
from alloctrace.allocator.tensor import TYPE_SIZE

from .plan import Plan, alias_parent, extent, graph_outputs, input_roots, read_srcs, root_of, writes

OVERWRITE_LIVE = "overwrite live"
STALE_READ = "stale read"
CONCURRENT_OVERLAP = "concurrent overlap"


@dataclass(frozen=True, slots=True)
class Label:
    root: object  # the Tensor whose data these bytes hold
    writer: object  # the node (or input leaf) that wrote them


class IntervalMap:
    """Disjoint half-open byte ranges, each with a label; assigning splits what it covers."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.labels: list = []

    def _first(self, a: int) -> int:
        """Index of the first segment that ends after a."""
        i = bisect_right(self.starts, a) - 1
        if i < 0 or self.ends[i] <= a:
            i += 1
        return i

    def overlapping(self, a: int, b: int):
        """(start, end, label) for every labelled piece of [a, b), clipped to it."""
        out = []
        if a >= b:
            return out
        i = self._first(a)
        while i < len(self.starts) and self.starts[i] < b:
            out.append((max(a, self.starts[i]), min(b, self.ends[i]), self.labels[i]))
            i += 1
        return out

    def gaps(self, a: int, b: int):
        """Pieces of [a, b) with no label at all."""
        out, cur = [], a
        for s, e, _ in self.overlapping(a, b):
            if s > cur:
                out.append((cur, s))
            cur = e
        if cur < b:
            out.append((cur, b))
        return out

    def assign(self, a: int, b: int, label):
        if a >= b:
            return
        i = self._first(a)
        j = i
        while j < len(self.starts) and self.starts[j] < b:
            j += 1
        pieces = []
        if i < j and self.starts[i] < a:
            pieces.append((self.starts[i], a, self.labels[i]))
        pieces.append((a, b, label))
        if i < j and self.ends[j - 1] > b:
            pieces.append((b, self.ends[j - 1], self.labels[j - 1]))
        self.starts[i:j] = [p[0] for p in pieces]
        self.ends[i:j] = [p[1] for p in pieces]
        self.labels[i:j] = [p[2] for p in pieces]


class ReadIndex:
    """Who reads which tensor's data where, by step: answers "is this range read after step k?"."""

    def __init__(self):
        self.by_root: dict = {}  # root -> sorted list of (step, start, end, reader, src)

    def add(self, root, step: int, start: int, end: int, reader, src):
        self.by_root.setdefault(root, []).append((step, start, end, reader, src))

    def finish(self):
        for reads in self.by_root.values():
            reads.sort(key=lambda r: r[0])
        self._steps = {root: [r[0] for r in reads] for root, reads in self.by_root.items()}

    def later_read(self, root, after_step: int, a: int, b: int):
        """The first read of root's data in [a, b) at a step after after_step, or None."""
        reads = self.by_root.get(root)
        if not reads:
            return None
        for r in reads[bisect_right(self._steps[root], after_step):]:
            if r[1] < b and a < r[2]:
                return r
        return None


class _Report:
    """Hazard events, one per (reason, node, victim), the byte range widened to cover every hit."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.events: dict = {}

    def add(self, reason: str, node, victim, a: int, b: int, step: int, **extra):
        key = (reason, id(node), id(victim))  # tensors, not names: built graphs repeat names per layer
        ev = self.events.get(key)
        if ev is None:
            self.events[key] = Event("hazard", graph=self.plan.graph_index, tensor=node.name, op=node.op,
                                     parent=victim.name if victim is not None else None, offset=a, size=b - a if a is not None else None, reason=reason,
                                     node=node.index if node.op != "NONE" else None,
                                     extra={"step": step, **{k: v for k, v in extra.items() if v is not None}})
            return
        if ev.offset is not None and a is not None:
            lo, hi = min(ev.offset, a), max(ev.offset + ev.size, b)
            ev.offset, ev.size = lo, hi - lo


def check(plan: Plan) -> list[Event]:
    """Every hazard of the plan as a `hazard` Event, in the order the walk meets them."""
    steps = plan.steps()
    nodes = plan.graph.nodes
    roots: dict = {}

    def root(t):
        if t not in roots:
            roots[t] = root_of(t)[0]
        return roots[t]

    reads = ReadIndex()
    for k, step in enumerate(steps):
        for i in step:
            for s in read_srcs(nodes[i]):
                r = plan.range(s)
                if r is not None:
                    reads.add(root(s), k, r[0], r[1], nodes[i], s)
    for out in graph_outputs(plan.graph):
        r = plan.range(out)
        if r is not None and writes(out):
            reads.add(root(out), len(steps), r[0], r[1], None, out)  # the program reads it after compute
    reads.finish()

    shadow = IntervalMap()
    report = _Report(plan)

    def write(node, step_k: int):
        r = plan.range(node)
        if r is None:
            return
        mine = root(node)
        for a, b, label in shadow.overlapping(*r):
            if label.root is mine:
                continue
            hit = reads.later_read(label.root, step_k, a, b)
            if hit is not None:
                report.add(OVERWRITE_LIVE, node, label.root, max(a, hit[1]), min(b, hit[2]), step_k,
                           reader=hit[3].name if hit[3] is not None else "<graph output>", read_as=hit[4].name)
        shadow.assign(r[0], r[1], Label(mine, node))

    for leaf in input_roots(plan.graph):
        write(leaf, -1)  # the program fills its inputs before compute

    for k, step in enumerate(steps):
        for i in step:
            node = nodes[i]
            for s in read_srcs(node):
                r = plan.range(s)
                if r is None:
                    continue
                want = root(s)
                for a, b, label in shadow.overlapping(*r):
                    if label.root is not want:
                        report.add(STALE_READ, node, s, a, b, k, overwriter=label.writer.name)
                for a, b in shadow.gaps(*r):
                    report.add(STALE_READ, node, s, a, b, k, overwriter="<never written>")
        if len(step) > 1:
            _concurrent(plan, [nodes[i] for i in step], report, k)
        for i in step:
            if writes(nodes[i]):
                write(nodes[i], k)
    _ordering(plan, steps, report)
    return list(report.events.values())


def _ordering(plan: Plan, steps: list, report: "_Report"):
    """Reads that graph order puts after a write into the same tensor's memory but the plan does not.

    Catches what byte ownership cannot: several writers of one tensor (CPY into views of a KV
    cache) and memory outside the buffer, where a read of the cache may be scheduled before, or in
    the same level as, the CPY that fills it (a level built from data dependencies only)."""
    step_of = {i: k for k, step in enumerate(steps) for i in step}
    writers: dict = {}  # root -> [(graph index, start, end, node)] in root-relative bytes
    for node in plan.graph.nodes:
        if writes(node) and alias_parent(node) is not None:
            root, off = root_of(node)
            writers.setdefault(root, []).append((node.index, off, off + extent(node), node))
    for node in plan.graph.nodes:
        for s in read_srcs(node):
            root, off = root_of(s)
            a, b = off, off + extent(s)
            for wi, wa, wb, w in writers.get(root, ()):
                if wi >= node.index or wb <= a or b <= wa or w is node:
                    continue
                r = plan.range(s)
                lo, hi = (r[0] + max(a, wa) - a, r[0] + min(b, wb) - a) if r else (None, None)
                where = {} if r else {"outside_buffer": root.name, "root_offset": max(a, wa)}
                if step_of[node.index] < step_of[wi]:
                    report.add(STALE_READ, node, s, lo, hi, step_of[node.index], early_for=w.name, **where)
                elif step_of[node.index] == step_of[wi]:
                    report.add(CONCURRENT_OVERLAP, w, s, lo, hi, step_of[wi], other=node.name, access="read",
                               **where)


MAX_RUNS = 1 << 22  # beyond this many element runs, keep the conservative whole-range answer


def is_dense(t) -> bool:
    """Every byte between the first and last element belongs to the tensor."""
    n = t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]
    return extent(t) == n * TYPE_SIZE.get(t.type, 1)


def byte_runs(t, start: int):
    """(starts, ends) of the contiguous byte runs a tensor placed at `start` touches, sorted; None if too many."""
    ts = TYPE_SIZE.get(t.type, 1)
    dims = (1, 2, 3) if t.nb[0] == ts else (0, 1, 2, 3)
    if int(np.prod([t.ne[d] for d in dims])) > MAX_RUNS:
        return None
    starts = np.array([start], dtype=np.int64)
    for d in dims:
        starts = (starts[:, None] + np.arange(t.ne[d], dtype=np.int64) * t.nb[d]).ravel()
    starts.sort()
    return starts, starts + (t.ne[0] * ts if dims[0] == 1 else ts)


def runs_meet(a, b) -> bool:
    """Do two sorted run lists share a byte?"""
    (sa, ea), (sb, eb) = a, b
    reach = np.maximum.accumulate(ea)  # runs of one tensor may overlap (stride 0): furthest end so far
    i = np.searchsorted(sa, eb, side="left") - 1  # the last run of a starting before each run of b ends
    hit = i >= 0
    return bool(np.any(reach[i[hit]] > sb[hit]))


def touch_same_bytes(plan: Plan, x, y, cache: dict) -> bool:
    """Exact for strided tensors; ranges that merely interleave do not count."""
    if is_dense(x) and is_dense(y):
        return True
    runs = []
    for t in (x, y):
        if t not in cache:
            cache[t] = byte_runs(t, plan.range(t)[0])
        runs.append(cache[t])
    return runs[0] is None or runs[1] is None or runs_meet(*runs)


def _concurrent(plan: Plan, level: list, report: _Report, k: int):
    """Overlaps between one node's writes and another's reads or writes inside one level (sweep by start)."""
    spans = []  # (start, end, node, tensor accessed, is_write)
    for node in level:
        if writes(node) and plan.range(node) is not None:
            spans.append((*plan.range(node), node, node, True))
        for s in read_srcs(node):
            if plan.range(s) is not None:
                spans.append((*plan.range(s), node, s, False))
    spans.sort(key=lambda x: x[0])
    active, runs = [], {}
    for span in spans:
        active = [x for x in active if x[1] > span[0]]
        for other in active:
            if other[2] is span[2] or not (other[4] or span[4]):
                continue
            if not touch_same_bytes(plan, other[3], span[3], runs):
                continue
            w, o = (other, span) if other[4] else (span, other)
            a, b = max(w[0], o[0]), min(w[1], o[1])
            report.add(CONCURRENT_OVERLAP, w[2], o[3], a, b, k, other=o[2].name,
                       access="write" if o[4] else "read")
        active.append(span)


def summary(events: list[Event]) -> str:
    """One line per hazard, for people."""
    lines = []
    for ev in events:
        extra = ev.extra
        what = {
            OVERWRITE_LIVE: lambda: f"overwrites {ev.parent}, still read by {extra.get('reader')}",
            STALE_READ: lambda: (f"reads {ev.parent} before {extra['early_for']} wrote it" if "early_for" in extra
                                 else f"reads {ev.parent}, overwritten by {extra.get('overwriter')}"),
            CONCURRENT_OVERLAP: lambda: f"writes over {ev.parent} while {extra.get('other')} "
                                        f"{'writes' if extra.get('access') == 'write' else 'reads'} it",
        }[ev.reason]()
        where = (f"[bytes {ev.offset}..{ev.offset + ev.size})" if ev.offset is not None
                 else f"[outside the buffer: {extra.get('outside_buffer')} + {extra.get('root_offset')}]")
        lines.append(f"graph {ev.graph} step {extra.get('step')}: {ev.reason}: {ev.tensor} ({ev.op}) {what} {where}")
    return "\n".join(lines)
