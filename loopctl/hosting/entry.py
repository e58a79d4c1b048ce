"""One registered run as the registry keeps it: ``RunStatus`` and the entry.

An entry holds the run's handle, its event buffer (the tap, on the run's
thread, only appends to it and releases parked followers) and its
leftovers. Once the run has ended and its thread is done, ``compact()``
keeps only what ``status``, ``result``, ``leftovers`` and ``events`` need
(``_Final``), so a finished run costs a few KiB and holds no loop.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

import attrs

from loopctl.approvals import ApprovalDecision, PendingApproval
from loopctl.driver.handle import run_threads
from loopctl.errors import Cancelled, LoopError, release_frames
from loopctl.events import Event, RunEnd
from loopctl.messages import Message
from loopctl.records import Run, json_form
from loopctl.text import json_safe, redact, redact_value

if TYPE_CHECKING:
    from loopctl.driver.handle import RunHandle
    from loopctl.driver.loop import BareLoop

log = logging.getLogger("loopctl")


def same_owner(a: Optional[Hashable], b: Optional[Hashable]) -> bool:
    """True when ``a`` and ``b`` name the same owner: equal and of one type (``0``, ``False`` and ``0.0`` differ)."""
    return type(a) is type(b) and a == b


@attrs.frozen
class RunStatus:
    """A snapshot of one registered run.

    Attributes:
        run_id: the run's id (its ``Run.id``).
        state: ``"running"``, ``"completed"``, ``"cancelled"`` or ``"failed"``.
        output: the final answer (None unless completed).
        error: the error text of a cancelled or failed run, else None.
        turns: model calls made so far.
        tool_calls: tool calls the model asked for so far.
        input_tokens: input tokens reported so far.
        output_tokens: output tokens reported so far.
        started_at: wall-clock start (``time.time()``).
        ended_at: wall-clock end, None while running.
        resumes: times the run moved to another worker and continued from
            its last checkpoint (durable runs of ``CeleryRunRegistry``).
        resume_cause: why it last moved (None if it never did).
        output_value: a typed run's answer in its JSON form (None unless
            completed with an ``output_type``).
        pending_approvals: tool calls waiting for a person's answer now.
        approvals: the approval decisions so far (calls still waiting when
            the run ended are here, denied "run ended").
    """

    run_id: str
    state: str
    output: Optional[str]
    error: Optional[str]
    turns: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    started_at: float
    ended_at: Optional[float]
    resumes: int = 0
    resume_cause: Optional[str] = None
    output_value: object = None
    pending_approvals: Tuple[PendingApproval, ...] = ()
    approvals: Tuple[ApprovalDecision, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-safe dict of the fields (texts masked, floats finite)."""
        out: Dict[str, Any] = json_safe(redact_value(attrs.asdict(self)))
        return out


class _Final:
    """What a finished run keeps once compacted: no loop, no thread, no handle."""

    __slots__ = ("status", "run", "error")

    def __init__(self, status: RunStatus, run: Run, error: Optional[LoopError]) -> None:
        self.status = status
        self.run = run
        self.error = error


