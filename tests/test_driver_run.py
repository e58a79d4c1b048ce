"""BareLoop.run / start: commit and discard, the request, records, accessors, resources.

SPEC §2.2, §2.4, §4 and seed 000: success commits the run's messages,
failure leaves history exactly as before, the user's input reaches every
request exactly once, every run gets its ``Run`` record, one run at a time.
Windows are opened with gates (Events), never sleeps.
"""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path
from typing import Any

import pytest
import support
from support import WAIT, Gate

from loopctl import (
    BareLoop,
    Cancelled,
    ConfigError,
    Loop,
    LoopBusy,
    LoopError,
    MaxTurnsExceeded,
    Message,
    ModelError,
    ParallelDispatch,
    Role,
    RunConfig,
    RunHandle,
    SessionConfig,
    StopReason,
    ToolResultPart,
    Usage,
)
from loopctl.machine import LoopMachine, MachineState
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.observers import CallbackObserver, Event
from loopctl.records import Session
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools import Tool, ToolContext


class Echo(support.Echo):
    """``echo(x)`` -> ``echo:<x>``; may overlap other calls in a parallel wave."""

    description = "Echo x."
    concurrency_safe = True


def _user_texts(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if m.role == Role.USER and m.text]


def _loop(script: list[Any], tools: Any = (), **kw: Any) -> tuple[BareLoop, ScriptedClient]:
    client = ScriptedClient(script)
    loop = BareLoop(client, tools, **kw)
    loop.set_turn_mode("non_streaming")
    return loop, client


# -- commit and discard ------------------------------------------------------------


def test_success_commits_and_next_request_carries_previous_run() -> None:
    loop, client = _loop([call("echo", x=1), reply("first done"), reply("second done")], [Echo()])
    with loop:
        loop.run("first question")
        first_conv = loop.conversation()
        assert [m.role for m in first_conv] == ["user", "assistant", "user", "assistant"]
        assert list(loop.machine.history) == first_conv
        assert len(loop.machine.pending) == 0
        loop.run("second question")
    req = client.requests[2]
    assert list(req.messages) == first_conv + [Message.user("second question")]
    conv = loop.conversation()
    assert conv[:5] == first_conv + [Message.user("second question")]
    assert len(conv) == 6 and conv[-1].text == "second done"


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_failure_leaves_history_exactly_as_before(streaming: bool) -> None:
    client = ScriptedClient(
        [
            reply("the committed answer"),
            call("echo", x=2),
            ModelError("provider down"),
            reply("after the failure"),
        ]
    )
    with BareLoop(client, [Echo()]) as loop:
        if not streaming:
            loop.set_turn_mode("non_streaming")
        loop.run("committed")
        before = loop.conversation()
        with pytest.raises(ModelError) as info:
            loop.run("doomed")
        assert loop.conversation() == before
        assert list(loop.machine.history) == before
        assert len(loop.machine.pending) == 0
        loop.run("recovered")
    err = info.value
    assert err.run is not None and err.run.stop_reason is err
    assert err.run.end is not None and err.run.output is None
    assert [t.turn for t in err.run.turns] == [0]  # the tool turn is recorded
    # The request after the failure sees none of the failed run's messages.
    assert list(client.requests[3].messages) == before + [Message.user("recovered")]


def test_user_input_appears_exactly_once_in_every_request() -> None:
    script = [calls(("echo", {"x": i})) for i in range(3)] + [reply("end of one")]
    script += [call("echo", x=9), reply("end of two")]
    loop, client = _loop(script, [Echo()])
    with loop:
        loop.run("input-one")
        loop.run("input-two")
    assert len(client.requests) == 6
    for i, req in enumerate(client.requests):
        texts = _user_texts(req)
        assert texts.count("input-one") == 1, (i, texts)
        assert texts.count("input-two") == (1 if i >= 4 else 0), (i, texts)
    # The first request is exactly the input; each later one grows by its turn.
    assert list(client.requests[0].messages) == [Message.user("input-one")]
    for a, b in zip(client.requests[:3], client.requests[1:4]):
        assert list(b.messages)[: len(a.messages)] == list(a.messages)
        assert len(b.messages) == len(a.messages) + 2


