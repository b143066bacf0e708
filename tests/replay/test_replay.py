"""`alloctrace replay`: the real programs' sizes, the 70B Metal failure and its fix, CLI and store."""
import json

import pytest

from alloctrace.traces.replay.run import replay, run_replay
from alloctrace.cli import main

KEYS = {"preset", "profile", "parse_seq_len", "measure", "eval", "first_divergence"}


@pytest.mark.parametrize("profile", ["ggml-2023-08-16", "ggml-2023-08-28"])
def test_gpt2_tiny_short_case_sizes(profile):
    """-n 4 -b 8 with a 9-token prompt: the first eval has 8 tokens and n_past 0 (fixture README)."""
    out = run_replay("gpt2-tiny", profile, n_batch=8, eval_tokens=8, n_past=0)
    assert out["measure"]["max_size"] == 102480
    assert out["eval"]["max_size"] == 45136
    assert out["measure"]["compute_buffer_total"] == 102480 + 16  # gpt-2: max_size + GGML_MEM_ALIGN
    assert out["measure"]["compute_buffer_total_mb"] == "0.10"  # "compute buffer size: 0.10 MB" in the log


def test_gpt2_tiny_long_case_sizes():
    out = run_replay("gpt2-tiny", "ggml-2023-08-28", n_batch=64, eval_tokens=64, n_past=0)
    assert out["measure"]["max_size"] == 360976
    assert out["eval"]["max_size"] == 360976
    assert out["measure"]["compute_buffer_total_mb"] == "0.34"


def test_open_llama_3b_compute_buffer_matches_real_log():
    out = run_replay("open-llama-3b", "ggml-2023-08-16", n_ctx=512, n_batch=512)
    assert out["measure"]["compute_buffer_total"] == 1_409_744 + out["measure"]["max_size"] + 32
    assert out["measure"]["compute_buffer_total_mb"] == "70.09"
    assert out["eval"]["oom"] is None and out["parse_seq_len"] is None


def test_llama2_70b_metal_fails_with_the_seed_allocator():
    r = replay("llama2-70b", "ggml-2023-08-16", n_ctx=512, n_batch=512, metal_concurrency=True)
    out = r.to_json()
    assert out["eval"]["oom"]["needed"] == 58720256 == 28672 * 512 * 4  # one FFN activation
    assert out["eval"]["oom"]["tensor"] in ("result_w1", "result_w3", "silu", "silu_x_result_w3")
    assert out["eval"]["oom"]["largest_available"] < 58720256
    assert r.layout == "macos-metal"
    assert out["parse_seq_len"] == r.measure.n_nodes + r.parse_seq.count(-1)
    assert r.concurrency.overflows  # more than the 4096 entries of the 2023 list (llama.cpp PR #2776)
    # measure and eval part ways somewhere before the failure
    assert out["first_divergence"] is not None


def test_llama2_70b_metal_fits_with_the_fixed_allocator():
    out = run_replay("llama2-70b", "ggml-2023-08-28", n_ctx=512, n_batch=512, metal_concurrency=True)
    assert out["eval"]["oom"] is None
    assert out["eval"]["max_size"] <= out["measure"]["max_size"]
    assert out["measure"]["compute_buffer_total"] == 1_475_280 + out["measure"]["max_size"] + 32


def test_without_metal_order_the_seed_allocator_fits():
    """The failure needs the reorder: in graph order measure and eval make the same choices."""
    out = run_replay("llama2-70b", "ggml-2023-08-16", metal_concurrency=False)
    assert out["eval"]["oom"] is None and out["eval"]["max_size"] == out["measure"]["max_size"]


