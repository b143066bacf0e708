"""The trace store: one SQLite database (WAL) in a store directory, or a PostgreSQL database.

Directory: an explicit path, else $ALLOCTRACE_STORE, else $XDG_DATA_HOME/alloctrace
(~/.local/share/alloctrace); a `postgresql://user@host:port/db` URL in their place opens a
PostgreSQL store (postgres.py) with the same tables, bytes and answers (so does a libpq `key=value`
string). Each
graph's events are stored column-wise (see columns.py): a few compressed numpy blobs and a string
table per graph, so large graphs load fast. `add_trace` is one transaction: a failure or an
interrupt leaves nothing behind. Concurrent imports and reads are safe on either backend.

Its length: one class over a backend; its reads and writes share the backend's transactions (the tables
and upgrades are in migrations.py, the column blobs and their checksums in blobs.py, the derived data in
derived.py, a copy between stores in copy.py); the batch reads a page of many traces needs (tagged,
summaries, graph_extras_of) sit beside the one-trace reads they mirror.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from collections.abc import Iterable

from alloctrace.allocator.events import Event
from alloctrace.traces.errors import UserError
from alloctrace.traces.util.gcpause import without_gc

from alloctrace.traces.store import derived
from alloctrace.traces.util import verbose
from alloctrace.traces.store.blobs import (_decompress, checkpoint_rows, checksum, pack_blobs,  # noqa: F401
                                          thread_compressor, thread_decompressor, unpack_blobs)
from alloctrace.traces.store.columns import EncodedGraph, decode_events, encode, pack, public_columns
from alloctrace.traces.store.damage import (DECODE_ERRORS, Damaged, DerivedDamaged, _json, _why, check_rows,  # noqa: F401
                                            damaged, verify_checksum)
from alloctrace.traces.store.derived import SAVED_MIN_EVENTS, Saved
from alloctrace.traces.store.migrations import STORE_FORMAT, create, current
from alloctrace.traces.store.schema import FORMAT_VERSION, GraphRecord, TraceMeta
from alloctrace.traces.store.sqlite import BUSY_TIMEOUT_S, SqliteBackend, StoreFull, is_full as _is_full  # noqa: F401

DB_NAME = "alloctrace.db"
TRUNCATED = """instr(extra, '"truncated": true') > 0"""  # salvaged from a truncated compressed file
INCOMPLETE = """instr(extra, '"incomplete": true') > 0"""  # a graph the log did not finish (extra is sorted JSON)
# what a summary shows of a trace and of each of its graphs (_summary reads them in this order)
TRACE_COLUMNS = "id, name, source, generation, profile, created, tags, " + TRUNCATED
GRAPH_COLUMNS = "idx, role, n_events, max_size, buffer_size, oom, consistent, " + INCOMPLETE
ID_RE = re.compile(r"^[0-9a-f]{1,8}$")
FULL_ID_RE = re.compile(r"^[0-9a-f]{8}$")
SMALL_VALUE = 1024  # an extra's value longer than this as JSON is left out of its small copy
GRAPH_INSERT = ("trace_id, idx, role, n_events, max_size, buffer_size, oom, consistent, extra, strings, packed, "
                "checksum, extra_small")
GRAPH_MARKS = "(" + ",".join("?" * 13) + ")"
TRACE_INSERT = "id, name, source, generation, profile, created, tags, extra, format_version, content_hash"
BUMP_SQL = ("INSERT INTO store_info VALUES ('generation', '1') ON CONFLICT(key) "
            "DO UPDATE SET value = CAST(CAST(store_info.value AS INTEGER) + 1 AS TEXT)")
BATCH_ROWS, BATCH_BYTES = 64, 8 << 20  # graph rows held at most before they are sent (memory)
KEY_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")  # a key graph_extras_of may take out in SQL
GENERATION_SQL = "SELECT value FROM store_info WHERE key='generation'"
# a trace's summary columns, then each graph's (trace_id None: no graphs), in one statement
SUMMARY_SQL = (f"SELECT t.*, g.* FROM (SELECT {TRACE_COLUMNS} AS truncated FROM traces WHERE id = ?) AS t "
               f"LEFT JOIN (SELECT trace_id, {GRAPH_COLUMNS} AS incomplete FROM graphs WHERE trace_id = ?) AS g "
               "ON g.trace_id = t.id ORDER BY g.idx")


def _graph_index(tid: str, g) -> int:
    """`g` as a graph index the database can hold; past int64 (`trace:99999999999999999999`, `--device 2**64`)
    no graph has it, said in one line (the driver raised OverflowError)."""
    g = int(g)
    if not -(1 << 63) <= g < 1 << 63:
        raise NotFound(f"trace {tid} has no graph {g}")
    return g


class NotFound(KeyError, UserError):
    """No trace (or graph) with that id."""

    exit_code = 3

    def __init__(self, message: str):
        UserError.__init__(self, message)

    def __str__(self):
        return self.args[0]


def store_url(path=None) -> str | None:
    """The PostgreSQL URL that names the store (explicit, else $ALLOCTRACE_STORE), None for a directory."""
    where = str((path if path else os.environ.get("ALLOCTRACE_STORE")) or "")
    if "://" not in where and "=" not in where:
        return None  # neither a URL nor a key=value string: a folder, told without importing postgres.py
    from alloctrace.traces.store import postgres

    return where if postgres.is_url(where) else None


def store_dir(path=None) -> Path:
    """Where the store lives: explicit path, $ALLOCTRACE_STORE, or the per-user data directory."""
    if path:
        return Path(path).expanduser()
    if os.environ.get("ALLOCTRACE_STORE"):
        return Path(os.environ["ALLOCTRACE_STORE"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "alloctrace"


class NoStore(UserError):
    """A command that only reads was pointed at a folder that holds no store (a mistyped --store, say): the
    user's error, exit status 2."""


