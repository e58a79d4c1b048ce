"""Stress: many runs cancelled at random points; many loops on many threads.

Seeded and gated (Events, Barriers), never timed: each run picks, from a
seeded RNG, how many tool turns it has, whether it streams, whether its
calls run in a parallel wave, and where (if anywhere) it is cancelled. At
the chosen point the model call or tool either blocks until released (the
cancel must win: ``Cancelled``) or only signals and carries on (a true race:
``Completed`` or ``Cancelled``). After every run the history must be exactly
the completed runs' messages, in order, with every tool result right after
its call; no run may hang and no loopctl thread may outlive the test.
"""

from __future__ import annotations

import contextvars
import random
import threading
from typing import Any, Optional

import pytest
from support import WAIT, join_run_threads

from loopctl import (
    BareLoop,
    Cancelled,
    LoopError,
    Message,
    ModelRequest,
    ModelResponse,
    ParallelDispatch,
    Role,
    RunConfig,
)
from loopctl.observers import CallbackObserver, Event, RunEnd
from loopctl.testing import ScriptedClient, calls, reply
from loopctl.tools import Tool, ToolContext

SEED = 20240611
RUNS_PER_LOOP = 100  # x2 loops (streaming and non-streaming) = 200 runs per seed


class Point:
    """Where a run is cancelled: (kind, index) and how the gated code behaves."""

    def __init__(self, kind: str, index: int, block: bool, cooperative: bool) -> None:
        self.kind = kind  # "model" or "tool"
        self.index = index
        self.block = block
        self.cooperative = cooperative
        self.reached = threading.Event()
        self.release = threading.Event()
        self.skip = False  # the run ended without reaching the point (a stray earlier cancel)

    def hit(self, ctx: Optional[ToolContext] = None) -> None:
        self.reached.set()
        if not self.block:
            return
        if self.cooperative and ctx is not None:
            ctx.cancel.wait(WAIT)
        else:
            assert self.release.wait(WAIT), "gate never released"


class Plan:
    """One run's script: tool turns (each 1 or 2 calls), then a final answer."""

    def __init__(self, i: int, rng: random.Random) -> None:
        self.i = i
        self.turns = [rng.choice([1, 1, 2]) for _ in range(rng.randint(0, 3))]
        self.final = f"final answer {i}"
        self.point: Optional[Point] = None
        n_model = len(self.turns) + 1
        n_tools = sum(self.turns)
        mode = rng.choice(["complete", "block", "race"])
        if mode != "complete":
            kind = rng.choice(["model", "tool"]) if n_tools else "model"
            index = rng.randrange(n_model if kind == "model" else n_tools)
            self.point = Point(kind, index, block=(mode == "block"), cooperative=rng.random() < 0.3)
        self.model_calls = 0
        self.tool_calls = 0
        self.lock = threading.Lock()

    def responses(self) -> list[ModelResponse]:
        out = [
            calls(*[("work", {"x": f"{self.i}-{t}-{k}"}) for k in range(n)]) for t, n in enumerate(self.turns)
        ]
        return out + [reply(self.final)]

    def expected_messages(self, input: str, responses: list[ModelResponse]) -> list[Message]:
        msgs = [Message.user(input)]
        for r in responses[:-1]:
            msgs.append(r.message)
            msgs.append(Message.from_tool_results(
                [_result(c.id, c.input["x"]) for c in r.message.tool_calls]
            ))
        msgs.append(responses[-1].message)
        return msgs

    def on_model(self) -> None:
        with self.lock:
            k = self.model_calls
            self.model_calls += 1
        p = self.point
        if p is not None and p.kind == "model" and p.index == k:
            p.hit()

    def on_tool(self, ctx: ToolContext) -> None:
        with self.lock:
            k = self.tool_calls
            self.tool_calls += 1
        p = self.point
        if p is not None and p.kind == "tool" and p.index == k:
            p.hit(ctx)


def _result(call_id: str, x: str) -> Any:
    from loopctl import ToolResultPart

    return ToolResultPart(call_id, "work", f"did {x}", False)


