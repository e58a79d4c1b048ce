"""The tool pipeline and the shipped middleware, standalone and inside a loop."""

from __future__ import annotations

import threading
import time
from typing import Optional

import pytest

from loopctl import (
    BareLoop,
    ConfigError,
    ParallelDispatch,
    RunConfig,
    ToolContext,
    ToolOutput,
    ToolRegistry,
)
from loopctl.observers import Event, ToolPost
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools import (
    DispatchContext,
    OutputLimitMiddleware,
    PermissionCheck,
    PermissionMiddleware,
    TimeoutMiddleware,
    ToolMiddleware,
    ToolPipeline,
    UnknownToolMiddleware,
    tool,
)
from loopctl.tools.middleware import lcs_similarity, truncate
from loopctl.tools.pipeline import Next

WAIT = 10.0


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


@tool
def search(query: str) -> str:
    """Search."""
    return f"found {query}"


def registry() -> ToolRegistry:
    return ToolRegistry([echo, search])


class Tag(ToolMiddleware):
    """Records the order it sees calls in, and wraps the output."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        self.log.append(f"{self.name}>")
        out = next(ctx)
        self.log.append(f"<{self.name}")
        return ToolOutput(f"{self.name}({out.text})", out.is_error)


def test_first_registered_middleware_is_outermost() -> None:
    log: list[str] = []
    pipeline = ToolPipeline.builder().with_middleware(Tag("a", log)).with_middleware(Tag("b", log)).with_core(registry()).build()
    assert pipeline.call("echo", {"text": "x"}) == ToolOutput("a(b(x))")
    assert log == ["a>", "b>", "<b", "<a"]


def test_a_layer_may_short_circuit_and_the_core_is_not_reached() -> None:
    ran: list[str] = []

    @tool
    def spy() -> str:
        """Spy."""
        ran.append("spy")
        return "ran"

    def cached(ctx: DispatchContext, next: Next) -> ToolOutput:  # a plain callable layer
        return ToolOutput("from cache")

    pipeline = ToolPipeline.builder().with_middleware(cached).with_core(ToolRegistry([spy])).build()
    assert pipeline.call("spy", {}) == ToolOutput("from cache")
    assert ran == []


def test_a_layer_may_rewrite_name_and_input_and_the_resolved_name_is_kept() -> None:
    class Alias(ToolMiddleware):
        def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
            if ctx.tool_name == "find":
                ctx.tool_name = "search"
                ctx.input = {"query": str(ctx.input.get("q"))}
            return next(ctx)

    pipeline = ToolPipeline.builder().with_middleware(Alias()).with_core(registry()).build()
    ctx = DispatchContext("find", {"q": "cats"}, "find")
    assert pipeline.dispatch(ctx) == ToolOutput("found cats")
    assert (ctx.tool_name, ctx.requested_name) == ("search", "find")


def test_core_miss_lists_available_tools() -> None:
    pipeline = ToolPipeline.builder().with_core(registry()).build()
    assert pipeline.call("nope", {}) == ToolOutput.error("Tool not found: nope. Available: echo, search")


def test_a_raising_layer_is_a_soft_error() -> None:
    def broken(ctx: DispatchContext, next: Next) -> ToolOutput:
        raise RuntimeError("layer bug")

    pipeline = ToolPipeline.builder().with_middleware(broken).with_core(registry()).build()
    assert pipeline.call("echo", {"text": "x"}) == ToolOutput.error(
        "Tool 'echo' failed in middleware: RuntimeError: layer bug"
    )


def test_builder_rules() -> None:
    with pytest.raises(ConfigError, match="needs a core"):
        ToolPipeline.builder().build()
    with pytest.raises(ConfigError, match="middleware must have dispatch"):
        ToolPipeline.builder().with_middleware(42)  # type: ignore[arg-type]
    with_core = ToolPipeline.builder().with_core(registry())
    assert with_core.has_core and not ToolPipeline.builder().has_core
    loop = BareLoop(ScriptedClient([]), registry())
    with loop, pytest.raises(ConfigError, match="without a core"):
        loop.set_pipeline(with_core)


def test_set_pipeline_installs_the_loops_registry_as_core() -> None:
    log: list[str] = []
    client = ScriptedClient([call("echo", text="hi"), reply("done")])
    with BareLoop(client, registry()) as loop:
        loop.set_pipeline(ToolPipeline.builder().with_middleware(Tag("t", log)))
        loop.run("go")
        (result,) = [r for m in loop.conversation() for r in m.tool_results]
    assert result.output == "t(hi)"
    assert log == ["t>", "<t"]


# -- timeout -----------------------------------------------------------------------------------


def test_stuck_tool_times_out_softly_the_run_finishes_and_close_is_prompt() -> None:
    release = threading.Event()
    started = threading.Event()

    @tool(concurrency_safe=True)
    def stuck() -> str:
        """Never returns on its own."""
        started.set()
        release.wait()  # ignores its cancel signal on purpose
        return "late"

    client = ScriptedClient([call("stuck"), reply("moved on")])
    loop = BareLoop(client, [stuck])
    loop.set_pipeline(ToolPipeline.builder().with_middleware(TimeoutMiddleware(0.05)))
    try:
        run = loop.run("go")
        assert run.output == "moved on"
        (result,) = [r for m in loop.conversation() for r in m.tool_results]
        assert (result.output, result.is_error) == ("Tool 'stuck' timed out after 0.05s", True)
        assert started.is_set()
        stragglers = [t for t in threading.enumerate() if t.name.startswith("loopctl-tool-timeout-stuck")]
        assert len(stragglers) == 1 and stragglers[0].daemon  # abandoned, still blocked
        assert not loop.cancel_signal()._listeners  # the abandoned call left no listener behind
        t0 = time.monotonic()
        loop.close()
        assert time.monotonic() - t0 < 1.0  # close() does not wait for the stuck thread
    finally:
        release.set()  # let the abandoned thread end so nothing leaks
        loop.close()


def test_timed_out_tool_sees_its_own_cancel_but_the_run_is_not_cancelled() -> None:
    saw: list[Optional[str]] = []
    done = threading.Event()

    @tool
    def polite(ctx: ToolContext) -> str:
        """Stops when told."""
        ctx.cancel.wait(WAIT)
        saw.append(ctx.cancel.reason)
        done.set()
        return "stopped"

    with BareLoop(ScriptedClient([call("polite"), reply("ok")]), [polite]) as loop:
        loop.set_pipeline(ToolPipeline.builder().with_middleware(TimeoutMiddleware(0.02)))
        assert loop.run("go").output == "ok"
        assert done.wait(WAIT)
        assert not loop.is_cancelled()
    assert saw == ["timed out after 0.02s"]


def test_tools_own_timeout_is_enforced_without_middleware() -> None:
    release = threading.Event()

    @tool(timeout=0.03)
    def slow() -> str:
        """Slow."""
        release.wait(WAIT)
        return "late"

    try:
        with BareLoop(ScriptedClient([call("slow"), reply("ok")]), [slow]) as loop:
            loop.run("go")
            (result,) = [r for m in loop.conversation() for r in m.tool_results]
        assert result.output == "Tool 'slow' timed out after 0.03s"
    finally:
        release.set()


def test_timeout_lets_fast_calls_through_with_their_result() -> None:
    pipeline = ToolPipeline.builder().with_middleware(TimeoutMiddleware(WAIT)).with_core(registry()).build()
    assert pipeline.call("echo", {"text": "quick"}) == ToolOutput("quick")
    with pytest.raises(ConfigError, match="TimeoutMiddleware.seconds must be a finite positive number of seconds, got 0"):
        TimeoutMiddleware(0)


@pytest.mark.parametrize("iteration", range(3))
def test_timeouts_in_a_parallel_wave_do_not_hold_the_others(iteration: int) -> None:
    # The deadline is generous so that the quick calls make it even on a loaded machine.
    release = threading.Event()

    @tool(concurrency_safe=True)
    def maybe(stuck: bool) -> str:
        """Maybe stuck."""
        if stuck:
            release.wait(WAIT)
        return "fine"

    script = calls(("maybe", {"stuck": False}), ("maybe", {"stuck": True}), ("maybe", {"stuck": False}))
    try:
        with BareLoop(ScriptedClient([script, reply("ok")]), [maybe]) as loop:
            loop.set_pipeline(ToolPipeline.builder().with_middleware(TimeoutMiddleware(0.5)))
            loop.run("go", RunConfig(parallel=ParallelDispatch("parallel", 8)))
            outs = [r.output for m in loop.conversation() for r in m.tool_results]
        assert outs == ["fine", "Tool 'maybe' timed out after 0.5s", "fine"]
    finally:
        release.set()


# -- permission ---------------------------------------------------------------------------------


def perm_pipeline(mw: PermissionMiddleware) -> ToolPipeline:
    return ToolPipeline.builder().with_middleware(mw).with_core(registry()).build()


def test_permission_allow_and_deny() -> None:
    assert perm_pipeline(PermissionMiddleware.allow_all()).call("echo", {"text": "a"}) == ToolOutput("a")
    assert perm_pipeline(PermissionMiddleware.deny_all()).call("echo", {"text": "a"}) == ToolOutput.error(
        "Tool 'echo' blocked by policy: all tools are disabled"
    )
    rules = perm_pipeline(PermissionMiddleware.for_tools(allow=["echo"], deny=["search"]))
    assert rules.call("echo", {"text": "a"}) == ToolOutput("a")
    assert rules.call("search", {"query": "q"}).text == "Tool 'search' blocked by policy: tool 'search' is denied"
    only = perm_pipeline(PermissionMiddleware.for_tools(allow=["search"]))
    assert only.call("echo", {"text": "a"}).text == "Tool 'echo' blocked by policy: tool 'echo' is not in the allow list"


def test_permission_ask_uses_the_resolver_and_denies_without_one() -> None:
    asked: list[tuple[str, str]] = []

    def resolver(ctx: DispatchContext, prompt: str) -> bool:
        asked.append((ctx.tool_name, prompt))
        return ctx.input.get("text") == "yes"

    with_resolver = perm_pipeline(PermissionMiddleware.for_tools(ask=["echo"]).with_ask_resolver(resolver))
    assert with_resolver.call("echo", {"text": "yes"}) == ToolOutput("yes")
    assert with_resolver.call("echo", {"text": "no"}) == ToolOutput.error("Tool 'echo' blocked by policy: denied by user")
    assert asked == [("echo", "allow tool 'echo'?")] * 2
    headless = perm_pipeline(PermissionMiddleware(lambda ctx: PermissionCheck.ask("really?")))
    assert headless.call("echo", {"text": "yes"}).text == (
        "Tool 'echo' blocked by policy: approval needed and no one to ask (really?)"
    )


def test_permission_modify_rewrites_the_input_and_the_tool_still_validates() -> None:
    fix = perm_pipeline(PermissionMiddleware(lambda ctx: PermissionCheck.modify({"text": "[redacted]"})))
    assert fix.call("echo", {"text": "secret"}) == ToolOutput("[redacted]")
    broken = perm_pipeline(PermissionMiddleware(lambda ctx: PermissionCheck.modify({"text": 1})))
    assert broken.call("echo", {"text": "x"}).text == (
        "Invalid input for tool 'echo': field 'text' must be string, got integer 1"
    )


def test_permission_read_only_policy() -> None:
    @tool(read_only=True)
    def peek() -> str:
        """Peek."""
        return "seen"

    pipeline = ToolPipeline.builder().with_middleware(PermissionMiddleware.read_only()).with_core(
        ToolRegistry([peek, echo])
    ).build()
    assert pipeline.call("peek", {}) == ToolOutput("seen")
    assert pipeline.call("echo", {"text": "x"}).text == "Tool 'echo' blocked by policy: tool 'echo' is not read-only"


def test_permission_deny_in_a_run_is_a_soft_error_and_the_run_continues() -> None:
    client = ScriptedClient([call("search", query="x"), call("echo", text="y"), reply("done")])
    with BareLoop(client, registry()) as loop:
        loop.set_pipeline(ToolPipeline.builder().with_middleware(PermissionMiddleware.for_tools(deny=["search"])))
        events: list[Event] = []
        run = loop.start("go", tap=events.append).result(WAIT)
        outs = [(r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]
    assert run.output == "done"
    assert outs == [("Tool 'search' blocked by policy: tool 'search' is denied", True), ("y", False)]
    assert [e.is_error for e in events if isinstance(e, ToolPost)] == [True, False]


# -- output limit --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, limit, expected",
    [
        ("short", 100, "short"),
        ("x" * 20, 20, "x" * 20),
        ("abcdefghijklmnopqrstuvwxyz", 20, "abcdefgh\n[truncated]"),
        ("abcdefghijklmnopqrstuvwxyz", 12, "\n[truncated]"),
        ("abcdefghijklmnopqrstuvwxyz", 5, "abcde"),
        ("abcdefghijklmnopqrstuvwxyz", 0, "abcdefghijklmnopqrstuvwxyz"),
    ],
)
def test_output_limit_keeps_the_head_within_the_budget(text: str, limit: int, expected: str) -> None:
    assert truncate(text, limit) == expected
    pipeline = ToolPipeline.builder().with_middleware(OutputLimitMiddleware(limit)).with_core(registry()).build()
    out = pipeline.call("echo", {"text": text})
    assert out == ToolOutput(expected)
    if limit:
        assert len(out.text) <= limit


def test_output_limit_keeps_the_error_flag() -> None:
    pipeline = ToolPipeline.builder().with_middleware(OutputLimitMiddleware(15)).with_core(registry()).build()
    out = pipeline.call("echo", {})
    assert out.is_error and out.text == "Inv\n[truncated]"
    with pytest.raises(ConfigError):
        OutputLimitMiddleware(-1)


# -- unknown tool --------------------------------------------------------------------------------


def test_unknown_tool_gets_a_suggestion() -> None:
    pipeline = ToolPipeline.builder().with_middleware(UnknownToolMiddleware()).with_core(registry()).build()
    assert pipeline.call("serch", {"query": "q"}) == ToolOutput.error("Tool not found: serch. Did you mean 'search'?")
    assert pipeline.call("ECHOO", {}) == ToolOutput.error("Tool not found: ECHOO. Did you mean 'echo'?")
    # Nothing close: the core's answer lists what exists.
    assert pipeline.call("zzz", {}) == ToolOutput.error("Tool not found: zzz. Available: echo, search")
    assert pipeline.call("echo", {"text": "k"}) == ToolOutput("k")


def test_unknown_tool_after_a_rename_inside_a_run() -> None:
    def typo(ctx: DispatchContext, next: Next) -> ToolOutput:
        ctx.tool_name = "ecko"  # a buggy rename: the advertised name no longer resolves
        return next(ctx)

    client = ScriptedClient([call("echo", text="x"), reply("done")])
    with BareLoop(client, registry()) as loop:
        # The rename must be outside (registered first) for the suggestion layer to see it.
        loop.set_pipeline(ToolPipeline.builder().with_middleware(typo).with_middleware(UnknownToolMiddleware()))
        loop.run("go")
        (result,) = [r for m in loop.conversation() for r in m.tool_results]
    assert result.output == "Tool not found: ecko. Did you mean 'echo'?"


def test_lcs_similarity() -> None:
    assert lcs_similarity("search", "search") == 1.0
    assert lcs_similarity("serch", "search") == pytest.approx(5 / 6)
    assert lcs_similarity("", "x") == 0.0
    assert lcs_similarity("abc", "xyz") == 0.0


class Counting(ToolMiddleware):
    """A stateful layer: counts under its own lock (layers run on pool threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[str] = []

    def dispatch(self, ctx: DispatchContext, next: Next) -> ToolOutput:
        with self.lock:
            self.seen.append(ctx.call_id)
        return next(ctx)


def test_middleware_sees_each_call_once_in_a_parallel_wave() -> None:
    barrier = threading.Barrier(4, timeout=WAIT)

    @tool(concurrency_safe=True)
    def meet(i: int) -> str:
        """Meet."""
        barrier.wait()
        return str(i)

    counting = Counting()
    client = ScriptedClient([calls(*[("meet", {"i": i}) for i in range(4)]), reply("done")])
    with BareLoop(client, [meet]) as loop:
        loop.set_pipeline(ToolPipeline.builder().with_middleware(counting))
        loop.run("go", RunConfig(parallel=ParallelDispatch("parallel", 8)))
        ids = [c.id for c in loop.conversation()[1].tool_calls]
    assert sorted(counting.seen) == sorted(ids)
