"""Approvals through a real run: a person answers tool calls from another thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from support import WAIT, Recorder, run_in_thread, run_in_threads

from loopctl import BareLoop, Cancelled, ParallelDispatch, RunConfig, ToolRecoveryExhausted, tool
from loopctl.approvals import ApprovalContext
from loopctl.observers import (
    ApprovalRequested,
    ApprovalResolved,
    Observer,
    RunEnd,
    ToolCallReceived,
    ToolPost,
    ToolPre,
)
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools.recovery import Retry


class Payments:
    """A tool with a side effect: every call that really runs is counted."""

    def __init__(self) -> None:
        self.paid: list[tuple[int, str]] = []
        self.lock = threading.Lock()

        @tool(requires_approval=True, concurrency_safe=True)
        def pay(amount: int, to: str) -> str:
            """Pay someone.

            Args:
                amount: how much.
                to: who.
            """
            with self.lock:
                self.paid.append((amount, to))
            return f"paid {amount} to {to}"

        self.tool = pay


class Asked(Observer):
    """Sets ``asked`` when a call is parked, so the test knows it can answer."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.requested: list[ApprovalRequested] = []

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.requested.append(event)
        self.asked.set()


def loop_with(script: list[Any], *tools: Any, **kw: Any) -> tuple[BareLoop, Asked, Recorder]:
    loop = BareLoop(ScriptedClient(script), list(tools))
    asked, rec = Asked(), Recorder()
    loop.register_observer(asked)
    loop.register_observer(rec)
    return loop, asked, rec


def tool_result_texts(loop: BareLoop) -> list[str]:
    return [r.output for m in loop.conversation() for r in m.tool_results]


def test_approved_call_runs_and_the_decision_is_in_the_record() -> None:
    p = Payments()
    loop, asked, rec = loop_with([call("pay", amount=5, to="bob"), reply("done")], p.tool)
    with loop:
        h = loop.start("pay bob")
        assert asked.asked.wait(WAIT)
        [pending] = h.pending_approvals()
        assert (pending.tool, pending.arguments, pending.run_id) == ("pay", {"amount": 5, "to": "bob"}, h.run_id)
        assert h.approve(pending.call_id, by="alice") is True
        run = h.result(WAIT)
    assert p.paid == [(5, "bob")]
    [d] = run.approvals
    assert (d.call_id, d.approved, d.by) == (pending.call_id, True, "alice")
    assert h.approve(pending.call_id) is False  # answered, and the run ended
    kinds = [type(e) for e in rec.snapshot() if type(e) in (ToolCallReceived, ApprovalRequested, ApprovalResolved, ToolPre, ToolPost)]
    assert kinds == [ToolCallReceived, ApprovalRequested, ApprovalResolved, ToolPre, ToolPost]
    [resolved] = rec.of(ApprovalResolved)
    assert (resolved.call_id, resolved.tool, resolved.approved, resolved.by) == (pending.call_id, "pay", True, "alice")
    assert resolved.to_dict()["type"] == "approval_resolved"
    assert rec.of(ApprovalRequested)[0].to_dict()["type"] == "approval_requested"


def test_denied_call_never_runs_and_the_model_reads_the_reason() -> None:
    p = Payments()
    loop, asked, rec = loop_with([call("pay", amount=500, to="mallory"), reply("ok")], p.tool)
    with loop:
        h = loop.start("pay mallory")
        assert asked.asked.wait(WAIT)
        [pending] = h.pending_approvals()
        assert h.deny(pending.call_id, "not this one", by="alice") is True
        assert h.deny(pending.call_id, "again") is False
        run = h.result(WAIT)
    assert p.paid == []
    assert tool_result_texts(loop) == ["the user denied this call: not this one"]
    assert [r.is_error for m in loop.conversation() for r in m.tool_results] == [True]
    assert rec.count(ToolPre) == 0 and rec.count(ToolPost) == 0
    [d] = run.approvals
    assert (d.approved, d.reason, d.by) == (False, "not this one", "alice")


