"""Properties of the brain under any sequence of valid feeds (hypothesis).

Each example plays the driver's part: a policy, then a list of actions.
``advance`` does what the driver does with the machine's answer (reply to
``CallLLM`` with a random reply shape — known, unknown or no tools; answer
``CallTools``; answer ``Compact`` with a result or a no-op, with or without
progress; finalize a terminal run with commit or discard and start the
next). Steering, new estimates, cancel and fail arrive in between. After
every action:

* ``full_history() == list(history) + list(pending)``;
* no tool result ever comes before its call: each ``ToolResultPart``'s
  call id appears in an earlier assistant message's ``ToolCallPart``;
* ``next_step`` only reports: asked twice it answers the same and changes
  nothing (history, pending, state, outcome, turns, estimate, cancel flag);
  terminal is forever;
* an O(1) conversation snapshot never changes after it was taken.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from loopctl.errors import ContextExceeded, LoopError
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
    Step,
)
from loopctl.messages import (
    Message,
    ModelResponse,
    Role,
    StopReason,
    ToolCallPart,
    ToolResultPart,
)

KNOWN = ("read", "write", "grep")
NAMES = (*KNOWN, "ghost")

policies = st.builds(
    MachinePolicy,
    max_turns=st.sampled_from([100, 3, 100, 1, 100, 0]),
    context_window=st.sampled_from([1000, 0, 1000, 1000]),
    compact_threshold=st.sampled_from([80, 50, 0, 80, 100]),
    auto_compact=st.booleans(),
)
# Around the lines of a 1000-token window, and anywhere below them.
tokens = st.sampled_from([400, 799, 800, 801, 949, 950, 951, 1200, 0, 123])
# Weighted by repetition: mostly the driver's own progress.
kinds = st.sampled_from(
    ["advance"] * 8 + ["inject", "inject", "tokens", "tokens", "cancel", "fail", "snapshot"]
)
action = st.fixed_dictionaries(
    {
        "kind": kinds,
        "names": st.one_of(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3), st.just([])),
        "text": st.text(alphabet="ab ", max_size=4),
        "figure": tokens,
        # tokens a compaction pass saved: mostly some, sometimes none or growth
        "progress": st.one_of(st.integers(1, 900), st.integers(-5, 0)),
        "noop": st.booleans(),
        "success": st.booleans(),
        "flags": st.lists(st.booleans(), min_size=3, max_size=3),
        "cut": st.integers(0, 50),
        "stop": st.sampled_from(list(StopReason)),
    }
)


def results_before_calls(messages: Sequence[Message]) -> list[str]:
    """Call ids of tool results with no ToolCallPart in an earlier assistant message."""
    seen: set[str] = set()
    bad: list[str] = []
    for msg in messages:
        for part in msg.tool_results:
            if part.tool_call_id not in seen:
                bad.append(part.tool_call_id)
        if msg.role == Role.ASSISTANT:
            seen.update(c.id for c in msg.tool_calls)
    return bad


class Driver:
    """Plays the driver's side of the contract and checks every answer."""

    def __init__(self, pol: MachinePolicy) -> None:
        self.pol = pol
        self.ids = itertools.count(1)
        self.m = LoopMachine([Message.user("earlier"), Message.assistant("earlier answer")])
        self.m.accept_input("first input")
        self.snapshots: list[tuple[Any, list[Message]]] = []

    def picture(self) -> tuple[Any, ...]:
        m = self.m
        return (
            list(m.history), list(m.pending), m.state, m.outcome, m.turns_taken,
            m.context_tokens, m.is_cancelled, m.is_terminal,
        )

    def ask(self) -> Step:
        before = self.picture()
        step = self.m.next_step(self.pol)
        again = self.m.next_step(self.pol)
        assert again == step, (step, again)
        assert self.picture() == before, "next_step changed the machine"
        if isinstance(step, Done):
            assert again.outcome is step.outcome  # type: ignore[union-attr]
        return step

    def play(self, a: dict[str, Any]) -> None:
        kind = a["kind"]
        if kind == "advance":
            self.advance(a)
        elif kind == "inject":
            self.inject(Message.user("steer " + a["text"]))
        elif kind == "tokens":
            terminal, before = self.m.is_terminal, self.m.context_tokens
            self.m.set_context_tokens(a["figure"])
            assert self.m.context_tokens == (before if terminal else a["figure"])
        elif kind == "cancel":
            self.cancel()
        elif kind == "fail":
            self.fail()
        else:
            self.snapshots.append((self.m.snapshot_conversation(), self.m.full_history()))
            del self.snapshots[:-3]
        self.check_invariants()

    # -- the driver's moves --------------------------------------------------------

    def advance(self, a: dict[str, Any]) -> None:
        if self.m.is_terminal:
            self.finalize_and_start_next(a)
            return
        owed = self.m.state is MachineState.AWAITING_COMPACTION
        step = self.ask()
        if isinstance(step, CallLLM):
            assert step.turn == self.m.turns_taken
            assert self.m.turns_taken < self.pol.max_turns
            # The driver measures the request it would send: call, or compact first.
            prepared = self.m.prepare_turn(a["figure"], self.pol)
            assert self.m.context_tokens == a["figure"]
            assert self.ask() == prepared
            if isinstance(prepared, Compact):
                assert self.m.state is MachineState.AWAITING_COMPACTION
                self.compact(prepared, a, True)
                return
            assert prepared == step and self.m.state is MachineState.AWAITING_MODEL
            self.model_reply(a)
        elif isinstance(step, CallTools):
            assert step.turn == self.m.turns_taken - 1
            self.tool_results(step, a["flags"])
        elif isinstance(step, Compact):
            self.compact(step, a, owed)
        else:
            outcome = self.m.conclude(self.pol)  # the driver acts on Done
            assert outcome is step.outcome  # type: ignore[union-attr]
            assert self.m.is_terminal and self.m.outcome is outcome

    def model_reply(self, a: dict[str, Any]) -> None:
        turns = self.m.turns_taken
        calls = [ToolCallPart(f"c{next(self.ids)}", n, {"i": i}) for i, n in enumerate(a["names"])]
        message = Message.assistant(a["text"], calls)
        self.m.model_response(ModelResponse(message, a["stop"]), a["figure"], KNOWN)
        assert self.m.turns_taken == turns + 1
        assert self.m.context_tokens == a["figure"]
        assert self.m.pending[-1] == message
        if not calls:
            assert self.m.outcome == Completed(message.text)
            return
        step = self.ask()
        assert isinstance(step, CallTools)
        assert [p.call for p in step.calls] == calls
        for p in step.calls:
            if p.call.name in KNOWN:
                assert p.preresolved is None
            else:
                assert p.preresolved == ToolResultPart(
                    p.call.id, p.call.name, f"tool '{p.call.name}' is not available", True
                )

    def tool_results(self, step: CallTools, flags: list[bool]) -> None:
        parts = [
            p.preresolved
            if p.preresolved is not None
            else ToolResultPart(p.call.id, p.call.name, f"out {p.call.id}", flag)
            for p, flag in zip(step.calls, flags)
        ]
        results = Message.from_tool_results(parts)  # type: ignore[arg-type]
        before = list(self.m.pending)
        self.m.tool_results([results])
        assert self.m.state is MachineState.START
        assert list(self.m.pending[: len(before) + 1]) == [*before, results]
        assert self.m.next_step(self.pol) != step  # the calls are answered

    def compact(self, step: Compact, a: dict[str, Any], owed: bool) -> None:
        tokens = self.m.context_tokens
        window = self.pol.context_window
        if owed:
            pass  # an owed pass is re-announced whatever the estimate became since
        elif step.reason == "emergency":
            assert tokens >= window * 95 // 100
        else:
            assert self.pol.auto_compact and tokens > window * self.pol.compact_threshold // 100
        before = tokens
        after = max(0, before - a["progress"])
        old_history, old_pending = list(self.m.history), list(self.m.pending)
        if a["noop"]:
            self.m.compaction_noop(before, after)
            compacted: Optional[list[Message]] = None
        else:
            full = self.m.full_history()
            # a compactor keeps a self-consistent tail: no result without its call
            starts = [i for i in range(len(full) + 1) if not results_before_calls(full[i:])]
            tail = full[starts[a["cut"] % len(starts)] :]
            compacted = [Message.user("summary"), *tail]
            self.m.compaction_result(compacted, before, after)
        if after >= before:
            outcome = self.m.outcome
            assert isinstance(outcome, Failed)
            assert isinstance(outcome.error, ContextExceeded)
            assert (outcome.error.used, outcome.error.limit) == (after, before)
            assert (list(self.m.history), list(self.m.pending)) == (old_history, old_pending)
            return
        assert self.m.context_tokens == after
        assert self.m.state is MachineState.START
        if compacted is None:
            assert (list(self.m.history), list(self.m.pending)) == (old_history, old_pending)
        else:
            assert list(self.m.history) == compacted
            assert list(self.m.pending) == []

    def inject(self, message: Message) -> None:
        before = list(self.m.pending)
        state = self.m.state
        self.m.inject(message)
        if state in (MachineState.TERMINAL, MachineState.AWAITING_TOOLS):
            assert list(self.m.pending) == before  # a no-op, or held until the results
        else:
            assert list(self.m.pending) == [*before, message]

    def cancel(self) -> None:
        if self.m.is_terminal:
            outcome, flag = self.m.outcome, self.m.is_cancelled
            self.m.cancel()
            assert self.m.outcome is outcome and self.m.is_cancelled == flag
            return
        self.m.cancel()
        assert self.m.is_cancelled
        assert self.ask() == Done(CancelledOutcome())

    def fail(self) -> None:
        outcome = self.m.outcome
        err = LoopError("failed on purpose")
        self.m.fail(err)
        if outcome is not None:
            assert self.m.outcome is outcome
        else:
            assert isinstance(self.m.outcome, Failed) and self.m.outcome.error is err

    def finalize_and_start_next(self, a: dict[str, Any]) -> None:
        self.feeds_after_terminal_change_nothing(a)
        history, pending = list(self.m.history), list(self.m.pending)
        if a["success"]:
            self.m.commit_pending()
            assert list(self.m.history) == history + pending
        else:
            self.m.discard_pending()
            assert list(self.m.history) == history
        assert list(self.m.pending) == []
        self.m.accept_input("next " + a["text"])
        assert self.m.state is MachineState.START
        assert (self.m.turns_taken, self.m.context_tokens, self.m.outcome) == (0, 0, None)
        assert not self.m.is_cancelled

    def feeds_after_terminal_change_nothing(self, a: dict[str, Any]) -> None:
        def picture() -> tuple[Any, ...]:
            m = self.m
            return (
                list(m.history), list(m.pending), m.outcome, m.turns_taken,
                m.context_tokens, m.is_cancelled, m.state,
            )

        before = picture()
        call = ToolCallPart(f"c{next(self.ids)}", "read", {})
        self.m.model_response(ModelResponse(Message.assistant("x", [call])), a["figure"], KNOWN)
        self.m.tool_results([Message.from_tool_results([ToolResultPart(call.id, "read", "o")])])
        self.m.inject(Message.user("late"))
        self.m.set_context_tokens(a["figure"] + 1)
        self.m.compaction_result([Message.user("s")], a["figure"] + 1, 0)
        self.m.compaction_noop(a["figure"] + 1, 0)
        self.m.cancel()
        self.m.fail(LoopError("late"))
        after = picture()
        assert after == before
        assert after[2] is before[2]

    # -- what must always hold -----------------------------------------------------

    def check_invariants(self) -> None:
        m = self.m
        full = m.full_history()
        assert full == list(m.history) + list(m.pending)
        assert results_before_calls(full) == []
        assert results_before_calls(list(m.history)) == []
        if m.is_terminal:
            assert isinstance(m.outcome, (Completed, MaxTurnsReached, CancelledOutcome, Failed))
            for pol in (self.pol, MachinePolicy(max_turns=0, context_window=1)):
                step = m.next_step(pol)
                assert isinstance(step, Done) and step.outcome is m.outcome
        else:
            assert m.outcome is None
        for snap, expected in self.snapshots:
            assert len(snap) == len(expected)
            assert list(snap) == expected


@settings(max_examples=50, deadline=None)
@given(pol=policies, actions=st.lists(action, min_size=15, max_size=40))
def test_any_sequence_of_valid_feeds_keeps_the_conversation_well_formed(
    pol: MachinePolicy, actions: list[dict[str, Any]]
) -> None:
    driver = Driver(pol)
    driver.check_invariants()
    for a in actions:
        driver.play(a)
