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

A durable run (``resume="on_worker_loss"``) differs in three places. The
loop hands its state to ``Checkpointer`` at each turn boundary, and the
events thread writes that checkpoint in the same script as the events
before it. A lapsed heartbeat puts the run back on the queue instead of
failing it (the sweepers send its task message again), and the claim that
picks it up gets the checkpoint: the loop is built from the same committed
history, restored through ``BareLoop.start(resume=...)``, its events numbered
on from the stream's last seq after a ``run_resumed`` event, and the steers
the checkpoint had not delivered are fed again. On a warm shutdown
(``WorkerHost.draining``) the run is handed back at its next boundary, or
from its last checkpoint once ``drain_timeout`` has passed.
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
from loopctl.driver.checkpoint import Checkpoint, ResumePoint
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.hosting.serialization import (
    history_from_dict,
    history_to_dict,
    message_from_dict,
    message_to_dict,
)
from loopctl.messages import Message
from loopctl.observers import Event, RunEnd, SteeringDelivered
from loopctl.records import Run, Turn

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


#: The cause a run handed back on a warm shutdown shows in ``run_resumed``.
HANDED_BACK = "the worker shut down and handed the run back"


class WorkerHost:
    """What a worker process offers its runs: the drain switch and a prompt resend.

    Attributes:
        draining: set on a warm shutdown; durable runs are handed back.
        drain_timeout: seconds a run may take to reach a boundary once draining.
    """

    def __init__(self, drain_timeout: float, kick: Callable[[], None]) -> None:
        self.draining = threading.Event()
        self.drain_timeout = drain_timeout
        self._kick = kick

    def kick(self) -> None:
        """Send the outbox's due task messages now (after a handback)."""
        self._kick()


def checkpoint_to_json(cp: Checkpoint, steers: int, clean: bool = False) -> str:
    """A checkpoint as JSON, with the count of steers it has delivered.

    ``clean``: the run stops right here (handed back), nothing runs after it.
    """
    return dumps(
        {
            "clean": clean,
            "after": cp.after,
            "pending": history_to_dict(cp.pending),
            "turns_taken": cp.turns_taken,
            "turns": [t.to_dict() for t in cp.turns],
            "answered": message_to_dict(Message.from_tool_results(cp.answered)) if cp.answered else None,
            "history": history_to_dict(cp.history) if cp.history is not None else None,
            "steers": steers,
        }
    )


