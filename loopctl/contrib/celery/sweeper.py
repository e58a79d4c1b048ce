"""A worker process's sweeper: liveness, reaping, and (re)sending task messages.

Lost runs used to be noticed only when someone looked (any registry call
reaps a run whose heartbeat lapsed). A durable run must move on by itself,
so every Celery worker process runs one sweeper thread per registry
(``loopctl-celery-sweeper-<prefix>``, started when the worker is ready,
stopped when it shuts down). Each ``heartbeat_interval`` one Lua step
(``scripts.SWEEP``) marks this process alive, reaps every live run
(a lapsed durable run goes back on the queue and into the outbox), puts in
the outbox any queued run whose task message a now-dead worker process had
reserved, and leases the outbox's due entries to this caller, which sends
their task messages. A lease that is never followed by a claim comes due
again after ``lease_s``, so a message lost with its sender is sent again;
a duplicate is harmless (claims are atomic). The broker's visibility
timeout is never what brings a run back.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from .redis import RESEND_LEASE_S, RedisBackend

log = logging.getLogger("loopctl")


class Sweeper:
    """One registry's sweeper in a worker process.

    Args:
        backend: the registry's Redis side.
        send: ``send(run_id, conversation, queue_or_None)`` sends a task message.
        worker: this process's name (host:pid), as claims record it.
        interval: seconds between steps (the heartbeat interval).
        ttl_ms: how long this process counts as alive after a step.
        name: the thread's name.
    """

    def __init__(
        self,
        backend: RedisBackend,
        send: Callable[[str, str, Optional[str]], None],
        worker: str,
        interval: float,
        ttl_ms: int,
        name: str,
    ) -> None:
        self._backend = backend
        self._send = send
        self.worker = worker
        self._interval = interval
        self._ttl_ms = ttl_ms
        self._name = name
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Start the thread (idempotent)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            t = threading.Thread(target=self._main, name=self._name, daemon=True)
            self._thread = t
            t.start()

    def stop(self) -> None:
        """Stop and join the thread (idempotent)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self._interval + self._backend.socket_timeout + 1.0)

    def reserved(self, run_id: str) -> None:
        """The run's task message reached this process: note it, and that we are alive."""
        self._backend.reserve(run_id, self.worker, self._ttl_ms)

    def step(self) -> int:
        """One sweep; returns how many task messages it sent."""
        lease = int(RESEND_LEASE_S * 1000)
        due = self._backend.sweep(self.worker, self._ttl_ms, lease)
        for rid, conv, queue in due:
            self._send(rid, conv, queue or None)
        return len(due)

    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # Redis or the broker hiccupped: try next interval
                log.warning("loopctl sweeper %s: %s: %s", self._name, type(exc).__name__, exc)
            self._stop.wait(self._interval)


__all__ = ["RESEND_LEASE_S", "Sweeper"]
