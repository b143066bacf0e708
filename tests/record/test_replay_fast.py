"""The compiled replay of a recorded reserve (traces/sources/record/plans_fast.c) against the Python path it
stands in for: build_graph + Gallocr.reserve + encode_arrays + shapes. Both must store the same bytes, leave the
model in the same state (the plan a later alloc_graph reuses, the buffers, the allocators' free lists), and fail
the same way; where the C side declines, the Python path answers alone."""
from __future__ import annotations

import gzip
import io
import json
import lzma
import random
from pathlib import Path

import pytest
import zstandard

from alloctrace.allocator import get_profile
from alloctrace.allocator.record_class import replace
from alloctrace.allocator.gallocr import BufferType, Gallocr
from alloctrace.traces.sources.record import plans_fast
from alloctrace.traces.sources.record.plans import build_graph, shapes
from alloctrace.traces.sources.record.source import RecordingSource
from alloctrace.traces.sources.record.stream import Call, RecordingError, tensor_records
from alloctrace.traces.store.columns import encode_arrays, pack_arrays

DATA = Path(__file__).parents[1].joinpath("data")
RECORDINGS = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.atrec*"))
decompress = zstandard.ZstdDecompressor().decompress

pytestmark = pytest.mark.skipif(plans_fast.library() is None, reason="no C compiler: the fast replay is not built")


@pytest.fixture
def pure_python(monkeypatch):
    """The Python path alone (as without a compiler)."""
    monkeypatch.setattr(plans_fast._FAST, "_tried", [None])


def read_bytes(name: str) -> bytes:
    data = (DATA / name).read_bytes()
    return lzma.decompress(data) if name.endswith(".xz") else gzip.decompress(data) if name.endswith(".gz") else data


