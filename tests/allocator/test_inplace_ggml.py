"""Every op of the model's in-place list, run through the real ggml_gallocr (ggml-python's ggml).

Each graph makes the op's first source an intermediate with one child and the
op's layout, so an op ggml may run in place takes its parent's memory: the
test asserts that the real allocator did (or, for an op off the list, did
not), and that the model placed every tensor where ggml did. ggml-python's
allocator is `ggml-2026-08-21`'s; CLAMP is a view of its source there. CLAMP's
in-place reuse (`ggml-head`) is checked against llama.cpp's ggml 0.25.3: a
graph built through ctypes (tests/clamp_program.py, with ALLOCTRACE_LLAMA_BIN)
and real MoE recordings (tests/record/test_record_moe.py).
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import ggml
import pytest

from alloctrace.allocator import Gallocr, get_profile
from alloctrace.allocator.profiles import INPLACE_HISTORY, PROFILES, inplace_on
from realggml import cpu_buffer_type, read_graph

GENERATION = "ggml-2026-08-21"  # the allocator ggml-python 0.0.45 bundles (ggml 0.15.3)
F32, I32 = ggml.GGML_TYPE_F32, ggml.GGML_TYPE_I32


def _op(ctx, name, x, new):
    """The op under test on `x` (4 x 3 x 2 f32); `new(type, *ne)` makes a further input."""
    if name == "FILL":
        return ggml.ggml_fill(ctx, x, 1.5)
    if name == "SCALE":
        return ggml.ggml_scale(ctx, x, 0.5)
    if name == "DIAG_MASK_ZERO":
        return ggml.ggml_diag_mask_zero(ctx, x, 0)
    if name == "DIAG_MASK_INF":
        return ggml.ggml_diag_mask_inf(ctx, x, 0)
    if name in ("ADD", "SUB", "MUL", "DIV"):
        return getattr(ggml, "ggml_" + name.lower())(ctx, x, new(F32, 4, 3, 2))
    if name == "ADD_ID":  # x: [n_embd, n_expert_used, n_tokens]; b: [n_embd, n_expert]; ids: [used, tokens]
        return ggml.ggml_add_id(ctx, x, new(F32, 4, 5), new(I32, 3, 2))
    if name == "ADD1":
        return ggml.ggml_add1(ctx, x, new(F32, 1))
    if name in ("SQR", "SQRT", "LOG"):
        return getattr(ggml, "ggml_" + name.lower())(ctx, x)
    if name == "UNARY":
        return ggml.ggml_gelu(ctx, x)
    if name == "ROPE":  # x: [head dim, heads, tokens]; positions: one per token
        return ggml.ggml_rope(ctx, x, new(I32, 2), 4, 0)
    if name == "ROPE_BACK":
        return ggml.ggml_rope_ext_back(ctx, x, new(I32, 2), None, 4, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    if name == "SILU_BACK":
        return ggml.ggml_silu_back(ctx, x, new(F32, 4, 3, 2))
    if name == "RMS_NORM":
        return ggml.ggml_rms_norm(ctx, x, 1e-6)
    if name == "RMS_NORM_BACK":
        return ggml.ggml_rms_norm_back(ctx, x, new(F32, 4, 3, 2), 1e-6)
    if name == "SOFT_MAX":
        return ggml.ggml_soft_max(ctx, x)
    if name == "SOFT_MAX_BACK":
        return ggml.ggml_soft_max_ext_back(ctx, x, new(F32, 4, 3, 2), 1.0, 0.0)
    # off the list today
    if name == "ACC":
        return ggml.ggml_acc(ctx, x, new(F32, 2, 3, 2), x.contents.nb[1], x.contents.nb[2], x.contents.nb[3], 0)
    if name == "SET":
        return ggml.ggml_set(ctx, x, new(F32, 2, 3, 2), x.contents.nb[1], x.contents.nb[2], x.contents.nb[3], 0)
    if name == "CONT":
        return ggml.ggml_cont(ctx, x)
    if name == "NORM":
        return ggml.ggml_norm(ctx, x, 1e-5)
    if name == "SIN":
        return ggml.ggml_sin(ctx, x)
    if name == "CLAMP":
        return ggml.ggml_clamp(ctx, x, -1.0, 1.0)
    raise AssertionError(f"no graph for {name}")


def _run(name: str):
    """(did ggml's op node share its parent's memory without being its view, the model's offsets,
    ggml's offsets, whether the op node is a view in ggml that the model did not allocate)"""
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    galloc = ggml.ggml_gallocr_new(cpu_buffer_type())
    try:
        def new(type_, *ne):
            t = getattr(ggml, f"ggml_new_tensor_{len(ne)}d")(ctx, type_, *ne)
            ggml.ggml_set_input(t)
            return t

        a, b = new(F32, 4, 3, 2), new(F32, 4, 3, 2)
        x = ggml.ggml_add(ctx, a, b)  # the parent: own memory, one child (the op)
        ggml.ggml_set_name(x, b"parent")
        y = _op(ctx, name, x, new)
        ggml.ggml_set_name(y, b"op")
        z = ggml.ggml_sqr(ctx, y)
        ggml.ggml_set_output(z)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, z)
        graph, by_addr = read_graph(gf)
        assert ggml.ggml_gallocr_alloc_graph(galloc, gf)
        model = Gallocr(get_profile(GENERATION))
        assert model.alloc_graph(graph)
        real, mine = {}, {}
        for addr, t in by_addr.items():
            c = ggml.ggml_tensor.from_address(addr)
            if c.buffer and c.data:
                real[t.name] = c.data - ggml.ggml_backend_buffer_get_base(c.buffer)
            if t in model.placement:
                mine[t.name] = model.placement[t][1]
        yc, xc = y.contents, x.contents
        shared = yc.data == xc.data and not yc.view_src
        allocated = {e.tensor for e in model.events if e.kind in ("alloc", "reuse")}
        return shared, mine, real, bool(yc.view_src) and "op" not in allocated
    finally:
        ggml.ggml_gallocr_free(galloc)
        ggml.ggml_free(ctx)


