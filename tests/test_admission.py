"""The admission gate through real runs: unique ids, one frozen value, bounded arguments, races."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from support import WAIT, Recorder, run_in_threads

from loopctl import BareLoop, ParallelDispatch, RunConfig, tool
from loopctl.approvals import ApprovalContext
from loopctl.driver.checkpoint import Checkpoint, ResumePoint
from loopctl.messages import Message, ModelResponse, StopReason, ToolCallPart
from loopctl.observers import ApprovalRequested, Observer, ToolInputDelta
from loopctl.testing import ScriptedClient, reply
from loopctl.tools import Correction, FailureAnalysis, Retry, Severity, ToolError


def calls_reply(*parts: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    """A reply whose calls carry the ids given (a model that repeats ids)."""
    calls = [ToolCallPart(cid, name, dict(args)) for cid, name, args in parts]
    return ModelResponse(Message.assistant("", calls), StopReason.TOOL_CALL)


class Parked(Observer):
    """Counts parked calls; ``wait_for(n)`` blocks until ``n`` were requested."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.requested: list[ApprovalRequested] = []

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        with self.cond:
            self.requested.append(event)
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.requested) >= n, WAIT), f"{len(self.requested)} of {n} parked"


class Bank:
    """Approval-gated tools with side effects; every call that really runs is recorded."""

    def __init__(self) -> None:
        self.ran: list[tuple[Any, ...]] = []
        self.lock = threading.Lock()

        @tool(requires_approval=True)
        def pay(to: str, amount: int) -> str:
            """Pay someone.

            Args:
                to: who.
                amount: how much.
            """
            with self.lock:
                self.ran.append(("pay", to, amount))
            return f"paid {amount} to {to}"

        @tool(requires_approval=True)
        def delete_account(who: str) -> str:
            """Delete an account.

            Args:
                who: whose.
            """
            with self.lock:
                self.ran.append(("delete_account", who))
            return f"deleted {who}"

        @tool(requires_approval=True, concurrency_safe=True)
        def step(n: int) -> str:
            """One numbered step.

            Args:
                n: its number.
            """
            with self.lock:
                self.ran.append(("step", n))
            return f"step {n}"

        self.tools = [pay, delete_account, step]


def loop_for(script: list[Any], *tools: Any, **kw: Any) -> tuple[BareLoop, ScriptedClient, Parked]:
    client = ScriptedClient(script)
    loop = BareLoop(client, list(tools), **kw)
    parked = Parked()
    loop.register_observer(parked)
    return loop, client, parked


def test_two_calls_sharing_an_id_are_each_approved_and_recorded_and_the_model_sees_the_same_ids() -> None:
    bank = Bank()
    script = [calls_reply(("c1", "pay", {"to": "alice", "amount": 5}), ("c1", "delete_account", {"who": "alice"})),
              reply("done")]
    loop, client, parked = loop_for(script, *bank.tools)
    with loop:
        h = loop.start("pay alice")
        parked.wait_for(2)
        pending = h.pending_approvals()
        assert [(p.call_id, p.tool) for p in pending] == [("c1", "pay"), ("c1-2", "delete_account")]
        assert h.approve("c1", by="ann") is True
        assert h.deny("c1-2", "not that", by="ann") is True
        run = h.result(WAIT)
    assert bank.ran == [("pay", "alice", 5)]  # approving pay never ran delete_account
    assert [(d.call_id, d.tool, d.approved) for d in run.approvals] == [
        ("c1", "pay", True), ("c1-2", "delete_account", False)]
    # The record and the model's next request carry the same renamed ids as the approvals.
    assert [c.id for c in run.turns[0].tool_calls] == ["c1", "c1-2"]
    sent = client.requests[1].messages
    assistant = [m for m in sent if m.tool_calls][-1]
    assert [c.id for c in assistant.tool_calls] == ["c1", "c1-2"]
    assert [r.tool_call_id for r in sent[-1].tool_results] == ["c1", "c1-2"]
    assert "denied" in sent[-1].tool_results[1].output


