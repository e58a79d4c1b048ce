"""Sub-agents on Celery workers: cancel, approvals and events of the tree across processes.

Real redis-server and a real Celery worker process running
``tests.celery_subagents:make_delegating_loop`` (a parent that hands its
PLAN to a ``research`` sub-agent). The tests learn where the run is from
the event stream and the plan's Redis gates, never by sleeping; the steer
tests' factory also signals each guidance a steering slot accepts on the
worker (``t:<conversation>:accepted``, the sub-agent's on
``t:<conversation>-research:accepted``).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, List

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.celery_support import (  # noqa: E402
    CeleryWorker,
    RedisServer,
    missing_requirements,
    release_held,
    stop_all,
    wait_signal,
)

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    import redis

    from loopctl import BareLoop, Cancelled, Message
    from loopctl.contrib.celery import CeleryRunRegistry
    from loopctl.contrib.celery.bridge import SteerFeed
    from loopctl.contrib.celery.durable import checkpoint_from_json, checkpoint_to_json
    from loopctl.contrib.celery.steers import (
        check_target,
        settled_prefix,
        steer_from_json,
        steer_json,
    )
    from loopctl.driver.checkpoint import Checkpoint
    from loopctl.errors import ConfigError
    from loopctl.testing import ScriptedClient, call, reply
    from tests import celery_app
    from tests.celery_app import plan_text
    from tests.support import GatedReply

WAIT = 20.0
FACTORY = "tests.celery_subagents:make_delegating_loop"
TIMED = "tests.celery_subagents:make_delegating_timed_loop"


class Cluster:
    def __init__(self, server: RedisServer) -> None:
        self.url = server.url()
        self.app = celery_app.make_app(self.url)
        self.sig = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=30)
        self.made: List[CeleryRunRegistry] = []

    def registry(self, factory: str = FACTORY, **kw: Any) -> CeleryRunRegistry:
        reg = celery_app.make_registry(self.app, self.url, factory, **kw)
        self.made.append(reg)
        return reg

    def entered(self, tag: str) -> int:
        return int(wait_signal(self.sig, f"t:{tag}:entered", WAIT))

    def release(self, tag: str, turn: int) -> None:
        self.sig.rpush(f"t:{tag}:release:{turn}", "go")

    def accepted(self, key: str) -> str:
        """The next text a steering slot accepted on the worker (``key``: the loop's conversation)."""
        return str(json.loads(wait_signal(self.sig, f"t:{key}:accepted", WAIT))["text"])

    def requests(self, tag: str) -> List[Dict[str, Any]]:
        return [json.loads(x) for x in self.sig.lrange(f"t:{tag}:requests", 0, -1)]


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


# -- steer(..., to=) ----------------------------------------------------------------------------


def steering_events(reg: CeleryRunRegistry, rid: str) -> List[Any]:
    """``(subagent, turn, texts)`` of the run's ``steering`` events, in order."""
    return [
        (e.get("subagent"), e["turn"], [m["parts"][0]["text"] for m in e["messages"]])
        for _, e in reg.events(rid, timeout=WAIT)
        if e["type"] == "steering"
    ]


def user_texts(reg: CeleryRunRegistry, conv: str) -> List[str]:
    return [m.text for m in reg.history(conv) if m.role == "user" and not m.tool_results]


def test_steer_to_a_subagent_lands_at_its_next_boundary_not_the_parents(cluster: Cluster) -> None:
    starter, web = cluster.registry(TIMED), cluster.registry(TIMED)
    conv, tag = uid(), uid()
    rid = starter.start(conv, plan_text(tag, turns=2, gate=[0], record=True))
    assert cluster.entered(tag) == 0  # the sub-agent's first model call is in flight
    assert web.steer(rid, "look left", to="research") is True
    assert cluster.accepted(conv + "-research") == "look left"  # in the sub-agent's slot, on the worker
    cluster.release(tag, 0)
    run = starter.result(rid, timeout=WAIT)
    assert run.output == f"delegated: done {tag} turn=1 steers=1"
    assert {r["turn"]: r["steers"] for r in cluster.requests(tag)} == {0: [], 1: ["look left"]}
    assert steering_events(web, rid) == [("research", 1, ["look left"])]
    assert "look left" not in user_texts(web, conv)  # never the parent's
    assert web.leftovers(rid) == []


def test_steer_without_to_still_goes_to_the_parent(cluster: Cluster) -> None:
    reg = cluster.registry(TIMED)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, gate=[0], record=True))
    assert cluster.entered(tag) == 0
    assert reg.steer(rid, "parent only") is True
    assert cluster.accepted(conv) == "parent only"  # the parent's slot, while its sub-agent runs
    cluster.release(tag, 0)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"delegated: done {tag} turn=1 steers=0"
    assert {r["turn"]: r["steers"] for r in cluster.requests(tag)} == {0: [], 1: []}
    assert steering_events(reg, rid) == [("", 1, ["parent only"])]
    assert user_texts(reg, conv)[-1] == "parent only"
    assert reg.leftovers(rid) == []


