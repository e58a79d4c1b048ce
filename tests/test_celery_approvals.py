"""Approvals across processes: a call waits on a Celery worker; other registries answer it.

Real redis-server, real Celery worker processes (``tests/celery_app.py``'s
``pay`` tool needs approval and pushes ``t:<tag>:paid`` when it runs). The
test learns that a call is waiting by following the run's event stream (a
blocking read), never by polling.
"""

from __future__ import annotations

import sys
import time
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

    from loopctl.contrib.celery import CeleryRunRegistry, WorkerLost
    from tests import celery_app
    from tests.celery_app import HEARTBEAT_TTL, plan_text

WAIT = 20.0


class Cluster:
    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.url = server.url()
        self.app = celery_app.make_app(self.url)
        self.sig = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=30)
        self.made: List[CeleryRunRegistry] = []

    def registry(self, **kw: Any) -> CeleryRunRegistry:
        reg = celery_app.make_registry(self.app, self.url, **kw)
        self.made.append(reg)
        return reg


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        started.append(CeleryWorker(server.url(), "appr", concurrency=4))
        c = Cluster(server)
        yield c
        for reg in c.made:
            reg.close()
        c.sig.close()
    finally:
        stop_all(started)


def uid() -> str:
    return uuid.uuid4().hex[:12]


def wait_for_event(reg: CeleryRunRegistry, rid: str, kind: str, after: int = 0) -> tuple[int, Dict[str, Any]]:
    for seq, event in reg.events(rid, after=after, timeout=WAIT):
        if event["type"] == kind:
            return seq, event
    raise AssertionError(f"no {kind} event in run {rid}")


def test_approve_from_another_registry_runs_the_call_on_the_worker(cluster: Cluster) -> None:
    starter, approver = cluster.registry(), cluster.registry()
    tag = uid()
    rid = starter.start(uid(), plan_text(tag, turns=2, tool="pay"))
    _, requested = wait_for_event(approver, rid, "approval_requested")
    [pending] = approver.pending_approvals(rid)
    assert (pending.call_id, pending.tool, pending.run_id) == (requested["call_id"], "pay", rid)
    assert pending.arguments["tag"] == tag
    assert [p.call_id for p in starter.status(rid).pending_approvals] == [pending.call_id]
    with pytest.raises(ValueError, match="i"):
        approver.approve(rid, pending.call_id, arguments={"i": "one", "tag": tag})
    assert approver.approve(rid, pending.call_id, by="ops") is True
    assert starter.approve(rid, pending.call_id, by="ops") is False  # answered once
    run = starter.result(rid, timeout=WAIT)
    assert cluster.sig.llen(f"t:{tag}:paid") == 1
    [d] = run.approvals
    assert (d.call_id, d.approved, d.by) == (pending.call_id, True, "ops")
    kinds = [e["type"] for _, e in starter.events(rid, timeout=WAIT)]
    assert kinds.index("approval_requested") < kinds.index("approval_resolved") < kinds.index("tool_pre")
    status = approver.status(rid)
    assert status.pending_approvals == () and [a.by for a in status.approvals] == ["ops"]
    assert approver.pending_approvals(rid) == []


def test_deny_from_another_registry_never_runs_the_call(cluster: Cluster) -> None:
    starter, approver = cluster.registry(), cluster.registry()
    tag = uid()
    rid = starter.start(uid(), plan_text(tag, turns=2, tool="pay"))
    _, requested = wait_for_event(approver, rid, "approval_requested")
    assert approver.deny(rid, requested["call_id"], "not today", by="ops") is True
    run = starter.result(rid, timeout=WAIT)
    assert cluster.sig.llen(f"t:{tag}:paid") == 0
    [d] = run.approvals
    assert (d.approved, d.reason) == (False, "not today")
    _, resolved = wait_for_event(starter, rid, "approval_resolved")
    assert resolved["approved"] is False and resolved["tool"] == "pay"
    assert approver.deny(rid, requested["call_id"], "again") is False
    with pytest.raises(KeyError):
        approver.approve("no-such-run", "c")


def test_a_worker_lost_while_a_call_waits_fails_the_run_like_any_lost_run(cluster: Cluster) -> None:
    queue = f"apprq-{uid()}"
    victim = CeleryWorker(cluster.url, f"victim-{uid()}", queues=queue, concurrency=2)
    try:
        reg = cluster.registry(queue=queue)
        tag = uid()
        rid = reg.start(uid(), plan_text(tag, turns=2, tool="pay"))
        _, requested = wait_for_event(reg, rid, "approval_requested")
        assert len(reg.pending_approvals(rid)) == 1
        killed_at = time.monotonic()
        victim.kill9()
        with pytest.raises(WorkerLost, match="worker lost"):
            reg.result(rid, timeout=HEARTBEAT_TTL * 6)
        assert time.monotonic() - killed_at <= HEARTBEAT_TTL + 3.0
        assert reg.status(rid).state == "failed"
        assert reg.pending_approvals(rid) == [] and reg.status(rid).pending_approvals == ()
        assert reg.approve(rid, requested["call_id"]) is False
        assert cluster.sig.llen(f"t:{tag}:paid") == 0
    finally:
        victim.stop()
