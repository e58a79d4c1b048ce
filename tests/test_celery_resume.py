"""Durable runs: a run outlives its worker (kill -9, SIGTERM) and resumes on another.

Real redis-server, real Celery worker processes (``--pool threads``), the
deterministic model of ``tests/celery_app.py``. Each test holds a worker at
a known point with a Redis-visible gate (a model call, a tool, the request
preparation between turns), waits until the run's checkpoint for that point
is committed in Redis, and only then kills the worker that holds the gate
(``t:<tag>:pid``). The module's cluster replaces every worker it kills.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, List, Optional

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

    from loopctl import Cancelled, LoopBusy, Message
    from loopctl.contrib.celery import CeleryRunRegistry, WorkerLost
    from loopctl.contrib.celery.worker import HANDED_BACK
    from loopctl.driver.checkpoint import INTERRUPTED
    from loopctl.errors import ConfigError
    from tests import celery_app
    from tests.celery_app import HEARTBEAT_TTL, plan_text

WAIT = 30.0
DURABLE = "tests.celery_app:make_durable_loop"


class Cluster:
    """Redis, three workers, and the means to kill and replace them."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.url = server.url()
        self.workers: List[CeleryWorker] = []
        self.retired: List[CeleryWorker] = []
        self.app = celery_app.make_app(self.url)
        self.sig = redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=30)
        self._made: List[CeleryRunRegistry] = []
        self._lock = threading.Lock()

    def add_worker(
        self, queues: str = "celery", concurrency: int = 3, env: Optional[Dict[str, str]] = None
    ) -> CeleryWorker:
        w = CeleryWorker(
            self.url, f"r{uuid.uuid4().hex[:6]}", queues=queues, concurrency=concurrency, extra_env=env
        )
        with self._lock:
            self.workers.append(w)
        return w

    def by_pid(self, pid: int) -> CeleryWorker:
        with self._lock:
            [w] = [w for w in self.workers if w.pid == pid]
            return w

    def kill9(self, w: CeleryWorker) -> float:
        """SIGKILL ``w``; returns when it happened (monotonic)."""
        with self._lock:
            self.workers.remove(w)
            self.retired.append(w)
        t = time.monotonic()
        w.kill9()
        return t

    def registry(self, factory: str = DURABLE, **kw: Any) -> CeleryRunRegistry:
        kw.setdefault("resume", "on_worker_loss")
        reg = celery_app.make_registry(self.app, self.url, factory, **kw)
        self._made.append(reg)
        return reg

    def holder(self, tag: str) -> CeleryWorker:
        return self.by_pid(int(self.sig.get(f"t:{tag}:pid") or 0))

    def release(self, tag: str, turn: int, kind: str = "") -> None:
        self.sig.rpush(f"t:{tag}:{kind + '_' if kind else ''}release:{turn}", "go")

    def entered(self, tag: str, kind: str = "") -> int:
        return int(wait_signal(self.sig, f"t:{tag}:{kind + '_' if kind else ''}entered", WAIT))

    def ran(self, tag: str) -> Dict[str, int]:
        return {k: int(v) for k, v in self.sig.hgetall(f"t:{tag}:ran").items()}

    def requests(self, tag: str) -> List[Dict[str, Any]]:
        return [json.loads(x) for x in self.sig.lrange(f"t:{tag}:requests", 0, -1)]

    def checkpoint(self, rid: str) -> Dict[str, Any]:
        raw = self.sig.hget(f"loopctl:run:{rid}", "ckpt")
        return json.loads(raw) if raw else {}

    def wait_checkpoint(self, rid: str, after: str, turns: int) -> Dict[str, Any]:
        """Until the run's committed checkpoint is at this boundary (a bounded condition wait)."""
        deadline = time.monotonic() + WAIT
        pause = threading.Event()
        while True:
            cp = self.checkpoint(rid)
            if cp.get("after") == after and cp.get("turns_taken") == turns:
                return cp
            if time.monotonic() > deadline:
                raise AssertionError(f"checkpoint of {rid} never reached {after}/{turns}: {cp}")
            pause.wait(0.01)

    def close(self) -> None:
        for reg in self._made:
            reg.close()
        self.sig.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started: List[Any] = []
    c = None
    try:
        server = RedisServer()
        started.append(server)
        c = Cluster(server)
        for _ in range(3):
            c.add_worker()
        yield c
    finally:
        if c is not None:
            c.close()
            started.extend(c.retired + c.workers)
        stop_all(started)


