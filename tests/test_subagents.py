"""Sub-agents as tools: ``loop.as_tool``, its answers, and what it refuses."""

from __future__ import annotations

import gc
import json
import threading
import weakref
from typing import Any

import attrs
import pytest
from support import WAIT, GatedReply, Recorder, run_in_thread

from loopctl import (
    BareLoop,
    ConfigError,
    LoopBusy,
    ModelError,
    ParallelDispatch,
    RunConfig,
    Tool,
    tool,
)
from loopctl.driver.subagent import MAX_DEPTH
from loopctl.messages import Usage
from loopctl.observers import RunEnd, RunStart, ToolPost
from loopctl.testing import ScriptedClient, call, calls, reply


def result_of(loop: BareLoop, index: int = 0) -> Any:
    """The ``index``-th tool result part in the loop's conversation."""
    parts = [p for m in loop.conversation() for p in m.tool_results]
    return parts[index]


def texts_sent(client: ScriptedClient, request: int) -> list[str]:
    return [m.text for m in client.requests[request].messages]


# -- item 1: the tool --------------------------------------------------------------------


def test_as_tool_is_a_tool_with_one_required_task_argument() -> None:
    child = BareLoop(ScriptedClient([]))
    t = child.as_tool("research", "Looks things up.")
    assert isinstance(t, Tool)
    schema = t.schema()
    assert schema.name == "research" and schema.description == "Looks things up."
    assert list(schema.input_schema["properties"]) == ["task"]
    assert schema.input_schema["properties"]["task"]["type"] == "string"
    assert schema.input_schema["required"] == ["task"]
    assert t.concurrency_safe is False


@pytest.mark.parametrize("name", ["", "a/b", 3])
def test_as_tool_refuses_a_bad_name_naming_it(name: Any) -> None:
    child = BareLoop(ScriptedClient([]))
    with pytest.raises(ConfigError, match="sub-agent name"):
        child.as_tool(name, "d")


def test_calling_it_runs_the_loop_and_returns_its_final_output() -> None:
    child_client = ScriptedClient([reply("Paris")])
    child = BareLoop(child_client)
    parent = BareLoop(
        ScriptedClient([call("research", task="capital of France?"), reply("It is Paris.")]),
        tools=[child.as_tool("research", "Looks things up.")],
    )
    run = parent.run("where?")
    assert run.output == "It is Paris."
    part = result_of(parent)
    assert (part.output, part.is_error) == ("Paris", False)
    assert texts_sent(child_client, 0) == ["capital of France?"]
    assert child.session.runs[-1].input == "capital of France?"


def test_the_childs_history_never_enters_the_parents_record() -> None:
    child = BareLoop(ScriptedClient([reply("secret working notes: 42")]))
    parent = BareLoop(
        ScriptedClient([call("research", task="t"), reply("done")]), tools=[child.as_tool("research", "r")]
    )
    run = parent.run("go")
    texts = [m.text for m in parent.conversation()]
    assert "t" not in texts  # the child's user message lives in the child's loop only
    assert [t.turn for t in run.turns] == [0, 1]
    assert len(child.conversation()) == 2


def test_each_call_starts_a_fresh_conversation_by_default() -> None:
    child_client = ScriptedClient([reply("one"), reply("two")])
    child = BareLoop(child_client)
    parent = BareLoop(
        ScriptedClient([call("research", task="first"), call("research", task="second"), reply("done")]),
        tools=[child.as_tool("research", "r")],
    )
    parent.run("go")
    assert texts_sent(child_client, 1) == ["second"]
    assert [m.text for m in child.conversation()] == ["second", "two"]


def test_keep_history_carries_the_conversation_across_calls() -> None:
    child_client = ScriptedClient([reply("one"), reply("two")])
    child = BareLoop(child_client)
    parent = BareLoop(
        ScriptedClient([call("research", task="first"), call("research", task="second"), reply("done")]),
        tools=[child.as_tool("research", "r", keep_history=True)],
    )
    parent.run("go")
    assert texts_sent(child_client, 1) == ["first", "one", "second"]


