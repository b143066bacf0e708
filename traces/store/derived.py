"""Data the store keeps beside a long graph of ggml events, made by the analyses that read it.

A state request or a first memory-map view of a million-event graph would replay or reduce it from its
start; so when such a graph is stored, the analyses make what they need once (state checkpoints,
memory-map lifetimes) and the store keeps it in the same transaction. The store does not import the
analyses: each one describes its rows as a `Derived`, and the package root hands the store the list
(`provide`), so the dependency points from the analyses to the store.
"""
from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterable

SAVED_MIN_EVENTS = 50_000  # below this a cold replay to the end takes a few tens of ms

# (named tuples, not dataclasses: the package root imports this module, and a sweep's first programs start
# before the command imports dataclasses, preflight/prestart.py)
Derived = namedtuple("Derived", "table fields reads rows decode", defaults=(None,))
Derived.__doc__ = """Rows of one of the store's tables of derived data (`state_checkpoints`, `memmap_lod`): the table,
its columns after (trace_id, graph_idx), the event columns `rows` reads, `rows(columns, graph {role,
buffer_size}, compressor)` -> the rows, and `decode(one stored value)` -> what the analysis reads (or None)."""

Saved = namedtuple("Saved", "marks load")
Saved.__doc__ = """Checkpoints kept in the store: the events they stand at (0 first, ascending) and a loader
(`load(event)` -> the checkpoint dict, state.index.checkpoint_dict)."""


_provider: Callable[[], tuple[Derived, ...]] | None = None


def provide(fn: Callable[[], tuple[Derived, ...]]) -> None:
    """Set where the store gets its list of derived data from (called once, by the package root)."""
    global _provider
    _provider = fn


def derived() -> tuple[Derived, ...]:
    return _provider() if _provider is not None else ()


def of_table(table: str) -> Derived | None:
    return next((d for d in derived() if d.table == table), None)
