"""Owners everywhere in ``CeleryRunRegistry``: the in-process registry's rule across processes.

Real redis-server and a real Celery worker process (``tests/celery_app.py``;
its ``pay`` tool waits for approval). A run started with ``owner=`` is, to
every other owner and to an unowned caller, an unknown id on every by-id
method; ``list`` shows only the given owner's runs (``owner=None``: only
unowned ones) and every owner's only with ``all_owners=True``.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all  # noqa: E402

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    from loopctl import LoopBusy
    from loopctl.contrib.celery import CeleryRunRegistry
    from loopctl.errors import ConfigError
    from tests import celery_app
    from tests.celery_app import plan_text

WAIT = 20.0


@pytest.fixture(scope="module")
def registry() -> Iterator[CeleryRunRegistry]:
    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        started.append(CeleryWorker(server.url(), "owners", concurrency=2))
        reg = celery_app.make_registry(celery_app.make_app(server.url()), server.url())
        yield reg
        reg.close()
    finally:
        stop_all(started)


def uid() -> str:
    return uuid.uuid4().hex[:12]


def wait_for_event(reg: CeleryRunRegistry, rid: str, kind: str, owner: str) -> Dict[str, Any]:
    for _, event in reg.events(rid, timeout=WAIT, owner=owner):
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind} event in run {rid}")


def test_an_owned_run_is_an_unknown_id_to_every_other_caller_and_absent_from_their_list(
    registry: CeleryRunRegistry,
) -> None:
    alice, bob = f"alice-{uid()}", f"bob-{uid()}"
    done_tag, pay_tag = uid(), uid()
    rid_done = registry.start(uid(), plan_text(done_tag, turns=1), owner=alice)
    registry.result(rid_done, timeout=WAIT, owner=alice)
    conv = uid()
    rid_pay = registry.start(conv, plan_text(pay_tag, turns=2, tool="pay"), owner=alice)
    requested = wait_for_event(registry, rid_pay, "approval_requested", alice)
    call_id = requested["call_id"]
    ops: List[Callable[[Any], Any]] = [
        lambda who: registry.status(rid_pay, owner=who),
        lambda who: registry.result(rid_pay, timeout=0.1, owner=who),
        lambda who: registry.steer(rid_pay, "hijack", owner=who),
        lambda who: registry.cancel(rid_pay, "hijack", owner=who),
        lambda who: registry.leftovers(rid_pay, owner=who),
        lambda who: registry.events(rid_pay, owner=who),
        lambda who: registry.pending_approvals(rid_pay, owner=who),
        lambda who: registry.approve(rid_pay, call_id, owner=who),
        lambda who: registry.deny(rid_pay, call_id, "no", owner=who),
    ]
    with pytest.raises(KeyError) as unknown:
        registry.status("nope-" + rid_pay[5:])
    for stranger in (bob, None):
        for op in ops:
            with pytest.raises(KeyError) as refused:
                op(stranger)
            assert str(refused.value).replace(rid_pay, "ID") == str(unknown.value).replace(
                "nope-" + rid_pay[5:], "ID"
            )
        listed = json.dumps([s.to_dict() for s in registry.list(owner=stranger)], default=str)
        assert rid_done not in listed and rid_pay not in listed and pay_tag not in listed
    # Another owner on the same conversation is told it is busy, not whose run it is.
    with pytest.raises(LoopBusy) as busy:
        registry.start(conv, plan_text(uid()), owner=bob)
    assert rid_pay not in str(busy.value)
    with pytest.raises(LoopBusy, match=rid_pay):
        registry.start(conv, plan_text(uid()), owner=alice)
    # The owner sees both, with the output, and the pending call's arguments.
    mine = {s.run_id: s for s in registry.list(owner=alice)}
    assert set(mine) == {rid_done, rid_pay}
    assert mine[rid_done].state == "completed" and done_tag in (mine[rid_done].output or "")
    assert registry.status(rid_pay, owner=alice).pending_approvals[0].arguments["tag"] == pay_tag
    assert registry.pending_approvals(rid_pay, owner=alice)[0].call_id == call_id
    assert {rid_done, rid_pay} <= {s.run_id for s in registry.list(all_owners=True)}
    # Nothing a stranger did reached the run: it still waits for alice.
    assert registry.deny(rid_pay, call_id, "test over", owner=alice) is True
    run = registry.result(rid_pay, timeout=WAIT, owner=alice)
    [decision] = run.approvals
    assert decision.approved is False and decision.reason == "test over"
    assert registry.leftovers(rid_pay, owner=alice) == []


def test_unowned_runs_are_listed_only_without_an_owner(registry: CeleryRunRegistry) -> None:
    rid = registry.start(uid(), plan_text(uid(), turns=1))
    registry.result(rid, timeout=WAIT)
    assert rid in {s.run_id for s in registry.list()}
    assert rid not in {s.run_id for s in registry.list(owner=f"carol-{uid()}")}
    assert registry.status(rid).state == "completed"
    with pytest.raises(KeyError):
        registry.status(rid, owner="carol")


@pytest.mark.parametrize("bad", [123, "", ("a", "b")])
def test_an_owner_must_be_a_non_empty_str(registry: CeleryRunRegistry, bad: Any) -> None:
    with pytest.raises(ConfigError, match="owner"):
        registry.start(uid(), plan_text(uid(), turns=1), owner=bad)
    with pytest.raises(ConfigError, match="owner"):
        registry.list(owner=bad)
