"""Message formats of every generation, graph splitting and allocator lives."""
import subprocess
import sys

import pytest

from conftest import log_records
from alloctrace.allocator.events import Event
from alloctrace.traces.sources.ggml_log.import_log import GgmlLogSource, LogImport
from alloctrace.traces.sources import import_paths
from alloctrace.traces.sources.ggml_log.parse_log import parse_line
from alloctrace.traces.store.store import open_store


def write(tmp_path, text, name="v.log"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("line,kind,fields", [
    ("ggml_allocr_alloc: allocating k (view) (cpy) (64 bytes) - block 2", "alloc",
     {"tensor": "k (view) (cpy)", "size": 64, "block": 2}),
    ("ggml_allocr_alloc: allocating  (32 bytes) - block -1", "alloc", {"tensor": "", "size": 32, "block": -1}),
    ("jumps over the lazy dogggml_allocr_alloc: allocating x (16 bytes) - block 0", "alloc",
     {"tensor": "x", "size": 16}),
    ("ggml_tallocr_alloc: allocating a b (1024 bytes) - block 3, addr 0x7f00aa001000", "alloc",
     {"tensor": "a b", "block": 3, "addr": 0x7F00AA001000}),
    ("ggml_dyn_tallocr_alloc: allocating n (96 bytes) - block 1, offset 4096", "alloc",
     {"offset": 4096, "block": 1, "chunk": None}),
    ("ggml_dyn_tallocr_alloc: allocating n (96 bytes) - block 1, offset 4096, chunk 2", "alloc",
     {"offset": 4096, "chunk": 2}),
    ("ggml_allocator_free_tensor: freeing tmpk (reshaped) (2048 bytes) - n_free_blocks = 3", "free",
     {"tensor": "tmpk (reshaped)", "size": 2048, "n_free_before": 3}),
    ("ggml_tallocr_free_tensor: freeing a at 0x7f0000001000 (1024 bytes) - n_free_blocks = 1", "free",
     {"addr": 0x7F0000001000, "offset": None}),
    ("ggml_dyn_tallocr_free_tensor: freeing a at 512 (1000 bytes) - n_free_blocks = 1", "free",
     {"offset": 512, "size": 1000}),
    ("ggml_gallocr_free_node: freeing a at {chunk=1, offset=64} (10 bytes) - n_free_blocks = 2", "free",
     {"chunk": 1, "offset": 64}),
    ("exec: CPY ( (view) (copy of  (view))) <=  (view),  (view)", "exec",
     {"op": "CPY", "tensor": " (view) (copy of  (view))", "srcs": [" (view)", " (view)"]}),
    ("exec: GELU (fc) <= ", "exec", {"srcs": []}),
    ("reusing view parent V_3d (v) for V_rope", "reuse", {"parent": "V_3d", "view_src": "v", "tensor": "V_rope"}),
    ("not reusing parent p for n as 0x7f12 is external", "no_reuse", {"reason": "external", "addr": 0x7F12}),
    ("not reusing parent p for n as (nil) is external", "no_reuse", {"reason": "external", "addr": 0}),
    ("not reusing parent p for n as it is an output", "no_reuse", {"reason": "output"}),
    ("parent embd: 0 children, 0 views, allocated: 1", "parent", {"children": 0, "allocated": 1}),
    ("freeing extra 64 bytes from parent a for b", "free_extra", {"size": 64, "parent": "a", "tensor": "b"}),
    ("not freeing output attn_o", "not_freed", {"tensor": "attn_o"}),
    ("ggml_allocr_alloc: not enough space in the buffer (needed 4096, largest block available 2064)", "oom",
     {"needed": 4096, "largest": 2064}),
    ("ggml_tallocr_alloc: not enough space in the buffer to allocate big one (needed 10, largest block available 5)",
     "oom", {"tensor": "big one", "needed": 10, "largest": 5}),
    ("ggml_dyn_tallocr_alloc: not enough space in the buffer to allocate 4096 bytes, largest block available 64 bytes",
     "oom", {"needed": 4096, "largest": 64}),
    ("ggml_gallocr_needs_realloc: node norm is not valid", "realloc", {"reason": "node norm is not valid"}),
])
def test_line_formats(line, kind, fields):
    ev = parse_line(line)
    if line.startswith("jumps over"):  # program output glued before the allocator text is reported as such
        assert ev[0] == "glued"
        ev = ev[1]
    assert isinstance(ev, Event) and ev.kind == kind
    for k, v in fields.items():
        assert getattr(ev, k) == v, k


@pytest.mark.parametrize("line,item", [
    ("####### graph 0/1", ("graph", 0, 1)),
    ("", ("blank",)),
    ('GGML_ASSERT: ggml/src/ggml-alloc.c:131: !"not enough space in the buffer"',
     ("assert", 131, '!"not enough space in the buffer"')),
    ("max_size = 0.03 MB: tensors: leaf_4 (0.00 MB) node_0 (0.03 MB) ", ("debug",)),
    ("max_size[0] = 0.01 MB: tensors: ggml_freeing [0: 0-20] (0.01 MB) ", ("debug",)),
    ("main: compute buffer size: 0.10 MB", ("compute_buffer",)),
    ("harness: === real allocator, buffer size = 12320 bytes, buffer % 16 = 0 ===", ("buffer_size", 12320)),
    ("the quick brown fox", ("program",)),
    ("exec: this is not (quite", ("program",)),
])
def test_markers_and_program_output(line, item):
    assert parse_line(line) == item


ADDR_LOG = """\
llama: loading
ggml_tallocr_alloc: allocating a (1024 bytes) - block 0, addr 0x7f0000001000
ggml_tallocr_alloc: allocating b (2048 bytes) - block 0, addr 0x7f0000001400
exec: ADD (b) <= a
ggml_tallocr_free_tensor: freeing a at 0x7f0000001000 (1024 bytes) - n_free_blocks = 1

ggml_tallocr_alloc: allocating c (512 bytes) - block 0, addr 0x7f0000001000
exec: MUL (c) <= b
"""

V3_LOG = """\
ggml_gallocr_needs_realloc: graph has different number of nodes
ggml_gallocr_alloc_graph: reallocating buffers automatically
ggml_dyn_tallocr_alloc: allocating a (1024 bytes) - block 0, offset 0
ggml_dyn_tallocr_alloc: allocating b (2048 bytes) - block 0, offset 1024
exec: ADD (b) <= a
parent a: 0 children, 0 views, allocated: 1
ggml_dyn_tallocr_free_tensor: freeing a at 0 (1024 bytes) - n_free_blocks = 1

ggml_dyn_tallocr_alloc: allocating c (512 bytes) - block 0, offset 0
exec: MUL (c) <= b
parent b: 0 children, 0 views, allocated: 1

"""


def test_address_era_log(tmp_path):
    imp = LogImport(write(tmp_path, ADDR_LOG))
    [g] = log_records(imp)
    assert imp.generation == "ggml-2023-10"
    assert g.consistent is True and g.max_size == 3072
    assert [(e.tensor, e.offset) for e in g.events if e.kind in ("alloc", "free")] == \
        [("a", 0), ("b", 1024), ("a", 0), ("c", 0)]
    bad = write(tmp_path, ADDR_LOG.replace("0x7f0000001000\nexec: MUL", "0x7f0000002000\nexec: MUL"), "bad.log")
    assert [r.consistent for r in log_records(LogImport(bad))] == [False]


def test_v3_log(tmp_path):
    imp = LogImport(write(tmp_path, V3_LOG), generation="ggml-2024-02")
    [g] = log_records(imp)
    # v3's CPU buffer type allocates one alignment (64) more than gallocr asks for
    assert (g.role, g.consistent, g.max_size, g.buffer_size) == ("eval", True, 3072, 3072 + 64)
    wrong = write(tmp_path, V3_LOG.replace("(512 bytes) - block 0, offset 0", "(512 bytes) - block 0, offset 64"), "w.log")
    assert [r.consistent for r in log_records(LogImport(wrong))] == [False]


def test_a_log_both_offset_generations_fit_is_read_as_the_newer_and_says_so(tmp_path):
    """Sizes all multiples of 64 and no leaf allocated after a node: 2024-02 and 2025-09 log alike."""
    imp = LogImport(write(tmp_path, V3_LOG))
    [g] = log_records(imp)
    assert imp.candidates == ["ggml-2025-09", "ggml-2024-02"] and imp.generation == "ggml-2025-09"
    assert g.buffer_size == 3072  # 2025-09's CPU buffer: max_size, no pad
    (trace,) = GgmlLogSource().read(open(write(tmp_path, V3_LOG), "rb"), filename="v3.log", name=None)
    note = trace.meta.extra["generation_note"]
    assert "ggml-2025-09 and ggml-2024-02" in note and "max_size + 64" in note and "--generation" in note
    # a leaf allocated after a node is v3's order (2025-09 allocates every data-less leaf first)
    late = V3_LOG.replace("exec: MUL (c) <= b", "ggml_dyn_tallocr_alloc: allocating w (64 bytes) - block 0, offset 512\n"
                          "exec: MUL (c) <= b, w")
    imp = LogImport(write(tmp_path, late, "late.log"))
    log_records(imp)
    assert imp.candidates == ["ggml-2024-02"]
    # a size only 32 divides: 2025-09 alone
    odd = V3_LOG.replace("allocating c (512 bytes)", "allocating c (544 bytes)")
    imp = LogImport(write(tmp_path, odd, "odd.log"))
    log_records(imp)
    assert imp.candidates == ["ggml-2025-09"]


def test_a_log_two_generations_fit_says_how_far_its_sizes_are_exact(tmp_path):
    """Read as ggml-2025-09 the buffer is 3,072 B; as ggml-2024-02 (also consistent) 3,136 B: the import keeps
    the newer reading and states the 64 bytes and why, instead of a bare `consistent`."""
    path = write(tmp_path, V3_LOG + "main: done\n")  # the program went on: the walk is whole
    (trace,) = GgmlLogSource().read(open(path, "rb"), filename="v3.log", name=None)
    [g] = list(trace.graphs)
    assert (g.consistent, g.max_size, g.buffer_size) == (True, 3072, 3072)
    assert g.extra["uncertainty_bytes"] == 64
    assert "the log fits ggml-2025-09 and ggml-2024-02" in g.extra["reason"]
    assert "read as ggml-2024-02: max_size 3,072, buffer 3,136" in g.extra["reason"]
    # told the generation, nothing is uncertain
    (trace,) = GgmlLogSource().read(open(path, "rb"), filename="v3.log", name=None, generation="ggml-2025-09")
    assert "uncertainty_bytes" not in list(trace.graphs)[0].extra
    st = str(tmp_path / "st")
    out = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(path), "--store", st],
                         capture_output=True, text=True, check=True)
    assert "sizes exact up to 64 bytes: the log fits ggml-2025-09 and ggml-2024-02" in out.stderr
    assert "yes, exact up to 64 B" in out.stdout


