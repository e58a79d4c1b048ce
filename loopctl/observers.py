"""Observer events and the ``Observer`` base class.

Every event is a frozen attrs class carrying ``session_id`` and ``run_id``
first, then its own fields. ``to_dict()`` gives a JSON-safe dict (no
``NaN``/``Infinity``, every string masked by ``loopctl.text.redact``) with a
``type`` field (``"turn_start"``, ``"text_delta"``, ...). ``redacted()`` is
what the emitter delivers: the event with every text masked and its quotes
of untrusted text (``error``, ``cause``, ``errors``, ...) cut to an excerpt.

``EVENTS`` lists every event class once; an event's observer method is
``on_`` + its ``TYPE`` (``observer_method()``). ``Observer`` has a
documented no-op ``on_*`` method per event; override the ones you want. Observers are called only from ``loopctl.driver.emission``: one that
raises is logged and skipped, and never changes the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Optional

import attrs

from loopctl.messages import Message, StopReason, Usage
from loopctl.text import json_safe, redact, redact_fields

#: Fields that quote untrusted text (an error, a cause, a pattern of tool input):
#: masked and cut to an excerpt. Every other text field is masked, never cut.
QUOTED_FIELDS = frozenset(("error", "cause", "errors", "pattern", "reason"))
_IDS = frozenset(("session_id", "run_id"))


def _json_safe(value: object) -> object:
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return json_safe(value)
    if isinstance(value, str):
        return redact(str(value))
    if isinstance(value, (Usage, Message)):
        return _json_safe(value.to_dict())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return str(value)


@attrs.frozen
class Event:
    """Base of every observer event.

    ``subagent`` is ``""`` for the run's own events; an event a sub-agent's
    run emitted, carried to its parent's observers, holds the sub-agent's
    path (``"research"``, or ``"research/search"`` one level deeper) and the
    parent's ``run_id``.
    """

    TYPE: ClassVar[str] = "event"

    session_id: str
    run_id: str
    subagent: str = attrs.field(default="", kw_only=True)

    @classmethod
    def observer_method(cls) -> str:
        """The ``Observer`` method that receives this event: ``on_`` + its ``TYPE``."""
        return f"on_{cls.TYPE}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict with a ``type`` field naming the event (texts masked, floats finite)."""
        out: dict[str, Any] = {"type": self.TYPE}
        for f in attrs.fields(type(self)):
            out[f.name] = _json_safe(getattr(self, f.name))
        return out

    def redacted(self) -> Event:
        """This event with every text masked and its quotes cut to an excerpt (itself if none changed)."""
        return redact_fields(self, QUOTED_FIELDS, _IDS)


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
    None for a client that names none), as on every model event.
    """

    TYPE: ClassVar[str] = "turn_start"
    turn: int
    query: str
    provider: Optional[str] = None


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


class Observer:
    """Watches a loop. Every method is a no-op; override what you need.

    Methods run on the run's thread, in registration order. One that raises
    is logged with its name and skipped; it never changes the run.
    """

    def on_run_start(self, event: RunStart) -> None:
        """A run began (before its first turn)."""

    def on_run_end(self, event: RunEnd) -> None:
        """A run ended, success or failure (its last event)."""

    def on_turn_start(self, event: TurnStart) -> None:
        """A model call is about to be made."""

    def on_text_delta(self, event: TextDelta) -> None:
        """A fragment of streamed reply text arrived."""

    def on_thinking_delta(self, event: ThinkingDelta) -> None:
        """A fragment of streamed reasoning arrived."""

    def on_tool_input_delta(self, event: ToolInputDelta) -> None:
        """A fragment of a tool call's arguments arrived."""

    def on_attempt_reset(self, event: AttemptReset) -> None:
        """A stream attempt failed and a new one starts: drop its buffered text."""

    def on_retry_scheduled(self, event: RetryScheduled) -> None:
        """A failed model call will be retried after ``event.wait_s`` seconds."""

    def on_response(self, event: Response) -> None:
        """A served turn's reply was assembled."""

    def on_stream_success(self, event: StreamSuccess) -> None:
        """A model call succeeded."""

    def on_stream_failure(self, event: StreamFailure) -> None:
        """A model call failed (not on cancel)."""

    def on_turn_end(self, event: TurnEnd) -> None:
        """A turn phase ended (``phase`` "llm" or "tools")."""

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        """The model asked for a tool call."""

    def on_tool_pre(self, event: ToolPre) -> None:
        """A tool call attempt is about to run."""

    def on_tool_post(self, event: ToolPost) -> None:
        """A tool call attempt finished."""

    def on_compaction(self, event: Compaction) -> None:
        """The conversation was compacted."""

    def on_fallback(self, event: Fallback) -> None:
        """Requests moved to a fallback model."""

    def on_model_switched(self, event: ModelSwitched) -> None:
        """The serving model changed."""

    def on_loop_detected(self, event: LoopDetectedEvent) -> None:
        """A repeating tool pattern was detected."""

    def on_convergence_detected(self, event: ConvergenceDetected) -> None:
        """The final answers converged."""

    def on_steering(self, event: SteeringDelivered) -> None:
        """Pushed guidance landed in the conversation."""

    def on_run_resumed(self, event: RunResumed) -> None:
        """A durable run continues on this worker from its last checkpoint."""

    def on_output_validation_failed(self, event: OutputValidationFailed) -> None:
        """A typed answer did not fit; the model is asked again unless attempts are used up."""

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        """A tool call waits for a person's approval (answer it from any thread)."""

    def on_approval_resolved(self, event: ApprovalResolved) -> None:
        """A waiting tool call was approved or denied."""


class CallbackObserver(Observer):
    """An observer that hands every event to one callable (``fn(event)``)."""

    def __init__(self, fn: object) -> None:
        self._fn = fn
        for method in EVENT_METHODS.values():
            setattr(self, method, fn)


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
