"""What-if predictions checked against real runs: one training workload (a 6-layer transformer, AdamW, five
steps of changing shapes, 3.5 GB peak allocated) recorded on an H200 under each allocator setting, each in a
fresh process (bench/record_torch_pairs.py, tests/data/torch/pairs/README.md). Replaying the default run's
requests under another run's settings must give that run's own max_memory_reserved() exactly."""
import gzip
import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from alloctrace.allocator.cuda_caching import AllocatorSettings
from alloctrace.traces.whatif.torch_model import replay_check, what_if
from alloctrace.traces.whatif.torch_request import infer_memory_limit

from torchsnap import columns

PAIRS = Path(__file__).parents[1] / "data" / "torch" / "pairs"
SETTINGS = ["train_expandable", "train_maxsplit", "train_roundup", "train_gc_cap", "train_cap"]


def _load(name):
    with gzip.open(PAIRS / f"{name}.pickle.gz") as f:
        snap = pickle.load(f)
    return snap, json.loads((PAIRS / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def default_run():
    snap, side = _load("train_default")
    cols = columns(snap["device_traces"][0])
    real = replay_check(cols, AllocatorSettings.from_snapshot(snap["allocator_settings"]))
    return cols, side, real


def test_default_run_replays_exactly(default_run):
    cols, side, real = default_run
    assert real.consistent, real.mismatch
    assert side["max_memory_allocated"] >= 1 << 30                  # a training workload of more than 1 GiB
    assert real.peak_reserved == side["max_memory_reserved"]
    assert real.peak_allocated == side["max_memory_allocated"]


@pytest.mark.parametrize("name", SETTINGS)
def test_each_setting_predicted_from_the_default_run(default_run, name):
    cols, _, real = default_run
    snap, side = _load(name)
    # the run's own settings, as its snapshot records them, with the cap it ran under
    settings = AllocatorSettings.from_snapshot(snap["allocator_settings"], memory_limit=side["allowed_bytes"])
    own = replay_check(columns(snap["device_traces"][0]), settings)
    assert own.consistent, own.mismatch
    assert own.peak_reserved == side["max_memory_reserved"]
    predicted = what_if(cols, settings, flushes=real.cache_flushes)
    assert predicted.peak_reserved == side["max_memory_reserved"]
    assert predicted.peak_allocated == side["max_memory_allocated"]
    assert predicted.alloc_retries == side["num_alloc_retries"]
    assert len(predicted.ooms) == side["num_ooms"]


def test_settings_change_the_answer(default_run):
    """The pairs are not trivial: every setting moves max_memory_reserved away from the default run's."""
    _, base, _ = default_run
    values = {n: _load(n)[1]["max_memory_reserved"] for n in SETTINGS}
    assert all(v != base["max_memory_reserved"] for v in values.values())
    assert len(set(values.values())) == len(values)


def test_cap_alone_fails_at_the_request_the_real_run_failed(default_run):
    cols, _, real = default_run
    snap, side = _load("train_cap")
    cap_cols = columns(snap["device_traces"][0])
    k = int((cap_cols["action"] == 7).nonzero()[0][0])
    predicted = what_if(cols, replace(AllocatorSettings(), memory_limit=side["allowed_bytes"]),
                        flushes=real.cache_flushes)
    assert predicted.oom["size"] == int(cap_cols["size"][k])        # the 160 MiB request of the message
    assert "Tried to allocate 160.00 MiB" in side["oom"]
    # the run itself: the inferred cap replays it as well as the real one
    lim = infer_memory_limit(cap_cols)
    assert lim <= side["allowed_bytes"]
    assert replay_check(cap_cols, replace(AllocatorSettings(), memory_limit=lim)).consistent
