"""The SQLite side of the memory store: its schema and the small helpers around it.

The table layout (``memories`` plus an optional FTS5 index kept in step by
triggers), the write transaction (``BEGIN IMMEDIATE``, committed or rolled
back as a whole), the splitter that runs a schema script statement by
statement, and the probe for FTS5 support. The store's locking and search
rules live in ``sqlite_store``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Optional

from loopctl.context.memory import MemoryEntry

SCHEMA = """
CREATE TABLE IF NOT EXISTS loopctl_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    tags TEXT NOT NULL,
    category TEXT NOT NULL,
    relevance REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS memories_created ON memories(created_at);
CREATE INDEX IF NOT EXISTS memories_identity ON memories(category, text);
"""

FTS = """
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
    text, tags, content='memories', content_rowid='rowid'
);
CREATE TRIGGER IF NOT EXISTS memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, text, tags) VALUES (new.rowid, new.text, new.tags);
END;
CREATE TRIGGER IF NOT EXISTS memories_ad AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts(memories_fts, rowid, text, tags) VALUES ('delete', old.rowid, old.text, old.tags);
END;
CREATE TRIGGER IF NOT EXISTS memories_au AFTER UPDATE ON memories BEGIN
    INSERT INTO memories_fts(memories_fts, rowid, text, tags) VALUES ('delete', old.rowid, old.text, old.tags);
    INSERT INTO memories_fts(rowid, text, tags) VALUES (new.rowid, new.text, new.tags);
END;
"""

COLUMNS = "id, text, tags, category, relevance, created_at"


def row_entry(row: tuple[Any, ...]) -> MemoryEntry:
    return MemoryEntry(row[1], tuple(json.loads(row[2])), row[3], float(row[4]), row[0], float(row[5]))


def fts5_available() -> bool:
    """True when this Python's SQLite build has FTS5."""
    try:
        con = sqlite3.connect(":memory:")
        try:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(a)")
        finally:
            con.close()
    except sqlite3.Error:
        return False
    return True


class WriteTx:
    """One write transaction: ``BEGIN IMMEDIATE`` on entry, commit or roll back on exit."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con

    def __enter__(self) -> sqlite3.Connection:
        self.con.execute("BEGIN IMMEDIATE")
        return self.con

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if et is None:
            self.con.execute("COMMIT")
        else:
            try:
                self.con.execute("ROLLBACK")
            except sqlite3.Error:
                pass


def close_all(connections: list[Optional[sqlite3.Connection]]) -> None:
    for con in connections:
        if con is not None:
            con.close()


def split_script(script: str, triggers: bool = False) -> list[str]:
    """Statements of a script (trigger bodies kept whole)."""
    if not triggers:
        return [s.strip() for s in script.split(";") if s.strip()]
    out: list[str] = []
    buf = ""
    for piece in script.split(";"):
        buf += piece + ";"
        if "TRIGGER" in buf.upper() and "END;" not in buf.upper().replace(" ", "").replace("\n", ""):
            continue
        if buf.strip(" \n;"):
            out.append(buf.strip())
        buf = ""
    return out



__all__ = ["SCHEMA", "FTS", "COLUMNS", "WriteTx", "close_all", "fts5_available", "row_entry", "split_script"]
