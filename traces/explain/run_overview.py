"""A run at a glance: every graph's own high water beside its buffer, max_size and failure.

A long run (a llama.cpp generation: one graph per token) has hundreds of graphs; the dashboard draws
them as one chart and opens the graph a user clicks. The high water is the graph's own (the highest
byte its tensors reach, chunks stacked), not 2023's running max_size.
"""
from __future__ import annotations

import numpy as np


def high_water(cols: dict) -> int:
    """The highest byte a graph's allocations reach, each chunk's extent stacked (as the memory map)."""
    kind = cols["kind"]
    placed = (kind == "alloc") & (cols["offset"] >= 0) & (cols["size"] > 0)
    if not placed.any():
        return 0
    ends = cols["offset"][placed] + cols["size"][placed]
    chunks = np.maximum(cols["chunk"][placed], 0)
    return int(sum(int(ends[chunks == c].max()) for c in np.unique(chunks)))


def run_overview(store, tid: str) -> dict:
    """{"graphs": [{index, role, n_events, high_water, max_size, buffer_size, oom}]} for every graph."""
    rows = []
    for g in store.summary(tid)["graphs"]:
        rows.append({"index": g["index"], "role": g["role"], "n_events": g["n_events"],
                     "high_water": high_water(store.columns(tid, g["index"])), "max_size": g["max_size"],
                     "buffer_size": g["buffer_size"], "oom": g["oom"]})
    return {"id": tid, "graphs": rows}