def open_store(path=None, create: bool = True) -> "Store":
    """The store a directory or a PostgreSQL URL names (see store_dir and store_url). A read that names a
    folder with no store is refused (`create=False`): a typo must not make an empty store that answers
    "no traces"."""
    with verbose.stage("open store"):
        return _open_store(path, create)


def _open_store(path, create: bool) -> "Store":
    url = store_url(path)
    if url is not None:
        verbose.note("store", f"postgresql {verbose.hide_password(url)}")
        from alloctrace.traces.store import postgres

        return Store(backend=postgres.PostgresBackend(url))
    d = store_dir(path)
    if d.exists() and not d.is_dir():
        raise UserError(f"store {d} is not a directory")
    if not create and not (d / DB_NAME).is_file():
        raise NoStore(f"no store at {d} (import, record, sweep or fit makes one; check --store or "
                      f"$ALLOCTRACE_STORE)")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create store directory {d}: {e.strerror}") from None
    verbose.note("store", f"sqlite {d / DB_NAME}")
    return Store(d / DB_NAME)


class Store:
    """Traces and their graphs over a backend (SQLite file or PostgreSQL database): the same SQL,
    schema version and migrations on both, so every command and endpoint answers the same."""

    def __init__(self, db_path: Path | None = None, backend=None):
        self._be = backend if backend is not None else SqliteBackend(Path(db_path))
        self.path = self._be.path  # the SQLite file; None for PostgreSQL
        self.kind = self._be.kind
        try:
            ver = self._be.setup(lambda db: create(db, self._be.table_columns), current)
        except self._be.errors as e:
            self._be.close()
            raise UserError(f"cannot open store {self._be.describe()}: {str(e).strip().splitlines()[0]}") from None
        if not str(ver).isdecimal():
            self._be.close()
            raise UserError(f"store {self._be.describe()} is damaged: its format_version is {str(ver)[:40]!r}, not a "
                            "number (restore it from a backup, or set it to the version the store was made with)")
        self.read_only = self._be.read_only  # a PostgreSQL role that may only SELECT
        if int(ver) > STORE_FORMAT:
            self._be.close()
            raise UserError(f"store {self._be.describe()} has format {ver}; this alloctrace reads up to {STORE_FORMAT}")

    # zstandard contexts of the calling thread: one store serves a server's whole thread pool
    _zc = property(lambda self: thread_compressor())
    _zd = property(lambda self: thread_decompressor())

    # the SQLite connection and its lock (tests and tools that inspect the file)
    db = property(lambda self: self._be.db)
    _lock = property(lambda self: self._be.lock)

    def writer(self) -> "Store":
        """A store for a server's writes: a second SQLite connection, or this store (a pool) on PostgreSQL."""
        be = self._be.reopen()
        return self if be is self._be else Store(backend=be)

    def _snapshot(self):
        """One read transaction, so related queries see the same committed state."""
        return self._be.read()

    def close(self):
        self._be.close()

    # --- writing ------------------------------------------------------------------------
    def add_trace(self, meta: TraceMeta, graphs: Iterable[GraphRecord | EncodedGraph],
                  content_hash: str | None = None) -> str:
        """Store a trace in one transaction; `graphs` may be a generator (it is consumed inside).
        Items may be GraphRecords or graphs an importer encoded already (EncodedGraph)."""
        return self.add_traces([(meta, graphs, content_hash)])[0]

    def add_traces(self, traces: Iterable[tuple]) -> list[str]:
        """Store traces [(meta, graphs, content_hash)] in one transaction: all of them or, on any failure or
        interrupt, none. `content_hash` names the input they were read from (stored_with finds it again)."""
        return [s["id"] for s in self.add_traces_summarised(traces, summaries=False)]

    def add_traces_summarised(self, traces: Iterable[tuple], summaries: bool = True) -> list[dict]:
        """`add_traces`, answering the new traces' summaries (as `summaries`), read in the same transaction:
        on PostgreSQL their queries ride in the write's pipeline, answered with its COMMIT (no read
        transaction's four round trips after it)."""
        traces = list(traces)
        if getattr(self._be, "guess_ids", False) and all(isinstance(g, (list, tuple)) for _, g, _ in traces):
            try:  # ids not looked up first: the write is one round trip; one taken fails it, and it runs again
                return self._add_traces(traces, summaries, look=False)
            except self._be.errors as e:
                if not self._be.id_taken(e):
                    raise
        return self._add_traces(traces, summaries, look=True)

    def _add_traces(self, traces: list[tuple], summaries: bool, look: bool) -> list[dict]:
        written: list[tuple] = []  # each trace's summary columns as written (trace row, graph rows)
        asked: list[tuple] = []
        built: dict[int, tuple] = {}  # graph rows made already (by id(graph)), less their trace id
        if not look and getattr(self._be, "insert_at_once", None):
            tids = self._add_at_once(traces, written, built)
            if tids is not None:
                return _summaries_of(tids, _as_written(written)) if summaries else [{"id": t} for t in tids]
            written = []
        with self._be.write() as db:
            ids = self._ids_for(db, [meta for meta, _, _ in traces], look)
            tids = [self._insert_trace(db, meta, graphs, content_hash, tid, written, built)
                    for (meta, graphs, content_hash), tid in zip(traces, ids)]
            self._bump(db)  # on PostgreSQL the row stays locked until the commit
            if summaries and not all(_as_read_back(row, graphs) for row, graphs in written):
                asked = [(self._be.later(db, f"SELECT {TRACE_COLUMNS} FROM traces WHERE id IN ({marks})", part),
                          self._be.later(db, f"SELECT trace_id, {GRAPH_COLUMNS} FROM graphs WHERE trace_id IN "
                                             f"({marks}) ORDER BY trace_id, idx", part))
                         for part, marks in _chunks(tids)]
        if not summaries:
            return [{"id": t} for t in tids]
        if asked:  # their rows, answered with the COMMIT
            return _summaries_of(tids, [(t.rows, g.rows) for t, g in asked])
        # what the summaries' queries would read back, value for value: no statements of theirs
        return _summaries_of(tids, _as_written(written))

    def _add_at_once(self, traces: list[tuple], written: list, built: dict) -> list[str] | None:
        """The traces' rows and the generation's bump as one statement (PostgreSQL: insert_at_once), a
        transaction of its own, so the write is one message and one answer; the new ids are guessed (a used one
        fails it: traces.id is UNIQUE). None (nothing written) where the general write is needed: a graph that
        gets derived rows, rows past BATCH_BYTES together (those made are kept in `built` for it), or summary
        values that reading back would change (_as_read_back)."""
        if any(_derives(g) for _, graphs, _ in traces for g in graphs):
            return None
        ids = self._ids_for(None, [meta for meta, _, _ in traces], look=False)
        trace_rows, graph_rows, held = [], [], 0
        for (meta, graphs, content_hash), tid in zip(traces, ids):
            trace_rows.append(self._trace_row(meta, tid, content_hash, written))
            for g in graphs:
                row, _ = self._graph_row(tid, g)
                built[id(g)] = row[1:]
                written[-1][1].append(_graph_summary(row))
                graph_rows.append(row)
                held += len(row[9]) + len(row[10])
                if held > BATCH_BYTES:
                    return None
        if not all(_as_read_back(row, graphs) for row, graphs in written):
            return None
        self._be.insert_at_once([("traces", TRACE_INSERT, trace_rows), ("graphs", GRAPH_INSERT, graph_rows)],
                                BUMP_SQL)
        return ids

    @staticmethod
    def _ids_for(db, metas: list[TraceMeta], look: bool = True) -> list[str]:
        """An unused id per trace, found with one query for all of them (a round trip each on PostgreSQL
        otherwise): the id a trace had (an export imported back keeps it, so links and scripts still name
        it) when the store has no trace by it, else a random one. `look` False: no query, every id taken as
        free (the INSERT of a used one fails: traces.id is UNIQUE)."""
        wanted = [m.id if isinstance(m.id, str) and FULL_ID_RE.match(m.id) else None for m in metas]
        while True:
            spare = [os.urandom(4).hex() for _ in metas]  # as secrets.token_hex, without importing hashlib
            asked = [t for t in wanted if t] + spare
            taken = set()
            for part, marks in (_chunks(asked) if look else ()):
                taken.update(r[0] for r in db.execute(f"SELECT id FROM traces WHERE id IN ({marks})", part))
            free = [t for t in dict.fromkeys(spare) if t not in taken and t not in wanted]
            out = []
            for t in wanted:
                if t and t not in taken and t not in out:
                    out.append(t)
                elif free:
                    out.append(free.pop())
                else:
                    break  # this many random ids met used ones: draw again
            else:
                return out

    @staticmethod
    def _trace_row(meta: TraceMeta, tid: str, content_hash: str | None, written: list) -> tuple:
        """A trace's row (TRACE_INSERT); its summary columns (TRACE_COLUMNS as written) appended to `written`,
        with a list for its graphs'."""
        created = meta.created or time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())  # UTC, ISO 8601
        trace = (tid, meta.name, meta.source, meta.generation or "", meta.profile, created, json.dumps(meta.tags),
                 json.dumps(meta.extra, sort_keys=True))
        written.append((trace[:7] + ('"truncated": true' in trace[7],), []))
        return (*trace, FORMAT_VERSION, content_hash)

    def _insert_trace(self, db, meta: TraceMeta, graphs, content_hash: str | None, tid: str,
                      written: list, built: dict) -> str:
        """The trace's rows; its summary columns (TRACE_COLUMNS, GRAPH_COLUMNS as written) appended to
        `written`. A graph whose row is in `built` is not encoded again."""
        db.execute(f"INSERT INTO traces ({TRACE_INSERT}) VALUES ({','.join('?' * 10)})",
                   self._trace_row(meta, tid, content_hash, written))
        summary_graphs = written[-1][1]
        rows: list[tuple] = []  # graph rows sent a batch at a time (executemany: in PostgreSQL's pipeline)
        held = 0
        for g in graphs:
            made = built.pop(id(g), None)
            row, derive = ((tid, *made), None) if made is not None else self._graph_row(tid, g)
            summary_graphs.append(_graph_summary(row))
            rows.append(row)
            held += len(row[9]) + len(row[10])
            if derive or held > BATCH_BYTES or len(rows) == BATCH_ROWS:
                self._insert_graphs(db, rows)
                rows, held = [], 0
            if derive:
                self._add_derived_rows(db, tid, *derive)
        self._insert_graphs(db, rows)
        return tid

    @staticmethod
    def _insert_graphs(db, rows: list[tuple]) -> None:
        if rows:
            db.executemany(f"INSERT INTO graphs ({GRAPH_INSERT}) VALUES {GRAPH_MARKS}", rows)

    def _graph_row(self, tid: str, g: GraphRecord | EncodedGraph) -> tuple[tuple, tuple | None]:
        """A graph's row, and what its derived rows are made from (None: it has none)."""
        encoded = None
        if isinstance(g, EncodedGraph):
            strings, blobs, n = g.strings, g.blobs, g.n_events
        else:
            encoded = encode(g.events)
            strings, blobs = pack(*encoded, self._zc.compress)
            n = len(g.events)
        packed = pack_blobs(blobs)
        row = (tid, g.index, g.role, n, g.max_size, g.buffer_size,
               None if g.oom is None else json.dumps(g.oom), None if g.consistent is None else int(g.consistent),
               json.dumps(g.extra, sort_keys=True) if g.extra else "{}", strings, packed, checksum(strings, packed),
               _small_extra(g.extra))
        return row, ((g, n, strings, blobs, encoded) if _derives(g) else None)

    def stored_with(self, content_hashes: Iterable[str]) -> dict[str, list[str]]:
        """Content hash -> the ids of the traces read from an input of that hash (sources.input_hash: its
        bytes, tags and options), oldest first: a re-run of an import finds what it stored before."""
        out: dict[str, list[str]] = {}
        with self._snapshot() as db:
            for part, marks in _chunks(list(dict.fromkeys(content_hashes))):
                for tid, h in db.execute(f"SELECT id, content_hash FROM traces WHERE content_hash IN ({marks}) "
                                         "ORDER BY seq", part):
                    out.setdefault(h, []).append(tid)
        return out

    @staticmethod
    def _bump(db):
        """Every write moves the store's generation on, so caches in other processes notice."""
        db.execute(BUMP_SQL)

    def generation(self, wait: bool = True) -> int | None:
        """A number that changes whenever any process writes to the store (it lives in the database).
        wait=False: None when this connection is busy (a long read in another thread) instead of waiting."""
        row = self._be.generation(wait, GENERATION_SQL)
        if row is False:  # busy
            return None
        return int(row[0]) if row else 0

    def trace_ids(self) -> set[str]:
        with self._snapshot() as db:
            return {r[0] for r in db.execute("SELECT id FROM traces")}

    def _add_derived_rows(self, db, tid: str, g: GraphRecord | EncodedGraph, n: int, strings, blobs, encoded):
        """A long graph of ggml events (a PyTorch device's entries have no `kind`) gets the analyses' derived
        rows (derived.py) in the same transaction, so that no request has to replay it from its start."""
        makers = derived.derived()
        names = tuple(dict.fromkeys(name for d in makers for name in d.reads))
        if not names:
            return
        if encoded is None:
            import numpy as np

            encoded = ({name: np.frombuffer(self._zd.decompress(data), dtype=np.dtype(dt))
                        for name, dt, data in blobs if name in names},
                       json.loads(self._zd.decompress(strings)))
        cols = public_columns(n, *encoded, names=names)
        del encoded
        graph = {"role": g.role, "buffer_size": g.buffer_size}
        for d in makers:
            marks = ",".join("?" * len(d.fields))
            db.executemany(f"INSERT INTO {d.table} (trace_id, graph_idx, {', '.join(d.fields)}) VALUES (?,?,{marks})",
                           [(tid, g.index, *row) for row in d.rows(cols, graph, self._zc)])
    def add_state_checkpoints(self, tid: str, graph_index: int, rows: list[tuple[int, bytes]]) -> bool:
        """Keep the checkpoints (blobs.checkpoint_rows) of a graph of ggml events stored without them, in one
        transaction; False when it has some already (another process was first), is gone, or is not one."""
        return self._add_derived("state_checkpoints", ("event", "data"), tid, graph_index, rows)

    def add_saved_lifetimes(self, tid: str, graph_index: int, data: bytes) -> bool:
        """Keep the memory-map lifetimes (memmap_saved.encode) of a graph of ggml events stored without
        them; False when it has them already (another process was first), is gone, or is not one."""
        return self._add_derived("memmap_lod", ("data",), tid, graph_index, [(data,)])

    def _add_derived(self, table: str, fields: tuple[str, ...], tid: str, graph_index: int, rows: list) -> bool:
        """Rows of `table` (one of this module's tables of derived data) for a graph of ggml events that has
        none yet, in one transaction; False when it has some, is gone, or is not one.
        Derived data: no generation bump, nothing cached changes."""
        with self._be.write() as db:
            if "kind" not in self._column_names(db, tid, graph_index) or db.execute(
                    f"SELECT 1 FROM {table} WHERE trace_id=? AND graph_idx=? LIMIT 1", (tid, graph_index)).fetchone():
                return False  # gone, not ggml events, or kept already (the empty transaction commits)
            marks = ",".join("?" * len(fields))
            db.executemany(f"INSERT INTO {table} (trace_id, graph_idx, {', '.join(fields)}) VALUES (?,?,{marks})",
                           [(tid, graph_index, *row) for row in rows])
            return True

    @staticmethod
    def _column_names(db, tid: str, g: int) -> list[str]:
        """The names of a graph's stored columns (none when the graph is gone)."""
        row = db.execute("SELECT packed FROM graphs WHERE trace_id=? AND idx=?", (tid, int(g))).fetchone()
        if row is None:
            return []
        if row[0] is not None:
            return [name for name, _, _ in unpack_blobs(row[0])]
        return [r[0] for r in db.execute("SELECT name FROM columns WHERE trace_id=? AND graph_idx=?",
                                         (tid, int(g)))]

    def delete(self, tid: str) -> None:
        tid = self._id(tid)
        with self._be.write() as db:
            if not db.execute("SELECT 1 FROM traces WHERE id=?", (tid,)).fetchone():
                raise NotFound(f"no trace {tid!r}")  # deleted by another process since it was resolved
            for table in ("columns", "state_checkpoints", "memmap_lod", "graphs"):
                db.execute(f"DELETE FROM {table} WHERE trace_id=?", (tid,))
            db.execute("DELETE FROM traces WHERE id=?", (tid,))
            self._bump(db)

    def set_tags(self, tid: str, tags: list[str]) -> None:
        """Replace a trace's tags (traces never change otherwise): one write, the generation moves on."""
        tid = self._id(tid)
        with self._be.write() as db:
            db.execute("UPDATE traces SET tags=? WHERE id=?", (json.dumps(list(tags)), tid))
            self._bump(db)

    # --- reading ------------------------------------------------------------------------
    def resolve(self, ref: str) -> tuple[str, int | None]:
        """'ID' or 'ID:G' -> (full id, graph index or None); unique id prefixes are accepted."""
        ref = (ref or "").strip()
        head, sep, tail = ref.partition(":")
        head = _id_head(head, ref)
        with self._snapshot() as db:
            tid = _unique_id(db, head)
        if not sep:
            return tid, None
        if not tail.isdecimal():
            raise NotFound(f"bad graph index {tail!r} in {ref!r}")
        g = _graph_index(tid, int(tail))
        with self._snapshot() as db:
            if not db.execute("SELECT 1 FROM graphs WHERE trace_id=? AND idx=?", (tid, g)).fetchone():
                raise NotFound(f"trace {tid} has no graph {g}")
        return tid, g

    def _id(self, tid: str) -> str:
        return self.resolve(str(tid).partition(":")[0])[0]

    def summary(self, tid: str) -> dict:
        ref = str(tid).partition(":")[0].strip()
        head = _id_head(ref, ref)
        if FULL_ID_RE.match(head):  # one statement, outside a transaction (on PostgreSQL one round trip, not 5)
            rows = self._be.read_one(SUMMARY_SQL, (head, head))
            if not rows:
                raise NotFound(f"no trace {head!r}")
            return _summary(rows[0][:8], [r[9:] for r in rows if r[8] is not None], strict=True)
        with self._snapshot() as db:  # the id found in the same read: a transaction less
            tid = _unique_id(db, head)
            row = db.execute(f"SELECT {TRACE_COLUMNS} FROM traces WHERE id=?", (tid,)).fetchone()
            graphs = db.execute(f"SELECT {GRAPH_COLUMNS} FROM graphs WHERE trace_id=? ORDER BY idx", (tid,)).fetchall()
        if row is None:
            raise NotFound(f"no trace {tid!r}")
        return _summary(row, graphs, strict=True)

    def list(self, q: str | None = None, tags: Iterable[str] = ()) -> list[dict]:
        """Summaries, newest first; `q` keeps traces whose name contains it (case-insensitive) or that carry
        it as a tag when it is `key=value`; `tags` keeps traces that carry every one of them."""
        from alloctrace.traces.store.tags import matches, split_query
        q, wanted = split_query(q, tags)
        sql = f"SELECT {TRACE_COLUMNS} FROM traces"
        args: tuple = ()
        if q:
            sql += " WHERE instr(lower(name), lower(?)) > 0"
            args = (q,)
        with self._snapshot() as db:
            rows = [r for r in db.execute(sql + " ORDER BY created DESC, seq DESC", args).fetchall()
                    if matches(_loose_tags(r[6]), wanted)]
            keep = {r[0] for r in rows}
            graphs: dict[str, list] = {}
            every = f"SELECT trace_id, {GRAPH_COLUMNS} FROM graphs"
            # a name or tag that picks some traces: only their graph rows are read
            asked = [(every + f" WHERE trace_id IN ({marks})", part) for part, marks in _chunks(sorted(keep))] \
                if (q or wanted) and len(keep) < 2000 else [(every, ())]
            for sql, part in asked:
                for r in db.execute(sql + " ORDER BY trace_id, idx", part):
                    if r[0] in keep:
                        graphs.setdefault(r[0], []).append(r[1:])
        return [_summary(r, graphs.get(r[0], [])) for r in rows]

    def tagged(self, tags: Iterable[str], key: str) -> list[tuple[str, list]]:
        """(id, tags) of the traces that carry every one of `tags` and a `key=...` tag, oldest first: found by
        the tags' stored text (no graph row is read), then checked exactly. What the history page groups."""
        tags = list(tags)
        needles = [json.dumps(t) for t in tags] + [json.dumps(key + "=")[:-1]]  # as stored: JSON strings
        where = " AND ".join("instr(tags, ?) > 0" for _ in needles)
        with self._snapshot() as db:
            rows = db.execute(f"SELECT id, tags FROM traces WHERE {where} ORDER BY created, seq", needles).fetchall()
        out, prefix = [], key + "="
        for tid, text in rows:
            have = _loose_tags(text, _fast_json)
            if all(t in have for t in tags) and any(isinstance(t, str) and t.startswith(prefix) for t in have):
                out.append((tid, have))
        return out

    def all_tags(self) -> list[list]:
        """Every trace's tags (a damaged value: none), without reading a graph: what the tag lists count."""
        with self._snapshot() as db:
            return [_loose_tags(r[0]) for r in db.execute("SELECT tags FROM traces")]

    def summaries(self, ids: Iterable[str]) -> list[dict]:
        """The summaries of these traces (those still stored) in the order given, a query per 500 ids."""
        ids = list(dict.fromkeys(ids))
        with self._snapshot() as db:
            answers = [(db.execute(f"SELECT {TRACE_COLUMNS} FROM traces WHERE id IN ({marks})", part).fetchall(),
                        db.execute(f"SELECT trace_id, {GRAPH_COLUMNS} FROM graphs WHERE trace_id IN ({marks}) "
                                   "ORDER BY trace_id, idx", part).fetchall())
                       for part, marks in _chunks(ids)]
        return _summaries_of(ids, answers)

    def graph_extras_of(self, ids: Iterable[str], keys: tuple[str, ...] = ()) -> dict[str, dict[int, dict]]:
        """`graph_extras` of several traces at once (id -> graph index -> extra); `keys`: only those keys,
        taken out by the database (a recording's extra is mostly its shapes, which need not be parsed)."""
        ids = list(ids)
        if keys and all(KEY_NAME_RE.match(k) for k in keys):
            try:
                return self._graph_extra_keys(ids, keys)
            except (*self._be.errors, ValueError):
                pass  # some extra is not JSON: the whole values are read, and the damaged one named
        out: dict[str, dict[int, dict]] = {}
        with self._snapshot() as db:
            for part, marks in _chunks(list(dict.fromkeys(ids))):
                for tid, idx, extra in db.execute(f"SELECT trace_id, idx, extra FROM graphs WHERE trace_id IN ({marks})",
                                                  part):
                    try:
                        value = _fast_json(extra)
                    except ValueError:  # or an integer past 64 bits: the checked reader tells
                        value = _json(extra, tid, idx, "extra", dict)
                    if not isinstance(value, dict):
                        value = _json(extra, tid, idx, "extra", dict)  # Damaged, naming it
                    out.setdefault(tid, {})[idx] = value
        return out

    def _graph_extra_keys(self, ids: list[str], keys: tuple[str, ...]) -> dict[str, dict[int, dict]]:
        """Kept per process: a stored trace's graphs never change (only its tags do), so a page asked for
        again reads none of them."""
        cache = self.__dict__.setdefault("_picked", {})
        if len(cache) > 100_000:
            cache.clear()
        out: dict[str, dict[int, dict]] = {tid: cache[tid, keys] for tid in ids if (tid, keys) in cache}
        if len(out) == len(set(ids)):
            return out  # every one kept: no read transaction (two round trips on PostgreSQL for nothing)
        whole: list[str] = []  # traces with a graph whose small extra lacks a key (or that has none)
        with self._snapshot() as db:
            for part, marks in _chunks([tid for tid in dict.fromkeys(ids) if tid not in out]):
                for tid, idx, small in db.execute(f"SELECT trace_id, idx, extra_small FROM graphs "
                                                  f"WHERE trace_id IN ({marks})", part):
                    small = None if small is None else _fast_json(small)
                    if not isinstance(small, dict) or any(k in small.get("_omitted", ()) for k in keys):
                        whole.append(tid)
                        continue
                    out.setdefault(tid, {})[idx] = {k: small[k] for k in keys if small.get(k) is not None}
            for part, marks in _chunks(list(dict.fromkeys(whole))):
                for tid, idx, picked in db.execute(f"SELECT trace_id, idx, {self._be.json_keys('extra', keys)} "
                                                   f"FROM graphs WHERE trace_id IN ({marks})", part):
                    out.setdefault(tid, {})[idx] = {k: v for k, v in _fast_json(picked).items() if v is not None}
        for tid in ids:
            if tid in out:
                cache[tid, keys] = out[tid]
        return out

    @without_gc  # decoding a graph makes a million small objects, no cycles (also for events, graph)
    def _decoded(self, tid: str, g: int, decode):
        row, cols, table = self._raw(tid, g)
        try:
            return row, decode(row[2], cols, table)
        except DECODE_ERRORS as e:  # columns that decompressed but hold impossible values
            raise damaged(e, self._id(tid), g, "columns") from None

    @staticmethod
    def _blobs(db, tid: str, g: int, row) -> list:
        """A graph's compressed columns [(name, dtype, data)]: from its row's `packed` (its last value),
        or, stored by format 1, from a row each in `columns`; NotFound when `row` is None."""
        if row is None:
            raise NotFound(f"trace {tid} has no graph {g}")
        if row[-1] is not None:
            try:
                return unpack_blobs(row[-1])
            except DECODE_ERRORS as e:
                raise damaged(e, tid, g, "packed columns") from None
        return db.execute("SELECT name, dtype, data FROM columns WHERE trace_id=? AND graph_idx=? ORDER BY name",
                          (tid, int(g))).fetchall()

    @staticmethod
    def _verify(tid: str, g: int, row, blobs) -> None:
        """A graph's bytes against its stored checksum (its row ends with strings, checksum, packed)."""
        packed = row[-1] if row[-1] is not None else pack_blobs(blobs)
        verify_checksum(tid, g, row[-2], row[-3], packed)

    def _raw(self, tid: str, g: int):
        tid = self._id(tid)
        with self._snapshot() as db:
            row = db.execute("SELECT idx, role, n_events, max_size, buffer_size, oom, consistent, extra, strings, "
                             "checksum, packed FROM graphs WHERE trace_id=? AND idx=?",
                             (tid, _graph_index(tid, g))).fetchone()
            blobs = self._blobs(db, tid, g, row)
        self._verify(tid, g, row, blobs)
        row = row[:9]
        try:
            table = json.loads(self._zd.decompress(row[8]))
        except DECODE_ERRORS as e:
            raise damaged(e, tid, g, "strings") from None
        check_rows(tid, g, row[2], blobs)
        import numpy as np

        try:
            cols = {name: np.frombuffer(self._zd.decompress(data), dtype=np.dtype(dt)) for name, dt, data in blobs}
        except DECODE_ERRORS as e:
            raise damaged(e, tid, g, "columns") from None
        return row, cols, table

    def lazy_columns(self, tid: str, graph_index: int):
        """The graph's columns still compressed, each decompressed when first read (columns_lazy)."""
        from alloctrace.traces.store.columns_lazy import LazyColumns, StringTable

        tid = self._id(tid)
        with self._snapshot() as db:
            row = db.execute("SELECT n_events, strings, checksum, packed FROM graphs WHERE trace_id=? AND idx=?",
                             (tid, int(graph_index))).fetchone()
            blobs = self._blobs(db, tid, graph_index, row)
        self._verify(tid, graph_index, row, blobs)
        check_rows(tid, graph_index, row[0], blobs)

        def checked(data: bytes) -> bytes:
            try:
                return _decompress(data)
            except DECODE_ERRORS as e:
                raise damaged(e, tid, graph_index, "columns") from None
        try:
            cols = LazyColumns(row[0], {name: (dt, data) for name, dt, data in blobs}, checked)
            cols.table = StringTable(thread_decompressor().decompress(row[1]))
        except DECODE_ERRORS as e:
            raise damaged(e, tid, graph_index, "strings") from None
        return cols

    def events(self, tid: str, graph_index: int) -> list[Event]:
        return self._decoded(tid, graph_index, decode_events)[1]

    def graph_extra(self, tid: str, graph_index: int) -> dict:
        """A graph's extra (a recording's buffer types and sizes, ...) without its columns."""
        tid = self._id(tid)
        with self._snapshot() as db:
            row = db.execute("SELECT extra FROM graphs WHERE trace_id=? AND idx=?",
                             (tid, _graph_index(tid, graph_index))).fetchone()
        if row is None:
            raise NotFound(f"trace {tid} has no graph {graph_index}")
        return _json(row[0], tid, graph_index, "extra", dict)

    def graph_extras(self, tid: str) -> dict[int, dict]:
        """Every graph's extra of a trace, by graph index."""
        tid = self._id(tid)
        with self._snapshot() as db:
            rows = db.execute("SELECT idx, extra FROM graphs WHERE trace_id=?", (tid,)).fetchall()
        return {idx: _json(extra, tid, idx, "extra", dict) for idx, extra in rows}

    def columns(self, tid: str, graph_index: int) -> dict:
        return self._decoded(tid, graph_index, public_columns)[1]

    def graph(self, tid: str, graph_index: int) -> GraphRecord:
        tid = self._id(tid)
        row, events = self._decoded(tid, graph_index, decode_events)
        idx, role, n, max_size, buffer_size, oom, consistent, extra, _ = row
        return GraphRecord(index=idx, role=role, events=events, max_size=max_size,
                           buffer_size=buffer_size, oom=None if oom is None else _json(oom, tid, idx, "oom"),
                           consistent=None if consistent is None else bool(consistent),
                           extra=_json(extra, tid, idx, "extra", dict))

    def saved_states(self, tid: str, graph_index: int) -> Saved | None:
        """The graph's stored state checkpoints (derived.Saved), None when it has none (a short
        graph, or one stored before checkpoints were kept)."""
        tid = self._id(tid)
        with self._snapshot() as db:
            marks = [r[0] for r in db.execute("SELECT event FROM state_checkpoints WHERE trace_id=? AND "
                                              "graph_idx=? ORDER BY event", (tid, int(graph_index)))]

        def load(event: int) -> dict:
            with self._snapshot() as db:
                row = db.execute("SELECT data FROM state_checkpoints WHERE trace_id=? AND graph_idx=? AND "
                                 "event=?", (tid, int(graph_index), event)).fetchone()
            if row is None:
                raise NotFound(f"trace {tid} graph {graph_index} has no state checkpoint at event {event}")
            try:
                state = json.loads(_decompress(row[0]))
            except DECODE_ERRORS as e:
                raise damaged(e, tid, graph_index, f"state checkpoint at event {event}", cls=DerivedDamaged) from None
            if not isinstance(state, dict):
                raise DerivedDamaged(tid, graph_index, f"state checkpoint at event {event}", "not an object")
            return state
        return Saved(marks, load) if marks else None

    def saved_lifetimes(self, tid: str, graph_index: int):
        """The graph's memory-map lifetimes with their tile pyramid (memmap.Lifetimes with `lod`) as stored
        with it, None when it has none (a short graph, or one stored before they were kept)."""
        tid = self._id(tid)
        with self._snapshot() as db:
            row = db.execute("SELECT data FROM memmap_lod WHERE trace_id=? AND graph_idx=?",
                             (tid, int(graph_index))).fetchone()
        lifetimes = derived.of_table("memmap_lod")
        if row is None or lifetimes is None:
            return None
        try:
            return lifetimes.decode(row[0])
        except DECODE_ERRORS as e:
            raise damaged(e, tid, graph_index, "memory-map lifetimes", cls=DerivedDamaged) from None

    def drop_derived(self, tid: str, graph_index: int, table: str) -> None:
        """Forget a graph's derived rows (`state_checkpoints` or `memmap_lod`) that cannot be read, so they
        are made again from its columns."""
        if table not in ("state_checkpoints", "memmap_lod"):
            raise ValueError(table)
        with self._be.write() as db:
            db.execute(f"DELETE FROM {table} WHERE trace_id=? AND graph_idx=?", (tid, int(graph_index)))

    def meta(self, tid: str) -> TraceMeta:
        tid = self._id(tid)
        with self._snapshot() as db:
            r = db.execute("SELECT name, source, generation, profile, created, tags, extra FROM traces WHERE id=?",
                           (tid,)).fetchone()
        if r is None:
            raise NotFound(f"no trace {tid!r}")
        return TraceMeta(name=r[0], source=r[1], generation=r[2] or None, profile=r[3], created=r[4],
                         tags=_json(r[5], tid, None, "tags", list), extra=_json(r[6], tid, None, "extra", dict))