@pytest.fixture()
def three_workers(cluster: Cluster) -> Cluster:
    """Replace the workers earlier tests killed, so each test starts with three."""
    while len(cluster.workers) < 3:
        cluster.add_worker()
    return cluster


def uid() -> str:
    return uuid.uuid4().hex[:12]


def events(reg: CeleryRunRegistry, rid: str) -> List[Dict[str, Any]]:
    got = list(reg.events(rid, timeout=WAIT))
    assert [s for s, _ in got] == list(range(1, len(got) + 1)), "seqs are contiguous from 1"
    return [e for _, e in got]


def assert_resumed_once(evs: List[Dict[str, Any]], cause: str) -> Dict[str, Any]:
    types = [e["type"] for e in evs]
    assert types[0] == "run_start" and types.count("run_start") == 1
    assert types[-1] == "run_end" and types.count("run_end") == 1 and evs[-1]["success"] is True
    [resumed] = [e for e in evs if e["type"] == "run_resumed"]
    assert resumed["attempt"] == 1 and cause in resumed["cause"]
    return resumed


def results(history: List[Message]) -> List[Any]:
    return [p for m in history for p in m.tool_results]


# -- kill -9 at a known point -------------------------------------------------------------------


def test_kill9_in_a_model_call_resumes_on_another_worker(three_workers: Cluster) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert c.entered(tag) == 1
    cp = c.wait_checkpoint(rid, "tools", 1)
    assert len(cp["pending"]["messages"]) == 3  # input, the call, its result
    victim = c.holder(tag)
    c.kill9(victim)
    c.release(tag, 1)  # for the resumed model call (the killed one is gone)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=0"
    evs = events(reg, rid)
    resumed = assert_resumed_once(evs, "worker lost")
    assert resumed["turn"] == 1  # resumes at the model call it lost
    st = reg.status(rid)
    assert (st.state, st.resumes) == ("completed", 1) and (st.resume_cause or "").startswith("worker lost")
    assert st.turns == 3 and run.turn_count == 3
    assert c.ran(tag) == {"echo:0": 1, "echo:1": 1}  # the committed tool was not run again
    pids = {r["pid"] for r in c.requests(tag) if r["turn"] == 2}
    assert pids and victim.pid not in pids
    history = reg.history(conv)
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert not any(p.is_error for p in results(history))


@pytest.mark.parametrize("tool, idempotent", [("echo", False), ("fetch", True)])
def test_kill9_in_a_tool_reruns_it_only_if_idempotent(three_workers: Cluster, tool: str, idempotent: bool) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=2, tool=tool, tool_gate=[0]))
    assert c.entered(tag, "tool") == 0
    c.wait_checkpoint(rid, "model", 1)
    victim = c.holder(tag)
    c.kill9(victim)
    c.release(tag, 0, "tool")  # lets a re-run pass its gate
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=1 steers=0"
    assert_resumed_once(events(reg, rid), "worker lost")
    [result] = results(reg.history(conv))
    if idempotent:
        assert c.ran(tag) == {"fetch:0": 2}
        assert not result.is_error and json.loads(result.output)["pid"] != victim.pid
    else:
        assert c.ran(tag) == {"echo:0": 1}  # never twice
        assert result.is_error and INTERRUPTED in result.output


def test_kill9_between_turns_keeps_the_committed_tool_result(three_workers: Cluster) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, prep_gate=[1]))
    assert c.entered(tag, "prep") == 1
    c.wait_checkpoint(rid, "tools", 1)
    victim = c.holder(tag)
    c.kill9(victim)
    c.release(tag, 1, "prep")
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=0"
    evs = events(reg, rid)
    assert assert_resumed_once(evs, "worker lost")["turn"] == 1
    assert c.ran(tag) == {"echo:0": 1, "echo:1": 1}
    first = results(reg.history(conv))[0]
    assert json.loads(first.output)["pid"] == victim.pid  # the result from before the crash
    # Everything before the resumption happened once: turn 0's events are not repeated.
    resumed_at = [e["type"] for e in evs].index("run_resumed")
    assert [e["turn"] for e in evs[resumed_at:] if e["type"] == "turn_start"] == [1, 2]