def test_edited_arguments_are_validated_and_used() -> None:
    p = Payments()
    loop, asked, _ = loop_with([call("pay", amount=900, to="bob"), reply("ok")], p.tool)
    with loop:
        h = loop.start("pay")
        assert asked.asked.wait(WAIT)
        [pending] = h.pending_approvals()
        with pytest.raises(ValueError, match="amount"):
            h.approve(pending.call_id, arguments={"amount": "nine hundred", "to": "bob"})
        assert [x.call_id for x in h.pending_approvals()] == [pending.call_id]  # still waiting
        assert h.approve(pending.call_id, by="boss", arguments={"amount": 90, "to": "bob"}) is True
        run = h.result(WAIT)
    assert p.paid == [(90, "bob")]
    [d] = run.approvals
    assert d.edited and d.arguments == {"amount": 90, "to": "bob"}


def test_policy_sees_validated_arguments_and_picks_the_calls() -> None:
    seen: list[ApprovalContext] = []

    @tool
    def transfer(amount: int) -> str:
        """Move money.

        Args:
            amount: how much.
        """
        return f"moved {amount}"

    def policy(ctx: ApprovalContext) -> bool:
        seen.append(ctx)
        return ctx.tool == "transfer" and ctx.arguments["amount"] > 100

    loop, asked, _ = loop_with(
        [call("transfer", amount=50), call("transfer", amount=500), call("transfer", amount="x"), reply("ok")],
        transfer,
    )
    loop.with_approval(policy)
    with loop:
        h = loop.start("go")
        assert asked.asked.wait(WAIT)
        [pending] = h.pending_approvals()
        assert pending.arguments == {"amount": 500}
        h.approve(pending.call_id)
        h.result(WAIT)
    assert [c.arguments["amount"] for c in seen] == [50, 500]  # the invalid call is never asked about
    assert tool_result_texts(loop)[:2] == ["moved 50", "moved 500"]


def test_a_policy_that_raises_makes_the_call_wait() -> None:
    @tool
    def noop() -> str:
        """Do nothing."""
        return "ok"

    def broken(ctx: ApprovalContext) -> bool:
        raise RuntimeError("boom")

    loop, asked, _ = loop_with([call("noop"), reply("ok")], noop)
    loop.with_approval(broken)
    with loop:
        h = loop.start("go")
        assert asked.asked.wait(WAIT)
        assert h.deny(h.pending_approvals()[0].call_id, "no")
        h.result(WAIT)
    assert tool_result_texts(loop) == ["the user denied this call: no"]


def test_calls_needing_no_approval_in_the_same_wave_run_meanwhile() -> None:
    p = Payments()
    looked = threading.Event()

    @tool(concurrency_safe=True)
    def lookup(key: str) -> str:
        """Look something up.

        Args:
            key: what.
        """
        looked.set()
        return f"value of {key}"

    script = [calls(("pay", {"amount": 1, "to": "a"}), ("lookup", {"key": "k"}), ("pay", {"amount": 2, "to": "b"})), reply("ok")]
    loop, asked, _ = loop_with(script, p.tool, lookup)
    with loop:
        h = loop.start("go")
        assert asked.asked.wait(WAIT)
        assert looked.wait(WAIT)  # ran while both payments still wait
        first, second = h.pending_approvals()
        assert h.deny(second.call_id, "no")
        assert h.approve(first.call_id)
        h.result(WAIT)
    assert p.paid == [(1, "a")]
    assert tool_result_texts(loop) == ["paid 1 to a", "value of k", "the user denied this call: no"]


def test_sequential_dispatch_asks_for_the_whole_batch_at_once() -> None:
    p = Payments()
    script = [calls(("pay", {"amount": 1, "to": "a"}), ("pay", {"amount": 2, "to": "b"})), reply("ok")]
    loop, asked, _ = loop_with(script, p.tool)
    with loop:
        h = loop.start("go", RunConfig(parallel=ParallelDispatch(mode="sequential")))
        assert asked.asked.wait(WAIT)
        first, second = h.pending_approvals()  # both visible before either is answered
        assert h.approve(second.call_id) and h.approve(first.call_id)
        h.result(WAIT)
    assert p.paid == [(1, "a"), (2, "b")]


def test_run_timeout_denies_with_approval_timed_out_and_the_tool_timeout_wins() -> None:
    @tool(requires_approval=True, approval_timeout=0.05)
    def quick() -> str:
        """Quick."""
        return "ran"

    p = Payments()
    loop, _, rec = loop_with([calls(("quick", {}), ("pay", {"amount": 1, "to": "a"})), reply("ok")], quick, p.tool)
    with loop:
        run = loop.run("go", RunConfig(approval_timeout=0.1))
    assert p.paid == []
    assert tool_result_texts(loop) == ["the user denied this call: approval timed out"] * 2
    assert [(d.approved, d.reason, d.by) for d in run.approvals] == [(False, "approval timed out", None)] * 2
    assert [e.timeout for e in rec.of(ApprovalRequested)] == [0.05, 0.1]


