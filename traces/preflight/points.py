"""Run a sweep's points under the recorder, in parallel, and store each one as a tagged trace.

Each point's program runs in a worker process forked from this one, which also reads and replays its
recording and sums the point up (buffers, consistency, the families at its peak): the CPU-bound part, so it
uses every core. The calling process only stores each point as it comes back. Nothing on this path imports
numpy (its import alone costs more than a dry run of a small model). A point's trace carries the tags
`sweep=<id>` and one `KEY=VALUE` per varied flag (`c=512` for -c), and `extra.sweep` (the sweep's flags,
the point's values, what the program printed), which is how `sweeps.load` and the dashboard find a
recorded sweep again.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.record.run import checked_program, collect, recorder_env

from . import prestart
from .forkpool import ForkPool
from .printed import printed_sizes
from .stops import stopped_by_signals
from .programs import (DEFAULT_RETRY_HUNG, DEFAULT_TIMEOUT, TimedOut, deadline, hung_note, ignored_flags,
                       next_deadline, past_deadline, stop_late, wait_any, wait_until)
from .summary import summarise_imported
from .vary import Vary, label, points as combinations, tags as point_tags, with_values

OUTPUT_TAIL = 400  # characters of a failed program's output kept in the point's error


@dataclass
class Point:
    values: dict[str, str]
    argv: list[str]
    buffers: dict[str, int] = field(default_factory=dict)  # buffer type name -> exact bytes
    consistent: bool | None = None
    trace: str | None = None
    families: list[dict] = field(default_factory=list)  # at the largest graph's peak, largest first
    printed: dict = field(default_factory=dict)  # printed_sizes() of the program's output
    exit_status: int | None = None
    error: str | None = None
    status: str = "ok"  # "ok", "failed" (error set) or "timed out"
    ignored: list[str] = field(default_factory=list)  # flags the program said it ignores (a CPU build: -ngl)
    graph: int | None = None  # the graph whose plan made the largest buffer
    all_families: list[dict] = field(default_factory=list)  # every family at that peak (for the growth laws)
    peak: object = None  # that graph's GraphPeak (for the attribution between neighbours)
    retried: str | None = None  # its program hung and was run again (programs.hung_note), else None

    @property
    def total(self) -> int:
        return sum(self.buffers.values())

    def to_json(self) -> dict:
        return {"values": self.values, "buffers": self.buffers, "consistent": self.consistent, "trace": self.trace,
                "graph": self.graph, "families": self.families, "printed": self.printed,
                "exit_status": self.exit_status, "error": self.error, "status": self.status,
                "ignored": self.ignored, "retried": self.retried}


default_jobs = prestart.default_jobs


def new_sweep_id() -> str:
    return os.urandom(4).hex()  # as secrets.token_hex does, without importing hashlib and hmac


def start_program(argv: list[str], library: Path, workdir: Path) -> prestart.Spawned:
    """One point's program started with the recorder preloaded, in a process group of its own, its stdout
    and stderr into workdir."""
    try:
        return prestart.spawn(argv, recorder_env(library, workdir), str(workdir / "output.txt"))
    except OSError as e:
        raise UserError(f"cannot run {argv[0]}: {e.strerror}") from None


def program_output(workdir: Path) -> str:
    """The program's stdout and stderr (their last 16 MiB), once it has ended."""
    out = workdir / "output.txt"
    with open(out, "rb") as fh:
        fh.seek(max(0, out.stat().st_size - (1 << 24)))
        return fh.read().decode("utf-8", "replace")


@dataclass
class Ran:
    """What a worker hands back for one point: the program's status and output, its traces read and replayed,
    and the first trace summed up (a Point's buffers, consistent, graph, families and peak)."""

    exit_status: int
    text: str  # the end of the program's output (for an error)
    traces: list  # ImportedTrace, ready to store
    error: str | None = None
    summary: Point | None = None
    printed: dict = field(default_factory=dict)  # printed_sizes() of its whole output
    timed_out: bool = False
    ignored: list[str] = field(default_factory=list)  # ignored_flags() of its output
    retried: str | None = None  # hung_note() of its runs that hung and were run again


