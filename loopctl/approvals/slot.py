"""The approval slot: a run's tool calls parked until a person answers, from any thread.

One ``ApprovalSlot`` per run, guarded by one ``Condition`` made when the
first call is parked (most runs park none: until then the slot holds no
lock, and nothing is pending to answer or close). The run's
thread parks a call (``request``) and waits for answers (``wait_any``; the
driver calls it unfenced, so a cancel takes the run over at once); any
thread lists what is pending (``pending``) and answers (``approve`` /
``deny``). Rules it keeps:

- an answer is taken once: a second answer, an unknown call id, an id of
  another run, or an answer after the slot closed returns False and
  changes nothing;
- edited arguments are frozen first (a deep, immutable copy: the caller
  changing its dict afterwards changes nothing), then that frozen value is
  checked against the tool's schema on the answering thread, outside the
  lock; an invalid edit raises ``ValueError`` naming the field and the call
  stays pending; the call runs with exactly the value that was checked;
- a call's timeout (the tool's ``approval_timeout``, else the run's) is
  measured from when it was parked; when it passes the call is denied
  ("approval timed out");
- the run's cancel closes the slot at once (the cancelling thread answers
  every pending call "run cancelled"), so an approve that loses the race
  returns False; the run's end closes it too ("run ended").

Every decision is appended to the run's ``Run.approvals`` as it is taken
(masked, as the record's other texts are), under the slot's lock, so the
record always agrees with what each caller was told. Decisions not yet reported as events are handed out once by
``wait_any`` (the run's thread) or ``take_unreported`` (finalize).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

from loopctl.approvals import (
    RUN_CANCELLED,
    TIMED_OUT,
    ApprovalDecision,
    PendingApproval,
)
from loopctl.errors import Cancelled
from loopctl.frozen import FrozenDict, freeze_arguments
from loopctl.records import Run
from loopctl.timeouts import bounded

#: Guards making a slot's lock against a ``close`` from another thread.
_arming = threading.Lock()

#: ``validate(arguments) -> problem``: a message naming the bad field, or None.
Validator = Callable[[Mapping[str, Any]], Optional[str]]


class _Entry:
    __slots__ = ("pending", "deadline", "validate", "decision", "reported")

    def __init__(self, pending: PendingApproval, deadline: Optional[float], validate: Optional[Validator]) -> None:
        self.pending = pending
        self.deadline = deadline
        self.validate = validate
        self.decision: Optional[ApprovalDecision] = None
        self.reported = False


class ApprovalSlot:
    """A run's parked tool calls and their answers (see the module docstring).

    Args:
        run: the run's audit record; decisions are appended to ``run.approvals``.
        cancel: the run's cancel signal; firing it closes the slot.
        clock: a monotonic clock for deadlines (tests inject one).
        wall: the wall clock for the record's timestamps.
    """

    __slots__ = ("_cancel", "_clock", "_closed", "_cond", "_entries", "_run", "_wall")

    def __init__(
        self,
        run: Run,
        cancel: Any = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._cond: Optional[threading.Condition] = None  # made by the first request
        self._entries: dict[str, _Entry] = {}
        self._closed = False
        self._run = run
        self._clock = clock
        self._wall = wall
        self._cancel = cancel

    def _armed(self) -> threading.Condition:
        """The slot's lock, made (and the cancel listened to) on the first request.

        Only the run's thread parks calls, so this runs once; a ``close``
        racing it decides under ``_arming`` whether it closes a slot with
        nothing parked or waits for the lock.
        """
        cond = self._cond
        if cond is None:
            with _arming:
                cond = self._cond = threading.Condition(threading.Lock())
            if self._cancel is not None:
                self._cancel.add_listener(self._on_cancel)  # already fired: closes the slot now
                if self._closed:  # closed meanwhile from another thread: leave nothing behind
                    self._cancel.remove_listener(self._on_cancel)
        return cond

    @property
    def run_id(self) -> str:
        """The id of the run this slot belongs to."""
        return self._run.id

    @property
    def is_closed(self) -> bool:
        """True once the run's end or cancel closed the slot."""
        return self._closed or (self._cancel is not None and self._cancel.is_cancelled())

    # -- the run's side -------------------------------------------------------------

    def request(
        self,
        call_id: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        turn: int = 0,
        timeout: Optional[float] = None,
        validate: Optional[Validator] = None,
    ) -> PendingApproval:
        """Park a call until it is answered (the run's thread).

        A call id answered earlier in the run may be parked again (a model
        that reuses ids across turns): the new call replaces the old entry.

        Raises:
            Cancelled: the slot is closed (the run was cancelled or ended).
        """
        pending = PendingApproval(call_id, tool, freeze_arguments(arguments), self._run.id, self._wall(), turn, timeout)
        deadline = None if timeout is None else self._clock() + timeout
        with self._armed():
            if self._closed:
                raise Cancelled(self._cancel_reason())
            self._entries[call_id] = _Entry(pending, deadline, validate)
        return pending

    def wait_any(self, call_ids: Iterable[str]) -> list[ApprovalDecision]:
        """Block until one or more of ``call_ids`` is answered; return those not yet reported.

        Deadlines are applied here: a call past its timeout is denied
        ("approval timed out"). Each decision is returned once.

        Raises:
            Cancelled: the run was cancelled (the slot closed) meanwhile.
            KeyError: an id that was never parked.
        """
        ids = list(call_ids)
        cond = self._armed()
        with cond:
            entries = [self._entries[i] for i in ids]
            while True:
                if self._cancel is not None and self._cancel.is_cancelled():
                    raise Cancelled(self._cancel_reason())
                now = self._clock()
                nearest: Optional[float] = None
                for e in entries:
                    if e.decision is None and e.deadline is not None:
                        if e.deadline <= now:
                            self._decide(e, False, None, TIMED_OUT, None)
                        elif nearest is None or e.deadline < nearest:
                            nearest = e.deadline
                out = []
                for e in entries:
                    if e.decision is not None and not e.reported:
                        e.reported = True
                        out.append(e.decision)
                if out:
                    return out
                if all(e.decision is not None for e in entries):
                    return []  # every one was answered and already reported
                if self._closed:
                    raise Cancelled(self._cancel_reason())
                cond.wait(None if nearest is None else bounded(nearest - now))

    def close(self, reason: str) -> None:
        """Answer every pending call denied with ``reason`` and refuse later answers (idempotent)."""
        if self._cond is None:
            with _arming:
                if self._cond is None:  # nothing was ever parked: nothing to answer
                    self._closed = True
                    return
        if self._cancel is not None and self._cancel.is_cancelled():
            # Whichever comes first, this slot's cancel listener or the run's
            # end on the thread that took the cancelled run over, says why.
            reason = RUN_CANCELLED
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for e in self._entries.values():
                if e.decision is None:
                    self._decide(e, False, None, reason, None)
            self._cond.notify_all()
        if self._cancel is not None:
            self._cancel.remove_listener(self._on_cancel)

    def take_unreported(self) -> list[ApprovalDecision]:
        """Decisions no event has reported yet, in the order they were parked (once)."""
        if self._cond is None:
            return []
        with self._cond:
            out = []
            for e in self._entries.values():
                if e.decision is not None and not e.reported:
                    e.reported = True
                    out.append(e.decision)
            return out

    def _on_cancel(self) -> None:
        self.close(RUN_CANCELLED)

    def _cancel_reason(self) -> Optional[str]:
        return self._cancel.reason if self._cancel is not None else RUN_CANCELLED

    # -- any thread -------------------------------------------------------------------

    def pending(self) -> list[PendingApproval]:
        """The calls waiting for an answer, in the order they were parked."""
        if self._cond is None:
            return []
        with self._cond:
            return [e.pending for e in self._entries.values() if e.decision is None]

    def approve(
        self, call_id: str, *, by: Optional[str] = None, arguments: Optional[Mapping[str, Any]] = None
    ) -> bool:
        """Let a pending call run, optionally with edited ``arguments``.

        Returns:
            True when this answer was taken; False when the call is not
            pending here (unknown, answered already, or the run ended).

        Raises:
            ValueError: ``arguments`` do not fit the tool's schema (the
                message names the field); the call stays pending.
        """
        _check_by(by)
        if arguments is not None:
            if not isinstance(arguments, Mapping):
                raise ValueError(f"arguments must be a mapping of field to value, got {type(arguments).__name__}")
            if self._cond is None:
                return False
            with self._cond:
                entry = self._entries.get(call_id)
                if entry is None or entry.decision is not None or self._closed:
                    return False
                validate = entry.validate
            edited = freeze_arguments(arguments)  # checked and run as this one immutable value
            try:
                problem = validate(edited) if validate is not None else None
            except Exception as exc:  # a custom validate() that raises: refuse the edit
                problem = f"validation raised {type(exc).__name__}"
            if problem is not None:
                raise ValueError(f"invalid arguments for tool '{entry.pending.tool}': {problem}")
        if self._cond is None:
            return False
        with self._cond:
            entry = self._entries.get(call_id)
            if entry is None or entry.decision is not None or self._closed:
                return False
            self._decide(entry, True, by, "", None if arguments is None else edited)
            self._cond.notify_all()
            return True

    def deny(self, call_id: str, reason: str, *, by: Optional[str] = None) -> bool:
        """Refuse a pending call; the model sees "the user denied this call: <reason>".

        Returns:
            True when this answer was taken; False when the call is not
            pending here (unknown, answered already, or the run ended).
        """
        if not isinstance(reason, str):
            raise TypeError(f"deny reason must be a str, got {type(reason).__name__}")
        _check_by(by)
        if self._cond is None:
            return False
        with self._cond:
            entry = self._entries.get(call_id)
            if entry is None or entry.decision is not None or self._closed:
                return False
            self._decide(entry, False, by, reason, None)
            self._cond.notify_all()
            return True

    def _decide(
        self,
        entry: _Entry,
        approved: bool,
        by: Optional[str],
        reason: str,
        edited: Optional[FrozenDict],
    ) -> None:
        # Under the lock: the decision and the audit record change together.
        p = entry.pending
        decision = ApprovalDecision(
            p.call_id,
            p.tool,
            approved,
            by,
            reason,
            edited if edited is not None else p.arguments,
            edited is not None,
            p.requested_at,
            self._wall(),
        )
        entry.decision = decision
        # The record is kept masked, as a run's turns are; the decision itself
        # stays whole: the call runs with its arguments, the model reads its reason.
        self._run.approvals.append(decision.recorded())


def _check_by(by: Optional[str]) -> None:
    if by is not None and not isinstance(by, str):
        raise TypeError(f"by must be a str or None, got {type(by).__name__}")


__all__ = ["ApprovalSlot", "Validator"]
