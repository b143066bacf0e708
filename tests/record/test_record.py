"""`alloctrace record` on real ggml: ggml-python's shared libraries, driven by tests/record_program.py.

The recorded placements must be the data pointers the program reads back after
allocation, and the ggml-head model must reproduce every recorded plan and
placement (consistent graphs), for a single gallocr, a gallocr over two buffer
types (different alignment and a max size that forces chunks), and the scheduler.
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from alloctrace.cli import main
from alloctrace.traces.sources.record.source import RecordingSource
from alloctrace.traces.sources.record.stream import read_processes, tensor_records
from alloctrace.traces.store.store import open_store
from record_program import SECOND_ALIGNMENT, SECOND_MAX_SIZE, encode
from test_differential_ggml import programs

PROGRAM = Path(__file__).parents[1].joinpath("record_program.py")
# each example runs a program under the recorder: few examples, no shrinking (a failure prints its programs)
RECORD_SETTINGS = dict(max_examples=4, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate),
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def record(tmp: Path, mode: str, progs, *, crash_after=None, bad_ids_at=None, store=None):
    """Run the program under `alloctrace record`; returns (exit status, recording or store, readback)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec, out = tmp / "spec.json", tmp / "out.json"
    spec.write_text(json.dumps({"mode": mode, "programs": [encode(p) for p in progs], "crash_after": crash_after,
                                "bad_ids_at": bad_ids_at}))
    target = ["--store", str(store)] if store else ["-o", str(tmp / "rec.atrec")]
    rc = main(["record", *target, "--", sys.executable, str(PROGRAM), str(spec), str(out)])
    readback = json.loads(out.read_text()) if out.exists() else []
    return rc, tmp / "rec.atrec", readback


def alloc_calls(path: Path) -> list:
    """Every recorded gallocr alloc_graph call, in program order (also those made by the scheduler)."""
    calls = []

    def walk(call):
        if call.kind == "alloc_graph":
            calls.append(call)
        for c in call.children:
            walk(c)

    with open(path, "rb") as f:
        read_processes(f, lambda proc, call: walk(call))
    return calls


def assert_placements_are_the_real_pointers(path: Path, readback: list):
    calls = alloc_calls(path)
    assert len(calls) == len(readback)
    compute_buffers = {b[2] for c in read_calls(path) for b in c.buffers}
    for call, graph in zip(calls, readback):
        recorded = {t: data for _kind, t, _buf, data, _base in call.placements}
        seen = {addr: data for addr, data, buf, _name in graph["tensors"] if buf in compute_buffers}
        assert recorded == seen  # every placement is where the tensor really is, and none is missing
    assert any(c.placements for c in calls)


def read_calls(path: Path) -> list:
    """Every recorded call, children included."""
    out = []

    def walk(call):
        out.append(call)
        for c in call.children:
            walk(c)

    with open(path, "rb") as f:
        read_processes(f, lambda proc, call: walk(call))
    return out


def traces_of(path: Path):
    with open(path, "rb") as f:
        return RecordingSource().read(f, filename=str(path), name=None)


def assert_model_consistent(path: Path) -> list:
    (trace,) = traces_of(path)
    graphs = list(trace.graphs)
    bad = [(g.index, g.extra["mismatches"]) for g in graphs if not g.consistent]
    assert not bad, bad
    assert trace.report["placements"] > 0
    return graphs


@settings(**RECORD_SETTINGS)
@given(progs=st.lists(programs(max_ops=40), min_size=4, max_size=8))
def test_gallocr_recording_matches_the_program_and_the_model(tmp_path_factory, progs):
    tmp = tmp_path_factory.mktemp("gallocr")
    rc, path, readback = record(tmp, "gallocr", progs)
    assert rc == 0
    assert_placements_are_the_real_pointers(path, readback)
    graphs = assert_model_consistent(path)
    assert [g.role for g in graphs].count("eval") == len(progs)


@settings(**RECORD_SETTINGS)
@given(progs=st.lists(programs(max_ops=40), min_size=4, max_size=8))
def test_two_buffer_types_with_their_own_alignment_and_max_size(tmp_path_factory, progs):
    tmp = tmp_path_factory.mktemp("two")
    rc, path, readback = record(tmp, "two_types", progs)
    assert rc == 0
    assert_placements_are_the_real_pointers(path, readback)
    graphs = assert_model_consistent(path)
    types = graphs[0].extra["buffer_types"]
    assert [t["name"] for t in types] == ["CPU", "TEST64"]
    assert (types[1]["alignment"], types[1]["max_size"]) == (SECOND_ALIGNMENT, SECOND_MAX_SIZE)


