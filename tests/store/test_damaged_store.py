"""A damaged store: every read of stored data is checked, a damaged trace or graph is one line naming it
(exit 2; the server 422), the rest of the store stays usable, derived rows that cannot be read are made
again, and `alloctrace doctor` lists the damage and deletes it."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.store.store import open_store

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "tests" / "data" / "hostile" / "gpt-2_tiny_short.AT.log"
TORCH = ROOT / "tests" / "data" / "torch" / "small_default.pickle.gz"


def imported(capsys, store: Path, path: Path, *options: str) -> str:
    assert main(["import", str(path), "--store", str(store), "--json", *options]) == 0
    return json.loads(capsys.readouterr().out)["traces"][0]["id"]


@pytest.fixture
def two(tmp_path, capsys):
    """A store of two ggml traces: `bad` gets damaged, `good` must stay usable. And a PyTorch trace."""
    store = tmp_path / "s"
    bad, good = imported(capsys, store, GPT2), imported(capsys, store, GPT2, "--tag", "copy=2")  # not the same import
    torch = imported(capsys, store, TORCH)
    return store, bad, good, torch


def sql(store: Path, statement: str, *args):
    with sqlite3.connect(store / "alloctrace.db") as db:
        db.execute(statement, args)


def flip(store: Path, tid: str, field: str, graph: int = 1):
    """Flip bits in the middle of a graph's `packed` or `strings` blob."""
    with sqlite3.connect(store / "alloctrace.db") as db:
        (blob,) = db.execute(f"SELECT {field} FROM graphs WHERE trace_id=? AND idx=?", (tid, graph)).fetchone()
        b = bytearray(blob)
        for k in range(len(b) // 3, len(b) // 3 + 8):
            b[k] ^= 0x5A
        db.execute(f"UPDATE graphs SET {field}=? WHERE trace_id=? AND idx=?", (bytes(b), tid, graph))


def one_line(capsys, argv: list[str], names: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    assert err.startswith("alloctrace: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert names in err, err
    return err


def still_usable(capsys, store: Path, good: str):
    assert main(["peak", good, "--store", str(store)]) == 0
    assert main(["list", "--store", str(store)]) == 0
    capsys.readouterr()


def test_a_format_version_that_is_not_a_number_is_one_line(two, capsys):
    store, *_ = two
    sql(store, "UPDATE store_info SET value='abc' WHERE key='format_version'")
    one_line(capsys, ["list", "--store", str(store)], "format_version is 'abc'")


@pytest.mark.parametrize("table,field", [("traces", "tags"), ("traces", "extra"), ("graphs", "extra")])
def test_json_that_is_not_json_names_the_trace(two, capsys, table, field):
    store, bad, good, _ = two
    key = "id" if table == "traces" else "trace_id"
    sql(store, f"UPDATE {table} SET {field}='{{not json' WHERE {key}=?", bad)
    one_line(capsys, ["show", bad, "--store", str(store)] if field == "tags" else
             ["export", bad, "--format", "jsonl", "-o", str(store.parent / "x.jsonl"), "--store", str(store)],
             f"trace {bad}")
    still_usable(capsys, store, good)


@pytest.mark.parametrize("field", ["packed", "strings"])
@pytest.mark.parametrize("command", ["peak", "export"])
def test_flipped_bits_in_a_blob_name_the_graph(two, capsys, field, command, tmp_path):
    store, bad, good, _ = two
    flip(store, bad, field)
    argv = {"peak": ["peak", f"{bad}:1"],
            "export": ["export", bad, "--format", "csv", "-o", str(tmp_path / "x.csv")]}[command]
    one_line(capsys, [*argv, "--store", str(store)], f"trace {bad} graph 1 is damaged")
    still_usable(capsys, store, good)


@pytest.mark.parametrize("field", ["packed", "strings"])
@pytest.mark.parametrize("command", ["state", "whatif", "peak"])
def test_flipped_bits_in_a_pytorch_trace_name_it(two, capsys, field, command):
    store, _, good, torch = two
    flip(store, torch, field, graph=0)
    argv = {"state": ["state", torch, "--event", "end"], "whatif": ["whatif", torch, "--set", "expandable_segments=true"],
            "peak": ["peak", torch]}[command]
    one_line(capsys, [*argv, "--store", str(store)], f"trace {torch} graph 0 is damaged")
    still_usable(capsys, store, good)


def test_an_event_count_of_10_to_the_12_is_damage_not_work(two, capsys, tmp_path):
    store, bad, good, torch = two
    sql(store, "UPDATE graphs SET n_events=? WHERE trace_id=? AND idx=1", 10 ** 12, bad)
    sql(store, "UPDATE graphs SET n_events=? WHERE trace_id=? AND idx=0", 10 ** 12, torch)
    one_line(capsys, ["peak", f"{bad}:1", "--store", str(store)], "n_events")
    one_line(capsys, ["export", bad, "--format", "csv", "-o", str(tmp_path / "x.csv"), "--store", str(store)],
             "n_events")
    one_line(capsys, ["state", torch, "--event", "end", "--store", str(store)], "n_events")
    one_line(capsys, ["whatif", torch, "--set", "expandable_segments=true", "--store", str(store)], "n_events")
    still_usable(capsys, store, good)


def test_the_server_names_a_damaged_trace_and_serves_the_rest(two):
    store, bad, good, _ = two
    flip(store, bad, "packed")
    sql(store, "UPDATE traces SET tags='[oops' WHERE id=?", bad)
    with TestClient(create_app(store_dir=store)) as c:
        r = c.get(f"/api/traces/{bad}/graphs/1/state", params={"event": 3})
        assert r.status_code == 422 and f"trace {bad}" in r.json()["detail"], r.text
        assert c.get(f"/api/traces/{bad}").status_code == 422
        listed = c.get("/api/traces").json()["traces"]
        assert {t["id"] for t in listed} >= {bad, good}  # the listing still works, damaged one included
        assert c.get(f"/api/traces/{good}/graphs/1/state", params={"event": 3}).status_code == 200


def test_damaged_derived_rows_are_made_again_in_the_server(two):
    """A graph long enough to keep state checkpoints and memory-map lifetimes, both damaged: the server
    answers from the columns and stores them again."""
    store, *_ = two
    from hostile_inputs import long_graph_log
    log = long_graph_log(store.parent / "long.log.zst", 200_000)
    s = open_store(store)
    from alloctrace.traces.sources import import_file
    tid = import_file(s, log)[0]["id"]
    with sqlite3.connect(store / "alloctrace.db") as db:
        assert db.execute("SELECT count(*) FROM state_checkpoints WHERE trace_id=?", (tid,)).fetchone()[0] > 0
        assert db.execute("SELECT count(*) FROM memmap_lod WHERE trace_id=?", (tid,)).fetchone()[0] == 1
        db.execute("UPDATE state_checkpoints SET data=? WHERE trace_id=?", (b"\x28\xb5\x2f\xfd garbage", tid))
        db.execute("UPDATE memmap_lod SET data=? WHERE trace_id=?", (b"not zstd at all", tid))
    with TestClient(create_app(store_dir=store)) as c:
        r = c.get(f"/api/traces/{tid}/graphs/0/state", params={"event": 150_000})
        assert r.status_code == 200, r.text
        assert c.get(f"/api/traces/{tid}/graphs/0/memory-map").status_code == 200
        ctx = c.app.state.ctx
        if ctx.keeping is not None:
            ctx.keeping.join(60)
    fresh = open_store(store)
    assert fresh.saved_lifetimes(tid, 0) is not None  # stored again, readable
    saved = fresh.saved_states(tid, 0)
    assert saved is not None and saved.load(saved.marks[-1])


def test_doctor_lists_the_damage_and_deletes_it(two, capsys):
    store, bad, good, torch = two
    flip(store, bad, "strings")
    assert main(["doctor", "--store", str(store)]) == 1
    assert f"{bad}" in capsys.readouterr().out
    assert main(["doctor", "--store", str(store), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["traces"] == 3 and [(d["trace"], d["graph"]) for d in report["damaged"]] == [(bad, 1)]
    assert main(["doctor", "--store", str(store), "--delete"]) == 1  # not a terminal and no --yes: asks, keeps
    assert "nothing deleted" in capsys.readouterr().out
    assert main(["doctor", "--store", str(store), "--delete", "--yes"]) == 0
    assert f"deleted 1 trace" in capsys.readouterr().out
    assert {t["id"] for t in open_store(store).list()} == {good, torch}
    assert main(["doctor", "--store", str(store)]) == 0
    assert "2 traces, all readable" in capsys.readouterr().out
