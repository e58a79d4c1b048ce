"""The ONLY caller of observers and run hooks.

Observers are called in registration order; one that raises is logged with
its name and skipped. An event object is built only when someone listens
(an observer that overrides its method, or the run's tap), so a loop with
no observers pays almost nothing per event. Run-start goes to observers
then hooks; run-end to hooks then observers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from loopctl.hooks import HookExecutor, RunHookContext
from loopctl.messages import Message, StopReason, Usage
from loopctl.observers import (
    EVENT_METHODS,
    AttemptReset,
    Compaction,
    ConvergenceDetected,
    Event,
    Fallback,
    LoopDetectedEvent,
    ModelSwitched,
    Observer,
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

log = logging.getLogger("loopctl")

Listener = Callable[[Any], None]


def _label(observer: Observer, fn: Listener) -> str:
    """The observer's class name, plus the callable's name when it is not a method of it."""
    name = type(observer).__name__
    if getattr(fn, "__self__", None) is observer:
        return name
    return f"{name}({getattr(fn, '__qualname__', None) or type(fn).__name__})"


class Emitter:
    """Fans events out to observers, the run's tap, and run hooks."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.run_id = ""
        self.observers: list[Observer] = []
        self.hooks: Optional[HookExecutor] = None
        self.tap: Optional[Callable[[Event], None]] = None
        self._table: dict[type[Event], tuple[Listener, ...]] = {cls: () for cls in EVENT_METHODS}
        self._labels: dict[int, str] = {}  # id(listener) -> the name logged when it raises

    def add_observer(self, observer: Observer) -> None:
        """Register ``observer`` (duplicates are called twice)."""
        self.observers.append(observer)
        for cls, name in EVENT_METHODS.items():
            fn = getattr(observer, name, None)
            if fn is None:
                continue
            base = getattr(Observer, name)
            if getattr(fn, "__func__", None) is base:
                continue  # the no-op default: skip it entirely
            self._table[cls] = self._table[cls] + (fn,)
            self._labels[id(fn)] = _label(observer, fn)

    def wants(self, cls: type[Event]) -> bool:
        """True when an event of ``cls`` would reach anyone."""
        return bool(self._table[cls]) or self.tap is not None

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to the tap, then observers in order; contain failures."""
        tap = self.tap
        if tap is not None:
            try:
                tap(event)
            except Exception:
                log.exception("event tap raised on %s", type(event).__name__)
        for fn in self._table[type(event)]:
            try:
                fn(event)
            except Exception:
                log.exception(
                    "observer %s raised in %s; skipped",
                    self._labels.get(id(fn), repr(fn)),
                    EVENT_METHODS[type(event)],
                )

    # -- one method per event (build only when someone listens) ---------------

    def run_start(self, input: str) -> None:
        if self.wants(RunStart):
            self.emit(RunStart(self.session_id, self.run_id, input))
        if self.hooks is not None:
            self.hooks.run_start(RunHookContext(self.session_id, self.run_id, input))

    def run_resumed(self, input: str, attempt: int, cause: str, turn: int) -> None:
        if self.wants(RunResumed):
            self.emit(RunResumed(self.session_id, self.run_id, attempt, cause, turn))
        if self.hooks is not None:  # this process never ran the run's start hooks
            self.hooks.run_start(RunHookContext(self.session_id, self.run_id, input))

    def run_end(
        self, input: str, success: bool, error: Optional[str], total_turns: int, duration_ms: float
    ) -> None:
        if self.hooks is not None:
            self.hooks.run_end(RunHookContext(self.session_id, self.run_id, input), success, error)
        if self.wants(RunEnd):
            self.emit(RunEnd(self.session_id, self.run_id, success, error, total_turns, duration_ms))

    def turn_start(self, turn: int, query: str) -> None:
        if self.wants(TurnStart):
            self.emit(TurnStart(self.session_id, self.run_id, turn, query))

    def text_delta(self, turn: int, delta: str) -> None:
        if self.wants(TextDelta):
            self.emit(TextDelta(self.session_id, self.run_id, turn, delta))

    def thinking_delta(self, turn: int, delta: str) -> None:
        if self.wants(ThinkingDelta):
            self.emit(ThinkingDelta(self.session_id, self.run_id, turn, delta))

    def tool_input_delta(self, turn: int, call_id: str, tool: str, delta: str) -> None:
        if self.wants(ToolInputDelta):
            self.emit(ToolInputDelta(self.session_id, self.run_id, turn, call_id, tool, delta))

    def attempt_reset(self, turn: int, attempt: int) -> None:
        if self.wants(AttemptReset):
            self.emit(AttemptReset(self.session_id, self.run_id, turn, attempt))

    def retry_scheduled(
        self, turn: int, model: str, cause: str, wait_s: float, attempt: int, max_attempts: int
    ) -> None:
        if self.wants(RetryScheduled):
            self.emit(
                RetryScheduled(
                    self.session_id, self.run_id, turn, model, cause, wait_s, attempt, max_attempts
                )
            )

    def response(self, turn: int, text: str, usage: Optional[Usage]) -> None:
        if self.wants(Response):
            self.emit(Response(self.session_id, self.run_id, turn, text, usage))

    def stream_success(self, turn: int, model: str, usage: Optional[Usage]) -> None:
        if self.wants(StreamSuccess):
            self.emit(StreamSuccess(self.session_id, self.run_id, turn, model, usage))

    def stream_failure(self, turn: int, model: str, error: str) -> None:
        if self.wants(StreamFailure):
            self.emit(StreamFailure(self.session_id, self.run_id, turn, model, error))

    def turn_end(
        self,
        turn: int,
        phase: str,
        success: bool,
        error: Optional[str],
        duration_ms: float,
        input_tokens: int,
        output_tokens: int,
        stop_reason: Optional[StopReason],
        context_tokens: int,
        context_window: Optional[int],
    ) -> None:
        if self.wants(TurnEnd):
            self.emit(
                TurnEnd(
                    self.session_id,
                    self.run_id,
                    turn,
                    phase,
                    success,
                    error,
                    duration_ms,
                    input_tokens,
                    output_tokens,
                    stop_reason,
                    context_tokens,
                    context_window,
                )
            )

    def tool_call_received(
        self, turn: int, call_id: str, tool: str, input: Mapping[str, Any]
    ) -> None:
        if self.wants(ToolCallReceived):
            self.emit(ToolCallReceived(self.session_id, self.run_id, turn, call_id, tool, input))

    def tool_pre(self, turn: int, call_id: str, tool: str, attempt: int) -> None:
        if self.wants(ToolPre):
            self.emit(ToolPre(self.session_id, self.run_id, turn, call_id, tool, attempt))

    def tool_post(
        self,
        turn: int,
        call_id: str,
        tool: str,
        attempt: int,
        is_error: bool,
        duration_ms: float,
        output: str,
        result_hash: str,
    ) -> None:
        if self.wants(ToolPost):
            self.emit(
                ToolPost(
                    self.session_id,
                    self.run_id,
                    turn,
                    call_id,
                    tool,
                    attempt,
                    is_error,
                    duration_ms,
                    output,
                    result_hash,
                )
            )

    def compaction(self, reason: str, tokens_before: int, tokens_after: int) -> None:
        if self.wants(Compaction):
            self.emit(Compaction(self.session_id, self.run_id, reason, tokens_before, tokens_after))

    def fallback(self, from_model: str, to_model: str) -> None:
        if self.wants(Fallback):
            self.emit(Fallback(self.session_id, self.run_id, from_model, to_model))

    def model_switched(self, from_model: str, to_model: str) -> None:
        if self.wants(ModelSwitched):
            self.emit(ModelSwitched(self.session_id, self.run_id, from_model, to_model))

    def loop_detected(self, pattern: str, repetitions: int) -> None:
        if self.wants(LoopDetectedEvent):
            self.emit(LoopDetectedEvent(self.session_id, self.run_id, pattern, repetitions))

    def convergence_detected(self, action: str, similarity: float, count: int) -> None:
        if self.wants(ConvergenceDetected):
            self.emit(ConvergenceDetected(self.session_id, self.run_id, action, similarity, count))

    def steering(self, turn: int, messages: Sequence[Message]) -> None:
        if self.wants(SteeringDelivered):
            self.emit(SteeringDelivered(self.session_id, self.run_id, turn, tuple(messages)))


__all__ = ["Emitter"]
