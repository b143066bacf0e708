"""Read ggml AT_PRINTF logs: lines in blocks, split into graph walks, recovered, encoded.

`GgmlLogSource` is the `traces.sources` source for them (the fallback every
text input reaches last); `LogImport` is one log as a stream of graphs.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterator

from alloctrace.allocator.events import Event
from alloctrace.allocator.profiles import PROFILES, names

from ...bounded_io import Limits
from ...columns import EncodedGraph, compressor as _compressor
from ...errors import UserError
from ...logio import LogReader
from ...schema import TraceMeta
from ..base import ImportedTrace
from . import fastlog
from .drafts import Draft, Features

# The Python path's modules (parse_log, split, split_memo, recover, graph_cache) are imported where it
# starts: an import the compiled fast path takes does without them.

MAX_BODY = 1 << 16  # lines without a `#######` line that are fed at once
HEADER = "#######"


def log_style(f: Features) -> str:
    """How the log's allocating lines look (Profile.log_style)."""
    return "chunk" if f.chunk else "offset" if (f.offset or f.parent_line) else "addr" if f.addr else "block"


def detect_generation(f: Features, first: Draft | None = None) -> str:
    """The generation (PROFILES row) a log's message style and fingerprints point to; `first` is the
    log's first graph walk (its allocation sizes are padded to the generation's alignment). Where
    several fit, the newest (see `generation_candidates`)."""
    return generation_candidates(f, first)[0]


def generation_candidates(f: Features, first: Draft | None = None) -> list[str]:
    """Every generation the log fits, newest first: one name when its lines tell."""
    events = [e for e in first.items if isinstance(e, Event)] if first else []
    sizes = [e.size for e in events if e.kind == "alloc" and e.size]
    rows = [p for p in PROFILES.values() if p.log_style == log_style(f)]
    for line in f.asserts:
        for p in rows:
            if line in p.assert_lines:
                return [p.name]
    if len({p.alignment for p in rows}) > 1:  # sizes are padded to the generation's alignment
        fits = [p for p in rows if sizes and all(s % p.alignment == 0 for s in sizes)]
        if not fits:
            return [rows[-1].name]
        rows = fits
    if len(rows) > 1 and _leaf_after_node(events):  # data-less leafs just before their first user
        rows = [p for p in rows if not p.leafs_first] or rows
    # a fresh allocator with a last-block fallback has only its last block, so its first choice prints -1
    skips_last = f.first_block == -1
    rows = [p for p in rows if p.best_fit_skips_last == skips_last] or rows
    return [p.name for p in reversed(rows)]


def _leaf_after_node(events: list) -> bool:
    """A tensor the walk never executes (a leaf) allocated after one it does: ggml before 2025-09
    (which allocates every data-less leaf first)."""
    executed = {e.tensor for e in events if e.kind == "exec"}
    node_seen = False
    for e in events:
        if e.kind == "alloc":
            if e.tensor in executed:
                node_seen = True
            elif node_seen:
                return True
    return False


AMBIGUITY = {  # what tells two generations apart that a log may not show
    frozenset({"ggml-2024-02", "ggml-2025-09"}):
        "ggml-2024-02 pads to 64 bytes and its CPU buffer is max_size + 64, ggml-2025-09 pads to 32 and its "
        "buffer is max_size; this log's sizes are all multiples of 64 and no leaf is allocated after a node",
    frozenset({"ggml-2023-08-22", "ggml-2023-08-28"}):
        "ggml-2023-08-22 walks a parse_seq as a pure reorder with immediate frees, ggml-2023-08-28 defers frees "
        "to its -1 barriers; only an out-of-space assert's line (139 or 140) tells them apart",
    frozenset({"ggml-2026-08-21", "ggml-head"}):
        "ggml-head (ggml 0.25.3) lets CLAMP reuse its parent, ggml-2026-08-21 (ggml 0.21.0) makes it a view; "
        "the logs look the same",
}


def ambiguity_note(candidates: list[str]) -> str | None:
    """One line naming the candidates and what differs, or None when there is one."""
    if len(candidates) < 2:
        return None
    why = AMBIGUITY.get(frozenset(candidates[:2]), "their logs look the same")
    return (f"the log fits {' and '.join(candidates)}: read as {candidates[0]} (the newer); {why}; "
            f"--generation decides")


def check_generation(generation: str | None) -> str | None:
    if generation is not None and generation not in PROFILES:
        raise UserError(f"unknown generation {generation!r}; known: {names()}")
    return generation


