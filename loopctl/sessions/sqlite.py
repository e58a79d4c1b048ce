"""``SQLiteSessionStore``: conversations in one SQLite file (stdlib ``sqlite3``).

The embedded default. One row per message (``messages``), one row per
session (``sessions``: owner, revision, times), one row per live writer
(``leases``), the rows a compaction replaced (``removed``, an audit trail)
and the schema version (``loopctl_meta``). Rules it keeps:

- WAL journal, ``synchronous=FULL``, every write one ``BEGIN IMMEDIATE``
  transaction that first checks the writer's lease: a write is all or
  nothing, and only the lease holder's lands.
- Any thread may call any method: one connection guarded by a lock.
  Several stores (threads or processes) on one file coordinate through
  SQLite's own locking with a busy timeout.
- A session has a ``sessions`` row only once something was written: a
  lease taken by a run that then failed leaves the file as it was.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

from loopctl.errors import ConfigError, LoopError
from loopctl.sessions.base import (
    DEFAULT_LEASE_S,
    SessionBackend,
    SessionInfo,
    SessionStore,
    store_error,
)

SCHEMA_VERSION = 1

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS loopctl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, owner TEXT, revision INTEGER NOT NULL,"
    " created REAL NOT NULL, updated REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sessions_owner ON sessions(owner, updated)",
    "CREATE TABLE IF NOT EXISTS messages (session_id TEXT NOT NULL, seq INTEGER NOT NULL,"
    " body TEXT NOT NULL, PRIMARY KEY (session_id, seq))",
    "CREATE TABLE IF NOT EXISTS leases (session_id TEXT PRIMARY KEY, token TEXT NOT NULL, until REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS removed (session_id TEXT NOT NULL, revision INTEGER NOT NULL,"
    " seq INTEGER NOT NULL, body TEXT NOT NULL, at REAL NOT NULL)",
)


class _SQLiteBackend(SessionBackend):
    """The storage operations on one connection (see the module's rules)."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            con = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open session database {str(path)!r}: {exc}") from exc
        self._con: Optional[sqlite3.Connection] = con
        self._finalizer = weakref.finalize(self, con.close)
        try:
            con.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            _retry_locked(lambda: con.execute("PRAGMA journal_mode = WAL"), timeout)
            con.execute("PRAGMA synchronous = FULL")
            _retry_locked(lambda: self._create_schema(con), timeout)
        except (sqlite3.Error, LoopError) as exc:
            self.close()
            raise ConfigError(f"cannot use {str(path)!r} as a session database: {exc}") from exc

    def _create_schema(self, con: sqlite3.Connection) -> None:
        with self._tx(con):
            for stmt in _SCHEMA:
                con.execute(stmt)
            row = con.execute("SELECT value FROM loopctl_meta WHERE key = 'sessions_schema'").fetchone()
            if row is None:
                con.execute("INSERT INTO loopctl_meta VALUES ('sessions_schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise LoopError(f"session schema version {row[0]} is newer than this loopctl's ({SCHEMA_VERSION})")

    @contextlib.contextmanager
    def _tx(self, con: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        con.execute(f"BEGIN {mode}")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")

    @contextlib.contextmanager
    def _use(self, what: str, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """The connection inside one transaction, under the lock; sqlite errors become ``LoopError``."""
        with self._lock:
            con = self._con
            if con is None:
                raise LoopError("this session store is closed")
            try:
                with self._tx(con, mode):
                    yield con
            except sqlite3.Error as exc:
                raise store_error(what, exc) from exc

    # -- reads ---------------------------------------------------------------------------

    def load(self, session_id: str) -> Tuple[int, Optional[str], List[Any]]:
        with self._use("load", "DEFERRED") as con:
            head = con.execute("SELECT revision, owner FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if head is None:
                return 0, None, []
            rows = con.execute(
                "SELECT body FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        return int(head[0]), head[1], [r[0] for r in rows]

    def infos(self, owner: Optional[str], session_id: Optional[str] = None) -> List[SessionInfo]:
        sql = (
            "SELECT s.id, s.owner, s.revision, s.updated,"
            " (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) FROM sessions s"
        )
        args: List[Any] = []
        where = []
        if owner is not None:
            where.append("s.owner = ?")
            args.append(owner)
        if session_id is not None:
            where.append("s.id = ?")
            args.append(session_id)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY s.updated DESC, s.id"
        with self._use("list", "DEFERRED") as con:
            rows = con.execute(sql, args).fetchall()
        return [SessionInfo(r[0], r[1], int(r[4]), int(r[2]), float(r[3])) for r in rows]

    # -- the lease -----------------------------------------------------------------------

    def acquire(self, session_id: str, owner: Optional[str], token: str, now: float, until: float) -> bool:
        with self._use("acquire") as con:
            head = con.execute("SELECT owner FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if head is not None and head[0] != owner:
                raise KeyError(f"unknown session {session_id[:80]!r}")
            held = con.execute("SELECT until, token FROM leases WHERE session_id = ?", (session_id,)).fetchone()
            if held is not None and float(held[0]) > now and held[1] != token:
                return False
            con.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?)", (session_id, token, until))
        return True

    def renew(self, session_id: str, token: str, until: float) -> bool:
        with self._use("renew") as con:
            cur = con.execute(
                "UPDATE leases SET until = ? WHERE session_id = ? AND token = ?", (until, session_id, token)
            )
            return cur.rowcount == 1

    def release(self, session_id: str, token: str) -> None:
        with self._use("release") as con:
            con.execute("DELETE FROM leases WHERE session_id = ? AND token = ?", (session_id, token))

    # -- writes --------------------------------------------------------------------------

    def write(
        self, session_id: str, owner: Optional[str], token: str, now: float, rows: List[str], replace: bool
    ) -> Optional[int]:
        with self._use("write") as con:
            held = con.execute("SELECT token FROM leases WHERE session_id = ?", (session_id,)).fetchone()
            if held is None or held[0] != token:
                return None
            head = con.execute("SELECT revision FROM sessions WHERE id = ?", (session_id,)).fetchone()
            revision = 1 if head is None else int(head[0]) + 1
            if head is None:
                con.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", (session_id, owner, revision, now, now))
            else:
                con.execute("UPDATE sessions SET revision = ?, updated = ? WHERE id = ?", (revision, now, session_id))
            old = [r[0] for r in con.execute(
                "SELECT body FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)
            )] if replace else []
            keep = _common_prefix(old, rows) if replace else 0
            if replace:
                # Only the rows that differ are moved to the audit trail; a
                # replace that merely extends the conversation removes nothing.
                con.execute(
                    "INSERT INTO removed SELECT session_id, ?, seq, body, ? FROM messages"
                    " WHERE session_id = ? AND seq >= ?",
                    (revision, now, session_id, keep),
                )
                con.execute("DELETE FROM messages WHERE session_id = ? AND seq >= ?", (session_id, keep))
                start, rows = keep, rows[keep:]
            else:
                last = con.execute("SELECT MAX(seq) FROM messages WHERE session_id = ?", (session_id,)).fetchone()
                start = 0 if last is None or last[0] is None else int(last[0]) + 1
            con.executemany(
                "INSERT INTO messages VALUES (?, ?, ?)", [(session_id, start + i, r) for i, r in enumerate(rows)]
            )
        return revision

    def delete(self, session_id: str, now: float) -> Optional[bool]:
        with self._use("delete") as con:
            held = con.execute("SELECT until FROM leases WHERE session_id = ?", (session_id,)).fetchone()
            if held is not None and float(held[0]) > now:
                return None
            con.execute("DELETE FROM leases WHERE session_id = ?", (session_id,))
            con.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            con.execute("DELETE FROM removed WHERE session_id = ?", (session_id,))
            return con.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 1

    def removed(self, session_id: str) -> List[Tuple[int, str]]:
        """The audit trail: (revision that removed it, row) in order."""
        with self._use("audit", "DEFERRED") as con:
            rows = con.execute(
                "SELECT revision, body FROM removed WHERE session_id = ? ORDER BY revision, seq", (session_id,)
            ).fetchall()
        return [(int(r[0]), r[1]) for r in rows]

    def close(self) -> None:
        with self._lock:
            con, self._con = self._con, None
        if con is not None:
            self._finalizer.detach()
            con.close()


def _common_prefix(old: List[str], new: List[str]) -> int:
    """How many leading rows ``old`` and ``new`` share."""
    n = 0
    for a, b in zip(old, new):
        if a != b:
            break
        n += 1
    return n


def _retry_locked(fn: Callable[[], object], timeout: float) -> None:
    """Run ``fn``, retrying while another connection sets up the same new file.

    Switching the journal mode can fail at once with "database is locked",
    without SQLite's busy handler; that is retried up to ``timeout``.
    """
    deadline = time.monotonic() + timeout
    delay = 0.005
    pause = threading.Event()
    while True:
        try:
            fn()
            return
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                raise
        pause.wait(delay)
        delay = min(delay * 2, 0.1)


class SQLiteSessionStore(SessionStore):
    """Conversations in a SQLite file; safe from any thread and any process.

    Args:
        path: the database file (created with its tables when missing; its
            directory must exist).
        lease_s: seconds a writer's lease lasts without renewal (60).
        clock: wall-clock seconds (injectable for tests).
        timeout: seconds to wait for another writer's lock on the file.

    Raises:
        ConfigError: ``path`` is not a usable database (the message names it).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        *,
        lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.time,
        timeout: float = 30.0,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path) or "\x00" in str(path):
            raise ConfigError(f"SQLiteSessionStore path must be a file path, got {path!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ConfigError(f"SQLiteSessionStore timeout must be a number >= 0, got {timeout!r}")
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"SQLiteSessionStore path {str(self.path)!r} is a directory, not a database file")
        if not self.path.parent.is_dir():
            raise ConfigError(
                f"SQLiteSessionStore path {str(self.path)!r}: directory {str(self.path.parent)!r} does not exist"
            )
        backend = _SQLiteBackend(self.path, float(timeout))
        try:
            super().__init__(backend, lease_s, clock)
        except BaseException:
            backend.close()
            raise
        self._sqlite = backend

    def removed(self, session_id: str) -> List[Tuple[int, str]]:
        """What compactions removed from the session: (revision, stored JSON row), oldest first."""
        return self._sqlite.removed(session_id)

    def __repr__(self) -> str:
        return f"<SQLiteSessionStore {str(self.path)!r}>"


__all__ = ["SCHEMA_VERSION", "SQLiteSessionStore"]
