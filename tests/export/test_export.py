"""Exports: JSON Lines is lossless (import -> export -> import), CSV lists events, Chrome JSON loads in Perfetto."""
import csv
import json
import subprocess
import sys

import pytest

from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store

LOGS = [("v2023-08-16-legacy", "harness_plain.AT.log"), ("v2023-08-28-parseseq", "gpt-2_tiny_long.AT+DEBUG.log"),
        ("head-gallocr", "harness_gallocr.AT.log")]


def cli(*args):
    r = subprocess.run([sys.executable, "-m", "alloctrace", *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("folder,name", LOGS)
def test_jsonl_round_trip_through_the_cli(fixtures, tmp_path, folder, name):
    store = tmp_path / "s"
    first = json.loads(cli("import", fixtures / folder / name, "--store", store, "--json"))["traces"][0]
    out = tmp_path / "t.jsonl"
    cli("export", first["id"], "--format", "jsonl", "-o", out, "--store", store)
    second = json.loads(cli("import", out, "--store", store, "--json"))["traces"][0]
    assert second["id"] != first["id"]
    assert second["graphs"] == first["graphs"]
    assert (second["generation"], second["source"], second["name"]) == (first["generation"], first["source"],
                                                                          first["name"])
    s = open_store(store)
    for g in first["graphs"]:
        assert s.events(second["id"], g["index"]) == s.events(first["id"], g["index"])
    again = tmp_path / "again.jsonl"
    cli("export", second["id"], "--format", "jsonl", "-o", again, "--store", store)
    strip = lambda p: [l for l in p.read_text().splitlines()[1:]]  # the header carries the id
    assert strip(again) == strip(out)


def test_csv_has_one_row_per_event(fixtures, tmp_path):
    s = open_store(tmp_path / "s")
    [tid] = import_paths(s, [fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"])
    text = cli("export", tid[:4], "--format", "csv", "--store", tmp_path / "s")
    rows = list(csv.DictReader(text.splitlines()))
    events = s.events(tid, 0) + s.events(tid, 1)
    assert len(rows) == len(events)
    assert [r["kind"] for r in rows] == [e.kind for e in events]
    assert [r["offset"] for r in rows] == ["" if e.offset is None else str(e.offset) for e in events]
    oom = [r for r in rows if r["kind"] == "oom"]
    assert [(r["tensor"], r["needed"], r["largest"]) for r in oom] == [("fc_b", "4096", "2064")]


def test_chrome_trace_has_counters_and_lifetimes(fixtures, tmp_path):
    s = open_store(tmp_path / "s")
    [tid] = import_paths(s, [fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"])
    doc = json.loads(cli("export", tid, "--format", "chrome", "--store", tmp_path / "s"))
    evs = doc["traceEvents"]
    assert {e["ph"] for e in evs} == {"M", "C", "X"}
    for pid, g in ((1, 0), (2, 1)):
        events = s.events(tid, g)
        allocs = [e for e in events if e.kind == "alloc"]
        counters = [e for e in evs if e["ph"] == "C" and e["pid"] == pid]
        used = [c["args"]["used bytes"] for c in counters]
        assert min(used) >= 0 and max(used) <= s.summary(tid)["graphs"][g]["max_size"]
        slices = [e for e in evs if e["ph"] == "X" and e["pid"] == pid]
        assert len(slices) == len(allocs)
        assert all(e["dur"] >= 1 and e["ts"] >= 0 for e in slices)
        assert sorted(x["args"]["offset"] for x in slices) == sorted(a.offset for a in allocs)


def test_export_to_a_file_and_bad_format(fixtures, tmp_path):
    s = open_store(tmp_path / "s")
    [tid] = import_paths(s, [fixtures / "head-gallocr" / "gpt-2-alloc_tiny_short.AT.log"])
    r = subprocess.run([sys.executable, "-m", "alloctrace", "export", tid, "--format", "xml", "--store",
                        tmp_path / "s"], capture_output=True, text=True)
    assert r.returncode != 0 and "Traceback" not in r.stderr
