"""Hazard checks and numeric runs on the model presets' graphs (gpt2-tiny, a tiny LLaMA, 70B statically)."""
import pytest

from alloctrace.traces.replay.run import replay, store_result
from alloctrace.cli import main
from alloctrace.metal_exec.execute import run
from alloctrace.metal_exec.hazards import STALE_READ, check
from alloctrace.metal_exec.plan import read_srcs, root_of
from alloctrace.traces.replay.run import preset_plans

TINY_LLAMA = {"n_vocab": 64, "n_embd": 64, "n_head": 4, "n_head_kv": 4, "n_layer": 2, "n_ff": 96}
LEGACY = ["ggml-2023-08-16", "ggml-2023-08-28"]


@pytest.mark.parametrize("profile", LEGACY)
@pytest.mark.parametrize("name,hparams", [("gpt2-tiny", None), ("llama-7b", TINY_LLAMA)])
def test_preset_plans_are_clean_serially(name, hparams, profile):
    plan = preset_plans(name, profile, hparams=hparams)[0]
    assert plan.graph.n_nodes > 50 and not plan.concurrent
    assert check(plan) == []
    result = run(plan)
    assert result.ok, result.first


@pytest.mark.parametrize("profile", LEGACY)
def test_tiny_llama_metal_levels_are_clean(profile):
    plan = preset_plans("llama-7b", profile, metal_concurrency=True, hparams=TINY_LLAMA)[0]
    assert plan.concurrent and any(len(level) > 1 for level in plan.levels)
    assert check(plan) == []
    assert run(plan).ok


def test_gpt2_metal_levels_read_the_kv_cache_before_it_is_written():
    """gpt-2 copies V out of the cache early; a level built from data edges alone runs that copy
    before the CPY that stores this batch's V (the cache is a leaf, so no edge orders them)."""
    plan = preset_plans("gpt2-tiny", "ggml-2023-08-28", metal_concurrency=True)[0]
    hazards = check(plan)
    assert hazards and all(h.reason == STALE_READ and h.offset is None for h in hazards)
    step_of = {i: k for k, step in enumerate(plan.steps()) for i in step}
    nodes = plan.graph.nodes
    for h in hazards:
        reader = next(n for n in nodes if n.name == h.tensor and step_of[n.index] == h.extra["step"])
        victim = next(s for s in read_srcs(reader) if s.name == h.parent)
        writer = next(n for n in nodes if n.name == h.extra["early_for"] and root_of(n)[0] is root_of(victim)[0])
        assert plan.range(victim) is None  # the KV cache lives outside the compute buffer
        assert writer.index < reader.index and step_of[writer.index] > step_of[reader.index]
    result = run(plan)
    assert not result.ok and result.first.offset is None
    assert result.first.tensor in {h.parent for h in hazards}
    # the same graph run serially is fine
    assert run(preset_plans("gpt2-tiny", "ggml-2023-08-28")[0]).ok


def test_70b_graph_is_checked_statically():
    plan = preset_plans("llama2-70b", "ggml-2023-08-28", metal_concurrency=True)[0]
    assert plan.graph.n_nodes > 2500 and sum(len(level) + 1 for level in plan.levels) > 4096
    assert check(plan) == []


def test_check_a_stored_replay_trace(tmp_path, capsys):
    r = replay("llama-7b", "ggml-2023-08-16", eval_tokens=1, n_past=10, hparams={"n_layer": 2})
    tid = store_result(r, tmp_path)
    assert main(["check", tid, "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 hazards" in out and "ggml-2023-08-16" in out
    r = replay("gpt2-tiny", "ggml-2023-08-28", metal_concurrency=True)
    tid = store_result(r, tmp_path)
    assert main(["check", tid, "--store", str(tmp_path), "--json"]) == 4
    assert main(["check", "0000beef", "--store", str(tmp_path)]) == 3
    assert "no trace" in capsys.readouterr().err


def test_cli_preset(capsys):
    argv = ["check", "--preset", "llama-7b", "--profile", "ggml-2023-08-28", "--metal-concurrency", "--numeric"]
    argv += [f"--hparam={k}={v}" for k, v in TINY_LLAMA.items()]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "concurrent levels" in out and "equals the reference" in out
    assert main(["check", "--preset", "gpt2-tiny", "--profile", "ggml-head"]) == 2
    assert main(["check", "--harness", "x.json", "--metal-concurrency"]) == 2