def test_steer_to_no_subagent_in_flight_comes_back_as_leftovers_never_to_the_parent(cluster: Cluster) -> None:
    reg = cluster.registry(TIMED)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, gate=[0], record=True))
    assert cluster.entered(tag) == 0
    assert reg.steer(rid, "for nobody", to="nobody") is True  # accepted: only the worker knows
    assert reg.steer(rid, "for a grandchild", to="research/search") is True  # research has none
    assert reg.steer(rid, "marker") is True
    # The worker takes steers in order: once the marker is in the parent's slot, both were refused.
    assert cluster.accepted(conv) == "marker"
    cluster.release(tag, 0)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"delegated: done {tag} turn=1 steers=0"
    assert {r["turn"]: r["steers"] for r in cluster.requests(tag)} == {0: [], 1: []}
    assert steering_events(reg, rid) == [("", 1, ["marker"])]
    assert reg.leftovers(rid) == [Message.user("for nobody"), Message.user("for a grandchild")]
    assert reg.steer(rid, "after the end", to="research") is False


def test_steer_to_a_subagent_before_pickup_is_a_leftover_and_the_parents_lands_first(cluster: Cluster) -> None:
    held = f"held-{uid()}"  # no worker consumes it until the task message is moved
    reg = cluster.registry(TIMED, queue=held)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, record=True))
    assert reg.steer(rid, "early for research", to="research") is True
    assert reg.steer(rid, "early for the parent") is True
    assert release_held(cluster.sig, held) == 1
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"delegated: done {tag} turn=1 steers=0"
    assert [r["steers"] for r in cluster.requests(tag)] == [[], []]
    assert steering_events(reg, rid) == [("", 0, ["early for the parent"])]
    assert reg.leftovers(rid) == [Message.user("early for research")]  # no sub-agent ran yet


def test_steer_to_checks_the_owner_and_the_path(cluster: Cluster) -> None:
    reg = cluster.registry()
    tag = uid()
    rid = reg.start(uid(), plan_text(tag, turns=1), owner="alice")
    with pytest.raises(KeyError, match=rid):
        reg.steer(rid, "hijack", owner="mallory", to="research")
    with pytest.raises(KeyError, match=rid):
        reg.steer(rid, "hijack", to="research")
    for bad in ("", "/research", "research/", "research//search", 3):
        with pytest.raises(ConfigError, match=f"got {bad!r}"):
            reg.steer(rid, "x", owner="alice", to=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="to="):
        reg.steer(rid, "x", owner="alice", to="a//b")
    with pytest.raises(KeyError):  # an unknown id is a KeyError first, as in process
        reg.steer("no-such-run", "x", to="a//b")
    reg.result(rid, timeout=WAIT, owner="alice")
    assert reg.steer(rid, "late", owner="alice", to="research") is False
    assert reg.leftovers(rid, owner="alice") == []


def test_a_durable_runs_checkpoint_counts_sub_agent_guidance_as_taken(cluster: Cluster) -> None:
    # The checkpoint's steer count is where a resumed run starts feeding guidance again: the
    # sub-agent's guidance before the parent's own must not make a resume feed the parent's twice.
    reg = cluster.registry(TIMED)
    conv, tag = uid(), uid()
    plan = plan_text(tag, turns=2, gate=[0], record=True, delegations=2)
    rid = reg.start(conv, plan, resume="on_worker_loss")
    assert cluster.entered(tag) == 0  # the first delegation's sub-agent run
    assert reg.steer(rid, "sub first", to="research") is True
    assert cluster.accepted(conv + "-research") == "sub first"
    assert reg.steer(rid, "parent second") is True
    assert cluster.accepted(conv) == "parent second"
    cluster.release(tag, 0)
    # The second delegation starts after the checkpoint of the parent's turn 1 (write-ahead).
    assert cluster.entered(tag) == 0
    checkpoint = json.loads(cluster.sig.hget(f"loopctl:run:{rid}", "ckpt"))
    assert (checkpoint["after"], checkpoint["steers"]) == ("model", 2)
    cluster.release(tag, 0)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"delegated: done {tag} turn=1 steers=0"
    assert [(r["turn"], r["steers"]) for r in cluster.requests(tag)] == [
        (0, []), (1, ["sub first"]), (0, []), (1, []),
    ]
    assert steering_events(reg, rid) == [("research", 1, ["sub first"]), ("", 1, ["parent second"])]
    assert json.loads(cluster.sig.hget(f"loopctl:run:{rid}", "ckpt"))["steers"] == 2
    assert reg.leftovers(rid) == []


