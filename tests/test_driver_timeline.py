"""The observer timeline of BareLoop (seed 000, SPEC §4.1), event by event.

A two-turn run with one tool call, in streaming and non-streaming mode:
the exact sequence of event types and their key fields, the two
``on_turn_end`` of a tool turn with disjoint durations, failures, observers
that raise, registration order, ids on every event, ``to_dict()``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Optional

import pytest
import support
from support import Gate, Recorder

from loopctl import BareLoop, LoopError, ModelError, Observer, StopReason, Usage
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.observers import (
    EVENT_METHODS,
    CallbackObserver,
    Event,
    Response,
    RunEnd,
    RunStart,
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
from loopctl.testing import ScriptedClient, calls, reply
from loopctl.tools import Tool, ToolContext


class Echo(support.Echo):
    """``echo(x)`` answers ``echo:<x>``; optionally spends ``work_s`` first."""

    description = "Echo the input."

    def __init__(self, work_s: float = 0.0) -> None:
        super().__init__(hook=(lambda input, ctx: _spend(work_s)) if work_s else None)


def _spend(seconds: float) -> None:
    """Take measurable wall time (a phase's work, not a synchronisation)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        time.sleep(seconds / 10)


def _collapse(types: list[type]) -> list[type]:
    """Runs of the same delta type collapse to one entry (×N)."""
    out: list[type] = []
    for t in types:
        if t in (TextDelta, ThinkingDelta, ToolInputDelta) and out and out[-1] is t:
            continue
        out.append(t)
    return out


TOOL_TEXT = "Let me check that for you."
FINAL_TEXT = "The echo said one, all done."
THINKING = "The tool answered; now summarise it briefly."


def _two_turn_loop(streaming: bool, **kw: Any) -> tuple[BareLoop, ScriptedClient, Recorder]:
    client = ScriptedClient(
        [
            calls(("echo", {"x": 1}), text=TOOL_TEXT),
            reply(FINAL_TEXT, thinking=THINKING, usage=Usage(120, 30)),
        ]
    )
    loop = BareLoop(client, [Echo(**kw)])
    if not streaming:
        loop.set_turn_mode("non_streaming")
    rec = Recorder()
    loop.register_observer(rec)
    return loop, client, rec


STREAMING_TIMELINE = [
    RunStart,
    TurnStart,
    TextDelta,  # ×N
    ToolInputDelta,
    StreamSuccess,
    Response,
    TurnEnd,  # turn 0, phase llm
    ToolCallReceived,
    ToolPre,
    ToolPost,
    TurnEnd,  # turn 0, phase tools
    TurnStart,
    ThinkingDelta,  # ×N
    TextDelta,  # ×N
    StreamSuccess,
    Response,
    TurnEnd,  # turn 1, phase llm
    RunEnd,
]

NON_STREAMING_TIMELINE = [
    t for t in STREAMING_TIMELINE if t not in (TextDelta, ThinkingDelta, ToolInputDelta)
]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_two_turn_timeline_event_by_event(streaming: bool) -> None:
    loop, client, rec = _two_turn_loop(streaming)
    with loop:
        run = loop.run("please echo one")
    expected = STREAMING_TIMELINE if streaming else NON_STREAMING_TIMELINE
    assert _collapse(rec.types()) == expected
    if not streaming:
        assert rec.types() == expected  # no deltas at all without streaming

    ev = rec.events
    call_id = run.turns[0].tool_calls[0].id
    start = rec.of(RunStart)[0]
    assert start.input == "please echo one"

    turn_starts = rec.of(TurnStart)
    assert [(t.turn, t.query) for t in turn_starts] == [(0, "please echo one"), (1, "echo:1")]

    ends = rec.of(TurnEnd)
    assert [(e.turn, e.phase, e.success, e.error) for e in ends] == [
        (0, "llm", True, None),
        (0, "tools", True, None),
        (1, "llm", True, None),
    ]
    assert ends[0].stop_reason == StopReason.TOOL_CALL
    assert ends[1].stop_reason == StopReason.TOOL_CALL
    assert ends[2].stop_reason == StopReason.END_TURN
    assert (ends[2].input_tokens, ends[2].output_tokens) == (120, 30)
    assert all(e.context_window == 200_000 for e in ends)
    assert all(e.context_tokens > 0 for e in ends)
    # The context grows: the tool phase adds the result, turn 1 adds its reply.
    assert ends[0].context_tokens < ends[1].context_tokens < ends[2].context_tokens

    received = rec.of(ToolCallReceived)
    assert [(r.turn, r.call_id, r.tool, dict(r.input)) for r in received] == [
        (0, call_id, "echo", {"x": 1})
    ]
    pre, post = rec.of(ToolPre), rec.of(ToolPost)
    assert [(p.turn, p.call_id, p.tool, p.attempt) for p in pre] == [(0, call_id, "echo", 0)]
    assert [(p.turn, p.call_id, p.tool, p.attempt, p.is_error, p.output) for p in post] == [
        (0, call_id, "echo", 0, False, "echo:1")
    ]
    assert post[0].result_hash and post[0].duration_ms >= 0

    responses = rec.of(Response)
    assert [(r.turn, r.text) for r in responses] == [(0, TOOL_TEXT), (1, FINAL_TEXT)]
    assert responses[1].usage == Usage(120, 30)
    successes = rec.of(StreamSuccess)
    assert [(s.turn, s.model) for s in successes] == [(0, "scripted"), (1, "scripted")]
    assert successes[1].usage == Usage(120, 30)

    if streaming:
        def by_turn(cls: type, turn: int) -> str:
            return "".join(e.delta for e in rec.of(cls) if e.turn == turn)

        assert by_turn(TextDelta, 0) == TOOL_TEXT
        assert by_turn(TextDelta, 1) == FINAL_TEXT
        assert by_turn(ThinkingDelta, 1) == THINKING
        assert by_turn(ThinkingDelta, 0) == ""
        assert len(rec.of(TextDelta)) > 2  # small deltas, not one blob
        tid = rec.of(ToolInputDelta)
        assert {(d.turn, d.call_id, d.tool) for d in tid} == {(0, call_id, "echo")}
        assert json.loads("".join(d.delta for d in tid)) == {"x": 1}

    end = ev[-1]
    assert isinstance(end, RunEnd)
    assert (end.success, end.error, end.total_turns) == (True, None, 2)
    assert end.duration_ms >= 0
    assert run.output == FINAL_TEXT
    assert len(client.requests) == 2


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_every_event_carries_session_and_run_id(streaming: bool) -> None:
    loop, client, rec = _two_turn_loop(streaming)
    with loop:
        first = loop.run("one")
        client.extend([reply("second answer, different words")])
        second = loop.run("two")
    assert first.id != second.id
    cut = rec.types().index(RunEnd) + 1
    assert {(e.session_id, e.run_id) for e in rec.events[:cut]} == {(loop.session.id, first.id)}
    assert {(e.session_id, e.run_id) for e in rec.events[cut:]} == {(loop.session.id, second.id)}


def test_run_id_argument_is_the_record_id_and_on_events() -> None:
    client = ScriptedClient([reply("fine")])
    rec = Recorder()
    with BareLoop(client).with_observer(rec) as loop:
        run = loop.run("hi", run_id="my-run-7")
    assert run.id == "my-run-7"
    assert {e.run_id for e in rec.events} == {"my-run-7"}


def test_event_to_dict_has_type_and_is_json_safe() -> None:
    loop, _, rec = _two_turn_loop(True)
    with loop:
        loop.run("dict me")
    seen = set()
    for e in rec.events:
        d = e.to_dict()
        assert d["type"] == type(e).TYPE
        assert d["session_id"] == e.session_id and d["run_id"] == e.run_id
        json.dumps(d)  # JSON-safe
        seen.add(d["type"])
    assert {
        "run_start",
        "turn_start",
        "text_delta",
        "thinking_delta",
        "tool_input_delta",
        "stream_success",
        "response",
        "turn_end",
        "tool_call_received",
        "tool_pre",
        "tool_post",
        "run_end",
    } <= seen
    turn_end = rec.of(TurnEnd)[0].to_dict()
    assert turn_end["phase"] == "llm" and turn_end["stop_reason"] == "tool_call"


def test_events_are_frozen() -> None:
    loop, _, rec = _two_turn_loop(False)
    with loop:
        loop.run("freeze")
    import attrs

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rec.events[0].run_id = "other"  # type: ignore[misc]


def test_tool_turn_has_two_turn_ends_with_disjoint_durations() -> None:
    """The LLM phase and the tool phase each time only their own work.

    The model call and the tool each take ~30 ms. Arrival times of the
    events bound each phase from outside: the LLM phase lies between
    on_turn_start and its on_turn_end; the tool phase between
    on_tool_call_received and its on_turn_end. A tool phase that also
    counted the model call (or the reverse) breaks these bounds.
    """
    work = 0.03

    def slow_model(request: ModelRequest) -> ModelResponse:
        _spend(work)
        return calls(("echo", {"x": 2}))

    client = ScriptedClient([slow_model, reply("finished in two")])
    rec = Recorder()
    with BareLoop(client, [Echo(work_s=work)]).with_observer(rec) as loop:
        loop.set_turn_mode("non_streaming")
        loop.run("time it")
    idx = {id(e): i for i, e in enumerate(rec.events)}
    llm_end, tools_end, _ = rec.of(TurnEnd)
    assert (llm_end.phase, tools_end.phase) == ("llm", "tools")
    t_start = rec.times[idx[id(rec.of(TurnStart)[0])]]
    t_llm_end = rec.times[idx[id(llm_end)]]
    t_received = rec.times[idx[id(rec.of(ToolCallReceived)[0])]]
    t_tools_end = rec.times[idx[id(tools_end)]]
    assert llm_end.duration_ms >= work * 1000 * 0.9
    assert tools_end.duration_ms >= work * 1000 * 0.9
    assert llm_end.duration_ms <= (t_llm_end - t_start) * 1000
    assert tools_end.duration_ms <= (t_tools_end - t_received) * 1000
    # Disjoint: together they fit in the wall time of the whole turn.
    assert llm_end.duration_ms + tools_end.duration_ms <= (t_tools_end - t_start) * 1000


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_failed_model_call_fires_failed_turn_end_then_run_end(streaming: bool) -> None:
    client = ScriptedClient([ModelError("upstream exploded (status 500)", status=500)])
    rec = Recorder()
    with BareLoop(client).with_observer(rec) as loop:
        if not streaming:
            loop.set_turn_mode("non_streaming")
        with pytest.raises(ModelError) as info:
            loop.run("fail please")
    assert rec.types() == [RunStart, TurnStart, StreamFailure, TurnEnd, RunEnd]
    failure, turn_end, run_end = rec.of(StreamFailure)[0], rec.of(TurnEnd)[0], rec.of(RunEnd)[0]
    assert failure.turn == 0 and "upstream exploded" in failure.error
    assert (turn_end.turn, turn_end.phase, turn_end.success) == (0, "llm", False)
    assert turn_end.error is not None and "upstream exploded" in turn_end.error
    assert (run_end.success, run_end.total_turns) == (False, 0)
    assert run_end.error is not None and "upstream exploded" in run_end.error
    assert info.value.run is not None and info.value.run.stop_reason is info.value


def test_failure_on_second_turn_after_a_tool_turn() -> None:
    client = ScriptedClient([calls(("echo", {"x": 3})), RuntimeError("socket reset")])
    rec = Recorder()
    with BareLoop(client, [Echo()]).with_observer(rec) as loop:
        loop.set_turn_mode("non_streaming")
        with pytest.raises(ModelError) as info:
            loop.run("two turns, second fails")
    assert _collapse(rec.types()) == [
        RunStart, TurnStart, StreamSuccess, Response, TurnEnd,
        ToolCallReceived, ToolPre, ToolPost, TurnEnd,
        TurnStart, StreamFailure, TurnEnd, RunEnd,
    ]  # fmt: skip
    last_turn_end = rec.of(TurnEnd)[-1]
    assert (last_turn_end.turn, last_turn_end.phase, last_turn_end.success) == (1, "llm", False)
    assert isinstance(info.value.__cause__, RuntimeError)  # foreign error chained
    assert "socket reset" in str(info.value)
    assert rec.of(RunEnd)[-1].success is False


class Exploding(Observer):
    """Raises from every event it gets."""

    def __init__(self) -> None:
        self.calls = 0

    def on_turn_start(self, event: TurnStart) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")

    def on_tool_post(self, event: ToolPost) -> None:
        self.calls += 1
        raise ValueError("observer bug")

    def on_run_end(self, event: RunEnd) -> None:
        self.calls += 1
        raise KeyError("observer bug")


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_raising_observer_is_logged_skipped_and_changes_nothing(
    streaming: bool, caplog: pytest.LogCaptureFixture
) -> None:
    baseline_loop, _, baseline = _two_turn_loop(streaming)
    with baseline_loop:
        baseline_run = baseline_loop.run("same input")

    loop, client, before = _two_turn_loop(streaming)
    bomb = Exploding()
    after = Recorder()
    loop.register_observer(bomb)
    loop.register_observer(after)
    with caplog.at_level(logging.ERROR, logger="loopctl"), loop:
        run = loop.run("same input")
    assert bomb.calls == 4  # two turn starts, one tool post, one run end
    assert before.types() == after.types() == baseline.types()
    assert run.output == baseline_run.output
    assert loop.conversation()[-1].text == FINAL_TEXT
    logged = [r for r in caplog.records if "Exploding" in r.getMessage()]
    assert len(logged) == 4, [r.getMessage() for r in caplog.records]
    assert any("on_turn_start" in r.getMessage() for r in logged)
    assert all(r.exc_info is not None for r in logged)


def test_raising_callback_observer_is_logged_with_a_name(caplog: pytest.LogCaptureFixture) -> None:
    def flaky_sink(event: Event) -> None:
        raise RuntimeError("sink down")

    client = ScriptedClient([reply("still fine")])
    with caplog.at_level(logging.ERROR, logger="loopctl"):
        with BareLoop(client).with_observer(CallbackObserver(flaky_sink)) as loop:
            run = loop.run("x")
    assert run.output == "still fine"
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs and all("flaky_sink" in m for m in msgs), msgs


def test_observers_called_in_registration_order() -> None:
    order: list[tuple[str, str]] = []

    class Named(Observer):
        def __init__(self, name: str) -> None:
            self.name = name
            for method in EVENT_METHODS.values():
                setattr(self, method, self._on)

        def _on(self, event: Event) -> None:
            order.append((type(event).TYPE, self.name))

    loop, _, _ = _two_turn_loop(True)
    for name in ("a", "b", "c"):
        loop.register_observer(Named(name))
    with loop:
        loop.run("order")
    assert len(order) % 3 == 0 and len(order) > 30
    for i in range(0, len(order), 3):
        triple = order[i : i + 3]
        assert [n for _, n in triple] == ["a", "b", "c"], triple
        assert len({t for t, _ in triple}) == 1


def test_observer_overriding_one_method_gets_only_that_event() -> None:
    got: list[Event] = []

    class OnlyEnds(Observer):
        def on_run_end(self, event: RunEnd) -> None:
            got.append(event)

    loop, _, _ = _two_turn_loop(True)
    loop.register_observer(OnlyEnds())
    with loop:
        loop.run("x")
    assert [type(e) for e in got] == [RunEnd]


def test_observer_registered_between_runs_sees_only_later_runs() -> None:
    client = ScriptedClient([reply("first reply text"), reply("second reply words")])
    late = Recorder()
    with BareLoop(client) as loop:
        loop.run("one")
        loop.register_observer(late)
        second = loop.run("two")
    assert late.types()[0] is RunStart
    assert {e.run_id for e in late.events} == {second.id}


def test_text_streamer_gets_deltas_before_observers() -> None:
    order: list[tuple[str, str]] = []
    client = ScriptedClient([reply("streamed to the console")])
    with BareLoop(client) as loop:
        loop.set_text_streamer(lambda d: order.append(("streamer", d)))
        loop.register_observer(CallbackObserver(
            lambda e: order.append(("observer", e.delta)) if isinstance(e, TextDelta) else None
        ))
        loop.run("x")
    assert "".join(d for who, d in order if who == "streamer") == "streamed to the console"
    for i in range(0, len(order), 2):
        (w1, d1), (w2, d2) = order[i], order[i + 1]
        assert (w1, w2) == ("streamer", "observer") and d1 == d2


def test_observers_run_on_the_run_thread() -> None:
    loop, _, rec = _two_turn_loop(True)
    with loop:
        loop.run("where")
    assert len(set(rec.threads)) == 1
    assert rec.threads[0].startswith("loopctl-run-")


def _first(events: list[Event], cls: type) -> Optional[Event]:
    return next((e for e in events if type(e) is cls), None)


def test_unknown_tool_gets_received_event_but_no_pre_post() -> None:
    client = ScriptedClient([calls(("ghost", {}), ("echo", {"x": 9})), reply("ok then")])
    rec = Recorder()
    with BareLoop(client, [Echo()]).with_observer(rec) as loop:
        loop.set_turn_mode("non_streaming")
        loop.run("x")
    assert [r.tool for r in rec.of(ToolCallReceived)] == ["ghost", "echo"]
    assert [p.tool for p in rec.of(ToolPre)] == ["echo"]
    assert [p.tool for p in rec.of(ToolPost)] == ["echo"]
    first_pre = _first(rec.events, ToolPre)
    assert first_pre is not None
    assert rec.events.index(first_pre) > rec.events.index(rec.of(ToolCallReceived)[-1])


def test_error_observer_does_not_break_a_failing_run() -> None:
    client = ScriptedClient([ModelError("nope")])
    with BareLoop(client).with_observer(Exploding()) as loop:
        loop.set_turn_mode("non_streaming")
        with pytest.raises(LoopError) as info:
            loop.run("x")
    assert isinstance(info.value, ModelError)


# -- a cancelled phase, and the event tap -----------------------------------------------------


@pytest.mark.parametrize("where", ["model", "tool"])
def test_a_cancelled_phase_fires_a_failed_turn_end(where: str) -> None:
    gate = Gate()

    class Stuck(Tool):
        name = "stuck"
        description = "Blocks."

        def call(self, input: Any, ctx: ToolContext) -> str:
            gate.pass_through()
            return "late"

    def blocked(request: ModelRequest) -> ModelResponse:
        gate.pass_through()
        return reply("late")

    script: list[Any] = [blocked] if where == "model" else [calls(("stuck", {}))]
    rec = Recorder()
    with BareLoop(ScriptedClient(script), [Stuck()]).with_observer(rec) as loop:
        loop.set_turn_mode("non_streaming")
        def cancel_at_gate() -> None:
            if gate.entered.wait(10.0):
                loop.cancel("stop")

        canceller = threading.Thread(target=cancel_at_gate, name="test-canceller")
        canceller.start()
        with pytest.raises(LoopError):
            loop.run("cancel me")
        canceller.join(10.0)
        gate.release.set()
    ends = rec.of(TurnEnd)
    assert rec.types()[-2:] == [TurnEnd, RunEnd]
    last = ends[-1]
    assert (last.turn, last.phase, last.success) == (0, "llm" if where == "model" else "tools", False)
    assert last.error is not None and "cancel" in last.error


def test_next_runs_tap_survives_the_previous_runs_finalize() -> None:
    """Pause run 1 right after it freed the loop (before it clears the tap); start run 2 then.

    A trace function parks run 1's thread on the line that clears the tap,
    which makes the window exact; run 2 is gated in its model call so that
    its later events are emitted after run 1 has finished.
    """
    import linecache

    parked, resume = threading.Event(), threading.Event()
    target = "self._emitter.tap = None"

    def local(frame: Any, event: str, arg: Any) -> Any:
        if not threading.current_thread().name.startswith("loopctl-run-first"):
            return local
        if event == "line" and not loop._busy.locked():
            if linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() == target:
                parked.set()  # the loop is free, the tap not yet cleared: the window
                resume.wait(10.0)
        elif event == "return":
            parked.set()  # finalize ended with no such window (the fixed driver)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_name == "_finalize" else None

    gate = Gate()

    def gated(request: ModelRequest) -> ModelResponse:
        gate.pass_through()
        return reply("second answer")

    client = ScriptedClient([reply("first answer"), gated])
    second_tap: list[Event] = []
    loop = BareLoop(client).with_turn_mode("non_streaming")
    previous = getattr(threading, "gettrace", lambda: None)()
    threading.settrace(tracer)
    try:
        first = loop.start("one", run_id="first", tap=lambda e: None)
        assert parked.wait(10.0), "run 1 never reached the line that clears the tap"
        second = loop.start("two", run_id="second", tap=second_tap.append)
        assert gate.entered.wait(10.0)
    finally:
        threading.settrace(previous)  # type: ignore[arg-type]
        resume.set()
    first.result(10.0)
    gate.release.set()
    second.result(10.0)
    loop.close()
    assert [type(e) for e in second_tap][-1] is RunEnd
