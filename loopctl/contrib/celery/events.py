"""The run's events thread on a worker: numbered events, heartbeats, checkpoints, fencing.

``EventWriter.tap`` (the run's thread) numbers each event and queues it; the
thread ``loopctl-celery-events-<id>`` batches the queue into one Redis step
(``APPEND``) together with the latest checkpoint, so the stream and the
checkpoint never disagree, and heartbeats the run. A refused write (the run
was declared lost or handed to another worker) fences this worker out: it
cancels its local run and writes nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs

from loopctl.driver.handle import RunHandle
from loopctl.events import Event, RunEnd, SteeringDelivered

from . import approvals as approvals
from .redis import RedisBackend, RegistryUnavailable, dumps

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


@attrs.frozen
class _Lease:
    """The claimed run as the writer addresses it: where, under which fencing token, on what heartbeat terms."""

    backend: RedisBackend
    run_id: str
    token: str
    settings: WorkerSettings


class EventWriter:
    """The run's events thread: heartbeats and batched event appends."""

    def __init__(
        self, backend: RedisBackend, run_id: str, token: str, settings: WorkerSettings, first_seq: int = 0
    ) -> None:
        self._lease = _Lease(backend, run_id, token, settings)
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
            own = not event.subagent  # a sub-agent's event: not this run's session, steers or end
            if own:
                self.session_id = event.session_id
            if own and type(event) is SteeringDelivered:
                self.delivered += len(event.messages)
            if own and type(event) is RunEnd:
                self.end = (self._seq, event.to_dict())
            else:
                q = self._queue
                if len(q) >= self._lease.settings.event_buffer:
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
        return self._lease.settings.heartbeat_ttl

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
            log.warning("run %s: fenced out (declared lost); cancelling it here", self._lease.run_id)
        self.lost = True
        with self._cond:
            written, self._written = self._written, []
        for w in written:
            w.set()
        h = self._handle
        if h is not None:
            h.cancel("worker lost: the run's heartbeat lapsed")

    def _main(self) -> None:
        interval = self._lease.settings.heartbeat_interval
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
                    # The pending list first: whoever reads an approval event finds it mirrored.
                    approvals.mirror(self._lease.backend, self._lease.run_id, batch)
                    if not self._lease.backend.append(self._lease.run_id, self._lease.token, self.progress(), data, ckpt):
                        self._fenced_out()
                    failures = 0
                    for w in written:
                        w.set()
                    written = []
                except RegistryUnavailable as exc:
                    ok = False
                    failures += 1
                    log.warning("run %s: events not written yet: %s", self._lease.run_id, exc)
                    with self._cond:  # keep them, in order, for the next try
                        self._queue[:0] = batch
                        del self._queue[: max(0, len(self._queue) - self._lease.settings.event_buffer)]
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
                        beat = self._lease.backend.heartbeat(self._lease.run_id, self._lease.token, self._lease.settings.ttl_ms)
                    except RegistryUnavailable as exc:
                        log.warning("run %s: heartbeat failed: %s", self._lease.run_id, exc)
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


__all__ = ["LINGER_S", "EventWriter", "WorkerSettings"]
