"""Many concurrent runs in one process (issue 22): N runs through a ``RunRegistry``.

Each run is a fresh ``BareLoop`` (a new conversation) with a
``ScriptedClient`` whose two model calls each wait a latency drawn from
``mean ± 50 %`` (uniform, seeded) on the loop's cancel signal (so a cancel
ends the wait at once, as an HTTP read unblocked on cancel does): model
call -> ``add(a, b)`` tool call -> final answer, default streaming mode.
All N runs are started as fast as one thread can (the loop is built
inside that timing: a web server builds one per conversation). 10 % of the
runs, seeded, are cancelled mid-flight (at 25-75 % of their own latency
sum after their start) by one canceller thread, which times
``cancel()`` -> ``result()`` raising ``Cancelled``.

The floor is N plain threads doing the same waits (each on its own
``threading.Event``, the same 10 % set by the canceller, timed until the
thread has ended) in the same benchmark run. Each side runs in its own
child process, one after the other, so peak RSS and CPU are its own.

Figures, each beside the floor's:
- wall: first start to last run ended, against the ideal (the longest
  latency sum of a run that was not cancelled); target <= 1.2x ideal;
- CPU per run: user and system CPU of the child process (``getrusage``)
  over the starts and the runs, divided by N; target <= 1 ms;
- peak threads (sampled every 50 ms) and RSS per run in flight: (peak RSS
  during the runs - RSS before the first start) / N; target <= 64 KiB;
- cancel latency p50/p99 under that load; target p99 <= 10 ms;
- fresh-loop 2-turn run (model -> tool -> answer, no latency; build, run,
  close), median wall of 400, against a hand-written loop doing the same
  calls; target < 400 us.

- GC: time in cyclic-GC collections and the longest one (``gc.callbacks``).
- wall against the plain threads' wall in the same run; target <= 1.3x
  (with ``--gc on``, the default: the interpreter's own GC settings);
- start cost: the N ``start()`` calls (each building its loop) against
  the N plain thread starts; target <= 2x;
- kernel CPU per run (``ru_stime``) and voluntary / involuntary context
  switches per run (``ru_nvcsw``, ``ru_nivcsw``): where a GIL convoy shows.

Take the default-GC rows at N = 2,000, 5,000 and 10,000 with ``--runs N``.
``--rate R`` starts R runs per second on both sides instead of all at once
(the ideal then counts each run from its turn to start), as a web process
gets them from its requests.

What it showed (issue 22): with the temp dir made lazily and finished runs
compacted, 1,000 runs meet every target; at 10,000 runs in flight a full
collection of the ~185 GC-tracked objects per run (about 1.9 M) holds the
GIL for seconds, the model replies due meanwhile queue thousands of
threads on the GIL, their 5 ms wake-ups eat the CPU the collection needs,
and the stall feeds on itself (one collection took 63 s; 220 s in all).
A finished run leaves no reference cycle (it is freed by refcounting), so
a host can make collections rare: with ``--gc tuned`` (``gc.freeze()``
after start-up, ``TUNED_THRESHOLDS``; docs/running.md) the same 10,000
runs finish in about 1.26x the ideal on a loaded machine, 0.7 ms of CPU
per run, cancel p99 about 6 ms.

What it showed (issue 28, 2 shared cores, Python 3.13): 2,000 runs 1.04x the
plain threads; 5,000 runs 1.07x, or 1.4x to 2.4x when a full collection
lands in a burst of replies; 10,000 runs 2.1x (3.7x with ``--gc off``: the
burst of starts outlasts the shortest latency and saturates the GIL), and
still 1.47x to 1.54x with the starts paced at 500 or 1,000 a second. A run
costs about 1.3 to 1.6 ms of Python over its life (plain threads: 0.15 to
0.3 ms), so one interpreter completes at most some 600 of them a second;
past that, or in a long collection, every reply leaves a thread waiting
for the GIL. docs/running.md has the figures and the design that removes
the thread per waiting run.

The machine may be shared: wall-clock figures (wall, cancel latency) move
with the load; CPU figures are steadier. Run:
``python benchmarks/concurrency.py`` (10,000 runs, mean 5 s: ~1 min with
``--gc off`` or ``--gc tuned``, minutes with the GC on), ``--quick`` (1,000 runs: ~40 s,
what ``run_all.py`` runs), ``--smoke`` (50 runs, mean 0.1 s: a few seconds, to check that it
runs), or ``--runs N --mean S``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_all import SMOKE_HELP, report  # noqa: E402

SEED = 22
CANCEL_SHARE = 0.10
GC_MODE = "on"  # --gc: on (Python's defaults), off (gc.disable()), tuned (docs/running.md)
#: ``--gc tuned``: what docs/running.md recommends to a host holding thousands
#: of runs: start-up objects frozen out of the collector, and thresholds that
#: make young collections rarer and full ones (which walk every run in
#: flight while holding the GIL) rarer still.
TUNED_THRESHOLDS = (50_000, 20, 100)
#: --rate: starts per second on both sides (0: as fast as one thread can).
START_RATE = 0.0


def pace(t0: float, i: int, pause: threading.Event) -> None:
    """With ``--rate``, wait until run ``i``'s turn to start (``i / rate`` seconds after ``t0``)."""
    if START_RATE > 0:
        left = t0 + i / START_RATE - time.perf_counter()
        if left > 0:
            pause.wait(left)