# -- steering and cancel while the run has no worker ------------------------------------------


def test_a_steer_during_the_outage_lands_at_the_resumed_runs_first_boundary(three_workers: Cluster) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert c.entered(tag) == 1
    c.wait_checkpoint(rid, "tools", 1)
    c.kill9(c.holder(tag))
    assert reg.steer(rid, "go left")  # nobody runs it now: stored for the resumed run
    c.release(tag, 1)
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=1"
    seen = [(r["turn"], r["steers"]) for r in c.requests(tag)]
    assert seen[0] == (0, []) and seen[-2:] == [(1, ["go left"]), (2, ["go left"])]
    steering = [e for e in events(reg, rid) if e["type"] == "steering"]
    assert [(e["turn"], len(e["messages"])) for e in steering] == [(1, 1)]
    assert [m.text for m in reg.history(conv)].count("go left") == 1
    assert reg.leftovers(rid) == []


def test_sub_agent_guidance_refused_before_the_crash_comes_back_once_after_the_resume(
    three_workers: Cluster,
) -> None:
    # Taken with the claim and refused (no sub-agent is in flight): the checkpoint moves
    # past it, so only the checkpoint itself can keep it for the leftovers.
    c = three_workers
    held = f"held-{uid()}"  # no worker consumes it until the task message is moved
    reg = c.registry(queue=held)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert reg.steer(rid, "for research", to="research") is True
    assert reg.steer(rid, "for the run") is True
    assert release_held(c.sig, held) == 1
    assert c.entered(tag) == 1
    cp = c.wait_checkpoint(rid, "tools", 1)
    assert cp["steers"] == 2 and cp["kept"] == [{"to": "research", "message": Message.user("for research").to_dict()}]
    c.kill9(c.holder(tag))
    c.release(tag, 1)
    # The resumed run's task message goes to the run's queue too: wait for it, move it on.
    assert c.sig.blmove(held, "celery", WAIT, "RIGHT", "LEFT") is not None
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=1"
    assert_resumed_once(events(reg, rid), "worker lost")
    assert [m.text for m in reg.history(conv)].count("for the run") == 1
    assert reg.leftovers(rid) == [Message.user("for research")]


def test_a_cancel_during_the_outage_ends_the_run_without_resuming_it(three_workers: Cluster) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    reg.result(reg.start(conv, plan_text(uid(), turns=1)), timeout=WAIT)
    before = reg.history(conv)
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert c.entered(tag) == 1
    c.wait_checkpoint(rid, "tools", 1)
    c.kill9(c.holder(tag))
    assert reg.cancel(rid, "user hit stop")
    with pytest.raises(Cancelled, match="user hit stop"):
        reg.result(rid, timeout=HEARTBEAT_TTL * 6)
    evs = events(reg, rid)
    assert "run_resumed" not in [e["type"] for e in evs] and evs[-1]["type"] == "run_end"
    assert [r["turn"] for r in c.requests(tag)] == [0, 1]  # no model call after the crash
    st = reg.status(rid)
    assert st.state == "cancelled" and st.resumes == 0
    assert reg.history(conv) == before
    nxt = reg.start(conv, plan_text(uid(), turns=1))  # the conversation is free again
    assert reg.result(nxt, timeout=WAIT).output is not None
    c.release(tag, 1)


# -- SIGTERM: drain and hand back ---------------------------------------------------------------