def test_generation_is_detected_from_the_first_choice(tmp_path):
    text = "ggml_allocr_alloc: allocating a (16 bytes) - block {}\nexec: ADD (a) <= \n\n"
    assert _gen(tmp_path, text.format(0)) == "ggml-2023-08-16"
    assert _gen(tmp_path, text.format(-1)) == "ggml-2023-08-28"


def _gen(tmp_path, text):
    imp = LogImport(write(tmp_path, text))
    log_records(imp)
    return imp.generation


def test_repeated_program_runs_start_new_allocator_lives(fixtures, tmp_path):
    """A log holding two runs of the 2023 gpt-2 program: measure, 5 evals, measure, 5 evals."""
    raw = (fixtures / "v2023-08-16-legacy" / "gpt-2_tiny_short.AT.log").read_text()
    recs = log_records(LogImport(write(tmp_path, raw + raw)))
    assert [(r.role, r.max_size, r.buffer_size) for r in recs] == \
        ([("measure", 102480, None)] + [("eval", 45136, 102496)] * 5) * 2
    assert all(r.consistent for r in recs)
    assert [r.index for r in recs] == list(range(12))
    assert all(e.graph == r.index for r in recs for e in r.events)


def test_head_reserve_passes_split_on_program_output(fixtures, tmp_path):
    raw = (fixtures / "head-gallocr" / "gpt-2-alloc_tiny_short.AT.log").read_text()
    recs = log_records(LogImport(write(tmp_path, raw + raw)))
    assert [(r.role, r.buffer_size, r.consistent) for r in recs] == [("reserve", 147520, True)] * 2


