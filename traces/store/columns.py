"""Events <-> columns: how a graph's events are laid out in the store.

Integer fields become arrays in the narrowest integer type that holds them, with
that type's minimum as "missing"; strings become int32 codes into a per-graph
string table (-1: missing); `srcs` and `extra` are JSON strings in that table.

Encoding needs no numpy (`encode_arrays`, `pack_arrays`: the standard library's `array`, byte for byte
what numpy would store), so a short command that only writes traces never imports it; reading columns back
for analysis (`decode_events`, `public_columns`) does.
"""
from __future__ import annotations

import json
import sys
from json.encoder import encode_basestring_ascii as _quote
from array import array
from alloctrace.allocator.record_class import record_class, field, fields
from operator import attrgetter

from alloctrace.traces.util.zstd import zstandard  # the compiled module without the package's __init__

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError

FIELDS = list(fields(Event))
STR_FIELDS = ("kind", "tensor", "op", "parent", "view_src", "reason")
JSON_FIELDS = ("srcs", "extra")
INT_FIELDS = tuple(f for f in FIELDS if f not in STR_FIELDS + JSON_FIELDS)
_row = attrgetter(*FIELDS)  # one event -> its field values, in FIELDS order


def _int_types() -> tuple:
    """(dtype string as numpy names it, array typecode, min, max) for 1, 2, 4 and 8-byte integers."""
    order = "<" if sys.byteorder == "little" else ">"
    out = []
    for size in (1, 2, 4, 8):
        code = next(c for c in "bhilq" if array(c).itemsize == size)
        lo = -(1 << (8 * size - 1))
        out.append(("|i1" if size == 1 else f"{order}i{size}", code, lo, -lo - 1))
    return tuple(out)


INT_TYPES = _int_types()
INT32 = INT_TYPES[2]


def narrowest_type(name: str, lo: int, hi: int) -> tuple:
    """The smallest of INT_TYPES holding lo..hi with its minimum left free for "missing"."""
    for t in INT_TYPES:
        if t[2] < lo and hi <= t[3]:
            return t
    raise UserError(f"event field {name} out of range ({lo if lo <= INT_TYPES[-1][2] else hi})")


def narrowest(name: str, lo: int, hi: int):
    """narrowest_type as a numpy dtype."""
    import numpy as np

    return np.dtype(narrowest_type(name, lo, hi)[0])


def encode_arrays(events: list[Event]) -> tuple[dict[str, tuple[str, array]], list[str]]:
    """({field name: (dtype string, array)}, string table) for one graph's events."""
    n = len(events)
    cols: dict[str, tuple[str, array]] = {}
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
        dt, tc, missing, _ = narrowest_type(name, min(present), max(present))
        cols[name] = (dt, array(tc, [missing if v is None else v for v in vals] if n_missing else vals))
    for name in STR_FIELDS:
        vals = columns[name]
        if vals.count(None) == n:
            continue
        cols[name] = (INT32[0], array(INT32[1], [-1 if v is None else code(v, len(table)) for v in vals]))
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
                c = known[key] = code(_dumps_names(s), len(table))
            codes.append(c)
        cols["srcs"] = (INT32[0], array(INT32[1], codes))
    extra = columns["extra"]
    if any(extra):
        cols["extra"] = (INT32[0], array(INT32[1], [code(json.dumps(x, sort_keys=True), len(table)) if x else -1
                                                      for x in extra]))
    return cols, list(table)


def _dumps_names(names: list) -> str:
    """json.dumps of a list of source names, byte for byte, without its encoder's machinery when every one
    is a string (a graph's source lists are most of its distinct strings)."""
    if all(type(x) is str for x in names):
        return "[" + ", ".join(map(_quote, names)) + "]"
    return json.dumps(names)


def encode(events: list[Event]) -> tuple[dict, list[str]]:
    """(numpy arrays by field name, string table) for one graph's events: `encode_arrays` seen by numpy."""
    import numpy as np

    arrays, table = encode_arrays(events)
    return {name: np.frombuffer(a, dtype=np.dtype(dt)) for name, (dt, a) in arrays.items()}, table


class FieldValues:
    """`values[field]`: the events' values of one field, as a tuple made when asked (a transposed copy of
    every field at once would hold 25 tuples of n values)."""

    def __init__(self, events: list[Event]):
        self.events = events

    def __getitem__(self, name: str) -> tuple:
        return tuple(map(attrgetter(name), self.events))


def decode_events(n: int, cols: dict, table: list[str]) -> list[Event]:
    """The exact events `encode` was given."""
    import numpy as np

    return events_from_lists(n, {name: (arr.tolist(), int(np.iinfo(arr.dtype).min) if name in INT_FIELDS else None)
                                 for name, arr in cols.items()}, table)


_TYPECODES = {dt: (code, lo) for dt, code, lo, _ in INT_TYPES}


def decode_arrays(n: int, blobs: list, strings: bytes, decompress) -> list[Event]:
    """`decode_events` of a graph in its packed form ([(name, dtype, data)] and the string table, as `pack`
    made them) without numpy: for a small graph a worker has just encoded."""
    table = json.loads(decompress(strings))
    lists = {}
    for name, dt, data in blobs:
        code, lo = _TYPECODES[dt]
        a = array(code)
        a.frombytes(decompress(data))
        lists[name] = (a.tolist(), lo if name in INT_FIELDS else None)
    return events_from_lists(n, lists, table)


