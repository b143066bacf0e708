"""Hostile and unlucky input through the CLI: each test is one attack of the hostile-input issue,
at a size that keeps CI fast; memory is the child's peak RSS (getrusage)."""
from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zstandard

from hostile_inputs import (cli_peak_rss, distinct_names_log, gzip_text_bomb, many_graphs_zstd, same_name_log,
                            zstd_zero_bomb)

DATA = Path(__file__).parents[1] / "data" / "hostile"
GPT2 = DATA / "gpt-2_tiny_short.AT.log"
MB = 1 << 20


def cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "alloctrace", *map(str, args)], capture_output=True, text=True,
                          env=env, **kw)


def one_error_line(p) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alloctrace: error: "), p.stderr
    return lines[0]


def n_traces(store) -> int:
    p = cli("list", "--json", "--store", store)
    assert p.returncode == 0, p.stderr
    return len(json.loads(p.stdout)["traces"])


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    d = tmp_path_factory.mktemp("bombs")
    return {"zstd-zeros": zstd_zero_bomb(d / "b.zst"),  # the 131 KB file: 4 GiB of zeros
            "gzip-text": gzip_text_bomb(d / "t.gz", 256 * MB)}


# --- 1: decompression bombs ---------------------------------------------------------------
def test_zstd_bomb_of_4_gib_is_refused_with_bounded_memory(bombs, tmp_path):
    assert bombs["zstd-zeros"].stat().st_size < 200_000
    p, peak = cli_peak_rss(["import", str(bombs["zstd-zeros"]), "--store", str(tmp_path / "s")])
    line = one_error_line(p)
    assert "binary data" in line  # zeros are refused after the first window, not after 4 GiB
    assert peak < 150 * MB, peak
    assert n_traces(tmp_path / "s") == 0


def test_text_bomb_stops_at_the_decompressed_cap(bombs, tmp_path):
    p, peak = cli_peak_rss(["import", str(bombs["gzip-text"]), "--store", str(tmp_path / "s"),
                            "--max-decompressed", "32M"])
    line = one_error_line(p)
    assert "more than 33,554,432 bytes" in line and "--max-bytes" in line
    assert peak < 200 * MB, peak
    # the same cap from the environment, on a zstd stream of text
    z = tmp_path / "t.zst"
    with gzip.open(bombs["gzip-text"]) as src, open(z, "wb") as f:
        w = zstandard.ZstdCompressor().stream_writer(f)
        w.write(src.read(64 * MB))
        w.flush(zstandard.FLUSH_FRAME)
    env = {**os.environ, "ALLOCTRACE_MAX_DECOMPRESSED": "16M"}
    line = one_error_line(cli("import", z, "--store", tmp_path / "s", env=env))
    assert "more than 16,777,216 bytes" in line and "ALLOCTRACE_MAX_DECOMPRESSED" in line
    assert n_traces(tmp_path / "s") == 0


def test_cpu_time_per_import_is_capped(bombs, tmp_path):
    # the decompression cap raised out of the way: the CPU cap alone must stop it
    env = {**os.environ, "ALLOCTRACE_MAX_IMPORT_CPU": "0.3", "ALLOCTRACE_MAX_DECOMPRESSED": str(8 << 30)}
    line = one_error_line(cli("import", bombs["gzip-text"], "--store", tmp_path / "s", env=env, timeout=60))
    assert "CPU time" in line and "ALLOCTRACE_MAX_IMPORT_CPU" in line


# --- 5: import cliff at ~32k distinct tensor names -----------------------------------------
def test_distinct_names_cost_linear_time(tmp_path):
    times = {}
    for n in (17_500, 70_000):  # 70k took over 156 s
        log = distinct_names_log(tmp_path / f"d{n}.log", n)
        t = time.perf_counter()
        p = cli("import", log, "--store", tmp_path / "s", timeout=120)
        times[n] = time.perf_counter() - t
        assert p.returncode == 0, p.stderr
    assert times[70_000] < 30
    assert times[70_000] < 8 * times[17_500] + 2  # linear is 4x; the cliff was ~80x


# --- 6: disk full ---------------------------------------------------------------------------
def test_disk_full_is_one_line_and_leaves_the_store_as_it_was(tmp_path):
    store = tmp_path / "s"
    assert cli("import", GPT2, "--store", store).returncode == 0
    db, wal = store / "alloctrace.db", store / "alloctrace.db-wal"
    # room for a little, not for another big trace (a command leaves its WAL to the next opener: cli.console;
    # its pages count as what is stored)
    limit = db.stat().st_size + (wal.stat().st_size if wal.exists() else 0) + 64 * 1024

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    big = tmp_path / "big.log"
    distinct_names_log(big, 30_000)
    p = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(big), "--store", str(store)],
                       capture_output=True, text=True, preexec_fn=small_disk)
    line = one_error_line(p)
    assert "disk full" in line and "Traceback" not in p.stderr
    assert n_traces(store) == 1  # the first trace is intact, the second left nothing
    assert not wal.exists() or wal.stat().st_size < 64 * 1024  # checkpointed, not left holding the disk
    assert cli("show", json.loads(cli("list", "--json", "--store", store).stdout)["traces"][0]["id"],
               "--store", store).returncode == 0


