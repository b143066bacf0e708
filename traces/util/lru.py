"""A small cache of built values (a graph's lifetimes, a device's columns) shared by request threads."""
from __future__ import annotations

import threading
from collections import OrderedDict


class LRU:
    """Built values per key (e.g. (trace id, graph)), least recently used dropped first; a value
    is built once even when many requests ask for it at the same time."""

    def __init__(self, max_entries: int = 8):
        self.max_entries = max_entries
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict = {}

    def get(self, key, build):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._items:
                    return self._items[key]
            try:
                value = build()
                with self._lock:
                    self._items[key] = value
                    while len(self._items) > self.max_entries:
                        self._items.popitem(last=False)
            finally:
                with self._lock:
                    self._building.pop(key, None)
            return value

    def peek(self, key):
        """The value if it is built already (marked as used), else None; never builds."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def drop(self, trace_id: str):
        """Forget every entry of a trace (keys are (trace id, ...))."""
        with self._lock:
            for k in [k for k in self._items if k[0] == trace_id]:
                del self._items[k]

    def keep_traces(self, trace_ids: set):
        """Forget the entries of traces not in `trace_ids` (deleted by another process)."""
        with self._lock:
            for k in [k for k in self._items if k[0] not in trace_ids]:
                del self._items[k]
