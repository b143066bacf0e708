"""Replaying the committed recordings gives, event for event, what the replay gave before it was made faster.

`data/record/replay-digests.json` holds one SHA-256 per recording, over what reading it yields: each trace's
name, profile and report (consistency verdicts included), each graph's summary and `extra`, and every event
decoded back from the stored columns. The digests were computed by the replay, allocator model and record
stream of commit 808b5f9 (before the speed work) with `python tests/record/test_replay_golden.py --write`. How
faithful those events are to ggml is checked elsewhere (ggml-python differential tests, real llama.cpp runs);
this checks that making the replay cheaper changed none of them. A deliberate change to the model's events
re-writes the file, with the reason in its commit.
"""
from __future__ import annotations

import gc
import hashlib
import io
import json
import lzma
import sys
from pathlib import Path

import pytest
import zstandard

from alloctrace.traces.sources.record.source import RecordingSource
from alloctrace.traces.store.columns import FIELDS, decode_arrays

DATA = Path(__file__).parents[1].joinpath("data") / "record"
DIGESTS = DATA / "replay-digests.json"
RECORDINGS = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.atrec*"))


def read(name: str) -> bytes:
    data = (DATA / name).read_bytes()
    return lzma.decompress(data) if name.endswith(".xz") else data


def digest(name: str) -> str:
    h = hashlib.sha256()
    put = lambda obj: h.update(json.dumps(obj, sort_keys=True).encode() + b"\n")  # noqa: E731
    decompress = zstandard.ZstdDecompressor().decompress
    for trace in RecordingSource().read(io.BytesIO(read(name)), filename=name, name=None):
        put([trace.meta.name, trace.meta.profile, trace.report])
        for g in trace.graphs:
            put([g.index, g.role, g.n_events, g.max_size, g.buffer_size, g.oom, g.consistent, g.extra])
            for ev in decode_arrays(g.n_events, g.blobs, g.strings, decompress):
                put([getattr(ev, f) for f in FIELDS])
    return h.hexdigest()


def test_every_recording_has_a_digest():
    assert RECORDINGS and sorted(json.loads(DIGESTS.read_text())["digests"]) == RECORDINGS


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_recording_replays_to_the_same_events(name):
    assert digest(name) == json.loads(DIGESTS.read_text())["digests"][name]


@pytest.mark.parametrize("name", ["fit/tiny-llama-c4096-faoff.atrec.xz", "cuda/ngl2-faoff-c512.atrec.xz",
                                  "gallocr-mlp.atrec"])
def test_a_finished_replay_leaves_no_cycles(name):
    """Everything a read made is freed by reference counting as soon as it is dropped: a sweep reads one
    recording per point, and garbage in cycles waits for the collector, which then walks all of it."""
    data = read(name)
    gc.collect()
    gc.disable()
    try:
        RecordingSource().read(io.BytesIO(data), filename="x", name=None)
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("name", ["fit/tiny-llama-c4096-faon.atrec.xz", "cuda/ngl2-faon-c1024.atrec.xz",
                                  "moe/qwen3moe-fa-off-c1024-ub256-fit.atrec.xz", "gallocr-mlp.atrec"])
def test_the_events_a_read_keeps_are_the_stored_ones(name):
    kept: list = []
    traces = RecordingSource().read(io.BytesIO(read(name)), filename=name, name=None, events=kept)
    decompress = zstandard.ZstdDecompressor().decompress
    assert len(kept) == len(traces)
    for trace, by_index in zip(traces, kept):
        assert sorted(by_index) == [g.index for g in trace.graphs]
        for g in trace.graphs:
            kept_events = by_index[g.index]  # the Python replay's Events, or the compiled one's EventColumns
            assert len(kept_events) == g.n_events
            assert list(kept_events) == decode_arrays(g.n_events, g.blobs, g.strings, decompress)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    DIGESTS.write_text(json.dumps({"made_by": "python tests/record/test_replay_golden.py --write", "code_of": "808b5f9",
                                   "digests": {n: digest(n) for n in RECORDINGS}}, indent=1) + "\n")