def test_a_call_reusing_an_earlier_turns_id_gets_a_new_one_so_a_late_answer_never_reaches_it() -> None:
    """A person answers the call they were shown; the model may send its id again in a later turn."""
    bank = Bank()
    script = [calls_reply(("c1", "pay", {"to": "alice", "amount": 5})),
              calls_reply(("c1", "pay", {"to": "mallory", "amount": 5000}), ("c1-2", "pay", {"to": "bob", "amount": 1})),
              reply("done")]
    loop, client, parked = loop_for(script, *bank.tools)
    with loop:
        h = loop.start("pay alice")
        parked.wait_for(1)
        assert h.deny("c1", "not now", by="ann") is True
        parked.wait_for(3)
        pending = h.pending_approvals()
        assert [(p.call_id, p.arguments["to"]) for p in pending] == [("c1-3", "mallory"), ("c1-2", "bob")]
        assert h.approve("c1", by="ann") is False  # the late click for alice's call reaches no other call
        assert h.deny("c1-3", "no", by="ann") is True
        assert h.approve("c1-2", by="ann") is True
        run = h.result(WAIT)
    assert bank.ran == [("pay", "bob", 1)]
    assert [[c.id for c in t.tool_calls] for t in run.turns[:2]] == [["c1"], ["c1-3", "c1-2"]]
    sent = client.requests[2].messages
    assert [c.id for m in sent for c in m.tool_calls] == ["c1", "c1-3", "c1-2"]
    assert [r.tool_call_id for m in sent for r in m.tool_results] == ["c1", "c1-3", "c1-2"]


def test_an_edit_applies_to_one_call_only_when_two_calls_share_an_id() -> None:
    bank = Bank()
    script = [calls_reply(("c1", "pay", {"to": "alice", "amount": 5}), ("c1", "pay", {"to": "mallory", "amount": 9999})),
              reply("done")]
    loop, _, parked = loop_for(script, *bank.tools)
    with loop:
        h = loop.start("pay alice")
        parked.wait_for(2)
        assert [p.arguments for p in h.pending_approvals()] == [
            {"to": "alice", "amount": 5}, {"to": "mallory", "amount": 9999}]
        assert h.approve("c1", arguments={"to": "alice", "amount": 6}) is True
        assert h.deny("c1-2", "who is mallory?") is True
        run = h.result(WAIT)
    assert bank.ran == [("pay", "alice", 6)]
    assert [(d.call_id, d.approved, d.arguments) for d in run.approvals] == [
        ("c1", True, {"to": "alice", "amount": 6}), ("c1-2", False, {"to": "mallory", "amount": 9999})]


def test_policy_person_event_record_and_tool_each_read_one_value_none_can_change() -> None:
    got: list[list[str]] = []

    @tool
    def basket(items: list[str]) -> str:
        """Buy the items.

        Args:
            items: what to buy.
        """
        got.append(list(items))
        items.append("added by the tool")  # its own copy
        return "bought"

    refused: list[str] = []

    def policy(ctx: ApprovalContext) -> bool:
        try:
            ctx.arguments["items"].append("added by the policy")
        except TypeError:
            refused.append("policy")
        return True

    class Meddler(Observer):
        def on_approval_requested(self, event: ApprovalRequested) -> None:
            try:
                event.arguments["items"].append("added by an observer")
            except TypeError:
                refused.append("observer")

    script = [calls_reply(("c1", "basket", {"items": ["apples"]})), reply("done")]
    loop, _, parked = loop_for(script, basket)
    loop.with_approval(policy)
    loop.register_observer(Meddler())
    edit = {"items": ["pears", "plums"]}
    with loop:
        h = loop.start("shop")
        parked.wait_for(1)
        [pending] = h.pending_approvals()
        with pytest.raises(TypeError):
            pending.arguments["items"].append("added by the person")
        assert h.approve("c1", by="ann", arguments=edit) is True
        edit["items"].append("added after approving")  # the approver's dict is not what runs
        run = h.result(WAIT)
    assert refused == ["policy", "observer"]
    assert got == [["pears", "plums"]]
    [decision] = run.approvals
    assert decision.arguments == {"items": ["pears", "plums"]} and decision.edited
    assert parked.requested[0].arguments == {"items": ["apples"]}
    assert pending.arguments == {"items": ["apples"]}
    assert run.turns[0].tool_calls[0].input == {"items": ["apples"]}


