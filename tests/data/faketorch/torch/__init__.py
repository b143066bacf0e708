"""A stand-in for `torch` in tests of the record hook: a tiny CUDA caching allocator that keeps a memory history
only while `cuda.memory._record_memory_history` has it on, and writes snapshots in torch's layout."""
import pickle
import types

MiB = 1 << 20


class OutOfMemoryError(RuntimeError):
    pass


class _Allocator:
    def __init__(self):
        self.history = None  # the settings, while recording
        self.entries, self.segments, self.next_addr = [], [], 1 << 40
        self.calls = []

    def record(self, enabled="all", context="all", stacks="python", max_entries=1):
        self.calls.append({"enabled": enabled, "stacks": stacks, "max_entries": max_entries, "entries_before":
                           len(self.entries), "segments_before": len(self.segments)})
        self.history = None if enabled is None else {"stacks": stacks, "max_entries": max_entries}

    def _log(self, action, addr, size):
        if self.history is not None:
            self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": len(self.entries),
                                 "frames": [{"name": "main", "filename": "train.py", "line": 1}],
                                 "compile_context": "N/A", "user_metadata": ""})

    def alloc(self, size):
        rounded = (size + 511) // 512 * 512
        seg_size = (rounded + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        addr, self.next_addr = self.next_addr, self.next_addr + seg_size
        self._log("segment_alloc", addr, seg_size)
        self._log("alloc", addr, size)
        self.segments.append({"device": 0, "address": addr, "total_size": seg_size, "stream": 0,
                              "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                              "frames": [], "blocks": [
                                  {"address": addr, "size": rounded, "requested_size": size,
                                   "state": "active_allocated", "frames": []}]
                              + ([{"address": addr + rounded, "size": seg_size - rounded, "requested_size": 0,
                                   "state": "inactive", "frames": []}] if seg_size > rounded else [])})
        return Tensor(addr, size)

    def free(self, t):
        self._log("free_requested", t.addr, t.size)
        self._log("free_completed", t.addr, t.size)
        for s in self.segments:
            for b in s["blocks"]:
                if b["address"] == t.addr:
                    b["state"], b["requested_size"], b["frames"] = "inactive", 0, []

    def snapshot(self):
        return {"segments": [dict(s, blocks=[dict(b) for b in s["blocks"]], allocated_size=0, active_size=0,
                                  requested_size=0) for s in self.segments],
                "device_traces": [list(self.entries)], "allocator_settings": {}, "external_annotations": []}


ALLOCATOR = _Allocator()


class Tensor:
    def __init__(self, addr, size):
        self.addr, self.size = addr, size

    def free(self):
        ALLOCATOR.free(self)


_queued_calls = []
_initialized = False
is_available_calls = []


def _lazy_call(callable):
    """Like torch's: now when CUDA is initialised, else at its first initialisation."""
    if _initialized:
        callable()
    else:
        _queued_calls.append(callable)


def _lazy_init():
    """Like torch's: the first CUDA use initialises it, then runs the queued calls."""
    global _initialized
    if not _initialized:
        _initialized = True
        for call in _queued_calls:
            call()


def _is_available():
    is_available_calls.append(1)
    return True


def empty(nbytes):
    """Allocate `nbytes` on the fake GPU (the first one initialises CUDA)."""
    _lazy_init()
    return ALLOCATOR.alloc(nbytes)


def _dump(path):
    with open(path, "wb") as f:
        pickle.dump(ALLOCATOR.snapshot(), f, protocol=4)


memory = types.SimpleNamespace(_record_memory_history=ALLOCATOR.record, _snapshot=ALLOCATOR.snapshot,
                               _dump_snapshot=_dump)
cuda = types.SimpleNamespace(is_available=_is_available, memory=memory, OutOfMemoryError=OutOfMemoryError,
                             _lazy_call=_lazy_call, is_initialized=lambda: _initialized, init=_lazy_init)