def test_every_run_gets_a_record_in_order() -> None:
    client = ScriptedClient(
        [reply("fine one"), ModelError("bad"), call("echo", x=1), call("echo", x=2)]
    )
    with BareLoop(client, [Echo()]) as loop:
        loop.set_turn_mode("non_streaming")
        ok = loop.run("a")
        with pytest.raises(ModelError):
            loop.run("b")
        loop.cancel_signal().cancel()
        with pytest.raises(Cancelled):
            loop.run("c")
        with pytest.raises(MaxTurnsExceeded) as mt:
            loop.run("d", RunConfig(max_turns=2))
        runs = loop.session.runs
    assert [r.input for r in runs] == ["a", "b", "c", "d"]
    assert runs[0] is ok and ok.stop_reason is None and ok.succeeded
    assert isinstance(runs[1].stop_reason, ModelError)
    assert isinstance(runs[2].stop_reason, Cancelled) and runs[2].turn_count == 0
    assert runs[3].stop_reason is mt.value and runs[3].turn_count == 2
    assert all(r.end is not None and r.end >= r.start for r in runs)
    assert len({r.id for r in runs}) == 4


def test_turn_records_carry_tokens_calls_and_stop_reason() -> None:
    loop, _ = _loop(
        [
            calls(("echo", {"x": 1}), ("echo", {"x": 2}), text="two calls"),
            reply("final words", usage=Usage(50, 7)),
        ],
        [Echo()],
    )
    with loop:
        run = loop.run("count me")
    t0, t1 = run.turns
    assert (t0.turn, t0.input, t0.output, t0.stop_reason) == (0, "count me", "two calls", StopReason.TOOL_CALL)
    assert [c.input for c in t0.tool_calls] == [{"x": 1}, {"x": 2}]
    assert (t1.turn, t1.input, t1.output, t1.stop_reason) == (1, "echo:1\necho:2", "final words", StopReason.END_TURN)
    assert (t1.input_tokens, t1.output_tokens) == (50, 7)
    assert (run.turn_count, run.tool_call_count, run.input_tokens, run.output_tokens) == (2, 2, 50, 7)
    assert run.output == "final words"


# -- limits and soft errors -----------------------------------------------------------


def test_max_turns_raises_max_turns_exceeded_and_discards() -> None:
    loop, client = _loop([call("echo", x=i) for i in range(10)], [Echo()])
    with loop:
        with pytest.raises(MaxTurnsExceeded) as info:
            loop.run("forever", RunConfig(max_turns=3))
        assert loop.conversation() == []
        assert isinstance(loop.stop_reason(), MaxTurnsExceeded)
        assert loop.stop_reason().max_turns == 3  # type: ignore[union-attr]
    assert info.value.max_turns == 3
    assert len(client.requests) == 3
    assert info.value.run.turn_count == 3


def test_max_turns_zero_never_calls_the_model() -> None:
    loop, client = _loop([reply("never")])
    with loop:
        with pytest.raises(MaxTurnsExceeded):
            loop.run("x", RunConfig(max_turns=0))
    assert client.requests == []


def test_unknown_tool_gets_a_soft_pre_answer_in_its_slot() -> None:
    echo = Echo()
    loop, client = _loop(
        [calls(("echo", {"x": 1}), ("ghost", {"y": 2}), ("echo", {"x": 3})), reply("coped")],
        [echo],
    )
    with loop:
        run = loop.run("use a ghost")
    assert run.output == "coped"
    assert len(echo.contexts) == 2  # the ghost call never dispatched
    results_msg = client.requests[1].messages[-1]
    assert results_msg.role == Role.USER
    results = results_msg.tool_results
    assert [(r.tool_name, r.is_error) for r in results] == [("echo", False), ("ghost", True), ("echo", False)]
    assert results[1].output == "tool 'ghost' is not available"
    call_ids = [c.id for c in client.requests[1].messages[-2].tool_calls]
    assert [r.tool_call_id for r in results] == call_ids


def test_results_come_back_in_request_order_as_one_message() -> None:
    """Parallel-safe calls finishing in reverse order still answer in request order."""
    done_second = threading.Event()

    class Ordered(Tool):
        name = "ordered"
        description = "Finishes in reverse order."
        concurrency_safe = True

        def call(self, input: Any, ctx: ToolContext) -> str:
            if input["i"] == 0:
                assert done_second.wait(WAIT)
            else:
                done_second.set()
            return f"result-{input['i']}"

    loop, client = _loop([calls(("ordered", {"i": 0}), ("ordered", {"i": 1})), reply("ok")], [Ordered()])
    with loop:
        loop.run("x", RunConfig(parallel=ParallelDispatch("parallel", 4)))
    msgs = list(client.requests[1].messages)
    assert [m.role for m in msgs] == ["user", "assistant", "user"]
    assert [r.output for r in msgs[-1].tool_results] == ["result-0", "result-1"]


