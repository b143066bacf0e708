"""The store's contract: atomic adds, exact round trips, columns, ids, resolution, concurrency."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import NotFound, open_store, store_dir


def _events(n, graph=0):
    out = []
    for i in range(n):
        k = ("alloc", "free", "exec", "reuse")[i % 4]
        out.append(Event(k, graph=graph, tensor=f"t{i % 97}" if i % 13 else "", op="ADD" if k == "exec" else None,
                         size=(i * 32) % 100000 if k in ("alloc", "free") else None,
                         offset=i * 16 if k == "alloc" else None, block=-1 if i % 5 == 0 else (i % 3),
                         addr=0x7F0000000000 + i if i % 7 == 0 else None,
                         srcs=[f"t{i}", None] if k == "exec" else None,
                         extra={"g": i, "n": 1} if i % 11 == 0 else {}))
    return out


def _trace(name="t", n=50, graphs=2):
    meta = TraceMeta(name=name, source="test", generation="ggml-head", tags=["a", "b"])
    recs = [GraphRecord(index=g, role="eval", events=_events(n, g), max_size=1000 + g, buffer_size=2048,
                        oom={"tensor": "x", "needed": 5, "largest_available": 4} if g else None, consistent=bool(g))
            for g in range(graphs)]
    return meta, recs


@pytest.fixture
def store(tmp_path):
    return open_store(tmp_path / "s")


def test_round_trip_is_exact(store):
    meta, recs = _trace(n=500)
    tid = store.add_trace(meta, recs)
    assert len(tid) == 8 and all(c in "0123456789abcdef" for c in tid)
    for r in recs:
        assert store.events(tid, r.index) == r.events
        g = store.graph(tid, r.index)
        assert (g.role, g.max_size, g.buffer_size, g.oom, g.consistent) == (r.role, r.max_size, r.buffer_size,
                                                                             r.oom, r.consistent)
    s = store.summary(tid)
    assert s["graphs"] == [r.summary() for r in recs]
    assert (s["name"], s["source"], s["generation"], s["tags"]) == ("t", "test", "ggml-head", ["a", "b"])
    assert s["created"]


def test_columns_follow_the_documented_semantics(store):
    meta, recs = _trace(n=200, graphs=1)
    tid = store.add_trace(meta, recs)
    cols = store.columns(tid, 0)
    ev = recs[0].events
    assert cols["i"].tolist() == list(range(200))
    assert cols["kind"].tolist() == [e.kind for e in ev]
    assert cols["size"].tolist() == [-1 if e.size is None else e.size for e in ev]
    assert cols["addr"].tolist() == [-1 if e.addr is None else e.addr for e in ev]
    assert cols["children"].tolist() == [-1] * 200  # never set: all missing
    assert cols["srcs"].tolist() == [e.srcs for e in ev]
    assert cols["extra"].tolist() == [e.extra for e in ev]
    assert all(cols[k].dtype == np.int64 for k in ("size", "offset", "block", "graph"))


def test_large_graph_round_trip(store):
    n = 300_000  # bench/bench_import.py times a 1M-event graph
    ev = [Event("alloc" if i % 2 else "free", tensor=f"node_{i % 5000}", size=4096 + (i % 64) * 32,
                offset=(i * 32) % (1 << 30), block=i % 7) for i in range(n)]
    tid = store.add_trace(TraceMeta("big", "test", "ggml-head"), [GraphRecord(0, "reserve", ev)])
    cols = store.columns(tid, 0)
    assert len(cols["i"]) == n and cols["offset"][-1] == ((n - 1) * 32) % (1 << 30)
    assert cols["tensor"][12345] == "node_2345"
    assert store.summary(tid)["graphs"][0]["n_events"] == n


def test_failed_add_leaves_nothing(store):
    meta, recs = _trace()
    keep = store.add_trace(meta, recs)

    def broken():
        yield recs[0]
        raise UserError("bad line")

    with pytest.raises(UserError):
        store.add_trace(TraceMeta("x", "test", "ggml-head"), broken())

    def interrupted():
        yield recs[0]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.add_trace(TraceMeta("y", "test", "ggml-head"), interrupted())
    assert [s["id"] for s in store.list()] == [keep]
    counts = store.db.execute("SELECT count(*), count(packed) FROM graphs").fetchone()
    assert counts == (2, 2)
    assert store.db.execute("SELECT count(*) FROM graphs WHERE trace_id != ?", (keep,)).fetchone()[0] == 0


def test_ids_resolution_and_not_found(store):
    meta, recs = _trace()
    a = store.add_trace(meta, recs)
    assert store.resolve(a) == (a, None)
    assert store.resolve(f"{a}:1") == (a, 1)
    assert store.resolve(a[:5].upper()) == (a, None)
    for bad in ("zzzz", f"{a}:9", f"{a}:x", "", "0123456789"):
        with pytest.raises(NotFound) as e:
            store.resolve(bad)
        assert isinstance(e.value, KeyError) and isinstance(e.value, UserError)
    with pytest.raises(NotFound):
        store.summary("ffffffff" if a != "ffffffff" else "00000000")
    store.delete(a)
    with pytest.raises(NotFound):
        store.events(a, 0)
    with pytest.raises(NotFound):
        store.delete(a)


def test_list_is_newest_first_and_filters(store):
    ids = [store.add_trace(*_trace(name=f"run {i}", graphs=1)) for i in range(3)]
    assert [s["id"] for s in store.list()] == ids[::-1]
    assert [s["id"] for s in store.list("RUN 1")] == [ids[1]]


def test_store_directory_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOCTRACE_STORE", str(tmp_path / "env"))
    assert store_dir(tmp_path / "explicit") == tmp_path / "explicit"
    assert store_dir() == tmp_path / "env"
    monkeypatch.delenv("ALLOCTRACE_STORE")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert store_dir() == tmp_path / "xdg" / "alloctrace"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert store_dir() == tmp_path / "home" / ".local" / "share" / "alloctrace"
    s = open_store(None)
    assert (tmp_path / "home" / ".local" / "share" / "alloctrace" / "alloctrace.db").is_file()
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_path_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError):
        open_store(tmp_path / "f")


def test_concurrent_writers_and_readers(tmp_path):
    """Threads with their own connections import and read at once; every trace lands whole."""
    path = tmp_path / "s"
    open_store(path)
    errors, ids = [], []

    def writer(k):
        try:
            s = open_store(path)
            for i in range(5):
                ids.append(s.add_trace(*_trace(name=f"w{k}-{i}", n=300)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader():
        try:
            s = open_store(path)
            for _ in range(30):
                for summ in s.list():
                    assert len(summ["graphs"]) == 2
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = open_store(path)
    assert sorted(x["id"] for x in s.list()) == sorted(ids) and len(ids) == 15


def test_threads_sharing_one_store_read_back_the_same_columns(store):
    """A server's thread pool shares one store: columns and lazily read columns decoded in eight threads at once
    are the stored ones, never a checksum failure taken for damage (a zstandard context shared between
    threads restores wrong bytes)."""
    n = 30_000
    ev = [Event("alloc" if i % 2 else "free", tensor=f"node_{i % 3000}", size=4096 + (i % 64) * 32,
                offset=(i * 48) % (1 << 28), block=i % 5) for i in range(n)]
    tid = store.add_trace(TraceMeta("shared", "test", "ggml-head"), [GraphRecord(0, "reserve", ev)])
    want = store.columns(tid, 0)
    errors, start = [], threading.Barrier(8)

    def read():
        try:
            start.wait(30)
            for k in range(6):
                cols = store.columns(tid, 0) if k % 2 else store.lazy_columns(tid, 0)
                assert np.array_equal(cols["offset"], want["offset"]) and cols["tensor"][2999] == "node_2999"
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_concurrent_processes(tmp_path):
    path = tmp_path / "s"
    code = ("import sys; sys.path.insert(0, %r); from test_store import _trace; "
            "from alloctrace.traces.store.store import open_store; s = open_store(%r); "
            "[s.add_trace(*_trace(name='p', n=2000)) for _ in range(4)]") % (os.path.dirname(__file__), str(path))
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    s = open_store(path)
    assert len(s.list()) == 12
    assert all(len(s.events(t["id"], 1)) == 2000 for t in s.list())
