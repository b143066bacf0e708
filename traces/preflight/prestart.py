"""The first programs of `alloctrace sweep --vary ... -- PROGRAM ...`, started before the command has imported
the rest of itself.

Python's start and the command's imports cost about 0.1 s of one core on a small machine: as long as five dry
runs of a small model, with the other core idle. So the `alloctrace` entry point calls `begin(argv)` first. For
a sweep command line it reads in full (the sweep's own options only, the program after `--`) it starts the
first -j points' programs under the recorder as `run_points` would start them itself; the command then parses
its arguments as usual and `run_points` takes them over (`take`), checking that each is the program it would
have started for that point. Any other command line, an environment that asks for it (ALLOCTRACE_PRESTART=0,
ALLOCTRACE_PURE_PYTHON=1) or anything unusual, and nothing is started; a difference at `take`, or a command
that ends before it takes them (a bad option, an error), and the programs are stopped and their folder
removed (`abandon`, also at exit).

It imports only what starting a program needs: no dataclasses, no argparse, no subprocess (os.posix_spawn).
"""
from __future__ import annotations

import os
import sys
import time

_started: "Started | None" = None
# the sweep's options that take a value (besides --vary, -j)
VALUE_OPTIONS = ("--name", "--store", "--tag", "--timeout", "--retry-hung")
RESTORED = (13, 25)  # SIGPIPE, SIGXFSZ: Python ignores them; a program gets their defaults, as subprocess does


