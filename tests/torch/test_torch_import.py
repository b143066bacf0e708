"""PyTorch memory snapshots: every real fixture imports and reproduces its sidecar's ground truth; pickles
that would run code, and mutated ones, are refused with one line and leave the store as it was."""
import gzip
import io
import json
import os
import pickle
import random
import re
from pathlib import Path

import pytest
import zstandard

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store
from alloctrace.traces.store.torch_stored import ACTIONS
from alloctrace.traces.sources import import_paths


def import_snapshot(store, path):
    [tid] = import_paths(store, [path])
    return tid
from alloctrace.traces.state.torch_blocks import compare_with_snapshot, state_at
from alloctrace.traces.store.torch_stored import device_columns, device_info
from alloctrace.traces.sources.torch.unpickle import SnapshotError, load_plain

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
NAMES = ["gpt2_train_bs8", "gpt2_train_bs16", "oom", "fragmentation"]


def sidecar(name):
    return json.loads((DATA / f"{name}.json").read_text())


def raw(name) -> bytes:
    return gzip.decompress((DATA / f"{name}.pickle.gz").read_bytes())


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture()
def store_dir(tmp_path):
    return tmp_path / "store"


def listing(store_dir):
    return [(t["id"], t["name"]) for t in open_store(store_dir).list()]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_imports_with_the_sidecars_peaks(capsys, store_dir, name):
    rc, out, err = cli(capsys, "import", DATA / f"{name}.pickle.gz", "--json", "--store", store_dir)
    assert rc == 0, err
    (trace,) = json.loads(out)["traces"]
    assert set(trace) == {"id", "name", "source", "devices"} and trace["source"] == "torch"
    (dev,) = trace["devices"]
    assert set(dev) >= {"device", "n_events", "peak_requested", "peak_reserved", "oom"}
    truth = sidecar(name)
    assert dev["peak_requested"] == truth["memory_stats_subset"]["requested_bytes.all.peak"]
    assert dev["peak_reserved"] == truth["ground_truth"]["max_memory_reserved"]
    assert dev["n_events"] == truth["snapshot_analysis"]["trace_entries_per_device"][0]
    if truth["memory_stats_subset"]["num_ooms"]:
        msg = truth["scenario_details"]["oom_exception_message"]
        mib = float(re.search(r"Tried to allocate ([\d.]+) MiB", msg).group(1))
        unallocated = float(re.search(r"([\d.]+) MiB is reserved by PyTorch but unallocated", msg).group(1))
        oom = dev["oom"]
        assert oom["requested"] == round(mib * 2 ** 20)
        # the OOM is the trace's last entry, so the allocator then is the allocator at the snapshot
        assert oom["allocated"] == truth["ground_truth"]["memory_allocated"]
        assert oom["reserved"] == truth["ground_truth"]["memory_reserved"]
        assert abs((oom["reserved"] - oom["allocated"]) / 2 ** 20 - unallocated) < 0.01
    else:
        assert dev["oom"] is None
    # `peak` reports the same peaks, and its call sites add up to the peak exactly
    rc, out, err = cli(capsys, "peak", trace["id"], "--json", "--store", store_dir, "--top", "5")
    assert rc == 0, err
    (p,) = json.loads(out)["devices"]
    assert (p["peak_requested"], p["peak_reserved"]) == (dev["peak_requested"], dev["peak_reserved"])
    assert sum(g["bytes"] for g in p["by_call_site"]) == p["peak_requested"]
    assert abs(sum(g["share"] for g in p["by_call_site"]) - 1) < 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_columns_and_info_hold_the_snapshot(tmp_path, name):
    store = open_store(tmp_path)
    tid = import_snapshot(store, DATA / f"{name}.pickle.gz")
    snap = pickle.loads(raw(name))  # the fixture is trusted: read it the ordinary way to compare
    entries = snap["device_traces"][0]
    cols = device_columns(store, tid, 0)
    assert set(cols) == {"action", "addr", "size", "stream", "time_us", "stack", "meta", "compile", "device_free"}
    assert all(len(c) == len(entries) for c in cols.values())
    assert [ACTIONS[a] for a in cols["action"].tolist()] == [e["action"] for e in entries]
    assert cols["size"].tolist() == [e["size"] for e in entries]
    assert cols["addr"].tolist() == [e.get("addr", -1) for e in entries]
    assert cols["time_us"].tolist() == [e["time_us"] for e in entries]
    assert cols["device_free"].tolist() == [e.get("device_free", -1) for e in entries]
    info = device_info(store, tid, 0)
    strings, st = info["strings"], info["stacks"]
    for k in random.Random(1).sample(range(len(entries)), 200):  # stacks decode to the entry's frames
        sid = int(cols["stack"][k])
        frames = [] if sid < 0 else [
            {"name": strings[st["frame_name"][f]], "filename": strings[st["frame_file"][f]],
             "line": int(st["frame_line"][f])}
            for f in st["frames"][st["offsets"][sid]:st["offsets"][sid + 1]]]
        assert frames == (entries[k].get("frames") or [])
        m = int(cols["meta"][k])
        assert (strings[m] if m >= 0 else "") == entries[k]["user_metadata"]
    assert info["allocator_settings"] == snap["allocator_settings"]
    ours = info["segments"]
    assert [(s["address"], s["total_size"], s["segment_type"], [(b["address"], b["size"], b["state"])
                                                               for b in s["blocks"]]) for s in ours] == \
        [(s["address"], s["total_size"], s["segment_type"], [(b["address"], b["size"], b["state"])
                                                            for b in s["blocks"]]) for s in snap["segments"]]
    assert info["n_events"] == len(entries) and info["consistent"] is True  # the caching-allocator replay