def test_fifty_calls_sharing_three_ids_get_fifty_ids_all_matched_in_request_order() -> None:
    bank = Bank()
    parts = [("abc"[i % 3], "step", {"n": i}) for i in range(50)]
    script = [calls_reply(*parts), reply("done")]
    loop, client, parked = loop_for(script, *bank.tools)
    with loop:
        h = loop.start("fifty", RunConfig(parallel=ParallelDispatch(max_concurrency=8)))
        parked.wait_for(50)
        pending = h.pending_approvals()
        ids = [p.call_id for p in pending]
        assert len(set(ids)) == 50
        assert [p.arguments["n"] for p in pending] == list(range(50))
        for p in reversed(pending):
            assert h.approve(p.call_id) is True
        run = h.result(WAIT)
    assert sorted(n for _, n in bank.ran) == list(range(50))
    calls = run.turns[0].tool_calls
    assert [c.id for c in calls] == ids
    assert ids[:3] == ["a", "b", "c"] and ids[3:6] == ["a-2", "b-2", "c-2"]
    results = client.requests[1].messages[-1].tool_results
    assert [r.tool_call_id for r in results] == ids  # request order kept
    assert [r.output for r in results] == [f"step {i}" for i in range(50)]
    assert sorted(d.call_id for d in run.approvals) == sorted(ids)
    assert {d.call_id: d.arguments["n"] for d in run.approvals} == {c.id: c.input["n"] for c in calls}


def test_sixteen_threads_answering_one_call_one_answer_wins_and_the_record_agrees_with_what_ran() -> None:
    ran: list[dict[str, Any]] = []

    @tool(requires_approval=True)
    def pay(to: str, tags: list[str]) -> str:
        """Pay someone.

        Args:
            to: who.
            tags: labels.
        """
        ran.append({"to": to, "tags": list(tags)})
        return "paid"

    rounds = 25
    script: list[Any] = []
    for _ in range(rounds):
        script += [calls_reply(("c1", "pay", {"to": "alice", "tags": ["a"]})), reply("done")]
    loop, _, parked = loop_for(script, pay)
    with loop:
        for r in range(rounds):
            ran.clear()
            h = loop.start(f"round {r}")
            parked.wait_for(r + 1)
            barrier = threading.Barrier(16)
            won: list[tuple[int, dict[str, Any] | None]] = []
            edits: dict[int, dict[str, Any]] = {}

            def answer(
                i: int, h: Any, barrier: threading.Barrier, edits: dict[int, Any], won: list[Any]
            ) -> None:
                barrier.wait(WAIT)
                if i % 3 == 0:
                    took = h.approve("c1", by=f"t{i}")
                    args = None
                elif i % 3 == 1:
                    took = h.deny("c1", f"no from t{i}", by=f"t{i}")
                    args = None
                else:
                    args = edits[i] = {"to": f"t{i}", "tags": [f"t{i}"]}
                    took = h.approve("c1", by=f"t{i}", arguments=args)
                if took:
                    won.append((i, args))

            assert run_in_threads(answer, [(i, h, barrier, edits, won) for i in range(16)]) == []
            run = h.result(WAIT)
            for args in edits.values():
                args["tags"].append("changed after the run")  # never reaches the record
            with pytest.raises(TypeError):  # nor can the event's copy be changed
                parked.requested[-1].arguments["tags"].append("changed by an observer")
            assert len(won) == 1
            winner, edited = won[0]
            [decision] = run.approvals
            assert decision.by == f"t{winner}"
            if winner % 3 == 1:
                assert not decision.approved and ran == []
            else:
                expected = {"to": "alice", "tags": ["a"]} if edited is None else {"to": f"t{winner}", "tags": [f"t{winner}"]}
                assert decision.approved and ran == [expected]
                assert decision.arguments == expected