def test_allocator_debug_and_assert_lines_are_tolerated(fixtures, tmp_path):
    src = (fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log").read_text().splitlines(keepends=True)
    mixed = []
    for i, line in enumerate(src):
        mixed.append(line)
        if i % 7 == 0 and line.startswith("exec"):
            mixed.append("max_size = 0.01 MB: tensors: x (0.00 MB) norm (0.00 MB) \n")
    store = open_store(tmp_path / "s")
    [a] = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"])
    [b] = import_paths(store, [write(tmp_path, "".join(mixed))])
    assert store.summary(a)["graphs"] == store.summary(b)["graphs"]


def test_progress_bar_only_on_request(tmp_path):
    import io

    from alloctrace.traces.util.progress import Progress

    quiet, shown = io.StringIO(), io.StringIO()
    for stream, enabled in ((quiet, False), (shown, True)):
        p = Progress(2_000_000, "big.log", enabled=enabled, stream=stream)
        p.update(1_000_000)
        p.close()
    assert quiet.getvalue() == ""
    assert "50.0%" in shown.getvalue() and shown.getvalue().endswith("100.0%      2.0 MB\n")


def test_import_says_when_a_log_fits_two_generations(tmp_path, capsys):
    from alloctrace.cli import main

    log = write(tmp_path, V3_LOG)
    assert main(["import", "--store", str(tmp_path / "s"), str(log)]) == 0
    err = capsys.readouterr().err
    assert "fits ggml-2025-09 and ggml-2024-02" in err and "--generation decides" in err
    assert main(["import", "--store", str(tmp_path / "s"), "--generation", "ggml-2024-02", str(log)]) == 0
    assert "fits" not in capsys.readouterr().err


SCHED_LOG = """\
ggml_tallocr_alloc: allocating a (1024 bytes) - block 0, addr 0x7f0000001000
ggml_tallocr_alloc: allocating b (2048 bytes) - block 0, addr 0x7f0000001400
exec: ADD (b) <= a
ggml_tallocr_free_tensor: freeing a at 0x7f0000001000 (1024 bytes) - n_free_blocks = 1

ggml_tallocr_alloc: allocating c (512 bytes) - block 0, addr 0x7f0000001000
exec: MUL (c) <= b

main: eval
ggml_tallocr_alloc: allocating a (1024 bytes) - block 0, addr 0x7f0000101000
ggml_tallocr_alloc: allocating b (2048 bytes) - block 0, addr 0x7f0000101400
exec: ADD (b) <= a
ggml_tallocr_alloc: allocating d (64 bytes) - block 0, addr 0x7f0000101c00
exec: MUL (d) <= b

"""


def test_a_2023_10_backend_buffer_has_the_cpu_backends_slack(tmp_path):
    """08d748b2's CPU backend allocates 64 bytes more than asked (size += TENSOR_ALIGNMENT): an eval may end
    up to 64 bytes past the measured size (its buffer's base padding counts in max_size) and still fit."""
    imp = LogImport(write(tmp_path, SCHED_LOG), generation="ggml-2023-10")
    measure, ev = log_records(imp)
    assert (measure.role, measure.max_size) == ("measure", 3072)
    assert (ev.role, ev.max_size, ev.buffer_size) == ("eval", 3136, 3072)
    assert ev.consistent and ev.oom is None
    over = write(tmp_path, SCHED_LOG.replace("allocating d (64 bytes)", "allocating d (128 bytes)"), "over.log")
    _, ev = log_records(LogImport(over, generation="ggml-2023-10"))
    assert not ev.consistent  # past the slack: the model's allocator is out of space where ggml was not


@pytest.mark.parametrize("folder,name,want", [
    ("v2024-02-11-gallocr-v3", "gpt-2-sched_tiny_short.AT.log", ["ggml-2024-02"]),  # every size a multiple of 64
    ("v2024-02-11-gallocr-v3", "gpt-2-backend_tiny_short.AT.log", ["ggml-2024-02"]),
    ("v2025-09-23-prechunk", "gpt-2-backend_tiny_short.AT.log", ["ggml-2025-09"]),  # 32-byte inputs
    ("head-gallocr", "gpt-2-alloc_tiny_short.AT.log", ["ggml-head", "ggml-2026-08-21"]),
])
def test_real_logs_name_the_generations_they_fit(fixtures, folder, name, want):
    """The real v3 logs are told from 2025-09 by their leaf order alone (data-less leafs allocated just
    before their first user); a chunked log fits both chunked generations (only CLAMP differs)."""
    imp = LogImport(fixtures / folder / name)
    log_records(imp)
    assert imp.candidates == want and imp.generation == want[0]


@pytest.mark.parametrize("folder,name", [
    ("v2023-08-28-parseseq", "gpt-2_tiny_short.AT.log"),
    ("v2023-08-28-parseseq", "gpt-2_tiny_long.AT+DEBUG.log"),
    ("v2023-08-28-parseseq", "harness_parseseq.AT.log"),
    ("many-graphs", "gpt-2_117M_many.2023-08-28.AT.log.xz"),
])
def test_block_logs_two_generations_fit_have_the_same_sizes_under_both(fixtures, tmp_path, folder, name):
    """The Aug 2023 logs fit 2023-08-22 and 2023-08-28, and the import says their sizes are exact under either
    reading (0 bytes uncertain): read both ways, every graph's sizes and consistency agree."""
    path = fixtures / folder / name
    readings = {}
    for gen in ("ggml-2023-08-28", "ggml-2023-08-22"):
        (trace,) = GgmlLogSource().read(open(path, "rb"), filename=name, name=None, generation=gen)
        readings[gen] = [(g.max_size, g.buffer_size, g.consistent, g.extra.get("uncertainty_bytes"))
                         for g in trace.graphs]
    assert readings["ggml-2023-08-28"] == readings["ggml-2023-08-22"]
    assert all(r[2] for r in readings["ggml-2023-08-28"])
    (trace,) = GgmlLogSource().read(open(path, "rb"), filename=name, name=None)
    assert trace.meta.extra["generation_candidates"] == ["ggml-2023-08-28", "ggml-2023-08-22"]
    assert "exact under either reading (0 bytes uncertain" in trace.meta.extra["generation_note"]
    assert [(g.max_size, g.buffer_size) for g in trace.graphs] == [r[:2] for r in readings["ggml-2023-08-28"]]
