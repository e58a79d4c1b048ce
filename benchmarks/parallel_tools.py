"""Parallel tool dispatch speed (issue 4).

1. Wall time. One turn asks for 8 calls of a concurrency-safe tool that
   sleeps 100 ms. Figure: the tool phase's duration (its ``on_turn_end``,
   phase "tools"), median of REPEATS runs, and its ratio to the ideal
   0.100 s (target <= 1.10x). Floor: a hand-written
   ``ThreadPoolExecutor(8).map`` of the same sleep over 8 items, measured
   in this process right before.

2. Dispatch overhead per call, trivial tool (returns "ok"), through the
   dispatcher (validation, events, hooks/health/detector checks, pipeline,
   result conversion; no model):
   - a wave of 8 concurrency-safe calls (pool hand-off), per call, beside
     the floor: ``pool.map(trivial, 8 items)`` on a warm 8-worker pool, per
     item;
   - a lone call (runs inline on the run's thread), beside the floor:
     one ``pool.submit(trivial).result()`` round trip, and a plain
     function call; and the same with the default loop detector off.
   Also the tool phase per call end to end (its ``on_turn_end`` duration /
   8) for a whole run, which adds building the results message and
   re-measuring the context.

Run: ``python benchmarks/parallel_tools.py`` (from the repo root; < 60 s);
``--smoke``: one repeat, 40 dispatch rounds, in a few seconds (its figures mean little).
"""

from __future__ import annotations

import gc
import itertools
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loopctl import BareLoop, ParallelDispatch, RunConfig  # noqa: E402
from loopctl.driver.run import RunDriver  # noqa: E402
from loopctl.messages import ToolCallPart  # noqa: E402
from loopctl.observers import Event, TurnEnd  # noqa: E402
from loopctl.testing import ScriptedClient, calls, reply  # noqa: E402
from loopctl.tools import tool  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import report, smoke_requested  # noqa: E402

N = 8
SLEEP_S = 0.100
REPEATS = 7
OVERHEAD_ROUNDS = 3000
SMOKE_ROUNDS = 40
PARALLEL = RunConfig(parallel=ParallelDispatch("parallel", N))
_seq = itertools.count()
T = TypeVar("T")


@tool(concurrency_safe=True)
def nap(i: int) -> str:
    """Sleep 100 ms."""
    time.sleep(SLEEP_S)
    return "rested"


@tool(concurrency_safe=True)
def noop(i: int) -> str:
    """Do nothing."""
    return "ok"


def trivial(i: int) -> str:
    return "ok"


def tools_phase_seconds(loop: BareLoop, name: str) -> float:
    events: list[Event] = []
    base = next(_seq) * N  # distinct inputs every run: the loop detector stays quiet
    loop.client.extend([calls(*[(name, {"i": base + i}) for i in range(N)]), reply("done")])  # type: ignore[attr-defined]
    loop.start("go", PARALLEL, tap=events.append).result(30)
    (end,) = [e for e in events if isinstance(e, TurnEnd) and e.phase == "tools"]
    return end.duration_ms / 1000.0


def wall_time(repeats: int) -> None:
    pool = ThreadPoolExecutor(N)
    list(pool.map(lambda _: None, range(N)))  # warm the workers
    floors, ours = [], []
    with BareLoop(ScriptedClient([]), [nap]) as loop:
        loop.set_turn_mode("non_streaming")
        tools_phase_seconds(loop, "nap")  # warm the loop's pool
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(lambda _: time.sleep(SLEEP_S), range(N)))
            floors.append(time.perf_counter() - t0)
            ours.append(tools_phase_seconds(loop, "nap"))
    pool.shutdown()
    f, o = statistics.median(floors), statistics.median(ours)
    print(f"8 x 100 ms tool, one turn (median of {repeats}):")
    print(f"  floor ThreadPoolExecutor.map : {f:.4f} s  ({f / SLEEP_S:.3f}x ideal)")
    print(f"  loopctl tool phase           : {o:.4f} s  ({o / SLEEP_S:.3f}x ideal, {o / f:.3f}x floor)"
          f"  target <= 1.10x ideal: {'ok' if o / SLEEP_S <= 1.10 else 'MISSED'}")
    report("8 x 100 ms tools, one turn: wall vs ideal 0.100 s", o, SLEEP_S, "s", target="<= 1.10x")
    report("8 x 100 ms tools, one turn: wall vs ThreadPoolExecutor.map", o, f, "s")


