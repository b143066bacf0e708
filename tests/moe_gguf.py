"""A tiny mixture-of-experts GGUF (qwen3moe) with deterministic random weights, written with `gguf`.

Small enough to make in a test (about 300 KB): 2 layers, n_embd 64, 4 heads (2 KV heads), 4 experts of
which 2 are used per token, 32-wide experts, and a 512-token SPM vocabulary of byte tokens. llama.cpp
builds its MoE FFN for it: router soft_max, top-k (argsort + view), get_rows of the weights, their sum
(SUM_ROWS), CLAMP of the sum and DIV (qwen3moe normalises the top-k weights), MUL_MAT_ID per expert.

    python tests/moe_gguf.py OUT.gguf
"""
from __future__ import annotations

import sys

import numpy as np

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, N_LAYER = 512, 64, 4, 2, 2
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 32
HEAD_DIM = N_EMBD // N_HEAD


def vocab():
    """<unk>, <s>, </s>, the 256 byte tokens, then single characters (the SPM word start marked)."""
    tokens, types = ["<unk>", "<s>", "</s>"], [2, 3, 3]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-"
    for c in chars:
        for word in (c, "\u2581" + c):
            if len(tokens) < N_VOCAB:
                tokens.append(word)
                types.append(1)
    while len(tokens) < N_VOCAB:
        tokens.append("\u2581" + "x" * (len(tokens) - 200))
        types.append(1)
    return tokens, [-float(i) for i in range(len(tokens))], types


def add_tokenizer(w) -> list[str]:
    """The SPM tokenizer of vocab() into GGUFWriter `w` (<unk>, <s>, </s> as ids 0, 1, 2); its tokens."""
    tokens, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    return tokens


def write(path: str, seed: int = 7):
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "qwen3moe")
    a = "qwen3moe"
    w.add_name("tiny-qwen3moe-random")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", N_LAYER)
    w.add_uint32(f"{a}.feed_forward_length", N_FF_EXP * N_EXPERT_USED)
    w.add_uint32(f"{a}.expert_feed_forward_length", N_FF_EXP)
    w.add_uint32(f"{a}.expert_count", N_EXPERT)
    w.add_uint32(f"{a}.expert_used_count", N_EXPERT_USED)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    tokens = add_tokenizer(w)

    def t(name, *ne, dtype=np.float16):  # ne in ggml order: ne0 first
        w.add_tensor(name, (rng.standard_normal(tuple(reversed(ne))) * 0.05).astype(dtype))

    def norm(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t("token_embd.weight", N_EMBD, N_VOCAB)
    norm("output_norm.weight", N_EMBD)
    t("output.weight", N_EMBD, N_VOCAB)
    kv = HEAD_DIM * N_HEAD_KV
    for i in range(N_LAYER):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight", N_EMBD)
        t(b + "attn_q.weight", N_EMBD, N_EMBD)
        t(b + "attn_k.weight", N_EMBD, kv)
        t(b + "attn_v.weight", N_EMBD, kv)
        t(b + "attn_output.weight", N_EMBD, N_EMBD)
        norm(b + "attn_q_norm.weight", HEAD_DIM)
        norm(b + "attn_k_norm.weight", HEAD_DIM)
        norm(b + "ffn_norm.weight", N_EMBD)
        t(b + "ffn_gate_inp.weight", N_EMBD, N_EXPERT, dtype=np.float32)
        t(b + "ffn_gate_exps.weight", N_EMBD, N_FF_EXP, N_EXPERT)
        t(b + "ffn_up_exps.weight", N_EMBD, N_FF_EXP, N_EXPERT)
        t(b + "ffn_down_exps.weight", N_FF_EXP, N_EMBD, N_EXPERT)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(sys.argv[1])
