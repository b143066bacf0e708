"""How much work a snapshot may cause once it is unpickled, and the CPU cap over its whole import.

A shared reference costs a pickle two bytes but expands into as many rows as the object it names holds:
3,000 segments sharing one list of 3,000 blocks are 12 KB of pickle and 9 million block rows. So the rows a
snapshot would expand into (entries, segments, blocks, annotations) and the frames of its distinct frame
lists are counted first, without building anything, against caps that grow with the decompressed pickle
size (a real entry or block costs 20 bytes of pickle or more); past them the import is refused with one
line (HTTP 413). docs/limits.md lists the caps.
"""
from __future__ import annotations

import time

from alloctrace.traces.sources.bounded_io import ENV, Cancelled, Limits

from alloctrace.traces.sources.torch.unpickle import SnapshotError

MAX_DEVICES = 1024  # device indices 0..1023: more GPUs than any host has (the snapshot schema's bound too)
MIN_ROWS = 100_000  # rows any snapshot may expand into, whatever its size
BYTES_PER_ROW = 4  # beyond those: one row per 4 bytes of pickle (real snapshots: 20+ bytes per row)
MIN_FRAMES = 1_000_000  # frames of distinct frame lists, beyond one per byte of pickle


class SnapshotTooBig(SnapshotError):
    """A snapshot that would expand into more work than its size allows."""

    status = 413


class Budget:
    """The import's CPU-time and cancel caps (Limits.max_cpu_s, Limits.cancelled), checked between pieces
    of work once the pickle is read: building columns, rebuilding the state, replaying the model."""

    def __init__(self, limits: Limits | None, label: str):
        self.limits, self.label, self.cpu0 = limits or Limits.from_env(), label, time.thread_time()

    def check(self, *_):
        lim = self.limits
        if lim.cancelled is not None and lim.cancelled():
            raise Cancelled(f"{self.label}: import cancelled (the client went away)")
        if time.thread_time() - self.cpu0 > lim.max_cpu_s:
            raise SnapshotTooBig(f"{self.label}: import took more than {lim.max_cpu_s:g} s of CPU time "
                                 f"(cap: {ENV['max_cpu_s']} or --max-cpu)")


def check_work(snap, n_bytes: int, label: str) -> dict:
    """Count what `snap` expands into; a SnapshotTooBig past the caps for `n_bytes` of pickle. Anything
    not shaped like a snapshot is left for the column builder to name. Returns the counts."""
    row_cap = MIN_ROWS + n_bytes // BYTES_PER_ROW
    frame_cap = MIN_FRAMES + n_bytes
    rows = frames = 0
    lists: set[int] = set()  # distinct frame lists already counted

    def more_rows(n: int):
        nonlocal rows
        rows += n
        if rows > row_cap:
            raise SnapshotTooBig(f"{label}: expands into more than {row_cap:,} rows (entries, segments, blocks) "
                                 f"from {n_bytes:,} bytes of pickle: shared references make it larger than any "
                                 "real snapshot of its size")

    def frames_of(x):
        nonlocal frames
        f = x.get("frames") if type(x) is dict else None
        if type(f) is list and id(f) not in lists:
            lists.add(id(f))
            frames += len(f)
            if frames > frame_cap:
                raise SnapshotTooBig(f"{label}: its distinct frame lists hold more than {frame_cap:,} frames "
                                     f"from {n_bytes:,} bytes of pickle")

    if type(snap) is not dict:
        return {}
    traces = snap.get("device_traces")
    if type(traces) is list:
        if len(traces) > MAX_DEVICES:
            raise SnapshotError(f"{label}: device_traces: {len(traces):,} devices, more than {MAX_DEVICES:,}")
        for entries in traces:
            if type(entries) is list:
                more_rows(len(entries))
                for e in entries:
                    frames_of(e)
    segments = snap.get("segments")
    if type(segments) is list:
        more_rows(len(segments))
        for s in segments:
            frames_of(s)
            blocks = s.get("blocks") if type(s) is dict else None
            if type(blocks) is list:
                more_rows(len(blocks))
                for b in blocks:
                    frames_of(b)
    annotations = snap.get("external_annotations")
    if type(annotations) is list:
        more_rows(len(annotations))
    return {"rows": rows, "frames": frames, "row_cap": row_cap, "frame_cap": frame_cap}
