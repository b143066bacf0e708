"""Explain a buffer's size: what is live at its high-water mark, and what changed between two runs.

A graph's *peak* is the allocation that sets its high-water mark (the end of the
highest block it ever placed, per buffer and chunk: a gallocr over several buffer
types tags its events with the buffer id). The bytes below that mark are either
live tensors, grouped here by *family* (the tensor's name without layer index and
ggml's decorations), or free holes (fragmentation). So for every graph

    high-water mark = sum of family bytes at the peak + fragmentation

and the size attribution between two graphs is exact by construction: the family
deltas plus the fragmentation delta add up to the difference of the two marks.

2023 logs report max_size as a running maximum across graphs; the mark here is
always the graph's own. Another trace source (a PyTorch snapshot) plugs in its own
peak computation with `register_peak(source, fn)`; ggml's is the default.

The peak's parts (GraphPeak, Live, Moment, families, size_attribution) live in `peak_types` and are
re-exported here; `peak_fast` computes the same GraphPeak from a list of Events without numpy.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from alloctrace.traces.explain.peak_types import (MAX_HOLES, TOP_TENSORS, GraphPeak, Live, Moment,  # noqa: F401
                                                  Occurrences, attribution_lines, display_name, families_json, family_of,
                                                  held_intervals, holes_below, peak_arguments, size_attribution,
                                                  text_table, unheld_bytes)
from alloctrace.traces.memmap.lifetimes import Lifetimes, extract


# --- one graph's peak, over store columns ---------------------------------------------------------
def _live_at(lt: Lifetimes, event: int, chunk: int | None = None) -> np.ndarray:
    """Lifetimes holding bytes once `event` has happened."""
    sel = (lt.start <= event) & (lt.end > event)
    if chunk is not None:
        sel &= lt.chunk == chunk
    return np.flatnonzero(sel)


def _moment(lt: Lifetimes, idx: np.ndarray, event: int, top: int, names: Occurrences,
            chunk: int | None = None) -> Moment:
    live = [Live(str(lt.tensor[i] or ""), family_of(lt.tensor[i], lt.op[i]), lt.op[i], int(lt.size[i]),
                 int(lt.offset[i]), int(lt.chunk[i]), int(lt.y0[i]), int(lt.start[i]), int(lt.end[i]),
                 names.of(lt.tensor[i], int(lt.start[i])))
            for i in idx.tolist()]
    used = sum(t.bytes for t in live)
    gaps = holes_below(live, top)
    m = Moment(event, top, live, top - used, max((n for _, n in gaps), default=0))
    done = lt.end <= event
    if chunk is not None:
        done &= lt.chunk == chunk
    held = held_intervals(lt.offset[done].tolist(), lt.size[done].tolist())
    m.unattributed = sum(unheld_bytes(off, n, held) for off, n in gaps)
    m.holes = _freed_in(lt, sorted(gaps, key=lambda g: (-g[1], g[0]))[:MAX_HOLES], done, held, names)
    return m


def _freed_in(lt: Lifetimes, gaps: list, done: np.ndarray, held: list, names: Occurrences) -> list[dict]:
    """Each hole, what last held its bytes before the moment (`done`: freed there), and its bytes no
    logged tensor held (unattributed: padding or a tensor the trace does not show; the trace cannot say)."""
    out = []
    for off, size in gaps:
        hit = np.flatnonzero(done & (lt.offset < off + size) & (lt.offset + lt.size > off))
        hit = hit[np.argsort(-lt.end[hit], kind="stable")][:3]  # the latest holders first
        out.append({"offset": off, "bytes": size, "unattributed": unheld_bytes(off, size, held), "freed": [
            {"tensor": str(lt.tensor[i] or ""), "occurrence": names.of(lt.tensor[i], int(lt.start[i])),
             "bytes": int(lt.size[i]), "freed_at": int(lt.end[i])} for i in hit]})
    return out


def _columns(events) -> dict:
    """The store's column form of a graph: passed through, or built from a list of Events."""
    if isinstance(events, dict):
        return events
    from alloctrace.traces.store.columns import encode, public_columns

    events = list(events)
    cols, table = encode(events)
    return public_columns(len(events), cols, table)


def ggml_peak(events, capacity: int | None = None, buffer_names: list[str] | None = None,
              buffer_sizes: list[int] | None = None) -> GraphPeak:
    """The peak of one ggml graph (its events, or the store's columns): one mark per (buffer, chunk).
    `capacity` is the real buffer's size, for the fragmentation at an out-of-space failure;
    `buffer_names` / `buffer_sizes` (a gallocr over several buffer types) name each buffer id and
    give its real size."""
    cols = _columns(events)
    kind = np.asarray(cols["kind"], dtype=object)
    buffer = cols.get("buffer")
    ids = sorted(set(np.asarray(buffer)[np.asarray(buffer) >= 0].tolist())) if buffer is not None else []
    per_buffer = {b: extract(_only_buffer(cols, kind, b)) for b in ids} or {None: extract(cols)}
    realloc = np.flatnonzero(kind == "realloc")
    last_plan = int(realloc[-1]) if len(realloc) else -1  # head re-planned: the last plan counts
    opens = np.flatnonzero((kind == "alloc") | (kind == "reuse")).tolist()
    tensor = cols.get("tensor")
    names = Occurrences([(i, None if tensor is None else tensor[i]) for i in opens], realloc.tolist())
    buffers = []
    for b, lt in per_buffer.items():
        after = lt.start > last_plan
        tops = lt.offset + lt.size
        for c in sorted(set(lt.chunk[after].tolist())):
            mine = np.flatnonzero(after & (lt.chunk == c))
            mark = int(tops[mine].max())
            setter = mine[tops[mine] == mark]
            k = int(setter[np.argmin(lt.start[setter])])
            event = int(lt.start[k])
            name = buffer_names[b] if b is not None and buffer_names and b < len(buffer_names) else None
            buffers.append({"buffer": b, "chunk": c, "name": name,
                            "tensor": display_name(lt.tensor[k], names.of(lt.tensor[k], event)),
                            "moment": _moment(lt, _live_at(lt, event, c), event, mark, names, c)})
    peak = GraphPeak(buffers, len(kind))
    ooms = np.flatnonzero(kind == "oom")
    if len(ooms):
        b = int(buffer[ooms[0]]) if buffer is not None and buffer[ooms[0]] >= 0 else None
        if b is not None:  # the failing buffer's own lifetimes and real size
            capacity = buffer_sizes[b] if buffer_sizes and b < len(buffer_sizes) else None
        peak.failure = _failure(cols, int(ooms[0]), per_buffer[b] if b in per_buffer else extract(cols), capacity,
                                names, b)
    return peak


