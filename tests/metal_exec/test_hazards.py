"""Static hazard checks of allocation plans on the real harness graphs and on hand-made broken plans."""
import json
import random

import pytest

from alloctrace.allocator import KINDS, LegacyAllocator, get_profile, render
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness
from alloctrace.allocator.tensor import Graph, Tensor
from alloctrace.cli import main
from alloctrace.metal_exec.hazards import (CONCURRENT_OVERLAP, OVERWRITE_LIVE, STALE_READ, IntervalMap, check)
from alloctrace.metal_exec.plan import (Plan, harness_plans, levels_from_parse_seq, plan_from_legacy, read_srcs,
                                        root_of, writes)

PLAIN = "v2023-08-16-legacy/harness_plain.json"
PARSESEQ = "v2023-08-28-parseseq/harness_parseseq.json"
HEAD = "head-gallocr/harness_gallocr.json"
GENEROUS = 1 << 20  # a fixed compute buffer much larger than needed: the real walk places as the measure did

CLEAN = [
    (PLAIN, "ggml-2023-08-16", False), (PLAIN, "ggml-2023-08-28", False), (PLAIN, "ggml-head", False),
    (PARSESEQ, "ggml-2023-08-16", False), (PARSESEQ, "ggml-2023-08-28", False), (PARSESEQ, "ggml-head", False),
    (PARSESEQ, "ggml-2023-08-28", True),  # parse_seq levels run concurrently, frees wait for barriers
    (HEAD, "ggml-head", False),
    # every generation row runs the model: the later rows on the harness graphs too
    (PLAIN, "ggml-2023-10", False), (HEAD, "ggml-2024-02", False), (HEAD, "ggml-2025-09", False),
]


def plans_for(fixtures, name, profile, parse_seq=False, **kw):
    return harness_plans(load_harness(fixtures / name), profile, parse_seq, **kw)


@pytest.mark.parametrize("buffer_size", [None, GENEROUS])
@pytest.mark.parametrize("name,profile,parse_seq", CLEAN)
def test_plans_of_every_profile_have_no_hazards(fixtures, name, profile, parse_seq, buffer_size):
    plans = plans_for(fixtures, name, profile, parse_seq, buffer_size=buffer_size)
    assert plans
    for plan in plans:
        assert plan.concurrent == parse_seq
        in_buffer = [t for t, r in plan.ranges.items() if r is not None]
        assert len(in_buffer) > 20  # the checker had something to look at
        assert check(plan) == []


def test_pure_reorder_parse_seq_is_serially_safe(fixtures):
    """08-16 applied parse_seq as a reorder with immediate frees: fine when nodes run one at a time."""
    plan = plans_for(fixtures, PARSESEQ, "ggml-2023-08-16", True, concurrent=False, buffer_size=GENEROUS)[0]
    assert [i for step in plan.steps() for i in step] == [i for i in load_harness(fixtures / PARSESEQ)["parse_seq"] if i >= 0]
    assert check(plan) == []


def test_immediate_frees_race_inside_a_concurrent_level(fixtures):
    """PR #2627's reorder with immediate frees, dispatched level by level (what #2757 fixed), is flagged."""
    plan = plans_for(fixtures, PARSESEQ, "ggml-2023-08-16", True, buffer_size=GENEROUS)[0]
    hazards = check(plan)
    assert hazards and {h.reason for h in hazards} == {CONCURRENT_OVERLAP}
    nodes = {t.name: t for t in plan.graph.nodes}
    steps = plan.steps()
    for h in hazards:
        assert h.kind == "hazard" and h.kind in KINDS
        writer, reader = nodes[h.tensor], nodes[h.extra["other"]]
        level = steps[h.extra["step"]]
        assert writer.index in level and reader.index in level and writer is not reader
        victim = next(s for s in read_srcs(reader) if s.name == h.parent)
        w, r = plan.range(writer), plan.range(victim)
        assert (h.offset, h.offset + h.size) == (max(w[0], r[0]), min(w[1], r[1]))
        # the victim's memory was freed inside that level and handed to the writer's destination
        assert root_of(victim)[0] is not root_of(writer)[0]


