"""The compiled fast path of a ggml log import (fastlog.c), for the logs it covers.

`fast_graphs(imp)` yields what `LogImport.encoded()` would, graph for graph, byte for byte, for
legacy ggml_allocr logs (the "block" log style of Aug 2023); for anything else the C side
DECLINES and `Declined` is raised, possibly after some graphs were handed out: the caller then
imports the input again on the Python path (`rewound()` gives the input back from its start) and
skips the graphs already handed out. tests/sources/test_fastlog.py checks both paths store the same bytes.

The library is built with the system C compiler at install time and loaded only from the package
(traces/util/cbuild.py); without it, or with ALLOCTRACE_PURE_PYTHON=1, the Python path runs alone.
"""
from __future__ import annotations

import codecs
import ctypes
import io
import os
import tempfile
import zlib
from pathlib import Path

from alloctrace.allocator.profiles import PROFILES

from alloctrace.traces.util.cbuild import InstalledLibrary
from alloctrace.traces.store.columns import EncodedGraph, STR_FIELDS, compressor
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.logio import LogReader, _why

SOURCE = Path(__file__).with_name("fastlog.c")
TEXT_BLOCK = 1 << 18  # decoded characters handed to C at a time (its graphs are replayed while still in cache)
SPOOL_IN_MEMORY = 32 << 20  # bytes of a one-pass input kept in memory for a second pass (then on disk)
INT_COLUMNS = ("size", "offset", "addr", "chunk", "buffer", "block", "n_free", "largest_free", "total_free",
               "n_free_before", "children", "views", "allocated", "needed", "largest", "node")
COLUMNS = INT_COLUMNS + STR_FIELDS + ("srcs", "extra")  # fastlog.c's column order (columns.encode's, less graph)
DTYPE = {1: "|i1", 2: "<i2", 4: "<i4", 8: "<i8"}
TUNE: tuple | None = None  # (column bytes kept, cache words kept, memo lines kept): smaller limits for tests


def debug(logger: str, msg: str, *args) -> None:
    """A debug line on `logger`; logging is imported only when there is one to write (an import that
    takes the fast path needs none)."""
    import logging
    logging.getLogger(logger).debug(msg, *args)


class Declined(Exception):
    """The fast path does not cover this input (the reason says where and why)."""


class GraphOut(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("n", "index", "max_size", "buffer_size", "oom_needed",
                                                   "oom_largest", "incomplete")] + \
               [(name, ctypes.c_int32) for name in ("role", "consistent", "has_buffer", "has_oom", "oom_has_tensor",
                                                   "pad")] + \
               [("oom_tensor", ctypes.c_void_p), ("oom_tensor_len", ctypes.c_int64),
                ("cols", ctypes.c_void_p * len(COLUMNS)), ("itemsize", ctypes.c_int64 * len(COLUMNS)),
                ("table", ctypes.c_void_p), ("table_len", ctypes.c_int64),
                ("slot", ctypes.c_int64), ("hit", ctypes.c_int64), ("epoch", ctypes.c_int64),
                ("same", ctypes.c_int64 * (len(COLUMNS) + 1)), ("blob", ctypes.c_int64 * len(COLUMNS)),
                ("seen", ctypes.c_int64 * len(COLUMNS)), ("seen_epoch", ctypes.c_int64)]


# where GraphOut's fields (and arrays) start, in 8-byte words
N, INDEX, MAX_SIZE, BUFFER_SIZE, OOM_NEEDED, OOM_LARGEST, INCOMPLETE, OOM_TENSOR, OOM_TENSOR_LEN, COLS, ITEMSIZE, \
    TABLE, TABLE_LEN, SLOT, HIT, EPOCH, SAME, BLOB, SEEN, SEEN_EPOCH = (
        getattr(GraphOut, name).offset // 8 for name in (
            "n", "index", "max_size", "buffer_size", "oom_needed", "oom_largest", "incomplete", "oom_tensor",
            "oom_tensor_len", "cols", "itemsize", "table", "table_len", "slot", "hit", "epoch", "same", "blob",
            "seen", "seen_epoch"))

SYMBOLS = ("fl_sizeof", "fl_new", "fl_free", "fl_release", "fl_reason", "fl_feed", "fl_queued", "fl_features",
           "fl_configure", "fl_next", "fl_tune")  # each one library() binds
def _bind(lib):
    """The library's functions given their C types."""
    lib.fl_new.restype = ctypes.c_void_p
    lib.fl_free.argtypes = [ctypes.c_void_p]
    lib.fl_release.argtypes = [ctypes.c_void_p]
    lib.fl_reason.restype = ctypes.c_char_p
    lib.fl_reason.argtypes = [ctypes.c_void_p]
    lib.fl_feed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int]
    lib.fl_queued.argtypes = [ctypes.c_void_p]
    lib.fl_queued.restype = ctypes.c_int64
    lib.fl_features.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64]
    lib.fl_features.restype = ctypes.c_int64
    lib.fl_configure.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    lib.fl_next.argtypes = [ctypes.c_void_p, ctypes.POINTER(GraphOut)]
    lib.fl_tune.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    return lib


