"""The plain-Python peak (traces/explain/peak_fast.py) answers exactly what numpy's `ggml_peak` answers.

Every ggml graph the test data holds (real logs of every generation, `alloctrace record` recordings
with CUDA and MoE models), preset replays that fit and ones that run out of space, graphs the head
allocator model places for random programs, and random event streams that put every rule on the same
bytes at once (ties, reuses without offsets, free_extra, realloc, several buffers and chunks, OOM).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from alloctrace.allocator import Gallocr, get_profile
from alloctrace.allocator.events import Event
from alloctrace.allocator.presets import PRESETS
from alloctrace.allocator.profiles import PROFILES
from alloctrace.traces.explain import peak, peak_fast, peak_types
from alloctrace.traces.explain.peak import ggml_peak
from alloctrace.traces.explain.peak_fast import ggml_peak_events, peak_of_events
from alloctrace.traces.replay.run import replay
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from realggml import ModelSide
from test_differential_ggml import programs
from test_memmap import synthetic_events

DATA = Path(__file__).resolve().parents[1] / "data"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ggml_graph_files() -> list[Path]:
    logs = [p for p in (DATA / "ggml-real").rglob("*") if p.is_file() and ".log" in p.name]
    return sorted(logs) + sorted((DATA / "explain").glob("*.log.gz")) + sorted(DATA.rglob("*.atrec*"))


def assert_same(events, capacity=None, names=None, sizes=None, where="") -> bool:
    """The fast peak equals the reference; True when the fast path answered."""
    fast = ggml_peak_events(events, capacity, names, sizes)
    ref = ggml_peak(events, capacity, names, sizes).to_json()
    if fast is not None:
        assert fast.to_json() == ref, where
    return fast is not None


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(label, events, capacity, buffer names, buffer sizes) of every stored ggml graph, as
    peak.graph_peak passes them."""
    s = open_store(tmp_path_factory.mktemp("store"))
    out = []
    try:
        for tid in import_paths(s, ggml_graph_files()):
            summary = s.summary(tid)
            for row in summary["graphs"]:
                g = row["index"]
                extra = s.graph_extra(tid, g)
                names = [t.get("name") for t in extra.get("buffer_types") or ()] or None
                out.append((f"{summary['name']}:{g}", s.events(tid, g), row["buffer_size"] if row["oom"] else None,
                            names, extra.get("real_sizes")))
    finally:
        s.close()
    return out


def test_every_stored_ggml_graph_takes_the_fast_path_with_the_same_peak(stored):
    fast = sum(assert_same(ev, cap, names, sizes, label) for label, ev, cap, names, sizes in stored)
    assert fast == len(stored) > 400  # every graph, not just most
    recorded = [ev for label, ev, *_ in stored if "atrec" in label or "tiny-llama" in label]
    assert len(recorded) > 100
    # the data exercises each rule the walk has
    assert sum(any(e.kind == "reuse" and e.offset is None for e in ev) for _, ev, *_ in stored) > 100
    assert sum(len({e.buffer for e in ev} - {None}) > 1 for _, ev, *_ in stored) > 10
    assert sum(any(e.kind == "realloc" for e in ev) for _, ev, *_ in stored) > 5
    assert any(cap for _, _, cap, *_ in stored)  # a real out-of-space failure


