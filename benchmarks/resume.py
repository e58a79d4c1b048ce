"""Durable runs (issue 21): from kill -9 of a worker to the run's resumption elsewhere.

Setup: one private redis-server (persistence off) and three Celery worker
processes (``--pool threads``), started by this script, with the test
timings of ``tests/celery_app.py`` (heartbeat every 0.25 s, lapse after
1.5 s; each worker's sweeper steps every 0.25 s). Each sample starts a
durable run (``resume="on_worker_loss"``) whose turn-1 model call waits on
a Redis gate, waits until the run's checkpoint after turn 0 is committed,
kill -9s the worker holding the gate, releases the gate, and follows the
run's events from this process:

- kill -> resumed p50/p99: from the kill until this process reads the
  run's ``run_resumed`` event (detection by the heartbeat TTL, the sweeper's
  step, the task message, the claim and the rebuild of the loop on another
  worker). Floor: the heartbeat TTL, below which no loss can be told from
  a slow worker;
- kill -> completed p50: until ``result()`` returns.

A replacement worker is started after each kill (in the background), so
every sample has at least two live workers to resume on.

Output: prose, plus ``RESULT <figure> | <value> | <floor> | <ratio>`` lines.
Run: ``python benchmarks/resume.py`` (from the repo root; about a minute;
``LOOPCTL_RESUME_SAMPLES`` sets the number of kills, default 15; ``--smoke``: one kill, two
workers).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from run_all import report, smoke_requested  # noqa: E402

from tests.celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all  # noqa: E402

SAMPLES = int(os.environ.get("LOOPCTL_RESUME_SAMPLES", "15"))
WAIT = 60.0
WORKERS = 3
SMOKE_SAMPLES, SMOKE_WORKERS = 1, 2  # --smoke: one kill, one worker left to resume on


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def result(name: str, value_s: float, floor_s: float) -> None:
    report(f"{name}, vs the heartbeat TTL", value_s * 1000.0, floor_s * 1000.0, "ms")


def main(argv: Optional[Sequence[str]] = None) -> int:
    global SAMPLES, WORKERS
    if smoke_requested(__doc__.splitlines()[0], argv):
        SAMPLES, WORKERS = SMOKE_SAMPLES, SMOKE_WORKERS
    reason = missing_requirements()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    import redis

    from tests import celery_app

    started: List[Any] = []
    workers: List[CeleryWorker] = []
    lock = threading.Lock()
    try:
        server = RedisServer()
        started.append(server)
        url = server.url()

        def add() -> None:
            w = CeleryWorker(url, f"b{uuid.uuid4().hex[:6]}", concurrency=2)
            with lock:
                workers.append(w)
                started.append(w)

        for _ in range(WORKERS):
            add()
        app = celery_app.make_app(url)
        reg = celery_app.make_registry(app, url, "tests.celery_app:make_durable_loop", resume="on_worker_loss")
        sig = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        resumed: List[float] = []
        completed: List[float] = []
        spawners: List[threading.Thread] = []
        pause = threading.Event()
        for _ in range(SAMPLES):
            tag = uuid.uuid4().hex[:12]
            rid = reg.start(uuid.uuid4().hex, celery_app.plan_text(tag, turns=3, gate=[1]))
            if sig.blpop([f"t:{tag}:entered"], timeout=WAIT) is None:
                raise RuntimeError("the gated model call was never entered")
            deadline = time.monotonic() + WAIT
            while True:  # until the checkpoint after turn 0's tools is committed
                raw = sig.hget(f"loopctl:run:{rid}", "ckpt")
                if raw and json.loads(raw).get("after") == "tools":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("no checkpoint")
                pause.wait(0.005)
            pid = int(sig.get(f"t:{tag}:pid") or 0)
            with lock:
                [victim] = [w for w in workers if w.pid == pid]
                workers.remove(victim)
            t0 = time.monotonic()
            victim.kill9()
            sig.rpush(f"t:{tag}:release:1", "go")
            for _, event in reg.events(rid, timeout=WAIT):
                if event["type"] == "run_resumed":
                    resumed.append(time.monotonic() - t0)
                    break
            reg.result(rid, timeout=WAIT)
            completed.append(time.monotonic() - t0)
            t = threading.Thread(target=add, name="bench-spawn")
            t.start()
            spawners.append(t)
            with lock:
                alive = len(workers)
            if alive < 2:
                spawners[-1].join()
        for t in spawners:
            t.join()
        ttl = celery_app.HEARTBEAT_TTL
        print(
            f"{SAMPLES} kill -9s of the worker holding a durable run ({WORKERS} workers, heartbeat TTL {ttl} s): "
            f"resumed p50 {pct(resumed, 50):.2f} s, p99 {pct(resumed, 99):.2f} s; "
            f"completed p50 {pct(completed, 50):.2f} s"
        )
        result("kill -9 to resumed p50", pct(resumed, 50), ttl)
        result("kill -9 to resumed p99", pct(resumed, 99), ttl)
        result("kill -9 to completed p50", pct(completed, 50), ttl)
        reg.close()
        sig.close()
        return 0
    finally:
        stop_all(started)


if __name__ == "__main__":
    raise SystemExit(main())
