"""The program of `alloctrace record --store DIR -- PROGRAM ...`, started before the command has imported the
rest of itself.

Python's start and the command's imports (argparse, the store, the recording's reader) cost a small machine
about as long as a dry run of a small model, and nothing in them changes how the program runs. So the
`alloctrace` entry point calls `begin(argv)` first: a record command line it reads in full (only --store,
--name, --tag and --ggml before `--`, the program after it; not a Python program, which gets the PyTorch hook)
has its program started under the recorder at once, as `run_recorded` would start it (same process group, stdio
untouched, SIGINT left to the program while it runs); the command then
parses its arguments as usual and `take`s it, checking that it is the program it would have started. Anything
else (another command line, ALLOCTRACE_PRESTART=0 or ALLOCTRACE_PURE_PYTHON=1, a check that fails: the command
then says what is wrong before anything runs) and nothing is started. A difference at `take`, or a command that
ends before it takes it, and the program is killed and its folder removed (`abandon`, also at exit).

It imports only what starting the program needs: no argparse, no store, no reader, no subprocess. The program
is started by `spawn`, a fork and exec that does what subprocess.Popen's child does for `run_recorded`
(descriptors past stderr closed, SIGPIPE and SIGXFSZ back to their defaults): importing subprocess (with
`locale`, `selectors`, `threading`) cost the start about 7 ms of CPU before the program could start, which now
runs beside them. (os.posix_spawn was tried before and left: it starts a program with glibc's internal signals
ignored, and passes it the descriptors this process inherited.)
"""
from __future__ import annotations

import os
import sys

VALUE_OPTIONS = ("--store", "--name", "--tag")


class Started:
    """A program `begin` started: its process, the command it runs, the resolved program, the recorder, the
    environment it started from, its private folder (removed by whoever ends up owning it) and the SIGINT
    handler to put back once it is reaped."""

    def __init__(self, proc, command: list[str], prog: str, library, environ: dict, folder: str, old_int):
        self.proc, self.command, self.prog, self.library = proc, command, prog, library
        self.environ, self.folder, self.old_int = environ, folder, old_int

    @property
    def returncode(self):
        return self.proc.returncode

    def wait(self) -> int:
        """The program's exit code as subprocess gives it (-N: killed by signal N); SIGINT's handler back."""
        import signal

        try:
            return self.proc.wait()
        finally:
            signal.signal(signal.SIGINT, self.old_int)

    def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            self.wait()
        from alloctrace.traces.sources.record.program import remove_folder

        remove_folder(self.folder)


_started: Started | None = None
RESTORED = (13, 25)  # SIGPIPE, SIGXFSZ: Python ignores them; a program gets their defaults, as subprocess does


class Child:
    """The program `spawn` started, with the part of subprocess.Popen's interface the command uses."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def wait(self) -> int:
        """Its exit code as subprocess gives it (-N: killed by signal N), once it has ended."""
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)  # retried after a signal's handler (PEP 475)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:  # reaped by someone else: as subprocess answers it
                self.returncode = 0
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


def spawn(argv: list[str], env: dict) -> Child:
    """Start `argv[0]` (a path) with `env` as subprocess.Popen(argv, env=env) does: in this process group,
    stdin, stdout and stderr this process's, every other descriptor closed (close_fds), SIGPIPE and SIGXFSZ at
    their defaults (restore_signals; handled signals go back to theirs at exec). An exec that fails is raised
    here as OSError (the child says its errno through a pipe closed at a good exec), as Popen raises it."""
    import signal

    ready, said = os.pipe()  # both close at exec (Python's descriptors are not inheritable)
    try:
        pid = os.fork()
    except OSError:
        os.close(ready)
        os.close(said)
        raise
    if pid == 0:  # the child: only os calls until exec; never returns into the command
        try:
            os.close(ready)
            for sig in RESTORED:
                signal.signal(sig, signal.SIG_DFL)
            os.closerange(3, said)
            os.closerange(said + 1, os.sysconf("SC_OPEN_MAX"))
            os.execve(argv[0], argv, env)
        except BaseException as e:  # OSError's errno; anything else (a NUL in an argument) as 0
            os.write(said, str(getattr(e, "errno", None) or 0).encode())
        finally:
            os._exit(127)
    os.close(said)
    try:
        answer = b""
        while True:
            got = os.read(ready, 32)
            if not got:
                break
            answer += got
    finally:
        os.close(ready)
    if answer:
        os.waitpid(pid, 0)
        errno = int(answer)
        raise OSError(errno, os.strerror(errno), argv[0])
    return Child(pid)


class RecordLine:
    """A record command line read in full: what argparse would make of its options (the last --store and
    --name, every --tag in order, whether --ggml was given) and the program's argv after the first `--`."""

    __slots__ = ("store", "name", "tags", "ggml", "program")

    def __init__(self, store, name, tags: list[str], ggml: bool, program: list[str]):
        self.store, self.name, self.tags, self.ggml, self.program = store, name, tags, ggml, program


