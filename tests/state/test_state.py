"""Free lists and live tensors rebuilt from events alone agree with the allocator that made them."""
import re

import pytest

from alloctrace.allocator import LAYOUTS, Event, Gallocr, LegacyAllocator, get_profile
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness
from alloctrace.traces.state.free_list import Replay, free_summary, state_at, states_at, stranding

LEGACY = [("v2023-08-16-legacy", "ggml-2023-08-16"), ("v2023-08-28-parseseq", "ggml-2023-08-28")]


def real_run(fixtures, folder, profile):
    desc = load_harness(fixtures / folder / "harness_plain.json")
    g = graph_from_json(desc)
    alloc = LegacyAllocator.real(get_profile(profile), LAYOUTS["linux"].buffer_base, desc["real_buffer_size"],
                                 desc["alignment"])
    for name in desc["explicit_allocs_before_graph"]:
        alloc.alloc_tensor(g.by_name(name))
    alloc.alloc_graph(g)
    return desc, alloc


@pytest.mark.parametrize("folder,profile", LEGACY)
def test_replayed_free_list_matches_the_allocator_after_every_change(fixtures, folder, profile):
    desc, alloc = real_run(fixtures, folder, profile)
    r = Replay(capacity=desc["real_buffer_size"])
    checked = 0
    for ev in alloc.events:
        r.apply(ev)
        if ev.kind in ("alloc", "free") and ev.n_free is not None:
            fs = free_summary(r.state())
            assert (fs["n_blocks"], fs["largest"], fs["total"]) == (ev.n_free, ev.largest_free, ev.total_free), ev
            checked += 1
    assert checked > 30
    assert [(o, s) for o, s, _ in r.state()["free_blocks"]] == alloc.t.blocks()