def test_store_full_in_process_rolls_back_and_says_so(tmp_path):
    from alloctrace.traces.sources import read_file
    from alloctrace.traces.store.store import StoreFull, open_store

    store = open_store(tmp_path / "s")
    [t] = read_file(GPT2)
    meta, graphs = t.meta, t.graphs
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count={pages + 2}")
    with pytest.raises(StoreFull, match="disk full"):
        store.add_trace(meta, graphs)
    assert store.list() == [] and not store.db.in_transaction
    store.db.execute("PRAGMA max_page_count=1000000")
    assert store.summary(store.add_trace(meta, graphs))["graphs"]  # the store still works


# --- 7: export -o and special files ---------------------------------------------------------
@pytest.fixture(scope="module")
def one_trace(tmp_path_factory):
    store = tmp_path_factory.mktemp("exp") / "s"
    p = cli("import", GPT2, "--store", store, "--json")
    return store, json.loads(p.stdout)["traces"][0]["id"]


def test_export_writes_into_a_fifo(one_trace, tmp_path):
    store, tid = one_trace
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    p = cli("export", tid, "--format", "csv", "-o", fifo, "--store", store, timeout=60)
    reader.join(10)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0].startswith("i,kind")


def test_export_writes_into_a_character_device(one_trace, tmp_path):
    store, tid = one_trace
    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    except PermissionError:
        pytest.skip("cannot make a device node here")
    p = cli("export", tid, "--format", "jsonl", "-o", dev, "--store", store)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_export_keeps_symlinks_and_modes(one_trace, tmp_path):
    store, tid = one_trace
    target = tmp_path / "real.csv"
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert cli("export", tid, "--format", "csv", "-o", link, "--store", store).returncode == 0
    assert link.is_symlink() and target.read_text().startswith("i,kind")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    new = tmp_path / "new.csv"
    assert cli("export", tid, "--format", "csv", "-o", new, "--store", store).returncode == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask
    sock_dir = tmp_path / "d"
    sock_dir.mkdir()
    assert "is a directory" in one_error_line(cli("export", tid, "--format", "csv", "-o", sock_dir,
                                                  "--store", store))


# --- 8 and 13: malformed JSON Lines and impossible numbers -----------------------------------
def _jsonl(tmp_path, graph_lines: list[dict], events: list[dict] | None = None) -> Path:
    head = {"type": "trace", "format": "alloctrace-trace", "version": 1, "name": "x", "source": "s",
            "generation": "ggml-2023-08-16"}
    lines = [head]
    for g in graph_lines:
        lines.append({"type": "graph", "index": 0, "role": "measure", "n_events": 1, **g})
        for e in events or [{"kind": "alloc", "tensor": "t", "size": 32}]:
            lines.append({"type": "event", **e})
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return p


@pytest.mark.parametrize("graphs,events,expect", [
    ([{}, {}], None, "t.jsonl:4: duplicate graph index 0"),
    ([{}], [{"kind": "alloc", "tensor": {"a": 1}}], "t.jsonl:3: tensor"),
    ([{}], [{"kind": "alloc", "tensor": ["x"]}], "t.jsonl:3: tensor"),
    ([{}], [{"kind": "alloc", "size": "32"}], "t.jsonl:3: size"),
    ([{"index": "x"}], None, "t.jsonl:2: index"),
    ([{}], [{"kind": "zzz"}], "t.jsonl:3: kind"),
    ([{"role": "<script>"}], None, "t.jsonl:2: role"),
    ([{}], [{"kind": "alloc", "size": 2 ** 63 - 1}], "t.jsonl:3: size"),
    ([{}], [{"kind": "alloc", "block": -99999}], "t.jsonl:3: block"),
    ([{}], [{"kind": "free", "size": -2048}], "t.jsonl:3: size"),
    ([{"index": 2 ** 63 - 1}], None, "t.jsonl:2: index"),
])
def test_malformed_jsonl_is_refused_with_its_line(tmp_path, graphs, events, expect):
    p = cli("import", _jsonl(tmp_path, graphs, events), "--store", tmp_path / "s")
    line = one_error_line(p)
    assert expect in line, line
    assert n_traces(tmp_path / "s") == 0


