"""Good data is never lost while bad data is cleaned, on both backends: every graph has a content checksum
(checked on each read and by `doctor`), so a lost blob is damage and not an empty graph; `doctor` deletes
only what the stored bytes show damaged, never what it could not check (out of memory); a multi-file import
is one transaction (killed or cut off from its database half way, it leaves all or none), and a re-run stores
nothing twice; a store made by the previous release (format 2, tests/data/store/format2.db) upgrades."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.store import store as store_module
from alloctrace.traces.store.damage import Damaged
from alloctrace.traces.store.store import STORE_FORMAT, open_store

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = DATA / "hostile" / "gpt-2_tiny_short.AT.log"
TORCH = DATA / "torch" / "small_default.pickle.gz"
FORMAT2 = DATA / "store" / "format2.db"  # made by the release before checksums: two traces, tag commit=abc
ROOT = Path(__file__).resolve().parents[2]


def imported(capsys, ref: str, *argv: str) -> list[dict]:
    assert main(["import", *argv, "--store", ref, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["traces"]


def sql(ref: str, statement: str, *args):
    store = open_store(ref)
    with store._be.write() as db:
        db.execute(statement, args)
    store.close()


def count(ref: str) -> int:
    store = open_store(ref)
    try:
        return len(store.trace_ids())
    finally:
        store.close()


def logs(folder: Path, n: int) -> list[str]:
    """`n` distinct small ggml logs (the same run, a different last line each)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = GPT2.read_text()
    out = []
    for i in range(n):
        p = folder / f"run{i:03d}.log"
        p.write_text(f"{text}\nrun {i}\n")
        out.append(str(p))
    return out


