"""Falcon presets: llm_build_falcon as llama.cpp built it at 38b16dfc (PR #2757, 2023-08-24).

Source read: llama.cpp's llama.cpp at cf658adc (PR #2717, Falcon with GGUF) and at 38b16dfc, whose
only Falcon change is dropping `cur->src[2] = attn_out` on the FFN up projection, the workaround
"because there seems to be a bug in the Metal concurrency optimization". Per layer the expand order
(K/V cache copies first, the rest when the next layer is expanded) gives 32 nodes for 7B:

  NORM MUL ADD (attn_norm), MUL_MAT (QKV), VIEW (tmpk), ROPE (Kcur), VIEW (k), CPY,
  VIEW (tmpv), CONT, RESHAPE, TRANSPOSE (Vcur), VIEW (v), CPY,
  then, reached from the residual adds: MUL_MAT (ffn_up), GELU, MUL_MAT (ffn_down),
  VIEW (V), VIEW (K), VIEW (tmpq), ROPE (Qcur), PERMUTE (Q), MUL_MAT (KQ), SCALE, DIAG_MASK_INF,
  SOFT_MAX, MUL_MAT (KQV), PERMUTE, CPY (KQV_merged_contiguous), MUL_MAT (result_wo), ADD, ADD.

40B's second LayerNorm (attn_norm_2, feeding QKV) adds three nodes; it comes first, and the
attn_norm chain the FFN reads is reached only from ffn_up. With Metal's concurrency order the FFN runs beside the
attention; ggml-2023-08-22 frees inside a level and keeps the silent return in allocate_node, so
Kcur, left unallocated when it ran, is placed later in the GELU output that ffn_down reads in the
same level: the race PR #2757 fixed.
"""
import pytest

from alloctrace.allocator import LAYOUTS, LegacyAllocator, get_profile
from alloctrace.allocator.presets import PRESETS, falcon, family_of, get_preset, with_hparams
from alloctrace.allocator.presets.space import AddressSpace
from alloctrace.traces.replay.run import replay
from alloctrace.cli import main
from alloctrace.metal_exec import find_concurrency
from alloctrace.metal_exec.execute import run
from alloctrace.metal_exec.hazards import CONCURRENT_OVERLAP, check
from alloctrace.metal_exec.plan import plan_from_legacy
from alloctrace.traces.replay.run import preset_plans

TINY = {"n_embd": 64, "n_head": 4, "n_head_kv": 1, "n_layer": 2, "n_ff": 256, "n_vocab": 128}
LAYER_OPS = ["NORM", "MUL", "ADD", "MUL_MAT", "VIEW", "ROPE", "VIEW", "CPY",
             "VIEW", "CONT", "RESHAPE", "TRANSPOSE", "VIEW", "CPY",
             "MUL_MAT", "UNARY", "MUL_MAT",
             "VIEW", "VIEW", "VIEW", "ROPE", "PERMUTE", "MUL_MAT", "SCALE", "DIAG_MASK_INF", "SOFT_MAX",
             "MUL_MAT", "PERMUTE", "CPY", "MUL_MAT", "ADD", "ADD"]


def build(hparams=None, preset="falcon-7b", n_tokens=8, n_past=4, n_ctx=16, ff_waits_for_attn=False):
    p = with_hparams(get_preset(preset), hparams or {})
    model = falcon.new_model(p.hparams, n_ctx, "ggml-2023-08-28", ff_waits_for_attn=ff_waits_for_attn)
    explicit = []
    return falcon.build_graph(model, n_tokens, n_past, explicit.append), explicit


