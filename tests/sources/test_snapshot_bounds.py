"""PyTorch snapshots: the work after unpickling is bounded, the CPU cap covers the whole import, and every
field is checked against one schema before anything is stored (CLI: one line, exit 2; server: 413 / 422)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.sources.bounded_io import Limits
from alloctrace.traces.store.store import open_store
from hostile_inputs import (bad_value_snapshots, refused_import, shared_blocks_snapshot, shared_frames_snapshot,
                            write_pickle)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "torch" / "gpt2_train_bs16.pickle.gz"
BAD = bad_value_snapshots()




@pytest.mark.parametrize("label", list(BAD))
def test_an_impossible_value_is_one_line(label, tmp_path, capsys):
    path = write_pickle(tmp_path / "bad.pickle", BAD[label])
    err = refused_import(capsys, path, tmp_path / "s")
    field = {"allocator_settings cyclic": "allocator_settings", "allocator_settings 1000 deep": "allocator_settings",
             "device 2^70": "device", "device '0' (a string)": "device", "segment without a device": "device",
             "total_size negative": "total_size", "block size negative": "size", "total_size int64 max": "total_size",
             "entry size int64 max": "size", "entry size negative": "size"}[label]
    assert f".{field}:" in err, err


def test_the_server_refuses_impossible_values_with_422(tmp_path):
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        for label, snap in BAD.items():
            path = write_pickle(tmp_path / "bad.pickle", snap)
            r = c.post("/api/torch/traces", files={"file": ("bad.pickle", path.read_bytes())})
            assert r.status_code == 422 and "bad.pickle" in r.json()["detail"], (label, r.status_code, r.text)
        assert c.get("/api/traces").json()["traces"] == []


@pytest.mark.parametrize("segments,blocks", [(3000, 3000), (10_000, 10_000)])
def test_segments_sharing_one_block_list_are_refused_before_they_expand(segments, blocks, tmp_path, capsys):
    """12 KB (and 40 KB) of pickle, 9 (100) million block rows once expanded: counted, never built."""
    path = shared_blocks_snapshot(tmp_path / "shared.pickle", segments, blocks)
    assert path.stat().st_size < 100_000
    err = refused_import(capsys, path, tmp_path / "s")
    assert "expands into more than" in err


def test_the_server_refuses_an_amplified_snapshot_with_413(tmp_path):
    path = shared_blocks_snapshot(tmp_path / "shared.pickle")
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        r = c.post("/api/torch/traces", files={"file": ("shared.pickle", path.read_bytes())})
        assert r.status_code == 413 and "expands into more than" in r.json()["detail"]


def test_a_frames_list_shared_by_every_entry_costs_once(tmp_path):
    """2,000 entries sharing one list of 10^6 frames: each entry's stack is looked up by the list's identity
    (before: 2 x 10^9 identity lookups, minutes). In a child, so a regression fails by its timeout."""
    path = shared_frames_snapshot(tmp_path / "frames.pickle", n_entries=2000, n_frames=1_000_000)
    p = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(path), "--store", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    s = open_store(tmp_path / "s")
    from alloctrace.traces.store.torch_stored import device_info
    stacks = device_info(s, s.list()[0]["id"], 0)["stacks"]
    assert len(stacks["offsets"]) == 2 and len(stacks["frames"]) == 1_000_000  # one stack of 10^6 frames


def _slow_model(monkeypatch, seconds: float):
    """The model replay burns `seconds` of CPU time (reading stays as cheap as it is)."""
    from alloctrace.traces.whatif import torch_request as torch_whatif
    real = torch_whatif.check_device

    def slow(cols, info, **kw):
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass
        return real(cols, info, **kw)

    monkeypatch.setattr(torch_whatif, "check_device", slow)


def test_the_cpu_cap_covers_the_model_replay_on_the_cli(monkeypatch, tmp_path, capsys):
    _slow_model(monkeypatch, 1.5)
    err = refused_import(capsys, FIXTURE, tmp_path / "s", "--max-cpu", "1")
    assert "CPU time" in err


def test_the_cpu_cap_covers_the_model_replay_on_the_server(monkeypatch, tmp_path):
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the slowed model is this process's
    _slow_model(monkeypatch, 1.5)
    with TestClient(create_app(store_dir=tmp_path / "s", limits=Limits(max_cpu_s=1.0))) as c:
        r = c.post("/api/torch/traces", files={"file": ("x.pickle.gz", FIXTURE.read_bytes())})
        assert r.status_code == 413 and "CPU time" in r.json()["detail"], r.text
        assert c.get("/api/traces").json()["traces"] == []
