"""``RunEnd.error_type`` and ``TurnEnd.error_type``: the class name of the error, None on success.

Events carried only an error's text; a consumer (OpenTelemetry, a log, a
remote stream) had to guess the class from it. These runs end every way a
run can (ok, a model failure, max turns, a tool phase's hard stop, a cancel
in the model call and in a tool) and check that both events name the class
of the error the caller got, and that the JSON form carries it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from support import Gate, Recorder

from loopctl import BareLoop, Cancelled, LoopError, MaxTurnsExceeded, ModelError, RunConfig
from loopctl.hosting.serialization import event_from_dict
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.observers import RunEnd, TurnEnd
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import Tool, ToolContext


class UpstreamDown(ModelError):
    """A ModelError subclass whose text names no class."""


def test_a_successful_run_has_no_error_type() -> None:
    rec = Recorder()
    with BareLoop(ScriptedClient([reply("fine")])).with_observer(rec) as loop:
        loop.run("hi")
    (end,) = rec.of(RunEnd)
    assert end.success and end.error is None and end.error_type is None
    assert all(t.error_type is None for t in rec.of(TurnEnd))
    assert json.loads(json.dumps(end.to_dict()))["error_type"] is None


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_a_failed_model_call_names_its_class_on_turn_end_and_run_end(streaming: bool) -> None:
    rec = Recorder()
    client = ScriptedClient([UpstreamDown("the proxy said no", retryable=False)])
    with BareLoop(client).with_observer(rec) as loop:
        if not streaming:
            loop.set_turn_mode("non_streaming")
        with pytest.raises(UpstreamDown):
            loop.run("hi")
    (turn_end,) = rec.of(TurnEnd)
    (run_end,) = rec.of(RunEnd)
    assert (turn_end.phase, turn_end.success, turn_end.error_type) == ("llm", False, "UpstreamDown")
    assert (run_end.success, run_end.error_type) == (False, "UpstreamDown")
    back = event_from_dict(json.loads(json.dumps(run_end.to_dict())))
    assert isinstance(back, RunEnd) and back.error_type == "UpstreamDown"


def test_max_turns_names_its_class_and_the_tool_phases_stay_clean() -> None:
    rec = Recorder()

    class Ping(Tool):
        name = "ping"
        description = "Pong."

        def call(self, input: Any, ctx: ToolContext) -> str:
            return "pong"

    script = [call("ping"), call("ping"), reply("never")]
    with BareLoop(ScriptedClient(script), [Ping()]).with_observer(rec) as loop:
        with pytest.raises(MaxTurnsExceeded):
            loop.run("hi", config=RunConfig(max_turns=2))
    (run_end,) = rec.of(RunEnd)
    assert run_end.error_type == "MaxTurnsExceeded"
    assert [t.error_type for t in rec.of(TurnEnd)] == [None] * len(rec.of(TurnEnd))


@pytest.mark.parametrize("where", ["model", "tool"])
def test_a_cancel_names_cancelled_on_the_cut_phase_and_the_run(where: str) -> None:
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

    script: list[Any] = [blocked] if where == "model" else [call("stuck")]
    rec = Recorder()
    with BareLoop(ScriptedClient(script), [Stuck()]).with_observer(rec) as loop:
        loop.set_turn_mode("non_streaming")

        def cancel_at_gate() -> None:
            if gate.entered.wait(10.0):
                loop.cancel("stop")

        canceller = threading.Thread(target=cancel_at_gate, name="test-canceller")
        canceller.start()
        with pytest.raises(Cancelled):
            loop.run("cancel me")
        canceller.join(10.0)
        gate.release.set()
    cut = rec.of(TurnEnd)[-1]
    assert (cut.phase, cut.success, cut.error_type) == ("llm" if where == "model" else "tools", False, "Cancelled")
    (run_end,) = rec.of(RunEnd)
    assert (run_end.error_type, run_end.error) == ("Cancelled", "run cancelled: stop")


def test_error_type_is_the_class_of_what_the_caller_got() -> None:
    rec = Recorder()
    with BareLoop(ScriptedClient([ModelError("max turns exceeded upstream", retryable=False)])) as loop:
        loop.register_observer(rec)
        with pytest.raises(LoopError) as info:
            loop.run("hi")
    (run_end,) = rec.of(RunEnd)
    # The text reads like another class; the field is exact.
    assert run_end.error_type == type(info.value).__name__ == "ModelError"
