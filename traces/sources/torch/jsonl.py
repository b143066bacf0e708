"""A PyTorch trace's JSON Lines export (traces/export/torch_jsonl.py writes it) read back as the same stored trace.

The lines rebuild each device's columns and tables exactly as the snapshot source built them (the same string
codes, stack ids and dtypes), and the facts the views read (peaks, the OOM, the state at the first entry, the
caching-allocator model's check) are computed again from them by the snapshot source's own code, never taken
from the file: the stored bytes equal the original's and a hand-edited fact cannot disagree with its entries.

Every line is checked as it is read (its type, the device it names, its place in the order the device line's
counts give, each number's range, every stack and frame id it names); the first problem is one
`FILE:LINE: ...` error (HTTP 422). The work is bounded like a snapshot's: the decompressed bytes and each line's
length by the reader (logio), the CPU time and a cancel between pieces of work (bounds.Budget), the graphs and
stored bytes by the per-file caps; no line expands into more rows than it spells out.
"""
from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Iterator

import numpy as np
from orjson import loads
from pydantic import ValidationError

from alloctrace.traces.sources.base import ImportedTrace
from alloctrace.traces.sources.logio import LogReader
from alloctrace.traces.sources.sniffers import torch_jsonl
from alloctrace.traces.store.columns import compressor
from alloctrace.traces.store.records import first_error
from alloctrace.traces.store.schema import TraceMeta
from alloctrace.traces.store.torch_stored import ACTION_CODE, BLOCK_STATES, JSONL_FORMAT, JSONL_VERSION, LAYOUT, OOM

from alloctrace.traces.sources.torch.bounds import Budget
from alloctrace.traces.sources.torch.columns import DeviceData
from alloctrace.traces.sources.torch.jsonl_schema import (Annotation, Block, DeviceLine, Frame, Header, Segment,
                                                          SourceExtra, Stack, Strings)
from alloctrace.traces.sources.torch.snapshot_schema import Top, check, entry_bounds
from alloctrace.traces.sources.torch.source import _encoded, device_facts
from alloctrace.traces.sources.torch.unpickle import SnapshotError

NAME = "torch-jsonl"
TICK_LINES = 4096  # lines read between two checks of the CPU cap
ENTRY_KEYS = frozenset({"type", "device", "i", "action", "addr", "size", "stream", "time_us", "stack",
                        "user_metadata", "compile_context", "device_free"})
BOUNDS = {k: entry_bounds(k) for k in ("addr", "size", "stream", "time_us", "device_free")}


class TorchJsonlSource:
    name = NAME

    def sniff(self, head: bytes) -> bool:
        return torch_jsonl(head)

    def read(self, stream, *, filename: str, name: str | None, limits=None) -> list[ImportedTrace]:
        label = Path(filename).name or "input"
        lines = Lines(LogReader(stream, label=label, limits=limits).lines(), label, Budget(limits, label))
        first = lines.next("a `trace` header line")
        h = lines.model(Header, first)
        if h.version != JSONL_VERSION:
            raise SnapshotError(f"{label}:{lines.n}: {JSONL_FORMAT} version {h.version}: "
                                + (f"newer than {JSONL_VERSION}, which this alloctrace reads" if h.version > JSONL_VERSION
                                   else "written before the export held segments, blocks and strings; export the "
                                        "trace again or import its snapshot"))
        meta = TraceMeta(name=name or h.name, source=h.source, generation=h.generation, profile=h.profile,
                         created=h.created, tags=list(h.tags), extra=first.get("extra") or {}, id=h.id)  # as written
        report: list[dict] = []
        return [ImportedTrace(meta, _devices(lines, report), {"devices": report})]


SOURCE = TorchJsonlSource()


class Lines:
    """The input's non-empty lines as JSON objects, numbered; CPU and cancel caps checked as they come."""

    def __init__(self, lines, label: str, budget: Budget):
        self.it, self.label, self.budget, self.n = iter(lines), label, budget, 0
        self.pending: dict | None = None

    def error(self, message: str) -> SnapshotError:
        return SnapshotError(f"{self.label}:{self.n}: {message}")

    def peek(self) -> dict | None:
        """The next line (None at the end), left to be read."""
        if self.pending is None:
            for line in self.it:
                self.n += 1
                if self.n % TICK_LINES == 0:
                    self.budget.check()
                if not line.strip():
                    continue
                try:
                    d = loads(line)  # orjson: an integer past 64 bits comes back a float, refused where it is read
                except ValueError as e:  # [[[[... too: orjson refuses more than 1,024 levels
                    raise self.error(f"invalid JSON ({str(e)[:60]})") from None
                if type(d) is not dict:
                    raise self.error("not a JSON object")
                self.pending = d
                break
        return self.pending

    def next(self, what: str, kind: str | None = None, device: int | None = None) -> dict:
        """The next line, which must be of type `kind` (and name `device`); `what` says what was expected."""
        d = self.peek()
        if d is None:
            raise SnapshotError(f"{self.label}: ends where {what} was expected (a cut file?)")
        if kind is not None and d.get("type") != kind:
            raise self.error(f"expected {what}, found a line of type {str(d.get('type'))[:40]!r}")
        if device is not None and (type(d.get("device")) is not int or d["device"] != device):
            raise self.error(f"`{kind}` line of device {str(d.get('device'))[:20]} inside device {device}")
        self.pending = None
        return d

    def model(self, model, d: dict):
        try:
            return model.model_validate(d)
        except ValidationError as e:
            raise self.error(first_error(e)) from None


