"""User code never holds a cancel hostage (issue 14, SPEC §5).

An observer, a text streamer, a pre-tool hook, a ``ConfirmationHook``
waiting for a person, a contributor, a memory store, a tool's own
``validate`` / ``is_concurrency_safe`` / ``resource_key`` /
``input_schema``, a token counter, or an answer type's own validation
blocks for up to 3 s; a cancel from another thread still makes ``run()`` /
``result()`` raise ``Cancelled`` within 100 ms. Delivery stays one event
at a time, with ``on_run_end`` last for its run and before any event of a
later run; the caller's contextvars still reach the observer.

Also: one cancel = one cancelled run through ``loop.cancel()``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable, Optional

import pytest
from support import WAIT, Recorder, join_threads

from loopctl import BareLoop, Cancelled, Observer, RunConfig, Tool, ToolContext
from loopctl.context import HeuristicTokenCounter
from loopctl.context.contributors import ContributorContext
from loopctl.hooks import ConfirmationHook, Hook, HookDecision, HookExecutor, ToolHookContext
from loopctl.messages import Message, ModelRequest, ModelResponse
from loopctl.observers import (
    CallbackObserver,
    Event,
    RunEnd,
    RunStart,
    ToolCallReceived,
    ToolPre,
    TurnEnd,
    TurnStart,
)
from loopctl.testing import ScriptedClient, call, calls, reply

BLOCK = 3.0  # how long the user code would block if nobody released it
BOUND = 0.100  # the cancel contract


class Blocker:
    """User code that blocks up to BLOCK seconds the first time it is reached."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.once = True

    def block(self) -> None:
        if self.once:
            self.once = False
            self.entered.set()
            self.release.wait(BLOCK)


class Echo(Tool):
    name = "echo"
    description = "Echo."

    def call(self, input: Any, ctx: ToolContext) -> str:
        return "echoed"


def cancel_at(entered: threading.Event, cancel: Callable[[], Any]) -> tuple[threading.Thread, dict[str, float]]:
    box: dict[str, float] = {}

    def fire() -> None:
        if entered.wait(WAIT):
            box["t"] = time.perf_counter()
            cancel()

    th = threading.Thread(target=fire, name="test-canceller")
    th.start()
    return th, box


def blocking_tool(where: str, blocker: Blocker) -> Tool:
    """``echo``, whose own method named by ``where`` (``tool_<method>``) blocks."""

    class Blocking(Echo):
        def validate(self, input: Mapping[str, Any]) -> Optional[str]:
            if where == "tool_validate":
                blocker.block()
            return super().validate(input)

        def is_concurrency_safe(self, input: Mapping[str, Any]) -> bool:
            if where == "tool_is_concurrency_safe":
                blocker.block()
            return True

        def resource_key(self, input: Mapping[str, Any]) -> Optional[str]:
            if where == "tool_resource_key":
                blocker.block()
            return None

        def input_schema(self) -> Mapping[str, Any]:
            if where == "tool_input_schema":
                blocker.block()
            return super().input_schema()

    return Blocking()


@dataclasses.dataclass
class Answer:
    """A typed answer whose own validation blocks (``BLOCKER`` is set by the test)."""

    x: int

    def __post_init__(self) -> None:
        BLOCKER[0].block()


BLOCKER: list[Blocker] = []


