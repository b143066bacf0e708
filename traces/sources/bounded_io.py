"""Read a possibly compressed file with every resource bounded.

A small file can decompress to gigabytes (a zstd frame of zeros, a gzip of
repeated text), and an import can run for hours. `BoundedRaw` decompresses
gzip, zstd and xz incrementally, a small window at a time, counts what it has
produced against `Limits.max_decompressed`, checks the CPU time the import has
used and whether the caller gave up, and refuses with one line naming the cap.
A compressed stream that ends before its end marker is corrupt; with
`Limits.salvage` what was readable is kept and `truncated` is set instead.

Limits come from the environment (ALLOCTRACE_MAX_DECOMPRESSED,
ALLOCTRACE_MAX_IMPORT_CPU, ALLOCTRACE_MAX_GRAPHS, ALLOCTRACE_MAX_AMPLIFICATION)
or from command-line options; the defaults suit real logs of any size.
"""
from __future__ import annotations

import io
import os
import re
import sys
import time
import zlib
from alloctrace.allocator.record_class import record_class, replace
from operator import itemgetter
from collections.abc import Callable

from alloctrace.traces.util.zstd import zstandard  # the compiled module without the package's __init__

from alloctrace.traces.errors import UserError
from alloctrace.traces.util import verbose

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XZ_MAGIC = b"\xfd7zXZ\x00"

READ_IN = 1 << 16  # compressed bytes read from the file at a time
WINDOW = 1 << 20  # decompressed bytes produced at a time (gzip, xz)
ZSTD_FEED = 512  # zstd input fed at a time: one zstd block of 4 bytes may stand for 128 KiB

# What a compressed file may decompress to unless raised (--max-bytes, ALLOCTRACE_MAX_DECOMPRESSED): the
# densest inputs cost about 15 bytes of memory per decompressed byte (a pickle of small dicts) and a log
# 0.15 s per MB, so 64 MiB keeps any file to about 1 GB and 20 s. A plain file is bounded by its own size.
DEFAULT_MAX_DECOMPRESSED = 64 << 20

ENV = {"max_decompressed": "ALLOCTRACE_MAX_DECOMPRESSED", "max_cpu_s": "ALLOCTRACE_MAX_IMPORT_CPU",
       "max_graphs": "ALLOCTRACE_MAX_GRAPHS", "max_amplification": "ALLOCTRACE_MAX_AMPLIFICATION",
       "max_memory": "ALLOCTRACE_MAX_IMPORT_MEMORY"}
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class LimitExceeded(UserError):
    """An input went over one of the import caps."""

    status = 413


class Corrupt(UserError):
    """Compressed data that is damaged or ends before its end marker."""


class Cancelled(UserError):
    """The caller (an HTTP client that went away) no longer wants the import."""

    status = 499


@record_class(frozen=True)
class Limits:
    max_decompressed: int | None = None  # bytes read per file; None: DEFAULT_MAX_DECOMPRESSED of a compressed one
    max_cpu_s: float = 900.0  # CPU seconds (of the importing thread) per file
    max_graphs: int = 100_000  # graphs stored per file
    graphs_per_kib: float = 64.0  # graphs per KiB of input (above 1,000): real logs have a few per KiB
    max_amplification: float = 200.0  # stored bytes per input byte (above a 64 MiB allowance)
    salvage: bool = False  # keep what a truncated compressed stream held instead of refusing it
    cancelled: Callable[[], bool] | None = None  # polled while reading; True stops the import
    min_stored: int = 64 << 20  # stored bytes any file may make, whatever its size
    max_memory: int = 4 << 30  # address space the reading of one file may add (in a child, traces/sources/child.py)

    @classmethod
    def from_env(cls, **given) -> "Limits":
        """Defaults, overridden by the environment, overridden by non-None `given` values."""
        values = {}
        for field_name, var in ENV.items():
            raw = os.environ.get(var)
            if raw:
                values[field_name] = parse_amount(raw, var)
        values.update({k: v for k, v in given.items() if v is not None})
        limits = cls(**values)
        verbose.note("budgets", limits.describe())
        return limits

    def describe(self) -> str:
        """The budgets in one line, for --verbose."""
        return ", ".join(f"{f}={getattr(self, f)}" for f in ("max_decompressed", "max_cpu_s", "max_graphs",
                                                              "graphs_per_kib", "max_amplification", "min_stored"))

    def bytes_cap(self, compressed: bool) -> int | None:
        """Bytes a file may yield: the cap given, else the default for a compressed file, else none."""
        if self.max_decompressed is not None:
            return self.max_decompressed
        return DEFAULT_MAX_DECOMPRESSED if compressed else None

    def with_(self, **changes) -> "Limits":
        return replace(self, **changes)

    def stored_cap(self, input_bytes: int) -> int:
        return int(max(self.min_stored, input_bytes * self.max_amplification))

    def graphs_cap(self, input_bytes: int) -> int:
        return int(min(self.max_graphs, max(self.min_graphs, input_bytes / 1024 * self.graphs_per_kib)))

    min_graphs = 1000


