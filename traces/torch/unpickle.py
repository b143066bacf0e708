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
import pickle

from alloctrace.errors import UserError

DEFAULT_MAX_BYTES = 2 << 30  # decompressed pickle bytes read at most (memory: about 5-6x this)


class SnapshotError(UserError):
    """The file is not a plain PyTorch memory snapshot (or is one we refuse to read)."""


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


def load_plain(stream, *, label: str = "pickle", max_bytes: int = DEFAULT_MAX_BYTES):
    """The object a pickle stream describes, built from plain containers and scalars only."""
    reader = io.BufferedReader(CappedReader(stream, max_bytes, label), buffer_size=1 << 20)
    try:
        unpickler = _Refusing(reader)
        unpickler.label = label
        return unpickler.load()
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


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]