def checkpoint_from_json(text: str) -> Tuple[Checkpoint, int, bool]:
    """The checkpoint, its delivered-steer count and clean flag (``checkpoint_to_json`` reversed)."""
    data = json.loads(text)
    answered = message_from_dict(data["answered"]).tool_results if data.get("answered") else []
    history = history_from_dict(data["history"]) if data.get("history") is not None else None
    cp = Checkpoint(
        str(data["after"]),
        tuple(history_from_dict(data["pending"])),
        int(data["turns_taken"]),
        tuple(Turn.from_dict(t) for t in data["turns"]),
        tuple(answered),
        tuple(history) if history is not None else None,
    )
    return cp, int(data.get("steers") or 0), bool(data.get("clean"))


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

    def __init__(
        self, backend: RedisBackend, run_id: str, token: str, settings: WorkerSettings, first_seq: int = 0
    ) -> None:
        self._backend = backend
        self._run_id = run_id
        self._token = token
        self._settings = settings
        self._cond = threading.Condition(threading.Lock())
        self._queue: List[Tuple[int, Event]] = []
        self._seq = first_seq  # a resumed run numbers on from the stream's last event
        self._ckpt: Optional[Tuple[str, int]] = None  # (json, seq): written with the events before it
        self._sealed = False
        self._written: List[threading.Event] = []  # waiters for the queued checkpoint
        self.delivered = 0  # steering messages drained into the conversation by this attempt
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
            if self.end is not None or self._sealed:
                return  # run_end is the last event; a handed-back run writes no more
            self._seq += 1
            self.session_id = event.session_id
            if type(event) is SteeringDelivered:
                self.delivered += len(event.messages)
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

    def checkpoint(self, text: str, confirm: bool = False) -> Optional[threading.Event]:
        """Queue a checkpoint (the run's thread); it lands with the events before it.

        With ``confirm``, returns an Event set once it is written (or the
        worker is fenced out); None when nothing will be written.
        """
        with self._cond:
            if self._sealed or self.lost:
                return None
            self._ckpt = (text, self._seq)
            written: Optional[threading.Event] = None
            if confirm:
                written = threading.Event()
                self._written.append(written)
            self._cond.notify()
            return written

    def seal(self) -> None:
        """Write nothing the run emits from now on (it is being handed back)."""
        with self._cond:
            self._sealed = True

    @property
    def confirm_timeout(self) -> float:
        """The longest a run waits for a checkpoint to be confirmed (the heartbeat TTL)."""
        return self._settings.heartbeat_ttl

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
        with self._cond:
            written, self._written = self._written, []
        for w in written:
            w.set()
        h = self._handle
        if h is not None:
            h.cancel("worker lost: the run's heartbeat lapsed")

    def _main(self) -> None:
        interval = self._settings.heartbeat_interval
        next_beat = time.monotonic() + interval
        failures = 0
        while True:
            with self._cond:
                while not self._queue and self._ckpt is None and not self._stopping:
                    left = next_beat - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._queue and not self._stopping and not self._written and LINGER_S > 0:
                    self._cond.wait(LINGER_S)  # let a burst collect into one round trip
                batch, self._queue = self._queue, []
                ckpt, self._ckpt = self._ckpt, None
                written, self._written = self._written, []
                stopping = self._stopping
            ok = True
            if (batch or ckpt is not None) and not self.lost:
                try:
                    data = [(seq, dumps(ev.to_dict())) for seq, ev in batch]
                    if not self._backend.append(self._run_id, self._token, self.progress(), data, ckpt):
                        self._fenced_out()
                    failures = 0
                    for w in written:
                        w.set()
                    written = []
                except RegistryUnavailable as exc:
                    ok = False
                    failures += 1
                    log.warning("run %s: events not written yet: %s", self._run_id, exc)
                    with self._cond:  # keep them, in order, for the next try
                        self._queue[:0] = batch
                        del self._queue[: max(0, len(self._queue) - self._settings.event_buffer)]
                        if self._ckpt is None:
                            self._ckpt = ckpt
                        self._written[:0] = written
                        written = []
            for w in written:  # fenced out before writing: the waiter sees ``lost``
                w.set()
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


def _build_loop(
    claim: Claim, conversation: str, saved: Optional[Checkpoint], steer_base: int
) -> Tuple[BareLoop, SteerFeed]:
    if saved is not None and saved.history is not None:
        history = list(saved.history)  # the run compacted: its own history goes on
    else:
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
        pending = [message_from_dict(json.loads(s)) for s in claim.steers[steer_base:]]
        feed = SteerFeed(loop.steering(), pending)
        loop.add_contributor(feed)
    except BaseException:
        loop.close()
        raise
    return loop, feed


