"""The approval slot on its own: answers from other threads, once; bounds; cancel; the record."""

from __future__ import annotations

import threading
import time

import pytest
from support import run_in_thread, run_in_threads

from loopctl.approvals import ApprovalDecision, PendingApproval
from loopctl.approvals.slot import ApprovalSlot
from loopctl.cancel import CancelSignal
from loopctl.errors import Cancelled
from loopctl.records import Run
from loopctl.tools import tool

WAIT = 5.0


@tool(requires_approval=True)
def pay(amount: int, to: str) -> str:
    """Pay someone.

    Args:
        amount: how much.
        to: who.
    """
    return f"paid {amount} to {to}"


def make_slot(run_id: str = "r1") -> tuple[ApprovalSlot, Run, CancelSignal]:
    run = Run(id=run_id, input="x")
    cancel = CancelSignal()
    return ApprovalSlot(run, cancel.view()), run, cancel


def park(slot: ApprovalSlot, call_id: str = "c1", timeout: float | None = None) -> PendingApproval:
    return slot.request(call_id, "pay", {"amount": 5, "to": "bob"}, turn=0, timeout=timeout, validate=pay.validate)


def test_pending_lists_parked_calls_with_their_fields() -> None:
    slot, _, _ = make_slot()
    park(slot, "c1")
    park(slot, "c2")
    pending = slot.pending()
    assert [p.call_id for p in pending] == ["c1", "c2"]
    p = pending[0]
    assert (p.tool, p.arguments, p.run_id) == ("pay", {"amount": 5, "to": "bob"}, "r1")
    assert PendingApproval.from_dict(p.to_dict()) == p


def test_approve_is_taken_once_and_recorded_with_who_and_when() -> None:
    slot, run, _ = make_slot()
    park(slot)
    before = time.time()
    assert slot.approve("c1", by="alice") is True
    assert slot.approve("c1", by="bob") is False
    assert slot.deny("c1", "too late", by="bob") is False
    assert slot.pending() == []
    [d] = run.approvals
    assert (d.approved, d.by, d.reason, d.edited) == (True, "alice", "", False)
    assert d.decided_at >= before
    assert [x.call_id for x in slot.wait_any(["c1"])] == ["c1"]


def test_unknown_call_id_is_refused() -> None:
    slot, run, _ = make_slot()
    park(slot)
    assert slot.approve("nope") is False
    assert slot.deny("nope", "x") is False
    assert run.approvals == []


def test_deny_records_the_reason() -> None:
    slot, run, _ = make_slot()
    park(slot)
    assert slot.deny("c1", "not today", by="carol") is True
    [d] = slot.wait_any(["c1"])
    assert (d.approved, d.by, d.reason) == (False, "carol", "not today")
    assert run.approvals == [d]


def test_invalid_edit_raises_naming_the_field_and_the_call_stays_pending() -> None:
    slot, run, _ = make_slot()
    park(slot)
    with pytest.raises(ValueError, match="amount"):
        slot.approve("c1", arguments={"amount": "lots", "to": "bob"})
    with pytest.raises(ValueError, match="to"):
        slot.approve("c1", arguments={"amount": 3})
    with pytest.raises(ValueError):
        slot.approve("c1", arguments=["not", "a", "mapping"])  # type: ignore[arg-type]
    assert [p.call_id for p in slot.pending()] == ["c1"]
    assert run.approvals == []
    assert slot.approve("c1", by="alice", arguments={"amount": 3, "to": "eve"}) is True
    [d] = run.approvals
    assert d.edited and d.arguments == {"amount": 3, "to": "eve"}


def test_timeout_denies_with_approval_timed_out() -> None:
    slot, run, _ = make_slot()
    park(slot, timeout=0.05)
    [d] = slot.wait_any(["c1"])
    assert (d.approved, d.reason, d.by) == (False, "approval timed out", None)
    assert slot.approve("c1") is False
    assert run.approvals == [d]


