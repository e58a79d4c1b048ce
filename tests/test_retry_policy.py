"""The model-call retry policy runs on tenacity: its stop, wait, retry, before_sleep and sleep.

The policy's parts are driven here by tenacity's own loop (``Retrying.__call__``),
so the waits and the stops asserted are tenacity's decisions from the policy
object; then by a real call over HTTP and by a real run, where the wait
announced (``RetryWait`` / ``RetryScheduled``) is the one slept, a cancel or a
close ends the cancel-aware sleep at once, and a first attempt that succeeds
builds no tenacity machinery at all.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Optional

import pytest
import tenacity
from fakeserver import FakeServer, Reply, Stream, openai_stream
from support import WAIT, Recorder, run_in_thread

from loopctl import BareLoop, Cancelled, CancelSignal, Message, ModelRequest
from loopctl.errors import ModelError, RateLimited, RateLimitEscalation
from loopctl.observers import RetryScheduled
from loopctl.providers import OpenAIClient, StreamHandler
from loopctl.providers import turn_stream as turn_stream_module
from loopctl.providers.base import RetryWait, StreamAttemptReset
from loopctl.providers.boundary import RATE_LIMIT, tag
from loopctl.providers.retry import CallRetries, CancelAwareSleep, RetryPolicy, is_retryable
from loopctl.testing import ScriptedClient, reply

REQ = ModelRequest([Message.user("hi")], "sys")
BOUND = 1.0  # seconds: the cancel contract is 100 ms; room for a loaded machine


def bad_gateway() -> ModelError:
    return ModelError("bad gateway", status=502, retryable=True)


def slow_down(retry_after: Optional[float]) -> ModelError:
    return tag(ModelError("slow down", status=429, retryable=True), RATE_LIMIT, retry_after, "rate limited (429)")


def failing(*failures: BaseException, then: Any = "ok") -> tuple[Callable[[], Any], list[int]]:
    """A function that raises ``failures`` in turn, then returns ``then``; and its call count."""
    calls: list[int] = []

    def fn() -> Any:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return then

    return fn, calls


def oa(server: FakeServer) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key="sk-test-000000000000", base_url=server.openai_url)


# -- the policy under tenacity's own loop ---------------------------------------------------------


def test_the_policy_builds_a_tenacity_retrying_of_its_own_parts() -> None:
    policy = RetryPolicy(StreamHandler())
    sleep = CancelAwareSleep(None)
    retrying = policy.retrying(sleep)
    assert isinstance(retrying, tenacity.Retrying)
    assert retrying.sleep is sleep
    assert (retrying.stop, retrying.wait, retrying.retry) == (policy.stop, policy.wait, policy.retry)
    assert (retrying.after, retrying.before_sleep) == (policy.count, policy.announce)
    assert retrying.retry_error_callback == policy.give_up


def test_tenacity_waits_the_policys_backoff_and_stops_at_its_budget() -> None:
    handler = StreamHandler(max_retries=3, base_delay=0.1, max_delay=0.3, jitter=0.0)
    slept: list[float] = []
    fn, calls = failing(bad_gateway(), bad_gateway(), bad_gateway())
    retrying = RetryPolicy(handler).retrying(slept.append)
    assert retrying(fn) == "ok"
    assert slept == [0.1, 0.2, 0.3] and len(calls) == 4  # doubling, capped at max_delay
    assert retrying.statistics["attempt_number"] == 4 and retrying.statistics["idle_for"] == pytest.approx(0.6)

    slept.clear()
    last = bad_gateway()
    fn, calls = failing(bad_gateway(), bad_gateway(), last)
    policy = RetryPolicy(StreamHandler(max_retries=2, base_delay=0.1, jitter=0.0))
    assert policy.retrying(slept.append)(fn) is last  # budget spent: handed back for the rescue
    assert slept == [0.1, 0.2] and len(calls) == 3 and policy.transport_failures == 3


def test_the_jitter_is_the_policys_random_and_the_deadline_caps_the_wait() -> None:
    handler = StreamHandler(max_retries=5, base_delay=1.0, max_delay=8.0, jitter=0.5)
    draws = itertools.cycle([1.0, 0.0, 0.5])
    now = [100.0]
    policy = RetryPolicy(handler, deadline=103.5, clock=lambda: now[0], rand=lambda: next(draws))
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    fn, calls = failing(*[bad_gateway() for _ in range(5)])
    retrying = policy.retrying(sleep)
    result = retrying(fn)
    # 1 * 1.5, then 2 * 0.5, then 4 * 1.0 cut to the 1 s left, then the deadline has passed: stop.
    assert slept == [1.5, 1.0, 1.0] and len(calls) == 4
    assert isinstance(result, ModelError)


def test_retry_after_is_the_wait_and_the_rate_limit_budget_escalates() -> None:
    handler = StreamHandler(rate_limit_retries=2, rate_limit_delay=5.0, max_retry_wait=60.0)
    slept: list[float] = []
    fn, calls = failing(slow_down(2.5), slow_down(None), slow_down(7.0))
    with pytest.raises(RateLimitEscalation) as info:
        RetryPolicy(handler).retrying(slept.append)(fn)
    assert slept == [2.5, 5.0]  # the server's Retry-After, else rate_limit_delay
    assert (info.value.attempts, info.value.retry_after) == (3, 7.0) and len(calls) == 3
    assert isinstance(info.value.__cause__, ModelError)


def test_a_retry_after_beyond_max_retry_wait_raises_rate_limited_without_waiting() -> None:
    slept: list[float] = []
    fn, calls = failing(slow_down(90.0))
    with pytest.raises(RateLimited, match=r"asks to wait 90s, longer than max_retry_wait \(60s\)") as info:
        RetryPolicy(StreamHandler(max_retry_wait=60.0)).retrying(slept.append)(fn)
    assert (info.value.retry_after, info.value.max_retry_wait, info.value.status) == (90.0, 60.0, 429)
    assert slept == [] and len(calls) == 1


@pytest.mark.parametrize("failure", [
    ModelError("unauthorized", status=401, retryable=True),
    ModelError("bad request", status=400, retryable=False),
    ModelError("not retryable", status=500, retryable=False),
    ValueError("not a model error"),
])
def test_a_failure_the_policy_refuses_is_raised_by_tenacity_at_once(failure: BaseException) -> None:
    slept: list[float] = []
    fn, calls = failing(failure)
    assert not is_retryable(failure)
    with pytest.raises(type(failure)) as info:
        RetryPolicy(StreamHandler()).retrying(slept.append)(fn)
    assert info.value is failure and slept == [] and len(calls) == 1


def test_before_sleep_announces_the_wait_tenacity_is_about_to_sleep() -> None:
    handler = StreamHandler(max_retries=3, base_delay=0.2, jitter=0.0, rate_limit_retries=4)
    policy = RetryPolicy(handler)
    seen: list[tuple[Optional[RetryWait], float]] = []
    fn, _ = failing(bad_gateway(), slow_down(1.5), bad_gateway())
    policy.retrying(lambda s: seen.append((policy.announced, s)))(fn)
    assert seen == [
        (RetryWait("bad gateway", 0.2, 2, 4), 0.2),
        (RetryWait("rate limited (429)", 1.5, 2, 5), 1.5),  # each kind counts against its own budget
        (RetryWait("bad gateway", 0.4, 3, 4), 0.4),
    ]


class WatchedCancel:
    """A cancel signal whose ``wait`` says it has been entered."""

    reason = None

    def __init__(self) -> None:
        self.signal = CancelSignal()
        self.entered = threading.Event()

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.entered.set()
        return self.signal.wait(timeout)


def cancel_during_tenacitys_sleep() -> None:
    cancel = WatchedCancel()
    fn, calls = failing(bad_gateway())
    handler = StreamHandler(base_delay=30.0, max_delay=30.0, jitter=0.0)
    retrying = RetryPolicy(handler).retrying(CancelAwareSleep(cancel))
    thread, errors = run_in_thread(lambda: retrying(fn))
    assert cancel.entered.wait(WAIT)
    t0 = time.monotonic()
    cancel.signal.cancel("stop")
    thread.join(WAIT)
    assert time.monotonic() - t0 < BOUND
    assert len(errors) == 1 and isinstance(errors[0], Cancelled) and len(calls) == 1


def test_a_cancel_ends_tenacitys_sleep_at_once() -> None:
    for _ in range(20):
        cancel_during_tenacitys_sleep()


def test_call_retries_sleeps_what_tenacity_decided_through_the_given_sleep() -> None:
    slept: list[float] = []
    retries = CallRetries(StreamHandler(base_delay=0.25, jitter=0.0), None, slept.append)
    assert retries.retrying.sleep == slept.append
    announced = retries.after_failure(bad_gateway())
    assert announced == RetryWait("bad gateway", 0.25, 2, 4) and slept == []  # announced before the wait
    retries.sleep()
    assert slept == [0.25]
    with pytest.raises(ModelError, match="unauthorized"):
        retries.after_failure(ModelError("unauthorized", status=401, retryable=True))


# -- a real call, over HTTP -------------------------------------------------------------------------


class Counted(CallRetries):
    built = 0

    def __init__(self, *args: Any) -> None:
        Counted.built += 1
        super().__init__(*args)


def test_a_first_attempt_that_succeeds_builds_no_tenacity_machinery(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(turn_stream_module, "CallRetries", Counted)
    Counted.built = 0
    server.push(Stream(openai_stream("hello")))
    events = list(StreamHandler().stream_turn(oa(server), REQ, CancelSignal()))
    assert not any(isinstance(e, (RetryWait, StreamAttemptReset)) for e in events)
    server.push(Reply(200, {"id": "c", "model": "gpt-test", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}]}))
    assert StreamHandler().complete_turn(oa(server), REQ, CancelSignal()).first_reply().message.text == "whole"
    assert Counted.built == 0

    server.push(Reply(502, {"error": {"message": "bad gateway"}}), Stream(openai_stream("again")))
    handler = StreamHandler(base_delay=0.01, jitter=0.0)
    events = list(handler.stream_turn(oa(server), REQ, CancelSignal()))
    waits = [e for e in events if isinstance(e, RetryWait)]
    assert Counted.built == 1 and [(w.wait_s, w.attempt, w.max_attempts) for w in waits] == [(0.01, 2, 4)]


def close_during_a_retry_after_wait(server: FakeServer) -> None:
    server.push(Reply(429, {"error": {"message": "slow"}}, {"retry-after": "30"}))
    turn = StreamHandler().stream_turn(oa(server), REQ, None)
    announced = threading.Event()
    seen: list[Any] = []

    def consume() -> None:
        for ev in turn:
            seen.append(ev)
            if isinstance(ev, RetryWait):
                announced.set()

    thread, errors = run_in_thread(consume)
    assert announced.wait(WAIT)
    t0 = time.monotonic()
    turn.close()
    thread.join(WAIT)
    assert time.monotonic() - t0 < BOUND
    assert len(errors) == 1 and isinstance(errors[0], Cancelled)
    assert [e.wait_s for e in seen if isinstance(e, RetryWait)] == [30.0]


def test_a_close_ends_a_retry_after_wait_of_a_call_without_a_cancel_signal(server: FakeServer) -> None:
    for _ in range(10):
        close_during_a_retry_after_wait(server)


# -- a real run -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["streaming", "non_streaming"])
def test_observers_see_the_wait_the_policy_chose_as_retry_scheduled(mode: str) -> None:
    client = ScriptedClient([bad_gateway(), bad_gateway(), reply("done")])
    recorder = Recorder()
    with BareLoop(client) as loop:
        loop.set_turn_mode(mode)
        loop.set_stream_handler(StreamHandler(max_retries=2, base_delay=0.01, jitter=0.0))
        loop.register_observer(recorder)
        run = loop.run("hi")
    assert run.output == "done"
    scheduled = recorder.of(RetryScheduled)
    assert [(e.cause, e.wait_s, e.attempt, e.max_attempts) for e in scheduled] == [
        ("bad gateway", 0.01, 2, 3),
        ("bad gateway", 0.02, 3, 3),
    ]