def test_tool_exception_is_a_soft_error_and_the_run_goes_on() -> None:
    class Broken(Tool):
        name = "broken"
        description = "Raises."

        def call(self, input: Any, ctx: ToolContext) -> str:
            raise OSError("disk on fire")

    loop, client = _loop([call("broken"), reply("handled it")], [Broken()])
    with loop:
        run = loop.run("x")
    assert run.output == "handled it"
    result = client.requests[1].messages[-1].tool_results[0]
    assert result.is_error and "broken" in result.output and "disk on fire" in result.output


# -- the request ----------------------------------------------------------------------


def test_request_has_no_tools_when_registry_is_empty_and_system_prompt_passed() -> None:
    client = ScriptedClient([reply("bare")])
    with BareLoop(client, (), SessionConfig(system_prompt="Be brief.")) as loop:
        loop.run("x")
    req = client.requests[0]
    assert tuple(req.tools) == ()
    assert req.system == "Be brief."
    assert all(m.role != Role.SYSTEM for m in req.messages)


def test_request_carries_tool_schemas_and_no_system_by_default() -> None:
    client = ScriptedClient([reply("tooled")])
    with BareLoop(client, [Echo()]) as loop:
        loop.run("x")
    req = client.requests[0]
    assert [s.name for s in req.tools] == ["echo"]
    assert req.system is None


# -- one run at a time ------------------------------------------------------------------


def test_loop_busy_while_a_run_is_in_flight_changes_nothing() -> None:
    gate = Gate()
    events: list[Event] = []
    loop, client = _loop([call("echo", x=1), reply("finished")], [Echo(lambda i, c: gate.pass_through())])
    loop.register_observer(CallbackObserver(events.append))
    with loop:
        handle = loop.start("the real run")
        gate.wait_entered()
        n_events, n_runs, n_requests = len(events), len(loop.session.runs), len(client.requests)
        conv = loop.conversation()
        with pytest.raises(LoopBusy):
            loop.run("intruder", RunConfig(max_turns=3))
        with pytest.raises(LoopBusy):
            loop.start("intruder 2", RunConfig(max_turns=4))
        with pytest.raises(ConfigError):
            loop.register_observer(CallbackObserver(events.append))
        with pytest.raises(LoopBusy):
            loop.finalize()
        assert (len(events), len(loop.session.runs), len(client.requests)) == (n_events, n_runs, n_requests)
        assert loop.conversation() == conv
        running_config = loop.run_config()
        assert running_config is not None and running_config.max_turns == 200
        assert loop.is_running
        gate.open()
        run = handle.result(WAIT)
    assert run.output == "finished"
    assert [r.input for r in loop.session.runs] == ["the real run"]
    assert all(e.run_id == run.id for e in events)
    assert not loop.is_running


def test_busy_error_is_a_loop_error_and_run_error() -> None:
    assert issubclass(LoopBusy, LoopError) and issubclass(LoopBusy, RuntimeError)


# -- the Loop protocol and accessors -----------------------------------------------------


def test_bare_loop_satisfies_the_loop_protocol() -> None:
    with BareLoop(ScriptedClient([])) as loop:
        assert isinstance(loop, Loop)


def test_accessors_before_during_and_after_a_run() -> None:
    seen: dict[str, Any] = {}
    cfg = RunConfig(max_turns=7)

    def inside(input: Any, ctx: ToolContext) -> None:
        seen["run_config"] = loop.run_config()
        seen["should_continue"] = loop.should_continue()
        seen["state"] = loop.state()
        seen["conversation"] = loop.conversation()
        seen["stop_reason"] = loop.stop_reason()

    loop, _ = _loop([call("echo", x=5), reply("the end")], [Echo(inside)])
    with loop:
        assert loop.run_config() is None
        assert loop.conversation() == []
        assert loop.stop_reason() is None
        assert isinstance(loop.session, Session) and loop.session.runs == []
        assert isinstance(loop.machine, LoopMachine)
        with pytest.raises(LoopError):
            loop.finalize()
        run = loop.run("access", cfg)
        assert loop.run_config() is cfg
        assert loop.state() is MachineState.TERMINAL
        assert loop.should_continue() is False
        assert loop.stop_reason() is None
        assert loop.finalize() is run
        assert loop.session.runs == [run] and loop.session.current_run is run
    assert seen["run_config"] is cfg
    assert seen["should_continue"] is True
    assert seen["state"] is MachineState.AWAITING_TOOLS
    assert seen["stop_reason"] is None
    conv = seen["conversation"]
    assert [m.role for m in conv] == ["user", "assistant"] and conv[0].text == "access"