def record_argv(argv: list[str]) -> RecordLine | None:
    """The record command line `argv` (the words after `alloctrace`) read in full, else None: only --store,
    --name and --tag with a value (`--store DIR` or `--store=DIR`; a value starting with a dash is left to
    argparse) and --ggml before `--`, and a program after it. Anything else (-o, --torch, --help, an
    abbreviation, a misspelling) is argparse's to read and, where it is wrong, to say so."""
    if argv[:1] != ["record"] or "--" not in argv:
        return None
    cut = argv.index("--")
    opts, program = argv[1:cut], argv[cut + 1:]
    got = {"--store": None, "--name": None}
    tags, ggml, i = [], False, 0
    while i < len(opts):
        w = opts[i]
        option, eq, value = w.partition("=")
        if option in VALUE_OPTIONS and not eq and i + 1 < len(opts) and not opts[i + 1].startswith("-"):
            value = opts[i + 1]
            i += 1
        elif not (option in VALUE_OPTIONS and eq):
            if w != "--ggml":
                return None  # -o, --torch, help, a misspelling: the command does it the ordinary way
            ggml, option = True, None
        if option == "--tag":
            tags.append(value)
        elif option is not None:
            got[option] = value
        i += 1
    return RecordLine(got["--store"], got["--name"], tags, ggml, program) if program else None


def begin(argv: list[str]) -> None:
    """Start the program of `argv` now, if it is a record command line read in full (see the module)."""
    global _started
    if _started is not None or os.environ.get("ALLOCTRACE_PRESTART") == "0" or \
            os.environ.get("ALLOCTRACE_PURE_PYTHON") == "1" or not sys.platform.startswith("linux"):
        return
    got = record_argv(argv)
    if got is None:
        return
    tags, program, ggml_only = got.tags, got.program, got.ggml
    from alloctrace.traces.errors import UserError

    try:
        from alloctrace.traces.sources.record.build import recorder_library
        from alloctrace.traces.sources.record.program import (checked_program, is_python_program,
                                                             leave_sigint_to_the_program, private_folder,
                                                             recorder_env)

        if tags:
            from alloctrace.traces.store.tags import parse_tags

            parse_tags(tags)  # a bad tag is refused before anything runs
        if not ggml_only and is_python_program(program):
            return  # the PyTorch hook too: the command starts it
        library = recorder_library()
        prog = checked_program(program)
        folder = private_folder("alloctrace-rec-")
    except (UserError, OSError):
        return  # the command says what is wrong, when it parses the same arguments
    import signal

    try:
        environ = dict(os.environ)
        env = recorder_env(library, folder)
        old_int = leave_sigint_to_the_program()  # as run_recorded: Ctrl-C is the program's
        try:
            proc = spawn([prog, *program[1:]], env)
        except OSError:
            signal.signal(signal.SIGINT, old_int)
            raise
    except (UserError, OSError):
        from alloctrace.traces.sources.record.program import remove_folder

        remove_folder(folder)
        return  # the command starts it itself and reports what fails
    _started = Started(proc, list(program), prog, library, environ, folder, old_int)
    import atexit

    atexit.register(abandon)


def take(command: list[str], library, torch: bool) -> Started | None:
    """The program `begin` started, when it is the one the command would start now (same argv, program,
    recorder and environment, no PyTorch hook); else None (and whatever was started is stopped)."""
    global _started
    got, _started = _started, None
    if got is None:
        return None
    if torch or got.command != command or str(got.library) != str(library) or got.environ != dict(os.environ):
        got.stop()
        return None
    return got


def abandon() -> None:
    """Stop what `begin` started and nobody took (the command ended first, or could not use it)."""
    global _started
    got, _started = _started, None
    if got is not None:
        got.stop()