def test_a_ten_megabyte_argument_is_a_short_soft_error_and_no_event_carries_it() -> None:
    ran: list[int] = []

    @tool
    def store(text: str) -> str:
        """Store the text.

        Args:
            text: what to store.
        """
        ran.append(len(text))
        return "stored"

    huge = "x" * 10_000_000
    loop, client, _ = loop_for([calls_reply(("c1", "store", {"text": huge})), reply("done")], store)
    rec = Recorder()
    loop.register_observer(rec)
    with loop:
        run = loop.run("store it")
    assert run.output == "done" and ran == []
    [result] = client.requests[1].messages[-1].tool_results
    assert result.is_error and "too large" in result.output and len(result.output) < 2048
    assert run.turns[0].tool_calls[0].input == {}
    # Past the gate nothing carries the argument. (The raw ``tool_input_delta``
    # stream events are the provider's chunks, bounded where deltas are made.)
    sizes = {type(e).__name__: len(json.dumps(e.to_dict())) for e in rec.events if not isinstance(e, ToolInputDelta)}
    assert max(sizes.values()) < 100_000, sizes


class FixTo:
    """A reflector that answers every failure with an input fix."""

    def __init__(self, fixed: dict[str, Any]) -> None:
        self.fixed = fixed

    def analyze(self, error: str, tool: str, input: Any, schema: Any, ctx: Any) -> FailureAnalysis:
        return FailureAnalysis(True, "transient", Severity.LOW, Correction("input_fix", modified_input=self.fixed))


class AlwaysRetry:
    def decide(self, analysis: FailureAnalysis, attempt: int, max_attempts: int) -> Any:
        return Retry(0.0)


def test_a_recovery_correction_that_changes_an_approved_call_is_not_run_without_approval() -> None:
    ran: list[tuple[str, int]] = []
    pay = flaky_pay(ran)
    loop, _, parked = loop_for([calls_reply(("c1", "pay", {"to": "alice", "amount": 5})), reply("done")], pay)
    loop.set_reflector(FixTo({"to": "mallory", "amount": 9999}))
    loop.set_recovery_strategy(AlwaysRetry())
    with loop:
        h = loop.start("pay alice")
        parked.wait_for(1)
        assert h.approve("c1") is True
        run = h.result(WAIT)
    assert ran == [("alice", 5)]  # the approved call ran; the changed one never did
    [result] = [r for m in loop.conversation() for r in m.tool_results]
    assert result.is_error and "needs a person's approval" in result.output
    assert [(d.call_id, d.arguments) for d in run.approvals] == [("c1", {"to": "alice", "amount": 5})]


def flaky_pay(ran: list[tuple[str, int]]) -> Any:
    """An approval-gated pay whose first attempt fails."""

    @tool(requires_approval=True)
    def pay(to: str, amount: int) -> str:
        """Pay someone.

        Args:
            to: who.
            amount: how much.
        """
        ran.append((to, amount))
        if len(ran) == 1:
            raise ToolError("bank unavailable")
        return f"paid {amount} to {to}"

    return pay


def deeply_nested(depth: int) -> dict[str, Any]:
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(depth):
        cur["n"] = {}
        cur = cur["n"]
    return deep


def approved_retry(fix: dict[str, Any], ran: list[tuple[str, int]]) -> tuple[Any, BareLoop]:
    """Pay alice 5 (approved), failing once; the reflector's correction is ``fix``."""
    loop, _, parked = loop_for([calls_reply(("c1", "pay", {"to": "alice", "amount": 5})), reply("done")], flaky_pay(ran))
    loop.with_reflector(FixTo(fix)).with_recovery_strategy(AlwaysRetry())
    with loop:
        h = loop.start("pay alice")
        parked.wait_for(1)
        assert h.approve("c1") is True
        run = h.result(WAIT)
    assert len(parked.requested) == 1
    return run, loop


def test_a_recovery_correction_equal_to_the_approved_call_runs_it_again_as_approved() -> None:
    ran: list[tuple[str, int]] = []
    run, loop = approved_retry({"to": "alice", "amount": 5}, ran)
    assert ran == [("alice", 5), ("alice", 5)]
    assert [r.output for m in loop.conversation() for r in m.tool_results] == ["paid 5 to alice"]
    assert [d.arguments for d in run.approvals] == [{"to": "alice", "amount": 5}]