def test_sigterm_hands_the_run_back_at_its_next_boundary_with_no_failure(three_workers: Cluster) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert c.entered(tag) == 1
    leaving = c.holder(tag)
    with c._lock:
        c.workers.remove(leaving)
        c.retired.append(leaving)
    leaving._p.proc.terminate()  # warm shutdown: it stops taking runs and drains
    # Only once the worker has handled the signal (else the run may pass its
    # boundary before the drain and finish on the leaving worker).
    assert leaving._p.wait_line("test-worker: warm shutdown", WAIT).endswith("draining=True")
    c.release(tag, 1)  # the model call ends: the boundary where the run is handed back
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=0"
    assert leaving._p.proc.wait(WAIT) == 0  # a clean exit, not a timeout
    evs = events(reg, rid)
    resumed = assert_resumed_once(evs, HANDED_BACK)
    assert resumed["turn"] == 2  # after turn 1's reply: no model call is repeated
    assert all(e.get("success", True) for e in evs)
    st = reg.status(rid)
    assert (st.resumes, st.resume_cause) == (1, HANDED_BACK)
    assert c.ran(tag) == {"echo:0": 1, "echo:1": 1}  # handed back before the tool: it ran once, there
    assert not any(p.is_error for p in results(reg.history(conv)))
    assert [r["turn"] for r in c.requests(tag)] == [0, 1, 2]


@pytest.mark.slow
def test_a_run_stuck_past_the_drain_timeout_is_handed_back_from_its_last_checkpoint(
    three_workers: Cluster,
) -> None:
    c = three_workers
    queue = f"drain-{uid()}"
    leaving = c.add_worker(queues=queue, concurrency=1, env={"LOOPCTL_TEST_DRAIN_S": "0.5"})
    reg = c.registry(queue=queue)
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1], record=True))
    assert c.entered(tag) == 1
    c.wait_checkpoint(rid, "tools", 1)
    rescuer = c.add_worker(queues=queue, concurrency=1)
    with c._lock:
        c.workers.remove(leaving)
        c.retired.append(leaving)
    leaving._p.proc.terminate()  # the model call never returns in time: no boundary to wait for
    for _, event in reg.events(rid, timeout=WAIT):
        if event["type"] == "run_resumed":
            assert event["cause"] == HANDED_BACK and event["turn"] == 1
            break
    else:
        raise AssertionError("the run was never resumed")
    c.release(tag, 1)
    c.release(tag, 1)  # one for the abandoned call, should it still be waiting
    run = reg.result(rid, timeout=WAIT)
    assert run.output == f"done {tag} turn=2 steers=0"
    assert assert_resumed_once(events(reg, rid), HANDED_BACK)["turn"] == 1
    assert c.ran(tag) == {"echo:0": 1, "echo:1": 1}
    assert leaving._p.proc.wait(WAIT) == 0
    with c._lock:
        c.workers.remove(rescuer)
        c.retired.append(rescuer)
    rescuer.stop()


# -- limits and configuration -----------------------------------------------------------------


def test_a_run_past_max_resumes_fails_as_worker_lost(three_workers: Cluster) -> None:
    c = three_workers
    reg = c.registry()
    conv, tag = uid(), uid()
    rid = reg.start(conv, plan_text(tag, turns=3, gate=[1]), max_resumes=0)
    assert c.entered(tag) == 1
    c.kill9(c.holder(tag))
    with pytest.raises(WorkerLost, match="max_resumes 0"):
        reg.result(rid, timeout=HEARTBEAT_TTL * 6)
    assert reg.status(rid).state == "failed"
    at_most_once = c.registry(resume=None)
    conv2, tag2 = uid(), uid()
    rid2 = at_most_once.start(conv2, plan_text(tag2, turns=3, gate=[1]))
    assert c.entered(tag2) == 1
    c.kill9(c.holder(tag2))
    with pytest.raises(WorkerLost, match="not re-executed"):
        at_most_once.result(rid2, timeout=HEARTBEAT_TTL * 6)
    c.release(tag, 1)
    c.release(tag2, 1)


def test_resume_options_are_validated(cluster: Cluster) -> None:
    with pytest.raises(ConfigError, match="resume"):
        cluster.registry(resume="always")
    with pytest.raises(ConfigError, match="max_resumes"):
        cluster.registry(max_resumes=-1)
    reg = cluster.registry()
    with pytest.raises(ConfigError, match="max_resumes"):
        reg.start(uid(), "x", max_resumes=True)  # type: ignore[arg-type]
    with pytest.raises(LoopBusy):
        conv = uid()
        held = cluster.registry(queue=f"held-{uid()}")
        held.start(conv, "x")
        held.start(conv, "y")


