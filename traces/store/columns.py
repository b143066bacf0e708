"""Events <-> columns: how a graph's events are laid out in the store.

Integer fields become numpy arrays in the narrowest dtype that holds them, with
that dtype's minimum as "missing"; strings become int32 codes into a per-graph
string table (-1: missing); `srcs` and `extra` are JSON strings in that table.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from operator import attrgetter

import numpy as np
import zstandard

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError

FIELDS = [f.name for f in fields(Event)]
STR_FIELDS = ("kind", "tensor", "op", "parent", "view_src", "reason")
JSON_FIELDS = ("srcs", "extra")
INT_FIELDS = tuple(f for f in FIELDS if f not in STR_FIELDS + JSON_FIELDS)
DTYPES = (np.int8, np.int16, np.int32, np.int64)
_row = attrgetter(*FIELDS)  # one event -> its field values, in FIELDS order


def narrowest(name: str, lo: int, hi: int):
    """The smallest integer dtype holding lo..hi with its minimum left free for "missing"."""
    for dt in DTYPES:
        info = np.iinfo(dt)
        if info.min < lo and hi <= info.max:
            return dt
    raise UserError(f"event field {name} out of range ({lo if lo <= info.min else hi})")


def encode(events: list[Event]) -> tuple[dict[str, np.ndarray], list[str]]:
    """(arrays by field name, string table) for one graph's events."""
    n = len(events)
    cols: dict[str, np.ndarray] = {}
    table: dict[str, int] = {}
    code = table.setdefault
    # one field at a time: a transposed copy of every row would cost 25 lists of n at once
    columns = FieldValues(events)
    for name in INT_FIELDS:
        vals = columns[name]
        n_missing = vals.count(None)
        if n_missing == n:
            continue
        present = [v for v in vals if v is not None] if n_missing else vals
        dt = narrowest(name, min(present), max(present))
        missing = int(np.iinfo(dt).min)
        cols[name] = np.array([missing if v is None else v for v in vals] if n_missing else vals, dtype=dt)
    for name in STR_FIELDS:
        vals = columns[name]
        if vals.count(None) == n:
            continue
        cols[name] = np.array([-1 if v is None else code(v, len(table)) for v in vals], dtype=np.int32)
    srcs = columns["srcs"]
    if srcs.count(None) != n:
        known: dict[tuple, int] = {}  # exec lines repeat their sources; dump each list once
        codes = []
        for s in srcs:
            if s is None:
                codes.append(-1)
                continue
            c = known.get(key := tuple(s))
            if c is None:
                c = known[key] = code(json.dumps(s), len(table))
            codes.append(c)
        cols["srcs"] = np.array(codes, dtype=np.int32)
    extra = columns["extra"]
    if any(extra):
        cols["extra"] = np.array([code(json.dumps(x, sort_keys=True), len(table)) if x else -1 for x in extra],
                                 dtype=np.int32)
    return cols, list(table)


class FieldValues:
    """`values[field]`: the events' values of one field, as a tuple made when asked (a transposed copy of
    every field at once would hold 25 tuples of n values)."""

    def __init__(self, events: list[Event]):
        self.events = events

    def __getitem__(self, name: str) -> tuple:
        return tuple(map(attrgetter(name), self.events))


def decode_events(n: int, cols: dict[str, np.ndarray], table: list[str]) -> list[Event]:
    """The exact events `encode` was given."""
    lists = []
    for name in FIELDS:  # Event's own field order, so rows can be passed positionally
        arr = cols.get(name)
        if arr is None:
            lists.append([{} for _ in range(n)] if name == "extra" else [None] * n)
        elif name in INT_FIELDS:
            missing = int(np.iinfo(arr.dtype).min)
            vals = arr.tolist()
            lists.append([None if v == missing else v for v in vals] if (arr == missing).any() else vals)
        elif name in STR_FIELDS:
            values = table + [None]
            lists.append([values[c] for c in arr.tolist()])
        else:
            lists.append([({} if name == "extra" else None) if c < 0 else json.loads(table[c]) for c in arr.tolist()])
    return [Event(*row) for row in zip(*lists)] if n else []


def public_columns(n: int, cols: dict[str, np.ndarray], table: list[str], names=FIELDS) -> dict[str, np.ndarray]:
    """Columns for analysis: int64 with -1 for missing, object arrays for strings, lists and dicts
    (`names`: only these fields)."""
    out: dict[str, np.ndarray] = {"i": np.arange(n, dtype=np.int64)}
    for name in names:
        arr = cols.get(name)
        if name in INT_FIELDS:
            if arr is None:
                out[name] = np.full(n, -1, dtype=np.int64)
            else:
                col = arr.astype(np.int64)
                col[arr == np.iinfo(arr.dtype).min] = -1
                out[name] = col
            continue
        values = np.empty(len(table) + 1, dtype=object)
        if name in STR_FIELDS:
            values[:-1] = table
        elif arr is not None:
            for c in np.unique(arr[arr >= 0]).tolist():
                values[c] = json.loads(table[c])
        values[-1] = {} if name == "extra" else None
        out[name] = values[arr] if arr is not None else np.full(n, values[-1], dtype=object)
    return out


def event_rows(cols: dict[str, np.ndarray], indices) -> list[dict]:
    """Event dicts (with their index `i`) from `public_columns`: -1 in an integer column means
    absent, except an alloc's `block`, where -1 is ggml's own "no block" answer (a placement taken from a
    recording, reason "recorded", chose no block at all)."""
    out = []
    reasons = cols.get("reason")
    for i in indices:
        row = {"i": i}
        kind = cols["kind"][i]
        chose = kind == "alloc" and (reasons is None or reasons[i] != "recorded")
        for name, col in cols.items():
            if name == "i":
                continue
            v = col[i]
            if isinstance(v, np.integer):
                v = int(v)
                if v == -1 and not (name == "block" and chose):
                    continue
            if v is None or v == {}:
                continue
            row[name] = v
        out.append(row)
    return out


@dataclass
class EncodedGraph:
    """A graph already in its stored form (compressed columns and string table), for
    importers that produce it directly; `Store.add_trace` takes these next to GraphRecords."""

    index: int
    role: str
    n_events: int
    max_size: int | None
    buffer_size: int | None
    oom: dict | None
    consistent: bool | None
    strings: bytes  # zstd-compressed JSON string table
    blobs: list  # (column name, dtype string, zstd-compressed little-endian array)
    extra: dict = field(default_factory=dict)


def pack(cols: dict[str, np.ndarray], table: list[str], compress) -> tuple[bytes, list]:
    """(compressed string table, [(name, dtype, compressed data)]), as the store keeps them."""
    return (compress(json.dumps(table).encode()),
            [(name, arr.dtype.str, compress(arr.tobytes())) for name, arr in cols.items()])


def compressor():
    """zstd at level 3, each result in a block of its own size: zstandard hands back bytes whose
    block is as large as the input's worst case (a 4 MB column that packs into 100 bytes keeps
    4 MB), and importers hold every graph's blobs until the store takes them. Each frame carries a
    checksum, so a stored blob that was damaged is found when it is read, not read as other numbers."""
    compress = zstandard.ZstdCompressor(level=3, write_checksum=True).compress
    return lambda data: bytes(memoryview(compress(data)))


def constant_column(name: str, value: int, n: int) -> np.ndarray:
    """The column `encode` makes for an integer field that is `value` in all n events."""
    return np.full(n, value, dtype=narrowest(name, value, value))
