"""Dispatch through a real ``BareLoop``: order, waves, overlap, events, hard errors.

Overlap is proven with ``threading.Barrier``s (a call that ran alone would
break the barrier), never with timing. Every barrier and gate has a
timeout so a regression fails instead of hanging.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any, Callable, Optional

import pytest

from loopctl import (
    BareLoop,
    Cancelled,
    LoopDetected,
    ParallelDispatch,
    RunConfig,
    Tool,
    ToolContext,
    ToolResultPart,
)
from loopctl.driver.admission import admit
from loopctl.driver.tool_calls import plan_waves
from loopctl.hooks import Hook, HookDecision, HookExecutor, ToolHookContext
from loopctl.observers import Event, LoopDetectedEvent, ToolCallReceived, ToolPost, ToolPre, TurnEnd
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools import tool

WAIT = 10.0
PARALLEL = RunConfig(parallel=ParallelDispatch("parallel", 8))


def waves_of(script: Any, loop: BareLoop, limit: int) -> list[list[int]]:
    """How the dispatcher cuts the scripted reply's calls into waves (no run: nothing to unfence)."""
    return plan_waves(admit(script.message.tool_calls, loop.tools, nullcontext), limit, nullcontext)


class Tracker:
    """Counts calls running at once, overall and per key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.by_key: dict[str, int] = {}
        self.key_overlap = False
        self.unsafe_saw_company = False
        self.order: list[str] = []

    def enter(self, key: Optional[str] = None, unsafe: bool = False) -> None:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            if unsafe and self.active != 1:
                self.unsafe_saw_company = True
            if key is not None:
                self.by_key[key] = self.by_key.get(key, 0) + 1
                if self.by_key[key] > 1:
                    self.key_overlap = True

    def leave(self, name: str, key: Optional[str] = None, unsafe: bool = False) -> None:
        with self.lock:
            if unsafe and self.active != 1:
                self.unsafe_saw_company = True
            self.active -= 1
            if key is not None:
                self.by_key[key] -= 1
            self.order.append(name)


class Probe(Tool):
    """A configurable tool: safety, key, and a body run between enter/leave."""

    description = "probe"

    def __init__(
        self,
        name: str,
        tracker: Tracker,
        safe: bool = True,
        body: Optional[Callable[[Mapping[str, Any], ToolContext], object]] = None,
    ) -> None:
        self.name = name
        self.concurrency_safe = safe
        self.tracker = tracker
        self.body = body

    def input_schema(self) -> Mapping[str, Any]:
        return {"type": "object"}

    def resource_key(self, input: Mapping[str, Any]) -> Optional[str]:
        return input.get("key")

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        key = input.get("key")
        self.tracker.enter(key, unsafe=not self.concurrency_safe)
        try:
            if self.body is not None:
                self.body(input, ctx)
        finally:
            self.tracker.leave(f"{self.name}:{input.get('i')}", key, unsafe=not self.concurrency_safe)
        return f"{self.name}:{input.get('i')}"


def results_of(loop: BareLoop) -> list[ToolResultPart]:
    return [r for m in loop.conversation() for r in m.tool_results]


def run_with_events(loop: BareLoop, text: str = "go", config: RunConfig = PARALLEL) -> list[Event]:
    events: list[Event] = []
    loop.start(text, config, tap=events.append).result(WAIT)
    return events


@pytest.mark.parametrize("iteration", range(25))
def test_overlapping_calls_finish_in_reverse_yet_results_keep_request_order(iteration: int) -> None:
    n = 8
    barrier = threading.Barrier(n, timeout=WAIT)
    finished = [threading.Event() for _ in range(n)]
    tracker = Tracker()

    def body(input: Mapping[str, Any], ctx: ToolContext) -> None:
        i = input["i"]
        barrier.wait()  # all 8 are running at once, or this breaks
        if i + 1 < n:  # finish only after the next one: completion order 7, 6, ..., 0
            assert finished[i + 1].wait(WAIT)
        finished[i].set()

    probe = Probe("p", tracker, body=body)
    client = ScriptedClient([calls(*[("p", {"i": i}) for i in range(n)]), reply("done")])
    with BareLoop(client, [probe]) as loop:
        events = run_with_events(loop)
    assert tracker.order == [f"p:{i}" for i in reversed(range(n))]
    assert [r.output for r in results_of(loop)] == [f"p:{i}" for i in range(n)]
    asked = [c.id for c in loop.conversation()[1].tool_calls]
    assert [r.tool_call_id for r in results_of(loop)] == asked
    # Events: every PRE of the wave, then every POST in request order.
    tool_events = [e for e in events if isinstance(e, (ToolPre, ToolPost))]
    assert [type(e) for e in tool_events] == [ToolPre] * n + [ToolPost] * n
    assert [e.call_id for e in tool_events[n:]] == asked
    received = [e for e in events if isinstance(e, ToolCallReceived)]
    assert [e.call_id for e in received] == asked
    assert events.index(received[-1]) < events.index(tool_events[0])


@pytest.mark.parametrize("iteration", range(15))
def test_calls_sharing_a_resource_key_run_in_different_waves(iteration: int) -> None:
    tracker = Tracker()
    barrier = threading.Barrier(2, timeout=WAIT)
    probe = Probe("p", tracker, body=lambda i, c: barrier.wait())
    # Waves: [a0, b1], [a2, b3] (a2's key is already in the first wave).
    script = calls(("p", {"i": 0, "key": "a"}), ("p", {"i": 1, "key": "b"}),
                   ("p", {"i": 2, "key": "a"}), ("p", {"i": 3, "key": "b"}))
    with BareLoop(ScriptedClient([script, reply("done")]), [probe]) as loop:
        loop.run("go", PARALLEL)
        assert waves_of(script, loop, 8) == [[0, 1], [2, 3]]
    assert not tracker.key_overlap
    assert tracker.max_active == 2  # the two waves each overlapped (the barrier proves it)
    assert [r.output for r in results_of(loop)] == ["p:0", "p:1", "p:2", "p:3"]


@pytest.mark.parametrize("iteration", range(15))
def test_unsafe_calls_never_overlap_anything(iteration: int) -> None:
    tracker = Tracker()
    pair = threading.Barrier(2, timeout=WAIT)
    safe = Probe("s", tracker, body=lambda i, c: pair.wait())
    unsafe = Probe("u", tracker, safe=False)
    script = calls(("s", {"i": 0}), ("s", {"i": 1}), ("u", {"i": 2}), ("s", {"i": 3}), ("s", {"i": 4}),
                   ("u", {"i": 5}), ("u", {"i": 6}))
    with BareLoop(ScriptedClient([script, reply("done")]), [safe, unsafe]) as loop:
        loop.run("go", PARALLEL)
        assert waves_of(script, loop, 8) == [[0, 1], [2], [3, 4], [5], [6]]
    assert not tracker.unsafe_saw_company
    assert tracker.order.index("u:2") > max(tracker.order.index("s:0"), tracker.order.index("s:1"))
    assert tracker.order.index("u:2") < min(tracker.order.index("s:3"), tracker.order.index("s:4"))
    assert [r.output for r in results_of(loop)] == ["s:0", "s:1", "u:2", "s:3", "s:4", "u:5", "u:6"]


def test_sequential_mode_runs_safe_calls_one_by_one() -> None:
    tracker = Tracker()
    probe = Probe("p", tracker)
    script = calls(*[("p", {"i": i}) for i in range(6)])
    with BareLoop(ScriptedClient([script, reply("done")]), [probe]) as loop:
        loop.run("go", RunConfig(parallel=ParallelDispatch("sequential")))
    assert tracker.max_active == 1
    assert tracker.order == [f"p:{i}" for i in range(6)]


def test_max_concurrency_caps_a_wave() -> None:
    tracker = Tracker()
    triple = threading.Barrier(3, timeout=WAIT)
    probe = Probe("p", tracker, body=lambda i, c: triple.wait() if i["i"] < 6 else None)
    script = calls(*[("p", {"i": i}) for i in range(7)])
    with BareLoop(ScriptedClient([script, reply("done")]), [probe]) as loop:
        loop.run("go", RunConfig(parallel=ParallelDispatch("parallel", 3)))
        assert waves_of(script, loop, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert tracker.max_active == 3
    assert [r.output for r in results_of(loop)] == [f"p:{i}" for i in range(7)]


def test_max_concurrency_one_is_sequential() -> None:
    tracker = Tracker()
    probe = Probe("p", tracker)
    with BareLoop(ScriptedClient([calls(*[("p", {"i": i}) for i in range(4)]), reply("done")]), [probe]) as loop:
        loop.run("go", RunConfig(parallel=ParallelDispatch("parallel", 1)))
    assert tracker.max_active == 1


def test_lone_call_runs_inline_on_the_run_thread() -> None:
    threads: list[str] = []

    @tool(concurrency_safe=True)
    def where() -> str:
        """Where."""
        threads.append(threading.current_thread().name)
        return "ok"

    with BareLoop(ScriptedClient([call("where"), reply("done")]), [where]) as loop:
        loop.run("go", run_id="inline-check")
    assert threads == ["loopctl-run-inline-check"]


def test_wave_calls_run_on_the_loops_named_pool() -> None:
    names: list[str] = []
    barrier = threading.Barrier(2, timeout=WAIT)

    @tool(concurrency_safe=True)
    def where(i: int) -> str:
        """Where."""
        barrier.wait()
        names.append(threading.current_thread().name)
        return "ok"

    with BareLoop(ScriptedClient([calls(("where", {"i": 0}), ("where", {"i": 1})), reply("done")]), [where]) as loop:
        loop.run("go", PARALLEL)
    assert len(names) == 2 and all(n.startswith("loopctl-tools-") for n in names)


# -- soft errors in a wave; hooks --------------------------------------------------------


class BlockNamed(Hook):
    def __init__(self, name: str) -> None:
        self.name = name
        self.post: list[tuple[str, str, bool]] = []

    def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
        return HookDecision.block("not today") if ctx.tool == self.name else None

    def on_post_tool_use(self, ctx: ToolHookContext, output: str, is_error: bool) -> None:
        self.post.append((ctx.tool, output, is_error))


@pytest.mark.parametrize("config", [PARALLEL, RunConfig(parallel=ParallelDispatch("sequential"))], ids=["parallel", "sequential"])
def test_each_soft_error_has_its_exact_text_and_the_run_continues(config: RunConfig) -> None:
    ran: list[str] = []

    @tool(concurrency_safe=True)
    def ok(n: int) -> str:
        """Ok."""
        ran.append("ok")
        return f"ok {n}"

    @tool(concurrency_safe=True)
    def boom() -> str:
        """Boom."""
        ran.append("boom")
        raise RuntimeError("kaput")

    @tool(concurrency_safe=True)
    def denied() -> str:
        """Denied."""
        ran.append("denied")
        return "never"

    hook = BlockNamed("denied")
    script = calls(("ok", {"n": 1}), ("ok", {"n": "one"}), ("boom", {}), ("denied", {}), ("ghost", {}))
    with BareLoop(ScriptedClient([script, reply("done")]), [ok, boom, denied]) as loop:
        loop.set_hook_executor(HookExecutor([hook]))
        events = run_with_events(loop, config=config)
    assert [(r.output, r.is_error) for r in results_of(loop)] == [
        ("ok 1", False),
        ("Invalid input for tool 'ok': field 'n' must be integer, got string 'one'", True),
        ("Tool 'boom' raised RuntimeError: kaput", True),
        ("Tool 'denied' blocked: not today", True),
        ("tool 'ghost' is not available", True),  # the machine pre-answers never-advertised names
    ]
    assert sorted(ran) == ["boom", "ok"]  # invalid input and the blocked call never ran
    pre = [e.tool for e in events if isinstance(e, ToolPre)]
    post = [e.tool for e in events if isinstance(e, ToolPost)]
    assert pre == ["ok", "ok", "boom", "denied"]
    assert post == ["ok", "ok", "boom"]  # a blocked call has no on_tool_post
    assert [p[0] for p in hook.post] == ["ok", "ok", "boom"]
    assert loop.session.runs[0].output == "done"


def test_tool_post_carries_error_flag_duration_hash_and_output() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    with BareLoop(ScriptedClient([call("echo", text="hello"), reply("done")]), [echo]) as loop:
        events = run_with_events(loop)
    (post,) = [e for e in events if isinstance(e, ToolPost)]
    assert (post.tool, post.attempt, post.is_error, post.output) == ("echo", 0, False, "hello")
    assert post.duration_ms >= 0.0
    assert post.result_hash == "3610a686"  # crc32("hello")
    tool_end = [e for e in events if isinstance(e, TurnEnd) and e.phase == "tools"]
    assert len(tool_end) == 1 and tool_end[0].success


# -- hard errors ------------------------------------------------------------------------------


class StopOnPreCheck:
    """A loop detector double: a stop is pending from the Nth pre-check on."""

    def __init__(self, stop_at: int, warn_on: Optional[str] = None) -> None:
        self.stop_at = stop_at
        self.warn_on = warn_on
        self.pre_checks = 0
        self.records: list[tuple[str, Mapping[str, Any], str, bool]] = []

    def pre_check(self) -> Optional[LoopDetected]:
        self.pre_checks += 1
        return LoopDetected("same call 10 times") if self.pre_checks >= self.stop_at else None

    def record(self, tool: str, input: Mapping[str, Any], output: str, is_error: bool) -> Optional[tuple[str, int]]:
        self.records.append((tool, dict(input), output, is_error))
        return ("echo x3", 3) if output == self.warn_on else None

    def consume_pending_stop(self) -> None:
        pass


def test_pending_loop_stop_is_a_hard_error_that_ends_the_batch() -> None:
    ran: list[int] = []

    @tool(concurrency_safe=True)
    def work(i: int) -> str:
        """Work."""
        ran.append(i)
        return str(i)

    script = calls(*[("work", {"i": i}) for i in range(4)])
    with BareLoop(ScriptedClient([script, reply("never")]), [work]) as loop:
        loop.set_loop_detector(StopOnPreCheck(stop_at=3))
        with pytest.raises(LoopDetected, match="same call 10 times") as info:
            loop.run("go", PARALLEL)
        assert ran == []  # the wave never started
        assert loop.conversation() == []  # the failed run's pending messages are discarded
    assert info.value.run is not None and info.value.run.stop_reason is info.value


def test_loop_detector_records_each_attempt_and_its_warning_is_an_event() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    detector = StopOnPreCheck(stop_at=99, warn_on="again")
    with BareLoop(ScriptedClient([call("echo", text="once"), call("echo", text="again"), reply("done")]), [echo]) as loop:
        loop.set_loop_detector(detector)
        events = run_with_events(loop)
    assert detector.records == [("echo", {"text": "once"}, "once", False), ("echo", {"text": "again"}, "again", False)]
    kinds = [type(e).__name__ for e in events if isinstance(e, (ToolPre, ToolPost, LoopDetectedEvent))]
    assert kinds == ["ToolPre", "ToolPost", "ToolPre", "LoopDetectedEvent", "ToolPost"]
    (warn,) = [e for e in events if isinstance(e, LoopDetectedEvent)]
    assert (warn.pattern, warn.repetitions) == ("echo x3", 3)


@pytest.mark.parametrize("iteration", range(10))
def test_cancel_during_a_wave_ends_the_run_promptly_and_discards_results(iteration: int) -> None:
    entered = threading.Barrier(4, timeout=WAIT)
    release = threading.Event()
    seen_cancel: list[bool] = []
    cooperative_done = threading.Event()

    def body(input: Mapping[str, Any], ctx: ToolContext) -> None:
        entered.wait()
        if input["i"] % 2:
            seen_cancel.append(ctx.cancel.wait(WAIT))  # cooperative
            cooperative_done.set()
        else:
            release.wait(WAIT)  # stuck until the test lets go

    probe = Probe("p", Tracker(), body=body)
    with BareLoop(ScriptedClient([calls(*[("p", {"i": i}) for i in range(3)]), reply("never")]), [probe]) as loop:
        events: list[Event] = []
        handle = loop.start("go", PARALLEL, tap=events.append)
        entered.wait()
        loop.cancel("user stop")
        with pytest.raises(Cancelled, match="user stop"):
            handle.result(WAIT)
        assert [type(e) for e in events if isinstance(e, (ToolPre, ToolPost))] == [ToolPre] * 3
        assert loop.conversation() == []
        release.set()
    assert cooperative_done.wait(WAIT)
    assert seen_cancel == [True]


def test_contextvars_reach_wave_tools() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []
    barrier = threading.Barrier(3, timeout=WAIT)

    @tool(concurrency_safe=True)
    def read(i: int) -> str:
        """Read."""
        barrier.wait()
        seen.append(var.get())
        return "ok"

    with BareLoop(ScriptedClient([calls(*[("read", {"i": i}) for i in range(3)]), reply("done")]), [read]) as loop:
        token = var.set("caller")
        try:
            loop.run("go", PARALLEL)
        finally:
            var.reset(token)
    assert seen == ["caller"] * 3


# -- memory trajectory -------------------------------------------------------------------------


class ListMemory:
    def __init__(self, fail: bool = False) -> None:
        self.entries: list[Any] = []
        self.fail = fail

    def store(self, entry: Any) -> None:
        if self.fail:
            raise OSError("disk full")
        self.entries.append(entry)

    def retrieve(self, query: str, limit: int) -> list[Any]:
        return []

    def consolidate(self) -> None:
        pass


def test_successful_calls_are_stored_as_trajectory_entries() -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        if text == "bad":
            raise ValueError("bad")
        return text * 300

    memory = ListMemory()
    script = [call("echo", text="ab"), call("echo", text="bad"), reply("done")]
    with BareLoop(ScriptedClient(script), [echo]) as loop:
        loop.set_memory(memory)
        loop.run("go", RunConfig(memory_top_k=0))
    (entry,) = memory.entries  # the failed call is not stored
    assert entry.tags == ("trajectory", "echo") and entry.category == "trajectory"
    assert entry.text == 'tool=echo; input={"text":"ab"}; result=' + ("ab" * 300)[:500]


def test_memory_store_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    with BareLoop(ScriptedClient([call("echo", text="x"), reply("done")]), [echo]) as loop:
        loop.set_memory(ListMemory(fail=True))
        run = loop.run("go", RunConfig(memory_top_k=0))
    assert run.output == "done"
    assert "memory store of a tool trajectory failed" in caplog.text


def test_a_later_run_with_a_wider_wave_still_overlaps_fully() -> None:
    small = threading.Barrier(2, timeout=WAIT)
    wide = threading.Barrier(4, timeout=1.0)  # short: the bug shows as a broken barrier
    outs: list[str] = []

    @tool(concurrency_safe=True)
    def meet(i: int, size: int) -> str:
        """Meet."""
        (small if size == 2 else wide).wait()
        return "met"

    script = [
        calls(*[("meet", {"i": i, "size": 2}) for i in range(2)]), reply("one"),
        calls(*[("meet", {"i": i, "size": 4}) for i in range(4)]), reply("two"),
    ]
    with BareLoop(ScriptedClient(script), [meet]) as loop:
        loop.run("first", RunConfig(parallel=ParallelDispatch("parallel", 2)))
        loop.run("second", RunConfig(parallel=ParallelDispatch("parallel", 4)))
        outs = [r.output for r in results_of(loop)]
    assert outs == ["met"] * 6
