"""How long the allocator model takes on a ~3,000-node graph (goal: measure + real under 0.5 s).

The graph is an 80-layer LLaMA-style network (attention with a KV cache, a
gated MLP), built with the ggml-like builder the way llama.cpp built it:
2023 sources and names for the legacy allocators, current ones for gallocr.
Weights and the KV cache live outside the compute buffer (linux layout).
Timed, best of `repeat` runs:
  - ggml-2023-08-16 / -08-28: a measure walk, then a real walk in a buffer of the measured size;
  - ggml-head: reserve (plan) then alloc_graph (plan reused, every tensor placed).
Usage: python bench/bench_model.py [n_layers] [n_tokens] [repeat] [--profile]
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time

from alloctrace.allocator import LAYOUTS, Gallocr, LegacyAllocator, get_profile
from alloctrace.allocator.build import Ctx
from figures import at_most, take_option, write

N_EMBD, N_HEAD, N_FF = 4096, 32, 11008


class _Placer:
    """Consecutive addresses for weights and KV cache, given as soon as a tensor exists."""

    def __init__(self, ctx: Ctx):
        layout = LAYOUTS["linux"]
        self.ctx, self.layout = ctx, layout
        self.next = {"w": layout.weights_base, "kv": layout.kv_base}

    def new(self, where: str, name: str, *ne, type_="f16"):
        t = self.ctx.set_name(self.ctx.new_tensor(type_, ne), name)
        self.next[where] = self.layout.place([t], self.next[where])
        return t


def llama_graph(n_layers: int, n_tokens: int, legacy: bool):
    """One forward pass over n_tokens with an empty cache; returns (graph, explicitly allocated inputs)."""
    ctx = Ctx(legacy=legacy)
    n = ctx.set_name
    p = _Placer(ctx)
    E, H, N = N_EMBD, N_HEAD, n_tokens
    D = E // H
    tokens = ctx.set_input(n(ctx.new_tensor("i32", (N,)), "inp_tokens"))
    pos = None if legacy else ctx.set_input(n(ctx.new_tensor("i32", (N,)), "inp_pos"))
    kq_scale = n(ctx.new_tensor("f32", (1,)), "1/sqrt(n_embd_head)") if legacy else 1 / D ** 0.5
    inputs = [tokens] + ([kq_scale] if legacy else [])
    tok_embd = p.new("w", "token_embd.weight", E, 32000)
    cur = n(ctx.get_rows(tok_embd, tokens), "inp_embd")
    for il in range(n_layers):
        inp_sa = cur
        cur = n(ctx.rms_norm(cur), "rms_norm_0")
        cur = n(ctx.mul(cur, p.new("w", f"blk.{il}.attn_norm.weight", E, type_="f32")), "attention_norm_0")
        k = n(ctx.mul_mat(p.new("w", f"blk.{il}.attn_k.weight", E, E), cur), "tmpk")
        q = n(ctx.mul_mat(p.new("w", f"blk.{il}.attn_q.weight", E, E), cur), "tmpq")
        k = n(ctx.rope(ctx.reshape_3d(k, D, H, N), 0 if legacy else pos, D, 0), "Kcur")
        q = n(ctx.rope(ctx.reshape_3d(q, D, H, N), 0 if legacy else pos, D, 0), "Qcur")
        v = ctx.mul_mat(p.new("w", f"blk.{il}.attn_v.weight", E, E), cur)
        v = n(ctx.transpose(ctx.reshape_2d(v, E, N)), "Vcur")
        k_cache = p.new("kv", f"cache_k_l{il}", E * N)
        v_cache = p.new("kv", f"cache_v_l{il}", N, E)
        k_view = n(ctx.view_1d(k_cache, N * E, 0), "k")
        v_view = n(ctx.view_2d(v_cache, N, E, v_cache.nb[1], 0), "v")
        store_k = ctx.cpy(k, k_view)
        store_v = ctx.cpy(v, v_view)
        Q = n(ctx.permute(q, 0, 2, 1, 3), "Q")
        K = n(ctx.permute(ctx.reshape_3d(store_k, D, H, N), 0, 2, 1, 3), "K")
        kq = n(ctx.mul_mat(K, Q), "KQ")
        kq = n(ctx.scale(kq, kq_scale), "KQ_scaled")
        kq = n(ctx.diag_mask_inf(kq, 0), "KQ_masked")
        kq = n(ctx.soft_max(kq), "KQ_soft_max")
        V = n(ctx.view_3d(store_v, N, D, H, store_v.nb[1], store_v.nb[1] * D, 0), "V")
        kqv = n(ctx.mul_mat(V, kq), "KQV")
        merged = n(ctx.permute(kqv, 0, 2, 1, 3), "KQV_merged")
        if legacy:  # 2023 llama.cpp copied into a fresh tensor; later it calls ggml_cont
            cur = n(ctx.cpy(merged, ctx.new_tensor_2d("f32", E, N)), "KQV_merged_contiguous")
        else:
            cur = n(ctx.reshape_2d(ctx.cont(merged), E, N), "KQV_merged_contiguous")
        cur = n(ctx.mul_mat(p.new("w", f"blk.{il}.attn_output.weight", E, E), cur), "result_wo")
        inp_ff = n(ctx.add(cur, inp_sa), "inpFF")
        cur = n(ctx.rms_norm(inp_ff), "rms_norm_1")
        cur = n(ctx.mul(cur, p.new("w", f"blk.{il}.ffn_norm.weight", E, type_="f32")), "ffn_norm")
        up = n(ctx.mul_mat(p.new("w", f"blk.{il}.ffn_up.weight", E, N_FF), cur), "result_w3")
        gate = n(ctx.mul_mat(p.new("w", f"blk.{il}.ffn_gate.weight", E, N_FF), cur), "result_w1")
        cur = n(ctx.mul(n(ctx.silu(gate), "silu"), up), "silu_x_result_w3")
        cur = n(ctx.mul_mat(p.new("w", f"blk.{il}.ffn_down.weight", N_FF, E), cur), "result_w2")
        cur = n(ctx.add(cur, inp_ff), "inpFF_+_result_w2")
    cur = n(ctx.rms_norm(cur), "rms_norm_2")
    cur = n(ctx.mul(cur, p.new("w", "output_norm.weight", E, type_="f32")), "result_norm")
    out = ctx.set_output(n(ctx.mul_mat(p.new("w", "output.weight", E, 32000), cur), "result_output"))
    return ctx.build_forward(out), inputs


def run_legacy(profile_name: str, graph, inputs):
    profile = get_profile(profile_name)
    measure = LegacyAllocator.measure(profile, 32)
    for t in inputs:
        measure.alloc_tensor(t)
    size = measure.alloc_graph(graph) + 32
    real = LegacyAllocator.real(profile, LAYOUTS["linux"].buffer_base, size, 32)
    for t in inputs:
        real.alloc_tensor(t)
    real.alloc_graph(graph)
    assert measure.failed is None and real.failed is None, (measure.failed, real.failed)
    return size, len(measure.events) + len(real.events)


def run_head(graph, _inputs):
    galloc = Gallocr(get_profile("ggml-head"), alignment=32)
    assert galloc.reserve(graph) and galloc.alloc_graph(graph)
    return galloc.buffer_size, len(galloc.events)


def best_of(repeat: int, fn, *args):
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, result


def main(argv) -> int:
    json_path = take_option(argv)
    figures = []
    profile = "--profile" in argv
    nums = [int(a) for a in argv if not a.startswith("--")]
    n_layers, n_tokens, repeat = (nums + [80, 512, 5][len(nums):])[:3]
    for legacy, runs in ((True, [("ggml-2023-08-16", run_legacy), ("ggml-2023-08-28", run_legacy)]),
                         (False, [("ggml-head", run_head)])):
        t_build, (graph, inputs) = best_of(1, llama_graph, n_layers, n_tokens, legacy)
        print(f"{'2023' if legacy else 'head'} graph: {graph.n_nodes} nodes, {graph.n_leafs} leafs, "
              f"built in {t_build * 1000:.0f} ms")
        for name, fn in runs:
            args = (name, graph, inputs) if fn is run_legacy else (graph, inputs)
            secs, (size, n_events) = best_of(repeat, fn, *args)
            what = "measure + real" if fn is run_legacy else "reserve + alloc_graph"
            verdict = "ok" if secs < 0.5 else "SLOW (goal < 0.5 s)"
            figures.append(at_most(f"model: {name} {what}, {graph.n_nodes} nodes (best of {repeat})", secs, "s", 0.5))
            print(f"  {name:16s} {what:22s} {secs * 1000:7.1f} ms  buffer {size / 2**20:8.1f} MiB  "
                  f"{n_events} events  {verdict}")
            if profile:
                pr = cProfile.Profile()
                pr.runcall(fn, *args)
                pstats.Stats(pr).sort_stats("cumulative").print_stats(12)
    write(json_path, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
