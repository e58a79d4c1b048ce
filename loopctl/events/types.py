"""The observer events, each declared once, and the ``EVENTS`` table.

Every event subclasses ``loopctl.events.base.Event``.

Every event is a frozen attrs class carrying ``session_id`` and ``run_id``
first, then its own fields. ``to_dict()`` gives a JSON-safe dict (no
``NaN``/``Infinity``, every string masked by ``loopctl.text.redact``) with a
``type`` field (``"turn_start"``, ``"text_delta"``, ...). ``redacted()`` is
what the emitter delivers: the event with every text masked and its quotes
of untrusted text (``error``, ``cause``, ``errors``, ...) cut to an excerpt.

``EVENTS`` lists every event class once; an event's observer method is
``on_`` + its ``TYPE`` (``observer_method()``); ``loopctl.events.observer``
holds the ``Observer`` base class with a no-op method per event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Optional

import attrs

from loopctl.events.base import Event
from loopctl.messages import Message, StopReason, Usage


@attrs.frozen
class RunStart(Event):
    """A run began."""

    TYPE: ClassVar[str] = "run_start"
    input: str


@attrs.frozen
class RunEnd(Event):
    """A run ended: always the run's last event.

    ``error`` is the text of the error that ended the run and ``error_type``
    its class name (``"Cancelled"``, ``"ModelError"``, ...); both None on
    success.
    """

    TYPE: ClassVar[str] = "run_end"
    success: bool
    error: Optional[str]
    total_turns: int
    duration_ms: float
    error_type: Optional[str] = None


@attrs.frozen
class TurnStart(Event):
    """A model call is about to be made (never for a deferred turn).

    ``provider`` names the client's provider (``"openai"``, ``"anthropic"``;
    None for a client that names none), as on every model event. ``model``
    is the model the call asks for (the client's, or the one a fallback
    chain routed to; None for a client that names none): the model that
    served it, which a server may name otherwise (``gpt-4o`` answered by
    ``gpt-4o-2024-08-06``), is ``StreamSuccess.model``.
    """

    TYPE: ClassVar[str] = "turn_start"
    turn: int
    query: str
    provider: Optional[str] = None
    model: Optional[str] = None


@attrs.frozen
class TextDelta(Event):
    """A streamed fragment of reply text (also from attempts that later fail)."""

    TYPE: ClassVar[str] = "text_delta"
    turn: int
    delta: str


@attrs.frozen
class ThinkingDelta(Event):
    """A streamed fragment of reasoning."""

    TYPE: ClassVar[str] = "thinking_delta"
    turn: int
    delta: str


@attrs.frozen
class ToolInputDelta(Event):
    """A streamed fragment of a tool call's JSON arguments."""

    TYPE: ClassVar[str] = "tool_input_delta"
    turn: int
    call_id: str
    tool: str
    delta: str


@attrs.frozen
class AttemptReset(Event):
    """A stream attempt failed; drop what was buffered for it."""

    TYPE: ClassVar[str] = "attempt_reset"
    turn: int
    attempt: int


@attrs.frozen
class RetryScheduled(Event):
    """A model call failed and will be retried after a wait.

    ``cause`` says what happened in words a person reads ("rate limited
    (429)", "connection refused at http://127.0.0.1:1/v1"); ``wait_s`` is
    the wait before the next try; ``attempt`` is the try about to start
    (2 for the first retry) of at most ``max_attempts``.
    """

    TYPE: ClassVar[str] = "retry_scheduled"
    turn: int
    model: str
    cause: str
    wait_s: float
    attempt: int
    max_attempts: int
    provider: Optional[str] = None


@attrs.frozen
class Response(Event):
    """The assembled reply of a served turn (text only, no tool calls)."""

    TYPE: ClassVar[str] = "response"
    turn: int
    text: str
    usage: Optional[Usage]


@attrs.frozen
class StreamSuccess(Event):
    """A model call succeeded; ``model`` is the model that served it, ``provider`` its provider."""

    TYPE: ClassVar[str] = "stream_success"
    turn: int
    model: str
    usage: Optional[Usage]
    provider: Optional[str] = None


@attrs.frozen
class StreamFailure(Event):
    """A model call failed (never fired for a cancel); ``provider`` names the client's provider."""

    TYPE: ClassVar[str] = "stream_failure"
    turn: int
    model: str
    error: str
    provider: Optional[str] = None


@attrs.frozen
class TurnEnd(Event):
    """A phase of a turn ended: ``phase`` is ``"llm"`` or ``"tools"``.

    A failed phase carries the error's text in ``error`` and its class name
    in ``error_type`` (both None on success).
    """

    TYPE: ClassVar[str] = "turn_end"
    turn: int
    phase: str
    success: bool
    error: Optional[str]
    duration_ms: float
    input_tokens: int
    output_tokens: int
    stop_reason: Optional[StopReason]
    context_tokens: int
    context_window: Optional[int]
    error_type: Optional[str] = None


@attrs.frozen
class ToolCallReceived(Event):
    """The model asked for a call (once per call, before any dispatch)."""

    TYPE: ClassVar[str] = "tool_call_received"
    turn: int
    call_id: str
    tool: str
    input: Mapping[str, Any]


