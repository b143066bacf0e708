"""What the API handlers share: the store, per-graph caches, the upload folder, import and replay.

Reads go through the store's connection, which serialises its own use; writes
(uploads, replays, deletes) go through a second connection to the same file, so
a long import transaction never holds the lock readers wait for (WAL lets them
read the last committed state meanwhile). An upload is parsed completely before
its transaction starts, outside any lock, so uploads parse side by side and a
failed parse writes nothing. Per-graph answers (columns, lifetimes) are cached;
another process may delete a trace, so each cached answer is checked against the
store's generation (a number every write moves on) before it is used.
"""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.gcpause import gc_paused
from alloctrace.traces import memmap
from alloctrace.traces.util.lru import LRU
from alloctrace.traces.store.columns import event_rows
from alloctrace.traces.store.graph_info import graph_info
from alloctrace.traces.store.store import NotFound
from alloctrace.server.mapjson import prepare

log = logging.getLogger("alloctrace.server")


def upload_dir_for(store) -> Path:
    """A folder of this process's uploads in progress, inside the store directory (a temp folder
    for a store without one). Folders of processes that died mid-upload are removed here."""
    db = getattr(store, "path", None)
    if db is None:
        return Path(tempfile.mkdtemp(prefix="alloctrace-uploads-"))
    root = Path(db).parent / "uploads"
    root.mkdir(exist_ok=True)
    for d in root.iterdir():
        pid = d.name.partition("-")[0]
        if pid.isdecimal() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
    mine = root / f"{os.getpid()}-{secrets.token_hex(4)}"
    mine.mkdir()
    return mine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Context:
    def __init__(self, store, max_upload_bytes: int, limits=None):
        from alloctrace.traces.sources.bounded_io import Limits
        self.store = store
        self.max_upload_bytes = max_upload_bytes
        self.limits = limits or Limits.from_env()
        self._generation = None
        self._gen_lock = threading.Lock()
        self.columns_cache = LRU(8)
        self.lifetimes_cache = LRU(8)
        self.info_cache = LRU(64)
        self.map_cache = LRU(128)
        self.states_cache = LRU(8)
        self.lazy_cache = LRU(8)  # columns still compressed, for graphs only asked for states
        self.upload_dir = upload_dir_for(store)
        self._writer = None
        self._writer_lock = threading.Lock()
        self.keeping: threading.Thread | None = None  # the last background store of checkpoints or lifetimes

    def close(self):
        shutil.rmtree(self.upload_dir, ignore_errors=True)
        stores = [self.store] + ([self._writer] if self._writer not in (None, self.store) else [])
        for s in stores:
            closer = getattr(s, "close", None)
            if closer:
                closer()

    def call(self, fn):
        return fn(self.store)

    def write(self, fn):
        """fn(store) on the writing connection (opened on first use: a second SQLite connection, or the
        same store when it pools its connections, as a PostgreSQL store does)."""
        with self._writer_lock:
            if self._writer is None:
                writer = getattr(self.store, "writer", None)
                self._writer = self.store if writer is None else writer()
        return fn(self._writer)

    # --- per-graph caches -------------------------------------------------------------
    def _caches(self):
        return (self.columns_cache, self.lifetimes_cache, self.info_cache, self.map_cache, self.states_cache,
                self.lazy_cache)

    def fresh(self):
        """Forget cached answers of traces that another process deleted since the last look."""
        gen_of = getattr(self.store, "generation", None)
        if gen_of is None:
            return
        gen = self.call(lambda s: s.generation())
        if gen == self._generation:
            return
        self._refresh(gen)

    def fresh_now(self) -> bool:
        """`fresh` for the event loop: True when the caches are known current without waiting;
        False when the store is busy or has changed (the caller then takes the route that waits)."""
        gen_of = getattr(self.store, "generation", None)
        return gen_of is None or gen_of(wait=False) == self._generation

    def _refresh(self, gen):
        with self._gen_lock:
            ids = self.call(lambda s: s.trace_ids())
            for cache in self._caches():
                cache.keep_traces(ids)
            self._generation = gen

    def columns(self, trace_id: str, g: int) -> dict:
        return _cached(self.columns_cache, (trace_id, g), lambda: self.call(lambda s: s.columns(trace_id, g)))

    def some_columns(self, trace_id: str, g: int):
        """The decoded columns when another view has loaded them, else the graph's LazyColumns: what a
        request reading a few rows needs (a state request as the graph's first, say), without decoding all.
        A graph without stored state checkpoints (a short one, or one of an older store) is decoded: its
        StateIndex replays from the start, reading every column anyway."""
        for cache in (self.columns_cache, self.lazy_cache):
            cols = cache.peek((trace_id, g))
            if cols is not None:
                return cols
        if self.call(lambda s: s.saved_states(trace_id, g)) is None:
            return self.columns(trace_id, g)
        return _cached(self.lazy_cache, (trace_id, g), lambda: self.call(lambda s: s.lazy_columns(trace_id, g)))

    def lifetimes(self, trace_id: str, g: int) -> memmap.Lifetimes:
        """With the tile pyramid and the pyramid's JSON rows, so later views of the graph only cut and
        join. A long graph's lifetimes and pyramid were made when it was stored and are loaded; others
        (short graphs, graphs of older stores) are built from the columns on this first view."""
        def build():
            lt = self._saved_lifetimes(trace_id, g)
            if lt is None:
                lt = memmap.with_lod(memmap.extract(self.columns(trace_id, g)))
                self._keep_lifetimes(trace_id, g, lt)
            return prepare(lt)
        return _cached(self.lifetimes_cache, (trace_id, g), build)

    def _saved_lifetimes(self, trace_id: str, g: int) -> memmap.Lifetimes | None:
        """The graph's stored lifetimes; None without them, or when they cannot be read (derived data:
        the graph's own columns still give the map)."""
        saved = getattr(self.store, "saved_lifetimes", None)
        if saved is None:
            return None
        from alloctrace.traces.store.damage import DerivedDamaged
        try:
            return self.call(lambda s: saved(trace_id, g))
        except NotFound:
            raise
        except DerivedDamaged as e:  # made again from the columns, and stored again by _keep_lifetimes
            log.warning("%s: made again from the graph's columns", e)
            self.write(lambda s: s.drop_derived(trace_id, g, "memmap_lod"))
            return None
        except Exception as e:  # noqa: BLE001
            log.warning("stored memory-map lifetimes of %s:%d not read (built instead): %s", trace_id, g, e)
            return None

    def _keep_lifetimes(self, trace_id: str, g: int, lt: memmap.Lifetimes):
        """A long graph of an older store: its lifetimes and pyramid are stored in the background, for the
        next server (as its state checkpoints are)."""
        from alloctrace.traces.state.index import SAVED_MIN_EVENTS
        if lt.n_events < SAVED_MIN_EVENTS or getattr(self.store, "add_saved_lifetimes", None) is None:
            return

        def made():
            import zstandard

            from alloctrace.traces.memmap import saved as memmap_saved
            data = memmap_saved.encode(lt, zstandard.ZstdCompressor(level=3, write_checksum=True))
            return lambda s: s.add_saved_lifetimes(trace_id, g, data)
        self._keep_in_background("memory-map lifetimes", trace_id, g, made)

    def _keep_in_background(self, what: str, trace_id: str, g: int, made: Callable[[], Callable]):
        """Make a graph's derived data (`made()` returns the store write that keeps it) and store it, in a
        thread of its own; a failure is a warning: the views answer without it."""
        def keep():
            try:
                self.write(made())
            except Exception as e:  # noqa: BLE001 (derived data)
                log.warning("%s of %s:%d not stored: %s", what, trace_id, g, e)
        self.keeping = threading.Thread(target=keep, daemon=True, name=f"{what} {trace_id}:{g}")
        self.keeping.start()

    def with_state_index(self, trace_id: str, g: int, answer: Callable):
        """answer(the graph's StateIndex). Stored checkpoints that cannot be read are dropped, and the
        answer is made again from the graph's columns (which has the checkpoints made and stored again)."""
        from alloctrace.traces.store.damage import DerivedDamaged
        try:
            return answer(self.state_index(trace_id, g))
        except DerivedDamaged as e:
            log.warning("%s: made again from the graph's columns", e)
            self.write(lambda s: s.drop_derived(trace_id, g, "state_checkpoints"))
            self.states_cache.drop(trace_id)
            return answer(self.state_index(trace_id, g))

    def state_index(self, trace_id: str, g: int):
        """The graph's StateIndex, from its stored checkpoints. A long graph stored without them (by an
        older version) answers from checkpoints made on demand, and has them made and stored in the
        background, for the next server."""
        from alloctrace.traces.state.index import SAVED_MIN_EVENTS, StateIndex, first_saved

        def build():
            info = self.graph_info(trace_id, g, lazy=True)
            capacity, saved = info["capacity"], self.call(lambda s: s.saved_states(trace_id, g))
            if first_saved(saved, info["n_events"], capacity) is not None:  # only the rows after a checkpoint
                return StateIndex(self.some_columns(trace_id, g), capacity, saved)
            cols = self.columns(trace_id, g)
            index = StateIndex(cols, capacity, saved)
            if index._saved is None and index.n_events >= SAVED_MIN_EVENTS:
                self._keep_in_background("state checkpoints", trace_id, g,
                                         lambda: self._checkpoints_made(trace_id, g, cols, capacity))
            return index
        return _cached(self.states_cache, (trace_id, g), build)

    @staticmethod
    def _checkpoints_made(trace_id: str, g: int, cols: dict, capacity: int | None):
        """A graph's state checkpoints, made outside the write lock; the store write that keeps them."""
        import zstandard

        from alloctrace.traces.state.index import saved_checkpoints
        from alloctrace.traces.store.blobs import checkpoint_rows
        rows = list(checkpoint_rows(saved_checkpoints(cols, capacity), zstandard.ZstdCompressor(level=3, write_checksum=True).compress))
        return lambda s: s.add_state_checkpoints(trace_id, g, rows)

    def graph_info(self, trace_id: str, g: int, lazy: bool = False) -> dict:
        """The graph's summary row plus its oom event and real capacity (traces/store/graph_info.py); `lazy`: from
        the columns still compressed unless they are decoded already (for a view that decodes few rows)."""
        def build():
            summary = self.call(lambda s: s.summary(trace_id))
            rows = [r for r in summary.get("graphs", []) if r.get("index") == g]
            if not rows:
                if 0 <= g < len(summary.get("graphs", [])):
                    rows = [summary["graphs"][g]]
                else:
                    raise NotFound(f"trace {trace_id} has no graph {g}")
            return graph_info(rows[0], self.some_columns(trace_id, g) if lazy else self.columns(trace_id, g))
        return self.info_cache.get((trace_id, g), build)

    def forget(self, trace_id: str):
        for cache in self._caches():
            cache.drop(trace_id)

    # --- writes -----------------------------------------------------------------------
    def import_file(self, path: Path, name: str | None, filename: str | None = None, cancelled=None,
                    tags=()) -> list[dict]:
        """Import one received file through the one entry point every face uses (traces.sources):
        parsed completely within the import caps, outside the write lock, then one store
        transaction. `cancelled()` turning True stops the parse. Messages name the client's file,
        never the temp path."""
        from alloctrace.traces.sources.bounded_io import Cancelled
        from alloctrace.traces.sources import read_file, store_traces
        label = filename or "upload"
        limits = self.limits if cancelled is None else self.limits.with_(cancelled=cancelled)
        try:
            traces = read_file(path, name=name, filename=label, limits=limits, tags=tags)
            if cancelled is not None and cancelled():
                raise Cancelled(f"{label}: import cancelled (the client went away)")
            return self.write(lambda s: store_traces(s, traces))
        except UserError as e:
            e.args = (str(e).replace(str(path), label),)
            raise e from None

    def replay(self, params: dict) -> dict:
        """`alloctrace replay --store` in-process: both graphs stored as one trace."""
        from alloctrace.traces.replay.run import run_replay
        return self.write(lambda s: run_replay(params.pop("preset"), params.pop("profile"), store=s, **params))

    # --- reads ------------------------------------------------------------------------
    def event_rows(self, trace_id: str, g: int, indices: list[int]) -> list[dict]:
        """Event dicts (with their index `i`), from the columns decoded or still compressed."""
        return event_rows(self.some_columns(trace_id, g), indices)


def _cached(cache, key, build):
    """A cached per-graph answer; building one makes a million small objects, no cycles."""
    def paused():
        with gc_paused():
            return build()
    return cache.get(key, paused)