def test_a_big_graph_over_two_buffer_types_uses_several_chunks(tmp_path):
    """Chunks: the second type's max size is 1 KiB; it holds four 4 KiB outputs (never freed), one chunk each.
    Nodes 2, 3, 6, 7 go to the second buffer (record_program spreads nodes in pairs)."""
    from realggml import Program, Ref, Step

    steps = [Step("new_tensor_1d", ("f32", 1024), "x", input=True)]
    for k in range(8):
        steps.append(Step("cont", (Ref(k),), f"c{k}", output=k % 4 >= 2))
    prog = Program(tuple(steps), (8,))
    rc, path, readback = record(tmp_path, "two_types", [prog])
    assert rc == 0
    assert_placements_are_the_real_pointers(path, readback)
    assert_model_consistent(path)
    (call,) = alloc_calls(path)
    assert len({buf for _k, _t, buf, _d, _b in call.placements}) == 5  # buffer 0, and 4 chunks of buffer 1
    (plan, _) = [g for g in assert_model_consistent(path)]
    assert plan.extra["real_sizes"][1] == 4 * 4096


def chunked_outputs():
    """Four 4 KiB outputs over a second buffer type of 1 KiB chunks (see the test above)."""
    from realggml import Program, Ref, Step

    steps = [Step("new_tensor_1d", ("f32", 1024), "x", input=True)]
    for k in range(8):
        steps.append(Step("cont", (Ref(k),), f"c{k}", output=k % 4 >= 2))
    return Program(tuple(steps), (8,))


@pytest.mark.parametrize("prog", ["mlp", "chunks"])
def test_peak_is_split_per_buffer_type_and_chunk(tmp_path, capsys, prog):
    """`alloctrace peak` on a two-buffer-type recording: one part per (buffer, chunk), named after the
    recorded buffer type; each buffer's chunk marks add up to the size ggml really gave that buffer, and
    the parts add up to the whole (bytes, families, fragmentation)."""
    store_dir = tmp_path / "store"
    rc, _, _ = record(tmp_path, "two_types", [mlp(16) if prog == "mlp" else chunked_outputs()], store=store_dir)
    assert rc == 0
    store = open_store(store_dir)
    (summary,) = store.list()
    plan = store.graph(summary["id"], 0)
    assert plan.role == "reserve" and plan.consistent
    assert {ev.buffer for ev in plan.events if ev.kind == "alloc"} == {0, 1}
    assert main(["peak", f"{summary['id']}:0", "--store", str(store_dir), "--json"]) == 0
    peak = json.loads(capsys.readouterr().out)
    parts = peak["buffers"]
    real = plan.extra["real_sizes"]  # ggml_gallocr_get_buffer_size after the reserve, per buffer id
    for b, name in enumerate(["CPU", "TEST64"]):
        mine = [p for p in parts if p["buffer"] == b]
        assert mine and all(p["name"] == name for p in mine)
        assert sum(p["peak"]["bytes"] for p in mine) == real[b] > 0
        assert len({p["chunk"] for p in mine}) == len(mine)
    if prog == "chunks":
        assert sorted(p["chunk"] for p in parts if p["buffer"] == 1) == [0, 1, 2, 3]
    assert sum(p["peak"]["bytes"] for p in parts) == peak["peak"]["bytes"] == sum(real)
    for p in parts:
        live = sum(f["bytes"] for f in p["families"])
        assert live + p["fragmentation"]["free_below_peak"] == p["peak"]["bytes"]
    assert sum(p["fragmentation"]["free_below_peak"] for p in parts) == peak["fragmentation"]["free_below_peak"]
    whole = {f["family"]: f["bytes"] for f in peak["families"]}
    summed: dict = {}
    for p in parts:
        for f in p["families"]:
            summed[f["family"]] = summed.get(f["family"], 0) + f["bytes"]
    assert summed == whole
    assert main(["peak", f"{summary['id']}:0", "--store", str(store_dir)]) == 0
    text = capsys.readouterr().out
    assert "buffer 0 (CPU) chunk 0" in text and "buffer 1 (TEST64) chunk 0" in text
    # the buffer id survives a JSON Lines export and import, so the copy splits the same way
    jsonl = tmp_path / "t.jsonl"
    assert main(["export", summary["id"], "--format", "jsonl", "-o", str(jsonl), "--store", str(store_dir)]) == 0
    assert main(["import", str(jsonl), "--store", str(store_dir)]) == 0
    (copy,) = [t["id"] for t in store.list() if t["id"] != summary["id"]]
    assert [e.buffer for e in store.events(copy, 0)] == [e.buffer for e in plan.events]


def mlp(n_tokens: int):
    from realggml import Program, Ref, Step

    steps = (Step("new_tensor_2d", ("f32", 32, n_tokens), "x", input=True),
             Step("new_tensor_2d", ("f32", 32, 48), "w1", input=True),
             Step("new_tensor_2d", ("f32", 48, 32), "w2", input=True),
             Step("mul_mat", (Ref(1), Ref(0)), "h"),
             Step("silu", (Ref(3),), "a"),
             Step("mul", (Ref(4), Ref(3)), "g"),
             Step("mul_mat", (Ref(2), Ref(5)), "o"),
             Step("add", (Ref(6), Ref(0)), "r"),
             Step("soft_max", (Ref(7),), "out", output=True))
    return Program(steps, (8,))


