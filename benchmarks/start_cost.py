"""Starting many runs: N ``RunRegistry.start()`` calls against N plain thread starts, nothing else in flight.

``concurrency.py`` times its starts while earlier runs already get their
replies, call their tools and end (its start phase is longer than the
shortest model latency), so its "start cost" row also carries the
collector's and the GIL's cost of everything else in flight. Here nothing
is in flight but the runs being started:

- loopctl: N ``RunRegistry.start`` calls, each on a fresh ``BareLoop`` (one
  tool, a scripted model) built before the timing; each run goes as far as
  its first model call and parks there (the model waits on the loop's
  cancel signal). A second row builds each loop inside the timing, as a
  web server that makes one per conversation does (no target);
- the floor: N times, start a plain ``threading.Thread`` that parks on its
  own ``threading.Event``;
- a second floor, what any run pays: N plain threads that each do a run's
  own work before they park (``work_us`` of Python, a calibrated loop, and
  ``objects`` tracked objects kept alive), both measured first by a
  calibration child: ``RunRegistry.start()`` one at a time with the
  collector off, the user CPU per start above a plain thread start's, and
  the tracked objects a started run adds, its loop included. Against it,
  the rest of loopctl's start cost is loopctl's; between it and the plain
  floor is the cost of a thread that works before it parks (the thread that
  started it waits for the GIL once more, and the collector walks more);
- timed from the first start to the last ``start()`` returning (the runs
  started earlier work up to their first model call meanwhile, on the
  same GIL: that is part of starting a run), and to the moment every run
  waits on its model (every thread has started); then every run is
  cancelled (every thread released) and joined, outside the timing.

Each kind runs in a fresh child process on the interpreter's default GC,
the three taking turns, ``--repeat`` times (default 3); the medians are
reported. Figures: start cost (target <= 2x plain threads), CPU per start
(user and kernel, ``getrusage``), and the time spent in cyclic-GC
collections during the starts.

    python benchmarks/start_cost.py              # 10,000 starts
    python benchmarks/start_cost.py --runs 2000
    python benchmarks/start_cost.py --smoke      # 200 starts, to check it runs
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from concurrency import GcClock  # noqa: E402
from run_all import SMOKE, SMOKE_HELP, report  # noqa: E402


def _cpu() -> tuple[float, float, int, int, int]:
    """User and kernel CPU, minor page faults, voluntary and involuntary context switches so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime, ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw


class Arrivals:
    """Counts the runs (threads) that reached their parking place; ``all_in`` is set by the last."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.lock = threading.Lock()
        self.all_in = threading.Event()

    def arrive(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.all_in.set()


def _measure(start_one: Any, n: int, arrivals: Arrivals) -> dict[str, float]:
    clock = GcClock()
    before = _cpu()
    t0 = time.perf_counter()
    for i in range(n):
        start_one(i)
    wall = time.perf_counter() - t0
    after = _cpu()
    if not arrivals.all_in.wait(600):
        raise SystemExit("not every run reached its first model call")
    parked = time.perf_counter() - t0
    gc.callbacks.remove(clock._tick)
    user, system, faults, vcsw, ivcsw = (b - a for a, b in zip(before, after))
    return {"wall": wall, "parked": parked, "user": user, "system": system, "faults": faults, "vcsw": vcsw,
            "ivcsw": ivcsw, "gc": clock.total, "gc_full": clock.full}


def floor_child(n: int, work_us: float = 0.0, objects: int = 0) -> dict[str, float]:
    """N plain threads that park on their own Event; with ``work_us``/``objects``, after a run's work.

    The work: ``work_us`` of Python (a calibrated loop), then ``objects``
    tracked objects kept alive while the thread is parked.
    """
    events = [threading.Event() for _ in range(n)]
    threads: list[threading.Thread] = []
    arrivals = Arrivals(n)
    iterations = round(work_us * _spin_per_us()) if work_us > 0 else 0
    links = max(objects - 20, 0)  # the thread and its Event already count about 20
    works = iterations > 0 or links > 0
    name = "work-floor" if works else "floor"

    def park(ev: threading.Event) -> None:
        arrivals.arrive()
        ev.wait()

    def work_then_park(ev: threading.Event) -> None:
        _spin(iterations)
        held: list[Any] = []
        for _ in range(links):
            held = [held]  # a chain: each object refers to the one before, as a run's do
        park(ev)  # ``held`` stays alive while parked

    body = work_then_park if works else park

    def start_one(i: int) -> None:
        t = threading.Thread(target=body, args=(events[i],), name=f"{name}-{i}", daemon=True)
        t.start()
        threads.append(t)

    out = _measure(start_one, n, arrivals)
    for ev in events:
        ev.set()
    for t in threads:
        t.join()
    return out


def _spin_per_us() -> float:
    """Iterations of ``_spin``'s loop per microsecond of this interpreter (best of 5)."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        _spin(200_000)
        best = min(best, time.perf_counter() - t)
    return 200_000 / (best * 1e6)