def timed_out(argv: list[str], workdir: Path, timeout: float | None, state: str = "") -> Ran:
    """A point whose program was killed at its time limit: what it printed and where its threads were
    (`state`, programs.where_it_was), nothing read."""
    text = program_output(workdir) if (workdir / "output.txt").exists() else ""
    where = f"; it was {state}" if state else ""
    return Ran(128 + 9, text[-OUTPUT_TAIL:], [], f"timed out after {timeout or 0:g} s: the program was killed "
               f"(--timeout){where}", printed=printed_sizes(text), timed_out=True, ignored=ignored_flags(text))


def run_and_read(argv: list[str], library: Path, workdir: Path, name: str, status: int | TimedOut | None = None, *,
                 timeout: float | None = None, retry_hung: int = 0, hung: list[str] | tuple = ()) -> Ran:
    """A worker's whole share of a point: run it, then read, replay and sum up its recordings (the CPU-bound
    part). `status`: the program has run already (run_points starts the first ones), its raw wait status (or
    TimedOut); else it runs here, killed after `timeout` seconds. A run that hung (TimedOut.hung) is run
    again, in an emptied folder, while fewer than `retry_hung` runs have hung (`hung`: where earlier ones
    were, read_here's own runs again). What reading needs the workers share: run_points imports it first."""
    hung = list(hung)
    try:
        if status is None:
            status = run_program(argv, library, workdir, timeout)
        while isinstance(status, TimedOut) and status.hung and len(hung) < retry_hung:
            hung.append(status.state)
            status = run_program(argv, library, fresh_folder(workdir), timeout)
    except UserError as e:
        return Ran(127, "", [], str(e), retried=hung_note(hung))
    ran = read_point(argv, workdir, name, status, timeout)
    ran.retried = hung_note(hung)
    return ran


def run_program(argv: list[str], library: Path, workdir: Path, timeout: float | None) -> int | TimedOut:
    """One run of a point's program, to its end (its wait status) or to its time limit (TimedOut)."""
    proc = start_program(argv, library, workdir)
    return proc.returncode if wait_until(proc, deadline(proc, timeout)) else stop_late(proc)


def fresh_folder(workdir: Path) -> Path:
    """A point's folder emptied for its program's next run: what a killed run printed and recorded is not read."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir()
    return workdir


def read_point(argv: list[str], workdir: Path, name: str, status: int | TimedOut, timeout: float | None) -> Ran:
    """A point whose program has ended: its recordings read, replayed and summed up, or why there are none."""
    if isinstance(status, TimedOut):
        return timed_out(argv, workdir, timeout, status.state)
    from alloctrace.traces.sources.record.source import no_allocator_calls

    text = program_output(workdir)
    result = collect(argv, status, workdir)
    # what the program printed is read here, on every core, and only its end travels back
    printed, ignored, tail = printed_sizes(text), ignored_flags(text), text[-OUTPUT_TAIL:]
    if not result.recordings:
        return Ran(result.exit_status, tail, [], no_allocator_calls(result.exit_status, text, argv[0]),
                   printed=printed, ignored=ignored)
    events: list[dict] = []  # per trace: {graph index: the replay's events}, so nothing is decoded again
    try:
        traces = [t for path in result.recordings for t in read_recording(path, name, events)]
    except UserError as e:
        return Ran(result.exit_status, tail, [], str(e), printed=printed, ignored=ignored)
    summary = Point({}, [])
    summarise_imported(summary, traces[0], events[0])
    return Ran(result.exit_status, tail, traces, summary=summary, printed=printed, ignored=ignored)


def run_read_and_free(argv: list[str], library: Path, workdir: Path, name: str, status: int | TimedOut | None = None,
                      *, timeout: float | None = None, retry_hung: int = 0, hung: list[str] | tuple = ()) -> Ran:
    """`run_and_read`, then the point's folder removed by the worker that read it, while other points run:
    left to the end, removing them all delays every sweep's last line."""
    try:
        return run_and_read(argv, library, workdir, name, status, timeout=timeout, retry_hung=retry_hung, hung=hung)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)  # what stays is removed with the sweep's folder


