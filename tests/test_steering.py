"""Steering (SPEC §7, seed 003): guidance from another thread, at the next boundary.

Every window is made exact with gates (``threading.Event`` pairs): the gated
code — a tool, a scripted model call, a memory lookup, a contributor —
signals that it has entered, the test pushes, then releases it. No sleeps.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from support import WAIT, Gate, Recorder, gated

from loopctl import (
    BareLoop,
    Cancelled,
    LoopError,
    Message,
    ModelError,
    Observer,
    RunConfig,
    SessionConfig,
    Steering,
)
from loopctl.driver.run import RunDriver
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.observers import Compaction, RunEnd, RunStart, SteeringDelivered
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext

# -- gates and fakes -----------------------------------------------------------------


class GatedTool(Tool):
    """``work``: the n-th call passes through the n-th gate (if any), then answers."""

    name = "work"
    description = "Does some work; the test decides when it finishes."

    def __init__(self, *gates: Gate) -> None:
        self.gates = list(gates)
        self.count = 0

    def call(self, input: Any, ctx: ToolContext) -> str:
        n = self.count
        self.count += 1
        if n < len(self.gates):
            self.gates[n].pass_through()
        return f"result {n}"


def gated_raise(gate: Gate, exc: BaseException) -> Callable[[ModelRequest], ModelResponse]:
    """A script item: the model call passes through ``gate``, then fails with ``exc``."""

    def item(request: ModelRequest) -> ModelResponse:
        gate.pass_through()
        raise exc

    return item


def texts(messages: Sequence[Message]) -> list[str]:
    return [m.text for m in messages]


def user(text: str) -> Message:
    return Message.user(text)


@pytest.fixture
def make_loop() -> Iterator[Callable[..., BareLoop]]:
    """Builds loops and closes every one of them after the test."""
    made: list[BareLoop] = []

    def make(client: ScriptedClient, tools: Sequence[Tool] = (), **kw: Any) -> BareLoop:
        loop = BareLoop(client, list(tools), **kw)
        made.append(loop)
        return loop

    yield make
    for loop in made:
        loop.close()


# -- the handle -------------------------------------------------------------------------


def test_steering_is_one_shared_object_per_loop(make_loop: Callable[..., BareLoop]) -> None:
    loop = make_loop(ScriptedClient([]))
    other = make_loop(ScriptedClient([]))
    assert isinstance(loop.steering(), Steering)
    assert loop.steering() is loop.steering()
    assert loop.steering() is not other.steering()


def test_idle_push_is_refused_and_stores_nothing(make_loop: Callable[..., BareLoop]) -> None:
    client = ScriptedClient([reply("done")])
    loop = make_loop(client)
    s = loop.steering()
    assert s.push("before any run") is False
    assert s.push(user("a message object")) is False
    assert s.take_all() == []
    assert s.take_leftovers() == []
    loop.run("hi")
    # Nothing refused earlier reached the run.
    assert texts(client.requests[0].messages) == ["hi"]
    assert texts(loop.conversation()) == ["hi", "done"]


def test_push_refuses_what_is_not_a_message_or_text(make_loop: Callable[..., BareLoop]) -> None:
    s = make_loop(ScriptedClient([])).steering()
    with pytest.raises(TypeError, match="int"):
        s.push(42)  # type: ignore[arg-type]


def test_every_push_becomes_a_user_message_and_one_with_calls_or_results_is_refused(
    make_loop: Callable[..., BareLoop],
) -> None:
    from loopctl import TextPart, ThinkingPart, ToolCallPart, ToolResultPart

    gate = Gate()
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(client, [GatedTool(gate)])
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    given = Message.user("as a Message")
    assert s.push("as text") is True
    assert s.push(given) is True  # a user message is kept as given
    assert s.push(Message.system("be brief")) is True
    assert s.push(Message("assistant", (ThinkingPart("mulling", "sig"), TextPart("from the operator")))) is True
    with pytest.raises(ValueError, match="tool calls or results"):
        s.push(Message.assistant("", tool_calls=(ToolCallPart("x1", "work", {}),)))
    with pytest.raises(ValueError, match="tool calls or results"):
        s.push(Message.from_tool_results([ToolResultPart("x1", "work", "fake result", False)]))
    gate.open()
    run = handle.result(WAIT)
    delivered = list(client.requests[1].messages[-4:])
    assert delivered == [Message.user("as text"), given, Message.user("be brief"), Message.user("from the operator")]
    assert delivered[1] is given
    assert [c.id for m in client.requests[1].messages for c in m.tool_calls] == [run.turns[0].tool_calls[0].id]
    assert s.take_all() == []  # the refused ones stored nothing


# -- boundary, not interruption --------------------------------------------------------


def test_push_during_tool_dispatch_lands_after_the_tool_results_in_the_next_request(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(client, [GatedTool(gate)])
    handle = loop.start("hi")
    gate.wait_entered()
    assert loop.steering().push("that file is generated") is True
    gate.open()
    run = handle.result(WAIT)
    assert run.output == "done"
    first, second = client.requests
    # Absent from the request whose tools were running...
    assert "that file is generated" not in texts(first.messages)
    # ...and present in the next one, right after the tool results that opened the boundary.
    msgs = list(second.messages)
    assert [m.role for m in msgs] == ["user", "assistant", "user", "user"]
    assert msgs[1].tool_calls and msgs[2].tool_results
    assert msgs[2].tool_results[0].output == "result 0"
    assert msgs[3] == user("that file is generated")


def test_push_during_a_tool_calling_model_call_lands_after_that_turns_tool_results(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([gated(gate, call("work")), reply("done")])
    loop = make_loop(client, [GatedTool()])
    handle = loop.start("hi")
    gate.wait_entered()
    assert loop.steering().push("guidance") is True
    gate.open()
    handle.result(WAIT)
    assert texts(client.requests[0].messages) == ["hi"]  # the request in flight
    msgs = list(client.requests[1].messages)
    assert msgs[2].tool_results, "the tool results come first"
    assert msgs[3:] == [user("guidance")]


def test_three_pushes_land_in_push_order_as_three_messages_and_persist(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(client, [GatedTool(gate)])
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert [s.push("one"), s.push("two"), s.push("three")] == [True, True, True]
    gate.open()
    handle.result(WAIT)
    assert list(client.requests[1].messages[-3:]) == [user("one"), user("two"), user("three")]
    history = list(loop.machine.history)
    assert texts(history)[-4:] == ["one", "two", "three", "done"]
    assert history[-4:-1] == [user("one"), user("two"), user("three")]
    # Persisted: the next run's first request still carries them.
    client.extend([reply("again")])
    loop.run("next")
    assert texts(client.requests[2].messages)[3:6] == ["one", "two", "three"]
    assert s.take_all() == []


def test_pushes_at_several_boundaries_each_land_at_their_own(
    make_loop: Callable[..., BareLoop],
) -> None:
    g0, g1 = Gate(), Gate()
    client = ScriptedClient([call("work"), call("work"), reply("done")])
    loop = make_loop(client, [GatedTool(g0, g1)])
    s = loop.steering()
    handle = loop.start("hi")
    g0.wait_entered()
    assert s.push("first")
    g0.open()
    g1.wait_entered()
    assert s.push("second")
    g1.open()
    handle.result(WAIT)
    assert texts(client.requests[1].messages)[-1] == "first"
    assert "second" not in texts(client.requests[1].messages)
    msgs = list(client.requests[2].messages)
    assert texts(msgs).count("first") == 1
    assert msgs[-1] == user("second") and msgs[-2].tool_results


# -- leftovers belong to you ------------------------------------------------------------


def test_push_during_the_final_model_call_is_sealed_and_no_later_run_delivers_it(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([gated(gate, reply("final"))])
    loop = make_loop(client)
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert s.push("too late") is True
    gate.open()
    assert handle.result(WAIT).output == "final"
    assert "too late" not in texts(loop.conversation())
    # Several later runs — a success, a failure, a success — never deliver it.
    client.extend([reply("r2"), ModelError("down", retryable=False), reply("r4")])
    loop.run("second")
    with pytest.raises(ModelError):
        loop.run("third")
    loop.run("fourth")
    for req in client.requests:
        assert "too late" not in texts(req.messages)
    assert "too late" not in texts(loop.conversation())
    assert s.take_leftovers() == [user("too late")]
    assert s.take_leftovers() == []


def test_take_leftovers_never_steals_live_guidance(make_loop: Callable[..., BareLoop]) -> None:
    g_final, g_tool = Gate(), Gate()
    client = ScriptedClient([gated(g_final, reply("one")), call("work"), reply("two")])
    loop = make_loop(client, [GatedTool(g_tool)])
    s = loop.steering()
    h = loop.start("first")
    g_final.wait_entered()
    assert s.push("sealed-1") and s.push("sealed-2")
    g_final.open()
    h.result(WAIT)

    h = loop.start("second")
    g_tool.wait_entered()
    assert s.push("live")
    assert s.take_leftovers() == [user("sealed-1"), user("sealed-2")]  # sealed only, in order
    g_tool.open()
    h.result(WAIT)
    assert texts(client.requests[2].messages)[-1] == "live"  # still delivered
    assert texts(loop.machine.history)[-2:] == ["live", "two"]
    assert s.take_all() == []


def test_queued_shows_live_guidance_in_place_until_delivered(make_loop: Callable[..., BareLoop]) -> None:
    g_final, g_tool = Gate(), Gate()
    client = ScriptedClient([gated(g_final, reply("one")), call("work"), reply("two")])
    loop = make_loop(client, [GatedTool(g_tool)])
    s = loop.steering()
    assert s.queued() == []
    h = loop.start("first")
    g_final.wait_entered()
    assert s.push("sealed")
    g_final.open()
    h.result(WAIT)
    assert s.queued() == []  # sealed is not queued: no run will deliver it

    h = loop.start("second")
    g_tool.wait_entered()
    assert s.push("live-1") and s.push("live-2")
    assert s.queued() == [user("live-1"), user("live-2")]
    assert s.queued() == [user("live-1"), user("live-2")]  # reading takes nothing
    g_tool.open()
    h.result(WAIT)
    assert texts(client.requests[2].messages)[-2:] == ["live-1", "live-2"]  # still delivered, once
    assert s.queued() == []
    assert s.take_leftovers() == [user("sealed")]


def test_take_all_collects_sealed_then_live_and_live_is_no_longer_delivered(
    make_loop: Callable[..., BareLoop],
) -> None:
    g_final, g_tool = Gate(), Gate()
    client = ScriptedClient([gated(g_final, reply("one")), call("work"), reply("two")])
    loop = make_loop(client, [GatedTool(g_tool)])
    s = loop.steering()
    h = loop.start("first")
    g_final.wait_entered()
    assert s.push("sealed")
    g_final.open()
    h.result(WAIT)

    h = loop.start("second")
    g_tool.wait_entered()
    assert s.push("live-1") and s.push("live-2")
    assert s.take_all() == [user("sealed"), user("live-1"), user("live-2")]
    g_tool.open()
    h.result(WAIT)
    for text in ("sealed", "live-1", "live-2"):
        assert text not in texts(client.requests[2].messages)
    assert s.take_all() == [] and s.take_leftovers() == []


def test_clear_drops_sealed_and_live(make_loop: Callable[..., BareLoop]) -> None:
    g_final, g_tool = Gate(), Gate()
    client = ScriptedClient([gated(g_final, reply("one")), call("work"), reply("two")])
    loop = make_loop(client, [GatedTool(g_tool)])
    s = loop.steering()
    h = loop.start("first")
    g_final.wait_entered()
    assert s.push("sealed")
    g_final.open()
    h.result(WAIT)

    h = loop.start("second")
    g_tool.wait_entered()
    assert s.push("live")
    s.clear()
    assert s.push("after clear")  # the slot stays open: clear is not a close
    g_tool.open()
    h.result(WAIT)
    assert texts(client.requests[2].messages)[-1] == "after clear"
    assert "live" not in texts(client.requests[2].messages)
    assert s.take_all() == []


# -- what a drain invalidates -----------------------------------------------------------


class _NoMemory:
    """A memory that remembers nothing (makes the loop gather transients)."""

    def store(self, entry: Any) -> None:
        pass

    def retrieve(self, query: str, limit: int) -> list[Any]:
        return []

    def consolidate(self) -> None:
        pass


class GatedMemory(_NoMemory):
    """A memory store whose first lookup blocks on a gate (the preparation window)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.lookups = 0

    def retrieve(self, query: str, limit: int) -> list[Any]:
        self.lookups += 1
        if self.lookups == 1:
            self.gate.pass_through()
        return []


