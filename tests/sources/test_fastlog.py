"""The compiled fast path of the ggml log import (traces/sources/ggml_log/fastlog.c) stores exactly
what the Python path stores, byte for byte, or declines and lets the Python path import the log.

Every comparison imports the same input twice: once with ALLOCTRACE_PURE_PYTHON=1 (the reference)
and once with the fast path allowed."""
import io
import lzma
import os
import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from alloctrace.traces.errors import UserError
from alloctrace.traces.sources import import_file
from alloctrace.traces.sources.ggml_log import fastlog
from alloctrace.traces.sources.ggml_log.import_log import LogImport
from alloctrace.traces.store.store import open_store
from alloctrace.traces.util import cbuild

from conftest import FIXTURES

ALL_LOGS = sorted(FIXTURES.glob("*/*.log"))
SUPPORTED = sorted(FIXTURES.glob("v2023-08-*/*.log"))  # the legacy ggml_allocr logs with graph headers
MANY = FIXTURES / "many-graphs" / "gpt-2_117M_many.2023-08-28.AT.log.xz"  # a real 302-graph generation run
MUTATED_FROM = [FIXTURES / "v2023-08-16-legacy" / "harness_plain.AT.log",
                FIXTURES / "v2023-08-28-parseseq" / "harness_parseseq.AT.log",
                FIXTURES / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"]


@pytest.fixture(autouse=True)
def fresh_library():
    fastlog._FAST._tried.clear()
    yield
    fastlog._FAST._tried.clear()


def stored(tmp_path, data: bytes, pure: bool, monkeypatch, name="in.log", **options):
    """Every stored byte of importing `data` (trace row less its id and time, graph rows, column rows),
    or ("error", message)."""
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "1" if pure else "0")
    store = open_store(tmp_path / ("pure" if pure else "fast"))
    try:
        import_file(store, io.BytesIO(data), filename=name, **options)
    except UserError as e:
        return ("error", str(e))
    db = store.db
    traces = db.execute("SELECT name, source, generation, profile, tags, extra, format_version FROM traces").fetchall()
    graphs = db.execute("SELECT idx, role, n_events, max_size, buffer_size, oom, consistent, extra, strings, packed "
                        "FROM graphs ORDER BY idx").fetchall()
    columns = db.execute("SELECT graph_idx, name, dtype, data FROM columns ORDER BY graph_idx, rowid").fetchall()
    return traces, graphs, columns


def assert_same_store(tmp_path, data: bytes, monkeypatch, **options):
    pure = stored(tmp_path, data, True, monkeypatch, **options)
    fast = stored(tmp_path, data, False, monkeypatch, **options)
    assert fast == pure
    return pure


def fast_run(src) -> LogImport:
    imp = LogImport(src)
    for _ in imp.encoded():
        pass
    return imp