def test_the_stored_steer_form_carries_the_target_and_reads_old_entries() -> None:
    m = Message.user("go")
    assert steer_from_json(steer_json(m)) == (m, None)
    assert steer_from_json(steer_json(m, "research/search")) == (m, "research/search")
    assert steer_from_json(json.dumps(m.to_dict())) == (m, None)  # stored before targets existed
    with pytest.raises(ConfigError, match="'a//b'"):
        steer_from_json(json.dumps({"to": "a//b", "message": m.to_dict()}))
    assert check_target(None) is None and check_target("a/b") == "a/b"
    # One flag per steer taken: True settled when taken (for a sub-agent), False the run's own.
    assert settled_prefix([], 0) == 0
    assert settled_prefix([False, False], 1) == 1
    assert settled_prefix([True, False, True, False], 1) == 3
    assert settled_prefix([True, False, True, False], 2) == 4
    assert settled_prefix([False, True], 0) == 0


def test_a_checkpoint_carries_refused_sub_agent_guidance_until_the_leftovers() -> None:
    # A steer for a sub-agent not in flight is settled when taken (never fed to the run again),
    # yet owed to the leftovers: the checkpoint carries it, so a worker's crash cannot lose it.
    feed = SteerFeed(BareLoop(ScriptedClient([])).steering(), [(Message.user("early"), "research")])
    feed.contribute(None)  # the run's first boundary, no handle: the sub-agent's guidance is refused
    feed.deliver([(Message.user("own"), None), (Message.user("late"), "nobody"), None])
    assert feed.settled(0) == (1, [(Message.user("early"), "research")])  # "late" is after "own"
    assert feed.settled(1) == (4, [(Message.user("early"), "research"), (Message.user("late"), "nobody")])
    count, kept = feed.settled(1)
    cp = Checkpoint("tools", (), 1, (), (), None)
    saved = checkpoint_from_json(checkpoint_to_json(cp, 7 + count, kept=kept))
    assert (saved.checkpoint, saved.steers, saved.kept) == (cp, 11, tuple(kept))
    # The resumed attempt's feed returns them once, after what it refuses itself.
    again = SteerFeed(BareLoop(ScriptedClient([])).steering(), [(Message.user("new"), "x")], saved.kept)
    again.contribute(None)
    assert again.settled(0) == (1, [*saved.kept, (Message.user("new"), "x")])
    assert [m.text for m in again.leftovers()] == ["early", "late", "new"]
    assert again.leftovers() == []
    # A checkpoint written before this field existed reads as carrying nothing.
    old = json.loads(checkpoint_to_json(cp, 3))
    del old["kept"]
    assert checkpoint_from_json(json.dumps(old)).kept == ()


def test_sub_agent_guidance_not_tried_yet_is_owed_by_a_checkpoint_taken_before_the_attach() -> None:
    # A resumed run can reach a checkpoint (a re-answered tool wave) before its start is
    # attached: the claimed sub-agent guidance is settled, not tried, and still owed.
    steering = BareLoop(ScriptedClient([])).steering()
    early = Message.user("for research")
    feed = SteerFeed(steering, [(early, "research"), (Message.user("own"), None)])
    assert feed.settled(0) == (1, [(early, "research")])
    assert feed.settled(1) == (2, [(early, "research")])


def test_leftovers_come_back_in_the_order_the_steers_were_taken() -> None:
    loop = BareLoop(ScriptedClient([]))
    feed = SteerFeed(loop.steering(), [], kept=[(Message.user("kept"), "gone")])
    feed.deliver([(Message.user("sub 1"), "nobody")])  # refused at once: no run started
    feed.deliver([(Message.user("own 2"), None), (Message.user("sub 3"), "nobody")])
    feed.deliver([(Message.user("own 4"), None)])
    # The run ended before its first boundary: the run's own guidance never left pending.
    assert [m.text for m in feed.leftovers()] == ["kept", "sub 1", "own 2", "sub 3", "own 4"]


def test_guidance_a_sub_agent_handed_back_is_owed_by_the_next_checkpoint() -> None:
    # Handed to the sub-agent's run, which ended before reaching it: it is back in the
    # parent's sealed guidance, in memory only, so the checkpoint must carry it.
    child_gate = GatedReply(reply("child done"))
    parent_gate = GatedReply(reply("done"))
    child = BareLoop(ScriptedClient([child_gate]))
    parent = BareLoop(ScriptedClient([call("research", task="t"), parent_gate]), tools=[child.as_tool("research", "r")])
    feed = SteerFeed(parent.steering(), [])
    handle = parent.start("go")
    try:
        feed.attach(handle)
        child_gate.wait_entered()
        nobody = Message.user("for nobody")
        guidance = Message.user("for research")
        feed.deliver([(nobody, "nobody")])  # refused at once
        feed.deliver([(guidance, "research")])
        assert feed.settled(0) == (2, [(nobody, "nobody")])  # "research" may still reach its guidance
        child_gate.release.set()
        parent_gate.wait_entered()  # the sub-agent's run ended without reaching it
        assert feed.settled(0) == (2, [(nobody, "nobody"), (guidance, "research")])
    finally:
        child_gate.release.set()
        parent_gate.release.set()
    assert handle.result(20).output == "done"
    assert feed.leftovers() == [nobody, guidance]  # as taken, though the slot's come before the refused