def _only_buffer(cols: dict, kind: np.ndarray, b: int) -> dict:
    """The columns with every placing event of another buffer made inert (kind "other"): event
    indices stay those of the whole graph, and offsets of different buffers never meet."""
    other = (np.asarray(cols["buffer"]) != b) & (np.asarray(cols["buffer"]) >= 0)
    k = kind.copy()
    k[other] = "other"
    return {**cols, "kind": k}


def _failure(cols, e: int, lt: Lifetimes, capacity: int | None, names: Occurrences, buffer: int | None = None) -> dict:
    """The first out-of-space event `e`, with what filled the buffer then."""
    needed, largest = cols.get("needed"), cols.get("largest")
    tensor = cols["tensor"][e]
    need = int(needed[e]) if needed is not None and needed[e] >= 0 else None
    idx = _live_at(lt, e - 1, 0) if e > 0 else np.zeros(0, dtype=np.int64)
    top = capacity if capacity else int((lt.offset[idx] + lt.size[idx]).max(initial=0))
    m = _moment(lt, idx, e, top, names)
    out = {"event": e, "tensor": tensor, "needed": need,
           "largest_available": int(largest[e]) if largest is not None and largest[e] >= 0 else None,
           "capacity": capacity, "live_bytes": top - m.free_below, "free": m.free_below,
           "largest_hole": m.largest_hole, "families": m.families()}
    if buffer is not None:
        out["buffer"] = buffer
    return out


# --- sources ------------------------------------------------------------------------------------
PeakFn = Callable[..., GraphPeak]  # (columns, graph summary row) -> GraphPeak
PEAK_SOURCES: dict[str, PeakFn] = {}


def register_peak(source: str, fn: PeakFn) -> None:
    """Let a trace source (its TraceMeta.source, or the part before ':') compute its own peak."""
    PEAK_SOURCES[source] = fn


def _ggml_from_store(cols: dict, row: dict) -> GraphPeak:
    return ggml_peak(cols, **peak_arguments(row))


def peak_fn(source: str | None) -> PeakFn:
    src = source or ""
    return PEAK_SOURCES.get(src) or PEAK_SOURCES.get(src.partition(":")[0]) or _ggml_from_store


def graph_peak(store, trace_id: str, g: int) -> tuple[GraphPeak, dict]:
    """A stored graph's peak and its summary row (role, max_size, buffer_size, ...)."""
    summary = store.summary(trace_id)
    row = next((x for x in summary["graphs"] if x["index"] == g), None)
    if row is None:
        from alloctrace.traces.store.store import NotFound

        raise NotFound(f"trace {summary['id']} has no graph {g}")
    cols = store.columns(summary["id"], g)
    row = {**row, "extra": store.graph_extra(summary["id"], g)}
    return peak_fn(summary.get("source"))(cols, row), row


def peak_json(store, ref: str) -> dict:
    """`alloctrace peak REF --json` and GET .../peak: ref is ID:G, or ID for its first graph."""
    tid, g = store.resolve(ref)
    if g is None:
        graphs = store.summary(tid)["graphs"]
        g = graphs[0]["index"] if graphs else 0
    peak, row = graph_peak(store, tid, g)
    out = peak.to_json(tid, g)
    out["role"], out["max_size"], out["buffer_size"] = row.get("role"), row.get("max_size"), row.get("buffer_size")
    extra = row.get("extra") or {}
    if extra.get("uncertainty_bytes"):  # the import could not pin the sizes down: how far, and why
        out["uncertainty_bytes"], out["reason"] = extra["uncertainty_bytes"], extra.get("reason")
    from alloctrace.traces.explain.peak_shapes import annotate

    return annotate(out, (row.get("extra") or {}).get("shapes") or {})  # a recording knows ne and type


# --- attribution between two runs (size_attribution lives in peak_types) ----------------------
def graphs_attribution(events_a, events_b, meta_a=None, meta_b=None) -> dict:
    """size_attribution of two graphs (events or store columns); `meta_*` (a dict or a GraphRecord)
    may name the trace's `source`, whose peak rules then apply, and the graph's row fields."""
    peaks = []
    for events, meta in ((events_a, meta_a), (events_b, meta_b)):
        row = meta if isinstance(meta, dict) else (meta.summary() if hasattr(meta, "summary") else {})
        if hasattr(meta, "extra") and "extra" not in row:
            row = {**row, "extra": meta.extra}
        peaks.append(peak_fn(row.get("source"))(_columns(events), row))
    return size_attribution(*peaks)
