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
   the ``RunHandle``'s cancel and a steer into ``steering.push`` (one with a
   sub-agent path into ``RunHandle.steer_subagent``); a push the slot
   refuses (the run is ending), or one whose sub-agent is not in flight, is
   kept as a leftover.
5. At the run's ending point (its answer in hand, or an error ending it)
   the loop's ``at_end`` hook runs ONE Lua step (``ENDING``): a cancel
   stored before it ends the run cancelled, delivered by the bridge or not;
   otherwise the run is marked ``ending`` and a later cancel is refused, as
   for an ended run. So a cancel that returned True ends the run cancelled,
   as in process, where the same decision is taken under one lock. A steer
   accepted past that point is returned as a leftover (by the slot, which
   refuses it, or by step 6).
6. After the run: both threads are stopped and joined, and ONE Lua step
   appends ``run_end``, writes the terminal state and the ``Run``, returns
   as leftovers the sealed and refused guidance plus every steer the bridge
   never read, commits the history (success only, and only while this run
   still holds the conversation lock), releases the lock and signals done.

If the heartbeat lapses (the process was killed, or stalled longer than the
TTL), any reader declares the run failed ("worker lost") and this worker's
later writes are refused; it then cancels its local run.

A durable run (``resume="on_worker_loss"``) differs in three places (the
parts live in ``durable``). The loop hands its state to the
``checkpointer`` sink at each turn boundary, and the events thread writes
that checkpoint in the same script as the events before it. A lapsed heartbeat puts the run back on the queue instead of
failing it (the sweepers send its task message again), and the claim that
picks it up gets the checkpoint: the loop is built from the same committed
history, restored through ``BareLoop.start(resume=...)``, its events numbered
on from the stream's last seq after a ``run_resumed`` event, and the steers
the checkpoint had not delivered are fed again. On a warm shutdown
(``WorkerHost.draining``) the run is handed back at its next boundary, or
from its last checkpoint once ``drain_timeout`` has passed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import threading
import time
import uuid
from typing import Any, Callable, List, Optional, Sequence, Tuple

import attrs

from loopctl.checks import shown
from loopctl.config import RunConfig
from loopctl.driver.checkpoint import Checkpoint, ResumePoint
from loopctl.driver.handle import RunHandle
from loopctl.driver.loop import BareLoop
from loopctl.errors import Cancelled, ConfigError, LoopError
from loopctl.events import RunEnd
from loopctl.hosting.serialization import (
    history_from_dict,
    history_to_dict,
)
from loopctl.messages import Message
from loopctl.records import Run
from loopctl.sessions.base import Session, SessionSnapshot, SessionStore

from . import approvals as approvals
from .bridge import Bridge, SteerFeed
from .durable import (
    HANDED_BACK,
    WorkerHost,
    checkpoint_from_json,
    checkpoint_trace,
    checkpointer,
    hand_back,
    wait_or_drain,
)
from .events import EventWriter, WorkerSettings
from .redis import Claim, RedisBackend, RegistryUnavailable, dumps
from .steers import Steer, steer_from_json, steer_json
from .task import propagation

log = logging.getLogger("loopctl")