def test_cancel_while_waiting_raises_cancelled_within_100ms() -> None:
    for _ in range(10):
        p = Payments()
        loop, asked, rec = loop_with([call("pay", amount=1, to="a"), reply("never")], p.tool)
        with loop:
            h = loop.start("go")
            assert asked.asked.wait(WAIT)
            [pending] = h.pending_approvals()
            t0 = time.perf_counter()
            assert h.cancel("stop")
            with pytest.raises(Cancelled):
                h.result(WAIT)
            assert time.perf_counter() - t0 < 0.1
            assert h.approve(pending.call_id) is False
        assert p.paid == []
        [d] = h.record.approvals
        assert (d.approved, d.reason) == (False, "run cancelled")
        assert rec.of(ApprovalResolved)[0].approved is False
        assert type(rec.snapshot()[-1]) is RunEnd


def test_blocking_run_call_is_cancelled_from_another_thread_while_waiting() -> None:
    p = Payments()
    loop, asked, _ = loop_with([call("pay", amount=1, to="a"), reply("never")], p.tool)
    raised: list[BaseException] = []

    def body() -> None:
        try:
            loop.run("go")
        except BaseException as exc:
            raised.append(exc)

    with loop:
        t, _ = run_in_thread(body)
        assert asked.asked.wait(WAIT)
        t0 = time.perf_counter()
        loop.cancel()
        t.join(WAIT)
        assert time.perf_counter() - t0 < 0.1
    assert len(raised) == 1 and isinstance(raised[0], Cancelled)


def test_leftover_pending_calls_are_answered_run_ended() -> None:
    @tool
    def flaky() -> str:
        """Always fails."""
        raise RuntimeError("down")

    class AlwaysRetry:
        def decide(self, analysis: Any, attempt: int, max_attempts: int) -> Any:
            return Retry(0.0)

    p = Payments()
    script = [calls(("flaky", {}), ("pay", {"amount": 1, "to": "a"})), reply("never")]
    loop, asked, rec = loop_with(script, flaky, p.tool)
    loop.set_recovery_strategy(AlwaysRetry())
    with loop:
        with pytest.raises(ToolRecoveryExhausted) as info:
            loop.run("go", RunConfig(parallel=ParallelDispatch(mode="sequential")))
    run = info.value.run
    assert p.paid == []
    [d] = run.approvals
    assert (d.approved, d.reason) == (False, "run ended")
    tail = [type(e) for e in rec.snapshot() if type(e) in (ApprovalResolved, RunEnd)]
    assert tail == [ApprovalResolved, RunEnd]  # reported before the run's last event


def test_an_approval_for_a_call_of_a_previous_run_is_refused() -> None:
    p = Payments()
    loop, asked, _ = loop_with([call("pay", amount=1, to="a"), reply("one"), call("pay", amount=2, to="b"), reply("two")], p.tool)
    with loop:
        h1 = loop.start("first")
        assert asked.asked.wait(WAIT)
        [old] = h1.pending_approvals()
        h1.approve(old.call_id)
        h1.result(WAIT)
        asked.asked.clear()
        h2 = loop.start("second")
        assert asked.asked.wait(WAIT)
        assert h2.approve(old.call_id) is False
        assert h1.approve(old.call_id) is False
        [new] = h2.pending_approvals()
        assert h2.deny(new.call_id, "no")
        h2.result(WAIT)
    assert p.paid == [(1, "a")]


def test_eight_threads_approving_through_the_handle_one_is_told_true() -> None:
    for _ in range(20):
        _eight_threads_trial()


def _eight_threads_trial() -> None:
    p = Payments()
    loop, asked, _ = loop_with([call("pay", amount=1, to="a"), reply("ok")], p.tool)
    with loop:
        h = loop.start("go")
        assert asked.asked.wait(WAIT)
        [pending] = h.pending_approvals()
        barrier = threading.Barrier(8)
        told: list[tuple[str, bool]] = []

        def approve(who: str) -> None:
            barrier.wait(WAIT)
            told.append((who, h.approve(pending.call_id, by=who)))

        assert not run_in_threads(approve, [(f"p{i}",) for i in range(8)])
        run = h.result(WAIT)
    winners = [who for who, ok in told if ok]
    assert len(winners) == 1
    assert [d.by for d in run.approvals] == winners
    assert p.paid == [(1, "a")]