_FAST = InstalledLibrary(SOURCE, "fastlog", SYMBOLS, ("fl_sizeof", {"GraphOut": GraphOut}), _bind, "ggml logs",
                         on_untrusted=lambda why: debug(__name__, "fast log import unavailable: %s", why))
library = _FAST.get               # the bound library, or None (not built at install time, a failed check,
unavailable = _FAST.unavailable   # ALLOCTRACE_PURE_PYTHON=1); unavailable() says why
path_line = _FAST.path_line       # which path reads ggml logs, in words (`import --verbose`)


class Replayable:
    """An input the Python path can read again from its start: a path, a seekable stream (seeked
    back), or a one-pass stream whose bytes are kept (in memory, then on disk) as they are read."""

    def __init__(self, src):
        self.src, self.start, self.spool = src, None, None
        if isinstance(src, (str, os.PathLike)):
            self.stream = src
            return
        try:
            if src.seekable():
                self.start, self.stream = src.tell(), src
                return
        except (OSError, ValueError, AttributeError):
            pass
        self.spool = tempfile.SpooledTemporaryFile(SPOOL_IN_MEMORY)
        self.stream = io.BufferedReader(_Recording(src, self.spool), 1 << 16)

    def close(self):
        """Let go of the kept bytes (once the fast path imported the input)."""
        if self.spool is not None:
            self.spool.close()
            self.spool = None

    def rewound(self):
        """The input again, from where it started."""
        if self.start is not None:
            self.src.seek(self.start)
            return self.src
        if self.spool is not None:
            self.spool.seek(0)
            return io.BufferedReader(_Chain(self.spool, self.src), 1 << 16)
        return self.src


class _Recording(io.RawIOBase):
    def __init__(self, src, spool):
        self.src, self.spool = src, spool

    def readable(self):
        return True

    def readinto(self, b):
        data = self.src.read(len(b))
        self.spool.write(data)
        b[:len(data)] = data
        return len(data)


class _Chain(io.RawIOBase):
    """The spooled bytes, then the rest of the one-pass stream."""

    def __init__(self, first, rest):
        self.first, self.rest = first, rest

    def readable(self):
        return True

    def readinto(self, b):
        data = self.first.read(len(b)) if self.first is not None else b""
        if not data:
            if self.first is not None:
                self.first.close()
                self.first = None
            data = self.rest.read(len(b))
        b[:len(data)] = data
        return len(data)


def fast_graphs(imp, src):
    """EncodedGraphs of LogImport `imp` over `src` (a path or stream), as the Python path gives them;
    sets imp.path, imp.features and imp.generation as it does. Raises Declined."""
    lib = library()
    if lib is None:
        raise Declined("no fast path library")
    from alloctrace.traces.sources.ggml_log.drafts import Features
    from alloctrace.traces.sources.ggml_log.detect import generation_candidates

    st = lib.fl_new()
    out = GraphOut()
    words = memoryview(out).cast("B").cast("q")  # GraphOut's 8-byte words, read at once (not field by field)
    imp.fast_hits, imp.fast_restarts = 0, (0, 0)  # graphs the recovery cache served; how often the memos started over
    if TUNE is not None:
        lib.fl_tune(st, *TUNE)
    try:
        encoder = _Encoder()
        configured = False
        with LogReader(src, label=imp.label, limits=imp.limits) as reader:
            imp.path = reader.path
            final = False
            for data in _utf8_text(reader):
                final = not data
                if lib.fl_feed(st, data, len(data), final) < 0:
                    raise Declined(lib.fl_reason(st).decode())
                if not configured and lib.fl_queued(st):
                    imp.features, imp.generation, imp.candidates = _configure(lib, st, imp.generation,
                                                                              generation_candidates, Features)
                    configured = True
                while configured:
                    got = lib.fl_next(st, ctypes.byref(out))
                    if got < 0:
                        raise Declined(lib.fl_reason(st).decode())
                    if not got:
                        break
                    w = words.tolist()
                    imp.fast_hits += w[HIT]
                    imp.fast_restarts = (w[EPOCH], w[SEEN_EPOCH])  # how often the two memos started over
                    g = encoder.graph(out, w)
                    lib.fl_release(st)  # a long walk's buffers are not held while the caller stores it
                    yield g
                if imp.progress and not final:
                    imp.progress()
        if not configured:
            raise Declined("no graph walks")  # the Python path says what is wrong
    finally:
        lib.fl_free(st)


