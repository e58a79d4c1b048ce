"""Hooks: the vetoing channel. Executor rules, built-ins, and their place in a run."""

from __future__ import annotations

from typing import Any, Optional

import pytest

from loopctl import BareLoop, Observer
from loopctl.hooks import (
    BlocklistHook,
    CompactHookContext,
    ConfirmationHook,
    Hook,
    HookDecision,
    HookExecutor,
    PreCompactDecision,
    RunHookContext,
    ToolHookContext,
)
from loopctl.observers import Event, RunEnd, RunStart, ToolPost, ToolPre
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import tool

WAIT = 10.0


def ctx(name: str = "t", attempt: int = 0) -> ToolHookContext:
    return ToolHookContext("s", "r", 0, "c1", name, {"a": 1}, attempt)


class Verdict(Hook):
    def __init__(self, decision: Optional[HookDecision], log: list[str], name: str) -> None:
        self.decision = decision
        self.log = log
        self.name = name

    def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
        self.log.append(self.name)
        return self.decision


def test_first_block_wins_and_later_hooks_are_not_consulted() -> None:
    log: list[str] = []
    ex = HookExecutor([
        Verdict(HookDecision.allow(), log, "allow"),  # an explicit allow does not stop evaluation
        Verdict(None, log, "none"),
        Verdict(HookDecision.block("first"), log, "block1"),
        Verdict(HookDecision.block("second"), log, "block2"),
    ])
    assert ex.pre_tool_use(ctx()) == HookDecision.block("first")
    assert log == ["allow", "none", "block1"]


def test_ask_blocks_when_headless_and_passes_when_interactive() -> None:
    log: list[str] = []
    asking = Verdict(HookDecision.ask("sure?"), log, "ask")
    assert HookExecutor([asking]).pre_tool_use(ctx()) == HookDecision.block("sure?")
    assert HookExecutor([asking], interactive=True).pre_tool_use(ctx()) == HookDecision.allow()


def test_a_raising_hook_is_logged_and_treated_as_allow(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Hook):
        def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
            raise RuntimeError("hook bug")

    assert HookExecutor([Broken()]).pre_tool_use(ctx()) == HookDecision.allow()
    assert "hook Broken.on_pre_tool_use raised" in caplog.text


def test_pre_compact_merges_veto_instructions_and_context() -> None:
    class Say(Hook):
        def __init__(self, d: Optional[PreCompactDecision]) -> None:
            self.d = d

        def on_pre_compact(self, ctx: CompactHookContext) -> Optional[PreCompactDecision]:
            return self.d

    cctx = CompactHookContext("s", "r", "threshold", (), 100)
    merged = HookExecutor([
        Say(PreCompactDecision(instructions="keep names", extra_context="user is ada")),
        Say(None),
        Say(PreCompactDecision(instructions="keep numbers")),
    ]).pre_compact(cctx)
    assert merged == PreCompactDecision(False, "keep names\nkeep numbers", "user is ada")
    assert HookExecutor([Say(PreCompactDecision(abort=True)), Say(PreCompactDecision())]).pre_compact(cctx).abort


def test_blocklist_hook() -> None:
    deny = BlocklistHook.deny(["rm"])
    assert deny.on_pre_tool_use(ctx("rm")) == HookDecision.block("tool 'rm' is on the blocklist")
    assert deny.on_pre_tool_use(ctx("ls")) is None
    only = BlocklistHook.allow_only(["ls"])
    assert only.on_pre_tool_use(ctx("cat")) == HookDecision.block("tool 'cat' is not on the allow list")
    assert only.on_pre_tool_use(ctx("ls")) is None
    assert BlocklistHook.allow_only([]).on_pre_tool_use(ctx("any")) is None  # empty allows everything
    both = BlocklistHook(deny=["ls"], allow=["ls"])
    assert both.on_pre_tool_use(ctx("ls")) is not None  # deny wins


def test_confirmation_hook() -> None:
    answers = {"write": False, "read": True}
    hook = ConfirmationHook(lambda c: answers[c.tool], tools=["write", "read"])
    assert hook.on_pre_tool_use(ctx("write")) == HookDecision.block("User denied permission")
    assert hook.on_pre_tool_use(ctx("read")) is None
    assert hook.on_pre_tool_use(ctx("other")) is None  # not listed: not asked

    def explode(c: ToolHookContext) -> bool:
        raise OSError("tty gone")

    assert ConfirmationHook(explode).on_pre_tool_use(ctx("x")) == HookDecision.block("User denied permission")