def test_approve_and_cancel_racing_100_trials_record_agrees_with_each_caller() -> None:
    for _ in range(100):
        _race_trial()


def _race_trial() -> None:
    p = Payments()
    loop, asked, _ = loop_with([call("pay", amount=1, to="a"), reply("ok")], p.tool)
    with loop:
        h = loop.start("go")
        assert asked.asked.wait(WAIT)
        [pending] = h.pending_approvals()
        barrier = threading.Barrier(2)
        told: dict[str, bool] = {}

        def approve() -> None:
            barrier.wait(WAIT)
            told["approve"] = h.approve(pending.call_id, by="alice")

        def cancel() -> None:
            barrier.wait(WAIT)
            told["cancel"] = h.cancel("stop")

        assert not run_in_threads(lambda f: f(), [(approve,), (cancel,)])
        try:
            h.result(WAIT)
            outcome = "completed"
        except Cancelled:
            outcome = "cancelled"
    [d] = h.record.approvals
    assert d.approved is told["approve"]  # the record says what the approver was told
    if not told["approve"]:
        assert d.reason == "run cancelled" and p.paid == []
    if told["cancel"]:
        assert outcome == "cancelled"
    else:
        assert outcome == "completed" and told["approve"]


def test_a_confirmation_hook_waiting_for_a_person_never_holds_a_cancel() -> None:
    from loopctl.hooks import ConfirmationHook, HookExecutor

    for _ in range(10):
        _confirmation_trial(ConfirmationHook, HookExecutor)


def _confirmation_trial(hook_cls: Any, executor_cls: Any) -> None:
    p = Payments()
    asking = threading.Event()
    released = threading.Event()

    def confirm(ctx: Any) -> bool:
        asking.set()
        released.wait(WAIT)  # a person who never answers
        return True

    @tool
    def noop() -> str:
        """Do nothing."""
        return "ok"

    loop, _, _ = loop_with([call("noop"), reply("never")], noop, p.tool)
    loop.set_hook_executor(executor_cls([hook_cls(confirm, tools=["noop"])]))
    with loop:
        h = loop.start("go")
        assert asking.wait(WAIT)
        t0 = time.perf_counter()
        h.cancel("stop")
        with pytest.raises(Cancelled):
            h.result(WAIT)
        assert time.perf_counter() - t0 < 0.1
        released.set()


def test_approval_timeouts_are_validated_and_round_trip() -> None:
    from loopctl import ConfigError

    cfg = RunConfig(approval_timeout=2.5)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert "approval_timeout" not in RunConfig().to_dict()  # older readers never see it unset
    for bad in (0, -1, "5", True, float("nan")):
        with pytest.raises(ConfigError, match="approval_timeout"):
            RunConfig(approval_timeout=bad)
        with pytest.raises(ConfigError, match="approval_timeout"):

            @tool(approval_timeout=bad)
            def t() -> str:
                """T."""
                return ""

    with pytest.raises(ConfigError, match="requires_approval"):

        @tool(requires_approval="yes")  # type: ignore[arg-type]
        def u() -> str:
            """U."""
            return ""

    loop = BareLoop(ScriptedClient([]))
    with pytest.raises(ConfigError, match="callable"):
        loop.with_approval("always")  # type: ignore[arg-type]


def test_a_gate_set_on_a_registered_tool_after_a_run_holds_from_the_next_call() -> None:
    paid: list[str] = []

    @tool
    def pay(to: str) -> str:
        """Pay someone.

        Args:
            to: who.
        """
        paid.append(to)
        return f"paid {to}"

    script = [call("pay", to="bob"), reply("one"), call("pay", to="eve"), reply("two")]
    loop, asked, _ = loop_with(script, pay)
    with loop:
        assert loop.run("pay bob").output == "one"
        loop.tools.get("pay").requires_approval = True  # type: ignore[union-attr]
        h = loop.start("pay eve")
        assert asked.asked.wait(WAIT)
        assert h.deny(h.pending_approvals()[0].call_id, "no") is True
        assert h.result(WAIT).output == "two"
    assert paid == ["bob"]