def events_from_lists(n: int, lists: dict[str, tuple[list, int | None]], table: list[str]) -> list[Event]:
    """Events from each stored column as a list (with its integer type's "missing" value)."""
    out = []
    for name in FIELDS:  # Event's own field order, so rows can be passed positionally
        got = lists.get(name)
        if got is None:
            out.append([{} for _ in range(n)] if name == "extra" else [None] * n)
            continue
        vals, missing = got
        if name in INT_FIELDS:
            out.append([None if v == missing else v for v in vals] if missing in vals else vals)
        elif name in STR_FIELDS:
            values = table + [None]
            out.append([values[c] for c in vals])
        else:
            out.append([({} if name == "extra" else None) if c < 0 else json.loads(table[c]) for c in vals])
    return [Event(*row) for row in zip(*out)] if n else []


class EventColumns:
    """A graph's events as its columns ({name: (dtype, bytes)} as `pack_arrays` takes them, and the string table):
    what a reader of a few fields of every event needs (a peak), each field decoded when first asked, without
    an Event object per event. Indexing gives the Event itself."""

    def __init__(self, n: int, columns: dict[str, tuple[str, bytes]], table: list[str]):
        self.n, self.columns, self.table = n, columns, table
        self._raw: dict[str, list] = {}

    def __len__(self) -> int:
        return self.n

    def raw(self, name: str) -> list | None:
        """The stored integers of a field (its type's minimum for missing; codes for strings), None if absent."""
        got = self._raw.get(name)
        if got is None and name in self.columns:
            dt, data = self.columns[name]
            got = self._raw[name] = array(_TYPECODES[dt][0], data).tolist()
        return got

    def ints(self, name: str, missing: int) -> list:
        """An integer field with `missing` where an event has none."""
        vals = self.raw(name)
        if vals is None:
            return [missing] * self.n
        lo = _TYPECODES[self.columns[name][0]][1]
        return [missing if v == lo else v for v in vals] if lo in vals else vals

    def field(self, name: str) -> list:
        """A field's values as the events hold them (None for missing)."""
        vals = self.raw(name)
        if vals is None:
            return [{} for _ in range(self.n)] if name == "extra" else [None] * self.n
        if name in INT_FIELDS:
            return self.ints(name, None)
        if name in STR_FIELDS:
            values = self.table + [None]
            return [values[c] for c in vals]
        return [({} if name == "extra" else None) if c < 0 else json.loads(self.table[c]) for c in vals]

    def __getitem__(self, i: int) -> Event:
        return Event(**{name: self.field(name)[i] for name in FIELDS})

    def __iter__(self):
        cols = [self.field(name) for name in FIELDS]
        return (Event(*row) for row in zip(*cols))


def public_columns(n: int, cols: dict, table: list[str], names=FIELDS) -> dict:
    """Columns for analysis: int64 with -1 for missing, object arrays for strings, lists and dicts
    (`names`: only these fields)."""
    import numpy as np

    out: dict = {"i": np.arange(n, dtype=np.int64)}
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
            for c in set(arr[arr >= 0].tolist()):  # (np.unique would import numpy.ma: 40 ms)
                values[c] = json.loads(table[c])
        values[-1] = {} if name == "extra" else None
        out[name] = values[arr] if arr is not None else np.full(n, values[-1], dtype=object)
    return out


def event_rows(cols: dict, indices) -> list[dict]:
    """Event dicts (with their index `i`) from `public_columns`: -1 in an integer column means
    absent, except an alloc's `block`, where -1 is ggml's own "no block" answer (a placement taken from a
    recording, reason "recorded", chose no block at all)."""
    import numpy as np

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


@record_class
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


def pack(cols: dict, table: list[str], compress) -> tuple[bytes, list]:
    """(compressed string table, [(name, dtype, compressed data)]), as the store keeps them."""
    return (compress(json.dumps(table).encode()),
            [(name, arr.dtype.str, compress(arr.tobytes())) for name, arr in cols.items()])


def pack_arrays(arrays: dict[str, tuple[str, array]], table: list[str], compress) -> tuple[bytes, list]:
    """`pack` of what `encode_arrays` gives: the same bytes, without numpy."""
    return (compress(json.dumps(table).encode()),
            [(name, dt, compress(a.tobytes())) for name, (dt, a) in arrays.items()])


def compressor():
    """zstd at level 3, each result in a block of its own size: zstandard hands back bytes whose
    block is as large as the input's worst case (a 4 MB column that packs into 100 bytes keeps
    4 MB), and importers hold every graph's blobs until the store takes them. Each frame carries a
    checksum, so a stored blob that was damaged is found when it is read, not read as other numbers."""
    compress = zstandard.ZstdCompressor(level=3, write_checksum=True).compress
    return lambda data: bytes(memoryview(compress(data)))


def constant_column(name: str, value: int, n: int):
    """The column `encode` makes for an integer field that is `value` in all n events."""
    import numpy as np

    return np.full(n, value, dtype=narrowest(name, value, value))