def test_valid_jsonl_still_imports(tmp_path):
    p = cli("import", _jsonl(tmp_path, [{}, {"index": 1}]), "--store", tmp_path / "s")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("line,expect", [
    ("ggml_allocr_alloc: allocating x (9223372036854775807 bytes) - block 0", "9223372036854775807 bytes"),
    ("ggml_allocr_alloc: allocating x (32 bytes) - block -99999", "block -99999"),
    ("ggml_allocator_free_tensor: freeing x (-2048 bytes) - n_free_blocks = 1", "-2048 bytes"),
    ("####### graph 9223372036854775807/1", "graph 9223372036854775807"),
])
def test_impossible_numbers_in_logs_name_their_line(tmp_path, line, expect):
    log = tmp_path / "x.log"
    log.write_text("####### graph 0/1\nggml_allocr_alloc: allocating a (32 bytes) - block 0\n" + line + "\n")
    out = one_error_line(cli("import", log, "--store", tmp_path / "s"))
    assert f"x.log:3: number out of range: {expect}" in out, out


# --- 9: terminal escapes ---------------------------------------------------------------------
def test_names_cannot_drive_the_terminal(tmp_path):
    evil = "evil\x1b]0;pwned\x07\nFAKE  forged-row\x9b2J"
    p = cli("import", GPT2, "--store", tmp_path / "s", "--name", evil)
    assert p.returncode == 0, p.stderr
    tid = json.loads(cli("list", "--json", "--store", tmp_path / "s").stdout)["traces"][0]["id"]
    for args in (["list"], ["show", tid], ["import", GPT2, "--name", evil]):
        out = cli(*args, "--store", tmp_path / "s").stdout
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
        assert "\\x1b]0;pwned\\x07\\nFAKE" in out
        assert not any(line.startswith("FAKE") for line in out.splitlines())
    diff = cli("diff", f"{tid}:0", f"{tid}:1", "--store", tmp_path / "s")
    assert diff.returncode in (0, 1) and "\x1b" not in diff.stdout


def test_tensor_names_cannot_drive_the_terminal_in_peak_and_diff(tmp_path):
    """Tensor names are data too: `peak` and `diff` tables escape them like the trace list does."""
    log = tmp_path / "evil.log"
    log.write_text(GPT2.read_text().replace("node_", "n\x1b]0;pwned\x07_"))
    tid = json.loads(cli("import", log, "--store", tmp_path / "s", "--json").stdout)["traces"][0]["id"]
    for args in (["peak", f"{tid}:0", "--tensors"], ["diff", f"{tid}:0", f"{tid}:1"]):
        out = cli(*args, "--store", tmp_path / "s").stdout
        assert "\x1b" not in out and "\x07" not in out, args
        assert "n\\x1b]0;pwned\\x07_" in out, args


# --- 12: resource use at the boundaries ------------------------------------------------------
def test_many_graphs_from_a_few_kb_are_capped(tmp_path):
    z = many_graphs_zstd(tmp_path / "g.zst", 23_087)
    assert z.stat().st_size < 10_000
    line = one_error_line(cli("import", z, "--store", tmp_path / "s", timeout=120))  # default caps
    assert "more than 1,000 graphs from" in line and "per KiB" in line
    big = many_graphs_zstd(tmp_path / "big.zst", 300)  # a few hundred graphs are fine
    assert cli("import", big, "--store", tmp_path / "s").returncode == 0
    env = {**os.environ, "ALLOCTRACE_MAX_GRAPHS": "200"}
    # into another store: the one above holds this file already, and a file stored before is not read again
    line = one_error_line(cli("import", big, "--store", tmp_path / "s2", env=env, timeout=120))
    assert "more than 200 graphs" in line and "ALLOCTRACE_MAX_GRAPHS" in line
    assert n_traces(tmp_path / "s") == 1 and n_traces(tmp_path / "s2") == 0


def test_amplification_cap_counts_stored_bytes(tmp_path):
    from alloctrace.traces.sources.bounded_io import LimitExceeded, Limits
    from alloctrace.traces.sources import read_file

    z = many_graphs_zstd(tmp_path / "g.zst", 3000)
    tight = Limits(max_amplification=1.0, min_stored=0)
    with pytest.raises(LimitExceeded, match="stored bytes per input byte"):
        read_file(z, limits=tight)


def test_a_million_same_named_allocations_stay_bounded(tmp_path):
    log = same_name_log(tmp_path / "same.log", 1_000_000)
    assert 83e6 < log.stat().st_size < 85e6  # 84 MB
    p, peak = cli_peak_rss(["import", str(log), "--store", str(tmp_path / "s")], timeout=300)
    assert p.returncode == 0, p.stderr
    assert peak < 400 * MB, peak  # 1.98 GB, then ~500 MiB before; one Python event per allocation remains (see docs)


