"""Presets build the graphs the real programs built: the gpt-2 fixture logs come out line for line."""
import pytest

from alloctrace.allocator import LAYOUTS, LegacyAllocator, get_profile, render
from alloctrace.allocator.presets import PRESETS, family_of, get_preset, with_hparams
from alloctrace.allocator.presets.space import AddressSpace

ALLOCATOR_PREFIXES = ("ggml_allocr_alloc:", "ggml_allocator_free_tensor:", "exec:", "reusing ", "not reusing ",
                      "view_src ", "####### graph", "input:", "output:")

SHORT = {"n_batch": 8, "evals": [(8, 0), (1, 8), (1, 9), (1, 10), (1, 11)]}  # -n 4 -b 8, 9-token prompt
LONG = {"n_batch": 64, "evals": [(64, 0), (22, 64), (1, 86), (1, 87)]}  # -n 3 -b 64, 86-token prompt
LOGS = [
    ("v2023-08-16-legacy/gpt-2_tiny_short.AT.log", "ggml-2023-08-16", SHORT),
    ("v2023-08-28-parseseq/gpt-2_tiny_short.AT.log", "ggml-2023-08-28", SHORT),
    ("v2023-08-28-parseseq/gpt-2_tiny_long.AT+DEBUG.log", "ggml-2023-08-28", LONG),
]
MARKER = "ggml_allocr_alloc: allocating  ("  # the first unnamed explicit allocation of a graph


def log_graphs(path):
    """The allocator lines of each graph (explicit allocations included), program output left out.

    A program line may carry an allocator line glued to its end; GGML_ALLOCATOR_DEBUG lines
    (`max_size = ...`) are not AT_PRINTF and are dropped."""
    graphs, cur = [], None
    for raw in open(path, newline="").read().split("\n"):
        if raw.startswith("max_size = "):
            continue
        at = raw.find(MARKER)
        if at > 0 and not raw.startswith(ALLOCATOR_PREFIXES):
            raw = raw[at:]  # e.g. "...the lazyggml_allocr_alloc: allocating  (32 bytes) - block 0"
        if raw.startswith(MARKER) and (cur is None or any(l.startswith("####### graph") for l in cur)):
            cur = []
            graphs.append(cur)
        if cur is None:
            continue
        if raw == "" or raw.startswith(ALLOCATOR_PREFIXES):
            cur.append(raw)
        else:
            cur = None  # program output ends the graph's lines
    return graphs


def program_run(profile_name, case):
    """gpt-2's main(): measure, buffer = max_size + 16, then every eval in one real allocator."""
    fam, preset = family_of(get_preset("gpt2-tiny")), get_preset("gpt2-tiny")
    profile = get_profile(profile_name)
    model = fam.new_model(preset.hparams, preset.hparams.n_ctx, profile_name)
    fam.place_model(model, LAYOUTS["linux"], AddressSpace())
    n_tokens, n_past = fam.measure_shape(model.n_ctx, case["n_batch"])
    measure = LegacyAllocator.measure(profile, fam.ALIGNMENT)
    measure.alloc_graph(fam.build_graph(model, n_tokens, n_past, measure.alloc_tensor, profile_name))
    real = LegacyAllocator.real(profile, LAYOUTS["linux"].buffer_base, measure.t.max_size + fam.BUFFER_PAD,
                                fam.ALIGNMENT)
    eval_lines, sizes = [], []
    for n, past in case["evals"]:
        real.reset()
        start = len(real.events)
        real.alloc_graph(fam.build_graph(model, n, past, real.alloc_tensor, profile_name))
        eval_lines.append(render(real.events[start:], profile))
        sizes.append(real.t.max_size)
    return measure, render(measure.events, profile), eval_lines, sizes


@pytest.mark.parametrize("log,profile,case", LOGS)
def test_gpt2_measure_graph_matches_real_log(fixtures, log, profile, case):
    theirs = log_graphs(fixtures / log)[0]
    _, ours, _, _ = program_run(profile, case)
    assert theirs[:4] == ours[:4]  # three unnamed explicit allocations, then the graph line
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"line {i + 1}: model {a!r} != real {b!r}"
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("log,profile,case", LOGS)
def test_gpt2_eval_graphs_match_real_log(fixtures, log, profile, case):
    """Every eval graph too, including `not reusing parent ... as 0x7f... is external` lines, whose
    addresses come from laying the weights out as a ggml context."""
    theirs = log_graphs(fixtures / log)[1:]
    _, _, ours, sizes = program_run(profile, case)
    assert len(ours) == len(theirs) == len(case["evals"])
    for g, (a_lines, b_lines) in enumerate(zip(ours, theirs)):
        for i, (a, b) in enumerate(zip(a_lines, b_lines)):
            assert a == b, f"eval {g} line {i + 1}: model {a!r} != real {b!r}"
        assert len(a_lines) == len(b_lines)


def test_gpt2_sizes_match_fixture_readme(fixtures):
    m, _, _, sizes = program_run("ggml-2023-08-16", SHORT)
    assert m.t.max_size == 102480 and sizes == [45136] * 5
    m, _, _, sizes = program_run("ggml-2023-08-28", LONG)
    assert m.t.max_size == 360976 and sizes == [360976] * 4


