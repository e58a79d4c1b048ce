"""CeleryRunRegistry across processes (issue 10), beside the in-process RunRegistry floor.

Setup: one private redis-server (persistence off) and two Celery worker
processes (``--pool threads``, 8 threads each), started by this script.
Runs use the deterministic model of ``tests/celery_app.py`` (its reply is a
function of the request) and the ``work`` tool (a cancel-aware wait).

Figures, each beside its floor measured in this run with the in-process
``RunRegistry`` running the same loops in this process:

- throughput: 200 runs (10 turns each: 9 tool turns of 1-5 ms, seeded, then
  the answer) on 200 conversations, at most 16 in flight (the workers' 2 x 8
  threads; the floor's 16 client threads): runs/s from the first start to
  the last result;
- cancel latency p50/p99: a run is held in its turn-1 model call (a Redis
  gate); from a second registry ``cancel(run_id)`` until ``result()`` in
  the first registry raises ``Cancelled`` (target p99 <= 50 ms);
- steer-to-slot p50/p99: from ``steer(run_id, text)`` in another registry
  until the worker's steering slot accepts the message (the timed factory
  stamps the accept; both processes read CLOCK_MONOTONIC);
- steer-to-request p50: from ``steer`` until the model receives a request
  carrying it (includes waiting for the boundary: the 3 ms tool in flight).

Output: prose, plus ``RESULT <figure> | <value> | <floor> | <ratio>`` lines
(``run_all.report``: values with their units).
Run: ``python benchmarks/distributed.py`` (from the repo root; < 60 s; ``--smoke``: 16 runs,
5 cancels, two steered runs of 12 turns).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from run_all import report, smoke_requested  # noqa: E402

from tests.celery_support import CeleryWorker, RedisServer, missing_requirements, stop_all  # noqa: E402

RUNS = 200
TURNS = 10
CONCURRENCY = 8  # threads per worker process
WORKERS = 2
CANCEL_SAMPLES = 60
STEER_RUNS = 3
STEER_TURNS = 24
#: --smoke: RUNS, CANCEL_SAMPLES, STEER_RUNS, STEER_TURNS (the workers and turns as above).
SMOKE = (16, 5, 2, 12)
SEED = 10


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def result_line(name: str, value: float, floor: float, unit: str, target: str = "") -> None:
    report(f"{name}, distributed vs in-process", value, floor, unit, target=target)


class Bench:
    def __init__(self, url: str) -> None:
        import redis

        from loopctl.hosting.registry import RunRegistry
        from tests import celery_app

        os.environ[celery_app.ENV_URL] = url  # in-process loops use the same Redis gates
        self.ca = celery_app
        self.url = url
        self.app = celery_app.make_app(url)
        self.sig = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        self.RunRegistry = RunRegistry

    def registry(self, factory: str = "tests.celery_app:make_loop") -> Any:
        return self.ca.make_registry(self.app, self.url, factory)

    # -- throughput --------------------------------------------------------------------

    def plans(self) -> List[str]:
        rng = random.Random(SEED)
        return [
            self.ca.plan_text(f"tp-{uuid.uuid4().hex[:8]}", turns=TURNS, tool="work",
                              ms=[rng.randint(1, 5) for _ in range(TURNS)])
            for _ in range(RUNS)
        ]

    def throughput_distributed(self) -> float:
        reg = self.registry()
        plans = self.plans()
        t0 = time.perf_counter()
        ids = [reg.start(f"tp-{uuid.uuid4().hex}", p) for p in plans]
        for rid in ids:
            reg.result(rid, timeout=60)
        elapsed = time.perf_counter() - t0
        reg.close()
        return RUNS / elapsed

    def throughput_inprocess(self) -> float:
        plans = self.plans()
        todo = list(reversed(plans))
        lock = threading.Lock()
        reg = self.RunRegistry(max_active=RUNS)

        def client() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    plan = todo.pop()
                loop = self.ca.make_loop("c", [])
                rid = reg.start(loop, plan)
                reg.result(rid, timeout=60)
                loop.close()

        threads = [threading.Thread(target=client, name=f"bench-client-{i}") for i in range(WORKERS * CONCURRENCY)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        reg.close()
        return RUNS / elapsed

    # -- cancel latency ------------------------------------------------------------------

    def _wait_entered(self, tag: str) -> None:
        if self.sig.blpop([f"t:{tag}:entered"], timeout=30) is None:
            raise RuntimeError(f"run {tag} never reached its gate")

    def cancel_distributed(self) -> List[float]:
        from loopctl import Cancelled

        web1, web2 = self.registry(), self.registry()
        out = []
        for _ in range(CANCEL_SAMPLES):
            tag = f"cx-{uuid.uuid4().hex[:8]}"
            rid = web1.start(tag, self.ca.plan_text(tag, turns=3, gate=[1]))
            self._wait_entered(tag)
            t0 = time.perf_counter()
            web2.cancel(rid)
            try:
                web1.result(rid, timeout=30)
            except Cancelled:
                out.append(time.perf_counter() - t0)
            self.sig.rpush(f"t:{tag}:release:1", "go")
        web1.close()
        web2.close()
        return out

    def cancel_inprocess(self) -> List[float]:
        from loopctl import Cancelled

        reg = self.RunRegistry()
        out = []
        for _ in range(CANCEL_SAMPLES):
            tag = f"ci-{uuid.uuid4().hex[:8]}"
            loop = self.ca.make_loop(tag, [])
            rid = reg.start(loop, self.ca.plan_text(tag, turns=3, gate=[1]))
            self._wait_entered(tag)
            t0 = time.perf_counter()
            reg.cancel(rid)
            try:
                reg.result(rid, timeout=30)
            except Cancelled:
                out.append(time.perf_counter() - t0)
            self.sig.rpush(f"t:{tag}:release:1", "go")
            loop.close()
        reg.close()
        return out

    # -- steering ------------------------------------------------------------------------

    def _steer_run(self, start: Callable[[str, str], Any], steer: Callable[[Any, str], bool],
                   finish: Callable[[Any], None], rng: random.Random) -> Tuple[List[float], List[float]]:
        conv = f"st-{uuid.uuid4().hex[:8]}"
        last = STEER_TURNS - 1
        # The last model call waits at a gate until every steer is pushed, so
        # a run can never end under a steer however far this thread lags
        # behind (on a busy machine it did: "steer refused during the run").
        plan = self.ca.plan_text(conv, turns=STEER_TURNS, tool="work", ms=[3], record=True, gate=[last])
        handle = start(conv, plan)
        sent: Dict[str, float] = {}
        seen_at: Dict[str, float] = {}
        pause = threading.Event()  # never set: a seeded offset into the tool call
        try:
            while True:
                got = self.sig.blpop([f"t:{conv}:requests"], timeout=30)
                if got is None:
                    raise RuntimeError("no request recorded")
                req = json.loads(got[1])
                for text in req["steers"]:
                    seen_at.setdefault(text, req["t"])
                turn = req["turn"]
                if turn >= last:
                    break
                if self.sig.llen(f"t:{conv}:requests"):
                    continue  # the run is already past this turn's tool: no sample here
                if turn % 2 == 0 and turn < STEER_TURNS - 3:
                    pause.wait(rng.uniform(0.0, 0.001))
                    text = f"S{turn}"
                    sent[text] = time.monotonic()
                    if not steer(handle, text):
                        raise RuntimeError(f"steer refused during the run (turn {turn}, gate held)")
        finally:
            self.sig.rpush(f"t:{conv}:release:{last}", "go")
        finish(handle)
        accepted = {}
        for raw in self.sig.lrange(f"t:{conv}:accepted", 0, -1):
            item = json.loads(raw)
            accepted[item["text"]] = item["t"]
        to_slot = [accepted[k] - t for k, t in sent.items() if k in accepted]
        # A steer pushed while the run sat at the gate is sealed, never in a request.
        to_request = [seen_at[k] - t for k, t in sent.items() if k in seen_at]
        return to_slot, to_request

    def steer_distributed(self) -> Tuple[List[float], List[float]]:
        web1, web2 = self.registry("tests.celery_app:make_timed_loop"), self.registry()
        rng = random.Random(SEED)
        slot: List[float] = []
        req: List[float] = []
        for _ in range(STEER_RUNS):
            a, b = self._steer_run(
                lambda conv, plan: web1.start(conv, plan),
                lambda rid, text: bool(web2.steer(rid, text)),
                lambda rid: web1.result(rid, timeout=60),
                rng,
            )
            slot += a
            req += b
        web1.close()
        web2.close()
        return slot, req

    def steer_inprocess(self) -> Tuple[List[float], List[float]]:
        reg = self.RunRegistry()
        rng = random.Random(SEED)
        slot: List[float] = []
        req: List[float] = []
        loops: List[Any] = []

        def start(conv: str, plan: str) -> str:
            loop = self.ca.make_timed_loop(conv, [])
            loops.append(loop)
            return str(reg.start(loop, plan))

        for _ in range(STEER_RUNS):
            a, b = self._steer_run(start, reg.steer, lambda rid: reg.result(rid, timeout=60), rng)
            slot += a
            req += b
        for loop in loops:
            loop.close()
        reg.close()
        return slot, req


def main(argv: Optional[Sequence[str]] = None) -> int:
    global RUNS, CANCEL_SAMPLES, STEER_RUNS, STEER_TURNS
    if smoke_requested(__doc__.splitlines()[0], argv):
        RUNS, CANCEL_SAMPLES, STEER_RUNS, STEER_TURNS = SMOKE
    reason = missing_requirements()
    if reason is not None:
        print(f"SKIP distributed benchmark: {reason}")
        return 0
    t_all = time.perf_counter()
    started: List[Any] = []
    try:
        server = RedisServer()
        started.append(server)
        url = server.url()
        for i in range(WORKERS):
            started.append(CeleryWorker(url, f"bench{i}", concurrency=CONCURRENCY))
        bench = Bench(url)
        print(f"redis-server + {WORKERS} Celery workers (--pool threads -c {CONCURRENCY}) up "
              f"in {time.perf_counter() - t_all:.1f} s")

        bench.throughput_distributed()  # warm-up: imports, connections, script loads
        tp_d = bench.throughput_distributed()
        tp_f = bench.throughput_inprocess()
        print(f"throughput: {RUNS} runs x {TURNS} turns (1-5 ms tools), 16 in flight: "
              f"distributed {tp_d:.1f} runs/s, in-process {tp_f:.1f} runs/s")

        c_d = bench.cancel_distributed()
        c_f = bench.cancel_inprocess()
        ms = 1000.0
        print(f"cancel latency ({len(c_d)} samples, cancel from a second registry -> Cancelled in the first): "
              f"p50 {statistics.median(c_d) * ms:.2f} ms, p99 {pct(c_d, 99) * ms:.2f} ms "
              f"(target p99 <= 50 ms); in-process p50 {statistics.median(c_f) * ms:.3f} ms, "
              f"p99 {pct(c_f, 99) * ms:.3f} ms")

        s_d, r_d = bench.steer_distributed()
        s_f, r_f = bench.steer_inprocess()
        print(f"steering ({len(s_d)} steers pushed 0-1 ms into a 3 ms tool): steer->slot p50 "
              f"{statistics.median(s_d) * ms:.2f} ms p99 {pct(s_d, 99) * ms:.2f} ms "
              f"(in-process {statistics.median(s_f) * ms:.3f} / {pct(s_f, 99) * ms:.3f} ms); "
              f"steer->next request p50 {statistics.median(r_d) * ms:.2f} ms "
              f"(in-process {statistics.median(r_f) * ms:.2f} ms)")

        result_line("throughput", tp_d, tp_f, "runs/s")
        result_line("cancel latency p50", statistics.median(c_d) * ms, statistics.median(c_f) * ms, "ms")
        result_line("cancel latency p99", pct(c_d, 99) * ms, pct(c_f, 99) * ms, "ms", target="<= 50 ms")
        result_line("steer-to-slot p50", statistics.median(s_d) * ms, statistics.median(s_f) * ms, "ms")
        result_line("steer-to-slot p99", pct(s_d, 99) * ms, pct(s_f, 99) * ms, "ms")
        result_line("steer-to-request p50", statistics.median(r_d) * ms, statistics.median(r_f) * ms, "ms")
        print(f"total {time.perf_counter() - t_all:.1f} s")
        return 0
    finally:
        stop_all(started)


if __name__ == "__main__":
    sys.exit(main())
