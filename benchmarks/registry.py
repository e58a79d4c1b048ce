"""RunRegistry at scale (issue 9): 1,000 concurrent scripted runs in one process.

Each run: its own ``BareLoop`` and ``ScriptedClient``, 10 turns (9 tool
turns, then a final answer), each tool waiting 1-5 ms (seeded) on its
cancel signal. Every run has its own consumer thread reading its events.
All runs are started first and held at their first model call by one
``go`` event, so all N are in flight at once; then ``go`` is set.

Figures (each printed beside its floor and the ratio):
- start: time to start all N runs (``RunRegistry.start`` vs ``BareLoop.start``;
  wall time, dominated by thread creation among hundreds of live threads),
  and the starting thread's CPU time per run (includes the GC passes its
  allocations trigger);
- wall: from ``go`` until every run has ended and every consumer has seen
  its ``run_end``;
- peak RSS per active run: ``(ru_maxrss after - ru_maxrss before the
  starts) / N`` — the threads, run state and buffered events of a run in
  flight (loops are built before the "before" reading);
- event-delivery latency p50/p99: from the moment the run's tap is called
  (on the run's thread) until the consumer thread has the event as a dict,
  over every event emitted after ``go``.

The floor is the same runs started with bare ``BareLoop.start(tap=...)``
whose tap puts ``(t, event)`` on a ``queue.SimpleQueue`` read by the
consumer thread (the least a hand-rolled registry could do). Both modes
stamp the time in the tap the same way (the registry's tap is wrapped for
this benchmark only). Each mode runs in a fresh child process, so peak RSS
is its own. Run: ``python benchmarks/registry.py [--runs N]`` (< 60 s; ``--smoke``: 10 runs).
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_all import SMOKE_HELP  # noqa: E402
from run_all import report as result_line  # noqa: E402

from loopctl import BareLoop  # noqa: E402
from loopctl.hosting import registry as registry_mod  # noqa: E402
from loopctl.messages import ModelRequest, ModelResponse  # noqa: E402
from loopctl.observers import Event, RunEnd  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402
from loopctl.tools import Tool, ToolContext  # noqa: E402

TURNS = 10
SEED = 9
SMOKE_RUNS = 10  # --smoke


class Work(Tool):
    name = "work"
    description = "Wait the given milliseconds (cancel-aware)."

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        ctx.cancel.wait(input["ms"] / 1000.0)
        return "worked"


def make_loops(n: int, go: threading.Event) -> list[BareLoop]:
    rng = random.Random(SEED)
    loops = []
    for i in range(n):
        ms = [rng.randint(1, 5) for _ in range(TURNS - 1)]
        first = call("work", ms=ms[0], step=0)

        def held(request: ModelRequest, first: ModelResponse = first) -> ModelResponse:
            go.wait()
            return first

        script: list[Any] = [held]
        script += [call("work", ms=m, step=k) for k, m in enumerate(ms[1:], 1)]
        script.append(reply(f"run {i} done"))
        # No managed temp dir: 1,000 mkdirs and rmtrees would measure the disk.
        loops.append(BareLoop(ScriptedClient(script), [Work()]).with_managed_temp_disabled())
    return loops


def maxrss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def child(mode: str, n: int) -> dict[str, Any]:
    go = threading.Event()
    loops = make_loops(n, go)
    stamps: list[list[float]] = [[] for _ in range(n)]
    latencies: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    go_at = [0.0]
    consumers: list[threading.Thread] = []
    handles: list[Any] = []
    reg = None

    def record(i: int, seq: int) -> None:
        t_emit = stamps[i][seq - 1]
        latencies[i].append((t_emit, time.perf_counter() - t_emit))

    rss_before = maxrss_kb()
    t0 = time.perf_counter()
    cpu0 = time.thread_time()
    if mode == "bare":
        for i, loop in enumerate(loops):
            q: queue.SimpleQueue[tuple[int, Event]] = queue.SimpleQueue()

            def tap(event: Event, i: int = i, q: queue.SimpleQueue[Any] = q) -> None:
                stamps[i].append(time.perf_counter())
                q.put((len(stamps[i]), event))

            def consume(i: int = i, q: queue.SimpleQueue[Any] = q) -> None:
                while True:
                    seq, event = q.get()
                    event.to_dict()
                    record(i, seq)
                    if type(event) is RunEnd:
                        return

            handles.append(loop.start("go", run_id=f"r{i}", tap=tap))
            consumers.append(threading.Thread(target=consume, name=f"bench-consumer-{i}"))
    else:
        index = {f"r{i}": i for i in range(n)}
        original = registry_mod._Entry.tap

        def timed_tap(self: Any, event: Event) -> None:
            stamps[index[self.run_id]].append(time.perf_counter())
            original(self, event)

        registry_mod._Entry.tap = timed_tap  # type: ignore[method-assign]
        reg = registry_mod.RunRegistry(max_active=n)
        for i, loop in enumerate(loops):
            rid = reg.start(loop, "go", run_id=f"r{i}")

            def consume_reg(i: int = i, rid: str = rid) -> None:
                assert reg is not None
                for seq, _ in reg.events(rid):
                    record(i, seq)

            consumers.append(threading.Thread(target=consume_reg, name=f"bench-consumer-{i}"))
    start_s = time.perf_counter() - t0
    start_cpu_s = time.thread_time() - cpu0
    for t in consumers:
        t.start()
    go_at[0] = time.perf_counter()
    go.set()
    for t in consumers:
        t.join()
    wall_s = time.perf_counter() - go_at[0]
    rss_after = maxrss_kb()
    if reg is not None:
        states = {s.state for s in reg.list()}
        turns = {s.turns for s in reg.list()}
        reg.close()
    else:
        runs = [h.result(10) for h in handles]
        states = {"completed" if r.succeeded else "failed" for r in runs}
        turns = {r.turn_count for r in runs}
    lat = sorted(d for per in latencies for t_emit, d in per if t_emit >= go_at[0])
    return {
        "mode": mode,
        "runs": n,
        "states": sorted(states),
        "turns": sorted(turns),
        "events": sum(len(s) for s in stamps),
        "start_s": start_s,
        "start_cpu_us": start_cpu_s / n * 1e6,
        "wall_s": wall_s,
        "rss_per_run_kb": (rss_after - rss_before) / n,
        "rss_peak_mb": rss_after / 1024,
        "lat_p50_us": _pct(lat, 0.50) * 1e6,
        "lat_p99_us": _pct(lat, 0.99) * 1e6,
        "lat_n": len(lat),
    }


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def in_child(mode: str, n: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--runs", str(n)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: Optional[Sequence[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP}: {SMOKE_RUNS} runs")
    ap.add_argument("--child", choices=("bare", "registry"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.runs)))
        return
    n = SMOKE_RUNS if args.smoke else args.runs
    floor = in_child("bare", n)
    reg = in_child("registry", n)
    for r in (floor, reg):
        assert r["states"] == ["completed"] and r["turns"] == [TURNS], r
    assert floor["events"] == reg["events"], (floor["events"], reg["events"])
    print(
        f"{n} concurrent runs x {TURNS} turns, tools 1-5 ms, one consumer thread per run, "
        f"{reg['events']} events ({reg['lat_n']} timed after go)"
    )
    rows: list[tuple[str, str, Callable[[dict[str, Any]], float]]] = [
        ("start all runs (wall)", "ms", lambda r: r["start_s"] * 1e3),
        ("start, main-thread CPU per run", "us", lambda r: r["start_cpu_us"]),
        ("wall time (go -> all consumers saw run_end)", "s", lambda r: r["wall_s"]),
        ("peak RSS per active run", "KiB", lambda r: r["rss_per_run_kb"]),
        ("event delivery p50", "us", lambda r: r["lat_p50_us"]),
        ("event delivery p99", "us", lambda r: r["lat_p99_us"]),
    ]
    print(f"{'figure':46} {'registry':>12} {'floor':>12} {'ratio':>7}")
    for label, unit, get in rows:
        a, b = get(reg), get(floor)
        ratio = a / b if b else float("nan")  # a few runs (--smoke) may add no RSS at all
        print(f"{label:46} {a:9.2f} {unit:<3}{b:9.2f} {unit:<3}{ratio:6.2f}x")
        result_line(f"registry {label} vs bare BareLoop.start", a, b, unit=unit)
    print(
        f"peak RSS of the process: registry {reg['rss_peak_mb']:.0f} MiB, floor {floor['rss_peak_mb']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