def stored(data: bytes) -> list:
    """Everything a read stores, the compressed parts decompressed (zstd frames may differ in nothing else)."""
    out = []
    for t in RecordingSource().read(io.BytesIO(data), filename="x", name=None):
        out.append((t.meta.name, t.meta.profile, json.dumps(t.report, sort_keys=True)))
        for g in t.graphs:
            out.append((g.index, g.role, g.n_events, g.max_size, g.buffer_size, g.oom, g.consistent,
                        decompress(g.strings), [(n, dt, decompress(b)) for n, dt, b in g.blobs],
                        json.dumps(g.extra, sort_keys=True)))
    return out


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_committed_recording_stores_the_same_bytes_on_both_paths(name, monkeypatch):
    data = read_bytes(name)
    taken = []
    real = plans_fast.reserve
    monkeypatch.setattr(plans_fast, "reserve", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    fast = stored(data)
    took = list(taken)
    monkeypatch.setattr(plans_fast._FAST, "_tried", [None])
    assert stored(data) == fast
    assert all(t is not None for t in took)  # every reserve the recorder wrote is one the compiled path covers


def test_the_fast_path_takes_the_reserves_of_a_real_dry_run(monkeypatch):
    taken = []
    real = plans_fast.reserve
    monkeypatch.setattr(plans_fast, "reserve", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    stored(read_bytes("record/fit/tiny-llama-c4096-faoff.atrec.xz"))
    assert len(taken) == 1 and taken[0] is not None and taken[0].n_events > 500


# --- generated graphs, straight through both paths -----------------------------------------------------------

OPS = ["ADD", "MUL", "SCALE", "SOFT_MAX", "ROPE", "RMS_NORM", "MUL_MAT", "CPY", "CONT", "GET_ROWS", "UNARY", "CLAMP"]
TYPES = {"f32": 4, "f16": 2, "i32": 4}


def tensor_line(kind, ptr, type_, op, desc, flags, ne, nbytes, data, buffer, view_src, srcs, sizes, name):
    size = TYPES[type_]
    nb = [size, size * ne[0], size * ne[0] * ne[1], size * ne[0] * ne[1] * ne[2]]
    fmt = lambda p: f"{p:#x}" if p else "(nil)"  # noqa: E731
    return " ".join([kind, fmt(ptr), type_, op, desc, str(flags), *map(str, ne), *map(str, nb), str(nbytes),
                     fmt(data), fmt(buffer), fmt(view_src), "0", str(len(srcs)), *[fmt(s) for s in srcs],
                     str(len(sizes)), *map(str, sizes), name.replace("\\", "\\\\").replace("\n", "\\n")])


def random_graph(rng: random.Random, n_bufs: int):
    """(tensor lines, n_nodes, n_leafs, node ids, leaf ids): leafs (inputs, weights), nodes over earlier tensors,
    views of them, outputs; sizes from a few shapes so that reuse and layout refusals both happen."""
    shapes_ = [(rng.choice([8, 16, 64, 100, 256]), rng.choice([1, 2, 7, 32]), 1, 1) for _ in range(4)]
    lines, tensors, views = [], [], set()  # tensors: (ptr, type, ne, nbytes) a later node may read
    ptr = 0x1000
    n_leafs = rng.randint(1, 6)
    names = ["", "in", "w", "kq", "x y", "a\\b", "ff\nn", "t\"q", "c\x01"]
    for i in range(n_leafs):
        ptr += 0x100
        ne = rng.choice(shapes_)
        t = rng.choice(list(TYPES))
        nbytes = TYPES[t] * ne[0] * ne[1]
        weight = rng.random() < 0.4
        flags = 1 if rng.random() < 0.5 else 0
        lines.append(tensor_line("l", ptr, t, "NONE", "NONE", flags, ne, nbytes, 0x7000000 + ptr if weight else 0,
                                 0, 0, [], [], f"{rng.choice(names)}leaf{i}"))
        tensors.append((ptr, t, ne, nbytes))
    n_nodes = rng.randint(1, 30)
    for i in range(n_nodes):
        ptr += 0x100
        k = rng.randint(0, 3)
        srcs = [rng.choice(tensors)[0] if rng.random() < 0.85 else 0 for _ in range(k)]
        if srcs and rng.random() < 0.6:  # same layout as its first source: may reuse it in place
            src = next((x for x in tensors if x[0] == srcs[0]), None)
            t, ne = (src[1], src[2]) if src else ("f32", rng.choice(shapes_))
        else:
            t, ne = rng.choice(list(TYPES)), rng.choice(shapes_)
        nbytes = TYPES[t] * ne[0] * ne[1]
        view_src = 0
        op = rng.choice(OPS)
        plain = [x for x in tensors if x[0] not in views]
        if plain and rng.random() < 0.15:
            base = rng.choice(plain)
            views.add(ptr)
            view_src, op, t, ne, nbytes = base[0], "VIEW", base[1], base[2], base[3]
        flags = (2 if rng.random() < 0.1 else 0) | (1 if rng.random() < 0.05 else 0)
        desc = f"{op}" if rng.random() < 0.8 else "NONE"
        sizes = [nbytes + rng.choice([0, 0, 32, 100]) for _ in range(n_bufs)] if rng.random() < 0.2 else []
        lines.append(tensor_line("n", ptr, t, op, desc, flags, ne, nbytes, 0, 0, view_src, srcs, sizes,
                                 rng.choice(names) + f"node{i}"))
        if not view_src or rng.random() < 0.7:  # a view can be a source too (its own source loses a view)
            tensors.append((ptr, t, ne, nbytes))
    ids = lambda n: [rng.randrange(n_bufs) for _ in range(n)] if n_bufs > 1 or rng.random() < 0.3 else None  # noqa
    return lines, n_nodes, n_leafs, ids(n_nodes), ids(n_leafs)


def new_galloc(rng: random.Random, n_bufs: int, max_free_blocks: int) -> Gallocr:
    profile = replace(get_profile(rng.choice(["ggml-head", "ggml-2024-02"])),
                                  max_free_blocks=max_free_blocks)
    keys = [rng.randrange(2) for _ in range(n_bufs)]  # two ids of one key share a buffer
    types = [BufferType(f"B{k}", rng.choice([16, 32, 64]), rng.choice([1 << 62, 4096, 20000]), key=k) for k in keys]
    return Gallocr(profile, buffer_types=types)


def python_reserve(g: Gallocr, lines, n_nodes, n_leafs, node_ids, leaf_ids, index, no_alloc):
    call = Call(seq=index, kind="reserve_n", obj=0, graph=0, parent=0, n_nodes=n_nodes, n_leafs=n_leafs,
                lines=lines, line_nos=list(range(1, len(lines) + 1)))
    graph, by_ptr = build_graph(call)
    sizes = {by_ptr[r.ptr]: r.alloc_sizes for r in tensor_records(call) if r.alloc_sizes}
    g.alloc_size = lambda t, bid: sizes[t][bid] if t in sizes else t.nbytes
    g.events, g.failed = [], None
    ok = g.reserve(graph, graph_index=index, node_buffer_ids=node_ids, leaf_buffer_ids=leaf_ids, no_alloc=no_alloc)
    strings, blobs = pack_arrays(*encode_arrays(g.events), lambda b: b)
    return ok, g.failed, len(g.events), strings, blobs, shapes(call)


def state(g: Gallocr) -> tuple:
    return ([None if d is None else [(c.offsets, c.sizes, c.max_size) for c in d.chunks] for d in g.dyns],
            g.buffer_chunk_sizes, list(g.node_allocs), list(g.leaf_allocs), g.n_nodes, g.n_leafs, g.planned_sizes(),
            g.buffer_sizes())


@pytest.mark.parametrize("seed", range(300))
def test_a_generated_graph_plans_the_same_on_both_paths(seed):
    rng = random.Random(seed)
    n_bufs = rng.choice([1, 1, 2, 3])
    max_free_blocks = rng.choice([256, 256, 3, 1])  # few blocks: a free can abort
    gs = [new_galloc(random.Random(seed), n_bufs, max_free_blocks) for _ in range(2)]
    for index in range(rng.randint(1, 3)):  # one model, several reserves: buffers grow, "buffer" events follow
        lines, n_nodes, n_leafs, node_ids, leaf_ids = random_graph(rng, n_bufs)
        no_alloc = rng.random() < 0.3
        want = python_reserve(gs[0], lines, n_nodes, n_leafs, node_ids, leaf_ids, index, no_alloc)
        fast = plans_fast.reserve(gs[1], lines, n_nodes, n_leafs, node_ids, leaf_ids, index, no_alloc, True, 8192)
        assert fast is not None, plans_fast.library()[0].rf_reason(plans_fast.library()[1])
        ok, failed, n, strings, blobs, shape = want
        assert (fast.ok, fast.failed, fast.n_events) == (ok, failed, n)
        assert fast.table_json == strings
        assert fast.columns == blobs
        assert json.loads(fast.shapes_json) == shape
        assert state(gs[1]) == state(gs[0])


def test_generated_graphs_reach_every_outcome():
    """The generator is worth its seeds: reuses, refusals, views, several chunks and aborts."""
    kinds, failures = set(), set()
    for seed in range(300):
        rng = random.Random(seed)
        n_bufs = rng.choice([1, 1, 2, 3])
        max_free_blocks = rng.choice([256, 256, 3, 1])
        g = new_galloc(random.Random(seed), n_bufs, max_free_blocks)
        for index in range(rng.randint(1, 3)):
            lines, n_nodes, n_leafs, node_ids, leaf_ids = random_graph(rng, n_bufs)
            got = plans_fast.reserve(g, lines, n_nodes, n_leafs, node_ids, leaf_ids, index, rng.random() < 0.3,
                                      False, 0)
            cols = plans_fast.event_columns(got.n_events, got.columns, got.table_json)
            kinds |= set(cols.field("kind"))
            kinds |= {r for r in cols.field("reason") if r in ("external", "output", "layout")}
            if got.failed:
                failures.add(got.failed.kind)
            if any(c and c > 0 for c in cols.field("chunk")):
                kinds.add("chunk>0")
    assert {"alloc", "free", "reuse", "free_extra", "no_reuse", "exec", "parent", "view_src", "step", "not_freed",
            "buffer", "external", "output", "layout", "chunk>0"} <= kinds
    assert failures == {"abort"}  # (out of space cannot happen: ggml's 16th chunk is SIZE_MAX / 2 bytes)


# --- where the compiled path declines --------------------------------------------------------------------------

def test_a_name_that_is_not_ascii_is_left_to_the_python_path(pure_python):
    lines = [tensor_line("n", 0x10, "f32", "ADD", "ADD", 2, (4, 1, 1, 1), 16, 0, 0, 0, [], [], "größe")]
    g = Gallocr(get_profile("ggml-head"))
    plans_fast._FAST._tried.clear()
    assert plans_fast.reserve(g, lines, 1, 0, None, None, 0, False, True, 10) is None
    assert g.buffer_chunk_sizes == [None]  # a declined call leaves the model alone


@pytest.mark.parametrize("line", [
    "n 0x10 f32 ADD ADD 0 4 1 1 1 4 16 16 16 16 (nil) (nil) (nil) 0 1 0x99 0 dangling",  # a source not recorded
    "n 0x10 f32 ADD ADD 0 4 1 1 1 4 16 16 16 +16 (nil) (nil) (nil) 0 0 0 plus",  # int() reads it, C does not
    "n 0x10 f32 ADD ADD 0 4 1 1 1 4 16 16 16",  # short
])
def test_a_line_it_does_not_read_gives_the_python_answer(line):
    call = lambda: Call(seq=0, kind="reserve_n", obj=0, graph=0, parent=0, n_nodes=1, n_leafs=0,  # noqa: E731
                        lines=[line], line_nos=[7])
    g = Gallocr(get_profile("ggml-head"))
    assert plans_fast.reserve(g, [line], 1, 0, None, None, 0, False, True, 10) is None
    try:
        graph, _ = build_graph(call())
    except (ValueError, RecordingError) as e:
        assert "line 7" in str(e) or "lacks" in str(e)
    else:
        assert graph.n_nodes == 1 and Gallocr(get_profile("ggml-head")).reserve(graph)
