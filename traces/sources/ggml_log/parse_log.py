"""One AT_PRINTF line -> one structured item, for every ggml-alloc generation.

Returns an `Event` for allocator decisions, a small tuple for markers the
importer needs (graph headers, program-flow hints), or PROGRAM for anything
else. Allocator text glued after program output is found anywhere in a line.
"""
from __future__ import annotations

import itertools
import json
import re

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError

from alloctrace.traces.store.columns import FIELDS, _row
from alloctrace.traces.store.schema import MAX_BYTES, MAX_COUNT, MAX_GRAPH

INT_MAX = (1 << 63) - 1
BLANK = ("blank",)
PROGRAM = ("program",)
DEBUG = ("debug",)
AUTO_REALLOC = ("auto_realloc",)
STEP = Event("step")  # what blank lines become; shared, read-only (see LineMemo)
BARRIER = Event("barrier")


class AbsurdNumber(ValueError, UserError):
    """A number no real log holds; the importer names the file and line."""


def num(s: str) -> int:
    v = int(s)
    if v > INT_MAX or v < -INT_MAX:
        raise AbsurdNumber(s if len(s) < 40 else s[:37] + "...")
    return v


def _short(s: str) -> str:
    return s if len(s) < 40 else s[:37] + "..."


def nbytes(s: str) -> int:
    """A byte count: 0 .. 1 PiB."""
    v = int(s)
    if not 0 <= v <= MAX_BYTES:
        raise AbsurdNumber(f"{_short(s)} bytes")
    return v


def block_index(s: str) -> int:
    """A free-block index: -1 (none / the fallback) or above."""
    v = int(s)
    if not -1 <= v <= MAX_COUNT:
        raise AbsurdNumber(f"block {_short(s)}")
    return v


def graph_number(s: str) -> int:
    v = int(s)
    if not 0 <= v <= MAX_GRAPH:
        raise AbsurdNumber(f"graph {_short(s)} (at most {MAX_GRAPH:,})")
    return v


def ptr(s: str | None) -> int | None:
    if s is None:
        return None
    if s == "(nil)":
        return 0
    if len(s) > 18:
        raise AbsurdNumber(s[:37])
    return num(str(int(s, 16)))


P = r"(0x[0-9a-fA-F]+|\(nil\))"
ALLOC = re.compile(r"ggml_\w*: allocating (.*) \((-?\d+) bytes\) - "
                   r"(?:block (-?\d+)(?:, addr " + P + r")?(?:, offset (\d+))?(?:, chunk (\d+))?)?$")
FREE = re.compile(r"ggml_\w*: freeing (.*?)(?: at (?:\{chunk=(\d+), offset=(\d+)\}|" + P + r"|(\d+)))? "
                  r"\((-?\d+) bytes\) - n_free_blocks = (-?\d+)$")
FREE_EXTRA = re.compile(r"freeing extra (\d+) bytes from parent (.*) for (.*)$")
NOT_FREED = re.compile(r"not freeing output (.*)$")
EXEC = re.compile(r"exec: (\S*) \((.*)\) <= (.*)$")
PARENT = re.compile(r"parent (.*): (-?\d+) children, (-?\d+) views, allocated: (-?\d+)$")
VIEW_SRC = re.compile(r"view_src (.*): (-?\d+) children, (-?\d+) views$")
REUSE_VIEW = re.compile(r"reusing view parent (.*) \((.*)\) for (.*)$")
REUSE = re.compile(r"reusing parent (.*) for (.*)$")
NO_REUSE = re.compile(r"not reusing parent (.*) for (.*) as (?:" + P + r" is external|(layouts are different)"
                      r"|(it is an output))$")
GRAPH = re.compile(r"####### graph (-?\d+)/(-?\d+)$")
INOUT = re.compile(r"^(input|output): (.*)$")
OOM_2023 = re.compile(r"not enough space in the buffer \(needed (\d+), largest block available (\d+)\)$")
OOM_NAMED = re.compile(r"not enough space in the buffer to allocate (.*) \(needed (\d+), (?:largest block )?"
                       r"available (\d+)\)$")
OOM_BYTES = re.compile(r"not enough space in the buffer to allocate (\d+) bytes, largest block available "
                       r"(\d+) bytes$")
