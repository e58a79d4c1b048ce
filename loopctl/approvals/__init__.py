"""Approvals in one package: the values, the per-run slot and the gate's policy.

``loopctl.approvals`` re-exports the values (``PendingApproval``,
``ApprovalContext``, ``ApprovalDecision`` ...) from
``loopctl.approvals.values``; ``loopctl.approvals.slot`` holds one run's
``ApprovalSlot``. The package imports only the leaves and the events.
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
