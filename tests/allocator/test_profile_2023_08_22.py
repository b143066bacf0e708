"""ggml f03d74aa (2023-08-22): PR #2639's last-block fallback, but parse_seq still a pure reorder.

That generation fixed the 70B out-of-space failure and still freed tensors
while Metal ran their readers' level concurrently: the race PR #2757 fixed.
"""
from alloctrace.allocator import LegacyAllocator, get_profile
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness
from alloctrace.traces.replay.run import replay
from alloctrace.metal_exec.execute import run
from alloctrace.metal_exec.hazards import CONCURRENT_OVERLAP, check
from alloctrace.metal_exec.plan import harness_plans

PARSESEQ = "v2023-08-28-parseseq/harness_parseseq.json"


def test_profile_combines_the_fallback_with_immediate_frees():
    p = get_profile("ggml-2023-08-22")
    assert p.best_fit_skips_last and p.parse_seq == "reorder" and p.assert_line == 139


def test_70b_metal_replay_fits_with_the_fallback():
    r = replay("llama2-70b", "ggml-2023-08-22", n_ctx=512, n_batch=512, metal_concurrency=True)
    assert r.eval.alloc.failed is None
    assert r.eval.max_size == r.measure.max_size
    assert replay("llama2-70b", "ggml-2023-08-16", n_ctx=512, n_batch=512,
                  metal_concurrency=True).eval.alloc.failed.needed == 58720256


def test_harness_levels_race_in_the_programs_own_buffer(fixtures):
    """In the harness's real buffer, 08-22 hands bytes freed inside a level to a sibling of their reader."""
    desc = load_harness(fixtures / PARSESEQ)
    plan = harness_plans(desc, "ggml-2023-08-22", True)[0]
    assert plan.concurrent
    hazards = check(plan)
    assert hazards and {h.reason for h in hazards} == {CONCURRENT_OVERLAP}
    assert {(h.tensor, h.parent) for h in hazards} >= {("V_trans", "Qcur")}
    result = run(plan, "adversarial")
    assert not result.ok
    assert (result.first.tensor, result.first.reader, result.first.overwriter) == ("Qcur", "Q_cont", "V_trans")
    # the same levels under the barrier semantics of 08-28 are safe
    fixed = harness_plans(desc, "ggml-2023-08-28", True)[0]
    assert check(fixed) == [] and run(fixed, "adversarial").ok


def test_serial_walk_is_08_28s_until_the_silent_return(fixtures):
    """Without parse_seq, 08-22 chooses blocks as 08-28 does; but it still has the silent return in
    allocate_node that PR #2757's second commit removed: a refused view parent leaves the node unallocated."""
    desc = load_harness(fixtures / "v2023-08-28-parseseq/harness_plain.json")
    g = graph_from_json(desc)
    a = LegacyAllocator.measure(get_profile("ggml-2023-08-22"), 16)
    b = LegacyAllocator.measure(get_profile("ggml-2023-08-28"), 16)
    for alloc in (a, b):
        for name in desc["explicit_allocs_before_graph"]:
            alloc.alloc_tensor(g.by_name(name))
        alloc.alloc_graph(g)
    rows = lambda alloc: [(e.kind, e.tensor, e.block, e.offset) for e in alloc.events]
    split = next(i for i, (x, y) in enumerate(zip(rows(a), rows(b))) if x != y)
    assert rows(b)[split] == ("alloc", "result", -1, 2064)  # 08-28 allocates the last node
    assert rows(a)[split][:2] == ("exec", "result")  # 08-22 goes straight to exec
    assert a.addr(g.by_name("result")) == 0 and b.addr(g.by_name("result")) != 0
    assert b.t.max_size == desc["measure_max_size"]


def test_import_reads_an_08_22_log(fixtures, tmp_path):
    """08-22 chooses blocks as 08-28 does, so a serial log of either replays consistently under it."""
    from alloctrace.traces import import_paths
    from alloctrace.traces.store.store import open_store

    store = open_store(tmp_path / "store")
    try:
        (tid,) = import_paths(store, [fixtures / "v2023-08-28-parseseq/harness_plain.AT.log"],
                              generation="ggml-2023-08-22")
        summary = store.summary(tid)
    finally:
        store.close()
    assert summary["generation"] == "ggml-2023-08-22"
    assert [g["max_size"] for g in summary["graphs"]] == [12304, 12304]
    assert all(g["consistent"] for g in summary["graphs"])