OOM_PREFIX = re.compile(r"allocating (.*) \((\d+) bytes\) - ")
NEEDS_REALLOC = re.compile(r"ggml_gallocr_needs_realloc: (.*)$")
BUFFER = re.compile(r"ggml_\w*: reallocating (\S*) buffer from size ([\d.]+) MiB to ([\d.]+) MiB$")
ASSERT = re.compile(r"GGML_ASSERT: (.*):(\d+): (.*)$")
DATA_ADDR = re.compile(r"ggml_\w*: allocated data at " + P + "$")
VM_BASE = re.compile(r"virtual memory for measure buffer at " + P)
BUFFER_SIZE = re.compile(r"buffer size = (\d+) bytes")
ALIGNMENT = re.compile(r"\balignment[ =](\d+)\b")


MAX_SCAN = 4096  # allocator text is short and sits at a line's end; longer lines are cut from the left


def _glued(line: str, m, ev: Event):
    """`ev`, or ("glued", ev) when program output precedes the allocator text on its line: output the
    program printed between two graph walks (logs without graph markers are split there)."""
    return ("glued", ev) if m.start() and not line[:m.start()].isspace() else ev


def parse_line(line: str):
    """The item one log line stands for (see the module docstring)."""
    if not line or line == "\r":
        return BLANK
    if len(line) > MAX_SCAN:
        line = line[-MAX_SCAN:]
    if line.startswith("max_size") and " MB: tensors:" in line:
        return DEBUG  # GGML_ALLOCATOR_DEBUG
    if "allocating " in line:
        if "not enough space" in line:
            return _oom(line)
        m = ALLOC.search(line)
        if m:
            name, size, block, addr, off, chunk = m.groups()
            return _glued(line, m, Event("alloc", tensor=name, size=nbytes(size),
                                         block=None if block is None else block_index(block), addr=ptr(addr),
                                         offset=None if off is None else nbytes(off),
                                         chunk=None if chunk is None else num(chunk)))
    if "freeing " in line:
        m = FREE.search(line)
        if m:
            name, hchunk, hoff, addr, off, size, nfree = m.groups()
            ev = Event("free", tensor=name, size=nbytes(size), n_free_before=block_index(nfree), addr=ptr(addr))
            if hchunk is not None:
                ev.chunk, ev.offset = num(hchunk), nbytes(hoff)
            elif off is not None:
                ev.offset = nbytes(off)
            return _glued(line, m, ev)
        m = FREE_EXTRA.search(line)
        if m:
            return Event("free_extra", size=nbytes(m.group(1)), parent=m.group(2), tensor=m.group(3))
        m = NOT_FREED.search(line)
        if m:
            return Event("not_freed", tensor=m.group(1))
    if "exec: " in line:
        m = EXEC.search(line)
        if m:
            srcs = m.group(3)
            return _glued(line, m, Event("exec", op=m.group(1), tensor=m.group(2),
                                         srcs=srcs.split(", ") if srcs else []))
    if "children, " in line:
        m = PARENT.search(line)
        if m:
            return Event("parent", tensor=m.group(1), children=num(m.group(2)), views=num(m.group(3)),
                         allocated=num(m.group(4)))
        m = VIEW_SRC.search(line)
        if m:
            return Event("view_src", tensor=m.group(1), children=num(m.group(2)), views=num(m.group(3)))
    if "reusing " in line:
        return _reuse(line) or PROGRAM
    if "#######" in line:
        m = GRAPH.search(line)
        if m:
            return ("graph", graph_number(m.group(1)), graph_number(m.group(2)))
    if "not enough space" in line:
        return _oom(line)
    if "ggml_" in line:
        return _other_ggml(line)
    if line.startswith(("input: ", "output: ")):
        m = INOUT.match(line)
        return Event(m.group(1), tensor=m.group(2))
    if "GGML_ASSERT" in line:
        return _assert(line)
    return _program(line)


def _reuse(line: str):
    if "not reusing" in line:
        m = NO_REUSE.search(line)
        if m:
            parent, node, addr, layout, output = m.groups()
            reason = "external" if output is None and layout is None else ("layout" if layout else "output")
            return Event("no_reuse", parent=parent, tensor=node, reason=reason, addr=ptr(addr))
        return None
    m = REUSE_VIEW.search(line)
    if m:
        return Event("reuse", parent=m.group(1), view_src=m.group(2), tensor=m.group(3))
    m = REUSE.search(line)
    if m:
        return Event("reuse", parent=m.group(1), tensor=m.group(2))
    return None


def _oom(line: str):
    m = OOM_2023.search(line)
    if m:
        ev = Event("oom", needed=nbytes(m.group(1)), largest=nbytes(m.group(2)))
        pre = OOM_PREFIX.search(line)
        if pre:
            ev.tensor = pre.group(1)
        return ev
    m = OOM_NAMED.search(line)
    if m:
        return Event("oom", tensor=m.group(1), needed=nbytes(m.group(2)), largest=nbytes(m.group(3)),
                     extra={"format": "named"})
    m = OOM_BYTES.search(line)
    if m:
        return Event("oom", needed=nbytes(m.group(1)), largest=nbytes(m.group(2)), extra={"format": "bytes"})
    return _assert(line) if "GGML_ASSERT" in line else PROGRAM


