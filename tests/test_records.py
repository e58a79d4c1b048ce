"""The audit trail: Session, Run, Turn — derived totals and JSON round trips."""

from __future__ import annotations

import time
from typing import Any

import pytest
from support import via_json

from loopctl.config import ParallelDispatch, RunConfig
from loopctl.errors import (
    Cancelled,
    ContextExceeded,
    FallbackExhausted,
    LoopError,
    MaxTurnsExceeded,
    ModelError,
    RateLimitEscalation,
    ToolRecoveryExhausted,
)
from loopctl.messages import StopReason, ToolCallPart
from loopctl.records import Run, Session, Turn


def two_turn_run() -> Run:
    calls = (ToolCallPart("c1", "read", {"path": "a"}), ToolCallPart("c2", "grep", {"q": "x"}))
    return Run(
        id="run-1",
        input="look around",
        output="found it",
        turns=[
            Turn(0, "look around", "", calls, 100, 20, StopReason.TOOL_CALL),
            Turn(1, "out a", "found it", (), 150, 7, StopReason.END_TURN),
        ],
        config=RunConfig(max_turns=5, parallel=ParallelDispatch("sequential", 2)),
        start=1000.0,
        end=1002.5,
    )


def test_run_totals_are_derived_from_its_turns() -> None:
    run = two_turn_run()
    assert run.turn_count == 2
    assert run.input_tokens == 250
    assert run.output_tokens == 27
    assert run.total_tokens == 277
    assert run.tool_call_count == 2
    assert run.duration == pytest.approx(2.5)
    run.turns.append(Turn(2, "q", "a", (ToolCallPart("c3", "x", {}),), 1, 1))
    assert (run.turn_count, run.input_tokens, run.tool_call_count) == (3, 251, 3)


def test_a_new_run_has_no_turns_and_zero_totals() -> None:
    run = Run(id="r", input="hi")
    assert (run.turn_count, run.input_tokens, run.output_tokens, run.tool_call_count) == (0, 0, 0, 0)
    assert run.output is None and run.end is None and run.stop_reason is None
    assert run.config == RunConfig()
    assert not run.succeeded


def test_duration_counts_to_now_while_in_flight() -> None:
    run = Run(id="r", input="hi", start=time.time() - 30.0)
    assert 30.0 <= run.duration < 300.0
    run.end = run.start + 1.25
    assert run.duration == pytest.approx(1.25)


def test_succeeded_means_ended_without_error() -> None:
    run = Run(id="r", input="hi", start=1.0, end=2.0)
    assert run.succeeded
    run.stop_reason = Cancelled()
    assert not run.succeeded


def test_session_totals_and_current_run() -> None:
    session = Session(id="s")
    assert session.current_run is None
    assert session.total_turns == 0
    first, second = two_turn_run(), Run(id="run-2", input="again")
    session.runs.extend([first, second])
    assert session.current_run is second
    assert session.total_turns == 2


def test_turn_defaults_and_conversions() -> None:
    turn = Turn(0, "q", "a")
    assert (turn.tool_calls, turn.input_tokens, turn.output_tokens) == ((), 0, 0)
    assert turn.stop_reason is StopReason.END_TURN
    # a list of calls and a plain stop-reason string are normalised
    call = ToolCallPart("c", "t", {})
    turn = Turn(1, "q", "a", [call], stop_reason="max_tokens")  # type: ignore[arg-type]
    assert turn.tool_calls == (call,)
    assert turn.stop_reason is StopReason.MAX_TOKENS
    with pytest.raises(ValueError):
        Turn(1, "q", "a", stop_reason="exploded")  # type: ignore[arg-type]


def test_turn_round_trips_through_json() -> None:
    for turn in two_turn_run().turns:
        assert Turn.from_dict(via_json(turn.to_dict())) == turn


def test_successful_run_round_trips_through_json() -> None:
    run = two_turn_run()
    data = run.to_dict()
    back = Run.from_dict(via_json(data))
    assert back.to_dict() == data
    assert (back.id, back.input, back.output, back.start, back.end) == (
        "run-1",
        "look around",
        "found it",
        1000.0,
        1002.5,
    )
    assert back.turns == run.turns
    assert back.config == run.config
    assert back.stop_reason is None
    assert (back.turn_count, back.input_tokens, back.tool_call_count) == (2, 250, 2)


@pytest.mark.parametrize(
    ("error", "fields"),
    [
        (ContextExceeded(used=5000, limit=4000), {"used": 5000, "limit": 4000}),
        (MaxTurnsExceeded(3), {"max_turns": 3}),
        (ToolRecoveryExhausted("deploy", 6), {"tool": "deploy", "attempts": 6}),
        (ModelError("bad gateway", status=502, retryable=True), {"status": 502, "retryable": True}),
        (RateLimitEscalation(4, 2.5), {"attempts": 4, "retry_after": 2.5}),
        (FallbackExhausted(("big", "small")), {"models": ("big", "small")}),
        (Cancelled("user pressed stop"), {"reason": "user pressed stop"}),
        (LoopError("plain"), {}),
    ],
)
def test_failed_run_keeps_its_error_type_message_and_fields(
    error: LoopError, fields: dict[str, Any]
) -> None:
    run = two_turn_run()
    run.stop_reason = error
    error.run = run  # the driver attaches the record; it must not recurse
    back = Run.from_dict(via_json(run.to_dict()))
    err = back.stop_reason
    assert type(err) is type(error)
    assert str(err) == str(error)
    for name, value in fields.items():
        assert getattr(err, name) == value
    assert not back.succeeded


def test_unknown_error_type_comes_back_as_a_loop_error() -> None:
    data = two_turn_run().to_dict()
    for name in ("NoSuchError", "Optional", "annotations", "ValueError"):
        data["stop_reason"] = {"type": name, "message": "something broke"}
        err = Run.from_dict(data).stop_reason
        assert type(err) is LoopError
        assert str(err) == "something broke"


def test_run_from_dict_fills_defaults_for_missing_keys() -> None:
    run = Run.from_dict({"id": "r"})
    assert (run.id, run.input, run.output, run.turns, run.config) == ("r", "", None, [], RunConfig())