def cores() -> int:
    """The cores this process may use."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


THREAD_FLAGS = ("-t", "--threads")


def program_threads(argv: list[str]) -> int | None:
    """The threads a program was told to use (`-t N`, `--threads N`, `--threads=N`), None when not told."""
    for i, w in enumerate(argv):
        if w in THREAD_FLAGS and i + 1 < len(argv) and argv[i + 1].isdecimal():
            return int(argv[i + 1])
        if w.startswith("--threads=") and w[10:].isdecimal():
            return int(w[10:])
    return None


# programs that plan their graphs without computing them (weightless dry runs): their threads sit idle
DRY_RUNS = ("llama-fit-params",)


def default_jobs(argv: list[str] | None = None) -> int:
    """Programs a sweep runs at once unless -j says: the cores shared out by the threads each program runs.
    A program not told its threads is taken to use every core (llama.cpp's default), so its points run one at
    a time: side by side they only slow each other down (a 2-core machine ran a sweep 6.4x slower); a dry run
    that computes nothing (llama-fit-params) runs on every core."""
    argv = argv or []
    threads = program_threads(argv)
    if threads:
        return max(1, cores() // threads)
    return cores() if argv and os.path.basename(argv[0]) in DRY_RUNS else 1


def jobs_reason(given: int | None, argv: list[str]) -> str:
    """Why a sweep runs the programs it runs at once, for -v: given, or how the default came out."""
    if given:
        return "given with -j"
    threads = program_threads(argv)
    if threads:
        return f"default: {cores()} cores / {threads} threads each (its -t)"
    if argv and os.path.basename(argv[0]) in DRY_RUNS:
        return f"default: {cores()} cores, one dry run on each"
    return "default: the program has no -t, so it uses every core itself"


LIVE: set[int] = set()  # programs this process started and has not reaped: each leads its own process group


def end_group(pid: int) -> None:
    """Kill what is left of a program's process group (the program, and what it started and left running)."""
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def end_program(pid: int) -> None:
    """Kill a program not reaped yet (one that left its group too) and its group."""
    try:
        os.kill(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    end_group(pid)


def end_all() -> None:
    """Kill every program this process started and has not reaped, with their groups (at exit, on a signal)."""
    for pid in list(LIVE):
        end_program(pid)


class Spawned:
    """A program started with os.posix_spawn in a process group of its own, with the part of subprocess.Popen's
    interface a sweep uses. Once it has ended, what is left of its group is killed before it is reaped (its
    zombie holds the group's id, so no other group can have taken it)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None
        self.started = time.monotonic()  # for --timeout: a program's time counts from its start
        LIVE.add(pid)

    def _reap(self, block: bool):
        if self.returncode is None:
            try:
                got = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG))
            except ChildProcessError:
                got = True
            if got is None:
                return None
            end_group(self.pid)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            LIVE.discard(self.pid)
        return self.returncode

    def poll(self):
        return self._reap(False)

    def wait(self):
        return self._reap(True)

    def kill(self):
        if self.returncode is None:
            end_program(self.pid)


class Started:
    """What `begin` started: the sweep's folder (one folder per point, `str(k)`) and the first points' programs
    (`running`: point -> Spawned, ended ones too, in order). While the command imports itself, a program that
    ends is followed by the next point's (`refill`, on SIGCHLD), -j at a time, until `take` or `stop`."""

    def __init__(self, folder: str, argvs: list[list[str]], library, jobs: int, env):
        self.folder, self.argvs, self.library, self.jobs, self.env = folder, argvs, library, jobs, env
        self.running: dict[int, Spawned] = {}
        self.old_handler = None
        self.old_stop: dict = {}  # the handlers `stopped` replaced
        self.busy = self.again = False

    def refill(self, *_signal) -> None:
        """Start the next points' programs while fewer than -j run (a signal handler: quick, never raises; one
        that arrives while it runs makes it look again instead of starting a point twice)."""
        if self.busy:
            self.again = True
            return
        self.busy = True
        try:
            self.again = True
            while self.again:
                self.again = False
                live = sum(1 for proc in self.running.values() if proc.poll() is None)
                while live < self.jobs and len(self.running) < len(self.argvs):
                    k = len(self.running)
                    work = os.path.join(self.folder, str(k))
                    self.running[k] = spawn(self.argvs[k], self.env(self.library, work),
                                            os.path.join(work, "output.txt"))
                    live += 1
        except OSError:
            pass  # the command starts it itself and reports what fails
        finally:
            self.busy = False

    def quiet(self) -> None:
        """No more refills: the command's own loop runs the programs from here."""
        import signal

        if self.old_handler is not None:
            signal.signal(signal.SIGCHLD, self.old_handler)
            self.old_handler = None
        for sig, handler in self.old_stop.items():
            if signal.getsignal(sig) is stopped:  # the command's own handler may be there already
                signal.signal(sig, handler)
        self.old_stop = {}

    def stop(self) -> None:
        self.quiet()
        for proc in self.running.values():
            proc.kill()
            proc.wait()
        self.running = {}
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def sweep_argv(argv: list[str]):
    """(the --vary texts, -j or None, the program's argv) of a sweep command line read in full, else None."""
    if argv[:1] != ["sweep"] or "--" not in argv:
        return None
    cut = argv.index("--")
    opts, program = argv[1:cut], argv[cut + 1:]
    varies, jobs, i = [], None, 0
    while i < len(opts):
        w = opts[i]
        if w.startswith("--vary="):
            varies.append(w[len("--vary="):])
        elif w == "--vary" and i + 1 < len(opts):
            i += 1
            varies.append(opts[i])
        elif w in ("-j", "--jobs") and i + 1 < len(opts) and opts[i + 1].isdecimal():
            i += 1
            jobs = int(opts[i])
        elif w.startswith("--jobs=") and w[7:].isdecimal():
            jobs = int(w[7:])
        elif w.startswith("-j") and w[2:].isdecimal():
            jobs = int(w[2:])
        elif w in VALUE_OPTIONS and i + 1 < len(opts) and not opts[i + 1].startswith("-"):
            i += 1
        elif w == "--json" or any(w.startswith(o + "=") for o in VALUE_OPTIONS):
            pass
        else:
            return None  # an option of another mode, help, a misspelling: argparse answers it
        i += 1
    return (varies, jobs, program) if varies and program else None


def begin(argv: list[str]) -> None:
    """Start a sweep's first programs now, if `argv` is a sweep command line read in full (see the module)."""
    global _started
    if _started is not None or os.environ.get("ALLOCTRACE_PRESTART") == "0" or \
            os.environ.get("ALLOCTRACE_PURE_PYTHON") == "1" or not sys.platform.startswith("linux"):
        return
    got = sweep_argv(argv)
    if got is None:
        return
    texts, jobs, program = got
    from alloctrace.traces.errors import UserError

    try:
        from .vary import parse_vary, points, with_values
        from alloctrace.traces.sources.record.build import recorder_library
        from alloctrace.traces.sources.record.program import checked_program, recorder_env

        combos = points([parse_vary(t) for t in texts])
        if jobs is not None and not 1 <= jobs <= 256:
            return  # the command refuses it
        jobs = max(1, min(jobs or default_jobs(program), len(combos)))
        if jobs < 2:
            return  # one at a time: the command starts it as soon as it runs
        prog = checked_program(program)
        library = recorder_library()
        argvs = [[prog, *with_values(program, values)[1:]] for values in combos]
        import tempfile

        folder = tempfile.mkdtemp(prefix="alloctrace-sweep-")
    except (UserError, OSError):
        return  # the command says what is wrong, when it parses the same arguments
    _started = started = Started(folder, argvs, library, jobs, recorder_env)
    import atexit
    import signal

    atexit.register(abandon)
    try:
        for k in range(len(argvs)):
            os.mkdir(os.path.join(folder, str(k)))
    except OSError:
        abandon()  # the command makes its own folder and reports what fails
        return
    started.old_stop = {sig: signal.signal(sig, stopped) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    started.old_handler = signal.signal(signal.SIGCHLD, started.refill)
    started.refill()


def stopped(signum, _frame) -> None:
    """A signal that ends the command before it took the programs over: they are killed, their folder removed,
    and the command ends saying so (nothing was stored yet)."""
    abandon()
    os.write(2, f"alloctrace: error: sweep stopped by signal {signum} before any point was stored; its programs "
                "were killed\n".encode())
    os._exit(128 + signum)


def spawn(argv: list[str], env: dict, output: str) -> Spawned:
    """One program in a process group of its own, stdin from /dev/null, stdout and stderr into `output` (a new
    file in the point's private folder: never one that is there, never through a link)."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        return Spawned(os.posix_spawn(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, fd, 1),
            (os.POSIX_SPAWN_DUP2, fd, 2)], setsigdef=RESTORED, setpgroup=0))
    finally:
        os.close(fd)


def take(argvs: list[list[str]], library, jobs: int) -> Started | None:
    """The programs `begin` started, when they are the first `jobs` of exactly these points' programs with this
    recorder; else None (and whatever was started is stopped)."""
    global _started
    got, _started = _started, None
    if got is None:
        return None
    got.quiet()
    if got.argvs != argvs or str(got.library) != str(library) or got.jobs != jobs:
        got.stop()
        return None
    return got


def abandon() -> None:
    """Stop what `begin` started and nobody took (the command ended first, or could not use it)."""
    global _started
    got, _started = _started, None
    if got is not None:
        got.stop()