def test_stop_reason_reports_a_pending_cancel_and_the_last_error() -> None:
    loop, _ = _loop([ModelError("x"), reply("fine")])
    with loop:
        with pytest.raises(ModelError) as info:
            loop.run("a")
        assert loop.stop_reason() is info.value
        loop.cancel_signal().cancel("changed my mind")
        assert isinstance(loop.stop_reason(), Cancelled)
        with pytest.raises(Cancelled):
            loop.run("b")
        assert not loop.is_cancelled()


def test_run_argument_validation() -> None:
    with BareLoop(ScriptedClient([])) as loop:
        with pytest.raises(TypeError):
            loop.run(123)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            loop.run("x", {"max_turns": 3})  # type: ignore[arg-type]
        assert loop.session.runs == []
    with pytest.raises(ConfigError):
        BareLoop(ScriptedClient([]), (), {"system_prompt": "x"})  # type: ignore[arg-type]


def test_from_history_resumes_a_conversation() -> None:
    history = [Message.user("earlier"), Message.assistant("earlier answer")]
    client = ScriptedClient([reply("resumed")])
    with BareLoop.from_history(client, (), SessionConfig(), history) as loop:
        loop.run("now")
        assert loop.conversation()[:2] == history
    assert list(client.requests[0].messages) == history + [Message.user("now")]


def test_close_is_idempotent_and_refuses_later_runs() -> None:
    loop = BareLoop(ScriptedClient([reply("one")]))
    loop.run("x")
    loop.close()
    loop.close()
    with pytest.raises(LoopError):
        loop.run("after close")


# -- RunHandle -------------------------------------------------------------------------


def test_run_handle_result_done_wait_and_timeout() -> None:
    gate = Gate()

    def blocked(request: ModelRequest) -> ModelResponse:
        gate.pass_through()
        return reply("released")

    loop, _ = _loop([blocked])
    with loop:
        handle = loop.start("handle me")
        assert isinstance(handle, RunHandle)
        gate.wait_entered()
        assert not handle.done()
        assert handle.wait(0.01) is False
        with pytest.raises(TimeoutError):
            handle.result(timeout=0.01)
        assert handle.record.end is None
        gate.open()
        run = handle.result(WAIT)
        assert handle.done() and handle.wait(0) is True
        assert run is handle.record and run.id == handle.run_id
        assert run.output == "released"
        handle.cancel()  # no effect once finished
        assert not loop.is_cancelled()


def test_run_handle_result_raises_the_runs_error() -> None:
    loop, _ = _loop([ModelError("handle failure")])
    with loop:
        handle = loop.start("x")
        with pytest.raises(ModelError) as info:
            handle.result(WAIT)
        with pytest.raises(ModelError) as again:
            handle.result(WAIT)
    assert info.value is again.value and info.value.run is handle.record


def test_start_runs_on_a_named_daemon_thread() -> None:
    names: list[tuple[str, bool]] = []

    def where(input: Any, ctx: ToolContext) -> None:
        t = threading.current_thread()
        names.append((t.name, t.daemon))

    loop, _ = _loop([call("echo", x=1), reply("ok")], [Echo(where)])
    with loop:
        loop.start("x").result(WAIT)
    assert names[0][0].startswith("loopctl-run-") and names[0][1] is True


# -- ToolContext, temp dir ---------------------------------------------------------------


def test_tool_context_fields() -> None:
    echo = Echo()
    loop, _ = _loop([call("echo", x=1), call("echo", x=2), reply("ok")], [echo])
    loop.tool_extras["db"] = "handle"
    with loop:
        run = loop.run("ctx")
    c0, c1 = echo.contexts
    assert (c0.session_id, c0.run_id, c0.turn) == (loop.session.id, run.id, 0)
    assert c1.turn == 1
    assert c0.call_id == run.turns[0].tool_calls[0].id
    assert c0.extras["db"] == "handle"
    assert c0.cancel.is_cancelled() is False


