"""Per-turn overhead of ``BareLoop`` against a hand-written loop (issue 3).

One run of N turns (N = 50, 200, 1000); every turn is one model call that
asks for one call of a trivial tool; then a final reply. Scripted client,
non-streaming, no observers. The floor is a hand-written loop doing the
same work in the same process: the same scripted client, a request over the
whole conversation each turn, ``Tool.invoke``, the assistant message and ONE
tool-result message appended per turn.

Prints, per N: µs per turn for both, the ratio, and the growth of the
driver's µs/turn from N=50 to N=1000. Targets: <= 50 µs/turn, growth <= 1.3x.

Run: ``python benchmarks/turn_overhead.py`` (from the repo root; < 60 s).
Set ``PROFILE=1`` to print the top cProfile costs of one N=1000 run.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loopctl import BareLoop, Message, ModelRequest, RunConfig, Tool  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402

SIZES = (50, 200, 1000)
REPEATS = 7


class Noop(Tool):
    """The trivial tool: returns a constant."""

    name = "noop"
    description = "Does nothing."

    def call(self, input: Any, ctx: Any) -> str:
        return "ok"


def script(n: int) -> list[Any]:
    """N tool-calling replies and a final answer (built outside the timing)."""
    return [call("noop") for _ in range(n)] + [reply("done")]


def driver_once(n: int) -> float:
    """Seconds for one BareLoop run of n tool turns (+ the final reply)."""
    client = ScriptedClient(script(n))
    with BareLoop(client, [Noop()]) as loop:
        loop.set_turn_mode("non_streaming")
        cfg = RunConfig(max_turns=n + 1)
        t0 = time.perf_counter()
        run = loop.run("go", cfg)
        dt = time.perf_counter() - t0
    assert run.turn_count == n + 1 and run.tool_call_count == n, run
    return dt


def floor_once(n: int) -> float:
    """Seconds for a hand-written loop doing the same work."""
    client = ScriptedClient(script(n))
    tool = Noop()
    tools = {tool.name: tool}
    schemas = (tool.schema(),)
    t0 = time.perf_counter()
    conversation: list[Message] = [Message.user("go")]
    while True:
        response = client.complete(ModelRequest(tuple(conversation), None, schemas))
        message = response.message
        conversation.append(message)
        if not message.tool_calls:
            break
        results = []
        from loopctl.messages import ToolResultPart

        for c in message.tool_calls:
            out = tools[c.name].invoke(c.input, None)  # type: ignore[arg-type]
            results.append(ToolResultPart(c.id, c.name, out.text, out.is_error))
        conversation.append(Message.from_tool_results(results))
    dt = time.perf_counter() - t0
    assert len(conversation) == 2 * n + 2
    return dt


def best(fn: Any, n: int) -> float:
    """Median of REPEATS runs, GC disabled inside each (collected between)."""
    samples = []
    for _ in range(REPEATS):
        gc.collect()
        gc.disable()
        try:
            samples.append(fn(n))
        finally:
            gc.enable()
    return statistics.median(samples)


def profile(n: int = 1000) -> None:
    """Print the top costs of one driver run (cumulative and own time)."""
    import cProfile
    import pstats

    client = ScriptedClient(script(n))
    with BareLoop(client, [Noop()]) as loop:
        loop.set_turn_mode("non_streaming")
        prof = cProfile.Profile()
        # The run's body executes on its own thread: profile that thread.
        import threading

        threading.setprofile(None)
        orig = loop._body

        def body(rc: Any) -> None:
            prof.enable()
            try:
                orig(rc)
            finally:
                prof.disable()

        loop._body = body  # type: ignore[method-assign]
        loop.run("go", RunConfig(max_turns=n + 1))
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(25)


def main() -> None:
    for n in SIZES[:1]:  # warm-up (imports, first-run costs)
        driver_once(n)
        floor_once(n)
    per_turn: dict[int, float] = {}
    print(f"{'N':>6} {'driver us/turn':>15} {'floor us/turn':>14} {'ratio':>7} {'overhead us/turn':>17}")
    for n in SIZES:
        d = best(driver_once, n) / n * 1e6
        f = best(floor_once, n) / n * 1e6
        per_turn[n] = d
        print(f"{n:>6} {d:>15.1f} {f:>14.1f} {d / f:>7.2f} {d - f:>17.1f}")
    growth = per_turn[SIZES[-1]] / per_turn[SIZES[0]]
    print(f"growth N={SIZES[0]}->{SIZES[-1]}: {growth:.2f}x (target <= 1.3x)")
    worst = max(per_turn.values())
    print(f"worst driver cost: {worst:.1f} us/turn (target <= 50 us/turn)")
    if os.environ.get("PROFILE"):
        profile()


if __name__ == "__main__":
    main()