@pytest.mark.parametrize(
    ("fix", "reason"),
    [
        ({"to": "alice" + "x" * 1_000_100, "amount": 5}, "the arguments of 'pay' are too large"),
        ({"to": "alice", "amount": 5, "extra": deeply_nested(5000)}, "the arguments of 'pay' are nested too deeply"),
    ],
    ids=["large", "deep"],
)
def test_a_recovery_correction_the_gate_refuses_is_answered_with_the_gates_reason(
    fix: dict[str, Any], reason: str
) -> None:
    ran: list[tuple[str, int]] = []
    _, loop = approved_retry(fix, ran)
    assert ran == [("alice", 5)]  # the refused correction never ran
    [result] = [r for m in loop.conversation() for r in m.tool_results]
    assert result.is_error and result.output.startswith(reason) and len(result.output) < 300


def test_a_resumed_wave_with_a_repeated_id_passes_the_gate_and_each_call_is_approved_alone() -> None:
    bank = Bank()
    asked = calls_reply(("c1", "pay", {"to": "alice", "amount": 5}), ("c1", "delete_account", {"who": "alice"}))
    cp = Checkpoint("model", (Message.user("go"), asked.message), 1, ())
    loop, client, parked = loop_for([reply("done")], *bank.tools)
    with loop:
        h = loop.start("go", resume=ResumePoint(cp, 1, "worker lost", clean=True))
        parked.wait_for(2)
        assert [(p.call_id, p.tool) for p in h.pending_approvals()] == [("c1", "pay"), ("c1-2", "delete_account")]
        assert h.approve("c1") is True and h.deny("c1-2", "no") is True
        run = h.result(WAIT)
    assert bank.ran == [("pay", "alice", 5)]
    sent = client.requests[0].messages
    assert [c.id for c in sent[-2].tool_calls] == ["c1", "c1-2"]
    assert [r.tool_call_id for r in sent[-1].tool_results] == ["c1", "c1-2"]
    assert len(run.approvals) == 2


