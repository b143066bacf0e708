"""The fast import path (block reading, line memo, body memo, graph cache, encoded
graphs) stores exactly what the plain path stores: every line parsed on its own,
split one item at a time, every graph replayed and encoded from its Events."""
import tracemalloc

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings, strategies as st

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources import logio
from alloctrace.traces.store.columns import EncodedGraph, encode, pack
from alloctrace.traces.sources.ggml_log.recover_fast import RecoveryCache
from alloctrace.traces.sources.ggml_log.import_log import LogImport, _compressor, detect_generation
from alloctrace.traces.sources import import_paths
from alloctrace.traces.sources.logio import LogReader
from alloctrace.traces.sources.ggml_log.parse_log import LineMemo, own, parse_line
from alloctrace.allocator.profiles import get_profile
from alloctrace.traces.sources.ggml_log.recover import GallocrReplay, LegacyReplay
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.sources.ggml_log.split import Splitter
from alloctrace.traces.store.store import open_store

from conftest import FIXTURES
from test_import_fuzz import OPS, mutate

ALL_LOGS = sorted(FIXTURES.glob("*/*.log"))


def plain_records(path):
    """The importer without any memo or cache: the reference the fast path must match."""
    with LogReader(path) as reader:
        split, drafts = Splitter(), []
        for line in reader.lines():
            d = split.feed(parse_line(line))
            if d is not None:
                drafts.append(d)
        d = split.finish()
        if d is not None:
            drafts.append(d)
    gen = detect_generation(split.features, drafts[0] if drafts else None)
    f = split.features
    replay = LegacyReplay(gen, f.addr_block, f.addr) if get_profile(gen).family == "legacy" else GallocrReplay(gen)
    for d in drafts:
        d.items = own(d.items)  # split items may be shared (blank-line Events)
    recs = [replay.graph(d) for d in drafts]
    for r in recs:
        for e in r.events:
            e.graph = r.index
    return gen, recs


def assert_stored_like_plain(store, tid, path):
    gen, recs = plain_records(path)
    s = store.summary(tid)
    assert s["generation"] == gen
    assert len(s["graphs"]) == len(recs)
    for r in recs:
        got = store.graph(tid, r.index)
        assert (got.role, got.max_size, got.buffer_size, got.oom, got.consistent) == \
            (r.role, r.max_size, r.buffer_size, r.oom, r.consistent)
        assert got.events == r.events