def resolve_factory(spec: str) -> Callable[..., object]:
    """Import ``"pkg.module:attr"`` (``attr`` may be dotted).

    Raises:
        ConfigError: a malformed spec, or an import or lookup that failed.
    """
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"loop_factory must look like 'pkg.module:factory', got {spec!r}")
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import loop_factory {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not callable(obj):
        raise ConfigError(f"loop_factory {spec!r} is not callable: {shown(obj)}")
    return obj


def _build_loop(
    claim: Claim,
    conversation: str,
    saved: Optional[Checkpoint],
    steer_base: int,
    sessions: Any = None,
    owner: Optional[str] = None,
    kept: Sequence[Steer] = (),
) -> Tuple[BareLoop, SteerFeed]:
    session: Optional[Session] = None
    snapshot = SessionSnapshot(0, None, [])
    if sessions is not None:
        # The run's owner's session only: another owner's conversation is an unknown id.
        session = sessions.session(conversation, owner=owner)
        snapshot = session.read()
    if saved is not None and saved.history is not None:
        history = list(saved.history)  # the run compacted: its own history goes on
    elif session is not None:
        history = snapshot.messages
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
        pending = [steer_from_json(s) for s in claim.steers[steer_base:]]
        feed = SteerFeed(loop.steering(), pending, kept)
        loop.with_contributor(feed)
        if session is not None:
            # The run holds its lease; finalize writes it.
            loop.with_session(session, revision=snapshot.revision, incarnation=snapshot.incarnation)
    except BaseException:
        loop.close()
        raise
    return loop, feed


def _claim(
    backend: RedisBackend, run_id: str, settings: WorkerSettings, worker: str
) -> Optional[Tuple[str, Bridge, Claim]]:
    """The run claimed here (its fencing token, its listening bridge, the claim); None: not queued any more."""
    token = uuid.uuid4().hex
    bridge = Bridge(backend, run_id)
    try:
        claim = backend.claim(run_id, token, settings.ttl_ms, worker)
    except BaseException:
        bridge.close()
        raise
    if claim is None:
        bridge.close()
        return None
    bridge.cursor = len(claim.steers)
    return token, bridge, claim


def execute_run(
    backend: RedisBackend,
    run_id: str,
    conversation: str,
    settings: WorkerSettings,
    worker: str,
    host: Optional[WorkerHost] = None,
    sessions: Optional[SessionStore] = None,
) -> str:
    """Claim and execute one queued run here; returns what happened (for logs).

    With ``sessions`` (a session store) the conversation is that store's
    session: loaded from it, written to it by the loop's ``finalize``, and
    never committed to the registry's history key.

    Returns:
        ``"skipped"`` (not queued any more), ``"completed"``, ``"cancelled"``,
        ``"failed"``, ``"lost"`` (fenced out: another process declared it
        lost), or ``"handed back"`` (a warm shutdown requeued it).

    Raises:
        RegistryUnavailable: Redis failed before the run was claimed.
    """
    if backend.state(run_id) != "queued":
        return "skipped"  # a duplicate message (cheap: no subscription); the claim re-checks
    claimed = _claim(backend, run_id, settings, worker)
    if claimed is None:
        return "skipped"
    token, bridge, claim = claimed
    writer = EventWriter(
        backend, run_id, token, attrs.evolve(settings, event_buffer=claim.event_buffer), claim.seq
    )
    writer.start()
    handed = threading.Event()
    try:
        owner = backend.owner(run_id) if sessions is not None else None
        end = _at_end(backend, run_id, token)
        st = _launch(claim, conversation, sessions, owner, writer, host, handed, run_id, end)
        if st.handle is not None:
            _watch(st, claim, writer, bridge, host, handed)
    finally:
        writer.stop()
        bridge.stop()
    try:
        if handed.is_set():
            return hand_back(backend, run_id, token, writer, host)
        fields, left = st.ending(run_id, claim, writer, bridge.cursor, sessions)
        if writer.lost:
            return "lost"
        if sessions is not None:
            # A cancelled run gives its lease back on the lease's own thread: the
            # next run, on any worker, is let in by _finish only once it has.
            sessions.wait_given_back(conversation)
        return _finish(backend, run_id, token, fields, left)
    finally:
        if st.handle is not None:
            approvals.drop(backend, run_id)
        if st.loop is not None:
            st.loop.close()


@attrs.define
class _Launch:
    """What starting a claimed run produced; a setup failure leaves ``handle`` None and sets ``error``."""

    steer_base: int = 0
    kept: Tuple[Steer, ...] = ()  # sub-agent guidance an earlier attempt refused (its checkpoint's)
    loop: Optional[BareLoop] = None
    feed: Optional[SteerFeed] = None
    handle: Optional[RunHandle] = None
    config: Optional[RunConfig] = None
    error: Optional[LoopError] = None

    def record(self, run_id: str, claim: Claim) -> Run:
        """The run's record; for a run that never started, one that ends with the setup error."""
        if self.handle is not None:
            return self.handle.record
        run = Run(id=run_id, input=claim.input, config=self.config or RunConfig())
        run.end = time.time()
        run.stop_reason = self.error
        return run

    def ending(
        self, run_id: str, claim: Claim, writer: EventWriter, cursor: int, sessions: Any
    ) -> Tuple[List[str], List[str]]:
        """The run's end fields for the registry, and its undelivered steering."""
        run = self.record(run_id, claim)
        loop = self.loop
        session = loop.session.id if loop is not None else ""
        left = self.leftovers(claim)
        keep_history = loop is not None and run.stop_reason is None and sessions is None
        history = loop.conversation() if keep_history and loop is not None else None
        fields = _end_fields(run, writer, cursor, session, history, self.handle is not None)
        fields[-1] = repr(claim.started_at)  # a resumed run keeps its first start
        return fields, left

    def leftovers(self, claim: Claim) -> List[str]:
        """Steering the run did not deliver, as stored JSON."""
        if self.feed is not None:
            return [steer_json(m) for m in self.feed.leftovers()]
        # Never built: what the checkpoint still owed, and the claimed steers as they came.
        return [steer_json(m) for m, _ in self.kept] + list(claim.steers[self.steer_base:])


def _watch(
    st: _Launch, claim: Claim, writer: EventWriter, bridge: Bridge, host: Optional[WorkerHost],
    handed: threading.Event,
) -> None:
    """Relay the started run's steering and heartbeats until it ends (or a warm shutdown hands it back)."""
    handle, feed = st.handle, st.feed
    assert handle is not None and feed is not None
    writer.attach(handle)
    bridge.start(handle, feed)
    writer.on_beat = bridge.poke
    if claim.resume == "on_worker_loss" and host is not None:
        wait_or_drain(handle, writer, host, handed)
    else:
        handle.wait()


def _launch(
    claim: Claim,
    conversation: str,
    sessions: Any,
    owner: Optional[str],
    writer: EventWriter,
    host: Optional[WorkerHost],
    handed: threading.Event,
    run_id: str,
    at_end: Callable[[], Optional[Cancelled]],
) -> _Launch:
    """Build the claimed run's loop and start it; a failure to do so is the run's error, logged."""
    st = _Launch()
    durable = claim.resume == "on_worker_loss"
    saved: Optional[Checkpoint] = None
    clean = False
    try:
        if claim.checkpoint:
            got = checkpoint_from_json(claim.checkpoint)
            saved, st.steer_base, clean, st.kept = got.checkpoint, got.steers, got.clean, got.kept
        st.config = RunConfig.from_dict(json.loads(claim.config)) if claim.config else None
        st.loop, st.feed = _build_loop(claim, conversation, saved, st.steer_base, sessions, owner, st.kept)
        loop = st.loop
        if claim.cancel:
            loop.cancel_signal().cancel(claim.reason)  # observed by the next run: no model call
        sink = checkpointer(loop, writer, st.steer_base, host, handed, run_id, st.feed.settled) if durable else None
        point = ResumePoint(saved, claim.resumes, claim.cause, clean) if claim.resumes > 0 else None
        # A resumed run continues the trace its checkpoint carries (the run thread copies it).
        with _resumed_trace(claim.checkpoint if point is not None else ""):
            st.handle = loop.start(
                claim.input, st.config, run_id, tap=writer.tap, checkpoint=sink, resume=point, at_end=at_end
            )
    except Exception as exc:
        msg = f"could not start the run: {type(exc).__name__}: {exc}"
        st.error = exc if isinstance(exc, LoopError) else LoopError(msg)
        if st.error is not exc:
            st.error.__cause__ = exc
        log.error("run %s: %s", run_id, msg)
        # The run ends here: its ending point, as a started run's (a cancel taken meanwhile ends it cancelled).
        st.error = at_end() or st.error
    return st


def _at_end(backend: RedisBackend, run_id: str, token: str) -> Callable[[], Optional[Cancelled]]:
    """The run's ``at_end`` hook: its ending point, decided in one step with Redis (``ENDING``)."""

    def at_end() -> Optional[Cancelled]:
        try:
            cancelled, reason = backend.ending(run_id, token)
        except RegistryUnavailable as exc:
            # Taken as not cancelled: the run goes on to its end and FINISH records
            # it (or, if Redis stays away, the run is declared lost). Left unmarked,
            # a cancel accepted meanwhile comes too late for the run: the one gap.
            log.warning("run %s: could not record its ending point: %s", run_id, exc)
            return None
        return Cancelled(reason) if cancelled else None

    return at_end


def _resumed_trace(checkpoint: str) -> Any:
    """The checkpoint's trace context made current (a no-op without one, or without OpenTelemetry)."""
    carrier = propagation() if checkpoint else None
    trace = checkpoint_trace(checkpoint) if carrier is not None else None
    if carrier is None or trace is None:
        return contextlib.nullcontext()
    return carrier.attached(trace)


def _end_fields(
    run: Run,
    writer: EventWriter,
    cursor: int,
    session: str,
    history: Optional[List[Message]],
    started: bool,
) -> List[Any]:
    """The FINISH script's fields (see ``scripts.FINISH``), state first."""
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
            None if err is None else type(err).__name__,
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
    "execute_run",
    "resolve_factory",
]