def test_each_call_of_a_reply_passes_the_gate_once_and_a_bad_one_is_still_refused() -> None:
    """The dispatcher takes the verdicts the gate gave the reply's calls; it does not validate them again."""
    from collections.abc import Mapping
    from typing import Optional

    from loopctl.tools import Tool, ToolOutput

    checked: list[dict[str, Any]] = []

    class Counted(Tool):
        name = "counted"
        description = "Echoes n; counts how often its arguments are validated."
        concurrency_safe = True

        def input_schema(self) -> dict[str, Any]:
            return {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

        def validate(self, input: Mapping[str, Any]) -> Optional[str]:
            checked.append(dict(input))
            return None if isinstance(input.get("n"), int) else "n must be an integer"

        def call(self, input: Mapping[str, Any], ctx: Any) -> object:
            return f"n={input['n']}"

        def invoke(self, input: Mapping[str, Any], ctx: Any) -> ToolOutput:
            # Its own invoke does not validate again: only the gate's checks are counted.
            if not isinstance(input.get("n"), int):
                return ToolOutput.error("n must be an integer")
            return ToolOutput(str(self.call(input, ctx)))

    for rounds in range(1, 6):
        checked.clear()
        waves = [
            calls_reply(*((f"c{t}-{i}", "counted", {"n": t * 10 + i}) for i in range(t % 3 + 1)))
            for t in range(rounds)
        ]
        bad = calls_reply(("x", "counted", {"n": "not a number"}))
        loop = BareLoop(ScriptedClient([*waves, bad, reply("done")]), [Counted()])
        run = loop.run("go", RunConfig(parallel=ParallelDispatch(max_concurrency=4)))
        expected = [{"n": t * 10 + i} for t in range(rounds) for i in range(t % 3 + 1)] + [{"n": "not a number"}]
        assert checked == expected  # once each, in request order
        results = [p for m in loop.machine.history for p in m.tool_results]
        assert [r.is_error for r in results] == [False] * (len(expected) - 1) + [True]
        assert "n must be an integer" in results[-1].output
        assert run.output == "done"
        loop.close()

    # A call the gate refuses (arguments too large) beside valid ones: it is
    # answered before the dispatch, the others are still validated once.
    checked.clear()
    huge = {"n": 1, "pad": "x" * 1_000_001}
    loop = BareLoop(
        ScriptedClient([calls_reply(("a", "counted", {"n": 1}), ("big", "counted", huge), ("b", "counted", {"n": 2})),
                        reply("done")]),
        [Counted()],
    )
    loop.run("go", RunConfig(parallel=ParallelDispatch(max_concurrency=4)))
    assert checked == [{"n": 1}, {"n": 2}]
    results = [p for m in loop.machine.history for p in m.tool_results]
    assert [r.is_error for r in results] == [False, True, False]
    assert "too large" in results[1].output
    loop.close()


def test_the_gate_rebuilds_calls_messages_and_replies_with_every_field() -> None:
    """The gate builds these values field by field (faster than ``attrs.evolve``): a new field must be added there.

    When this fails, add the new field where ``driver/admission.py`` builds a
    ``ToolCallPart`` and a ``Message``, and ``driver/llm_turn.py``'s
    ``record_reply`` a ``ModelResponse``.
    """
    import attrs

    assert [f.name for f in attrs.fields(ToolCallPart)] == ["id", "name", "input", "invalid"]
    assert [f.name for f in attrs.fields(Message)] == ["role", "parts"]
    assert [f.name for f in attrs.fields(ModelResponse)] == ["message", "stop_reason", "usage", "model"]


def test_a_tool_unregistered_between_the_reply_and_its_dispatch_does_not_run() -> None:
    """The reply's verdicts are reused only while the registry still maps each name to the tool they named."""
    from loopctl.observers import Response

    ran: list[int] = []

    @tool
    def gone(n: int) -> str:
        """Records that it ran."""
        ran.append(n)
        return "ran"

    class Unregisters(Observer):
        def __init__(self, loop: BareLoop) -> None:
            self.loop = loop

        def on_response(self, event: Response) -> None:
            self.loop.tools.unregister("gone")

    loop = BareLoop(ScriptedClient([calls_reply(("c1", "gone", {"n": 1})), reply("done")]), [gone])
    loop.register_observer(Unregisters(loop))
    assert loop.run("go").output == "done"
    assert ran == []
    results = [p for m in loop.machine.history for p in m.tool_results]
    assert len(results) == 1 and results[0].is_error and "gone" in results[0].output
    loop.close()


def test_a_resumed_run_that_compacted_before_its_checkpoint_still_renames_an_id_it_used() -> None:
    """The checkpoint's pending messages no longer hold the early turns' calls; its turns do."""
    from collections.abc import Mapping

    from loopctl import SessionConfig, Tool, ToolContext

    class Dump(Tool):
        name = "dump"
        description = "Returns n characters."

        def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
            return "z" * int(input.get("n", 100))

    def ask(cid: str, n: int = 100) -> ModelResponse:
        return calls_reply((cid, "dump", {"n": n}))

    cfg = SessionConfig(context_window=10_000, compact_threshold=80)
    history = [Message.user("h" * 1600) if i % 2 == 0 else Message.assistant("a" * 1600) for i in range(10)]
    saved: list[Checkpoint] = []
    loop = BareLoop(ScriptedClient([ask("c1", 20_000), ask("c2"), reply("done")]), [Dump()], config=cfg,
                    history=history)
    loop.start("go", run_id="r1", checkpoint=saved.append).result(WAIT)
    cp = next(c for c in reversed(saved) if c.history is not None and c.after == "tools")
    assert [c.id for m in cp.pending for c in m.tool_calls] == ["c2"]  # c1 went with the compaction
    again = BareLoop.from_history(ScriptedClient([ask("c1"), reply("end")]), [Dump()], history=list(cp.history),
                                  config=cfg)
    run = again.start("go", run_id="r1", resume=ResumePoint(cp, 1, "worker lost")).result(WAIT)
    assert [c.id for t in run.turns for c in t.tool_calls] == ["c1", "c2", "c1-2"]
