"""A durable memory store on stdlib ``sqlite3``.

``SqliteMemoryStore(path)`` keeps entries in one SQLite file. Rules it keeps:

- Durable: WAL journal, ``synchronous=FULL``, one transaction per write; an
  entry whose ``store`` returned survives the process being killed.
- Concurrent: any thread may call any method. Writes go through one
  connection guarded by a lock; searches and other reads go through a
  second, read-only one with its own lock, so a search never holds up a
  ``store()`` (WAL lets a reader and a writer run at once). Several stores
  (several loops, threads or processes) on one file coordinate through
  SQLite's own locking with a busy timeout.
- Bounded searches: the query is cut first (``memory_query``: 2,000
  characters, 64 distinct words), so a huge one is no slower than a short one.
- Search: FTS5 when the SQLite build has it (candidates by bm25), else a
  scan; either way candidates are re-scored exactly like ``InMemoryStore``
  (case-insensitive word overlap plus tag match), so both stores agree.
- Bounded and deduplicated like ``InMemoryStore``: at most ``capacity``
  rows (the least recently stored are deleted past it, in the writing
  transaction), and an entry identical to a stored one (text, tags,
  category, relevance) refreshes that row instead of adding one. Rowids
  grow with each write, so rowid order is store order. ``consolidate``
  also merges copies a file written before deduplication may hold.
- A path that cannot be opened as a database raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

from loopctl.checks import flag, shown
from loopctl.context.memory import (
    DEFAULT_CAPACITY,
    PRUNE_BELOW,
    MemoryEntry,
    check_capacity,
    check_limit,
    memory_query,
    rank,
    words,
)
from loopctl.context.sqlite_schema import (
    COLUMNS,
    FTS,
    SCHEMA,
    WriteTx,
    close_all,
    fts5_available,
    row_entry,
    split_script,
)
from loopctl.errors import ConfigError, LoopError
from loopctl.timeouts import sqlite_seconds

log = logging.getLogger("loopctl")

SCHEMA_VERSION = 1
_T = TypeVar("_T")

class SqliteMemoryStore:
    """Memory in a SQLite file; safe from any thread, durable across restarts.

    Args:
        path: the database file (created with its tables when missing; its
            directory must exist).
        use_fts: False forces the scan search even when FTS5 exists.
        timeout: seconds to wait for another writer's lock.
        capacity: most entries kept in the file (an int >= 1); past it the
            least recently stored are deleted.

    Raises:
        ConfigError: ``path`` is not a usable database, or a bad
            ``capacity`` (the message names it).
    """

    def __init__(
        self,
        path: Union[str, os.PathLike[str]],
        *,
        use_fts: bool = True,
        timeout: float = 30.0,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self.capacity = check_capacity(capacity, type(self).__name__)
        if not isinstance(path, (str, os.PathLike)) or not str(path) or "\x00" in str(path):
            raise ConfigError(f"SqliteMemoryStore.path must be a file path, got {shown(path)}")
        if str(path) == ":memory:":
            raise ConfigError("SqliteMemoryStore path ':memory:' is not supported; use InMemoryStore")
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"SqliteMemoryStore path {str(self.path)!r} is a directory, not a database file")
        if not self.path.parent.is_dir():
            raise ConfigError(
                f"SqliteMemoryStore path {str(self.path)!r}: directory {str(self.path.parent)!r} does not exist"
            )
        self._lock = threading.RLock()
        self._timeout = sqlite_seconds(timeout, "SqliteMemoryStore.timeout")
        flag(use_fts, "SqliteMemoryStore.use_fts")
        try:
            con = sqlite3.connect(str(self.path), timeout=self._timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open memory database {str(self.path)!r}: {exc}") from exc
        self._con: Optional[sqlite3.Connection] = con
        self._reader: Optional[sqlite3.Connection] = None
        self._read_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, close_all, [con])
        try:
            self._fts = self._setup(con, use_fts)
            self._reader = self._open_reader()
        except sqlite3.Error as exc:
            self.close()
            raise ConfigError(f"cannot use {str(self.path)!r} as a memory database: {exc}") from exc
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, close_all, [con, self._reader])

    # -- setup -------------------------------------------------------------------

    def _setup(self, con: sqlite3.Connection, use_fts: bool) -> bool:
        con.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        mode = self._retry_busy(lambda: con.execute("PRAGMA journal_mode = WAL").fetchone())
        if mode is None or str(mode[0]).lower() != "wal":
            log.warning("memory database %s is not in WAL mode (%s)", self.path, mode and mode[0])
        con.execute("PRAGMA synchronous = FULL")
        self._retry_busy(lambda: self._create_schema(con))
        fts = False
        if use_fts:
            fts = self._setup_fts(con)
        return fts

    def _open_reader(self) -> sqlite3.Connection:
        """The search connection: read-only (``query_only``), same busy timeout."""
        reader = sqlite3.connect(
            str(self.path), timeout=self._timeout, isolation_level=None, check_same_thread=False
        )
        try:
            reader.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
            reader.execute("PRAGMA query_only = ON")
        except sqlite3.Error:
            reader.close()
            raise
        return reader

    def _create_schema(self, con: sqlite3.Connection) -> None:
        with self._write(con):
            for stmt in split_script(SCHEMA):
                con.execute(stmt)
            row = con.execute("SELECT value FROM loopctl_meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                con.execute("INSERT INTO loopctl_meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {row[0]} is newer than this loopctl ({SCHEMA_VERSION})")

    def _retry_busy(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn``, retrying while another connection holds the lock.

        Switching the journal mode can fail with "database is locked" at once,
        without SQLite's busy handler, while another connection sets up the
        same new file; that is retried with a short backoff up to ``timeout``.
        """
        deadline = time.monotonic() + self._timeout
        delay = 0.005
        pause = threading.Event()
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                text = str(exc).lower()
                if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                    raise
            pause.wait(delay)
            delay = min(delay * 2, 0.1)

    def _setup_fts(self, con: sqlite3.Connection) -> bool:
        def create() -> None:
            with self._write(con):
                existed = con.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'memories_fts'"
                ).fetchone() is not None
                for stmt in split_script(FTS, triggers=True):
                    con.execute(stmt)
                if not existed:  # index rows written before the index existed
                    con.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
            con.execute("SELECT rowid FROM memories_fts LIMIT 0")

        try:
            self._retry_busy(create)
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc).lower() or "busy" in str(exc).lower():
                raise
            log.info("FTS5 unavailable for %s (%s); using scan search", self.path, exc)
            return False
        return True

    def _write(self, con: sqlite3.Connection) -> WriteTx:
        return WriteTx(con)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The read connection, held under the read lock (never the write lock)."""
        with self._read_lock:
            con = self._reader
            if con is None:
                raise LoopError(f"memory database {str(self.path)!r} is closed")
            yield con

    def _conn(self) -> sqlite3.Connection:
        con = self._con
        if con is None:
            raise LoopError(f"memory database {str(self.path)!r} is closed")
        return con

    # -- the Memory protocol -------------------------------------------------------

    @property
    def uses_fts(self) -> bool:
        """True when searches go through FTS5."""
        return self._fts

    def store(self, entry: MemoryEntry) -> None:
        """Remember ``entry`` durably (an entry with the same id is replaced)."""
        if not isinstance(entry, MemoryEntry):
            raise TypeError(f"store() takes a MemoryEntry, got {type(entry).__name__}")
        self.store_many((entry,))

    def store_many(self, entries: Iterable[MemoryEntry]) -> None:
        """Remember several entries in one transaction (deduplicated, within ``capacity``)."""
        rows = [
            (e.id, e.text, json.dumps(list(e.tags)), e.category, float(e.relevance), float(e.created_at))
            for e in entries
        ]
        if not rows:
            return
        with self._lock:
            con = self._conn()
            try:
                with self._write(con):
                    for row in rows:
                        self._store_row(con, row)
                    self._evict(con)
            except sqlite3.Error as exc:
                raise LoopError(f"memory database {str(self.path)!r}: store failed: {exc}") from exc

    @staticmethod
    def _store_row(con: sqlite3.Connection, row: tuple[Any, ...]) -> None:
        """Write one row as the most recently stored; an identical row is refreshed, keeping its id."""
        con.execute("DELETE FROM memories WHERE id = ?", (row[0],))
        same = con.execute(
            "SELECT id, created_at FROM memories "
            "WHERE category = ? AND text = ? AND tags = ? AND relevance = ? LIMIT 1",
            (row[3], row[1], row[2], row[4]),
        ).fetchone()
        if same is not None:
            con.execute("DELETE FROM memories WHERE id = ?", (same[0],))
            row = (same[0], *row[1:5], max(float(same[1]), row[5]))
        con.execute(f"INSERT INTO memories ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)", row)

    def _evict(self, con: sqlite3.Connection) -> None:
        """Delete the least recently stored rows past ``capacity`` (inside the write)."""
        count = int(con.execute("SELECT COUNT(*) FROM memories").fetchone()[0])
        if count > self.capacity:
            con.execute(
                "DELETE FROM memories WHERE rowid IN (SELECT rowid FROM memories ORDER BY rowid LIMIT ?)",
                (count - self.capacity,),
            )

    def retrieve(self, query: str, limit: int = 5) -> list[MemoryEntry]:
        """Up to ``limit`` entries sharing a word (or a tag) with ``query``, best first.

        The query is cut by ``memory_query``; the search runs on the read
        connection, so it never holds up a concurrent ``store()``.
        """
        check_limit(limit)
        query = memory_query(query)
        qw = words(query)
        if limit == 0 or not qw:
            return []
        with self._reading() as con:
            try:
                if self._fts:
                    match = " OR ".join('"' + w.replace('"', '""') + '"' for w in sorted(qw))
                    rows = con.execute(
                        "SELECT m.id, m.text, m.tags, m.category, m.relevance, m.created_at "
                        "FROM memories_fts f JOIN memories m ON m.rowid = f.rowid "
                        "WHERE memories_fts MATCH ? ORDER BY bm25(memories_fts) LIMIT ?",
                        (match, max(100, limit * 20)),
                    ).fetchall()
                    candidates: Iterable[MemoryEntry] = [row_entry(r) for r in rows]
                else:
                    candidates = list(self._scan(con, qw))
            except sqlite3.Error as exc:
                raise LoopError(f"memory database {str(self.path)!r}: retrieve failed: {exc}") from exc
        return rank(candidates, query, limit)

    def _scan(self, con: sqlite3.Connection, qw: frozenset[str]) -> Iterator[MemoryEntry]:
        if all(w.isascii() for w in qw):
            cond = " OR ".join(["text LIKE ? ESCAPE '\\' OR tags LIKE ? ESCAPE '\\'"] * len(qw))
            args: list[str] = []
            for w in sorted(qw):
                pat = "%" + w.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                args += [pat, pat]
            cur = con.execute(f"SELECT {COLUMNS} FROM memories WHERE {cond}", args)
        else:
            cur = con.execute(f"SELECT {COLUMNS} FROM memories")
        for row in cur:
            yield row_entry(row)

    def consolidate(self) -> None:
        """Drop entries whose relevance is below 0.05, merge copies, keep ``capacity``; checkpoint."""
        with self._lock:
            con = self._conn()
            try:
                with self._write(con):
                    con.execute("DELETE FROM memories WHERE relevance < ?", (PRUNE_BELOW,))
                    con.execute(
                        "DELETE FROM memories WHERE rowid NOT IN (SELECT MAX(rowid) FROM memories "
                        "GROUP BY category, text, tags, relevance)"
                    )
                    self._evict(con)
                con.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as exc:
                raise LoopError(f"memory database {str(self.path)!r}: consolidate failed: {exc}") from exc

    # -- extras --------------------------------------------------------------------

    def get(self, entry_id: str) -> Optional[MemoryEntry]:
        """One entry by id, or None."""
        with self._reading() as con:
            row = con.execute(f"SELECT {COLUMNS} FROM memories WHERE id = ?", (entry_id,)).fetchone()
        return None if row is None else row_entry(row)

    def entries(self) -> list[MemoryEntry]:
        """Every entry, oldest first."""
        with self._reading() as con:
            rows = con.execute(f"SELECT {COLUMNS} FROM memories ORDER BY created_at, rowid").fetchall()
        return [row_entry(r) for r in rows]

    def delete(self, entry_id: str) -> bool:
        """Forget one entry; True when it existed."""
        with self._lock:
            con = self._conn()
            with self._write(con):
                n = con.execute("DELETE FROM memories WHERE id = ?", (entry_id,)).rowcount
        return n > 0

    def __len__(self) -> int:
        with self._reading() as con:
            return int(con.execute("SELECT COUNT(*) FROM memories").fetchone()[0])

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise ``LoopError``."""
        with self._lock, self._read_lock:
            self._con = None
            self._reader = None
            self._finalizer()

    def __enter__(self) -> SqliteMemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SqliteMemoryStore path={str(self.path)!r} fts={self._fts}>"


__all__ = ["SqliteMemoryStore", "fts5_available"]