def test_a_lost_blob_is_damage_not_an_empty_graph(store_ref, capsys):
    bad = imported(capsys, store_ref, str(GPT2))[0]["id"]
    good = imported(capsys, store_ref, str(GPT2), "--tag", "copy=2")[0]["id"]
    sql(store_ref, "UPDATE graphs SET packed=NULL WHERE trace_id=? AND idx=1", bad)  # the blob is gone
    with pytest.raises(Damaged, match=f"trace {bad} graph 1 is damaged \\(checksum"):
        open_store(store_ref).events(bad, 1)
    assert main(["peak", f"{bad}:1", "--store", store_ref]) == 2
    assert "checksum" in capsys.readouterr().err
    assert main(["doctor", "--store", store_ref, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(d["trace"], d["graph"]) for d in report["damaged"]] == [(bad, 1)] and report["unchecked"] == []
    assert main(["doctor", "--store", store_ref, "--delete", "--yes"]) == 0
    assert open_store(store_ref).trace_ids() == {good}


def test_changed_bytes_with_a_valid_frame_are_damage(store_ref, capsys):
    """A blob replaced by another graph's valid bytes decodes fine: only the checksum tells."""
    a = imported(capsys, store_ref, str(GPT2))[0]["id"]
    b = imported(capsys, store_ref, str(GPT2), "--tag", "copy=2")[0]["id"]
    store = open_store(store_ref)
    with store._snapshot() as db:
        other = db.execute("SELECT packed FROM graphs WHERE trace_id=? AND idx=2", (b,)).fetchone()[0]
    sql(store_ref, "UPDATE graphs SET packed=? WHERE trace_id=? AND idx=1", bytes(other), a)
    with pytest.raises(Damaged, match="checksum"):
        store.columns(a, 1)
    assert main(["doctor", "--store", store_ref]) == 1
    assert f"{a}" in capsys.readouterr().out


def test_doctor_never_deletes_what_ran_out_of_memory(store_ref, capsys, monkeypatch):
    big = imported(capsys, store_ref, str(GPT2))[0]["id"]
    other = imported(capsys, store_ref, str(GPT2), "--tag", "copy=2")[0]["id"]
    decode = store_module.decode_events

    def out_of_memory(n, cols, table):
        if n == open_store(store_ref).summary(big)["graphs"][1]["n_events"] and cols is not None and oom_now[0]:
            raise MemoryError()
        return decode(n, cols, table)
    oom_now = [True]
    monkeypatch.setattr(store_module, "decode_events", out_of_memory)
    assert main(["doctor", "--store", store_ref, "--delete", "--yes"]) == 1  # could not check: not "all done"
    out = capsys.readouterr().out
    assert "could not check graph 1: out of memory (kept)" in out and "deleted" not in out, out
    assert open_store(store_ref).trace_ids() == {big, other}  # nothing healthy deleted
    assert main(["doctor", "--store", store_ref, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["damaged"] == [] and {u["trace"] for u in report["unchecked"]} >= {big}
    assert all(u["reason"] == "out of memory" for u in report["unchecked"])
    oom_now[0] = False
    assert main(["doctor", "--store", store_ref]) == 0
    assert "2 traces, all readable" in capsys.readouterr().out


def test_a_graph_stored_before_checksums_with_no_columns_is_damage(store_ref, capsys):
    tid = imported(capsys, store_ref, str(GPT2))[0]["id"]
    sql(store_ref, "UPDATE graphs SET packed=NULL, checksum=NULL WHERE trace_id=? AND idx=1", tid)
    with pytest.raises(Damaged, match="no columns are stored"):
        open_store(store_ref).events(tid, 1)
    assert main(["doctor", "--store", store_ref]) == 1


def test_a_store_made_by_the_previous_release_upgrades(tmp_path, capsys):
    folder = tmp_path / "old"
    folder.mkdir()
    shutil.copy(FORMAT2, folder / "alloctrace.db")
    store = open_store(folder)
    assert store.db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone() == (str(STORE_FORMAT),)
    assert store.db.execute("SELECT count(*), count(checksum) FROM graphs").fetchone() == (7, 0)  # none invented
    assert {t["name"] for t in store.list()} == {"gpt-2_tiny_short.AT.log", "small_default.pickle.gz"}
    assert all(t["tags"] == ["commit=abc"] for t in store.list())
    store.close()
    assert main(["doctor", "--store", str(folder)]) == 0
    assert "2 traces, all readable" in capsys.readouterr().out
    assert main(["peak", "6501ca63:1", "--store", str(folder)]) == 0
    assert "peak: 44.08 KiB" in capsys.readouterr().out
    new = imported(capsys, str(folder), str(GPT2), "--tag", "commit=def")[0]["id"]
    store = open_store(folder)
    assert store.db.execute("SELECT count(checksum) FROM graphs WHERE trace_id=?", (new,)).fetchone() == (6,)
    assert len(store.trace_ids()) == 3


def test_a_rerun_of_an_import_stores_nothing_twice(store_ref, capsys, tmp_path):
    files = logs(tmp_path / "in", 3)
    first = imported(capsys, store_ref, *files[:2])
    again = imported(capsys, store_ref, *files)  # a retry with one more file
    assert [t["id"] for t in again[:2]] == [t["id"] for t in first] and all(t.get("stored_before") for t in again[:2])
    assert not again[2].get("stored_before")
    assert count(store_ref) == 3
    assert main(["import", files[0], "--store", store_ref]) == 0
    assert "stored before as" in capsys.readouterr().err
    assert count(store_ref) == 3
    tagged = imported(capsys, store_ref, files[0], "--tag", "config=b")  # other tags: another trace
    assert not tagged[0].get("stored_before") and count(store_ref) == 4
    assert imported(capsys, store_ref, files[1], files[1])[0]["stored_before"] and count(store_ref) == 4


def _import_process(ref: str, files: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    return subprocess.Popen([sys.executable, "-m", "alloctrace", "import", *files, "--store", ref],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def test_an_import_killed_half_way_leaves_all_or_none(store_ref, tmp_path):
    files = logs(tmp_path / "in", 200)
    seen = set()
    for delay in (0.5, 0.9, 1.3, 1.7, 2.2):
        p = _import_process(store_ref, files)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait(60)
        n = count(store_ref)
        assert n in (0, 200), f"killed after {delay}s: {n} of 200 traces stored"
        seen.add(n)
        if n:
            break
    p = _import_process(store_ref, files)  # the retry completes and duplicates nothing
    assert p.wait(120) == 0, p.stderr.read()
    assert count(store_ref) == 200


def test_an_import_that_loses_its_database_leaves_none(pg_url, pg_admin, tmp_path):
    import psycopg

    files = logs(tmp_path / "in", 200)
    p = _import_process(pg_url, files)
    db = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_admin, autocommit=True) as admin:
        while p.poll() is None:
            time.sleep(0.15)
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname=%s "
                          "AND pid <> pg_backend_pid()", (db,))
    n = count(pg_url)
    assert n in (0, 200) and (p.returncode == 0) == (n == 200), (p.returncode, n)
    if p.returncode:
        err = p.stderr.read().decode()
        assert err.startswith("alloctrace: error: ") and "Traceback" not in err, err


def test_the_history_of_thousands_of_traces_reads_only_its_page(store_ref, monkeypatch):
    """3,000 tagged traces (the old history refused more than 2,000, having read every one): the page's
    commits come from the tags alone and only the page's traces are read."""
    from alloctrace.traces.regress.history import history
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    from test_store import _events

    store = open_store(store_ref)
    graph = [GraphRecord(0, "eval", _events(5), max_size=100, buffer_size=4096)]
    store.add_traces([(TraceMeta(f"t{i}", "test", "ggml-head", tags=[f"commit=c{i // 3:04d}", f"config=k{i % 3}"]),
                       graph, None) for i in range(3000)])
    read: list[str] = []
    summaries = store.summaries
    monkeypatch.setattr(store, "summaries", lambda ids: (read.extend(ids), summaries(ids))[1])
    monkeypatch.setattr(store, "list", None)  # a scan of every trace is not how a page is made
    h = history(store, [], offset=990, limit=20)
    assert h["total"] == 1000 and [c["value"] for c in h["commits"]] == [f"c{i:04d}" for i in range(990, 1000)]
    assert len(read) == 30 and len(h["series"]) == 3
    assert all([p["commit"] for p in s["points"]] == [f"c{i:04d}" for i in range(990, 1000)] for s in h["series"])
    k1 = history(store, ["config=k1"], limit=5)
    assert k1["total"] == 1000 and [p["commit"] for p in k1["series"][0]["points"]] == [f"c{i:04d}" for i in range(5)]


def test_a_postgresql_store_of_the_previous_format_upgrades(pg_url, capsys):
    """The previous release's PostgreSQL layout (format 2: no checksum, no content hash, no indexes), with a
    trace in it, opens upgraded: the trace reads as before and new graphs get checksums."""
    old = imported(capsys, pg_url, str(GPT2))[0]["id"]
    store = open_store(pg_url)
    with store._be.write() as db:
        for stmt in ("DROP INDEX traces_content_hash", "DROP INDEX traces_created",
                     "ALTER TABLE graphs DROP COLUMN checksum", "ALTER TABLE traces DROP COLUMN content_hash",
                     "UPDATE store_info SET value='2' WHERE key='format_version'"):
            db.execute(stmt)
    store.close()
    store = open_store(pg_url)
    with store._snapshot() as db:
        assert db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone()[0] == str(STORE_FORMAT)
        assert db.execute("SELECT count(*), count(checksum) FROM graphs").fetchone() == (6, 0)
    assert main(["peak", f"{old}:1", "--store", pg_url]) == 0 and "peak: 44.08 KiB" in capsys.readouterr().out
    new = imported(capsys, pg_url, str(GPT2))[0]  # its content hash was not kept: stored again, with checksums
    assert not new.get("stored_before")
    with store._snapshot() as db:
        assert db.execute("SELECT count(checksum) FROM graphs WHERE trace_id=?", (new["id"],)).fetchone() == (6,)
    assert main(["doctor", "--store", pg_url]) == 0


def test_a_page_reads_the_small_extras_and_older_graphs_whole(store_ref, capsys):
    """A recording's graph keeps its extra without the large values (its shapes) beside it; a page of many
    graphs reads those, and a graph stored before (none kept) its whole extra: the same answer."""
    from alloctrace.traces.regress.compare import BUFFER_KEYS

    rec = DATA / "compare" / "tiny-llama-fa-off.atrec.gz"
    tid = imported(capsys, store_ref, str(rec))[0]["id"]
    store = open_store(store_ref)
    with store._snapshot() as db:
        small = [json.loads(r[0]) for r in db.execute("SELECT extra_small FROM graphs WHERE trace_id=?", (tid,))]
    assert small and all("shapes" in s["_omitted"] and "shapes" not in s for s in small)
    whole = {i: {k: e[k] for k in BUFFER_KEYS if k in e} for i, e in store.graph_extras(tid).items()}
    assert store.graph_extras_of([tid], BUFFER_KEYS) == {tid: whole}
    sql(store_ref, "UPDATE graphs SET extra_small=NULL WHERE trace_id=?", tid)  # as a graph stored before
    assert open_store(store_ref).graph_extras_of([tid], BUFFER_KEYS) == {tid: whole}
    sql(store_ref, "UPDATE graphs SET extra='{not json' WHERE trace_id=? AND idx=0", tid)
    with pytest.raises(Damaged, match=f"trace {tid} graph 0 is damaged \\(extra"):
        open_store(store_ref).graph_extras_of([tid], BUFFER_KEYS)
