"""`alloctrace export` of PyTorch traces: Chrome trace JSON that keeps the Trace Event Format's rules and
carries the trace's own numbers (peaks, allocations, the OOM), and JSON Lines of devices, stacks and entries."""
from __future__ import annotations

import json

import pytest

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store
from alloctrace.traces.store.torch_stored import device_columns
from torchsnap import DATA, sidecar
from trace_event_format import violations


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    store = str(root / "s")
    ids = {}
    for name in ("oom", "small_streams"):
        assert main(["import", "--store", store, str(DATA / f"{name}.pickle.gz")]) == 0
        ids[name] = next(t["id"] for t in open_store(store).list() if t["id"] not in ids.values())
    return root, store, ids


def export(stored, name, fmt):
    root, store, ids = stored
    out = root / f"{name}.{fmt}"
    assert main(["export", "--store", store, ids[name], "--format", fmt, "-o", str(out)]) == 0
    return out, open_store(store), ids[name]


@pytest.mark.parametrize("name", ["oom", "small_streams"])
def test_chrome_trace_keeps_the_format_and_the_numbers(stored, name):
    out, store, tid = export(stored, name, "chrome")
    doc = json.loads(out.read_text())
    assert violations(doc) == []
    evs = doc["traceEvents"]
    cols = device_columns(store, tid, 0)
    streams = sorted(set(cols["stream"].tolist()))
    threads = [e for e in evs if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(threads) == len(streams)  # one track per stream
    begins = [e for e in evs if e["ph"] == "b"]
    assert len(begins) == int((cols["action"] == 0).sum())  # every allocation is a slice
    assert sum(e["args"]["size"] for e in begins) == int(cols["size"][cols["action"] == 0].sum())
    counters = [e["args"] for e in evs if e["ph"] == "C"]
    info = store.summary(tid)["graphs"][0]
    assert max(c["allocated"] for c in counters) == info["max_size"]  # the peak requested, exactly
    assert max(c["reserved"] for c in counters) == info["buffer_size"]
    if name == "oom":
        truth = sidecar("oom")["ground_truth"]
        assert max(c["reserved"] for c in counters) == truth["max_memory_reserved"]
        [oom] = [e for e in evs if e["ph"] == "i" and e["cat"] == "oom"]
        assert oom["args"]["size"] == 48 << 20 and oom["s"] == "p"


def test_the_checker_catches_broken_files():
    assert violations({"traceEvents": [{"ph": "b", "cat": "a", "id": 1, "pid": 1, "ts": 5, "name": "x"},
                                       {"ph": "e", "cat": "a", "id": 1, "pid": 1, "ts": 4, "name": "x"},
                                       {"ph": "C", "pid": 1, "ts": 1, "name": "c", "args": {"v": "1"}},
                                       {"ph": "Q", "pid": 1}]}) == [
        "event 1: async (1, 'a', '1') ends before it begins", "event 2: counter without numeric args",
        "event 3: unknown phase 'Q'"]


def test_jsonl_lists_every_entry_with_its_stack(stored):
    out, store, tid = export(stored, "oom", "jsonl")
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "trace" and lines[0]["id"] == tid
    entries = [x for x in lines if x["type"] == "entry"]
    stacks = {x["id"]: x["frames"] for x in lines if x["type"] == "stack"}
    cols = device_columns(store, tid, 0)
    assert [e["size"] for e in entries] == cols["size"].tolist()
    assert all(e["stack"] == -1 or e["stack"] in stacks for e in entries)
    [oom] = [e for e in entries if e["action"] == "oom"]
    assert oom["device_free"] > 0 and oom["size"] == 48 << 20


def test_csv_is_refused_for_a_torch_trace(stored, capsys):
    _, store, ids = stored
    assert main(["export", "--store", store, ids["oom"], "--format", "csv"]) == 2
    assert "exports as chrome or jsonl" in capsys.readouterr().err