def test_cli_import_parses_before_taking_the_write_lock(tmp_path):
    """A slow import must not block a small one: the lock is taken for the final write only."""
    store = tmp_path / "s"
    assert cli("import", GPT2, "--store", store).returncode == 0
    slow = same_name_log(tmp_path / "same.log", 600_000)
    # the Python path keeps it slow (the compiled fast path reads this log in well under the sleep below)
    big = subprocess.Popen([sys.executable, "-m", "alloctrace", "import", str(slow), "--store", str(store)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "ALLOCTRACE_PURE_PYTHON": "1"})
    try:
        time.sleep(0.3)  # the big import is parsing now
        small = cli("import", GPT2, "--store", store, timeout=60)
        assert small.returncode == 0, small.stderr
        assert big.poll() is None  # the small import finished while the big one was still parsing
    finally:
        big.wait(120)
    assert big.returncode == 0


# --- 14: truncated compressed files and logs that end mid-graph ------------------------------
def test_truncated_gzip_is_corrupt_unless_salvaged(tmp_path):
    cut = tmp_path / "cut.log.gz"
    whole = gzip.compress(GPT2.read_bytes()[:40_000])
    cut.write_bytes(whole[:len(whole) // 2])  # the issue cut 20,000 of a real log's gzip; this one is smaller
    line = one_error_line(cli("import", cut, "--store", tmp_path / "s"))
    assert "truncated gzip data" in line and "--salvage" in line
    assert n_traces(tmp_path / "s") == 0
    p = cli("import", cut, "--store", tmp_path / "s", "--salvage", "--json")
    assert p.returncode == 0, p.stderr
    tid = json.loads(p.stdout)["traces"][0]["id"]
    summary = json.loads(cli("show", tid, "--json", "--store", tmp_path / "s").stdout)
    assert summary["truncated"] is True
    assert summary["graphs"][-1]["complete"] is False
    assert "INCOMPLETE" in cli("show", tid, "--store", tmp_path / "s").stdout


def test_a_log_that_ends_mid_graph_is_never_consistent_and_complete(tmp_path):
    cut = tmp_path / "cut.log"
    cut.write_bytes(GPT2.read_bytes()[:40_000])
    p = cli("import", cut, "--store", tmp_path / "s", "--json")
    assert p.returncode == 0, p.stderr
    tid = json.loads(p.stdout)["traces"][0]["id"]
    graphs = json.loads(cli("show", tid, "--json", "--store", tmp_path / "s").stdout)["graphs"]
    assert graphs[-1]["complete"] is False  # the walk the cut ends in
    assert all(g["complete"] for g in graphs[:-1])
    assert "INCOMPLETE" in cli("list", "--store", tmp_path / "s").stdout
    # the whole log: every graph complete
    p = cli("import", GPT2, "--store", tmp_path / "t", "--json")
    tid = json.loads(p.stdout)["traces"][0]["id"]
    graphs = json.loads(cli("show", tid, "--json", "--store", tmp_path / "t").stdout)["graphs"]
    assert len(graphs) == 6 and all(g["complete"] for g in graphs)


def test_truncated_zstd_and_xz_are_corrupt_too(tmp_path):
    import lzma
    raw = GPT2.read_bytes()
    for name, data in (("c.zst", zstandard.ZstdCompressor().compress(raw)), ("c.xz", lzma.compress(raw))):
        p = tmp_path / name
        p.write_bytes(data[:len(data) // 2])
        assert "truncated" in one_error_line(cli("import", p, "--store", tmp_path / "s"))
        whole = tmp_path / ("whole-" + name)
        whole.write_bytes(data)
        assert cli("import", whole, "--store", tmp_path / "s").returncode == 0


def test_bounded_reader_reads_every_member_and_refuses_garbage():
    import io
    import lzma

    from alloctrace.traces.errors import UserError
    from alloctrace.traces.sources.bounded_io import BoundedRaw, Limits, kind_of

    data = GPT2.read_bytes()
    a, b = data[:30_000], data[30_000:]
    streams = {"gzip": gzip.compress(a) + gzip.compress(b) + b"\0" * 64, "xz": lzma.compress(a) + lzma.compress(b),
               "zstd": zstandard.ZstdCompressor().compress(a) + zstandard.ZstdCompressor().compress(b),
               "big": gzip.compress(data * 50)}
    for name, c in streams.items():
        got = io.BufferedReader(BoundedRaw(io.BytesIO(c), kind_of(c[:8]), name, Limits())).read()
        assert got == (data * 50 if name == "big" else data), name
    with pytest.raises(UserError, match="corrupt gzip data"):
        io.BufferedReader(BoundedRaw(io.BytesIO(gzip.compress(data) + b"junk"), "gzip", "g", Limits())).read()
