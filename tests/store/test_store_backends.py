"""Both store backends, SQLite and PostgreSQL, under the same tests: the same answers from the store,
every command and every endpoint, the same bytes stored, the same schema version, and safe concurrent
and interrupted imports (`store_ref` in conftest.py gives a directory or a fresh database's URL)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.errors import UserError
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import STORE_FORMAT, NotFound, open_store

from test_store import _events, _trace

DATA = Path(__file__).resolve().parents[1] / "data"
UB8 = DATA / "explain" / "llama-tiny_c512_ub8.head.AT.log.gz"
UB64 = DATA / "explain" / "llama-tiny_c512_ub64.head.AT.log.gz"
SNAPSHOT = DATA / "torch" / "fragmentation.pickle.gz"
ROOT = Path(__file__).resolve().parents[2]


def _count(store, sql: str) -> int:
    with store._snapshot() as db:
        return db.execute(sql).fetchone()[0]


def test_round_trip_list_delete_and_generation(store_ref):
    store = open_store(store_ref)
    meta, recs = _trace(n=600)
    meta.tags = ["old", "commit=a1", "model=tiny"]
    g0 = store.generation()
    tid = store.add_trace(meta, recs)
    other = open_store(store_ref)  # another process's connection sees the write
    assert other.generation() == g0 + 1 and other.generation(wait=False) == g0 + 1
    for r in recs:
        assert other.events(tid, r.index) == r.events
        assert other.graph(tid, r.index).oom == r.oom
    assert other.summary(tid)["graphs"] == [r.summary() for r in recs]
    assert other.meta(tid).tags == ["old", "commit=a1", "model=tiny"]
    assert other.resolve(tid[:4].upper()) == (tid, None) and other.resolve(f"{tid}:1") == (tid, 1)
    second = store.add_trace(TraceMeta("second run", "test", "ggml-head", tags=["commit=b2", "model=tiny"]),
                             [GraphRecord(0, "eval", _events(40), max_size=1 << 33)])  # past 32 bits
    assert [s["id"] for s in other.list()] == [second, tid]
    assert [s["id"] for s in other.list("SECOND")] == [second]
    assert [s["id"] for s in other.list("model=tiny")] == [second, tid]
    assert [s["id"] for s in other.list("model=tiny commit=a1")] == [tid]
    assert [s["id"] for s in other.list(tags=["commit=b2"])] == [second]
    assert other.list(tags=["commit=zz"]) == []
    assert other.summary(second)["graphs"][0]["max_size"] == 1 << 33
    store.delete(tid)
    assert other.generation() == g0 + 3 and other.trace_ids() == {second}
    with pytest.raises(NotFound):
        other.summary(tid)
    with pytest.raises(NotFound):
        other.delete(tid)


def test_a_failed_add_leaves_nothing(store_ref):
    store = open_store(store_ref)
    meta, recs = _trace()
    keep = store.add_trace(meta, recs)
    gen = store.generation()

    def broken():
        yield recs[0]
        raise UserError("bad line")

    with pytest.raises(UserError):
        store.add_trace(TraceMeta("x", "test", "ggml-head"), broken())
    assert [s["id"] for s in store.list()] == [keep] and store.generation() == gen
    assert _count(store, "SELECT count(*) FROM graphs") == 2


def test_a_used_id_is_replaced_and_the_rest_kept(store_ref):
    """A PostgreSQL write does not ask which ids are used (one round trip): a used one fails the INSERT and the
    write runs again, looking them up. Either way, as on SQLite: the trace gets a new id, the others of the
    batch keep theirs, the generation moves once, and nothing of the failed try is left."""
    store = open_store(store_ref)
    meta, recs = _trace(n=40)
    meta.id = "0000abcd"
    assert store.add_trace(meta, recs) == "0000abcd"
    gen = store.generation()
    again, _ = _trace(n=40)
    again.id = "0000abcd"
    other, _ = _trace(n=40)
    other.id = "0000abce"
    ids = store.add_traces([(again, recs, None), (other, list(recs), None)])
    assert ids[0] not in ("0000abcd", "0000abce") and ids[1] == "0000abce"
    streamed, _ = _trace(n=40)
    streamed.id = "0000abce"  # graphs from a generator: the ids are looked up first (no second try possible)
    ids.append(store.add_trace(streamed, (r for r in recs)))
    assert ids[2] not in ("0000abcd", "0000abce")
    assert store.trace_ids() == {"0000abcd", *ids} and store.generation() == gen + 2
    assert _count(store, "SELECT count(*) FROM graphs") == 4 * len(recs)
    for tid in ids:
        assert store.summary(tid)["graphs"] == [r.summary() for r in recs]


def test_derived_rows_are_kept_once(store_ref):
    from alloctrace.traces.store.store import checkpoint_rows

    store = open_store(store_ref)
    tid = store.add_trace(*_trace(n=400, graphs=1))
    assert store.saved_states(tid, 0) is None  # short graph: none stored with it
    import zstandard

    rows = list(checkpoint_rows([{"n": 100, "free": []}], zstandard.ZstdCompressor().compress))
    assert store.add_state_checkpoints(tid, 0, rows) is True
    assert store.add_state_checkpoints(tid, 0, rows) is False  # kept already
    saved = store.saved_states(tid, 0)
    assert saved is not None


def test_schema_version_and_a_newer_store_is_refused(store_ref):
    store = open_store(store_ref)
    with store._be.write() as db:
        (ver,) = db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone()
        assert ver == str(STORE_FORMAT)
        db.execute("UPDATE store_info SET value=? WHERE key='format_version'", (str(STORE_FORMAT + 1),))
    store.close()
    with pytest.raises(UserError, match="has format"):
        open_store(store_ref)


def test_both_backends_store_the_same_bytes(tmp_path, pg_url):
    lite, pg = open_store(tmp_path / "s"), open_store(pg_url)
    meta, recs = _trace(n=70_000, graphs=1)  # long enough for stored checkpoints and map lifetimes
    ids = [s.add_trace(meta, recs) for s in (lite, pg)]

    def rows(store, tid):
        with store._snapshot() as db:
            return [
                [tuple(bytes(v) if isinstance(v, (bytes, memoryview)) else v for v in r)
                 for r in db.execute(f"SELECT {cols} FROM {table} WHERE trace_id=? ORDER BY {order}", (tid,))]
                for table, cols, order in (
                    ("graphs", "idx, role, n_events, max_size, buffer_size, oom, consistent, extra, strings, packed",
                     "idx"),
                    ("state_checkpoints", "graph_idx, event, data", "event"),
                    ("memmap_lod", "graph_idx, data", "graph_idx"))]
    a, b = rows(lite, ids[0]), rows(pg, ids[1])
    assert a == b and len(a[1]) > 1 and len(a[2]) == 1
    with pg._snapshot() as db:
        types = dict(db.execute("SELECT column_name, data_type FROM information_schema.columns "
                                "WHERE table_name = 'graphs'").fetchall())
    assert types["packed"] == "bytea" and types["max_size"] == "bigint"


def _normalised(text: str, ids: list[str]) -> str:
    for k, tid in enumerate(ids):
        text = text.replace(tid, f"<id{k}>")
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", "<created>", text)


def _cli_session(ref: str, capsys) -> list[str]:
    """Every store command over one store, their outputs in order."""
    out = []

    def run(*argv) -> str:
        code = main([*argv, "--store", ref])
        text = capsys.readouterr().out
        out.append(f"{' '.join(argv[:1])} -> {code}\n{text}")
        return text

    ids = []
    for path, commit in ((UB8, "commit=a"), (UB64, "commit=b")):
        ids += [t["id"] for t in json.loads(run("import", str(path), "--json", "--tag", commit, "--tag",
                                                "config=c"))["traces"]]
    ids += [t["id"] for t in json.loads(run("import", str(SNAPSHOT), "--json"))["traces"]]
    run("list")
    run("list", "-q", "commit=b")
    run("show", ids[0])
    run("peak", f"{ids[1]}:0", "--json")
    run("diff", f"{ids[0]}:0", f"{ids[1]}:0", "--json")
    run("state", f"{ids[0]}:0", "--event", "50")
    run("export", ids[0], "--format", "jsonl")  # to standard output
    run("compare", "--base", "commit=a", "--head", "commit=b", "--json")
    run("whatif", ids[2], "--set", "expandable_segments=true")
    run("doctor", "--json")
    run("rm", ids[1])
    run("list", "--json")
    return [_normalised(o, ids) for o in out]


def test_every_command_answers_the_same_on_both(tmp_path, pg_url, capsys):
    lite = _cli_session(str(tmp_path / "s"), capsys)
    pg = _cli_session(pg_url, capsys)
    assert lite == pg
    assert "-> 0" in lite[0] and "commit=b" in lite[4]
    assert lite[-1].count('"id"') == 2  # rm took one of three
    assert lite[-3].startswith("doctor -> 0")


def _api_session(ref) -> list:
    client = TestClient(create_app(store=open_store(ref)))
    out = []
    with client:
        ids = []
        for path, tag in ((UB8, "commit=a"), (UB64, "commit=b")):
            with open(path, "rb") as f:
                r = client.post("/api/traces", files={"file": (path.name, f)},
                                data={"tag": [tag, "model=tiny"]})
            assert r.status_code == 201, r.text
            ids.append(r.json()["traces"][0]["id"])
        for path in (f"/api/traces/{ids[0]}", f"/api/traces/{ids[0]}/graphs/0/events?limit=50",
                     f"/api/traces/{ids[0]}/graphs/0/memory-map", f"/api/traces/{ids[1]}/graphs/0/state?event=40",
                     f"/api/traces/{ids[1]}/graphs/0/peak", f"/api/diff?a={ids[0]}:0&b={ids[1]}:0",
                     f"/api/traces/{ids[0]}/export?format=jsonl", "/api/traces?q=ub64",
                     "/api/traces?tag=commit=b&tag=model=tiny", "/api/compare?base=commit=a&head=commit=b"):
            r = client.get(path)
            out.append((path, r.status_code, r.text))
        out.append(client.delete(f"/api/traces/{ids[0]}").json())
        out.append(client.get(f"/api/traces/{ids[0]}").status_code)
        out.append(client.get("/api/traces").json())
    return [_normalised(json.dumps(o), ids) for o in out]


def test_every_endpoint_answers_the_same_on_both(tmp_path, pg_url):
    lite, pg = _api_session(tmp_path / "s"), _api_session(pg_url)
    assert lite == pg
    assert "n_events" in lite[0] and lite[-2] == "404"
    listed = json.loads(json.loads(lite[8])[2])["traces"]
    assert [t["tags"] for t in listed] == [["commit=b", "model=tiny"]]
    compared = json.loads(json.loads(lite[9])[2])
    assert compared["failed"] is True and compared["pairs"][0]["buffers"][0]["cause"] == "kq"  # ub8 -> ub64


IMPORTER = """
import sys, time
from alloctrace.traces.store.store import open_store
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
sys.path.insert(0, {tests!r})
from test_store import _events
store = open_store({ref!r})
mode = sys.argv[1]
if mode == "many":
    for k in range(3):
        store.add_trace(TraceMeta(f"p{{sys.argv[2]}}-{{k}}", "test", "ggml-head"),
                        [GraphRecord(g, "eval", _events(300, g)) for g in range(2)])
