"""Imported allocations carry the op the log's exec lines name, as the model's own events do."""
import pytest

from alloctrace.traces import import_paths
from alloctrace.traces.store.store import open_store

from test_fidelity_harness import CASES_2023, run_2023
from alloctrace.allocator import get_profile
from conftest import load_harness


@pytest.mark.parametrize("folder,name,profile", CASES_2023)
def test_alloc_ops_match_the_model(fixtures, tmp_path, folder, name, profile):
    desc = load_harness(fixtures / folder / f"{name}.json")
    runs = run_2023(desc, get_profile(profile))
    store = open_store(tmp_path / "s")
    try:
        (tid,) = import_paths(store, [fixtures / folder / f"{name}.AT.log"])
        for g, run in enumerate(runs):
            theirs = [(e.tensor, e.op) for e in store.events(tid, g) if e.kind == "alloc"]
            ours = [(e.tensor, e.op) for e in run.events if e.kind == "alloc"]
            if run.failed is not None:  # the failing allocation: the log never says what it was for
                assert theirs[-1] == (run.failed.tensor, None)
                theirs, ours = theirs[:-1], ours[:-1]
            assert theirs == ours
            assert {op for _, op in theirs} >= {"NONE", "MUL_MAT", "NORM"}
            reuses = lambda evs: [(e.tensor, e.parent, e.op) for e in evs if e.kind == "reuse"]
            assert reuses(store.events(tid, g)) == reuses(run.events)
    finally:
        store.close()
