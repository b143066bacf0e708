"""Where traces come from: one module (or sub-package) per source behind one entry point.

`import_file(store, src, name=..., filename=...)` is what every face calls (the
CLI's `import`, the server's upload): it decompresses the input (logio), shows
the first decompressed bytes to each registered source in turn, lets the first
that recognises them read it, and stores what it read in one transaction;
if anything fails, nothing of the file stays stored (`import_files`: nothing of
any of the files).

A source is a small object (see `Source`); register it with `register`. The
ggml log reader is the fallback: it is asked last and refuses input without
allocator lines with one clear error.
"""
from __future__ import annotations

from alloctrace.traces.errors import UserError

# What reading a file needs is imported when one is read (the annotations name `base`'s ImportedTrace and
# Source, `bounded_io`'s Limits): a sweep imports `record.run`, and so this package, before its first
# program starts, and reads nothing there (traces/preflight/points.py).

__all__ = ["ImportedTrace", "Source", "read_file", "store_traces", "import_file", "import_files", "import_paths", "register", "registered"]


_SOURCES: list[Source] = []


def __getattr__(name: str):
    """`ImportedTrace` and `Source` (sources/base.py), imported when first asked for."""
    if name in ("ImportedTrace", "Source"):
        from alloctrace.traces.sources import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(source: Source) -> Source:
    """Add a source (asked before the ones registered earlier); a source of the same name is replaced."""
    _SOURCES[:] = [source] + [s for s in _SOURCES if s.name != source.name]
    return source


def registered() -> list[Source]:
    """The sources in the order they are asked: the registered ones, then the ggml log fallback."""
    from alloctrace.traces.sources.ggml_log import SOURCE as ggml_log
    if not _builtins_registered:
        _register_builtins()
    return [*_SOURCES, ggml_log]


def source_for(head: bytes) -> Source:
    """The first source that recognises `head`; the ggml log fallback is imported only when none other does
    (a recording's import never loads the log reader)."""
    if not _builtins_registered:
        _register_builtins()
    for s in _SOURCES:
        if s.sniff(head):
            return s.load() if hasattr(s, "load") else s
    from alloctrace.traces.sources.ggml_log import SOURCE as ggml_log

    if ggml_log.sniff(head):
        return ggml_log.load() if hasattr(ggml_log, "load") else ggml_log
    raise UserError("no trace source recognises this input")  # unreachable: the fallback reads any text


OWN_RECORDING_IN_PROCESS = 4 << 20  # bytes: what `record` reads of its own recording without a child


def read_file(src, *, name: str | None = None, filename: str | None = None, limits: Limits | None = None,
              progress: bool = False, tags=(), own_recording: bool = False, abandon_if=None,
              **options) -> list[ImportedTrace] | None:
    """Read one input (a path or a binary stream) completely into its stored form, within the
    caps of `limits` (decompressed bytes, CPU time, graphs and stored bytes per input byte,
    cancel), before any store lock is taken: encoded graphs are compact.

    `filename` is what messages and metadata call the input (default: the path's name);
    `options` go to the source when its `read` takes them (e.g. `generation` for ggml logs);
    `tags` (`key=value` strings, store/tags.py) are added to every trace read.

    A path is read in a child process under the memory and CPU caps (sources/child.py). `own_recording`: the
    file is a raw recording `record` just made in its private folder; up to OWN_RECORDING_IN_PROCESS bytes
    it is read here, under the same graph and size caps (a child's fork and answer cost a dry run's
    recording more than reading it: its bytes bound the work, and no one else wrote it).

    `abandon_if()` (a check of the store, say) runs while the child reads, or before reading in this process:
    when it answers true nothing is read and read_file answers None."""
    import os
    from pathlib import Path

    from alloctrace.traces.sources.bounded_io import Limits

    limits = limits or Limits.from_env()
    if isinstance(src, (str, Path)) and os.environ.get("ALLOCTRACE_IMPORT_IN_PROCESS") != "1" and \
            not (own_recording and _size(src) <= OWN_RECORDING_IN_PROCESS):
        from alloctrace.traces.sources.child import read_in_child
        args = (str(src), name, filename, limits.with_(cancelled=None), progress, tuple(tags), options)
        return read_in_child(lambda: _read_file(*args), filename or Path(src).name, int(limits.max_memory),
                             limits.max_cpu_s, limits.cancelled, spawn_args=args, abandon_if=abandon_if)
    if abandon_if is not None and abandon_if():
        return None
    return _read_file(src, name, filename, limits, progress, tags, options)


def _size(path) -> int:
    import os

    try:
        return os.stat(path).st_size
    except OSError:
        return OWN_RECORDING_IN_PROCESS + 1  # the child reports what is wrong with it


def _read_file(src, name, filename, limits, progress, tags, options) -> list[ImportedTrace]:
    from pathlib import Path

    from alloctrace.traces.sources.bounded_io import capped_graphs
    from alloctrace.traces.sources.logio import LogReader
    from alloctrace.traces.util.gcpause import gc_paused
    from alloctrace.traces.util.progress import Progress

    named = src if isinstance(src, (str, Path)) else getattr(src, "name", None)
    label = filename or (Path(named).name if isinstance(named, (str, Path)) else "input")
    with LogReader(src, label=label, text=False, limits=limits) as reader:
        source = source_for(reader.head)
        bar = Progress(reader.size, label, enabled=None if progress else False)
        # a source that reads the stream through its own text reader applies the same caps, not the defaults
        wanted = dict(options, progress=lambda: bar.update(reader.position), limits=limits)
        try:
            with gc_paused():  # many small parsed objects, no cycles
                traces = source.read(reader.binary, filename=label, name=name, **_accepted(source.read, wanted))
                for t in traces:
                    t.graphs = list(capped_graphs(t.graphs, limits, reader.size, label))
        finally:
            bar.close()
        if reader.truncated:  # salvaged: what a cut compressed file held
            for t in traces:
                t.meta.extra = {**t.meta.extra, "truncated": True}
    if tags:
        from alloctrace.traces.store.tags import with_tags
        for t in traces:
            t.meta.tags = with_tags(t.meta.tags, tags)
    return traces