class _Entry:
    """One registered run: its handle, event buffer and leftovers.

    Waiters of ``events()`` park on a lock of their own in ``waiters``; the
    tap releases them, and costs nothing more when nobody waits. Once the
    run has ended and its thread is done, ``compact()`` keeps only what
    ``status``, ``result``, ``leftovers`` and ``events`` need.
    """

    __slots__ = (
        "run_id",
        "session_id",
        "loop",
        "handle",
        "lock",
        "waiters",
        "buf",
        "seq",
        "ended",
        "leftovers",
        "owner",
        "final",
        "_ending",
        "_clock",
    )

    def __init__(
        self,
        run_id: str,
        loop: BareLoop,
        size: int,
        ending: deque[Tuple[float, _Entry]],
        clock: Callable[[], float],
    ) -> None:
        self.run_id = run_id
        self.session_id = loop.session.id
        self.loop: Optional[BareLoop] = loop
        self.handle: Optional[RunHandle] = None
        self.lock = threading.Lock()
        self.waiters: Optional[List[Any]] = None  # parked follower locks, released by the tap
        # Events only (no (seq, event) tuples: half the objects the cyclic GC
        # must walk); the newest has seq ``self.seq``, the rest count down.
        self.buf: Union[deque[Event], Tuple[Event, ...]] = deque(maxlen=size)
        self.seq = 0
        self.ended = False
        self.leftovers: Sequence[Message] = ()
        self.owner: Optional[Hashable] = None
        self.final: Optional[_Final] = None
        self._ending = ending
        self._clock = clock

    def tap(self, event: Event) -> None:
        """The run's tap (on the run's thread): append, wake followers, nothing else."""
        with self.lock:
            if self.ended:  # run_end is the last event; a stray later one is dropped
                return
            self.seq += 1
            self.buf.append(event)  # type: ignore[union-attr]
            if type(event) is RunEnd and not event.subagent:  # a sub-agent's run_end is not ours
                # The slot was sealed just before run_end and no new run can
                # open it until this one has left finalize: these are ours.
                loop = self.loop
                assert loop is not None
                self.leftovers = loop.steering().take_leftovers() or ()
                self.ended = True
                try:
                    ended_at = self._clock()
                except Exception:  # a broken injected clock must not lose the wake-up
                    log.exception("RunRegistry clock raised; run %s is pruned early", self.run_id)
                    ended_at = -math.inf
                self._ending.append((ended_at, self))
            waiters = self.waiters
            if waiters is not None:
                self.waiters = None
                for waiter in waiters:
                    waiter.release()

    def queued(self) -> Tuple[int, List[Message]]:
        """``(seq, guidance)``: the run's undelivered guidance and its last event before it.

        Call with the registry's lock held, so the loop's open slot is this
        run's. The seq is read first: guidance still queued after that read
        is delivered in a ``steering`` event emitted later, so with a greater seq.
        """
        with self.lock:
            seq, loop = self.seq, (None if self.ended else self.loop)
        return seq, ([] if loop is None else loop.steering().queued())

    def park(self) -> Any:
        """A locked lock the tap will release (call with ``self.lock`` held)."""
        waiter = threading.Lock()
        waiter.acquire()
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(waiter)
        return waiter

    def compact(self) -> None:
        """Drop the loop, the handle and the deque once the run's thread is done.

        A loop the host keeps (``loop_for``) lives on; a per-run loop, its
        machine, client and thread state become garbage here.
        """
        handle = self.handle
        if self.final is not None or handle is None or not handle.done():
            return
        status = _status(self)
        run = handle.record
        error = run.stop_reason  # the error result() raises (finalize sets both)
        release_frames(error)
        self.final = _Final(status, run, error)
        with self.lock:
            # A tuple, sized to what the run emitted (the deque is sized for
            # the buffer limit). Pickling and compressing would halve the
            # bytes but cost ~80 us of CPU per run: CPU is the scarcer part.
            self.buf = tuple(self.buf)
        self.handle = None
        self.loop = None

    def gap(self, seq: int, dropped: int) -> Tuple[int, Dict[str, Any]]:
        return seq, {
            "type": "gap",
            "session_id": self.session_id,
            "run_id": self.run_id,
            "dropped": dropped,
        }


def _status(entry: _Entry) -> RunStatus:
    handle = entry.handle
    if handle is None:
        final = entry.final
        assert final is not None
        return final.status
    run = handle.record
    turns = [*run.turns]
    state, error, output, value = "running", None, None, None
    # run_end is emitted after finalize recorded the end and the error, so a
    # client that saw run_end already gets the final state.
    if entry.ended or handle.done():
        err = run.stop_reason
        if err is None:
            # The answer leaves through the status: masked like every outlet's text.
            output = None if run.output is None else redact(run.output)
            state, value = "completed", json_safe(redact_value(json_form(run.output_value)))
        else:
            state = "cancelled" if isinstance(err, Cancelled) else "failed"
            error = str(err)
    return RunStatus(
        run_id=entry.run_id,
        state=state,
        output=output,
        error=error,
        turns=len(turns),
        tool_calls=sum(len(t.tool_calls) for t in turns),
        input_tokens=sum(t.input_tokens for t in turns),
        output_tokens=sum(t.output_tokens for t in turns),
        started_at=run.start,
        ended_at=run.end if state != "running" else None,
        output_value=value,
        pending_approvals=tuple(handle.pending_approvals()),
        approvals=tuple(run.approvals),
    )


def join_run_threads(
    handles: Sequence[RunHandle],
    left: Callable[[], Optional[float]],
    grace: Optional[Callable[[], Optional[float]]] = None,
) -> None:
    """Join each run's threads: its body and a cancel's takeover thread (``run_threads``).

    The runs name their own threads: never another run's (or registry's)
    thread found by its name, never one whose start is still in progress.
    ``left()`` is the time left for each join (None: no bound). With
    ``grace``, the body of a run a cancel took over (it was blocked, maybe
    in a call that never returns) waits ``grace()`` instead, and is left
    behind after it.
    """
    me = threading.current_thread()
    for handle in handles:
        threads = run_threads(handle, left())
        takeover, body = threads.takeover, threads.body
        if takeover is not None and takeover is not me:
            takeover.join(left())
        if body is not None and body is not me:
            body.join(grace() if grace is not None and threads.taken_over else left())


__all__ = ["RunStatus", "join_run_threads", "same_owner"]