def test_two_calls_in_one_wave_run_one_after_the_other_never_loop_busy() -> None:
    for _ in range(20):
        child = BareLoop(ScriptedClient([reply("a"), reply("b")]))
        parent = BareLoop(
            ScriptedClient([calls(("research", {"task": "x"}), ("research", {"task": "y"})), reply("done")]),
            tools=[child.as_tool("research", "r")],
        )
        parent.run("go", RunConfig(parallel=ParallelDispatch("parallel", 8)))
        outs = [(result_of(parent, i).output, result_of(parent, i).is_error) for i in range(2)]
        assert sorted(outs) == [("a", False), ("b", False)]
        first, second = child.session.runs
        assert first.end is not None and first.end <= second.start


def test_a_parallel_wave_of_two_safe_subagent_calls_is_serialised_by_the_tool() -> None:
    # Even marked safe (a subclass), one sub-agent's calls never overlap: no LoopBusy.
    for _ in range(20):
        child = BareLoop(ScriptedClient([reply("a"), reply("b")]))
        t = child.as_tool("research", "r")
        t.concurrency_safe = True
        parent = BareLoop(
            ScriptedClient([calls(("research", {"task": "x"}), ("research", {"task": "y"})), reply("done")]),
            tools=[t],
        )
        parent.run("go", RunConfig(parallel=ParallelDispatch("parallel", 8)))
        assert [result_of(parent, i).is_error for i in range(2)] == [False, False]


@attrs.frozen
class Capital:
    city: str
    population: int


def test_a_typed_subagent_returns_its_value_as_json() -> None:
    child = BareLoop(ScriptedClient([reply('{"city": "Paris", "population": 2100000}')]))
    parent = BareLoop(
        ScriptedClient([call("research", task="t"), reply("done")]),
        tools=[child.as_tool("research", "r", output_type=Capital)],
    )
    parent.run("go")
    part = result_of(parent)
    assert not part.is_error
    assert json.loads(part.output) == {"city": "Paris", "population": 2100000}


def test_a_subagent_with_a_run_config_uses_it() -> None:
    child = BareLoop(ScriptedClient([call("nope"), call("nope"), reply("late")]))
    parent = BareLoop(
        ScriptedClient([call("research", task="t"), reply("done")]),
        tools=[child.as_tool("research", "r", config=RunConfig(max_turns=1))],
    )
    parent.run("go")
    part = result_of(parent)
    assert part.is_error and "MaxTurnsExceeded" in part.output


# -- item 2 (second half): ending on its own account is a soft error ---------------------


def _parent_over(child_tool: Tool) -> BareLoop:
    return BareLoop(ScriptedClient([call("research", task="t"), reply("carried on")]), tools=[child_tool])


def test_a_subagent_error_is_a_soft_error_naming_it_and_the_reason() -> None:
    child = BareLoop(ScriptedClient([ModelError("upstream exploded", retryable=False)]))
    parent = _parent_over(child.as_tool("research", "r"))
    run = parent.run("go")
    assert run.output == "carried on" and run.stop_reason is None
    part = result_of(parent)
    assert part.is_error
    assert "Sub-agent 'research'" in part.output and "ModelError" in part.output
    assert "upstream exploded" in part.output


def test_a_subagent_hitting_max_turns_is_a_soft_error() -> None:
    child = BareLoop(ScriptedClient([call("nope")] * 3))
    parent = _parent_over(child.as_tool("research", "r", config=RunConfig(max_turns=2)))
    assert parent.run("go").output == "carried on"
    part = result_of(parent)
    assert part.is_error and "Sub-agent 'research'" in part.output and "MaxTurnsExceeded" in part.output


def test_a_subagent_failing_its_typed_answer_is_a_soft_error() -> None:
    child = BareLoop(ScriptedClient([reply("not json")] * 5))
    parent = _parent_over(child.as_tool("research", "r", output_type=Capital, config=RunConfig(output_retries=1)))
    assert parent.run("go").output == "carried on"
    part = result_of(parent)
    assert part.is_error and "Sub-agent 'research'" in part.output and "OutputValidationError" in part.output


def test_a_subagent_cancelled_on_its_own_is_a_soft_error_and_the_parent_goes_on() -> None:
    gate = GatedReply(reply("never used"))
    child = BareLoop(ScriptedClient([gate]))
    parent = _parent_over(child.as_tool("research", "r"))
    out: list[Any] = []
    t, errors = run_in_thread(lambda: out.append(parent.run("go")))
    gate.wait_entered()
    assert child.cancel("enough research")
    t.join(WAIT)
    gate.release.set()
    assert not errors and out[0].output == "carried on"
    part = result_of(parent)
    assert part.is_error and "Sub-agent 'research'" in part.output and "Cancelled" in part.output


