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
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.hosting.serialization import history_from_dict, history_to_dict, message_from_dict
from loopctl.messages import Message
from loopctl.observers import Event, RunEnd
from loopctl.records import Run

from .celery_bridge import Bridge, SteerFeed
from .celery_redis import Claim, RedisBackend, RegistryUnavailable, dumps

log = logging.getLogger("loopctl")

#: How long the events thread lets a burst of events collect into one write
#: (a stream consumer sees events at most this much later; run_end is never held).
LINGER_S = 0.002


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
        self.on_beat: Optional[Callable[[bool, Optional[str], int], None]] = None
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
            self.session_id = event.session_id
            if type(event) is RunEnd:
                self.end = (self._seq, event.to_dict())
            else:
                q = self._queue
                if len(q) >= self._settings.event_buffer:
                    del q[0]  # a reader sees the hole as a gap
                q.append((self._seq, event))
                if len(q) > 1:
                    return  # the writer was already told (it lingers to batch)
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
                if self._queue and not self._stopping and LINGER_S > 0:
                    self._cond.wait(LINGER_S)  # let a burst collect into one round trip
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
                        beat = self._backend.heartbeat(self._run_id, self._token, self._settings.ttl_ms)
                    except RegistryUnavailable as exc:
                        log.warning("run %s: heartbeat failed: %s", self._run_id, exc)
                    else:
                        if beat is None:
                            self._fenced_out()
                        elif self.on_beat is not None:
                            self.on_beat(*beat)
            if stopping and (ok or failures >= 3 or self.lost):
                return
            if not ok:
                with self._cond:  # a short pause before retrying (woken by stop)
                    self._cond.wait(min(interval, 0.2))


def _build_loop(claim: Claim, conversation: str) -> Tuple[BareLoop, SteerFeed]:
    history = history_from_dict(json.loads(claim.history)) if claim.history else []
    factory = resolve_factory(claim.factory)
    loop = factory(conversation, list(history))
    if not isinstance(loop, BareLoop):
        raise ConfigError(
            f"loop factory {claim.factory!r} returned {type(loop).__name__}, not a BareLoop"
        )
    try:
        if loop.conversation() != history:
            raise ConfigError(
                f"loop factory {claim.factory!r} ignored the conversation's history "
                f"({len(history)} messages); build the loop with "
                "BareLoop.from_history(client, tools, config, history)"
            )
        pending = [message_from_dict(json.loads(s)) for s in claim.steers]
        feed = SteerFeed(loop.steering(), pending)
        loop.add_contributor(feed)
    except BaseException:
        loop.close()
        raise
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
                loop.cancel_signal().cancel(claim.reason)  # observed by the next run: no model call
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
            writer.on_beat = bridge.poke
            handle.wait()
    finally:
        writer.stop()
        bridge.stop()
    try:
        if handle is not None:
            run = handle.record
        else:
            run = Run(id=run_id, input=claim.input, config=config or RunConfig())
            run.end = time.time()
            run.stop_reason = setup_error
        session = loop.session.id if loop is not None else ""
        if feed is not None:
            left = [dumps(m.to_dict()) for m in feed.leftovers()]
        else:  # never built: the steers taken with the claim go back as they came
            left = list(claim.steers)
        history = loop.conversation() if loop is not None and run.stop_reason is None else None
        fields = _end_fields(run, writer, bridge.cursor, session, history, handle is not None)
        if writer.lost:
            return "lost"
        return _finish(backend, run_id, token, fields, left)
    finally:
        if loop is not None:
            loop.close()


def _end_fields(
    run: Run,
    writer: EventWriter,
    cursor: int,
    session: str,
    history: Optional[List[Message]],
    started: bool,
) -> List[Any]:
    """The FINISH script's fields (see ``celery_scripts.FINISH``), state first."""
    err = run.stop_reason
    if err is None:
        state = "completed"
    else:
        state = "cancelled" if isinstance(err, Cancelled) else "failed"
    if writer.end is not None:
        end_seq, end_dict = writer.end
    else:  # the run never started: its only event is this run_end
        end_seq = writer.seq + 1
        end_dict = RunEnd(
            session, run.id, err is None, None if err is None else str(err),
            run.turn_count, ((run.end or time.time()) - run.start) * 1000.0,
        ).to_dict()
    progress = writer.progress() if started else [session, 0, 0, 0, 0]
    progress[0] = progress[0] or session
    return [
        state,
        (run.output or "") if err is None else "",
        "" if err is None else str(err),
        "" if err is None else type(err).__name__,
        dumps(run.to_dict()),
        dumps(history_to_dict(history)) if history is not None else "",
        cursor,
        end_seq,
        dumps(end_dict),
        *progress,
        repr(run.start),
    ]


def _finish(backend: RedisBackend, run_id: str, token: str, fields: List[Any], left: List[str]) -> str:
    """Record the end (a few tries if Redis hiccups); the state, or ``"lost"``."""
    pause = threading.Event()  # never set: a bounded pause between tries
    for attempt in range(3):
        try:
            if not backend.finish(run_id, token, fields, left):
                return "lost"
            return str(fields[0])
        except RegistryUnavailable as exc:
            log.warning("run %s: finish attempt %d failed: %s", run_id, attempt + 1, exc)
            pause.wait(0.2 * (attempt + 1))
    log.error("run %s: could not record its end; it will be declared lost", run_id)
    return "lost"


__all__ = ["EventWriter", "WorkerSettings", "execute_run", "resolve_factory"]
