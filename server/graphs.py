"""Answers about one graph, built from the store's columns: event pages, memory maps, states."""
from __future__ import annotations

import numpy as np

from alloctrace.traces.errors import UserError
from alloctrace.traces import memmap
from alloctrace.traces.state_index import StateIndex, state_json  # noqa: F401 (the API's names)

MAX_PAGE = 5000
MAX_SHAPES = 20000
MAX_POINTS = 10000


def events_page(cols: dict, rows_at, start: int, limit: int, kind: str | None, tensor: str | None) -> dict:
    """Events [start, start+limit) of those matching the filters, each with its index `i`.
    `rows_at(indices)` turns event indices into event dicts."""
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
            "events": rows_at(idx.tolist())}


def window(lt: memmap.Lifetimes, info: dict, x0, x1, y0, y1) -> tuple[int, int, int, int]:
    """The view window with defaults filled in: the whole graph, up to the highest byte any
    tensor, max_size or buffer_size reaches."""
    top = max(lt.y_extent, info.get("max_size") or 0, info.get("buffer_size") or 0, 1)
    win = (0 if x0 is None else x0, max(lt.n_events, 1) if x1 is None else x1,
           0 if y0 is None else y0, top if y1 is None else y1)
    if win[1] <= win[0]:
        raise UserError(f"empty event range: x1 ({win[1]}) must be above x0 ({win[0]})")
    if win[3] <= win[2]:
        raise UserError(f"empty address range: y1 ({win[3]}) must be above y0 ({win[2]})")
    return win


def stored_ids(result: dict) -> list[str]:
    """Trace ids a replay stored (its JSON names one per graph: measure and eval share a trace)."""
    ids = []
    for part in ("measure", "eval"):
        tid = (result.get(part) or {}).get("trace_id")
        if isinstance(tid, str) and tid not in ids:
            ids.append(tid)
    return ids


def presets() -> dict:
    """The model presets replay can run, the allocator profiles it accepts, and every generation."""
    from alloctrace.allocator.presets import PRESETS
    from alloctrace.allocator.profiles import PRESET_PROFILES, PROFILES
    return {"presets": [p.to_json() for p in PRESETS.values()], "profiles": list(PRESET_PROFILES),
            "generations": [p.to_json() for p in PROFILES.values()]}
