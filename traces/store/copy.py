"""Copy the traces of one store into another (SQLite folder or PostgreSQL database, either way): what
`alloctrace store copy` does.

A trace keeps its id, name, tags, created time, extra, content hash, every graph's bytes and its derived rows
(state checkpoints, memory-map lifetimes), so links and scripts that name ids keep working. Each trace is
one transaction in the destination: a copy that is killed or loses a database keeps whole traces only, and a
re-run copies only the traces the destination lacks (idempotent). Every graph's bytes are checked against
their content checksum before they leave (a graph stored before checksums were kept is decoded instead, and
gets its checksum in the destination) and read back and checked again before the transaction commits.
A damaged trace of the source is named and left out; a trace whose id the destination holds with other
content is named and left alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .blobs import checksum, pack_blobs
from .damage import Damaged, verify_checksum

TRACE_FIELDS = ("id", "name", "source", "generation", "profile", "created", "tags", "extra", "format_version",
                "content_hash")
GRAPH_FIELDS = ("trace_id", "idx", "role", "n_events", "max_size", "buffer_size", "oom", "consistent", "extra",
                "strings", "packed", "checksum", "extra_small")
DERIVED = {"state_checkpoints": ("trace_id", "graph_idx", "event", "data"),
           "memmap_lod": ("trace_id", "graph_idx", "data")}


@dataclass
class CopyReport:
    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)  # already in the destination, the same bytes
    conflicts: list[str] = field(default_factory=list)  # the destination holds the id with other content
    damaged: list[str] = field(default_factory=list)  # Damaged messages of source traces left out

    @property
    def complete(self) -> bool:
        return not (self.conflicts or self.damaged)


def copy_store(src, dst, progress=None) -> CopyReport:
    """Copy every trace of `src` that `dst` lacks (oldest first, so listings keep their order)."""
    report = CopyReport()
    with src._snapshot() as db:
        ids = [r[0] for r in db.execute("SELECT id FROM traces ORDER BY seq")]
    have = dst.trace_ids()
    for n, tid in enumerate(ids):
        if progress:
            progress(n, len(ids), tid)
        try:
            rows = _trace_rows(src, tid)
        except Damaged as e:
            report.damaged.append(str(e))
            continue
        if rows is None:
            continue  # deleted from the source meanwhile
        if tid in have:
            same = _checksums(dst, tid) == {g[1]: g[11] for g in rows["graphs"]}
            (report.present if same else report.conflicts).append(tid)
            continue
        if _insert(dst, rows):
            report.copied.append(tid)
        else:
            report.present.append(tid)  # another copy stored it meanwhile
    return report


def _trace_rows(src, tid: str) -> dict | None:
    """A trace's rows as the destination stores them, each graph's bytes checked (Damaged when they fail)."""
    with src._snapshot() as db:
        trace = db.execute(f"SELECT {', '.join(TRACE_FIELDS)} FROM traces WHERE id=?", (tid,)).fetchone()
        if trace is None:
            return None
        graphs = []
        for row in db.execute(f"SELECT {', '.join(GRAPH_FIELDS)} FROM graphs WHERE trace_id=? ORDER BY idx",
                              (tid,)).fetchall():
            row = list(row)
            if row[10] is None:  # stored a row per column (format 1): packed here, in name order
                row[10] = pack_blobs(src._blobs(db, tid, row[1], (None,)))
            row[9], row[10] = bytes(row[9]), bytes(row[10])
            graphs.append(row)
        derived = {table: db.execute(f"SELECT {', '.join(fields)} FROM {table} WHERE trace_id=?", (tid,)).fetchall()
                   for table, fields in DERIVED.items()}
    for row in graphs:
        if row[11] is None:  # no checksum kept: decoding is the check, then it gets one
            src._raw(tid, row[1])
            row[11] = checksum(row[9], row[10])
        else:
            verify_checksum(tid, row[1], row[11], row[9], row[10])
    return {"trace": tuple(trace), "graphs": graphs, "derived": derived}


def _checksums(store, tid: str) -> dict[int, str]:
    """A stored trace's graph checksums by index (computed for a graph stored without one)."""
    out = {}
    with store._snapshot() as db:
        for row in db.execute("SELECT trace_id, idx, strings, checksum, packed FROM graphs WHERE trace_id=?",
                              (tid,)).fetchall():
            packed = row[4] if row[4] is not None else pack_blobs(store._blobs(db, tid, row[1], row))
            out[row[1]] = row[3] or checksum(row[2], packed)
    return out


def _insert(dst, rows: dict) -> bool:
    """One trace in one transaction of the destination, its graphs read back and checked before the commit;
    False when the destination has its id already."""
    tid = rows["trace"][0]
    with dst._be.write() as db:
        if db.execute("SELECT 1 FROM traces WHERE id=?", (tid,)).fetchone():
            return False
        db.execute(f"INSERT INTO traces ({', '.join(TRACE_FIELDS)}) VALUES ({','.join('?' * len(TRACE_FIELDS))})",
                   rows["trace"])
        db.executemany(f"INSERT INTO graphs ({', '.join(GRAPH_FIELDS)}) VALUES ({','.join('?' * len(GRAPH_FIELDS))})",
                       rows["graphs"])
        for table, fields in DERIVED.items():
            if rows["derived"][table]:
                db.executemany(f"INSERT INTO {table} ({', '.join(fields)}) VALUES ({','.join('?' * len(fields))})",
                               rows["derived"][table])
        for idx, strings, packed, stored in db.execute("SELECT idx, strings, packed, checksum FROM graphs "
                                                       "WHERE trace_id=?", (tid,)).fetchall():
            verify_checksum(tid, idx, stored, strings, packed)  # Damaged: rolled back, nothing half-copied
        dst._bump(db)
    return True