def test_managed_temp_dir_lifecycle(tmp_path: Path) -> None:
    def scribble(input: Any, ctx: ToolContext) -> None:
        assert ctx.temp_dir is not None
        (ctx.temp_dir / "scratch.txt").write_text("x")

    echo = Echo(scribble)
    client = ScriptedClient([reply("no tools yet"), call("echo", x=1), reply("ok")])
    loop = BareLoop(client, [echo]).with_temp_dir(tmp_path)
    expected = loop.temp_dir  # {base}/loopctl-p{pid}-{token}/loopctl-{session id}
    assert expected is not None and expected.name == f"loopctl-{loop.session.id}"
    assert expected.parent.parent == tmp_path
    loop.run("no tool dispatch")
    assert not expected.exists()  # made lazily, when a tool first reads ctx.temp_dir
    loop.run("dispatch")
    assert echo.contexts[0].temp_dir == expected == loop.temp_dir
    assert (expected / "scratch.txt").read_text() == "x"
    loop.close()
    assert not expected.exists()
    loop.close()


def test_managed_temp_dir_default_base_and_context_manager_exit() -> None:
    echo = Echo()
    with BareLoop(ScriptedClient([call("echo", x=1), reply("ok")]), [echo]) as loop:
        loop.run("x")
        path = echo.contexts[0].temp_dir
        assert path is not None and path.is_dir() and path.name == f"loopctl-{loop.session.id}"
    assert not path.exists()


def test_managed_temp_disabled_gives_none() -> None:
    echo = Echo()
    loop = BareLoop(ScriptedClient([call("echo", x=1), reply("ok")]), [echo]).with_managed_temp_disabled()
    with loop:
        loop.run("x")
        assert loop.temp_dir is None
    assert echo.contexts[0].temp_dir is None


# -- contextvars --------------------------------------------------------------------------

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST_ID", default="unset")


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_callers_contextvars_visible_in_tools_observers_and_model(streaming: bool) -> None:
    seen: list[tuple[str, str]] = []

    def model(request: ModelRequest) -> ModelResponse:
        seen.append(("model", REQUEST_ID.get()))
        return call("echo", x=1)

    echo = Echo(lambda i, c: seen.append(("tool", REQUEST_ID.get())))
    client = ScriptedClient([model, reply("done")])
    with BareLoop(client, [echo]) as loop:
        if not streaming:
            loop.set_turn_mode("non_streaming")
        loop.register_observer(CallbackObserver(lambda e: seen.append(("observer", REQUEST_ID.get()))))
        token = REQUEST_ID.set("req-42")
        try:
            loop.run("ctx vars")
        finally:
            REQUEST_ID.reset(token)
    assert {who for who, _ in seen} == {"model", "tool", "observer"}
    assert all(v == "req-42" for _, v in seen), seen


def test_contextvars_of_start_caller_visible_in_the_run() -> None:
    seen: list[str] = []
    echo = Echo(lambda i, c: seen.append(REQUEST_ID.get()))
    with BareLoop(ScriptedClient([call("echo", x=1), reply("ok")]), [echo]) as loop:
        token = REQUEST_ID.set("started")
        try:
            handle = loop.start("x")
        finally:
            REQUEST_ID.reset(token)
        handle.result(WAIT)
    assert seen == ["started"]


def test_contextvars_visible_in_parallel_wave_tools() -> None:
    seen: list[str] = []
    echo = Echo(lambda i, c: seen.append(REQUEST_ID.get()))
    client = ScriptedClient([calls(("echo", {"x": 1}), ("echo", {"x": 2}), ("echo", {"x": 3})), reply("ok")])
    with BareLoop(client, [echo]) as loop:
        loop.set_turn_mode("non_streaming")
        token = REQUEST_ID.set("wave")
        try:
            loop.run("x", RunConfig(parallel=ParallelDispatch("parallel", 4)))
        finally:
            REQUEST_ID.reset(token)
    assert seen == ["wave"] * 3


def test_tool_results_message_shape_in_history() -> None:
    loop, _ = _loop([calls(("echo", {"x": 1}), ("echo", {"x": 2})), reply("ok")], [Echo()])
    with loop:
        loop.run("x")
        conv = loop.conversation()
    assert [m.role for m in conv] == ["user", "assistant", "user", "assistant"]
    assert all(isinstance(p, ToolResultPart) for p in conv[2].parts)
    assert [p.output for p in conv[2].tool_results] == ["echo:1", "echo:2"]
