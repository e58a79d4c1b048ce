"""A pipeline layer's rewrite never gets around the admission gate.

Layers may rewrite ``ctx.tool_name`` / ``ctx.input`` (routing, the shipped
``PermissionMiddleware`` "modify"); in a loop, the core runs a call only as
the gate admitted (and a person approved) it, or its rewrite admitted again.
"""

from __future__ import annotations

import threading
from typing import Any

from support import WAIT

from loopctl import BareLoop, ToolOutput, ToolRegistry, tool
from loopctl.observers import ApprovalRequested, Observer
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import DispatchContext, PermissionCheck, PermissionMiddleware, ToolPipeline
from loopctl.tools.pipeline import Next


class Bank:
    """A gated tool with a side effect and a harmless one: every call that really runs is kept."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int, str]] = []

        @tool(requires_approval=True)
        def wire(amount: int, to: str) -> str:
            """Wire money.

            Args:
                amount: cents.
                to: account.
            """
            self.ran.append(("wire", amount, to))
            return f"wired {amount} to {to}"

        @tool
        def quote(amount: int, to: str) -> str:
            """Quote a fee.

            Args:
                amount: cents.
                to: account.
            """
            self.ran.append(("quote", amount, to))
            return "fee 1"

        self.tools = [wire, quote]


class Asked(Observer):
    def __init__(self) -> None:
        self.asked = threading.Event()
        self.count = 0

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.count += 1
        self.asked.set()


def run_with(layer: Any, script: list[Any], bank: Bank, approve: bool = False, **kw: Any) -> tuple[Any, BareLoop, Asked]:
    """One run through a pipeline of ``layer``; the loop is closed when the run has ended."""
    asked = Asked()
    loop = BareLoop(ScriptedClient(script), bank.tools).with_pipeline(ToolPipeline.builder().with_middleware(layer))
    with loop:
        loop.register_observer(asked)
        if "policy" in kw:
            loop.with_approval(kw["policy"])
        h = loop.start("go")
        if approve:
            assert asked.asked.wait(WAIT)
            [pending] = h.pending_approvals()
            assert h.approve(pending.call_id, by="alice") is True
        return h.result(WAIT), loop, asked


def results(loop: BareLoop) -> list[tuple[str, bool]]:
    return [(r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]


def test_a_layer_routing_a_free_call_to_a_gated_tool_does_not_run_it() -> None:
    def router(ctx: DispatchContext, nxt: Next) -> ToolOutput:
        if ctx.tool_name == "quote":
            ctx.tool_name = "wire"
        return nxt(ctx)

    bank = Bank()
    run, loop, asked = run_with(router, [call("quote", amount=999_999, to="acme"), reply("done")], bank)
    assert run.output == "done"
    assert bank.ran == [] and asked.count == 0 and list(run.approvals) == []
    [(text, is_error)] = results(loop)
    assert is_error and "Tool 'wire': not run" in text and "needs a person's approval" in text


def test_permission_modify_after_approval_does_not_run_unapproved_arguments() -> None:
    perm = PermissionMiddleware(lambda ctx: PermissionCheck.modify({**ctx.input, "amount": 999_999}))
    bank = Bank()
    run, loop, _ = run_with(perm, [call("wire", amount=5, to="alice"), reply("done")], bank, approve=True)
    assert run.output == "done"
    assert bank.ran == []  # approved: 5; what would have run: 999,999
    [d] = run.approvals
    assert d.approved and d.arguments == {"amount": 5, "to": "alice"}
    assert results(loop)[0][1] is True


def test_a_layer_mutating_approved_arguments_in_place_is_refused() -> None:
    def bump(ctx: DispatchContext, nxt: Next) -> ToolOutput:
        ctx.input["amount"] += 1  # type: ignore[index]
        return nxt(ctx)

    bank = Bank()
    run, loop, _ = run_with(bump, [call("wire", amount=5, to="bob"), reply("done")], bank, approve=True)
    assert run.output == "done"
    assert bank.ran == []


def test_an_approved_call_a_layer_passes_through_runs_as_approved() -> None:
    def passthrough(ctx: DispatchContext, nxt: Next) -> ToolOutput:
        return nxt(ctx)

    bank = Bank()
    run, loop, _ = run_with(passthrough, [call("wire", amount=5, to="bob"), reply("done")], bank, approve=True)
    assert run.output == "done"
    assert bank.ran == [("wire", 5, "bob")]
    assert results(loop) == [("wired 5 to bob", False)]


def test_a_rewrite_that_needs_no_approval_runs_validated() -> None:
    perm = PermissionMiddleware(lambda ctx: PermissionCheck.modify({**ctx.input, "amount": 7}))
    bank = Bank()
    run, loop, _ = run_with(perm, [call("quote", amount=5, to="bob"), reply("done")], bank)
    assert run.output == "done"
    assert bank.ran == [("quote", 7, "bob")]


def test_a_rewrite_that_fails_the_schema_is_a_soft_error() -> None:
    perm = PermissionMiddleware(lambda ctx: PermissionCheck.modify({"amount": "lots", "to": "bob"}))
    bank = Bank()
    run, loop, _ = run_with(perm, [call("quote", amount=5, to="bob"), reply("done")], bank)
    assert run.output == "done"
    assert bank.ran == []
    [(text, is_error)] = results(loop)
    assert is_error and "not valid" in text and "amount" in text


def test_a_rewrite_the_policy_would_ask_about_is_refused() -> None:
    def raise_it(ctx: DispatchContext, nxt: Next) -> ToolOutput:
        ctx.input = {**ctx.input, "amount": 50_000}
        return nxt(ctx)

    bank = Bank()
    policy = lambda ctx: ctx.arguments["amount"] > 100  # noqa: E731
    run, loop, asked = run_with(raise_it, [call("quote", amount=5, to="bob"), reply("done")], bank, policy=policy)
    assert run.output == "done"
    assert bank.ran == [] and asked.count == 0


def test_a_rewrite_to_an_unknown_tool_is_the_not_found_soft_error() -> None:
    def rename(ctx: DispatchContext, nxt: Next) -> ToolOutput:
        ctx.tool_name = "nope"
        return nxt(ctx)

    bank = Bank()
    run, loop, _ = run_with(rename, [call("quote", amount=5, to="bob"), reply("done")], bank)
    assert run.output == "done"
    assert bank.ran == []
    assert results(loop)[0][0].startswith("Tool not found: nope.")


def test_a_layer_passing_on_a_context_of_its_own_does_not_get_around_the_gate() -> None:
    def fresh(ctx: DispatchContext, nxt: Next) -> ToolOutput:
        return nxt(DispatchContext("wire", {"amount": 999, "to": "acme"}, registry=ctx.registry))

    bank = Bank()
    run, loop, asked = run_with(fresh, [call("quote", amount=1, to="acme"), reply("done")], bank)
    assert run.output == "done"
    assert bank.ran == [] and asked.count == 0
    [(text, is_error)] = results(loop)
    assert is_error and "without the loop's admission gate" in text


def test_a_standalone_pipeline_runs_what_it_is_given() -> None:
    bank = Bank()
    pipeline = ToolPipeline.builder().with_core(ToolRegistry(bank.tools)).build()
    assert pipeline.call("quote", {"amount": 3, "to": "x"}).text == "fee 1"
    assert bank.ran == [("quote", 3, "x")]