def _small_extra(extra: dict | None) -> str:
    """A graph's extra without its large values (a recording's shapes), their keys under `_omitted`: what a
    page of many graphs reads (graph_extras_of) instead of parsing every graph's whole extra."""
    small, omitted = {}, []
    for k, v in (extra or {}).items():
        text = json.dumps(v)
        if len(text) <= SMALL_VALUE:
            small[k] = v
        else:
            omitted.append(k)
    return json.dumps({**small, "_omitted": omitted} if omitted else small, sort_keys=True)


# the Python type each summary column is read back as (the database's own for the value given), None aside
TRACE_TYPES = (str, str, str, str, str, str, str, bool)
GRAPH_TYPES = (int, str, int, int, int, str, int, bool)


def _as_read_back(trace: tuple, graphs: list[tuple]) -> bool:
    """Whether a trace's summary columns as written are what reading them back gives (plain ints and strings:
    SQLite and PostgreSQL keep those as they are; a float or a numpy int the column converts is read back)."""
    return all(v is None or type(v) is t for v, t in zip(trace, TRACE_TYPES)) and \
        all(v is None or type(v) is t for g in graphs for v, t in zip(g, GRAPH_TYPES))


def _derives(g: GraphRecord | EncodedGraph) -> bool:
    """Whether a graph gets derived rows when stored (_add_derived_rows): a long graph of ggml events."""
    if isinstance(g, EncodedGraph):
        return g.n_events >= SAVED_MIN_EVENTS and any(b[0] == "kind" for b in g.blobs)
    return len(g.events) >= SAVED_MIN_EVENTS


