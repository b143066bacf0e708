"""A tiny sliding-window (iSWA) GGUF (gemma3) with deterministic random weights, written with `gguf`.

About 300 KB: 6 layers, n_embd 64, 4 heads (2 KV heads of 16), n_ff 128, a sliding window of 128 tokens, and
tests/moe_gguf.py's 512-token SPM vocabulary. llama.cpp reads gemma3's layers in the pattern 5 sliding-window
layers to 1 full-attention layer, so it makes two KV caches and prints a `llama_kv_cache: size = ...` line for
each: the full one (n_ctx cells, 1 layer) and the sliding-window one (min(n_ctx, window + n_ubatch) cells,
padded, 5 layers).

    python tests/iswa_gguf.py OUT.gguf
"""
from __future__ import annotations

import sys

import numpy as np

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_LAYER, N_FF, WINDOW = 64, 4, 2, 16, 6, 128, 128


def write(path: str, seed: int = 11, window: int = WINDOW):
    import gguf

    from moe_gguf import add_tokenizer

    rng = np.random.default_rng(seed)
    a = "gemma3"
    w = gguf.GGUFWriter(path, a)
    w.add_name("tiny-gemma3-random")
    w.add_uint32(f"{a}.context_length", 32768)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.feed_forward_length", N_FF)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.sliding_window", window)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 1000000.0)
    tokens = add_tokenizer(w)

    def t(name, *ne):  # ne in ggml order: ne0 first
        w.add_tensor(name, (rng.standard_normal(tuple(reversed(ne))) * 0.05).astype(np.float16))

    def norm(name, n):
        w.add_tensor(name, np.zeros(n, dtype=np.float32))  # gemma's norms scale by 1 + weight

    t("token_embd.weight", N_EMBD, len(tokens))  # the output reuses it (gemma ties them)
    norm("output_norm.weight", N_EMBD)
    q, kv = HEAD_DIM * N_HEAD, HEAD_DIM * N_HEAD_KV
    for i in range(N_LAYER):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight", N_EMBD)
        t(b + "attn_q.weight", N_EMBD, q)
        t(b + "attn_k.weight", N_EMBD, kv)
        t(b + "attn_v.weight", N_EMBD, kv)
        t(b + "attn_output.weight", q, N_EMBD)
        norm(b + "attn_q_norm.weight", HEAD_DIM)
        norm(b + "attn_k_norm.weight", HEAD_DIM)
        norm(b + "post_attention_norm.weight", N_EMBD)
        norm(b + "ffn_norm.weight", N_EMBD)
        t(b + "ffn_gate.weight", N_EMBD, N_FF)
        t(b + "ffn_up.weight", N_EMBD, N_FF)
        t(b + "ffn_down.weight", N_FF, N_EMBD)
        norm(b + "post_ffw_norm.weight", N_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(sys.argv[1])