else:
    def graphs():
        yield GraphRecord(0, "eval", _events(500))
        yield GraphRecord(1, "eval", _events(500, 1))
        open({marker!r}, "w").close()  # two graphs written inside the transaction; now wait to be killed
        time.sleep(600)
        yield GraphRecord(2, "eval", _events(10, 2))
    store.add_trace(TraceMeta("killed", "test", "ggml-head"), graphs())
"""


def _importer(ref, tmp_path, *argv):
    script = tmp_path / "importer.py"
    script.write_text(IMPORTER.format(tests=str(ROOT / "tests" / "store"), ref=str(ref), marker=str(tmp_path / "marker")))
    return subprocess.Popen([sys.executable, str(script), *argv], cwd=str(ROOT))


def test_concurrent_imports_from_many_processes(store_ref, tmp_path):
    open_store(store_ref).close()
    procs = [_importer(store_ref, tmp_path, "many", str(i)) for i in range(4)]
    assert [p.wait(300) for p in procs] == [0] * 4
    store = open_store(store_ref)
    names = sorted(s["name"] for s in store.list())
    assert names == sorted(f"p{i}-{k}" for i in range(4) for k in range(3))
    assert len(store.trace_ids()) == 12 and store.generation() == 12
    assert _count(store, "SELECT count(*) FROM graphs") == 24


def test_an_importer_killed_mid_write_leaves_no_half_trace(store_ref, tmp_path):
    store = open_store(store_ref)
    keep = store.add_trace(*_trace(graphs=1))
    proc = _importer(store_ref, tmp_path, "killed")
    deadline = time.monotonic() + 120
    while not (tmp_path / "marker").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30  # PostgreSQL notices the lost connection and rolls back
    while True:
        try:
            after = open_store(store_ref)
            added = after.add_trace(*_trace(name="after", graphs=1))  # the store takes writes again
            break
        except UserError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert sorted(s["name"] for s in after.list()) == ["after", "t"]
    assert after.trace_ids() == {keep, added}
    assert _count(after, "SELECT count(*) FROM graphs") == 2


def test_a_bad_url_is_one_line(capsys, monkeypatch):
    """Answered by one connection, with its reason: the pool, which tries again until its timeout, is never
    opened for an address that refuses."""
    import psycopg_pool

    opened = []
    monkeypatch.setattr(psycopg_pool.ConnectionPool, "open", lambda self, *a, **k: opened.append(self))
    code = main(["list", "--store", "postgresql://nobody:secret@127.0.0.1:1/none"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("alloctrace: error: cannot open store postgresql://nobody@127.0.0.1:1/none")
    assert "secret" not in err and len(err.strip().splitlines()) == 1
    assert "refused" in err.lower() and opened == []


def test_the_environment_names_a_postgresql_store(pg_url, monkeypatch, capsys):
    monkeypatch.setenv("ALLOCTRACE_STORE", pg_url)
    assert main(["import", str(UB8), "--tag", "commit=x"]) == 0
    capsys.readouterr()
    assert main(["list", "--tag", "commit=x", "--json"]) == 0
    assert [t["tags"] for t in json.loads(capsys.readouterr().out)["traces"]] == [["commit=x"]]


@pytest.mark.parametrize("command", [["list"], ["sweep", "--vary=-c=1,2", "--", sys.executable, "-c", "pass"]])
def test_an_unreachable_postgresql_store_is_one_line(command):
    """The connection pool's own warnings (one per attempt) stay out of the CLI's one-line refusal."""
    url = "postgresql://nobody@127.0.0.1:1/none"
    r = subprocess.run([sys.executable, "-m", "alloctrace", command[0], "--store", url, *command[1:]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alloctrace: error: cannot open store postgresql://"), r.stderr


def test_a_write_answers_its_summaries_from_its_own_transaction(store_ref):
    """add_traces_summarised reads the new traces' summaries inside the write (on PostgreSQL, answered with
    the COMMIT): the same as a read after it, in the order given; a failed write answers nothing and
    leaves nothing."""
    store = open_store(store_ref)
    metas = []
    for k in range(3):
        meta, recs = _trace(n=200 + k)
        meta.tags = [f"copy={k}"]
        metas.append((meta, recs, f"hash{k}"))
    g0 = store.generation()
    got = store.add_traces_summarised(metas)
    assert [s["tags"] for s in got] == [["copy=0"], ["copy=1"], ["copy=2"]]
    assert got == open_store(store_ref).summaries([s["id"] for s in got])
    # the summaries come from the values written where reading them back gives the same (no queries of their
    # own): flags taken out of the extras, no generation or profile, graphs given out of order; a value the
    # column converts (a float size, a numpy int) is read back
    import numpy as np

    odd = []
    for extra, size in (({"truncated": True}, 7), ({}, 7.0), ({}, np.int64(7))):
        meta, recs = _trace(n=30, graphs=3)
        meta.generation, meta.profile, meta.extra = None, None, extra
        recs[1].extra, recs[0].max_size = {"incomplete": True, "note": "x"}, size
        odd.append((meta, recs[::-1] if size == 7 else recs, None))
    ahead = store.add_traces_summarised(odd[:1]) + store.add_traces_summarised(odd[1:])  # the first: as written
    assert ahead == open_store(store_ref).summaries([s["id"] for s in ahead])
    assert [s["truncated"] for s in ahead] == [True, False, False] and ahead[0]["generation"] is None
    assert [g["index"] for g in ahead[0]["graphs"]] == [0, 1, 2]
    assert [g["complete"] for g in ahead[0]["graphs"]] == [True, False, True]
    assert [type(s["graphs"][0]["max_size"]) for s in ahead[:2]] == [int, int]  # 7.0 read back as 7
    g0 += 2
    assert [g["n_events"] for g in got[1]["graphs"]] == [len(r.events) for r in metas[1][1]]
    assert store.generation() == g0 + 1
    assert store.stored_with(["hash2"]) == {"hash2": [got[2]["id"]]}
    meta, recs = _trace(n=50)
    (plain,) = store.add_traces([(meta, recs, None)])  # the plain form: ids only, stored all the same
    assert store.summary(plain)["graphs"] == [r.summary() for r in recs]

    def broken():
        yield metas[0][1][0]
        raise RuntimeError("cut")
    before = store.trace_ids()
    with pytest.raises(RuntimeError):
        store.add_traces_summarised([(TraceMeta("half", "test", "ggml-head"), broken(), None)])
    assert store.trace_ids() == before and store.generation() == g0 + 2


def test_postgresql_writes_have_the_sqlite_stores_durability(pg_url, tmp_path):
    """A PostgreSQL write commits without waiting for the WAL flush, as the SQLite store commits in WAL mode
    with synchronous=NORMAL (docs/team.md): both may lose the last moment of writes to a power loss, never
    half of one."""
    pg, lite = open_store(pg_url), open_store(tmp_path / "s")
    with pg._be.write() as db:
        assert db.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    assert lite.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert lite.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_postgresql_generation_reads_are_shared_and_never_stale(pg_url):
    """Threads that ask for the generation at once share a read (a round trip each queued behind one
    connection before); a thread that asks while a read is in flight takes the next read's answer, never the
    one started before it asked: a write committed in between is seen."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    store, other = open_store(pg_url), open_store(pg_url)
    be = store._be
    real, reads = be._read_generation, []
    in_flight, go_on = threading.Event(), threading.Event()

    def slow(sql):
        row = real(sql)  # its answer is read first, then it lingers: a write may commit meanwhile
        reads.append(row)
        in_flight.set()
        go_on.wait(10)
        return row

    g0 = store.generation()
    be._read_generation = slow
    got: list[int] = []
    first = threading.Thread(target=lambda: got.append(store.generation()))
    first.start()
    in_flight.wait(10)
    other.add_trace(*_trace(n=20))  # committed while the first read is in flight
    start = threading.Barrier(8)

    def ask(_):
        start.wait(10)
        return store.generation()
    with ThreadPoolExecutor(8) as pool:
        later = pool.map(ask, range(8))
        time.sleep(0.3)  # the eight wait behind the first read
        go_on.set()
        later = list(later)
    first.join(10)
    assert got == [g0] and later == [g0 + 1] * 8
    assert len(reads) == 2  # the first, and one read the eight shared