def _graph_summary(row: tuple) -> tuple:
    """A graph row's summary columns (GRAPH_COLUMNS) as written."""
    return row[1:8] + ('"incomplete": true' in row[8],)


def _as_written(written: list[tuple]) -> list[tuple]:
    """[(trace rows, graph rows)] as the summaries' queries would read back what was written."""
    return [([row], [(row[0], *g) for g in sorted(graphs, key=lambda g: g[0])]) for row, graphs in written]


def _summaries_of(ids: list[str], answers) -> list[dict]:
    """Summaries in the order of `ids` (those stored) from [(trace rows, graph rows)] of their queries."""
    rows: dict[str, tuple] = {}
    graphs: dict[str, list] = {}
    for trace_rows, graph_rows in answers:
        rows.update((r[0], r) for r in trace_rows)
        for r in graph_rows:
            graphs.setdefault(r[0], []).append(r[1:])
    return [_summary(rows[t], graphs.get(t, [])) for t in ids if t in rows]


def _id_head(head: str, ref: str) -> str:
    """A trace id or unique prefix as looked up (lower case); NotFound naming `ref` when it cannot be one."""
    head = head.lower()
    if not ID_RE.match(head):
        raise NotFound(f"no trace {ref!r}")
    return head


def _unique_id(db, head: str) -> str:
    """The one stored trace id that starts with `head`, inside a read; NotFound when none or several do."""
    rows = db.execute("SELECT id FROM traces WHERE substr(id, 1, ?) = ? LIMIT 2", (len(head), head)).fetchall()
    if not rows:
        raise NotFound(f"no trace {head!r}")
    if len(rows) > 1:
        raise NotFound(f"trace id prefix {head!r} is ambiguous")
    return rows[0][0]


