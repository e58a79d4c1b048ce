"""Cancel latency of a sub-agent tree, depth 3: one ``cancel()`` on the top run stops four runs.

The tree: a top-level loop whose model calls ``level1`` (``loop.as_tool``),
whose model calls ``level2``, whose model calls ``level3``, whose model
calls a tool that waits on its run's cancel signal. Once that tool has
started (a gate), the main thread notes the time and calls ``cancel()`` on
the top run; it notes when ``result()`` raised ``Cancelled`` (the top run's
latency) and when the last of the four runs recorded its end (the tree's).
The same four loops serve every iteration: each is reusable at once.

The floor is the same hand-off written by hand: four threads, each waiting
on its own Event; the cancel sets the first, each woken thread sets the
next (a cancel travelling down the tree), and the figure is when the last
one woke. Prints p50 / p99 / max (ms) and the p99 against the 100 ms
bound. Run from the repo root; a few seconds (``--smoke``: 10 cancels).
"""

from __future__ import annotations

import gc
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_all import report, smoke_requested  # noqa: E402

from loopctl import BareLoop, Cancelled, ModelRequest, ModelResponse, ToolContext, tool  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402

N = 200
SMOKE_N = 10  # cancels with --smoke
DEPTH = 3
WAIT = 10.0
BOUND_MS = 100.0


def delegating(name: str) -> Any:
    """A model that hands its task to ``name`` and answers once the result is in."""

    def respond(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].tool_results:
            return reply("done")
        return call(name) if name == "wait_here" else call(name, task="dig deeper")

    return respond


def build_tree(entered: threading.Event) -> list[BareLoop]:
    @tool(name="wait_here")
    def wait_here(ctx: ToolContext) -> str:
        """Waits for the run's cancel."""
        entered.set()
        ctx.cancel.wait(WAIT)
        return "stopped"

    loops = [BareLoop(ScriptedClient([delegating("wait_here")] * (N + 10)), tools=[wait_here])]
    for level in range(DEPTH, 0, -1):
        below = loops[0]
        name = f"level{level}"
        loops.insert(0, BareLoop(ScriptedClient([delegating(name)] * (N + 10)), tools=[below.as_tool(name, "deeper")]))
    return loops


def measure_tree() -> tuple[list[float], list[float]]:
    entered = threading.Event()
    loops = build_tree(entered)
    top_ms: list[float] = []
    tree_ms: list[float] = []
    for _ in range(N):
        entered.clear()
        handle = loops[0].start("go")
        if not entered.wait(WAIT):
            raise RuntimeError("the tree never reached its leaf tool")
        wall0 = time.time()
        t0 = time.perf_counter()
        handle.cancel("benchmark")
        try:
            handle.result(WAIT)
        except Cancelled:
            pass
        else:
            raise RuntimeError("the top run was not cancelled")
        top_ms.append((time.perf_counter() - t0) * 1000.0)
        ends = []
        for loop in loops:
            run = loop.session.runs[-1]
            if not isinstance(run.stop_reason, Cancelled) or run.end is None or loop.is_running:
                raise RuntimeError(f"a run of the tree did not end cancelled: {run.stop_reason!r}")
            ends.append(run.end)
        tree_ms.append((max(ends) - wall0) * 1000.0)
    for loop in loops:
        loop.close()
    return top_ms, tree_ms


def _level(i: int, events: list[threading.Event], ready: threading.Barrier, woke: list[float]) -> None:
    ready.wait()
    events[i].wait(WAIT)
    woke[i] = time.perf_counter()
    if i + 1 < len(events):
        events[i + 1].set()


def measure_floor() -> list[float]:
    """Four threads woken one after the other by Events: the bare hand-off down a tree."""
    out: list[float] = []
    for _ in range(N):
        events = [threading.Event() for _ in range(DEPTH + 1)]
        ready = threading.Barrier(DEPTH + 2)
        woke = [0.0] * (DEPTH + 1)
        threads = [threading.Thread(target=_level, args=(i, events, ready, woke)) for i in range(DEPTH + 1)]
        for t in threads:
            t.start()
        ready.wait()
        t0 = time.perf_counter()
        events[0].set()
        for t in threads:
            t.join(WAIT)
        out.append((max(woke) - t0) * 1000.0)
    return out


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))]


def show(label: str, xs: list[float]) -> None:
    print(f"  {label:<34} p50 {statistics.median(xs):8.3f} ms   p99 {p99(xs):8.3f} ms   max {max(xs):8.3f} ms")


def main(argv: Optional[Sequence[str]] = None) -> None:
    global N
    if smoke_requested(__doc__.splitlines()[0], argv):
        N = SMOKE_N
    gc.freeze()  # what the imports made is not this benchmark's to collect
    top, tree = measure_tree()
    floor = measure_floor()
    print(f"sub-agent cancel, depth {DEPTH} ({N} cancels; bound {BOUND_MS:.0f} ms)")
    show("top run: cancel() -> Cancelled", top)
    show("whole tree: cancel() -> last end", tree)
    show("floor: hand-written Event chain", floor)
    within = "yes" if max(p99(top), p99(tree)) < BOUND_MS else "NO"
    print(f"  p99 within the {BOUND_MS:.0f} ms bound: {within}")
    report(f"sub-agent cancel p99, depth {DEPTH}, top run", p99(top), p99(floor), unit="ms")
    report(f"sub-agent cancel p99, depth {DEPTH}, whole tree", p99(tree), p99(floor), unit="ms")


if __name__ == "__main__":
    main()