class GatedContributor:
    """A contributor whose first call blocks on a gate; it contributes nothing."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.seen: list[list[str]] = []

    def contribute(self, ctx: Any) -> Optional[Message]:
        self.seen.append(texts(ctx.conversation))
        if len(self.seen) == 1:
            self.gate.pass_through()
        return None


def test_push_in_the_preparation_window_contributor_is_in_the_first_request(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([reply("done")])
    loop = make_loop(client)
    contributor = GatedContributor(gate)
    loop.add_contributor(contributor)
    handle = loop.start("hi")
    gate.wait_entered()
    assert loop.steering().push("early guidance") is True
    gate.open()
    handle.result(WAIT)
    assert list(client.requests[0].messages) == [user("hi"), user("early guidance")]
    # The preparation was redone with the guidance in view.
    assert contributor.seen == [["hi"], ["hi", "early guidance"]]
    assert texts(loop.machine.history) == ["hi", "early guidance", "done"]


def test_push_in_the_preparation_window_memory_is_in_the_first_request(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([reply("done")])
    loop = make_loop(client)
    memory = GatedMemory(gate)
    loop.set_memory(memory)
    handle = loop.start("hi")
    gate.wait_entered()
    assert loop.steering().push("early guidance") is True
    gate.open()
    handle.result(WAIT)
    assert list(client.requests[0].messages) == [user("hi"), user("early guidance")]
    assert memory.lookups == 2  # gathered again after the second drain
    assert len(client.requests) == 1


class PushRightAfterDrain(Steering):
    """A Steering whose first non-empty-or-empty drain is followed at once by a push.

    The push comes from another thread and completes before the loop reads
    anything else: the narrowest preparation window there is.
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text: Optional[str] = text
        self.accepted: list[bool] = []

    def _drain(self) -> list[Message]:
        out = super()._drain()
        text, self._text = self._text, None
        if text is not None:
            t = threading.Thread(target=lambda: self.accepted.append(self.push(text)))
            t.start()
            t.join(WAIT)
        return out