@pytest.mark.parametrize("profile", [n for n, p in PROFILES.items() if p.presets])
@pytest.mark.parametrize("preset", ["gpt2-tiny", "gpt2-117m", "llama-7b", "falcon-7b", "open-llama-3b"])
def test_preset_replays_have_the_same_peak(preset, profile):
    r = replay(preset, profile)
    for run in (r.measure, r.eval):
        assert assert_same(run.events, run.buffer_size, where=f"{preset} {profile} {run.role}")
    small = replay(preset, profile, buffer_size=r.measure.max_size // 3)  # the eval runs out of space
    peak_ = ggml_peak_events(small.eval.events, small.eval.buffer_size)
    assert peak_ is not None and peak_.failure is not None
    assert assert_same(small.eval.events, small.eval.buffer_size, where=f"{preset} {profile} small buffer")


def test_every_preset_measure_takes_the_fast_path():
    for preset in PRESETS:
        assert assert_same(replay(preset, "ggml-2023-08-28").measure.events, where=preset)


# --- graphs the head allocator model places ---------------------------------------------------
@st.composite
def model_graphs(draw):
    """Each graph's events of a sequence of random programs run through one head Gallocr whose chunk
    size is small enough, at times, to spread a graph over several chunks."""
    side = ModelSide()
    side.galloc = Gallocr(get_profile("ggml-head"), alignment=32,
                          max_buffer_size=draw(st.sampled_from([1 << 62, 4096, 1024, 256])))
    graphs, seen = [], 0
    for _ in range(draw(st.integers(1, 3))):
        program = draw(programs())
        side.start()
        for step in program.steps:
            side.step(step)
        side.finish(program.roots)
        graphs.append(side.galloc.events[seen:])
        seen = len(side.galloc.events)
    return graphs, side.galloc.events


@settings(max_examples=150, **SETTINGS)
@given(model_graphs())
def test_model_placed_graphs_have_the_same_peak(graphs):
    per_graph, whole = graphs
    for ev in per_graph + [whole]:
        assert assert_same(ev)


@pytest.mark.parametrize("seed", range(4))
def test_long_synthetic_streams_with_head_free_extras_have_the_same_peak(seed):
    """Allocs, frees, reuses whose tail goes back (free_extra) over a few thousand slots."""
    events = synthetic_events(6000, seed=seed, slots=64 << seed)
    assert sum(e.kind == "free_extra" for e in events) > 50
    assert assert_same(events)


# --- random event streams: every rule on the same few bytes -------------------------------------
NAMES = [None, "", "kq-1", "kq-2 (view)", "node_3", "cache_k_l0", "x"]


@st.composite
def events_streams(draw):
    n = draw(st.integers(0, 60))
    kinds = st.sampled_from(["alloc", "alloc", "reuse", "free", "free", "free_extra", "realloc", "oom",
                             "view", "exec", "input"])
    small = st.one_of(st.none(), st.sampled_from([0, 16, 32, 48, 64, 96, 128]))
    out = []
    for _ in range(n):
        out.append(Event(draw(kinds), tensor=draw(st.sampled_from(NAMES)),
                         op=draw(st.sampled_from([None, "ADD", "MUL_MAT"])), size=draw(small),
                         offset=draw(small), chunk=draw(st.sampled_from([None, 0, 0, 1, 2])),
                         buffer=draw(st.sampled_from([None, None, 0, 1])),
                         parent=draw(st.sampled_from(NAMES)), view_src=draw(st.sampled_from(NAMES)),
                         needed=draw(small), largest=draw(small)))
    capacity = draw(st.sampled_from([None, 0, 100, 4096]))
    names = draw(st.sampled_from([None, ["CPU"], ["CUDA0", "CUDA_Host"]]))
    sizes = draw(st.sampled_from([None, [64], [256, 1024]]))
    return out, capacity, names, sizes


@settings(max_examples=300, **SETTINGS)
@given(events_streams())
def test_random_streams_have_the_same_peak(stream):
    events, capacity, names, sizes = stream
    assert assert_same(events, capacity, names, sizes)


def test_values_outside_the_walks_range_go_to_the_reference():
    floats = [Event("alloc", tensor="a", size=64, offset=0), Event("alloc", tensor="b", size=32.0, offset=64)]
    assert ggml_peak_events(floats) is None  # not an int: what the columns make of it is theirs to say
    huge = [Event("alloc", tensor="a", size=64, offset=0), Event("alloc", tensor="b", size=64, offset=1 << 45)]
    assert ggml_peak_events(huge) is None  # past the 2**44 offsets a (chunk, offset) key holds
    assert peak_of_events(huge).to_json() == ggml_peak(huge).to_json()
    assert peak_of_events(huge).bytes == (1 << 45) + 64


def test_a_graph_over_the_limit_goes_to_the_reference(monkeypatch):
    events = replay("gpt2-tiny", "ggml-2023-08-28").measure.events
    monkeypatch.setattr(peak_fast, "MAX_EVENTS", len(events) - 1)
    assert ggml_peak_events(events) is None
    assert peak_of_events(events).to_json() == ggml_peak(events).to_json()


def test_a_large_graph_goes_to_numpy_once_it_is_loaded(monkeypatch):
    events = replay("gpt2-tiny", "ggml-2023-08-28").measure.events
    assert "numpy" in sys.modules  # this process has it: ggml_peak imported it
    assert peak_of_events(events).to_json() == ggml_peak(events).to_json()
    monkeypatch.setattr(peak_fast, "NUMPY_LOADED_MAX", len(events) - 1)

    def unused(*args):
        raise AssertionError("the walk ran")

    monkeypatch.setattr(peak_fast, "ggml_peak_events", unused)
    assert peak_of_events(events).to_json() == ggml_peak(events).to_json()


def test_peak_still_offers_the_moved_names():
    for name in ("GraphPeak", "Live", "Moment", "family_of", "families_json", "size_attribution", "text_table",
                 "attribution_lines", "MAX_HOLES", "TOP_TENSORS"):
        assert getattr(peak, name) is getattr(peak_types, name)


def test_the_fast_peak_never_imports_numpy():
    events = [dict(kind="alloc", tensor="a", size=64, offset=0), dict(kind="reuse", tensor="b", parent="a"),
              dict(kind="free", tensor="b", size=64, offset=0), dict(kind="alloc", tensor="c", size=32, offset=64)]
    code = ("import json, sys\n"
            "from alloctrace.allocator.events import Event\n"
            "from alloctrace.traces.explain.peak_fast import peak_of_events\n"
            f"p = peak_of_events([Event(**e) for e in {events!r}])\n"
            "print(json.dumps({'numpy': 'numpy' in sys.modules, 'peak': p.to_json()}))\n")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    cwd="/").stdout)
    assert out["numpy"] is False
    assert out["peak"] == ggml_peak([Event(**e) for e in events]).to_json()
    assert out["peak"]["peak"]["bytes"] == 96
