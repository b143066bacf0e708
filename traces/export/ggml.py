"""Exporters: JSON Lines (lossless), CSV of events, Chrome trace JSON (opens in Perfetto).

JSON Lines layout (docs/trace-format.md): a `trace` header line, then per graph a
`graph` line followed by one `event` line per event; sources/jsonl.py reads it back.
"""
from __future__ import annotations

import csv
import io
import json
from typing import IO, Iterator

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError

from alloctrace.traces.store.columns import FIELDS
from alloctrace.traces.store.schema import FORMAT_VERSION, GraphRecord

FORMATS = ("chrome", "jsonl", "csv")  # what write() takes; the registry (formats.py) lists them for the faces


def trace_graphs(store, tid: str) -> Iterator[GraphRecord]:
    for g in store.summary(tid)["graphs"]:
        yield store.graph(tid, g["index"])


def jsonl_chunks(store, tid: str) -> Iterator[str]:
    """The JSON Lines export, one piece per graph (the header first), so a reader gets the first graph at once."""
    meta = store.meta(tid)
    head = {"type": "trace", "format": "alloctrace-trace", "version": FORMAT_VERSION, "id": tid,
            "name": meta.name, "source": meta.source, "generation": meta.generation, "profile": meta.profile,
            "created": meta.created, "tags": meta.tags, "extra": meta.extra}
    yield json.dumps(head) + "\n"
    for g in trace_graphs(store, tid):
        gl = g.summary()
        gl.update(type="graph", extra=g.extra)
        lines = [json.dumps(gl)]
        for ev in g.events:
            d = ev.to_dict()
            d["type"] = "event"
            lines.append(json.dumps(d))
        yield "\n".join(lines) + "\n"


def csv_chunks(store, tid: str) -> Iterator[str]:
    """The CSV export, the header row then one piece per graph."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["i"] + FIELDS)
    yield _take(buf)
    for g in trace_graphs(store, tid):
        for i, ev in enumerate(g.events):
            row = [i]
            for f in FIELDS:
                v = getattr(ev, f)
                if f == "srcs":
                    v = "" if v is None else json.dumps(v)
                elif f == "extra":
                    v = json.dumps(v, sort_keys=True) if v else ""
                row.append("" if v is None else v)
            w.writerow(row)
        yield _take(buf)


def _take(buf: io.StringIO) -> str:
    text = buf.getvalue()
    buf.seek(0)
    buf.truncate()
    return text


def chrome_events(g: GraphRecord, pid: int) -> list[dict]:
    """One process per graph: counters of used and free bytes, one slice per allocation, from
    its `alloc` to the `free` at the same place (a reused tensor frees its parent's block).
    Time is the event index (1 unit = 1 microsecond in the viewer). Lifetimes overlap without
    nesting, which the trace event format does not allow on one thread, so each buffer (chunk) gets
    as many tracks as it has tensors live at once: a slice goes on the first of its buffer's tracks
    that is free by its start."""
    out = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"graph {g.index} ({g.role})"}},
           {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
    used, live, spans = 0, {}, []
    for i, ev in enumerate(g.events):
        if ev.kind not in ("alloc", "free", "free_extra") or ev.size is None:
            continue
        key = (ev.chunk, ev.offset) if ev.offset is not None else ev.tensor
        if ev.kind == "alloc":
            if ev.offset is None and ev.block == -1 and g.oom:
                continue  # the allocation that failed
            used += ev.size
            live.setdefault(key, []).append((i, ev))
        else:
            used -= ev.size
            starts = live.get(key) if ev.kind == "free" else None
            if starts:
                start, a = starts.pop(0)
                spans.append((start, i, a, ev))
        out.append({"ph": "C", "name": "memory", "pid": pid, "ts": i,
                    "args": {"used bytes": used, "free bytes": ev.total_free or 0}})
    end = len(g.events)
    spans += [(start, end, a, None) for starts in live.values() for start, a in starts]
    out += _on_tracks(spans, pid)
    return out


def _on_tracks(spans: list, pid: int) -> list[dict]:
    """Slices and their tracks' names: per buffer, the lowest track whose last slice has ended."""
    tracks: dict = {}  # buffer -> [end of each track's last slice]
    tids: dict = {}  # (buffer, track) -> tid
    out = []
    for start, end, a, f in sorted(spans, key=lambda s: (s[0], s[1])):
        buffer = a.chunk if a.chunk is not None else 0
        ends = tracks.setdefault(buffer, [])
        dur = max(end - start, 1)
        level = next((k for k, e in enumerate(ends) if e <= start), len(ends))
        if level == len(ends):
            ends.append(0)
        ends[level] = start + dur
        tid = tids.setdefault((buffer, level), len(tids) + 1)
        out.append(_slice(start, dur, pid, tid, a, f))
    names = []
    for (buffer, level), tid in sorted(tids.items(), key=lambda kv: kv[1]):
        names.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                      "args": {"name": f"buffer {buffer} · level {level}"}})
        names.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                      "args": {"sort_index": buffer * 100_000 + level}})
    return names + out


def _slice(start, dur, pid, tid, a: Event, f: Event | None) -> dict:
    args = {"offset": a.offset, "size": a.size, "chunk": a.chunk, "freed": f is not None}
    if f is not None and f.tensor != a.tensor:
        args["freed as"] = f.tensor
    return {"ph": "X", "name": a.tensor or "(unnamed)", "cat": "tensor", "pid": pid, "tid": tid, "ts": start,
            "dur": dur, "args": args}


def chrome_chunks(store, tid: str) -> Iterator[str]:
    """The Chrome trace JSON, written one graph at a time (a JSON object, traceEvents first)."""
    meta = store.meta(tid)
    yield '{"displayTimeUnit": "ms", "otherData": ' + json.dumps(
        {"trace": tid, "name": meta.name, "generation": meta.generation}) + ', "traceEvents": ['
    first = True
    for g in trace_graphs(store, tid):
        events = chrome_events(g, g.index + 1)
        if events:
            yield ("" if first else ", ") + ", ".join(json.dumps(e) for e in events)
            first = False
    yield "]}"


CHUNKS = {"jsonl": jsonl_chunks, "csv": csv_chunks, "chrome": chrome_chunks}


def export_chunks(store, tid: str, fmt: str, progress=None) -> Iterator[str]:
    """The export as text pieces, one per graph after a header; `progress(done, total)` after each graph.
    Checks the format and the trace before the first piece, so a caller can still answer an error."""
    if fmt not in CHUNKS:
        raise UserError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    total = len(store.summary(tid)["graphs"])
    pieces = CHUNKS[fmt](store, tid)

    def counted():  # piece n (1..total) is graph n's
        for n, piece in enumerate(pieces):
            yield piece
            if progress is not None and 1 <= n <= total:
                progress(n, total)
    return counted()


def export(store, tid: str, fmt: str, out: IO[str], progress=None):
    for piece in export_chunks(store, tid, fmt, progress):
        out.write(piece)
