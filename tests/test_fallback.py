"""FallbackManager: the breaker state machine by plain calls with an injected clock,
then routing through BareLoop over real HTTP."""

from __future__ import annotations

from typing import Any

import pytest
from fakeserver import FakeServer, Reply, Stream, openai_stream
from support import FakeClock

from loopctl import BareLoop, ConfigError, FallbackExhausted, ModelError, Observer
from loopctl.fallback import FallbackManager
from loopctl.providers import OpenAIClient, StreamHandler


def manager(clock: FakeClock, chain: tuple[str, ...] = ("b", "c"), **kw: Any) -> FallbackManager:
    return FallbackManager("a", chain, clock=clock, **kw)


def test_starts_primary_and_routes_to_primary() -> None:
    fb = manager(FakeClock())
    assert fb.state == "primary" and fb.before_request() == "a"


def test_trips_after_three_consecutive_failures_not_two() -> None:
    fb = manager(FakeClock())
    assert fb.record_failure(False) is None
    assert fb.record_failure(False) is None
    assert fb.state == "primary"
    assert fb.record_failure(False) == ("a", "b")
    assert fb.state == "fallback" and fb.before_request() == "b"


def test_a_success_resets_the_failure_count() -> None:
    fb = manager(FakeClock())
    fb.record_failure(False)
    fb.record_failure(False)
    fb.record_success()
    fb.record_failure(False)
    fb.record_failure(False)
    assert fb.state == "primary"


def test_threshold_zero_trips_on_the_first_failure() -> None:
    fb = manager(FakeClock(), trip_threshold=0)
    assert fb.record_failure(False) == ("a", "b")


def test_cooldown_then_probe_primary_then_two_successes_close() -> None:
    clock = FakeClock()
    fb = manager(clock, trip_threshold=1)
    fb.record_failure(False)
    clock.now += 59.9
    assert fb.before_request() == "b" and fb.state == "fallback"
    clock.now += 0.1
    assert fb.before_request() == "a" and fb.state == "recovering"
    fb.record_success()
    assert fb.state == "recovering"
    fb.record_success()
    assert fb.state == "primary" and fb.before_request() == "a"


def test_rate_limited_failure_while_recovering_retrips_at_once() -> None:
    clock = FakeClock()
    fb = manager(clock, trip_threshold=3)
    for _ in range(3):
        fb.record_failure(False)
    clock.now += 60
    fb.before_request()
    fb.record_success()
    assert fb.record_failure(True) == ("a", "b")
    assert fb.state == "fallback" and fb.before_request() == "b"
    clock.now += 59
    assert fb.before_request() == "b"  # the cooldown restarted at the re-trip


def test_transient_failure_while_recovering_resets_the_success_streak() -> None:
    clock = FakeClock()
    fb = manager(clock, trip_threshold=2)
    fb.record_failure(False)
    fb.record_failure(False)
    clock.now += 60
    fb.before_request()
    fb.record_success()
    assert fb.record_failure(False) is None
    assert fb.state == "recovering"
    fb.record_success()
    assert fb.state == "recovering"  # the streak started over: one success is not enough
    fb.record_success()
    assert fb.state == "primary"


def test_chain_advances_after_an_entry_fails_its_budget() -> None:
    fb = manager(FakeClock(), trip_threshold=1, max_fail_count=2)
    fb.record_failure(False)
    assert fb.before_request() == "b"
    assert fb.record_failure(False) is None  # b: 1 of 2
    assert fb.record_failure(False) == ("b", "c")
    assert fb.before_request() == "c"


def test_every_entry_down_raises_fallback_exhausted_until_the_cooldown() -> None:
    clock = FakeClock()
    fb = manager(clock, chain=("b",), trip_threshold=1, max_fail_count=1)
    fb.record_failure(False)
    assert fb.record_failure(False) is None  # b is spent, nothing left to move to
    with pytest.raises(FallbackExhausted) as info:
        fb.before_request()
    assert info.value.models == ("a", "b")
    clock.now += 60
    assert fb.before_request() == "a" and fb.state == "recovering"


