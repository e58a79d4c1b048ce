"""``RedisSessionStore``: conversations in Redis, shared by every process and worker.

redis-py is imported when a store is made, so the core never needs it.
Each session's keys are named by the SHA-256 of its id (any id, of any
length or alphabet, makes a safe, fixed-size key); the id itself is kept in
the session's hash. Keys, under ``prefix`` (``loopctl:session``):

- ``{prefix}:{h}:meta``: hash of id, owner, revision, created, updated,
  incarnation (made with the session; absent in sessions stored before);
- ``{prefix}:{h}:msgs``: list, one JSON row per message;
- ``{prefix}:{h}:lease``: hash of token and expiry (a live writer);
- ``{prefix}:{h}:removed``: list of rows a compaction replaced (audit);
- ``{prefix}:all`` and ``{prefix}:owner:{sha(owner)}``: sorted sets of
  session hashes by last write, for ``list()``.

Each step that checks the lease and writes is one Lua script, so it is
atomic; a replace keeps the rows it shares with the new conversation and
moves only the others to the audit list. The lease's expiry is the store's clock reading (as in the SQLite
store); the lease key also gets a Redis TTL of twice the lease, so an
abandoned one is cleaned up. An acquire that finds a live lease asks
whether its holder is gone (``holders``) and, if so, runs again naming that
token: the script takes the lease only if that token still holds it. A key
of the wrong Redis type, or a revision that is not a number, is that
session's ``SessionCorrupt``; ``list()`` leaves such a session out. Redis
Cluster is not supported.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import Any, Callable, List, Optional, Tuple

from loopctl.checks import shown
from loopctl.errors import ConfigError, LoopError, SessionCorrupt
from loopctl.sessions.base import (
    DEFAULT_LEASE_S,
    SessionBackend,
    SessionInfo,
    SessionStore,
    check_lease,
)
from loopctl.sessions.stored import corrupt, list_entry
from loopctl.timeouts import required_seconds

log = logging.getLogger("loopctl")

_OWNER_MISMATCH = -2
_BAD_REVISION = -3

# KEYS: lease, meta.  ARGV: token, now, until, ttl_ms, owner ("" = none), stale token ("" = none)
# Returns {1} (taken), {-2} (another owner's), or {0, the live holder's token}.
_ACQUIRE = """
local exists = redis.call('EXISTS', KEYS[2])
if exists == 1 and (redis.call('HGET', KEYS[2], 'owner') or '') ~= ARGV[5] then return {-2} end
local held = redis.call('HMGET', KEYS[1], 'token', 'until')
if held[1] and held[1] ~= ARGV[1] and held[1] ~= ARGV[6] and tonumber(held[2]) > tonumber(ARGV[2]) then
  return {0, held[1]}
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'until', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1}
"""

# KEYS: lease.  ARGV: token, until, ttl_ms
_RENEW = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'until', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: lease.  ARGV: token
_RELEASE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

# KEYS: lease, meta, msgs, removed, all, owner-set.
# ARGV: token, now, replace, owner, id, hash, new incarnation, rows...
# Returns {-1} (lease not held), {-3} (stored revision not a number), or {revision, incarnation}.
_WRITE = """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {-1} end
local current = redis.call('HGET', KEYS[2], 'revision')
if current and not string.match(current, '^%d+$') then return {-3} end
local revision = redis.call('HINCRBY', KEYS[2], 'revision', 1)
if revision == 1 then
  redis.call('HSET', KEYS[2], 'id', ARGV[5], 'owner', ARGV[4], 'created', ARGV[2], 'incarnation', ARGV[7])
end
redis.call('HSET', KEYS[2], 'updated', ARGV[2])
local first = 8
if ARGV[3] == '1' then
  local old = redis.call('LRANGE', KEYS[3], 0, -1)
  local keep = 0
  while keep < #old and first + keep <= #ARGV and old[keep + 1] == ARGV[first + keep] do keep = keep + 1 end
  for i = keep + 1, #old do redis.call('RPUSH', KEYS[4], revision .. ':' .. old[i]) end
  if keep == 0 then redis.call('DEL', KEYS[3]) else redis.call('LTRIM', KEYS[3], 0, keep - 1) end
  first = first + keep
