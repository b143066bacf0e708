"""The model reproduces real ggml logs of the harness graphs, line for line."""
import pytest

from alloctrace.allocator import LAYOUTS, Gallocr, LegacyAllocator, get_profile, render
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness

from conftest import allocator_lines

CASES_2023 = [
    ("v2023-08-16-legacy", "harness_plain", "ggml-2023-08-16"),
    ("v2023-08-28-parseseq", "harness_plain", "ggml-2023-08-28"),
    ("v2023-08-28-parseseq", "harness_parseseq", "ggml-2023-08-28"),
]


def run_2023(desc, profile):
    """The harness program's flow: explicit allocs, measure walk, then the same in a real buffer."""
    g = graph_from_json(desc)
    runs = []
    for alloc in (LegacyAllocator.measure(profile, desc["alignment"]),
                  LegacyAllocator.real(profile, LAYOUTS["linux"].buffer_base, desc["real_buffer_size"],
                                       desc["alignment"])):
        for name in desc["explicit_allocs_before_graph"]:
            alloc.alloc_tensor(g.by_name(name))
        alloc.alloc_graph(g, parse_seq=desc["parse_seq"] or None)
        runs.append(alloc)
    return runs


@pytest.mark.parametrize("folder,name,profile", CASES_2023)
def test_2023_harness_log_identical(fixtures, folder, name, profile):
    desc = load_harness(fixtures / folder / f"{name}.json")
    p = get_profile(profile)
    measure, real = run_2023(desc, p)
    assert measure.t.max_size == desc["measure_max_size"]
    ours = render(measure.events, p) + render(real.events, p)
    theirs = allocator_lines(fixtures / folder / f"{name}.AT.log")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"line {i + 1}: model {a!r} != real {b!r}"
    assert len(ours) == len(theirs)


def test_legacy_failure_is_a_clean_oom_event(fixtures):
    desc = load_harness(fixtures / "v2023-08-16-legacy" / "harness_plain.json")
    _, real = run_2023(desc, get_profile("ggml-2023-08-16"))
    oom = real.failed
    assert oom is not None and oom.kind == "oom"
    assert (oom.tensor, oom.needed, oom.largest) == ("fc_b", 4096, 2064)
    assert real.events[-1] is oom


def test_fixed_allocator_fits_the_same_graph(fixtures):
    desc = load_harness(fixtures / "v2023-08-28-parseseq" / "harness_plain.json")
    _, real = run_2023(desc, get_profile("ggml-2023-08-28"))
    assert real.failed is None
    assert real.t.max_size == 12304


def test_head_multi_graph_log_identical(fixtures):
    desc = load_harness(fixtures / "head-gallocr" / "harness_gallocr.json")
    p = get_profile("ggml-head")
    galloc = Gallocr(p, desc["alignment"])
    sizes = []
    for gd in desc["graphs"]:
        galloc.alloc_graph(graph_from_json(gd, legacy=False), graph_index=gd["step"])
        sizes.append(galloc.buffer_size)
    assert sizes == [20512, 20512, 41024, 41024, 41024]
    ours = render(galloc.events, p)
    theirs = allocator_lines(fixtures / "head-gallocr" / "harness_gallocr.AT.log")
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"line {i + 1}: model {a!r} != real {b!r}"
    assert len(ours) == len(theirs)
    # graph 1 fits graph 0's plan: ggml prints nothing for it, and the model says so
    assert [e.graph for e in galloc.events if e.kind == "plan_reused"] == [1]
