"""The worker side of ``CeleryRunRegistry``: one queued run, executed here, at most once.

``execute_run`` keeps this order, and each step is why a guarantee holds:

1. Subscribe to the run's control channel and wait for the confirmation,
   THEN claim the run (queued -> running, one Lua step that also returns the
   stored cancel flag, the steers accepted so far and the history). A cancel
   or steer is therefore either in the claim or arrives on the channel
   (possibly both: applying a cancel twice is harmless, and steers are
   addressed by their index in the run's steer list, so none is taken twice).
   A run that is not queued any more (already claimed, cancelled in the
   queue, redelivered by the broker) is skipped: at-most-once.
2. The events thread (``loopctl-celery-events-<id>``) starts at once: it
   heartbeats the run and batches the run's events into its Redis stream.
   The run's tap only appends to a bounded list and notifies.
3. The loop is built by the factory from the stored history; a contributor
   (``SteerFeed``) pushes the steers that arrived before the run started at
   the first boundary (inside turn 0's request preparation, so they are in
   the first request); a stored cancel is applied before ``start``, so it
   ends that run and no other.
4. The bridge thread (``loopctl-celery-bridge-<id>``) turns a cancel into
   the ``RunHandle``'s cancel and a steer into ``steering.push``; a push the
   slot refuses (the run is ending) is kept as a leftover.
5. After the run: both threads are stopped and joined, and ONE Lua step
   appends ``run_end``, writes the terminal state and the ``Run``, returns
   as leftovers the sealed and refused guidance plus every steer the bridge
   never read, commits the history (success only, and only while this run
   still holds the conversation lock), releases the lock and signals done.

If the heartbeat lapses (the process was killed, or stalled longer than the
TTL), any reader declares the run failed ("worker lost") and this worker's
later writes are refused; it then cancels its local run.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs

from loopctl.config import RunConfig
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.driver.signals import Steering
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.messages import Message
from loopctl.observers import Event, RunEnd
from loopctl.records import Run
from loopctl.serialization import history_from_dict, history_to_dict, message_from_dict

from .celery_redis import Claim, RedisBackend, RegistryUnavailable, dumps

try:
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover
    raise ImportError("loopctl.contrib.celery needs the [celery] extra") from exc

log = logging.getLogger("loopctl")


@attrs.frozen
class WorkerSettings:
    """Timing of a worker's run: heartbeat every ``interval`` s, lapse after ``ttl`` s."""

    heartbeat_interval: float
    heartbeat_ttl: float
    event_buffer: int

    @property
    def ttl_ms(self) -> int:
        """The heartbeat TTL in milliseconds."""
        return max(1, int(self.heartbeat_ttl * 1000))


