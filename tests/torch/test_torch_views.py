"""The torch views checked against answers derived here, straight from the snapshot's entries."""
import gzip
import json
import pickle
import random
from pathlib import Path

import pytest

from alloctrace.traces.store.store import open_store
from alloctrace.traces.explain import torch_peak
from alloctrace.traces.memmap import torch_timeline
from alloctrace.traces.state import torch_device as views
from alloctrace.traces.diff.torch_snapshots import diff
from alloctrace.traces.sources import import_paths


def import_snapshot(store, path):
    [tid] = import_paths(store, [path])
    return tid
from alloctrace.traces.store.torch_stored import device_columns, device_info

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"


def entries(name):
    return pickle.loads(gzip.decompress((DATA / f"{name}.pickle.gz").read_bytes()))["device_traces"][0]


def sidecar(name):
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("store"))
    s.ids = {n: import_snapshot(s, DATA / f"{n}.pickle.gz") for n in
             ("gpt2_train_bs8", "gpt2_train_bs16", "oom", "fragmentation")}
    return s


def dev(store, name):
    return views.load_device(store, store.ids[name], 0)


def lifetimes(es):
    """(alloc index, free_requested index or len, size) for every alloc, by a plain walk."""
    open_, out = {}, []
    for i, e in enumerate(es):
        if e["action"] == "alloc":
            open_[e["addr"]] = len(out)
            out.append([i, len(es), e["size"]])
        elif e["action"] == "free_requested" and e["addr"] in open_:
            out[open_.pop(e["addr"])][1] = i
    return out


def test_timeline_bands_stack_like_the_official_viewer(store):
    es = entries("gpt2_train_bs8")
    life = lifetimes(es)
    t = torch_timeline.timeline(dev(store, "gpt2_train_bs8"), max_points=300, max_bands=40, band_points=50)
    assert len(t["bands"]) == 40
    sizes = sorted((z for _, _, z in life), reverse=True)
    assert sorted((b["size"] for b in t["bands"]), reverse=True) == sizes[:40]  # the largest are drawn
    rnd = random.Random(3)
    for b in t["bands"]:
        for x, base in rnd.sample(list(zip(b["x"], b["base"])), min(5, len(b["x"]))):
            below = sum(z for s, e, z in life if s < b["alloc"] and s <= x < e)
            assert base == below
    # the drawn total is the envelope of requested bytes, so the peak survives sampling
    assert max(t["allocated_max"]) == sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"]
    assert max(t["reserved_max"]) == sidecar("gpt2_train_bs8")["ground_truth"]["max_memory_reserved"]
    for x0, x1 in ((100, 200), (5000, 5003), (len(es) - 10, len(es))):  # zoomed windows: same stacking
        z = torch_timeline.timeline(dev(store, "gpt2_train_bs8"), x0, x1, max_bands=30)
        for b in z["bands"]:
            assert x0 <= b["x"][0] and b["x"][-1] < x1
            for x, base in zip(b["x"], b["base"]):
                assert base == sum(zz for s, e, zz in life if s < b["alloc"] and s <= x < e)
    names = {a["name"] for a in t["annotations"] if a["kind"] == "annotation"}
    assert {"forward", "backward", "optimizer_step"} <= names
    assert {a["name"] for a in t["annotations"] if a["kind"] == "metadata"} >= {"step0:forward"}


def test_timeline_payload_does_not_grow_with_the_snapshot(tmp_path):
    snap = pickle.loads(gzip.decompress((DATA / "oom.pickle.gz").read_bytes()))
    trace = snap["device_traces"][0]
    snap["device_traces"][0] = [dict(e) for _ in range(8) for e in trace]
    big = tmp_path / "big.pickle"
    big.write_bytes(pickle.dumps(snap, protocol=4))
    s = open_store(tmp_path / "s")
    small_len = len(json.dumps(torch_timeline.timeline(views.load_device(s, import_snapshot(s, DATA / "oom.pickle.gz"), 0))))
    big_dev = views.load_device(s, import_snapshot(s, big), 0)
    big_t = torch_timeline.timeline(big_dev)
    assert big_t["n_events"] == 8 * len(trace)
    assert len(json.dumps(big_t)) < 1.5 * small_len < 600_000
    zoom = torch_timeline.timeline(big_dev, 5000, 6000, max_points=100)
    assert zoom["grid"][0] == 5000 and zoom["grid"][-1] < 6000 and len(zoom["grid"]) <= 100