# -- in a run ------------------------------------------------------------------------------------


class Recorder(Hook):
    def __init__(self, log: list[str], block: tuple[str, ...] = ()) -> None:
        self.log = log
        self.block = block
        self.post: list[tuple[str, int, str, bool]] = []

    def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
        self.log.append(f"hook:pre:{ctx.tool}")
        if ctx.tool in self.block:
            return HookDecision.block(f"{ctx.tool} is off limits")
        return None

    def on_post_tool_use(self, ctx: ToolHookContext, output: str, is_error: bool) -> None:
        self.log.append(f"hook:post:{ctx.tool}")
        self.post.append((ctx.tool, ctx.attempt, output, is_error))

    def on_run_start(self, ctx: RunHookContext) -> None:
        self.log.append(f"hook:run_start:{ctx.input}")

    def on_run_end(self, ctx: RunHookContext, success: bool, error: Optional[str]) -> None:
        self.log.append(f"hook:run_end:{success}")


class Watch(Observer):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def on_run_start(self, event: RunStart) -> None:
        self.log.append("obs:run_start")

    def on_run_end(self, event: RunEnd) -> None:
        self.log.append("obs:run_end")

    def on_tool_pre(self, event: ToolPre) -> None:
        self.log.append(f"obs:pre:{event.tool}")

    def on_tool_post(self, event: ToolPost) -> None:
        self.log.append(f"obs:post:{event.tool}")


def test_blocked_call_is_a_soft_error_never_runs_and_has_no_post() -> None:
    ran: list[str] = []

    @tool
    def wipe() -> str:
        """Wipe everything."""
        ran.append("wipe")
        return "wiped"

    @tool
    def look() -> str:
        """Look."""
        ran.append("look")
        return "seen"

    log: list[str] = []
    hook = Recorder(log, block=("wipe",))
    client = ScriptedClient([call("wipe"), call("look"), reply("done")])
    with BareLoop(client, [wipe, look]) as loop:
        loop.set_hook_executor(HookExecutor([hook]))
        loop.register_observer(Watch(log))
        run = loop.run("go")
        outs = [(r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]
    assert run.output == "done"
    assert ran == ["look"]
    assert outs == [("Tool 'wipe' blocked: wipe is off limits", True), ("seen", False)]
    assert log == [
        "obs:run_start", "hook:run_start:go",  # run start: observers, then hooks
        "obs:pre:wipe", "hook:pre:wipe",  # blocked: no post event, no post hook
        "obs:pre:look", "hook:pre:look", "obs:post:look", "hook:post:look",
        "hook:run_end:True", "obs:run_end",  # run end: hooks, then observers
    ]
    assert hook.post == [("look", 0, "seen", False)]


def test_headless_ask_in_a_run_blocks_with_the_prompt() -> None:
    @tool
    def deploy() -> str:
        """Deploy."""
        return "deployed"

    class Ask(Hook):
        def on_pre_tool_use(self, ctx: ToolHookContext) -> Optional[HookDecision]:
            return HookDecision.ask("deploy to prod?")

    with BareLoop(ScriptedClient([call("deploy"), reply("done")]), [deploy]) as loop:
        loop.set_hook_executor(HookExecutor([Ask()]))
        loop.run("go")
        (result,) = [r for m in loop.conversation() for r in m.tool_results]
    assert (result.output, result.is_error) == ("Tool 'deploy' blocked: deploy to prod?", True)


def test_post_hook_sees_errors_and_every_attempt() -> None:
    from loopctl.tools import Retry, ToolError

    tries: list[int] = []

    @tool
    def wobbly() -> str:
        """Wobbly."""
        tries.append(1)
        if len(tries) == 1:
            raise ToolError("first")
        return "second"

    class Retry1:
        def decide(self, analysis: Any, attempt: int, max_attempts: int) -> Any:
            return Retry(0.0)

    log: list[str] = []
    hook = Recorder(log)
    with BareLoop(ScriptedClient([call("wobbly"), reply("done")]), [wobbly]) as loop:
        loop.set_hook_executor(HookExecutor([hook]))
        loop.set_recovery_strategy(Retry1())
        events: list[Event] = []
        loop.start("go", tap=events.append).result(WAIT)
    assert hook.post == [("wobbly", 0, "Tool 'wobbly' failed: first", True), ("wobbly", 1, "second", False)]
    assert log.count("hook:pre:wobbly") == 2
