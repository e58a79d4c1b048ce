"""The Redis side of ``CeleryRunRegistry``: key layout, connections, timeouts, errors.

Every state change of a run is ONE Lua script (``scripts``), so each is atomic against
every other: starting (conversation lock + run hash), claiming (queued ->
running, with the cancel flag, stored steers and history read in the same
step), appending events, heartbeating, the run's ending point (a stored
cancel ends it cancelled, else it is marked ``ending`` and cancels are
refused from then on, as for an ended run), finishing (run_end event, terminal
state, leftovers, history commit, lock release, done signal), cancel and
steer (check "still live" and record in one step), and reaping a run whose
heartbeat lapsed ("worker lost"). The worker is fenced by a token: once a
run is terminal or its heartbeat has lapsed, the worker's writes are
refused. Keys (``P`` is the prefix, standalone Redis; scripts derive keys
from the prefix, so Redis Cluster is not supported):

- ``P:run:ID`` hash (state, conv, input, config, factory, token, worker,
  times, progress, output, error, the final ``Run`` as JSON, ``seq``;
  ``cancel``/``cancel_reason`` once cancelled, ``ending`` once past its
  ending point)
- ``P:run:ID:ev`` stream of events, entry id ``0-<seq>``, field ``d`` (JSON)
- ``P:run:ID:steer`` list of accepted steers (message JSON; ``{"to", "message"}``
  for a sub-agent, see ``steers``), in order
- ``P:run:ID:left`` list of the run's leftovers (message JSON)
- ``P:run:ID:done`` list that gets one item when the run is terminal
- ``P:run:ID:hb`` heartbeat (expires after the TTL); ``P:run:ID:ctl`` channel
- ``P:conv:KEY:lock`` the conversation's run id; ``P:conv:KEY:hist`` history
- ``P:runs`` sorted set of run ids by creation time; ``P:active`` set of the
  runs not ended yet (the sweepers' work list)
- ``P:outbox`` sorted set of durable runs put back on the queue whose task
  message is (re)sent by a worker's sweeper, scored by when it is due
- ``P:worker:NAME`` a worker process's liveness (expires after the TTL)

Durable runs (``resume="on_worker_loss"``) also keep their last checkpoint
in the run hash (``ckpt``), written in the same script as the events before
it, so the stream and the checkpoint never disagree.

Every client call has socket timeouts and no hidden retries with backoff, so
an unreachable Redis is a ``RegistryUnavailable`` within the timeout, never
a hang. Blocking reads wait in slices no longer than ``block_slice``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "loopctl.contrib.celery needs the [celery] extra: pip install 'loopctl[celery]'"
    ) from exc

from loopctl.errors import LoopError
from loopctl.text import json_safe, redact, register_secrets

from . import scripts as lua
from .runs import Claim, QueuedRun

TERMINAL = ("completed", "cancelled", "failed")
#: Seconds before a queued run's task message is sent again, unless a live
#: worker holds it or the run was claimed (a duplicate is harmless).
RESEND_LEASE_S = 30.0
LIVE = ("queued", "running")


class RegistryUnavailable(LoopError):
    """Redis (or the Celery broker) could not be reached; the call did nothing certain."""


class WorkerLost(LoopError):
    """The worker running the run stopped heartbeating and the run was not resumed.

    A durable run (``resume="on_worker_loss"``) fails this way only past
    ``max_resumes`` losses, or when its conversation was taken meanwhile.
    """


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for messages and logs).

    Both places redis-py reads one from: ``user:password@`` and a
    ``?password=`` query parameter.
    """
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a malformed URL (a port that is no number): nothing of it is shown
        return "<unparseable redis url>"
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}{port}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_passwords(url: str) -> List[str]:
    """The passwords ``url`` carries (``user:password@`` and ``?password=``), for masking everywhere."""
    try:
        parts = urlsplit(url)
        found = [parts.password] + [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    except ValueError:
        return []
    return [p for p in found if p]


class RedisBackend:
    """One registry's connection to Redis: every script and read, with timeouts.

    Args:
        url: the Redis URL (``redis://host:port/db``); never shown with its password.
        prefix: the key prefix.
        event_buffer: events kept per run (exact trimming below 1000, ``~`` above).
        keep_finished_s: how long a finished run's keys live.
        socket_timeout: seconds for connecting and for each reply.
        block_slice: the longest single blocking read (XREAD / BRPOPLPUSH).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        event_buffer: int,
        keep_finished_s: float,
        socket_timeout: float,
        block_slice: float,
    ) -> None:
        self.url = redact_url(url)
        register_secrets(self, url_passwords(url))  # masked at every outlet while this backend lives
        self.prefix = prefix
        self.buf = str(event_buffer)
        self.approx = "1" if event_buffer >= 1000 else "0"  # (scripts decide from the run's own buffer)
        self.keep_ms = str(max(1, int(keep_finished_s * 1000)))
        self.block_slice = block_slice
        self.socket_timeout = socket_timeout
        self._raw_url = url  # never shown: it may hold a password
        common: Dict[str, Any] = dict(
            decode_responses=True,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 1, (redis.exceptions.ConnectionError,)),
            retry_on_timeout=False,
            protocol=2,
        )
        # Typed Any: redis-py's stubs cannot know decode_responses=True gives str.
        self.r: Any
        self.rb: Any
        try:
            self.r = redis.Redis.from_url(url, socket_timeout=socket_timeout, **common)
            self.rb = redis.Redis.from_url(
                url, socket_timeout=socket_timeout + block_slice, **common
            )
        except (ValueError, redis.exceptions.RedisError) as exc:
            raise RegistryUnavailable(f"bad redis url {self.url!r}: {redact(str(exc))[:200]}") from None
        self._common_kwargs = common
        scripts = {
            "start": lua.START,
            "claim": lua.CLAIM,
            "append": lua.APPEND,
            "heartbeat": lua.HEARTBEAT,
            "ending": lua.ENDING,
            "finish": lua.FINISH,
            "cancel": lua.CANCEL,
            "steer": lua.STEER,
            "status": lua.STATUS,
            "abort": lua.ABORT,
            "handback": lua.HANDBACK,
            "reserve": lua.RESERVE,
            "sweep": lua.SWEEP,
        }
        self._scripts = {name: self.r.register_script(lua.PRELUDE + body) for name, body in scripts.items()}

    # -- keys and plumbing ----------------------------------------------------------------

    def run_key(self, run_id: str, suffix: str = "") -> str:
        """The key of a run's hash (or of one of its parts)."""
        return f"{self.prefix}:run:{run_id}{suffix}"

    def conv_key(self, conversation: str, suffix: str) -> str:
        """The key of a conversation's lock (``:lock``) or history (``:hist``)."""
        return f"{self.prefix}:conv:{conversation}{suffix}"

    def channel(self, run_id: str) -> str:
        """The run's control channel (cancel, steer, end)."""
        return self.run_key(run_id, ":ctl")

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Translate any Redis failure inside into ``RegistryUnavailable``."""
        try:
            yield
        except redis.exceptions.RedisError as exc:
            raise RegistryUnavailable(
                f"redis at {self.url} failed during {what}: {type(exc).__name__}: {exc}"
            ) from exc

    def _run(self, name: str, run_id: str, *args: object, client: object = None) -> Any:
        with self.guard(name):
            return self._scripts[name](
                keys=[self.run_key(run_id)], args=[self.prefix, run_id, *args], client=client
            )

    def _common(self) -> Tuple[str, str, str, str]:
        return (repr(time.time()), self.keep_ms, self.buf, self.approx)

    # -- the registry's side -----------------------------------------------------------------

    def start(self, run: QueuedRun) -> List[str]:
        """Lock the conversation and record the queued run: ``['ok']``, ``['dup']`` or ``['busy', holder]``."""
        now, keep, buf, approx = self._common()
        out: List[str] = self._run(
            "start", run.run_id, run.conversation, run.input, run.config, run.factory, now, str(run.queue_ms),
            keep, buf, approx, run.resume, str(run.max_resumes), run.queue, str(int(RESEND_LEASE_S * 1000)),
            run.owner,
        )
        return out

    def abort(self, run_id: str, error: str) -> None:
        """Fail a queued run that could not be enqueued (releases the lock)."""
        self._run("abort", run_id, *self._common(), error)

    def cancel(self, run_id: str, reason: Optional[str]) -> int:
        """1 accepted, 0 already ended, -1 unknown."""
        has = "0" if reason is None else "1"
        return int(self._run("cancel", run_id, *self._common(), has, reason or ""))

    def steer(self, run_id: str, message_json: str) -> int:
        """1 accepted, 0 already ended, -1 unknown."""
        return int(self._run("steer", run_id, *self._common(), message_json))

    def status(self, run_id: str) -> Dict[str, str]:
        """The run hash (after reaping a lost run); empty when unknown."""
        raw = self._run("status", run_id, *self._common())
        return dict(zip(raw[::2], raw[1::2]))

    def statuses(self, run_ids: Sequence[str]) -> List[Dict[str, str]]:
        """``status`` of many runs in one round trip."""
        with self.guard("list"):
            pipe = self.r.pipeline(transaction=False)
            for rid in run_ids:
                self._scripts["status"](
                    keys=[self.run_key(rid)], args=[self.prefix, rid, *self._common()], client=pipe
                )
            raws = pipe.execute()
        return [dict(zip(raw[::2], raw[1::2])) for raw in raws]

    def run_ids(self) -> List[str]:
        """Every run id in creation order."""
        with self.guard("list"):
            ids: List[str] = self.r.zrange(f"{self.prefix}:runs", 0, -1)
        return ids

    def forget(self, run_ids: Sequence[str]) -> None:
        """Drop ids whose runs expired from the index."""
        if run_ids:
            with self.guard("list"):
                self.r.zrem(f"{self.prefix}:runs", *run_ids)

    def leftovers(self, run_id: str) -> List[str]:
        """The run's leftovers (message JSON), in push order."""
        with self.guard("leftovers"):
            out: List[str] = self.r.lrange(self.run_key(run_id, ":left"), 0, -1)
        return out

    def history(self, conversation: str) -> Optional[str]:
        """The conversation's committed history JSON, or None."""
        with self.guard("history"):
            out: Optional[str] = self.r.get(self.conv_key(conversation, ":hist"))
        return out

    def wait_done(self, run_id: str, timeout: float) -> bool:
        """Block up to ``timeout`` (at most one slice) for the run's done signal."""
        t = max(0.01, min(timeout, self.block_slice))
        key = self.run_key(run_id, ":done")
        with self.guard("result"):
            # Rotate the item instead of popping it, so every waiter wakes.
            return self.rb.brpoplpush(key, key, timeout=t) is not None

    def read_events(self, run_id: str, after: int, timeout: float) -> List[Tuple[int, str]]:
        """Events with seq > ``after``, waiting up to ``timeout`` (one slice) for the first."""
        ms = max(1, int(min(timeout, self.block_slice) * 1000))
        key = self.run_key(run_id, ":ev")
        with self.guard("events"):
            resp = self.rb.xread({key: f"0-{after}"}, count=1000, block=ms)
        if not resp:
            return []
        entries = resp[0][1] if isinstance(resp, list) else next(iter(resp.values()))[0]
        return [(int(eid.split("-", 1)[1]), fields["d"]) for eid, fields in entries]

    def close(self) -> None:
        """Close both connection pools."""
        for client in (self.r, self.rb):
            with contextlib.suppress(Exception):
                client.close()

    # -- the worker's side -------------------------------------------------------------------

    def claim(self, run_id: str, token: str, ttl_ms: int, worker: str) -> Optional[Claim]:
        """queued -> running for this worker; None if the run is not queued any more."""
        now, keep, buf, approx = self._common()
        raw = self._run("claim", run_id, token, str(ttl_ms), now, worker, keep, buf, approx)
        return Claim(raw) if raw and raw[0] == "ok" else None

    def append(
        self,
        run_id: str,
        token: str,
        progress: Sequence[Any],
        events: Sequence[Tuple[int, str]],
        checkpoint: Optional[Tuple[str, int]] = None,
    ) -> bool:
        """Append events (with progress fields and a checkpoint, atomically).

        Returns:
            False once the worker is fenced out.
        """
        flat: List[Any] = []
        for seq, data in events:
            flat += [seq, data]
        ckpt, ckpt_seq = checkpoint if checkpoint is not None else ("", 0)
        return bool(
            self._run("append", run_id, token, *self._common(), *progress, ckpt, ckpt_seq, *flat)
        )

    def handback(self, run_id: str, token: str, cause: str) -> int:
        """Put the worker's run back on the queue from its last checkpoint.

        Returns:
            1 requeued, 2 ended cancelled (a cancel was stored), 3 failed (the
            conversation was taken), 0 fenced out.
        """
        return int(self._run("handback", run_id, token, *self._common(), cause))

    def reserve(self, run_id: str, worker: str, ttl_ms: int) -> None:
        """Note that ``worker`` holds the run's task message (and is alive)."""
        self._run("reserve", run_id, worker, str(ttl_ms))

    def state(self, run_id: str) -> Optional[str]:
        """The run's stored state (no reaping), None when unknown."""
        with self.guard("state"):
            out: Optional[str] = self.r.hget(self.run_key(run_id), "state")
        return out

    def owner(self, run_id: str) -> Optional[str]:
        """Who started the run (None: nobody named an owner)."""
        with self.guard("owner"):
            out: Optional[str] = self.r.hget(self.run_key(run_id), "owner")
        return out or None

    def resend_soon(self, run_id: str) -> None:
        """Put a queued run's id in the outbox, due now, and forget who held its message."""
        with self.guard("resend"):
            pipe = self.r.pipeline(transaction=True)
            pipe.hdel(self.run_key(run_id), "rsv")
            pipe.zadd(f"{self.prefix}:outbox", {run_id: 0})
            pipe.execute()

    def sweep(self, worker: str, ttl_ms: int, lease_ms: int) -> List[Tuple[str, str, str]]:
        """The sweeper's step; the (run id, conversation, queue) whose messages to send."""
        raw = self._run("sweep", "", *self._common(), worker, str(ttl_ms), str(lease_ms))
        return [(raw[i], raw[i + 1], raw[i + 2]) for i in range(0, len(raw), 3)]

    def heartbeat(
        self, run_id: str, token: str, ttl_ms: int
    ) -> Optional[Tuple[bool, Optional[str], int]]:
        """Refresh the heartbeat and the conversation lock.

        Returns:
            None once fenced out; else (cancel stored, its reason, steers accepted).
        """
        raw = self._run("heartbeat", run_id, token, str(ttl_ms), *self._common())
        if not isinstance(raw, list):
            return None
        cancelled = raw[1] == "1"
        return cancelled, (raw[2] or None) if cancelled else None, int(raw[3])

    def ending(self, run_id: str, token: str) -> Tuple[bool, Optional[str]]:
        """The worker's run is at its ending point (see ``scripts.ENDING``).

        Returns:
            (True, the reason) when a cancel was stored before it; else
            (False, None), and a cancel from now on is refused.
        """
        raw = self._run("ending", run_id, token, *self._common())
        if int(raw[0]) != 1:
            return False, None
        return True, (raw[1] if len(raw) > 1 else None) or None

    def finish(self, run_id: str, token: str, fields: Sequence[Any], leftovers: Sequence[str]) -> int:
        """The terminal step (see ``scripts.FINISH``); the run_end's seq, or 0 when fenced out."""
        return int(self._run("finish", run_id, token, *self._common(), *fields, *leftovers))

    def steers_from(self, run_id: str, start: int, end: int = -1) -> List[str]:
        """Accepted steers ``start..end`` (inclusive) of the run."""
        with self.guard("steer catch-up"):
            out: List[str] = self.r.lrange(self.run_key(run_id, ":steer"), start, end)
        return out

    def cancel_requested(self, run_id: str) -> Tuple[bool, Optional[str]]:
        """Whether a cancel was stored for the run, and its reason."""
        with self.guard("cancel catch-up"):
            flag, reason = self.r.hmget(self.run_key(run_id), "cancel", "cancel_reason")
        return flag == "1", reason

    def publish(self, run_id: str, data: str) -> None:
        """Publish on the run's control channel."""
        with self.guard("publish"):
            self.r.publish(self.channel(run_id), data)

    def pubsub(self, name: str) -> Any:
        """A PubSub on its own connection, named ``name`` (``CLIENT LIST`` shows it).

        The name survives reconnects (redis-py sets it on every connect).
        """
        client: Any = redis.Redis.from_url(
            self._raw_url, socket_timeout=self.socket_timeout, client_name=name, **self._common_kwargs
        )
        return client.pubsub(ignore_subscribe_messages=False)


def dumps(data: object) -> str:
    """Compact, standard JSON text (a non-finite number is ``null``)."""
    return json.dumps(json_safe(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


__all__ = [
    "LIVE",
    "TERMINAL",
    "Claim",
    "QueuedRun",
    "RedisBackend",
    "RegistryUnavailable",
    "WorkerLost",
    "redact_url",
]
