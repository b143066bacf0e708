"""A graph's compressed columns as one stored value, and a state checkpoint as stored bytes."""
from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator

from alloctrace.traces.util.zstd import zstandard  # the compiled module without the package's __init__


_LENGTH = struct.Struct("<I")
_HEADS: dict[tuple[str, str], bytes] = {}  # (name, dtype) -> its packed name and dtype: a few dozen pairs


def pack_blobs(blobs) -> bytes:
    """A graph's compressed columns [(name, dtype, data)] as one value: per column the name and
    dtype (a length byte and ASCII each), the data's length (4 bytes, little-endian) and the data."""
    parts, heads, length = [], _HEADS, _LENGTH.pack
    for name, dtype, data in blobs:
        head = heads.get((name, dtype))
        if head is None:
            n, d = name.encode("ascii"), dtype.encode("ascii")
            head = bytes((len(n),)) + n + bytes((len(d),)) + d
            if len(heads) < 4096:
                heads[name, dtype] = head
        parts += (head, length(len(data)), data)
    return b"".join(parts)


def unpack_blobs(packed: bytes) -> list[tuple[str, str, memoryview]]:
    """pack_blobs' columns back; each data a view into `packed` (no copies)."""
    view, at, out = memoryview(packed), 0, []
    while at < len(view):
        n = view[at]
        name = bytes(view[at + 1:at + 1 + n]).decode("ascii")
        at += 1 + n
        d = view[at]
        dtype = bytes(view[at + 1:at + 1 + d]).decode("ascii")
        at += 1 + d
        (size,) = _LENGTH.unpack_from(view, at)
        at += 4
        out.append((name, dtype, view[at:at + size]))
        at += size
    return out


SMALL_HASH = 256 << 10  # bytes Python's own SHA-256 hashes in about the time loading OpenSSL's takes


def new_sha256(nbytes: int):
    """An empty SHA-256 hash for about `nbytes` of data: hashlib's (OpenSSL, ten times faster per byte) for
    large data or once loaded, else Python's own module: loading OpenSSL's libcrypto costs a short command
    (a small recording's import) a few milliseconds, more than hashing its few kilobytes. The same digest."""
    import sys

    if nbytes < SMALL_HASH and "hashlib" not in sys.modules:
        from alloctrace.traces.util.cbuild import python_sha256

        return python_sha256()()
    import hashlib

    return hashlib.sha256()


def checksum(strings, packed) -> str:
    """A graph's content checksum (stored in `graphs.checksum`, verified on every read and by `doctor`): SHA-256
    over its string table and its packed columns (a graph stored a row per column: pack_blobs of its rows in
    name order), so a lost, cut or changed blob is damage, not an empty graph."""
    h = new_sha256(len(strings) + len(packed))
    h.update(len(strings).to_bytes(8, "little"))
    h.update(strings)
    h.update(packed)
    return h.hexdigest()


_PER_THREAD = threading.local()


def thread_compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor: a zstandard context is not safe in two threads at once (a server reads and
    writes from a pool of threads), and making one per call costs more than keeping one per thread."""
    zc = getattr(_PER_THREAD, "zc", None)
    if zc is None:
        zc = _PER_THREAD.zc = zstandard.ZstdCompressor(level=3, write_checksum=True)
    return zc


def thread_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor (thread_compressor says why: two threads sharing one context restore wrong
    bytes, which a checksum then reports as damage)."""
    zd = getattr(_PER_THREAD, "zd", None)
    if zd is None:
        zd = _PER_THREAD.zd = zstandard.ZstdDecompressor()
    return zd


def _decompress(data: bytes) -> bytes:
    """One frame, with this thread's decompressor (this runs in several threads at once)."""
    return thread_decompressor().decompress(data)


def checkpoint_rows(checkpoints, compress) -> Iterator[tuple[int, bytes]]:
    """(event, stored bytes) of each state checkpoint (state.index.checkpoint_dict)."""
    for cp in checkpoints:
        yield cp["n"], compress(json.dumps(cp).encode())
