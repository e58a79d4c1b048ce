"""Per-turn overhead of ``BareLoop`` against a hand-written loop (issue 3).

One run of N turns (N = 50, 200, 1000); every turn is one model call that
asks for one call of a trivial tool; then a final reply. Scripted client,
non-streaming, no observers, default components (token meter, loop and
convergence detectors, context manager). The floor is a hand-written loop
doing the same work in the same process: the same scripted client, a
request over the whole conversation each turn, ``Tool.invoke``, the
assistant message and ONE tool-result message appended per turn.

Prints, per N: µs per turn for both, the ratio, and the growth of the
driver's µs/turn from N=50 to N=1000; then a fit of total(N) = fixed +
N * marginal. Targets: <= 50 µs/turn, growth <= 1.3x.

Two clocks: wall time (``perf_counter``) and CPU time (``thread_time`` of
the run's own thread plus the caller's). On a shared machine wall time also
counts the time other processes held the CPU; CPU time does not, so it is
the steadier figure. (``process_time`` is no use here: in this sandbox the
CPU of a thread that has exited is not reliably added to the process.)
Each figure is the best of REPEATS, GC off.

When smolagents is installed, a peer row: the marginal CPU per turn
(N=50 -> N=200) of loopctl, the hand-written loop and a smolagents
``ToolCallingAgent`` doing the same turns with a fake model (no network),
in the same run; target: loopctl within 0.15x of smolagents.

Run: ``python benchmarks/turn_overhead.py`` (from the repo root; < 60 s).
Set ``PROFILE=1`` to print the top cProfile costs of one N=1000 run. ``--smoke``: N = 10,
20, 40, once each.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run_all import report, smoke_requested  # noqa: E402

from loopctl import BareLoop, Message, ModelRequest, RunConfig, Tool, ToolResultPart  # noqa: E402
from loopctl.driver.run import RunDriver  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402


@contextlib.contextmanager
def run_bodies(wrap: Callable[[Callable[[Any], None]], Callable[[Any], None]]) -> Iterator[None]:
    """Every run's body (``RunDriver.body``, on the run's own thread) wrapped while in the block."""
    orig = RunDriver.body
    RunDriver.body = wrap(orig)  # type: ignore[method-assign]
    try:
        yield
    finally:
        RunDriver.body = orig  # type: ignore[method-assign]

SIZES = (50, 200, 1000)
REPEATS = 9
#: --smoke: small runs, once each, and the smolagents row at its smallest.
SMOKE_SIZES, SMOKE_REPEATS, SMOKE_SMOL_SIZES = (10, 20, 40), 1, (10, 20)


class Noop(Tool):
    """The trivial tool: returns a constant."""

    name = "noop"
    description = "Does nothing."

    def call(self, input: Any, ctx: Any) -> str:
        return "ok"


def script(n: int) -> list[Any]:
    """N tool-calling replies and a final answer (built outside the timing).

    Each call has its own input, as a real agent's do: the default loop
    detector stops ten identical (tool, input, result) calls in a row.
    """
    return [call("noop", step=k) for k in range(n)] + [reply("done")]


Clock = tuple[float, float]  # (wall seconds, cpu seconds)


def _now() -> Clock:
    return time.perf_counter(), time.thread_time()


def _since(t0: Clock) -> Clock:
    w, c = _now()
    return w - t0[0], c - t0[1]


def driver_once(n: int) -> Clock:
    """One BareLoop run of n tool turns (+ the final reply)."""
    client = ScriptedClient(script(n))
    with BareLoop(client, [Noop()]) as loop:
        loop.set_turn_mode("non_streaming")
        body_cpu: list[float] = []
        clocked_out = threading.Event()

        def clocking(body: Callable[[Any], None]) -> Callable[[Any], None]:
            def clocked(driver: Any) -> None:  # the run's body runs on its own thread: clock it there
                t = time.thread_time()
                try:
                    body(driver)
                finally:
                    body_cpu.append(time.thread_time() - t)
                    clocked_out.set()

            return clocked

        cfg = RunConfig(max_turns=n + 1)
        with run_bodies(clocking):
            t0 = _now()
            run = loop.run("go", cfg)
            wall, caller_cpu = _since(t0)
        # run() returns once the run has ended, which can be a moment before its
        # body returns on the run's thread: wait for the body's own clock.
        assert clocked_out.wait(30.0), "the run's body never returned"
    assert run.turn_count == n + 1 and run.tool_call_count == n, run
    return wall, caller_cpu + body_cpu[0]


def floor_once(n: int) -> Clock:
    """A hand-written loop doing the same work."""
    client = ScriptedClient(script(n))
    tool = Noop()
    tools = {tool.name: tool}
    schemas = (tool.schema(),)
    t0 = _now()
    conversation: list[Message] = [Message.user("go")]
    while True:
        response = client.complete(ModelRequest(tuple(conversation), None, schemas))
        message = response.message
        conversation.append(message)
        if not message.tool_calls:
            break
        results = []
        for c in message.tool_calls:
            out = tools[c.name].invoke(c.input, None)  # type: ignore[arg-type]
            results.append(ToolResultPart(c.id, c.name, out.text, out.is_error))
        conversation.append(Message.from_tool_results(results))
    dt = _since(t0)
    assert len(conversation) == 2 * n + 2
    return dt


# -- a peer: smolagents (when installed) -------------------------------------------------------

SMOL_SIZES = (50, 200)
SMOL_REPEATS = 3


def smol_once_factory() -> Optional[Callable[[int], Clock]]:
    """A smolagents ``ToolCallingAgent`` run of n tool turns with a fake model; None if not installed.

    The same work as the driver's run: each model reply (no network; built
    on the spot, as ScriptedClient replays its script) asks for one call of
    a trivial tool, then a ``final_answer`` call ends the run. Logging off.
    """
    try:
        from smolagents import ChatMessage, Model, ToolCallingAgent
        from smolagents import tool as smol_tool
        from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction, MessageRole
        from smolagents.monitoring import LogLevel
    except ImportError:
        return None

    def noop(step: int) -> str:
        """Does nothing.

        Args:
            step: the step number.
        """
        return "ok"

    with warnings.catch_warnings():  # it warns of "decorators" on any function not defined at module level
        warnings.simplefilter("ignore")
        noop_tool = smol_tool(noop)

    class FakeModel(Model):  # type: ignore[misc]
        def __init__(self, n: int) -> None:
            super().__init__(model_id="fake")
            self.n, self.k = n, 0

        def generate(self, messages: Any, stop_sequences: Any = None, response_format: Any = None,
                     tools_to_call_from: Any = None, **kw: Any) -> Any:
            k = self.k
            self.k += 1
            if k < self.n:
                fn = ChatMessageToolCallFunction(arguments={"step": k}, name="noop")
            else:
                fn = ChatMessageToolCallFunction(arguments={"answer": "done"}, name="final_answer")
            call = ChatMessageToolCall(fn, id=f"call-{k}", type="function")
            return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[call])

    def smol_once(n: int) -> Clock:
        agent = ToolCallingAgent(tools=[noop_tool], model=FakeModel(n), max_steps=n + 2, verbosity_level=LogLevel.OFF)
        t0 = _now()
        out = agent.run("go")
        dt = _since(t0)
        assert out == "done", out
        return dt

    return smol_once


def peer_row(smol_once: Callable[[int], Clock]) -> None:
    """Marginal CPU per turn (N=50 -> N=200) of loopctl, the hand-written loop and smolagents."""
    lo, hi = SMOL_SIZES
    smol_once(lo)  # warm-up

    def marginal(fn: Callable[[int], Clock], repeats: int) -> float:
        a = min(fn(lo)[1] for _ in range(repeats))
        b = min(fn(hi)[1] for _ in range(repeats))
        return (b - a) / (hi - lo) * 1e6

    d = marginal(lambda n: best(driver_once, n), 1)
    f = marginal(lambda n: best(floor_once, n), 1)
    sm = marginal(smol_once, SMOL_REPEATS)
    print(f"marginal CPU per turn N={lo}->{hi}: loopctl {d:.1f} us, hand-written {f:.1f} us, "
          f"smolagents {sm:.1f} us; loopctl / smolagents {d / sm:.3f}x (target <= 0.15x)")
    report(f"marginal CPU per turn N={lo}->{hi}, loopctl vs smolagents", d, sm, unit="us",
           target="<= 0.15x")
    report(f"marginal CPU per turn N={lo}->{hi}, loopctl vs hand-written loop", d, f, unit="us")


def best(fn: Callable[[int], Clock], n: int) -> Clock:
    """Best wall and best CPU time of REPEATS runs, GC off inside each."""
    samples = []
    for _ in range(REPEATS):
        gc.collect()
        gc.disable()
        try:
            samples.append(fn(n))
        finally:
            gc.enable()
    return min(s[0] for s in samples), min(s[1] for s in samples)


def profile(n: int = 1000) -> None:
    """Print the top costs of one driver run (own time and cumulative)."""
    import cProfile
    import pstats

    client = ScriptedClient(script(n))
    with BareLoop(client, [Noop()]) as loop:
        loop.set_turn_mode("non_streaming")
        prof = cProfile.Profile()

        def profiling(orig: Callable[[Any], None]) -> Callable[[Any], None]:
            def body(driver: Any) -> None:  # the run's body executes on its own thread: profile that
                prof.enable()
                try:
                    orig(driver)
                finally:
                    prof.disable()

            return body

        with run_bodies(profiling):
            loop.run("go", RunConfig(max_turns=n + 1))
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(30)


def main(argv: Optional[Sequence[str]] = None) -> None:
    global SIZES, REPEATS, SMOL_SIZES, SMOL_REPEATS
    if smoke_requested(__doc__.splitlines()[0], argv):
        SIZES, REPEATS, SMOL_SIZES, SMOL_REPEATS = SMOKE_SIZES, SMOKE_REPEATS, SMOKE_SMOL_SIZES, 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"one run of N tool turns, non-streaming, no observers; best of {REPEATS}; "
        f"load average {load:.1f}"
    )
    driver_once(SIZES[0])  # warm-up: imports, first-run costs
    floor_once(SIZES[0])
    results: dict[int, tuple[Clock, Clock]] = {}
    print(f"{'':>6} {'--------- wall us/turn ---------':>34} {'---------- cpu us/turn ----------':>35}")
    print(f"{'N':>6} {'driver':>9} {'floor':>8} {'ratio':>7} {'over':>7}   {'driver':>9} {'floor':>8} {'ratio':>7} {'over':>7}")
    for n in SIZES:
        d, f = best(driver_once, n), best(floor_once, n)
        results[n] = (d, f)
        dw, fw, dc, fc = d[0] / n * 1e6, f[0] / n * 1e6, d[1] / n * 1e6, f[1] / n * 1e6
        print(
            f"{n:>6} {dw:>9.1f} {fw:>8.1f} {dw / fw:>7.2f} {dw - fw:>7.1f}   "
            f"{dc:>9.1f} {fc:>8.1f} {dc / fc:>7.2f} {dc - fc:>7.1f}"
        )
        report(f"turn overhead N={n}, CPU per turn vs hand-written loop", dc, fc, unit="us")
    lo, hi = SIZES[0], SIZES[-1]
    for k, name in ((0, "wall"), (1, "cpu")):
        per = {n: results[n][0][k] / n * 1e6 for n in SIZES}
        marginal = (results[hi][0][k] - results[lo][0][k]) / (hi - lo) * 1e6
        fixed = results[lo][0][k] * 1e6 - marginal * lo
        report(f"growth of {name} per turn N={lo}->{hi}", per[hi], per[lo], unit="us/turn", target="<= 1.3x")
        print(
            f"{name:>4}: growth N={lo}->{hi} {per[hi] / per[lo]:.2f}x (target <= 1.3x); "
            f"worst {max(per.values()):.1f} us/turn (target <= 50); "
            f"fit: marginal {marginal:.1f} us/turn + fixed {fixed:.0f} us/run"
        )
    smol_once = smol_once_factory()
    if smol_once is None:
        print("smolagents is not installed: no peer row (pip install smolagents)")
    else:
        peer_row(smol_once)
    if os.environ.get("PROFILE"):
        profile()


if __name__ == "__main__":
    main()
