"""Columns of rows as PostgreSQL arrays in the binary wire format (what `array_send` writes), for the
one-statement write (postgres.PostgresBackend.insert_at_once): a write passes each column of its rows as
one array parameter.

psycopg adapts a Python list element by element in Python, choosing each list's element type by looking at
its values (ints become int2, int4 or int8 arrays by size, which the server then converts): about 70 us for
the 23 arrays of a trace's write, a tenth of a small trace's write. Here an array is one `b"".join` of its
elements with their lengths, of the type its column has; `ARRAYS` registers them with a connection.
"""
from __future__ import annotations

import struct
from functools import lru_cache

HEAD = struct.Struct("!iiIii")  # dimensions (1), has NULLs, element type, length, lower bound (1)
EMPTY = struct.Struct("!iiI")  # no dimensions, no NULLs, element type
INT8 = struct.Struct("!iq")  # an int8 element: its length (8) and its value
NULL = b"\xff\xff\xff\xff"  # an element's length -1: NULL


class TextArray(bytes):
    oid, element = 1009, 25


class Int8Array(bytes):
    oid, element = 1016, 20


class ByteaArray(bytes):
    oid, element = 1001, 17


ARRAYS = {"TEXT": TextArray, "BIGINT": Int8Array, "BYTEA": ByteaArray}  # by the column's PostgreSQL type


def array(values: list, sql_type: str, encoding: str = "utf-8") -> bytes:
    """`values` (str, int or bytes, or None) as an array of `sql_type` (a key of ARRAYS); text encoded as the
    connection's client encoding."""
    cls = ARRAYS[sql_type]
    if not values:
        return cls(EMPTY.pack(0, 0, cls.element))
    if cls is Int8Array:
        body = [NULL if v is None else INT8.pack(8, v) for v in values]
    else:
        body = []
        for v in values:
            if v is None:
                body.append(NULL)
                continue
            data = v.encode(encoding) if cls is TextArray else v
            body += (len(data).to_bytes(4, "big"), data)
    return cls(HEAD.pack(1, None in values, cls.element, len(values), 1) + b"".join(body))


def register(conn) -> None:
    """A connection sends these arrays as they are, each as its array type."""
    for cls, dumper in _dumpers():
        conn.adapters.register_dumper(cls, dumper)


@lru_cache(maxsize=1)
def _dumpers() -> list[tuple[type, type]]:
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    return [(cls, type(f"{cls.__name__}Dumper", (Dumper,), {"format": Format.BINARY, "oid": cls.oid,
                                                            "dump": lambda self, obj: obj}))
            for cls in ARRAYS.values()]
