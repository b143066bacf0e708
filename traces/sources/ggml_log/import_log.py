"""Read ggml AT_PRINTF logs: lines in blocks, split into graph walks, recovered, encoded.

`GgmlLogSource` is the `traces.sources` source for them (the fallback every
text input reaches last); `LogImport` is one log as a stream of graphs.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterator

from alloctrace.allocator.events import Event
from alloctrace.allocator.profiles import PROFILES, names

from alloctrace.traces.sources.bounded_io import Limits
from alloctrace.traces.store.columns import EncodedGraph, compressor as _compressor
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.logio import LogReader
from alloctrace.traces.store.schema import TraceMeta
from alloctrace.traces.sources.base import ImportedTrace
from alloctrace.traces.sources.ggml_log import fastlog
from alloctrace.traces.sources.ggml_log.drafts import Draft, Features
from alloctrace.traces.sources.ggml_log.detect import (  # noqa: F401 (detect_generation, log_style: for readers)
    ambiguity_note, detect_generation, generation_candidates, log_style)

# The Python path's modules (parse_log, split, split_fast, recover, recover_fast) are imported where it
# starts: an import the compiled fast path takes does without them.

MAX_BODY = 1 << 16  # lines without a `#######` line that are fed at once
HEADER = "#######"


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
        log, else the Python path's, where identical graphs are recovered once (recover_fast.py)."""
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
        from alloctrace.traces.sources.ggml_log.recover_fast import RecoveryCache

        cache = other = None
        for draft in self._drafts():
            if cache is None:
                cache = self.cache = RecoveryCache(self._replayer(self.features, draft), _compressor(), self.memo)
                if len(self.candidates) > 1 and PROFILES[self.generation].log_style != "block":
                    other = RecoveryCache(self._replayer_of(self.candidates[1], self.features), _compressor(),
                                          self.memo)
            g = cache.graph(draft)
            if other is not None:
                g = with_other_reading(g, other.graph(draft), self.generation, self.candidates[1])
            yield _marked(g, draft)
        if cache is None:
            raise UserError(f"{self.path}: no ggml-alloc trace lines found")

    def _drafts(self) -> Iterator[Draft]:
        """The log's graph walks as logged; `features` is up to date when one is handed out.

        Lines are fed in bodies (the lines between `#######` lines), so a body the
        log repeats is split once (split_fast.py)."""
        from alloctrace.traces.sources.ggml_log.parse_log import AbsurdNumber, LineMemo
        from alloctrace.traces.sources.ggml_log.split import Splitter
        from alloctrace.traces.sources.ggml_log.split_fast import BodyMemo

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
        from alloctrace.traces.sources.ggml_log.recover import GallocrReplay, LegacyReplay

        if self.generation is None:
            self.candidates = generation_candidates(features, first)
            self.generation = self.candidates[0]
        return self._replayer_of(self.generation, features)

    @staticmethod
    def _replayer_of(generation: str, features: Features):
        from alloctrace.traces.sources.ggml_log.recover import GallocrReplay, LegacyReplay

        if PROFILES[generation].family == "legacy":
            return LegacyReplay(generation, features.addr_block, features.addr)
        return GallocrReplay(generation)


def with_other_reading(g: EncodedGraph, alt: EncodedGraph, generation: str, other: str) -> EncodedGraph:
    """A graph of a log two generations fit, read as `generation`, with what reading it as `other` changes:
    where that reading is consistent too and its sizes differ, the graph's sizes are exact only up to the
    difference (`uncertainty_bytes`, and `reason` names both readings and what would tell them apart).
    Only the log-style the compiled fast path never reads is read twice (its graphs stay byte-identical)."""
    if not alt.consistent:
        return g  # the log does not fit the other generation after all (for this graph)
    diffs = [abs(a - b) for a, b in ((g.max_size, alt.max_size), (g.buffer_size, alt.buffer_size))
             if a is not None and b is not None]
    d = max(diffs, default=0)
    if not d:
        return g
    why = (f"{ambiguity_note([generation, other])}; read as {other}: max_size {_num(alt.max_size)}, "
           f"buffer {_num(alt.buffer_size)}")
    old = g.extra.get("uncertainty_bytes") or 0
    reason = why if not old else f"{g.extra.get('reason')}; and {why}"
    g.extra = {**g.extra, "uncertainty_bytes": old + d, "reason": reason}
    return g


def _num(n) -> str:
    return "-" if n is None else f"{n:,}"


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
