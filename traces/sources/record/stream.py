"""Read a recording: the line stream `recorder.c` writes (format in docs/record.md).

`read_processes` yields one `Process` per `ATREC` header; each process's allocator
calls arrive through `Process.calls` as they finish (their `R` line), so a long
run is replayed call by call instead of being held in memory. Calls a crash cut
short come last, with `rc=None`.
"""
from __future__ import annotations

import json
from alloctrace.allocator.record_class import record_class, field
from collections.abc import Iterator
from io import BufferedIOBase  # a binary stream (typing's BinaryIO would cost a short command its import)

from alloctrace.traces.errors import UserError

from alloctrace.traces.sources.sniffers import RECORDING_MAGIC as MAGIC  # the registry knows it too
MAX_LINE = 1 << 24  # a graph line is short; a buffer-id line has one number per node
MAX_TENSORS = 1 << 20  # per call (a 70B LLaMA graph has about 10,000)
MAX_CALLS_OPEN = 4096
READ_BLOCK = 1 << 20

GALLOC_CALLS = ("reserve_n", "reserve_n_size", "alloc_graph")
INPUT, OUTPUT, PARAM = 1, 2, 4


class RecordingError(UserError):
    pass


@record_class(slots=True)
class TensorRec:
    """One tensor as the recorder read it (pointers as ints, 0 for NULL)."""

    kind: str  # "l" leaf, "n" node, "x" referenced from the graph but in neither list
    ptr: int
    type: str
    op: str
    desc: str
    flags: int
    ne: tuple
    nb: tuple
    nbytes: int
    data: int
    buffer: int
    view_src: int
    view_offs: int
    srcs: list
    alloc_sizes: tuple  # per buffer id, only when a buffer type pads beyond nbytes
    name: str


@record_class
class BufferType:
    ptr: int
    alignment: int
    max_size: int
    name: str


@record_class
class Call:
    seq: int
    kind: str  # reserve_n | reserve_n_size | alloc_graph | sched_reserve | sched_alloc_graph | ...
    obj: int  # the gallocr (or scheduler)
    graph: int
    parent: int
    dumped: bool = False  # its graph was recorded (the recorder refuses unknown layouts)
    n_nodes: int = 0
    n_leafs: int = 0
    tensors: list = field(default_factory=list)  # TensorRec, parsed from `lines` when first asked (tensor_records)
    lines: list = field(default_factory=list)  # the graph's tensor lines as recorded (a fast replay reads these)
    line_nos: list = field(default_factory=list)  # where each one is in the recording (for errors)
    node_ids: list | None = None
    leaf_ids: list | None = None
    rc: int | None = None  # None: the program died inside the call
    sizes: list = field(default_factory=list)  # after the call: ggml_gallocr_get_buffer_size per id (or reserve_n_size's)
    placements: list = field(default_factory=list)  # (kind P|V, tensor, buffer, data, base)
    buffers: list = field(default_factory=list)  # (buft, size, buffer, base, real size) made inside the call
    children: list = field(default_factory=list)  # finished calls made from inside this one


@record_class
class Process:
    pid: int
    bufts: dict = field(default_factory=dict)  # ptr -> BufferType
    gallocs: dict = field(default_factory=dict)  # ptr -> (serial, [buft ptr, ...]); freed ones dropped
    ggml: dict = field(default_factory=dict)  # version, commit, layout
    errors: list = field(default_factory=list)
    signal: int | None = None  # the program died of this signal
    program: dict = field(default_factory=dict)  # from the runner's Z line: argv, exit status
    n_gallocs: int = 0