def apply_gc_mode() -> None:
    """Set the cyclic GC as ``--gc`` says (in a child, after its warm-up)."""
    if GC_MODE == "off":
        gc.disable()
    elif GC_MODE == "tuned":
        gc.freeze()
        gc.set_threshold(*TUNED_THRESHOLDS)
FRESH_RUNS = 400
#: --smoke: runs, mean latency (s), fresh-loop runs.
SMOKE_RUNS, SMOKE_MEAN, SMOKE_FRESH_RUNS = 50, 0.1, 20


def plan(n: int, mean: float) -> tuple[list[tuple[float, float]], dict[int, float]]:
    """Each run's two latencies, and the cancelled runs' cancel offsets (seconds after start)."""
    rng = random.Random(SEED)
    lat = [(rng.uniform(0.5 * mean, 1.5 * mean), rng.uniform(0.5 * mean, 1.5 * mean)) for _ in range(n)]
    chosen = rng.sample(range(n), int(n * CANCEL_SHARE))
    cancels = {i: rng.uniform(0.25, 0.75) * sum(lat[i]) for i in chosen}
    return lat, cancels


def rss_bytes() -> int:
    """Resident set size now (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class GcClock:
    """Time spent in cyclic-GC collections (all generations), and the longest one."""

    def __init__(self) -> None:
        self.total = 0.0
        self.longest = 0.0
        self.full = 0
        self._t = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        dt = time.perf_counter() - self._t
        self.total += dt
        self.longest = max(self.longest, dt)
        self.full += info.get("generation") == 2

    def figures(self) -> dict[str, float]:
        return {"gc_total": self.total, "gc_longest": self.longest, "gc_full": self.full}


class Sampler:
    """Peak thread count and peak RSS, sampled every 50 ms on its own thread."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads = 0
        self.rss = 0
        self.thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.threads = max(self.threads, threading.active_count())
            self.rss = max(self.rss, rss_bytes())

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def cancel_all(
    due: list[tuple[float, int]], cancel: Callable[[int], bool], wait_ended: Callable[[int], None]
) -> list[float]:
    """Cancel each run at its due time; the seconds from cancel to the run's end."""
    latencies = []
    pause = threading.Event()
    for at, i in sorted(due):
        left = at - time.perf_counter()
        if left > 0:
            pause.wait(left)
        t0 = time.perf_counter()
        if cancel(i):
            wait_ended(i)
            latencies.append(time.perf_counter() - t0)
    return latencies