class Router:
    """A model client that plays the current run's plan (a fresh script per run)."""

    model = "router"

    def __init__(self) -> None:
        self.client = ScriptedClient([])
        self.plan: Optional[Plan] = None

    def load(self, plan: Plan, responses: list[ModelResponse]) -> None:
        self.plan = plan

        def gated(resp: ModelResponse) -> Any:
            def item(request: ModelRequest) -> ModelResponse:
                plan.on_model()
                return resp

            return item

        self.client = ScriptedClient([gated(r) for r in responses])

    def complete(self, request: ModelRequest) -> ModelResponse:
        return self.client.complete(request)

    def stream(self, request: ModelRequest) -> Any:
        return self.client.stream(request)


class Work(Tool):
    """Counts its calls against the plan of the run that made them (by run id).

    A call of an abandoned run can start late (queued in the pool when its run
    was cancelled); keyed by ``ctx.run_id`` it can never touch a later run's plan.
    """

    name = "work"
    description = "Does x."
    concurrency_safe = True

    def __init__(self) -> None:
        self.plans: dict[str, Plan] = {}

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.plans[ctx.run_id].on_tool(ctx)
        return f"did {input['x']}"


def _well_formed(history: list[Message]) -> None:
    """Alternation, and every tool result right after its call (ids in order)."""
    for i, m in enumerate(history):
        prev = history[i - 1] if i else None
        if m.role == Role.ASSISTANT:
            assert prev is not None and prev.role == Role.USER, f"assistant at {i} not after a user"
            if m.tool_calls:
                nxt = history[i + 1]
                assert [r.tool_call_id for r in nxt.tool_results] == [c.id for c in m.tool_calls]
        elif m.tool_results:
            assert prev is not None and prev.role == Role.ASSISTANT and prev.tool_calls, f"orphan result at {i}"
        else:  # a run's input: first, or after a final answer
            assert prev is None or (prev.role == Role.ASSISTANT and not prev.tool_calls), f"input at {i}"


def _run_once(
    loop: BareLoop,
    text: str,
    cfg: RunConfig,
    run_id: str,
    point: Optional[Point],
    use_start: bool,
    by_handle: bool,
) -> dict[str, Any]:
    """Start one run (``start()``, or ``run()`` on a worker), cancel it at ``point``.

    Returns ``{"run": Run}`` or ``{"err": LoopError}`` once the run, its
    canceller and its (released) body thread have all finished.
    """
    box: dict[str, Any] = {}
    done = threading.Event()
    handle = None

    def runner() -> None:
        try:
            box["run"] = loop.run(text, cfg, run_id)
        except LoopError as exc:
            box["err"] = exc
        finally:
            done.set()

    if use_start:
        handle = loop.start(text, cfg, run_id)
    else:
        threading.Thread(target=runner, name=f"test-runner-{run_id}", daemon=True).start()

    def cancel(p: Point) -> None:
        if not p.reached.wait(WAIT) or p.skip:
            return
        if handle is not None and (by_handle or not p.block):
            handle.cancel(f"random cancel {run_id}")
        else:  # a run() caller, or a run blocked at its point: a loop-wide cancel is safe too
            loop.cancel(f"random cancel {run_id}")

    canceller = None
    if point is not None:
        canceller = threading.Thread(target=cancel, args=(point,), name=f"test-cancel-{run_id}", daemon=True)
        canceller.start()
    if handle is not None:
        assert handle.wait(WAIT), f"run {run_id} hung"
        try:
            box["run"] = handle.result(0)
        except LoopError as exc:
            box["err"] = exc
    else:
        assert done.wait(WAIT), f"run {run_id} hung"
    if point is not None and not point.reached.is_set():
        point.skip = True  # cancelled before its point by a cancel that outlived the run before
        point.reached.set()
    if canceller is not None:
        canceller.join(WAIT)
        assert not canceller.is_alive()
    if point is not None:
        point.release.set()
    assert (box["run"] if "run" in box else box["err"].run).id == run_id
    join_run_threads(run_id)
    return box


