"""Checkpoints at turn boundaries and resuming a run from one (in-process, no Redis).

The durable Celery registry is built on this seam: ``start(checkpoint=)``
hands the run's state over at each boundary, ``start(resume=)`` continues a
run from a handed-over state on a fresh loop (as another worker would).
"""

from __future__ import annotations

from typing import Any, List

import pytest

from loopctl import BareLoop, Message, RunConfig, tool
from loopctl.driver.checkpoint import INTERRUPTED, Checkpoint, ResumePoint
from loopctl.hosting.serialization import event_to_dict
from loopctl.observers import RunResumed, RunStart
from loopctl.testing import ScriptedClient, call, calls, reply
from tests.support import Recorder

RUNS: List[str] = []


@tool(idempotent=True)
def lookup(key: str) -> str:
    """Look a key up (safe to repeat)."""
    RUNS.append(f"lookup:{key}")
    return f"value of {key}"


@tool
def pay(amount: int) -> str:
    """Pay an amount (never twice)."""
    RUNS.append(f"pay:{amount}")
    return f"paid {amount}"


def tools() -> list[Any]:
    return [lookup, pay]


def test_checkpoints_follow_the_boundaries_in_order() -> None:
    got: List[Checkpoint] = []
    client = ScriptedClient([call("lookup", key="a"), calls(("lookup", {"key": "b"}), ("pay", {"amount": 3})), reply("done")])
    with BareLoop(client, tools()) as loop:
        run = loop.start("go", RunConfig(parallel=RunConfig().parallel), checkpoint=got.append).result(5)
    assert run.output == "done"
    assert [c.after for c in got] == ["model", "call", "tools", "model", "call", "call", "tools"]
    assert [c.turns_taken for c in got] == [1, 1, 1, 2, 2, 2, 2]
    # "call" checkpoints carry the settled results of the awaited wave, growing.
    assert [len(c.answered) for c in got] == [0, 1, 0, 0, 1, 2, 0]
    assert got[-1].pending[0].text == "go" and got[-1].pending[-1].tool_results
    assert all(c.history is None for c in got)
    assert [t.turn for t in got[-1].turns] == [0, 1]


def resume_on_fresh_loop(cp: Checkpoint, script: list[Any], history: List[Message]) -> Any:
    rec = Recorder()
    client = ScriptedClient(script)
    loop = BareLoop.from_history(client, tools(), history=history)
    loop.register_observer(rec)
    handle = loop.start("go", run_id="r1", resume=ResumePoint(cp, 1, "worker lost"))
    return loop, handle, rec, client


def test_a_resumed_run_reruns_only_idempotent_calls_and_tells_the_model_about_the_rest() -> None:
    got: List[Checkpoint] = []
    client = ScriptedClient([calls(("lookup", {"key": "k"}), ("pay", {"amount": 7})), reply("first")])
    with BareLoop(client, tools()) as first:
        first.start("go", RunConfig(), "r1", checkpoint=got.append).result(5)
    # Resume from the model boundary, as if the worker died during the tool phase.
    cp = next(c for c in got if c.after == "model")
    RUNS.clear()
    loop, handle, rec, client2 = resume_on_fresh_loop(cp, [reply("finished")], [])
    run = handle.result(5)
    loop.close()
    assert run.output == "finished" and run.id == "r1"
    assert RUNS == ["lookup:k"]  # pay is never run again
    results = client2.requests[0].messages[-1].tool_results
    assert [(r.tool_name, r.is_error) for r in results] == [("lookup", False), ("pay", True)]
    assert results[0].output == "value of k" and INTERRUPTED in results[1].output
    types = [type(e) for e in rec.events]
    assert RunStart not in types and types[0] is RunResumed
    first_event = event_to_dict(rec.events[0])
    assert first_event["type"] == "run_resumed" and first_event["attempt"] == 1
    assert first_event["cause"] == "worker lost" and first_event["turn"] == 1
    assert [t.turn for t in run.turns] == [0, 1]


def test_a_committed_result_is_never_rerun_even_for_a_non_idempotent_tool() -> None:
    got: List[Checkpoint] = []
    client = ScriptedClient([call("pay", amount=1), reply("ok")])
    RUNS.clear()
    with BareLoop(client, tools()) as loop:
        loop.start("go", checkpoint=got.append).result(5)
    cp = next(c for c in got if c.after == "call")
    RUNS.clear()
    loop2, handle, _, client2 = resume_on_fresh_loop(cp, [reply("ok again")], [])
    assert handle.result(5).output == "ok again"
    loop2.close()
    assert RUNS == []
    [result] = client2.requests[0].messages[-1].tool_results
    assert result.output == "paid 1" and not result.is_error


def test_a_resumed_run_commits_its_whole_conversation_on_success() -> None:
    got: List[Checkpoint] = []
    client = ScriptedClient([call("lookup", key="x"), reply("done")])
    history = [Message.user("earlier"), Message.assistant("earlier answer")]
    with BareLoop.from_history(client, tools(), history=history) as loop:
        loop.start("go", checkpoint=got.append).result(5)
        expected = loop.conversation()
    cp = next(c for c in got if c.after == "tools")
    loop2, handle, _, client2 = resume_on_fresh_loop(cp, [reply("done")], history)
    handle.result(5)
    assert loop2.conversation() == expected
    # The model saw history, then the run so far (input, call, result), once each.
    assert client2.requests[0].messages == [*history, *cp.pending]
    loop2.close()


def test_resume_without_a_checkpoint_starts_from_the_input_and_steering_lands_first() -> None:
    client = ScriptedClient([reply("fresh")])
    with BareLoop(client, tools()) as loop:
        rec = Recorder()
        loop.register_observer(rec)
        h = loop.start("go", resume=ResumePoint(None, 2, "the worker shut down and handed the run back"))
        assert h.result(5).output == "fresh"
    assert [m.text for m in client.requests[0].messages] == ["go"]
    assert type(rec.events[0]) is RunResumed and rec.events[0].attempt == 2


def test_the_machine_resumes_awaiting_the_unanswered_calls_of_the_last_reply() -> None:
    from loopctl.machine import CallLLM, CallTools, LoopMachine, MachinePolicy
    from loopctl.messages import ToolCallPart, ToolResultPart

    policy = MachinePolicy(10, 0, 80, True)
    ask = Message.assistant("", [ToolCallPart("a", "lookup", {}), ToolCallPart("b", "pay", {})])
    done_a = ToolResultPart("a", "lookup", "kept", False)
    m = LoopMachine([Message.user("old")])
    m.resume([Message.user("go"), ask], 1, {"a": done_a})
    step = m.next_step(policy)
    assert isinstance(step, CallTools) and step.turn == 0
    assert [(p.call.id, p.preresolved) for p in step.calls] == [("a", done_a), ("b", None)]
    assert list(m.history) == [Message.user("old")] and m.turns_taken == 1
    m.tool_results([Message.from_tool_results([done_a, ToolResultPart("b", "pay", "ok", False)])])
    assert m.next_step(policy) == CallLLM(1)

    fresh = LoopMachine()
    fresh.resume([Message.user("go"), ask, Message.from_tool_results([done_a])], 1, {})
    assert fresh.next_step(policy) == CallLLM(1)
    with pytest.raises(ValueError, match="zz"):
        fresh.resume([Message.user("go")], 0, {"zz": done_a})
