"""Structured allocator events: one per decision the real allocator makes.

Each event maps to the AT_PRINTF line ggml prints for that decision (see
`render.py`), but carries more than the line: offsets, chunk, the state of the
free list after the decision, and the reused parent.
"""
from __future__ import annotations

from .record_class import record_class, field, fields

# kind -> what it records
KINDS = {
    "graph": "start of a graph walk (`####### graph g/n`)",
    "input": "a graph input is allocated first",
    "output": "a graph output is freed at the end (2023)",
    "alloc": "a block was carved for a tensor",
    "free": "a tensor's bytes went back to the free list",
    "free_extra": "the unused tail of a reused parent was freed (head)",
    "reuse": "a node took its parent's memory (inplace)",
    "no_reuse": "a parent could not be reused (external, layout, output)",
    "view": "a view got its parent's address (no allocation)",
    "exec": "a node is ready: its sources and destination are placed",
    "parent": "a source's child count went down (head)",
    "view_src": "a view's source lost a view",
    "not_freed": "an output was kept alive (head)",
    "step": "end of a node's update (a blank line in the log)",
    "barrier": "end of a parse_seq level: deferred frees ran",
    "oom": "not enough space: needed vs largest available block",
    "abort": "the allocator asserted (e.g. out of free blocks)",
    "realloc": "head: the plan is invalid for this graph and is redone",
    "buffer": "head: the backend buffer was (re)allocated",
    "plan_reused": "head: the graph fits the recorded plan; nothing printed",
    "hazard": "a plan is unsafe: a write over live bytes, a stale read, or a concurrent overlap (metal_exec)",
}


@record_class(slots=True)
class Event:
    kind: str
    graph: int = 0
    tensor: str | None = None
    op: str | None = None
    size: int | None = None  # bytes as the allocator counted them (padded for alloc)
    offset: int | None = None  # from the start of the buffer (chunk for head)
    addr: int | None = None  # absolute address (2023 generations)
    chunk: int | None = None
    buffer: int | None = None  # which buffer holds the bytes, for a gallocr over several buffer types
    block: int | None = None  # chosen free-block index (-1: fell back / none)
    n_free: int | None = None  # free blocks after the decision
    largest_free: int | None = None
    total_free: int | None = None
    n_free_before: int | None = None  # what a `freeing` line prints
    parent: str | None = None  # reused or refused parent
    view_src: str | None = None
    reason: str | None = None  # why not reused / why realloc / why aborted
    srcs: list | None = None  # exec: source names (None for empty slots)
    children: int | None = None
    views: int | None = None
    allocated: int | None = None
    needed: int | None = None
    largest: int | None = None
    node: int | None = None  # graph node index of the node being processed
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The set fields, containers copied (what dataclasses.asdict gives, without its per-field
        recursion: exports write one of these per event)."""
        out = {}
        for k in _FIELD_NAMES:
            v = getattr(self, k)
            if v is None or v == {}:
                continue
            out[k] = _deepcopy(v) if isinstance(v, (dict, list)) else v
        return out


_FIELD_NAMES = fields(Event)


def _deepcopy(v):
    """copy.deepcopy, imported on first use (a recording's import never asks for it), then in this name's place."""
    global _deepcopy
    from copy import deepcopy

    _deepcopy = deepcopy
    return deepcopy(v)


@record_class
class FreeSummary:
    n_blocks: int
    largest: int
    total: int
