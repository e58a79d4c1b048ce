"""Session stores: the latency of a completed run's append, 8 threads x 25 runs, both stores.

Each of 8 threads drives its own ``BareLoop`` on its own session and makes
25 one-reply runs (``ScriptedClient``); each completed run appends its two
new messages in ``finalize`` through the session's lease (the lease check
and the write are one transaction: ``BEGIN IMMEDIATE`` in SQLite, one Lua
script in Redis). The figure is the time of that append (the lease's
write, timed around it: encoding, the transaction, the round trip), p50
and p99 over the 200 appends.

The floor is the same writes done the simplest way on the same store, from
the same 8 threads: SQLite, a plain connection per thread (WAL,
``synchronous=FULL``) doing ``BEGIN IMMEDIATE``, two ``INSERT``s, ``COMMIT``;
Redis, one ``RPUSH`` of the two rows. A whole run with a session is also
set against the same run without one (p50).

The Redis rows need ``redis-server`` and redis-py (a private server is
started, persistence off); without them only the SQLite rows are printed.
Run: ``python benchmarks/sessions.py`` (a few seconds; ``--smoke``: 2 runs a thread).
"""

from __future__ import annotations

import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_all import report, smoke_requested  # noqa: E402

from loopctl import BareLoop, Message  # noqa: E402
from loopctl.sessions import RedisSessionStore, SQLiteSessionStore  # noqa: E402
from loopctl.sessions.base import SessionLease, SessionStore, encode_message  # noqa: E402
from loopctl.testing import ScriptedClient, reply  # noqa: E402
from tests.celery_support import RedisServer, missing_requirements  # noqa: E402

THREADS = 8
RUNS = 25
SMOKE_RUNS = 2  # runs per thread with --smoke
ROWS = [encode_message(Message.user("what is 12 + 30?")), encode_message(Message.assistant("42"))]


def pct(values: List[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def in_threads(work: Callable[[int], None]) -> None:
    """Run ``work(i)`` on 8 threads released together by one barrier."""
    barrier = threading.Barrier(THREADS)

    def body(i: int) -> None:
        barrier.wait()
        work(i)

    threads = [threading.Thread(target=body, args=(i,), name=f"bench-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def loop_runs(store: Any, tag: str, appends: List[float], runs: List[float]) -> None:
    """8 threads x 25 runs on their own sessions; collect append and run times (ms)."""
    original = SessionLease._write
    lock = threading.Lock()

    def timed(self: SessionLease, messages: Any, replace: bool) -> int:
        t0 = time.perf_counter()
        try:
            return original(self, messages, replace)
        finally:
            took = (time.perf_counter() - t0) * 1000.0
            with lock:
                appends.append(took)

    SessionLease._write = timed  # type: ignore[method-assign]
    try:
        def work(i: int) -> None:
            with BareLoop(ScriptedClient([reply("42")] * RUNS)) as loop:
                if store is not None:
                    loop.with_session(store.session(f"{tag}-{i}"))
                for j in range(RUNS):
                    t0 = time.perf_counter()
                    loop.run(f"what is 12 + {j}?")
                    took = (time.perf_counter() - t0) * 1000.0
                    with lock:
                        runs.append(took)

        in_threads(work)
    finally:
        SessionLease._write = original  # type: ignore[method-assign]


def floor_sqlite(path: str) -> List[float]:
    times: List[float] = []
    lock = threading.Lock()
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.execute("CREATE TABLE rows (k TEXT, seq INTEGER, body TEXT, PRIMARY KEY (k, seq))")
    setup.commit()
    setup.close()

    def work(i: int) -> None:
        con = sqlite3.connect(path, timeout=30, isolation_level=None)
        con.execute("PRAGMA synchronous = FULL")
        for j in range(RUNS):
            t0 = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            con.executemany("INSERT INTO rows VALUES (?, ?, ?)", [(str(i), 2 * j + n, r) for n, r in enumerate(ROWS)])
            con.execute("COMMIT")
            took = (time.perf_counter() - t0) * 1000.0
            with lock:
                times.append(took)
        con.close()

    in_threads(work)
    return times


def floor_redis(url: str) -> List[float]:
    import redis

    times: List[float] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        r = redis.Redis.from_url(url)
        for _ in range(RUNS):
            t0 = time.perf_counter()
            r.rpush(f"floor:{i}", *ROWS)
            took = (time.perf_counter() - t0) * 1000.0
            with lock:
                times.append(took)
        r.close()

    in_threads(work)
    return times


def measure(name: str, store: SessionStore, floor: List[float]) -> None:
    loop_runs(store, "warm", [], [])  # imports, connections, scripts, page cache
    appends: List[float] = []
    runs: List[float] = []
    loop_runs(store, "bench", appends, runs)
    bare: List[float] = []
    loop_runs(None, "bare", [], bare)
    assert len(appends) == THREADS * RUNS, len(appends)
    report(f"{name} append p50, {THREADS} threads x {RUNS} runs vs the plain write", pct(appends, 50), pct(floor, 50), "ms")
    report(f"{name} append p99, {THREADS} threads x {RUNS} runs vs the plain write", pct(appends, 99), pct(floor, 99), "ms")
    report(f"{name} whole run p50 with a session vs without", statistics.median(runs), statistics.median(bare), "ms")


def main(argv: Optional[Sequence[str]] = None) -> None:
    global RUNS
    if smoke_requested(__doc__.splitlines()[0], argv):
        RUNS = SMOKE_RUNS
    with tempfile.TemporaryDirectory(prefix="loopctl-bench-sessions-") as tmp:
        floor = floor_sqlite(str(Path(tmp) / "floor.db"))
        store = SQLiteSessionStore(Path(tmp) / "sessions.db")
        try:
            measure("sqlite", store, floor)
        finally:
            store.close()
    why = missing_requirements()
    if why is not None:
        print(f"redis rows skipped: {why}")
        return
    server = RedisServer()
    try:
        url = server.url()
        floor = floor_redis(url)
        rstore = RedisSessionStore(url)
        try:
            measure("redis", rstore, floor)
        finally:
            rstore.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
