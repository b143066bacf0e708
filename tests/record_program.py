"""A ggml program for `alloctrace record` tests: builds op programs in real ggml (ggml-python) and allocates them.

    python record_program.py SPEC.json OUT.json

SPEC: {"mode": "gallocr" | "two_types" | "sched" | "threads", "programs": [...], "crash_after": k (optional),
"hang_after": k (optional: after k graphs, touch OUT.hung and sleep for an hour),
"bad_ids_at": k (optional, two_types: graph k's last node gets buffer id -1, an assert inside the allocator)}.
Each program's tensors are built as realggml does; then, per mode, allocated by one `ggml_gallocr_new`, by one
`ggml_gallocr_new_n` over the CPU buffer type and a second type (alignment 64, max size 4096, its own name)
with nodes and leafs spread over both, or by a `ggml_backend_sched`; "threads" builds every program first,
then allocates them from four threads at once, each with its own gallocr (ctypes releases the GIL). OUT lists, per graph, every tensor's
address, data pointer and buffer as the program reads them back after allocation. With crash_after, the
program dies of a GGML_ASSERT after that many graphs.
"""
from __future__ import annotations

import ctypes
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ggml  # noqa: E402

from realggml import Program, RealSide, Ref, Step, cpu_buffer_type  # noqa: E402

ALIGN_FN = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)
NAME_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
SECOND_ALIGNMENT, SECOND_MAX_SIZE = 64, 1024


def decode(obj) -> Program:
    steps = []
    for s in obj["steps"]:
        args = tuple(Ref(a["ref"]) if isinstance(a, dict) else a for a in s["args"])
        steps.append(Step(s["op"], args, s.get("name", ""), s.get("input", False), s.get("output", False),
                          s.get("external", False)))
    return Program(tuple(steps), tuple(obj["roots"]))


def encode(program: Program) -> dict:
    return {"steps": [{"op": s.op, "args": [{"ref": a.index} if isinstance(a, Ref) else a for a in s.args],
                       "name": s.name, "input": s.input, "output": s.output, "external": s.external}
                      for s in program.steps],
            "roots": list(program.roots)}


class SecondBufferType:
    """The CPU buffer type copied, with its own name, alignment and maximum size (ggml 0.15.3's struct:
    six interface pointers, then device and context)."""

    def __init__(self):
        cpu = _ptr(cpu_buffer_type())
        self.raw = (ctypes.c_void_p * 8).from_buffer_copy(ctypes.string_at(cpu, 64))
        self.name = ctypes.create_string_buffer(b"TEST64")
        self._fns = [NAME_FN(lambda b: ctypes.addressof(self.name)), ALIGN_FN(lambda b: SECOND_ALIGNMENT),
                     ALIGN_FN(lambda b: SECOND_MAX_SIZE)]
        for slot, fn in zip((0, 2, 3), self._fns):
            self.raw[slot] = ctypes.cast(fn, ctypes.c_void_p).value
        self.ptr = ctypes.addressof(self.raw)


def _ptr(p) -> int:
    return p if isinstance(p, int) else ctypes.cast(p, ctypes.c_void_p).value


def build(real: RealSide, program: Program):
    real.start(program)
    for s in program.steps:
        real.step(s)
    gf = ggml.ggml_new_graph_custom(real.ctx, real.graph_size, False)
    for r in program.roots:
        ggml.ggml_build_forward_expand(gf, real.tensors[r])
    return gf


def readback(real: RealSide) -> list:
    out = []
    for t in real.tensors:
        c = t.contents
        out.append([ctypes.addressof(c), c.data or 0, c.buffer or 0, ggml.ggml_get_name(t).decode()])
    return out


def threads(spec: dict, out_path: str):
    import threading

    cpu = cpu_buffer_type()
    sides = [RealSide() for _ in spec["programs"]]
    graphs = [build(side, decode(obj)) for side, obj in zip(sides, spec["programs"])]
    results = [None] * len(graphs)
    start = threading.Barrier(4)

    def work(k0):
        galloc = ggml.ggml_gallocr_new(cpu)
        start.wait()
        for k in range(k0, len(graphs), 4):
            ok = ggml.ggml_gallocr_alloc_graph(galloc, graphs[k])
            results[k] = {"ok": bool(ok), "tensors": readback(sides[k]), "thread": k0}

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    Path(out_path).write_text(json.dumps(results))


def main(spec_path: str, out_path: str):
    spec = json.loads(Path(spec_path).read_text())
    mode = spec["mode"]
    if mode == "threads":
        return threads(spec, out_path)
    real = RealSide()  # its own gallocr goes unused: one allocator per mode below
    results = []
    cpu = cpu_buffer_type()
    if mode == "gallocr":
        galloc = ggml.ggml_gallocr_new(cpu)
    elif mode == "two_types":
        second = SecondBufferType()
        bufts = (ctypes.c_void_p * 2)(_ptr(cpu), second.ptr)
        galloc = ggml.ggml_gallocr_new_n(bufts, 2)
    else:
        backend = ggml.ggml_backend_cpu_init()
        backends = (ctypes.c_void_p * 1)(_ptr(backend))
        sched_bufts = (ctypes.c_void_p * 1)(_ptr(cpu))
        sched = ggml.ggml_backend_sched_new(backends, sched_bufts, 1, 4096, False, False)
    for k, obj in enumerate(spec["programs"]):
        if spec.get("hang_after") == k:
            Path(out_path + ".hung").touch()
            time.sleep(3600)
        if spec.get("crash_after") == k:
            sys.stdout.flush()
            ggml.ggml_gallocr_get_buffer_size(galloc, 99)  # GGML_ASSERT(buffer_id < n_buffers): abort
        program = decode(obj)
        gf = build(real, program)
        if mode == "gallocr":
            ok = ggml.ggml_gallocr_alloc_graph(galloc, gf)
        elif mode == "two_types":
            g = gf.contents
            node_ids = (ctypes.c_int * max(1, g.n_nodes))(*[(i // 2) % 2 for i in range(g.n_nodes)])
            if spec.get("bad_ids_at") == k:  # GGML_ASSERT(buffer_id >= 0) inside ggml_gallocr_reserve_n
                node_ids[g.n_nodes - 1] = -1
            leaf_ids = (ctypes.c_int * max(1, g.n_leafs))(*[i % 2 for i in range(g.n_leafs)])
            ok = ggml.ggml_gallocr_reserve_n(galloc, gf, node_ids, leaf_ids) and ggml.ggml_gallocr_alloc_graph(galloc, gf)
        else:
            ggml.ggml_backend_sched_reset(sched)
            ok = ggml.ggml_backend_sched_alloc_graph(sched, gf)
        results.append({"ok": bool(ok), "tensors": readback(real)})
        Path(out_path).write_text(json.dumps(results))
    print(f"allocated {len(results)} graphs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
