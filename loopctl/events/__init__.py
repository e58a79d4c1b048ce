"""Events and hooks together: what a run reports, and the one channel that can veto.

- ``loopctl.events.base``: ``Event``, its JSON form and its masked form;
- ``loopctl.events.types``: every event class, declared once, and the
  ``EVENTS`` table every consumer is checked against;
- ``loopctl.events.observer``: ``Observer`` (a no-op ``on_*`` per event)
  and ``CallbackObserver``;
- ``loopctl.events.hooks``: the hooks, which may veto a tool call or a
  compaction (not re-exported here: ``from loopctl.events.hooks import Hook``).

The package imports only the leaves (messages, text). ``loopctl.observers``
and ``loopctl.hooks`` are stable aliases of this package and of its hooks.
"""

from __future__ import annotations

from loopctl.events.base import Event
from loopctl.events.observer import CallbackObserver, Observer
from loopctl.events.types import (
    EVENT_METHODS,
    EVENT_TYPES,
    EVENTS,
    ApprovalRequested,
    ApprovalResolved,
    AttemptReset,
    Compaction,
    ConvergenceDetected,
    Fallback,
    LoopDetectedEvent,
    ModelSwitched,
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
    "EVENTS",
    "EVENT_METHODS",
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