def _other_ggml(line: str):
    m = NEEDS_REALLOC.search(line)
    if m:
        return Event("realloc", reason=m.group(1))
    if line.endswith("reallocating buffers automatically"):
        return AUTO_REALLOC
    m = BUFFER.search(line)
    if m:
        return ("buffer", m.group(1), float(m.group(2)), float(m.group(3)))
    m = DATA_ADDR.search(line)
    if m:
        return ("data_addr", ptr(m.group(1)))
    m = VM_BASE.search(line)
    if m:
        return ("vm_base", ptr(m.group(1)))
    if "alloc->data = " in line:
        return DEBUG
    if "GGML_ASSERT" in line:
        return _assert(line)
    return _program(line)


def _assert(line: str):
    m = ASSERT.search(line)
    if not m:
        return PROGRAM
    return ("assert", num(m.group(2)) if len(m.group(2)) < 12 else 0, m.group(3))


def _program(line: str):
    """Program output; a few phrases tell the importer about the program's flow."""
    low = line.lower()
    if "compute buffer" in low:
        return ("compute_buffer",)
    if "measure allocator" in low:
        return ("measure_next",)
    if "buffer size = " in low:
        m = BUFFER_SIZE.search(low)
        if m:
            return ("buffer_size", nbytes(m.group(1)))
    if "alignment" in low:
        m = ALIGNMENT.search(low)
        if m:
            return ("alignment", num(m.group(1)))
    return PROGRAM


class LineMemo:
    """parse_line with a memo: a log repeats the same lines graph after graph, and a dict
    lookup costs a fraction of the regex work. Exact, since parse_line depends on the line
    alone. Repeated lines give the *same* Event object: items are read-only until `own`
    copies them.

    `number(item_key(item))` names an item's values by a number never given to other
    values; `keys` holds the numbers of the shared Events, by id (the memo keeps them alive)."""

    LIMIT = 1 << 16  # distinct lines remembered; the memo starts over when full
    LONGEST = 512  # longer lines are rare and not worth keeping

    def __init__(self):
        self.memo: dict = {}
        self.keys: dict[int, int] = {}
        self.numbers: dict[tuple, int] = {}
        self._next = itertools.count()  # never restarts, so a number keeps meaning one value
        self._start()

    def _start(self):
        self.memo.clear()
        self.keys.clear()
        self.numbers.clear()
        for ev in (STEP, BARRIER):
            self.keys[id(ev)] = self.number(item_key(ev))

    def number(self, key: tuple) -> int:
        n = self.numbers.get(key)
        if n is None:
            n = self.numbers[key] = next(self._next)
        return n

    def __call__(self, line: str):
        hit = self.memo.get(line)
        if hit is not None:
            return hit
        item = parse_line(line)
        if len(line) <= self.LONGEST:
            if len(self.memo) >= self.LIMIT:
                self._start()
            self.memo[line] = item
            ev = item[1] if type(item) is tuple and item[0] == "glued" else item
            if type(ev) is Event:
                self.keys[id(ev)] = self.number(item_key(ev))
        return item


_SRCS = FIELDS.index("srcs")
_EXTRA = FIELDS.index("extra")


def item_key(item) -> tuple:
    """A hashable copy of one parsed item's values (marker tuples are their own key)."""
    if type(item) is not Event:
        return item
    row = _row(item)
    if item.srcs is not None:
        row = row[:_SRCS] + (tuple(item.srcs),) + row[_SRCS + 1:]
    return row[:_EXTRA] + (json.dumps(item.extra, sort_keys=True) if item.extra else None,) + row[_EXTRA + 1:]


def copy_event(ev: Event) -> Event:
    """An Event of its own, equal to `ev` (lists and dicts copied too)."""
    new = Event(*_row(ev))
    if ev.srcs is not None:
        new.srcs = list(ev.srcs)
    if ev.extra:  # an empty one is shared: extras are replaced, never changed in place
        new.extra = dict(ev.extra)
    return new


def own(items: list, kinds=None) -> list:
    """Draft items with every Event (or every Event of `kinds`) copied, so filling them in
    touches no shared one."""
    if kinds is None:
        return [copy_event(it) if type(it) is Event else it for it in items]
    return [copy_event(it) if type(it) is Event and it.kind in kinds else it for it in items]
