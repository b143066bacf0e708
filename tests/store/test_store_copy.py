"""`alloctrace store copy SRC DST` between a SQLite folder and a PostgreSQL database, either way: ids, tags,
bytes and derived rows kept, a re-run copies only what is missing, every graph checked by its checksum;
and how a store is named: a libpq `key=value` string is PostgreSQL (never a folder), a password is never
echoed, a malformed address is one line, a role that may only SELECT serves the store read-only."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.store.store import open_store

from hostile_inputs import long_graph_log

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = DATA / "hostile" / "gpt-2_tiny_short.AT.log"
TORCH = DATA / "torch" / "small_default.pickle.gz"
FORMAT2 = DATA / "store" / "format2.db"

TABLES = {"traces": "id, name, source, generation, profile, created, tags, extra, content_hash",
          "graphs": "trace_id, idx, role, n_events, max_size, buffer_size, oom, consistent, extra, strings, packed, "
                    "checksum",
          "state_checkpoints": "trace_id, graph_idx, event, data", "memmap_lod": "trace_id, graph_idx, data"}


def rows(ref: str) -> dict:
    """Every stored row of the tables a copy keeps (bytes as bytes), sorted."""
    store = open_store(ref)
    out = {}
    with store._snapshot() as db:
        for table, cols in TABLES.items():
            out[table] = sorted(tuple(bytes(v) if isinstance(v, memoryview) else v for v in r)
                                for r in db.execute(f"SELECT {cols} FROM {table}").fetchall())
    store.close()
    return out


def copy(capsys, src: str, dst: str, rc: int = 0) -> dict:
    assert main(["store", "copy", src, dst, "--json"]) == rc
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def filled(tmp_path, capsys):
    """A folder store: a ggml trace, a PyTorch trace, and a long graph with state checkpoints and lifetimes."""
    ref = str(tmp_path / "src")
    for argv in ([str(GPT2), "--tag", "commit=a1"], [str(TORCH)],
                 [str(long_graph_log(tmp_path / "long.log.zst", 200_000)), "--tag", "config=long"]):
        assert main(["import", *argv, "--store", ref]) == 0
    capsys.readouterr()
    return ref


@pytest.mark.parametrize("way", ["sqlite-postgresql-sqlite", "sqlite-sqlite"])
def test_a_copy_keeps_every_row_and_a_rerun_copies_nothing(filled, pg_url, tmp_path, capsys, way):
    middle = pg_url if "postgresql" in way else str(tmp_path / "mid")
    want = rows(filled)
    assert want["state_checkpoints"] and want["memmap_lod"]
    ids = {r[0] for r in want["traces"]}
    assert set(copy(capsys, filled, middle)["copied"]) == ids
    assert rows(middle) == want
    again = copy(capsys, filled, middle)
    assert again["copied"] == [] and set(again["present"]) == ids and rows(middle) == want
    back = str(tmp_path / "back")
    copy(capsys, middle, back)
    assert rows(back) == want
    assert [t["id"] for t in open_store(back).list()] == [t["id"] for t in open_store(filled).list()]  # order kept
    assert main(["doctor", "--store", back]) == 0
    capsys.readouterr()


def test_a_stopped_copy_resumes_with_what_is_missing(filled, pg_url, capsys):
    ids = [t["id"] for t in reversed(open_store(filled).list())]
    copy(capsys, filled, pg_url)
    dst = open_store(pg_url)
    dst.delete(ids[1])  # as if the copy had stopped after the first trace (each trace is one transaction)
    dst.delete(ids[2])
    again = copy(capsys, filled, pg_url)
    assert again["copied"] == ids[1:] and again["present"] == ids[:1]
    assert rows(pg_url) == rows(filled)


def test_damage_in_the_source_is_named_and_left_out(filled, tmp_path, capsys):
    ids = [t["id"] for t in reversed(open_store(filled).list())]
    src = open_store(filled)
    with src._be.write() as db:
        db.execute("UPDATE graphs SET packed=NULL WHERE trace_id=? AND idx=1", (ids[0],))
    report = copy(capsys, filled, str(tmp_path / "dst"), rc=1)
    assert report["copied"] == ids[1:] and len(report["damaged"]) == 1 and ids[0] in report["damaged"][0]
    assert open_store(tmp_path / "dst").trace_ids() == set(ids[1:])


def test_an_id_with_other_content_is_left_alone(filled, tmp_path, capsys):
    dst = str(tmp_path / "dst")
    copy(capsys, filled, dst)
    tid = next(t["id"] for t in open_store(filled).list() if t["name"] == GPT2.name)
    store = open_store(dst)
    with store._be.write() as db:  # another trace under the same id in the destination
        (other,) = db.execute("SELECT packed FROM graphs WHERE trace_id=? AND idx=2", (tid,)).fetchone()
        db.execute("UPDATE graphs SET packed=?, checksum=? WHERE trace_id=? AND idx=1",
                   (other, "0" * 64, tid))
    assert copy(capsys, filled, dst, rc=1)["conflicts"] == [tid]


def test_graphs_stored_before_checksums_get_one_in_the_copy(tmp_path, pg_url, capsys):
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(FORMAT2, old / "alloctrace.db")
    copy(capsys, str(old), pg_url)
    store = open_store(pg_url)
    with store._snapshot() as db:
        assert db.execute("SELECT count(*), count(checksum) FROM graphs").fetchone() == (7, 7)
    assert main(["doctor", "--store", pg_url]) == 0
    assert main(["peak", "6501ca63:1", "--store", pg_url]) == 0
    assert "peak: 44.08 KiB" in capsys.readouterr().out


def test_the_same_store_twice_is_one_line(filled, capsys):
    assert main(["store", "copy", filled, filled]) == 2
    assert capsys.readouterr().err == "alloctrace: error: SRC and DST are the same store\n"


# --- how a PostgreSQL store is named ------------------------------------------------------------------------
def _keywords(url: str, password: str | None = None) -> str:
    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(url)
    return " ".join([f"host={d['host']} port={d['port']} dbname={d['dbname']} user={d['user']}"]
                    + ([f"password={password}"] if password else []))


def test_a_libpq_keyword_string_is_a_postgresql_store(pg_url, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conninfo = _keywords(pg_url)
    assert main(["import", str(GPT2), "--store", conninfo]) == 0
    capsys.readouterr()
    assert len(open_store(pg_url).trace_ids()) == 1  # in the database
    assert list(tmp_path.iterdir()) == []  # no folder named after it
    assert main(["list", "--store", conninfo]) == 0


@pytest.mark.parametrize("address,says", [
    ("postgresql://bob:s3cret@127.0.0.1:notaport/db", "the port 'notaport' is not a number"),
    ("postgresql://bob:s3cret@[::1/db?password=s3cret", "not a valid PostgreSQL address"),
    ("host=127.0.0.1 bogus=1 password=s3cret", 'invalid connection option "bogus"'),
    ("host=127.0.0.1 port=1 connect_timeout=2 password=s3cret", "cannot open store"),
])
def test_a_bad_address_is_one_line_without_its_password(address, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["list", "--store", address]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: ") and err.count("\n") == 1 and says in err, err
    assert "s3cret" not in err and list(tmp_path.iterdir()) == []


def test_a_password_in_the_query_string_is_never_echoed(pg_admin, capsys):
    url = pg_admin.rsplit("/", 1)[0].rsplit(":", 1)[0] + ":1/db?password=s3cret&connect_timeout=2"
    assert main(["list", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "password=***" in err, err


def test_the_servers_503_names_no_database_user_or_host(pg_url, pg_admin):
    import psycopg

    app = create_app(store_dir=pg_url)
    with TestClient(app) as c:
        assert c.get("/api/traces").status_code == 200
        db = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(pg_admin, autocommit=True) as admin:  # the database goes away
            admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname=%s", (db,))
        try:
            r = c.get("/api/traces")
        finally:
            with psycopg.connect(pg_admin, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        assert r.status_code == 503, r.text
        assert "postgres@" not in r.text and "127.0.0.1" not in r.text and "unavailable" in r.json()["detail"]


def test_a_select_only_role_serves_the_store_read_only(pg_url, pg_admin, capsys):
    import psycopg

    assert main(["import", str(GPT2), "--store", pg_url]) == 0
    capsys.readouterr()
    tid = next(iter(open_store(pg_url).trace_ids()))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS reader")
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
    reader = pg_url.replace("postgres@", "reader@", 1)
    try:
        store = open_store(reader)
        assert store.read_only and store.trace_ids() == {tid}
        assert main(["peak", f"{tid}:1", "--store", reader]) == 0
        capsys.readouterr()
        assert main(["import", str(GPT2), "--tag", "x=y", "--store", reader]) == 2
        err = capsys.readouterr().err
        assert "read-only" in err and err.count("\n") == 1, err
        with TestClient(create_app(store_dir=reader)) as c:
            assert c.get("/api/traces").json()["traces"][0]["id"] == tid
            assert c.get("/api/access").json() == {"can_write": False, "why": "read-only store"}  # no controls
            assert c.get(f"/api/traces/{tid}/graphs/1/state", params={"event": 3}).status_code == 200
            r = c.delete(f"/api/traces/{tid}")
            assert r.status_code == 403 and "read-only" in r.json()["detail"], r.text
        store.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM reader')
            conn.execute(f'DROP OWNED BY reader')
            conn.execute("DROP ROLE reader")


def test_an_export_imported_back_keeps_its_id(filled, pg_url, tmp_path, capsys):
    tid = next(t["id"] for t in open_store(filled).list() if t["name"] == GPT2.name)
    out = tmp_path / "t.jsonl"
    assert main(["export", tid, "--format", "jsonl", "-o", str(out), "--store", filled]) == 0
    capsys.readouterr()
    assert [t["id"] for t in json.loads(_import(capsys, out, pg_url))["traces"]] == [tid]  # a store without it
    assert open_store(pg_url).graph(tid, 1) == open_store(filled).graph(tid, 1)
    again = json.loads(_import(capsys, out, filled, "--tag", "copy=2"))["traces"][0]["id"]
    assert again != tid and open_store(filled).trace_ids() >= {tid, again}  # the id is taken there: a new one


def _import(capsys, path, ref, *options) -> str:
    assert main(["import", str(path), "--store", ref, "--json", *options]) == 0
    return capsys.readouterr().out


def test_an_id_asked_for_twice_in_one_import_is_kept_once(store_ref):
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    from test_store import _events

    store = open_store(store_ref)
    graphs = [GraphRecord(0, "eval", _events(5))]
    ids = store.add_traces([(TraceMeta(f"t{i}", "test", id="abcdef01"), graphs, None) for i in range(3)])
    assert ids[0] == "abcdef01" and len(set(ids)) == 3 and all(len(t) == 8 for t in ids)
    assert store.add_traces([(TraceMeta("again", "test", id="abcdef01"), graphs, None)])[0] != "abcdef01"
    assert len(store.trace_ids()) == 4