def test_the_race_is_the_allocators_doing(fixtures):
    """The writer's block was freed by a node of the same level, before the level's barrier."""
    desc = load_harness(fixtures / PARSESEQ)
    g = graph_from_json(desc)
    alloc = LegacyAllocator.real(get_profile("ggml-2023-08-16"), 0x10000, GENEROUS, 16)
    for name in desc["explicit_allocs_before_graph"]:
        alloc.alloc_tensor(g.by_name(name))
    alloc.alloc_graph(g, parse_seq=desc["parse_seq"])
    plan = plan_from_legacy(g, alloc, desc["parse_seq"])
    h = check(plan)[0]
    writer_root = root_of(g.by_name(h.tensor))[0]
    level = set(plan.steps()[h.extra["step"]])
    alloc_ev = next(e for e in alloc.events if e.kind == "alloc" and e.tensor == writer_root.name)
    freed_before = [e for e in alloc.events[:alloc.events.index(alloc_ev)]
                    if e.kind == "free" and e.node in level and e.offset <= alloc_ev.offset < e.offset + e.size]
    assert freed_before, "the writer's block should come from a free inside its own level"


def test_barrier_frees_make_the_same_levels_safe(fixtures):
    plan = plans_for(fixtures, PARSESEQ, "ggml-2023-08-28", True, buffer_size=GENEROUS)[0]
    assert plan.concurrent and any(len(level) > 1 for level in plan.levels)
    assert check(plan) == []


def live_pairs(plan: Plan):
    """(node, victim): the victim's value is written before the node runs and read after it."""
    order = [i for step in plan.steps() for i in step]
    pos = {i: k for k, i in enumerate(order)}
    last_read = {}
    for i in order:
        for s in read_srcs(plan.graph.nodes[i]):
            last_read[root_of(s)[0]] = pos[i]
    for t in plan.graph.nodes:
        for v in plan.graph.nodes:
            if writes(t) and writes(v) and root_of(t)[0] is t and root_of(v)[0] is v and t is not v \
                    and plan.range(v) and pos[v.index] < pos[t.index] < last_read.get(v, -1) \
                    and t.nbytes <= v.nbytes:
                yield t, v


@pytest.mark.parametrize("name,profile", [(PLAIN, "ggml-2023-08-28"), (HEAD, "ggml-head")])
def test_a_tensor_moved_onto_a_live_one_is_caught(fixtures, name, profile):
    plan = plans_for(fixtures, name, profile)[0]
    t, victim = next(live_pairs(plan))
    broken = plan.moved(t, plan.range(victim)[0])
    assert broken.range(t)[0] == plan.range(victim)[0] and plan.range(t) != broken.range(t)
    hazards = check(broken)
    assert any(h.reason == OVERWRITE_LIVE and h.tensor == t.name and h.parent == victim.name for h in hazards)
    assert any(h.reason == STALE_READ and h.parent == victim.name and h.extra["overwriter"] == t.name
               for h in hazards)


def test_legacy_allocators_ignore_output_flags(fixtures):
    """The head harness marks attn_o an output; 2023 walks reuse it inplace, gallocr keeps it."""
    for profile in ("ggml-2023-08-16", "ggml-2023-08-28"):
        hazards = [h for p in plans_for(fixtures, HEAD, profile) for h in check(p)]
        assert hazards and all(h.reason == OVERWRITE_LIVE and h.parent == "attn_o"
                               and h.extra["reader"] == "<graph output>" for h in hazards)
    assert all(check(p) == [] for p in plans_for(fixtures, HEAD, "ggml-head"))


def test_hazard_events_serialize_and_render_nothing(fixtures):
    plan = plans_for(fixtures, PARSESEQ, "ggml-2023-08-16", True, buffer_size=GENEROUS)[0]
    hazards = check(plan)
    d = hazards[0].to_dict()
    assert d["kind"] == "hazard" and {"tensor", "parent", "offset", "size", "reason"} <= set(d)
    json.dumps(d)
    assert render(hazards, get_profile("ggml-2023-08-16")) == []  # not an allocator log line


# --- the interval map against a per-byte model ----------------------------------------------------
def test_interval_map_matches_a_byte_array():
    rng = random.Random(7)
    im, ref = IntervalMap(), [None] * 200
    for step in range(400):
        a = rng.randrange(0, 200)
        b = rng.randrange(a, 201)
        if rng.random() < 0.6:
            im.assign(a, b, step)
            ref[a:b] = [step] * (b - a)
        got = [None] * (b - a)
        for s, e, label in im.overlapping(a, b):
            assert a <= s < e <= b
            got[s - a:e - a] = [label] * (e - s)
        assert got == ref[a:b]
        gaps = [k for s, e in im.gaps(a, b) for k in range(s, e)]
        assert gaps == [k for k in range(a, b) if ref[k] is None]
        assert all(x < y for x, y in zip(im.starts, im.starts[1:]))
        assert all(e <= s for e, s in zip(im.ends, im.starts[1:]))


