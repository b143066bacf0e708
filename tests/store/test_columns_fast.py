"""columns_fast gives byte for byte what the plain columns.encode/pack give: on every real
fixture log's graphs, graph after graph through one ColumnEncoder (so reused columns are
checked too), and on random events with missing values, wide numbers, odd strings and extras."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from alloctrace.allocator.events import KINDS, Event
from alloctrace.traces.store.columns import INT_FIELDS, INT_TYPES, encode, encode_arrays, pack, pack_arrays
from alloctrace.traces.store.columns_fast import ColumnEncoder, encode_fast
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.ggml_log.import_log import LogImport

from conftest import FIXTURES, log_records

ALL_LOGS = sorted(FIXTURES.glob("*/*.log"))


def same_columns(a, b):
    (ca, ta), (cb, tb) = a, b
    assert ta == tb
    assert list(ca) == list(cb)
    for name in ca:
        assert ca[name].dtype == cb[name].dtype, name
        assert ca[name].tobytes() == cb[name].tobytes(), name


def plain_pack(events):
    cols, table = encode(events)
    cols.pop("graph", None)
    return pack(cols, table, bytes)


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fixture_graphs_encode_and_pack_like_the_plain_path(path):
    enc = ColumnEncoder(bytes)  # identity "compression": the bytes themselves are compared
    recs = list(log_records(LogImport(path)))
    for rec in recs + recs[::-1]:  # again backwards: every graph once after a different one
        same_columns(encode_fast(rec.events), encode(rec.events))
        assert enc.pack(rec.events) == plain_pack(rec.events)
        assert pack_arrays(*encode_arrays(rec.events), bytes) == pack(*encode_fast(rec.events), bytes)


def test_a_repeated_graph_reuses_its_columns(fixtures):
    rec = next(iter(log_records(LogImport(fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"))))
    enc = ColumnEncoder(bytes)
    first = enc.pack(rec.events)
    assert enc.reused == 0
    assert enc.pack(rec.events) == first
    assert enc.reused == (len(INT_FIELDS) - 1) + 1  # every integer column but `graph`, and the string section


names = st.one_of(st.none(), st.sampled_from(["node_1", "leaf_2", "", "a\"b", "ü\\", '["x"]']))
ints = st.one_of(st.none(), st.integers(-(1 << 62), 1 << 62), st.integers(-3, 300))
events = st.builds(
    Event, kind=st.sampled_from(sorted(KINDS)), graph=st.integers(0, 3), tensor=names, op=names, size=ints,
    offset=ints, addr=ints, block=ints, n_free=st.one_of(st.none(), st.integers(0, 1 << 40)), parent=names,
    srcs=st.one_of(st.none(), st.lists(names, max_size=3)),
    extra=st.one_of(st.just({}), st.dictionaries(st.sampled_from(["from", "b", "ä"]), st.integers(-5, 5))))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(events, max_size=12), min_size=1, max_size=4))
def test_random_events_encode_and_pack_like_the_plain_path(graphs):
    enc = ColumnEncoder(bytes)
    for evs in graphs + graphs:
        same_columns(encode_fast(evs), encode(evs))
        assert enc.pack(evs) == plain_pack(evs)
        assert pack_arrays(*encode_arrays(evs), bytes) == pack(*encode_fast(evs), bytes)  # numpy-free = numpy


def test_numbers_beyond_int64_fail_like_the_plain_path():
    evs = [Event("alloc", size=1 << 64), Event("free", size=None)]
    with pytest.raises(UserError) as plain:
        encode(evs)
    with pytest.raises(UserError) as fast:
        encode_fast(evs)
    assert str(fast.value) == str(plain.value)


def test_the_string_table_is_json_of_the_plain_table():
    evs = [Event("exec", tensor="n", srcs=["a", None]), Event("alloc", tensor="a", extra={"from": 1})]
    strings, _ = ColumnEncoder(bytes).pack(evs)
    assert json.loads(strings) == encode(evs)[1]
    assert np.array_equal(encode_fast(evs)[0]["srcs"], encode(evs)[0]["srcs"])


def test_the_numpy_free_integer_types_are_numpys():
    """encode_arrays names each column's type as numpy does and bounds it as numpy's iinfo does: the store
    reads its bytes back with numpy."""
    for (dt, code, lo, hi), np_type in zip(INT_TYPES, (np.int8, np.int16, np.int32, np.int64)):
        assert dt == np.dtype(np_type).str
        assert (lo, hi) == (int(np.iinfo(np_type).min), int(np.iinfo(np_type).max))
        assert np.dtype(dt).itemsize == __import__("array").array(code).itemsize


def test_writing_a_recording_into_the_store_does_not_import_numpy(tmp_path):
    """A sweep's workers read, replay and store recordings without numpy (its import alone costs more than
    a dry run of a small model)."""
    import subprocess
    import sys
    from pathlib import Path

    rec = next(Path(__file__).parents[1].joinpath("data", "record").rglob("*.atrec"))
    probe = f"""
import sys
from alloctrace.traces.sources.record.source import SOURCE
from alloctrace.traces.sources import store_traces
from alloctrace.traces.store.store import open_store
with open({str(rec)!r}, "rb") as f:
    traces = SOURCE.read(f, filename="r.atrec", name="r")
out = store_traces(open_store({str(tmp_path / "s")!r}), traces)
print(len(out), "numpy" in sys.modules)
"""
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert int(got[0]) >= 1 and got[1] == "False", got


@settings(max_examples=60, deadline=None)
@given(st.lists(events, max_size=20))
def test_packed_events_decode_without_numpy_as_with_it(evs):
    from alloctrace.traces.store.columns import decode_arrays, decode_events

    strings, blobs = pack_arrays(*encode_arrays(evs), bytes)
    assert decode_arrays(len(evs), blobs, strings, bytes) == evs
    cols, table = encode(evs)
    assert decode_events(len(evs), cols, table) == evs
