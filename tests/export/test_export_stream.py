"""Exports stream graph by graph, say how far they are on a terminal, and the Chrome trace keeps to the trace
event format's rules (complete events on one thread must nest: overlapping lifetimes get tracks of their own)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import defaultdict

import pytest

from alloctrace.allocator.record_class import fields
from alloctrace.traces.export.ggml import export_chunks
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from test_diff_terminal import on_a_terminal

PHASES = {"X", "C", "M"}  # what the exporter writes; the checks below are the format's rules for each
METADATA = {"process_name": "name", "process_sort_index": "sort_index", "thread_name": "name",
            "thread_sort_index": "sort_index"}


@pytest.fixture()
def long_trace(fixtures, tmp_path):
    store = open_store(tmp_path / "s")
    [tid] = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_long.AT+DEBUG.log"])
    return store, tid


def chrome_doc(store, tid) -> dict:
    return json.loads("".join(export_chunks(store, tid, "chrome")))


def check_trace_event_format(doc: dict):
    """The JSON Object Format of the Trace Event Format (Google's spec): a traceEvents array; each event's
    phase, pid, tid and timestamps; metadata names and args; counters' numeric args; and on each thread,
    complete events ("X") that nest: one ends before the next starts, or holds it whole."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    by_thread = defaultdict(list)
    named = set()
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES and isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in METADATA and METADATA[e["name"]] in e["args"]
            if e["name"] == "thread_name":
                named.add((e["pid"], e["tid"]))
        elif e["ph"] == "C":
            assert isinstance(e["ts"], (int, float)) and e["args"]
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        else:
            assert isinstance(e["tid"], int) and e["ts"] >= 0 and e["dur"] >= 0 and e["name"]
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for thread, spans in by_thread.items():
        assert thread in named, f"thread {thread} has slices but no name"
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"on thread {thread}, [{start}, {end}) overlaps without nesting"
            stack.append(end)
    return by_thread


def test_the_chrome_trace_keeps_the_trace_event_formats_rules(long_trace):
    store, tid = long_trace
    doc = chrome_doc(store, tid)
    by_thread = check_trace_event_format(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    for g in store.summary(tid)["graphs"]:
        pid = g["index"] + 1
        mine = [e for e in slices if e["pid"] == pid]
        assert len(mine) == sum(1 for e in store.events(tid, g["index"]) if e.kind == "alloc")
        # as many tracks as tensors live at once: the fewest that keep every slice apart
        edges = sorted([(e["ts"], 1) for e in mine] + [(e["ts"] + e["dur"], -1) for e in mine],
                       key=lambda p: (p[0], p[1]))
        live = most = 0
        for _, step in edges:
            live += step
            most = max(most, live)
        tracks = {tid_ for (p, tid_) in by_thread if p == pid}
        assert len(tracks) == most > 1
        for e in mine:  # a track holds one buffer's tensors and says which
            assert names[(pid, e["tid"])].startswith(f"buffer {e['args']['chunk'] or 0} · level ")


def test_exports_stream_from_the_first_graph(long_trace):
    store, tid = long_trace
    read = []
    real_graph = store.graph
    store.graph = lambda t, g: (read.append(g), real_graph(t, g))[1]
    for fmt in ("jsonl", "csv", "chrome"):
        read.clear()
        pieces = export_chunks(store, tid, fmt)
        head, first = next(pieces), next(pieces)
        assert read == [0], f"{fmt}: the first graph's piece needed graphs {read}"
        if fmt == "jsonl":
            lines = [json.loads(x) for x in (head + first).splitlines()]
            assert [x["type"] for x in lines[:2]] == ["trace", "graph"] and lines[1]["index"] == 0
            assert len(lines) == 2 + store.summary(tid)["graphs"][0]["n_events"]
        rest = list(pieces)
        assert read == [g["index"] for g in store.summary(tid)["graphs"]]
        if fmt == "chrome":
            check_trace_event_format(json.loads(head + first + "".join(rest)))


def test_to_dict_is_asdict_without_the_nones(long_trace):
    store, tid = long_trace
    for ev in store.events(tid, 0) + store.events(tid, 1):
        want = {k: copy.deepcopy(getattr(ev, k)) for k in fields(ev) if getattr(ev, k) is not None and getattr(ev, k) != {}}
        assert ev.to_dict() == want


def test_the_cli_shows_progress_on_a_terminal_and_nothing_in_a_pipe(long_trace, tmp_path):  # noqa: D103
    store, tid = long_trace
    n = len(store.summary(tid)["graphs"])
    out = tmp_path / "t.jsonl"
    status, screen = on_a_terminal("export", tid, "--format", "jsonl", "-o", out, "--store", tmp_path / "s")
    assert status == 0, screen
    assert "exporting graphs" in screen and f"{n}/{n}" in screen
    assert len(out.read_text().splitlines()) == 1 + n + sum(g["n_events"] for g in store.summary(tid)["graphs"])
    piped = subprocess.run([sys.executable, "-m", "alloctrace", "export", tid, "--format", "csv", "--store",
                            tmp_path / "s"], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == "" and piped.stdout.startswith("i,kind,")