# ggml_op_can_inplace as ggml-alloc.c spells it at d99724f2 (ggml-python's copy is the same file)
LISTED = ["FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV", "SQR",
          "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK", "SOFT_MAX",
          "SOFT_MAX_BACK"]


def test_the_models_list_is_ggmls():
    assert PROFILES[GENERATION].inplace_ops == set(LISTED)
    assert PROFILES["ggml-head"].inplace_ops == set(LISTED) | {"CLAMP"}  # llama.cpp's ggml 0.25.3


@pytest.mark.parametrize("op", LISTED)
def test_an_op_on_the_list_takes_its_parents_memory_like_ggml(op):
    shared, mine, real, _ = _run(op)
    assert shared, f"ggml did not run {op} in place: the graph does not test it"
    assert mine == real
    assert mine["op"] == mine["parent"]


@pytest.mark.parametrize("op", ["ACC", "SET", "CONT", "NORM", "SIN"])
def test_an_op_off_the_list_gets_memory_of_its_own_like_ggml(op):
    shared, mine, real, _ = _run(op)
    assert not shared
    assert mine == real and mine["op"] != mine["parent"]


def test_clamp_is_a_view_of_its_source_in_ggml_python():
    shared, mine, real, is_view = _run("CLAMP")
    assert is_view and not shared
    assert mine == real and mine["op"] == mine["parent"]  # a view: at its source, never allocated


def test_each_generation_lists_the_ops_of_its_date():
    """The history table against the lists read from ggml-alloc.c at each profile's commit."""
    assert {op for op, _, until in INPLACE_HISTORY if until} == {"ACC", "SET", "CONT"}
    assert PROFILES["ggml-2023-08-28"].inplace_ops >= {"ACC", "SET", "CONT"}
    assert not PROFILES["ggml-2023-10"].inplace_ops & {"ACC", "SET", "CONT"}
    assert len(PROFILES["ggml-2023-10"].inplace_ops) == len(PROFILES["ggml-2024-02"].inplace_ops) == 15
    assert PROFILES["ggml-2025-09"].inplace_ops - PROFILES["ggml-2024-02"].inplace_ops == {
        "ADD_ID", "ROPE_BACK", "SILU_BACK", "RMS_NORM_BACK", "SOFT_MAX_BACK"}
    assert PROFILES[GENERATION].inplace_ops - PROFILES["ggml-2025-09"].inplace_ops == {"FILL"}
    assert inplace_on("2026-08-24") - inplace_on("2026-08-23") == {"CLAMP"}


