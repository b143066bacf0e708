"""What a stored trace is: metadata, graphs, and each graph's events.

The on-disk format is documented in docs/trace-format.md; this module is its
in-memory form, shared by the store, the importers, replay and diff.
"""
from __future__ import annotations

from alloctrace.allocator.record_class import record_class, field

from alloctrace.allocator.events import Event

FORMAT_VERSION = 1
ROLES = ("measure", "eval", "reserve")  # the ggml sources' graph roles
# what a real trace can hold; larger numbers are corrupt or hostile input and are refused on import
MAX_BYTES = 1 << 50  # 1 PiB: no allocator buffer is larger
MAX_GRAPH = 1_000_000  # graph indices
MAX_COUNT = 1 << 31  # block indices, free-block counts, child counts, node indices


@record_class
class GraphRecord:
    """One unit of a trace: a ggml graph walk (one `####### graph` in a 2023 log, one plan in head),
    or whatever unit another source has (for a CUDA caching allocator snapshot, one device)."""

    index: int
    role: str  # source-specific: ggml has measure | eval | reserve
    events: list[Event]
    max_size: int | None = None  # what ggml_allocr_alloc_graph returned (a running maximum, 2023)
    buffer_size: int | None = None  # the buffer it ran in (2023 real) / the backend buffer after it (head)
    oom: dict | None = None  # {"tensor", "needed", "largest_available"}
    consistent: bool | None = None  # importer: did the model reproduce every logged choice
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"index": self.index, "role": self.role, "n_events": len(self.events), "max_size": self.max_size,
                "buffer_size": self.buffer_size, "oom": self.oom, "consistent": self.consistent,
                "complete": not self.extra.get("incomplete")}


@record_class
class TraceMeta:
    """What a trace is and where it came from. Only `name` and `source` mean the same for every
    source; the rest is source-specific (a ggml trace has its allocator generation)."""

    name: str
    source: str  # the source's name: "ggml-log", "jsonl" keeps the exported one, "replay", ...
    generation: str | None = None  # ggml: profile name of the allocator that produced it
    profile: str | None = None
    created: str | None = None  # ISO 8601, set by the store when missing
    tags: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    id: str | None = None  # the id it had (a JSON Lines export's): kept when the store has no trace by it


def oom_of(event: Event | None) -> dict | None:
    """The oom summary of an allocator's failure event, as the JSON outputs spell it."""
    if event is None or event.kind != "oom":
        return None
    return {"tensor": event.tensor, "needed": event.needed, "largest_available": event.largest}