def _spin(iterations: int) -> int:
    x = 0
    for i in range(iterations):
        x += i
    return x


def _loop_factory(on_arrive: Callable[[], None]) -> Callable[[], Any]:
    """A maker of fresh loops (one tool, a scripted model) whose model call calls ``on_arrive`` and parks.

    The call waits on the loop's cancel signal, so a cancel ends it.
    """
    from loopctl import BareLoop, Cancelled, ModelRequest, ModelResponse
    from loopctl.testing import ScriptedClient
    from loopctl.tools import tool

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class Parked:
        def __init__(self) -> None:
            self.loop: Any = None

        def __call__(self, request: ModelRequest) -> ModelResponse:
            on_arrive()
            self.loop.cancel_signal().wait()
            raise Cancelled("cancelled while waiting for the model")

    def make() -> BareLoop:
        parked = Parked()
        loop = BareLoop(ScriptedClient([parked]), [add])
        parked.loop = loop
        return loop

    return make


def calibrate_child(n: int) -> dict[str, float]:
    """A run's own work up to its first model call, one start at a time, collector off.

    ``work_us``: user CPU per ``RunRegistry.start()`` (the start and the run's
    work up to its model call) above a plain thread start's; ``objects``:
    tracked objects a started run adds, loop included (it is built per run).
    """
    from loopctl.hosting.registry import RunRegistry

    arrived = threading.Semaphore(0)
    make = _loop_factory(arrived.release)
    registry = RunRegistry(max_active=n + 1, keep_finished_s=600)
    gc.collect()
    gc.disable()
    ids = [registry.start(make(), "warm up")]
    arrived.acquire()
    loops = [make() for _ in range(n)]
    count0 = len(gc.get_objects())
    u0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    for i in range(n):
        ids.append(registry.start(loops[i], "what is i + 1?", run_id=f"run-{i:06d}"))
        arrived.acquire()
    user = resource.getrusage(resource.RUSAGE_SELF).ru_utime - u0
    objects = (len(gc.get_objects()) - count0) / n
    events = [threading.Event() for _ in range(n)]

    def park(ev: threading.Event) -> None:
        arrived.release()
        ev.wait()

    threads: list[threading.Thread] = []
    u0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    for ev in events:  # each thread built inside the timing, as start() builds its run's
        t = threading.Thread(target=park, args=(ev,), name="calibration-floor", daemon=True)
        t.start()
        threads.append(t)
        arrived.acquire()
    plain = resource.getrusage(resource.RUSAGE_SELF).ru_utime - u0
    for ev in events:
        ev.set()
    for t in threads:
        t.join()
    for rid in ids:
        registry.cancel(rid)
    registry.close()
    gc.enable()
    idle = _idle_loop_objects(make)
    return {"work_us": max(user - plain, 0.0) / n * 1e6, "objects": objects + idle}


def _idle_loop_objects(make: Callable[[], Any]) -> float:
    """Tracked objects per idle loop ``make`` builds (after full collections)."""
    gc.collect()
    before = len(gc.get_objects())
    loops = [make() for _ in range(200)]
    gc.collect()
    return (len(gc.get_objects()) - before) / len(loops)


