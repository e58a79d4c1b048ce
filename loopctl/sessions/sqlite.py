"""``SQLiteSessionStore``: conversations in one SQLite file (stdlib ``sqlite3``).

The embedded default. One row per message (``messages``), one row per
session (``sessions``: owner, revision, times, incarnation), one row per live writer
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
- Stored values are read as bytes and checked in ``stored``: a row that is
  not valid UTF-8 (or not a number where one belongs) is that session's
  ``SessionCorrupt``, never a failure of the whole query.
- A file made by schema 1 (no ``incarnation`` column) is migrated when it
  is opened: the column is added, and its sessions keep no incarnation
  until they are deleted and made again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple, Union

from loopctl.checks import shown
from loopctl.errors import ConfigError, LoopError
from loopctl.sessions.base import (
    DEFAULT_LEASE_S,
    SessionBackend,
    SessionInfo,
    SessionStore,
    store_error,
)
from loopctl.sessions.stored import corrupt, list_entry, stored_owner, stored_revision
from loopctl.timeouts import sqlite_seconds

SCHEMA_VERSION = 2

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS loopctl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, owner TEXT, revision INTEGER NOT NULL,"
    " created REAL NOT NULL, updated REAL NOT NULL, incarnation TEXT)",
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
            version = str(row[0]) if row is not None else ""
            if row is not None and not version.isdigit():
                raise LoopError("the session schema version is not a number")
            if row is not None and int(version) > SCHEMA_VERSION:
                raise LoopError(f"session schema version {version} is newer than this loopctl's ({SCHEMA_VERSION})")
            columns = {r[1] for r in con.execute("PRAGMA table_info(sessions)")}
            if "incarnation" not in columns:  # made by schema 1
                con.execute("ALTER TABLE sessions ADD COLUMN incarnation TEXT")
            con.execute(
                "INSERT OR REPLACE INTO loopctl_meta VALUES ('sessions_schema', ?)", (str(SCHEMA_VERSION),)
            )

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

    def load(self, session_id: str) -> Optional[Tuple[object, object, object, List[Any]]]:
        with self._use("load", "DEFERRED") as con:
            head = con.execute(
                "SELECT CAST(revision AS BLOB), CAST(owner AS BLOB), CAST(incarnation AS BLOB)"
                " FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            if head is None:
                return None
            rows = con.execute(
                "SELECT CAST(body AS BLOB) FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)
            ).fetchall()
        return head[0], head[1], head[2], [r[0] for r in rows]

    def infos(self, owner: Optional[str], session_id: Optional[str] = None) -> List[SessionInfo]:
        sql = (
            "SELECT CAST(s.id AS BLOB), CAST(s.owner AS BLOB), CAST(s.revision AS BLOB),"
            " CASE WHEN typeof(s.updated) IN ('integer', 'real') THEN s.updated END,"
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
        found = (list_entry(r[0], r[1], r[4], r[2], r[3]) for r in rows)
        return [info for info in found if info is not None]

    # -- the lease -----------------------------------------------------------------------

    def acquire(
        self, session_id: str, owner: Optional[str], token: str, now: float, until: float, stale: Callable[[str], bool]
    ) -> bool:
        with self._use("acquire") as con:
            head = con.execute("SELECT CAST(owner AS BLOB) FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if head is not None and stored_owner(session_id, head[0]) != owner:
                raise KeyError(f"unknown session {session_id[:80]!r}")
            held = con.execute("SELECT until, token FROM leases WHERE session_id = ?", (session_id,)).fetchone()
            # Checked inside the write transaction: the stale token is replaced only if it still holds.
            if held is not None and float(held[0]) > now and held[1] != token and not stale(held[1]):
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
    ) -> Optional[Tuple[int, object]]:
        with self._use("write") as con:
            held = con.execute("SELECT token FROM leases WHERE session_id = ?", (session_id,)).fetchone()
            if held is None or held[0] != token:
                return None
            revision, incarnation = _bump(con, session_id, owner, now)
            if replace:
                old = [bytes(r[0]) for r in con.execute(
                    "SELECT CAST(body AS BLOB) FROM messages WHERE session_id = ? ORDER BY seq", (session_id,)
                )]
                keep = _common_prefix(old, [r.encode("utf-8") for r in rows])
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
        return revision, incarnation

    def delete(self, session_id: str, now: float, stale: Callable[[str], bool]) -> Optional[bool]:
        with self._use("delete") as con:
            held = con.execute("SELECT until, token FROM leases WHERE session_id = ?", (session_id,)).fetchone()
            if held is not None and float(held[0]) > now and not stale(held[1]):
                return None
            con.execute("DELETE FROM leases WHERE session_id = ?", (session_id,))
            con.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            con.execute("DELETE FROM removed WHERE session_id = ?", (session_id,))
            return con.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 1

    def removed(self, session_id: str) -> List[Tuple[int, str]]:
        """The audit trail: (revision that removed it, row) in order."""
        with self._use("audit", "DEFERRED") as con:
            rows = con.execute(
                "SELECT revision, CAST(body AS BLOB) FROM removed WHERE session_id = ? ORDER BY revision, seq",
                (session_id,),
            ).fetchall()
        try:
            return [(int(r[0]), bytes(r[1]).decode("utf-8")) for r in rows]
        except (TypeError, ValueError):  # UnicodeDecodeError is a ValueError
            raise corrupt(session_id, "audit row") from None

    def close(self) -> None:
        with self._lock:
            con, self._con = self._con, None
        if con is not None:
            self._finalizer.detach()
            con.close()


def _bump(con: sqlite3.Connection, session_id: str, owner: Optional[str], now: float) -> Tuple[int, object]:
    """The session's next revision and its incarnation, written to its row (made with a fresh incarnation).

    Raises:
        SessionCorrupt: the stored revision cannot be read.
    """
    head = con.execute(
        "SELECT CAST(revision AS BLOB), CAST(incarnation AS BLOB) FROM sessions WHERE id = ?", (session_id,)
    ).fetchone()
    if head is None:
        incarnation = uuid.uuid4().hex
        con.execute(
            "INSERT INTO sessions (id, owner, revision, created, updated, incarnation) VALUES (?, ?, 1, ?, ?, ?)",
            (session_id, owner, now, now, incarnation),
        )
        return 1, incarnation
    revision = stored_revision(session_id, head[0]) + 1
    con.execute("UPDATE sessions SET revision = ?, updated = ? WHERE id = ?", (revision, now, session_id))
    return revision, head[1]


def _common_prefix(old: List[bytes], new: List[bytes]) -> int:
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
            raise ConfigError(f"SQLiteSessionStore.path must be a file path, got {shown(path)}")
        wait = sqlite_seconds(timeout, "SQLiteSessionStore.timeout")
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"SQLiteSessionStore path {str(self.path)!r} is a directory, not a database file")
        if not self.path.parent.is_dir():
            raise ConfigError(
                f"SQLiteSessionStore path {str(self.path)!r}: directory {str(self.path.parent)!r} does not exist"
            )
        backend = _SQLiteBackend(self.path, wait)
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
