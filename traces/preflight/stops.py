"""A sweep ended by a signal (SIGTERM, SIGHUP, Ctrl-C) while its points run: its programs killed, its folders
removed, what it stored before tagged `sweep-stopped=SIGNAL`, and one line saying so instead of a sweep that
reads as finished."""
from __future__ import annotations

from contextlib import contextmanager

from alloctrace.traces.errors import UserError

from . import prestart


class SweepStopped(UserError):
    """The sweep was ended by a signal: its programs were killed, its folders removed, and this says so (with
    what was stored before) instead of a sweep that reads as finished."""


@contextmanager
def stopped_by_signals(sid: str, stored: dict, total: int):
    """SIGTERM and SIGHUP end the sweep as Ctrl-C does (the programs, whose process groups no terminal signal
    reaches, are killed on the way out; the folders removed), as SweepStopped, exit status 128 + the signal.
    The points stored before get the tag `sweep-stopped=SIGNAL`, so the stored sweep reads as stopped."""
    import atexit
    import signal

    def stop(signum, _frame):
        raise SweepStopped("", 128 + signum)

    atexit.register(prestart.end_all)
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except (SweepStopped, KeyboardInterrupt) as e:
        prestart.end_all()
        code = e.exit_code if isinstance(e, SweepStopped) else 130
        name = signal.Signals(code - 128).name
        _mark_stopped(stored, name)
        raise SweepStopped(f"sweep {sid} stopped by signal {code - 128} ({name}) after {len(stored['ids'])} of "
                           f"{total} points were stored (tagged sweep={sid} and sweep-stopped={name}); its "
                           "programs were killed", code) from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        prestart.end_all()


def _mark_stopped(stored: dict, name: str) -> None:
    """Tag what a stopped sweep stored (best effort: a second signal, or a store that fails, leaves it)."""
    from alloctrace.traces.store.tags import with_tags

    store = stored["store"]
    try:
        for tid in stored["ids"]:
            store.set_tags(tid, with_tags(store.summary(tid).get("tags") or [], [f"sweep-stopped={name}"]))
    except Exception:  # noqa: BLE001 - the stop itself is what is reported
        pass
