"""Open a log (plain, gzip, zstd or xz) as a stream of text lines, memory bounded.

Bad input (missing paths, directories, empty or binary files, truncated
compressed data, decompression bombs) becomes a one-line UserError, never a
traceback; the caps are bounded_io.Limits.
"""
from __future__ import annotations

import io
import os
import zlib
from pathlib import Path
from typing import Iterator

from alloctrace.errors import UserError

from .bounded_io import BoundedRaw, Limits, kind_of

MAX_LINE = 1 << 20  # longer lines are read in pieces, so memory stays bounded
SNIFF = 8192
BLOCK = 1 << 20  # decoded characters read at a time


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

    def __init__(self, path, limits: Limits | None = None):
        self.path = check_path(path)
        self.size = self.path.stat().st_size
        self.raw = open(self.path, "rb")
        magic = self.raw.read(8)
        self.raw.seek(0)
        self.kind = kind_of(magic)
        self.bounded = BoundedRaw(self.raw, self.kind, str(self.path), limits or Limits.from_env())
        self.binary = binary = io.BufferedReader(self.bounded, 1 << 16)
        self.ended_mid_line = False  # the text's last line has no line break (a cut log)
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
    def truncated(self) -> bool:
        """A truncated compressed stream was read as far as it went (Limits.salvage)."""
        return self.bounded.truncated

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
            self.ended_mid_line = True
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