def metal_plan(profile, ff_waits_for_attn=False):
    """The program's flow on the tiny model, by hand so the workaround graph can be planned too."""
    hp = with_hparams(get_preset("falcon-7b"), TINY).hparams
    model = falcon.new_model(hp, 512, profile, ff_waits_for_attn=ff_waits_for_attn)
    falcon.place_model(model, LAYOUTS["macos-metal"], AddressSpace())
    prof = get_profile(profile)
    measure = LegacyAllocator.measure(prof, falcon.ALIGNMENT)
    graph = falcon.build_graph(model, 512, 0, measure.alloc_tensor)
    seq = find_concurrency(graph)
    measure.alloc_graph(graph, parse_seq=seq)
    real = LegacyAllocator.real(prof, LAYOUTS["macos-metal"].buffer_base, measure.t.max_size + falcon.BUFFER_PAD,
                                falcon.ALIGNMENT)
    graph = falcon.build_graph(model, 512, 0, real.alloc_tensor)
    real.alloc_graph(graph, parse_seq=seq, graph_index=1)
    assert real.failed is None
    return plan_from_legacy(graph, real, seq, graph_index=1), real


def test_presets_are_registered_with_falcon_shapes():
    f7, f40 = PRESETS["falcon-7b"], PRESETS["falcon-40b"]
    assert family_of(f7) is falcon and f7.to_json()["hparams"]["n_head_kv"] == 1
    assert (f7.hparams.n_embd_head, f7.hparams.n_embd_gqa) == (64, 64)
    assert (f40.hparams.n_embd_head, f40.hparams.n_embd_gqa, f40.hparams.attn_norm_2) == (64, 512, 1)
    with pytest.raises(ValueError, match="multiple of n_head_kv"):
        with_hparams(f7, {"n_head_kv": 3})


def test_layer_node_order_and_count():
    graph, explicit = build(TINY)
    ops = [t.op for t in graph.nodes]
    assert ops[0] == "GET_ROWS" and ops[-4:] == ["NORM", "MUL", "ADD", "MUL_MAT"]
    assert graph.n_nodes == 1 + 32 * TINY["n_layer"] + 4
    for il in range(TINY["n_layer"]):
        assert ops[1 + 32 * il:33 + 32 * il] == LAYER_OPS
    layer0 = graph.nodes[1:33]
    assert layer0[15].op_desc == "GELU" and layer0[16].srcs[0].name == "blk.0.ffn_down.weight"
    assert [layer0[i].name for i in (11, 12, 17, 18, 21, 29)] == ["Vcur", "v", "V", "K", "Q", "result_wo"]
    assert layer0[5].name == " (view) (view)" and layer0[5].nb == layer0[4].nb  # in place on a strided view
    assert [t.name for t in graph.nodes[-2:]] == ["result_norm", "result_output"]
    assert [t.name for t in explicit] == ["inp_tokens", "1/sqrt(n_embd_head)"]


def test_40b_second_norm_and_full_sizes():
    graph, _ = build(dict(TINY, n_head=8, n_head_kv=2, attn_norm_2=1), preset="falcon-40b")
    assert graph.n_nodes == 1 + 35 * TINY["n_layer"] + 4
    ops = [t.op for t in graph.nodes[1:36]]
    assert ops == LAYER_OPS[:14] + ["NORM", "MUL", "ADD"] + LAYER_OPS[14:]
    qkv, ffn_up = graph.nodes[4], graph.nodes[18]
    assert qkv.ne[0] == 64 + 2 * 2 * 8 and ffn_up.srcs[0].name == "blk.0.ffn_up.weight"
    assert qkv.srcs[1].srcs[0].srcs[1].name == "blk.0.attn_norm_2.weight"
    assert ffn_up.srcs[1].srcs[0].srcs[1].name == "blk.0.attn_norm.weight"
    r = replay("falcon-7b", "ggml-2023-08-28", n_ctx=512, n_batch=512, metal_concurrency=True)
    assert r.measure.n_nodes == 1029 and r.eval.alloc.failed is None


def test_workaround_orders_the_ffn_after_the_attention():
    plain, _ = build(TINY)
    worked, _ = build(TINY, ff_waits_for_attn=True)
    def up(g):
        return next(i for i, t in enumerate(g.nodes) if t.op == "MUL_MAT" and t.srcs[0].name == "blk.0.ffn_up.weight")

    def wo(g):
        return next(i for i, t in enumerate(g.nodes) if t.name == "result_wo")

    assert up(plain) < wo(plain) and up(worked) == wo(worked) + 1
    assert worked.nodes[up(worked)].srcs[2] is worked.nodes[wo(worked)]


