"""Replay recorded allocator calls through the model and compare with what ggml really did.

The generation is the one the recorded `ggml_version()` names (`profile_for_version`:
ggml-head for today's ggml).

Every gallocr of the program gets one model `Gallocr` with the recorded buffer
types (alignment, max size; the same type object shares one buffer, as in ggml).
Each recorded call is replayed on it in order: a reserve plans, `alloc_graph`
re-plans only when the model finds the plan invalid. Then:

- every placement the program made (`ggml_backend_tensor_alloc`,
  `ggml_backend_view_init`) must be at the model's offset in a buffer the model
  also chose, consistently within the call (model (buffer id, chunk) <-> real buffer);
- buffer sizes after the call must equal the model's (`ggml_gallocr_get_buffer_size`,
  or the sizes `reserve_n_size` returned);
- the return value, and whether `alloc_graph` re-planned, must agree.

A plan made by a reserve call places nothing itself: the `alloc_graph` calls that
reuse it do. Their placements are checked against that plan too, and a mismatch
makes the reserve graph inconsistent as well (`extra.plan_checked` counts them).
"""
from __future__ import annotations

import json
from alloctrace.allocator.record_class import record_class, field

from alloctrace.traces.util.zstd import zstandard  # the compiled module without the package's __init__

from alloctrace.allocator import get_profile
from alloctrace.allocator.profiles import profile_for_version
from alloctrace.allocator.gallocr import BufferType, Gallocr
from alloctrace.allocator.tensor import Graph, Tensor
from alloctrace.traces.store.columns import EncodedGraph, encode_arrays, pack_arrays
from alloctrace.traces.store.schema import GraphRecord, oom_of

from alloctrace.traces.sources.record import plans_fast
from alloctrace.traces.sources.record.placed import placement_events
from alloctrace.traces.sources.record.stream import (GALLOC_CALLS, INPUT, OUTPUT, PARAM, Call, Process, RecordingError,
                                                     tensor_records)

PROFILE = "ggml-head"  # when the recording names no ggml version
MAX_MISMATCHES = 10  # kept per graph
MAX_SHAPES = 8192  # tensors whose shape a graph's extra keeps (for `peak`: ne, type, op and inputs)
MAX_KEPT_EVENTS = 200_000  # per process, for a caller that asked to keep them (a long run's stay compressed)


@record_class
class _Model:
    serial: int
    bufts: list  # stream.BufferType per buffer id
    galloc: Gallocr
    alloc_sizes: dict = field(default_factory=dict)  # Tensor -> per-buffer sizes (padding buffer types), this call's
    plan_owner: EncodedGraph | None = None  # the graph whose call made the plan now in force


def build_graph(call: Call) -> tuple[Graph, dict[int, Tensor]]:
    """Model tensors for a recorded graph, linked by the recorded pointers."""
    by_ptr: dict[int, Tensor] = {}
    records = tensor_records(call)
    for r in records:
        by_ptr[r.ptr] = Tensor(name=r.name, op=r.op, type=r.type, ne=r.ne, nb=r.nb, nbytes=r.nbytes,
                               view_offs=r.view_offs, input=bool(r.flags & INPUT), output=bool(r.flags & OUTPUT),
                               param=bool(r.flags & PARAM), data=r.data, buffer=r.buffer,
                               op_desc=r.desc if r.desc != "NONE" else r.op)
    for r in records:
        t = by_ptr[r.ptr]
        try:
            t.srcs = [by_ptr[p] if p else None for p in r.srcs]
            t.view_src = by_ptr[r.view_src] if r.view_src else None
        except KeyError as e:
            raise ValueError(f"tensor {r.name!r} points at a tensor the recording lacks ({e})") from None
    nodes = [by_ptr[r.ptr] for r in records if r.kind == "n"]
    leafs = [by_ptr[r.ptr] for r in records if r.kind == "l"]
    if len(nodes) != call.n_nodes or len(leafs) != call.n_leafs:
        raise ValueError(f"graph of call {call.seq} has {len(nodes)}/{call.n_nodes} nodes, "
                         f"{len(leafs)}/{call.n_leafs} leafs recorded")
    return Graph(nodes, leafs), by_ptr


