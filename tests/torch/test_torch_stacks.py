"""The stack table a torch import stores names every stack its columns name: entries', segments' and blocks'.

A segment or block whose frames no trace entry shares (a segment allocated before recording began, in a trace
that wrapped) once got a stack id past the stored table, and its frames were lost."""
import gzip
import io
import json
import pickle
from pathlib import Path

import numpy as np

from alloctrace.traces.export.torch_jsonl import write_jsonl
from alloctrace.traces.sources import import_paths
from alloctrace.traces.state import torch_device as views
from alloctrace.traces.state.torch_frames import DEFAULT_SKIP, site_label
from alloctrace.traces.store.store import open_store
from alloctrace.traces.store.torch_stored import device_tables

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
WRAPPED = DATA / "pairs" / "train_wrapped.pickle.gz"


def _frames(cols, strings, stack):
    if stack < 0:
        return []
    lo, hi = int(cols["stack_offsets"][stack]), int(cols["stack_offsets"][stack + 1])
    return [{"name": strings[cols["frame_name"][f]], "filename": strings[cols["frame_file"][f]],
             "line": int(cols["frame_line"][f])} for f in cols["stack_frames"][lo:hi].tolist()]


def _own(frames):
    return [{"name": f["name"], "filename": f["filename"], "line": f["line"]} for f in frames or []]


def _check_every_stack_is_stored(cols, strings, snap_segments):
    n_stacks = len(cols["stack_offsets"]) - 1
    for name in ("stack", "seg_stack", "blk_stack"):
        assert int(cols[name].max(initial=-1)) < n_stacks, name
    for k, seg in enumerate(snap_segments):
        assert _frames(cols, strings, int(cols["seg_stack"][k])) == _own(seg.get("frames")), k
    j = 0
    for seg in snap_segments:
        for b in seg["blocks"]:
            assert _frames(cols, strings, int(cols["blk_stack"][j])) == _own(b.get("frames")), j
            j += 1


def test_segments_older_than_a_wrapped_trace_keep_their_frames(tmp_path):
    snap = pickle.loads(gzip.decompress(WRAPPED.read_bytes()))
    entry_stacks = {json.dumps(_own(e.get("frames"))) for e in snap["device_traces"][0]}
    older = [s for s in snap["segments"] if s.get("frames") and json.dumps(_own(s["frames"])) not in entry_stacks]
    assert older  # the fixture holds segments whose frames no entry shares
    s = open_store(tmp_path)
    [tid] = import_paths(s, [WRAPPED])
    cols, strings, extra = device_tables(s, tid, 0)
    _check_every_stack_is_stored(cols, strings, snap["segments"])
    assert extra["n_stacks"] == len(cols["stack_offsets"]) - 1


def frame(name, line):
    return {"name": name, "filename": f"/src/{name}.py", "line": line}