@pytest.mark.parametrize("path", ALL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_repeated_fixture_logs_store_what_the_plain_path_computes(tmp_path, path):
    """Three copies of each real log: the later copies come from the memos and caches."""
    log = tmp_path / "x3.log"
    log.write_bytes(path.read_bytes() * 3)
    store = open_store(tmp_path / "s")
    [tid] = import_paths(store, [log])
    assert_stored_like_plain(store, tid, log)


def test_repeats_are_served_from_the_memos(fixtures, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "1")  # the Python path's memos (the compiled path: test_fastlog.py)
    log = tmp_path / "x4.log"
    log.write_bytes((fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log").read_bytes() * 4)
    imp = LogImport(log)
    graphs, hits = [], []
    for g in imp.encoded():
        graphs.append(g)
        hits.append(imp.cache.hits)
    assert len(graphs) == 24 and all(isinstance(g, EncodedGraph) for g in graphs)
    assert [g.index for g in graphs] == list(range(24))
    # each run is measure + 5 evals (each eval a token longer); the first run is all new,
    # runs 3 and 4 start from the state run 2 started from and repeat it line for line
    assert hits[5] == 0
    assert [b - a for a, b in zip(hits[11:23], hits[12:24])] == [1] * 12
    assert imp.bodies.hits > imp.bodies.misses


def test_a_graph_from_another_allocator_state_is_not_a_hit(fixtures, tmp_path):
    """Same draft, different buffer history: the cache must replay it again."""
    log = fixtures / "head-gallocr" / "gpt-2-alloc_tiny_short.AT.log"
    with LogReader(log) as reader:
        split = Splitter()
        drafts = [d for d in map(split.feed, map(parse_line, reader.lines())) if d is not None]
        drafts.append(split.finish())
    [draft] = [d for d in drafts if d is not None]
    replay = GallocrReplay("ggml-head")
    cache = RecoveryCache(replay, lambda b: b, LineMemo())
    first = cache.graph(draft)
    replay.chunk_sizes = [first.buffer_size * 2]  # a bigger buffer from an earlier, larger plan
    second = cache.graph(draft)
    assert (cache.hits, cache.misses) == (0, 2)
    assert second.buffer_size == first.buffer_size * 2 and second.max_size == first.max_size
    replay.chunk_sizes = [first.buffer_size * 2]
    third = cache.graph(draft)
    assert (cache.hits, cache.misses) == (1, 2)
    assert (third.index, third.buffer_size, third.blobs[1:]) == (2, second.buffer_size, second.blobs[1:])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=st.sampled_from(ALL_LOGS), ops=OPS)
def test_mutated_repeated_logs_store_what_the_plain_path_computes(tmp_path_factory, log, ops):
    """Repeats that differ here and there (a lost line, a changed number) must not be served
    from an earlier copy's results."""
    tmp = tmp_path_factory.mktemp("fast")
    lines = log.read_bytes().splitlines(keepends=True)
    path = tmp / "m.log"
    path.write_bytes(b"".join(lines) + mutate(lines, ops) + b"".join(lines))
    store = open_store(tmp / "s")
    try:
        [tid] = import_paths(store, [path])
    except UserError:
        with pytest.raises(UserError):  # the plain path fails too, reading or encoding
            for rec in plain_records(path)[1]:
                encode(rec.events)
        return
    assert_stored_like_plain(store, tid, path)


def test_events_from_the_line_memo_are_independent(fixtures):
    memo = LineMemo()
    line = "exec: ADD (node_2) <= node_0, node_1"
    a, b = memo(line), memo(line)
    assert a == b == parse_line(line) and a is b  # shared until owned
    mine = own([a])[0]
    mine.srcs.append("x")
    mine.offset = 64
    assert memo(line) == parse_line(line) and mine is not a


def _readline_pieces(path, limit):
    with open(path, encoding="utf-8", errors="replace", newline=None) as f:
        out = []
        while line := f.readline(limit):
            out.append(line[:-1] if line.endswith("\n") else line)
        return out


@pytest.mark.parametrize("data", [b"a\nb\r\nc\rd\n\n\ne", b"x" * 8 + b"\n", b"x" * 8, b"x" * 16 + b"\nq\n",
                                  b"x" * 21 + b"\r\nq", b"y\n" + b"x" * 23 + b"\r", b"abc\r\n" * 9,
                                  b"12345678\n123456789\n1234567\n" * 5])
def test_block_reading_gives_readline_pieces(tmp_path, monkeypatch, data):
    """Lines longer than MAX_LINE come in readline(MAX_LINE) pieces, whatever the block size."""
    path = tmp_path / "l.log"
    path.write_bytes(data)
    monkeypatch.setattr(logio, "MAX_LINE", 8)
    for block in (3, 8, 1 << 20):
        monkeypatch.setattr(logio, "BLOCK", block)
        with LogReader(path) as reader:
            assert list(reader.lines()) == _readline_pieces(path, 8), block


def test_store_takes_encoded_graphs_and_records_alike(tmp_path):
    import zstandard

    events = [Event("alloc", tensor="a", size=64, offset=0, block=-1), Event("exec", op="ADD", tensor="a",
                                                                             srcs=["b", None]),
              Event("free", tensor="a", size=64, n_free_before=1, extra={"k": 1})]
    store = open_store(tmp_path / "s")
    rec = GraphRecord(0, "eval", [Event(**e.to_dict()) for e in events], max_size=64, consistent=True)
    strings, blobs = pack(*encode(events), zstandard.ZstdCompressor(level=3).compress)
    enc = EncodedGraph(index=1, role="eval", n_events=3, max_size=64, buffer_size=None, oom=None, consistent=True,
                       strings=strings, blobs=blobs)
    tid = store.add_trace(TraceMeta("t", "test", "ggml-head"), [rec, enc])
    assert store.events(tid, 1) == events
    assert store.events(tid, 0) == events
    assert [g["n_events"] for g in store.summary(tid)["graphs"]] == [3, 3]
    assert store.graph(tid, 1).summary() == {**store.graph(tid, 0).summary(), "index": 1}


def test_compressed_columns_hold_no_block_of_the_input_size():
    """zstandard's results keep a block as large as their input; the importer holds every
    graph's blobs until they are stored, so each is copied into a block of its own size."""
    compress = _compressor()
    column = bytes(4 << 20)
    tracemalloc.start()
    try:
        blob = compress(column)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert zstandard.ZstdDecompressor().decompress(blob) == column
    assert held < 64 << 10, held  # 4 MB without the copy
