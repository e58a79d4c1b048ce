"""The gate's policy and the parked batch: who decides a call waits, and the answers as they come.

``ask_policy`` asks the loop's policy (``with_approval``) outside the run's
fence, so a policy that blocks never holds a cancel; a policy that raises
counts as "needs approval" (fail closed). ``ParkedBatch`` holds one batch's
parked calls in the run's ``ApprovalSlot`` and waits for their answers,
reporting each (``on_approval_resolved``) as it arrives, for any call of
the batch. Which admitted calls are asked about, and the dispatch around
them, is the driver's (``loopctl.driver.approval_gate``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Callable, ContextManager, Protocol

from loopctl.approvals.slot import ApprovalSlot
from loopctl.approvals.values import ApprovalContext, ApprovalDecision
from loopctl.events import ApprovalResolved, Event

#: Releases the run's fence around blocking work (``RunContext.unfenced``).
Unfence = Callable[[], ContextManager[object]]


class EventSink(Protocol):
    """Where approval events go: the run's events (only those an observer wants)."""

    def wants(self, cls: type[Event]) -> bool: ...

    def emit(self, event: Event) -> None: ...


log = logging.getLogger("loopctl")

#: ``policy(ctx) -> bool``: True when the call needs a person's approval.
ApprovalPolicy = Callable[[ApprovalContext], bool]


class ParkedBatch:
    """The parked calls of one batch and the answers reported so far."""

    __slots__ = ("slot", "events", "session_id", "ids", "decisions")

    def __init__(self, slot: ApprovalSlot, events: EventSink, session_id: str, ids: dict[int, str]) -> None:
        self.slot = slot
        self.events = events
        self.session_id = session_id
        self.ids = ids  # call index -> parked call id
        self.decisions: dict[str, ApprovalDecision] = {}

    def is_parked(self, index: int) -> bool:
        """True when call ``index`` waits for a person."""
        return index in self.ids

    def wait_for(self, indices: Sequence[int], unfenced: Unfence) -> None:
        """Block (unfenced) until every call in ``indices`` is answered; report answers as they come.

        Raises:
            Cancelled: the run was cancelled while waiting.
        """
        while any(self.ids[i] not in self.decisions for i in indices):
            open_ids = [cid for cid in dict.fromkeys(self.ids.values()) if cid not in self.decisions]
            with unfenced():
                got = self.slot.wait_any(open_ids)
            for d in got:
                self.decisions[d.call_id] = d
                report(self.events, self.session_id, self.slot.run_id, d)

    def decision(self, index: int) -> ApprovalDecision:
        """The answer for call ``index`` (after ``wait_for``)."""
        return self.decisions[self.ids[index]]


def report(events: EventSink, session_id: str, run_id: str, d: ApprovalDecision) -> None:
    """Fire ``on_approval_resolved`` for ``d``."""
    if events.wants(ApprovalResolved):
        events.emit(ApprovalResolved(session_id, run_id, d.call_id, d.tool, d.approved, d.by, d.reason, d.edited))


def report_unreported(slot: ApprovalSlot, events: EventSink, session_id: str) -> None:
    """Fire ``on_approval_resolved`` for every answer not reported yet (finalize)."""
    for d in slot.take_unreported():
        report(events, session_id, slot.run_id, d)


def ask_policy(policy: ApprovalPolicy, ctx: ApprovalContext, unfenced: Unfence) -> bool:
    """The policy's answer for ``ctx``, asked outside the run's fence; True when it raises (fail closed)."""
    with unfenced():  # user code may block: never hold a cancel
        try:
            return bool(policy(ctx))
        except Exception:
            log.exception("approval policy raised on tool %r; the call waits for approval", ctx.tool)
            return True


__all__ = ["ApprovalPolicy", "ParkedBatch", "ask_policy", "report", "report_unreported"]
