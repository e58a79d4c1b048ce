"""``CeleryRunRegistry``: the ``RunRegistry`` API with runs on Celery workers, state in Redis.

The web side of the package: the guarantees it keeps are listed in the
package's docstring (``loopctl.contrib.celery``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from loopctl.checks import integer, shown
from loopctl.config import RunConfig
from loopctl.driver.signals import guidance
from loopctl.errors import ConfigError, LoopBusy, LoopError
from loopctl.hosting.registry import RunStatus
from loopctl.messages import Message
from loopctl.records import Run
from loopctl.sessions.base import SessionStore

from .approvals import ApprovalsMixin
from .options import (
    checked_run,
    duration,
    factory_spec,
    max_resumes_of,
    resume_mode_of,
)
from .reads import (
    check_owner,
    fields_of,
    follow_events,
    history_of,
    is_run_id,
    leftovers_of,
    list_statuses,
    status_of,
    wait_result,
)
from .redis import QueuedRun, RedisBackend, RegistryUnavailable, WorkerLost, dumps
from .steers import check_target, steer_json
from .sweeper import Sweeper
from .task import REGISTRIES, TASK_NAME, propagation, task_for
from .worker import WorkerHost, WorkerSettings, execute_run


class CeleryRunRegistry(ApprovalsMixin):
    """Runs on Celery workers, addressed by id from any process; the in-process registry's guarantees hold.

    Args:
        app: the Celery app (its broker carries the tasks).
        redis_url: the Redis holding runs, events and histories (may be the broker).
        loop_factory: ``"pkg.module:factory"`` (or a module-level function),
            importable by the workers: ``factory(conversation, history) ->
            BareLoop``, building the loop with ``BareLoop.from_history``.
        prefix: key prefix in Redis; registries that share it share runs.
        queue: the Celery queue to send runs to (default: the app's).
        event_buffer: events kept per run (a consumer further behind gets a ``gap``).
        keep_finished_s: seconds a finished run stays queryable.
        heartbeat_interval: seconds between a worker's heartbeats.
        heartbeat_ttl: seconds without a heartbeat after which the run is lost
            (at least twice the interval).
        queue_timeout: seconds a queued run holds its conversation's lock
            before a worker must have picked it up.
        socket_timeout: seconds for connecting to Redis and for each reply.
        resume: ``"on_worker_loss"`` makes runs durable: checkpointed at each
            turn boundary, resumed on another worker after a worker loss, handed
            back on a warm shutdown. None (or ``"never"``): at most once, a lost
            worker fails its run (``WorkerLost``). ``start`` may override it.
        max_resumes: worker losses a durable run survives; one more fails it
            with ``WorkerLost``. Hand-backs on shutdown do not count.
        drain_timeout: seconds a draining worker (warm shutdown) waits for a
            durable run to reach a turn boundary before handing it back from
            its last checkpoint.
        session_store: keep conversations in this session store (a
            ``loopctl.sessions.RedisSessionStore``, constructed alike in the
            web processes and the workers) instead of the registry's own
            history keys: the conversation key is the session id, any worker
            continues any conversation, and each run holds the session's
            lease, so a run on it anywhere else (a local ``BareLoop``) is
            ``SessionBusy``.

    Raises:
        ConfigError: a bad argument (the message names it and its value).
        RegistryUnavailable: a malformed Redis URL.
    """

    def __init__(
        self,
        app: object,
        redis_url: str,
        loop_factory: Union[str, Callable[..., object]],
        *,
        prefix: str = "loopctl",
        queue: Optional[str] = None,
        event_buffer: int = 10_000,
        keep_finished_s: float = 600,
        heartbeat_interval: float = 1.0,
        heartbeat_ttl: float = 5.0,
        queue_timeout: float = 3600,
        socket_timeout: float = 5.0,
        resume: Optional[str] = None,
        max_resumes: int = 3,
        drain_timeout: float = 30.0,
        session_store: Optional[SessionStore] = None,
    ) -> None:
        if not isinstance(redis_url, str) or not redis_url:
            raise ConfigError(f"CeleryRunRegistry redis_url must be a non-empty str, got {type(redis_url).__name__}")
        if not isinstance(prefix, str) or not prefix or ":" in prefix:
            raise ConfigError(f"CeleryRunRegistry prefix must be a non-empty str without ':', got {shown(prefix)}")
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ConfigError(f"CeleryRunRegistry queue must be a non-empty str or None, got {shown(queue)}")
        integer(event_buffer, "CeleryRunRegistry.event_buffer", 1)
        keep = duration("keep_finished_s", keep_finished_s, 0.001)
        interval = duration("heartbeat_interval", heartbeat_interval, 0.01)
        ttl = duration("heartbeat_ttl", heartbeat_ttl, 0.02)
        if ttl < 2 * interval:
            raise ConfigError(
                f"CeleryRunRegistry.heartbeat_ttl must be at least twice heartbeat_interval "
                f"({shown(heartbeat_interval)}), got {shown(heartbeat_ttl)}"
            )
        qtimeout = duration("queue_timeout", queue_timeout, 0.001)
        stimeout = duration("socket_timeout", socket_timeout, 0.01)
        self._resume = resume_mode_of(resume)
        self._max_resumes = max_resumes_of(max_resumes)
        drain = duration("drain_timeout", drain_timeout, 0.0)
        self._factory = factory_spec(loop_factory)
        if session_store is not None and not hasattr(session_store, "session"):
            raise ConfigError(f"CeleryRunRegistry session_store must be a session store, got {shown(session_store)}")
        self.session_store = session_store
        self._app = app
        self._prefix = prefix
        self._queue = queue
        self._queue_ms = max(1, int(qtimeout * 1000))
        self._settings = WorkerSettings(interval, ttl, event_buffer)
        self._slice = max(0.05, min(1.0, ttl / 4))
        self._backend = RedisBackend(redis_url, prefix, event_buffer, keep, stimeout, self._slice)
        self._task = task_for(app)
        self._worker = f"{socket.gethostname()}:{os.getpid()}"
        self._host = WorkerHost(drain, self._kick)
        self._sweeper = Sweeper(
            self._backend, self._send, self._worker, interval, self._settings.ttl_ms,
            f"loopctl-celery-sweeper-{prefix}",
        )
        REGISTRIES[prefix] = self

    # -- starting ----------------------------------------------------------------------

    def start(
        self,
        conversation: str,
        input: str,
        config: Optional[RunConfig] = None,
        run_id: Optional[str] = None,
        *,
        resume: Optional[str] = None,
        max_resumes: Optional[int] = None,
        output_type: object = None,
        owner: Optional[str] = None,
    ) -> str:
        """Queue a run of the conversation on the workers.

        Args:
            conversation: the conversation's key (its history lives in Redis).
            input: the user's input.
            config: the run's configuration.
            run_id: the id to use (default: a fresh uuid hex).
            resume: this run's ``resume`` (``"on_worker_loss"`` or
                ``"never"``; default: the registry's).
            max_resumes: this run's ``max_resumes`` (default: the registry's).
            output_type: ask for a typed answer (sets ``config.output_type``);
                a class must be importable by the workers (module level), a
                JSON Schema dict travels as itself. ``result()`` rebuilds the
                class; ``status()`` carries the answer's JSON form.
            owner: who may address the run (e.g. a web session's user id, a
                non-empty str). Every by-id method finds an owned run only
                when passed the same ``owner``; for anyone else it is an
                unknown id. ``list(owner=...)`` shows only that owner's runs.

        With OpenTelemetry installed, the caller's current trace context
        (W3C ``traceparent``) travels with the run and is current around it
        on the worker, so the run's spans join the caller's trace.

        Returns:
            The run's id (its ``Run.id`` on the worker).

        Raises:
            LoopBusy: the conversation has a run queued or in flight.
            LoopError: ``run_id`` is already registered.
            RegistryUnavailable: Redis or the broker could not be reached
                (a run recorded before the broker failed is failed at once).
        """
        config = checked_run(conversation, input, config, output_type)
        rid = uuid.uuid4().hex if run_id is None else run_id
        if not is_run_id(rid):
            raise ConfigError(f"run_id must be a non-empty str without ':', got {shown(run_id)}")
        who = check_owner(owner) or ""
        mode = self._resume if resume is None else resume_mode_of(resume)
        bound = self._max_resumes if max_resumes is None else max_resumes_of(max_resumes)
        cfg = dumps(config.to_dict()) if config is not None else ""
        res = self._backend.start(
            QueuedRun(rid, conversation, input, cfg, self._factory, self._queue_ms, mode, bound, self._queue or "", who)
        )
        self._check_started(res, rid, conversation, who)
        self._enqueue(rid, conversation)
        return rid

    def _check_started(self, res: List[str], rid: str, conversation: str, who: str) -> None:
        """Raise when the backend refused the start: a duplicate id, or a busy conversation."""
        if res[0] == "dup":
            raise LoopError(f"run id {rid!r} is already registered")
        if res[0] == "busy":
            # Name the run in the way only to the owner who could address it.
            holder = res[1] if self._backend.status(res[1]).get("owner") == (who or None) else "another owner's"
            raise LoopBusy(
                f"conversation {conversation!r} already has a run in flight ({holder}); run not started"
            )

    def _enqueue(self, rid: str, conversation: str) -> None:
        """Send the recorded run's task with the caller's trace context; a broker failure fails the run."""
        carrier = propagation()
        trace = carrier.current_carrier() if carrier is not None else None
        try:
            self._send(rid, conversation, self._queue, trace or None)
        except Exception as exc:
            text = f"could not enqueue run {rid} on the Celery broker: {type(exc).__name__}"
            try:
                self._backend.abort(rid, text)
            except RegistryUnavailable:
                pass  # the lock expires after queue_timeout
            raise RegistryUnavailable(text) from exc

    def _send(
        self, run_id: str, conversation: str, queue: Optional[str], trace: Optional[Dict[str, str]] = None
    ) -> None:
        """Send the run's task message (a duplicate is harmless: claims are atomic).

        ``trace`` (the starter's W3C trace context) rides on the first message
        only: a run sent again by a sweeper starts its own trace.
        """
        options: Dict[str, Any] = {
            "kwargs": {"run_id": run_id, "prefix": self._prefix, "conversation": conversation},
            "task_id": run_id,
            "retry": True,
            "retry_policy": {"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
        }
        if queue:
            options["queue"] = queue
        if trace:
            options["kwargs"]["trace"] = trace  # the worker's spans join the caller's trace
        self._task.apply_async(**options)

    # -- driving a run ---------------------------------------------------------------------

    def steer(
        self, run_id: str, message: Union[Message, str], *, owner: Optional[str] = None, to: Optional[str] = None
    ) -> bool:
        """Offer guidance to the run; False once it has ended.

        Accepted guidance is delivered at the run's next turn boundary (at
        its first, if the run has not started yet) or returned by
        ``leftovers(run_id)`` once the run has ended.

        With ``to`` (a sub-agent's name, or a path like ``"research/search"``)
        the worker hosting the run hands it to that sub-agent's run in
        flight, to land at its next turn boundary. Whether such a run is in
        flight is only known on the worker, so True still means "accepted
        for the run": guidance whose sub-agent is not in flight when the
        worker reads it (not started yet, or already ended) is never given
        to the parent; it is returned by ``leftovers(run_id)`` once the run
        has ended, like guidance the sub-agent's run never reached.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            ConfigError: (a ``ValueError``) ``to`` is not a non-empty str of
                "/"-separated names.
            TypeError, ValueError: not guidance (``loopctl.driver.signals.guidance``).
            RegistryUnavailable: Redis could not be reached.
        """
        message = guidance(message)
        self._fields(run_id, owner)  # a run's owner never changes: checked once, before acting
        target = check_target(to)  # after the id: an unknown one is a KeyError first, as in process
        got = self._backend.steer(run_id, steer_json(message, target))
        if got < 0:
            raise KeyError(f"unknown run id {run_id!r}")
        return got == 1

    def cancel(self, run_id: str, reason: Optional[str] = None, *, owner: Optional[str] = None) -> bool:
        """Cancel the run (only that run); False if it has already ended.

        A run not yet picked up by a worker ends ``Cancelled`` as soon as one
        does, without calling the model.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            RegistryUnavailable: Redis could not be reached.
        """
        self._fields(run_id, owner)
        got = self._backend.cancel(run_id, reason)
        if got < 0:
            raise KeyError(f"unknown run id {run_id!r}")
        return got == 1

    # -- looking at runs -----------------------------------------------------------------------


    def status(self, run_id: str, *, owner: Optional[str] = None) -> RunStatus:
        """A snapshot of the run (a queued run is ``"running"``).

        Raises:
            KeyError: unknown (or expired) ``run_id``, or another ``owner``'s run.
            RegistryUnavailable: Redis could not be reached.
        """
        return status_of(self._backend, run_id, owner)

    def result(self, run_id: str, timeout: Optional[float] = None, *, owner: Optional[str] = None) -> Run:
        """The finished ``Run`` (as ``RunHandle.result``), waiting without polling.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            LoopError: the run's error (``Cancelled``, ``WorkerLost``, ...; ``.run`` set).
            TimeoutError: not finished within ``timeout`` seconds.
            RegistryUnavailable: Redis could not be reached.
        """
        return wait_result(self._backend, run_id, timeout, self._slice, owner)

    def leftovers(self, run_id: str, *, owner: Optional[str] = None) -> List[Message]:
        """The run's guidance that was accepted but never delivered.

        Empty while the run is in flight; in push order once it ended.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run.
            RegistryUnavailable: Redis could not be reached.
        """
        return leftovers_of(self._backend, run_id, owner)

    def list(self, *, owner: Optional[str] = None, all_owners: bool = False) -> List[RunStatus]:
        """Status of the caller's known runs (started by any process), oldest first.

        Args:
            owner: list exactly the runs started with this ``owner``; None
                lists only the runs started without one.
            all_owners: list every owner's runs (an operator's view; never
                derive it from a request).
        """
        return list_statuses(self._backend, owner, all_owners)

    def history(self, conversation: str, *, owner: Optional[str] = None) -> List[Message]:
        """The conversation's committed history (empty for a new conversation).

        With a session store, only ``owner``'s session is read: another
        owner's conversation raises ``KeyError``, as an unknown run id does.
        """
        if self.session_store is not None:
            return list(self.session_store.session(conversation, owner=owner).messages())
        return history_of(self._backend, conversation)

    def events(
        self, run_id: str, after: int = 0, timeout: Optional[float] = None, *, owner: Optional[str] = None
    ) -> Iterator[Tuple[int, Dict[str, Any]]]:
        """Follow the run's events: ``(seq, event_dict)`` with ``seq > after``.

        As ``RunRegistry.events``: seqs start at 1, the iterator ends after
        ``run_end``, a consumer behind the buffer first gets a ``gap`` event,
        and ``timeout`` bounds the wait for each next event.

        Raises:
            KeyError: unknown ``run_id``, or another ``owner``'s run (at once,
                not on first ``next``).
            RegistryUnavailable: Redis could not be reached (also while iterating).
        """
        fields = self._fields(run_id, owner)
        return follow_events(self._backend, run_id, max(0, int(after)), timeout, fields, self._slice)

    # -- the worker's side -------------------------------------------------------------------

    def execute(self, run_id: str, conversation: str) -> str:
        """Claim and execute a queued run in this process (the Celery task calls this).

        Returns:
            What happened: ``"skipped"``, ``"completed"``, ``"cancelled"``,
            ``"failed"`` or ``"lost"``.
        """
        if self._host.draining.is_set():  # shutting down: leave it to another worker
            self._backend.resend_soon(run_id)
            self._kick()
            return "skipped"
        return execute_run(
            self._backend, run_id, conversation, self._settings, self._worker, self._host, self.session_store
        )

    @property
    def app(self) -> object:
        """The Celery app the registry sends runs with."""
        return self._app

    def reserved(self, run_id: str) -> None:
        """The run's task message reached this worker process (Celery's ``task_received``)."""
        self._sweeper.reserved(run_id)

    def start_sweeper(self) -> None:
        """Start this process's sweeper (a Celery worker does it when it is ready; see
        ``sweeper``)."""
        self._sweeper.start()

    def stop_sweeper(self) -> None:
        """Stop and join this process's sweeper (idempotent)."""
        self._sweeper.stop()

    def drain(self) -> None:
        """Warm shutdown: hand durable runs back at their next boundary; claim no new ones."""
        self._host.draining.set()

    def _kick(self) -> None:
        self._sweeper.step()

    # -- housekeeping ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the Redis connections (runs on the workers are not affected)."""
        self._backend.close()

    def __enter__(self) -> CeleryRunRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CeleryRunRegistry prefix={self._prefix!r} redis={self._backend.url}>"

    def _fields(self, run_id: str, owner: Optional[str] = None) -> Dict[str, str]:
        return fields_of(self._backend, run_id, owner)


__all__ = [
    "TASK_NAME",
    "CeleryRunRegistry",
    "RegistryUnavailable",
    "WorkerLost",
]