def parse_amount(text: str, what: str) -> float:
    """'2G', '512M', '4096', '1.5' -> a number; a UserError naming `what` otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m:
        raise UserError(f"{what}: not an amount: {text!r} (e.g. 2G, 512M, 600)")
    v = float(m.group(1)) * _UNITS[m.group(2)]
    if v <= 0:
        raise UserError(f"{what}: must be positive")
    return int(v) if v.is_integer() else v


def kind_of(magic: bytes) -> str:
    if magic.startswith(GZIP_MAGIC):
        return "gzip"
    if magic.startswith(ZSTD_MAGIC):
        return "zstd"
    if magic.startswith(XZ_MAGIC):
        return "xz"
    return "plain"


def _xz_errors() -> tuple:
    """lzma's error, once xz input has imported lzma (no xz data was read before that)."""
    lzma = sys.modules.get("lzma")
    return (lzma.LZMAError,) if lzma is not None else ()


class _Decoder:
    """One compressed stream's members/frames, decompressed at most `window` bytes at a time."""

    def __init__(self, kind: str):
        self.kind = kind
        self.obj = self._new()
        self.started = False  # a member is open (for truncation checks)

    def _new(self):
        if self.kind == "gzip":
            return zlib.decompressobj(31)
        if self.kind == "xz":
            import lzma  # here: only xz input needs it (a record's own recording is plain text)

            return lzma.LZMADecompressor()
        return zstandard.ZstdDecompressor().decompressobj()

    def feed(self, data: bytes, window: int) -> tuple[bytes, bytes]:
        """Decompress some of `data`; returns (output, input not consumed yet)."""
        o = self.obj
        if self.kind == "gzip":
            out = o.decompress(data, window)
            self.started = not o.eof
            rest = o.unconsumed_tail
            if o.eof:
                rest = self._next_member(o.unused_data)
            elif not rest and len(out) >= window:
                rest = _MORE  # output held back inside zlib
            return out, rest
        if self.kind == "xz":
            out = o.decompress(data, window)
            self.started = not o.eof
            if o.eof:
                return out, self._next_member(o.unused_data)
            return out, b"" if o.needs_input else _MORE
        piece, rest = data[:ZSTD_FEED], data[ZSTD_FEED:]
        out = o.decompress(piece)
        self.started = not o.eof
        if o.eof:
            return out, self._next_member(o.unused_data) + rest
        return out, rest

    def _next_member(self, unused: bytes) -> bytes:
        """After one member ends: the next one starts, or only zero padding may follow."""
        self.obj = self._new()
        if unused.strip(b"\0") == b"":  # nothing, or only padding
            return b""
        self.started = True
        return unused


_MORE = b"\0more"  # marker: the decoder holds output back; call again with no new input


