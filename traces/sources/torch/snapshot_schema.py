"""The fields of a PyTorch memory snapshot, as one pydantic schema: what a value may be before it is stored.

Segments, blocks, annotations and the allocator settings are checked as models; trace entries (millions
of them) are checked column by column against the same `Entry` model's bounds (`entry_bounds`), so one
declaration says what each field may hold. A value outside it is a one-line SnapshotError naming where it
was found (HTTP 422). docs/limits.md lists the bounds.
"""
from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from annotated_types import Ge, Le, Lt
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from alloctrace.traces.store.schema import MAX_BYTES

from alloctrace.traces.sources.torch.bounds import MAX_DEVICES
from alloctrace.traces.sources.torch.unpickle import SnapshotError

MAX_ADDRESS = (1 << 63) - 1  # addresses are stored as int64
MAX_STREAM = (1 << 63) - 1
SETTINGS_DEPTH = 4  # allocator_settings nest at most this deep (torch's own: 2)
SETTINGS_ITEMS = 10_000  # values in allocator_settings, all levels together

Size = Annotated[int, Ge(0), Le(MAX_BYTES)]
Address = Annotated[int, Ge(0), Le(MAX_ADDRESS)]
Device = Annotated[int, Ge(0), Le(MAX_DEVICES - 1)]
Stream = Annotated[int, Ge(-MAX_STREAM), Le(MAX_STREAM)]
Time = Annotated[int, Ge(-(1 << 62)), Le(1 << 62)]


def _plain_settings(value: Any) -> Any:
    """allocator_settings: JSON-like plain values, at most SETTINGS_DEPTH deep and SETTINGS_ITEMS in all
    (a cyclic dict is infinitely deep, so it is refused too), before anything recurses into it."""
    if value is None:
        return {}
    if type(value) is not dict:
        raise ValueError(f"expected a dict, found {type(value).__name__}")
    seen, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if type(v) in (dict, list, tuple):
            if depth > SETTINGS_DEPTH:
                raise ValueError(f"nested more than {SETTINGS_DEPTH} deep (or cyclic)")
            items = v.items() if type(v) is dict else enumerate(v)
            for k, x in items:
                seen += 1
                if seen > SETTINGS_ITEMS:
                    raise ValueError(f"more than {SETTINGS_ITEMS:,} values")
                if type(v) is dict and type(k) is not str:
                    raise ValueError(f"a key of type {type(k).__name__}")
                todo.append((x, depth + 1))
        elif not (v is None or type(v) in (str, int, float, bool)):
            raise ValueError(f"a value of type {type(v).__name__}")
        elif type(v) is int and not -(1 << 63) <= v < (1 << 63):
            raise ValueError("an integer out of the int64 range")
        elif type(v) is str and len(v) > 65536:
            raise ValueError("a string longer than 65,536 characters")
    return value


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


Divisions = Annotated[int, Ge(0), Le(1 << 20)]


class Settings(_Model):
    """The allocator_settings fields the caching-allocator model reads (others are kept as they are)."""

    max_split_size: Annotated[int, Ge(-1), Le((1 << 63) - 1)] = -1
    garbage_collection_threshold: Annotated[float, Ge(0.0), Lt(1.0)] = 0.0  # as the model takes it
    expandable_segments: bool = False
    roundup_power2_divisions: dict[Annotated[str, Field(pattern=r"^[0-9]{1,6}$")], Divisions] | list[Divisions] \
        | None = None


class Block(_Model):
    address: Address
    size: Size
    requested_size: Size = 0
    state: str = Field("inactive", max_length=64)


class Segment(_Model):
    device: Device  # required: a segment belongs to one GPU
    address: Address
    total_size: Size
    allocated_size: Size = 0
    active_size: Size = 0
    requested_size: Size = 0
    stream: Stream = 0


class Annotation(_Model):
    time_us: Time
    stage: str | None = Field(None, max_length=64)
    name: Any = None  # checked as a string where the string table takes it


class Entry(_Model):
    """A trace entry (device_traces[d][i]); checked as columns, see `entry_bounds`."""

    addr: Annotated[int, Ge(-1), Le(MAX_ADDRESS)] = -1  # -1: an oom entry has none
    size: Size
    stream: Stream = 0
    time_us: Time = 0
    device_free: Annotated[int, Ge(-1), Le(MAX_BYTES)] = -1


class Top(_Model):
    allocator_settings: Annotated[Settings, BeforeValidator(_plain_settings)] = Settings()


def entry_bounds(name: str) -> tuple[int, int]:
    """(lowest, highest) an Entry field may hold, read from the model."""
    lo, hi = -(1 << 63), (1 << 63) - 1
    for m in Entry.model_fields[name].metadata:
        lo = max(lo, m.ge) if isinstance(m, Ge) else lo
        hi = min(hi, m.le) if isinstance(m, Le) else hi
    return lo, hi


def check_entry_column(name: str, values: np.ndarray, where: str) -> None:
    """Every value of an entry column within Entry's bounds; else a SnapshotError naming the first one."""
    lo, hi = entry_bounds(name)
    bad = (values < lo) | (values > hi)
    if bad.any():
        k = int(np.argmax(bad))
        raise SnapshotError(f"{where}[{k}].{name}: {int(values[k]):,} is outside {lo:,}..{hi:,}")


def check(model: type[_Model], value: Any, where: str) -> _Model:
    """`value` as `model`, or one SnapshotError line naming `where` and the first problem."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        given = err.get("input")
        shown = repr(given)[:40] if isinstance(given, (int, str, float, bool, type(None))) else type(given).__name__
        found = "" if err["type"] == "missing" else f" (found {shown})"
        msg = err["msg"].removeprefix("Value error, ")
        raise SnapshotError(f"{where}{'.' + loc if loc else ''}: {msg}{found}") from None
