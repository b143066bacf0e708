"""Read ggml AT_PRINTF logs: lines in blocks, split into graph walks, recovered, encoded.

`GgmlLogSource` is the `traces.sources` source for them (the fallback every
text input reaches last); `LogImport` is one log as a stream of graphs.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterator

import zstandard

from ...columns import EncodedGraph
from ...errors import UserError
from ...logio import LogReader
from ...schema import GraphRecord, TraceMeta
from .. import ImportedTrace
from .graph_cache import RecoveryCache
from .parse_log import AbsurdNumber, LineMemo, own
from .recover import GENERATIONS, GallocrReplay, LegacyReplay
from .split import Draft, Features, Splitter
from .split_memo import BodyMemo

MAX_BODY = 1 << 16  # lines without a `#######` line that are fed at once
HEADER = "#######"


def detect_generation(f: Features) -> str:
    """The generation a log's message formats and fingerprints point to."""
    if f.chunk:
        return "ggml-head"
    if f.offset or f.parent_line:
        return "ggml-2024-02"
    if f.addr:
        return "ggml-2023-10"
    for line in f.asserts:
        if line == 131:
            return "ggml-2023-08-16"
        if line == 139:
            return "ggml-2023-08-22"
        if line in (140, 173, 174):
            return "ggml-2023-08-28"
        if line in (148, 116, 114):
            return "ggml-2023-10"
    # a fresh 2023-08-28 allocator has only its last block, so its first choice prints -1
    return "ggml-2023-08-28" if f.first_block == -1 else "ggml-2023-08-16"


def check_generation(generation: str | None) -> str | None:
    if generation is not None and generation not in GENERATIONS:
        raise UserError(f"unknown generation {generation!r}; known: {', '.join(GENERATIONS)}")
    return generation


class LogImport:
    """One log file as a stream of GraphRecords; `generation` is known after the first graph."""

    def __init__(self, src, generation: str | None = None, progress: Callable[[], None] | None = None,
                 label: str | None = None):
        """`src` is a path or a decompressed binary stream; `label` names it in messages;
        `progress()` is called after each block of lines."""
        self.src, self.label = src, label
        self.generation = check_generation(generation)
        self.progress = progress

    def records(self) -> Iterator[GraphRecord]:
        """The graphs with their events (every graph replayed)."""
        replay = None
        for draft in self._drafts():
            replay = replay or self._replayer(self.features)
            draft.items = own(draft.items)
            yield _numbered(replay.graph(draft))
        if replay is None:
            raise UserError(f"{self.path}: no ggml-alloc trace lines found")

    def encoded(self) -> Iterator[EncodedGraph]:
        """The graphs in their stored form; identical graphs are recovered once (graph_cache.py)."""
        cache = None
        for draft in self._drafts():
            if cache is None:
                cache = self.cache = RecoveryCache(self._replayer(self.features),
                                                   zstandard.ZstdCompressor(level=3).compress, self.memo)
            yield cache.graph(draft)
        if cache is None:
            raise UserError(f"{self.path}: no ggml-alloc trace lines found")

    def _drafts(self) -> Iterator[Draft]:
        """The log's graph walks as logged; `features` is up to date when one is handed out.

        Lines are fed in bodies (the lines between `#######` lines), so a body the
        log repeats is split once (split_memo.py)."""
        with LogReader(self.src, label=self.label) as reader:
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
                draft = split.finish()
                if draft is not None:
                    yield draft
            except AbsurdNumber as e:
                raise UserError(f"{self.path}:{bodies.lineno}: number out of range: {e}") from None

    def _replayer(self, features: Features):
        if self.generation is None:
            self.generation = detect_generation(features)
        if GENERATIONS[self.generation] == "legacy":
            return LegacyReplay(self.generation, features.addr_block, features.addr)
        return GallocrReplay(self.generation)


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


def _numbered(rec: GraphRecord) -> GraphRecord:
    for ev in rec.events:
        ev.graph = rec.index
    return rec


class GgmlLogSource:
    """ggml-alloc AT_PRINTF logs of every generation (detected, or forced with `generation`)."""

    name = "ggml-log"

    def sniff(self, head: bytes) -> bool:
        return True  # the fallback: any text input is tried as a log ("no ggml-alloc trace lines" otherwise)

    def read(self, stream, *, filename: str, name: str | None, generation: str | None = None,
             progress: Callable[[], None] | None = None) -> list[ImportedTrace]:
        imp = LogImport(stream, generation, progress, label=filename)
        records = imp.encoded()
        first = next(records)  # raises the file's UserError, or "no trace lines"
        meta = TraceMeta(name=name or filename, source=self.name, generation=imp.generation,
                         profile=imp.generation, extra={"format": "at_printf", "file": filename})
        return [ImportedTrace(meta, itertools.chain([first], records))]
