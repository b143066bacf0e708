"""How many threads a server process lends its requests, and to what.

A read (a summary, a listing, a graph's first build) runs in one of REQUEST_THREADS threads. Python runs one
thread of a process at a time: past a few, more threads only take turns at the interpreter's lock, and each turn
costs a switch. With starlette's default of 40, `serve --workers 2` on 2 cores answered 1.54-1.55x the reads of
one worker; with 8 (the PostgreSQL pool's connections) 1.54-1.66x, with 4 1.60-1.72x, one worker's own rate the
same (docs/team.md). The cost: a fifth slow read (a long graph's first map) waits for one of four to end.
An upload's import waits on its reading child for as long as the file takes: it runs in one of IMPORT_THREADS
threads of its own, so imports never hold the reads' threads, nor run more children than that at once.
"""
from __future__ import annotations

import anyio
import anyio.to_thread

REQUEST_THREADS = 4
IMPORT_THREADS = 4


def lend_threads(state) -> None:
    """At start-up, in the server's event loop: the reads' threads counted, the imports' limiter made."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = REQUEST_THREADS
    state.import_limiter = anyio.CapacityLimiter(IMPORT_THREADS)


async def in_import_thread(request, fn, *args):
    """`fn(*args)` in one of the imports' threads (the reads' pool when the app was started without its
    lifespan, as a test client outside a `with` block starts it)."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=getattr(request.app.state, "import_limiter", None))
