"""Happenings on a run's span: compaction, steering, fallbacks, detections, approvals.

``RunSpanEvents`` is the part of ``OTelObserver`` that adds span events to
a run's ``invoke_agent`` span, each stamped when it happened. Text that
quotes the conversation (steering messages, a loop's pattern) is recorded
only with ``record_content``.
"""

from __future__ import annotations

import time
from typing import Any

from loopctl.events import (
    Compaction,
    ConvergenceDetected,
    Fallback,
    LoopDetectedEvent,
    ModelSwitched,
    Observer,
    SteeringDelivered,
)

from . import conventions as cv
from .spans import RunState, run_key


class RunSpanEvents(Observer):
    """Observer methods that add span events to the run's span (state lives on the subclass)."""

    _runs: dict[str, RunState]
    record_content: bool

    def _run_event(self, run_id: str, name: str, attrs: dict[str, Any]) -> None:
        st = self._runs.get(run_id)
        if st is not None:
            st.span.add_event(name, attrs, timestamp=time.time_ns())

    def on_compaction(self, event: Compaction) -> None:
        """The conversation was compacted."""
        self._run_event(
            run_key(event),
            cv.EV_COMPACTION,
            {
                "loopctl.compaction.reason": event.reason,
                "loopctl.compaction.tokens_before": event.tokens_before,
                "loopctl.compaction.tokens_after": event.tokens_after,
            },
        )

    def on_steering(self, event: SteeringDelivered) -> None:
        """Guidance landed in the conversation (its text only with ``record_content``)."""
        attrs: dict[str, Any] = {cv.TURN: event.turn, "loopctl.steering.count": len(event.messages)}
        if self.record_content:
            attrs["loopctl.steering.messages"] = tuple(cv.clean(m.text) for m in event.messages)
        self._run_event(run_key(event), cv.EV_STEERING, attrs)

    def on_fallback(self, event: Fallback) -> None:
        """Requests moved to a fallback model."""
        self._run_event(
            run_key(event), cv.EV_FALLBACK, {"loopctl.model.from": event.from_model, "loopctl.model.to": event.to_model}
        )

    def on_model_switched(self, event: ModelSwitched) -> None:
        """The serving model changed."""
        self._run_event(
            run_key(event),
            cv.EV_MODEL_SWITCHED,
            {"loopctl.model.from": event.from_model, "loopctl.model.to": event.to_model},
        )

    def on_loop_detected(self, event: LoopDetectedEvent) -> None:
        """A repeating tool pattern (the pattern's text, which quotes inputs, only with content)."""
        attrs: dict[str, Any] = {"loopctl.loop.repetitions": event.repetitions}
        if self.record_content:
            attrs["loopctl.loop.pattern"] = cv.clean(event.pattern)
        self._run_event(run_key(event), cv.EV_LOOP_DETECTED, attrs)

    def on_convergence_detected(self, event: ConvergenceDetected) -> None:
        """The final answers converged."""
        self._run_event(
            run_key(event),
            cv.EV_CONVERGENCE,
            {
                "loopctl.convergence.action": event.action,
                "loopctl.convergence.similarity": float(event.similarity),
                "loopctl.convergence.count": event.count,
            },
        )

    def on_approval_requested(self, event: object) -> None:
        """A tool call waits for a person's approval."""
        self._run_event(run_key(event), cv.EV_APPROVAL_REQUESTED, _approval_attrs(event))

    def on_approval_resolved(self, event: object) -> None:
        """A pending approval was granted or denied."""
        attrs = _approval_attrs(event)
        approved = getattr(event, "approved", None)
        if isinstance(approved, bool):
            attrs["loopctl.approval.approved"] = approved
        self._run_event(run_key(event), cv.EV_APPROVAL_RESOLVED, attrs)


def _approval_attrs(event: object) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    call_id = getattr(event, "call_id", None)
    tool = getattr(event, "tool", None)
    if isinstance(call_id, str):
        attrs[cv.TOOL_CALL_ID] = call_id
    if isinstance(tool, str):
        attrs[cv.TOOL_NAME] = tool
    return attrs


__all__ = ["RunSpanEvents"]
