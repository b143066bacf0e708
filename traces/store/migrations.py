"""The store's tables, and how an older store is brought to the current layout (both backends).

STORE_FORMAT is the database's layout, not the trace format (schema.FORMAT_VERSION): 1 kept each column of
a graph in a row of `columns`; 2 keeps them in the graph's own row (`graphs.packed`), one insert per graph
instead of ~20 (older graphs keep their rows and are read); 3 adds `graphs.checksum` (a content checksum of
each graph's blobs, verified on read and by `doctor`; graphs stored before it have none and are checked by
decoding) and `traces.content_hash` (the input a trace was read from, so a re-run of an import stores nothing
twice), `graphs.extra_small` (its extra without large values: what a page of many graphs reads), with the
indexes the listing and the history read by.
"""
from __future__ import annotations

import re

STORE_FORMAT = 3

# written for SQLite; the PostgreSQL backend reads INTEGER as BIGINT and BLOB as BYTEA
SCHEMA = """
CREATE TABLE IF NOT EXISTS store_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS traces (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL, source TEXT NOT NULL, generation TEXT NOT NULL, profile TEXT,
    created TEXT NOT NULL, tags TEXT NOT NULL, extra TEXT NOT NULL, format_version INTEGER NOT NULL,
    content_hash TEXT);
CREATE TABLE IF NOT EXISTS graphs (
    trace_id TEXT NOT NULL REFERENCES traces(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL, role TEXT NOT NULL, n_events INTEGER NOT NULL,
    max_size INTEGER, buffer_size INTEGER, oom TEXT, consistent INTEGER, extra TEXT NOT NULL,
    strings BLOB NOT NULL, packed BLOB, checksum TEXT, extra_small TEXT,
    PRIMARY KEY (trace_id, idx));
CREATE TABLE IF NOT EXISTS columns (
    trace_id TEXT NOT NULL, graph_idx INTEGER NOT NULL, name TEXT NOT NULL, dtype TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (trace_id, graph_idx, name),
    FOREIGN KEY (trace_id, graph_idx) REFERENCES graphs(trace_id, idx) ON DELETE CASCADE);
CREATE TABLE IF NOT EXISTS state_checkpoints (
    trace_id TEXT NOT NULL, graph_idx INTEGER NOT NULL, event INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (trace_id, graph_idx, event),
    FOREIGN KEY (trace_id, graph_idx) REFERENCES graphs(trace_id, idx) ON DELETE CASCADE);
CREATE TABLE IF NOT EXISTS memmap_lod (
    trace_id TEXT NOT NULL, graph_idx INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (trace_id, graph_idx),
    FOREIGN KEY (trace_id, graph_idx) REFERENCES graphs(trace_id, idx) ON DELETE CASCADE);
"""
TABLES = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))
# each table's columns and their SQLite types, as SCHEMA declares them
COLUMN_TYPES = {table: dict(re.findall(r"(?:^|[(,])\s*(\w+) (TEXT|INTEGER|BLOB)\b", body))
                for table, body in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\);", SCHEMA, re.S)}
# made after an upgrade added the columns they index
INDEXES = (
    "CREATE INDEX IF NOT EXISTS traces_content_hash ON traces (content_hash)",
    "CREATE INDEX IF NOT EXISTS traces_created ON traces (created, seq)",
)


def current(db) -> bool:
    """Whether the store's tables exist at STORE_FORMAT already: then opening it writes nothing (a role that
    may only SELECT opens it, and opening is one quick read)."""
    try:
        row = db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone()
        if row is None or str(row[0]) != str(STORE_FORMAT):
            return False
        for table in TABLES:  # a table missing at the current format (lost, or dropped by hand): made again
            db.execute(f"SELECT 1 FROM {table} LIMIT 0")
    except Exception:  # noqa: BLE001 - no table yet (each backend's own error): create it
        return False
    return True


current.format = str(STORE_FORMAT)


def create(db, table_columns) -> str:
    """The tables, then the format version (upgrading an older store); inside the backend's setup transaction.
    `table_columns(db, table)`: the backend's way to list a table's columns."""
    for stmt in SCHEMA.split(";"):
        if stmt.strip():
            db.execute(stmt)
    db.execute("INSERT INTO store_info VALUES ('format_version', ?) ON CONFLICT(key) DO NOTHING",
               (str(STORE_FORMAT),))
    (ver,) = db.execute("SELECT value FROM store_info WHERE key='format_version'").fetchone()
    if str(ver).isdecimal() and int(ver) < STORE_FORMAT:  # not a number: damaged, said when the store opens
        ver = _upgrade(db, int(ver), table_columns)
    if str(ver) == str(STORE_FORMAT):
        for stmt in INDEXES:
            db.execute(stmt)
    return ver


def _upgrade(db, ver: int, table_columns) -> str:
    """Bring an older store to STORE_FORMAT inside the setup transaction: what it holds stays as it is
    (older graphs are read from their `columns` rows); the version says the layout changed, so an older
    alloctrace refuses the store instead of missing the columns of graphs stored from now on."""
    graphs, traces = table_columns(db, "graphs"), table_columns(db, "traces")
    if "packed" not in graphs:  # format 2
        db.execute("ALTER TABLE graphs ADD COLUMN packed BLOB")
    if "checksum" not in graphs:  # format 3: graphs stored before have none (checked by decoding)
        db.execute("ALTER TABLE graphs ADD COLUMN checksum TEXT")
    if "extra_small" not in graphs:  # graphs stored before: read from their whole extra
        db.execute("ALTER TABLE graphs ADD COLUMN extra_small TEXT")
    if "content_hash" not in traces:
        db.execute("ALTER TABLE traces ADD COLUMN content_hash TEXT")
    db.execute("UPDATE store_info SET value=? WHERE key='format_version'", (str(STORE_FORMAT),))
    return str(STORE_FORMAT)
