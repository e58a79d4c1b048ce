"""The brain, driven by plain calls: every branch of the decision order.

No threads, no sleeps, no driver: each test feeds ``LoopMachine`` exactly
what the driver would and checks the step it answers, at the exact
boundaries of SPEC §3 (window 1000: emergency line 950 inclusive,
threshold line 800 strict).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from loopctl.errors import ContextExceeded, LoopError, ModelError
from loopctl.machine import (
    CallLLM,
    CallTools,
    CancelledOutcome,
    Compact,
    Completed,
    Done,
    Failed,
    LoopMachine,
    MachinePolicy,
    MachineState,
    MaxTurnsReached,
    PendingToolCall,
)
from loopctl.messages import (
    Message,
    ModelResponse,
    StopReason,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
)

WINDOW = 1000
EMERGENCY = 950  # 1000 * 95 // 100
THRESHOLD = 800  # 1000 * 80 // 100
POLICY = MachinePolicy(max_turns=10, context_window=WINDOW, compact_threshold=80, auto_compact=True)
TOOLS = ("read", "write")

_ids = itertools.count(1)


def policy(**changes: object) -> MachinePolicy:
    base = {
        "max_turns": POLICY.max_turns,
        "context_window": POLICY.context_window,
        "compact_threshold": POLICY.compact_threshold,
        "auto_compact": POLICY.auto_compact,
    }
    base.update(changes)
    return MachinePolicy(**base)  # type: ignore[arg-type]


def tool_reply(*names: str, text: str = "") -> ModelResponse:
    parts = [ToolCallPart(f"c{next(_ids)}", n, {"n": i}) for i, n in enumerate(names)]
    return ModelResponse(Message.assistant(text, parts), StopReason.TOOL_CALL)


def final_reply(text: str = "done", stop: StopReason = StopReason.END_TURN) -> ModelResponse:
    return ModelResponse(Message.assistant(text), stop)


def results_for(step: CallTools) -> Message:
    parts = [
        p.preresolved
        if p.preresolved is not None
        else ToolResultPart(p.call.id, p.call.name, f"ok {p.call.id}", False)
        for p in step.calls
    ]
    return Message.from_tool_results(parts)


def started(text: str = "hi", history: Iterable[Message] = ()) -> LoopMachine:
    m = LoopMachine(history)
    m.accept_input(text)
    return m


def tool_turn(m: LoopMachine, *names: str, tokens: int = 10) -> CallTools:
    """Drive one whole tool turn: CallLLM, a tool reply, its results."""
    step = m.next_step(POLICY)
    assert isinstance(step, CallLLM)
    m.model_response(tool_reply(*(names or ("read",))), tokens, TOOLS)
    call_step = m.next_step(POLICY)
    assert isinstance(call_step, CallTools)
    m.tool_results([results_for(call_step)])
    return call_step


def at_tokens(tokens: int, pol: MachinePolicy = POLICY) -> object:
    m = started()
    m.set_context_tokens(tokens)
    return m.next_step(pol)


# -- the model turn: limits and lines ----------------------------------------------


def test_fresh_run_calls_the_model_for_turn_zero() -> None:
    m = started()
    assert m.state is MachineState.START
    assert m.next_step(POLICY) == CallLLM(0)
    assert m.state is MachineState.START  # next_step only reports
    assert m.prepare_turn(10, POLICY) == CallLLM(0)  # the measured request fits
    assert m.state is MachineState.AWAITING_MODEL
    assert m.context_tokens == 10


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (0, CallLLM(0)),
        (THRESHOLD, CallLLM(0)),  # at the threshold line: strict, no compaction
        (THRESHOLD + 1, Compact("threshold")),
        (EMERGENCY - 1, Compact("threshold")),
        (EMERGENCY, Compact("emergency")),  # at the emergency line: inclusive
        (EMERGENCY + 1, Compact("emergency")),
        (10**9, Compact("emergency")),
    ],
)
def test_decision_at_each_line_of_a_1000_token_window(tokens: int, expected: object) -> None:
    assert at_tokens(tokens) == expected


@pytest.mark.parametrize(
    ("window", "threshold", "emergency_line", "threshold_line"),
    [
        (999, 80, 949, 799),  # 949.05 and 799.2 floor down
        (1001, 80, 950, 800),  # 950.95 and 800.8 floor down
        (19, 50, 18, 9),
        (200_000, 80, 190_000, 160_000),
    ],
)
def test_lines_use_integer_arithmetic(
    window: int, threshold: int, emergency_line: int, threshold_line: int
) -> None:
    pol = policy(context_window=window, compact_threshold=threshold)
    assert at_tokens(emergency_line, pol) == Compact("emergency")
    assert at_tokens(emergency_line - 1, pol) == Compact("threshold")
    assert at_tokens(threshold_line + 1, pol) == Compact("threshold")
    assert at_tokens(threshold_line, pol) == CallLLM(0)


def test_auto_compact_off_disables_threshold_but_emergency_still_fires() -> None:
    pol = policy(auto_compact=False)
    assert at_tokens(THRESHOLD + 1, pol) == CallLLM(0)
    assert at_tokens(EMERGENCY - 1, pol) == CallLLM(0)
    assert at_tokens(EMERGENCY, pol) == Compact("emergency")


def test_threshold_zero_disables_only_the_threshold_trigger() -> None:
    pol = policy(compact_threshold=0)
    assert at_tokens(1, pol) == CallLLM(0)
    assert at_tokens(EMERGENCY - 1, pol) == CallLLM(0)
    assert at_tokens(EMERGENCY, pol) == Compact("emergency")


def test_window_zero_disables_both_lines() -> None:
    pol = policy(context_window=0)
    assert at_tokens(10**12, pol) == CallLLM(0)
    assert at_tokens(10**12, policy(context_window=0, auto_compact=False)) == CallLLM(0)


def test_emergency_wins_over_threshold_when_threshold_is_above_95() -> None:
    # threshold 96% is above the emergency line: the emergency check comes first.
    pol = policy(compact_threshold=96)
    assert at_tokens(EMERGENCY, pol) == Compact("emergency")
    assert at_tokens(EMERGENCY - 1, pol) == CallLLM(0)
    # threshold 100: never fires on its own.
    assert at_tokens(EMERGENCY - 1, policy(compact_threshold=100)) == CallLLM(0)


def test_max_turns_checked_before_compaction() -> None:
    m = started()
    tool_turn(m)
    tool_turn(m)
    assert m.turns_taken == 2
    m.set_context_tokens(10**6)  # far past the emergency line
    step = m.next_step(policy(max_turns=2))
    assert step == Done(MaxTurnsReached())
    assert not m.is_terminal  # reported, not yet acted on
    assert m.conclude(policy(max_turns=2)) == MaxTurnsReached()
    assert m.is_terminal
    assert m.state is MachineState.TERMINAL


def test_one_turn_below_max_turns_still_calls_the_model() -> None:
    m = started()
    tool_turn(m)
    assert m.next_step(policy(max_turns=2)) == CallLLM(1)


def test_max_turns_zero_ends_before_the_first_model_call() -> None:
    m = started()
    assert m.next_step(policy(max_turns=0)) == Done(MaxTurnsReached())
    assert m.turns_taken == 0


def test_prepare_turn_defers_when_the_measured_request_crosses_a_line() -> None:
    # The driver measures the fuller payload (extras included) after CallLLM.
    m = started()
    assert m.next_step(POLICY) == CallLLM(0)
    assert m.prepare_turn(THRESHOLD + 1, POLICY) == Compact("threshold")
    assert m.state is MachineState.AWAITING_COMPACTION
    assert m.context_tokens == THRESHOLD + 1
    assert m.next_step(POLICY) == Compact("threshold")


def test_conclude_refuses_a_machine_that_does_not_report_done() -> None:
    m = started()
    with pytest.raises(RuntimeError, match="conclude"):
        m.conclude(POLICY)
    assert m.state is MachineState.START


def test_context_overflow_compacts_once_per_turn_then_fails_naming_the_window() -> None:
    from loopctl.errors import ContextExceeded, ContextOverflow

    m = started()
    m.prepare_turn(100, POLICY)
    refusal = ContextOverflow("too long")
    assert m.context_overflow(refusal, 500, POLICY) == Compact("emergency")
    assert m.next_step(POLICY) == Compact("emergency")
    m.compaction_noop(500, 50)
    assert m.prepare_turn(50, POLICY) == CallLLM(0)  # the same turn again
    step = m.context_overflow(refusal, 60, POLICY)
    assert isinstance(step, Done) and isinstance(step.outcome, Failed)
    err = step.outcome.error
    assert isinstance(err, ContextExceeded) and err.limit == POLICY.context_window
    assert m.is_terminal


def test_context_overflow_without_a_window_fails_with_the_refusal() -> None:
    from loopctl.errors import ContextOverflow

    m = started()
    refusal = ContextOverflow("too long")
    step = m.context_overflow(refusal, 10, policy(context_window=0))
    assert step == Done(Failed(refusal)) and step.outcome.error is refusal  # type: ignore[union-attr]


# -- idempotence -----------------------------------------------------------------------


def test_next_step_is_idempotent_for_every_step_kind() -> None:
    m = started()
    first = m.next_step(POLICY)
    assert first == m.next_step(POLICY) == CallLLM(0)

    m.model_response(tool_reply("read", "nope"), 10, TOOLS)
    calls = m.next_step(POLICY)
    again = m.next_step(POLICY)
    assert isinstance(calls, CallTools)
    assert again == calls
    assert len(m.pending) == 2  # re-polling added nothing

    m.tool_results([results_for(calls)])
    m.set_context_tokens(EMERGENCY)
    assert m.next_step(POLICY) == m.next_step(POLICY) == Compact("emergency")

    m.compaction_noop(EMERGENCY, 100)
    assert m.next_step(POLICY) == CallLLM(1)
    m.model_response(final_reply("bye"), 120, TOOLS)
    done = m.next_step(POLICY)
    assert done == Done(Completed("bye"))
    assert m.next_step(POLICY).outcome is done.outcome  # type: ignore[union-attr]


def test_awaiting_compaction_repolls_the_same_reason() -> None:
    m = started()
    assert m.prepare_turn(THRESHOLD + 1, POLICY) == Compact("threshold")
    # Asked again, even under a policy that would not compact now, the owed pass stays.
    assert m.next_step(policy(context_window=0)) == Compact("threshold")


# -- model replies and tool calls -----------------------------------------------------


def test_reply_without_tool_calls_completes_with_its_text() -> None:
    m = started()
    m.next_step(POLICY)
    reply = ModelResponse(
        Message("assistant", (ThinkingPart("hmm"), TextPart("the "), TextPart("answer"))),
        StopReason.END_TURN,
    )
    m.model_response(reply, 42, TOOLS)
    assert m.turns_taken == 1
    assert m.context_tokens == 42
    assert m.next_step(POLICY) == Done(Completed("the answer"))
    assert list(m.pending) == [Message.user("hi"), reply.message]


@pytest.mark.parametrize("stop", [StopReason.MAX_TOKENS, StopReason.STOP_SEQUENCE])
def test_any_stop_reason_without_tool_calls_completes(stop: StopReason) -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(final_reply("cut", stop), 5, TOOLS)
    assert m.next_step(POLICY) == Done(Completed("cut"))


def test_tool_calls_decide_continuation_even_with_end_turn_stop_reason() -> None:
    m = started()
    m.next_step(POLICY)
    reply = tool_reply("read")
    m.model_response(ModelResponse(reply.message, StopReason.END_TURN), 5, TOOLS)
    assert isinstance(m.next_step(POLICY), CallTools)


def test_call_tools_carries_every_call_in_order_with_the_asking_turn() -> None:
    m = started()
    tool_turn(m)
    assert m.next_step(POLICY) == CallLLM(1)
    reply = tool_reply("write", "read", "write")
    m.model_response(reply, 10, TOOLS)
    step = m.next_step(POLICY)
    assert isinstance(step, CallTools)
    assert step.turn == 1
    assert [p.call for p in step.calls] == reply.message.tool_calls
    assert all(p.preresolved is None for p in step.calls)
    assert m.state is MachineState.AWAITING_TOOLS


def test_unknown_tool_gets_a_soft_pre_answer_in_its_slot() -> None:
    m = started()
    m.next_step(POLICY)
    reply = tool_reply("read", "ghost", "write")
    m.model_response(reply, 10, TOOLS)
    step = m.next_step(POLICY)
    assert isinstance(step, CallTools)
    ghost = reply.message.tool_calls[1]
    assert step.calls == (
        PendingToolCall(reply.message.tool_calls[0], None),
        PendingToolCall(ghost, ToolResultPart(ghost.id, "ghost", "tool 'ghost' is not available", True)),
        PendingToolCall(reply.message.tool_calls[2], None),
    )
    assert step.calls[1].preresolved is not None
    assert step.calls[1].preresolved.is_error is True


@pytest.mark.parametrize(
    "available",
    [
        lambda: iter(TOOLS),  # a one-shot iterator
        lambda: list(TOOLS),
        lambda: frozenset(TOOLS),
        lambda: {name: object() for name in TOOLS},
        lambda: (n for n in TOOLS),
    ],
    ids=["iterator", "list", "frozenset", "dict", "generator"],
)
def test_available_tools_may_be_any_iterable_of_names(available) -> None:  # type: ignore[no-untyped-def]
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read", "ghost", "write"), 10, available())
    step = m.next_step(POLICY)
    assert isinstance(step, CallTools)
    assert [p.preresolved is None for p in step.calls] == [True, False, True]


def test_every_call_unknown_when_no_tools_are_advertised() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read", "write"), 10, ())
    step = m.next_step(POLICY)
    assert isinstance(step, CallTools)
    assert [p.preresolved.output for p in step.calls] == [  # type: ignore[union-attr]
        "tool 'read' is not available",
        "tool 'write' is not available",
    ]


def test_tool_results_clear_the_awaited_calls_and_return_to_the_model() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read", "write"), 10, TOOLS)
    step = m.next_step(POLICY)
    assert isinstance(step, CallTools)
    assert m.next_step(POLICY) == step  # re-poll: the same calls
    results = results_for(step)
    m.tool_results([results])
    assert m.state is MachineState.START
    assert m.next_step(POLICY) == CallLLM(1)
    assert m.pending[-1] == results
    assert m.turns_taken == 1


def test_tool_result_for_a_call_never_asked_is_refused() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 10, TOOLS)
    before = list(m.pending)
    stray = Message.from_tool_results([ToolResultPart("nope-1", "read", "x", False)])
    with pytest.raises(ValueError, match="nope-1"):
        m.tool_results([stray])
    assert list(m.pending) == before
    assert isinstance(m.next_step(POLICY), CallTools)


# -- inject (steering) ------------------------------------------------------------------


def test_inject_appends_to_pending_without_touching_the_estimate() -> None:
    m = started()
    m.set_context_tokens(123)
    note = Message.user("also check the tests")
    m.inject(note)
    assert list(m.pending) == [Message.user("hi"), note]
    assert m.context_tokens == 123
    assert m.next_step(POLICY) == CallLLM(0)
    # while awaiting the model (the driver drains at the boundary), it still appends
    second = Message.user("and the docs")
    m.inject(second)
    assert list(m.pending)[-1] == second
    assert m.context_tokens == 123


def test_inject_while_awaiting_tools_lands_right_after_the_results() -> None:
    m = started()
    m.next_step(POLICY)
    reply = tool_reply("read", "write")
    m.model_response(reply, 10, TOOLS)
    step = m.next_step(POLICY)
    assert isinstance(step, CallTools)
    first, second = Message.user("steer 1"), Message.user("steer 2")
    m.inject(first)
    m.inject(second)
    # held back: never between a call and its result
    assert list(m.pending) == [Message.user("hi"), reply.message]
    assert m.full_history() == [Message.user("hi"), reply.message]
    results = results_for(step)
    m.tool_results([results])
    assert list(m.pending) == [Message.user("hi"), reply.message, results, first, second]


def test_held_steering_of_a_cancelled_run_never_reaches_the_next_run() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 10, TOOLS)
    m.inject(Message.user("late steer"))
    m.cancel()
    assert m.next_step(POLICY) == Done(CancelledOutcome())
    m.discard_pending()
    m.accept_input("next")
    tool_turn(m)
    texts = [msg.text for msg in m.full_history()]
    assert "late steer" not in texts


def test_inject_while_awaiting_compaction_appends() -> None:
    m = started()
    m.set_context_tokens(EMERGENCY)
    assert m.next_step(POLICY) == Compact("emergency")
    note = Message.user("steer")
    m.inject(note)
    assert list(m.pending)[-1] == note


# -- compaction ---------------------------------------------------------------------------


def test_compaction_result_replaces_history_wholesale_and_clears_pending() -> None:
    old = [Message.user("old q"), Message.assistant("old a")]
    m = started("new q", history=old)
    tool_turn(m)
    m.set_context_tokens(THRESHOLD + 1)
    assert m.next_step(POLICY) == Compact("threshold")
    summary = [Message.user("summary of everything")]
    m.compaction_result(summary, THRESHOLD + 1, 300)
    assert list(m.history) == summary
    assert list(m.pending) == []
    assert m.full_history() == summary
    assert m.context_tokens == 300
    assert m.turns_taken == 1  # compaction is not a turn
    assert m.state is MachineState.START
    assert m.next_step(POLICY) == CallLLM(1)


def test_compaction_is_a_commit_point_that_survives_discard() -> None:
    m = started("q", history=[Message.user("old")])
    m.set_context_tokens(EMERGENCY)
    assert m.next_step(POLICY) == Compact("emergency")
    summary = [Message.user("summary"), Message.assistant("ok")]
    m.compaction_result(summary, EMERGENCY, 100)
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 150, TOOLS)
    m.fail(ModelError("boom"))
    assert isinstance(m.next_step(POLICY), Done)
    m.discard_pending()
    assert list(m.history) == summary
    assert m.full_history() == summary


def test_compaction_noop_leaves_both_buffers_and_adopts_the_figure() -> None:
    old = [Message.user("old q"), Message.assistant("old a")]
    m = started("new q", history=old)
    tool_turn(m)
    pending_before = list(m.pending)
    m.set_context_tokens(EMERGENCY)
    assert m.next_step(POLICY) == Compact("emergency")
    m.compaction_noop(EMERGENCY, EMERGENCY - 1)
    assert list(m.history) == old
    assert list(m.pending) == pending_before
    assert m.context_tokens == EMERGENCY - 1
    assert m.state is MachineState.START
    # still above the threshold line, now below the emergency line
    assert m.next_step(POLICY) == Compact("threshold")


@pytest.mark.parametrize("after_delta", [0, 1, 500])
@pytest.mark.parametrize("feed", ["result", "noop"])
def test_no_progress_guard_fails_with_context_exceeded(feed: str, after_delta: int) -> None:
    old = [Message.user("old")]
    m = started("q", history=old)
    before = EMERGENCY + 10
    after = before + after_delta
    m.set_context_tokens(before)
    assert m.next_step(POLICY) == Compact("emergency")
    pending_before = list(m.pending)
    if feed == "result":
        m.compaction_result([Message.user("bigger summary")], before, after)
    else:
        m.compaction_noop(before, after)
    step = m.next_step(POLICY)
    assert isinstance(step, Done)
    assert isinstance(step.outcome, Failed)
    err = step.outcome.error
    assert isinstance(err, ContextExceeded)
    assert (err.used, err.limit) == (after, before)
    assert str(after) in str(err) and str(before) in str(err)
    # buffers untouched by a stalled pass
    assert list(m.history) == old
    assert list(m.pending) == pending_before


def test_one_token_of_progress_is_progress() -> None:
    m = started()
    m.set_context_tokens(EMERGENCY)
    m.next_step(POLICY)
    m.compaction_result([Message.user("s")], EMERGENCY, EMERGENCY - 1)
    assert not m.is_terminal


# -- cancel ------------------------------------------------------------------------------


def test_cancel_flag_ends_the_run_at_the_next_decision() -> None:
    m = started()
    m.cancel()
    assert m.is_cancelled
    assert m.next_step(POLICY) == Done(CancelledOutcome())
    assert m.is_terminal


def test_cancel_beats_awaiting_tools_compaction_and_max_turns() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 10, TOOLS)
    m.cancel()
    assert m.next_step(POLICY) == Done(CancelledOutcome())

    m = started()
    m.set_context_tokens(EMERGENCY)
    assert m.next_step(POLICY) == Compact("emergency")
    m.cancel()
    assert m.next_step(POLICY) == Done(CancelledOutcome())

    m = started()
    m.cancel()
    assert m.next_step(policy(max_turns=0)) == Done(CancelledOutcome())


def test_cancel_after_completed_stays_completed() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(final_reply("fine"), 5, TOOLS)
    assert m.next_step(POLICY) == Done(Completed("fine"))
    m.cancel()
    assert not m.is_cancelled
    assert m.next_step(POLICY) == Done(Completed("fine"))


def test_accept_input_resets_turns_estimate_and_cancel_flag() -> None:
    m = started("first")
    tool_turn(m)
    m.set_context_tokens(500)
    m.cancel()
    m.accept_input("second")
    assert m.turns_taken == 0
    assert m.context_tokens == 0
    assert not m.is_cancelled
    assert m.state is MachineState.START
    assert m.outcome is None
    assert list(m.pending) == [Message.user("second")]
    assert m.next_step(POLICY) == CallLLM(0)


# -- fail, terminal, commit/discard ----------------------------------------------------------


def test_fail_ends_the_run_with_that_error() -> None:
    m = started()
    m.next_step(POLICY)
    err = ModelError("server said no", status=400)
    m.fail(err)
    step = m.next_step(POLICY)
    assert isinstance(step, Done) and isinstance(step.outcome, Failed)
    assert step.outcome.error is err
    m.fail(LoopError("second"))  # a no-op once terminal
    assert m.outcome is step.outcome
    assert m.outcome.error is err  # type: ignore[union-attr]


def _completed_machine() -> LoopMachine:
    m = started()
    tool_turn(m)
    m.next_step(POLICY)
    m.model_response(final_reply("fin"), 77, TOOLS)
    assert m.next_step(POLICY) == Done(Completed("fin"))
    return m


def test_feeds_after_terminal_are_no_ops() -> None:
    m = _completed_machine()
    pending = list(m.pending)
    history = list(m.history)
    state = (m.turns_taken, m.context_tokens, m.state, m.outcome)

    m.model_response(tool_reply("read"), 999, TOOLS)
    m.tool_results([Message.from_tool_results([ToolResultPart("x", "read", "o", False)])])
    m.inject(Message.user("steer"))
    m.set_context_tokens(10**6)
    m.compaction_result([Message.user("s")], 10, 5)
    m.compaction_noop(10, 5)
    m.compaction_noop(10, 50)
    m.cancel()
    m.fail(LoopError("late"))

    assert list(m.pending) == pending
    assert list(m.history) == history
    assert (m.turns_taken, m.context_tokens, m.state, m.outcome) == state
    assert not m.is_cancelled
    for pol in (POLICY, policy(max_turns=0), policy(context_window=1)):
        assert m.next_step(pol) == Done(Completed("fin"))


def test_commit_pending_after_terminal_appends_the_run_to_history() -> None:
    m = _completed_machine()
    run_messages = list(m.pending)
    assert len(run_messages) == 4  # user, call, results, final
    m.commit_pending()
    assert list(m.history) == run_messages
    assert list(m.pending) == []
    m.accept_input("again")
    assert m.full_history() == [*run_messages, Message.user("again")]


def test_discard_pending_leaves_history_exactly_as_before_the_run() -> None:
    old = [Message.user("old"), Message.assistant("ok")]
    m = started("q", history=old)
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 10, TOOLS)
    m.cancel()
    m.next_step(POLICY)
    m.discard_pending()
    assert list(m.history) == old
    assert list(m.pending) == []


def test_from_history_starts_fresh_with_that_history() -> None:
    old = [Message.user("a"), Message.assistant("b")]
    m = LoopMachine.from_history(old)
    assert list(m.history) == old
    assert list(m.pending) == []
    assert (m.turns_taken, m.context_tokens, m.is_terminal) == (0, 0, False)
    old.append(Message.user("not seen"))  # the machine keeps its own copy
    assert len(m.history) == 2


def test_full_history_is_a_new_list_of_history_then_pending() -> None:
    m = started("q", history=[Message.user("old")])
    full = m.full_history()
    assert full == [Message.user("old"), Message.user("q")]
    full.append(Message.user("mutation"))
    assert len(m.full_history()) == 2
    assert m.history == [Message.user("old")]  # views compare with lists


# -- out-of-order feeds -----------------------------------------------------------------------


def test_model_response_while_awaiting_tools_raises() -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 10, TOOLS)
    pending = list(m.pending)
    with pytest.raises(RuntimeError, match="awaited"):
        m.model_response(final_reply(), 10, TOOLS)
    assert list(m.pending) == pending
    assert m.turns_taken == 1


def test_model_response_while_awaiting_compaction_raises() -> None:
    m = started()
    assert m.prepare_turn(EMERGENCY, POLICY) == Compact("emergency")
    with pytest.raises(RuntimeError, match="compaction"):
        m.model_response(final_reply(), 10, TOOLS)
    assert m.turns_taken == 0
    assert m.next_step(POLICY) == Compact("emergency")


@pytest.mark.parametrize("poll", [False, True])
def test_tool_results_without_awaited_calls_raise(poll: bool) -> None:
    m = started()
    if poll:
        m.next_step(POLICY)  # AWAITING_MODEL
    with pytest.raises(RuntimeError, match="no tool calls"):
        m.tool_results([Message.user("orphan")])
    assert list(m.pending) == [Message.user("hi")]


@pytest.mark.parametrize("feed", ["result", "noop"])
def test_compaction_while_awaiting_tools_raises(feed: str) -> None:
    m = started()
    m.next_step(POLICY)
    m.model_response(tool_reply("read"), 10, TOOLS)
    pending = list(m.pending)
    with pytest.raises(RuntimeError, match="awaited"):
        if feed == "result":
            m.compaction_result([Message.user("s")], 100, 10)
        else:
            m.compaction_noop(100, 10)
    assert list(m.pending) == pending
    assert isinstance(m.next_step(POLICY), CallTools)


def test_commit_never_adds_steering_held_for_unanswered_calls() -> None:
    # Held guidance was never part of the conversation: committing the
    # (cancelled) run must not append it after an unanswered call.
    m = started()
    m.next_step(POLICY)
    reply = tool_reply("read")
    m.model_response(reply, 10, TOOLS)
    m.inject(Message.user("held"))
    m.cancel()
    m.next_step(POLICY)
    m.commit_pending()
    assert list(m.history) == [Message.user("hi"), reply.message]


# -- O(1) conversation snapshots ---------------------------------------------------------------


def test_conversation_snapshot_does_not_change_after_later_feeds() -> None:
    old = [Message.user("old")]
    m = started("q", history=old)
    extra = [Message.system("contributor")]
    snap = m.snapshot_conversation(extra)
    expected = [*extra, *old, Message.user("q")]
    assert list(snap) == expected and len(snap) == 3
    assert snap[0] == extra[0] and snap[-1] == Message.user("q") and snap[1:] == expected[1:]

    m.inject(Message.user("steer"))  # pending grows
    m.next_step(POLICY)
    m.model_response(final_reply("a"), 10, TOOLS)
    m.commit_pending()  # history grows, pending replaced
    m.accept_input("next")
    m.set_context_tokens(EMERGENCY)
    m.next_step(POLICY)
    m.compaction_result([Message.user("summary")], EMERGENCY, 1)  # history replaced
    assert list(snap) == expected
    assert snap == expected
    with pytest.raises(IndexError):
        snap[3]
