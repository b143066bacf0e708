"""A ggml program for `alloctrace sweep` tests: one attention score block in real ggml (ggml-python), sized by
llama.cpp-like flags, planned and allocated by ggml's own graph allocator.

    python sweep_program.py [-c N_CTX] [-ub N_UBATCH] [-nh N_HEAD] [-fa on|off]

q [64, n_ubatch, n_head] and k [64, n_ctx, n_head] are f32 inputs; kq = k·q [n_ctx, n_ubatch, n_head] f32, then
an unnamed SCALE and `kq_soft_max` (both in place on kq's bytes). With `-fa on` the scores are never made:
`kqv` [64, n_ubatch, n_head] comes from ggml_flash_attn_ext. So, with sizes that are multiples of 8 (no padding),
the compute buffer is 4·n_head·(64·n_ubatch + 64·n_ctx + n_ctx·n_ubatch) bytes with -fa off. It prints the
buffer's size as ggml reports it, in llama.cpp's words.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ggml  # noqa: E402

from realggml import cpu_buffer_type  # noqa: E402

HEAD_DIM = 64


def expected_bytes(n_ctx: int, n_ubatch: int, n_head: int) -> int:
    """The buffer with -fa off: q, k and kq live together when kq is placed."""
    return 4 * n_head * (HEAD_DIM * n_ubatch + HEAD_DIM * n_ctx + n_ctx * n_ubatch)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", type=int, default=256)
    ap.add_argument("-ub", type=int, default=64)
    ap.add_argument("-nh", type=int, default=4)
    ap.add_argument("-fa", choices=("on", "off"), default="off")
    a = ap.parse_args(argv)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=ggml.ggml_tensor_overhead() * 64
                                               + ggml.ggml_graph_overhead(), mem_buffer=None, no_alloc=True))
    f32 = ggml.GGML_TYPE_F32
    q = ggml.ggml_new_tensor_3d(ctx, f32, HEAD_DIM, a.ub, a.nh)
    k = ggml.ggml_new_tensor_3d(ctx, f32, HEAD_DIM, a.c, a.nh)
    for t, name in ((q, b"q"), (k, b"k")):
        ggml.ggml_set_name(t, name)
        ggml.ggml_set_input(t)
    if a.fa == "on":
        v = ggml.ggml_new_tensor_3d(ctx, ggml.GGML_TYPE_F16, HEAD_DIM, a.c, a.nh)
        kf = ggml.ggml_new_tensor_3d(ctx, ggml.GGML_TYPE_F16, HEAD_DIM, a.c, a.nh)
        ggml.ggml_set_name(v, b"v")
        ggml.ggml_set_name(kf, b"k16")
        ggml.ggml_set_input(v)
        ggml.ggml_set_input(kf)
        out = ggml.ggml_flash_attn_ext(ctx, q, kf, v, None, 0.125, 0.0, 0.0)
        ggml.ggml_set_name(out, b"kqv")
    else:
        kq = ggml.ggml_mul_mat(ctx, k, ggml.ggml_scale(ctx, q, 0.125))  # the SCALE left unnamed: ggml calls it node_N
        ggml.ggml_set_name(kq, b"kq")
        scaled = ggml.ggml_scale(ctx, kq, 0.125)
        out = ggml.ggml_soft_max(ctx, scaled)
        ggml.ggml_set_name(out, b"kq_soft_max")
    ggml.ggml_set_output(out)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, out)
    galloc = ggml.ggml_gallocr_new(cpu_buffer_type())
    if not ggml.ggml_gallocr_reserve(galloc, gf) or not ggml.ggml_gallocr_alloc_graph(galloc, gf):
        print("allocation failed", file=sys.stderr)
        return 1
    size = ggml.ggml_gallocr_get_buffer_size(galloc, 0)
    print(f"sweep_program:        CPU compute buffer size = {size / 2**20:8.2f} MiB ({size} bytes)")
    ggml.ggml_gallocr_free(galloc)
    ggml.ggml_free(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