@pytest.mark.parametrize("log", ALL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_log_stores_the_same_bytes(tmp_path, monkeypatch, log):
    got = assert_same_store(tmp_path, log.read_bytes(), monkeypatch)
    assert got[0] != "error" and len(got[1]) >= 1


def test_the_real_long_log_stores_the_same_bytes(tmp_path, monkeypatch):
    data = lzma.decompress(MANY.read_bytes())
    traces, graphs, columns = assert_same_store(tmp_path, data, monkeypatch)
    assert len(graphs) == 302 and all(g[6] for g in graphs)  # every graph consistent with the model
    # the sizes ggml printed for this run (the fixtures README)
    assert (graphs[0][1], graphs[0][3]) == ("measure", 3_760_208)
    assert {(g[1], g[3], g[4]) for g in graphs[1:]} == {("eval", 1_657_376, 3_760_224)}
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    path = tmp_path / "many.log"
    path.write_bytes(data)
    imp = fast_run(path)
    assert imp.fast, imp.declined


def test_repeated_graphs_come_from_the_recovery_cache(tmp_path, monkeypatch):
    """Four runs of one program: later graphs repeat earlier ones line for line, from the same allocator
    state; the C cache serves the graphs the Python path's RecoveryCache serves (no more, no fewer)."""
    data = (FIXTURES / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log").read_bytes() * 4
    assert_same_store(tmp_path, data, monkeypatch)
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "1")
    pure = fast_run(io.BytesIO(data))
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    fastlog._FAST._tried.clear()
    imp = fast_run(io.BytesIO(data))
    assert imp.fast and imp.fast_hits == pure.cache.hits >= 12


@pytest.mark.parametrize("tune", [(30_000, 1 << 21, 1 << 16), (1 << 25, 3_000, 1 << 16), (30_000, 3_000, 1 << 16),
                                  (1 << 25, 1 << 21, 300), (1 << 25, 1 << 21, 1)])
def test_memos_that_start_over_store_the_same_bytes(tmp_path, monkeypatch, tune):
    """Small limits on the packed-column numbers, the recovery cache and the line memo (whose guesses of
    the next line then point into entries that were let go): they start over many times."""
    monkeypatch.setattr(fastlog, "TUNE", tune)
    log = (FIXTURES / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log").read_bytes()
    data = b"".join(log.replace(b"node_", b"n%d_" % (i % 3)) for i in range(8))  # repeats, and not
    assert_same_store(tmp_path, data, monkeypatch)
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    imp = fast_run(io.BytesIO(data))
    cache_starts, number_starts = imp.fast_restarts
    assert imp.fast and (cache_starts > 1) == (tune[1] < 1 << 21) and (number_starts > 1) == (tune[0] < 1 << 25)


def test_a_forced_generation_and_a_compressed_input_store_the_same_bytes(tmp_path, monkeypatch):
    data = lzma.compress((FIXTURES / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log").read_bytes())
    got = assert_same_store(tmp_path, data, monkeypatch, name="in.log.xz", generation="ggml-2023-08-16")
    assert got[0][0][2] == "ggml-2023-08-16"
    assert_same_store(tmp_path / "b", data, monkeypatch, generation="ggml-head")  # declined: a gallocr replay


@pytest.mark.parametrize("log", SUPPORTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_fast_path_runs_on_the_legacy_logs(monkeypatch, log):
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    imp = fast_run(log)
    assert imp.fast and imp.declined is None
    with open(log, "rb") as f:  # a seekable stream, and a one-pass one
        assert fast_run(f).fast
    assert fast_run(_OnePass(log.read_bytes())).fast


class _OnePass(io.RawIOBase):
    """A stream that cannot seek (an upload being decompressed)."""

    def __init__(self, data):
        self.data = io.BytesIO(data)

    def readable(self):
        return True

    def readinto(self, b):
        got = self.data.read(len(b))
        b[:len(got)] = got
        return len(got)


@pytest.mark.parametrize("log", sorted(set(ALL_LOGS) - set(SUPPORTED)), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_later_generations_are_declined(monkeypatch, log):
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    imp = fast_run(log)
    assert not imp.fast and imp.declined


def test_a_late_decline_on_a_one_pass_stream_restarts_from_the_start(tmp_path, monkeypatch):
    """Graphs already handed out are not handed out twice; the Python path reads the kept bytes."""
    data = (FIXTURES / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log").read_bytes()
    data += b"ggml_allocr_alloc: allocating late (16 bytes) - block 0, addr 0x10\n"  # a line it does not cover
    assert_same_store(tmp_path, data, monkeypatch)
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    imp = LogImport(_OnePass(data))
    graphs = list(imp.encoded())
    assert not imp.fast and "addr" in imp.declined
    assert [g.index for g in graphs] == list(range(len(graphs))) and len(graphs) >= 6


def test_without_an_install_time_library_the_python_path_imports(tmp_path, monkeypatch):
    """Nothing is compiled on use: no library in the package is the Python path, even with a compiler."""
    monkeypatch.setattr(cbuild, "installed_path", lambda *a: tmp_path / "fastlog-missing.so")
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    fastlog._FAST._tried.clear()
    assert fastlog.library() is None and "fastlog-missing.so" in fastlog.unavailable()
    log = SUPPORTED[0]
    imp = fast_run(log)
    assert not imp.fast
    monkeypatch.undo()
    fastlog._FAST._tried.clear()
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    assert_same_store(tmp_path, log.read_bytes(), monkeypatch)


LOADED_BY_AN_IMPORT = """
import sys
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.util import cbuild
[tid] = import_paths(open_store(sys.argv[2]), [sys.argv[1]])
print(" ".join(sorted(m for m in sys.modules if m.startswith(("alloctrace.", "rich", "pydantic", "fastapi")))))
"""


@pytest.mark.parametrize("pure", [False, True])
def test_an_import_on_the_fast_path_loads_no_python_path_modules(tmp_path, pure):
    """The fast path needs none of the Python path's parser, splitter or replay; no import loads the
    web or terminal libraries."""
    # read in this process: what the reading loads is what is counted (the child is traces/sources/child.py's)
    env = {**os.environ, "ALLOCTRACE_PURE_PYTHON": "1" if pure else "0", "ALLOCTRACE_IMPORT_IN_PROCESS": "1"}
    res = subprocess.run([sys.executable, "-c", LOADED_BY_AN_IMPORT, str(SUPPORTED[0]), str(tmp_path / "s")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    ggml = "alloctrace.traces.sources.ggml_log."
    python_path = {ggml + m for m in ("parse_log", "split", "split_fast", "recover", "recover_fast")}
    assert "alloctrace.traces.sources.ggml_log.fastlog" in loaded
    assert (loaded & python_path) == (python_path if pure else set())
    assert not {m for m in loaded if m.split(".")[0] in ("rich", "pydantic", "fastapi")}


def test_pure_python_forced(monkeypatch):
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "1")
    assert fastlog.library() is None
    assert not fast_run(SUPPORTED[0]).fast


def test_absurd_numbers_give_the_python_paths_message(tmp_path, monkeypatch):
    data = (FIXTURES / "v2023-08-16-legacy" / "harness_plain.AT.log").read_bytes()
    data = data.replace(b"(4096 bytes) - block", b"(99999999999999999999999 bytes) - block", 1)
    got = assert_same_store(tmp_path, data, monkeypatch)
    assert got[0] == "error" and "in.log:" in got[1] and "out of range" in got[1]


# --- mutated legacy logs: the same store, or the same error ---

PROGRAM_LINES = [b"main: some program output\n", b"gpt2: compute buffer size: 12.5 MB\n",
                 b"using a measure allocator next\n", b"real buffer size = 123456 bytes\n",
                 b"tensor alignment 32\n", "sortie du programme: caf\u00e9 \u2014 na\u00efve\n".encode(),
                 "\u00a0\n".encode(), b"\n", b"   \n", b"\t\n"]
GLUE = [b"The quick brown fox jumps over the lazy", "Gr\u00fc\u00dfe aus K\u00f6ln ".encode(), b"   ",
        "\u00a0".encode(), "\u2003 ".encode(), b"42", b"x"]
ALLOCATOR_LINES = [
    b"ggml_allocr_alloc: not enough space in the buffer (needed 4096, largest block available 16)\n",
    b"GGML_ASSERT: ggml/src/ggml-alloc.c:140: !\"not enough space in the buffer\"\n",
    b"GGML_ASSERT: ggml/src/ggml-alloc.c:131: alloc->n_free_blocks < MAX_FREE_BLOCKS && \"out of free blocks\"\n",
    b"####### graph 0/1\n", b"####### graph 7/9\n",
    b"reusing view parent node_1 (node_0) for node_2\n", b"not reusing parent leaf_2 for node_4 as (nil) is external\n",
    b"not reusing parent a for b as layouts are different\n", b"not reusing parent a for b as it is an output\n",
    b"exec: ADD (node_x) <= \n", b"exec: CPY ( (view) (copy of  (view))) <=  (view),  (view)\n",
    b"ggml_allocr_alloc: allocating node_\"q\\ (16 bytes) - block 0\n",
    b"ggml_allocr_alloc: allocating odd\x01name (32 bytes) - \n",
    b"max_size = 0.01 MB: tensors: node_1 (0.01 MB)\n",
    "ggml_allocr_alloc: allocating n\u00e9 (16 bytes) - block 0\n".encode(),
    b"view_src node_3: 2 children, 1 views\n",
]

EDITS = st.lists(st.tuples(
    st.sampled_from(["delete", "duplicate", "swap", "program", "glue", "allocator", "blank", "cut", "truncate"]),
    st.integers(0, 10**6), st.integers(0, 10**6)), max_size=8)


def mutated(lines: list[bytes], edits, crlf: bool) -> bytes:
    lines = list(lines)
    for op, a, b in edits:
        if not lines:
            break
        i, j = a % len(lines), b % len(lines)
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        elif op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "program":
            lines.insert(i, PROGRAM_LINES[b % len(PROGRAM_LINES)])
        elif op == "glue":
            lines[i] = GLUE[b % len(GLUE)] + lines[i]
        elif op == "allocator":
            lines.insert(i, ALLOCATOR_LINES[b % len(ALLOCATOR_LINES)])
        elif op == "blank":
            lines.insert(i, b"\n")
        elif op == "cut":  # a truncated last line
            lines = lines[:i + 1]
            lines[-1] = lines[-1][:b % (len(lines[-1]) + 1)]
        elif op == "truncate":
            lines = lines[:i + 1]
    data = b"".join(lines)
    return data.replace(b"\n", b"\r\n") if crlf else data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=st.sampled_from(MUTATED_FROM), edits=EDITS, crlf=st.booleans())
def test_mutated_legacy_logs_store_the_same_bytes(tmp_path_factory, monkeypatch, log, edits, crlf):
    tmp = tmp_path_factory.mktemp("mut")
    data = mutated(log.read_bytes().splitlines(keepends=True), edits, crlf)
    if not data.strip():
        return
    assert_same_store(tmp, data, monkeypatch)


def test_many_graph_log_with_random_edits_stores_the_same_bytes(tmp_path, monkeypatch):
    """A long log, cut to a few graphs, with seeded edits all over it."""
    lines = lzma.decompress(MANY.read_bytes()).splitlines(keepends=True)[:12000]
    rng = random.Random(7)
    edits = [(rng.choice(["delete", "duplicate", "swap", "program", "glue", "blank", "allocator"]),
              rng.randrange(10**6), rng.randrange(10**6)) for _ in range(40)]
    assert_same_store(tmp_path, mutated(lines, edits, False), monkeypatch)


def test_text_blocks_split_inside_a_character_and_a_line_break(tmp_path, monkeypatch):
    """A multi-byte character and a CR LF pair across the 1 MiB read blocks, plain ASCII blocks
    between: the text the C side scans is what LogReader decodes."""
    body = lzma.decompress(MANY.read_bytes())[:3 * fastlog.TEXT_BLOCK]
    body = body[:body.rindex(b"\n") + 1]
    cut = body.index(b"\n", fastlog.TEXT_BLOCK - 200) + 1
    program = "r\u00e9sum\u00e9 of the run\n".encode()
    pad = b"x" * (fastlog.TEXT_BLOCK - cut - 2)  # the second byte of "é" is the next block's first
    data = body[:cut] + pad + program + body[cut:]
    cut2 = data.index(b"\n", 2 * fastlog.TEXT_BLOCK - 100)
    data = data[:cut2] + b"\r" + data[cut2:]  # a CR LF pair, the CR before the block boundary
    for edit in (data, data[:2 * fastlog.TEXT_BLOCK - 1] + b"\r" + data[2 * fastlog.TEXT_BLOCK - 1:]):
        assert_same_store(tmp_path / str(len(edit)), edit, monkeypatch)
        assert fast_run(io.BytesIO(edit)).fast


@pytest.mark.parametrize("log", SUPPORTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_legacy_logs_without_graph_headers_store_the_same_bytes(tmp_path, monkeypatch, log):
    """Walks cut where program output or glued text comes between them (Splitter's rules without headers)."""
    data = b"".join(line for line in log.read_bytes().splitlines(keepends=True) if not line.startswith(b"#######"))
    assert_same_store(tmp_path, data, monkeypatch)
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    assert fast_run(io.BytesIO(data)).fast


def test_a_cancelled_import_stops_on_the_fast_path_and_stores_nothing(tmp_path, monkeypatch):
    """An upload whose client left stops between graphs on the compiled path too (capped_graphs' check)."""
    from alloctrace.traces.sources.bounded_io import Cancelled, Limits

    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    store = open_store(tmp_path / "s")
    polls = []

    def cancelled():
        polls.append(1)
        return len(polls) > 40  # some graphs in

    with pytest.raises(Cancelled, match="import cancelled"):
        import_file(store, io.BytesIO(lzma.decompress(MANY.read_bytes())), filename="many.log",
                    limits=Limits(cancelled=cancelled))
    assert store.list() == []
    assert fast_run(io.BytesIO(lzma.decompress(MANY.read_bytes()))).fast  # an input the fast path takes
