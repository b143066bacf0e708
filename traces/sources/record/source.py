"""A recording as a trace source: one trace per recorded process that used ggml's graph allocator.

Written to the sources contract (`name`, `sniff`, `read` -> `ImportedTrace`s);
registered with the sources seam, so `alloctrace import` and uploads read recordings too.
"""
from __future__ import annotations

from pathlib import Path
from io import BufferedIOBase  # a binary stream (typing's BinaryIO would cost a short command its import)

from alloctrace.traces.store.schema import TraceMeta
from alloctrace.traces.sources.base import ImportedTrace

from alloctrace.traces.sources.record.plans import Replayer
from alloctrace.traces.sources.record.stream import MAGIC, RecordingError, read_processes

NO_GGML = "no ggml allocator calls were seen"
TAIL_LINES, TAIL_CHARS = 3, 600  # of a failed program's output, in its message


def no_allocator_calls(exit_status: int | None, output: str | None = None, program: str | None = None) -> str:
    """Why a run left no recording, from what is known rather than a guess: the program's exit status (or the
    signal that killed it) and its own last lines (`output`: None when they went to the terminal); for a
    program that ran to the end, whether it holds ggml's allocator itself (linked statically)."""
    import signal

    if exit_status:
        how = (f"was killed by {signal.Signals(exit_status - 128).name}"
               if 128 < exit_status < 128 + 65 and exit_status - 128 in signal.Signals._value2member_map_
               else f"exited with status {exit_status}")
        said = last_lines(output) if output else ""
        return (f"{NO_GGML}: the program {how} before using ggml's graph allocator"
                + (f"; its last lines: {said}" if said else "; its output is above" if output is None else
                   "; its output was empty (a logger thread can lose the last lines of a program that exits at "
                   "once: run it by hand to see why)"))
    from alloctrace.traces.sources.record.program import holds_ggml_allocator

    if program and holds_ggml_allocator(program):
        return (f"{NO_GGML}: {program} has ggml linked in statically, so its calls never reach the recorder: "
                "build it with shared libraries (-DBUILD_SHARED_LIBS=ON)")
    return (f"{NO_GGML}: the program ended normally (exit status 0) without allocating a ggml graph (does this "
            "run build one? a model that fails to load, --help or a dry run of another tool allocates none)")


def last_lines(output: str) -> str:
    """A program's last non-empty lines, joined with ' | ', at most TAIL_CHARS (their end)."""
    lines = [line.strip() for line in output[-8 * TAIL_CHARS:].splitlines() if line.strip()]
    text = " | ".join(lines[-TAIL_LINES:])
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def unknown_layout(fields: list) -> str:
    """`E layout VERSION COMMIT N_MATCHES FROM` as one message with the remedy."""
    version, commit, source = fields[1], fields[2], fields[4] if len(fields) > 4 else "builtin"
    what = f"ggml {version}" + (f" (commit {commit})" if commit not in ("-", "unknown") else "")
    if source == "ggml.h":
        return (f"unknown ggml struct layout: the ggml.h given with --ggml-include does not match the {what} "
                "the program runs; point it at the header the program was built with")
    return (f"unknown ggml struct layout for {what}: no struct ggml_tensor layout alloctrace knows (2024-02 to "
            "today) matches; point --ggml-include at the ggml.h the program was built with")


class RecordingSource:
    """`alloctrace record` streams (ATREC)."""

    name = "recording"

    def sniff(self, head: bytes) -> bool:
        return head.startswith(MAGIC)

    def read(self, stream: BufferedIOBase, *, filename: str, name: str | None,
             events: list | None = None) -> list[ImportedTrace]:
        """`events`, when given, gets one {graph index: [Event, ...]} per trace returned, in order: the replay's
        own events, for a caller that sums a graph up right away instead of decoding what was just encoded
        (up to replay.MAX_KEPT_EVENTS of them per process: a graph past that is left out, to be decoded)."""
        replayers: dict[int, Replayer] = {}

        def on_call(proc, call):
            r = replayers.get(id(proc))
            if r is None:
                r = replayers[id(proc)] = Replayer(proc, keep_events=events is not None)
            r.on_call(proc, call)

        procs = read_processes(stream, on_call)
        out = []
        for proc in procs:
            r = replayers.get(id(proc))
            layout = [e.split() for e in proc.errors if e.startswith("layout ")]
            if layout:
                raise RecordingError(unknown_layout(layout[0]))
            if proc.errors and (r is None or not r.graphs):
                raise RecordingError(f"the recorder could not read the program's graphs: {proc.errors[0]}")
            if r is None or not r.graphs:
                continue
            base = name or Path(filename).name
            label = base if len(procs) == 1 else f"{base} [pid {proc.pid}]"
            consistent = sum(1 for g in r.graphs if g.consistent)
            report = {"pid": proc.pid, "graphs": len(r.graphs), "consistent": consistent,
                      "inconsistent": len(r.graphs) - consistent, "placements": r.n_placements,
                      "ggml": proc.ggml, "signal": proc.signal, "skipped": r.skipped[:10], **proc.program}
            meta = TraceMeta(name=label, source=self.name, generation=r.profile, profile=r.profile,
                             tags=["recording"], extra={"recording": report})
            out.append(ImportedTrace(meta, r.graphs, report))
            if events is not None:
                events.append(r.events)
        if not out:
            raise RecordingError(NO_GGML)
        return out


SOURCE = RecordingSource()
