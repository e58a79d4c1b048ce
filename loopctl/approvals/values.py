"""Approval values: a call waiting for a person, the policy's view, the decision.

A leaf: plain frozen attrs classes with JSON forms, no threads; it imports
only ``loopctl.frozen`` and ``loopctl.text`` (the JSON forms are outlets:
masked like every other). Arguments are deeply immutable (``FrozenDict``):
the policy, the person, the events and the record read one value that
none of them can change (``thaw`` gives a mutable copy). The slot that parks calls and takes answers from other
threads is ``loopctl.approvals.slot``; the audit record keeps every
``ApprovalDecision`` in ``Run.approvals``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import attrs

from loopctl.frozen import FrozenDict, freeze_arguments, thaw
from loopctl.text import json_safe, redact, redact_value

#: The reason given to calls still pending when their run ends.
RUN_ENDED = "run ended"
#: The reason given to calls still pending when their run is cancelled.
RUN_CANCELLED = "run cancelled"
#: The reason given to a call whose approval timeout passed.
TIMED_OUT = "approval timed out"


@attrs.frozen
class PendingApproval:
    """A tool call parked until a person approves or denies it.

    Args:
        call_id: the model's id for the call (answer with it).
        tool: the tool's name.
        arguments: the validated arguments the model asked for.
        run_id: the run the call belongs to.
        requested_at: wall-clock time (``time.time()``) it was parked.
        turn: the run's turn that asked for it.
        timeout: seconds it may wait before it is denied ("approval timed
            out"); None waits for ever.
        subagent: ``""`` for the run's own call; for a call a sub-agent's run
            parked, the sub-agent's path (``"research"``,
            ``"research/search"``), with the parent's ``run_id``.
    """

    call_id: str
    tool: str
    arguments: FrozenDict = attrs.field(converter=freeze_arguments)
    run_id: str
    requested_at: float
    turn: int = 0
    timeout: Optional[float] = None
    subagent: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict, the arguments masked (``loopctl.text.redact``) as at every outlet."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments": json_safe(redact_value(thaw(self.arguments))),
            "run_id": self.run_id,
            "requested_at": self.requested_at,
            "turn": self.turn,
            "timeout": self.timeout,
            "subagent": self.subagent,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingApproval:
        """Rebuild from ``to_dict`` output."""
        timeout = data.get("timeout")
        return cls(
            call_id=str(data["call_id"]),
            tool=str(data["tool"]),
            arguments=dict(data.get("arguments") or {}),
            run_id=str(data.get("run_id", "")),
            requested_at=float(data.get("requested_at") or 0.0),
            turn=int(data.get("turn", 0)),
            timeout=None if timeout is None else float(timeout),
            subagent=str(data.get("subagent") or ""),
        )


@attrs.frozen
class ApprovalContext:
    """What an approval policy (``loop.with_approval(policy)``) sees of a call.

    ``arguments`` have passed the tool's schema; the policy returns True
    when the call needs a person's approval.
    """

    tool: str
    arguments: FrozenDict = attrs.field(converter=freeze_arguments)
    call_id: str
    run_id: str
    session_id: str
    turn: int


@attrs.frozen
class ApprovalDecision:
    """How a parked call was answered: the audit record's entry.

    Args:
        call_id: the call's id.
        tool: the tool's name.
        approved: True when the call may run.
        by: who answered (as the caller of ``approve``/``deny`` said), None
            when the runtime answered (a timeout, the run's end, a cancel).
        reason: why it was denied ("" when approved).
        arguments: the arguments the call runs with (edited ones when the
            approver changed them), or those it asked for when denied.
        edited: True when the approver replaced the arguments.
        requested_at: wall-clock time the call was parked.
        decided_at: wall-clock time it was answered.
    """

    call_id: str
    tool: str
    approved: bool
    by: Optional[str]
    reason: str
    arguments: FrozenDict = attrs.field(converter=freeze_arguments)
    edited: bool
    requested_at: float
    decided_at: float

    def recorded(self) -> ApprovalDecision:
        """This decision as a run's record keeps it: ``by``, ``reason`` and the arguments masked.

        Returns itself when nothing needed masking.
        """
        by = None if self.by is None else redact(self.by)
        reason = redact(self.reason)
        arguments = redact_value(self.arguments)
        if by == self.by and reason == self.reason and arguments is self.arguments:
            return self
        return attrs.evolve(self, by=by, reason=reason, arguments=arguments)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict, its texts masked (``loopctl.text.redact``) as at every outlet."""
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "approved": self.approved,
            "by": None if self.by is None else redact(self.by),
            "reason": redact(self.reason),
            "arguments": json_safe(redact_value(thaw(self.arguments))),
            "edited": self.edited,
            "requested_at": self.requested_at,
            "decided_at": self.decided_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApprovalDecision:
        """Rebuild from ``to_dict`` output."""
        by = data.get("by")
        return cls(
            call_id=str(data["call_id"]),
            tool=str(data["tool"]),
            approved=bool(data["approved"]),
            by=None if by is None else str(by),
            reason=str(data.get("reason", "")),
            arguments=dict(data.get("arguments") or {}),
            edited=bool(data.get("edited", False)),
            requested_at=float(data.get("requested_at") or 0.0),
            decided_at=float(data.get("decided_at") or 0.0),
        )


def denial_text(reason: str) -> str:
    """The soft error a denied call returns to the model."""
    return f"the user denied this call: {reason}"


__all__ = [
    "RUN_CANCELLED",
    "RUN_ENDED",
    "TIMED_OUT",
    "ApprovalContext",
    "ApprovalDecision",
    "PendingApproval",
    "denial_text",
]
