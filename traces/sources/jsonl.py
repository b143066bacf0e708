"""Our own JSON Lines export (traces/export.py writes it) read back as a trace, losslessly."""
from __future__ import annotations

import json
import re
from typing import Iterator

from alloctrace.allocator.events import Event

from ..errors import UserError
from ..logio import LogReader
from ..schema import FORMAT_VERSION, GraphRecord, TraceMeta
from .base import ImportedTrace

HEADER = re.compile(rb'\A\s*\{\s*"type"\s*:\s*"trace"')


class JsonlSource:
    name = "jsonl"

    def sniff(self, head: bytes) -> bool:
        return HEADER.match(head) is not None

    def read(self, stream, *, filename: str, name: str | None) -> list[ImportedTrace]:
        reader = LogReader(stream, label=filename)  # bounded line length; closed with the stream
        meta, graphs = read_jsonl(reader.lines(), filename)
        if name:
            meta.name = name
        return [ImportedTrace(meta, graphs)]


SOURCE = JsonlSource()


def read_jsonl(lines, where: str = "input") -> tuple[TraceMeta, Iterator[GraphRecord]]:
    """A JSON Lines export as what `Store.add_trace` takes; graphs are read one at a time."""
    numbered = enumerate(lines, 1)
    meta = None
    for n, line in numbered:
        if line.strip():
            d = _json(line, n, where)
            if d.get("type") != "trace" or not isinstance(d.get("version"), int):
                break
            if d["version"] > FORMAT_VERSION:
                raise UserError(f"{where}: trace format {d['version']} is newer than {FORMAT_VERSION}")
            try:
                meta = TraceMeta(name=d["name"], source=d["source"], generation=d["generation"],
                                 profile=d.get("profile"), created=d.get("created"), tags=d.get("tags", []),
                                 extra=d.get("extra", {}))
            except KeyError as e:
                raise UserError(f"{where}:{n}: trace header lacks {e}") from None
            break
    if meta is None:
        raise UserError(f"{where}: not an alloctrace JSON Lines trace (no trace header)")
    return meta, _graphs(numbered, where)


def _graphs(numbered, where: str) -> Iterator[GraphRecord]:
    g = None
    for n, line in numbered:
        if not line.strip():
            continue
        d = _json(line, n, where)
        t = d.pop("type", None)
        try:
            if t == "graph":
                if g is not None:
                    yield g
                d.pop("n_events", None)
                g = GraphRecord(events=[], **d)
            elif t == "event" and g is not None:
                g.events.append(Event(**d))
            else:
                raise ValueError(f"unexpected line type {t!r}")
        except (ValueError, TypeError) as e:
            raise UserError(f"{where}:{n}: not an alloctrace JSON Lines trace ({e})") from None
    if g is not None:
        yield g


def _json(line: str, n: int, where: str) -> dict:
    try:
        d = json.loads(line)
    except ValueError as e:
        raise UserError(f"{where}:{n}: invalid JSON ({e.args[0][:60]})") from None
    if not isinstance(d, dict):
        raise UserError(f"{where}:{n}: not an alloctrace JSON Lines record")
    return d


