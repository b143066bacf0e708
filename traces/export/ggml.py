"""Exporters: JSON Lines (lossless), CSV of events, Chrome trace JSON (opens in Perfetto).

JSON Lines layout (docs/trace-format.md): a `trace` header line, then per graph a
`graph` line followed by one `event` line per event; sources/jsonl.py reads it back.
"""
from __future__ import annotations

import csv
import json
from typing import IO, Iterator

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError

from alloctrace.traces.store.columns import FIELDS
from alloctrace.traces.store.schema import FORMAT_VERSION, GraphRecord

FORMATS = ("jsonl", "csv", "chrome")


def trace_graphs(store, tid: str) -> Iterator[GraphRecord]:
    for g in store.summary(tid)["graphs"]:
        yield store.graph(tid, g["index"])


def write_jsonl(store, tid: str, out: IO[str]):
    meta = store.meta(tid)
    head = {"type": "trace", "format": "alloctrace-trace", "version": FORMAT_VERSION, "id": tid,
            "name": meta.name, "source": meta.source, "generation": meta.generation, "profile": meta.profile,
            "created": meta.created, "tags": meta.tags, "extra": meta.extra}
    out.write(json.dumps(head) + "\n")
    for g in trace_graphs(store, tid):
        gl = g.summary()
        gl.update(type="graph", extra=g.extra)
        out.write(json.dumps(gl) + "\n")
        for ev in g.events:
            d = ev.to_dict()
            d["type"] = "event"
            out.write(json.dumps(d) + "\n")


def write_csv(store, tid: str, out: IO[str]):
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["i"] + FIELDS)
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


def chrome_events(g: GraphRecord, pid: int) -> list[dict]:
    """One process per graph: counters of used and free bytes, one slice per allocation, from
    its `alloc` to the `free` at the same place (a reused tensor frees its parent's block).
    Time is the event index (1 unit = 1 microsecond in the viewer)."""
    out = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"graph {g.index} ({g.role})"}},
           {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "tensor lifetimes"}}]
    used, live = 0, {}
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
                out.append(_slice(start, i, pid, a, ev))
        out.append({"ph": "C", "name": "memory", "pid": pid, "ts": i,
                    "args": {"used bytes": used, "free bytes": ev.total_free or 0}})
    end = len(g.events)
    for starts in live.values():
        for start, a in starts:
            out.append(_slice(start, end, pid, a, None))
    return out


def _slice(start, end, pid, a: Event, f: Event | None) -> dict:
    args = {"offset": a.offset, "size": a.size, "chunk": a.chunk, "freed": f is not None}
    if f is not None and f.tensor != a.tensor:
        args["freed as"] = f.tensor
    return {"ph": "X", "name": a.tensor or "(unnamed)", "cat": "tensor", "pid": pid, "tid": 1, "ts": start,
            "dur": max(end - start, 1), "args": args}


def write_chrome(store, tid: str, out: IO[str]):
    meta = store.meta(tid)
    events = []
    for g in trace_graphs(store, tid):
        events.extend(chrome_events(g, g.index + 1))
    json.dump({"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"trace": tid, "name": meta.name, "generation": meta.generation}}, out)


def export(store, tid: str, fmt: str, out: IO[str]):
    writers = {"jsonl": write_jsonl, "csv": write_csv, "chrome": write_chrome}
    if fmt not in writers:
        raise UserError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    writers[fmt](store, tid, out)
