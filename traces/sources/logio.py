"""Open an input (a path or a binary stream; plain, gzip, zstd or xz) decompressed, memory bounded.

`LogReader` hands out the decompressed bytes (`binary`, `head`) to whatever
reads them, or text lines for text formats. Decompression is incremental with a
bounded output window and capped (bounded_io.Limits: decompressed bytes, CPU time,
cancel). Bad input (missing paths, directories, empty or binary files, truncated
compressed data, decompression bombs) becomes a one-line UserError, never a traceback.
"""
from __future__ import annotations

import io
import os
import zlib
from pathlib import Path
from collections.abc import Iterator

from alloctrace.traces.errors import UserError

from alloctrace.traces.sources.bounded_io import BoundedRaw, Limits, kind_of

MAX_LINE = 1 << 20  # longer lines are read in pieces, so memory stays bounded
SNIFF = 8192
BLOCK = 1 << 20  # decoded characters read at a time
HEAD = 1 << 16  # decompressed bytes a source sees to recognise its format


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


class _Rewound(io.RawIOBase):
    """A stream whose first bytes were read ahead (to look at them) and are handed out again."""

    def __init__(self, head: bytes, rest):
        self.pending, self.rest = head, rest

    def readable(self):
        return True

    def readinto(self, b):
        if not self.pending:
            return self.rest.readinto(b) if hasattr(self.rest, "readinto") else _copy_into(b, self.rest.read(len(b)))
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def _rewind(stream, read: bytes):
    """`stream` as it was before `read` was read from it: seeked back when it can be, else replayed."""
    try:
        if stream.seekable():
            stream.seek(-len(read), io.SEEK_CUR)
            return stream
    except (OSError, ValueError, AttributeError):
        pass
    return io.BufferedReader(_Rewound(read, stream), 1 << 16)


def _copy_into(b, data: bytes) -> int:
    b[:len(data)] = data
    return len(data)


class LogReader:
    """The decompressed bytes of one input (`binary`, starting with `head`) or its text lines;
    `position` is how far into the (compressed) input it has read, `size` its length if known."""

    def __init__(self, src, label: str | None = None, text: bool = True, limits: Limits | None = None):
        if isinstance(src, (str, os.PathLike)):
            self.path = check_path(src)
            self.size = self.path.stat().st_size
            self.file, self.owned = open(self.path, "rb"), True
        else:
            self.path = Path(label or getattr(src, "name", None) or "input")
            self.file, self.owned = src, False
            self.size = _remaining(src)
        if label is not None:
            self.path = Path(label)
        raw = self.file
        magic = raw.read(8)
        raw = _rewind(raw, magic)
        self.kind = kind_of(magic)
        self.bounded = BoundedRaw(raw, self.kind, str(self.path), limits or Limits.from_env())
        binary = io.BufferedReader(self.bounded, 1 << 16)
        self.ended_mid_line = False  # the text's last line has no line break (a cut log)
        self._text = None
        self.head = self._read_head(binary, text)
        self.binary = _rewind(binary, self.head)

    def _read_head(self, binary, text: bool) -> bytes:
        """The first HEAD decompressed bytes; text inputs that are binary data are refused early."""
        try:
            head = b""
            while len(head) < HEAD:
                got = binary.read(HEAD - len(head))
                if not got:
                    break
                head += got
        except (EOFError, OSError, zlib.error) as e:
            self.close()
            raise UserError(f"{self.path}: unreadable {self.kind} data ({_why(e)})") from None
        if not head:
            self.close()
            raise UserError(f"{self.path}: empty {self.kind} data" if self.kind != "plain" else f"{self.path}: empty file")
        if text and (b"\x00" in head[:SNIFF] or _mostly_undecodable(head[:SNIFF])):
            self.close()
            raise UserError(f"{self.path}: {looks_like(head)}, not a trace; {ACCEPTED}")
        return head

    @property
    def text(self):
        if self._text is None:
            self._text = io.TextIOWrapper(self.binary, encoding="utf-8", errors="replace", newline=None)
        return self._text

    @property
    def truncated(self) -> bool:
        """A truncated compressed stream was read as far as it went (Limits.salvage)."""
        return self.bounded.truncated

    @property
    def position(self) -> int:
        try:
            return self.file.tell()
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
        if not self.owned:  # the caller's stream stays open
            if self._text is not None:
                self._text.detach()
                self._text = None
            return
        try:
            self.file.close()
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


def _remaining(stream) -> int:
    """Bytes left in a seekable stream (0 when it cannot tell)."""
    try:
        here = stream.tell()
        end = stream.seek(0, io.SEEK_END)
        stream.seek(here)
        return end - here
    except (OSError, ValueError, AttributeError):
        return 0


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


ACCEPTED = ("accepted: a ggml log with AT_PRINTF lines (text), an alloctrace JSON Lines export, or a PyTorch "
            "memory snapshot (the .pickle of torch.cuda.memory._dump_snapshot); plain, .gz, .zst or .xz")

# what a refused binary file is, by its first bytes (the formats people drop by mistake)
_SIGNATURES = ((b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
               (b"%PDF", "a PDF document"), (b"PK\x03\x04", "a zip archive"), (b"\x7fELF", "a program (ELF)"),
               (b"SQLite format 3\x00", "an SQLite database"), (b"BZh", "bzip2 data (not a compression alloctrace reads)"),
               (b"\x80", "a Python pickle that is not a PyTorch memory snapshot"))


def looks_like(head: bytes) -> str:
    """What binary data is, in words: 'a PNG image', ..., else 'binary data'."""
    return next((what for magic, what in _SIGNATURES if head.startswith(magic)), "binary data")


def _mostly_undecodable(head: bytes) -> bool:
    if not head:
        return False
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") > len(text) // 20 + 1