# -- bad input and races ----------------------------------------------------------------


def test_a_subagent_that_is_its_own_tool_is_refused_with_a_clear_error() -> None:
    loop = BareLoop(ScriptedClient([call("me", task="again"), reply("ok")]))
    loop.tools.register(loop.as_tool("me", "myself"))
    assert loop.run("go").output == "ok"
    part = result_of(loop)
    assert part.is_error and "cannot call itself" in part.output and "'me'" in part.output


def test_mutual_recursion_is_refused_where_the_cycle_closes() -> None:
    a = BareLoop(ScriptedClient([call("b", task="x"), reply("a done")]))
    b = BareLoop(ScriptedClient([call("a", task="y"), reply("b done")]))
    a.tools.register(b.as_tool("b", "b"))
    b.tools.register(a.as_tool("a", "a"))
    assert a.run("go").output == "a done"
    inner = result_of(b)
    assert inner.is_error and "cannot call itself" in inner.output and "b/a" in inner.output
    assert result_of(a).output == "b done"


def test_delegation_deeper_than_the_limit_is_refused() -> None:
    depth = MAX_DEPTH + 2
    loops = [BareLoop(ScriptedClient([call(f"l{i + 1}", task="down"), reply(f"up {i}")])) for i in range(depth)]
    for i in range(depth - 1):
        loops[i].tools.register(loops[i + 1].as_tool(f"l{i + 1}", "deeper"))
    loops[0].run("go")
    refused = result_of(loops[MAX_DEPTH])
    assert refused.is_error and f"deeper than {MAX_DEPTH} levels" in refused.output
    assert not result_of(loops[MAX_DEPTH - 1]).is_error
    assert not loops[MAX_DEPTH + 1].session.runs  # never started


def test_a_subagent_busy_with_a_direct_run_gives_the_tool_call_a_soft_error() -> None:
    gate = GatedReply(reply("direct"))
    child = BareLoop(ScriptedClient([gate]))
    parent = _parent_over(child.as_tool("research", "r"))
    handle = child.start("direct use")
    gate.wait_entered()
    try:
        assert parent.run("go").output == "carried on"
        part = result_of(parent)
        assert part.is_error and "Sub-agent 'research' is busy" in part.output
    finally:
        gate.release.set()
    assert handle.result(WAIT).output == "direct"


def test_direct_use_of_a_loop_serving_as_a_tool_raises_loop_busy_there() -> None:
    gate = GatedReply(reply("from the tool"))
    child = BareLoop(ScriptedClient([gate, reply("later")]))
    parent = _parent_over(child.as_tool("research", "r"))
    handle = parent.start("go")
    gate.wait_entered()
    try:
        with pytest.raises(LoopBusy):
            child.run("direct use")
    finally:
        gate.release.set()
    assert handle.result(WAIT).output == "carried on"
    assert result_of(parent).output == "from the tool"
    assert child.run("direct use").output == "later"


# -- item 5: one stream and usage -----------------------------------------------------------


def _three_levels(rec: Recorder) -> tuple[BareLoop, BareLoop, BareLoop]:
    search = BareLoop(ScriptedClient([reply("found", usage=Usage(3, 4))]))
    research = BareLoop(
        ScriptedClient([call("search", task="s"), reply("researched", usage=Usage(20, 30))]),
        tools=[search.as_tool("search", "searches")],
    )
    root = BareLoop(
        ScriptedClient([call("research", task="r", ), reply("answer", usage=Usage(100, 200))]),
        tools=[research.as_tool("research", "researches")],
    )
    root.register_observer(rec)
    return root, research, search


def test_the_parents_observers_get_every_subagent_event_with_its_path() -> None:
    rec = Recorder()
    root, research, search = _three_levels(rec)
    run = root.run("go")
    events = rec.snapshot()
    assert {e.run_id for e in events} == {run.id}
    starts = [(e.subagent, e.input) for e in events if isinstance(e, RunStart)]
    assert starts == [("", "go"), ("research", "r"), ("research/search", "s")]
    ends = [e.subagent for e in events if isinstance(e, RunEnd)]
    assert ends == ["research/search", "research", ""]
    assert isinstance(events[-1], RunEnd) and events[-1].subagent == ""
    posts = [(e.subagent, e.tool) for e in events if isinstance(e, ToolPost)]
    assert posts == [("research", "search"), ("", "research")]
    assert events[-1].to_dict()["subagent"] == ""
    assert [e.to_dict()["subagent"] for e in events if isinstance(e, RunStart)][2] == "research/search"