def build(where: str, blocker: Blocker) -> tuple[BareLoop, RunConfig]:
    """A loop whose user code at ``where`` blocks, and the config to run it with."""
    config = RunConfig()
    if where.startswith("tool_"):
        # Two calls of one reply: the dispatcher plans a wave (is_concurrency_safe, resource_key).
        client = ScriptedClient([calls(("echo", {}), ("echo", {})), reply("done"), reply("after")])
        return BareLoop(client, [blocking_tool(where, blocker)]), config
    if where == "answer_type":
        BLOCKER[:] = [blocker]
        client = ScriptedClient([call("echo"), reply('{"x": 1}'), reply("after")])
        return BareLoop(client, [Echo()]), RunConfig(output_type=Answer)
    client = ScriptedClient([call("echo"), reply("done"), reply("after")])
    loop = BareLoop(client, [Echo()])
    if where == "token_counter":

        class SlowCounter(HeuristicTokenCounter):
            def count_text(self, text: str) -> int:
                blocker.block()
                return super().count_text(text)

        loop.with_token_counter(SlowCounter())
    elif where == "observer":

        class Slow(Observer):
            def on_turn_start(self, event: TurnStart) -> None:
                blocker.block()

        loop.register_observer(Slow())
    elif where == "text_streamer":
        loop.set_text_streamer(lambda delta: blocker.block())
    elif where == "pre_tool_hook":

        class SlowHook(Hook):
            def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
                blocker.block()
                return None

        loop.set_hook_executor(HookExecutor([SlowHook()]))
    elif where == "confirmation_hook":

        def ask_a_person(ctx: ToolHookContext) -> bool:
            blocker.block()
            return True

        loop.set_hook_executor(HookExecutor([ConfirmationHook(ask_a_person)]))
    elif where == "contributor":

        class SlowContributor:
            def contribute(self, ctx: ContributorContext) -> Optional[Message]:
                blocker.block()
                return None

        loop.add_contributor(SlowContributor())
    elif where == "memory":

        class SlowMemory:
            def retrieve(self, query: str, limit: int) -> list[Any]:
                blocker.block()
                return []

            def store(self, entry: Any) -> None:
                return None

            def consolidate(self) -> None:
                return None

        loop.set_memory(SlowMemory())
    return loop, config


WHERE = [
    "observer", "text_streamer", "pre_tool_hook", "confirmation_hook", "contributor", "memory",
    "tool_validate", "tool_is_concurrency_safe", "tool_resource_key", "tool_input_schema", "token_counter",
    "answer_type",
]


@pytest.mark.parametrize("entry", ["run", "start"])
@pytest.mark.parametrize("where", WHERE)
def test_blocking_user_code_never_delays_cancel(where: str, entry: str) -> None:
    blocker = Blocker()
    loop, config = build(where, blocker)
    try:
        if entry == "run":
            th, box = cancel_at(blocker.entered, lambda: loop.cancel("stop"))
            with pytest.raises(Cancelled):
                loop.run("go", config)
        else:
            handle = loop.start("go", config)
            th, box = cancel_at(blocker.entered, lambda: handle.cancel("stop"))
            with pytest.raises(Cancelled):
                handle.result(WAIT)
        latency = time.perf_counter() - box["t"]
        th.join(WAIT)
        assert latency < BOUND, f"{where}: Cancelled came {latency * 1000:.0f} ms after the cancel"
        assert not blocker.release.is_set()  # the user code was still blocked meanwhile
    finally:
        blocker.release.set()
        loop.close()
    join_threads("loopctl-", check=False)


def test_a_blocked_observer_delays_delivery_never_order_nor_context() -> None:
    """Run 1 is cancelled while its observer blocks; run 2 starts at once.

    Events still arrive one at a time; run 1's ``on_run_end`` is its last
    event and comes before run 2's first; each run's events see its own
    caller's contextvars.
    """
    var: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")
    blocker = Blocker()
    seen: list[tuple[str, type[Event], str]] = []
    busy = [0]
    overlaps: list[str] = []
    run2_ended = threading.Event()

    def watch(event: Event) -> None:
        busy[0] += 1
        if busy[0] > 1:
            overlaps.append(type(event).__name__)
        seen.append((event.run_id, type(event), var.get()))
        if isinstance(event, TurnStart) and event.run_id == "one":
            blocker.block()
        if isinstance(event, RunEnd) and event.run_id == "two":
            run2_ended.set()
        busy[0] -= 1

    client = ScriptedClient([reply("second")])  # run 1 never reaches the model
    loop = BareLoop(client).with_turn_mode("non_streaming")
    loop.register_observer(CallbackObserver(watch))
    try:
        var.set("caller one")
        th, box = cancel_at(blocker.entered, lambda: loop.cancel("stop"))
        t0 = time.perf_counter()
        with pytest.raises(Cancelled):
            loop.run("first", run_id="one")
        assert time.perf_counter() - t0 < BLOCK / 2
        th.join(WAIT)
        var.set("caller two")
        assert loop.run("second", run_id="two").output == "second"  # never waits for delivery
        assert not run2_ended.is_set()  # its events wait behind the blocked observer
        blocker.release.set()
        assert run2_ended.wait(WAIT)
    finally:
        blocker.release.set()
        loop.close()
    join_threads("loopctl-", check=False)
    assert overlaps == []
    runs = [rid for rid, _, _ in seen]
    assert runs == sorted(runs, key=["one", "two"].index)  # every run-1 event before run 2's
    one = [(cls, who) for rid, cls, who in seen if rid == "one"]
    two = [(cls, who) for rid, cls, who in seen if rid == "two"]
    assert one[0][0] is RunStart and one[-1][0] is RunEnd
    assert two[0][0] is RunStart and two[-1][0] is RunEnd
    assert {who for _, who in one} == {"caller one"}
    assert {who for _, who in two} == {"caller two"}