def test_cli_json_and_exit_codes(capsys):
    assert main(["replay", "--preset", "llama2-70b", "--profile", "ggml-2023-08-16", "--metal-concurrency",
                 "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert set(out) == KEYS
    assert set(out["measure"]) == {"max_size", "compute_buffer_total", "compute_buffer_total_mb", "trace_id"}
    assert set(out["eval"]) == {"max_size", "oom", "trace_id"}
    assert out["eval"]["oom"]["needed"] == 58720256
    assert main(["replay", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28", "--hparam", "n_layer=3"]) == 0
    text = capsys.readouterr().out
    assert "fits" in text and "gpt2-tiny" in text


@pytest.mark.parametrize("argv,msg", [
    (["--preset", "nope", "--profile", "ggml-2023-08-16"], "unknown preset"),
    (["--preset", "gpt2-tiny", "--profile", "ggml-1999"], "unknown profile"),
    (["--preset", "gpt2-tiny", "--profile", "ggml-head"], "cannot run the presets"),
    (["--preset", "gpt2-tiny", "--profile", "ggml-2023-08-16", "--n-past", "200"], "exceeds n_ctx"),
    (["--preset", "gpt2-tiny", "--profile", "ggml-2023-08-16", "--eval-tokens", "0"], "eval_tokens"),
    (["--preset", "llama-7b", "--profile", "ggml-2023-08-16", "--hparam", "n_head=7"], "multiple of n_head"),
    (["--preset", "llama-7b", "--profile", "ggml-2023-08-16", "--hparam", "n_layer"], "KEY=VALUE"),
    (["--preset", "llama-7b", "--profile", "ggml-2023-08-16", "--hparam", " =3"], "KEY=VALUE"),  # as check refuses it
])
def test_bad_input_is_one_line_and_nonzero(capsys, argv, msg):
    code = main(["replay", *argv])
    err = capsys.readouterr().err
    assert code not in (0, 3)
    assert msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_store_keeps_measure_and_eval_as_one_trace(tmp_path, capsys):
    store_mod = pytest.importorskip("alloctrace.traces.store.store")
    out = run_replay("gpt2-tiny", "ggml-2023-08-16", n_batch=8, eval_tokens=1, n_past=8, store=tmp_path / "st")
    tid = out["measure"]["trace_id"]
    assert tid is not None and out["eval"]["trace_id"] == tid
    store = store_mod.open_store(tmp_path / "st")
    try:
        g0, g1 = store.graph(tid, 0), store.graph(tid, 1)
        assert (g0.role, g1.role) == ("measure", "eval")
        assert g0.max_size == 102480 and g1.max_size == out["eval"]["max_size"]
        assert len(g0.events) > len(g1.events) > 0
        assert store.meta(tid).source == "replay"
    finally:
        store.close()
    # the same replay again keeps the stored trace, as the API does (traces/replay/reuse.py); --keep-copies
    # stores a second one
    same = ["replay", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-16", "--n-batch", "8", "--eval-tokens",
            "1", "--n-past", "8", "--store", str(tmp_path / "st")]
    assert main([*same, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["measure"]["trace_id"] == again["eval"]["trace_id"] == tid and again["reused"] is True
    assert main(same) == 0
    assert f"identical to the stored trace {tid}" in capsys.readouterr().out
    other = ["replay", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28", "--store", str(tmp_path / "st")]
    assert main([*other, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reused"] is False
    assert main([*same, "--json", "--keep-copies"]) == 0
    copy = json.loads(capsys.readouterr().out)
    assert copy["measure"]["trace_id"] not in (None, tid)
    store = store_mod.open_store(tmp_path / "st")
    try:
        assert len(store.list()) == 3 and copy["measure"]["trace_id"] in [t["id"] for t in store.list()]
    finally:
        store.close()


def test_replay_stores_where_alloctrace_store_points(tmp_path, monkeypatch, capsys):
    """Like every other command, `replay` takes its store from $ALLOCTRACE_STORE when --store is not given."""
    from alloctrace.cli import main as cli_main
    from alloctrace.traces.store.store import open_store

    monkeypatch.setenv("ALLOCTRACE_STORE", str(tmp_path / "envstore"))
    assert cli_main(["replay", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    store = open_store(tmp_path / "envstore", create=False)
    try:
        assert [t["id"] for t in store.list()] == [out["measure"]["trace_id"]]
    finally:
        store.close()
