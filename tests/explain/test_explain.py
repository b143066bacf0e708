"""Peak composition, size attribution and sweeps, checked against real logs and the graphs' own shapes.

Expected sizes are computed here from the models' hyper-parameters (the shapes of the
tensors ggml allocates), never copied from a run.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.allocator.presets import get_preset
from alloctrace.traces.replay.run import replay, store_result
from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.diff.graphs import diff_refs
from alloctrace.traces.explain.peak import family_of, ggml_peak, peak_json, register_peak, size_attribution, PEAK_SOURCES
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.replay.sweep import sweep

DATA = Path(__file__).resolve().parents[1] / "data" / "explain"
SHORT = DATA / "gpt-2_tiny_short.2023-08-28.AT.log.gz"  # -b 8: measure N=8, n_past=120
LONG = DATA / "gpt-2_tiny_long.2023-08-28.AT+DEBUG.log.gz"  # -b 64: measure N=64, n_past=64
HEAD = DATA / "gpt-2-alloc_tiny_short.head.AT.log.gz"  # ggml-head reserve, N=8
F32 = 4
TINY = get_preset("gpt2-tiny").hparams  # the fixture logs' model: n_embd 128, n_head 4, n_ctx 128, n_vocab 512


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("store"))
    ids = dict(zip(("short", "long", "head"), import_paths(s, [SHORT, LONG, HEAD])))
    s.ids = ids
    yield s
    s.close()


@pytest.mark.parametrize("name, op, family", [
    ("kq-12", "MUL_MAT", "kq"), ("ffn_up-3 (view)", "VIEW", "ffn_up"), ("Kcur-0 (permuted)", None, "Kcur"),
    ("kqv_out-31 (transposed) (cont)", "CONT", "kqv_out"), ("Vcur-7 (reshaped)", None, "Vcur"),
    ("Vcur-0 (copy of Kcur-0)", "CPY", "Vcur"), ("cache_k_l3 (view)", "VIEW", "cache_k"),
    ("node_12", "MUL_MAT", "MUL_MAT"), ("leaf_3", "NONE", "NONE"), ("", "ADD", "ADD"),
    (" (view) (copy of  (view))", "CPY", "CPY"), ("KQ_soft_max", "SOFT_MAX", "KQ_soft_max"), (None, None, "(unnamed)"),
])
def test_family_names(name, op, family):
    assert family_of(name, op) == family
    assert family_of(name, op) == family_of(name, op)  # stable


def _check_sums(att: dict):
    assert sum(r["delta"] for r in att["families"]) + att["fragmentation_delta"] == att["delta"]
    assert att["delta"] == att["b_bytes"] - att["a_bytes"]
    for side in ("a", "b"):
        assert sum(r[side] for r in att["families"]) + att[f"{side}_fragmentation"] == att[f"{side}_bytes"]


def test_gpt2_batch_8_against_64_attribution_is_exact_and_follows_the_shapes(store):
    ids = store.ids
    d = diff_refs(store, f"{ids['short']}:0", f"{ids['long']}:0").to_json()
    att = d["size_attribution"]
    _check_sums(att)
    # the logged measure max_size of each run (graph 0: the running maximum is its own)
    rows = {k: store.summary(ids[k])["graphs"][0] for k in ("short", "long")}
    assert att["a_bytes"] == rows["short"]["max_size"] and att["b_bytes"] == rows["long"]["max_size"]
    assert att["delta"] == rows["long"]["max_size"] - rows["short"]["max_size"]

    E = TINY.n_embd
    # n_batch 64 (N=64, n_past=64): the peak is in the MLP, where the c_fc product [4E, N] and the bias
    # repeated to its shape are live together: two f32 tensors of 4E*N*4 bytes, the largest of the graph
    mlp = 4 * E * 64 * F32
    long_peak = peak_json(store, f"{ids['long']}:0")
    top2 = long_peak["families"][:2]
    assert {f["family"] for f in top2} == {"MUL_MAT", "REPEAT"} and all(f["bytes"] == mlp for f in top2)
    assert long_peak["tensors"][0]["bytes"] == mlp
    # n_batch 8 (N=8, n_past=120): the peak is set by V transposed into a new f32 tensor of
    # (n_past + N) x E (an unnamed leaf, op NONE); the MLP is only 4E*8*4 bytes there
    short_peak = peak_json(store, f"{ids['short']}:0")
    v_trans = (120 + 8) * E * F32
    assert short_peak["families"][0]["family"] == "NONE"
    assert short_peak["tensors"][0]["bytes"] == v_trans > 4 * E * 8 * F32
    fams = {r["family"]: r for r in att["families"]}
    assert fams["MUL_MAT"]["b"] == mlp and fams["MUL_MAT"]["status"] == "appeared"
    assert att["families"][0]["delta"] == mlp  # the MLP pair moves the buffer most


def test_attribution_across_generations_and_sources(store, tmp_path):
    ids = store.ids
    # ggml-head's reserve against a 2023-08-28 measure: parts still add up exactly
    d = diff_refs(store, f"{ids['head']}:0", f"{ids['long']}:0").to_json()
    att = d["size_attribution"]
    _check_sums(att)
    assert att["a_bytes"] == store.summary(ids["head"])["graphs"][0]["buffer_size"]
    # an imported log against a replay of the same program: nothing to attribute
    r = replay("gpt2-tiny", "ggml-2023-08-28", n_ctx=TINY.n_ctx, n_batch=64)
    tid = store_result(r, store)
    att = diff_refs(store, f"{ids['long']}:0", f"{tid}:0").to_json()["size_attribution"]
    _check_sums(att)
    assert att["delta"] == 0 and all(x["delta"] == 0 for x in att["families"]) and att["families"]
    # whole traces: every pair carries its attribution
    t = diff_refs(store, ids["short"], ids["long"]).to_json()
    for pair in t["pairs"]:
        _check_sums(pair["size_attribution"])


def test_another_source_plugs_in_its_own_peak(store):
    seen = []

    def fake(cols, row):
        seen.append(row["index"])
        return ggml_peak(cols)

    register_peak("ggml-log", fake)
    try:
        peak_json(store, f"{store.ids['long']}:0")
    finally:
        PEAK_SOURCES.pop("ggml-log")
    assert seen == [0]


def test_cli_peak_and_diff_json(store, capsys):
    ref = f"{store.ids['long']}:0"
    assert main(["peak", ref, "--store", str(store.path.parent), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"trace", "graph", "peak", "families", "fragmentation"}
    assert set(out["peak"]) >= {"event", "bytes"}
    assert set(out["fragmentation"]) == {"free_below_peak", "largest_hole", "holes"}
    assert set(out["families"][0]) >= {"family", "tensors", "bytes", "share"}
    assert sum(f["bytes"] for f in out["families"]) + out["fragmentation"]["free_below_peak"] == out["peak"]["bytes"]
    assert main(["peak", ref, "--store", str(store.path.parent)]) == 0
    text = capsys.readouterr().out
    assert "MUL_MAT" in text and "fragmentation:" in text and "KiB" in text
    a, b = f"{store.ids['short']}:0", ref
    main(["diff", a, b, "--store", str(store.path.parent), "--json"])
    att = json.loads(capsys.readouterr().out)["size_attribution"]
    assert set(att) >= {"a_bytes", "b_bytes", "delta", "families", "fragmentation_delta"}
    main(["diff", a, b, "--store", str(store.path.parent)])
    assert "SIZE ATTRIBUTION" in capsys.readouterr().out
    assert main(["peak", f"{LONG}:0", "--store", str(store.path.parent), "--json"]) == 0  # a log file, imported
    assert json.loads(capsys.readouterr().out)["families"] == out["families"]
    assert main(["peak", "nothere", "--store", str(store.path.parent)]) == 3
    assert capsys.readouterr().err.startswith("alloctrace: error: ")


def test_holes_below_the_peak_say_what_was_freed_there(store, capsys):
    """gpt-2 -b 64 (real log): 64.50 KiB free below the mark; each hole names the tensors that held it."""
    assert main(["peak", f"{store.ids['long']}:0", "--store", str(store.path.parent), "--json", "--tensors"]) == 0
    out = json.loads(capsys.readouterr().out)
    fr, event = out["fragmentation"], out["peak"]["event"]
    holes = fr["holes"]
    assert sum(h["bytes"] for h in holes) == fr["free_below_peak"] == 66_048
    assert max(h["bytes"] for h in holes) == fr["largest_hole"] == 32_768
    live = [(t["offset"], t["offset"] + t["bytes"]) for t in out["tensors"]]
    for h in holes:  # a hole overlaps no live tensor, and what it names was freed before the peak, there
        assert all(e <= h["offset"] or s >= h["offset"] + h["bytes"] for s, e in live)
        assert h["freed"] and all(x["freed_at"] <= event for x in h["freed"])
    assert main(["peak", f"{store.ids['long']}:0", "--store", str(store.path.parent)]) == 0
    text = capsys.readouterr().out
    assert "    hole at " in text and "freed at event" in text


# --- LLaMA presets -------------------------------------------------------------------------------
def llama_measure_size(hp, n_ctx: int, n_batch: int) -> int:
    """The measure graph's max_size of llama.cpp (Aug 2023) from the shapes: N = min(n_ctx, n_batch) tokens
    against n_kv = n_ctx keys. Either the logits peak (result_output [n_vocab, N] with result_norm
    [n_embd, N]) or the first layer's attention peak: KQ [n_kv, N, n_head] with Qcur and layer_inp_0
    ([n_embd, N] each) live, the freed inpL ([n_embd, N]) and tokens (N int32) left as holes below them,
    and the KQ_scale scalar (one f32 in a 32-byte aligned block)."""
    N = min(n_ctx, n_batch)
    logits = F32 * hp.n_vocab * N + F32 * hp.n_embd * N
    attention = F32 * n_ctx * N * hp.n_head + 3 * F32 * hp.n_embd * N + 4 * N + 32
    return max(logits, attention)


def test_llama_7b_sweep_grows_as_the_shapes_predict():
    hp = get_preset("llama-7b").hparams
    ctxs = [512, 1024, 2048, 3072, 4096]
    out = sweep("llama-7b", ["ggml-2023-08-28"], ctxs, [512])
    assert [(p["n_ctx"], p["n_batch"]) for p in out["points"]] == [(c, 512) for c in ctxs]
    for p in out["points"]:
        assert p["max_size"] == llama_measure_size(hp, p["n_ctx"], 512)
        assert not p["oom"] and p["peak_bytes"] == p["max_size"]
    big = out["points"][-1]
    assert big["top_families"][0] == {"family": "KQ", "bytes": F32 * 4096 * 512 * hp.n_head}
    assert out["points"][0]["top_families"][0]["family"] == "result_output"  # logits win at a short context
    assert out["oom_onset"] == []


@pytest.mark.parametrize("preset", ["llama-7b", "llama-13b", "llama2-70b"])
def test_attention_scores_dominate_llama_peaks_at_large_n_ctx(preset):
    hp = get_preset(preset).hparams
    r = replay(preset, "ggml-2023-08-28", n_ctx=4096, n_batch=512)
    top = ggml_peak(r.measure.events).to_json(tensors=False)["families"][0]
    assert top["family"] == "KQ" and top["bytes"] == F32 * 4096 * 512 * hp.n_head
    assert top["share"] > 0.5


def test_legacy_70b_pair_peaks_and_fragmentation_at_the_failure():
    """`alloctrace replay --preset llama2-70b --profile ggml-2023-08-16 --metal-concurrency` (PR #2627)."""
    hp = get_preset("llama2-70b").hparams
    r = replay("llama2-70b", "ggml-2023-08-16", metal_concurrency=True)
    N = r.measure.n_tokens
    m = ggml_peak(r.measure.events).to_json(tensors=False)
    e = ggml_peak(r.eval.events, capacity=r.eval.buffer_size).to_json(tensors=False)
    # measure: the feed-forward peak, w1 and w3 products [n_ff, N] with the norm and its input [n_embd, N]
    assert m["peak"]["bytes"] == r.measure.max_size and m["failure"] is None
    fams = {f["family"]: f["bytes"] for f in m["families"]}
    assert fams["result_w1"] == fams["result_w3"] == F32 * hp.n_ff * N
    assert fams["ffn_norm"] == fams["inpFF"] == F32 * hp.n_embd * N
    # eval: its own high water, below the measured one (max_size of 2023 is a running maximum)
    assert e["peak"]["bytes"] < m["peak"]["bytes"]
    fail = e["failure"]
    assert fail["tensor"] == "result_w3" and fail["needed"] == F32 * hp.n_ff * N
    assert fail["capacity"] == r.eval.buffer_size
    assert fail["live_bytes"] + fail["free"] == fail["capacity"]
    # enough bytes free in total, but no hole large enough: fragmentation is the failure
    assert fail["free"] >= fail["needed"] > fail["largest_hole"] == fail["largest_available"]


def test_sweep_onset_and_json_shape(capsys):
    out = sweep("llama2-70b", ["ggml-2023-08-16", "ggml-2023-08-28"], [256, 512], [512], metal_concurrency=True)
    assert [(p["profile"], p["n_ctx"]) for p in out["points"]] == [
        ("ggml-2023-08-16", 256), ("ggml-2023-08-16", 512), ("ggml-2023-08-28", 256), ("ggml-2023-08-28", 512)]
    assert [p["oom"] for p in out["points"]] == [False, True, False, False]
    assert [(o["profile"], o["n_ctx"]) for o in out["oom_onset"]] == [("ggml-2023-08-16", 512)]
    assert main(["sweep", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28", "--n-ctx", "64,128",
                 "--n-batch", "8", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert len(got["points"]) == 2
    assert set(got["points"][0]) >= {"preset", "profile", "n_ctx", "n_batch", "max_size", "oom", "top_families"}
    assert main(["sweep", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28", "--n-ctx", "64,x"]) == 2
    assert "alloctrace: error: --n-ctx" in capsys.readouterr().err
    assert main(["sweep", "--preset", "gpt2-tiny", "--profile", "ggml-head"]) == 2
    assert main(["sweep", "--preset", "gpt2-tiny", "--profile", "ggml-2023-08-28", "--n-ctx",
                 ",".join(str(i) for i in range(1, 65)), "--n-batch", "1,2,3,4,5"]) == 2


def test_api_peak_sweep_and_diff(store):
    app = create_app(store=store)
    with TestClient(app) as c:
        ref = f"{store.ids['long']}:0"
        r = c.get(f"/api/traces/{store.ids['long']}/graphs/0/peak")
        assert r.status_code == 200 and r.json()["peak"]["bytes"] == peak_json(store, ref)["peak"]["bytes"]
        assert c.get(f"/api/traces/{store.ids['long']}/graphs/9/peak").status_code == 404
        r = c.get("/api/diff", params={"a": f"{store.ids['short']}:0", "b": ref})
        _check_sums(r.json()["size_attribution"])
        r = c.get("/api/sweep", params={"preset": "gpt2-tiny", "profile": "ggml-2023-08-28", "n_ctx": "64,128"})
        assert r.status_code == 200 and [p["n_ctx"] for p in r.json()["points"]] == [64, 128]
        assert c.get("/api/sweep", params={"preset": "nope", "profile": "ggml-2023-08-28"}).status_code == 400
        assert c.get("/api/sweep", params={"preset": "gpt2-tiny", "profile": "ggml-2023-08-28",
                                           "n_ctx": ",".join(["64"] * 65)}).status_code == 400


def test_attribution_identity_on_synthetic_peaks():
    from alloctrace.allocator.events import Event

    def graph(sizes):
        ev, off = [Event("graph")], 0
        for i, s in enumerate(sizes):
            ev.append(Event("alloc", tensor=f"t-{i}", op="ADD", size=s, offset=off))
            off += s
        ev.append(Event("free", tensor="t-0", size=sizes[0], offset=0))
        ev.append(Event("alloc", tensor="u-0", op="MUL", size=sizes[0] // 2, offset=0))
        return ev

    a, b = ggml_peak(graph([64, 32])), ggml_peak(graph([32, 96, 16]))
    att = size_attribution(a, b)
    _check_sums(att)
    assert att["a_bytes"] == 96 and att["b_bytes"] == 144 and att["fragmentation_delta"] == 0


def test_real_llama_cpp_ubatch_8_against_64_is_the_attention_scores(tmp_path):
    """Current llama.cpp without flash attention: the worst-case graph peaks when kq-0 is placed, and kq is
    n_ctx x n_ubatch x n_head f32 (the tracker's 'KQ is n_ctx * n_ubatch * n_head * 4 bytes')."""
    n_ctx, n_head, n_embd = 512, 8, 256
    s = open_store(tmp_path)
    small, big = import_paths(s, [DATA / "llama-tiny_c512_ub8.head.AT.log.gz",
                                  DATA / "llama-tiny_c512_ub64.head.AT.log.gz"])
    for tid, ub in ((small, 8), (big, 64)):
        p = peak_json(s, f"{tid}:0")
        assert p["peak"]["bytes"] == s.summary(tid)["graphs"][0]["buffer_size"]  # head: the buffer is the mark
        assert p["peak"]["tensor"] == "kq-0"
        top = p["families"][0]
        assert top["family"] == "kq" and top["bytes"] == n_ctx * ub * n_head * F32 and top["first_node"] == "kq-0"
        fams = {f["family"]: f["bytes"] for f in p["families"]}
        assert fams["attn_inp_kq_mask"] == n_ctx * ub * F32 and fams["Qcur"] == n_embd * ub * F32
    att = diff_refs(s, f"{small}:0", f"{big}:0").to_json()["size_attribution"]
    _check_sums(att)
    assert att["families"][0] == {"family": "kq", "a": n_ctx * 8 * n_head * F32, "b": n_ctx * 64 * n_head * F32,
                                  "delta": n_ctx * 56 * n_head * F32, "status": "both"}
    s.close()


def test_chunks_give_one_buffer_each_and_a_replan_starts_over():
    from alloctrace.allocator.events import Event

    ev = [Event("alloc", tensor="old-0", op="ADD", size=4096, offset=0, chunk=0),  # before the re-plan: ignored
          Event("realloc"),
          Event("alloc", tensor="a-0", op="ADD", size=64, offset=0, chunk=0),
          Event("alloc", tensor="b-0", op="MUL", size=32, offset=64, chunk=0),
          Event("free", tensor="a-0", size=64, offset=0, chunk=0),
          Event("alloc", tensor="c-1 (view)", op="MUL_MAT", size=128, offset=0, chunk=1),
          Event("alloc", tensor="node_7", op="SOFT_MAX", size=16, offset=128, chunk=1)]
    p = ggml_peak(ev).to_json()
    assert [b["chunk"] for b in p["buffers"]] == [0, 1]
    c0, c1 = p["buffers"]
    assert c0["peak"] == {"event": 3, "bytes": 96, "tensor": "b-0", "live_bytes": 96}
    assert c1["peak"]["bytes"] == 144 and c1["peak"]["tensor"] == "node_7"
    assert [f["family"] for f in c1["families"]] == ["c", "SOFT_MAX"]
    # the graph: both marks added, families summed over both chunks (chunk 0 at its peak keeps a and b)
    assert p["peak"]["bytes"] == 240 and p["peak"]["event"] == c1["peak"]["event"]
    assert {f["family"]: f["bytes"] for f in p["families"]} == {"c": 128, "a": 64, "b": 32, "SOFT_MAX": 16}
    assert p["fragmentation"] == {"free_below_peak": 0, "largest_hole": 0, "holes": []}
    empty = ggml_peak([Event("graph")]).to_json()
    assert empty["peak"]["event"] is None and empty["families"] == [] and empty["peak"]["bytes"] == 0
