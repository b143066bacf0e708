"""Hostile and unlucky inputs, made on the fly (issue: hostile input), shared by the tests and
bench/bench_hostile.py. Every maker writes to `path` and returns it."""
from __future__ import annotations

import gzip
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import zstandard

HEADER = "####### graph 0/1\n"


def zstd_zero_bomb(path: Path, size: int = 4 << 30) -> Path:
    """`size` zero bytes in one zstd frame (4 GiB -> about 131 KB): the issue's bomb, verbatim."""
    with open(path, "wb") as f:
        w = zstandard.ZstdCompressor().stream_writer(f, size=size)
        block = b"\0" * (64 << 20)
        for _ in range(size // len(block)):
            w.write(block)
        w.flush(zstandard.FLUSH_FRAME)
    return path


def gzip_text_bomb(path: Path, size: int) -> Path:
    """`size` bytes of plausible log text (program output lines), gzipped at level 9."""
    line = b"llama_print_timings: prompt eval time = 1.00 ms / 1 tokens\n"
    block = line * ((1 << 20) // len(line))
    with gzip.open(path, "wb", compresslevel=9) as f:
        for _ in range(size // len(block)):
            f.write(block)
    return path


def distinct_names_log(path: Path, n: int, size: int = 4096) -> Path:
    """One graph of `n` allocations, each of its own tensor name (a 2023-08-16 measure walk)."""
    with open(path, "w") as f:
        f.write(HEADER)
        for i in range(n):
            f.write(f"ggml_allocr_alloc: allocating tensor_{i} ({size} bytes) - block 0\n"
                    f"exec: ADD (tensor_{i}) <= a, b\n\n")
    return path


def long_graph_log(path: Path, n_allocs: int) -> Path:
    """One graph that only allocates (the live set grows to `n_allocs`), zstd-compressed: a tiny
    file, a huge graph."""
    line = "ggml_allocr_alloc: allocating t (32 bytes) - block 0\n"
    with open(path, "wb") as f:
        w = zstandard.ZstdCompressor(level=19).stream_writer(f)
        w.write(HEADER.encode())
        chunk = (line * 10000).encode()
        for _ in range(n_allocs // 10000):
            w.write(chunk)
        w.flush(zstandard.FLUSH_FRAME)
    return path


def many_distinct_graphs_zstd(path: Path, n_graphs: int, allocs: int) -> Path:
    """`n_graphs` graphs of `allocs` allocations each, no two alike (every one is recovered)."""
    with open(path, "wb") as f:
        w = zstandard.ZstdCompressor(level=19).stream_writer(f)
        for g in range(n_graphs):
            node = f"ggml_allocr_alloc: allocating t ({32 * (g + 1)} bytes) - block 0\nexec: ADD (t) <= a, b\n\n"
            w.write((HEADER + node * allocs + "program output\n").encode())
        w.flush(zstandard.FLUSH_FRAME)
    return path


def same_name_log(path: Path, n: int) -> Path:
    """`n` allocations of one tensor name, 84 bytes a line (10**6 -> an 84 MB log)."""
    head, tail = "ggml_allocr_alloc: allocating ", " (4096 bytes) - block 0\n"
    line = head + "same_named_tensor".ljust(84 - len(head) - len(tail), "_") + tail
    with open(path, "w") as f:
        f.write(HEADER)
        block = line * 10000
        for _ in range(n // 10000):
            f.write(block)
    return path


def many_graphs_zstd(path: Path, n_graphs: int) -> Path:
    """`n_graphs` tiny graphs in a few KB of zstd (amplification: graphs per compressed byte)."""
    one = HEADER + "ggml_allocr_alloc: allocating t (32 bytes) - block 0\nexec: ADD (t) <= a, b\n\n"
    with open(path, "wb") as f:
        w = zstandard.ZstdCompressor(level=19).stream_writer(f)
        w.write((one * n_graphs).encode())
        w.flush(zstandard.FLUSH_FRAME)
    return path


def peak_rss_of(code: str, *args: str, env=None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int]:
    """Run `code` in a fresh Python; returns the finished process and its peak RSS in bytes: the
    high-water mark of its own memory (VmHWM), or of a child where a server's uploads were read (its fork
    server's, which reaps them). Not its own ru_maxrss: Linux carries the parent's peak across fork and exec
    into it, so a child of a big test process would report the parent's size."""
    prog = textwrap.dedent(code) + textwrap.dedent("""
        import re as _re, resource as _r, sys as _s
        _hwm = int(_re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        if "alloctrace.traces.sources.child" in _s.modules:  # a server's readings run in its fork server's children
            _s.modules["alloctrace.traces.sources.child"].stop_fork_server()
            _hwm = max(_hwm, _r.getrusage(_r.RUSAGE_CHILDREN).ru_maxrss * 1024)
        print("PEAK_RSS", _hwm, file=_s.stderr)
    """)
    p = subprocess.run([sys.executable, "-c", prog, *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    peak = 0
    for line in p.stderr.splitlines():
        if line.startswith("PEAK_RSS "):
            peak = int(line.split()[1])
    return p, peak


def cli_peak_rss(args: list[str], env=None, timeout: float = 120) -> tuple[subprocess.CompletedProcess, int]:
    """`alloctrace ARGS` in a child; its exit status, output and peak RSS (RUSAGE_CHILDREN of a
    wrapper that runs only it)."""
    wrapper = textwrap.dedent("""
        import resource, subprocess, sys
        p = subprocess.run([sys.executable, "-m", "alloctrace", *sys.argv[1:]])
        # the wrapper is small, so the peak it hands its child across fork and exec is too
        print("PEAK_RSS", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr)
        sys.exit(p.returncode)
    """)
    p = subprocess.run([sys.executable, "-c", wrapper, *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    peak = 0
    lines = []
    for line in p.stderr.splitlines():
        if line.startswith("PEAK_RSS "):
            peak = int(line.split()[1])
        else:
            lines.append(line)
    p.stderr = "\n".join(lines) + ("\n" if lines else "")
    return p, peak


def self_peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- PyTorch snapshots whose shared references multiply the work (issue: trust nothing in a pickle) -------
def _snapshot(segments=(), entries=(), settings=None) -> dict:
    return {"segments": list(segments), "device_traces": [list(entries)],
            "allocator_settings": {} if settings is None else settings}


def write_pickle(path: Path, obj) -> Path:
    """`obj` pickled (protocol 4): the pickler's memo keeps every shared reference shared."""
    import pickle

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))  # a 1000-deep dict is part of the attack
    try:
        path.write_bytes(pickle.dumps(obj, protocol=4))
    finally:
        sys.setrecursionlimit(old)
    return path


def shared_blocks_snapshot(path: Path, n_segments: int = 3000, n_blocks: int = 3000) -> Path:
    """`n_segments` segments (one dict, repeated) that hold one list of `n_blocks` blocks (one dict,
    repeated): about 2 bytes of pickle per segment and per block, n_segments x n_blocks rows once expanded."""
    block = {"address": 0, "size": 512, "requested_size": 512, "state": "inactive"}
    seg = {"device": 0, "address": 0, "total_size": 512 * n_blocks, "stream": 0, "segment_type": "large",
           "blocks": [block] * n_blocks}
    return write_pickle(path, _snapshot([seg] * n_segments))


def shared_frames_snapshot(path: Path, n_entries: int = 200_000, n_frames: int = 1_000_000) -> Path:
    """One frames list of `n_frames` frames (one dict, repeated) shared by each of `n_entries` entries."""
    frame = {"name": "f", "filename": "x.py", "line": 1}
    frames = [frame] * n_frames
    entries = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "frames": frames}
               for i in range(n_entries)]
    return write_pickle(path, _snapshot(entries=entries))


def deep_settings(depth: int = 1000) -> dict:
    d: dict = {}
    for _ in range(depth):
        d = {"x": d}
    return d


def cyclic_settings() -> dict:
    d: dict = {"max_split_size": -1}
    d["self"] = d
    return d


def _segment(**changes) -> dict:
    seg = {"device": 0, "address": 1 << 20, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
           "blocks": [{"address": 1 << 20, "size": 2 << 20, "requested_size": 0, "state": "inactive"}]}
    seg.update(changes)
    return {k: v for k, v in seg.items() if v is not None}


def bad_value_snapshots() -> dict[str, dict]:
    """Snapshots with one impossible value each (label -> snapshot dict)."""
    alloc = {"action": "alloc", "addr": 1 << 20, "size": 512, "stream": 0}
    return {
        "allocator_settings cyclic": _snapshot([_segment()], settings=cyclic_settings()),
        "allocator_settings 1000 deep": _snapshot([_segment()], settings=deep_settings()),
        "device 2^70": _snapshot([_segment(device=2 ** 70)]),
        "device '0' (a string)": _snapshot([_segment(device="0")]),
        "segment without a device": _snapshot([_segment(device=None)]),
        "total_size negative": _snapshot([_segment(total_size=-4096)]),
        "block size negative": _snapshot([_segment(blocks=[{"address": 1 << 20, "size": -1, "state": "inactive"}])]),
        "total_size int64 max": _snapshot([_segment(total_size=2 ** 63 - 1)]),
        "entry size int64 max": _snapshot(entries=[dict(alloc, size=2 ** 63 - 1)]),
        "entry size negative": _snapshot(entries=[dict(alloc, size=-512)]),
    }


def _pickled_str(text: str) -> bytes:
    b = text.encode()
    return b"X" + len(b).to_bytes(4, "little") + b  # BINUNICODE


def deep_tuple_snapshot(path: Path, depth: int = 200_000, where: str = "filename") -> Path:
    """A snapshot whose one entry's frame `filename` (or the entry's `size`) is a tuple nested `depth` deep,
    written opcode by opcode (pickle.dumps would recurse): ~1 byte of pickle per level, and hashing or
    converting the value recursed in C until the process died (SIGSEGV, exit 139)."""
    nested = b")" + b"\x85" * depth  # EMPTY_TUPLE, then TUPLE1 around it `depth` times
    s = _pickled_str
    frame = b"}(" + s("filename") + (nested if where == "filename" else s("x.py")) + s("line") + b"K\x01" \
        + s("name") + s("f") + b"u"
    entry = b"}(" + s("action") + s("alloc") + s("addr") + b"K\x00" + s("size") \
        + (nested if where == "size" else b"K\x10") + s("stream") + b"K\x00" + s("frames") + b"]" + frame + b"au"
    path.write_bytes(b"\x80\x02}(" + s("segments") + b"]" + s("device_traces") + b"]]" + entry + b"aau.")
    return path


def codec_log_bomb(path: Path, codec: str, size: int = 72 << 20) -> Path:
    """`size` bytes of one ever-growing graph's allocation lines, compressed with `codec` (gzip, zstd, xz):
    a few hundred KB at most that decompress past the 64 MiB default (before: 2 GiB, 10 s and 500 MB per
    64 MiB of text)."""
    import lzma

    line = b"ggml_allocr_alloc: allocating t (32 bytes) - block 0\n"
    chunk = line * ((1 << 20) // len(line))
    opener = {"gzip": lambda f: gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6),
              "xz": lambda f: lzma.LZMAFile(f, "wb", preset=1),
              "zstd": lambda f: zstandard.ZstdCompressor(level=3).stream_writer(f, closefd=False)}[codec]
    with open(path, "wb") as f, opener(f) as w:
        w.write(HEADER.encode())
        for _ in range(size // len(chunk) + 1):
            w.write(chunk)
    return path


def dense_snapshot_zstd(path: Path, n_entries: int = 2_000_000) -> Path:
    """A snapshot of `n_entries` alike entries, each a dict of its own with a one-frame stack, zstd-compressed:
    the densest memory per decompressed byte (about 15 bytes per byte unpickled; 2 million: 108 MB of pickle
    in 6 MB, 1.75 GB and 21 s to import under the old 2 GiB cap)."""
    import pickle

    entries = [{"action": "alloc", "addr": 0, "size": 512, "stream": 0,
                "frames": [{"filename": "x.py", "line": 1, "name": "f"}]} for _ in range(n_entries)]
    data = pickle.dumps({"segments": [], "device_traces": [entries]}, protocol=2)
    del entries
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))
    return path


def shared_long_string_snapshot(path: Path, n_entries: int = 2000, text_len: int = 1 << 20,
                                depth: int = 4) -> Path:
    """One `text_len`-character string (pickled once: the memo shares it) as the filename of every frame;
    `n_entries` allocations, each with its own `depth`-frame stack (distinct lines). A 1 MB pickle that
    expands into n_entries x depth x text_len characters wherever stacks are written out."""
    text = "/" + "x" * (text_len - 4) + ".py"
    entries = [{"action": "alloc", "addr": 4096 * (i + 1), "size": 512, "stream": 0,
                "frames": [{"name": "f", "filename": text, "line": i * depth + k} for k in range(depth)]}
               for i in range(n_entries)]
    return write_pickle(path, _snapshot(entries=entries))


def shared_long_stack_snapshot(path: Path, n_entries: int = 300, n_frames: int = 20_000, text_len: int = 2000) -> Path:
    """One frames list of `n_frames` frames naming one `text_len`-character file (each kept whole by the
    import's 2,048-character cut) shared by `n_entries` entries: a 0.35 MB pickle whose entries page with
    frames writes n_entries x n_frames x text_len characters (300 x 20,000 x 2,000: 12 GB)."""
    text = "/" + "x" * (text_len - 4) + ".py"
    frames = [{"name": "f", "filename": text, "line": k} for k in range(n_frames)]
    entries = [{"action": "alloc", "addr": 4096 * (i + 1), "size": 512, "stream": 0, "frames": frames}
               for i in range(n_entries)]
    return write_pickle(path, _snapshot(entries=entries))


def torch_jsonl_variants(text: str) -> dict[str, tuple[str, str]]:
    """A PyTorch trace's JSON Lines export (traces/export/torch_jsonl.py) damaged in every way its reader checks:
    label -> (the damaged file's text, a piece of the one line it must be refused with)."""
    import json as _json

    lines = [_json.loads(x) for x in text.splitlines()]
    first = {t: next(k for k, d in enumerate(lines) if d["type"] == t) for t in ("device", "frame", "stack", "entry")}

    def changed(at: int, **fields) -> str:
        out = [dict(d) for d in lines]
        out[at].update(fields)
        return "".join(_json.dumps(d) + "\n" for d in out)

    def raw(replace_at: int, line: str) -> str:
        out = [_json.dumps(d) for d in lines]
        out[replace_at] = line
        return "\n".join(out) + "\n"

    dev, entry = first["device"], first["entry"]
    deep: dict = {}
    for _ in range(50):
        deep = {"x": deep}
    return {
        "version 1 (before segments)": (changed(0, version=1), "export the trace again"),
        "a newer version": (changed(0, version=99), "newer than"),
        "a ggml source in a torch file": (changed(0, source="ggml-log"), "source"),
        "a bad id": (changed(0, id="../../etc"), "id"),
        "cut inside the entries": ("".join(_json.dumps(d) + "\n" for d in lines[:entry + 5]), "ends where"),
        "a count of 10^12 entries": (changed(dev, n_entries=10 ** 12), f"expected entry {lines[dev]['n_entries']} of device 0"),
        "invalid JSON": (raw(entry + 1, '{"type": "entry", "device": 0,'), "invalid JSON"),
        "a line nested 100,000 deep": (raw(entry + 1, "[" * 100_000), "invalid JSON"),
        "a list, not an object": (raw(entry + 1, "[1, 2, 3]"), "not a JSON object"),
        "an unknown action": (changed(entry, action="explode"), "action: not one of"),
        "a negative size": (changed(entry, size=-5), "size: expected an integer"),
        "a size of 2^70": (changed(entry, size=1 << 70), "size: expected an integer"),
        "a size as text": (changed(entry, size="12"), "found '12'"),
        "an address past int64": (changed(entry, addr=1 << 64), "addr: expected an integer"),
        "a stack past the table": (changed(entry, stack=10 ** 6), "stack: expected an integer"),
        "an unknown entry field": (changed(entry, evil=1), "unknown field 'evil'"),
        "entries out of order": (changed(entry, i=7), "entry number 7"),
        "an entry of another device": (changed(entry, device=3), "line of device 3 inside device 0"),
        "a stack naming a missing frame": (changed(first["stack"], frames=[0, 10 ** 6]), "names frame"),
        "a frame name of 10,000 characters": (changed(first["frame"], name="n" * 10_000), "name"),
        "a device twice": ("".join(_json.dumps(d) + "\n" for d in lines + lines[dev:]), "after device 0"),
        "allocator_settings 50 deep": (changed(dev, extra={**lines[dev]["extra"], "allocator_settings": deep}),
                                       "allocator_settings"),
        "a rank as text": (changed(dev, extra={**lines[dev]["extra"], "rank": "0"}), "extra.rank"),
        "a plan search of numbers": (changed(0, extra={"plan_vary": {"name": "batch", "points": [1, 2]}}),
                                     "extra.plan_vary.points"),
        "an unknown trace extra": (changed(0, extra={"sweep": {"id": "x"}}), "extra.sweep"),
        "a device line missing": (raw(dev, _json.dumps({"type": "entry"})), "expected a `device` line"),
    }


def refused_import(capsys, path: Path, store: Path, *extra: str) -> str:
    """`alloctrace import PATH` refused as bad input should be: exit 2, one `alloctrace: error:` line, no
    traceback, nothing stored; the line."""
    from alloctrace.cli import main
    from alloctrace.traces.store.store import open_store

    assert main(["import", str(path), "--store", str(store), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert open_store(store).list() == []  # nothing half-stored
    return err
