"""Steering speed (issue 6): push->delivery latency, and push throughput from 4 threads.

Latency. One run of TURNS tool turns; every tool call takes 10 ms (a
cancel-aware wait). On even turns a second thread pushes one message at a
seeded offset 0.5-8 ms into the call; the next request (the model stand-in
records when it arrives) must carry it, last, right after the tool result:
delivered at that very boundary. Figures: latency = request arrival - push;
remaining = tool end - push (what the push had to wait for anyway); excess =
request arrival - tool end (the boundary's own cost). Floor: the excess of
the odd turns of the same run, where nothing was pushed. Target: every push
delivered at its boundary, excess <= 1 ms.

Throughput. 4 threads push M messages each while a run is in flight, (a)
parked in a tool, (b) busy draining at boundaries (1 ms tool turns); beside
the floor, 4 threads doing bare ``with lock: list.append`` under the same
run conditions, in the same process. push(str) builds the user message;
push(Message) takes a prebuilt one. At most 10,000 pushed messages wait
undrained (the steering cap), so most pushes of a race are refused; the
figures count accepted and refused pushes alike, and the accepted share is
printed and reported beside them.

Run: ``python benchmarks/steering.py`` (from the repo root; < 60 s; ``--smoke``: 10 turns,
3,000 pushes a thread, once). Besides the prose it
prints ``RESULT`` lines (figure | value | floor | ratio) for ``benchmarks/run_all.py``.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loopctl import (  # noqa: E402
    BareLoop,
    Message,
    ModelRequest,
    ModelResponse,
    RunConfig,
    SessionConfig,
    Tool,
)
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_all import report, smoke_requested  # noqa: E402

TURNS = 200
TOOL_S = 0.010
THREADS = 4
M = 25_000
REPEATS = 5
SMOKE_TURNS, SMOKE_M, SMOKE_REPEATS = 10, 3_000, 1  # --smoke: past the cap too


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# -- latency -----------------------------------------------------------------------------


class TenMs(Tool):
    """A 10 ms tool: announces its start, records its end."""

    name = "work"
    description = "Works for 10 ms."

    def __init__(self) -> None:
        self.started: list[threading.Event] = [threading.Event() for _ in range(TURNS)]
        self.ended = [0.0] * TURNS

    def call(self, input: Any, ctx: Any) -> str:
        n = input["n"]
        self.started[n].set()
        ctx.cancel.wait(TOOL_S)
        self.ended[n] = time.perf_counter()
        return f"step {n}"


def latency(mode: str, seed: int = 6) -> None:
    rng = random.Random(seed)
    tool = TenMs()
    arrived = [0.0] * (TURNS + 1)
    last_text = [""] * (TURNS + 1)

    def step(k: int) -> Callable[[ModelRequest], ModelResponse]:
        def answer(request: ModelRequest) -> ModelResponse:
            arrived[k] = time.perf_counter()
            last_text[k] = request.messages[-1].text
            return call("work", n=k) if k < TURNS else reply("done")

        return answer

    client = ScriptedClient([step(k) for k in range(TURNS + 1)])
    pushed_at = [0.0] * TURNS
    accepted = [False] * TURNS
    with BareLoop(client, [tool], SessionConfig(context_window=0)) as loop:
        loop.set_turn_mode(mode)
        steering = loop.steering()
        pause = threading.Event()  # never set: waits are plain timed sleeps off the GIL

        def pusher() -> None:
            for k in range(0, TURNS, 2):
                if not tool.started[k].wait(30):
                    return
                pause.wait(rng.uniform(0.0005, 0.008))
                pushed_at[k] = time.perf_counter()
                accepted[k] = steering.push(f"guidance {k}")

        th = threading.Thread(target=pusher, name="bench-pusher")
        th.start()
        loop.run("go", RunConfig(max_turns=TURNS + 1))
        th.join()

    lat, rem, exc, floor = [], [], [], []
    at_boundary = late_push = 0
    for k in range(TURNS):
        boundary_cost = arrived[k + 1] - tool.ended[k]
        if k % 2:
            floor.append(boundary_cost)
            continue
        assert accepted[k], f"push {k} refused during its run"
        if pushed_at[k] > tool.ended[k]:
            late_push += 1  # the pusher was scheduled after the tool had ended
            continue
        if last_text[k + 1] == f"guidance {k}":
            at_boundary += 1
        lat.append(arrived[k + 1] - pushed_at[k])
        rem.append(tool.ended[k] - pushed_at[k])
        exc.append(boundary_cost)
    ms = 1000.0
    n = len(lat)
    print(f"latency ({mode}): {n} pushes during a 10 ms tool call; {at_boundary}/{n} delivered at that "
          f"very boundary ({late_push} pushes landed after the tool ended and were not counted)")
    print(f"  latency   median {statistics.median(lat) * ms:6.3f} ms   p99 {_pct(lat, 99) * ms:6.3f} ms")
    print(f"  remaining median {statistics.median(rem) * ms:6.3f} ms   p99 {_pct(rem, 99) * ms:6.3f} ms")
    print(f"  excess    median {statistics.median(exc) * ms:6.3f} ms   p99 {_pct(exc, 99) * ms:6.3f} ms"
          f"   max {max(exc) * ms:6.3f} ms   (target <= 1 ms)")
    print(f"  floor     median {statistics.median(floor) * ms:6.3f} ms   p99 {_pct(floor, 99) * ms:6.3f} ms"
          f"   (same boundary, nothing pushed)")
    report(f"steering boundary excess, median ({mode}) vs nothing pushed",
           statistics.median(exc) * ms, statistics.median(floor) * ms, "ms", target="<= 1 ms")
    report(f"steering boundary excess, p99 ({mode}) vs nothing pushed",
           _pct(exc, 99) * ms, _pct(floor, 99) * ms, "ms", target="<= 1 ms")


# -- throughput --------------------------------------------------------------------------


def _race(fn: Callable[[list[Any]], None], payloads: list[list[Any]]) -> float:
    """Seconds for THREADS threads to each run ``fn`` on their payload, from one barrier."""
    go = threading.Barrier(THREADS + 1)
    done = [0.0] * THREADS

    def worker(i: int) -> None:
        go.wait()
        fn(payloads[i])
        done[i] = time.perf_counter()

    ths = [threading.Thread(target=worker, args=(i,), name=f"bench-{i}") for i in range(THREADS)]
    for t in ths:
        t.start()
    gc.collect()
    gc.disable()
    try:
        go.wait()
        t0 = time.perf_counter()
        for t in ths:
            t.join()
    finally:
        gc.enable()
    return max(done) - t0


class Parked(Tool):
    """Holds the run in flight until released."""

    name = "park"
    description = "Waits."

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def call(self, input: Any, ctx: Any) -> str:
        self.started.set()
        self.release.wait(60)
        return "released"


class Busy(Tool):
    """A 1 ms tool: the run keeps crossing boundaries (and draining) meanwhile."""

    name = "busy"
    description = "Works for 1 ms."

    def __init__(self) -> None:
        self.started = threading.Event()

    def call(self, input: Any, ctx: Any) -> str:
        self.started.set()
        ctx.cancel.wait(0.001)
        return f"ok {input['n']}"


def throughput(kind: str) -> None:
    texts = [[f"t{i}-{n}" for n in range(M)] for i in range(THREADS)]
    messages = [[Message.user(x) for x in row] for row in texts]
    stop = threading.Event()
    tool: Any = Parked() if kind == "parked" else Busy()

    steps = iter(range(10**9))

    def busy_step(request: ModelRequest) -> ModelResponse:
        # Distinct inputs: identical calls would (rightly) trip the loop detector.
        return reply("done") if stop.is_set() else call("busy", n=next(steps))

    script: list[Any] = [call("park"), reply("done")] if kind == "parked" else [busy_step] * 100_000
    with BareLoop(ScriptedClient(script), [tool], SessionConfig(context_window=0)) as loop:
        loop.set_turn_mode("non_streaming")
        handle = loop.start("go", RunConfig(max_turns=1_000_000))
        tool.started.wait(30)
        steering = loop.steering()
        accepted = {"push(str)": 0, "push(Message)": 0}
        counting = ["push(str)"]

        def push_all(row: list[Any]) -> None:
            push = steering.push
            ok = 0
            for x in row:
                ok += push(x)
            with floor_lock:
                accepted[counting[0]] += ok

        floor_lock = threading.Lock()
        sink: list[Any] = []

        def append_all(row: list[Any]) -> None:
            lock = floor_lock
            append = sink.append
            for x in row:
                with lock:
                    append(x)

        results: dict[str, list[float]] = {"push(str)": [], "push(Message)": [], "floor": []}
        for _ in range(REPEATS):
            for name, payload in (("push(str)", texts), ("push(Message)", messages)):
                counting[0] = name
                results[name].append(_race(push_all, payload))
                steering.take_all()  # every race starts with nothing undrained
            results["floor"].append(_race(append_all, texts))
            sink.clear()
        stop.set()
        if kind == "parked":
            tool.release.set()
        handle.result(60)
        steering.take_all()
    total = THREADS * M
    cap = steering.max_messages
    floor = statistics.median(results["floor"])
    print(f"throughput ({kind} run, {THREADS} threads x {M} pushes, median of {REPEATS}):")
    for name, ok in accepted.items():
        # Pushes past the cap on undrained guidance are refused (and store
        # nothing); a refusal is cheaper than an acceptance, so say how many.
        print(f"  {name:<14} accepted {ok:,} of {REPEATS * total:,} pushes "
              f"({ok / (REPEATS * total):.1%}); the rest met the cap of {cap:,} undrained messages")
    for name, xs in results.items():
        s = statistics.median(xs)
        print(f"  {name:<14} {total / s / 1e6:6.2f} M pushes/s   {s / total * 1e9:7.0f} ns/push"
              f"   {s / floor:5.2f}x floor")
    for name in ("push(str)", "push(Message)"):
        report(f"steering {name}, {THREADS} threads, {kind} run vs locked list.append",
               statistics.median(results[name]) / total * 1e9, floor / total * 1e9, "ns/push")
        report(f"steering {name}, {kind} run: pushes accepted (cap {cap:,} undrained)",
               accepted[name] / REPEATS, total, "pushes", better="higher")


def main(argv: Optional[Sequence[str]] = None) -> None:
    global TURNS, M, REPEATS
    if smoke_requested(__doc__.splitlines()[0], argv):
        TURNS, M, REPEATS = SMOKE_TURNS, SMOKE_M, SMOKE_REPEATS
    t0 = time.perf_counter()
    latency("streaming")
    latency("non_streaming")
    throughput("parked")
    throughput("busy")
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