def _utf8_text(reader):
    """The input's text as LogReader.text decodes it (UTF-8, bad bytes replaced, universal newlines),
    re-encoded as UTF-8, in blocks; b"" at the end. Blocks of plain ASCII without a carriage return
    are that text already and skip the decoder."""
    read = reader.binary.read
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(errors="replace"), True)
    clean = decoder.getstate()
    while True:
        try:
            raw = read(TEXT_BLOCK)
            if raw and raw.isascii() and b"\r" not in raw and decoder.getstate() == clean:
                yield raw
                continue
            text = decoder.decode(raw, final=not raw)
        except (EOFError, OSError, zlib.error) as e:  # LogReader.blocks' message
            raise UserError(f"{reader.path}: truncated or corrupt {reader.kind} data ({_why(e)})") from None
        if text:
            yield text.encode()
        if not raw:
            yield b""
            return


def _configure(lib, st, generation, generation_candidates, Features):
    """The generation (detected from the features as they were when the first walk ended, or forced)
    and the candidates detection found."""
    buf = (ctypes.c_int64 * 80)()
    k = lib.fl_features(st, buf, 80)
    has_first, first_block, setup_allocs, n_asserts = buf[0], buf[1], buf[2], buf[3]
    features = Features(first_block=first_block if has_first else None, asserts=list(buf[4:4 + n_asserts]),
                        setup_allocs=setup_allocs)
    assert k == 4 + n_asserts
    if generation is None:
        block_rows = [p for p in PROFILES.values() if p.log_style == "block"]
        if len({p.alignment for p in block_rows}) > 1:  # detection would read the first walk's sizes
            raise Declined("generation detection needs the first walk's sizes")
        candidates = generation_candidates(features, None)
        generation = candidates[0]
    else:
        candidates = []
    p = PROFILES[generation]
    if p.family != "legacy":
        raise Declined(f"{generation} is not a legacy generation")
    aligns = (ctypes.c_int64 * len(p.alignments))(*p.alignments)
    lib.fl_configure(st, int(p.best_fit_skips_last), p.max_free_blocks, p.backend_alignment, p.backend_slack, aligns,
                     len(p.alignments))
    return features, generation, candidates


class _Encoder:
    """Graphs in their stored form. A graph the C side recovered before (its cache slot) reuses that
    graph's parts; a column C flags as equal to the previous graph's, or as bytes it numbered before,
    reuses their compressed bytes."""

    def __init__(self):
        self.compress = compressor()
        self.slots: dict[int, tuple] = {}
        self.epoch = self.seen_epoch = None
        self.packed: dict[int, bytes] = {}  # compressed column bytes by C's number for them
        self.prev: list = [None] * (len(COLUMNS) + 1)  # the previous encoded graph's blobs, by column

    def graph(self, out: GraphOut, w: list) -> EncodedGraph:
        """The graph C handed over in `out`, whose 8-byte words are `w`."""
        n, index = w[N], w[INDEX]
        if w[EPOCH] != self.epoch:  # the C side's cache started over
            self.slots.clear()
            self.epoch = w[EPOCH]
        if w[HIT]:
            parts = self.slots[w[SLOT]]
        else:
            parts = self.slots[w[SLOT]] = self._parts(out, w)
        role, max_size, buffer_size, oom, consistent, strings, blobs = parts
        if n:  # the graph's index in every row (columns.constant_column), without numpy
            size = 1 if index < 1 << 7 else 2 if index < 1 << 15 else 4 if index < 1 << 31 else 8
            blobs = [("graph", DTYPE[size], self.compress(index.to_bytes(size, "little") * n))] + blobs
        return EncodedGraph(index=index, role=role, n_events=n, max_size=max_size, buffer_size=buffer_size,
                            oom=None if oom is None else dict(oom), consistent=consistent, strings=strings,
                            blobs=blobs, extra={"incomplete": True} if w[INCOMPLETE] else {})

    def _parts(self, out: GraphOut, w: list) -> tuple:
        if w[SEEN_EPOCH] != self.seen_epoch:  # C's numbers for column bytes started over
            self.packed.clear()
            self.seen_epoch = w[SEEN_EPOCH]
        n, at, prev, packed, compress = w[N], ctypes.string_at, self.prev, self.packed, self.compress
        blobs = []
        for i, name in enumerate(COLUMNS):
            size = w[ITEMSIZE + i]
            if size:
                if w[SAME + i]:
                    blob = prev[i]
                else:
                    number = w[BLOB + i]
                    data = packed.get(number) if w[SEEN + i] else None
                    if data is None:
                        data = compress(at(w[COLS + i], size * n))
                        if number >= 0:
                            packed[number] = data
                    blob = (name, DTYPE[size], data)
                blobs.append(blob)
                prev[i] = blob
        strings = prev[-1] = prev[-1] if w[SAME + len(COLUMNS)] else compress(at(w[TABLE], w[TABLE_LEN]))
        oom = None
        if out.has_oom:
            tensor = at(w[OOM_TENSOR], w[OOM_TENSOR_LEN]).decode() if out.oom_has_tensor else None
            oom = {"tensor": tensor, "needed": w[OOM_NEEDED], "largest_available": w[OOM_LARGEST]}
        return ("eval" if out.role else "measure", w[MAX_SIZE], w[BUFFER_SIZE] if out.has_buffer else None, oom,
                bool(out.consistent), strings, blobs)
