"""Contributors: transient per-turn messages (SPEC §9, reference §10)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import pytest

from loopctl import BareLoop, RunConfig
from loopctl.context import (
    ContextContributor,
    ContributorContext,
    GoalReminder,
    InMemoryStore,
    MemoryEntry,
)
from loopctl.context.contributors import GOAL_REMINDER_PREFIX, FunctionContributor, first_user_text
from loopctl.context.memory import MEMORY_PREFIX, MEMORY_SUFFIX
from loopctl.errors import ConfigError
from loopctl.messages import Message, ToolResultPart
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext


class Noop(Tool):
    name = "noop"
    description = "does nothing"

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        return "ok"


def test_goal_reminder_every_n_turns_skips_turn_zero() -> None:
    g = GoalReminder(2)
    conv = [Message.user("build the thing"), Message.assistant("sure")]
    got = [g.contribute(ContributorContext(t, conv, "build the thing")) for t in range(5)]
    assert [m is not None for m in got] == [False, False, True, False, True]
    assert got[2] is not None and got[2].text == f"{GOAL_REMINDER_PREFIX}\nbuild the thing"
    assert isinstance(g, ContextContributor)


def test_goal_reminder_uses_first_user_text_not_tool_results() -> None:
    conv = [
        Message.from_tool_results([ToolResultPart("c", "t", "out")]),
        Message.user("the real goal"),
        Message.user("a later message"),
    ]
    assert first_user_text(conv) == "the real goal"
    assert first_user_text([]) is None
    msg = GoalReminder(1).contribute(ContributorContext(1, [], "fallback input"))
    assert msg is not None and msg.text.endswith("fallback input")


@pytest.mark.parametrize("bad", [0, -1, "2", True])
def test_goal_reminder_validates(bad: Any) -> None:
    with pytest.raises(ConfigError, match=repr(bad)):
        GoalReminder(bad)


def test_contributors_in_order_before_memory_and_conversation_never_persisted() -> None:
    order: list[int] = []

    def make(k: int) -> FunctionContributor:
        def f(ctx: ContributorContext) -> Optional[str]:
            order.append(k)
            return f"contrib {k} turn {ctx.turn}"

        return FunctionContributor(f)

    client = ScriptedClient([call("noop"), reply("done")])
    loop = (
        BareLoop(client, [Noop()])
        .with_contributor(make(1))
        .with_contributor(make(2))
        .with_memory(InMemoryStore([MemoryEntry("remember the goal")]))
    )
    loop.run("the goal", RunConfig(memory_top_k=3))
    assert order == [1, 2, 1, 2]
    for turn, req in enumerate(client.requests):
        texts = [m.text for m in req.messages]
        assert texts[0] == f"contrib 1 turn {turn}"
        assert texts[1] == f"contrib 2 turn {turn}"
        if turn == 0:  # the query is the input: it shares "goal" with the entry
            assert texts[2] == MEMORY_PREFIX + "\nremember the goal\n" + MEMORY_SUFFIX
            assert texts[3] == "the goal"
        else:  # the query is the tool output "ok": "remember the goal" does not match it
            rest = texts[2:]
            if rest[0].startswith(MEMORY_PREFIX):  # e.g. a stored trajectory of the noop call
                assert "remember the goal" not in rest[0]
                rest = rest[1:]
            assert rest[0] == "the goal"
            assert not any(t.startswith(MEMORY_PREFIX) or t.startswith("contrib") for t in rest)
    convo = [m.text for m in loop.conversation()]
    assert not any(t.startswith("contrib") or t.startswith(MEMORY_PREFIX) for t in convo)
    run = loop.session.current_run
    assert run is not None
    assert all(not t.input.startswith("contrib") for t in run.turns)


def test_contributor_sees_snapshot_with_input_and_raising_one_is_skipped() -> None:
    seen: list[ContributorContext] = []

    class Boom:
        def contribute(self, ctx: ContributorContext) -> Optional[Message]:
            raise RuntimeError("contributor bug")

    class Spy:
        def contribute(self, ctx: ContributorContext) -> Optional[Message]:
            seen.append(ctx)
            return None

    client = ScriptedClient([reply("fine")])
    loop = BareLoop(client).with_contributor(Boom()).with_contributor(Spy())
    assert loop.run("hello").output == "fine"
    assert len(seen) == 1
    assert seen[0].turn == 0 and seen[0].input == "hello"
    assert [m.text for m in seen[0].conversation] == ["hello"]
    assert [m.text for m in client.requests[0].messages] == ["hello"]


def test_goal_reminder_through_the_loop() -> None:
    client = ScriptedClient([call("noop"), call("noop"), reply("done")])
    loop = BareLoop(client, [Noop()]).with_contributor(GoalReminder(2))
    loop.run("reach the goal")
    firsts = [r.messages[0].text for r in client.requests]
    assert firsts[0] == "reach the goal"
    assert firsts[1] == "reach the goal"  # turn 1: no reminder
    assert firsts[2] == f"{GOAL_REMINDER_PREFIX}\nreach the goal"


def test_function_contributor_rejects_bad_return() -> None:
    f = FunctionContributor(lambda ctx: 3)
    with pytest.raises(TypeError, match="int"):
        f.contribute(ContributorContext(0, [], ""))
    assert FunctionContributor(lambda ctx: "").contribute(ContributorContext(0, [], "")) is None
