"""A recording as a trace source: one trace per recorded process that used ggml's graph allocator.

Written to the sources contract (`name`, `sniff`, `read` -> `ImportedTrace`s);
registered with the sources seam, so `alloctrace import` and uploads read recordings too.
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from alloctrace.traces.store.schema import TraceMeta
from alloctrace.traces.sources.base import ImportedTrace

from alloctrace.traces.sources.record.plans import Replayer
from alloctrace.traces.sources.record.stream import MAGIC, RecordingError, read_processes

NO_GGML = ("no ggml allocator calls were seen: the recorded program never used ggml's graph allocator (a run "
           "that failed early, or ggml linked into the program itself: `alloctrace record` says which)")


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

    def read(self, stream: BinaryIO, *, filename: str, name: str | None,
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