def _devices(lines: Lines, report: list[dict]) -> Iterator:
    """Each device's EncodedGraph, read and checked one device at a time."""
    compress = compressor()
    last = -1
    while lines.peek() is not None:
        dl = lines.model(DeviceLine, lines.next("a `device` line", "device"))
        if dl.device <= last:
            raise lines.error(f"device {dl.device} after device {last} (devices come once, in order)")
        last = dl.device
        try:
            source_extra = SourceExtra.model_validate(dl.extra).model_dump(exclude_unset=True)
        except ValidationError as e:
            raise lines.error(f"extra.{first_error(e)}") from None
        settings = dl.extra.get("allocator_settings") or {}
        check(Top, {"allocator_settings": settings}, f"{lines.label}:{lines.n}: extra")
        dev, table = read_device(lines, dl)
        dev.extra = {**source_extra, "allocator_settings": settings}
        facts = device_facts(dev, table, lines.budget.check)
        lines.budget.check()
        report.append({**facts["report"], "device": dl.device})
        graph = _encoded(dev, facts, compress(json.dumps(table).encode()), compress)
        graph.index = dl.device  # a job's rank, where the GPU's own index is in extra["device"]
        yield graph


def read_device(lines: Lines, dl: DeviceLine) -> tuple[DeviceData, list[str]]:
    """One device's lines after its `device` line, in the order and numbers that line gives."""
    d = dl.device
    table: list[str] = []
    while len(table) < dl.n_strings:
        table += lines.model(Strings, lines.next(f"`strings` of device {d}", "strings", d)).values
    if len(table) != dl.n_strings:
        raise lines.error(f"{len(table):,} strings where device {d} has {dl.n_strings:,}")
    codes = {s: k for k, s in reversed(list(enumerate(table)))}

    def code(s: str) -> int:  # a text's code: its place in the table, or a new one at its end
        c = codes.get(s)
        if c is None:
            c = codes[s] = len(table)
            table.append(s)
        return c

    frames = [array("q") for _ in range(3)]
    for k in range(dl.n_frames):
        f = lines.model(Frame, lines.next(f"frame {k} of device {d}", "frame", d))
        if f.id != k:
            raise lines.error(f"frame id {f.id} where frame {k} comes")
        for col, v in zip(frames, (code(f.name), code(f.filename), f.line)):
            col.append(v)
    offsets, flat = array("q", [0]), array("q")
    for k in range(dl.n_stacks):
        s = lines.model(Stack, lines.next(f"stack {k} of device {d}", "stack", d))
        if s.id != k:
            raise lines.error(f"stack id {s.id} where stack {k} comes")
        if max(s.frames) >= dl.n_frames:
            raise lines.error(f"stack {k} names frame {max(s.frames)}; device {d} has {dl.n_frames:,}")
        flat.extend(s.frames)
        offsets.append(len(flat))
    cols = read_entries(lines, dl, code)
    tables = {"frame_name": np.asarray(frames[0], np.int32), "frame_file": np.asarray(frames[1], np.int32),
              "frame_line": np.asarray(frames[2], np.int64), "stack_offsets": np.asarray(offsets, np.int64),
              "stack_frames": np.asarray(flat, np.int32), **read_segments(lines, dl, code)}
    ann = [array("q") for _ in range(3)]
    for k in range(dl.n_annotations):
        a = lines.model(Annotation, lines.next(f"annotation {k} of device {d}", "annotation", d))
        for col, v in zip(ann, (int(a.stage != "START"), code(a.name), a.time_us)):
            col.append(v)
    tables.update(ann_stage=np.asarray(ann[0], np.int8), ann_name=np.asarray(ann[1], np.int32),
                  ann_time=np.asarray(ann[2], np.int64))
    dtypes = dict(LAYOUT)
    return DeviceData(dl.device, {k: v.astype(dtypes[k], copy=False) for k, v in cols.items()},
                      {k: v.astype(dtypes[k], copy=False) for k, v in tables.items()}), table