def read_recording(path: Path, name: str, events: list | None = None) -> list:
    """A recording our own recorder just wrote, read by the recording source itself (its stream reader bounds
    lines, tensors and bytes): asking every registered source to sniff it would import them all. `events`
    gets each trace's replayed events by graph (RecordingSource.read)."""
    from alloctrace.traces.sources.record.source import SOURCE

    with open(path, "rb") as f:
        return SOURCE.read(f, filename=path.name, name=name, events=events)


def run_points(store, argv: list[str], varies: list[Vary], library: Path, *, jobs: int | None = None,
               name: str | None = None, sweep_id: str | None = None, progress=None, tags=(),
               timeout: float | None = DEFAULT_TIMEOUT, extra: dict | None = None,
               retry_hung: int = DEFAULT_RETRY_HUNG) -> tuple[str, list[Point]]:
    """Every combination of `varies` applied to `argv`, recorded and stored; (sweep id, points in order).
    A program past `timeout` is killed; one that hung there is run again, up to `retry_hung` times.
    `extra`: more of each point's trace's `extra` (a fit's probes, for the pre-flight page).
    `progress(done, total, point)` is called as each point is stored. `store` is a Store, or a function
    that opens one, called once the workers run: importing and opening a store costs about a dry run of
    a small model, which they spend running programs instead."""
    opener = store if callable(store) else (lambda given=store: given)
    prog = checked_program(argv)
    combos = combinations(varies)
    sid = sweep_id or new_sweep_id()
    base = name or os.path.basename(prog)
    pts = [Point(values, [prog, *with_values(argv, values)[1:]]) for values in combos]
    spec = [[v.flag, list(v.values)] for v in varies]
    from alloctrace.traces.util import verbose

    given, jobs = jobs, max(1, min(jobs or default_jobs(argv), len(pts)))
    verbose.note("programs at once (-j)", f"{jobs} ({prestart.jobs_reason(given, argv)})")
    here = jobs > 1 and reads_are_cheap()
    stored: dict = {"store": None, "ids": []}  # what a stop marks
    with stopped_by_signals(sid, stored, len(pts)):
        # the entry point may have started the first programs (prestart.py): taken when they are these points'
        taken = prestart.take([p.argv for p in pts], library, jobs) if here else prestart.abandon()
        with sweep_folder(taken) as tmp:
            dirs = [Path(tmp) / str(k) for k in range(len(pts))]
            for d in dirs:
                d.mkdir(exist_ok=taken is not None)
            tasks = [(p.argv, library, d, f"{base} {label(p.values)}") for p, d in zip(pts, dirs)]
            tasks = first_programs_run(tasks, jobs, timeout) if jobs > 1 and not here else tasks
            work = functools.partial(run_read_and_free, timeout=timeout, retry_hung=retry_hung)
            with ForkPool(jobs, on_stop=prestart.end_all) as pool:
                if here:  # this process runs the programs and reads each one's point as it ends
                    results = read_here(tasks, jobs, taken.running if taken else None, timeout, retry_hung)
                else:  # workers forked from this process run and read the points (replays run on every core)
                    results = pool.run(work, tasks) if jobs > 1 else ((k, work(*t)) for k, t in enumerate(tasks))
                store = None
                for done, (k, ran) in enumerate(results, 1):
                    if store is None:
                        store = stored["store"] = opener()  # once the first programs run
                    p = pts[k]
                    p.exit_status, p.printed, p.error = ran.exit_status, ran.printed, ran.error
                    p.ignored, p.retried = ran.ignored, ran.retried
                    p.status = "timed out" if ran.timed_out else "failed" if ran.error else "ok"
                    meta = {"id": sid, "vary": spec, "values": p.values, "index": k, "printed": p.printed,
                            "argv": p.argv, "ignored": p.ignored, "retried": p.retried}
                    if ran.traces:
                        _store_point(store, p, ran, ["recording", f"sweep={sid}", *point_tags(p.values), *tags], meta,
                                     extra)
                        stored["ids"].append(p.trace)
                    if p.exit_status and p.error is None:
                        from alloctrace.traces.sources.record.source import last_lines

                        p.error = f"exit status {p.exit_status}; its last lines: {last_lines(ran.text)}"
                        p.status = "failed"
                    if progress:
                        progress(done, len(pts), p)
    return sid, pts