def import_file(store, src, *, name: str | None = None, filename: str | None = None, limits: Limits | None = None,
                progress: bool = False, **options) -> list[dict]:
    """Import one input (a path or a binary stream) as one or more traces; their summaries.
    Everything is read first (`read_file`), so the store's write lock is held only for the writes."""
    return store_traces(store, read_file(src, name=name, filename=filename, limits=limits, progress=progress,
                                         **options))  # an upload: stored each time it is sent


def store_traces(store, traces: list[ImportedTrace], content_hash: str | None = None) -> list[dict]:
    """Store what `read_file` read in one transaction: all of it or, on any failure or interrupt, none.
    The summaries carry the source's `report` where it gave one."""
    return _reported(store.add_traces_summarised([(t.meta, t.graphs, content_hash) for t in traces]), traces)


def _reported(summaries: list[dict], traces: list[ImportedTrace]) -> list[dict]:
    for s, t in zip(summaries, traces):
        if t.report:
            s["report"] = t.report
    return summaries


def input_hash(path, options: dict) -> str:
    """What names an import of a file: the SHA-256 of its bytes (as given: compressed or not) with the options
    that change what is stored (tags, a generation, salvage), so a re-run finds what it stored before."""
    import json
    import os

    from alloctrace.traces.store.blobs import new_sha256

    with open(path, "rb") as f:
        h = new_sha256(os.fstat(f.fileno()).st_size)
        while chunk := f.read(1 << 20):
            h.update(chunk)
    limits = options.get("limits")
    how = {"tags": sorted(options.get("tags") or ()), "generation": options.get("generation"),
           "salvage": bool(getattr(limits, "salvage", False))}
    options_hash = new_sha256(0)
    options_hash.update(json.dumps(how, sort_keys=True).encode())
    return f"sha256:{h.hexdigest()}:" + options_hash.hexdigest()[:16]


def import_files(store, paths, *, name: str | None = None, progress: bool = False, **options) -> list[dict]:
    """Import files, each as its trace(s), in one transaction: all or nothing across files (a kill or a lost
    database half way leaves none). A file stored before with the same tags and options (input_hash) is not
    read or stored again: its traces' summaries come back marked `stored_before`, so a retry never duplicates."""
    from alloctrace.traces.sources.logio import check_path

    paths = [check_path(p) for p in paths]
    if not paths:
        raise UserError("no files to import")
    read: list[tuple[list, str]] = []
    order: list[tuple[str, list[str] | None]] = []  # per file: its hash, and its traces when stored before
    seen: set[str] = set()
    for i, p in enumerate(paths):
        label = name if name is None or len(paths) == 1 else f"{name} ({i + 1})"
        found: dict = {}

        def known(p=p, found=found) -> bool:
            """Stored before, or named twice in this command (then the reading is abandoned): the file is
            hashed while a child reads it, which overlap on a machine of two cores."""
            key = found["key"] = input_hash(p, options)
            found["before"] = store.stored_with([key]).get(key)
            return bool(found["before"]) or key in seen

        traces = read_file(p, name=label, progress=progress, abandon_if=known, **options)
        order.append((found["key"], found["before"] or None))
        if traces is not None:
            seen.add(found["key"])
            read.append((traces, found["key"]))
    stored = store.add_traces_summarised([(t.meta, t.graphs, key) for traces, key in read for t in traces]) \
        if read else []  # their summaries read in the same transaction
    new: dict[str, list[dict]] = {}
    at = 0
    for traces, key in read:
        new[key] = _reported(stored[at:at + len(traces)], traces)
        at += len(traces)
    done: list[dict] = []
    for key, before in order:
        if before:
            done += [dict(store.summary(tid), stored_before=True) for tid in before]
        elif key in new:
            done += new.pop(key)
    return done


def import_paths(store, paths, *, name: str | None = None, progress: bool = False, **options) -> list[str]:
    """`import_files`, answering the new trace ids."""
    return [s["id"] for s in import_files(store, paths, name=name, progress=progress, **options)]


def _accepted(fn, options: dict) -> dict:
    """The `options` that `fn` (a function or bound method) takes by keyword: all of them when it takes
    **kwargs. Read from its code object (inspect.signature would cost a short command inspect's import)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is not None:
        takes_any = bool(code.co_flags & 0x08)  # CO_VARKEYWORDS
        names = code.co_varnames[code.co_posonlyargcount:code.co_argcount + code.co_kwonlyargcount]
    else:  # another kind of callable
        import inspect

        names = inspect.signature(fn).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in names.values())
    return options if takes_any else {k: v for k, v in options.items() if k in names}


_builtins_registered = False


def _register_builtins():
    """The sources that ship with alloctrace, by their sniffers (sniffers.py): a source's module is imported
    only when it reads an input."""
    global _builtins_registered
    _builtins_registered = True
    from alloctrace.traces.sources.sniffers import BUILTINS
    for source in BUILTINS:
        register(source)