def execute_run(
    backend: RedisBackend,
    run_id: str,
    conversation: str,
    settings: WorkerSettings,
    worker: str,
    host: Optional[WorkerHost] = None,
) -> str:
    """Claim and execute one queued run here; returns what happened (for logs).

    Returns:
        ``"skipped"`` (not queued any more), ``"completed"``, ``"cancelled"``,
        ``"failed"``, ``"lost"`` (fenced out: another process declared it
        lost), or ``"handed back"`` (a warm shutdown requeued it).

    Raises:
        RegistryUnavailable: Redis failed before the run was claimed.
    """
    if backend.state(run_id) != "queued":
        return "skipped"  # a duplicate message (cheap: no subscription); the claim re-checks
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
    durable = claim.resume == "on_worker_loss"
    saved: Optional[Checkpoint] = None
    steer_base = 0
    clean = False
    writer = EventWriter(
        backend, run_id, token, attrs.evolve(settings, event_buffer=claim.event_buffer), claim.seq
    )
    writer.start()
    loop: Optional[BareLoop] = None
    feed: Optional[SteerFeed] = None
    handle: Optional[RunHandle] = None
    config: Optional[RunConfig] = None
    setup_error: Optional[LoopError] = None
    handed = threading.Event()
    try:
        try:
            if claim.checkpoint:
                saved, steer_base, clean = checkpoint_from_json(claim.checkpoint)
            config = RunConfig.from_dict(json.loads(claim.config)) if claim.config else None
            loop, feed = _build_loop(claim, conversation, saved, steer_base)
            if claim.cancel:
                loop.cancel_signal().cancel(claim.reason)  # observed by the next run: no model call
            sink = _checkpointer(loop, writer, steer_base, host, handed) if durable else None
            point = ResumePoint(saved, claim.resumes, claim.cause, clean) if claim.resumes > 0 else None
            handle = loop.start(claim.input, config, run_id, tap=writer.tap, checkpoint=sink, resume=point)
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
            if durable and host is not None:
                _wait_or_drain(handle, writer, host, handed)
            else:
                handle.wait()
    finally:
        writer.stop()
        bridge.stop()
    try:
        if handed.is_set():
            return _hand_back(backend, run_id, token, writer, host)
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
            left = list(claim.steers[steer_base:])
        history = loop.conversation() if loop is not None and run.stop_reason is None else None
        fields = _end_fields(run, writer, bridge.cursor, session, history, handle is not None)
        fields[-1] = repr(claim.started_at)  # a resumed run keeps its first start
        if writer.lost:
            return "lost"
        return _finish(backend, run_id, token, fields, left)
    finally:
        if loop is not None:
            loop.close()


def _checkpointer(
    loop: BareLoop, writer: EventWriter, steer_base: int, host: Optional[WorkerHost], handed: threading.Event
) -> Callable[[Checkpoint], None]:
    """The run's checkpoint sink (its thread): queue the state; hand back if draining."""

    def sink(cp: Checkpoint) -> None:
        hand = host is not None and host.draining.is_set() and not handed.is_set()
        text = checkpoint_to_json(cp, steer_base + writer.delivered, clean=hand)
        # Write-ahead for at-most-once: the model's calls are durable before any
        # of them starts, or a crash now would ask (and run) them again.
        written = writer.checkpoint(text, confirm=cp.after == "model" and not hand)
        if written is not None and not written.wait(writer.confirm_timeout):
            log.warning("checkpoint not confirmed within %.1fs; the tools run anyway", writer.confirm_timeout)
        if writer.lost:
            loop.cancel("worker lost: the run's heartbeat lapsed")  # before any tool starts
            return
        if hand:
            writer.seal()  # nothing after this boundary reaches the stream
            handed.set()
            # On this thread, before the run's next step: no tool starts after the checkpoint.
            loop.cancel(HANDED_BACK)

    return sink


def _wait_or_drain(handle: RunHandle, writer: EventWriter, host: WorkerHost, handed: threading.Event) -> None:
    """Wait for the run; on a warm shutdown, stop it at a boundary (or at the drain deadline)."""
    deadline: Optional[float] = None
    while not handle.wait(0.05):
        if not host.draining.is_set():
            continue
        now = time.monotonic()
        if deadline is None:
            deadline = now + host.drain_timeout
        if not handed.is_set() and now >= deadline:
            writer.seal()  # no boundary in time: back from the last committed checkpoint
            handed.set()
        if handed.is_set():
            handle.cancel(HANDED_BACK)
            handle.wait()
            return


def _hand_back(
    backend: RedisBackend, run_id: str, token: str, writer: EventWriter, host: Optional[WorkerHost]
) -> str:
    if writer.lost:
        return "lost"
    try:
        got = backend.handback(run_id, token, HANDED_BACK)
    except RegistryUnavailable as exc:  # the heartbeat lapses: it is resumed as lost
        log.warning("run %s: could not hand the run back: %s", run_id, exc)
        return "lost"
    if got == 1 and host is not None:
        try:
            host.kick()
        except Exception:  # the sweepers send it within their interval
            log.warning("run %s: could not resend the handed-back run at once", run_id, exc_info=True)
    return {0: "lost", 1: "handed back", 2: "cancelled", 3: "failed"}.get(got, "lost")


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


__all__ = [
    "HANDED_BACK",
    "EventWriter",
    "WorkerHost",
    "WorkerSettings",
    "checkpoint_from_json",
    "checkpoint_to_json",
    "execute_run",
    "resolve_factory",
]