def test_stacks_first_met_on_blocks_of_two_devices(tmp_path):
    """Two devices share one stack table; blocks and segments of both bring frames no entry has."""
    mb = 1 << 20
    e = [frame("train", 1)]
    traces = [[{"action": "segment_alloc", "addr": 0, "size": 2 * mb, "stream": 0, "frames": e},
               {"action": "alloc", "addr": 0, "size": mb, "stream": 0, "frames": e}],
              [{"action": "alloc", "addr": 1 << 40, "size": mb, "stream": 0, "frames": e}]]
    segments = [
        {"device": 0, "address": 0, "total_size": 2 * mb, "stream": 0, "segment_type": "large",
         "allocated_size": mb, "active_size": mb, "requested_size": mb, "frames": e,
         "blocks": [{"address": 0, "size": mb, "requested_size": mb, "state": "active_allocated", "frames": e},
                    {"address": mb, "size": mb, "requested_size": 0, "state": "inactive", "frames": []}]},
        {"device": 1, "address": 1 << 40, "total_size": 2 * mb, "stream": 0, "segment_type": "large",
         "allocated_size": 2 * mb, "active_size": 2 * mb, "requested_size": 2 * mb,
         "frames": [frame("load_weights", 7), frame("main", 2)],
         "blocks": [{"address": 1 << 40, "size": mb, "requested_size": mb, "state": "active_allocated",
                     "frames": e},
                    {"address": (1 << 40) + mb, "size": mb, "requested_size": mb, "state": "active_allocated",
                     "frames": [frame("embed", 3), frame("load_weights", 7)]}]}]
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": traces}, protocol=4))
    s = open_store(tmp_path / "store")
    [tid] = import_paths(s, [path])
    for d in (0, 1):
        cols, strings, _ = device_tables(s, tid, d)
        _check_every_stack_is_stored(cols, strings, [x for x in segments if x["device"] == d])
    out = io.StringIO()
    write_jsonl(s, tid, out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    for d in (0, 1):
        n = next(x["n_stacks"] for x in lines if x["type"] == "device" and x["device"] == d)
        named = [x["stack"] for x in lines if x["type"] in ("segment", "block") and x["device"] == d]
        assert named and max(named) < n


def _older_segments(snap):
    """Snapshot segments the trace never made nor freed: address -> their frames."""
    touched = {e["addr"] for e in snap["device_traces"][0] if e["action"].startswith("segment_")}
    return {s["address"]: s["frames"] for s in snap["segments"] if s.get("frames") and s["address"] not in touched}


def test_the_state_view_names_who_made_segments_and_blocks_older_than_the_trace(tmp_path):
    snap = pickle.loads(gzip.decompress(WRAPPED.read_bytes()))
    older = _older_segments(snap)
    assert len(older) >= 10
    s = open_store(tmp_path)
    [tid] = import_paths(s, [WRAPPED])
    dev = views.load_device(s, tid, 0)
    for k in (0, dev.n // 2, dev.n):
        shown = {seg["address"]: seg["site"] for seg in views.state(dev, views.StateIndex(dev), k)["segments"]}
        for addr, frames in older.items():
            assert shown[addr] == site_label(_own(frames), DEFAULT_SKIP), (k, addr)
    # an allocated block older than the trace that no entry frees is named by the snapshot's frames of it
    untouched = {e["addr"] for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")}
    held = {b["address"]: b["frames"] for seg in snap["segments"] for b in seg["blocks"]
            if b["state"] == "active_allocated" and b.get("frames") and b["address"] not in untouched}
    assert held
    start = views.state(dev, views.StateIndex(dev), 0)["segments"]
    blocks = {seg["address"] + b["offset"]: b for seg in start for b in seg["blocks"]}
    for addr, frames in held.items():
        assert blocks[addr]["alloc"] is None and blocks[addr]["site"] == site_label(_own(frames), DEFAULT_SKIP)
    # a segment the trace made is named by its segment_alloc entry, as its blocks are by their alloc entries
    made = [e for e in snap["device_traces"][0] if e["action"] == "segment_alloc"]
    end = {seg["address"]: seg for seg in views.state(dev, views.StateIndex(dev), dev.n)["segments"]}
    named = [e for e in made if e["addr"] in end and e.get("frames")]
    assert named and all(end[e["addr"]]["site"] == site_label(_own(e["frames"]), DEFAULT_SKIP) for e in named)


def test_a_trace_stored_before_the_fix_still_reads(tmp_path):
    """A store made by an older build kept segment and block stack ids past its stack table: such a trace (here
    its JSON Lines export with the table cut back as that build stored it) reads, and those frames are unknown."""
    s = open_store(tmp_path / "a")
    [tid] = import_paths(s, [WRAPPED])
    cols, _, _ = device_tables(s, tid, 0)
    kept = int(cols["stack"].max()) + 1  # the older build's table: the entries' stacks only
    assert kept < len(cols["stack_offsets"]) - 1 and int(cols["seg_stack"].max()) >= kept
    out = io.StringIO()
    write_jsonl(s, tid, out)
    lines = []
    for line in out.getvalue().splitlines():
        x = json.loads(line)
        if x["type"] == "stack" and x["id"] >= kept:
            continue
        if x["type"] == "device":
            x["n_stacks"] = kept
        lines.append(json.dumps(x))
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join(lines) + "\n")
    s2 = open_store(tmp_path / "b")
    [tid2] = import_paths(s2, [old])
    dev = views.load_device(s2, tid2, 0)
    assert len(dev.cols["stack_offsets"]) - 1 == kept
    lost = [int(x) for x in dev.cols["seg_stack"] if x >= kept]
    assert lost and all(dev.frames(x) == [] for x in lost)
    sites = {seg["address"]: seg["site"] for seg in views.state(dev, views.StateIndex(dev), 0)["segments"]}
    gone = {int(a) for a, x in zip(dev.cols["seg_address"], dev.cols["seg_stack"]) if x >= kept}
    assert gone <= set(sites) and all(sites[a] is None for a in gone)
    assert np.array_equal(dev.cols["stack"], cols["stack"])
