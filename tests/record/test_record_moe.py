"""Recordings of a real llama.cpp (ggml 0.25.3) running a mixture-of-experts model replay consistently.

The fixtures (tests/data/record/moe/, README there) are `alloctrace record -o` recordings of the shared
CPU build running tests/moe_gguf.py's tiny qwen3moe. Its FFN normalises the top-k expert weights with a
CLAMP that ggml 0.25.3 runs in place: a model without CLAMP on its in-place list (ggml-2026-08-21, the
allocator before llama.cpp #27644) misplaces the clamped sum and everything after it in that block.
"""
from __future__ import annotations

import io
import lzma
import os
import subprocess
from pathlib import Path

import pytest

import alloctrace.traces.sources.record.plans as replay
from alloctrace.traces.sources.record.source import RecordingSource

DATA = Path(__file__).parents[1].joinpath("data") / "record" / "moe"
# llama.cpp's own check of its compute buffer ("CPU compute buffer size is X MiB, matches expectation")
PRINTED_MIB = {"qwen3moe-fa-on-c512": 1.2637, "qwen3moe-fa-off-c512": 5.7598, "qwen3moe-fa-off-c1024-ub256-fit": 5.3799}


def text(name: str) -> str:
    return lzma.decompress((DATA / f"{name}.atrec.xz").read_bytes()).decode()


def traces_of(data: str):
    return RecordingSource().read(io.BytesIO(data.encode()), filename="moe.atrec", name=None)


@pytest.mark.parametrize("name", sorted(PRINTED_MIB))
def test_moe_recordings_are_consistent_with_the_printed_buffer(name):
    traces = traces_of(text(name))
    graphs = [g for t in traces for g in t.graphs]
    assert all(t.meta.generation == "ggml-head" for t in traces)
    assert graphs and all(g.consistent for g in graphs), [g.extra["mismatches"] for g in graphs if not g.consistent]
    assert {"reserve", "eval"} <= {g.role for g in graphs}
    real = traces[-1].graphs[-1].buffer_size  # the context's compute buffer (after any --fit dry run)
    assert round(real / 2**20, 4) == PRINTED_MIB[name]
    # every reserve whose plan placed tensors was checked placement by placement
    assert any(g.role == "reserve" and g.extra["plan_checked"] > 100 for g in graphs)


def test_without_clamp_in_place_the_moe_weights_are_misplaced(monkeypatch):
    monkeypatch.setattr(replay, "profile_for_version", lambda version: "ggml-2026-08-21")
    (trace,) = traces_of(text("qwen3moe-fa-on-c512"))
    bad = [g for g in trace.graphs if not g.consistent]
    assert bad and all("ffn_moe_weights_sum_clamped" in " ".join(g.extra["mismatches"]) for g in bad)
    assert any(g.role == "reserve" for g in bad)  # the plan the evals used answers for their placements


def test_altering_one_placement_made_with_a_reserve_plan_makes_that_reserve_inconsistent():
    data = text("qwen3moe-fa-on-c512")
    (trace,) = traces_of(data)
    reserve = max((g for g in trace.graphs if g.role == "reserve"), key=lambda g: g.extra["plan_checked"])
    eval_seq = next(g.extra["seq"] for g in trace.graphs if g.role == "eval" and g.index > reserve.index)
    lines = data.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith(f"P {eval_seq} "))
    f = lines[k].split()
    f[4] = hex(int(f[4], 16) + 64)
    lines[k] = " ".join(f)
    (trace,) = traces_of("\n".join(lines) + "\n")
    by_index = {g.index: g for g in trace.graphs}
    changed = by_index[reserve.index]
    assert not changed.consistent
    assert any("placed with this plan" in m and "offset model" in m for m in changed.extra["mismatches"])
    assert all(g.consistent for g in trace.graphs if g.role == "reserve" and g.index != reserve.index)


def test_a_reserve_size_mismatch_alone_is_still_caught():
    data = text("qwen3moe-fa-on-c512")
    (trace,) = traces_of(data)
    reserve = next(g for g in trace.graphs if g.role == "reserve")
    real = reserve.extra["real_sizes"][0]
    seq = reserve.extra["seq"]
    data = data.replace(f"R {seq} 1 {real}\n", f"R {seq} 1 {real + 32}\n")
    (trace,) = traces_of(data)
    assert not trace.graphs[0].consistent


LLAMA = os.environ.get("ALLOCTRACE_LLAMA_BIN")


@pytest.mark.skipif(not LLAMA, reason="set ALLOCTRACE_LLAMA_BIN to a llama-completion to record a MoE model")
def test_recording_a_generated_moe_model_is_consistent(tmp_path):
    pytest.importorskip("gguf")
    from moe_gguf import write

    model = tmp_path / "moe.gguf"
    write(str(model))
    out = tmp_path / "moe.atrec"
    bin_dir = str(Path(LLAMA).parent)
    env = {**os.environ, "LD_LIBRARY_PATH": bin_dir}
    subprocess.run(["alloctrace", "record", "-o", str(out), "--", LLAMA, "-m", str(model), "-p", "Hello there",
                    "-n", "3", "-c", "256", "-b", "128", "-ub", "128", "-fa", "off", "-t", "2", "-ngl", "0",
                    "--temp", "0", "-no-cnv", "-fit", "off"], env=env, check=True, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=300)
    (trace,) = traces_of(out.read_text())
    assert trace.graphs and all(g.consistent for g in trace.graphs)