def shapes(call: Call) -> dict:
    """name -> [type, ne, op, input names] for the graph's tensors that hold bytes of their own: what
    `peak` shows beside each family (its bytes follow from ne and type) and how it names unnamed ones."""
    records = tensor_records(call)
    names = {r.ptr: r.name for r in records}
    out: dict = {}
    for r in records:
        if r.view_src or r.nbytes <= 0 or r.name in out:
            continue
        if len(out) >= MAX_SHAPES:
            break
        out[r.name] = [r.type, list(r.ne), r.op, [names.get(p, "") for p in r.srcs if p]]
    return out


class Replayer:
    """The model side of one recorded process: one model gallocr per real one."""

    def __init__(self, proc: Process, keep_events: bool = False):
        self.proc = proc
        self.events: dict[int, list] | None = {} if keep_events else None  # graph index -> its Events, if kept
        self._kept = 0  # events kept so far (at most MAX_KEPT_EVENTS; a graph beyond is only stored)
        self.models: dict[int, _Model] = {}  # by gallocr serial
        self.graphs: list[EncodedGraph] = []  # stored form right away: a long run's events stay compressed
        self._zc = zstandard.ZstdCompressor(level=3, write_checksum=True)
        self.skipped: list[str] = []
        self.n_placements = 0
        self.buffer_buft: dict[int, int] = {}  # every compute buffer ggml made -> its buffer type
        self.profile = profile_for_version(proc.ggml.get("version", "")) if proc.ggml else PROFILE
        self._shapes_of = None  # the tensor list whose shapes the last stored graph carries

    def _note_buffers(self, call: Call):
        for buft, _size, buf, _base, _real in call.buffers:
            self.buffer_buft[buf] = buft
        for c in call.children:
            self._note_buffers(c)

    def _model(self, call: Call) -> _Model | None:
        entry = self.proc.gallocs.get(call.obj)
        if entry is None:
            return None
        serial, buft_ptrs = entry
        m = self.models.get(serial)
        if m is None:
            unknown = [p for p in buft_ptrs if p not in self.proc.bufts]
            if unknown:
                raise RecordingError(f"gallocr {serial} uses buffer type {unknown[0]:#x}, which no T line of the "
                                     "recording describes (a damaged or hand-edited recording)")
            bufts = [self.proc.bufts[p] for p in buft_ptrs]
            types = [BufferType(b.name, b.alignment, b.max_size, key=b.ptr) for b in bufts]
            m = _Model(serial, bufts, None)
            self.profile = profile_for_version(self.proc.ggml.get("version", "")) if self.proc.ggml else PROFILE
            # the function holds the model's size table, not the model: no reference cycle through the
            # gallocr, so a finished replay (its tensors and events) is freed at once, not by the cycle collector
            sizes = m.alloc_sizes
            m.galloc = Gallocr(get_profile(self.profile), buffer_types=types,
                               alloc_size=lambda t, bid: sizes[t][bid] if t in sizes else t.nbytes)
            self.models[serial] = m
        return m

    def on_call(self, proc: Process, call: Call, via: str | None = None):
        self._note_buffers(call)
        if call.kind.startswith("sched_"):
            for child in call.children:
                self.on_call(proc, child, via=call.kind)
            return
        if call.kind not in GALLOC_CALLS:
            return
        if not call.dumped:
            self.skipped.append(f"call {call.seq} ({call.kind}): its graph was not recorded")
            return
        m = self._model(call)
        if m is None:
            tensor_records(call)  # read all the same: a damaged line is an error wherever it is
            self.skipped.append(f"call {call.seq} ({call.kind}): its gallocr was created before recording began")
            return
        try:
            record, plan_problems, fast = self.replay(m, call)
        except ValueError as e:
            if call.rc is not None:
                raise RecordingError(f"call {call.seq} ({call.kind}): {e}") from None
            self.skipped.append(f"call {call.seq} ({call.kind}): cut short by the program's death ({e})")
            return
        if via:
            record.extra["via"] = via
        if fast is not None:  # laid out by the compiled replay already
            compress = self._zc.compress
            strings, blobs = compress(fast.table_json), [(name, dt, compress(data)) for name, dt, data in fast.columns]
            n_events = fast.n_events
        else:
            strings, blobs = pack_arrays(*encode_arrays(record.events), self._zc.compress)
            n_events = len(record.events)
        graph = EncodedGraph(
            index=record.index, role=record.role, n_events=n_events, max_size=record.max_size,
            buffer_size=record.buffer_size, oom=record.oom, consistent=record.consistent, strings=strings,
            blobs=blobs, extra=record.extra)
        self.graphs.append(graph)
        if self.events is not None and self._kept + n_events <= MAX_KEPT_EVENTS:
            # the gallocr starts a new list per call: this one stays
            self.events[graph.index] = record.events if fast is None else \
                plans_fast.event_columns(n_events, fast.columns, fast.table_json)
            self._kept += n_events
        self._check_plan(m, graph, plan_problems)

    def _check_plan(self, m: _Model, graph: EncodedGraph, problems: list | None):
        """`problems` None: this call made a new plan (it owns it now); False: it left the plan alone
        (a refused alloc_graph); else the placements of a call that reused the plan in force, checked
        against it: the plan's own graph answers for them too."""
        if problems is False:
            return
        if problems is None:
            m.plan_owner = graph
            graph.extra["plan_checked"] = graph.extra["placements"] if graph.role == "eval" else 0
            return
        owner = m.plan_owner
        if owner is None or owner is graph:
            return
        owner.extra["plan_checked"] += graph.extra["placements"]
        if problems:
            owner.consistent = False
            found = owner.extra["mismatches"]
            for p in problems:
                if len(found) < MAX_MISMATCHES:
                    found.append(f"graph {graph.index} ({graph.extra['call']}), placed with this plan: {p}")
            owner.extra["n_mismatches"] += len(problems)
            offs = owner.extra["offset_mismatches"]
            offs += [{**o, "graph": graph.index} for o in graph.extra["offset_mismatches"][:MAX_MISMATCHES - len(offs)]]

    def replay(self, m: _Model, call: Call) -> tuple:
        """(GraphRecord, the plan's problems (see _check_plan), the FastReserve that replayed it or None)."""
        g = m.galloc
        g.events, g.failed = [], None  # each call on its own: ggml's gallocr carries no failure over
        g.data, g.placement, g.buffer_of = {}, {}, {}
        problems: list[str] = []
        index = len(self.graphs)
        n_ids = len(m.bufts)
        for ids, what in ((call.node_ids, "node"), (call.leaf_ids, "leaf")):
            if ids and any(not 0 <= i < n_ids for i in ids):
                problems.append(f"{what} buffer ids outside 0..{n_ids - 1}")
        graph_key = call.lines or call.tensors  # a repeated graph (`g ... =SEQ`) shares its lists
        new_shapes = graph_key is not self._shapes_of
        fast = None
        if not problems and call.kind != "alloc_graph" and call.rc is not None and call.lines:
            fast = plans_fast.reserve(g, call.lines, call.n_nodes, call.n_leafs, call.node_ids, call.leaf_ids,
                                       index, call.kind == "reserve_n_size", new_shapes, MAX_SHAPES)
        if fast is None:
            graph, by_ptr = build_graph(call)
            m.alloc_sizes.clear()  # the table its galloc's alloc_size reads
            m.alloc_sizes.update({by_ptr[r.ptr]: r.alloc_sizes for r in call.tensors if r.alloc_sizes})
        replanned = None
        offsets: list[dict] = []  # placements model and ggml disagree on
        recorded: list = []  # events made from the recorded placements (the map of a plan-reusing call)
        plan_problems = None  # this call makes a plan of its own (or none)
        if problems:
            ok = False
        elif call.kind == "alloc_graph":
            model_replans = g.needs_realloc(graph) is not None
            # one buffer: ggml re-plans inside (a nested reserve_n); several: it refuses, the caller reserves
            real_replans = any(c.kind == "reserve_n" for c in call.children) or (
                g.n_buffers > 1 and call.rc == 0)
            replanned = real_replans
            if model_replans != real_replans:
                problems.append(f"re-planned: model {model_replans}, ggml {real_replans}")
            ok = g.alloc_graph(graph, graph_index=index)
            if call.rc is not None:
                placed: list[str] = []
                self._compare_placements(m, call, by_ptr, placed, offsets)
                problems += placed
                if not any(e.kind == "alloc" for e in g.events):  # the plan placed them: ggml prints nothing
                    recorded = placement_events(graph, call, by_ptr, g, m.bufts, index)
                    g.events += recorded
                if not model_replans and not real_replans:
                    plan_problems = placed
            if real_replans and not any(c.kind == "reserve_n" for c in call.children):
                plan_problems = False  # refused: the caller reserves next
        elif fast is not None:
            ok, g.failed, g.graph_index = fast.ok, fast.failed, index
        else:
            ok = g.reserve(graph, graph_index=index, node_buffer_ids=call.node_ids, leaf_buffer_ids=call.leaf_ids,
                           no_alloc=call.kind == "reserve_n_size")
        real_ok = None if call.rc is None else bool(call.rc)
        if real_ok is not None and ok != real_ok:
            problems.append(f"result: model {ok}, ggml {real_ok}")
        model_sizes = g.planned_sizes() if call.kind == "reserve_n_size" else g.buffer_sizes()
        if call.rc is not None and call.sizes:
            for i, (real, mine) in enumerate(zip(call.sizes, model_sizes)):
                shared = g.owner[i] != i
                if real != mine and not (shared and real == 0):
                    problems.append(f"buffer {i} size: model {mine:,}, ggml {real:,}")
        if call.rc is None:
            problems.append("the program died inside this call")
        n_real = len(call.placements)
        self.n_placements += n_real
        extra = {
            "call": call.kind, "seq": call.seq, "gallocr": m.serial,
            "buffer_types": [{"name": b.name, "alignment": b.alignment, "max_size": b.max_size} for b in m.bufts],
            "real_sizes": call.sizes, "model_sizes": model_sizes, "placements": n_real,
            "n_nodes": call.n_nodes, "n_leafs": call.n_leafs, "mismatches": problems[:MAX_MISMATCHES],
            "n_mismatches": len(problems), "offset_mismatches": offsets[:MAX_MISMATCHES],
            "map_from": "recorded placements" if recorded else "model",
        }
        if replanned is not None:
            extra["replanned"] = replanned
        if new_shapes:  # a repeated graph keeps the shapes it had
            self._shapes_of = graph_key
            extra["shapes"] = json.loads(fast.shapes_json) if fast is not None else shapes(call)
        return GraphRecord(
            index=index, role="eval" if call.kind == "alloc_graph" else "reserve", events=g.events,
            max_size=sum(g.planned_sizes()), buffer_size=sum(call.sizes) if call.sizes else None,
            oom=oom_of(g.failed), consistent=not problems, extra=extra), plan_problems, fast

    def _compare_placements(self, m: _Model, call: Call, by_ptr: dict, problems: list, offsets: list):
        """Each real placement at the model's offset; model (buffer id, chunk) <-> real buffer one to one.
        `offsets` gets each placement the two disagree on: tensor, model and real offset, buffer, chunk."""
        g = m.galloc
        to_real: dict = {}
        to_model: dict = {}
        buffer_types = self.buffer_buft
        placed = set()
        for kind, tptr, buf, data, base in call.placements:
            t = by_ptr.get(tptr)
            if t is None:
                continue  # a tensor outside the graph (ggml places nothing else, but be safe)
            placed.add(t)
            if t.view_src is not None and t.view_src not in g.placement:
                # a view of a tensor on another buffer (a KV cache view): ggml_backend_view_init puts it there
                vs = t.view_src
                if (data, buf) != (g.addr(vs) + t.view_offs, vs.buffer):
                    problems.append(f"{t.name!r}: view of {vs.name!r} not at its source + {t.view_offs:,}")
                continue
            if t not in g.placement:
                problems.append(f"{t.name!r}: ggml placed it ({'view' if kind == 'V' else 'tensor'}), the model did not")
                offsets.append({"tensor": t.name, "model_offset": None, "real_offset": data - base,
                                "buffer": to_model.get(buf, (None,))[0], "chunk": None})
                continue
            chunk, off = g.placement[t]
            key = (g.buffer_of[t], chunk)
            if data - base != off:
                problems.append(f"{t.name!r}: offset model {off:,}, ggml {data - base:,} (buffer {key[0]}, chunk {chunk})")
                offsets.append({"tensor": t.name, "model_offset": off, "real_offset": data - base,
                                "buffer": key[0], "chunk": chunk})
            if to_real.setdefault(key, buf) != buf or to_model.setdefault(buf, key) != key:
                problems.append(f"{t.name!r}: model buffer {key[0]} chunk {chunk} is not the buffer ggml used")
            buft = buffer_types.get(buf)
            if buft is not None and buft != m.bufts[key[0]].ptr:
                problems.append(f"{t.name!r}: ggml placed it in a {self.proc.bufts[buft].name} buffer, "
                                f"the model in {m.bufts[key[0]].name}")
        for t in g.placement:
            if t not in placed:
                problems.append(f"{t.name!r}: the model placed it, ggml did not")
                offsets.append({"tensor": t.name, "model_offset": g.placement[t][1], "real_offset": None,
                                "buffer": g.buffer_of[t], "chunk": g.placement[t][0]})
