"""What a trace source is and what it hands back (the entry point is the package, `import_file`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Protocol

from alloctrace.traces.store.columns import EncodedGraph
from alloctrace.traces.sources.logio import HEAD
from alloctrace.traces.store.schema import GraphRecord, TraceMeta


@dataclass
class ImportedTrace:
    """What a source read: the trace's metadata and its graphs (consumed inside the store's transaction)."""

    meta: TraceMeta  # meta.source is the source's name
    graphs: Iterable[GraphRecord | EncodedGraph]
    report: dict = field(default_factory=dict)  # source-specific facts for `import --json`


class Source(Protocol):
    name: str  # "ggml-log", "jsonl", ...

    def sniff(self, head: bytes) -> bool:
        """Does this source read input that starts with `head` (up to HEAD decompressed bytes)?"""

    def read(self, stream: BinaryIO, *, filename: str, name: str | None) -> list[ImportedTrace]:
        """The traces in `stream` (decompressed). Bad input raises UserError naming `filename`.
        A source may take more keyword options (`progress`, its own); the entry point passes those
        it declares."""


__all__ = ["HEAD", "ImportedTrace", "Source"]