class BoundedRaw(io.RawIOBase):
    """The decompressed bytes of `f` (kind: plain, gzip, zstd or xz), with the caps of `limits`."""

    def __init__(self, f, kind: str, name: str, limits: Limits):
        self.f, self.kind, self.name, self.limits = f, kind, name, limits
        self.decoder = None if kind == "plain" else _Decoder(kind)
        self.pending = memoryview(b"")
        self.rest = b""
        self.produced = 0
        self.truncated = False
        self.eof = False
        self.cpu0 = time.thread_time()
        self._checks = 0

    def readable(self):
        return True

    def seekable(self):
        """Plain bytes of a seekable file can be read again (a source's second pass); decompressed ones cannot."""
        return self.decoder is None and self.f.seekable()

    def tell(self) -> int:
        if not self.seekable():
            raise io.UnsupportedOperation("tell")
        return self.f.tell()

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if not self.seekable():
            raise io.UnsupportedOperation("seek")
        self.produced = self.f.seek(pos, whence)  # bytes read again are not counted twice against the cap
        return self.produced

    def check(self):
        """The CPU and cancel caps; called as data is read, so parsing is covered too."""
        lim = self.limits
        if lim.cancelled is not None and lim.cancelled():
            raise Cancelled(f"{self.name}: import cancelled (the client went away)")
        if time.thread_time() - self.cpu0 > lim.max_cpu_s:
            raise LimitExceeded(f"{self.name}: import took more than {lim.max_cpu_s:g} s of CPU time "
                                f"(cap: {ENV['max_cpu_s']})")

    def readinto(self, b) -> int:
        self.check()
        if self.decoder is None:
            n = self.f.readinto(b)
            self._count(n)
            return n
        while not self.pending and not self.eof:
            self._fill()
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def _count(self, n: int):
        self.produced += n
        cap = self.limits.bytes_cap(self.decoder is not None)
        if cap is not None and self.produced > cap:
            what = "decompresses to" if self.decoder is not None else "is"
            raise LimitExceeded(f"{self.name}: {what} more than {cap:,} bytes (cap: {ENV['max_decompressed']} "
                                f"or --max-bytes)")

    def _fill(self):
        d = self.decoder
        data = self.rest
        if not data:
            data = self.f.read(READ_IN)
            if not data:
                self.eof = True
                if d.started:
                    if not self.limits.salvage:
                        raise Corrupt(f"{self.name}: truncated {self.kind} data (the stream ends before its end "
                                      f"marker; --salvage imports what was readable)")
                    self.truncated = True
                return
        if data is _MORE:
            data = b""
        try:
            out, self.rest = d.feed(data, WINDOW)
        except (zlib.error, zstandard.ZstdError, EOFError, *_xz_errors()) as e:
            if self.limits.salvage and self.produced:
                self.truncated, self.eof = True, True
                return
            raise Corrupt(f"{self.name}: corrupt {self.kind} data ({str(e).splitlines()[0] if str(e) else e})") \
                from None
        if out:
            self._count(len(out))
            self.pending = memoryview(out)


_DATA = itemgetter(2)  # a blob's compressed bytes


def capped_graphs(graphs, limits: Limits, input_bytes: int, name: str):
    """`graphs` (EncodedGraphs or GraphRecords) until they go over the per-file caps: how many graphs
    and how many stored bytes per input byte (a few KB of zstd must not become a huge database)."""
    cap = limits.stored_cap(input_bytes)
    most = limits.graphs_cap(input_bytes)
    stored = 0
    for n, g in enumerate(graphs, 1):
        if limits.cancelled is not None and limits.cancelled():  # between graphs too, not only while reading
            raise Cancelled(f"{name}: import cancelled (the client went away)")
        if n > most:
            raise LimitExceeded(f"{name}: more than {most:,} graphs from {input_bytes:,} input bytes (cap: "
                                f"{ENV['max_graphs']} = {limits.max_graphs:,}, and {limits.graphs_per_kib:g} per KiB "
                                f"above {limits.min_graphs:,})")
        blobs = getattr(g, "blobs", None)
        stored += (len(g.strings) + sum(map(len, map(_DATA, blobs)))) if blobs is not None else 16 * len(g.events)
        if stored > cap:
            raise LimitExceeded(f"{name}: would store more than {cap:,} bytes from {input_bytes:,} input bytes "
                                f"(cap: {ENV['max_amplification']} = {limits.max_amplification:g} stored bytes per "
                                f"input byte above {limits.min_stored >> 20} MiB)")
        yield g