@pytest.mark.parametrize("name", ["oom", "fragmentation"])
def test_state_at_random_entries_matches_running_sums(store, name):
    es = entries(name)
    d = dev(store, name)
    index = views.StateIndex(d)
    ks = sorted(random.Random(7).sample(range(len(es) + 1), 12), reverse=True)  # backwards: the index restarts
    for k in ks:
        st = views.state(d, index, k)
        reserved = sum(e["size"] * {"segment_alloc": 1, "segment_free": -1}.get(e["action"], 0) for e in es[:k])
        requested = sum(e["size"] * {"alloc": 1, "free_requested": -1}.get(e["action"], 0) for e in es[:k])
        pending = set()
        for e in es[:k]:
            if e["action"] == "free_requested":
                pending.add(e["addr"])
            elif e["action"] == "free_completed":
                pending.discard(e["addr"])
        t = st["totals"]
        assert (st["event"], t["reserved"], t["segments"]) == (k, reserved, len(st["segments"]))
        # a block freed but not completed still holds its requested bytes
        assert t["requested"] == requested + sum(b["requested"] for s in st["segments"] for b in s["blocks"]
                                                 if b["state"] == "pending_free")
        assert pending == {s["address"] + b["offset"] for s in st["segments"] for b in s["blocks"]
                           if b["state"] == "pending_free"}
        for s in st["segments"]:  # blocks tile their segment
            offsets = [b["offset"] for b in s["blocks"]]
            assert offsets[0] == 0 and sum(b["size"] for b in s["blocks"]) == s["size"]
            assert all(a + b["size"] == c for a, b, c in zip(offsets, s["blocks"], offsets[1:]))
        assert t["cached"] == t["reserved"] - t["allocated"]
        free = [b["size"] for s in st["segments"] for b in s["blocks"] if b["state"] == "free" and s["pool"] == "large"]
        assert t["largest_free"]["large"] == max(free, default=0)


def test_peak_by_call_site_adds_up_and_skip_is_configurable(store):
    d = dev(store, "gpt2_train_bs8")
    truth = sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"]
    default = torch_peak.peak(d, top=1000)
    assert sum(g["bytes"] for g in default["by_call_site"]) == truth
    assert not any("site-packages/torch/" in g["site"] for g in default["by_call_site"])
    # skipping the model library too moves the attribution to the training script
    deeper = torch_peak.peak(d, skip=views.DEFAULT_SKIP + ("site-packages/",), top=1000)
    assert sum(g["bytes"] for g in deeper["by_call_site"]) == truth
    assert {g["site"].split(" (")[1].split(":")[0] for g in deeper["by_call_site"] if "(" in g["site"]
            and not g["site"].startswith("(no")} == {"heldout/torch-snapshots/gen/make.py"}
    # no skipping: the innermost frame, which for this model is torch's own
    raw = torch_peak.peak(d, skip=(), top=1000)
    assert any("torch/" in g["site"] for g in raw["by_call_site"])
    live = [z for s, e, z in lifetimes(entries("gpt2_train_bs8")) if s <= default["event"] < e]
    assert default["live_allocations"] == len(live) and sum(live) == truth


