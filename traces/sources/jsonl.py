"""Our own JSON Lines export (traces/export/ggml.py writes it) read back as a trace, losslessly."""
from __future__ import annotations

import json
from typing import Iterator

from alloctrace.allocator.events import Event

from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.bounded_io import Limits
from alloctrace.traces.sources.logio import LogReader
from alloctrace.traces.store.schema import FORMAT_VERSION, GraphRecord, TraceMeta
from alloctrace.traces.sources.base import ImportedTrace
from alloctrace.traces.sources.sniffers import JSONL_HEADER

HEADER = JSONL_HEADER


class JsonlSource:
    name = "jsonl"

    def sniff(self, head: bytes) -> bool:
        return HEADER.match(head) is not None

    def read(self, stream, *, filename: str, name: str | None, limits: Limits | None = None) -> list[ImportedTrace]:
        reader = LogReader(stream, label=filename, limits=limits)  # bounded line length; closed with the stream
        meta, graphs = read_jsonl(reader.lines(), filename)
        if name:
            meta.name = name
        return [ImportedTrace(meta, graphs)]


SOURCE = JsonlSource()


def read_jsonl(lines, filename: str = "input") -> tuple[TraceMeta, Iterator[GraphRecord]]:
    """A JSON Lines export as what `Store.add_trace` takes; graphs are read one at a time.
    Every line is checked against the one schema the API shares (records.py); a bad one is a
    `filename:LINE:` error."""
    from alloctrace.traces.store.records import TraceLine  # pydantic: loaded when a JSON Lines input is read, not by every import
    numbered = enumerate(lines, 1)
    for n, line in numbered:
        if line.strip():
            d = _json(line, n, filename)
            if d.get("type") != "trace" or not isinstance(d.get("version"), int):
                break
            if d["version"] > FORMAT_VERSION:
                raise UserError(f"{filename}:{n}: trace format {d['version']} is newer than {FORMAT_VERSION}")
            h = _valid(TraceLine, d, n, filename)
            meta = TraceMeta(name=h.name, source=h.source, generation=h.generation, profile=h.profile,
                             created=h.created, tags=h.tags, extra=h.extra, id=h.id)
            return meta, _graphs(numbered, filename)
        break
    raise UserError(f"{filename}: not an alloctrace JSON Lines trace (no trace header)")


def _graphs(numbered, filename: str) -> Iterator[GraphRecord]:
    from alloctrace.traces.store.records import EventLine, GraphLine
    g = None
    seen: set[int] = set()
    for n, line in numbered:
        if not line.strip():
            continue
        d = _json(line, n, filename)
        t = d.get("type")
        if t == "graph":
            if g is not None:
                yield g
            gl = _valid(GraphLine, d, n, filename)
            if gl.index in seen:
                raise UserError(f"{filename}:{n}: duplicate graph index {gl.index}")
            seen.add(gl.index)
            extra = dict(gl.extra)
            if not gl.complete:
                extra["incomplete"] = True
            g = GraphRecord(index=gl.index, role=gl.role, events=[], max_size=gl.max_size,
                            buffer_size=gl.buffer_size, oom=None if gl.oom is None else gl.oom.model_dump(),
                            consistent=gl.consistent, extra=extra)
        elif t == "event" and g is not None:
            ev = _valid(EventLine, d, n, filename).model_dump(exclude={"type"})
            g.events.append(Event(**ev))
        else:
            raise UserError(f"{filename}:{n}: unexpected line type {t!r}" +
                            (" before the first graph line" if t == "event" else ""))
    if g is not None:
        yield g


def _valid(model, d: dict, n: int, filename: str):
    from pydantic import ValidationError

    from alloctrace.traces.store.records import first_error
    try:
        return model.model_validate(d)
    except ValidationError as e:
        raise UserError(f"{filename}:{n}: {first_error(e)}") from None


def _json(line: str, n: int, filename: str) -> dict:
    try:
        d = json.loads(line)
    except ValueError as e:
        raise UserError(f"{filename}:{n}: invalid JSON ({e.args[0][:60]})") from None
    except RecursionError:  # [[[[... a line may hold a million brackets
        raise UserError(f"{filename}:{n}: invalid JSON (nested too deep)") from None
    if not isinstance(d, dict):
        raise UserError(f"{filename}:{n}: not an alloctrace JSON Lines record")
    return d