def _chunks(ids: list[str], size: int = 500):
    """(ids, their placeholders) a few hundred at a time: a statement's parameters are bounded."""
    for at in range(0, len(ids), size):
        part = ids[at:at + size]
        yield part, ",".join("?" * len(part))


def _fast_json(text):
    import orjson

    return orjson.loads(text)


def _loose_tags(text, loads=json.loads) -> list:
    """A listing shows a trace whose tags are damaged without them (`show` and `doctor` name the damage)."""
    try:
        tags = loads(text)
    except DECODE_ERRORS:
        return []
    return tags if isinstance(tags, list) and all(isinstance(t, str) for t in tags) else []


def _loose_oom(text):
    try:
        oom = json.loads(text)
    except DECODE_ERRORS:
        return None
    return oom if isinstance(oom, dict) else None


def _summary(row, graphs, strict: bool = False) -> dict:
    """A trace's summary; `strict`: a damaged tags or oom value is Damaged (else left out, for listings)."""
    tid, name, source, generation, profile, created, tags, truncated = row
    tags = _json(tags, tid, None, "tags", list) if strict else _loose_tags(tags)
    oom = (lambda g: _json(g[5], tid, g[0], "oom", dict)) if strict else (lambda g: _loose_oom(g[5]))
    return {"id": tid, "name": name, "source": source, "generation": generation or None, "profile": profile,
            "created": created, "tags": tags, "truncated": bool(truncated),
            "graphs": [{"index": g[0], "role": g[1], "n_events": g[2], "max_size": g[3], "buffer_size": g[4],
                        "oom": None if g[5] is None else oom(g),
                        "consistent": None if g[6] is None else bool(g[6]), "complete": not g[7]} for g in graphs]}
