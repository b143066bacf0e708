"""Import AT_PRINTF logs into the store: read, split into graphs, recover, store atomically.

`import_paths` is what the CLI and the HTTP server call; each file becomes one
trace, and a failure on any file leaves the store as it was.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import zstandard

from alloctrace.allocator.events import Event
from alloctrace.errors import UserError
from alloctrace.gcpause import gc_paused

from .bounded_io import Limits, capped_graphs
from .columns import EncodedGraph
from .graph_cache import RecoveryCache
from .logio import LogReader, check_path
from .parse_log import AbsurdNumber, LineMemo, own
from .progress import Progress
from .recover import GENERATIONS, GallocrReplay, LegacyReplay
from .schema import GraphRecord, TraceMeta
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

    def __init__(self, path, generation: str | None = None, progress: bool = False, limits: Limits | None = None):
        self.path = check_path(path)
        self.generation = check_generation(generation)
        self.progress = progress
        self.limits = limits or Limits.from_env()
        self.truncated = False  # a truncated compressed stream was salvaged

    def records(self) -> Iterator[GraphRecord]:
        """The graphs with their events (every graph replayed)."""
        replay = None
        for draft in self._drafts():
            replay = replay or self._replayer(self.features)
            draft.items = own(draft.items)
            yield _numbered(_marked(replay.graph(draft), draft))
        if replay is None:
            raise UserError(f"{self.path}: no ggml-alloc trace lines found")

    def encoded(self) -> Iterator[EncodedGraph]:
        """The graphs in their stored form; identical graphs are recovered once (graph_cache.py)."""
        cache = None
        for draft in self._drafts():
            if cache is None:
                cache = self.cache = RecoveryCache(self._replayer(self.features),
                                                   zstandard.ZstdCompressor(level=3).compress, self.memo)
            yield _marked(cache.graph(draft), draft)
        if cache is None:
            raise UserError(f"{self.path}: no ggml-alloc trace lines found")

    def _drafts(self) -> Iterator[Draft]:
        """The log's graph walks as logged; `features` is up to date when one is handed out.

        Lines are fed in bodies (the lines between `#######` lines), so a body the
        log repeats is split once (split_memo.py)."""
        with LogReader(self.path, self.limits) as reader, gc_paused():
            bar = Progress(reader.size, self.path.name, enabled=None if self.progress else False)
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
                    bar.update(reader.position)
                yield from feed_body(body)
                walk_ended = split.gap  # program output came after the last walk's allocator lines
                draft = split.finish()
                self.truncated = reader.truncated
                if draft is not None:
                    last = draft.items[-1]
                    failed = type(last) is Event and last.kind in ("oom", "abort")  # a failure ends a walk
                    draft.incomplete = reader.truncated or not (walk_ended or failed)
                    yield draft
            except AbsurdNumber as e:
                raise UserError(f"{self.path}:{bodies.lineno}: number out of range: {e}") from None
            finally:
                bar.close()

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


def _marked(g, draft: Draft):
    """A graph whose walk the log does not finish says so (`extra.incomplete`, summary `complete`)."""
    if draft.incomplete:
        g.extra = {**g.extra, "incomplete": True}
    return g


def _numbered(rec: GraphRecord) -> GraphRecord:
    for ev in rec.events:
        ev.graph = rec.index
    return rec


def parse_file(path, name: str | None = None, generation: str | None = None, progress: bool = False,
               limits: Limits | None = None, source: str = "log", label: str | None = None) \
        -> tuple[TraceMeta, list]:
    """One log (or JSON Lines export) parsed completely into its stored form, within `limits`,
    before any store lock is taken: the encoded graphs are compact. `label` names the file in
    the trace's source and in errors (an upload's client-side name)."""
    limits = limits or Limits.from_env()
    p = Path(path)
    label = label or p.name
    size = p.stat().st_size
    if _is_jsonl_export(path, limits):
        from .export import read_jsonl

        with LogReader(path, limits) as reader:
            meta, graphs = read_jsonl(reader.lines(), filename=label)
            graphs = list(capped_graphs(graphs, limits, size, label))
        if name:
            meta.name = name
        return meta, graphs
    imp = LogImport(path, generation, progress, limits)
    with gc_paused():  # many small parsed objects, no cycles
        graphs = list(capped_graphs(imp.encoded(), limits, size, label))
    extra = {"format": "at_printf"}
    if imp.truncated:
        extra["truncated"] = True
    meta = TraceMeta(name=name or label, source=f"{source}:{label}", generation=imp.generation,
                     profile=imp.generation, extra=extra)
    return meta, graphs


def import_file(store, path, name: str | None = None, generation: str | None = None,
                progress: bool = False, limits: Limits | None = None) -> str:
    """Import one log as one trace; returns its id. Nothing is stored if anything fails, and the
    store's write lock is held only for the final write."""
    meta, graphs = parse_file(path, name, generation, progress, limits)
    return store.add_trace(meta, graphs)


def _is_jsonl_export(path, limits: Limits | None = None) -> bool:
    with LogReader(path, limits) as reader:
        for line in reader.lines():
            if line.strip():
                return line.lstrip().startswith('{"type": "trace"')
    return False


def import_paths(store, paths, name: str | None = None, generation: str | None = None,
                 progress: bool = False, limits: Limits | None = None) -> list[str]:
    """Import each file (plain, gzip or zstd) as one trace; all or nothing across files."""
    check_generation(generation)
    paths = [check_path(p) for p in paths]
    if not paths:
        raise UserError("no files to import")
    done: list[str] = []
    try:
        for i, p in enumerate(paths):
            label = name if name is None or len(paths) == 1 else f"{name} ({i + 1})"
            done.append(import_file(store, p, label, generation, progress, limits))
    except BaseException:
        for tid in done:
            store.delete(tid)
        raise
    return done