def test_no_chain_trips_but_keeps_serving_the_primary() -> None:
    fb = FallbackManager("a", clock=FakeClock(), trip_threshold=1)
    assert fb.record_failure(False) is None
    assert fb.state == "fallback"
    assert fb.before_request() == "a"


def test_success_on_a_fallback_resets_its_failure_budget() -> None:
    fb = manager(FakeClock(), trip_threshold=1, max_fail_count=2)
    fb.record_failure(False)
    fb.record_failure(False)
    fb.record_success()
    assert fb.record_failure(False) is None
    assert fb.before_request() == "b"


def test_manual_availability_and_reset() -> None:
    fb = manager(FakeClock(), trip_threshold=1)
    fb.set_available("b", False)
    assert fb.record_failure(False) == ("a", "c")
    fb.reset()
    assert fb.state == "primary" and fb.before_request() == "a"
    with pytest.raises(ConfigError, match="'zzz'"):
        fb.set_available("zzz", True)


def test_set_primary_switches_and_resets() -> None:
    fb = manager(FakeClock(), trip_threshold=1)
    fb.record_failure(False)
    fb.set_primary("a2")
    assert fb.state == "primary" and fb.before_request() == "a2"


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"trip_threshold": -1}, "trip_threshold"), ({"recovery_successes": 0}, "recovery_successes"),
     ({"max_fail_count": 0}, "max_fail_count"), ({"recovery_timeout": -1}, "recovery_timeout"),
     ({"fallbacks": "b"}, "fallbacks"), ({"fallbacks": ["", "c"]}, "''")],
)
def test_bad_configuration_raises_config_error(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        FallbackManager("a", **kwargs)


# -- routing through the loop, over HTTP -------------------------------------------------


class Events(Observer):
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, Any]] = []

    def on_fallback(self, event: Any) -> None:
        self.seen.append(("fallback", event.from_model, event.to_model))

    def on_model_switched(self, event: Any) -> None:
        self.seen.append(("switched", event.from_model, event.to_model))

    def on_stream_success(self, event: Any) -> None:
        self.seen.append(("success", event.model, None))


def test_loop_routes_to_the_fallback_by_per_request_override(server: FakeServer) -> None:
    clock = FakeClock()
    client = OpenAIClient("gpt-a", api_key="sk-test-0000000000", base_url=server.openai_url)
    fb = FallbackManager("gpt-a", ["gpt-b"], trip_threshold=1, clock=clock)
    events = Events()
    loop = BareLoop(client).with_fallback(fb).with_observer(events)
    loop.set_stream_handler(StreamHandler(max_retries=0, jitter=0.0, base_delay=0.0))
    server.push(Reply(500, {"error": {"message": "primary down"}}),
                Stream(openai_stream("from b", model="gpt-b")),
                Stream(openai_stream("from a", model="gpt-a")),
                Stream(openai_stream("from a again", model="gpt-a")),
                Stream(openai_stream("a closed", model="gpt-a")))
    with loop:
        with pytest.raises(ModelError, match="primary down"):
            loop.run("one")
        assert loop.run("two").output == "from b"
        clock.now += 60  # cooldown over: probe the primary
        assert loop.run("three").output == "from a"
        assert loop.run("four").output == "from a again"
        assert fb.state == "primary"
        assert loop.run("five").output == "a closed"
    assert [r.json["model"] for r in server.requests] == ["gpt-a", "gpt-b", "gpt-a", "gpt-a", "gpt-a"]
    assert client.model == "gpt-a"  # routing never mutates the client
    assert ("fallback", "gpt-a", "gpt-b") in events.seen
    switches = [e for e in events.seen if e[0] == "switched"]
    assert switches == [("switched", "gpt-a", "gpt-b"), ("switched", "gpt-b", "gpt-a")]
    assert ("success", "gpt-b", None) in events.seen
