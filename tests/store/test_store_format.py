"""The store's layout versions: format 2 keeps a graph's columns in its own row; a format-1 store (a row per
column) opens, is read exactly as before, takes new graphs in the new layout, and says so in its version,
so an older alloctrace refuses it instead of missing columns."""
import sqlite3

import pytest

from alloctrace.traces.errors import UserError
from alloctrace.traces.store.store import STORE_FORMAT, Store, open_store, pack_blobs, unpack_blobs

from test_store import _trace

# the format-1 tables as that version created them (the reference the upgrade starts from)
FORMAT_1 = """
CREATE TABLE store_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE traces (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL, source TEXT NOT NULL, generation TEXT NOT NULL, profile TEXT,
    created TEXT NOT NULL, tags TEXT NOT NULL, extra TEXT NOT NULL, format_version INTEGER NOT NULL);
CREATE TABLE graphs (
    trace_id TEXT NOT NULL REFERENCES traces(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL, role TEXT NOT NULL, n_events INTEGER NOT NULL,
    max_size INTEGER, buffer_size INTEGER, oom TEXT, consistent INTEGER, extra TEXT NOT NULL,
    strings BLOB NOT NULL, PRIMARY KEY (trace_id, idx));
CREATE TABLE columns (
    trace_id TEXT NOT NULL, graph_idx INTEGER NOT NULL, name TEXT NOT NULL, dtype TEXT NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (trace_id, graph_idx, name),
    FOREIGN KEY (trace_id, graph_idx) REFERENCES graphs(trace_id, idx) ON DELETE CASCADE);
"""


@pytest.mark.parametrize("blobs", [
    [],
    [("kind", "|i1", b"")],
    [("size", "<i8", b"\x00" * 70000), ("tensor", "<i4", bytes(range(256)) * 3), ("graph", "|i1", b"\x01")],
])
def test_packed_columns_round_trip(blobs):
    back = unpack_blobs(pack_blobs(blobs))
    assert [(n, d, bytes(x)) for n, d, x in back] == blobs


def format_1_copy(src: Store, path) -> None:
    """`src`'s traces written into a new database in format 1's layout, a row per column."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.executescript(FORMAT_1)
    db.execute("BEGIN")
    db.execute("INSERT INTO store_info VALUES ('format_version', '1')")
    for row in src.db.execute("SELECT id, name, source, generation, profile, created, tags, extra, format_version "
                              "FROM traces"):
        db.execute("INSERT INTO traces (id, name, source, generation, profile, created, tags, extra, format_version) "
                   "VALUES (?,?,?,?,?,?,?,?,?)", row)
    for *row, packed in src.db.execute("SELECT trace_id, idx, role, n_events, max_size, buffer_size, oom, "
                                       "consistent, extra, strings, packed FROM graphs"):
        db.execute("INSERT INTO graphs VALUES (?,?,?,?,?,?,?,?,?,?)", row)
        db.executemany("INSERT INTO columns VALUES (?,?,?,?,?)",
                       [(row[0], row[1], name, dtype, bytes(data)) for name, dtype, data in unpack_blobs(packed)])
    db.execute("COMMIT")
    db.close()


def test_new_graphs_keep_their_columns_in_their_own_row(tmp_path):
    store = open_store(tmp_path / "s")
    tid = store.add_trace(*_trace(graphs=3))
    assert store.db.execute("SELECT count(*) FROM columns").fetchone() == (0,)
    assert store.db.execute("SELECT count(*), count(packed) FROM graphs").fetchone() == (3, 3)
    assert store.db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone() == (str(STORE_FORMAT),)
    meta, recs = _trace(graphs=3)
    assert [store.graph(tid, g).events for g in range(3)] == [r.events for r in recs]


def test_a_format_1_store_is_read_as_before_and_upgraded(tmp_path):
    new = open_store(tmp_path / "new")
    tid = new.add_trace(*_trace(graphs=2))
    (tmp_path / "old").mkdir()
    format_1_copy(new, tmp_path / "old" / "alloctrace.db")

    old = open_store(tmp_path / "old")  # opening upgrades the layout, keeping every row
    assert old.db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone() == (str(STORE_FORMAT),)
    assert old.db.execute("SELECT count(*), count(packed) FROM graphs").fetchone() == (2, 0)
    for g in range(2):
        assert old.graph(tid, g) == new.graph(tid, g)
        got, want = old.columns(tid, g), new.columns(tid, g)
        assert got.keys() == want.keys() and all((got[k] == want[k]).all() for k in got)
    tid2 = old.add_trace(*_trace(name="later", graphs=1))  # a new graph in the new layout, beside the old ones
    assert old.db.execute("SELECT count(packed) FROM graphs WHERE trace_id=?", (tid2,)).fetchone() == (1,)
    assert old.graph(tid2, 0).events == _trace(graphs=1)[1][0].events
    old.delete(tid)
    assert old.db.execute("SELECT count(*) FROM columns").fetchone() == (0,)
    assert [t["id"] for t in old.list()] == [tid2]
    old.close()
    again = open_store(tmp_path / "old")  # opening an upgraded store changes nothing
    assert [t["id"] for t in again.list()] == [tid2]


def test_a_store_of_a_newer_format_is_refused(tmp_path):
    store = open_store(tmp_path / "s")
    store.db.execute("UPDATE store_info SET value=? WHERE key='format_version'", (str(STORE_FORMAT + 1),))
    store.close()
    with pytest.raises(UserError, match=f"has format {STORE_FORMAT + 1}; this alloctrace reads up to {STORE_FORMAT}"):
        open_store(tmp_path / "s")
