"""Approvals (issue 17): time from ``approve()`` to the tool starting.

In-process: one run of ``N`` turns, each asking for one call of a tool that
needs approval. When ``on_approval_requested`` has fired (an Event), the
main thread notes ``perf_counter()`` and calls ``handle.approve(call_id)``;
the tool notes the time it starts. Floor: the same hand-off with nothing in
between: one thread sets an Event, another (already waiting) wakes and
notes the time.

Through Celery + Redis: one private redis-server and one Celery worker
(``--pool threads``) run ``tests/celery_app.py``'s ``pay`` tool (it needs
approval and pushes its ``CLOCK_MONOTONIC`` start on a Redis list). For
each of ``N_CELERY`` turns, this process follows the run's event stream to
the ``approval_requested`` event, notes the time, calls
``registry.approve(run_id, call_id)`` from a second registry, and reads the
tool's start from Redis. Floor: one Redis hop between two connections (an
``RPUSH`` here woken by a ``BLPOP`` on another thread here).

Targets: p99 <= 5 ms in-process, <= 50 ms through Celery + Redis. Prints
``RESULT`` lines (p50 and p99 against the floor's). Run from the repo root:
``python benchmarks/approvals.py`` (< 60 s; ``--smoke``: 10 and 5 approvals).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_all import report, smoke_requested  # noqa: E402

from loopctl import BareLoop, RunConfig, tool  # noqa: E402
from loopctl.observers import ApprovalRequested, Observer  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402

N = 300
N_CELERY = 60
SMOKE_N, SMOKE_N_CELERY = 10, 5  # --smoke
WAIT = 30.0


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def in_process() -> List[float]:
    started: List[float] = []
    asked, ran = threading.Event(), threading.Event()

    @tool(requires_approval=True)
    def pay(i: int) -> str:
        """Pay.

        Args:
            i: which.
        """
        started.append(time.perf_counter())
        ran.set()
        return "paid"

    class Asked(Observer):
        def on_approval_requested(self, event: ApprovalRequested) -> None:
            asked.set()

    script = [call("pay", i=i) for i in range(N)] + [reply("done")]
    loop = BareLoop(ScriptedClient(script), [pay]).with_observer(Asked())
    out: List[float] = []
    with loop:
        h = loop.start("go", RunConfig(max_turns=N + 1))
        for _ in range(N):
            if not asked.wait(WAIT):
                raise RuntimeError("no approval was requested")
            asked.clear()
            [pending] = h.pending_approvals()
            ran.clear()
            time.sleep(0.0005)  # let the run's thread settle into its wait
            t0 = time.perf_counter()
            h.approve(pending.call_id)
            if not ran.wait(WAIT):
                raise RuntimeError("the tool never started")
            out.append(started[-1] - t0)
        h.result(WAIT)
    return out


def _waiter(ready: threading.Event, go: threading.Event, woke: List[float]) -> None:
    ready.set()
    go.wait()
    woke.append(time.perf_counter())


def _popper(client: Any, ready: threading.Event, woke: List[float]) -> None:
    ready.set()
    client.blpop(["bench:hop"], timeout=WAIT)
    woke.append(time.monotonic())


def event_floor() -> List[float]:
    out: List[float] = []
    for _ in range(N):
        go, ready = threading.Event(), threading.Event()
        woke: List[float] = []
        t = threading.Thread(target=_waiter, args=(ready, go, woke))
        t.start()
        ready.wait()
        time.sleep(0.0005)  # the waiter is blocked in wait(), as the run's thread is
        t0 = time.perf_counter()
        go.set()
        t.join()
        out.append(woke[0] - t0)
    return out


def through_celery() -> tuple[List[float], List[float]]:
    from tests.celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all

    reason = missing_requirements()
    if reason is not None:
        print(f"Celery part skipped: {reason}")
        return [], []
    import redis

    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        url = server.url()
        started.append(CeleryWorker(url, "bench-appr", concurrency=2))
        from tests import celery_app

        os.environ[celery_app.ENV_URL] = url
        app = celery_app.make_app(url)
        starter = celery_app.make_registry(app, url)
        approver = celery_app.make_registry(app, url)
        sig = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        tag = f"ap-{uuid.uuid4().hex[:8]}"
        rid = starter.start(tag, celery_app.plan_text(tag, turns=N_CELERY + 1, tool="pay"))
        out: List[float] = []
        after = 0
        for _ in range(N_CELERY):
            cid = None
            for seq, event in approver.events(rid, after=after, timeout=WAIT):
                after = seq
                if event["type"] == "approval_requested":
                    cid = event["call_id"]
                    break
            if cid is None:
                raise RuntimeError("no approval was requested")
            t0 = time.monotonic()
            if not approver.approve(rid, cid):
                raise RuntimeError("the approval was refused")
            got = sig.blpop([f"t:{tag}:paid"], timeout=WAIT)
            if got is None:
                raise RuntimeError("the tool never started")
            out.append(json.loads(got[1])["t"] - t0)
        starter.result(rid, timeout=WAIT)

        floor: List[float] = []
        other = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        for _ in range(N_CELERY):
            ready = threading.Event()
            woke = []
            t = threading.Thread(target=_popper, args=(other, ready, woke))
            t.start()
            ready.wait()
            time.sleep(0.002)  # let the BLPOP reach the server before the push
            t0 = time.monotonic()
            sig.rpush("bench:hop", "x")
            t.join()
            floor.append(woke[0] - t0)
        for reg in (starter, approver):
            reg.close()
        sig.close()
        other.close()
        return out, floor
    finally:
        stop_all(started)


def main(argv: Optional[Sequence[str]] = None) -> None:
    global N, N_CELERY
    if smoke_requested(__doc__.splitlines()[0], argv):
        N, N_CELERY = SMOKE_N, SMOKE_N_CELERY
    gc.freeze()
    floor = event_floor()
    lat = in_process()
    ms = 1000.0
    print(f"in-process approve -> tool start, {N} approvals: p50 {statistics.median(lat) * ms:.3f} ms, "
          f"p99 {pct(lat, 99) * ms:.3f} ms, max {max(lat) * ms:.3f} ms")
    report("approve -> tool start p50, in-process", statistics.median(lat) * ms, statistics.median(floor) * ms, "ms")
    report("approve -> tool start p99, in-process", pct(lat, 99) * ms, pct(floor, 99) * ms, "ms",
           target="<= 5 ms")
    dist, hop = through_celery()
    if dist:
        print(f"Celery+Redis approve -> tool start, {N_CELERY} approvals: p50 {statistics.median(dist) * ms:.3f} ms, "
              f"p99 {pct(dist, 99) * ms:.3f} ms, max {max(dist) * ms:.3f} ms")
        report("approve -> tool start p50, Celery+Redis", statistics.median(dist) * ms, statistics.median(hop) * ms, "ms")
        report("approve -> tool start p99, Celery+Redis", pct(dist, 99) * ms, pct(hop, 99) * ms, "ms",
               target="<= 50 ms")


if __name__ == "__main__":
    main()
