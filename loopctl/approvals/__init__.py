"""Approvals in one package: the values, the per-run slot and the gate's policy.

``loopctl.approvals`` re-exports the values (``PendingApproval``,
``ApprovalContext``, ``ApprovalDecision`` ...) from
``loopctl.approvals.values``; ``loopctl.approvals.slot`` holds one run's
``ApprovalSlot`` (parked calls, answers from any thread, the audit record);
``loopctl.approvals.gate`` asks the loop's policy and waits for a parked
batch's answers. The package imports only the leaves, the records and the
events, never the driver: which admitted calls are parked, and the dispatch
around them, is the driver's glue (``loopctl.driver.approval_gate``).
"""

from __future__ import annotations

from loopctl.approvals.values import (
    RUN_CANCELLED,
    RUN_ENDED,
    TIMED_OUT,
    ApprovalContext,
    ApprovalDecision,
    PendingApproval,
    denial_text,
)

__all__ = [
    "RUN_CANCELLED",
    "RUN_ENDED",
    "TIMED_OUT",
    "ApprovalContext",
    "ApprovalDecision",
    "PendingApproval",
    "denial_text",
]
