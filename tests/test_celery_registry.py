"""CeleryRunRegistry against a real redis-server and real Celery worker processes.

One redis-server (persistence off, free loopback port) and two workers
(``--pool threads``) serve the module; the kill test starts its own worker
on its own queue. Runs use the deterministic model of ``tests/celery_app.py``
(its reply depends only on the request); every interleaving is forced by
Redis-visible signals: a gated model call pushes ``t:<tag>:entered`` and
waits for ``t:<tag>:release:<turn>``; the timed factory pushes
``t:<conversation>:accepted`` when the worker's steering slot accepts a
message; a run started on a queue nobody consumes is "not picked up yet"
until the test moves its task message to the workers' queue.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:  # workers and this module import the test app as tests.celery_app
    sys.path.insert(0, _REPO)

from tests.celery_support import (  # noqa: E402
    CeleryWorker,
    RedisServer,
    free_port,
    missing_requirements,
    release_held,
    stop_all,
    wait_signal,
)

REASON = missing_requirements()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    import redis

    from loopctl import Cancelled, LoopBusy, LoopError, MaxTurnsExceeded, Message, RunConfig
    from loopctl.contrib.celery import TASK_NAME, CeleryRunRegistry, RegistryUnavailable, WorkerLost
    from loopctl.errors import ConfigError
    from tests import celery_app
    from tests.celery_app import HEARTBEAT_TTL, plan_text

WAIT = 20.0
TIMED = "tests.celery_app:make_timed_loop"
END_GATED = "tests.celery_app:make_end_gated_loop"


class Cluster:
    def __init__(self, server: RedisServer, workers: List[CeleryWorker]) -> None:
        self.server = server
        self.url = server.url()
        self.workers = workers
        self.app = celery_app.make_app(self.url)
        self.sig = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=30)
        self._made: List[CeleryRunRegistry] = []

    def registry(self, factory: str = "tests.celery_app:make_loop", **kw: Any) -> CeleryRunRegistry:
        reg = celery_app.make_registry(self.app, self.url, factory, **kw)
        self._made.append(reg)
        return reg

    def release(self, tag: str, turn: int) -> None:
        self.sig.rpush(f"t:{tag}:release:{turn}", "go")

    def entered(self, tag: str) -> int:
        return int(wait_signal(self.sig, f"t:{tag}:entered", WAIT))

    def accepted(self, conversation: str) -> str:
        return str(json.loads(wait_signal(self.sig, f"t:{conversation}:accepted", WAIT))["text"])

    def requests(self, tag: str) -> List[Dict[str, Any]]:
        return [json.loads(x) for x in self.sig.lrange(f"t:{tag}:requests", 0, -1)]

    def close(self) -> None:
        for reg in self._made:
            reg.close()
        self.sig.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        workers = []
        for name in ("w1", "w2"):
            w = CeleryWorker(server.url(), name, concurrency=4)
            started.append(w)
            workers.append(w)
        c = Cluster(server, workers)
        yield c
        c.close()
    finally:
        stop_all(started)


def uid() -> str:
    return uuid.uuid4().hex[:12]


def texts(messages: List[Message]) -> List[str]:
    return [m.text for m in messages]


def tool_pids(messages: List[Message]) -> List[int]:
    return [json.loads(p.output)["pid"] for m in messages for p in m.tool_results]


def well_formed(history: List[Message], tag: str, runs: int, turns: int) -> None:
    """PLAN, then (assistant call, user results) x (turns-1), then the answer; per run."""
    per = 2 * turns
    assert len(history) == runs * per
    for r in range(runs):
        chunk = history[r * per : (r + 1) * per]
        assert chunk[0].role == "user" and chunk[0].text.startswith("PLAN ")
        assert json.loads(chunk[0].text[5:])["tag"].startswith(tag)
        for k in range(turns - 1):
            ask, results = chunk[1 + 2 * k], chunk[2 + 2 * k]
            assert ask.role == "assistant" and len(ask.tool_calls) == 1
            assert [p.tool_call_id for p in results.tool_results] == [ask.tool_calls[0].id]
        assert chunk[-1].role == "assistant" and chunk[-1].text.startswith("done ")


# -- a run on a worker ------------------------------------------------------------------


def test_run_executes_in_a_worker_and_events_stream_back_in_order(cluster: Cluster) -> None:
    reg = cluster.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3))
    got = list(reg.events(rid, timeout=WAIT))
    seqs = [s for s, _ in got]
    types = [e["type"] for _, e in got]
    assert seqs == list(range(1, len(got) + 1))
    assert types[0] == "run_start" and types[-1] == "run_end" and types.count("run_end") == 1
    assert [e["turn"] for _, e in got if e["type"] == "turn_start"] == [0, 1, 2]
    assert types.count("tool_post") == 2
    assert {e["run_id"] for _, e in got} == {rid}
    assert got[-1][1]["success"] is True and got[-1][1]["total_turns"] == 3

    run = reg.result(rid, timeout=WAIT)
    assert run.id == rid and run.output == f"done {tag} turn=2 steers=0" and run.turn_count == 3
    st = reg.status(rid)
    assert (st.state, st.output, st.turns, st.tool_calls) == ("completed", run.output, 3, 2)
    assert st.ended_at is not None and st.ended_at >= st.started_at

    history = reg.history(conv)
    well_formed(history, tag, runs=1, turns=3)
    pids = set(tool_pids(history))
    assert pids <= {w.pid for w in cluster.workers} and os.getpid() not in pids

    # Resume after seq 5 from another "web process": the same dicts, nothing else.
    other = cluster.registry()
    assert list(other.events(rid, after=5, timeout=WAIT)) == got[5:]
    assert list(other.events(rid, after=len(got), timeout=WAIT)) == []

    # The conversation continues from the stored history.
    tag2 = uid()
    rid2 = other.start(conv, plan_text(tag2, turns=2))
    other.result(rid2, timeout=WAIT)
    after = reg.history(conv)
    assert after[:6] == history
    assert texts(after[6:])[0].startswith("PLAN ") and after[-1].text == f"done {tag2} turn=1 steers=0"
    assert {s.run_id for s in reg.list()} >= {rid, rid2}


def test_steer_from_a_second_registry_lands_at_the_next_boundary(cluster: Cluster) -> None:
    web1, web2 = cluster.registry(TIMED), cluster.registry(TIMED)
    conv, tag = uid(), uid()
    rid = web1.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert cluster.entered(tag) == 1
    assert web2.steer(rid, "go left")
    assert cluster.accepted(conv) == "go left"  # in the worker's slot, during turn 1's call
    cluster.release(tag, 1)
    run = web1.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=1"
    seen = {r["turn"]: r["steers"] for r in cluster.requests(tag)}
    assert seen == {0: [], 1: [], 2: ["go left"]}
    steering = [e for _, e in web2.events(rid, timeout=WAIT) if e["type"] == "steering"]
    assert [(e["turn"], [m["parts"][0]["text"] for m in e["messages"]]) for e in steering] == [
        (2, ["go left"])
    ]
    history = web1.history(conv)
    # After turn 1's tool results, before the answer.
    assert history[4].tool_results and history[5].text == "go left"
    assert web2.leftovers(rid) == []
    assert web2.steer(rid, "too late") is False


def test_cancel_from_a_third_registry_returns_cancelled_promptly(cluster: Cluster) -> None:
    web1, web3 = cluster.registry(), cluster.registry()
    conv, tag = uid(), uid()
    web1.result(web1.start(conv, plan_text(uid(), turns=1)), timeout=WAIT)
    before = web1.history(conv)
    rid = web1.start(conv, plan_text(tag, turns=3, gate=[1]))
    assert cluster.entered(tag) == 1
    t0 = time.monotonic()
    assert web3.cancel(rid, "user hit stop")
    with pytest.raises(Cancelled, match="user hit stop") as info:
        web1.result(rid, timeout=WAIT)
    latency = time.monotonic() - t0
    assert info.value.run is not None and info.value.run.id == rid
    st = web3.status(rid)
    assert st.state == "cancelled" and "user hit stop" in (st.error or "")
    end = list(web1.events(rid, timeout=WAIT))[-1][1]
    assert end["type"] == "run_end" and end["success"] is False
    assert web1.history(conv) == before
    assert web3.cancel(rid) is False and web3.steer(rid, "x") is False
    cluster.release(tag, 1)  # let the abandoned model call return
    # One cancel = one cancelled run: the next run on the conversation is clean.
    nxt = web1.start(conv, plan_text(uid(), turns=2))
    assert web1.result(nxt, timeout=WAIT).output is not None
    assert latency < WAIT  # prompt; the figure itself is measured by benchmarks/distributed.py


# -- races ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_cancel_before_pickup_yields_one_cancelled_run_without_a_model_call(
    cluster: Cluster, seed: int
) -> None:
    held = f"held-{uid()}"
    reg = cluster.registry(queue=held)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, record=True, count=True))
    assert reg.status(rid).state == "running"  # queued
    assert reg.cancel(rid, f"early {seed}")
    assert reg.cancel(rid, "again")  # still not picked up: accepted, same run
    assert release_held(cluster.sig, held) == 1
    with pytest.raises(Cancelled, match=f"early {seed}"):
        reg.result(rid, timeout=WAIT)
    assert [e["type"] for _, e in reg.events(rid, timeout=WAIT)] == ["run_start", "run_end"]
    assert cluster.requests(tag) == [] and cluster.sig.get(f"t:{tag}:tools") is None
    assert reg.history(conv) == []
    nxt = reg.start(conv, plan_text(uid(), turns=2))
    assert release_held(cluster.sig, held) == 1
    assert reg.result(nxt, timeout=WAIT).output is not None


def test_steers_before_pickup_are_delivered_at_the_first_boundary(cluster: Cluster) -> None:
    held = f"held-{uid()}"
    reg = cluster.registry(queue=held)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, record=True))
    for text in ("one", "two", "three"):
        assert reg.steer(rid, text)
    from loopctl.messages import Message, ToolCallPart

    with pytest.raises(ValueError, match="tool calls or results"):  # refused as in process, stored nowhere
        reg.steer(rid, Message.assistant("", tool_calls=(ToolCallPart("x", "t", {}),)))
    release_held(cluster.sig, held)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=1 steers=3"
    assert cluster.requests(tag)[0]["steers"] == ["one", "two", "three"]
    steering = [e for _, e in reg.events(rid, timeout=WAIT) if e["type"] == "steering"]
    assert [e["turn"] for e in steering] == [0] and len(steering[0]["messages"]) == 3
    assert texts(reg.history(conv))[:4] == [plan_text(tag, turns=2, record=True), "one", "two", "three"]
    assert reg.leftovers(rid) == []


def test_steer_during_the_final_model_call_comes_back_as_a_leftover(cluster: Cluster) -> None:
    reg = cluster.registry(TIMED)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, gate=[1], record=True))
    assert cluster.entered(tag) == 1
    assert reg.steer(rid, "too late for this answer")
    assert cluster.accepted(conv) == "too late for this answer"
    assert reg.leftovers(rid) == []  # in flight: nothing sealed yet
    cluster.release(tag, 1)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=1 steers=0"
    assert texts(reg.leftovers(rid)) == ["too late for this answer"]
    assert "too late for this answer" not in texts(reg.history(conv))
    assert reg.steer(rid, "after the end") is False
    assert texts(reg.leftovers(rid)) == ["too late for this answer"]


@pytest.mark.slow
@pytest.mark.parametrize("seed, turns", [(11, 3), (12, 6), (13, 12)])
def test_four_producers_x_100_steers_each_delivered_once_or_returned_once(
    cluster: Cluster, seed: int, turns: int
) -> None:
    rng = random.Random(seed)
    reg = cluster.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=turns, tool="work", ms=[rng.randint(1, 3)], gate=[0]))
    assert cluster.entered(tag) == 0
    producers = [cluster.registry() for _ in range(4)]
    accepted: List[List[str]] = [[] for _ in producers]
    refused: List[List[str]] = [[] for _ in producers]
    halfway = threading.Barrier(len(producers) + 1)
    split = rng.randint(10, 60)

    def produce(i: int) -> None:
        for j in range(100):
            if j == split:
                halfway.wait(WAIT)
            text = f"p{i}-{j:03d}"
            (accepted if producers[i].steer(rid, text) else refused)[i].append(text)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    halfway.wait(WAIT)
    cluster.release(tag, 0)  # the rest race the run's boundaries and its end
    for t in threads:
        t.join(WAIT)
    run = reg.result(rid, timeout=WAIT)
    assert run.output is not None
    history = texts(reg.history(conv))
    delivered = [t for t in history if t.startswith("p")]
    left = texts(reg.leftovers(rid))
    events = [e for _, e in reg.events(rid, timeout=WAIT) if e["type"] == "steering"]
    via_events = [m["parts"][0]["text"] for e in events for m in e["messages"]]
    assert via_events == delivered
    everything = delivered + left
    assert len(everything) == len(set(everything))  # nothing twice
    assert sorted(everything) == sorted(t for a in accepted for t in a)  # nothing lost
    assert not set(everything) & {t for r in refused for t in r}
    for i in range(4):  # each producer's order survives, delivered then returned
        mine = [t for t in everything if t.startswith(f"p{i}-")]
        assert mine == accepted[i]
    assert sum(map(len, accepted)) >= 4 * split  # the first part landed while gated


# -- a cancel against the run's end: True exactly when the run ends cancelled -------------------


@pytest.mark.parametrize("ends", ["completed", "failed"])
def test_a_cancel_past_the_runs_ending_point_returns_false_and_the_run_ends_as_it_would(
    cluster: Cluster, ends: str
) -> None:
    reg = cluster.registry(END_GATED)
    conv, tag = uid(), uid()
    config = RunConfig(max_turns=1) if ends == "failed" else None  # failed: max turns, at the ending point
    rid = reg.start(conv, plan_text(tag, turns=1 if ends == "completed" else 3, end_gate=True), config)
    assert wait_signal(cluster.sig, f"t:{tag}:end_entered", WAIT) == "0"  # in on_run_end, not recorded yet
    assert reg.status(rid).state == "running"
    assert reg.cancel(rid, "too late") is False
    assert reg.steer(rid, "too late too")  # accepted while it runs: returned once, as a leftover
    cluster.sig.rpush(f"t:{tag}:end_release:0", "go")
    if ends == "completed":
        run = reg.result(rid, timeout=WAIT)
        assert run.output == f"done {tag} turn=0 steers=0"
        st = reg.status(rid)
        assert (st.state, st.output, st.error) == ("completed", run.output, None)
        assert texts(reg.history(conv))[-1] == run.output
    else:
        with pytest.raises(MaxTurnsExceeded):
            reg.result(rid, timeout=WAIT)
        st = reg.status(rid)
        assert st.state == "failed" and "max turns" in (st.error or "")
    assert texts(reg.leftovers(rid)) == ["too late too"]
    assert reg.cancel(rid) is False


def test_the_ending_step_takes_a_stored_cancel_or_refuses_later_ones_until_a_handback(
    cluster: Cluster,
) -> None:
    held = f"held-{uid()}"  # nobody consumes it: this test claims the runs itself, as a worker would
    reg = cluster.registry(queue=held, resume="on_worker_loss")
    backend = reg._backend
    first = reg.start(uid(), plan_text(uid()))
    assert backend.claim(first, "token-1", 10_000, "test") is not None
    assert reg.cancel(first, "stored")
    assert backend.ending(first, "token-1") == (True, "stored")  # the run ends cancelled

    second = reg.start(uid(), plan_text(uid()))
    assert backend.claim(second, "token-2", 10_000, "test") is not None
    assert backend.ending(second, "another worker's token") == (False, None)  # fenced out: nothing marked
    assert reg.cancel(second, "not yet ending")  # still reaches it
    third = reg.start(uid(), plan_text(uid()))
    assert backend.claim(third, "token-3", 10_000, "test") is not None
    assert backend.ending(third, "token-3") == (False, None)
    assert reg.status(third).state == "running"
    assert reg.cancel(third, "too late") is False
    assert reg.steer(third, "still taken")  # the worker returns it as a leftover
    # Handed back (a warm shutdown), the run goes on from its checkpoint: cancels reach it again.
    assert backend.handback(third, "token-3", "test") == 1
    assert reg.cancel(third, "after the handback")
    with pytest.raises(Cancelled, match="after the handback"):
        reg.result(third, timeout=WAIT)
    assert texts(reg.leftovers(third)) == ["still taken"]
    cluster.sig.delete(held)


def test_a_cancel_stored_before_the_ending_point_ends_the_run_cancelled(cluster: Cluster) -> None:
    reg = cluster.registry()
    for i in range(10):  # the worker's bridge or its ending step sees it first: the same end
        conv, tag, rid = uid(), uid(), uid()
        reg.start(conv, plan_text(tag, turns=1, rid=rid, cancel_self=f"own {i}"), run_id=rid)
        with pytest.raises(Cancelled, match=f"own {i}"):
            reg.result(rid, timeout=WAIT)
        assert wait_signal(cluster.sig, f"t:{tag}:cancelled", WAIT) == "True"
        st = reg.status(rid)
        assert st.state == "cancelled" and st.output is None
        assert reg.history(conv) == []
        assert reg.cancel(rid) is False


def test_a_cancel_racing_the_runs_end_returns_true_exactly_when_it_ends_cancelled(cluster: Cluster) -> None:
    reg = cluster.registry()
    ends: List[str] = []
    for i in range(30):
        conv, tag = uid(), uid()
        rid = reg.start(conv, plan_text(tag, turns=1, gate=[0]))
        assert cluster.entered(tag) == 0
        cluster.release(tag, 0)  # the answer is on its way: the cancel below races its end
        for _ in range(i % 6):  # reads that move the cancel along the run's end, one more each time
            reg.status(rid)
        accepted = reg.cancel(rid, f"race {i}")
        try:
            run = reg.result(rid, timeout=WAIT)
        except Cancelled:
            ends.append("cancelled")
        else:
            assert run.output == f"done {tag} turn=0 steers=0"
            ends.append("completed")
        assert reg.status(rid).state == ends[-1]
        assert accepted == (ends[-1] == "cancelled"), (i, accepted, ends[-1])
    assert len(ends) == 30


# -- failure ------------------------------------------------------------------------------


def kill_bridge_connection(cluster: Cluster, rid: str) -> None:
    name = f"loopctl-bridge-{rid[:12]}"
    ids = [c["id"] for c in cluster.sig.client_list() if c.get("name") == name]
    assert ids, f"no connection named {name}"
    for cid in ids:
        cluster.sig.client_kill_filter(_id=cid)


def test_the_bridge_recovers_when_its_subscription_is_killed(cluster: Cluster) -> None:
    reg = cluster.registry(TIMED)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=4, gate=[1, 2], record=True))
    assert cluster.entered(tag) == 1
    kill_bridge_connection(cluster, rid)
    assert reg.steer(rid, "after the kill")
    assert cluster.accepted(conv) == "after the kill"
    cluster.release(tag, 1)
    assert cluster.entered(tag) == 2
    kill_bridge_connection(cluster, rid)
    assert reg.cancel(rid, "after another kill")
    with pytest.raises(Cancelled, match="after another kill"):
        reg.result(rid, timeout=WAIT)
    seen = {r["turn"]: r["steers"] for r in cluster.requests(tag)}
    assert seen[2] == ["after the kill"]
    assert reg.leftovers(rid) == []
    cluster.release(tag, 2)



@pytest.mark.slow
def test_killed_worker_fails_the_run_within_the_ttl_and_never_reruns_it(cluster: Cluster) -> None:
    queue = f"killq-{uid()}"
    victim = CeleryWorker(cluster.url, f"victim-{uid()}", queues=queue, concurrency=2)
    try:
        reg = cluster.registry(TIMED, queue=queue)
        shared = cluster.registry()
        conv, tag = uid(), uid()
        shared.result(shared.start(conv, plan_text(uid(), turns=1)), timeout=WAIT)
        before = shared.history(conv)
        rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], count=True))
        assert cluster.entered(tag) == 1
        assert cluster.sig.get(f"t:{tag}:tools") == "1"  # turn 0's tool ran: a side effect
        assert reg.steer(rid, "guidance for a doomed run")
        assert cluster.accepted(conv) == "guidance for a doomed run"
        with pytest.raises(LoopBusy):
            shared.start(conv, plan_text(uid()))
        killed_at = time.monotonic()
        victim.kill9()
        with pytest.raises(WorkerLost, match="worker lost") as info:
            reg.result(rid, timeout=HEARTBEAT_TTL * 6)
        detected = time.monotonic() - killed_at
        assert info.value.run is not None and info.value.run.id == rid
        assert detected <= HEARTBEAT_TTL + 3.0, detected  # the TTL plus one read slice, with slack
        st = shared.status(rid)
        assert st.state == "failed" and "worker lost" in (st.error or "")
        end = list(shared.events(rid, timeout=WAIT))[-1][1]
        assert end["type"] == "run_end" and end["success"] is False and "worker lost" in end["error"]
        assert end["error_type"] == "WorkerLost"
        assert shared.history(conv) == before
        assert texts(shared.leftovers(rid)) == ["guidance for a doomed run"]
        assert shared.cancel(rid) is False and shared.steer(rid, "x") is False
        # The lock was released: the next run on the conversation works.
        nxt = shared.start(conv, plan_text(uid(), turns=2))
        assert shared.result(nxt, timeout=WAIT).output is not None
        assert shared.history(conv)[: len(before)] == before
        # At-most-once: a redelivered task message finds the run not queued and skips it.
        assert shared.execute(rid, conv) == "skipped"
        cluster.app.send_task(TASK_NAME, kwargs={"run_id": rid, "prefix": "loopctl", "conversation": conv})
        follow = shared.start(conv, plan_text(uid(), turns=1))
        shared.result(follow, timeout=WAIT)
        assert cluster.sig.get(f"t:{tag}:tools") == "1" and shared.status(rid).state == "failed"
    finally:
        victim.stop()
        cluster.release(tag, 1)


@pytest.mark.slow
def test_two_workers_100_conversations_no_cross_talk(cluster: Cluster) -> None:
    reg = cluster.registry()
    convs = [f"c{i:03d}-{uid()}" for i in range(100)]
    for rnd in range(2):
        ids = {c: reg.start(c, plan_text(f"{c}-r{rnd}", turns=3)) for c in convs}
        for c, rid in ids.items():
            run = reg.result(rid, timeout=WAIT)
            assert run.output == f"done {c}-r{rnd} turn=2 steers=0"
    pids: set[int] = set()
    for c in convs:
        history = reg.history(c)
        well_formed(history, c, runs=2, turns=3)
        pids |= set(tool_pids(history))
    assert pids == {w.pid for w in cluster.workers}


# -- the worker's side in this process: threads, bad factories ------------------------------


def test_worker_threads_are_named_and_gone_when_the_run_ends(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPCTL_TEST_REDIS_URL", cluster.url)
    held = f"held-{uid()}"
    reg = cluster.registry(queue=held)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, gate=[1]))
    cluster.sig.delete(held)  # nobody else will run it: this process is the worker
    outcome: List[str] = []
    t = threading.Thread(target=lambda: outcome.append(reg.execute(rid, conv)))
    t.start()
    assert cluster.entered(tag) == 1
    names = {th.name for th in threading.enumerate()}
    assert f"loopctl-celery-bridge-{rid[:12]}" in names
    assert f"loopctl-celery-events-{rid[:12]}" in names
    assert reg.cancel(rid, "in-process")
    t.join(WAIT)
    assert outcome == ["cancelled"]
    cluster.release(tag, 1)
    with pytest.raises(Cancelled):
        reg.result(rid, timeout=WAIT)
    assert reg.execute(rid, conv) == "skipped"


def test_a_factory_that_ignores_the_history_fails_the_run_and_keeps_the_history(
    cluster: Cluster,
) -> None:
    good = cluster.registry()
    conv = uid()
    good.result(good.start(conv, plan_text(uid(), turns=1)), timeout=WAIT)
    before = good.history(conv)
    held = f"held-{uid()}"
    bad = cluster.registry("tests.celery_app:make_forgetful_loop", queue=held)
    rid = bad.start(conv, plan_text(uid(), turns=1))
    assert bad.steer(rid, "kept")
    release_held(cluster.sig, held)
    with pytest.raises(ConfigError, match="ignored the conversation's history"):
        bad.result(rid, timeout=WAIT)
    assert bad.status(rid).state == "failed"
    assert texts(bad.leftovers(rid)) == ["kept"]  # taken with the claim, returned
    assert [e["type"] for _, e in bad.events(rid, timeout=WAIT)][-1] == "run_end"
    assert good.history(conv) == before
    good.result(good.start(conv, plan_text(uid(), turns=1)), timeout=WAIT)  # lock released


# -- the registry's own contract -------------------------------------------------------------


def test_unknown_ids_busy_conversations_and_duplicate_ids(cluster: Cluster) -> None:
    held = f"held-{uid()}"
    reg = cluster.registry(queue=held)
    for call in (reg.status, reg.leftovers, reg.result, reg.cancel, reg.events):
        with pytest.raises(KeyError, match="nope"):
            call("nope")
    with pytest.raises(KeyError):
        reg.steer("nope", "x")
    conv = uid()
    rid = reg.start(conv, plan_text(uid(), turns=1), config=RunConfig(max_turns=5), run_id=f"r-{uid()}")
    with pytest.raises(LoopBusy, match=conv):
        reg.start(conv, plan_text(uid()))
    with pytest.raises(LoopError, match="already registered"):
        reg.start(uid(), "x", run_id=rid)
    with pytest.raises(TimeoutError):
        reg.result(rid, timeout=0.2)
    assert list(reg.events(rid, timeout=0.2)) == []
    release_held(cluster.sig, held)
    run = reg.result(rid, timeout=WAIT)
    assert run.id == rid and run.config == RunConfig(max_turns=5)
    with pytest.raises(ConfigError):
        reg.start("", "x")
    with pytest.raises(ConfigError, match="heartbeat_ttl"):
        cluster.registry(heartbeat_interval=1.0, heartbeat_ttl=1.5)
    with pytest.raises(ConfigError, match="loop_factory"):
        cluster.registry("no-colon")


def test_an_id_no_run_can_have_is_refused_at_start_and_unknown_everywhere(cluster: Cluster) -> None:
    # A run's keys are its id plus ":"-suffixes: "<id>:ev" would name another run's events.
    held = f"held-{uid()}"
    reg = cluster.registry(queue=held)
    rid = reg.start(uid(), plan_text(uid(), turns=1), run_id=f"r-{uid()}", owner="alice")
    for bad in (f"{rid}:ev", f"{rid}:done", "x:y"):
        with pytest.raises(ConfigError, match="without ':'"):
            reg.start(uid(), "x", run_id=bad)
    for probe in (f"{rid}:ev", f"{rid}:done", None, ("a", "b"), 7):
        for owner in ("alice", "mallory"):  # the same answer for every owner: nothing to probe
            for call in (reg.status, reg.leftovers, reg.result, reg.cancel, reg.events):
                with pytest.raises(KeyError):
                    call(probe, owner=owner)  # type: ignore[operator]
            with pytest.raises(KeyError):
                reg.steer(probe, "x", owner=owner)  # type: ignore[arg-type]
    release_held(cluster.sig, held)
    assert reg.result(rid, timeout=WAIT, owner="alice").id == rid


def test_a_consumer_behind_the_buffer_gets_a_gap_then_the_rest(cluster: Cluster) -> None:
    reg = cluster.registry(event_buffer=8)
    rid = reg.start(uid(), plan_text(uid(), turns=5))
    reg.result(rid, timeout=WAIT)
    got = list(reg.events(rid, timeout=WAIT))
    seq0, gap = got[0]
    assert gap["type"] == "gap" and gap["run_id"] == rid and gap["session_id"]
    rest = [s for s, _ in got[1:]]
    assert len(rest) == 8 and rest == list(range(seq0 + 1, seq0 + 9))
    assert gap["dropped"] == seq0 and got[-1][1]["type"] == "run_end"


@pytest.mark.parametrize("cancelled", [False, True], ids=["fails", "cancel-taken"])
def test_a_run_nobody_picks_up_ends_at_queue_timeout_and_frees_the_conversation(
    cluster: Cluster, cancelled: bool
) -> None:
    # It fails; but one cancel = one cancelled run: a cancel that returned True is how it
    # ends, even when it ends because no worker came (the same step ends a lost worker's run).
    held = f"held-{uid()}"
    reg = cluster.registry(queue=held, queue_timeout=0.3)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=1, record=True))
    assert reg.steer(rid, "never heard")
    if cancelled:
        assert reg.cancel(rid, "user pressed stop") is True
    with pytest.raises(Cancelled if cancelled else LoopError, match="user pressed stop" if cancelled else "queue_timeout"):
        reg.result(rid, timeout=WAIT)  # the lock's expiry is seen at the next read slice
    assert reg.status(rid).state == ("cancelled" if cancelled else "failed")
    assert reg.cancel(rid) is False
    assert texts(reg.leftovers(rid)) == ["never heard"]
    assert [e["type"] for _, e in reg.events(rid, timeout=WAIT)] == ["run_end"]
    assert reg.execute(rid, conv) == "skipped"  # a late pickup never runs it
    assert cluster.requests(tag) == []
    cluster.sig.delete(held)
    nxt = cluster.registry().start(conv, plan_text(uid(), turns=1))
    assert reg.result(nxt, timeout=WAIT).output is not None


def test_a_cancel_taken_while_the_loop_factory_fails_ends_the_run_cancelled(cluster: Cluster) -> None:
    reg = cluster.registry("tests.celery_app:make_failing_loop")
    conv = uid()
    rid = reg.start(conv, "hi")
    assert cluster.sig.blpop([f"t:{conv}:factory"], timeout=WAIT)  # the worker is inside the factory
    assert reg.steer(rid, "kept")
    assert reg.cancel(rid, "stop") is True
    cluster.sig.rpush(f"t:{conv}:factory:go", "1")
    with pytest.raises(Cancelled, match="stop"):
        reg.result(rid, timeout=WAIT)
    assert reg.status(rid).state == "cancelled" and texts(reg.leftovers(rid)) == ["kept"]


def test_an_unreachable_broker_fails_start_at_once_and_frees_the_conversation(cluster: Cluster) -> None:
    app = celery_app.make_app(f"redis://127.0.0.1:{free_port()}/0")
    reg = celery_app.make_registry(app, cluster.url)
    conv = uid()
    with pytest.raises(RegistryUnavailable, match="Celery broker"):
        reg.start(conv, plan_text(uid(), turns=1))
    [failed] = [s for s in reg.list() if s.state == "failed" and "Celery broker" in (s.error or "")][-1:]
    assert failed.ended_at is not None
    ok = cluster.registry()
    assert ok.result(ok.start(conv, plan_text(uid(), turns=1)), timeout=WAIT).output is not None
    reg.close()


def _every_call(reg: Any) -> List[Tuple[str, Any]]:
    """Each registry call that needs Redis, named."""
    return [
        ("start", lambda: reg.start("c", "x")),
        ("status", lambda: reg.status("r")),
        ("steer", lambda: reg.steer("r", "x")),
        ("cancel", lambda: reg.cancel("r")),
        ("result", lambda: reg.result("r", timeout=5)),
        ("events", lambda: list(reg.events("r"))),
        ("list", reg.list),
    ]


def test_redis_unreachable_is_a_clear_error_never_a_hang(cluster: Cluster) -> None:
    port = free_port()  # nothing listens there
    # redis-py reads a password from "user:password@" and from a "?password=" query parameter.
    for url in (f"redis://:sekrit@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0?password=sekrit-query"):
        reg = celery_app.make_registry(cluster.app, url, socket_timeout=0.5)
        for name, fn in _every_call(reg):
            with pytest.raises(RegistryUnavailable) as info:
                fn()
            assert isinstance(info.value, LoopError)
            assert f"127.0.0.1:{port}" in str(info.value) and "sekrit" not in str(info.value), (name, str(info.value))
        assert "sekrit" not in repr(reg)
        reg.close()
    # A malformed URL is the registry's error too, naming nothing of the password.
    with pytest.raises(RegistryUnavailable) as bad:
        celery_app.make_registry(cluster.app, "redis://:sekrit@127.0.0.1:badport/0", socket_timeout=0.5)
    assert "sekrit" not in str(bad.value)

    # A server that accepts and never answers: the socket timeout bounds every call.
    with socket.socket() as black:
        black.bind(("127.0.0.1", 0))
        black.listen(16)
        silent = celery_app.make_registry(
            cluster.app, f"redis://127.0.0.1:{black.getsockname()[1]}/0", socket_timeout=0.3
        )
        t0 = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="Timeout"):
            silent.status("r")
        assert time.monotonic() - t0 < 5.0
        silent.close()
