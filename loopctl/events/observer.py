"""``Observer``: a documented no-op ``on_*`` method per event; override the ones you want.

An event's method is ``on_`` + its ``TYPE`` (``EVENT_METHODS``). Observers
are called only from the run's emitter: one that raises is logged and
skipped, and never changes the run.
"""

from __future__ import annotations

from typing import Any

from loopctl.events.types import (
    EVENT_METHODS,
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

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        for method in EVENT_METHODS.values():
            setattr(self, method, fn)


__all__ = ["CallbackObserver", "Observer"]
