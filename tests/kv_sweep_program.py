"""tests/sweep_program.py's real ggml compute buffer, with the weights and KV cache lines a llama.cpp run split
over two devices prints (its own words and layout): a KV cache per device that grows with -c, fixed weights.

    python kv_sweep_program.py [-c N_CTX] [-ub N_UBATCH] [-nh N_HEAD] [-fa on|off]

KV cache: K and V, f16, 64 x n_ctx x n_head per layer; 4 layers on CUDA0, 2 on CPU.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweep_program  # noqa: E402

LAYERS = {"CUDA0": 4, "CPU": 2}
WEIGHTS_MIB = {"CUDA0": 40.0, "CPU": 6.13}


def kv_bytes(device: str, n_ctx: int, n_head: int) -> int:
    return 2 * 2 * sweep_program.HEAD_DIM * n_ctx * n_head * LAYERS[device]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n_ctx = int(argv[argv.index("-c") + 1]) if "-c" in argv else 256
    n_head = int(argv[argv.index("-nh") + 1]) if "-nh" in argv else 4
    for dev, mib in WEIGHTS_MIB.items():
        print(f"load_tensors: {dev:>12} model buffer size = {mib:8.2f} MiB")
    for dev in LAYERS:
        print(f"llama_kv_cache: {dev:>10} KV buffer size = {kv_bytes(dev, n_ctx, n_head) / 2**20:8.2f} MiB")
    return sweep_program.main(argv)


if __name__ == "__main__":
    sys.exit(main())
