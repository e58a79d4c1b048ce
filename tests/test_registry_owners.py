"""Owners everywhere in ``RunRegistry``: ``list`` keeps the by-id methods' rule.

A run started with ``owner=`` is listed only for that owner; ``owner=None``
lists only runs started without one; every owner's runs only with the
explicit ``all_owners=True``. Nothing of another owner's run (its id, its
output, its pending approval's arguments) reaches a listing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support import WAIT

from loopctl import BareLoop, tool
from loopctl.hosting.registry import RunRegistry
from loopctl.observers import ApprovalRequested, Observer
from loopctl.testing import ScriptedClient, call, reply


@tool(requires_approval=True)
def pay(to: str, amount: int) -> str:
    """Pay someone.

    Args:
        to: who gets the money.
        amount: how much.
    """
    return f"paid {to} {amount}"


class Asked(Observer):
    def __init__(self) -> None:
        self.asked = threading.Event()

    def on_approval_requested(self, event: ApprovalRequested) -> None:
        self.asked.set()


@pytest.fixture
def reg() -> Iterator[RunRegistry]:
    r = RunRegistry()
    yield r
    r.close()


def _text(statuses: Any) -> str:
    return json.dumps([s.to_dict() for s in statuses], default=str)


def test_list_shows_each_owner_only_their_runs_outputs_and_pending_arguments(reg: RunRegistry) -> None:
    done = BareLoop(ScriptedClient([reply("alice's secret answer")]))
    rid_done = reg.start(done, "hi", owner="alice")
    reg.result(rid_done, WAIT, owner="alice")
    waiting = BareLoop(ScriptedClient([call("pay", to="mallory-account-991", amount=9999), reply("ok")]), [pay])
    asked = Asked()
    waiting.register_observer(asked)
    rid_wait = reg.start(waiting, "pay", owner="alice")
    assert asked.asked.wait(WAIT)
    plain = BareLoop(ScriptedClient([reply("nobody's")]))
    rid_plain = reg.start(plain, "hi")
    reg.result(rid_plain, WAIT)
    try:
        mine = reg.list(owner="alice")
        assert [s.run_id for s in mine] == [rid_done, rid_wait]
        assert mine[0].output == "alice's secret answer"
        assert mine[1].pending_approvals[0].arguments == {"to": "mallory-account-991", "amount": 9999}
        for stranger in ("bob", None):
            seen = reg.list(owner=stranger)
            text = _text(seen)
            assert rid_done not in text and rid_wait not in text
            assert "secret answer" not in text and "mallory-account-991" not in text
        assert [s.run_id for s in reg.list(owner="bob")] == []
        # No owner: only the runs started without one (the by-id methods' rule).
        assert [s.run_id for s in reg.list()] == [rid_plain]
        assert [s.run_id for s in reg.list(all_owners=True)] == [rid_done, rid_wait, rid_plain]
    finally:
        [pending] = reg.pending_approvals(rid_wait, owner="alice")
        reg.deny(rid_wait, pending.call_id, "test over", owner="alice")
        reg.result(rid_wait, WAIT, owner="alice")
        done.close()
        waiting.close()
        plain.close()


def test_list_filters_owners_by_equality_like_the_by_id_methods(reg: RunRegistry) -> None:
    # Any hashable owner works, compared by equality, never by truthiness.
    loops = [BareLoop(ScriptedClient([reply(str(i))])) for i in range(3)]
    try:
        rids = [reg.start(loop, "hi", owner=who) for loop, who in zip(loops, (0, ("org", 7), ""))]
        for rid, who in zip(rids, (0, ("org", 7), "")):
            reg.result(rid, WAIT, owner=who)
            assert [s.run_id for s in reg.list(owner=who)] == [rid]
            assert reg.status(rid, owner=who).run_id == rid
        assert reg.list() == []
    finally:
        for loop in loops:
            loop.close()


def test_owners_that_compare_equal_across_types_are_different_owners(reg: RunRegistry) -> None:
    # 0 == False == 0.0 and 1 == True in Python; a user id 0 is not the flag False.
    loops = [BareLoop(ScriptedClient([reply(str(i))])) for i in range(2)]
    try:
        zero = reg.start(loops[0], "hi", owner=0)
        one = reg.start(loops[1], "hi", owner=True)
        assert reg.result(zero, WAIT, owner=0).output == "0"
        assert reg.result(one, WAIT, owner=True).output == "1"
        for rid, strangers in ((zero, (False, 0.0, None)), (one, (1, 1.0))):
            for who in strangers:
                with pytest.raises(KeyError):
                    reg.status(rid, owner=who)
                assert reg.list(owner=who) == []
        assert [s.run_id for s in reg.list(owner=0)] == [zero]
    finally:
        for loop in loops:
            loop.close()


def test_list_all_owners_must_be_a_bool(reg: RunRegistry) -> None:
    with pytest.raises(TypeError, match="all_owners"):
        reg.list(all_owners="yes")  # type: ignore[arg-type]
