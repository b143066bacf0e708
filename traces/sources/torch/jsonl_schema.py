"""The lines of a PyTorch trace's JSON Lines export as pydantic models (traces/sources/torch/jsonl.py checks each
line against them; `entry` lines, the many, are checked field by field there against the same snapshot schema
bounds). The trace's and each device's `extra` are checked for what the views read of them."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field

from alloctrace.traces.store.records import MAX_TEXT
from alloctrace.traces.store.schema import MAX_GRAPH
from alloctrace.traces.store.torch_stored import JSONL_FORMAT

from alloctrace.traces.sources.torch.columns import MAX_FRAME_TEXT
from alloctrace.traces.sources.torch.snapshot_schema import Address, Size, Stream, Time
from alloctrace.traces.sources.torch.source import ROLE
FRAME_TEXT = MAX_FRAME_TEXT + 100  # a frame's name or file: what the snapshot source keeps of one, with its marker
Int64 = Annotated[int, Ge(-(1 << 63)), Le((1 << 63) - 1)]
Count = Annotated[int, Ge(0), Le(1 << 40)]
StackId = Annotated[int, Ge(-1), Le((1 << 31) - 1)]


class _Line(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


Number = int | float


class Law(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    a: Number | None = None
    b_per_unit: Number | None = None
    linear: bool | None = None


class PlanPoint(_Line):
    value: Number
    fits: bool | None = None
    peak_allocated: Size | None = None
    peak_reserved: Size | None = None
    fragmentation_at_peak: Size | None = None
    categories: dict[Annotated[str, Field(max_length=200)], Size] | None = None
    oom: dict | None = None
    partial: bool | None = None
    peak_allocated_range: list[Size] | None = Field(default=None, min_length=2, max_length=2)
    peak_reserved_range: list[Size] | None = Field(default=None, min_length=2, max_length=2)
    address_orders: Count | None = None
    oom_orders: Count | None = None


class AddressCertainty(_Line):
    """Whether a search's answer holds wherever the driver puts segments (torch_plan.address_certainty)."""

    orders_at_value: Count | None = None
    oom_at_value: Count | None = None
    orders_above_value: Count | None = None
    fit_above_value: Count | None = None
    certain: bool | None = None


class PlanVary(_Line):
    """A `plan --vary` point's trace: the whole search (what the pre-flight page and `categories` read)."""

    name: str = Field(max_length=200)
    budget: Size | None = None
    value: Number | None = None
    lo: Number | None = None
    hi: Number | None = None
    laws: dict[Annotated[str, Field(max_length=200)], Law] = {}
    points: list[PlanPoint] = Field(min_length=1, max_length=4096)
    stored_value: Number | None = None
    value_every_order: Number | None = None
    address_orders: AddressCertainty | None = None


class TraceExtra(_Line):
    """What the trace's extra may hold (the snapshot source's, a job's, a plan's): checked, as views read it."""

    format: str | None = Field(default=None, max_length=100)
    file: str | None = Field(default=None, max_length=MAX_TEXT)
    files: list[Annotated[str, Field(max_length=MAX_TEXT)]] | None = Field(default=None, max_length=100_000)
    devices: Count | None = None
    ranks: Count | None = None
    truncated: bool | None = None
    plan_vary: PlanVary | None = None


class Header(_Line):
    type: Literal["trace"]
    format: Literal[JSONL_FORMAT]  # type: ignore[valid-type]
    version: int
    id: str | None = Field(default=None, pattern=r"^[0-9a-f]{8}$")
    name: str = Field(max_length=MAX_TEXT)
    source: Literal["torch"]
    generation: str | None = Field(default=None, max_length=100)
    profile: str | None = Field(default=None, max_length=100)
    created: str | None = Field(default=None, max_length=64)
    tags: list[Annotated[str, Field(max_length=MAX_TEXT)]] = Field(default=[], max_length=64)
    extra: TraceExtra = TraceExtra()


class DeviceLine(_Line):
    type: Literal["device"]
    device: int = Field(ge=0, le=MAX_GRAPH)
    role: Literal[ROLE]  # type: ignore[valid-type]
    n_entries: Count
    n_strings: Count
    n_frames: Count
    n_stacks: Count
    n_segments: Count
    n_blocks: Count
    n_annotations: Count
    peak_requested: Any = None  # facts of the exporting store: computed again here, not read
    peak_reserved: Any = None
    oom: Any = None
    consistent: Any = None
    extra: dict = {}


class SourceExtra(BaseModel):
    """What a device row's extra holds that its entries do not say (the rest is computed again on import)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    device: int = Field(default=0, ge=0, le=MAX_GRAPH)  # the GPU index in its own snapshot
    rank: int | None = Field(default=None, ge=0, le=MAX_GRAPH)  # a job's trace: the rank and its file
    cuda_device: int | None = Field(default=None, ge=0, le=MAX_GRAPH)
    file: str | None = Field(default=None, max_length=MAX_TEXT)


class Strings(_Line):
    type: Literal["strings"]
    device: int
    values: list[str]


class Frame(_Line):
    type: Literal["frame"]
    device: int
    id: int
    name: str = Field(max_length=FRAME_TEXT)
    filename: str = Field(max_length=FRAME_TEXT)
    line: Int64


class Stack(_Line):
    type: Literal["stack"]
    device: int
    id: int
    frames: list[Annotated[int, Ge(0), Le((1 << 31) - 1)]] = Field(min_length=1)


class Segment(_Line):
    type: Literal["segment"]
    device: int
    id: int
    address: Address
    total_size: Size
    allocated_size: Size
    active_size: Size
    requested_size: Size
    stream: Stream
    segment_type: Literal["small", "large"]
    segment_pool_id: list[Int64] = Field(min_length=2, max_length=2)
    is_expandable: bool
    stack: StackId
    n_blocks: Count


class Block(_Line):
    type: Literal["block"]
    device: int
    segment: int
    address: Address
    size: Size
    requested_size: Size
    state: str = Field(max_length=64)
    stack: StackId


class Annotation(_Line):
    type: Literal["annotation"]
    device: int
    stage: Literal["START", "END"]
    name: str = Field(max_length=MAX_TEXT)
    time_us: Time
