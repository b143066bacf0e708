"""A long graph's memory-map lifetimes and tile pyramid as one stored value, made when the graph is
stored, so its first memory-map view loads them instead of extracting and reducing a million events.

The value is zstd-compressed: a length-prefixed JSON head (event count, chunks, the name tables of the
`tensor` and `op` columns, and each array's name, dtype and length) followed by the arrays' bytes in
that order. Names are stored once each (once per distinct object) with an int32 code per lifetime. The free-list series levels
are not stored: they are rebuilt from the per-event series (a few tens of ms), which halves the value.
Loading gives the same Lifetimes and Pyramid `with_lod(extract(cols))` builds: every
array with the same values and dtype (tests/memmap/test_memmap_saved.py compares the server's answers).
"""
from __future__ import annotations

import json
import struct

import numpy as np
from alloctrace.traces.util.zstd import zstandard  # the compiled module without the package's __init__

from alloctrace.traces.memmap import lod as memmap_lod
from alloctrace.traces.memmap.lifetimes import Lifetimes, extract
from alloctrace.traces.memmap.view import with_lod
from alloctrace.traces.state.index import REPLAYED_FIELDS
from alloctrace.traces.store.derived import Derived

FORMAT = 1
_HEAD = struct.Struct("<I")
LIFETIME_ARRAYS = ("start", "end", "y0", "y1", "offset", "size", "chunk", "used", "n_free", "largest_free",
                   "total_free")
LEVEL_ARRAYS = ("key", "x0", "x1", "y0", "y1", "biggest", "count", "up")
NAME_COLUMNS = ("tensor", "op")


def lod_of(cols: dict) -> Lifetimes:
    """The graph's lifetimes with their pyramid, from its event columns (what the server builds on view)."""
    return with_lod(extract(cols))


def _codes(values: np.ndarray) -> tuple[list, np.ndarray]:
    """(names, int32 code per value): one entry per distinct object. Decoded columns share one object
    per string (columns.public_columns' table), so this is per distinct name without comparing strings."""
    ids = np.fromiter(map(id, values.tolist()), dtype=np.uint64, count=len(values))
    _, first, codes = np.unique(ids, return_index=True, return_inverse=True)
    return values[first].tolist(), codes.astype(np.int32)


def encode(lt: Lifetimes, compressor) -> bytes:
    """`lt` (with its pyramid) as stored bytes, through a zstandard.ZstdCompressor: array by array,
    never a second copy of them all."""
    pyr = lt.lod
    arrays = [(f"lt.{name}", getattr(lt, name)) for name in LIFETIME_ARRAYS]
    names = {}
    for col in NAME_COLUMNS:
        names[col], codes = _codes(getattr(lt, col))
        arrays.append((f"code.{col}", codes))
    for k, lv in enumerate(pyr.levels):
        arrays += [(f"level{k}.{name}", getattr(lv, name)) for name in LEVEL_ARRAYS]
    arrays += [("members", pyr.members), ("first", pyr.first)]
    arrays += [(f"columns{k}", a) for k, a in enumerate(pyr.columns)]
    arrays = [(name, np.ascontiguousarray(a)) for name, a in arrays]
    head = {"format": FORMAT, "n_events": lt.n_events, "chunks": lt.chunks, "names": names,
            "levels": len(pyr.levels), "arrays": [[name, a.dtype.str, len(a)] for name, a in arrays]}
    head_bytes = json.dumps(head, separators=(",", ":")).encode()
    z = compressor.compressobj()
    out = [z.compress(_HEAD.pack(len(head_bytes)) + head_bytes)]
    out += [z.compress(memoryview(a).cast("B")) for _, a in arrays if len(a)]
    out.append(z.flush())
    return b"".join(out)


def decode(data: bytes) -> Lifetimes | None:
    """The Lifetimes (with `lod`) stored by `encode`; None for a value of another format."""
    # one writable buffer, the arrays views into it; a decompressor of its own (threads load side by side)
    raw = bytearray(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    (size,) = _HEAD.unpack_from(raw, 0)
    head = json.loads(bytes(raw[_HEAD.size:_HEAD.size + size]))
    if head.get("format") != FORMAT:
        return None
    at, arrays = _HEAD.size + size, {}
    for name, dtype, n in head["arrays"]:
        dt = np.dtype(dtype)
        arrays[name] = np.frombuffer(raw, dtype=dt, count=n, offset=at)
        at += n * dt.itemsize
    named = {}
    for col in NAME_COLUMNS:
        table = np.empty(len(head["names"][col]) + 1, dtype=object)
        table[:-1] = head["names"][col]
        named[col] = table[arrays[f"code.{col}"]]
    lt = Lifetimes(head["n_events"], *(arrays[f"lt.{n}"] for n in LIFETIME_ARRAYS[:7]),
                          named["tensor"], named["op"], head["chunks"],
                          *(arrays[f"lt.{n}"] for n in LIFETIME_ARRAYS[7:]))
    levels = [memmap_lod.Level(*(arrays[f"level{k}.{n}"] for n in LEVEL_ARRAYS)) for k in range(head["levels"])]
    lt.lod = memmap_lod.Pyramid(levels, arrays["members"], arrays["first"], memmap_lod._series_levels(lt),
                                tuple(arrays[f"columns{k}"] for k in range(3)))
    return lt


MAP_FIELDS = ("op", "n_free", "largest_free", "total_free")  # what extract reads beyond REPLAYED_FIELDS
# a graph whose events open more lifetimes than this is stored without its map: building it would take
# ~200 MB more than the import may (a million never-freed allocations); the server builds it on the first
# view and keeps it then (server/context.py), as for graphs of older stores
SAVED_MAX_LIFETIMES = 1 << 19


def _stored_rows(cols: dict, graph: dict, compressor) -> list[tuple]:
    kind = cols["kind"]
    if int(np.count_nonzero((kind == "alloc") | (kind == "reuse"))) > SAVED_MAX_LIFETIMES:
        return []
    return [(encode(lod_of(cols), compressor),)]


DERIVED = Derived("memmap_lod", ("data",), REPLAYED_FIELDS + MAP_FIELDS, _stored_rows, decode)