@pytest.mark.parametrize("entry", ["run", "start"])
@pytest.mark.parametrize(
    ("held_in", "phase"),
    [(TurnStart, "llm"), (ToolCallReceived, "tools"), (ToolPre, "tools")],
    ids=["on_turn_start", "on_tool_call_received", "on_tool_pre"],
)
def test_a_cancel_while_an_observer_holds_a_phases_event_still_sends_its_failed_turn_end(
    held_in: type[Event], phase: str, entry: str
) -> None:
    """The phase is open from its first event: the takeover owes, and sends, its ``on_turn_end``.

    The observer blocks in the phase's opening event (or, as a control, in a
    later one); the run is cancelled meanwhile. Once the observer returns,
    the queued events arrive in order: the phase's failed ``on_turn_end``,
    then ``on_run_end``.
    """
    blocker = Blocker()

    def watch(event: Event) -> None:
        if type(event) is held_in:
            blocker.block()

    rec = Recorder()
    loop = BareLoop(ScriptedClient([call("echo"), reply("never")]), [Echo()])
    loop.register_observer(CallbackObserver(watch))
    loop.register_observer(rec)
    try:
        if entry == "run":
            th, _ = cancel_at(blocker.entered, lambda: loop.cancel("stop"))
            with pytest.raises(Cancelled):
                loop.run("go")
        else:
            handle = loop.start("go")
            th, _ = cancel_at(blocker.entered, lambda: handle.cancel("stop"))
            with pytest.raises(Cancelled):
                handle.result(WAIT)
        th.join(WAIT)
        blocker.release.set()
        assert rec.run_ended.wait(WAIT)
    finally:
        blocker.release.set()
        loop.close()
    join_threads("loopctl-", check=False)
    events = rec.snapshot()
    assert type(events[-1]) is RunEnd and not events[-1].success
    ends = [e for e in events if isinstance(e, TurnEnd)]
    before = [] if phase == "llm" else [("llm", True)]  # a tool phase: its turn's reply came first
    assert [(e.phase, e.success) for e in ends] == [*before, (phase, False)]
    cut = ends[-1]
    assert (cut.turn, cut.phase, cut.error_type) == (0, phase, "Cancelled") and "stop" in (cut.error or "")
    assert events.index(cut) == len(events) - 2  # the phase's end, then the run's
    if phase == "tools":  # the tool phase reports the reply that asked, as when it ends on its own
        assert cut.output_tokens == ends[0].output_tokens and cut.stop_reason == ends[0].stop_reason


# -- one cancel = one cancelled run, through loop.cancel() ---------------------------------------


def test_loop_cancel_reaches_no_run_when_none_is_in_flight() -> None:
    with BareLoop(ScriptedClient([reply("clean")])) as loop:
        assert loop.cancel("nobody home") is False
        assert not loop.is_cancelled()
        assert loop.run("go").output == "clean"
        assert loop.cancel("too late") is False  # that run has ended
        assert not loop.is_cancelled()


def test_two_cancels_a_few_ms_apart_cancel_one_run_and_the_next_completes() -> None:
    """A double-click on Stop: 100 trials, the second click 0-5 ms after the first."""
    for trial in range(100):
        entered = threading.Event()
        release = threading.Event()

        def held(
            request: ModelRequest, entered: threading.Event = entered, release: threading.Event = release
        ) -> ModelResponse:
            entered.set()
            release.wait(WAIT)
            return reply("abandoned")

        client = ScriptedClient([held, reply(f"clean {trial}")])
        with BareLoop(client).with_turn_mode("non_streaming") as loop:
            handle = loop.start("first")
            assert entered.wait(WAIT)
            gap = (trial % 6) / 1000.0
            assert loop.cancel("click 1") is True
            if gap:
                threading.Event().wait(gap)  # the second click, gap ms later
            loop.cancel("click 2")
            with pytest.raises(Cancelled, match="click 1"):
                handle.result(WAIT)
            release.set()
            run = loop.run("second", RunConfig())
            assert run.output == f"clean {trial}", f"trial {trial}: the next run was cancelled"
        join_threads("loopctl-", check=False)
