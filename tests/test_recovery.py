"""Recovery: reflector and strategy, retries with corrections, backoff, the ceiling."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Optional

import pytest

from loopctl import BareLoop, Cancelled, ParallelDispatch, RunConfig, ToolRecoveryExhausted
from loopctl.messages import ToolSchema
from loopctl.observers import Event, ToolPost, ToolPre
from loopctl.testing import ScriptedClient, call, calls, reply
from loopctl.tools import (
    AskUser,
    Correction,
    ExponentialBackoffRecovery,
    Fail,
    FailureAnalysis,
    NoopReflector,
    ReflectionContext,
    Retry,
    Severity,
    Skip,
    ToolError,
    tool,
)

WAIT = 10.0


class Flaky:
    """A tool that fails its first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.inputs: list[dict[str, Any]] = []

        @tool(concurrency_safe=True)
        def flaky(n: int) -> str:
            """Sometimes fails."""
            self.inputs.append({"n": n})
            if len(self.inputs) <= self.failures:
                raise ToolError(f"failure {len(self.inputs)}")
            return f"ok {n}"

        self.tool = flaky


class Recoverable:
    """A reflector that calls every failure recoverable, with an optional correction."""

    def __init__(self, correction: Optional[Correction] = None, severity: Severity = Severity.LOW) -> None:
        self.correction = correction
        self.severity = severity
        self.seen: list[tuple[str, str, dict[str, Any], Optional[ToolSchema], ReflectionContext]] = []

    def analyze(
        self, error: str, tool: str, input: Mapping[str, Any], schema: Optional[ToolSchema], ctx: ReflectionContext
    ) -> FailureAnalysis:
        self.seen.append((error, tool, dict(input), schema, ctx))
        return FailureAnalysis(True, "transient", self.severity, self.correction)


class Always:
    """A strategy that always answers the same action."""

    def __init__(self, action: Any) -> None:
        self.action = action
        self.calls: list[tuple[int, int]] = []

    def decide(self, analysis: FailureAnalysis, attempt: int, max_attempts: int) -> Any:
        self.calls.append((attempt, max_attempts))
        return self.action


def run_events(loop: BareLoop, config: Optional[RunConfig] = None) -> list[Event]:
    events: list[Event] = []
    loop.start("the task", config, tap=events.append).result(WAIT)
    return events


def tool_events(events: list[Event]) -> list[tuple[str, int, Optional[bool]]]:
    out: list[tuple[str, int, Optional[bool]]] = []
    for e in events:
        if isinstance(e, ToolPre):
            out.append(("pre", e.attempt, None))
        elif isinstance(e, ToolPost):
            out.append(("post", e.attempt, e.is_error))
    return out


def results(loop: BareLoop) -> list[tuple[str, bool]]:
    return [(r.output, r.is_error) for m in loop.conversation() for r in m.tool_results]


def test_defaults_make_no_retries() -> None:
    flaky = Flaky(failures=1)
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.run("go")
    assert len(flaky.inputs) == 1
    assert results(loop) == [("Tool 'flaky' failed: failure 1", True)]


def test_default_reflector_with_backoff_strategy_still_makes_no_retries() -> None:
    flaky = Flaky(failures=1)
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.set_recovery_strategy(ExponentialBackoffRecovery())
        loop.run("go")
    assert len(flaky.inputs) == 1


def test_more_than_five_retries_is_a_hard_recovery_exhausted_error() -> None:
    flaky = Flaky(failures=100)
    strategy = Always(Retry(0.0))
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("never")]), [flaky.tool]) as loop:
        loop.set_recovery_strategy(strategy)
        events: list[Event] = []
        with pytest.raises(ToolRecoveryExhausted) as info:
            loop.start("go", tap=events.append).result(WAIT)
        assert loop.conversation() == []
    err = info.value
    assert (err.tool, err.attempts) == ("flaky", 6)
    assert str(err) == "tool 'flaky' failed after 6 attempts"
    assert len(flaky.inputs) == 6
    assert tool_events(events) == [e for a in range(6) for e in (("pre", a, None), ("post", a, True))]
    assert [a for a, _ in strategy.calls] == [0, 1, 2, 3, 4, 5]
    assert err.run is not None and err.run.stop_reason is err