# -- a message reserved by a worker that dies before claiming --------------------------------------


@pytest.mark.slow
def test_a_task_message_reserved_by_a_dead_worker_is_sent_again_promptly(three_workers: Cluster) -> None:
    c = three_workers
    queue = f"solo-{uid()}"
    solo = c.add_worker(queues=queue, concurrency=1)
    reg = c.registry(queue=queue)
    tag_a = uid()
    first = reg.start(uid(), plan_text(tag_a, turns=2, gate=[0]))
    assert c.entered(tag_a) == 0  # the only thread of the solo worker is busy
    waiting = reg.start(uid(), plan_text(uid(), turns=1))
    deadline = time.monotonic() + WAIT
    pause = threading.Event()
    while c.sig.hget(f"loopctl:run:{waiting}", "rsv") is None:  # reserved, not claimed
        assert time.monotonic() < deadline, "the solo worker never reserved the second run"
        pause.wait(0.01)
    killed_at = c.kill9(solo)
    rescuer = c.add_worker(queues=queue, concurrency=2)
    c.release(tag_a, 0)
    assert reg.result(waiting, timeout=WAIT).output is not None
    assert reg.result(first, timeout=WAIT).output is not None
    elapsed = time.monotonic() - killed_at
    assert elapsed < WAIT  # seconds (the TTL and a worker start), not the broker's hour
    assert [e["type"] for e in events(reg, waiting)].count("run_resumed") == 0
    with c._lock:
        c.workers.remove(rescuer)
        c.retired.append(rescuer)
    rescuer.stop()


# -- the soak ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_soak_runs_survive_random_kill9s_with_no_duplicates_and_no_reruns(three_workers: Cluster) -> None:
    c = three_workers
    runs = int(os.environ.get("LOOPCTL_SOAK_RUNS", "100"))
    rng = random.Random(2101)
    reg = c.registry(max_resumes=20)
    tags = {}
    for _ in range(runs):
        tag = uid()
        rid = reg.start(uid(), plan_text(tag, turns=5, tool="work", ms=[rng.randint(200, 800)]))
        tags[rid] = tag
    done = threading.Event()
    kills: List[float] = []

    def chaos() -> None:
        pause = threading.Event()
        while not done.is_set():
            pause.wait(rng.uniform(1.5, 3.0))
            if done.is_set():
                return
            with c._lock:
                victim = rng.choice(c.workers)
            kills.append(c.kill9(victim))
            c.add_worker()

    t0 = time.monotonic()
    thread = threading.Thread(target=chaos, name="test-chaos")
    thread.start()
    try:
        outputs = {}
        for rid in tags:
            try:
                outputs[rid] = reg.result(rid, timeout=120).output
            except TimeoutError:
                fields = c.sig.hgetall(f"loopctl:run:{rid}")
                fields.pop("ckpt", None)
                outbox = c.sig.zscore("loopctl:outbox", rid)
                raise AssertionError(f"run {rid} stuck: {fields} outbox={outbox}") from None
    finally:
        done.set()
        thread.join(30)
    elapsed = time.monotonic() - t0
    assert outputs == {rid: f"done {tag} turn=4 steers=0" for rid, tag in tags.items()}
    resumed = 0
    for rid, tag in tags.items():
        types = [e["type"] for e in events(reg, rid)]
        assert types.count("run_end") == 1 and types[-1] == "run_end"  # 0 duplicated completions
        resumed += types.count("run_resumed")
        ran = c.ran(tag)
        assert all(n == 1 for n in ran.values()), (rid, ran)  # 0 non-idempotent re-runs
    print(
        f"\nSOAK runs={runs} workers=3 kills={len(kills)} resumptions={resumed} "
        f"completed={len(outputs)} duplicates=0 reruns=0 elapsed={elapsed:.1f}s"
    )
    assert kills, "the soak killed no worker"