def _small_llama(**kw):
    return with_hparams(get_preset("llama2-70b"), {"n_layer": 2, "n_embd": 256, "n_head": 8, "n_head_kv": 2,
                                                   "n_ff": 512, "n_vocab": 100, **kw})


def _llama_graph(preset, n_tokens=4, n_past=3, n_ctx=8, profile="ggml-2023-08-28"):
    fam = family_of(preset)
    model = fam.new_model(preset.hparams, n_ctx, profile)
    explicit = []
    return fam.build_graph(model, n_tokens, n_past, explicit.append, profile), explicit, model


def test_llama_layer_node_order_and_names():
    g, explicit, _ = _llama_graph(_small_llama())
    assert [t.name for t in explicit] == ["inp_tokens", "1/sqrt(n_embd_head)"]
    names = [t.name for t in g.nodes]
    layer0 = names[1:names.index("layer_inp_1") + 1]
    assert names[0] == "layer_inp_0"  # the token embedding rows, renamed per layer by llama.cpp
    assert [n for n in layer0] == [
        "rms_norm_0", "attention_norm_0", "tmpk", "tmpk (reshaped)", "Kcur", "k", "k (copy of Kcur)",
        "tmpv", "tmpv (reshaped)", "Vcur", "v", "v (copy of Vcur)", "V", "K", "tmpq", "tmpq (reshaped)", "Qcur",
        "Q", "KQ", "KQ_scaled", "KQ_masked", "KQ_soft_max", "KQV", "KQV_merged", "KQV_merged_contiguous",
        "result_wo", "inpFF", "rms_norm_1", "ffn_norm", "result_w1", "silu", "result_w3", "silu_x_result_w3",
        "result_w2", "layer_inp_1"]
    assert names[-3:] == ["rms_norm_2", "result_norm", "result_output"]
    assert len(g.nodes) == 1 + 2 * 35 + 3  # embedding rows, 35 nodes per layer, final norm and output


def test_llama_gqa_shapes():
    g, _, model = _llama_graph(_small_llama())
    by = {t.name: t for t in g.nodes[:40]}
    hp = model.hp  # head size 32, 8 query heads, 2 KV heads
    assert by["Kcur"].ne == (32, 2, 4, 1) and by["Qcur"].ne == (32, 8, 4, 1)
    assert by["K"].ne == (32, 7, 2, 1) and by["V"].ne == (7, 32, 2, 1)
    assert by["KQ"].ne == (7, 4, 8, 1) and by["KQV"].ne == (32, 4, 8, 1)
    assert by["KQV_merged_contiguous"].ne == (256, 4, 1, 1)
    assert by["result_w1"].ne == (hp.n_ff, 4, 1, 1)
    assert model.cache_k.ne[0] == hp.n_embd_gqa * 8 * 2  # n_embd_gqa * n_ctx * n_layer
    # the KV views point into the cache at the layer's and n_past's offset
    assert by["k"].data == 0 and by["k"].view_offs == 2 * 64 * 3  # f16, n_embd_gqa 64, n_past 3


def test_weight_names_follow_the_loader_of_the_time():
    _, _, old = _llama_graph(_small_llama(), profile="ggml-2023-08-16")
    _, _, new = _llama_graph(_small_llama(), profile="ggml-2023-08-28")
    assert old.layers[1]["wk"].name == "layers.1.attention.wk.weight"
    assert new.layers[1]["wk"].name == "blk.1.attn_k.weight"


def test_macos_layout_keeps_everything_below_one_terabyte():
    preset = get_preset("llama2-70b")
    fam = family_of(preset)
    model = fam.new_model(preset.hparams, 512, "ggml-2023-08-16")
    space = AddressSpace()
    fam.place_model(model, LAYOUTS["macos-metal"], space)
    space.reserve("compute", LAYOUTS["macos-metal"].buffer_base, 150_000_000)
    spans = sorted(space.regions.values())
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no overlap
    assert spans[-1][1] < 1 << 40  # inside the measure allocator's range
    model_l = fam.new_model(preset.hparams, 512, "ggml-2023-08-16")
    fam.place_model(model_l, LAYOUTS["linux"], AddressSpace())
    assert model_l.weights[0].data >= 1 << 40


def test_custom_hparams_are_checked():
    with pytest.raises(ValueError, match="unknown hyper-parameter"):
        with_hparams(get_preset("llama-7b"), {"n_heads": 3})
    with pytest.raises(ValueError, match="multiple of n_head"):
        with_hparams(get_preset("llama-7b"), {"n_head": 3})
    with pytest.raises(ValueError, match="integer"):
        with_hparams(get_preset("gpt2-tiny"), {"n_layer": "two"})
    assert with_hparams(get_preset("gpt2-tiny"), {"n_layer": "3"}).hparams.n_layer == 3


def test_presets_command_lists_every_preset(capsys):
    from alloctrace.cli import main

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out
    assert "n_head_kv=8" in out and "n_ff=28672" in out
    assert main(["presets", "--json"]) == 0
    import json
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(PRESETS)
    assert next(r for r in rows if r["name"] == "open-llama-3b")["hparams"]["n_embd"] == 3200
