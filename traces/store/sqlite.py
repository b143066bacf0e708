"""The SQLite backend: one database file (WAL) in a store directory, one connection per store.

The connection serialises its own use (a lock); a write is one `BEGIN IMMEDIATE` transaction, so
concurrent importers in other processes wait for each other (busy timeout) instead of failing,
and readers see the last committed state meanwhile.
"""
from __future__ import annotations

import errno
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from alloctrace.traces.errors import UserError

BUSY_TIMEOUT_S = 120.0


class StoreFull(UserError):
    """The disk (or the store's size limit) is full; nothing of the write was kept."""

    status = 507


def is_full(e: BaseException) -> bool:
    if isinstance(e, sqlite3.OperationalError):
        # a write past the end of the disk or of the file size limit (RLIMIT_FSIZE gives EFBIG: IOERR_WRITE)
        return getattr(e, "sqlite_errorcode", None) in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_WRITE) \
            or "full" in str(e)
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


class SqliteBackend:
    kind = "sqlite"
    read_only = False
    errors = (sqlite3.DatabaseError,)

    def __init__(self, path: Path):
        self.path = Path(path)
        self.where = str(self.path.parent)
        self.lock = threading.RLock()
        try:
            self.db = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.DatabaseError as e:
            raise UserError(f"cannot open store {self.path}: {e}") from None

    def describe(self) -> str:
        return str(self.path)

    def close(self):
        self.db.close()

    def reopen(self) -> "SqliteBackend":
        """A second connection to the same file (a server writes through one, reads through the other)."""
        return SqliteBackend(self.path)

    def setup(self, create, current):
        """WAL mode, then `create(db)` in one transaction unless the tables are `current` already; other
        processes may be creating the store now."""
        for attempt in range(200):
            try:
                self.db.execute("PRAGMA journal_mode=WAL")
                with self.read() as db:
                    if current(db):
                        return current.format
                with self.write(busy_fails=False) as db:
                    return create(db)
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 199:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    @staticmethod
    def json_keys(column: str, keys) -> str:
        """SQL for a JSON object of `keys` of the JSON object in `column` (missing ones null)."""
        return "json_object(" + ", ".join(f"'{k}', {column} -> '$.{k}'" for k in keys) + ")"

    def table_columns(self, db, table: str) -> set[str]:
        return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}

    @contextmanager
    def read(self):
        """One read transaction, so related queries see the same committed state."""
        with self.lock:
            self.db.execute("BEGIN")
            try:
                yield self.db
            finally:
                self.db.execute("COMMIT")

    def read_one(self, sql: str, args=()) -> list[tuple]:
        """The rows of one statement (its own snapshot: no transaction around it)."""
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    @contextmanager
    def write(self, busy_fails: bool = True):
        """One write transaction: committed when the block ends, rolled back on any exception."""
        with self.lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                if not busy_fails:
                    raise
                raise UserError(f"store {self.path} is busy: {e}") from None
            try:
                yield self.db
                self.db.execute("COMMIT")
            except BaseException as e:
                self._abandon(e)
                raise

    def _abandon(self, e: BaseException):
        """Roll the open write back (sqlite may have done so already) and say "disk full" when it was."""
        if self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        if is_full(e):
            try:  # give the WAL's pages back, so the disk is not left full
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            raise StoreFull(f"disk full: cannot write to the store {self.where} (nothing was stored)") from None

    @staticmethod
    def later(db, sql: str, args=()):
        """A query inside a write, answered at once (postgres.Later's shape: `rows`)."""
        return SimpleNamespace(rows=db.execute(sql, args).fetchall())

    def generation(self, wait: bool, sql: str):
        """The generation row (None: none yet); False when `wait` is False and the connection is busy."""
        if not self.lock.acquire(blocking=wait):
            return False
        try:
            return self.db.execute(sql).fetchone()
        finally:
            self.lock.release()
