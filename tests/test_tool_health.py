"""Per-tool breakers: trip, soft refusal, cooldown, one probe, close. Time is injected."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import FakeClock

from loopctl import BareLoop, ConfigError, ToolError, ToolOutput
from loopctl.observers import Event, ToolPost, ToolPre
from loopctl.testing import ScriptedClient, call, reply
from loopctl.tools import DispatchContext, ToolHealthRegistry, ToolPipeline, tool
from loopctl.tools.health import CLOSED, HALF_OPEN, OPEN, unavailable_text
from loopctl.tools.pipeline import Next

WAIT = 10.0


def tripped(threshold: int = 3, cooldown: float = 30.0) -> tuple[ToolHealthRegistry, FakeClock]:
    clock = FakeClock()
    health = ToolHealthRegistry(failure_threshold=threshold, cooldown=cooldown, clock=clock)
    for _ in range(threshold):
        assert health.check("t") is None
        health.record("t", False)
    return health, clock


def test_breaker_trips_after_consecutive_failures_only() -> None:
    health = ToolHealthRegistry(failure_threshold=3, clock=FakeClock())
    for outcome in (False, False, True, False, False):  # a success resets the count
        health.record("t", outcome)
    assert health.state("t") == CLOSED and health.check("t") is None
    health.record("t", False)
    assert health.state("t") == OPEN
    assert health.check("t") == "Tool 't' is temporarily unavailable after 3 consecutive failures"
    assert health.check("other") is None  # per tool


def test_default_threshold_is_five() -> None:
    health = ToolHealthRegistry(clock=FakeClock())
    for _ in range(4):
        health.record("t", False)
    assert health.check("t") is None
    health.record("t", False)
    assert health.check("t") == unavailable_text("t", 5)


def test_cooldown_then_exactly_one_probe_and_its_success_closes() -> None:
    health, clock = tripped(cooldown=30.0)
    clock.now += 29.999
    assert health.check("t") is not None
    clock.now += 0.001
    assert health.check("t") is None  # the probe
    assert health.state("t") == HALF_OPEN
    assert health.check("t") == unavailable_text("t", 3)  # others wait for the probe
    health.record("t", True)
    assert health.state("t") == CLOSED
    assert health.check("t") is None and health.health("t").consecutive_failures == 0


def test_a_failed_probe_reopens_for_another_cooldown() -> None:
    health, clock = tripped(cooldown=10.0)
    clock.now += 10
    assert health.check("t") is None
    health.record("t", False)
    assert health.state("t") == OPEN
    clock.now += 9
    assert health.check("t") is not None
    clock.now += 1
    assert health.check("t") is None


def test_a_probe_that_never_reports_expires_after_a_cooldown() -> None:
    health, clock = tripped(cooldown=10.0)
    clock.now += 10
    assert health.check("t") is None  # probe started, never recorded (run cancelled)
    clock.now += 9
    assert health.check("t") is not None
    clock.now += 1
    assert health.check("t") is None  # a fresh probe


def test_reset_and_snapshot() -> None:
    health, _ = tripped()
    health.record("u", False)
    snap = health.snapshot()
    assert (snap["t"].state, snap["t"].consecutive_failures) == (OPEN, 3)
    assert (snap["u"].state, snap["u"].consecutive_failures) == (CLOSED, 1)
    health.reset("t")
    assert health.check("t") is None
    health.reset()
    assert health.snapshot() == {}


@pytest.mark.parametrize(
    "kwargs, message",
    [({"failure_threshold": 0}, "failure_threshold must be an int >= 1"), ({"cooldown": -1}, "cooldown must be a finite number of seconds >= 0, got -1")],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ToolHealthRegistry(**kwargs)


def test_concurrent_records_are_counted_exactly() -> None:
    health = ToolHealthRegistry(failure_threshold=10_000, clock=FakeClock())
    barrier = threading.Barrier(4)

    def worker() -> None:
        barrier.wait()
        for _ in range(500):
            health.record("t", False)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert health.health("t").consecutive_failures == 2000


# -- inside a loop -------------------------------------------------------------------------------


def test_tripped_tool_is_refused_softly_without_running_then_probed_and_closed() -> None:
    ran: list[int] = []
    fail = [True]

    @tool
    def shaky(n: int) -> str:
        """Shaky."""
        ran.append(n)
        if fail[0]:
            raise ToolError("down")
        return f"up {n}"

    clock = FakeClock()
    health = ToolHealthRegistry(failure_threshold=2, cooldown=60.0, clock=clock)

    def advance_then_heal(request: Any) -> Any:
        clock.now += 60  # the cooldown passes while the model thinks
        fail[0] = False
        return call("shaky", n=4)

    script: list[Any] = [call("shaky", n=1), call("shaky", n=2), call("shaky", n=3), advance_then_heal, call("shaky", n=5), reply("done")]
    with BareLoop(ScriptedClient(script), [shaky]) as loop:
        loop.set_health_registry(health)
        events: list[Event] = []
        run = loop.start("go", tap=events.append).result(WAIT)
        outs = [(r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]
    assert run.output == "done"
    assert ran == [1, 2, 4, 5]  # call 3 never ran
    assert outs == [
        ("Tool 'shaky' failed: down", True),
        ("Tool 'shaky' failed: down", True),
        ("Tool 'shaky' is temporarily unavailable after 2 consecutive failures", True),
        ("up 4", False),  # the probe
        ("up 5", False),  # closed again
    ]
    assert health.state("shaky") == CLOSED
    # The refused call still gets its pre/post pair (it did not run: duration 0).
    posts = [e for e in events if isinstance(e, ToolPost)]
    assert [p.duration_ms for p in posts][2] == 0.0
    assert len([e for e in events if isinstance(e, ToolPre)]) == 5


def test_gated_on_the_requested_name_recorded_under_the_resolved_name() -> None:
    @tool
    def old_api() -> str:
        """Old."""
        return "old"

    @tool
    def new_api() -> str:
        """New."""
        raise ToolError("new is down")

    def route(ctx: DispatchContext, next: Next) -> ToolOutput:
        if ctx.tool_name == "old_api":
            ctx.tool_name = "new_api"
        return next(ctx)

    health = ToolHealthRegistry(failure_threshold=1, clock=FakeClock())
    with BareLoop(ScriptedClient([call("old_api"), call("old_api"), reply("done")]), [old_api, new_api]) as loop:
        loop.set_health_registry(health)
        loop.set_pipeline(ToolPipeline.builder().with_middleware(route))
        loop.run("go")
        outs = [r.output for m in loop.conversation() for r in m.tool_results]
    # The failure was recorded under the resolved name; the gate asks about the requested
    # name, which stays healthy, so the second call runs (and fails) again.
    assert health.state("new_api") == OPEN
    assert health.state("old_api") == CLOSED
    assert outs == ["Tool 'new_api' failed: new is down", "Tool 'new_api' failed: new is down"]


def test_a_tripped_breaker_stops_recovery_retries() -> None:
    from loopctl.tools import Retry

    ran: list[int] = []

    @tool
    def down() -> str:
        """Down."""
        ran.append(1)
        raise ToolError("x")

    class AlwaysRetry:
        def decide(self, analysis: Any, attempt: int, max_attempts: int) -> Retry:
            return Retry(0.0)

    health = ToolHealthRegistry(failure_threshold=2, clock=FakeClock())
    with BareLoop(ScriptedClient([call("down"), reply("done")]), [down]) as loop:
        loop.set_health_registry(health)
        loop.set_recovery_strategy(AlwaysRetry())
        run = loop.run("go")
        (result,) = [r for m in loop.conversation() for r in m.tool_results]
    assert run.output == "done"
    assert len(ran) == 2  # the third attempt met an open breaker: no run, no more retries
    assert result.output == "Tool 'down' is temporarily unavailable after 2 consecutive failures"
