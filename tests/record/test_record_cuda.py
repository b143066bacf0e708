"""Recordings of llama.cpp with CUDA (H200, partial offload) replay consistent without a GPU.

tests/data/record/cuda/README.md has the build, the commands and the sizes llama.cpp printed per buffer type.
"""
from __future__ import annotations

import io
import json
import lzma
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.sources.record.source import RecordingSource

DATA = Path(__file__).parents[1].joinpath("data") / "record" / "cuda"
PRINTED_MIB = {  # (CUDA0, CUDA_Host) compute buffers, as llama.cpp printed them at exit
    "ngl0-faon-c512": (6.2520, 2.0137), "ngl0-faon-c1024": (3.1885, 1.2568),
    "ngl0-faoff-c512": (11.1270, 2.5098), "ngl0-faoff-c1024": (10.1260, 1.7549),
    "ngl2-faon-c512": (6.2520, 2.2637), "ngl2-faon-c1024": (3.1885, 1.7568),
    "ngl2-faoff-c512": (11.6270, 2.5098), "ngl2-faoff-c1024": (10.3760, 1.7549),
    "ngl99-faon-c512": (5.6348, 2.2637), "ngl99-faon-c1024": (2.8174, 1.7568),
    "ngl99-faoff-c512": (11.5078, 2.5098), "ngl99-faoff-c1024": (10.2539, 1.7549),
    "moe-ngl99-faon": (1.2500, 0.9512),
    "moe-ngl1-faoff": (5.8828, 1.3848), "moe-ngl1-faon": (1.2500, 0.8887),  # partial offload: 1 of 3 layers
    "moe-ngl2-faoff-c1024": (5.3828, 1.1924),
}


def recording(name: str) -> bytes:
    return lzma.decompress((DATA / f"{name}.atrec.xz").read_bytes())


def mib(n: int) -> float:
    return round(n / 2**20, 4)


@pytest.mark.parametrize("name", sorted(PRINTED_MIB))
def test_cuda_recording_replays_consistent_with_the_printed_sizes(name):
    (trace,) = RecordingSource().read(io.BytesIO(recording(name)), filename=name, name=None)
    graphs = list(trace.graphs)
    assert trace.meta.generation == "ggml-head"
    assert all(g.consistent for g in graphs), [g.extra["mismatches"] for g in graphs if not g.consistent]
    last = graphs[-1]
    assert [b["name"] for b in last.extra["buffer_types"]] == ["CUDA0", "CUDA_Host"]
    assert tuple(mib(s) for s in last.extra["real_sizes"]) == PRINTED_MIB[name]
    assert {g.role for g in graphs} == {"reserve", "eval"}
    assert any(g.role == "reserve" and g.extra["plan_checked"] > 0 for g in graphs)


@pytest.mark.parametrize("name", ["ngl0-faon-c512", "ngl2-faoff-c1024", "ngl99-faon-c512", "moe-ngl99-faon",
                                  "moe-ngl1-faoff"])
def test_peak_gives_one_part_per_buffer_type_adding_up_to_the_printed_sizes(tmp_path, capsys, name):
    src = tmp_path / f"{name}.atrec"
    src.write_bytes(recording(name))
    store = str(tmp_path / "store")
    assert main(["import", "--store", store, str(src)]) == 0
    capsys.readouterr()
    assert main(["list", "--store", store, "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)["traces"]
    # the worst-case plan: the reserve whose plan is as big as the buffers it left
    plan = next(g for g in summary["graphs"] if g["role"] == "reserve" and g["max_size"] == g["buffer_size"])
    assert main(["peak", f"{summary['id']}:{plan['index']}", "--store", store, "--json"]) == 0
    peak = json.loads(capsys.readouterr().out)
    parts = {p["name"]: p["peak"]["bytes"] for p in peak["buffers"]}
    assert list(parts) == ["CUDA0", "CUDA_Host"]
    assert (mib(parts["CUDA0"]), mib(parts["CUDA_Host"])) == PRINTED_MIB[name]
    assert sum(parts.values()) == peak["peak"]["bytes"]
