"""A graph's columns read as they are asked for: what a state request needs of a long graph, cheaply.

`Store.columns` decodes every column of a graph into the analysis form of
`columns.public_columns` (strings as object arrays): about 0.3 s for a million
events. A state answer reads one slice of a few columns (the events after the
nearest checkpoint), one row (the next event) and a few masks, so `LazyColumns`
keeps the columns compressed as stored, decompresses a column the first time it
is touched and decodes only the rows asked for, with the values
`public_columns` gives for them (tests/state/test_state_cold.py compares both).
The columns start decompressing side by side in background threads as soon as
the graph is opened (zstd lets go of the interpreter lock meanwhile), while the
caller parses the string table; a read waits for its column only.
"""
from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterator

import numpy as np

from alloctrace.traces.store.columns import FIELDS, INT_FIELDS, STR_FIELDS


class StringTable:
    """A graph's string table (the JSON text of a list of strings) read one entry at a time: parsing
    all of it takes tens of ms on a million-event graph, a state answer needs a few thousand entries.
    Outside its strings JSON has quotes only around them, and a quote inside one is escaped."""

    def __init__(self, data: bytes):
        self.data = data
        b = np.frombuffer(data, dtype=np.uint8)
        quotes = np.flatnonzero(b == 0x22)
        maybe = quotes[(quotes > 0) & (b[np.maximum(quotes - 1, 0)] == 0x5C)]  # after a backslash: rare
        if len(maybe):
            quotes = np.setdiff1d(quotes, [q for q in maybe.tolist() if _escaped(data, q)])
        if len(quotes) % 2:
            raise ValueError("not a JSON list of strings")
        self._start, self._end = quotes[0::2], quotes[1::2]

    def __len__(self) -> int:
        return len(self._start)

    def __getitem__(self, k: int) -> str:
        s, e = int(self._start[k]), int(self._end[k])
        piece = self.data[s + 1:e]
        return json.loads(self.data[s:e + 1]) if b"\\" in piece else piece.decode()


def _escaped(data: bytes, q: int) -> bool:
    """True when the quote at q follows an odd number of backslashes."""
    k = q
    while k > 0 and data[k - 1] == 0x5C:
        k -= 1
    return (q - k) % 2 == 1


_FIRST = ("kind", "chunk", "offset", "size", "tensor")
_POOL = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="columns")


class LazyColumns:
    """`cols[name]` -> a LazyColumn for every field (and "i"), like public_columns' dict. The caller
    sets `table` (a StringTable) after this starts the columns decompressing, so both go on at once."""

    def __init__(self, n: int, blobs: dict[str, tuple[str, bytes]], decompress: Callable[[bytes], bytes]):
        self.n, self.table = n, StringTable(b"[]")
        first = sorted(blobs, key=lambda name: name not in _FIRST)  # what every state request reads
        self._raw = {name: _POOL.submit(_array, decompress, blobs[name][1], blobs[name][0]) for name in first}
        self._codes: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._cols = {"i": LazyColumn(self, "i")} | {name: LazyColumn(self, name) for name in FIELDS}

    def raw(self, name: str) -> np.ndarray | None:
        """The column as stored (codes, narrowest ints with their minimum as missing), None if absent."""
        arr = self._raw.get(name)
        return None if arr is None else arr.result()

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


def _array(decompress, data: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(decompress(data), dtype=np.dtype(dtype))
