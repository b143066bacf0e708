"""Diffing two allocator runs: the harness fixtures' measure and real passes, model-made and imported."""
import re
from collections import Counter

import pytest

from alloctrace.allocator import LAYOUTS, Gallocr, LegacyAllocator, get_profile
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness
from alloctrace.traces import import_paths
from alloctrace.traces.diff.graphs import TraceDiff, diff_graphs, diff_refs
from alloctrace.traces.store.store import open_store

ALLOC = re.compile(r"allocating (.*) \((\d+) bytes\) - block (-?\d+)")
OOM = re.compile(r"needed (\d+), largest block available (\d+)")


def logged_runs(path):
    """(measure, real) lists of (tensor, block) read straight from a harness log."""
    text = path.read_text()
    measure, real = text.split("harness: measure max_size", 1)
    return ([(m[1], int(m[3])) for m in ALLOC.finditer(measure)], [(m[1], int(m[3])) for m in ALLOC.finditer(real)])


def first_logged_divergence(path):
    measure, real = logged_runs(path)
    for (ta, ba), (tb, bb) in zip(measure, real):
        assert ta == tb  # both passes walk the same graph
        if ba != bb:
            return ta, ba, bb
    return None


def model_runs(fixtures, folder, profile):
    desc = load_harness(fixtures / folder / "harness_plain.json")
    g, p = graph_from_json(desc), get_profile(profile)
    runs = []
    for alloc in (LegacyAllocator.measure(p, desc["alignment"]),
                  LegacyAllocator.real(p, LAYOUTS["linux"].buffer_base, desc["real_buffer_size"], desc["alignment"])):
        for name in desc["explicit_allocs_before_graph"]:
            alloc.alloc_tensor(g.by_name(name))
        alloc.alloc_graph(g)
        runs.append(alloc)
    m, r = runs
    return (m.events, {"role": "measure", "max_size": m.t.max_size},
            r.events, {"role": "eval", "max_size": r.t.max_size, "buffer_size": desc["real_buffer_size"]})


@pytest.fixture()
def store(tmp_path):
    s = open_store(tmp_path / "store")
    yield s
    s.close()


def check_legacy_failure(fixtures, d):
    log = fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"
    tensor, block_a, block_b = first_logged_divergence(log)
    fd = d.first_divergence
    assert (fd["tensor"], fd["a"]["block"], fd["b"]["block"]) == (tensor, block_a, block_b)
    assert f"took block {block_a}" in fd["words"] and f"took block {block_b}" in fd["words"]
    # both sides' free lists at that moment, and the chosen block is in each of them
    for side in ("a", "b"):
        c = fd[side]
        blocks = [b for b in c["free_blocks"] if b[2] == 0]
        assert blocks[c["block"]][0] == c["offset"]
    needed, largest = map(int, OOM.search(log.read_text()).groups())
    oom = d.b["oom"]
    assert d.a["oom"] is None
    assert (oom["needed"], oom["largest_free"]) == (needed, largest)
    assert max(s for _, s, _ in oom["free_blocks"]) == largest and oom["total_free"] >= needed
    stranders = {t["tensor"] for g in oom["stranded_by"] for t in g["live"]}
    assert stranders and all(name in oom["words"] for name in stranders)
    # what measure had at the same point: it placed the failing tensor
    assert oom["other"]["tensor"] == oom["tensor"] and oom["other"]["offset"] is not None
    fl = d.first_free_list_divergence
    assert fl is not None and fl["event_a"] >= fd["event_a"]


def test_legacy_failure_by_the_model(fixtures):
    ea, ma, eb, mb = model_runs(fixtures, "v2023-08-16-legacy", "ggml-2023-08-16")
    d = diff_graphs(ea, eb, ma, mb)
    check_legacy_failure(fixtures, d)
    assert d.a["max_size"] == 12304 and d.a["label"] == "measure" and d.b["label"] == "eval"