def test_a_mixture_of_experts_ffn_places_every_tensor_like_ggml():
    """llama.cpp's MoE FFN (build_moe_ffn, qwen3moe's path) for 2 tokens: router soft_max, top-k,
    get_rows of the weights, their sum (SUM_ROWS), CLAMP and DIV, MUL_MAT_ID per expert, the weighted
    expert outputs added up. Weights live in a context of their own (external to the allocator)."""
    n_embd, n_ff, n_expert, n_used, n_tok = 16, 8, 4, 2, 2
    wctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    galloc = ggml.ggml_gallocr_new(cpu_buffer_type())
    try:
        gate_inp = ggml.ggml_new_tensor_2d(wctx, F32, n_embd, n_expert)
        up_exps = ggml.ggml_new_tensor_3d(wctx, F32, n_embd, n_ff, n_expert)
        gate_exps = ggml.ggml_new_tensor_3d(wctx, F32, n_embd, n_ff, n_expert)
        down_exps = ggml.ggml_new_tensor_3d(wctx, F32, n_ff, n_embd, n_expert)
        x = ggml.ggml_new_tensor_2d(ctx, F32, n_embd, n_tok)
        ggml.ggml_set_input(x)
        cur = ggml.ggml_rms_norm(ctx, x, 1e-6)
        logits = ggml.ggml_mul_mat(ctx, gate_inp, cur)
        probs = ggml.ggml_soft_max(ctx, logits)
        selected = ggml.ggml_top_k(ctx, probs, n_used)
        weights = ggml.ggml_get_rows(ctx, ggml.ggml_reshape_3d(ctx, probs, 1, n_expert, n_tok), selected)
        weights = ggml.ggml_reshape_2d(ctx, weights, n_used, n_tok)
        weights_sum = ggml.ggml_clamp(ctx, ggml.ggml_sum_rows(ctx, weights), 6.103515625e-5, float("inf"))
        weights = ggml.ggml_reshape_3d(ctx, ggml.ggml_div(ctx, weights, weights_sum), 1, n_used, n_tok)
        cur3 = ggml.ggml_reshape_3d(ctx, cur, n_embd, 1, n_tok)
        up = ggml.ggml_mul_mat_id(ctx, up_exps, cur3, selected)
        gate = ggml.ggml_mul_mat_id(ctx, gate_exps, cur3, selected)
        experts = ggml.ggml_mul_mat_id(ctx, down_exps, ggml.ggml_mul(ctx, ggml.ggml_silu(ctx, gate), up), selected)
        experts = ggml.ggml_mul(ctx, experts, weights)
        e = experts.contents
        out = None
        for i in range(n_used):
            v = ggml.ggml_view_2d(ctx, experts, n_embd, n_tok, e.nb[2], i * e.nb[1])
            out = v if out is None else ggml.ggml_add(ctx, out, v)
        ggml.ggml_set_output(out)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, out)
        graph, by_addr = read_graph(gf)
        assert ggml.ggml_gallocr_alloc_graph(galloc, gf)
        model = Gallocr(get_profile(GENERATION))
        assert model.alloc_graph(graph)
        real = {}
        for addr, t in by_addr.items():
            c = ggml.ggml_tensor.from_address(addr)
            if c.buffer and c.data and t in model.placement:
                real[t] = c.data - ggml.ggml_backend_buffer_get_base(c.buffer)
        ops = {t.op for t in graph.nodes}
        assert {"MUL_MAT_ID", "SUM_ROWS", "CLAMP", "DIV", "GET_ROWS", "TOP_K", "SOFT_MAX"} <= ops, ops
        assert {t.name: o for t, (_, o) in model.placement.items()} == {t.name: o for t, o in real.items()}
        assert len(real) == len(model.placement) > 20
        assert model.buffer_size == ggml.ggml_gallocr_get_buffer_size(galloc, 0)
    finally:
        ggml.ggml_gallocr_free(galloc)
        ggml.ggml_free(ctx)
        ggml.ggml_free(wctx)


LLAMA = os.environ.get("ALLOCTRACE_LLAMA_BIN")


@pytest.mark.skipif(not LLAMA, reason="set ALLOCTRACE_LLAMA_BIN to a llama-completion (its ggml 0.25.3 runs CLAMP in place)")
def test_clamp_takes_its_parents_memory_in_llama_cpps_ggml(tmp_path, monkeypatch):
    """CLAMP first: ggml 0.25.3 (llama.cpp's) makes it a node of its own and reuses its parent; the recorded
    graph replays consistent through ggml-head and not through ggml-2026-08-21 (CLAMP off the list)."""
    import alloctrace.traces.sources.record.plans as replay
    from alloctrace.traces.sources.record.source import RecordingSource

    out = tmp_path / "clamp.atrec"
    res = subprocess.run([sys.executable, "-m", "alloctrace", "record", "-o", str(out), "--", sys.executable,
                          str(Path(__file__).parents[1].joinpath("clamp_program.py")), str(Path(LLAMA).parent)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["inplace"]
    (trace,) = RecordingSource().read(open(out, "rb"), filename="clamp.atrec", name=None)
    assert trace.meta.generation == "ggml-head" and all(g.consistent for g in trace.graphs)
    monkeypatch.setattr(replay, "profile_for_version", lambda version: GENERATION)
    (trace,) = RecordingSource().read(open(out, "rb"), filename="clamp.atrec", name=None)
    (g,) = trace.graphs
    assert not g.consistent and any("sum_clamped" in m for m in g.extra["mismatches"])
