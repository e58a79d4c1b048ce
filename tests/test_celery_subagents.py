"""Sub-agents on Celery workers: cancel, approvals and events of the tree across processes.

Real redis-server and a real Celery worker process running
``tests.celery_subagents:make_delegating_loop`` (a parent that hands its
PLAN to a ``research`` sub-agent). The tests learn where the run is from
the event stream and the plan's Redis gates, never by sleeping.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, List

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all  # noqa: E402

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    import redis

    from loopctl import Cancelled
    from loopctl.contrib.celery import CeleryRunRegistry
    from tests import celery_app
    from tests.celery_app import plan_text

WAIT = 20.0
FACTORY = "tests.celery_subagents:make_delegating_loop"


class Cluster:
    def __init__(self, server: RedisServer) -> None:
        self.url = server.url()
        self.app = celery_app.make_app(self.url)
        self.sig = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=30)
        self.made: List[CeleryRunRegistry] = []

    def registry(self) -> CeleryRunRegistry:
        reg = celery_app.make_registry(self.app, self.url, FACTORY)
        self.made.append(reg)
        return reg


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        started.append(CeleryWorker(server.url(), "subagents", concurrency=2))
        c = Cluster(server)
        yield c
        for reg in c.made:
            reg.close()
        c.sig.close()
    finally:
        stop_all(started)


def uid() -> str:
    return uuid.uuid4().hex[:12]


def wait_for_event(reg: CeleryRunRegistry, rid: str, kind: str, subagent: str) -> Dict[str, Any]:
    for _, event in reg.events(rid, timeout=WAIT):
        if event["type"] == kind and event.get("subagent") == subagent:
            return event
    raise AssertionError(f"no {kind} event of sub-agent {subagent!r} in run {rid}")


def test_a_subagents_call_is_approved_through_another_celery_registry(cluster: Cluster) -> None:
    starter, approver = cluster.registry(), cluster.registry()
    tag = uid()
    rid = starter.start(uid(), plan_text(tag, turns=2, tool="pay"))
    requested = wait_for_event(approver, rid, "approval_requested", "research")
    [pending] = approver.pending_approvals(rid)
    assert (pending.call_id, pending.tool, pending.subagent) == (requested["call_id"], "pay", "research")
    assert approver.approve(rid, pending.call_id, by="ops") is True
    run = starter.result(rid, timeout=WAIT)
    assert run.output is not None and run.output.startswith(f"delegated: done {tag}")
    assert cluster.sig.llen(f"t:{tag}:paid") == 1
    kinds = [(e["type"], e.get("subagent")) for _, e in starter.events(rid, timeout=WAIT)]
    assert ("run_end", "research") in kinds and kinds[-1] == ("run_end", "")


def test_a_celery_cancel_stops_the_subagent_and_a_late_approval_returns_false(cluster: Cluster) -> None:
    reg = cluster.registry()
    tag = uid()
    rid = reg.start(uid(), plan_text(tag, turns=2, tool="pay"))
    requested = wait_for_event(reg, rid, "approval_requested", "research")
    assert reg.cancel(rid, "stop the tree")
    with pytest.raises(Cancelled, match="stop the tree"):
        reg.result(rid, timeout=WAIT)
    assert reg.approve(rid, requested["call_id"]) is False
    assert reg.status(rid).state == "cancelled"
    assert cluster.sig.llen(f"t:{tag}:paid") == 0
    ends = [e for _, e in reg.events(rid, timeout=WAIT) if e["type"] == "run_end"]
    assert [e.get("subagent") for e in ends][-1] == ""
    assert any(e.get("subagent") == "research" and e["error_type"] == "Cancelled" for e in ends)
