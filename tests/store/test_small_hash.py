"""A small input is hashed without OpenSSL (traces/store/blobs.py new_sha256): the digests, and so the import
names and graph checksums stores already hold, are hashlib's SHA-256 at every size."""
from __future__ import annotations

import hashlib
import json
import sys

from alloctrace.traces.sources import input_hash
from alloctrace.traces.store.blobs import SMALL_HASH, checksum, new_sha256


def test_small_and_large_inputs_hash_as_hashlib_does(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "hashlib")  # as in a command that has not loaded it
    assert type(new_sha256(SMALL_HASH - 1)).__module__ != "_hashlib"  # Python's own module
    monkeypatch.delitem(sys.modules, "hashlib", raising=False)
    for size in (0, 1000, SMALL_HASH - 1, SMALL_HASH, 3 * SMALL_HASH + 7):
        data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
        monkeypatch.delitem(sys.modules, "hashlib", raising=False)
        h = new_sha256(size)
        assert (type(h).__module__ == "_hashlib") == (size >= SMALL_HASH)
        h.update(data)
        assert h.hexdigest() == hashlib.sha256(data).hexdigest()
        path = tmp_path / f"in{size}"
        path.write_bytes(data)
        how = json.dumps({"tags": [], "generation": None, "salvage": False}, sort_keys=True).encode()
        assert input_hash(path, {}) == \
            f"sha256:{hashlib.sha256(data).hexdigest()}:{hashlib.sha256(how).hexdigest()[:16]}"


def test_a_graph_checksum_is_the_sha256_of_its_table_length_table_and_columns():
    strings, packed = b"kq-0\0kqv-0", b"\1\2\3" * 100
    want = hashlib.sha256(len(strings).to_bytes(8, "little") + strings + packed).hexdigest()
    assert checksum(strings, packed) == want
