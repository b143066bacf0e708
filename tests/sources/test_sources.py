"""The sources seam: one entry point decompresses, sniffs, reads and stores, whatever the source."""
from __future__ import annotations

import gzip
import io
import lzma

import pytest

from alloctrace.allocator.events import Event
from alloctrace.traces import sources
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.logio import HEAD
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.sources import ImportedTrace, import_file, import_paths
from alloctrace.traces.store.store import open_store

LOG = "v2023-08-28-parseseq/harness_plain.AT.log"


@pytest.fixture
def store(tmp_path):
    return open_store(tmp_path / "store")


class Unbuffered(io.RawIOBase):
    """A stream that cannot seek or peek (a socket, a pipe)."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), len(self.data), 1000)
        b[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def graphs_of(store, tid):
    return [(g["role"], g["max_size"], g["buffer_size"], g["consistent"]) for g in store.summary(tid)["graphs"]]


@pytest.mark.parametrize("pack", [gzip.compress, lzma.compress, lambda b: b])
def test_a_stream_imports_like_its_file(fixtures, store, pack):
    [ref] = import_paths(store, [fixtures / LOG])
    [got] = import_file(store, Unbuffered(pack((fixtures / LOG).read_bytes())), filename="piped.log")
    assert got["name"] == "piped.log" and got["source"] == "ggml-log"
    assert graphs_of(store, got["id"]) == graphs_of(store, ref)
    assert store.events(got["id"], 1) == store.events(ref, 1)


class Probe:
    """A source that takes files starting with PROBE and records what it was shown."""

    name = "probe"

    def __init__(self, fail_second=False):
        self.heads, self.options, self.fail_second = [], [], fail_second

    def sniff(self, head: bytes) -> bool:
        self.heads.append(head)
        return head.startswith(b"PROBE")

    def read(self, stream, *, filename, name, progress=None, depth=None):
        self.options.append({"depth": depth, "progress": progress is not None})
        body = stream.read()

        def graphs(k):
            if k == 1 and self.fail_second:
                raise UserError(f"{filename}: the second trace is broken")
            yield GraphRecord(0, "device", [Event("alloc", tensor="t", size=len(body), offset=0)], max_size=len(body))

        return [ImportedTrace(TraceMeta(name=f"{name or filename} #{k}", source=self.name), graphs(k),
                              {"bytes": len(body)}) for k in range(2)]


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setattr(sources, "_SOURCES", list(sources._SOURCES))
    return sources.register(Probe())


def test_a_registered_source_reads_what_it_recognises(tmp_path, store, probe, monkeypatch):
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the probe records its calls in this process
    data = b"PROBE" + b"x" * (3 * HEAD)
    path = tmp_path / "p.bin.gz"
    path.write_bytes(gzip.compress(data))
    got = import_file(store, path, depth=3, generation="ignored by a source that does not take it")
    assert [t["name"] for t in got] == ["p.bin.gz #0", "p.bin.gz #1"]
    assert [t["report"] for t in got] == [{"bytes": len(data)}] * 2  # the whole decompressed stream
    assert [t["source"] for t in got] == ["probe", "probe"] and got[0]["generation"] is None
    assert probe.options == [{"depth": 3, "progress": True}]
    assert len(probe.heads[-1]) == HEAD and probe.heads[-1] == data[:HEAD]  # decompressed, bounded


def test_a_log_is_not_taken_by_a_source_that_does_not_recognise_it(fixtures, store, probe):
    [got] = import_file(store, fixtures / LOG)
    assert got["source"] == "ggml-log" and probe.options == []


def test_a_failing_trace_leaves_none_of_the_file(tmp_path, store, monkeypatch):
    monkeypatch.setattr(sources, "_SOURCES", list(sources._SOURCES))
    sources.register(Probe(fail_second=True))
    path = tmp_path / "p.bin"
    path.write_bytes(b"PROBE and more")
    with pytest.raises(UserError, match="p.bin: the second trace is broken"):
        import_file(store, path)
    assert store.list() == []


@pytest.mark.parametrize("kind", ["log", "jsonl"])
def test_the_callers_caps_apply_to_every_reader_of_the_input(fixtures, store, tmp_path, monkeypatch, kind):
    """A source reads the seam's stream through its own text reader: the caps are the caller's,
    not the environment's defaults, both ways."""
    from alloctrace.traces.sources.bounded_io import LimitExceeded, Limits
    from alloctrace.traces.export.ggml import export

    path = fixtures / "v2023-08-28-parseseq" / "harness_parseseq.AT.log"
    if kind == "jsonl":
        [tid] = import_paths(store, [path])
        with open(tmp_path / "t.jsonl", "w") as f:
            export(store, tid, "jsonl", f)
        path = tmp_path / "t.jsonl"
    monkeypatch.setenv("ALLOCTRACE_MAX_DECOMPRESSED", "2000")
    [t] = sources.read_file(path, limits=Limits.from_env(max_decompressed=1 << 30))
    assert list(t.graphs)
    monkeypatch.delenv("ALLOCTRACE_MAX_DECOMPRESSED")
    with pytest.raises(LimitExceeded, match="2,000 bytes"):
        sources.read_file(path, limits=Limits.from_env(max_decompressed=2000))
