"""The approval gate: which calls of a batch wait for a person, and dispatch around them.

Before a batch runs, ``park_batch`` asks of each call: does its tool say
``requires_approval``, or does the loop's policy (``with_approval``) say so
for these arguments? Only calls whose arguments pass the tool's schema are
asked about (an invalid call never runs, so nobody need approve it); a
policy that raises counts as "needs approval" (fail closed). Every call
that needs one is parked in the run's ``ApprovalSlot`` at once, in request
order, each announced by ``on_approval_requested``, so a person sees the
whole batch.

``dispatch_parked`` then walks the batch's waves in order: a wave's free
calls run first (they never wait for a person), then the gate waits for
the wave's parked calls (unfenced: a cancel takes the run over at once;
``on_approval_resolved`` fires as each answer arrives, for any call of the
batch), and the approved ones run, with edited arguments when the approver
gave them. A denied call never runs: its result is the soft error "the
user denied this call: <reason>", with no ``on_tool_pre``. Results stay in
request order. An approval covers the call's recovery retries.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Callable, Optional

import attrs

from loopctl.approvals import ApprovalContext, ApprovalDecision, denial_text
from loopctl.driver.approvals import ApprovalSlot
from loopctl.messages import ToolCallPart, ToolResultPart
from loopctl.observers import ApprovalRequested, ApprovalResolved

log = logging.getLogger("loopctl")

#: ``policy(ctx) -> bool``: True when the call needs a person's approval.
ApprovalPolicy = Callable[[ApprovalContext], bool]


class ParkedBatch:
    """The parked calls of one batch and the answers reported so far."""

    __slots__ = ("slot", "events", "session_id", "ids", "decisions")

    def __init__(self, slot: ApprovalSlot, events: Any, session_id: str, ids: dict[int, str]) -> None:
        self.slot = slot
        self.events = events
        self.session_id = session_id
        self.ids = ids  # call index -> parked call id
        self.decisions: dict[str, ApprovalDecision] = {}

    def is_parked(self, index: int) -> bool:
        """True when call ``index`` waits for a person."""
        return index in self.ids

    def wait_for(self, indices: Sequence[int], unfenced: Callable[[], Any]) -> None:
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


def report(events: Any, session_id: str, run_id: str, d: ApprovalDecision) -> None:
    """Fire ``on_approval_resolved`` for ``d``."""
    if events.wants(ApprovalResolved):
        events.emit(ApprovalResolved(session_id, run_id, d.call_id, d.tool, d.approved, d.by, d.reason, d.edited))


def report_unreported(slot: ApprovalSlot, events: Any, session_id: str) -> None:
    """Fire ``on_approval_resolved`` for every answer not reported yet (finalize)."""
    for d in slot.take_unreported():
        report(events, session_id, slot.run_id, d)


def park_batch(
    slot: ApprovalSlot,
    tools: Any,
    policy: Optional[ApprovalPolicy],
    calls: Sequence[ToolCallPart],
    *,
    events: Any,
    session_id: str,
    turn: int,
    default_timeout: Optional[float],
    unfenced: Callable[[], Any],
) -> Optional[ParkedBatch]:
    """Park the calls that need approval; None when none does (the fast path).

    Raises:
        Cancelled: the run was cancelled (the slot is closed).
    """
    ids: dict[int, str] = {}
    for i, call in enumerate(calls):
        tool = tools.get(call.name)
        if tool is None:
            continue
        needs = bool(getattr(tool, "requires_approval", False))
        if not needs and policy is None:
            continue
        try:
            if tool.validate(call.input) is not None:
                continue  # it fails validation and never runs: nothing to approve
        except Exception:
            continue
        if not needs:
            ctx = ApprovalContext(call.name, dict(call.input), call.id, slot.run_id, session_id, turn)
            needs = _ask_policy(policy, ctx, unfenced)  # a copy: a policy cannot change what runs
        if not needs:
            continue
        if call.id in ids.values():  # a model that repeats an id: one answer serves both
            ids[i] = call.id
            continue
        timeout = getattr(tool, "approval_timeout", None)
        if timeout is None:
            timeout = default_timeout
        pending = slot.request(call.id, call.name, call.input, turn=turn, timeout=timeout, validate=tool.validate)
        ids[i] = call.id
        if events.wants(ApprovalRequested):
            events.emit(
                ApprovalRequested(session_id, slot.run_id, turn, call.id, call.name, pending.arguments, timeout)
            )
    return ParkedBatch(slot, events, session_id, ids) if ids else None


def _ask_policy(policy: Any, ctx: ApprovalContext, unfenced: Callable[[], Any]) -> bool:
    with unfenced():  # user code may block: never hold a cancel
        try:
            return bool(policy(ctx))
        except Exception:
            log.exception("approval policy raised on tool %r; the call waits for approval", ctx.tool)
            return True


def dispatch_parked(
    batch: ParkedBatch,
    calls: Sequence[ToolCallPart],
    waves: Sequence[Sequence[int]],
    run_group: Callable[[Sequence[ToolCallPart]], list[ToolResultPart]],
    check_cancel: Callable[[], None],
    unfenced: Callable[[], Any],
) -> list[ToolResultPart]:
    """Run ``calls`` wave by wave around their approvals; results in request order.

    ``run_group(calls)`` runs calls that may overlap (one call alone, or a
    parallel wave) and returns their results in order.
    """
    results: list[Optional[ToolResultPart]] = [None] * len(calls)

    def run(indices: list[int], group: list[ToolCallPart]) -> None:
        if indices:
            for i, r in zip(indices, run_group(group)):
                results[i] = r

    for wave in waves:
        check_cancel()
        free = [i for i in wave if not batch.is_parked(i)]
        run(free, [calls[i] for i in free])
        parked = [i for i in wave if batch.is_parked(i)]
        if not parked:
            continue
        batch.wait_for(parked, unfenced)
        check_cancel()
        go: list[int] = []
        group: list[ToolCallPart] = []
        for i in parked:
            d = batch.decision(i)
            call = calls[i]
            if d.approved:
                go.append(i)
                group.append(attrs.evolve(call, input=dict(d.arguments)) if d.edited else call)
            else:
                results[i] = ToolResultPart(call.id, call.name, denial_text(d.reason), True)
        run(go, group)
    return results  # type: ignore[return-value]


__all__ = ["ApprovalPolicy", "ParkedBatch", "dispatch_parked", "park_batch", "report", "report_unreported"]