def test_scheduler_recording(tmp_path):
    """ggml_backend_sched drives the gallocr (reserve_n, then alloc_graph with the plan): a growing and a
    shrinking batch. (The scheduler needs weights in backend buffers, so these weights are graph inputs.)"""
    progs = [mlp(4), mlp(4), mlp(16), mlp(2)]
    rc, path, readback = record(tmp_path, "sched", progs)
    assert rc == 0
    assert_placements_are_the_real_pointers(path, readback)
    graphs = assert_model_consistent(path)
    assert {g.extra.get("via") for g in graphs} == {"sched_alloc_graph"}
    assert [g.role for g in graphs] == ["eval"] * len(progs)
    # the first graph and the bigger one do not fit the plan: the gallocr re-plans inside alloc_graph
    assert [g.extra["replanned"] for g in graphs] == [True, False, True, False]


def test_four_threads_allocating_at_once(tmp_path):
    """Four gallocrs used from four threads concurrently: every call's lines stay together, every placement
    is found, and each gallocr's graphs replay consistently."""
    progs = [mlp(2 + k) for k in range(16)]
    rc, path, readback = record(tmp_path, "threads", progs)
    assert rc == 0
    placed = {t: data for c in alloc_calls(path) for _k, t, _b, data, _base in c.placements}
    real = {addr: data for g in readback for addr, data, buf, _n in g["tensors"] if buf}
    assert placed == real and len(placed) == sum(len(p.steps) for p in progs)  # nothing external here
    graphs = assert_model_consistent(path)
    assert len({g.extra["gallocr"] for g in graphs}) == 4
    assert sum(g.role == "eval" for g in graphs) == 16


def test_crash_mid_run_keeps_everything_before_it(tmp_path):
    """GGML_ASSERT aborts the program after two graphs: the exit status is the abort's, and the store gets
    a trace with both graphs."""
    from realggml import Program, Ref, Step

    def chain(n):
        return Program((Step("new_tensor_1d", ("f32", n), "x", input=True), Step("silu", (Ref(0),), "y"),
                        Step("mul", (Ref(1), Ref(0)), "z", output=True)), (2,))

    store_dir = tmp_path / "store"
    rc, _, readback = record(tmp_path, "gallocr", [chain(8), chain(64), chain(512)], crash_after=2, store=store_dir)
    assert rc == 128 + signal.SIGABRT
    assert len(readback) == 2
    store = open_store(store_dir)
    (summary,) = store.list()
    trace = store.summary(summary["id"])
    evals = [g for g in trace["graphs"] if g["role"] == "eval"]
    assert len(evals) == 2 and all(g["consistent"] for g in trace["graphs"])
    assert store.meta(summary["id"]).extra["recording"]["signal"] == signal.SIGABRT
    assert max(g["buffer_size"] for g in evals) == 64 * 4 * 2  # y and x are alive together, z reuses y


def test_an_assert_inside_the_allocator_keeps_the_call_it_died_in(tmp_path):
    """GGML_ASSERT(buffer_id >= 0) fires inside ggml_gallocr_reserve_n: the crash handler writes the pending
    lines, so the third plan arrives whole, marked as the one the program died in."""
    rc, path, readback = record(tmp_path, "two_types", [mlp(4), mlp(8), mlp(16)], bad_ids_at=2)
    assert rc == 128 + signal.SIGABRT and len(readback) == 2
    (trace,) = traces_of(path)
    graphs = list(trace.graphs)
    assert trace.report["signal"] == signal.SIGABRT
    assert [g.consistent for g in graphs] == [True] * 4 + [False]
    last = graphs[-1]
    assert last.extra["call"] == "reserve_n" and last.extra["n_nodes"] == 6
    assert "the program died inside this call" in last.extra["mismatches"]
    assert any("buffer ids outside" in m for m in last.extra["mismatches"])


def test_a_c_program_linked_against_ggml(tmp_path):
    """A C program linked (not dlopen-ed) against ggml-python's libraries, recorded without the dlsym path."""
    import shutil
    import subprocess

    import ggml

    lib = Path(ggml.__file__).parent / "lib"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    exe = tmp_path / "prog"
    r = subprocess.run([cc, "-O1", "-o", str(exe), str(Path(__file__).parents[1].joinpath("data") / "record" / "prog.c"),
                        f"-L{lib}", "-l:libggml-base.so", "-l:libggml-cpu.so", f"-Wl,-rpath,{lib}"],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot link a C program against ggml-python's libraries: {r.stderr[:200]}")
    out = tmp_path / "ptrs.txt"
    rc = main(["record", "-o", str(tmp_path / "rec.atrec"), "--", str(exe), str(out)])
    assert rc == 0
    pointers = dict(line.split() for line in out.read_text().splitlines())
    (call,) = alloc_calls(tmp_path / "rec.atrec")
    with open(tmp_path / "rec.atrec", "rb") as f:
        names = {}
        read_processes(f, lambda p, c: names.update({t.ptr: t.name for t in tensor_records(c)}))
    recorded = {names[t]: hex(data) for _k, t, _b, data, _base in call.placements}
    assert recorded == pointers
    assert_model_consistent(tmp_path / "rec.atrec")