def test_push_landing_right_after_the_drain_is_still_in_the_request_being_prepared(
    make_loop: Callable[..., BareLoop],
) -> None:
    client = ScriptedClient([reply("done")])
    loop = make_loop(client)
    loop.set_memory(_NoMemory())  # a preparation step: the memory lookup
    steering = PushRightAfterDrain("squeezed in")
    loop._steering = steering  # instrumented slot (the loop owns exactly one)
    loop.run("hi")
    assert steering.accepted == [True]
    assert list(client.requests[0].messages) == [user("hi"), user("squeezed in")]


class RecordingManager:
    """A context manager stand-in: records what it compacted and when."""

    def __init__(self, client: ScriptedClient) -> None:
        self.client = client
        self.calls: list[tuple[str, list[Message], int]] = []

    def compact(self, messages: Sequence[Message], **kw: Any) -> list[Message]:
        self.calls.append((kw["reason"], list(messages), len(self.client.requests)))
        return [user("summary of the work so far")]


def test_a_large_push_moves_the_estimate_before_the_threshold_decision(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(
        client, [GatedTool(gate)], config=SessionConfig(context_window=1000, compact_threshold=50)
    )
    manager = RecordingManager(client)
    loop.set_context_manager(manager)
    rec = Recorder()
    loop.register_observer(rec)
    handle = loop.start("hi")
    gate.wait_entered()
    big = "generated file, do not edit. " * 80  # ~600 tokens: over the 500 line, under 950
    assert loop.steering().push(big)
    gate.open()
    handle.result(WAIT)
    # The compaction ran before the second request, with the guidance in view...
    assert len(manager.calls) == 1
    reason, compacted, requests_before = manager.calls[0]
    assert reason == "threshold"
    assert requests_before == 1
    assert compacted[-1] == user(big)
    (event,) = rec.of(Compaction)
    assert event.tokens_before > 500
    # ...so the second request is the compacted conversation, not the oversized one.
    assert texts(client.requests[1].messages) == ["summary of the work so far"]


# -- the slot's lifecycle -----------------------------------------------------------------


class PushingObserver(Observer):
    """Pushes from inside ``on_run_start`` and ``on_run_end`` and keeps the answers."""

    def __init__(self, steering: Steering) -> None:
        self.steering = steering
        self.answers: dict[str, bool] = {}

    def on_run_start(self, event: RunStart) -> None:
        self.answers["run_start"] = self.steering.push("from run start")

    def on_run_end(self, event: RunEnd) -> None:
        self.answers["run_end"] = self.steering.push("from run end")


@pytest.mark.parametrize("fails", [False, True])
def test_push_from_run_start_lands_in_the_first_request_and_from_run_end_is_refused(
    make_loop: Callable[..., BareLoop], fails: bool
) -> None:
    # The slot opens before start() returns, so on_run_start (on the run's
    # thread, after that) already steers; on_run_end comes after the slot closed.
    client = ScriptedClient([ModelError("down", retryable=False) if fails else reply("done")])
    loop = make_loop(client)
    obs = PushingObserver(loop.steering())
    loop.register_observer(obs)
    if fails:
        with pytest.raises(ModelError):
            loop.run("hi")
    else:
        loop.run("hi")
    assert obs.answers == {"run_start": True, "run_end": False}
    assert texts(client.requests[0].messages) == ["hi", "from run start"]
    assert loop.steering().take_all() == []


def test_push_after_the_run_is_refused(make_loop: Callable[..., BareLoop]) -> None:
    gate = Gate()
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(client, [GatedTool(gate)])
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert s.is_open
    gate.open()
    handle.result(WAIT)
    assert not s.is_open
    assert s.push("after") is False
    assert s.take_all() == []


def test_slot_closes_when_the_run_fails(make_loop: Callable[..., BareLoop]) -> None:
    gate = Gate()
    client = ScriptedClient([gated_raise(gate, ModelError("boom", retryable=False))])
    loop = make_loop(client)
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert s.push("during the failing call")
    gate.open()
    with pytest.raises(ModelError):
        handle.result(WAIT)
    assert s.push("after the failure") is False
    assert s.take_leftovers() == [user("during the failing call")]


class Escape(BaseException):
    """Not an ``Exception``: nothing on the way translates it."""


def test_slot_closes_when_a_foreign_base_exception_escapes_the_run_thread_body(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([gated_raise(gate, Escape("escaped"))])
    loop = make_loop(client)
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert s.push("pending guidance")
    gate.open()
    with pytest.raises(LoopError) as info:
        handle.result(WAIT)
    assert isinstance(info.value.__cause__, Escape)
    assert s.push("after") is False
    assert s.take_leftovers() == [user("pending guidance")]
    # The loop is usable again and the sealed guidance stays sealed.
    client.extend([reply("ok")])
    loop.run("again")
    assert "pending guidance" not in texts(client.requests[-1].messages)


def test_slot_closes_even_when_an_exception_escapes_before_finalize(
    make_loop: Callable[..., BareLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    escaped: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    gate = Gate()
    client = ScriptedClient([gated_raise(gate, ModelError("boom", retryable=False))])
    loop = make_loop(client)

    def broken(self: RunDriver, error: LoopError) -> None:
        raise RuntimeError("driver bug while recording the failure")

    monkeypatch.setattr(RunDriver, "set_error_state", broken)
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert s.push("undrained")
    gate.open()
    assert handle.wait(WAIT)
    assert [type(e) for e in escaped] == [RuntimeError]
    loop._active = None  # let close() skip the run this test broke on purpose
    assert s.push("into a dead run") is False
    assert s.take_leftovers() == [user("undrained")]


def test_a_new_run_seals_guidance_left_live_by_a_run_that_never_closed_the_slot(
    make_loop: Callable[..., BareLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Defence in depth: even if a run ended without closing the slot, the next run
    # opens it by sealing what is still live, never by delivering it.
    client = ScriptedClient([reply("one"), reply("two")])
    loop = make_loop(client)
    s = loop.steering()
    monkeypatch.setattr(s, "_close_and_seal", lambda: None)  # a run that forgets to close
    loop.run("first")
    assert s.push("stale") is True  # the dead run's slot is still open
    monkeypatch.undo()
    loop.run("second")
    assert "stale" not in texts(client.requests[1].messages)
    assert "stale" not in texts(loop.conversation())
    assert s.take_leftovers() == [user("stale")]


# -- events ------------------------------------------------------------------------------


def test_on_steering_fires_with_the_messages_and_turn_before_that_turn_starts(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(client, [GatedTool(gate)])
    rec = Recorder()
    loop.register_observer(rec)
    handle = loop.start("hi")
    gate.wait_entered()
    assert loop.steering().push("a") and loop.steering().push(user("b"))
    gate.open()
    run = handle.result(WAIT)
    (event,) = rec.of(SteeringDelivered)
    assert event.turn == 1
    assert event.messages == (user("a"), user("b"))
    assert event.run_id == run.id and event.session_id == loop.session.id
    kinds = [(type(e).__name__, getattr(e, "turn", None), getattr(e, "phase", None)) for e in rec.events]
    i = kinds.index(("SteeringDelivered", 1, None))
    assert kinds[i - 1] == ("TurnEnd", 0, "tools")
    assert kinds[i + 1] == ("TurnStart", 1, None)


def test_no_steering_event_when_nothing_was_pushed(make_loop: Callable[..., BareLoop]) -> None:
    client = ScriptedClient([call("work"), reply("done")])
    loop = make_loop(client, [GatedTool()])
    rec = Recorder()
    loop.register_observer(rec)
    loop.run("hi")
    assert rec.of(SteeringDelivered) == []


# -- steering with cancel and failure ----------------------------------------------------


def _baseline(loop: BareLoop, client: ScriptedClient) -> list[Message]:
    client.extend([reply("earlier answer")])
    loop.run("earlier question")
    return list(loop.machine.history)


def test_guidance_pushed_before_a_cancel_is_a_leftover_and_history_is_unchanged(
    make_loop: Callable[..., BareLoop],
) -> None:
    gate = Gate()
    client = ScriptedClient()
    loop = make_loop(client, [GatedTool(gate)])
    before = _baseline(loop, client)
    client.extend([call("work"), reply("never")])
    s = loop.steering()
    handle = loop.start("hi")
    gate.wait_entered()
    assert s.push("guidance")
    handle.cancel("user stopped it")
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    gate.open()  # the abandoned tool finishes; its result is discarded
    assert list(loop.machine.history) == before
    assert loop.conversation() == before
    assert s.push("after cancel") is False
    assert s.take_leftovers() == [user("guidance")]
    assert len(client.requests) == 2  # the cancelled run never asked again


def test_cancel_discards_delivered_guidance_with_pending_and_seals_the_rest(
    make_loop: Callable[..., BareLoop],
) -> None:
    g_tool, g_model = Gate(), Gate()
    client = ScriptedClient()
    loop = make_loop(client, [GatedTool(g_tool)])
    before = _baseline(loop, client)
    client.extend([call("work"), gated(g_model, reply("never"))])
    s = loop.steering()
    handle = loop.start("hi")
    g_tool.wait_entered()
    assert s.push("delivered")
    g_tool.open()
    g_model.wait_entered()
    assert texts(client.requests[-1].messages)[-1] == "delivered"
    assert s.push("undelivered")
    loop.cancel()
    with pytest.raises(Cancelled):
        handle.result(WAIT)
    g_model.open()
    assert list(loop.machine.history) == before  # delivered-but-uncommitted is gone
    assert s.take_leftovers() == [user("undelivered")]


def test_failed_run_discards_delivered_guidance_and_seals_undelivered(
    make_loop: Callable[..., BareLoop],
) -> None:
    g_tool, g_model = Gate(), Gate()
    client = ScriptedClient()
    loop = make_loop(client, [GatedTool(g_tool)])
    before = _baseline(loop, client)
    client.extend([call("work"), gated_raise(g_model, ModelError("down", retryable=False))])
    s = loop.steering()
    handle = loop.start("hi")
    g_tool.wait_entered()
    assert s.push("delivered")
    g_tool.open()
    g_model.wait_entered()
    assert s.push("undelivered")
    g_model.open()
    with pytest.raises(ModelError):
        handle.result(WAIT)
    assert texts(client.requests[-1].messages)[-1] == "delivered"
    assert list(loop.machine.history) == before
    assert s.take_leftovers() == [user("undelivered")]
    assert s.take_all() == []


def test_a_cancel_before_the_run_seals_nothing_and_refuses_nothing_later(
    make_loop: Callable[..., BareLoop],
) -> None:
    client = ScriptedClient([reply("done")])
    loop = make_loop(client)
    s = loop.steering()
    loop.cancel_signal().cancel()
    assert s.push("while idle, even with a cancel armed") is False
    with pytest.raises(Cancelled):
        loop.run("hi")
    assert s.take_all() == []
    assert client.requests == []
    assert loop.run("hi again").output == "done"


def test_run_config_is_unaffected_by_steering(make_loop: Callable[..., BareLoop]) -> None:
    # A push counts toward nothing but the conversation: max_turns still holds.
    gate = Gate()
    client = ScriptedClient([call("work"), call("work")])
    loop = make_loop(client, [GatedTool(gate)])
    handle = loop.start("hi", RunConfig(max_turns=1))
    gate.wait_entered()
    assert loop.steering().push("keep going")
    gate.open()
    with pytest.raises(LoopError):
        handle.result(WAIT)
    assert len(client.requests) == 1
    assert loop.steering().take_leftovers() == [user("keep going")]


# -- the example and the docs ------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def test_the_steering_demo_runs_and_shows_boundary_leftover_and_refusal() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "steering_demo.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "[agent] turn 0: calling edit_file",
        "[ui] pushed 'src/generated.py is generated. Do not edit it.': accepted=True",
        "[agent] turn 1: guidance arrived: 'src/generated.py is generated. Do not edit it.'",
        "[agent] turn 1: calling edit_file",
        "[ui] pushed 'Also run the tests.': accepted=True",
        "[agent] output: Done: fixed src/app.py; fixed src/util.py. Left src/generated.py alone.",
        "[ui] pushed 'Thanks!' after the run: accepted=False",
        "[ui] leftovers: ['Also run the tests.']",
        "[agent] output: Ran the tests: 12 passed.",
    ]


def test_the_docs_snippet_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "steering.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/steering.md", "exec"), {"__name__": "docs_steering"})
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "idle push: False",
        "accepted: True",
        "output: Built; generated files untouched.",
        "delivered after: ['<tool result>', 'src/generated.py is generated. Do not edit it.']",
        "in history: True",
        "after the run: False",
        "leftovers: []",
    ]


# -- bounded pending guidance -----------------------------------------------------------------


def _held_run(make_loop: Callable[..., BareLoop], gate: Gate) -> tuple[BareLoop, Any]:
    client = ScriptedClient([gated(gate, reply("done"))])
    loop = make_loop(client)
    handle = loop.start("hi")
    gate.wait_entered()
    return loop, handle


def test_push_past_the_message_cap_is_refused_and_stores_nothing(make_loop: Callable[..., BareLoop]) -> None:
    gate = Gate()
    loop, handle = _held_run(make_loop, gate)
    s = loop.steering()
    s.set_limits(max_messages=3, max_bytes=1_000_000)
    assert [s.push(f"g{i}") for i in range(5)] == [True, True, True, False, False]
    gate.open()
    handle.result(WAIT)
    assert s.take_leftovers() == [user("g0"), user("g1"), user("g2")]


def test_push_past_the_byte_cap_is_refused_and_stores_nothing(make_loop: Callable[..., BareLoop]) -> None:
    gate = Gate()
    loop, handle = _held_run(make_loop, gate)
    s = loop.steering()
    s.set_limits(max_messages=1000, max_bytes=25)
    assert s.push("x" * 10) and s.push("é" * 5)  # 10 + 10 bytes (UTF-8)
    assert s.push("y" * 6) is False  # 26 > 25
    assert s.push("z" * 5)  # exactly 25
    gate.open()
    handle.result(WAIT)
    assert s.take_leftovers() == [user("x" * 10), user("é" * 5), user("z" * 5)]


def test_default_caps_refuse_a_flood(make_loop: Callable[..., BareLoop]) -> None:
    """20,000 pushes of 10 KB (200 MB) are not all accepted: the default caps hold."""
    gate = Gate()
    loop, handle = _held_run(make_loop, gate)
    s = loop.steering()
    chunk = "k" * 10_000
    accepted = sum(s.push(chunk) for _ in range(20_000))
    assert accepted * 10_000 <= s.max_bytes and accepted <= s.max_messages
    assert accepted > 0
    gate.open()
    handle.result(WAIT)
    assert len(s.take_leftovers()) == accepted


def test_steering_limits_must_be_positive() -> None:
    s = BareLoop(ScriptedClient([])).steering()
    with pytest.raises(ValueError, match="max_bytes"):
        s.set_limits(max_messages=1, max_bytes=0)
    with pytest.raises(ValueError, match="max_messages"):
        s.set_limits(max_messages=-1, max_bytes=10)
