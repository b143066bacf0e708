"""CLAMP on an intermediate with one child, allocated by the ggml of a llama.cpp build (ctypes, no bindings).

    python tests/clamp_program.py BIN_DIR     (BIN_DIR holds libggml-base.so.0)

Prints "view" when ggml_clamp made a view of its source (ggml before llama.cpp #27644), else "inplace" or
"own" for whether the allocator put the CLAMP node in its parent's memory. Run under `alloctrace record`,
the recording replays the same graph through the model.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

F32 = 0
VIEW_SRC = 232  # struct ggml_tensor.view_src in the layout of ggml since late 2024 (traces/sources/record)


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def main(bin_dir: str) -> str:
    lib = ctypes.CDLL(str(Path(bin_dir) / "libggml-base.so.0"))
    P = ctypes.c_void_p
    for name, args, res in [
        ("ggml_init", [InitParams], P), ("ggml_new_tensor_2d", [P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], P),
        ("ggml_add", [P, P, P], P), ("ggml_clamp", [P, P, ctypes.c_float, ctypes.c_float], P),
        ("ggml_sqr", [P, P], P), ("ggml_set_input", [P], None), ("ggml_set_output", [P], None),
        ("ggml_set_name", [P, ctypes.c_char_p], P), ("ggml_new_graph", [P], P),
        ("ggml_build_forward_expand", [P, P], None), ("ggml_backend_cpu_buffer_type", [], P),
        ("ggml_gallocr_new", [P], P), ("ggml_gallocr_alloc_graph", [P, P], ctypes.c_bool),
        ("ggml_get_data", [P], P), ("ggml_gallocr_free", [P], None), ("ggml_free", [P], None)]:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    ctx = lib.ggml_init(InitParams(1 << 20, None, True))
    a, b = lib.ggml_new_tensor_2d(ctx, F32, 64, 4), lib.ggml_new_tensor_2d(ctx, F32, 64, 4)
    for t, n in ((a, b"a"), (b, b"b")):
        lib.ggml_set_input(t)
        lib.ggml_set_name(t, n)
    x = lib.ggml_add(ctx, a, b)
    lib.ggml_set_name(x, b"sum")
    y = lib.ggml_clamp(ctx, x, 6.1e-5, float("inf"))
    lib.ggml_set_name(y, b"sum_clamped")
    z = lib.ggml_sqr(ctx, y)
    lib.ggml_set_name(z, b"out")
    lib.ggml_set_output(z)
    gf = lib.ggml_new_graph(ctx)
    lib.ggml_build_forward_expand(gf, z)
    galloc = lib.ggml_gallocr_new(lib.ggml_backend_cpu_buffer_type())
    assert lib.ggml_gallocr_alloc_graph(galloc, gf)
    is_view = ctypes.c_void_p.from_address(y + VIEW_SRC).value is not None
    answer = "view" if is_view else "inplace" if lib.ggml_get_data(y) == lib.ggml_get_data(x) else "own"
    lib.ggml_gallocr_free(galloc)
    lib.ggml_free(ctx)
    return answer


if __name__ == "__main__":
    print(main(sys.argv[1]))
