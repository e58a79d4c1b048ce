"""The ``loopctl`` command's live run view: a run's events as lines.

``LiveView`` is the observer that turns a run's events into what a person
sees on the ``Console`` (``loopctl.demo.console``): the model's waiting
line, each retry with its cause, tool calls and their results, delivered
guidance. ``RunFacts`` notes what the command needs (the first turn, token
usage). It never touches a loop: ``loopctl.demo.cli`` wires these pieces
to one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any, Callable, Optional

from loopctl.demo.console import Console, cells, fit, printable, seconds
from loopctl.demo.terminal import StdinLines
from loopctl.events import (
    AttemptReset,
    LoopDetectedEvent,
    Observer,
    Response,
    RetryScheduled,
    RunStart,
    SteeringDelivered,
    StreamFailure,
    StreamSuccess,
    ThinkingDelta,
    ToolCallReceived,
    ToolInputDelta,
    ToolPost,
    ToolPre,
    TurnStart,
)


def _args_text(input: Mapping[str, Any]) -> str:
    return printable(", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in input.items()))


def _indent(event: Any) -> str:
    """Two spaces, plus two per sub-agent level: a sub-agent's calls sit under its parent's call."""
    path = event.subagent
    return "  " * (2 + path.count("/")) if path else "  "


def _one_line(text: str, limit: int = 200) -> str:
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class RunFacts(Observer):
    """What the command needs to know about the run in flight.

    ``started`` is set at the first turn (the steering slot is open by
    then; ``on_first_turn`` runs just before it is set); ``usage_known``/``usage_unknown`` count served turns with and
    without token usage from the server.
    """

    def __init__(self, on_first_turn: Optional[Callable[[], None]] = None) -> None:
        self.started = threading.Event()
        self._on_first_turn = on_first_turn
        self.usage_known = 0
        self.usage_unknown = 0

    def on_run_start(self, event: RunStart) -> None:
        """A new run: the counts start again (a sub-agent's run is part of the run)."""
        if not event.subagent:
            self.usage_known = self.usage_unknown = 0

    def on_turn_start(self, event: TurnStart) -> None:
        """The slot is open by now: typed guidance may be pushed."""
        if not self.started.is_set():
            if self._on_first_turn is not None:
                self._on_first_turn()
            self.started.set()

    def on_stream_success(self, event: StreamSuccess) -> None:
        """A served turn: did the server say how many tokens it took?"""
        if event.usage is None:
            self.usage_unknown += 1
        else:
            self.usage_known += 1


class LiveView(Observer):
    """Shows a run as it happens: waiting, tool calls, results, guidance, retries.

    Args:
        console: where it draws.
        streaming: reply text arrives through the text streamer (else whole).
        model: the model name the waiting line shows.
    """

    def __init__(self, console: Console, *, streaming: bool, model: str = "the model") -> None:
        self.console = console
        self.streaming = streaming
        self.model = model
        self._labels: dict[str, str] = {}
        self._retry_shown = False  # the next attempt reset is that retry's own
        self.attempts = 1  # tries of the turn's model call so far (for the error line)
        self.rescued = False  # after the last try, one more was made without streaming

    def on_turn_start(self, event: TurnStart) -> None:
        """The model is asked: a waiting line until its first token."""
        self.attempts, self.rescued = 1, False
        self.console.waiting(f"waiting for {self.model}")

    def on_thinking_delta(self, event: ThinkingDelta) -> None:
        """The model is answering (reasoning)."""
        self.console.waiting(None)

    def on_tool_input_delta(self, event: ToolInputDelta) -> None:
        """The model is answering (a tool call)."""
        self.console.waiting(None)

    def on_response(self, event: Response) -> None:
        """Without streaming, a turn's text is shown whole (a sub-agent's always, indented)."""
        self.console.waiting(None)
        if event.subagent:
            if event.text:
                self.console.line(f"{_indent(event)}[{printable(event.subagent)}] {_one_line(event.text)}", "dim")
            return
        if self.streaming:
            self.console.end_text()
        elif event.text:
            self.console.line(printable(event.text))

    def on_stream_failure(self, event: StreamFailure) -> None:
        """The model call failed for good."""
        self.console.waiting(None)

    def on_retry_scheduled(self, event: RetryScheduled) -> None:
        """A failed model call will be tried again: its cause and the wait."""
        self._retry_shown = True
        self.attempts = event.attempt
        self.console.line(f"  [{_one_line(event.cause)}: retrying in {seconds(event.wait_s)}, "
                          f"attempt {event.attempt}/{event.max_attempts}]", "yellow")
        self.console.waiting(f"retrying {event.model or self.model} "
                             f"(attempt {event.attempt}/{event.max_attempts})")

    def on_tool_call_received(self, event: ToolCallReceived) -> None:
        """The call and its arguments, as soon as the model asks."""
        c = self.console
        c.waiting(None)
        tool, args = _one_line(event.tool), _args_text(event.input)
        self._labels[event.call_id] = f"{tool}({args})"
        c.line(f"{_indent(event)}{c.style('>', 'cyan')} {c.style(tool, 'cyan', 'bold')}({args})")

    def on_tool_pre(self, event: ToolPre) -> None:
        """The spinner starts for this call."""
        self.console.tool_started(event.call_id, self._labels.get(event.call_id, event.tool))

    def on_tool_post(self, event: ToolPost) -> None:
        """The result (or soft error) and how long it took."""
        c = self.console
        c.tool_finished(event.call_id)
        mark = c.style("!", "red") if event.is_error else c.style("<", "green")
        body = c.style(_one_line(event.output), "red") if event.is_error else _one_line(event.output)
        c.line(f"{_indent(event)}{mark} {_one_line(event.tool)}: {body} "
               f"{c.style(f'({event.duration_ms:.0f} ms)', 'dim')}")

    def on_steering(self, event: SteeringDelivered) -> None:
        """Guidance landed in the conversation."""
        for msg in event.messages:
            self.console.line(f"  [guidance delivered: {_one_line(msg.text)}]", "yellow")

    def on_output_validation_failed(self, event: Any) -> None:
        """A typed answer did not fit: its first problem, and whether the model is asked again."""
        first = _one_line(event.errors[0]) if event.errors else "no details"
        again = "asking again" if event.attempt < event.max_attempts else "giving up"
        self.console.line(f"  [answer does not fit: {first}; {again} ({event.attempt}/{event.max_attempts})]", "yellow")

    def on_attempt_reset(self, event: AttemptReset) -> None:
        """The reply starts again: said once (the retry line already gave its cause).

        A reset with no retry before it is the last resort after the last
        try failed: one more request, for the whole reply at once.
        """
        if self._retry_shown:
            self._retry_shown = False
            return
        self.rescued = True
        tries = f"{self.attempts} tries" if self.attempts != 1 else "1 try"
        self.console.line(f"  [still no reply after {tries}: asking once more, for the whole reply at once]",
                          "yellow")

    def on_loop_detected(self, event: LoopDetectedEvent) -> None:
        """A repeating tool pattern."""
        self.console.line(f"  [repeating tool calls: {_one_line(str(event.pattern))} x{event.repetitions}]", "yellow")


__all__ = ["Console", "LiveView", "RunFacts", "StdinLines", "cells", "fit", "printable", "seconds"]