def reads_are_cheap() -> bool:
    """Whether this process can read every point itself while the programs run: the compiled replay is there,
    so reading a dry run's point costs a few ms against its program's tens (docs/performance.md). Without
    it (no C compiler, ALLOCTRACE_PURE_PYTHON=1) a point's Python replay can cost as much as its program,
    and forked workers read on every core."""
    from alloctrace.traces.sources.record import plans_fast

    return plans_fast.library() is not None


@contextmanager
def sweep_folder(taken):
    """The sweep's folder (a folder per point inside): the one the prestarted programs write into, else a new
    one; removed at the end either way."""
    if taken is None:
        with tempfile.TemporaryDirectory(prefix="alloctrace-sweep-") as tmp:
            yield tmp
        return
    try:
        yield taken.folder
    finally:
        shutil.rmtree(taken.folder, ignore_errors=True)


def read_here(tasks: list[tuple], jobs: int, started: dict | None = None, timeout: float | None = None,
              retry_hung: int = 0):
    """(point index, Ran) as each point's program ends, `jobs` programs running at a time from this process:
    a program that ends is followed by the next point's at once, before its own point is read, so the
    programs never wait for the reading. While the readers are imported (import_readers) the programs that
    end are only replaced; their points are read once the import is done. A program that hung at its time
    limit is run again (up to `retry_hung` times) before the next point's starts."""
    running: dict = dict(started or {})  # point -> its program (prestart's Spawned)
    ended: list[tuple[int, int | TimedOut]] = []  # (point, wait status): read next
    failed: list[tuple[int, Ran]] = []  # points whose program could not start
    hung: dict[int, list[str]] = {}  # point -> where each of its runs that hung was
    again: list[int] = []  # points whose program hung: run again first
    nxt = len(running)  # the programs started already (some may have ended) are the first points'

    def fill() -> None:
        nonlocal nxt
        for k in [k for k, proc in running.items() if proc.poll() is not None]:
            ended.append((k, running.pop(k).returncode))
        while len(running) < jobs and (again or nxt < len(tasks)):
            k, nxt = (again.pop(0), nxt) if again else (nxt, nxt + 1)
            argv, library, workdir = tasks[k][:3]
            try:  # os.posix_spawn: a subprocess.Popen costs this process a few ms per point
                workdir = fresh_folder(workdir) if k in hung else workdir
                running[k] = prestart.spawn(argv, recorder_env(library, workdir), str(workdir / "output.txt"))
            except (OSError, UserError) as e:
                why = e if isinstance(e, UserError) else f"cannot run {argv[0]}: {e.strerror}"
                failed.append((k, Ran(127, "", [], str(why), retried=hung_note(hung.get(k)))))

    def fill_or_stop() -> None:
        for k in past_deadline(running, timeout):  # a hung program ends its point as timed out, or runs again
            status = stop_late(running.pop(k))
            if status.hung and len(hung.get(k, ())) < retry_hung:
                hung.setdefault(k, []).append(status.state)
                again.append(k)
            else:
                ended.append((k, status))
        fill()

    try:
        fill_or_stop()
        import_readers(fill_or_stop)
        while running or ended or failed or again:
            if failed:
                yield failed.pop(0)
                continue
            if not ended:
                wait_any(running, next_deadline(running, timeout))
            fill_or_stop()
            if not ended:
                continue
            k, status = ended.pop(0)
            yield k, run_read_and_free(*tasks[k][:4], status, timeout=timeout, retry_hung=retry_hung,
                                       hung=hung.get(k, ()))
    finally:  # interrupted (or the caller stopped): the programs end with the command
        for proc in running.values():
            proc.kill()
            proc.wait()


