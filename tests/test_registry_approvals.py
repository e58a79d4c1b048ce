"""Approvals by run id through ``RunRegistry``: pending list, answers, JSON events, status."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import WAIT

from loopctl import BareLoop, Cancelled, tool
from loopctl.hosting.registry import RunRegistry
from loopctl.hosting.serialization import event_from_dict, status_from_dict
from loopctl.observers import ApprovalRequested, Observer
from loopctl.testing import ScriptedClient, call, reply


@tool(requires_approval=True)
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: the address.
        body: the text.
    """
    return f"sent to {to}"


class Asked(Observer):
    def __init__(self) -> None:
        self.asked = threading.Event()

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.asked.set()


def make_loop(*script: Any) -> tuple[BareLoop, Asked]:
    loop = BareLoop(ScriptedClient(list(script)), [send_email])
    asked = Asked()
    loop.register_observer(asked)
    return loop, asked


@pytest.fixture
def reg() -> Iterator[RunRegistry]:
    r = RunRegistry()
    yield r
    r.close()


def test_approve_by_run_id_runs_the_call_and_the_event_stream_shows_both_sides(reg: RunRegistry) -> None:
    loop, asked = make_loop(call("send_email", to="a@b.c", body="hi"), reply("done"))
    rid = reg.start(loop, "mail a")
    assert asked.asked.wait(WAIT)
    [pending] = reg.pending_approvals(rid)
    status = reg.status(rid)
    assert [p.call_id for p in status.pending_approvals] == [pending.call_id]
    wire = json.loads(json.dumps(status.to_dict()))
    assert wire["pending_approvals"][0]["tool"] == "send_email"
    assert status_from_dict(wire).pending_approvals == status.pending_approvals
    assert reg.approve(rid, pending.call_id, by="ops") is True
    assert reg.approve(rid, pending.call_id, by="ops") is False
    assert reg.result(rid, WAIT).output == "done"
    events = [e for _, e in reg.events(rid, timeout=WAIT)]
    kinds = [e["type"] for e in events]
    assert kinds.index("approval_requested") < kinds.index("approval_resolved") < kinds.index("tool_pre")
    resolved = next(e for e in events if e["type"] == "approval_resolved")
    assert (resolved["call_id"], resolved["tool"], resolved["approved"], resolved["by"]) == (
        pending.call_id,
        "send_email",
        True,
        "ops",
    )
    requested = next(e for e in events if e["type"] == "approval_requested")
    assert requested["arguments"] == {"to": "a@b.c", "body": "hi"}
    for e in (requested, resolved):
        assert event_from_dict(json.loads(json.dumps(e))).to_dict() == e
    final = reg.status(rid)
    assert final.pending_approvals == () and [d.approved for d in final.approvals] == [True]


def test_deny_by_run_id_and_answers_after_the_end_are_refused(reg: RunRegistry) -> None:
    loop, asked = make_loop(call("send_email", to="x@y.z", body="spam"), reply("ok"))
    rid = reg.start(loop, "mail x")
    assert asked.asked.wait(WAIT)
    [pending] = reg.pending_approvals(rid)
    assert reg.deny(rid, pending.call_id, "looks like spam", by="ops") is True
    reg.result(rid, WAIT)
    assert reg.deny(rid, pending.call_id, "again") is False
    assert reg.approve(rid, pending.call_id) is False
    assert reg.pending_approvals(rid) == []
    [d] = reg.status(rid).approvals
    assert (d.approved, d.reason, d.by) == (False, "looks like spam", "ops")


def test_invalid_edit_by_run_id_raises_value_error_naming_the_field(reg: RunRegistry) -> None:
    loop, asked = make_loop(call("send_email", to="a@b.c", body="hi"), reply("ok"))
    rid = reg.start(loop, "mail")
    assert asked.asked.wait(WAIT)
    [pending] = reg.pending_approvals(rid)
    with pytest.raises(ValueError, match="body"):
        reg.approve(rid, pending.call_id, arguments={"to": "a@b.c"})
    assert len(reg.pending_approvals(rid)) == 1
    assert reg.approve(rid, pending.call_id, arguments={"to": "a@b.c", "body": "hello"})
    reg.result(rid, WAIT)


def test_cancelled_run_reports_its_leftover_call_in_status(reg: RunRegistry) -> None:
    loop, asked = make_loop(call("send_email", to="a@b.c", body="hi"), reply("never"))
    rid = reg.start(loop, "mail")
    assert asked.asked.wait(WAIT)
    assert reg.cancel(rid, "stop")
    with pytest.raises(Cancelled):
        reg.result(rid, WAIT)
    status = reg.status(rid)
    assert status.state == "cancelled" and status.pending_approvals == ()
    assert [(d.approved, d.reason) for d in status.approvals] == [(False, "run cancelled")]
    kinds = [e["type"] for _, e in reg.events(rid, timeout=WAIT)]
    assert kinds[-1] == "run_end" and "approval_resolved" in kinds


def test_unknown_run_id_raises_key_error(reg: RunRegistry) -> None:
    with pytest.raises(KeyError):
        reg.pending_approvals("nope")
    with pytest.raises(KeyError):
        reg.approve("nope", "c")
    with pytest.raises(KeyError):
        reg.deny("nope", "c", "r")


def test_an_owned_runs_approvals_are_unknown_to_another_owner(reg: RunRegistry) -> None:
    loop, asked = make_loop(call("send_email", to="a@b.c", body="hi"), reply("ok"))
    rid = reg.start(loop, "mail", owner="alice")
    assert asked.asked.wait(WAIT)
    with pytest.raises(KeyError):
        reg.pending_approvals(rid, owner="mallory")
    [pending] = reg.pending_approvals(rid, owner="alice")
    with pytest.raises(KeyError):
        reg.approve(rid, pending.call_id, owner="mallory")
    with pytest.raises(KeyError):
        reg.deny(rid, pending.call_id, "no", owner="mallory")
    assert reg.approve(rid, pending.call_id, owner="alice", by="alice")
    reg.result(rid, WAIT, owner="alice")


def test_a_compacted_finished_run_has_nothing_pending_and_refuses_answers(reg: RunRegistry) -> None:
    loop, asked = make_loop(call("send_email", to="a@b.c", body="hi"), reply("ok"))
    rid = reg.start(loop, "mail")
    assert asked.asked.wait(WAIT)
    [pending] = reg.pending_approvals(rid)
    assert reg.deny(rid, pending.call_id, "no", by="ops")
    reg.result(rid, WAIT)
    reg.list()  # any access compacts a run whose thread is done
    assert reg.pending_approvals(rid) == []
    assert reg.approve(rid, pending.call_id) is False
    assert reg.deny(rid, pending.call_id, "again") is False
    assert [d.reason for d in reg.status(rid).approvals] == ["no"]