# --- small hand-made graphs ------------------------------------------------------------------------
def chain(n_layers: int, width: int = 64):
    """x -> (MUL_MAT w, ADD b, UNARY, ADD residual) per layer: inplace reuse and residual reads."""
    x = Tensor("x", ne=(width, 4))
    leafs, nodes, cur = [x], [], x
    for i in range(n_layers):
        w = Tensor(f"w{i}", ne=(width, width), data=0x7F0000000000 + i * (1 << 20))
        b = Tensor(f"b{i}", ne=(width, 4), data=0x7F0000080000 + i * (1 << 20))
        leafs += [w, b]
        mm = Tensor(f"mm{i}", "MUL_MAT", ne=(width, 4), srcs=[w, cur])
        ad = Tensor(f"add{i}", "ADD", ne=(width, 4), srcs=[mm, b])
        ac = Tensor(f"act{i}", "UNARY", ne=(width, 4), srcs=[ad], op_desc="SILU")
        res = Tensor(f"res{i}", "ADD", ne=(width, 4), srcs=[ac, cur])
        nodes += [mm, ad, ac, res]
        cur = res
    return Graph(nodes, leafs)


def chain_plan(n_layers):
    g = chain(n_layers)
    alloc = LegacyAllocator.measure(get_profile("ggml-2023-08-28"), 16)
    alloc.alloc_tensor(g.leafs[0])
    alloc.alloc_graph(g)
    return plan_from_legacy(g, alloc)


def test_chain_plan_is_clean_and_inplace_reuse_is_legal():
    plan = chain_plan(6)
    g = plan.graph
    shared = [t for t in g.nodes if any(plan.range(s) == plan.range(t) for s in t.srcs if s is not None)]
    assert shared, "the chain should have inplace reuse"
    assert check(plan) == []


def test_reading_before_the_writer_ran_is_a_stale_read():
    plan = chain_plan(2)
    g = plan.graph
    order = list(range(g.n_nodes))
    order[0], order[1] = order[1], order[0]  # add0 now runs before mm0 wrote its source
    bad = Plan(g, plan.ranges, [[i] for i in order], False, plan.buffer_size)
    hazards = check(bad)
    assert any(h.reason == STALE_READ and h.tensor == "add0" and h.parent == "mm0" for h in hazards)


def test_parse_seq_levels_are_validated():
    assert levels_from_parse_seq([0, -1, 2, 1, -1, 3], 4) == [[0], [2, 1], [3]]
    for bad in ([0, -1, 1], [0, 1, 2, 5], [0, 0, 1, 2]):
        with pytest.raises(ValueError):
            levels_from_parse_seq(bad, 3)


# --- the command --------------------------------------------------------------------------------
def test_cli_exit_status_four_when_flagged(fixtures, capsys):
    path = str(fixtures / PARSESEQ)
    rc = main(["check", "--harness", path, "--profile", "ggml-2023-08-16", "--parse-seq",
               "--buffer-size", str(GENEROUS), "--json"])
    out = capsys.readouterr().out
    assert rc == 4
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert events and all(e["kind"] == "hazard" and e["reason"] == CONCURRENT_OVERLAP for e in events)
    assert main(["check", "--harness", path, "--profile", "ggml-2023-08-28", "--parse-seq"]) == 0
    assert "0 hazards" in capsys.readouterr().out


def test_cli_bad_input_is_one_line(fixtures, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["check", "--harness", str(bad)]) == 2
    assert main(["check", "--harness", str(fixtures / HEAD), "--profile", "ggml-head", "--parse-seq"]) == 2
    assert main(["check", "--harness", str(fixtures / PLAIN), "--profile", "nope"]) == 2
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("alloctrace: error: ") for line in lines)
    assert "Traceback" not in err


def test_the_prechunk_model_decides_like_head_in_one_chunk(fixtures):
    """The fixtures README: the pre-chunk gallocr's decisions equal the chunked head's when one chunk holds
    everything; the model under each profile places every tensor of the head harness graphs alike."""
    def placements(profile):
        return [sorted((t.name, r) for t, r in plan.ranges.items() if r is not None)
                for plan in plans_for(fixtures, HEAD, profile)]
    assert placements("ggml-2025-09") == placements("ggml-head")
