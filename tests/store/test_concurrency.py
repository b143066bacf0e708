"""Metal's concurrency reorder: levels respect dependencies, barriers close each level."""
import pytest

from alloctrace.allocator.build import Ctx
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness
from alloctrace.allocator.presets import family_of, get_preset
from alloctrace.metal_exec import MAX_CONCUR_2023, find_concurrency, report


def levels_of(seq):
    out, cur = [], []
    for i in seq:
        if i == -1:
            out.append(cur)
            cur = []
        else:
            cur.append(i)
    assert cur == [], "the list must end with a barrier"
    return out


def diamond():
    """x -> a, b (independent) -> c; d depends only on leafs; e on c and d."""
    ctx = Ctx(legacy=True)
    x = ctx.set_name(ctx.new_tensor_1d("f32", 8), "x")
    w = ctx.set_name(ctx.new_tensor_1d("f32", 8), "w")
    a = ctx.set_name(ctx.sqr(x), "a")
    b = ctx.set_name(ctx.mul(x, w), "b")
    c = ctx.set_name(ctx.add(a, b), "c")
    d = ctx.set_name(ctx.sqr(w), "d")
    e = ctx.set_name(ctx.add(c, d), "e")
    return ctx.build_forward(e)


def test_small_graph_levels_respect_dependencies():
    g = diamond()
    seq = find_concurrency(g)
    levels = levels_of(seq)
    name = lambda i: g.nodes[i].name
    assert [[name(i) for i in lv] for lv in levels] == [["a", "b", "d"], ["c"], ["e"]]
    assert len(seq) == g.n_nodes + len(levels)
    level_of = {i: k for k, lv in enumerate(levels) for i in lv}
    for i, node in enumerate(g.nodes):
        for s in node.srcs:
            if s in g.nodes:
                assert level_of[g.nodes.index(s)] < level_of[i]
    assert sorted(i for i in seq if i != -1) == list(range(g.n_nodes))


def test_levels_match_the_harness_fixture(fixtures):
    """The real harness computed the same levels (it listed each level in descending order)."""
    d = load_harness(fixtures / "v2023-08-28-parseseq" / "harness_parseseq.json")
    ours = levels_of(find_concurrency(graph_from_json(d)))
    theirs = levels_of(d["parse_seq"])
    assert [sorted(lv) for lv in ours] == [sorted(lv) for lv in theirs]
    assert all(lv == sorted(lv) for lv in ours)  # Metal appends in index order


def test_memory_check_scan_agrees_when_nothing_overlaps():
    g = diamond()
    addr = {t: 0x1000 * (k + 1) for k, t in enumerate(g.nodes)}
    assert find_concurrency(g, check_mem=True, addr=addr.get) == find_concurrency(g)


def test_memory_check_defers_a_node_whose_memory_an_unscheduled_earlier_node_writes():
    """d may not run before c when they share memory; nodes already placed in the level do not count."""
    g = diamond()
    by = {t.name: t for t in g.nodes}
    addr = {t: 0x1000 * (k + 1) for k, t in enumerate(g.nodes)}
    addr[by["d"]] = addr[by["c"]]
    names = [[g.nodes[i].name for i in lv] for lv in levels_of(find_concurrency(g, check_mem=True, addr=addr.get))]
    assert names == [["a", "b"], ["c", "d"], ["e"]]
    addr[by["d"]] = addr[by["b"]]  # b is placed before d is considered: no conflict
    names = [[g.nodes[i].name for i in lv] for lv in levels_of(find_concurrency(g, check_mem=True, addr=addr.get))]
    assert names == [["a", "b", "d"], ["c"], ["e"]]


def test_memory_check_on_unallocated_graph():
    """Before allocation every node's data is NULL, so every range 'overlaps' an unscheduled node's."""
    g = diamond()
    names = [[g.nodes[i].name for i in lv] for lv in levels_of(find_concurrency(g, check_mem=True))]
    assert names == [["a", "b"], ["c", "d"], ["e"]]


def _llama_seq(name):
    preset = get_preset(name)
    fam = family_of(preset)
    model = fam.new_model(preset.hparams, 512, "ggml-2023-08-16")
    g = fam.build_graph(model, 512, 0, lambda t: None, "ggml-2023-08-16")
    return g, find_concurrency(g)


@pytest.mark.parametrize("name,overflows", [("open-llama-3b", False), ("llama2-70b", True)])
def test_parse_seq_overflow_of_the_2023_array(name, overflows):
    g, seq = _llama_seq(name)
    r = report(seq)
    assert r.length == g.n_nodes + r.n_levels == len(seq)
    assert r.capacity == MAX_CONCUR_2023 == 4096
    assert r.overflows is overflows
