"""Snapshots the record hook wrote inside real programs on a GPU (tests/data/torch/recorded): dumped at exit, at
an uncaught OutOfMemoryError, at SIGTERM, and per rank of a 2-rank torchrun job; each imports with the
allocator's own counters, exactly, and the ranks come from the hook's sidecars."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.diff.torch_ranks import compare
from alloctrace.traces.sources.ranks import import_ranks
from alloctrace.traces.store.torch_stored import device_info

REC = Path(__file__).parents[1] / "data" / "torch" / "recorded"


@pytest.mark.parametrize("run,reason,status", [("train", "exit", 0), ("oom", "oom", 1), ("sigterm", "sigterm", 143)])
def test_each_dump_imports_with_the_allocators_own_counters(tmp_path, run, reason, status):
    [snap] = (REC / run).glob("*.pickle.gz")
    facts = json.loads(snap.with_name(snap.name.replace(".pickle.gz", ".json")).read_text())
    truth = json.loads((REC / run / "truth.json").read_text())
    assert facts["reason"] == reason and (REC / run / "status").read_text().split() == ["exit", str(status)]
    store = open_store(str(tmp_path / "s"))
    [tid] = import_paths(store, [snap])
    info = device_info(store, tid, 0)
    assert info["peak_requested"] == truth["memory_stats"]["requested_bytes.all.peak"]
    assert info["peak_reserved"] == truth["max_memory_reserved"]
    assert info["consistent"] is True
    if run == "oom":
        assert info["oom"]["requested"] == 96 << 20 and truth["memory_stats"]["num_ooms"] == 1


def test_the_two_ranks_of_a_torchrun_job(tmp_path, capsys):
    store = open_store(str(tmp_path / "s"))
    [t] = import_ranks(store, [REC / "ddp"])
    assert [d["rank"] for d in t["report"]["devices"]] == [0, 1]
    for r in (0, 1):
        truth = json.loads((REC / "ddp" / f"truth-rank{r}.json").read_text())
        info = device_info(store, t["id"], r)
        assert info["rank"] == r and info["cuda_device"] == truth["gpu"] == 0  # both ranks on one GPU
        assert info["peak_requested"] == truth["requested_peak"]
        assert info["peak_reserved"] == truth["max_memory_reserved"]
    c = compare(store, t["id"])
    assert c["oom_ranks"] == [] and (c["compared"]["b_rank"], c["compared"]["why"]) == (1, "highest peak")
    t1 = json.loads((REC / "ddp" / "truth-rank1.json").read_text())
    t0 = json.loads((REC / "ddp" / "truth-rank0.json").read_text())
    assert c["compared"]["delta_requested"] == t1["requested_peak"] - t0["requested_peak"]
    assert c["compared"]["delta_reserved"] == t1["max_memory_reserved"] - t0["max_memory_reserved"]
    assert main(["peak", t["id"], "--ranks", "--store", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "rank 1 (highest peak) against rank 0" in out and f"{t1['max_memory_reserved']:,}" in out
