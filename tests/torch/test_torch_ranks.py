"""Many ranks: a directory (or several files) of per-rank snapshots as one trace, and the ranks compared.
The ranks here are real single-GPU snapshots (tests/data/torch) standing in for a job's ranks."""
from __future__ import annotations

import json
import shutil

import pytest

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store
from alloctrace.traces.diff.torch_ranks import compare
from alloctrace.traces.sources.ranks import rank_of
from alloctrace.traces.store.torch_stored import device_info
from torchsnap import DATA, sidecar


def job(tmp_path, files: dict[int, str]):
    d = tmp_path / "job"
    d.mkdir()
    for rank, name in files.items():
        shutil.copy(DATA / f"{name}.pickle.gz", d / f"snapshot_rank{rank}.pickle.gz")
    return d


def test_a_directory_imports_as_one_trace_with_a_device_per_rank(tmp_path, capsys):
    d = job(tmp_path, {1: "gpt2_train_bs16", 0: "gpt2_train_bs8"})
    assert main(["import", "--store", str(tmp_path / "s"), "--json", str(d)]) == 0
    [t] = json.loads(capsys.readouterr().out)["traces"]
    assert t["name"] == "job" and [x["rank"] for x in t["devices"]] == [0, 1]
    store = open_store(str(tmp_path / "s"))
    for rank, name in ((0, "gpt2_train_bs8"), (1, "gpt2_train_bs16")):
        truth = sidecar(name)
        info = device_info(store, t["id"], rank)
        assert info["rank"] == rank and info["file"] == f"snapshot_rank{rank}.pickle.gz"
        assert info["peak_reserved"] == truth["ground_truth"]["max_memory_reserved"]
        assert info["peak_requested"] == truth["memory_stats_subset"]["requested_bytes.all.peak"]


def test_compare_names_the_rank_that_ran_out_and_what_differed(tmp_path, capsys):
    d = job(tmp_path, {0: "gpt2_train_bs8", 1: "oom", 2: "gpt2_train_bs16"})
    assert main(["import", "--store", str(tmp_path / "s"), str(d)]) == 0
    capsys.readouterr()
    store = open_store(str(tmp_path / "s"))
    [t] = store.list()
    c = compare(store, t["id"])
    assert c["oom_ranks"] == [1] and [r["rank"] for r in c["ranks"]] == [0, 1, 2]
    oom = sidecar("oom")
    r1 = c["ranks"][1]
    assert r1["peak_reserved"] == oom["ground_truth"]["max_memory_reserved"] and r1["oom"]["requested"] == 48 << 20
    for r in c["ranks"]:
        assert 0 <= r["fragmentation"] <= r["peak_reserved"]
    cmp_ = c["compared"]
    assert (cmp_["b_rank"], cmp_["why"]) == (1, "ran out of memory") and cmp_["a_rank"] == 0
    assert cmp_["delta_requested"] == r1["peak_requested"] - c["ranks"][0]["peak_requested"]
    assert cmp_["by_call_site"] and all(x["delta"] for x in cmp_["by_call_site"])
    assert main(["peak", "--store", str(tmp_path / "s"), t["id"], "--ranks"]) == 0
    out = capsys.readouterr().out
    assert "out of memory: rank 1" in out and "rank 1 (ran out of memory) against rank 0" in out
    assert f"{oom['ground_truth']['max_memory_reserved']:,}" in out


def test_several_files_with_ranks_flag_and_bad_inputs(tmp_path, capsys):
    a, b = tmp_path / "r0.pickle.gz", tmp_path / "r1.pickle.gz"
    shutil.copy(DATA / "small_default.pickle.gz", a)
    shutil.copy(DATA / "small_gc.pickle.gz", b)
    assert main(["import", "--store", str(tmp_path / "s"), "--ranks", "--name", "two", str(a), str(b)]) == 0
    store = open_store(str(tmp_path / "s"))
    [t] = store.list()
    assert t["name"] == "two" and len(store.summary(t["id"])["graphs"]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["import", "--store", str(tmp_path / "s"), str(empty)]) == 2
    assert "no snapshot files" in capsys.readouterr().err
    dup = job(tmp_path, {0: "small_default"})
    shutil.copy(DATA / "small_gc.pickle.gz", dup / "other-rank0.pickle.gz")
    assert main(["import", "--store", str(tmp_path / "s"), str(dup)]) == 2
    assert "rank 0 appears in more than one file" in capsys.readouterr().err
    assert len(store.list()) == 1  # nothing half-stored


def test_rank_from_sidecar_name_or_position(tmp_path):
    p = tmp_path / "pid77.pickle"
    p.write_bytes(b"")
    assert rank_of(p, 5) == 5
    (tmp_path / "pid77.json").write_text('{"rank": 3}')
    assert rank_of(p, 5) == 3
    assert rank_of(tmp_path / "trace_rank_12.pickle.gz", 0) == 12