def _int(tok: str) -> int:
    """A pointer (`%p`: 0x..., or (nil)) or a plain number."""
    if tok[:2] == "0x":
        return int(tok, 16)
    return 0 if tok == "(nil)" else int(tok)


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append({"n": "\n", "r": "\r"}.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_tensor(f: list) -> TensorRec:
    """A tensor line, split at spaces (a name may hold spaces: it is the rest of the line)."""
    if len(f) < 21:
        raise ValueError("short tensor line")
    n_src = int(f[19])
    k = 20 + n_src
    n_sizes = int(f[k])
    flags, ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3, nbytes = map(int, f[5:15])
    data, buffer, view_src = f[15:18]  # mostly NULL: (nil) without a call
    return TensorRec(f[0], _int(f[1]), f[2], f[3], f[4], flags, (ne0, ne1, ne2, ne3), (nb0, nb1, nb2, nb3), nbytes,
                     0 if data == "(nil)" else _int(data), 0 if buffer == "(nil)" else _int(buffer),
                     0 if view_src == "(nil)" else _int(view_src), int(f[18]), [_int(x) for x in f[20:k]],
                     tuple(map(int, f[k + 1:k + 1 + n_sizes])) if n_sizes else (),
                     _unescape(" ".join(f[k + 1 + n_sizes:])))


def tensor_records(call: Call) -> list[TensorRec]:
    """The call's tensors, parsed from its recorded lines the first time they are asked for (a reserve the
    compiled replay takes never needs them in Python). A graph repeated from an earlier call shares that
    call's lists, so either call's parse serves both."""
    if len(call.tensors) < len(call.lines):
        for no, line in zip(call.line_nos[len(call.tensors):], call.lines[len(call.tensors):]):
            try:
                call.tensors.append(parse_tensor(line.split(" ")))
            except (ValueError, IndexError) as e:
                raise RecordingError(f"recording line {no}: {e}: {line[:120]!r}") from None
    return call.tensors


def _lines(stream: BufferedIOBase, max_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number, line) of every whole line, read a block at a time (a line at a time costs a sweep's
    point more than its replay); a line of MAX_LINE bytes or more, or more than `max_bytes` in all, is an error."""
    total, no, rest = 0, 0, b""
    while True:
        block = stream.read(READ_BLOCK)
        if not block:
            return  # what is left has no newline: the last line of a killed program may be cut
        lines = (rest + block).split(b"\n") if rest else block.split(b"\n")
        rest = lines.pop()
        for raw in lines:
            no += 1
            total += len(raw) + 1
            if total > max_bytes:
                raise RecordingError(f"recording larger than {max_bytes:,} bytes")
            if len(raw) >= MAX_LINE:
                raise RecordingError(f"line {no}: longer than {MAX_LINE:,} bytes")
            yield no, raw.decode("utf-8", "replace")
        if total + len(rest) > max_bytes:
            raise RecordingError(f"recording larger than {max_bytes:,} bytes")
        if len(rest) >= MAX_LINE:
            raise RecordingError(f"line {no + 1}: longer than {MAX_LINE:,} bytes")


def read_processes(stream: BufferedIOBase, on_call, *, max_bytes: int = 1 << 36) -> list[Process]:
    """Parse the stream; `on_call(process, call)` gets every finished top-level call in order.
    Calls made inside another recorded call are attached to it as `children` instead."""
    procs: list[Process] = []
    proc: Process | None = None
    open_calls: dict[int, Call] = {}
    current: Call | None = None  # the call the g/l/n/x/i/j lines belong to
    last_dump: dict[int, Call] = {}  # per gallocr: the call whose graph a `g ... =SEQ` line repeats

    def finish(call: Call):
        parent = open_calls.get(call.parent)
        if parent is not None:
            parent.children.append(call)
        else:
            on_call(proc, call)

    def close_process():
        # calls still open: the program died inside them; innermost first
        for seq in sorted(open_calls, reverse=True):
            finish(open_calls.pop(seq))

    for no, line in _lines(stream, max_bytes):
        if not line:
            continue
        kind = line[0]
        try:
            if line.startswith("ATREC "):
                if proc is not None:
                    close_process()
                if not line.startswith(MAGIC.decode()):
                    raise RecordingError(f"line {no}: unsupported recording version {line!r}")
                parts = line.split()
                proc = Process(pid=int(parts[2]) if len(parts) > 2 else 0)
                procs.append(proc)
                open_calls, current, last_dump = {}, None, {}
                continue
            if proc is None:
                raise RecordingError("not a recording (no ATREC header)")
            if kind in "lnx" and " " in line:  # parsed when the call is replayed (tensor_records)
                if current is None:
                    raise ValueError("tensor outside a call")
                if len(current.lines) >= MAX_TENSORS:
                    raise RecordingError(f"line {no}: more than {MAX_TENSORS:,} tensors in one graph")
                current.lines.append(line)
                current.line_nos.append(no)
                continue
            f = line.split(" ")
            if kind == "P" or kind == "V":
                call = open_calls.get(int(f[1]))
                if call is not None:
                    call.placements.append((kind, _int(f[2]), _int(f[3]), _int(f[4]), _int(f[5])))
            elif kind == "C":
                call = Call(seq=int(f[1]), kind=f[2], obj=_int(f[3]), graph=_int(f[4]), parent=int(f[5]))
                if len(open_calls) >= MAX_CALLS_OPEN:
                    raise RecordingError(f"line {no}: more than {MAX_CALLS_OPEN} calls open at once")
                open_calls[call.seq] = call
                current = call
            elif kind == "g":
                current = open_calls.get(int(f[1]))
                if current is None:
                    raise ValueError("graph of an unknown call")
                current.n_nodes, current.n_leafs = int(f[2]), int(f[3])
                current.dumped = True
                if len(f) > 4:  # the same graph as this gallocr's previous dump
                    prev = last_dump.get(current.obj)
                    if prev is None or f[4] != f"={prev.seq}":
                        raise ValueError(f"graph repeats call {f[4][1:]}, which this gallocr did not record last")
                    current.tensors, current.node_ids, current.leaf_ids = prev.tensors, prev.node_ids, prev.leaf_ids
                    current.lines, current.line_nos = prev.lines, prev.line_nos
                else:
                    last_dump[current.obj] = current
            elif kind == "i" or kind == "j":
                ids = list(map(int, f[1:]))
                if current is None:
                    raise ValueError("buffer ids outside a call")
                if kind == "i":
                    current.node_ids = ids
                else:
                    current.leaf_ids = ids
            elif kind == "R":
                call = open_calls.pop(int(f[1]), None)
                if call is not None:
                    call.rc = int(f[2])
                    call.sizes = list(map(int, f[3:]))
                    finish(call)
                current = None
            elif kind == "B":
                call = open_calls.get(int(f[1]))
                rec = (_int(f[2]), int(f[3]), _int(f[4]), _int(f[5]), int(f[6]))
                if call is not None:
                    call.buffers.append(rec)
            elif kind == "T":
                proc.bufts[_int(f[1])] = BufferType(_int(f[1]), int(f[2]), int(f[3]), _unescape(" ".join(f[4:])))
            elif kind == "N":
                n = int(f[2])
                proc.n_gallocs += 1
                proc.gallocs[_int(f[1])] = (proc.n_gallocs - 1, [_int(x) for x in f[3:3 + n]])
            elif kind == "F":
                proc.gallocs.pop(_int(f[1]), None)
            elif kind == "H":
                proc.ggml = {"version": f[2], "commit": f[3], "layout": f[5] if len(f) > 5 else "?"}
            elif kind == "E":
                proc.errors.append(line[2:])
            elif kind == "X":
                proc.signal = int(f[1])
            elif kind == "Z":
                proc.program = json.loads(line[2:])
            else:
                raise ValueError(f"unknown line kind {kind!r}")
        except RecordingError:
            raise
        except (ValueError, IndexError, json.JSONDecodeError) as e:
            raise RecordingError(f"recording line {no}: {e}: {line[:120]!r}") from None
    if proc is not None:
        close_process()
    if not procs:
        raise RecordingError("not a recording (no ATREC header)")
    return procs