@pytest.mark.parametrize("name", NAMES)
def test_state_rebuilt_from_the_trace_matches_the_snapshot(tmp_path, name):
    store = open_store(tmp_path)
    tid = import_snapshot(store, DATA / f"{name}.pickle.gz")
    cols = device_columns(store, tid, 0)
    from alloctrace.traces.store.torch_stored import device_tables
    tables, _, extra = device_tables(store, tid, 0)
    state = state_at(cols, len(cols["action"]))
    assert state.mismatches == []
    assert compare_with_snapshot(state, tables) == []
    t = state.totals()
    truth = sidecar(name)["ground_truth"]
    assert (t["reserved"], t["allocated"]) == (truth["memory_reserved"], truth["memory_allocated"])
    assert extra["trace_matches_snapshot"] is True


def test_compressions_and_plain_import_alike(tmp_path, capsys):
    data = raw("oom")
    files = {"p.pickle": data, "p.pickle.gz": gzip.compress(data), "p.pickle.zst": zstandard.compress(data)}
    peaks = set()
    for fname, blob in files.items():
        (tmp_path / fname).write_bytes(blob)
        rc, out, err = cli(capsys, "import", tmp_path / fname, "--json", "--store", tmp_path / "s")
        assert rc == 0, err
        d = json.loads(out)["traces"][0]["devices"][0]
        peaks.add((d["peak_requested"], d["peak_reserved"], json.dumps(d["oom"])))
    assert len(peaks) == 1


class Boom:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = None


def test_a_pickle_that_runs_a_command_is_refused(tmp_path, capsys, store_dir):
    global MARKER
    cli(capsys, "import", DATA / "oom.pickle.gz", "--store", store_dir)
    before = listing(store_dir)
    MARKER = tmp_path / "pwned"
    snap = pickle.loads(raw("oom"))
    snap["device_traces"][0][3]["frames"] = [Boom()]  # buried deep inside a real snapshot
    for proto in (2, 4, 5):
        evil = tmp_path / f"evil{proto}.pickle"
        evil.write_bytes(pickle.dumps(snap, protocol=proto))
        rc, out, err = cli(capsys, "import", evil, "--store", store_dir)
        assert rc == 2 and out == ""
        assert err.count("\n") == 1 and err.startswith("alloctrace: error: ")
        assert "posix.system" in err or "os.system" in err
        assert not MARKER.exists()
    assert listing(store_dir) == before


