"""An upload that is slow to parse or to write blocks no other request, and is stored whole or not at all."""
from __future__ import annotations

import threading
import time

import pytest

from alloctrace.traces.sources.ggml_log import import_log
from alloctrace.traces.store.store import Store
from test_server import LEGACY_HARNESS, LiveServer, upload


@pytest.fixture()
def live(tmp_path, fixtures):
    with LiveServer(tmp_path / "store") as srv, srv.client() as c:
        first = upload(c, fixtures / LEGACY_HARNESS, name="first")
        assert first.status_code == 201
        yield srv, c, first.json()["traces"][0]["id"]


def held_upload(srv, fixtures, name):
    """Start an upload in a thread; returns (thread, result holder)."""
    result = {}

    def run():
        with srv.client() as cc:
            result["response"] = upload(cc, fixtures / LEGACY_HARNESS, name=name)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def reads_answer(c, tid):
    """Requests that need the store and the event loop."""
    assert c.get("/api/traces", timeout=30).status_code == 200
    assert c.get(f"/api/traces/{tid}", timeout=30).status_code == 200
    assert c.get(f"/api/traces/{tid}/graphs/1/memory-map", timeout=30).status_code == 200
    assert c.get(f"/api/traces/{tid}/graphs/1/state", params={"event": 5}, timeout=30).status_code == 200
    return [t["name"] for t in c.get("/api/traces", timeout=30).json()["traces"]]


def test_reads_answer_while_an_upload_is_parsing(live, fixtures, monkeypatch):
    srv, c, tid = live
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the parse is held in this process (patched below)
    started, release = threading.Event(), threading.Event()
    original = import_log.LogImport.encoded

    def slow_records(self):
        records = original(self)
        yield next(records)  # held between two graphs: half parsed
        started.set()
        assert release.wait(60)
        yield from records

    monkeypatch.setattr(import_log.LogImport, "encoded", slow_records)
    t, result = held_upload(srv, fixtures, "slow parse")
    assert started.wait(30)
    names = reads_answer(c, tid)
    assert "slow parse" not in names and not release.is_set() and "response" not in result
    release.set()
    t.join(60)
    assert result["response"].status_code == 201
    assert "slow parse" in [x["name"] for x in c.get("/api/traces").json()["traces"]]


def test_reads_answer_while_an_upload_transaction_is_open(live, fixtures, monkeypatch):
    """Blocked inside the import's transaction: readers see the last committed state, not half a trace."""
    srv, c, tid = live
    started, release = threading.Event(), threading.Event()
    original = Store._insert_graphs

    def slow_insert_graphs(db, rows):  # graph rows written, the transaction still open
        original(db, rows)
        if rows:
            started.set()
            assert release.wait(60)

    monkeypatch.setattr(Store, "_insert_graphs", staticmethod(slow_insert_graphs))
    t, result = held_upload(srv, fixtures, "slow write")
    assert started.wait(30)
    names = reads_answer(c, tid)
    assert names == ["first"] and "response" not in result
    release.set()
    t.join(60)
    assert result["response"].status_code == 201
    assert sorted(x["name"] for x in c.get("/api/traces").json()["traces"]) == ["first", "slow write"]


def test_a_failed_upload_beside_a_slow_one_leaves_both_right(live, fixtures, tmp_path, monkeypatch):
    srv, c, tid = live
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the parse is held in this process (patched below)
    started, release = threading.Event(), threading.Event()
    original = import_log.LogImport.encoded

    def slow_records(self):
        if self.label != "bad.log":
            started.set()
            assert release.wait(60)
        yield from original(self)

    monkeypatch.setattr(import_log.LogImport, "encoded", slow_records)
    t, result = held_upload(srv, fixtures, "slow")
    assert started.wait(30)
    bad = tmp_path / "bad.log"
    bad.write_text("bad: no allocator lines here\n" * 10)
    r = upload(c, bad)
    assert r.status_code == 400 and "bad.log" in r.json()["detail"]
    release.set()
    t.join(60)
    assert result["response"].status_code == 201
    assert sorted(x["name"] for x in c.get("/api/traces").json()["traces"]) == ["first", "slow"]


def test_imports_run_on_threads_of_their_own(live, fixtures, monkeypatch):
    """More uploads held in their parse than the imports have threads: the reads still answer (imports never
    hold the reads' threads), and at most IMPORT_THREADS imports run at once (the rest wait their turn)."""
    from alloctrace.server.threads import IMPORT_THREADS, REQUEST_THREADS

    srv, c, tid = live
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the parse is held in this process (patched below)
    release, lock = threading.Event(), threading.Lock()
    running, most = [0], [0]
    original = import_log.LogImport.encoded

    def held_records(self):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            assert release.wait(60)
            yield from original(self)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(import_log.LogImport, "encoded", held_records)
    held = [held_upload(srv, fixtures, f"held {i}") for i in range(max(REQUEST_THREADS, IMPORT_THREADS) + 2)]
    for _ in range(300):
        if running[0] == IMPORT_THREADS:
            break
        time.sleep(0.05)
    assert running[0] == IMPORT_THREADS
    assert reads_answer(c, tid) == ["first"]
    assert most[0] == IMPORT_THREADS  # the others are queued, not parsing
    release.set()
    for t, result in held:
        t.join(60)
        assert result["response"].status_code == 201
    assert len(c.get("/api/traces").json()["traces"]) == len(held) + 1
