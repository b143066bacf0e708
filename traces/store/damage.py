"""Checked decoding of stored data: what a damaged trace, graph or derived row is, and the checks every read
of the store makes (shared by the SQLite and PostgreSQL stores: they decode the same blobs and JSON)."""
from __future__ import annotations

import json
import struct

from alloctrace.traces.util.zstd import zstandard  # the compiled module without the package's __init__

from alloctrace.traces.errors import UserError


class Damaged(UserError):
    """Stored data that cannot be read back: the trace (or graph) it names is damaged, the rest of the store
    is not. `alloctrace doctor` lists what is damaged and can delete it. The server answers 422."""

    status = 422

    def __init__(self, tid: str, g: int | None, what: str, why: str = ""):
        self.tid, self.graph, self.what = tid, g, what
        where = f"trace {tid}" + ("" if g is None else f" graph {g}")
        super().__init__(f"{where} is damaged ({what}{': ' + why if why else ''}); `alloctrace doctor` lists "
                         "damaged traces and can delete them")


class DerivedDamaged(Damaged):
    """A graph's derived rows (state checkpoints, memory-map lifetimes) cannot be read: they are made again
    from its columns."""


# what decoding stored bytes may raise when they are damaged (a flipped bit, a hand edit, a cut write)
DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, struct.error, zstandard.ZstdError,
                 UnicodeDecodeError, OverflowError, MemoryError)


class OutOfMemory(UserError):
    """Reading a stored value ran out of memory: nothing says it is damaged (`doctor` never deletes it)."""

    status = 503

    def __init__(self, tid: str, g: int | None, what: str):
        self.tid, self.graph, self.what = tid, g, what
        where = f"trace {tid}" + ("" if g is None else f" graph {g}")
        super().__init__(f"out of memory reading {where} ({what}); it is not known to be damaged")


def damaged(e: BaseException, tid: str, g: int | None, what: str, cls: type = Damaged) -> UserError:
    """What a failed decoding of stored bytes means: damage (`cls`), or, for a MemoryError, a resource that ran
    out (OutOfMemory), which says nothing about the bytes."""
    if isinstance(e, MemoryError):
        return OutOfMemory(tid, g, what)
    return cls(tid, g, what, _why(e))


def verify_checksum(tid: str, g: int, stored: str | None, strings, packed) -> None:
    """A graph's bytes (strings, packed columns) against the checksum stored with them (blobs.checksum); a
    graph stored before checksums were kept (None) is checked by decoding alone."""
    from .blobs import checksum

    if stored is not None and checksum(strings, packed) != stored:
        raise Damaged(tid, g, "checksum", "its stored bytes differ from what was written (a lost or changed blob)")


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"


def _json(text, tid: str, g: int | None, what: str, kind: type = object):
    """A stored JSON value (a trace's tags or extra, a graph's extra or oom), or Damaged naming it."""
    try:
        value = json.loads(text)
    except DECODE_ERRORS as e:
        raise damaged(e, tid, g, what) from None
    if kind is not object and not isinstance(value, kind):
        raise Damaged(tid, g, what, f"a {type(value).__name__}, not a {kind.__name__}")
    return value


def _content_size(data) -> int:
    """The decompressed size a zstd frame declares (-1: it declares none)."""
    try:
        return zstandard.frame_content_size(bytes(data[:18]))
    except zstandard.ZstdError:
        return -1


def check_rows(tid: str, g: int, n_events: int, blobs) -> None:
    """A graph's event count against its first entry column's declared size (kind for ggml events, action
    for PyTorch entries), before anything is sized by it: a count edited to 10^12 is damage, not work."""
    if n_events > 0 and not blobs:
        raise Damaged(tid, g, "columns", f"{n_events:,} events, but no columns are stored")
    for name, dtype, data in blobs:
        if name in ("kind", "action"):
            import numpy as np

            try:
                itemsize = np.dtype(dtype).itemsize
            except DECODE_ERRORS as e:
                raise damaged(e, tid, g, f"column {name}") from None
            size = _content_size(data)
            if n_events < 0 or (size >= 0 and size != n_events * itemsize):
                raise Damaged(tid, g, "n_events", f"{n_events:,} events, but its {name} column holds "
                                                  f"{size // max(itemsize, 1):,}")
            return