def resolve_factory(spec: str) -> Callable[..., Any]:
    """Import ``"pkg.module:attr"`` (``attr`` may be dotted).

    Raises:
        ConfigError: a malformed spec, or an import or lookup that failed.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"loop_factory must look like 'pkg.module:factory', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import loop_factory {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(obj):
        raise ConfigError(f"loop_factory {spec!r} is not callable: {obj!r:.60}")
    return obj  # type: ignore[no-any-return]


class SteerFeed:
    """Steering's landing: a contributor that opens the feed at the first boundary.

    Before the run's slot is open, guidance waits here (``pending``). The
    first time the driver consults contributors (turn 0's request
    preparation) the pending guidance is pushed, so it is in the first
    request; from then on the bridge pushes directly. A push the slot
    refuses (the run is ending) is kept in ``refused``. ``leftovers`` gives
    pending + sealed + refused: push order, each message once.
    """

    def __init__(self, steering: Steering, pending: List[Message]) -> None:
        self._steering = steering
        self._lock = threading.Lock()
        self._ready = False
        self._pending = list(pending)
        self._refused: List[Message] = []

    def contribute(self, ctx: Any) -> None:
        """Open the feed on the first call (on the run's thread); never adds a message."""
        if self._ready:
            return None
        with self._lock:
            if not self._ready:
                self._ready = True
                pending, self._pending = self._pending, []
                self._push(pending)
        return None

    def deliver(self, messages: List[Message]) -> None:
        """Hand guidance to the run (the bridge thread)."""
        with self._lock:
            if self._ready:
                self._push(messages)
            else:
                self._pending.extend(messages)

    def _push(self, messages: List[Message]) -> None:
        push = self._steering.push
        for m in messages:
            if not push(m):
                self._refused.append(m)

    def leftovers(self) -> List[Message]:
        """Everything accepted for the run and never delivered (after the run ended)."""
        with self._lock:
            self._ready = True  # nothing may wait in pending after this
            out = self._pending + self._steering.take_leftovers() + self._refused
            self._pending, self._refused = [], []
            return out


class EventWriter:
    """The run's events thread: heartbeats and batched event appends."""

    def __init__(self, backend: RedisBackend, run_id: str, token: str, settings: WorkerSettings) -> None:
        self._backend = backend
        self._run_id = run_id
        self._token = token
        self._settings = settings
        self._cond = threading.Condition(threading.Lock())
        self._queue: List[Tuple[int, Event]] = []
        self._seq = 0
        self._stopping = False
        self._handle: Optional[RunHandle] = None
        self.session_id = ""
        self.end: Optional[Tuple[int, Dict[str, Any]]] = None
        self.lost = False
        self._thread = threading.Thread(
            target=self._main, name=f"loopctl-celery-events-{run_id[:12]}", daemon=True
        )

    def start(self) -> None:
        """Start heartbeating (right after the claim)."""
        self._thread.start()

    def tap(self, event: Event) -> None:
        """The run's tap (its thread): number, append, notify."""
        with self._cond:
            if self.end is not None:
                return  # run_end is the last event
            self._seq += 1
            if type(event) is RunEnd:
                self.end = (self._seq, event.to_dict())
            else:
                q = self._queue
                if len(q) >= self._settings.event_buffer:
                    del q[0]  # a reader sees the hole as a gap
                q.append((self._seq, event))
            self.session_id = event.session_id
            self._cond.notify()

    @property
    def seq(self) -> int:
        """The last sequence number handed out."""
        return self._seq

    def attach(self, handle: RunHandle) -> None:
        """Know the run (for progress figures and to cancel it if we are fenced out)."""
        self._handle = handle
        if self.lost:
            handle.cancel("worker lost: the run's heartbeat lapsed")

    def progress(self) -> List[Any]:
        """session id, turns, tool calls, input and output tokens so far."""
        h = self._handle
        turns = [*h.record.turns] if h is not None else []
        return [
            self.session_id,
            len(turns),
            sum(len(t.tool_calls) for t in turns),
            sum(t.input_tokens for t in turns),
            sum(t.output_tokens for t in turns),
        ]

    def stop(self) -> None:
        """Flush what is queued (best effort), stop heartbeating, join the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _fenced_out(self) -> None:
        if not self.lost:
            log.warning("run %s: fenced out (declared lost); cancelling it here", self._run_id)
        self.lost = True
        h = self._handle
        if h is not None:
            h.cancel("worker lost: the run's heartbeat lapsed")

    def _main(self) -> None:
        interval = self._settings.heartbeat_interval
        next_beat = time.monotonic() + interval
        failures = 0
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    left = next_beat - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch, self._queue = self._queue, []
                stopping = self._stopping
            ok = True
            if batch and not self.lost:
                try:
                    data = [(seq, dumps(ev.to_dict())) for seq, ev in batch]
                    if not self._backend.append(self._run_id, self._token, self.progress(), data):
                        self._fenced_out()
                    failures = 0
                except RegistryUnavailable as exc:
                    ok = False
                    failures += 1
                    log.warning("run %s: events not written yet: %s", self._run_id, exc)
                    with self._cond:  # keep them, in order, for the next try
                        self._queue[:0] = batch
                        del self._queue[: max(0, len(self._queue) - self._settings.event_buffer)]
            if not stopping and time.monotonic() >= next_beat:
                next_beat = time.monotonic() + interval
                if not self.lost:
                    try:
                        if not self._backend.heartbeat(self._run_id, self._token, self._settings.ttl_ms):
                            self._fenced_out()
                    except RegistryUnavailable as exc:
                        log.warning("run %s: heartbeat failed: %s", self._run_id, exc)
            if stopping and (ok or failures >= 3 or self.lost):
                return
            if not ok:
                with self._cond:  # a short pause before retrying (woken by stop)
                    self._cond.wait(min(interval, 0.2))


class Bridge:
    """The run's control channel on this worker: cancel and steer in, nothing out."""

    def __init__(self, backend: RedisBackend, run_id: str, cursor: int = 0) -> None:
        self._backend = backend
        self._run_id = run_id
        self._slice = backend.block_slice
        self.cursor = cursor
        self._handle: Optional[RunHandle] = None
        self._feed: Optional[SteerFeed] = None
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self._stop_evt = threading.Event()
        self._ps = backend.pubsub()
        try:
            with backend.guard("subscribe"):
                self._ps.subscribe(backend.channel(run_id))
                deadline = time.monotonic() + backend.socket_timeout
                while True:
                    msg = self._ps.get_message(timeout=max(0.01, deadline - time.monotonic()))
                    if msg is not None and msg.get("type") == "subscribe":
                        break
                    if time.monotonic() >= deadline:
                        raise RegistryUnavailable(
                            f"redis at {backend.url}: no confirmation for the run's channel subscription"
                        )
        except BaseException:
            self.close()
            raise

    def start(self, handle: RunHandle, feed: SteerFeed) -> None:
        """Start the bridge thread for the running run."""
        self._handle = handle
        self._feed = feed
        t = threading.Thread(
            target=self._main, name=f"loopctl-celery-bridge-{self._run_id[:12]}", daemon=True
        )
        self._thread = t
        t.start()

    def stop(self) -> None:
        """Make the thread leave after what is already on the channel, join it, close."""
        self._stopped = True
        self._stop_evt.set()
        t = self._thread
        if t is not None and t.is_alive():
            try:
                self._backend.publish(self._run_id, "x")
            except RegistryUnavailable:
                pass  # the thread leaves at its next empty read
            t.join(self._slice + self._backend.socket_timeout + 1.0)
        self.close()

    def close(self) -> None:
        """Close the subscription's connection."""
        try:
            self._ps.close()
        except Exception:  # closing a broken connection must not mask the real error
            log.debug("closing the bridge's pubsub failed", exc_info=True)

    def _main(self) -> None:
        handle = self._handle
        assert handle is not None
        while True:
            try:
                msg = self._ps.get_message(timeout=self._slice)
            except (RedisError, OSError, ValueError) as exc:
                if self._stopped:
                    return
                log.warning("run %s: control channel broke (%s); catching up", self._run_id, exc)
                if not self._catch_up(handle):
                    self._stop_evt.wait(0.2)  # Redis is down: retry shortly (or leave on stop)
                continue
            if msg is None:
                if self._stopped:
                    return
                continue
            if msg.get("type") != "message":
                continue
            data: str = msg["data"]
            op = data[:1]
            if op == "c":
                handle.cancel(data[2:] if data[1:2] == "1" else None)
            elif op == "s":
                idx, _, payload = data[1:].partition(" ")
                self._on_steer(int(idx), payload)
            elif op in ("e", "x"):
                return

    def _on_steer(self, index: int, payload: str) -> None:
        if index < self.cursor:
            return  # already taken (in the claim, or by a catch-up)
        raw: List[str] = []
        if index > self.cursor:  # a notification was missed: read the gap, in order
            try:
                raw = self._backend.steers_from(self._run_id, self.cursor, index - 1)
            except RegistryUnavailable:
                return  # not taken: the finish step returns them as leftovers
            if len(raw) != index - self.cursor:
                return
        raw.append(payload)
        self.cursor = index + 1
        self._deliver(raw)

    def _deliver(self, raw: List[str]) -> None:
        feed = self._feed
        assert feed is not None
        msgs: List[Message] = []
        for text in raw:
            try:
                msgs.append(message_from_dict(json.loads(text)))
            except (ValueError, LoopError):
                log.error("run %s: dropped a malformed steer %r", self._run_id, text[:80])
        feed.deliver(msgs)

    def _catch_up(self, handle: RunHandle) -> bool:
        """After a broken subscription: apply a stored cancel and unread steers."""
        try:
            cancelled, reason = self._backend.cancel_requested(self._run_id)
            if cancelled:
                handle.cancel(reason)
            raw = self._backend.steers_from(self._run_id, self.cursor)
        except RegistryUnavailable:
            return False
        if raw:
            self.cursor += len(raw)
            self._deliver(raw)
        return True


def _build_loop(claim: Claim, conversation: str) -> Tuple[BareLoop, SteerFeed]:
    history = history_from_dict(json.loads(claim.history)) if claim.history else []
    factory = resolve_factory(claim.factory)
    loop = factory(conversation, list(history))
    if not isinstance(loop, BareLoop):
        raise ConfigError(
            f"loop factory {claim.factory!r} returned {type(loop).__name__}, not a BareLoop"
        )
    if loop.conversation() != history:
        loop.close()
        raise ConfigError(
            f"loop factory {claim.factory!r} ignored the conversation's history "
            f"({len(history)} messages); build the loop with "
            "BareLoop.from_history(client, tools, config, history)"
        )
    pending = [message_from_dict(json.loads(s)) for s in claim.steers]
    feed = SteerFeed(loop.steering(), pending)
    loop.add_contributor(feed)
    return loop, feed


def execute_run(
    backend: RedisBackend, run_id: str, conversation: str, settings: WorkerSettings, worker: str
) -> str:
    """Claim and execute one queued run here; returns what happened (for logs).

    Returns:
        ``"skipped"`` (not queued any more), ``"completed"``, ``"cancelled"``,
        ``"failed"``, or ``"lost"`` (fenced out: another process declared it lost).

    Raises:
        RegistryUnavailable: Redis failed before the run was claimed.
    """
    token = uuid.uuid4().hex
    bridge = Bridge(backend, run_id)
    try:
        claim = backend.claim(run_id, token, settings.ttl_ms, worker)
    except BaseException:
        bridge.close()
        raise
    if claim is None:
        bridge.close()
        return "skipped"
    bridge.cursor = len(claim.steers)
    writer = EventWriter(backend, run_id, token, attrs.evolve(settings, event_buffer=claim.event_buffer))
    writer.start()
    loop: Optional[BareLoop] = None
    feed: Optional[SteerFeed] = None
    handle: Optional[RunHandle] = None
    config: Optional[RunConfig] = None
    setup_error: Optional[LoopError] = None
    try:
        try:
            config = RunConfig.from_dict(json.loads(claim.config)) if claim.config else None
            loop, feed = _build_loop(claim, conversation)
            if claim.cancel:
                loop.cancel(claim.reason)
            handle = loop.start(claim.input, config, run_id, tap=writer.tap)
        except Exception as exc:
            msg = f"could not start the run: {type(exc).__name__}: {exc}"
            setup_error = exc if isinstance(exc, LoopError) else LoopError(msg)
            if setup_error is not exc:
                setup_error.__cause__ = exc
            log.error("run %s: %s", run_id, msg)
        if handle is not None:
            assert feed is not None
            writer.attach(handle)
            bridge.start(handle, feed)
            handle.wait()
    finally:
        writer.stop()
        bridge.stop()
    try:
        if handle is not None:
            run = handle.record
            session = loop.session.id if loop is not None else ""
        else:
            run = Run(id=run_id, input=claim.input, config=config or RunConfig())
            run.end = time.time()
            run.stop_reason = setup_error
            session = ""
        err = run.stop_reason
        if err is None:
            state = "completed"
        else:
            state = "cancelled" if isinstance(err, Cancelled) else "failed"
        if writer.end is not None:
            end_seq, end_dict = writer.end
        else:
            end_seq = writer.seq + 1
            end_dict = RunEnd(
                session, run_id, err is None, None if err is None else str(err),
                run.turn_count, ((run.end or time.time()) - run.start) * 1000.0,
            ).to_dict()
        leftovers = feed.leftovers() if feed is not None else []
        hist = ""
        if err is None and loop is not None:
            hist = dumps(history_to_dict(loop.conversation()))
        progress = writer.progress() if handle is not None else [session, 0, 0, 0, 0]
        progress[0] = progress[0] or session or end_dict.get("session_id", "")
        fields: List[Any] = [
            state,
            (run.output or "") if err is None else "",
            "" if err is None else str(err),
            "" if err is None else type(err).__name__,
            dumps(run.to_dict()),
            hist,
            bridge.cursor,
            end_seq,
            dumps(end_dict),
            *progress,
            repr(run.start),
        ]
        left = [dumps(m.to_dict()) for m in leftovers]
        if writer.lost:
            return "lost"
        for attempt in range(3):
            try:
                if not backend.finish(run_id, token, fields, left):
                    return "lost"
                return state
            except RegistryUnavailable as exc:
                log.warning("run %s: finish attempt %d failed: %s", run_id, attempt + 1, exc)
                threading.Event().wait(0.2 * (attempt + 1))
        log.error("run %s: could not record its end; it will be declared lost", run_id)
        return "lost"
    finally:
        if loop is not None:
            loop.close()


__all__ = ["Bridge", "EventWriter", "SteerFeed", "WorkerSettings", "execute_run", "resolve_factory"]