def test_legacy_failure_from_the_imported_log(fixtures, store):
    (tid,) = import_paths(store, [fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"])
    d = diff_refs(store, f"{tid}:0", f"{tid}:1")
    check_legacy_failure(fixtures, d)
    json_ = d.to_json()
    assert set(json_) >= {"first_divergence", "first_free_list_divergence", "a", "b", "deltas", "aligned"}


def test_model_and_imported_log_agree(fixtures, store):
    (tid,) = import_paths(store, [fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"])
    ea, ma, eb, mb = model_runs(fixtures, "v2023-08-16-legacy", "ggml-2023-08-16")
    for g, events, meta in ((0, ea, ma), (1, eb, mb)):
        d = diff_graphs(events, store.events(tid, g), meta, store.graph(tid, g))
        assert d.first_divergence is None and d.aligned["fraction"] == 1.0


@pytest.mark.parametrize("source", ["model", "import"])
def test_fixed_allocator_reports_no_divergence(fixtures, store, source):
    log = fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"
    assert first_logged_divergence(log) is None
    if source == "model":
        ea, ma, eb, mb = model_runs(fixtures, "v2023-08-28-parseseq", "ggml-2023-08-28")
        d = diff_graphs(ea, eb, ma, mb)
    else:
        (tid,) = import_paths(store, [log])
        d = diff_refs(store, f"{tid}:0", f"{tid}:1")
    assert d.first_divergence is None and d.first_free_list_divergence is None
    assert d.a["oom"] is None and d.b["oom"] is None
    assert d.aligned["fraction"] == 1.0 and d.deltas["offsets"] == [] and d.deltas["max_size"] == 0


def names(events):
    return Counter(e.tensor or "" for e in events if e.kind in ("alloc", "reuse"))


def test_unrelated_traces_say_how_much_aligned(fixtures, store):
    (harness,) = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"])
    (gpt2,) = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"])
    a, b = store.events(harness, 0), store.events(gpt2, 0)
    assert not names(a) & names(b)  # hand-named harness tensors against ggml's node_N / leaf_N
    d = diff_refs(store, f"{harness}:0", f"{gpt2}:0")
    assert d.aligned["count"] == 0 and d.aligned["fraction"] == 0.0
    assert (d.aligned["a"], d.aligned["b"]) == (sum(names(a).values()), sum(names(b).values()))
    assert d.first_divergence is None and d.a["max_size"] and d.b["max_size"]


def test_reordered_graph_aligns_in_order(fixtures, store):
    """The same tensors walked in parse_seq order: every kept pair is in order on both sides."""
    (plain,) = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"])
    (seq,) = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "harness_parseseq.AT.log"])
    a, b = store.events(plain, 0), store.events(seq, 0)
    common = sum((names(a) & names(b)).values())
    order_a = [e.tensor for e in a if e.kind in ("alloc", "reuse")]
    order_b = [e.tensor for e in b if e.kind in ("alloc", "reuse")]
    assert common == len(order_a) and order_a != order_b
    d = diff_refs(store, f"{plain}:0", f"{seq}:0")
    assert 0 < d.aligned["count"] < common
    assert d.aligned["fraction"] == d.aligned["count"] / len(order_a)
    assert d.first_divergence is not None


def head_graph_events(fixtures, step):
    desc = load_harness(fixtures / "head-gallocr" / "harness_gallocr.json")
    gd = desc["graphs"][step]
    galloc = Gallocr(get_profile("ggml-head"), desc["alignment"])
    galloc.reserve(graph_from_json(gd, legacy=False))
    return gd, galloc.events


def test_different_graph_sizes_align_by_name(fixtures):
    g8, small = head_graph_events(fixtures, 0)
    g16, large = head_graph_events(fixtures, 2)
    assert [n["name"] for n in g8["nodes"]] == [n["name"] for n in g16["nodes"]] and g8["N"] < g16["N"]
    d = diff_graphs(small, large, {"label": "N=8"}, {"label": "N=16"})
    assert d.aligned["fraction"] == 1.0
    assert d.deltas["sizes"] and all(r["b"] > r["a"] for r in d.deltas["sizes"])
    assert d.deltas["peak_live"] > 0 and d.b["high_water"] > d.a["high_water"]
    assert d.first_divergence is None or "32 B in a and 64 B in b" in d.first_divergence["words"]


def test_deleted_tensors_leave_the_rest_aligned(fixtures):
    _, full = head_graph_events(fixtures, 2)
    g_short, short = head_graph_events(fixtures, 3)
    assert g_short["n_nodes"] < 38
    d = diff_graphs(full, short)
    assert d.aligned["fraction_b"] == 1.0 and d.aligned["a"] > d.aligned["b"]
    assert (d.a["label"], d.b["label"]) == ("a", "b")


def test_whole_traces_pair_graphs_in_order(fixtures, store):
    (old,) = import_paths(store, [fixtures / "v2023-08-16-legacy" / "gpt-2_tiny_short.AT.log"])
    (new,) = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_long.AT+DEBUG.log"])
    t = diff_refs(store, old, new)
    assert isinstance(t, TraceDiff)
    n_old, n_new = len(store.summary(old)["graphs"]), len(store.summary(new)["graphs"])
    assert [(ga, gb) for ga, gb, _ in t.pairs] == [(i, i) for i in range(min(n_old, n_new))]
    assert t.unpaired_a == list(range(n_new, n_old)) and t.unpaired_b == []
    js = t.to_json()
    assert len(js["pairs"]) == len(t.pairs) and js["first_divergent_pair"] is not None
    one = diff_refs(store, f"{old}:1", new)  # one graph against a whole trace: pairs with its graph 0
    assert [(ga, gb) for ga, gb, _ in one.pairs] == [(1, 0)]


def test_store_columns_and_event_lists_give_the_same_diff(fixtures, store):
    """diff_refs reads the store's columns; the result must not depend on that."""
    for folder in ("v2023-08-16-legacy", "head-gallocr"):
        log = fixtures / folder / ("harness_gallocr.AT.log" if folder == "head-gallocr" else "harness_plain.AT.log")
        (tid,) = import_paths(store, [log])
        by_columns = diff_refs(store, f"{tid}:0", f"{tid}:1").to_json()
        gen = store.meta(tid).generation
        meta = {g["index"]: {**g, "label": f"{tid}:{g['index']} {g['role']}", "generation": gen}
                for g in store.summary(tid)["graphs"]}
        by_events = diff_graphs(store.events(tid, 0), store.events(tid, 1), meta[0], meta[1]).to_json()
        assert by_columns == by_events


def test_choice_divergence_ignores_offsets_shifted_by_sizes(fixtures):
    """N=8 against N=16: every offset moves, yet the block choices can still be compared."""
    _, small = head_graph_events(fixtures, 0)
    _, large = head_graph_events(fixtures, 2)
    d = diff_graphs(small, large)
    fd, fc = d.first_divergence, d.first_choice_divergence
    assert fd is not None and fd["fields"] == ["offset", "size"]
    blocks = lambda evs: [(e.tensor, e.block, e.chunk) for e in evs if e.kind == "alloc"]  # noqa: E731
    first_other = next((x for x, y in zip(blocks(small), blocks(large)) if x != y), None)
    if first_other is None:
        assert fc is None
    else:
        assert fc["tensor"] == first_other[0] and ("block" in fc["fields"] or "chunk" in fc["fields"])
    # a diff of the legacy harness has one divergence, a choice: both keys agree
    ea, ma, eb, mb = model_runs(fixtures, "v2023-08-16-legacy", "ggml-2023-08-16")
    legacy = diff_graphs(ea, eb, ma, mb)
    assert legacy.first_choice_divergence == legacy.first_divergence


def test_block_minus_one_at_the_same_offset_is_the_same_choice(fixtures, store):
    """2023-08-28 prints `block -1` where 2023-08-16 prints the last block's index: the two
    measure runs of the harness graph choose alike, and the older one places one tensor fewer."""
    logs = [fixtures / f / "harness_plain.AT.log" for f in ("v2023-08-16-legacy", "v2023-08-28-parseseq")]
    old, new = (import_paths(store, [p])[0] for p in logs)
    measure_old, measure_new = (logged_runs(p)[0] for p in logs)
    assert any(b == -1 for _, b in measure_new) and not any(b == -1 for _, b in measure_old)
    d = diff_refs(store, f"{old}:0", f"{new}:0")
    assert d.first_divergence is None

    def placed(path):
        measure = path.read_text().split("harness: measure max_size", 1)[0]
        return len(ALLOC.findall(measure)) + measure.count("reusing ")

    assert (d.aligned["a"], d.aligned["b"]) == (placed(logs[0]), placed(logs[1]))
    assert d.aligned["b"] - d.aligned["a"] == 1 == d.aligned["b"] - d.aligned["count"]
