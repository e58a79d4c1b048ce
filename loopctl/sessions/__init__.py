"""Conversations that outlive the process: session stores.

``SQLiteSessionStore(path)`` (the embedded default, stdlib ``sqlite3``) and
``RedisSessionStore(url)`` (redis-py, the ``[celery]`` extra) keep
conversations by id; ``store.session(id)`` names one, and
``BareLoop(...).with_session(session)`` makes a loop continue it: the
stored conversation is loaded at the run's start and each completed run's
new messages are written atomically at its end. One run writes a session
at a time, in any thread or process (``SessionBusy``); a row that cannot be
read raises ``SessionCorrupt`` naming the session (``list()`` leaves it
out). A lease whose holder process on this host is gone is taken over at
once, and a process gives its leases back as it exits.
"""

from __future__ import annotations

from loopctl.errors import SessionBusy, SessionCorrupt
from loopctl.sessions.base import (
    DEFAULT_LEASE_S,
    MAX_ID_CHARS,
    Session,
    SessionInfo,
    SessionLease,
    SessionSnapshot,
    SessionStore,
)
from loopctl.sessions.redis_store import RedisSessionStore
from loopctl.sessions.sqlite import SQLiteSessionStore

__all__ = [
    "DEFAULT_LEASE_S",
    "MAX_ID_CHARS",
    "RedisSessionStore",
    "SQLiteSessionStore",
    "Session",
    "SessionBusy",
    "SessionCorrupt",
    "SessionInfo",
    "SessionLease",
    "SessionSnapshot",
    "SessionStore",
]