def usage() -> tuple[float, float, int, int]:
    """User CPU, kernel CPU, voluntary and involuntary context switches of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime, ru.ru_nvcsw, ru.ru_nivcsw


def finish(
    kind: str, n: int, t0: float, cpu0: tuple[float, float, int, int], rss0: int, sampler: Sampler,
    latencies: list[float], extra: dict[str, Any],
) -> None:
    wall = time.perf_counter() - t0
    cpu1 = usage()
    sampler.close()
    out = {
        "kind": kind,
        "wall": wall,
        "user": cpu1[0] - cpu0[0],
        "system": cpu1[1] - cpu0[1],
        "vcsw": cpu1[2] - cpu0[2],
        "ivcsw": cpu1[3] - cpu0[3],
        "threads": sampler.threads,
        "rss_per_run": max(0, max(sampler.rss, rss_bytes()) - rss0) / n,
        "cancel": latencies,
        **extra,
    }
    print(json.dumps(out), flush=True)


# -- the floor: plain threads ---------------------------------------------------------------


def floor_child(n: int, mean: float) -> None:
    lat, cancels = plan(n, mean)
    events = [threading.Event() for _ in range(n)]
    threads: list[threading.Thread] = []

    def body(i: int) -> None:
        ev = events[i]
        if ev.wait(lat[i][0]):
            return
        _ = 1 + 2  # the tool
        ev.wait(lat[i][1])

    apply_gc_mode()
    rss0 = rss_bytes()
    sampler = Sampler()
    gcc = GcClock()
    cpu0 = usage()
    t0 = time.perf_counter()
    started = []
    pause = threading.Event()
    for i in range(n):
        pace(t0, i, pause)
        t = threading.Thread(target=body, args=(i,), name=f"floor-{i}", daemon=True)
        t.start()
        started.append(time.perf_counter())
        threads.append(t)
    starts = time.perf_counter() - t0

    def cancel(i: int) -> bool:
        events[i].set()
        return True

    latencies = cancel_all([(started[i] + off, i) for i, off in cancels.items()], cancel, lambda i: threads[i].join())
    for t in threads:
        t.join()
    finish("floor", n, t0, cpu0, rss0, sampler, latencies, {"starts": starts, **gcc.figures()})


# -- loopctl --------------------------------------------------------------------------------


def loopctl_child(n: int, mean: float) -> None:
    from loopctl import BareLoop, Cancelled, LoopError, ModelRequest, ModelResponse
    from loopctl.hosting.registry import RunRegistry
    from loopctl.testing import ScriptedClient, call, reply
    from loopctl.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    fresh = fresh_loop_us(BareLoop, ScriptedClient, call, reply, add)
    lat, cancels = plan(n, mean)

    def waiting(seconds: float, response: ModelResponse, box: list[Any]) -> Callable[[ModelRequest], ModelResponse]:
        def item(request: ModelRequest) -> ModelResponse:
            if box[0].wait(seconds):  # the loop's cancel signal: a cancel ends the wait
                raise Cancelled("cancelled while waiting for the model")
            return response

        return item

    def make(i: int) -> Any:
        box: list[Any] = [None]
        l1, l2 = lat[i]
        client = ScriptedClient(
            [waiting(l1, call("add", a=i, b=1), box), waiting(l2, reply(f"{i} + 1 = {i + 1}"), box)]
        )
        loop = BareLoop(client, [add])
        box[0] = loop.cancel_signal()
        return loop

    make(0)  # warm-up: imports, first-use costs
    apply_gc_mode()
    registry = RunRegistry(max_active=n, keep_finished_s=600)
    ids: list[str] = []
    started: list[float] = []
    rss0 = rss_bytes()
    sampler = Sampler()
    gcc = GcClock()
    cpu0 = usage()
    t0 = time.perf_counter()
    pause = threading.Event()
    for i in range(n):
        pace(t0, i, pause)
        ids.append(registry.start(make(i), "what is i + 1?", run_id=f"run-{i:06d}"))
        started.append(time.perf_counter())
    starts = time.perf_counter() - t0

    def wait_ended(i: int) -> None:
        try:
            registry.result(ids[i], timeout=30)
        except Cancelled:
            return
        raise AssertionError(f"run {i} was cancelled but did not end Cancelled")

    latencies = cancel_all(
        [(started[i] + off, i) for i, off in cancels.items()], lambda i: registry.cancel(ids[i]), wait_ended
    )
    failed: dict[str, int] = {}
    for i, rid in enumerate(ids):
        try:
            run = registry.result(rid, timeout=600)
            assert run.output == f"{i} + 1 = {i + 1}", run.output
        except Cancelled as exc:
            if i not in cancels:
                failed[f"Cancelled: {exc}"[:200]] = failed.get(f"Cancelled: {exc}"[:200], 0) + 1
        except LoopError as exc:
            key = f"{type(exc).__name__}: {exc}"[:200]
            failed[key] = failed.get(key, 0) + 1
    extra = {"starts": starts, "failed": failed, **gcc.figures(), "fresh_us": fresh[0], "fresh_floor_us": fresh[1], "fresh_best_us": fresh[2]}
    finish("loopctl", n, t0, cpu0, rss0, sampler, latencies, extra)
    registry.close()


def fresh_loop_us(BareLoop: Any, ScriptedClient: Any, call: Any, reply: Any, add: Any) -> tuple[float, float, float]:
    """Median wall of a fresh loop's 2-turn run (build, run, close), of a hand-written one; best of the first."""
    from loopctl import Message, ModelRequest, ToolResultPart

    def driver() -> float:
        t = time.perf_counter()
        loop = BareLoop(ScriptedClient([call("add", a=1, b=2), reply("3")]), [add])
        loop.run("1 + 2?")
        loop.close()
        return time.perf_counter() - t

    def floor() -> float:
        t = time.perf_counter()
        client = ScriptedClient([call("add", a=1, b=2), reply("3")])
        conversation = [Message.user("1 + 2?")]
        schemas = (add.schema(),)
        while True:
            message = client.complete(ModelRequest(tuple(conversation), None, schemas)).message
            conversation.append(message)
            if not message.tool_calls:
                break
            parts = []
            for c in message.tool_calls:
                out = add.invoke(c.input, None)
                parts.append(ToolResultPart(c.id, c.name, out.text, out.is_error))
            conversation.append(Message.from_tool_results(parts))
        return time.perf_counter() - t

    for _ in range(50):
        driver(), floor()
    ds = [driver() for _ in range(FRESH_RUNS)]
    f = statistics.median(floor() for _ in range(FRESH_RUNS))
    return statistics.median(ds) * 1e6, f * 1e6, min(ds) * 1e6