def loopctl_child(n: int, build_inside: bool) -> dict[str, float]:
    from loopctl import Cancelled
    from loopctl.hosting.registry import RunRegistry

    def arrive() -> None:
        if arrivals is not None:
            arrivals.arrive()

    make = _loop_factory(arrive)
    arrivals: Any = None  # the warm-up run is not counted
    registry = RunRegistry(max_active=n + 1, keep_finished_s=600)
    # Warm-up, outside the timing: imports and first-use costs of one whole run.
    warm = registry.start(make(), "warm up")
    registry.cancel(warm)
    try:
        registry.result(warm, timeout=60)
    except Cancelled:
        pass
    ids: list[str] = []
    arrivals = Arrivals(n)
    if build_inside:

        def start_one(i: int) -> None:
            ids.append(registry.start(make(), "what is i + 1?", run_id=f"run-{i:06d}"))

    else:
        loops = [make() for _ in range(n)]

        def start_one(i: int) -> None:
            ids.append(registry.start(loops[i], "what is i + 1?", run_id=f"run-{i:06d}"))

    out = _measure(start_one, n, arrivals)
    for rid in ids:
        registry.cancel(rid)
    for rid in ids:
        try:
            registry.result(rid, timeout=120)
        except Cancelled:
            pass
    registry.close()
    return out


def child(kind: str, n: int, *extra: str) -> dict[str, float]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--runs", str(n), *extra], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"{kind} child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="starts per side (default 10,000)")
    parser.add_argument("--repeat", type=int, default=3, help="child processes per side (default 3)")
    parser.add_argument(SMOKE, action="store_true", help=SMOKE_HELP + " (200 starts, once per side)")
    parser.add_argument("--child", choices=["floor", "work-floor", "calibrate", "loopctl", "loopctl-build"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--work-us", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--objects", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.repeat = 200, 1
    n = args.runs
    if args.child is not None:
        if args.child == "floor":
            out = floor_child(n)
        elif args.child == "work-floor":
            out = floor_child(n, args.work_us, args.objects)
        elif args.child == "calibrate":
            out = calibrate_child(min(n, 1000))
        else:
            out = loopctl_child(n, args.child == "loopctl-build")
        print(json.dumps(out), flush=True)
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{n} starts per side, each run parked in its first model call; default GC; "
          f"{args.repeat} child processes per side; load average {load:.1f} on {os.cpu_count()} CPUs")
    work = child("calibrate", n)
    print(f"  a run's own work up to its first model call (one start at a time, collector off): "
          f"{work['work_us']:.0f} us of Python above a thread start's, {work['objects']:.0f} tracked objects "
          f"(its loop included)")
    work_args = ("--work-us", f"{work['work_us']:.1f}", "--objects", str(round(work["objects"])))
    kinds = ("floor", "work-floor", "loopctl", "loopctl-build")
    sides: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(args.repeat):
        for kind in kinds:
            r = child(kind, n, *(work_args if kind == "work-floor" else ()))
            sides[kind].append(r)
            print(f"  {kind:>13}: {r['wall']:.2f} s, CPU user {r['user']:.2f} s system {r['system']:.2f} s, "
                  f"GC {r['gc']:.2f} s ({int(r['gc_full'])} full); per start: {r['faults'] / n:.1f} page faults, "
                  f"{r['vcsw'] / n:.2f} voluntary and {r['ivcsw'] / n:.2f} involuntary context switches")

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in sides[kind])

    report(f"start cost, {n} RunRegistry.start() calls vs {n} thread starts", med("loopctl", "wall"),
           med("floor", "wall"), unit="s", target="<= 2x")
    report(f"until all {n} runs wait on their model vs all {n} threads started", med("loopctl", "parked"),
           med("floor", "parked"), unit="s")
    report(f"build a loop and start it, {n} times, vs {n} thread starts", med("loopctl-build", "wall"),
           med("floor", "wall"), unit="s")
    report(f"start cost, {n} RunRegistry.start() calls vs {n} threads doing a run's work before they park",
           med("loopctl", "wall"), med("work-floor", "wall"), unit="s")
    report(f"{n} threads doing a run's work before they park vs {n} plain thread starts",
           med("work-floor", "wall"), med("floor", "wall"), unit="s")
    report(f"CPU per start, user (N={n})", med("loopctl", "user") / n * 1e6, med("floor", "user") / n * 1e6,
           unit="us")
    report(f"CPU per start, kernel (N={n})", med("loopctl", "system") / n * 1e6,
           med("floor", "system") / n * 1e6, unit="us")
    report(f"GC time during the starts (N={n})", med("loopctl", "gc"), med("floor", "gc"), unit="s")


if __name__ == "__main__":
    main()