def test_recovery_exhausted_in_a_wave_discards_finished_siblings() -> None:
    flaky = Flaky(failures=100)

    @tool(concurrency_safe=True)
    def fine(n: int) -> str:
        """Fine."""
        return "fine"

    script = calls(("fine", {"n": 0}), ("flaky", {"n": 1}), ("fine", {"n": 2}))
    with BareLoop(ScriptedClient([script, reply("never")]), [fine, flaky.tool]) as loop:
        loop.set_recovery_strategy(Always(Retry(0.0)))
        with pytest.raises(ToolRecoveryExhausted):
            loop.run("go", RunConfig(parallel=ParallelDispatch("parallel", 8)))
        assert loop.conversation() == []  # the finished siblings went nowhere


def test_backoff_delays_come_from_the_strategy_through_the_injected_sleep() -> None:
    flaky = Flaky(failures=100)
    slept: list[float] = []
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.set_reflector(Recoverable())
        loop.set_recovery_strategy(ExponentialBackoffRecovery(max_attempts=3))

        def fake_sleep(cancel: Any, seconds: float) -> bool:
            slept.append(seconds)
            return False

        loop._dispatcher.sleep = fake_sleep
        events = run_events(loop)
    assert slept == [0.1, 0.2, 0.4]
    assert len(flaky.inputs) == 4  # 3 retries, then Fail hands the error to the model
    assert results(loop) == [("Tool 'flaky' failed: failure 4", True)]
    assert [a for kind, a, _ in tool_events(events) if kind == "pre"] == [0, 1, 2, 3]


def test_a_retry_that_succeeds_gives_the_success() -> None:
    flaky = Flaky(failures=2)
    reflector = Recoverable()
    with BareLoop(ScriptedClient([call("flaky", n=7), reply("done")]), [flaky.tool]) as loop:
        loop.set_reflector(reflector)
        loop.set_recovery_strategy(ExponentialBackoffRecovery(base_delay=0.0))
        events = run_events(loop)
        call_id = loop.conversation()[1].tool_calls[0].id
    assert results(loop) == [("ok 7", False)]
    assert tool_events(events) == [
        ("pre", 0, None), ("post", 0, True), ("pre", 1, None), ("post", 1, True), ("pre", 2, None), ("post", 2, False),
    ]
    errors = [s[0] for s in reflector.seen]
    assert errors == ["Tool 'flaky' failed: failure 1", "Tool 'flaky' failed: failure 2"]
    _, name, inp, schema, ctx = reflector.seen[1]
    assert (name, inp) == ("flaky", {"n": 7})
    assert schema is not None and schema.name == "flaky"
    assert (ctx.attempt, ctx.max_attempts, ctx.task, ctx.turn, ctx.call_id) == (1, 3, "the task", 0, call_id)


def test_input_fix_is_applied_on_retry() -> None:
    flaky = Flaky(failures=1)
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.set_reflector(Recoverable(Correction.input_fix({"n": 2})))
        loop.set_recovery_strategy(Always(Retry(0.0)))
        loop.run("go")
    assert flaky.inputs == [{"n": 1}, {"n": 2}]
    assert results(loop) == [("ok 2", False)]


def test_tool_change_is_applied_on_retry_and_the_result_pairs_with_the_original_call() -> None:
    flaky = Flaky(failures=100)

    @tool
    def backup(n: int) -> str:
        """Backup."""
        return f"backup {n}"

    with BareLoop(ScriptedClient([call("flaky", n=3), reply("done")]), [flaky.tool, backup]) as loop:
        loop.set_reflector(Recoverable(Correction.tool_change("backup")))
        loop.set_recovery_strategy(Always(Retry(0.0)))
        events = run_events(loop)
        (result,) = [r for m in loop.conversation() for r in m.tool_results]
        asked = loop.conversation()[1].tool_calls[0]
    assert (result.tool_call_id, result.tool_name, result.output) == (asked.id, "flaky", "backup 3")
    assert [e.tool for e in events if isinstance(e, ToolPre)] == ["flaky", "backup"]


def test_a_bad_input_fix_is_skipped_and_the_retry_runs_uncorrected() -> None:
    flaky = Flaky(failures=1)
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.set_reflector(Recoverable(Correction("input_fix", modified_input=None)))
        loop.set_recovery_strategy(Always(Retry(0.0)))
        loop.run("go")
    assert flaky.inputs == [{"n": 1}, {"n": 1}]


@pytest.mark.parametrize("action", [Skip("no"), AskUser("what now?"), Fail("gave up")], ids=repr)
def test_actions_other_than_retry_return_the_error_result(action: Any) -> None:
    flaky = Flaky(failures=100)
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.set_reflector(Recoverable())
        loop.set_recovery_strategy(Always(action))
        run = loop.run("go")
    assert run.output == "done"
    assert len(flaky.inputs) == 1
    assert results(loop) == [("Tool 'flaky' failed: failure 1", True)]