def test_wait_returns_each_decision_once_as_they_come() -> None:
    slot, _, _ = make_slot()
    park(slot, "c1")
    park(slot, "c2")
    assert slot.deny("c2", "no")
    assert [d.call_id for d in slot.wait_any(["c1", "c2"])] == ["c2"]
    t, errors = run_in_thread(lambda: slot.approve("c1"))
    assert [d.call_id for d in slot.wait_any(["c1", "c2"])] == ["c1"]
    t.join(WAIT)
    assert not errors


def test_cancel_wakes_the_wait_within_100ms_and_closes_the_slot() -> None:
    for _ in range(20):
        _cancel_trial()


def _cancel_trial() -> None:
    slot, run, cancel = make_slot()
    park(slot)
    waiting = threading.Event()
    raised: list[BaseException] = []

    def wait() -> None:
        waiting.set()
        try:
            slot.wait_any(["c1"])
        except BaseException as exc:
            raised.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    assert waiting.wait(WAIT)
    t0 = time.perf_counter()
    cancel.cancel("stop")
    t.join(WAIT)
    assert time.perf_counter() - t0 < 0.1
    assert len(raised) == 1 and isinstance(raised[0], Cancelled)
    assert slot.approve("c1") is False
    [d] = run.approvals
    assert (d.approved, d.reason) == (False, "run cancelled")


def test_close_answers_leftovers_run_ended_and_refuses_later_answers() -> None:
    slot, run, _ = make_slot()
    park(slot, "c1")
    park(slot, "c2")
    slot.approve("c1")
    slot.close("run ended")
    assert slot.approve("c2") is False
    assert slot.deny("c2", "x") is False
    assert [(d.call_id, d.approved, d.reason) for d in run.approvals] == [
        ("c1", True, ""),
        ("c2", False, "run ended"),
    ]
    assert [d.call_id for d in slot.take_unreported()] == ["c1", "c2"]
    assert slot.take_unreported() == []
    with pytest.raises(Cancelled):
        park(slot, "c3")


def test_an_id_from_another_run_is_refused() -> None:
    first, _, _ = make_slot("r1")
    park(first, "call_1")
    first.close("run ended")
    second, run2, _ = make_slot("r2")
    assert second.approve("call_1") is False
    assert run2.approvals == []


def test_eight_threads_approving_at_once_one_wins() -> None:
    for _ in range(50):
        _eight_threads_trial()


def _eight_threads_trial() -> None:
    slot, run, _ = make_slot()
    park(slot)
    barrier = threading.Barrier(8)
    answers: list[bool] = []
    lock = threading.Lock()

    def approve(who: str) -> None:
        barrier.wait(WAIT)
        ok = slot.approve("c1", by=who)
        with lock:
            answers.append(ok)

    errors = run_in_threads(approve, [(f"p{i}",) for i in range(8)])
    assert not errors
    assert sorted(answers) == [False] * 7 + [True]
    [d] = run.approvals
    assert d.approved and d.by is not None


def test_approve_and_cancel_racing_exactly_one_decides_the_call() -> None:
    outcomes = {_race_trial() for _ in range(100)}
    assert outcomes  # both orders are legal; each trial agrees with itself


def _race_trial() -> bool:
    slot, run, cancel = make_slot()
    park(slot)
    barrier = threading.Barrier(2)
    told: list[bool] = []

    def approve() -> None:
        barrier.wait(WAIT)
        told.append(slot.approve("c1", by="alice"))

    def fire() -> None:
        barrier.wait(WAIT)
        cancel.cancel("stop")

    errors = run_in_threads(lambda f: f(), [(approve,), (fire,)])
    assert not errors
    [d] = run.approvals
    assert told == [d.approved]
    assert d.reason == ("" if d.approved else "run cancelled")
    assert slot.approve("c1") is False
    return d.approved


def test_decision_round_trips_through_the_run_record() -> None:
    slot, run, _ = make_slot()
    park(slot)
    slot.approve("c1", by="alice", arguments={"amount": 1, "to": "x"})
    again = Run.from_dict(run.to_dict())
    assert again.approvals == run.approvals
    assert isinstance(again.approvals[0], ApprovalDecision)