def test_oom_card(store):
    d = dev(store, "oom")
    card = torch_peak.oom_card(d, views.StateIndex(d))
    es = entries("oom")
    k = next(i for i, e in enumerate(es) if e["action"] == "oom")
    assert card["event"] == k and card["requested"] == es[k]["size"] and card["device_free"] == es[k]["device_free"]
    assert sum(g["bytes"] for g in card["holders"]) == card["requested_live"]
    assert card["cached"] == card["reserved"] - card["allocated"]
    assert card["site"] == "forward (transformers/activations.py:66)"  # the traceback's innermost model line
    # README: 11 segment_free, 2 retries: the cache (11 small segments) was emptied and the retry got its
    # segment; the next request failed with nothing left to release
    (flush,) = card["cache_releases"]
    frees = [i for i, e in enumerate(es) if e["action"] == "segment_free"]
    assert (flush["first"], flush["end"], flush["segments"]) == (frees[0], frees[-1] + 1, len(frees)) == \
        (frees[0], frees[0] + 11, 11)
    assert flush["bytes"] == sum(es[i]["size"] for i in frees) and flush["then"] == "segment_alloc"
    assert torch_peak.oom_card(dev(store, "gpt2_train_bs8"), views.StateIndex(dev(store, "gpt2_train_bs8"))) is None


