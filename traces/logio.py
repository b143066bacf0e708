"""Open a log (plain, gzip or zstd) as a stream of text lines, memory bounded.

Bad input (missing paths, directories, empty or binary files, truncated
compressed data) becomes a one-line UserError, never a traceback.
"""
from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Iterator

import zstandard

from alloctrace.traces.errors import UserError

MAX_LINE = 1 << 20  # longer lines are read in pieces, so memory stays bounded
SNIFF = 8192
BLOCK = 1 << 20  # decoded characters read at a time
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class _ZstdRaw(io.RawIOBase):
    """A raw stream over zstd frames that notices a truncated last frame."""

    def __init__(self, fileobj):
        self.f = fileobj
        self.dctx = zstandard.ZstdDecompressor()
        self.dobj = self.dctx.decompressobj()
        self.pending = b""
        self.done = False

    def readable(self):
        return True

    def readinto(self, b):
        while not self.pending and not self.done:
            chunk = self.f.read(1 << 20)
            if not chunk:
                if not self.dobj.eof:
                    raise UserError(f"{self.f.name}: truncated zstd data")
                self.done = True
                break
            try:
                out = self.dobj.decompress(chunk)
                while self.dobj.eof and self.dobj.unused_data:
                    rest = self.dobj.unused_data
                    self.dobj = self.dctx.decompressobj()
                    out += self.dobj.decompress(rest)
            except zstandard.ZstdError as e:
                raise UserError(f"{self.f.name}: corrupt zstd data ({e})") from None
            self.pending = out
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def check_path(path) -> Path:
    """The path as a readable regular file, or a UserError saying why not."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such file")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, not a log file")
    if not p.is_file():
        raise UserError(f"{p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise UserError(f"{p}: permission denied")
    if p.stat().st_size == 0:
        raise UserError(f"{p}: empty file")
    return p


class LogReader:
    """Iterates the decoded lines of one log file; `position` is how far into the file it has read."""

    def __init__(self, path):
        self.path = check_path(path)
        self.size = self.path.stat().st_size
        self.raw = open(self.path, "rb")
        magic = self.raw.read(4)
        self.raw.seek(0)
        if magic[:2] == GZIP_MAGIC:
            self.kind = "gzip"
            binary = gzip.GzipFile(fileobj=self.raw, mode="rb")
        elif magic == ZSTD_MAGIC:
            self.kind = "zstd"
            binary = io.BufferedReader(_ZstdRaw(self.raw), 1 << 16)
        else:
            self.kind = "plain"
            binary = self.raw
        self.binary = binary
        self._sniff()
        self.text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline=None)

    def _sniff(self):
        """Refuse binary data early (random bytes, images, archives)."""
        try:
            head = self.binary.peek(SNIFF)[:SNIFF] if hasattr(self.binary, "peek") else b""
        except (EOFError, OSError, zlib.error) as e:
            self.close()
            raise UserError(f"{self.path}: unreadable {self.kind} data ({_why(e)})") from None
        if self.kind != "plain" and not head:
            self.close()
            raise UserError(f"{self.path}: empty {self.kind} data")
        if b"\x00" in head or _mostly_undecodable(head):
            self.close()
            raise UserError(f"{self.path}: binary data, not a text log")

    @property
    def position(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def lines(self) -> Iterator[str]:
        """Lines without their line break; over-long lines come in MAX_LINE pieces."""
        for block in self.blocks():
            yield from block

    def blocks(self) -> Iterator[list[str]]:
        """The lines in lists of about BLOCK characters.

        Reads big decoded blocks and splits them in C: per-line `readline` calls
        cost more than the rest of a fast import. The pieces are exactly what
        `readline(MAX_LINE)` would return, line break removed.
        """
        read = self.text.read
        carry = ""
        try:
            while True:
                block = read(BLOCK)
                if not block:
                    break
                parts = (carry + block).split("\n") if carry else block.split("\n")
                carry = parts.pop()
                if len(carry) > MAX_LINE:  # an unfinished over-long line: hand out its full pieces now
                    cut = len(carry) // MAX_LINE * MAX_LINE
                    if cut == len(carry):
                        cut -= MAX_LINE
                    yield list(_pieces(carry[:cut], False))
                    carry = carry[cut:]
                if parts and max(map(len, parts)) >= MAX_LINE:
                    parts = [piece for line in parts
                             for piece in (_pieces(line, True) if len(line) >= MAX_LINE else (line,))]
                yield parts
                del parts
        except (EOFError, OSError, zlib.error) as e:
            raise UserError(f"{self.path}: truncated or corrupt {self.kind} data ({_why(e)})") from None
        if carry:
            yield list(_pieces(carry, False)) if len(carry) > MAX_LINE else [carry]

    def close(self):
        try:
            self.raw.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _pieces(line: str, ended: bool) -> Iterator[str]:
    """A long line as readline(MAX_LINE) returns it: full pieces, the rest, and an empty
    piece when the line break comes right after a full piece."""
    for i in range(0, len(line), MAX_LINE):
        yield line[i:i + MAX_LINE]
    if ended and len(line) % MAX_LINE == 0:
        yield ""


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _mostly_undecodable(head: bytes) -> bool:
    if not head:
        return False
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > len(text) // 20 + 1
