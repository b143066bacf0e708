"""The server's state index (changes only, from checkpoints) gives exactly state_at, in any order."""
from __future__ import annotations

import random

import pytest

from alloctrace.traces.state.index import StateIndex, column_changes
from alloctrace.traces.sources import import_paths
from alloctrace.traces.state.free_list import states_at
from alloctrace.traces.store.store import open_store
from test_memmap import columns_of, synthetic_events


@pytest.fixture(scope="module")
def big():
    events = synthetic_events(120_000, seed=5)
    return events, columns_of(events)


def test_random_events_of_a_large_graph_equal_state_at(big, monkeypatch):
    events, cols = big
    monkeypatch.setattr(StateIndex, "step", 4096)
    index = StateIndex(cols, None)
    rng = random.Random(3)
    points = [rng.randrange(len(events) + 1) for _ in range(40)] + [0, 1, len(events) - 1, len(events)]
    want = states_at(events, points)  # one event-by-event pass, the reference
    rng.shuffle(points)
    for n in points:
        assert index.state(n) == want[n], n
    # checkpoints exist only up to the furthest event asked for, one per step
    assert sorted(index.checkpoints) == list(range(0, max(points) + 1, 4096))


def test_changes_are_the_free_list_events_only(big):
    events, cols = big
    ch = column_changes(cols)
    kinds = [events[i].kind for i in ch.event.tolist()]
    assert set(kinds) <= {"alloc", "free", "free_extra", "reuse", "realloc"}
    assert len(kinds) == sum(e.kind in ("alloc", "free", "free_extra", "reuse") for e in events)
    assert not ch.needs_names  # every synthetic reuse carries its offset


def test_imported_head_log_with_named_reuses(fixtures, tmp_path):
    """Head logs name a reuse's parent but not its bytes: the index must track names like state_at."""
    store = open_store(tmp_path)
    (tid,) = import_paths(store, [fixtures / "head-gallocr" / "harness_gallocr.AT.log"])
    checked = 0
    for g in range(len(store.summary(tid)["graphs"])):
        events, cols = store.events(tid, g), store.columns(tid, g)
        index = StateIndex(cols, None)
        index.step = 5
        points = list(range(len(events) + 1))
        want = states_at(events, points)
        random.Random(g).shuffle(points)
        for n in points:
            assert index.state(n) == want[n], (g, n)
        checked += column_changes(cols).needs_names
    assert checked  # at least one graph exercised the name lookup
    store.close()


def test_out_of_range_is_refused(big):
    events, cols = big
    index = StateIndex(cols, None)
    with pytest.raises(ValueError):
        index.state(len(events) + 1)