def test_diff_of_batch_8_and_16_decomposes_exactly(store):
    a, b = dev(store, "gpt2_train_bs8"), dev(store, "gpt2_train_bs16")
    d = diff(a, b, top=5)
    delta = (sidecar("gpt2_train_bs16")["memory_stats_subset"]["requested_bytes.all.peak"]
             - sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"])
    assert d["delta_requested"] == delta
    assert sum(r["delta"] for r in d["by_call_site"]) == delta and len(d["by_call_site"]) == 6
    p = d["decomposition"]
    assert p["resized"]["bytes"] + p["only_b"]["bytes"] - p["only_a"]["bytes"] == p["total"] == delta
    r = d["reserved"]
    assert r["delta_peak_reserved"] == (sidecar("gpt2_train_bs16")["ground_truth"]["max_memory_reserved"]
                                        - sidecar("gpt2_train_bs8")["ground_truth"]["max_memory_reserved"])
    al = d["alignment"]  # the README: same 3651 allocations in the same order, other sizes
    assert al["same_sequence"] and al["in_order"] and al["paired"] == 3651 and al["only_a"] == al["only_b"] == 0
    sa = [e["size"] for e in entries("gpt2_train_bs8") if e["action"] == "alloc"]
    sb = [e["size"] for e in entries("gpt2_train_bs16") if e["action"] == "alloc"]
    assert al["same_size"] == sum(x == y for x, y in zip(sa, sb))
    assert sum(al["sequence"]["a_bytes"]) == sum(sa) and sum(al["sequence"]["b_bytes"]) == sum(sb)
    same = diff(a, a)
    assert same["delta_requested"] == 0 and all(r["delta"] == 0 for r in same["by_call_site"])


def test_diff_of_different_programs_still_adds_up(store):
    a, b = dev(store, "oom"), dev(store, "fragmentation")
    d = diff(a, b)
    assert not d["alignment"]["same_sequence"]
    p = d["decomposition"]
    assert p["total"] == d["delta_requested"] == sum(r["delta"] for r in d["by_call_site"])
    assert p["only_b"]["bytes"] == sidecar("fragmentation")["memory_stats_subset"]["requested_bytes.all.peak"]


def frame(name):
    return {"name": name, "filename": "train.py", "line": 1}


def test_expandable_segments_and_two_devices(tmp_path):
    """A hand-made snapshot: device 1 grows one expandable segment by mapping, then unmaps its free tail."""
    f = [frame("step")]
    mib = 1 << 20
    dev1 = [{"action": "segment_map", "addr": 1 << 40, "size": 20 * mib, "stream": 0, "time_us": 1, "frames": f},
            {"action": "alloc", "addr": 1 << 40, "size": 12 * mib, "stream": 0, "time_us": 2, "frames": f},
            {"action": "segment_map", "addr": (1 << 40) + 20 * mib, "size": 20 * mib, "stream": 0, "time_us": 3,
             "frames": f},
            {"action": "alloc", "addr": (1 << 40) + 12 * mib, "size": 20 * mib, "stream": 0, "time_us": 4,
             "frames": f},
            {"action": "free_requested", "addr": (1 << 40) + 12 * mib, "size": 20 * mib, "stream": 0, "time_us": 5},
            {"action": "free_completed", "addr": (1 << 40) + 12 * mib, "size": 20 * mib, "stream": 0, "time_us": 6},
            {"action": "segment_unmap", "addr": (1 << 40) + 20 * mib, "size": 20 * mib, "stream": 0, "time_us": 7}]
    snap = {"segments": [{"device": 1, "address": 1 << 40, "total_size": 20 * mib, "allocated_size": 12 * mib,
                          "active_size": 12 * mib, "requested_size": 12 * mib, "stream": 0, "segment_type": "large",
                          "segment_pool_id": (0, 0), "is_expandable": True, "frames": f,
                          "blocks": [{"address": 1 << 40, "size": 12 * mib, "requested_size": 12 * mib,
                                      "state": "active_allocated", "frames": f},
                                     {"address": (1 << 40) + 12 * mib, "size": 8 * mib, "requested_size": 0,
                                      "state": "inactive", "frames": []}]}],
            "device_traces": [[], dev1], "allocator_settings": {"expandable_segments": True},
            "external_annotations": []}
    p = tmp_path / "x.pickle"
    p.write_bytes(pickle.dumps(snap))
    s = open_store(tmp_path / "s")
    tid = import_snapshot(s, p)
    assert [g["n_events"] for g in s.summary(tid)["graphs"]] == [0, 7]
    info = device_info(s, tid, 1)
    assert info["peak_reserved"] == 40 * mib and info["peak_requested"] == 32 * mib
    assert info["trace_matches_snapshot"] is True and info["state_problems"] == []
    assert device_columns(s, tid, 1)["action"].tolist() == [5, 0, 5, 0, 1, 2, 6]


def test_a_trace_that_wrapped_keeps_absolute_levels(tmp_path, store):
    """Drop the first 3,000 entries (as max_entries would): the snapshot's own totals give back what existed
    before, so peaks within the kept part and the peak's attribution still add up."""
    snap = pickle.loads(gzip.decompress((DATA / "gpt2_train_bs8.pickle.gz").read_bytes()))
    full = snap["device_traces"][0]
    snap["device_traces"][0] = full[3000:]
    p = tmp_path / "wrapped.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    s = open_store(tmp_path / "s")
    tid = import_snapshot(s, p)
    info = device_info(s, tid, 0)
    sign = {"alloc": 1, "free_requested": -1}
    level, levels = 0, []
    for e in full:
        level += sign.get(e["action"], 0) * e["size"]
        levels.append(level)
    assert info["trace_complete"] is False
    assert info["baseline_requested"] == levels[2999]
    assert info["peak_requested"] == max(levels[3000:])
    d = views.load_device(s, tid, 0)
    p = torch_peak.peak(d, top=1000)
    assert sum(g["bytes"] for g in p["by_call_site"]) == p["peak_requested"]
    assert any(g["site"] == views.PREEXISTING for g in p["by_call_site"])
    full_dev = dev(store, "gpt2_train_bs8")
    out = diff(full_dev, d)
    assert out["decomposition"]["total"] == out["delta_requested"] == sum(r["delta"] for r in out["by_call_site"])
    for name in ("gpt2_train_bs8", "oom", "fragmentation"):  # complete recordings: nothing before
        ex = dev(store, name).extra
        assert (ex["baseline_requested"], ex["baseline_reserved"], ex["trace_complete"]) == (0, 0, True)


def test_a_snapshot_whose_segments_disagree_with_its_trace_keeps_the_trace_levels(tmp_path):
    mib = 1 << 20
    trace = [{"action": "segment_alloc", "addr": 1 << 30, "size": 20 * mib, "stream": 0, "time_us": 1},
             {"action": "alloc", "addr": 1 << 30, "size": 12 * mib, "stream": 0, "time_us": 2}]
    p = tmp_path / "x.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    s = open_store(tmp_path / "s")
    info = device_info(s, import_snapshot(s, p), 0)
    assert (info["peak_requested"], info["peak_reserved"]) == (12 * mib, 20 * mib)
    assert (info["baseline_requested"], info["baseline_reserved"]) == (0, 0)
    assert info["trace_matches_snapshot"] is False  # the rebuilt state has a segment the snapshot lacks
