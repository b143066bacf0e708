"""The graph builder makes the graphs ggml made: same node/leaf order, shapes, strides, sizes, sources."""
import pytest

from alloctrace.allocator.build import Ctx
from conftest import load_harness


def harness_block(ctx: Ctx, E=64, H=4, N=8):
    """The attention-plus-MLP block of the fixture harness, written against the ggml-like API."""
    legacy = ctx.legacy
    D = E // H
    n = ctx.set_name
    w = lambda name, *ne: n(ctx.new_tensor("f32", ne), name)
    w_proj, w_fa, w_o, w_v = w("w_proj", 2 * E, E), w("w_fa", E, 2 * E), w("w_o", E, E), w("w_v", E, E)
    x = ctx.set_input(w("x", E, N))
    ln_g, ln_b = w("ln_g", E), w("ln_b", E)
    pos = None if legacy else ctx.set_input(n(ctx.new_tensor("i32", (N,)), "pos"))
    v_dst, w_qk, b_qk = w("V_trans_dst", N, D, H), w("w_qk", E, 2 * E), w("b_qk", 2 * E)
    k_dst, q_dst = w("K_dst", D, H, N), w("Q_dst", D, H, N)
    kq_scale = w("kq_scale", 1)
    merged_dst, b_o, w_fb = w("merged_dst", E, N), w("b_o", E), w("w_fb", E, 2 * E)

    norm = n(ctx.norm(x), "norm")
    norm_g = n(ctx.mul(norm, n(ctx.repeat(ln_g, norm), "ln_g_rep")), "norm_g")
    norm_gb = n(ctx.add(norm_g, n(ctx.repeat(ln_b, norm_g), "ln_b_rep")), "norm_gb")
    v = n(ctx.mul_mat(w_v, norm_gb), "v")
    v3 = n(ctx.reshape_3d(v, D, H, N), "V_3d")
    vr = n(ctx.rope(v3, pos if not legacy else 0, D, 0), "V_rope")
    vt = n(ctx.cpy(n(ctx.permute(vr, 1, 2, 0, 3), "V_perm"), v_dst), "V_trans")
    qk = n(ctx.mul_mat(w_qk, norm_gb), "qk")
    qk_b = n(ctx.add(qk, n(ctx.repeat(b_qk, qk), "b_qk_rep")), "qk_b")
    kcur = n(ctx.view_2d(qk_b, E, N, qk_b.nb[1], E * 4), "Kcur")
    K = n(ctx.permute(n(ctx.cpy(kcur, k_dst), "K_cont"), 0, 2, 1, 3), "K")
    qcur = n(ctx.view_2d(qk_b, E, N, qk_b.nb[1], 0), "Qcur")
    Q = n(ctx.permute(n(ctx.cpy(qcur, q_dst), "Q_cont"), 0, 2, 1, 3), "Q")
    kq = n(ctx.mul_mat(K, Q), "KQ")
    kq = n(ctx.scale(kq, kq_scale if legacy else 0.25), "KQ_scaled")
    kq = n(ctx.soft_max(n(ctx.diag_mask_inf(kq, 0), "KQ_masked")), "KQ_soft_max")
    kqv = n(ctx.mul_mat(vt, kq), "KQV")
    attn = n(ctx.cpy(n(ctx.permute(kqv, 0, 2, 1, 3), "KQV_merged"), merged_dst), "attn_cont")
    attn_o = n(ctx.mul_mat(w_o, attn), "attn_o")
    attn_ob = n(ctx.add(attn_o, n(ctx.repeat(b_o, attn_o), "b_o_rep")), "attn_ob")
    resid1 = n(ctx.add(attn_ob, x), "resid1")
    fc_a = n(ctx.mul_mat(w_fa, resid1), "fc_a")
    gated = n(ctx.mul(n(ctx.gelu(fc_a), "fc_a_gelu"), n(ctx.mul_mat(w_fb, resid1), "fc_b")), "gated")
    out = n(ctx.add(n(ctx.mul_mat(w_proj, gated), "proj"), resid1), "out")
    last = n(ctx.view_2d(out, E, 1, out.nb[1], (N - 1) * out.nb[1]), "out_last_row")
    result = n(ctx.scale(last, kq_scale if legacy else 0.25), "result")
    return ctx.build_forward(result)


def pad16(n):
    """The 2023 harness JSON records one scalar's size padded; the allocator pads anyway."""
    return (n + 15) // 16 * 16


def describe(t, g):
    srcs = []
    for s in t.srcs:
        if s is None:
            continue
        srcs.append((s.name, s.index if s in g.nodes else -1, s.index if s in g.leafs else -1))
    return (t.name, t.op, t.type, list(t.ne), list(t.nb), pad16(t.nbytes), srcs)


def expected(d):
    out = []
    for t in d["nodes"] + d["leafs"]:
        srcs = [(s["name"], s["node"], s["leaf"]) for s in t["srcs"]]
        out.append((t["name"], t["op"], t["type"], t["ne"], t["nb"], pad16(t["nbytes"]), srcs))
    return out


@pytest.mark.parametrize("legacy", [True, False])
def test_builder_reproduces_harness_graph(fixtures, legacy):
    if legacy:
        d = load_harness(fixtures / "v2023-08-16-legacy" / "harness_plain.json")
    else:
        d = load_harness(fixtures / "head-gallocr" / "harness_gallocr.json")["graphs"][0]
        d = {"nodes": d["nodes"], "leafs": [l for l in d["leafs"]]}
    g = harness_block(Ctx(legacy=legacy))
    ours = [describe(t, g) for t in g.nodes + g.leafs]
    theirs = expected(d)
    assert [o[0] for o in ours] == [t[0] for t in theirs]
    for o, t in zip(ours, theirs):
        assert o == t, f"{o} != {t}"


def test_builder_graph_allocates_like_the_real_log(fixtures):
    """Built with the API instead of loaded from JSON, the graph still renders the real log."""
    from alloctrace.allocator import LAYOUTS, LegacyAllocator, get_profile, render
    from conftest import allocator_lines

    ctx = Ctx(legacy=True)
    g = harness_block(ctx)
    LAYOUTS["linux"].place([t for t in g.leafs if t.name[:2] in ("w_", "b_", "ln")], LAYOUTS["linux"].weights_base)
    p = get_profile("ggml-2023-08-16")
    lines = []
    for alloc in (LegacyAllocator.measure(p, 16), LegacyAllocator.real(p, LAYOUTS["linux"].buffer_base, 12320, 16)):
        alloc.alloc_tensor(g.by_name("x"))
        alloc.alloc_tensor(g.by_name("kq_scale"))
        alloc.alloc_graph(g)
        lines += render(alloc.events, p)
    assert lines == allocator_lines(fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log")
