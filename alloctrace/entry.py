"""The `alloctrace` command's entry point (the console script and `python -m alloctrace`).

A sweep's first programs, and a recording's program, start here, before the command imports its parser and
the rest of itself (traces/preflight/prestart.py, traces/sources/early.py: Python's imports cost a small machine
as long as several dry runs of a small model); then `cli.console` runs the command. A recording's start runs
with the cyclic collector paused until the command has imported what it runs (traces/util/gcpause.py)."""
import sys


def console() -> None:
    if sys.argv[1:2] == ["record"]:
        import gc

        collecting = gc.isenabled()
        gc.disable()  # the start's pause, before gcpause's own imports (threading, contextlib) delay the program
        from alloctrace.traces.sources import early

        early.begin(sys.argv[1:])  # starts nothing unless it reads the command line in full; stopped at exit
        from alloctrace.traces.util import gcpause

        gcpause.start_paused(collecting)  # until record.run has imported what it runs
    else:
        from alloctrace.traces.preflight import prestart

        prestart.begin(sys.argv[1:])  # starts nothing unless this is a sweep it reads in full; stopped at exit
    from alloctrace.cli import console as run

    run()