# hand-made programs using each opcode that builds or calls objects, with no global resolved first
OPCODE_PROGRAMS = {
    "GLOBAL": b"cbuiltins\neval\n(S'1'\ntR.",
    "STACK_GLOBAL": b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x011\x85R.",
    "INST": b"(S'echo hi'\nios\nsystem\n.",
    "OBJ": b"(cos\nsystem\nS'echo hi'\no.",
    "REDUCE on a plain value": b"\x80\x02X\x01\x00\x00\x00a)R.",
    "BUILD on a dict": b"\x80\x02}}X\x01\x00\x00\x00aK\x01sb.",
    "NEWOBJ on a plain value": b"\x80\x02X\x01\x00\x00\x00a)\x81.",
    "EXT1": b"\x80\x02\x82\x01.",
    "PERSID": b"Pabc\n.",
    "a frame declaring 1 TiB": b"\x80\x04\x95" + (1 << 40).to_bytes(8, "little") + b"}.",
    "a string declaring 1 TiB": b"\x80\x04\x8d" + (1 << 40).to_bytes(8, "little") + b"abc.",
}


@pytest.mark.parametrize("label", OPCODE_PROGRAMS)
def test_every_object_building_opcode_gives_one_clear_error(label):
    with pytest.raises(SnapshotError) as e:
        load_plain(io.BytesIO(OPCODE_PROGRAMS[label]), label="x.pickle")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("x.pickle: ")
    assert any(w in msg for w in ("refused", "not a valid pickle", "malformed", "beyond the limit"))


def test_mutated_pickles_give_one_line_and_leave_the_store_unchanged(tmp_path, capsys, store_dir):
    cli(capsys, "import", DATA / "fragmentation.pickle.gz", "--store", store_dir)
    before = listing(store_dir)
    data = raw("fragmentation")
    rnd = random.Random(15)
    cases = [data[:n] for n in (0, 1, 2, 11, len(data) // 3, len(data) - 1)]
    for _ in range(40):
        b = bytearray(data)
        for _ in range(rnd.choice((1, 3, 20))):
            b[rnd.randrange(2, len(b))] = rnd.randrange(256)
        cases.append(bytes(b))
    cases.append(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "size": "big"}]]}))
    cases.append(pickle.dumps({"segments": [], "device_traces": [[{"action": "explode", "size": 1}]]}))
    cases.append(pickle.dumps({"segments": [{"address": 1.5}], "device_traces": []}))
    cases.append(pickle.dumps([1, 2, 3]))
    cases.append(pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1 << 70, "size": 1,
                                                                     "stream": 0, "time_us": 0}]]}))
    refused = 0
    for k, blob in enumerate(cases):
        p = tmp_path / f"m{k}.pickle"
        p.write_bytes(blob)
        rc, out, err = cli(capsys, "import", p, "--store", store_dir)
        if rc != 0:
            refused += 1
            assert rc == 2 and err.count("\n") == 1 and err.startswith("alloctrace: error: "), err
        else:  # a mutation that kept it a valid snapshot: it was stored whole; take it out again
            open_store(store_dir).delete(open_store(store_dir).list()[0]["id"])
        assert listing(store_dir) == before
    assert refused >= len(cases) // 2


def test_decompressed_size_is_capped(tmp_path, capsys, store_dir, monkeypatch):
    p = tmp_path / "big.pickle.gz"
    p.write_bytes(gzip.compress(raw("oom")))
    monkeypatch.setenv("ALLOCTRACE_TORCH_MAX_BYTES", "100000")
    rc, out, err = cli(capsys, "import", p, "--store", store_dir)
    assert rc == 2 and "more than 100,000 bytes" in err and err.count("\n") == 1
    assert listing(store_dir) == []


def test_sniff_knows_snapshots_from_other_input():
    from alloctrace.traces.sources.torch.source import SOURCE
    for name in NAMES:
        assert SOURCE.sniff(raw(name)[:65536])
    for proto in (2, 3, 5):
        assert SOURCE.sniff(pickle.dumps({"segments": [], "device_traces": []}, protocol=proto))
    assert not SOURCE.sniff(pickle.dumps([1, 2, 3], protocol=4))
    assert not SOURCE.sniff(b"ggml_allocr_alloc: allocating node_0 (4096 bytes)\n" * 10)
    assert not SOURCE.sniff(b"")
    (imported,) = SOURCE.read(io.BytesIO(raw("oom")), filename="/tmp/x/oom.pickle", name=None)
    assert imported.meta.source == "torch" and imported.meta.name == "oom.pickle"
    assert [d["peak_reserved"] for d in imported.report["devices"]] == \
        [sidecar("oom")["ground_truth"]["max_memory_reserved"]]