def test_state_at_the_legacy_oom_shows_the_logged_numbers(fixtures):
    desc, alloc = real_run(fixtures, "v2023-08-16-legacy", "ggml-2023-08-16")
    log = (fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log").read_text()
    needed, largest = map(int, re.search(r"needed (\d+), largest block available (\d+)", log).groups())
    at = next(i for i, e in enumerate(alloc.events) if e.kind == "alloc" and e.offset is None)
    st = state_at(alloc.events, at, capacity=desc["real_buffer_size"])
    fs = free_summary(st)
    assert fs["largest"] == largest < needed <= fs["total"]
    # every gap between two free blocks is filled exactly by live tensors: nothing leaked, nothing overlaps
    gaps = stranding(st)
    assert len(gaps) == fs["n_blocks"] - 1
    for gap in gaps:
        assert gap["live"] and sum(t["size"] for t in gap["live"]) == gap["gap"]
    used = sum(t["size"] for t in st["live"])
    assert used + fs["total"] == desc["real_buffer_size"] - st["free_blocks"][0][0]


def test_state_at_bounds_and_the_empty_start(fixtures):
    _, alloc = real_run(fixtures, "v2023-08-28-parseseq", "ggml-2023-08-28")
    assert state_at(alloc.events, 0) == {"event": 0, "free_blocks": [], "live": [], "live_bytes": 0,
                                         "anomalies": []}
    with pytest.raises(ValueError):
        state_at(alloc.events, len(alloc.events) + 1)
    end = state_at(alloc.events, len(alloc.events))
    assert end["free_blocks"][-1][1] is None  # no capacity given: the last block is endless
    many = states_at(alloc.events, [0, 10, len(alloc.events)])
    assert many[len(alloc.events)] == end and many[10] == state_at(alloc.events, 10)


def test_measure_tail_is_endless_and_live_bytes_peak_at_max_size(fixtures):
    desc = load_harness(fixtures / "v2023-08-16-legacy" / "harness_plain.json")
    g = graph_from_json(desc)
    m = LegacyAllocator.measure(get_profile("ggml-2023-08-16"), desc["alignment"])
    for name in desc["explicit_allocs_before_graph"]:
        m.alloc_tensor(g.by_name(name))
    m.alloc_graph(g)
    r = Replay()
    r.run_to(m.events, len(m.events))
    assert r.state()["anomalies"] == []
    assert r.peak_live <= desc["measure_max_size"]
    high = max(e.offset + e.size for e in m.events if e.kind == "alloc")
    assert high == desc["measure_max_size"]


def test_head_replay_matches_the_dynamic_allocator(fixtures):
    """Head frees print unpadded sizes and reuse frees a parent's tail: the replay must still agree."""
    desc = load_harness(fixtures / "head-gallocr" / "harness_gallocr.json")
    p = get_profile("ggml-head")
    galloc = Gallocr(p, desc["alignment"])
    for gd in desc["graphs"]:
        galloc.alloc_graph(graph_from_json(gd, legacy=False), graph_index=gd["step"])
    r = Replay(alignment=desc["alignment"])
    high: dict = {}
    checked = 0
    for ev in galloc.events:
        r.apply(ev)
        if ev.kind == "realloc":
            high = {}
        if ev.kind == "alloc":
            high[ev.chunk] = max(high.get(ev.chunk, 0), ev.offset + ev.size)
        if ev.kind in ("alloc", "free") and ev.n_free is not None:
            # the allocator reports each chunk's last block clipped to the chunk's high-water mark
            sizes = []
            for o, s, c in r.state()["free_blocks"]:
                s = max(0, high.get(c, 0) - o) if s is None else s
                if s:
                    sizes.append(s)
            assert (len(sizes), max(sizes, default=0), sum(sizes)) == (ev.n_free, ev.largest_free, ev.total_free)
            checked += 1
    assert checked > 20
    assert any(e.kind == "free_extra" for e in galloc.events) or any(e.kind == "reuse" for e in galloc.events)
    for c, ch in enumerate(galloc.dyn.chunks):
        mine = [(o, s) for o, s, cc in r.state()["free_blocks"] if cc == c]
        assert [o for o, _ in mine] == ch.offsets
        assert [s for _, s in mine[:-1]] == ch.sizes[:-1]


def test_unpadded_free_size_gives_back_the_allocated_bytes():
    """Head prints `freeing a (40 bytes)` for a tensor that took 64 padded bytes."""
    evs = [Event("alloc", tensor="a", offset=0, size=64, block=0, chunk=0),
           Event("alloc", tensor="b", offset=64, size=64, block=0, chunk=0),
           Event("free", tensor="a", offset=0, size=40, chunk=0)]
    st = state_at(evs, 3)
    assert st["free_blocks"][0] == (0, 64, 0)
    assert [t["tensor"] for t in st["live"]] == ["b"] and st["live_bytes"] == 64


def test_double_free_is_reported_not_merged():
    evs = [Event("alloc", tensor="a", offset=0, size=32, block=0),
           Event("alloc", tensor="b", offset=32, size=32, block=0),
           Event("free", tensor="a", offset=0, size=32),
           Event("free", tensor="a", offset=0, size=32)]
    st = state_at(evs, 4)
    assert len(st["anomalies"]) == 1 and "twice" in st["anomalies"][0]
    assert st["free_blocks"][0] == (0, 32, 0)


def test_state_from_store_columns_equals_state_from_events(fixtures, tmp_path):
    from alloctrace.traces import import_paths
    from alloctrace.traces.store.store import open_store

    s = open_store(tmp_path)
    (tid,) = import_paths(s, [fixtures / "head-gallocr" / "harness_gallocr.AT.log"])
    for g in range(len(s.summary(tid)["graphs"])):
        events, cols = s.events(tid, g), s.columns(tid, g)
        for n in (0, len(events) // 3, len(events)):
            assert state_at(cols, n) == state_at(events, n)
    s.close()


@pytest.mark.parametrize("cut", [0, 5, 40])
def test_copy_into_a_real_buffer_equals_replaying_in_it(fixtures, cut):
    """A measure replay handed to the real run at a point where both agree: same state as replaying
    the real run from the start (the endless last block becomes the real buffer's end)."""
    desc, real = real_run(fixtures, "v2023-08-28-parseseq", "ggml-2023-08-28")
    cap = desc["real_buffer_size"]
    measure_like = Replay()
    measure_like.run_to(real.events, cut)
    moved = measure_like.copy(capacity=cap)
    fresh = Replay(capacity=cap)
    fresh.run_to(real.events, cut)
    assert moved.state() == fresh.state()
    moved.run_to(real.events, len(real.events))
    fresh.run_to(real.events, len(real.events))
    assert moved.state() == fresh.state() and moved.free.shape() == fresh.free.shape()
