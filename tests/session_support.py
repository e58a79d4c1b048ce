"""Both session stores for the session tests: a SQLite file, and a real redis-server.

``make_store(kind, where, **kw)`` opens a store of ``kind`` ("sqlite" or
"redis") at ``where`` (a file path, or a Redis URL); two stores opened at
the same place see the same sessions, as two processes would. Redis tests
skip only when redis-server (or redis-py) is absent.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from loopctl.sessions import RedisSessionStore, SQLiteSessionStore
from loopctl.sessions.base import SessionStore

KINDS = ("sqlite", "redis")


def make_store(kind: str, where: str, **kw: Any) -> SessionStore:
    if kind == "sqlite":
        return SQLiteSessionStore(where, **kw)
    return RedisSessionStore(where, **kw)


def corrupt_row(kind: str, where: str, session_id: str, position: int, prefix: str = "loopctl:session") -> None:
    """Overwrite one stored message of the session with bytes that are not a message."""
    if kind == "sqlite":
        con = sqlite3.connect(where)
        with con:
            con.execute(
                "UPDATE messages SET body = ? WHERE session_id = ? AND seq = ?", ("{not json", session_id, position)
            )
        con.close()
        return
    import hashlib

    import redis

    r = redis.Redis.from_url(where)
    h = hashlib.sha256(session_id.encode("utf-8")).hexdigest()
    r.lset(f"{prefix}:{h}:msgs", position, b"{not json")
    r.close()


__all__ = ["KINDS", "corrupt_row", "make_store"]
