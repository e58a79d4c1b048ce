"""Events and hooks together: what a run reports, and the one channel that can veto.

``loopctl.events.types`` declares every event once (the ``EVENTS`` table)
and the ``Observer`` base class whose ``on_*`` methods it dispatches to;
``loopctl.events.hooks`` holds the hooks, which may veto a tool call or a
compaction. This package imports only the leaves (messages, text).
"""

from __future__ import annotations

from loopctl.events.types import (
    EVENT_METHODS,
    EVENTS,
    EVENT_TYPES,
    ApprovalRequested,
    ApprovalResolved,
    AttemptReset,
    CallbackObserver,
    Compaction,
    ConvergenceDetected,
    Event,
    Fallback,
    LoopDetectedEvent,
    ModelSwitched,
    Observer,
    OutputValidationFailed,
    Response,
    RetryScheduled,
    RunEnd,
    RunResumed,
    RunStart,
    SteeringDelivered,
    StreamFailure,
    StreamSuccess,
    TextDelta,
    ThinkingDelta,
    ToolCallReceived,
    ToolInputDelta,
    ToolPost,
    ToolPre,
    TurnEnd,
    TurnStart,
)

__all__ = [
    "EVENT_METHODS",
    "EVENTS",
    "EVENT_TYPES",
    "ApprovalRequested",
    "ApprovalResolved",
    "AttemptReset",
    "CallbackObserver",
    "Compaction",
    "ConvergenceDetected",
    "Event",
    "Fallback",
    "LoopDetectedEvent",
    "ModelSwitched",
    "Observer",
    "OutputValidationFailed",
    "Response",
    "RetryScheduled",
    "RunEnd",
    "RunResumed",
    "RunStart",
    "SteeringDelivered",
    "StreamFailure",
    "StreamSuccess",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallReceived",
    "ToolInputDelta",
    "ToolPost",
    "ToolPre",
    "TurnEnd",
    "TurnStart",
]
