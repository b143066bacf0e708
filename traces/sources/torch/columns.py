"""A snapshot dict -> per-device columns: trace entries, the stack table, segments, annotations.

Frames are shared objects in the pickle (one file: 20M references, 156 distinct
frames), so they are deduplicated by object identity while the snapshot is
alive: each distinct frame list becomes one stack id, each distinct frame one
frame id. Every value is checked for its type on the way in; anything else is
a one-line SnapshotError naming where it was found.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alloctrace.traces.sources.torch.unpickle import SnapshotError
from alloctrace.traces.store.torch_stored import (  # noqa: F401 (the stored layout's codes, named here for the source)
    ACTION_CODE, ACTIONS, ALLOC, BLOCK_STATES, FREE_COMPLETED, FREE_REQUESTED, OOM, SEGMENT_ALLOC, SEGMENT_FREE,
    SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT)

ANNOTATION_STAGES = ("START", "END")
MAX_STACKS = 5_000_000  # distinct frame lists kept (each is at least a few pickle bytes anyway)
MAX_FRAME_TEXT = 2048  # characters kept of a frame's name or filename (a real one is under 300)


def cut_frame_text(s):
    """A frame's name or filename, cut to MAX_FRAME_TEXT characters with a marker that says so: one string
    shared by every frame costs the pickle a few bytes but every view that expands stacks multiplies it."""
    if type(s) is not str or len(s) <= MAX_FRAME_TEXT:
        return s
    return f"{s[:MAX_FRAME_TEXT]}...[cut: {len(s):,} characters, {MAX_FRAME_TEXT:,} kept]"


class Strings:
    """An append-only string table: value -> code."""

    def __init__(self):
        self.codes: dict[str, int] = {}
        self.table: list[str] = []

    def code(self, s) -> int:
        c = self.codes.get(s)
        if c is None:
            if type(s) is not str:
                raise SnapshotError(f"expected a string, found {type(s).__name__}")
            c = self.codes[s] = len(self.table)
            self.table.append(s)
        return c


class StackTable:
    """Frames and stacks, deduplicated first by object identity, then by value."""

    def __init__(self, strings: Strings):
        self.strings = strings
        self.frame_ids: dict[tuple, int] = {}
        self.frames: list[tuple[int, int, int]] = []  # (name code, file code, line)
        self.stack_ids: dict[tuple, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self._frame_by_obj: dict[int, int] = {}
        self._stack_by_obj: dict[tuple, int] = {}  # frame object ids -> stack id
        self._stack_by_list: dict[int, int] = {}  # frames list object id -> stack id: O(1) for a shared list

    def stack(self, frames) -> int:
        """Stack id of a frame list (-1 for none or empty)."""
        if not frames:
            if frames is not None and type(frames) is not list:
                raise SnapshotError(f"frames: expected a list, found {type(frames).__name__}")
            return -1
        if type(frames) is not list:
            raise SnapshotError(f"frames: expected a list, found {type(frames).__name__}")
        sid = self._stack_by_list.get(id(frames))  # the list stays alive with the snapshot: its id is stable
        if sid is not None:
            return sid
        sid = self._stack_by_list[id(frames)] = self._stack_of(frames)
        return sid

    def _stack_of(self, frames: list) -> int:
        ids = tuple(map(id, frames))  # the frame objects stay alive with the snapshot, so ids are stable
        sid = self._stack_by_obj.get(ids)
        if sid is None:
            key = tuple(self._frame(f) for f in frames)
            sid = self.stack_ids.get(key)
            if sid is None:
                if len(self.stacks) >= MAX_STACKS:
                    raise SnapshotError(f"more than {MAX_STACKS:,} distinct stacks")
                sid = self.stack_ids[key] = len(self.stacks)
                self.stacks.append(key)
            self._stack_by_obj[ids] = sid
        return sid

    def _frame(self, f) -> int:
        fid = self._frame_by_obj.get(id(f))
        if fid is not None:
            return fid
        if type(f) is not dict:
            raise SnapshotError(f"frame: expected a dict, found {type(f).__name__}")
        line = f.get("line", -1)
        if type(line) is not int:
            raise SnapshotError(f"frame line: expected an int, found {type(line).__name__}")
        key = (self.strings.code(cut_frame_text(f.get("name", "?"))),
               self.strings.code(cut_frame_text(f.get("filename", "?"))), line)
        fid = self.frame_ids.get(key)
        if fid is None:
            fid = self.frame_ids[key] = len(self.frames)
            self.frames.append(key)
        self._frame_by_obj[id(f)] = fid
        return fid

    def arrays(self) -> dict[str, np.ndarray]:
        fr = np.array(self.frames, dtype=np.int64).reshape(-1, 3)
        offsets = np.zeros(len(self.stacks) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in self.stacks], out=offsets[1:])
        flat = np.fromiter((f for s in self.stacks for f in s), dtype=np.int32, count=int(offsets[-1]))
        return {"frame_name": fr[:, 0].astype(np.int32), "frame_file": fr[:, 1].astype(np.int32),
                "frame_line": fr[:, 2], "stack_offsets": offsets, "stack_frames": flat}


@dataclass
class DeviceData:
    """One device of a snapshot in column form (what one graph row stores)."""

    device: int
    cols: dict[str, np.ndarray]  # trace entries: action, addr, size, stream, time_us, stack, meta, compile, device_free
    tables: dict[str, np.ndarray]  # frames, stacks, seg_*, blk_*, ann_*
    extra: dict = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return len(self.cols["action"])


def _ints(name: str, values: list, dtype=np.int64) -> np.ndarray:
    """A list of Python ints as an array; anything that is not an int is an error."""
    if not values:
        return np.zeros(0, dtype=dtype)
    try:
        arr = np.array(values)
    except ValueError:  # lists or tuples among the values (nested past numpy's 64 dimensions, or ragged)
        raise SnapshotError(f"{name}: expected integers, found containers") from None
    if arr.dtype.kind not in "ib":
        what = "integers out of range" if arr.dtype.kind in "uO" else f"integers, found {arr.dtype.kind!r} values"
        raise SnapshotError(f"{name}: expected {what}")
    return arr.astype(dtype, casting="safe") if arr.dtype != dtype else arr


def _check_dict(x, what: str) -> dict:
    if type(x) is not dict:
        raise SnapshotError(f"{what}: expected a dict, found {type(x).__name__}")
    return x


def _list(x, what: str) -> list:
    if type(x) is not list:
        raise SnapshotError(f"{what}: expected a list, found {type(x).__name__}")
    return x


def split_devices(snapshot, tick=lambda: None) -> tuple[list[DeviceData], list[str]]:
    """Per-device columns of a snapshot dict, and the string table they share. `tick()` is called between
    pieces of work (the import's CPU cap)."""
    from alloctrace.traces.sources.torch.snapshot_schema import Segment, Top, check  # pydantic: when read
    snap = _check_dict(snapshot, "snapshot")
    if "device_traces" not in snap or "segments" not in snap:
        raise SnapshotError("not a PyTorch memory snapshot (no `segments` / `device_traces`); record one with "
                            "torch.cuda.memory._record_memory_history() and _dump_snapshot()")
    strings = Strings()
    stacks = StackTable(strings)
    traces = _list(snap["device_traces"], "device_traces")
    segments = _list(snap["segments"], "segments")
    annotations = _list(snap.get("external_annotations") or [], "external_annotations")
    check(Top, {"allocator_settings": snap.get("allocator_settings")}, "snapshot")
    settings = snap.get("allocator_settings") or {}
    by_device: dict[int, list] = {}  # segments of each device, checked against the schema once
    for k, s in enumerate(segments):
        by_device.setdefault(check(Segment, s, f"segments[{k}]").device, []).append((k, s))
    devices = []
    for d, entries in enumerate(traces):
        cols = _entries(_list(entries, f"device_traces[{d}]"), d, strings, stacks)
        devices.append(DeviceData(d, cols, {}, {"device": d}))
        tick()
    for d in sorted(x for x in by_device if x >= len(devices)):
        devices.append(DeviceData(d, _entries([], d, strings, stacks), {}, {"device": d}))
    ann_by_device: dict = {}
    for a in annotations:
        ann_by_device.setdefault(a.get("device", 0) if type(a) is dict else 0, []).append(a)
    rest = [(_segments(by_device.get(dev.device, []), strings, stacks, tick),
             _annotations(ann_by_device.get(dev.device, []), strings)) for dev in devices]
    st = stacks.arrays()  # after every device's segments: a stack first met on a segment or block is in it too
    for dev, (seg, ann) in zip(devices, rest):  # in the stored layout's order (torch_stored.LAYOUT)
        dev.tables.update(st)
        dev.tables.update(seg)
        dev.tables.update(ann)
        dev.extra["allocator_settings"] = settings
    return devices, strings.table


def _entries(entries: list, d: int, strings: Strings, stacks: StackTable) -> dict[str, np.ndarray]:
    try:
        return _entry_columns(entries, d, strings, stacks)
    except (SnapshotError, KeyError, TypeError, AttributeError) as err:
        _locate_bad_entry(entries, d, strings, stacks)  # names the entry when it can
        raise SnapshotError(f"device_traces[{d}]: malformed entries ({err})") from None


def _locate_bad_entry(entries: list, d: int, strings: Strings, stacks: StackTable):
    """Re-read the entries one by one to say which one is bad (only after the fast path failed)."""
    for i, e in enumerate(entries):
        try:
            if type(e) is not dict:
                raise SnapshotError(f"expected a dict, found {type(e).__name__}")
            ACTION_CODE[e["action"]]
            e["size"]
            stacks.stack(e.get("frames"))
            for k in ("user_metadata", "compile_context"):
                if e.get(k) not in ("", None):
                    strings.code(e[k])
        except SnapshotError as err:
            raise SnapshotError(f"device_traces[{d}][{i}]: {err}") from None
        except KeyError as err:
            raise SnapshotError(f"device_traces[{d}][{i}]: missing or unknown {err}") from None
        except TypeError as err:
            raise SnapshotError(f"device_traces[{d}][{i}]: not a trace entry ({err})") from None


def _codes(values: list, strings: Strings) -> np.ndarray:
    """String codes of values (empty or missing: -1), each distinct value looked up once."""
    known = {v: (-1 if v in ("", None) else strings.code(v)) for v in set(values)}
    return np.array([known[v] for v in values], dtype=np.int32)


def _entry_columns(entries: list, d: int, strings: Strings, stacks: StackTable) -> dict[str, np.ndarray]:
    """One pass per field in comprehensions (no per-entry Python frames beyond the stack lookup)."""
    from alloctrace.traces.sources.torch.snapshot_schema import check_entry_column  # pydantic: when read
    n = len(entries)
    code, stack_of = ACTION_CODE, stacks.stack
    action = np.array([code[e["action"]] for e in entries], dtype=np.int8)
    addr = [e.get("addr", -1) for e in entries]
    size = [e["size"] for e in entries]
    stream = [e.get("stream", 0) for e in entries]
    time_us = [e.get("time_us", 0) for e in entries]
    stack = np.array([stack_of(e.get("frames")) for e in entries], dtype=np.int32)
    meta = _codes([e.get("user_metadata") for e in entries], strings)
    compile_ = _codes([e.get("compile_context") for e in entries], strings)
    free_at = {int(i): entries[i].get("device_free", -1) for i in np.flatnonzero(action == OOM)}
    where = f"device_traces[{d}]"
    cols = {"action": action, "addr": _ints(f"{where} addr", addr), "size": _ints(f"{where} size", size),
            "stream": _ints(f"{where} stream", stream), "time_us": _ints(f"{where} time_us", time_us),
            "stack": stack, "meta": meta, "compile": compile_}
    for name in ("addr", "size", "stream", "time_us"):
        check_entry_column(name, cols[name], where)
    if float(cols["size"].sum(dtype=np.float64)) >= 2.0 ** 62:  # running totals must stay within int64
        raise SnapshotError(f"{where}: the entry sizes add up to more than 2^62 bytes")
    if free_at:
        free = np.full(n, -1, dtype=np.int64)
        free[list(free_at)] = _ints(f"{where} device_free", list(free_at.values()))
        check_entry_column("device_free", free, where)
        cols["device_free"] = free
    return cols


def _segments(segments: list, strings: Strings, stacks: StackTable, tick=lambda: None) -> dict[str, np.ndarray]:
    """Columns of one device's segments: (index in the snapshot, segment) pairs, each already a Segment."""
    from alloctrace.traces.sources.torch.snapshot_schema import Block, check  # pydantic: when read
    rows, blocks, starts = [], [], [0]
    for n, (k, s) in enumerate(segments):
        where = f"segments[{k}]"
        if n & 1023 == 1023:
            tick()
        try:
            pool = s.get("segment_pool_id") or (0, 0)
            pool = tuple(pool) if type(pool) in (tuple, list) else (pool, 0)
            rows.append((s["address"], s["total_size"], s.get("allocated_size", 0), s.get("active_size", 0),
                         s.get("requested_size", 0), s.get("stream", 0), int(s.get("segment_type") == "small"),
                         pool[0], pool[1] if len(pool) > 1 else 0, int(bool(s.get("is_expandable"))),
                         stacks.stack(s.get("frames"))))
            for j, b in enumerate(_list(s.get("blocks") or [], f"{where}.blocks")):
                check(Block, b, f"blocks[{j}]")
                st = b.get("state", "inactive")
                blocks.append((b["address"], b["size"], b.get("requested_size", 0),
                               BLOCK_STATES.index(st) if st in BLOCK_STATES else 100 + strings.code(st),
                               stacks.stack(b.get("frames"))))
            starts.append(len(blocks))
        except SnapshotError as e:
            raise SnapshotError(f"{where}: {e}") from None
        except KeyError as e:
            raise SnapshotError(f"{where}: missing {e}") from None
        except (TypeError, ValueError) as e:
            raise SnapshotError(f"{where}: not a segment ({e})") from None
    names = ("seg_address", "seg_total", "seg_allocated", "seg_active", "seg_requested", "seg_stream", "seg_small",
             "seg_pool_a", "seg_pool_b", "seg_expandable", "seg_stack")
    out = {n: _ints(n, [r[i] for r in rows]) for i, n in enumerate(names)}
    out["seg_block0"] = np.array(starts, dtype=np.int64)
    for i, n in enumerate(("blk_address", "blk_size", "blk_requested", "blk_state", "blk_stack")):
        out[n] = _ints(n, [b[i] for b in blocks])
    return out


def _annotations(annotations: list, strings: Strings) -> dict[str, np.ndarray]:
    from alloctrace.traces.sources.torch.snapshot_schema import Annotation, check
    stage, name, time_us = [], [], []
    for k, a in enumerate(annotations):
        try:
            check(Annotation, a, "annotation")
            stage.append(int(a.get("stage") != "START"))
            name.append(strings.code(a.get("name", "?")))
            time_us.append(a["time_us"])
        except (SnapshotError, KeyError, TypeError) as e:
            raise SnapshotError(f"external_annotations[{k}]: {e}") from None
    return {"ann_stage": np.array(stage, dtype=np.int8), "ann_name": np.array(name, dtype=np.int32),
            "ann_time": _ints("external_annotations time_us", time_us)}