class LogImport:
    """One log file as a stream of encoded graphs; `generation` and `features` are known after the first
    graph (the features as they were when the first graph walk ended; the Python path goes on updating them)."""

    def __init__(self, src, generation: str | None = None, progress: Callable[[], None] | None = None,
                 label: str | None = None, limits: Limits | None = None):
        """`src` is a path or a decompressed binary stream; `label` names it in messages;
        `progress()` is called after each block of lines; `limits` are the import's caps (the
        caller's, not the defaults, when it gave some)."""
        self.src, self.label, self.limits = src, label, limits
        self.generation = check_generation(generation)
        self.progress = progress
        self.candidates: list[str] = []  # the generations detection found the log to fit (newest first)
        self.fast = False  # the compiled fast path imported the log
        self.declined: str | None = None  # why the fast path did not

    def encoded(self) -> Iterator[EncodedGraph]:
        """The graphs in their stored form: the compiled fast path's (fastlog.py) where it covers the
        log, else the Python path's, where identical graphs are recovered once (graph_cache.py)."""
        handed_out = 0
        if fastlog.library() is not None:
            again = fastlog.Replayable(self.src)
            try:
                for g in fastlog.fast_graphs(self, again.stream):
                    yield g
                    handed_out += 1
                self.fast = True
                again.close()
                return
            except fastlog.Declined as e:
                fastlog.debug(__name__, "%s: the fast path declined (%s); importing on the Python path", self.label, e)
                self.declined = str(e)
                self.src = again.rewound()
        graphs = self._python_graphs()
        for _ in range(handed_out):  # the fast path handed these out already (the same graphs)
            next(graphs)
        yield from graphs

    def _python_graphs(self) -> Iterator[EncodedGraph]:
        from .graph_cache import RecoveryCache

        cache = None
        for draft in self._drafts():
            if cache is None:
                cache = self.cache = RecoveryCache(self._replayer(self.features, draft), _compressor(), self.memo)
            yield _marked(cache.graph(draft), draft)
        if cache is None:
            raise UserError(f"{self.path}: no ggml-alloc trace lines found")

    def _drafts(self) -> Iterator[Draft]:
        """The log's graph walks as logged; `features` is up to date when one is handed out.

        Lines are fed in bodies (the lines between `#######` lines), so a body the
        log repeats is split once (split_memo.py)."""
        from .parse_log import AbsurdNumber, LineMemo
        from .split import Splitter
        from .split_memo import BodyMemo

        with LogReader(self.src, label=self.label, limits=self.limits) as reader:
            self.path = reader.path
            split = Splitter()
            parse = self.memo = LineMemo()
            self.features = split.features
            bodies = self.bodies = BodyMemo(split, parse)
            feed_body, feed = bodies.feed, split.feed
            body: list[str] = []
            try:
                for block in reader.blocks():
                    start = 0
                    for h in _header_lines(block):
                        body += block[start:h]
                        yield from feed_body(body)
                        body = []
                        bodies.lineno += 1
                        draft = feed(parse(block[h]))
                        if draft is not None:
                            yield draft
                        start = h + 1
                    body += block[start:]
                    if len(body) > MAX_BODY:
                        yield from feed_body(body)
                        body = []
                    if self.progress:
                        self.progress()
                yield from feed_body(body)
                walk_ended = split.gap  # program output came after the last walk's allocator lines
                draft = split.finish()
                if draft is not None:
                    last = draft.items[-1]
                    failed = type(last) is Event and last.kind in ("oom", "abort")  # a failure ends a walk
                    draft.incomplete = not (walk_ended or failed)
                    yield draft
            except AbsurdNumber as e:
                raise UserError(f"{self.path}:{bodies.lineno}: number out of range: {e}") from None

    def _replayer(self, features: Features, first: Draft):
        from .recover import GallocrReplay, LegacyReplay

        if self.generation is None:
            self.candidates = generation_candidates(features, first)
            self.generation = self.candidates[0]
        if PROFILES[self.generation].family == "legacy":
            return LegacyReplay(self.generation, features.addr_block, features.addr)
        return GallocrReplay(self.generation)


def _marked(g, draft: Draft):
    """A graph whose walk the log does not finish says so (`extra.incomplete`, summary `complete`)."""
    if draft.incomplete:
        g.extra = {**g.extra, "incomplete": True}
    return g


def _header_lines(block: list[str]) -> list[int]:
    """Indices of the lines that start with `#######`, found in C over the joined block."""
    found = [0] if block and block[0].startswith(HEADER) else []
    text = "\n".join(block)
    at, line, pos = 0, 0, text.find("\n" + HEADER)
    while pos >= 0:
        line += text.count("\n", at, pos + 1)
        found.append(line)
        at = pos + 1
        pos = text.find("\n" + HEADER, at)
    return found


class GgmlLogSource:
    """ggml-alloc AT_PRINTF logs of every generation (detected, or forced with `generation`)."""

    name = "ggml-log"

    def sniff(self, head: bytes) -> bool:
        return True  # the fallback: any text input is tried as a log ("no ggml-alloc trace lines" otherwise)

    def read(self, stream, *, filename: str, name: str | None, generation: str | None = None,
             progress: Callable[[], None] | None = None, limits: Limits | None = None) -> list[ImportedTrace]:
        imp = LogImport(stream, generation, progress, label=filename, limits=limits)
        records = imp.encoded()
        first = next(records)  # raises the file's UserError, or "no trace lines"
        extra = {"format": "at_printf", "file": filename}
        note = ambiguity_note(imp.candidates)
        if note:  # the log cannot tell these generations apart
            extra["generation_candidates"], extra["generation_note"] = imp.candidates, note
        if imp.features.setup_allocs:  # the program's own buffers (weights, KV cache), before any graph walk
            extra["setup_allocations"] = imp.features.setup_allocs
        meta = TraceMeta(name=name or filename, source=self.name, generation=imp.generation,
                         profile=imp.generation, extra=extra)
        return [ImportedTrace(meta, itertools.chain([first], records))]
