"""Allocates one small graph with ggml's gallocr, and leaves a detached child running after it exits: the
child notes its pid and its environment's record folder in INFO, waits for the file GO, allocates a graph
again (the recorder then tries to write), starts `sh -c env` (its output into INFO.env) and writes INFO.done.

    python detach_later.py GO INFO
"""
import json
import os
import subprocess
import sys
import time

import ggml


def allocate():
    backend = ggml.ggml_backend_cpu_init()
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=ggml.ggml_tensor_overhead() * 16 + ggml.ggml_graph_overhead(),
                                               mem_buffer=None, no_alloc=True))
    x = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, 16, 4)
    ggml.ggml_set_input(x)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, ggml.ggml_mul(ctx, ggml.ggml_silu(ctx, x), x))
    galloc = ggml.ggml_gallocr_new(ggml.ggml_backend_get_default_buffer_type(backend))
    assert ggml.ggml_gallocr_alloc_graph(galloc, gf)


go, info = sys.argv[1], sys.argv[2]
allocate()
if os.fork() == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # as a daemon does: the command's pipes are not held open
        os.dup2(null, fd)
    with open(info + ".part", "w") as f:
        json.dump({"pid": os.getpid(), "dir": os.environ.get("ALLOCTRACE_RECORD_DIR")}, f)
    os.rename(info + ".part", info)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    allocate()
    with open(info + ".env", "w") as f:
        subprocess.run(["sh", "-c", "env"], stdout=f, check=True)
    open(info + ".done", "w").close()
    os._exit(0)
while not os.path.exists(info):
    time.sleep(0.01)
