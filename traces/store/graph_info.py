"""Facts about one stored graph that every view needs: where it failed, how much room it had, its events."""
from __future__ import annotations

import numpy as np

from alloctrace.allocator.events import KINDS
from alloctrace.traces.errors import UserError
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
    """Events [start, start+limit) of those matching the filters, each with its index `i`; an unknown `kind`
    is the user's error."""
    if kind is not None and kind not in KINDS:
        raise UserError(f"unknown event kind {kind!r} (one of {', '.join(KINDS)})")
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


def with_ggml_lines(summary: dict) -> dict:
    """A trace summary whose failed graphs' `oom` also carry `ggml_line`: ggml's own message for the failure
    in that trace's generation (what a user searched for), as every answer that lists graphs gives it."""
    from alloctrace.allocator.render import ggml_oom_message

    for g in summary.get("graphs") or []:
        oom = g.get("oom")
        if oom and oom.get("needed") is not None and oom.get("largest_available") is not None:
            g["oom"] = {**oom, "ggml_line": ggml_oom_message(summary.get("generation"), oom["needed"],
                                                             oom["largest_available"])}
    return summary


UNCERTAINTY_KEYS = ("uncertainty_bytes", "reason")


def with_uncertainty(store, summaries: list[dict]) -> list[dict]:
    """Summaries whose graphs carry `uncertainty_bytes` and `reason` where an import could not tell a size
    exactly (the log lacks what decides it): consistent means consistent up to that many bytes."""
    ids = [s["id"] for s in summaries if s.get("graphs") and not s.get("report")]
    found = store.graph_extras_of(ids, UNCERTAINTY_KEYS) if ids else {}
    for s in summaries:
        for g in s.get("graphs") or ():
            got = found.get(s["id"], {}).get(g["index"]) or {}
            if got.get("uncertainty_bytes"):
                g["uncertainty_bytes"], g["reason"] = got["uncertainty_bytes"], got.get("reason")
    return summaries


def uncertainty_text(graphs: list[dict]) -> str | None:
    """`exact up to N bytes: REASON` for the widest uncertainty of some graphs, None when all are exact."""
    g = max((g for g in graphs if g.get("uncertainty_bytes")), key=lambda g: g["uncertainty_bytes"], default=None)
    return None if g is None else f"exact up to {g['uncertainty_bytes']:,} bytes: {g.get('reason') or 'see the import'}"


def consistency(store, trace_id: str, g: int) -> dict:
    """Whether the model reproduced graph `g` of a stored trace, and the placements it got wrong."""
    from alloctrace.traces.store.store import NotFound

    graph = next((x for x in store.summary(trace_id)["graphs"] if x["index"] == g), None)
    if graph is None:
        raise NotFound(f"trace {trace_id} has no graph {g}")
    extra = store.graph_extra(trace_id, g)
    return {"consistent": graph["consistent"], "n_mismatches": extra.get("n_mismatches"),
            "mismatches": extra.get("mismatches", []), "offsets": extra.get("offset_mismatches", []),
            "plan_checked": extra.get("plan_checked"), "placements": extra.get("placements"),
            "map_from": extra.get("map_from", "model"),
            "buffer_types": [b.get("name") for b in extra.get("buffer_types", [])]}