def test_08_22_metal_plan_races_ffn_against_attention():
    plan = preset_plans("falcon-7b", "ggml-2023-08-22", metal_concurrency=True, hparams=TINY)[0]
    hazards = check(plan)
    assert hazards and {h.reason for h in hazards} == {CONCURRENT_OVERLAP}
    nodes = plan.graph.nodes
    gelu = next(t for t in nodes if t.op_desc == "GELU")
    down = next(t for t in nodes if t.op == "MUL_MAT" and gelu in t.srcs)
    race = [h for h in hazards if h.parent == gelu.name]
    assert race and race[0].extra["other"] == down.name
    writer = nodes[race[0].node]
    assert writer.op == "ROPE" and writer.srcs[0].op == "VIEW" and writer.srcs[0].srcs[0].op == "MUL_MAT"
    assert writer.srcs[0].srcs[0].srcs[0].name == "blk.0.attn_qkv.weight"
    step = next(s for s in plan.steps() if race[0].node in s)
    assert nodes.index(down) in step  # Kcur and ffn_down in one concurrent level


def test_08_22_kcur_is_placed_after_it_ran():
    """The silent return: Kcur's in-place attempt on the QKV view fails and leaves it unallocated;
    its CPY allocates it a level later, after the GELU output was freed."""
    _, real = metal_plan("ggml-2023-08-22")
    rows = [(e.kind, e.tensor) for e in real.events if e.kind in ("exec", "alloc", "reuse", "free")]
    kcur = " (view) (view)"
    ran = rows.index(("exec", kcur))
    placed = rows.index(("alloc", kcur))
    freed_gelu = next(i for i, r in enumerate(rows) if r[0] == "free" and r[1] == "node_16")
    assert ran < freed_gelu < placed


def test_numeric_run_shows_the_corruption_and_08_28_is_clean():
    bad = preset_plans("falcon-7b", "ggml-2023-08-22", metal_concurrency=True, hparams=TINY)[0]
    result = run(bad, "adversarial")
    assert not result.ok and result.first.max_abs_diff > 0
    gelu = bad.graph.by_name(result.first.tensor)
    assert gelu.op_desc == "GELU" and bad.graph.by_name(result.first.reader).srcs[1] is gelu
    assert result.first.overwriter == " (view) (view)"
    good = preset_plans("falcon-7b", "ggml-2023-08-28", metal_concurrency=True, hparams=TINY)[0]
    assert good.concurrent and check(good) == [] and run(good, "adversarial").ok


def test_full_size_7b_static_check():
    bad = preset_plans("falcon-7b", "ggml-2023-08-22", metal_concurrency=True)[0]
    gelus = {t.name for t in bad.graph.nodes if t.op_desc == "GELU"}
    assert {h.parent for h in check(bad)} & gelus
    assert check(preset_plans("falcon-7b", "ggml-2023-08-28", metal_concurrency=True)[0]) == []


def test_pr_2717_workaround_graph_runs_clean_on_08_22():
    """With the artificial dependency the FFN waits, and nothing is corrupted. Qcur is still written in
    place over the QKV output while Kcur and the V copy read their views of it in the same level, but
    those strided views interleave (Q, K and V heads alternate per token) without sharing a byte, and
    the checker compares them element run by element run."""
    plan, _ = metal_plan("ggml-2023-08-22", ff_waits_for_attn=True)
    assert run(plan, "adversarial").ok
    assert check(plan) == []


def test_cli_check_exit_status(capsys):
    args = ["check", "--preset", "falcon-7b", "--metal-concurrency", "--numeric"]
    for k, v in TINY.items():
        args += ["--hparam", f"{k}={v}"]
    assert main(args + ["--profile", "ggml-2023-08-22"]) == 4
    out = capsys.readouterr().out
    assert "concurrent overlap" in out and "first corrupted tensor: node_16" in out
    assert main(args + ["--profile", "ggml-2023-08-28"]) == 0
    assert "0 hazards" in capsys.readouterr().out