def test_the_parents_usage_includes_its_subagents() -> None:
    root, research, search = _three_levels(Recorder())
    run = root.run("go")
    assert (run.input_tokens, run.output_tokens) == (100, 200)
    assert run.subagent_usage == Usage(23, 34)
    assert run.usage == Usage(123, 234)
    assert research.session.runs[-1].usage == Usage(23, 34)
    assert type(run).from_dict(json.loads(json.dumps(run.to_dict()))).usage == Usage(123, 234)


def test_a_direct_run_of_a_subagent_loop_is_not_forwarded() -> None:
    rec = Recorder()
    root, research, search = _three_levels(rec)
    search_client = ScriptedClient([reply("alone")])
    lone = BareLoop(search_client)
    lone.as_tool("search", "s")
    assert lone.run("direct").output == "alone"
    assert rec.snapshot() == []


def test_as_tool_refuses_a_loop_whose_run_is_in_flight() -> None:
    gate = GatedReply(reply("x"))
    child = BareLoop(ScriptedClient([gate]))
    handle = child.start("busy")
    gate.wait_entered()
    try:
        with pytest.raises(ConfigError):
            child.as_tool("research", "r")
    finally:
        gate.release.set()
    handle.result(WAIT)


@tool
def noop() -> str:
    """Does nothing."""
    return "ok"


def test_threads_of_a_tree_are_all_named_loopctl() -> None:
    seen: set[str] = set()
    lock = threading.Lock()

    @tool(name="where")
    def where() -> str:
        """Reports its thread."""
        with lock:
            seen.add(threading.current_thread().name)
        return "here"

    child = BareLoop(ScriptedClient([call("where"), reply("c")]), tools=[where])
    parent = BareLoop(ScriptedClient([call("research", task="t"), reply("p")]), tools=[child.as_tool("research", "r")])
    parent.run("go")
    assert seen and all(name.startswith("loopctl-") for name in seen)


def test_a_finished_tree_is_freed_without_the_cyclic_gc() -> None:
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            child = BareLoop(ScriptedClient([reply("42")]))
            parent = BareLoop(
                ScriptedClient([call("research", task="t"), reply("done")]), tools=[child.as_tool("research", "r")]
            )
            handle = parent.start("go")
            assert handle.result(WAIT).output == "done"
            child_run = child.session.runs[-1]
            refs = [weakref.ref(parent), weakref.ref(child), weakref.ref(handle._rc), weakref.ref(child_run)]
            handle._rc.thread.join(WAIT)
            for t in threading.enumerate():
                if t.name.startswith("loopctl-run-"):
                    t.join(WAIT)
            parent.close()
            child.close()
            del parent, child, handle, child_run
            assert [r() is None for r in refs] == [True] * 4
    finally:
        gc.enable()


def test_a_loop_kept_in_a_session_is_a_subagent_only_with_its_history_and_never_loses_what_is_stored(
    tmp_path: Any,
) -> None:
    """A fresh conversation per call would replace the stored one: refused, whether stored before or after as_tool."""
    from loopctl.errors import ConfigError
    from loopctl.sessions import SQLiteSessionStore

    with SQLiteSessionStore(str(tmp_path / "s.db")) as store:
        kept = BareLoop(ScriptedClient([reply("R0"), reply("R1")])).with_session(store.session("helper-log"))
        kept.run("direct run")
        with pytest.raises(ConfigError, match="keep_history=True"):
            kept.as_tool("helper", "h")
        # Stored after as_tool(): the call is refused (a soft error), and nothing stored changes.
        later = BareLoop(ScriptedClient([reply("L0")]))
        tool_first = later.as_tool("later", "l")
        later.with_session(store.session("later-log"))
        parent = BareLoop(ScriptedClient([call("later", task="t"), reply("done")]), tools=[tool_first])
        parent.run("go")
        result = parent.conversation()[-2].tool_results[0]
        assert result.is_error and "keep_history=True" in result.output
        assert store.session("later-log").messages() == []
        # With its history, each call continues the stored conversation.
        parent2 = BareLoop(ScriptedClient([call("helper", task="t1"), reply("done")]),
                           tools=[kept.as_tool("helper", "h", keep_history=True)])
        parent2.run("go")
        assert [m.text for m in store.session("helper-log").messages()] == ["direct run", "R0", "t1", "R1"]
