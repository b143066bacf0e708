"""PostgreSQL's quick paths against the general ones and against SQLite.

The one-statement write (Store._add_at_once over PostgresBackend.insert_at_once: a write of a few traces as
one statement, a transaction of its own) against the pipelined write it stands in for and against SQLite:
the same rows of every table, byte for byte, in the same order; the generation moved once a write; a write
past BATCH_BYTES goes the pipelined way without encoding a graph twice. Long text values (a recording's
extras) are compressed with lz4 where the server has it, and read back the same. Its arrays (pg_arrays.py)
are what psycopg's own adaptation sends; it locks the generation's row after its rows, as the pipelined
write does. Opening a store at the current format is one read of two
statements (no transaction, nothing written); a missing table or an older format is still found.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from alloctrace.traces.sources import read_file
from alloctrace.traces.store import store as store_module
from alloctrace.traces.store.migrations import COLUMN_TYPES
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store

from test_store import _events, _trace

RECORDING = Path(__file__).resolve().parents[1] / "data" / "compare" / "tiny-llama-fa-off.atrec.gz"
CREATED = "2026-01-02T03:04:05+00:00"


def _writes() -> list[list[tuple]]:
    """Writes of several kinds: GraphRecords with and without oom / consistent / sizes, a real recording's
    encoded graphs (10 KB extras), a trace without graphs, text past ASCII, flags in the extras."""
    first, recs = _trace("ü ✓ first", n=300, graphs=3)
    first.id, first.created, first.tags = "0000aaaa", CREATED, ["commit=a", "model=x"]
    recs[2].max_size, recs[2].consistent, recs[2].extra = None, None, {"incomplete": True, "note": "é"}
    recorded = read_file(RECORDING)
    for k, t in enumerate(recorded):
        t.meta.id, t.meta.created = f"0000bb{k:02x}", CREATED
    empty = TraceMeta("no graphs", "test", "ggml-head", id="0000cccc", created=CREATED, extra={"truncated": True})
    last = TraceMeta("last", "test", "ggml-head", id="0000dddd", created=CREATED)
    return [[(first, recs, "sha256:one"), *[(t.meta, t.graphs, "sha256:two") for t in recorded],
             (empty, [], None)],
            [(last, [GraphRecord(0, "eval", _events(120), max_size=1 << 40, buffer_size=7)], None)]]


def _rows(store) -> dict[str, list[tuple]]:
    """Every row of the tables a write fills, bytes as bytes, in insertion order (traces by seq)."""
    out = {}
    with store._snapshot() as db:
        for table, order in (("traces", "seq"), ("graphs", "trace_id, idx"), ("store_info", "key")):
            cols = ", ".join(COLUMN_TYPES[table])
            out[table] = [tuple(bytes(v) if isinstance(v, (bytes, memoryview)) else v for v in r)
                          for r in db.execute(f"SELECT {cols} FROM {table} ORDER BY {order}")]
    return out


def _spy(store, name: str) -> list:
    """Calls of one method of the store (or of its backend, `_be.NAME`), counted."""
    owner = store._be if name.startswith("_be.") else store
    attr = name.removeprefix("_be.")
    real, calls = getattr(owner, attr), []

    def spied(*args):
        calls.append(args)
        return real(*args)
    setattr(owner, attr, spied)
    return calls


def test_one_statement_stores_the_rows_of_the_pipelined_write_and_of_sqlite(tmp_path, pg_url, pg_admin,
                                                                                monkeypatch):
    from pgcluster import drop_database, new_database

    urls = [pg_url, new_database(pg_admin), new_database(pg_admin)]
    try:
        lite, fast, pipelined, split = open_store(tmp_path / "s"), *(open_store(u) for u in urls)
        at_once = _spy(fast, "_be.insert_at_once")
        pipelined._be.insert_at_once = None  # the write as it was: BEGIN, an INSERT each, COMMIT, pipelined
        split_at_once, encoded = _spy(split, "_be.insert_at_once"), _spy(split, "_graph_row")
        answers = {}
        for name, store in (("sqlite", lite), ("fast", fast), ("pipelined", pipelined), ("split", split)):
            with monkeypatch.context() as m:
                if name == "split":
                    m.setattr(store_module, "BATCH_BYTES", 20_000)  # past it half way through the first write
                answers[name] = [store.add_traces_summarised(w) for w in _writes()]
        assert len(at_once) == 2 and [c[0][0][2][0][0] for c in split_at_once] == ["0000dddd"]  # the second only
        assert len(encoded) == sum(len(g) for w in _writes() for _, g, _ in w)  # each graph encoded once
        rows = {name: _rows(s) for name, s in (("sqlite", lite), ("fast", fast), ("pipelined", pipelined),
                                                ("split", split))}
        assert rows["fast"] == rows["sqlite"] == rows["pipelined"] == rows["split"]
        assert [t[:2] for t in rows["fast"]["traces"]] == [(1, "0000aaaa"), (2, "0000bb00"), (3, "0000cccc"),
                                                           (4, "0000dddd")]
        assert len(rows["fast"]["graphs"]) == 3 + 5 + 1 and dict(rows["fast"]["store_info"])["generation"] == "2"
        assert answers["fast"] == answers["sqlite"] == answers["pipelined"] == answers["split"]
        assert answers["fast"] == [fast.summaries([s["id"] for s in w]) for w in answers["fast"]]
        with fast._snapshot() as db:  # the recording's 10 KB extras: lz4 where the server has it, else pglz
            (lz4,) = db.execute("SELECT count(*) FROM pg_settings WHERE name = 'default_toast_compression' AND "
                                "'lz4' = ANY(enumvals)").fetchone()
            kinds = {r[0] for r in db.execute("SELECT pg_column_compression(extra) FROM graphs WHERE "
                                              "length(extra) > 4000")}
        assert kinds == ({"lz4"} if lz4 else {"pglz"})
    finally:
        for s in (fast, pipelined, split):
            s.close()
        for u in urls[1:]:
            drop_database(pg_admin, u)


def test_a_failed_statement_leaves_nothing(pg_url):
    """Two graphs with one index in a trace: the statement fails (and so does the pipelined write it is
    tried again as); nothing of either is stored and the generation stays."""
    store = open_store(pg_url)
    meta, recs = _trace(n=40)
    keep = store.add_trace(meta, recs)
    gen = store.generation()
    bad, twice = _trace("bad", n=40)
    twice[1].index = 0
    at_once = _spy(store, "_be.insert_at_once")
    with pytest.raises(Exception, match="graphs_pkey"):
        store.add_traces([(bad, twice, None), (_trace("fine")[0], _trace()[1], None)])
    assert len(at_once) == 1
    assert store.trace_ids() == {keep} and store.generation() == gen
    with store._snapshot() as db:
        assert db.execute("SELECT count(*) FROM graphs").fetchone()[0] == len(recs)


@pytest.mark.parametrize("sql_type, values", [
    ("TEXT", ["a", "", None, "ü ✓ \"{,}\\ NULL", "x" * 5000]),
    ("TEXT", [None, None]),
    ("TEXT", []),
    ("BIGINT", [0, -1, None, (1 << 63) - 1, -(1 << 63), 1 << 40]),
    ("BIGINT", []),
    ("BYTEA", [b"", b"\x00\xff" * 3000, None]),
])
def test_arrays_are_what_psycopg_sends_and_read_back_the_same(pg_url, sql_type, values):
    """pg_arrays against psycopg's own adaptation of the same list: the server reads the same array (its
    binary form, array_send, byte for byte) and the values come back as given."""
    import psycopg

    from alloctrace.traces.store.pg_arrays import array, register

    with psycopg.connect(pg_url) as conn:
        register(conn)
        ours = conn.execute(f"SELECT array_send(%b::{sql_type}[]), %b::{sql_type}[]",
                            [array(values, sql_type), array(values, sql_type)]).fetchone()
        theirs = conn.execute(f"SELECT array_send(%s::{sql_type}[])", [values]).fetchone()
    assert bytes(ours[0]) == bytes(theirs[0])
    assert [bytes(v) if isinstance(v, memoryview) else v for v in ours[1]] == values


@pytest.mark.parametrize("change", ["DROP TABLE memmap_lod", "DROP TABLE store_info",
                                    "UPDATE store_info SET value = '2' WHERE key = 'format_version'",
                                    "DELETE FROM store_info WHERE key = 'format_version'"])
def test_opening_finds_a_missing_table_or_an_older_format(pg_url, change, monkeypatch):
    import psycopg

    from alloctrace.traces.store.postgres import PostgresBackend

    store = open_store(pg_url)
    tid = store.add_trace(*_trace())
    store.close()

    def no_transaction(*args, **kwargs):
        raise AssertionError("opening a current store ran a transaction")
    with monkeypatch.context() as m:  # a current store: two statements, no transaction, nothing written
        m.setattr(PostgresBackend, "_transaction", no_transaction)
        opened = open_store(pg_url)
        assert not opened.read_only and opened._be._current("3") is True
        opened.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(change)
    again = open_store(pg_url)  # the table made again, or the format set: the store opens as before
    assert again.trace_ids() == {tid} and not again.read_only
    with again._snapshot() as db:
        assert db.execute("SELECT value FROM store_info WHERE key = 'format_version'").fetchone() == ("3",)
        assert db.execute("SELECT count(*) FROM memmap_lod").fetchone() == (0,)
    again.close()


def test_the_generations_row_is_locked_after_the_rows(pg_url):
    """A write waiting for another transaction's uncommitted trace of the same id holds no lock on the
    generation's row yet (the pipelined write bumps it last too): two writers never wait for each other
    in a circle. Once the other rolls back, the write keeps the id."""
    import threading

    import psycopg

    store = open_store(pg_url)
    store.add_trace(*_trace())
    with psycopg.connect(pg_url) as other, psycopg.connect(pg_url, autocommit=True) as probe:
        other.execute("INSERT INTO traces (id, name, source, generation, created, tags, extra, format_version) "
                      "VALUES ('0000eeee', 'x', 'x', '', 'x', '[]', '{}', 1)")  # uncommitted
        meta, recs = _trace("waits")
        meta.id = "0000eeee"
        at_once, got = _spy(store, "_be.insert_at_once"), []
        writer = threading.Thread(target=lambda: got.append(store.add_trace(meta, recs)))
        writer.start()
        for _ in range(200):  # until the write waits for `other`
            if probe.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                             "wait_event_type = 'Lock' AND query LIKE 'WITH rows0%'").fetchone()[0]:
                break
            threading.Event().wait(0.05)
        else:
            raise AssertionError("the write never waited")
        probe.execute("BEGIN")
        probe.execute("SELECT value FROM store_info WHERE key = 'generation' FOR UPDATE NOWAIT")  # free
        probe.execute("ROLLBACK")
        other.rollback()
        writer.join(30)
    assert got == ["0000eeee"] and len(at_once) == 1
    assert store.summary("0000eeee")["graphs"] == [r.summary() for r in recs]
