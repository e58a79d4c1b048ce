"""The brain and typed answers: a final reply is read, accepted, or answered and asked again.

Driven by plain calls with the real ``OutputCheck`` (pure), no threads.
"""

from __future__ import annotations

import attrs
import pytest

from loopctl.errors import OutputValidationError
from loopctl.machine import (
    CallLLM,
    CallTools,
    Completed,
    Done,
    Failed,
    LoopMachine,
    MachinePolicy,
)
from loopctl.messages import Message, ModelResponse, StopReason, ToolCallPart
from loopctl.output import OutputCheck, OutputSpec

POLICY = MachinePolicy(max_turns=10, context_window=0)


@attrs.frozen
class City:
    name: str
    population: int


def _text(text: str, stop: StopReason = StopReason.END_TURN) -> ModelResponse:
    return ModelResponse(Message.assistant(text), stop)


def _calls(*calls: tuple[str, dict[str, object]]) -> ModelResponse:
    parts = tuple(ToolCallPart(f"c{i}", name, inp) for i, (name, inp) in enumerate(calls))
    return ModelResponse(Message.assistant("", parts), StopReason.TOOL_CALL)


def _machine(mode: str = "native", retries: int = 2) -> LoopMachine:
    m = LoopMachine()
    m.accept_input("a city please", OutputCheck(OutputSpec.of(City), mode, retries))
    assert m.next_step(POLICY) == CallLLM(0)
    return m


def test_a_fitting_answer_completes_with_the_value_and_the_text() -> None:
    m = _machine()
    m.model_response(_text('{"name": "Oslo", "population": 7}'), 0, ())
    step = m.next_step(POLICY)
    assert step == Done(Completed('{"name": "Oslo", "population": 7}', City("Oslo", 7)))
    assert m.answer_rejected is None


def test_an_answer_that_does_not_fit_is_answered_with_its_problems_and_asked_again() -> None:
    m = _machine()
    m.model_response(_text('{"name": "Oslo"}'), 0, ())
    rejected = m.answer_rejected
    assert rejected is not None and rejected.attempt == 1 and rejected.max_attempts == 3
    assert "missing required field 'value.population'" in rejected.errors[0]
    assert m.next_step(POLICY) == CallLLM(1)
    assert m.next_step(POLICY) == CallLLM(1)  # asking twice changes nothing
    feedback = m.pending[-1]
    assert feedback.role == "user" and "value.population" in feedback.text
    m.model_response(_text('{"name": "Oslo", "population": 7}'), 0, ())
    outcome = m.next_step(POLICY)
    assert isinstance(outcome, Done) and outcome.outcome == Completed(
        '{"name": "Oslo", "population": 7}', City("Oslo", 7)
    )


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_after_the_retries_the_run_fails_with_the_raw_text_and_errors(retries: int) -> None:
    m = _machine(retries=retries)
    for _ in range(retries + 1):
        assert isinstance(m.next_step(POLICY), CallLLM)
        m.model_response(_text("prose, not JSON"), 0, ())
    step = m.next_step(POLICY)
    assert isinstance(step, Done) and isinstance(step.outcome, Failed)
    error = step.outcome.error
    assert isinstance(error, OutputValidationError)
    assert error.raw_text == "prose, not JSON" and "not valid JSON" in error.errors[0]
    assert m.turns_taken == retries + 1  # each re-ask was a turn


def test_rejections_count_against_max_turns() -> None:
    m = _machine(retries=5)
    policy = MachinePolicy(max_turns=2, context_window=0)
    m.model_response(_text("no"), 0, ())
    assert isinstance(m.next_step(policy), CallLLM)
    m.model_response(_text("no"), 0, ())
    step = m.next_step(policy)
    assert isinstance(step, Done) and type(step.outcome).__name__ == "MaxTurnsReached"


def test_tool_mode_a_final_answer_call_completes_and_stays_as_text() -> None:
    m = _machine("tool")
    m.model_response(_calls(("final_answer", {"name": "Rome", "population": 3})), 0, {"final_answer"})
    step = m.next_step(POLICY)
    assert isinstance(step, Done) and step.outcome == Completed(
        '{"name": "Rome", "population": 3}', City("Rome", 3)
    )
    last = m.pending[-1]
    assert last.role == "assistant" and not last.tool_calls and last.text == '{"name": "Rome", "population": 3}'


def test_tool_mode_other_tools_run_before_the_final_answer() -> None:
    m = _machine("tool")
    m.model_response(_calls(("lookup", {"q": "rome"})), 0, {"final_answer", "lookup"})
    assert isinstance(m.next_step(POLICY), CallTools)


def test_tool_mode_two_final_answers_in_one_reply_are_refused_and_every_call_answered() -> None:
    m = _machine("tool")
    one = {"name": "Rome", "population": 3}
    m.model_response(_calls(("final_answer", one), ("final_answer", one), ("lookup", {})), 0, {"final_answer", "lookup"})
    assert m.answer_rejected is not None and "called 2 times" in m.answer_rejected.errors[0]
    results = m.pending[-1].tool_results
    assert [r.tool_call_id for r in results] == ["c0", "c1", "c2"]
    assert all(r.is_error for r in results)
    assert "not run" in results[2].output and "called 2 times" in results[0].output
    assert m.next_step(POLICY) == CallLLM(1)


def test_a_reply_cut_off_at_max_tokens_says_so() -> None:
    m = _machine()
    m.model_response(_text('{"name": "Os', StopReason.MAX_TOKENS), 0, ())
    assert m.answer_rejected is not None and "max_tokens" in m.answer_rejected.errors[0]


def test_a_run_without_an_answer_type_completes_on_any_text() -> None:
    m = LoopMachine()
    m.accept_input("hi")
    m.next_step(POLICY)
    m.model_response(_text("prose"), 0, ())
    assert m.next_step(POLICY) == Done(Completed("prose"))
