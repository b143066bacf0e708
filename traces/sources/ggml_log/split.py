"""Split a stream of parsed log items into graphs (drafts), noting program-flow hints.

A draft is one allocator graph walk as logged, before offsets are recovered.
Rules: `####### graph` starts a walk (allocations logged since the previous walk's
last node are explicit allocations of the new graph); a head `needs_realloc`
starts a re-plan; without graph headers, an allocation after program output or
at the start of a still-live allocation starts a new walk.
"""
from __future__ import annotations

from alloctrace.allocator.events import Event

from alloctrace.traces.sources.ggml_log.drafts import Draft, Features  # noqa: F401 (where they were defined before)
from alloctrace.traces.sources.ggml_log.parse_log import AUTO_REALLOC, BARRIER, BLANK, DEBUG, STEP, copy_event


class Splitter:
    """Items in drafts may be shared between drafts (parsed lines, blank-line Events):
    copy them with parse_log.own before changing them."""

    # what feeding a line reads and writes besides the open draft, the features and `pending`
    # (split_fast.py keys on these; a new attribute that feeding depends on belongs here)
    FEED_STATE = ("gap", "prev_alloc_line", "exec_since_blank", "setup_at")

    def __init__(self):
        self.cur: Draft | None = None
        self.pending: dict = {}
        self.features = Features()
        self.headers_seen = False
        self.gap = False  # program output since the last allocator line of a started walk
        self.prev_alloc_line = False
        self.exec_since_blank = 0
        self.live: set = set()  # (chunk, offset or addr) of logged live allocations in the current walk
        self.last_alloc: Event | None = None
        # logs without graph markers: allocations followed by program output before any walk started are
        # the program's own set-up (weights, KV cache, inputs in buffers of their own), not a graph's:
        # how many items of the open draft they are, dropped when the walk starts
        self.setup_at: int | None = None

    def _new(self, items=None) -> Draft | None:
        """Open the next draft (taking the pending hints); returns the one it ends, if any."""
        done = self.cur
        d = Draft(items=items or [])
        for k, v in self.pending.items():
            setattr(d, k, v)
        self.pending = {}
        self.cur, self.gap, self.exec_since_blank = d, False, 0
        self.live = set()
        return done if done is not None and done.items else None

    def feed(self, item):
        """Take one parsed item; returns a finished Draft or None."""
        if type(item) is Event:
            return self._event(item)
        kind = item[0]
        if kind == "glued":  # program output, then allocator text on the same line
            started = self.cur is not None and self.cur.n_exec > 0
            self.gap = self.gap or started
            done = self._new() if started and not self.headers_seen else None
            return self._event(item[1]) or done
        if item is BLANK:
            if self.cur is not None and self.prev_alloc_line:
                self.cur.items.append(BARRIER if self.exec_since_blank > 1 else STEP)
                self.exec_since_blank = 0
            self.prev_alloc_line = False
            return None
        self.prev_alloc_line = kind not in ("program", "compute_buffer", "measure_next", "buffer_size",
                                            "alignment")
        if kind == "graph":
            return self._header(item)
        if item is DEBUG or item is AUTO_REALLOC:
            return None
        started = self.cur is not None and self.cur.n_exec > 0
        if kind == "buffer":
            if self.cur is not None:
                self.cur.items.append(item)
            self.gap = started
            return None
        if kind == "data_addr":
            if self.last_alloc is not None and self.last_alloc.addr is None:
                self._set_last_addr(item[1])
                self.features.addr = True
            return None
        if kind == "vm_base":
            self.pending["vm_base"] = item[1]
            return None
        if kind == "assert":
            self.features.asserts.append(item[1])
            if "out of free blocks" in item[2] and self.cur is not None:
                self.cur.items.append(Event("abort", reason="out of free blocks"))
            return None
        # program output and the hints it carries
        if not started and not self.headers_seen and self.cur is not None and self.cur.items:
            self.setup_at = len(self.cur.items)
        if kind == "compute_buffer" and started:
            self.cur.compute_after = True
        elif kind == "measure_next":
            self.pending["measure_before"] = True
        elif kind == "buffer_size":
            if started and self.cur.buffer_after is None:
                self.cur.buffer_after = item[1]
            self.pending["buffer_before"] = item[1]
        elif kind == "alignment":
            self.pending["alignment"] = item[1]
            if self.cur is not None and self.cur.alignment is None:
                self.cur.alignment = item[1]
        self.gap = self.gap or started
        return None

    def _set_last_addr(self, addr: int):
        """The last allocation learns its address; parsed Events may be shared, so it gets a copy."""
        ev = self.last_alloc
        new = self.last_alloc = copy_event(ev)
        new.addr = addr
        items = self.cur.items if self.cur is not None else []
        for i in range(len(items) - 1, -1, -1):
            if items[i] is ev:
                items[i] = new
                break

    def _header(self, item) -> Draft | None:
        self.headers_seen = True
        self.setup_at = None
        ev = Event("graph", extra={"g": item[1], "n": item[2]})
        if self.cur is None or self.cur.n_exec == 0:
            if self.cur is None:
                self._new()
            for k, v in self.pending.items():
                setattr(self.cur, k, v)
            self.pending = {}
            self.cur.items.append(ev)
            return None
        items = self.cur.items
        cut = len(items)
        while cut > 0 and isinstance(items[cut - 1], Event) and items[cut - 1].kind == "alloc":
            cut -= 1
        tail = items[cut:]
        del items[cut:]
        return self._new(tail + [ev])

    def _event(self, ev: Event) -> Draft | None:
        self.prev_alloc_line = True
        k = ev.kind
        done = None
        f = self.features
        if k == "alloc":
            f.n_alloc_lines += 1
            if f.first_block is None:
                f.first_block = ev.block
            if ev.chunk is not None:
                f.chunk = True
            elif ev.offset is not None:
                f.offset = True
            if ev.addr is not None:
                f.addr = f.addr_block = True
            key = (ev.chunk, ev.offset if ev.offset is not None else ev.addr)
            started = self.cur is not None and self.cur.n_exec > 0
            if started and not self.headers_seen and (self.gap or (key[1] is not None and key in self.live)):
                done = self._new()
            if key[1] is not None:
                self.live.add(key)
            self.last_alloc = ev
        elif k == "free":
            if ev.chunk is not None:
                f.chunk = True
            elif ev.offset is not None:
                f.offset = True
            if ev.addr is not None:
                f.addr = True
            self.live.discard((ev.chunk, ev.offset if ev.offset is not None else ev.addr))
        elif k == "realloc":
            if self.cur is not None and self.cur.n_exec > 0:
                done = self._new()
        elif k == "exec":
            self.exec_since_blank += 1
            if self.setup_at is not None and self.cur is not None and self.cur.n_exec == 0:
                setup, self.cur.items = self.cur.items[:self.setup_at], self.cur.items[self.setup_at:]
                f.setup_allocs += sum(1 for e in setup if type(e) is Event and e.kind == "alloc")
            self.setup_at = None
        elif k == "parent":
            f.parent_line = True
        if self.cur is None:
            self._new()
        if k == "exec":
            self.cur.n_exec += 1
        self.cur.items.append(ev)
        return done

    def finish(self) -> Draft | None:
        d, self.cur = self.cur, None
        return d if d is not None and d.items else None
