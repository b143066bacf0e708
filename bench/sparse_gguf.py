"""A llama GGUF of a real model's shape whose weights are a hole in the file: for timing dry runs.

`llama-fit-params` plans every graph without reading a weight, so a file with the metadata and tensor
table of a real model (here TinyLlama-1.1B's or Llama-2-7B's shape, Q4_0 weights) but no tensor bytes
on disk gives the same graphs and the same compute buffers as the real file, in the time a real dry run
takes. The data section is made with truncate(): sparse, no disk space, never read.

    python bench/sparse_gguf.py OUT.gguf [--shape 1b|7b]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

SHAPES = {  # n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff
    "1b": (32000, 2048, 22, 32, 4, 5632),
    "7b": (32000, 4096, 32, 32, 32, 11008),
}
BLOCK, BLOCK_BYTES = 32, 18  # Q4_0: 32 weights in 18 bytes


def write(path: str, shape: str = "1b") -> int:
    """Write the file; its size in bytes (almost all of it a hole)."""
    import gguf

    n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff = SHAPES[shape]
    w = gguf.GGUFWriter(path, "llama")
    a = "llama"
    w.add_name(f"sparse-llama-{shape}")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", n_embd)
    w.add_uint32(f"{a}.block_count", n_layer)
    w.add_uint32(f"{a}.feed_forward_length", n_ff)
    w.add_uint32(f"{a}.rope.dimension_count", n_embd // n_head)
    w.add_uint32(f"{a}.attention.head_count", n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", n_head_kv)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(n_vocab)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259))
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)

    def q4(name, *ne):  # ne in ggml order (ne0 first)
        n = int(np.prod(ne))
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float16), n // BLOCK * BLOCK_BYTES,
                          raw_dtype=gguf.GGMLQuantizationType.Q4_0)

    def f32(name, n):
        w.add_tensor_info(name, (n,), np.dtype(np.float32), 4 * n)

    kv = n_embd // n_head * n_head_kv
    q4("token_embd.weight", n_embd, n_vocab)
    f32("output_norm.weight", n_embd)
    q4("output.weight", n_embd, n_vocab)
    for i in range(n_layer):
        b = f"blk.{i}."
        f32(b + "attn_norm.weight", n_embd)
        q4(b + "attn_q.weight", n_embd, n_embd)
        q4(b + "attn_k.weight", n_embd, kv)
        q4(b + "attn_v.weight", n_embd, kv)
        q4(b + "attn_output.weight", n_embd, n_embd)
        f32(b + "ffn_norm.weight", n_embd)
        q4(b + "ffn_gate.weight", n_embd, n_ff)
        q4(b + "ffn_up.weight", n_embd, n_ff)
        q4(b + "ffn_down.weight", n_ff, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.write_padding(w.fout[0], w.fout[0].tell())
    start = w.fout[0].tell()
    data = sum(ti.nbytes + (-ti.nbytes) % w.data_alignment for ti in w.tensors[0].values())
    w.close()
    os.truncate(path, start + data)
    return start + data


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    a = ap.parse_args()
    size = write(a.out, a.shape)
    print(f"{a.out}: {size:,} bytes, {os.stat(a.out).st_blocks * 512:,} on disk")
