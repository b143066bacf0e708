"""A graph's columns read as they are asked for: what a state request needs of a long graph, cheaply.

`Store.columns` decodes every column of a graph into the analysis form of
`columns.public_columns` (strings as object arrays): about 0.3 s for a million
events. A state answer reads one slice of a few columns (the events after the
nearest checkpoint), one row (the next event) and a few masks, so `LazyColumns`
keeps the columns compressed as stored, decompresses a column the first time it
is touched and decodes only the rows asked for, with the values
`public_columns` gives for them (tests/test_state_cold.py compares both).
"""
from __future__ import annotations

import json
import threading
from typing import Callable, Iterator

import numpy as np

from .columns import FIELDS, INT_FIELDS, STR_FIELDS


class LazyColumns:
    """`cols[name]` -> a LazyColumn for every field (and "i"), like public_columns' dict."""

    def __init__(self, n: int, blobs: dict[str, tuple[str, bytes]], table: list[str],
                 decompress: Callable[[bytes], bytes]):
        self.n, self.table = n, table
        self._blobs, self._decompress = blobs, decompress
        self._raw: dict[str, np.ndarray] = {}
        self._codes: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._cols = {"i": LazyColumn(self, "i")} | {name: LazyColumn(self, name) for name in FIELDS}

    def raw(self, name: str) -> np.ndarray | None:
        """The column as stored (codes, narrowest ints with their minimum as missing), None if absent."""
        if name not in self._blobs:
            return None
        with self._lock:
            arr = self._raw.get(name)
            if arr is None:
                dtype, data = self._blobs[name]
                arr = self._raw[name] = np.frombuffer(self._decompress(data), dtype=np.dtype(dtype))
        return arr

    def codes(self, name: str) -> dict[str, int]:
        """The table index of each string a string column holds (strings are kept once each): for a
        column of few distinct values, as `kind`."""
        with self._lock:
            known = self._codes.get(name)
        if known is None:
            raw = self.raw(name)
            present = [] if raw is None else (np.flatnonzero(np.bincount(raw + 1)) - 1).tolist()
            known = {self.table[c]: c for c in present if c >= 0}
            with self._lock:
                self._codes[name] = known
        return known

    def __getitem__(self, name: str) -> "LazyColumn":
        return self._cols[name]

    def get(self, name: str, default=None):
        return self._cols.get(name, default)

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def items(self):
        return self._cols.items()

    def __len__(self) -> int:
        return len(self._cols)


class LazyColumn:
    """One field: `col[rows]` decodes those rows only; `col == "oom"` compares the string codes."""

    def __init__(self, owner: LazyColumns, name: str):
        self.owner, self.name = owner, name

    def __len__(self) -> int:
        return self.owner.n

    def __eq__(self, s) -> np.ndarray:
        if self.name not in STR_FIELDS:
            return NotImplemented
        code, raw = self.owner.codes(self.name).get(s), self.owner.raw(self.name)
        if raw is None or code is None:
            return np.zeros(self.owner.n, dtype=bool)
        return raw == code

    __hash__ = None

    def __getitem__(self, rows):
        owner, name = self.owner, self.name
        if name == "i":
            return np.arange(owner.n, dtype=np.int64)[rows]
        raw = owner.raw(name)
        if name in INT_FIELDS:
            if raw is None:
                return np.int64(-1) if np.ndim(rows) == 0 and not isinstance(rows, slice) else \
                    np.full(_count(rows, owner.n), -1, dtype=np.int64)
            part = raw[rows]
            missing = part == np.iinfo(raw.dtype).min
            if np.ndim(part) == 0:
                return np.int64(-1 if missing else part)
            col = part.astype(np.int64)  # a copy: the stored array is read-only
            col[missing] = -1
            return col
        absent = {} if name == "extra" else None
        if raw is None:
            if np.ndim(rows) == 0 and not isinstance(rows, slice):
                return absent
            return np.full(_count(rows, owner.n), absent, dtype=object)
        else:
            codes = raw[rows]
        if np.ndim(codes) == 0:
            return self._value(int(codes), absent)
        values = np.empty(len(codes), dtype=object)
        values[:] = [self._value(c, absent) for c in codes.tolist()]
        return values

    def _value(self, code: int, absent):
        if code < 0:
            return absent
        s = self.owner.table[code]
        return s if self.name in STR_FIELDS else json.loads(s)


def _count(rows, n: int) -> int:
    """How many rows `rows` picks out of n (a slice, an index array or a boolean mask)."""
    if isinstance(rows, slice):
        return len(range(*rows.indices(n)))
    rows = np.asarray(rows)
    return int(rows.sum()) if rows.dtype == bool else len(rows)
