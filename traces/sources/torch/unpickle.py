"""A pickle reader that builds plain data only: a pickle is a program, a snapshot is data.

The C unpickler is used for speed with every way to reach code closed: it never
resolves a global (GLOBAL, STACK_GLOBAL, INST and the extension codes all go
through `find_class`, which refuses), has no persistent loader, and so never
holds a callable for REDUCE, NEWOBJ, OBJ or BUILD to call; those opcodes fail
on the plain values they meet. Whatever fails becomes one `SnapshotError` line.
The decompressed size is capped while reading, before the objects exist.
"""
from __future__ import annotations

import io
import marshal
import pickle

from alloctrace.traces.errors import UserError

CHUNK = 16 << 20  # larger reads are done piece by piece
DEFAULT_MAX_BYTES = 2 << 30  # decompressed pickle bytes read at most (memory: about 5-6x this)


class SnapshotError(UserError):
    """The file is not a plain PyTorch memory snapshot (or is one we refuse to read)."""

    status = 422  # the server's answer: a well-formed upload whose content is refused


class _Refusing(pickle.Unpickler):
    label = "pickle"

    def find_class(self, module, name):
        raise SnapshotError(f"{self.label}: pickle refers to {module}.{name}: refused (a memory snapshot holds "
                            "only plain dicts, lists, tuples, strings and numbers; this pickle would run code)")

    def persistent_load(self, pid):
        raise SnapshotError(f"{self.label}: pickle uses persistent ids: refused (not a plain memory snapshot)")


class CappedReader(io.RawIOBase):
    """Reads from `stream` and fails once more than `limit` bytes came out of it."""

    def __init__(self, stream, limit: int, label: str):
        self.stream, self.limit, self.label, self.n = stream, limit, label, 0

    def readable(self):
        return True

    def readinto(self, b):
        data = self.stream.read(len(b))
        self.n += len(data)
        if self.n > self.limit:
            raise SnapshotError(f"{self.label}: more than {self.limit:,} bytes after decompression; "
                                "raise the limit (ALLOCTRACE_TORCH_MAX_BYTES) to read it")
        b[:len(data)] = data
        return len(data)


class BoundedInput:
    """What the unpickler reads from: a request for more bytes than the cap leaves (a frame or a string
    declaring gigabytes in a few bytes of pickle) fails before anything is allocated for it."""

    def __init__(self, stream, limit: int, label: str):
        self.f = io.BufferedReader(CappedReader(stream, limit, label), buffer_size=1 << 20)
        self.limit, self.label, self.n = limit, label, 0

    def _check(self, n: int) -> None:
        if n > self.limit - self.n:
            raise SnapshotError(f"{self.label}: the pickle asks for {n:,} bytes at offset {self.n:,}, beyond the "
                                f"limit of {self.limit:,} (ALLOCTRACE_TORCH_MAX_BYTES)")

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.limit - self.n + 1
        self._check(n)
        if n <= CHUNK:
            data = self.f.read(n)
        else:  # in pieces, so memory follows the bytes that really arrive, not the size declared
            parts, left = [], n
            while left > 0:
                part = self.f.read(min(left, CHUNK))
                if not part:
                    break
                parts.append(part)
                left -= len(part)
            data = b"".join(parts)
        self.n += len(data)
        return data

    def readinto(self, b) -> int:
        self._check(len(b))
        k = self.f.readinto(b)
        self.n += k
        return k

    def readline(self, size: int = -1) -> bytes:
        line = self.f.readline(self.limit - self.n + 1 if size is None or size < 0 else size)
        self.n += len(line)
        self._check(0)
        return line

    def peek(self, n: int = 0) -> bytes:
        return self.f.peek(n)


def load_plain(stream, *, label: str = "pickle", max_bytes: int = DEFAULT_MAX_BYTES):
    """The object a pickle stream describes, built from plain containers and scalars only."""
    return load_plain_sized(stream, label=label, max_bytes=max_bytes)[0]


def load_plain_sized(stream, *, label: str = "pickle", max_bytes: int = DEFAULT_MAX_BYTES):
    """load_plain's object, and how many pickle bytes it was read from (what its work caps grow with)."""
    reader = BoundedInput(stream, max_bytes, label)
    try:
        unpickler = _Refusing(reader)
        unpickler.label = label
        obj = unpickler.load()
        check_depth(obj, label)
        return obj, reader.n
    except SnapshotError:
        raise
    except (pickle.UnpicklingError, EOFError) as e:
        raise SnapshotError(f"{label}: not a valid pickle ({_short(e) or 'truncated'})") from None
    except (TypeError, AttributeError) as e:  # REDUCE / BUILD / NEWOBJ meeting plain values
        raise SnapshotError(f"{label}: pickle tries to construct objects, refused "
                            f"(only plain containers and scalars are read): {_short(e)}") from None
    except (ValueError, KeyError, IndexError, OverflowError, MemoryError, RecursionError) as e:
        raise SnapshotError(f"{label}: malformed pickle ({type(e).__name__}: {_short(e)})") from None
    except UserError:
        raise
    except Exception as e:  # decompressor errors surface here too
        raise SnapshotError(f"{label}: unreadable ({type(e).__name__}: {_short(e)})") from None


def check_depth(obj, label: str) -> None:
    """A SnapshotError when `obj` nests deeper than marshal's guard (2,000; a real snapshot nests 6 deep):
    hashing, comparing or converting a 200,000-deep tuple recurses in C and kills the process (SIGSEGV).
    marshal walks the containers in C with a depth guard, each shared one once, at about a sixth of the
    unpickling's time (a Python walk took three times as long as the unpickling)."""
    try:
        marshal.dumps(obj)
    except ValueError as e:
        if "deeply nested" in str(e):
            raise SnapshotError(f"{label}: containers nested too deep: refused (a memory snapshot nests 6 deep)") \
                from None
        raise SnapshotError(f"{label}: holds a value that is not plain data: refused ({_short(e)})") from None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]