# what a worker reads, replays and sums a point up with (import_readers), in the order they import
READERS = ("alloctrace.traces.store.columns", "alloctrace.traces.store.schema", "alloctrace.traces.sources.base",
           "alloctrace.allocator.gallocr", "alloctrace.traces.sources.record.stream",
           "alloctrace.traces.sources.record.plans_fast", "alloctrace.traces.sources.record.plans",
           "alloctrace.traces.sources.record.source", "alloctrace.traces.explain.peak_types",
           "alloctrace.traces.explain.peak_fast", "alloctrace.traces.explain.peak_shapes")


def first_programs_run(tasks: list[tuple], jobs: int, timeout: float | None = None) -> list[tuple]:
    """The first points' programs run while what the workers read with is imported (import_readers), `jobs` at
    a time: one that ends between two imports is followed by the next point's at once, so the cores run
    programs rather than wait for the import. Returns the tasks, those that ran with their wait statuses: the
    workers fork with their readers in hand and these points ready to read. A program that cannot start is
    left to its worker, which reports it."""
    running: dict[int, prestart.Spawned] = {}
    status: dict[int, int | TimedOut] = {}
    nxt = 0

    def refill(start: bool = True) -> None:
        nonlocal nxt
        for k in past_deadline(running, timeout):
            status[k] = stop_late(running.pop(k))
        for k in [k for k, proc in running.items() if proc.poll() is not None]:
            status[k] = running.pop(k).returncode
        while start and len(running) < jobs and nxt < len(tasks):
            try:
                running[nxt] = start_program(*tasks[nxt][:3])
            except UserError:
                pass
            nxt += 1

    try:
        refill()
        import_readers(refill)
        refill(start=False)
        for k, proc in running.items():  # the last ones started: the workers fork once they end
            status[k] = proc.returncode if wait_until(proc, deadline(proc, timeout)) else stop_late(proc)
    except BaseException:  # interrupted: the programs end with the command
        for proc in running.values():
            proc.kill()
            proc.wait()
        raise
    return [(*t, status[k]) if k in status else t for k, t in enumerate(tasks)]


def import_readers(between=lambda: None) -> None:
    """What a worker reads, replays and sums a point up with, imported once before the workers fork, so that
    they share it: imported in each worker instead (while its first program runs) it costs every worker
    the same CPU again, which delays a sweep on a machine whose cores all run points (docs/performance.md).
    `between()` runs after each module. The store and the growth laws are the parent's alone: it imports
    those once the workers run."""
    import importlib

    for name in READERS:
        importlib.import_module(name)
        between()
    from alloctrace.traces.sources.record import plans_fast

    plans_fast.library()  # loaded (or found missing) once, for every worker
    between()


def _store_point(store, p: Point, ran: Ran, tags: list[str], meta: dict, extra: dict | None = None):
    from alloctrace.traces.sources import store_traces

    for t in ran.traces:
        t.meta.tags = tags
        t.meta.extra = {**t.meta.extra, **(extra or {}), "sweep": meta}
    summaries = store_traces(store, ran.traces)
    p.trace = summaries[0]["id"]
    s = ran.summary
    p.buffers, p.consistent, p.graph, p.peak = s.buffers, s.consistent, s.graph, s.peak
    p.all_families, p.families = s.all_families, s.families
