"""Facts about one stored graph that every view needs: where it failed, how much room it had, its events."""
from __future__ import annotations

import numpy as np

from alloctrace.traces.store.columns import event_rows


def failure_index(cols: dict) -> int | None:
    """Index of the graph's first oom (or abort) event, if it failed."""
    kind = cols["kind"]
    hit = np.flatnonzero((kind == "oom") | (kind == "abort"))
    return int(hit[0]) if len(hit) else None


def capacity_of(record_summary: dict, cols: dict) -> int | None:
    """A real 2023 buffer ends at its buffer_size; measure runs and head chunks are open-ended."""
    chunked = "chunk" in cols and bool(np.any(cols["chunk"][cols["kind"] == "alloc"] >= 0))
    if chunked or record_summary.get("role") == "measure":
        return None
    return record_summary.get("buffer_size")


def graph_info(row: dict, cols: dict) -> dict:
    """The graph's summary row (from `Store.summary`) plus its event count, failure and real capacity."""
    info = dict(row)
    info["n_events"] = len(cols["i"])
    fail = failure_index(cols)
    info["oom"] = None
    if fail is not None:
        e = event_rows(cols, [fail])[0]
        info["oom"] = {"event": fail, "kind": e["kind"], "tensor": e.get("tensor"), "needed": e.get("needed"),
                       "largest_available": e.get("largest"), "reason": e.get("reason")}
    info["capacity"] = capacity_of(info, cols)
    return info


def events_page(cols: dict, start: int, limit: int, kind: str | None, tensor: str | None) -> dict:
    """Events [start, start+limit) of those matching the filters, each with its index `i`."""
    n = len(cols["i"])
    mask = None
    if kind is not None:
        mask = cols["kind"] == kind
    if tensor is not None:
        m = cols["tensor"] == tensor
        mask = m if mask is None else mask & m
    if mask is None:
        total = n
        idx = np.arange(min(start, n), min(start + limit, n))
    else:
        hits = np.flatnonzero(mask)
        total = len(hits)
        idx = hits[start:start + limit]
    return {"total": int(total), "start": start, "limit": limit, "kind": kind, "tensor": tensor,
            "events": event_rows(cols, idx.tolist())}
