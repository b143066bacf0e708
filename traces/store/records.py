"""The JSON shapes of a trace, its graphs and its events, as one pydantic schema.

JSON Lines imports are checked against it line by line (a wrong type, an unknown
kind or role, an impossible number is a `file:LINE:` error, never a stored
row), and the HTTP API answers with the same trace and graph models, so what
one face accepts the other can show.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from alloctrace.allocator.events import KINDS

from alloctrace.traces.store.schema import MAX_BYTES, MAX_COUNT, MAX_GRAPH, ROLES

MAX_TEXT = 4096  # a name, an op, a reason

Bytes = Field(default=None, ge=0, le=MAX_BYTES)
Count = Field(default=None, ge=-1, le=MAX_COUNT)
Text = Field(default=None, max_length=MAX_TEXT)
Kind = Literal[tuple(KINDS)]  # type: ignore[valid-type]
Role = Literal[ROLES]  # type: ignore[valid-type]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class OomSummary(_Strict):
    tensor: str | None = Text
    needed: int | None = Bytes
    largest_available: int | None = Bytes


class GraphSummary(_Strict):
    """One graph's row: what `Store.summary` and GET /api/traces/{id} give per graph."""

    index: int = Field(ge=0, le=MAX_GRAPH)
    role: Role
    n_events: int = Field(ge=0, le=1 << 40)
    max_size: int | None = Bytes
    buffer_size: int | None = Bytes
    oom: OomSummary | None = None
    consistent: bool | None = None
    complete: bool = True  # False: the log ends inside this graph walk
    uncertainty_bytes: int | None = Field(default=None, ge=0, le=1 << 20)  # sizes exact up to this many bytes
    reason: str | None = Text  # what the log lacks that would make them exact


class TraceSummary(_Strict):
    id: str = Field(pattern=r"^[0-9a-f]{8}$")
    name: str
    source: str
    generation: str | None = None  # the ggml sources' allocator generation
    profile: str | None = None
    created: str
    tags: list[str]
    truncated: bool = False  # salvaged from a compressed file that ends early (import --salvage)
    graphs: list[GraphSummary]


class TraceList(_Strict):
    traces: list[TraceSummary]


class TraceLine(_Strict):
    """The first line of a JSON Lines export."""

    type: Literal["trace"]
    format: Literal["alloctrace-trace"] = "alloctrace-trace"
    version: int = Field(ge=1)
    id: str | None = Field(default=None, max_length=64)
    name: str = Field(max_length=MAX_TEXT)
    source: str = Field(max_length=MAX_TEXT)
    generation: str | None = Field(default=None, max_length=100)
    profile: str | None = Field(default=None, max_length=100)
    created: str | None = Field(default=None, max_length=64)
    tags: list[str] = []
    extra: dict = {}


class GraphLine(GraphSummary):
    type: Literal["graph"]
    extra: dict = {}


class EventLine(_Strict):
    type: Literal["event"]
    kind: Kind
    graph: int = Field(default=0, ge=0, le=MAX_GRAPH)
    tensor: str | None = Text
    op: str | None = Text
    size: int | None = Bytes
    offset: int | None = Bytes
    addr: int | None = Field(default=None, ge=0, le=(1 << 64) - 1)
    chunk: int | None = Field(default=None, ge=0, le=1 << 16)
    buffer: int | None = Field(default=None, ge=0, le=1 << 16)  # several buffer types: which one
    block: int | None = Count
    n_free: int | None = Count
    largest_free: int | None = Bytes
    total_free: int | None = Bytes
    n_free_before: int | None = Count
    parent: str | None = Text
    view_src: str | None = Text
    reason: str | None = Text
    srcs: list[str | None] | None = None
    children: int | None = Field(default=None, ge=-MAX_COUNT, le=MAX_COUNT)
    views: int | None = Field(default=None, ge=-MAX_COUNT, le=MAX_COUNT)
    allocated: int | None = Field(default=None, ge=-MAX_COUNT, le=MAX_COUNT)
    needed: int | None = Bytes
    largest: int | None = Bytes
    node: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    extra: dict = {}


def first_error(e: ValidationError) -> str:
    """The first problem of a validation error, as `field: message`."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, int) or len(err["loc"]) > 1)
    msg = err.get("msg", "invalid")
    return f"{where}: {msg}" if where else msg