@attrs.frozen
class ToolPre(Event):
    """One attempt of a tool call is about to run."""

    TYPE: ClassVar[str] = "tool_pre"
    turn: int
    call_id: str
    tool: str
    attempt: int


@attrs.frozen
class ToolPost(Event):
    """One attempt of a tool call finished."""

    TYPE: ClassVar[str] = "tool_post"
    turn: int
    call_id: str
    tool: str
    attempt: int
    is_error: bool
    duration_ms: float
    output: str
    result_hash: str


@attrs.frozen
class Compaction(Event):
    """The conversation was really compacted."""

    TYPE: ClassVar[str] = "compaction"
    reason: str
    tokens_before: int
    tokens_after: int


@attrs.frozen
class Fallback(Event):
    """The model breaker tripped to a fallback model."""

    TYPE: ClassVar[str] = "fallback"
    from_model: str
    to_model: str


@attrs.frozen
class ModelSwitched(Event):
    """The model serving requests changed."""

    TYPE: ClassVar[str] = "model_switched"
    from_model: str
    to_model: str


@attrs.frozen
class LoopDetectedEvent(Event):
    """A repeating tool pattern was seen."""

    TYPE: ClassVar[str] = "loop_detected"
    pattern: str
    repetitions: int


@attrs.frozen
class ConvergenceDetected(Event):
    """Final answers converged."""

    TYPE: ClassVar[str] = "convergence_detected"
    action: str
    similarity: float
    count: int


@attrs.frozen
class SteeringDelivered(Event):
    """Pushed guidance was drained into the conversation."""

    TYPE: ClassVar[str] = "steering"
    turn: int
    messages: tuple[Message, ...]


@attrs.frozen
class RunResumed(Event):
    """A durable run continues from its last checkpoint (in place of ``run_start``).

    ``attempt`` counts from 1 (the first resumption); ``cause`` says why the
    run moved (its worker was lost, or it shut down and handed the run back);
    ``turn`` is the turn the run continues at. Events of the earlier attempt
    after its last checkpoint (a partial reply, tool calls whose results were
    never committed) are superseded: the run does that work again.
    """

    TYPE: ClassVar[str] = "run_resumed"
    attempt: int
    cause: str
    turn: int


@attrs.frozen
class OutputValidationFailed(Event):
    """A final answer did not fit the run's ``output_type``.

    ``errors`` are the problems (``"path: message"``) the model is shown;
    ``attempt`` counts the answers rejected so far, of at most
    ``max_attempts`` (``output_retries + 1``): at ``attempt ==
    max_attempts`` the run fails with ``OutputValidationError``, else the
    model is asked again.
    """

    TYPE: ClassVar[str] = "output_validation_failed"
    turn: int
    errors: tuple[str, ...]
    attempt: int
    max_attempts: int


@attrs.frozen
class ApprovalRequested(Event):
    """A tool call was parked until a person approves or denies it.

    ``arguments`` are the validated arguments the model asked for;
    ``timeout`` is the seconds it may wait (None: for ever).
    """

    TYPE: ClassVar[str] = "approval_requested"
    turn: int
    call_id: str
    tool: str
    arguments: Mapping[str, Any]
    timeout: Optional[float]


@attrs.frozen
class ApprovalResolved(Event):
    """A parked call was answered: ``approved``, by whom, and why not.

    ``by`` is None when the runtime answered (a timeout, the run's end or
    cancel); ``edited`` is True when the approver changed the arguments.
    """

    TYPE: ClassVar[str] = "approval_resolved"
    call_id: str
    tool: str
    approved: bool
    by: Optional[str]
    reason: str
    edited: bool


#: Every event class, once: the table observers, JSON loading and the
#: integrations are checked against. A new event is added here and nowhere else.
EVENTS: tuple[type[Event], ...] = (
    RunStart,
    RunEnd,
    TurnStart,
    TextDelta,
    ThinkingDelta,
    ToolInputDelta,
    AttemptReset,
    RetryScheduled,
    Response,
    StreamSuccess,
    StreamFailure,
    TurnEnd,
    ToolCallReceived,
    ToolPre,
    ToolPost,
    Compaction,
    Fallback,
    ModelSwitched,
    LoopDetectedEvent,
    ConvergenceDetected,
    SteeringDelivered,
    RunResumed,
    OutputValidationFailed,
    ApprovalRequested,
    ApprovalResolved,
)

#: Observer method name for each event class (``on_`` + its ``TYPE``).
EVENT_METHODS: dict[type[Event], str] = {cls: cls.observer_method() for cls in EVENTS}

EVENT_TYPES: dict[str, type[Event]] = {cls.TYPE: cls for cls in EVENTS}


__all__ = [
    "EVENT_METHODS",
    "EVENTS",
    "EVENT_TYPES",
    "ApprovalRequested",
    "ApprovalResolved",
    "AttemptReset",
    "Compaction",
    "ConvergenceDetected",
    "Fallback",
    "LoopDetectedEvent",
    "ModelSwitched",
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