end
for i = first, #ARGV do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[6])
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[6], ARGV[2], ARGV[6]) end
return {revision, redis.call('HGET', KEYS[2], 'incarnation')}
"""

# KEYS: lease, meta, msgs, removed, all, owner-set.  ARGV: now, hash, stale token ("" = none)
# Returns {1} or {0} (existed or not), or {-1, the live holder's token}.
_DELETE = """
local held = redis.call('HMGET', KEYS[1], 'token', 'until')
if held[1] and held[1] ~= ARGV[3] and tonumber(held[2]) > tonumber(ARGV[1]) then return {-1, held[1]} end
local existed = redis.call('EXISTS', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[5], ARGV[2])
redis.call('ZREM', KEYS[6], ARGV[2])
return {existed}
"""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _text(value: object) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _wrong_type(exc: BaseException) -> bool:
    """Whether Redis refused a command because a key holds another type (the data is bad, not the link)."""
    return any(c.__name__ == "ResponseError" for c in type(exc).__mro__) and "WRONGTYPE" in str(exc)


class _RedisBackend(SessionBackend):
    """The storage operations as Lua scripts and transactions (see the module's rules)."""

    def __init__(self, client: Any, prefix: str, lease_s: float) -> None:
        self._r = client
        self._prefix = prefix
        self._ttl_ms = max(1000, int(lease_s * 2000))
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._write = client.register_script(_WRITE)
        self._delete = client.register_script(_DELETE)

    def _keys(self, session_id: str, owner: Optional[str] = None) -> Tuple[str, List[str]]:
        h = _digest(session_id)
        base = f"{self._prefix}:{h}"
        owner_key = f"{self._prefix}:owner:{_digest(owner or '')}"
        return h, [f"{base}:lease", f"{base}:meta", f"{base}:msgs", f"{base}:removed", f"{self._prefix}:all", owner_key]

    def _call(self, what: str, fn: Callable[[], object], session_id: Optional[str] = None) -> Any:
        try:
            return fn()
        except LoopError:
            raise
        except Exception as exc:  # redis' errors (connection, timeout, script): one boundary
            if session_id is not None and _wrong_type(exc):
                raise corrupt(session_id, "key (of the wrong Redis type)") from None
            raise LoopError(f"session store: {what} failed: {type(exc).__name__}: {exc}") from exc

    def load(self, session_id: str) -> Optional[Tuple[object, object, object, List[Any]]]:
        _, keys = self._keys(session_id)

        def read() -> object:
            pipe = self._r.pipeline(transaction=True)
            pipe.hmget(keys[1], "revision", "owner", "incarnation", "id")
            pipe.lrange(keys[2], 0, -1)
            return pipe.execute()

        (revision, owner, incarnation, sid), rows = self._call("load", read, session_id)
        if revision is None and owner is None and incarnation is None and sid is None:
            return None
        return revision, owner if owner is not None else "", incarnation, list(rows)

    def acquire(
        self, session_id: str, owner: Optional[str], token: str, now: float, until: float, stale: Callable[[str], bool]
    ) -> bool:
        _, keys = self._keys(session_id)
        args = [token, repr(now), repr(until), self._ttl_ms, owner or "", ""]
        got = self._call("acquire", lambda: self._acquire(keys=keys[:2], args=args), session_id)
        if int(got[0]) == 0 and stale(_text(got[1])):
            args[5] = _text(got[1])  # again, taking the lease only if that dead holder's token still holds it
            got = self._call("acquire", lambda: self._acquire(keys=keys[:2], args=args), session_id)
        if int(got[0]) == _OWNER_MISMATCH:
            raise KeyError(f"unknown session {session_id[:80]!r}")
        return int(got[0]) == 1

    def renew(self, session_id: str, token: str, until: float) -> bool:
        _, keys = self._keys(session_id)
        got = self._call("renew", lambda: self._renew(keys=keys[:1], args=[token, repr(until), self._ttl_ms]))
        return int(got) == 1

    def release(self, session_id: str, token: str) -> None:
        _, keys = self._keys(session_id)
        self._call("release", lambda: self._release(keys=keys[:1], args=[token]))

    def write(
        self, session_id: str, owner: Optional[str], token: str, now: float, rows: List[str], replace: bool
    ) -> Optional[Tuple[int, object]]:
        h, keys = self._keys(session_id, owner)
        args = [token, repr(now), "1" if replace else "0", owner or "", session_id, h, uuid.uuid4().hex, *rows]
        got = self._call("write", lambda: self._write(keys=keys, args=args), session_id)
        if int(got[0]) == _BAD_REVISION:
            raise corrupt(session_id, "revision")
        return None if int(got[0]) < 0 else (int(got[0]), got[1] if len(got) > 1 else None)

    def infos(self, owner: Optional[str], session_id: Optional[str] = None) -> List[SessionInfo]:
        if session_id is not None:
            hashes = [_digest(session_id)]
        else:
            index = f"{self._prefix}:all" if owner is None else f"{self._prefix}:owner:{_digest(owner)}"
            hashes = [_text(h) for h in self._call("list", lambda: self._r.zrevrange(index, 0, -1))]

        def read() -> object:
            pipe = self._r.pipeline(transaction=False)
            for h in hashes:
                pipe.hmget(f"{self._prefix}:{h}:meta", "id", "owner", "revision", "updated")
                pipe.llen(f"{self._prefix}:{h}:msgs")
            # A key of the wrong type fails its own entry only (an error in the list), not the listing.
            return pipe.execute(raise_on_error=False)

        got = self._call("list", read) if hashes else []
        out = []
        for i in range(0, len(got), 2):
            meta, count = got[i], got[i + 1]
            if isinstance(meta, Exception):
                log.warning("session store: list() leaves out the session under hash %s: its record cannot be read",
                            hashes[i // 2][:16])
                continue
            sid, own, rev, updated = meta
            if sid is None:
                continue  # deleted between the index read and this one
            if owner is not None and (_text(own) if own is not None else "") != owner:
                continue
            info = list_entry(sid, own if own is not None else "", count, rev, updated)  # a count error: unreadable
            if info is not None:
                out.append(info)
        return out

    def delete(self, session_id: str, now: float, stale: Callable[[str], bool]) -> Optional[bool]:
        h, keys = self._keys(session_id)
        _, meta = keys[0], keys[1]
        try:
            owner = self._call("delete", lambda: self._r.hget(meta, "owner"), session_id)
        except SessionCorrupt:
            owner = None  # a meta key of the wrong type: deleted all the same (it lists under no owner)
        keys[5] = f"{self._prefix}:owner:{_digest(_text(owner) if owner is not None else '')}"
        args = [repr(now), h, ""]
        got = self._call("delete", lambda: self._delete(keys=keys, args=args), session_id)
        if int(got[0]) < 0 and stale(_text(got[1])):
            args[2] = _text(got[1])  # again, ignoring the lease only if that dead holder's token still holds it
            got = self._call("delete", lambda: self._delete(keys=keys, args=args), session_id)
        return None if int(got[0]) < 0 else int(got[0]) == 1

    def removed(self, session_id: str) -> List[Tuple[int, str]]:
        _, keys = self._keys(session_id)
        out = []
        for item in self._call("audit", lambda: self._r.lrange(keys[3], 0, -1)):
            revision, _, row = _text(item).partition(":")
            out.append((int(revision), row))
        return out

    def close(self) -> None:
        self._r.close()


class RedisSessionStore(SessionStore):
    """Conversations in Redis: any process (any Celery worker) continues any conversation.

    Args:
        url: the Redis URL (``redis://host:port/db``).
        prefix: the key prefix.
        lease_s: seconds a writer's lease lasts without renewal (60).
        clock: wall-clock seconds, shared by every process (injectable for tests).
        socket_timeout: seconds any Redis call may take before it fails.

    Raises:
        ConfigError: redis-py is missing, or a bad argument.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "loopctl:session",
        lease_s: float = DEFAULT_LEASE_S,
        clock: Callable[[], float] = time.time,
        socket_timeout: float = 10.0,
    ) -> None:
        try:
            import redis
        except ImportError as exc:
            raise ConfigError("RedisSessionStore needs redis-py: pip install 'loopctl[celery]'") from exc
        if not isinstance(url, str) or not url:
            raise ConfigError(f"RedisSessionStore url must be a non-empty str, got {type(url).__name__}")
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(f"RedisSessionStore prefix must be a non-empty str, got {shown(prefix)}")
        lease = check_lease(lease_s, clock, type(self).__name__)
        wait = required_seconds(socket_timeout, "RedisSessionStore.socket_timeout")
        try:
            client = redis.Redis.from_url(url, socket_timeout=wait, socket_connect_timeout=wait)
        except ValueError as exc:
            raise ConfigError(f"RedisSessionStore url is not a Redis URL ({exc.__class__.__name__})") from None
        backend = _RedisBackend(client, prefix, lease)
        super().__init__(backend, lease_s, clock)
        self._redis = backend

    def removed(self, session_id: str) -> List[Tuple[int, str]]:
        """What compactions removed from the session: (revision, stored JSON row), oldest first."""
        return self._redis.removed(session_id)

    def __repr__(self) -> str:
        return "<RedisSessionStore>"  # the URL may carry a password


__all__ = ["RedisSessionStore"]