def test_a_raising_reflector_means_no_retry(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def analyze(self, *args: Any) -> FailureAnalysis:
            raise RuntimeError("reflector down")

    flaky = Flaky(failures=100)
    strategy = Always(Retry(0.0))
    with BareLoop(ScriptedClient([call("flaky", n=1), reply("done")]), [flaky.tool]) as loop:
        loop.set_reflector(Broken())
        loop.set_recovery_strategy(strategy)
        loop.run("go")
    assert len(flaky.inputs) == 1 and strategy.calls == []
    assert "reflector failed on tool 'flaky'" in caplog.text


@pytest.mark.parametrize("iteration", range(5))
def test_cancel_during_a_backoff_ends_the_run_without_waiting_it_out(iteration: int) -> None:
    flaky = Flaky(failures=100)
    sleeping = threading.Event()

    def sleep(cancel: Any, seconds: float) -> bool:
        sleeping.set()
        return bool(cancel.wait(seconds))  # the real, cancel-aware wait

    with BareLoop(ScriptedClient([call("flaky", n=1), reply("never")]), [flaky.tool]) as loop:
        loop.set_recovery_strategy(Always(Retry(600.0)))
        loop._dispatcher.sleep = sleep
        handle = loop.start("go")
        assert sleeping.wait(WAIT)
        loop.cancel("enough")
        with pytest.raises(Cancelled, match="enough"):
            handle.result(WAIT)  # a 600 s backoff would time this out
    assert len(flaky.inputs) == 1


def test_a_failed_call_in_a_wave_is_retried_and_order_is_kept() -> None:
    barrier = threading.Barrier(2, timeout=WAIT)
    attempts: list[int] = []

    @tool(concurrency_safe=True)
    def steady(n: int) -> str:
        """Steady."""
        barrier.wait()
        return f"steady {n}"

    @tool(concurrency_safe=True)
    def partner(n: int) -> str:
        """Meets steady in the wave, fails there, succeeds on its (lone) retry."""
        attempts.append(n)
        if len(attempts) == 1:
            barrier.wait()
            raise ToolError("first try")
        return f"ok {n}"

    script = calls(("steady", {"n": 0}), ("partner", {"n": 1}))
    with BareLoop(ScriptedClient([script, reply("done")]), [steady, partner]) as loop:
        loop.set_reflector(Recoverable())
        loop.set_recovery_strategy(Always(Retry(0.0)))
        events = run_events(loop, RunConfig(parallel=ParallelDispatch("parallel", 8)))
    assert results(loop) == [("steady 0", False), ("ok 1", False)]
    assert tool_events(events) == [
        ("pre", 0, None), ("pre", 0, None), ("post", 0, False), ("post", 0, True), ("pre", 1, None), ("post", 1, False),
    ]


# -- the strategy alone (pure) ---------------------------------------------------------------


def test_exponential_backoff_decisions() -> None:
    s = ExponentialBackoffRecovery(max_attempts=4, base_delay=1.0, factor=3.0, max_delay=5.0)
    ok = FailureAnalysis(True)
    assert [s.decide(ok, a, 10) for a in range(5)] == [Retry(1.0), Retry(3.0), Retry(5.0), Retry(5.0), Fail("gave up after 5 attempts")]
    assert s.decide(ok, 1, 1) == Fail("gave up after 2 attempts")  # the caller's limit counts too
    assert s.decide(FailureAnalysis(False, "bad input"), 0, 10) == Fail("bad input")
    fix = Correction.input_fix({"a": 1})
    assert s.decide(FailureAnalysis(True, "risky", Severity.HIGH, fix), 0, 10) == AskUser("risky")
    assert s.decide(FailureAnalysis(True, "meh", Severity.MEDIUM, fix), 0, 10) == Retry(1.0)


def test_a_finite_factor_that_grows_past_the_float_range_is_held_by_the_cap() -> None:
    s = ExponentialBackoffRecovery(max_attempts=5, base_delay=1.0, factor=1e300, max_delay=7.0)
    assert [s.delay(a) for a in range(4)] == [1.0, 7.0, 7.0, 7.0]  # 1e300**2 overflowed: OverflowError
    assert ExponentialBackoffRecovery(base_delay=0.0, factor=1e300).delay(3) == 0.0


def test_noop_reflector_is_never_recoverable() -> None:
    analysis = NoopReflector().analyze("boom", "t", {}, None, ReflectionContext(0, 3))
    assert analysis == FailureAnalysis(False, "boom", Severity.MEDIUM)