@pytest.mark.slow
@pytest.mark.parametrize("seed", [SEED, SEED + 1, SEED + 2])
@pytest.mark.parametrize("streaming", [False, True], ids=["non_streaming", "streaming"])
def test_runs_cancelled_at_random_points(streaming: bool, seed: int) -> None:
    rng = random.Random(seed * 2 + int(streaming))
    router = Router()
    work = Work()
    ends: list[Event] = []
    outcomes = {"completed": 0, "cancelled": 0}
    expected: list[Message] = []
    with BareLoop(router, [work]) as loop:
        if not streaming:
            loop.set_turn_mode("non_streaming")
        loop.register_observer(CallbackObserver(lambda e: ends.append(e) if isinstance(e, RunEnd) else None))
        for i in range(RUNS_PER_LOOP):
            plan = Plan(i, rng)
            responses = plan.responses()
            router.load(plan, responses)
            text = f"task {i}"
            run_id = f"stress-{int(streaming)}-{i:03d}"
            work.plans[run_id] = plan
            cfg = RunConfig(parallel=ParallelDispatch(rng.choice(["parallel", "sequential"]), 4))
            use_start = rng.random() < 0.5
            by_handle = rng.random() < 0.5
            box = _run_once(loop, text, cfg, run_id, plan.point, use_start, by_handle)
            point = plan.point

            if "run" in box:
                assert box["run"].output == plan.final
                assert point is None or not point.block, f"run {i} blocked at {point.kind} yet completed"
                expected.extend(plan.expected_messages(text, responses))
                outcomes["completed"] += 1
            else:
                err = box["err"]
                assert isinstance(err, Cancelled), f"run {i}: {type(err).__name__}: {err}"
                assert point is not None or loop.session.runs[-1].turn_count == 0
                outcomes["cancelled"] += 1
            history = loop.conversation()
            assert history == expected, f"history diverged after run {i}"
            assert len(loop.machine.pending) == 0
            _well_formed(history)
            assert ends[-1].run_id == run_id and len(ends) == i + 1
            assert not loop.is_running
        assert len(loop.session.runs) == RUNS_PER_LOOP
    assert outcomes["completed"] > 10 and outcomes["cancelled"] > 10, outcomes
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("loopctl-run-")]
    assert leftover == []


TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("TENANT", default="none")


@pytest.mark.slow
def test_eight_loops_on_eight_threads_no_cross_talk() -> None:
    """Flask-style: each request thread owns its loop and client; nothing leaks across."""
    n_threads, rounds = 8, 6
    barrier = threading.Barrier(n_threads)
    failures: list[str] = []
    results: dict[int, list[Any]] = {}

    class Whoami(Tool):
        name = "whoami"
        description = "Says which tenant runs it."
        concurrency_safe = True

        def call(self, input: Any, ctx: ToolContext) -> str:
            return f"tenant={TENANT.get()} session={ctx.session_id} run={ctx.run_id} x={input['x']}"

    def handler(t: int) -> None:
        try:
            TENANT.set(f"t{t}")
            tag = f"T{t}"

            def model_turn(request: ModelRequest) -> ModelResponse:
                barrier.wait(WAIT)  # all eight loops are mid-run at once
                return calls(("whoami", {"x": f"{tag}-a"}), ("whoami", {"x": f"{tag}-b"}))

            script: list[Any] = []
            for r in range(rounds):
                script += [model_turn, reply(f"{tag} answer {r}")]
            client = ScriptedClient(script)
            events: list[Event] = []
            with BareLoop(client, [Whoami()]) as loop:
                if t % 2:
                    loop.set_turn_mode("non_streaming")
                loop.register_observer(CallbackObserver(events.append))
                runs = [loop.run(f"{tag} question {r}", RunConfig(parallel=ParallelDispatch("parallel", 2))) for r in range(rounds)]
                conv = loop.conversation()
                sid = loop.session.id
            assert [r.output for r in runs] == [f"{tag} answer {r}" for r in range(rounds)]
            assert {e.session_id for e in events} == {sid}
            assert {e.run_id for e in events} == {r.id for r in runs}
            for req in client.requests:
                for m in req.messages:
                    for text in [m.text] + [p.output for p in m.tool_results]:
                        for other in range(n_threads):
                            if other != t:
                                assert f"T{other}" not in text and f"t{other} " not in text, text
            results[t] = [conv, runs, sid]
            for m in conv:
                for p in m.tool_results:
                    assert p.output.startswith(f"tenant=t{t} session={sid}")
            assert len(conv) == rounds * 4
        except BaseException as exc:  # reported below; never hang the barrier
            barrier.abort()
            failures.append(f"thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=handler, args=(t,), name=f"test-request-{t}") for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT * 3)
        assert not th.is_alive()
    assert failures == []
    assert len({sid for _, _, sid in results.values()}) == n_threads