def per_call(fn: Callable[[], Any], rounds: int, per: int) -> float:
    """Median-of-5 microseconds per item of ``fn`` (which handles ``per`` items)."""
    samples = []
    for _ in range(5):
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        samples.append((time.perf_counter() - t0) / (rounds * per) * 1e6)
    return statistics.median(samples)


def in_run(loop: BareLoop, measure: Callable[[RunDriver], T]) -> T:
    """``measure(driver)`` on a real run's own thread, with the run's fence held, before its steps.

    The dispatcher is driven the way the run's tool phase drives it: on the
    run's thread, lent the run itself (``dispatcher.dispatch(run, turn,
    calls)``), so no run internals are built by hand. The run then goes on
    to its one scripted reply and ends as usual.
    """
    out: list[T] = []
    failed: list[BaseException] = []
    orig = RunDriver.body

    def body(driver: RunDriver) -> None:
        try:
            out.append(measure(driver))
        except BaseException as exc:  # re-raised on the caller's thread below
            failed.append(exc)
        orig(driver)

    loop.client.extend([reply("done")])  # type: ignore[attr-defined]
    RunDriver.body = body  # type: ignore[method-assign]
    try:
        loop.run("bench", PARALLEL)
    finally:
        RunDriver.body = orig  # type: ignore[method-assign]
    if failed:
        raise failed[0]
    return out[0]


def overhead(rounds: int, e2e_runs: int) -> None:
    rounds_lone = rounds
    rounds_wave = max(1, rounds // 4)
    # Distinct inputs, so the default loop detector sees no repetition (it stays on).
    ids = itertools.count()

    def wave() -> list[ToolCallPart]:
        return [ToolCallPart(f"c{k}", "noop", {"i": k}) for k in itertools.islice(ids, N)]

    def lone() -> list[ToolCallPart]:
        k = next(ids)
        return [ToolCallPart(f"c{k}", "noop", {"i": k})]

    def dispatching(make: Callable[[], list[ToolCallPart]], rounds: int, per: int) -> Callable[[RunDriver], float]:
        def measure(run: RunDriver) -> float:
            batches = iter([make() for _ in range(rounds * 5)])  # built outside the timing
            return per_call(lambda: run.dispatcher.dispatch(run, 0, next(batches)), rounds, per)

        return measure

    pool = ThreadPoolExecutor(N)
    items = list(range(N))
    floor_map = per_call(lambda: list(pool.map(trivial, items)), rounds_wave, N)
    floor_submit = per_call(lambda: pool.submit(trivial, 0).result(), rounds_lone, 1)
    floor_plain = per_call(lambda: trivial(0), rounds_lone * 10, 1)
    pool.shutdown()
    with BareLoop(ScriptedClient([]), [noop]) as loop:
        loop.set_turn_mode("non_streaming")
        wave_us = in_run(loop, dispatching(wave, rounds_wave, N))
        lone_us = in_run(loop, dispatching(lone, rounds_lone, 1))
    with BareLoop(ScriptedClient([]), [noop]).with_loop_detector(None) as bare:
        bare.set_turn_mode("non_streaming")
        bare_us = in_run(bare, dispatching(lone, rounds_lone, 1))

    with BareLoop(ScriptedClient([]), [noop]) as e2e:
        e2e.set_turn_mode("non_streaming")
        tools_phase_seconds(e2e, "noop")
        phase_us = statistics.median(tools_phase_seconds(e2e, "noop") for _ in range(e2e_runs)) / N * 1e6

    print("dispatch overhead per call, trivial tool:")
    print(f"  wave of 8    : {wave_us:7.1f} us/call   floor pool.map(8 items): {floor_map:6.1f} us/item"
          f"  ({wave_us / floor_map:.2f}x floor)")
    print(f"  lone (inline): {lone_us:7.1f} us/call   floor submit().result(): {floor_submit:6.1f} us"
          f"  ({lone_us / floor_submit:.2f}x floor); plain call {floor_plain:.2f} us")
    print(f"  lone, loop detector off: {bare_us:.1f} us/call (the default detector's record() is the rest)")
    report("dispatch per call, wave of 8 trivial tools vs pool.map item", wave_us, floor_map, "us")
    report("dispatch per call, lone trivial tool (inline) vs submit().result()", lone_us, floor_submit, "us")
    print(f"  end to end tool phase, wave of 8 (results message + re-measure): {phase_us:.1f} us/call")


def main(argv: Optional[Sequence[str]] = None) -> None:
    smoke = smoke_requested(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    wall_time(1 if smoke else REPEATS)
    overhead(SMOKE_ROUNDS if smoke else OVERHEAD_ROUNDS, 3 if smoke else 50)
    print(f"(benchmark took {time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