# -- the parent ----------------------------------------------------------------------------------


def child(kind: str, n: int, mean: float, gc_mode: str, smoke: bool, rate: float = 0.0) -> dict[str, Any]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--runs", str(n), "--mean", str(mean), "--gc", gc_mode,
         "--rate", str(rate), *(["--smoke"] if smoke else [])],
        capture_output=True, text=True, env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{kind} child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="concurrent runs (default 10,000; --quick 1,000)")
    parser.add_argument("--mean", type=float, default=None, help="mean model latency, s (default 5)")
    parser.add_argument("--quick", action="store_true", help="1,000 runs")
    parser.add_argument("--smoke", action="store_true",
                        help=f"{SMOKE_HELP}: {SMOKE_RUNS} runs, mean {SMOKE_MEAN:g} s, {SMOKE_FRESH_RUNS} fresh loops")
    parser.add_argument("--gc", choices=["on", "off", "tuned"], default="on",
                        help="off: gc.disable() in both children during the runs; "
                             "tuned: gc.freeze() and TUNED_THRESHOLDS (docs/running.md)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="starts per second on both sides, as requests would bring them "
                             "(default 0: all N as fast as one thread can)")
    parser.add_argument("--child", choices=["floor", "loopctl"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global GC_MODE, FRESH_RUNS, START_RATE
    GC_MODE = args.gc
    START_RATE = args.rate
    if args.smoke:
        FRESH_RUNS = SMOKE_FRESH_RUNS
    n = args.runs or (SMOKE_RUNS if args.smoke else 1_000 if args.quick else 10_000)
    mean = args.mean if args.mean is not None else SMOKE_MEAN if args.smoke else 5.0
    if args.child == "floor":
        return floor_child(n, mean)
    if args.child == "loopctl":
        return loopctl_child(n, mean)
    lat, cancels = plan(n, mean)
    ideal = max(sum(lat[i]) + (i / args.rate if args.rate > 0 else 0.0) for i in range(n) if i not in cancels)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{n} concurrent runs (model -> tool -> answer), latency {mean:g} s +-50 %, "
          f"{len(cancels)} cancelled mid-flight; cyclic GC {args.gc}; "
          f"{f'{args.rate:g} starts/s' if args.rate > 0 else 'started in one burst'}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    fl = child("floor", n, mean, args.gc, args.smoke, args.rate)
    lc = child("loopctl", n, mean, args.gc, args.smoke, args.rate)
    failed = sum(lc["failed"].values())
    for why, count in lc["failed"].items():
        print(f"FAILED {count} runs: {why}")
    for name, r in (("floor (plain threads)", fl), ("loopctl (RunRegistry)", lc)):
        print(
            f"{name:>22}: wall {r['wall']:.2f} s ({r['wall'] / ideal:.2f}x ideal {ideal:.2f} s; "
            f"starts {r['starts']:.2f} s), CPU/run user {r['user'] / n * 1e3:.3f} ms system "
            f"{r['system'] / n * 1e3:.3f} ms, peak threads {r['threads']}, RSS/run "
            f"{r['rss_per_run'] / 1024:.1f} KiB, cancel p50 {pct(r['cancel'], 0.5) * 1e3:.2f} ms "
            f"p99 {pct(r['cancel'], 0.99) * 1e3:.2f} ms; GC {r['gc_total']:.2f} s in all, "
            f"{r['gc_full']} full, longest {r['gc_longest'] * 1e3:.0f} ms; context switches/run "
            f"voluntary {r['vcsw'] / n:.1f} involuntary {r['ivcsw'] / n:.1f}"
        )
    print(f"fresh loop 2-turn run: median {lc['fresh_us']:.0f} us, best {lc['fresh_best_us']:.0f} us "
          f"(hand-written {lc['fresh_floor_us']:.0f} us; target < 400)")
    tag = f"N={n}" + (", default GC" if GC_MODE == "on" else f", GC {GC_MODE}")
    tag += f", {args.rate:g} starts/s" if args.rate > 0 else ""
    report(f"wall vs plain threads {tag}", lc["wall"], fl["wall"], unit="s", target="<= 1.3x")
    report(f"wall / ideal {tag}", lc["wall"] / ideal, fl["wall"] / ideal, unit="x ideal",
           target="<= 1.2 x ideal")
    report(f"start cost, {n} start() calls vs {n} thread starts", lc["starts"], fl["starts"], unit="s",
           target="<= 2x")
    report(f"CPU per run, user+system {tag}",
           (lc["user"] + lc["system"]) / n * 1e3, (fl["user"] + fl["system"]) / n * 1e3, unit="ms",
           target="<= 1 ms")
    report(f"CPU per run, user {tag}", lc["user"] / n * 1e3, fl["user"] / n * 1e3, unit="ms")
    report(f"CPU per run, kernel (system) {tag}", lc["system"] / n * 1e3, fl["system"] / n * 1e3, unit="ms")
    report(f"context switches per run, voluntary {tag}", lc["vcsw"] / n, fl["vcsw"] / n, unit="switches")
    report(f"context switches per run, involuntary {tag}", lc["ivcsw"] / n, fl["ivcsw"] / n,
           unit="switches")
    report(f"peak threads {tag}", lc["threads"], fl["threads"], unit="threads")
    report(f"RSS per run in flight {tag}", lc["rss_per_run"] / 1024, fl["rss_per_run"] / 1024,
           unit="KiB", target="<= 64 KiB")
    report(f"cancel latency p50 {tag}", pct(lc["cancel"], 0.5) * 1e3, pct(fl["cancel"], 0.5) * 1e3, unit="ms")
    report(f"cancel latency p99 {tag}", pct(lc["cancel"], 0.99) * 1e3, pct(fl["cancel"], 0.99) * 1e3, unit="ms",
           target="<= 10 ms")
    report(f"longest GC pause {tag}", lc["gc_longest"] * 1e3, fl["gc_longest"] * 1e3, unit="ms")
    report("fresh loop 2-turn run wall", lc["fresh_us"], lc["fresh_floor_us"], unit="us", target="< 400 us")
    report(f"runs failed (not cancelled) {tag}", failed, 0, unit="runs", target="= 0 runs")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