def read_entries(lines: Lines, dl: DeviceLine, code) -> dict[str, np.ndarray]:
    """The `entry` lines as columns; each value checked against the snapshot schema's bounds as it comes."""
    d = dl.device
    names = ("addr", "size", "stream", "time_us", "stack", "meta", "compile", "device_free")
    cols = {k: array("q") for k in names}
    action = array("b")
    adds = [cols[k].append for k in names]
    stack_hi = dl.n_stacks - 1
    saw_oom = False
    for k in range(dl.n_entries):
        e = lines.next(f"entry {k} of device {d}", "entry", d)
        if e.keys() - ENTRY_KEYS:
            raise lines.error(f"unknown field {sorted(e.keys() - ENTRY_KEYS)[0][:40]!r}")
        if type(e.get("i")) is not int or e["i"] != k:
            raise lines.error(f"entry number {str(e.get('i'))[:20]} where entry {k} comes")
        a = ACTION_CODE.get(e.get("action")) if type(e.get("action")) is str else None
        if a is None:
            raise lines.error(f"action: not one of {', '.join(ACTION_CODE)}")
        saw_oom |= a == OOM
        vals = [_int(lines, e, f, BOUNDS[f], -1 if f in ("addr", "device_free") else 0)
                for f in ("addr", "size", "stream", "time_us")]
        vals.append(_int(lines, e, "stack", (-1, stack_hi), -1))
        vals += [_text(lines, e, "user_metadata", code), _text(lines, e, "compile_context", code)]
        vals.append(_int(lines, e, "device_free", BOUNDS["device_free"], -1))
        action.append(a)
        for add, v in zip(adds, vals):
            add(v)
    out = {"action": np.asarray(action, np.int8)}
    for k in names:
        if k != "device_free" or saw_oom:
            out[k] = np.asarray(cols[k], np.int64)
    if float(out["size"].sum(dtype=np.float64)) >= 2.0 ** 62:  # running totals must stay within int64
        raise lines.error(f"the entry sizes of device {d} add up to more than 2^62 bytes")
    return out


def _int(lines: Lines, e: dict, key: str, bounds: tuple[int, int], default: int) -> int:
    v = e.get(key, default)
    if type(v) is not int or not bounds[0] <= v <= bounds[1]:
        raise lines.error(f"{key}: expected an integer in {bounds[0]:,}..{bounds[1]:,}, found {repr(v)[:40]}")
    return v


def _text(lines: Lines, e: dict, key: str, code) -> int:
    v = e.get(key)
    if v is None:
        return -1
    if type(v) is not str or not v:
        raise lines.error(f"{key}: expected a non-empty string")
    return code(v)


def read_segments(lines: Lines, dl: DeviceLine, code) -> dict[str, np.ndarray]:
    """The `segment` lines, each followed by its `block` lines, as the seg_* and blk_* tables. Their stack ids are
    kept as stored, not checked against the stack table: a trace stored by a build before December 2026 named
    stacks first met on a segment or block past the table it kept (the views read those as unknown frames)."""
    d = dl.device
    seg = [array("q") for _ in range(11)]
    blk = [array("q") for _ in range(5)]
    starts = array("q", [0])
    for k in range(dl.n_segments):
        s = lines.model(Segment, lines.next(f"segment {k} of device {d}", "segment", d))
        if s.id != k:
            raise lines.error(f"segment id {s.id} where segment {k} comes")
        for col, v in zip(seg, (s.address, s.total_size, s.allocated_size, s.active_size, s.requested_size, s.stream,
                                int(s.segment_type == "small"), *s.segment_pool_id, int(s.is_expandable), s.stack)):
            col.append(v)
        for j in range(s.n_blocks):
            b = lines.model(Block, lines.next(f"block {j} of segment {k} of device {d}", "block", d))
            if b.segment != k:
                raise lines.error(f"a block of segment {b.segment} where segment {k}'s blocks come")
            state = BLOCK_STATES.index(b.state) if b.state in BLOCK_STATES else 100 + code(b.state)
            for col, v in zip(blk, (b.address, b.size, b.requested_size, state, b.stack)):
                col.append(v)
        starts.append(len(blk[0]))
    if len(blk[0]) != dl.n_blocks:
        raise lines.error(f"{len(blk[0]):,} blocks where device {d} has {dl.n_blocks:,}")
    names = ("address", "total", "allocated", "active", "requested", "stream", "small", "pool_a", "pool_b",
             "expandable", "stack")
    out = {f"seg_{n}": np.asarray(c, np.int64) for n, c in zip(names, seg)}
    out["seg_block0"] = np.asarray(starts, np.int64)
    out.update({f"blk_{n}": np.asarray(c, np.int64)
                for n, c in zip(("address", "size", "requested", "state", "stack"), blk)})
    return out
