"""What a trace source is and what it hands back (the entry point is the package, `import_file`)."""
from __future__ import annotations

from alloctrace.allocator.record_class import record_class, field
from collections.abc import Iterable
from io import BufferedIOBase  # a binary stream (typing's BinaryIO would cost a short command its import)

from alloctrace.traces.store.columns import EncodedGraph
from alloctrace.traces.sources.logio import HEAD
from alloctrace.traces.store.schema import GraphRecord, TraceMeta


@record_class
class ImportedTrace:
    """What a source read: the trace's metadata and its graphs (consumed inside the store's transaction)."""

    meta: TraceMeta  # meta.source is the source's name
    graphs: Iterable[GraphRecord | EncodedGraph]
    report: dict = field(default_factory=dict)  # source-specific facts for `import --json`


class Source:
    """What a source provides (sources need not inherit it; `register` takes any object with these)."""

    name: str  # "ggml-log", "jsonl", ...

    def sniff(self, head: bytes) -> bool:
        """Does this source read input that starts with `head` (up to HEAD decompressed bytes)?"""

    def read(self, stream: BufferedIOBase, *, filename: str, name: str | None) -> list[ImportedTrace]:
        """The traces in `stream` (decompressed). Bad input raises UserError naming `filename`.
        A source may take more keyword options (`progress`, its own); the entry point passes those
        it declares."""


__all__ = ["HEAD", "ImportedTrace", "Source"]
