"""The fallback breaker through BareLoop: routing, events and cancels (SPEC §8).

The model is a ``ScriptedClient`` whose items all call one fake provider: a
request goes to ``request.options.model`` when set (the driver's per-request
routing override), else to the client's model, and fails when that model is
down, so each test states which models are down and reads where every
request went. Time is an injected clock. What must hold:

- three consecutive failures trip the breaker: ``on_fallback(primary,
  backup)`` once, then requests carry the override ``"backup"`` and
  ``on_model_switched`` fires once; the client itself is never switched;
- once the clock passes the cooldown, requests probe the primary again;
- ``FallbackExhausted`` (no request sent) when every model is down;
- a cancelled turn never touches the breaker, in any breaker state and
  whichever side wins the fence after the cancel, and fires no
  ``on_stream_failure``;
- ``on_stream_success`` names the model that served.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
from support import WAIT, FakeClock, Recorder, join_threads

from loopctl import BareLoop, Cancelled, FallbackExhausted, ModelError, RateLimitEscalation
from loopctl.fallback import FallbackManager
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.observers import (
    RunEnd,
    StreamSuccess,
    TurnStart,
)
from loopctl.providers import StreamHandler
from loopctl.testing import ScriptedClient, reply

COOLDOWN = 60.0
MODES = ["non_streaming", "streaming", "streaming_passthrough"]


class Hold:
    """One provider call that blocks until released, then fails as a torn connection would."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()


class Provider:
    """The fake model API behind every script item (see the module docstring)."""

    def __init__(self, client_model: Callable[[], str], down: tuple[str, ...] = ()) -> None:
        self.client_model = client_model
        self.down = set(down)
        self.lock = threading.Lock()
        self.log: list[tuple[str, Optional[str]]] = []  # (target, options.model)
        self.hold: Optional[Hold] = None
        self.failure: Callable[[str], Exception] = lambda m: ModelError(f"{m} is down")

    def __call__(self, request: ModelRequest) -> ModelResponse:
        override = request.options.model if request.options is not None else None
        target = override or self.client_model()
        with self.lock:
            self.log.append((target, override))
            hold, self.hold = self.hold, None
        if hold is not None:
            hold.entered.set()
            assert hold.release.wait(WAIT), "held call never released"
            raise ModelError(f"connection to {target} dropped")
        if target in self.down:
            raise self.failure(target)
        r = reply(f"served by {target}")
        return ModelResponse(r.message, r.stop_reason, r.usage, target)

    def hold_next(self) -> Hold:
        with self.lock:
            self.hold = Hold()
            return self.hold

    @property
    def targets(self) -> list[str]:
        with self.lock:
            return [t for t, _ in self.log]

    @property
    def overrides(self) -> list[Optional[str]]:
        with self.lock:
            return [o for _, o in self.log]


def build(
    mode: str, down: tuple[str, ...] = (), **fb_kw: Any
) -> tuple[BareLoop, ScriptedClient, Provider, FallbackManager, FakeClock, Recorder]:
    clock = FakeClock(5000.0)
    client = ScriptedClient([], model="primary")
    provider = Provider(lambda: client.model, down)
    client.extend([provider] * 100)
    fb_kw.setdefault("trip_threshold", 3)
    fb_kw.setdefault("recovery_timeout", COOLDOWN)
    fb = FallbackManager("primary", ["backup"], clock=clock, **fb_kw)
    rec = Recorder()
    loop = BareLoop(client).with_fallback(fb).with_observer(rec)
    if mode == "non_streaming":
        loop.set_turn_mode("non_streaming")
    elif mode == "streaming_passthrough":
        loop.set_stream_handler(StreamHandler.passthrough())
    else:
        loop.set_stream_handler(StreamHandler(max_retries=0, jitter=0.0, base_delay=0.0, rescue=False))
    return loop, client, provider, fb, clock, rec


def trip(loop: BareLoop, n: int) -> None:
    for i in range(n):
        with pytest.raises(ModelError, match="primary is down"):
            loop.run(f"failing {i}")


@pytest.fixture(params=["non_streaming", "streaming"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


# -- tripping ------------------------------------------------------------------------------


def test_three_failures_trip_the_breaker_then_requests_carry_the_backup_override(mode: str) -> None:
    loop, client, provider, fb, _, rec = build(mode, down=("primary",))
    with loop:
        trip(loop, 2)
        assert fb.state == "primary" and rec.fallbacks() == []
        trip(loop, 1)
        assert fb.state == "fallback"
        assert rec.fallbacks() == [("primary", "backup")]
        assert rec.switches() == []  # the routing change is announced when a request is routed
        assert loop.run("on the backup").output == "served by backup"
        assert rec.switches() == [("primary", "backup")]
        assert loop.run("still on the backup").output == "served by backup"
        assert loop.run("and again").output == "served by backup"
    assert provider.targets == ["primary"] * 3 + ["backup"] * 3
    assert provider.overrides == [None] * 3 + ["backup"] * 3  # routed per request ...
    assert client.model == "primary"  # ... never by switching the client
    assert rec.fallbacks() == [("primary", "backup")]  # exactly once
    assert rec.switches() == [("primary", "backup")]  # exactly once
    assert rec.failed() == ["primary"] * 3
    assert rec.served() == ["backup"] * 3
    # Each call names the model it asked for as it starts (a span's name, before any reply).
    assert [e.model for e in rec.of(TurnStart)] == ["primary"] * 3 + ["backup"] * 3


def test_a_success_between_failures_keeps_the_breaker_closed(mode: str) -> None:
    loop, _, provider, fb, _, rec = build(mode, down=("primary",))
    with loop:
        trip(loop, 2)
        provider.down.clear()
        assert loop.run("primary is fine").output == "served by primary"
        provider.down.add("primary")
        trip(loop, 2)
        assert fb.state == "primary" and rec.fallbacks() == []
        trip(loop, 1)
        assert fb.state == "fallback" and rec.fallbacks() == [("primary", "backup")]
    assert provider.overrides == [None] * 6


# -- the cooldown ----------------------------------------------------------------------------


def test_after_the_cooldown_requests_probe_the_primary_and_two_successes_close(mode: str) -> None:
    loop, _, provider, fb, clock, rec = build(mode, down=("primary",))
    with loop:
        trip(loop, 3)
        provider.down.clear()  # the primary recovered, but nobody asks it yet
        clock.now += COOLDOWN - 0.5
        assert loop.run("before the cooldown").output == "served by backup"
        clock.now += 0.5
        assert loop.run("probe").output == "served by primary"
        assert fb.state == "recovering"
        assert loop.run("second success").output == "served by primary"
        assert fb.state == "primary"
        assert loop.run("closed").output == "served by primary"
    assert provider.targets == ["primary"] * 3 + ["backup"] + ["primary"] * 3
    assert provider.overrides[3] == "backup"
    assert set(provider.overrides[4:]) <= {None, "primary"}
    assert rec.switches() == [("primary", "backup"), ("backup", "primary")]
    assert rec.fallbacks() == [("primary", "backup")]
    assert rec.served() == ["backup", "primary", "primary", "primary"]


def test_a_failed_probe_counts_toward_a_new_trip_and_the_cooldown_restarts(mode: str) -> None:
    loop, _, provider, fb, clock, rec = build(mode, down=("primary",))
    with loop:
        trip(loop, 3)
        clock.now += COOLDOWN
        trip(loop, 2)  # probes on probation: still down
        assert fb.state == "recovering"
        trip(loop, 1)
        assert fb.state == "fallback"
        assert rec.fallbacks() == [("primary", "backup")] * 2
        clock.now += COOLDOWN - 0.5  # measured from the re-trip, not the first trip
        assert loop.run("backup again").output == "served by backup"
        clock.now += 0.5
        provider.down.clear()
        assert loop.run("probe again").output == "served by primary"
    assert provider.targets == ["primary"] * 6 + ["backup", "primary"]
    # The probes went to the model already routed to: no switch until the backup served.
    assert rec.switches() == [("primary", "backup"), ("backup", "primary")]


def test_a_rate_limited_probe_re_trips_at_once(mode: str) -> None:
    loop, _, provider, fb, clock, rec = build(mode, down=("primary",))
    with loop:
        trip(loop, 3)
        clock.now += COOLDOWN
        provider.failure = lambda m: RateLimitEscalation(6, 30.0)
        with pytest.raises(RateLimitEscalation):
            loop.run("rate limited probe")
        assert fb.state == "fallback"  # one failure, not three: a rate limit re-trips
        assert rec.fallbacks() == [("primary", "backup")] * 2
        assert loop.run("back on the backup").output == "served by backup"
    assert provider.targets == ["primary"] * 4 + ["backup"]


# -- exhausted -------------------------------------------------------------------------------


def test_fallback_exhausted_when_every_model_is_down_without_sending_a_request(mode: str) -> None:
    loop, _, provider, fb, clock, rec = build(mode, down=("primary", "backup"), max_fail_count=2)
    with loop:
        trip(loop, 3)
        for i in range(2):
            with pytest.raises(ModelError, match="backup is down"):
                loop.run(f"backup failing {i}")
        history = loop.conversation()
        sent = len(provider.log)
        turn_starts = rec.count(TurnStart)
        with pytest.raises(FallbackExhausted) as info:
            loop.run("nothing left")
        assert info.value.models == ("primary", "backup")
        assert "primary" in str(info.value) and "backup" in str(info.value)
        assert info.value.run is not None and info.value.run.stop_reason is info.value
        assert len(provider.log) == sent  # no request was sent
        assert rec.count(TurnStart) == turn_starts
        assert loop.conversation() == history
        end = rec.of(RunEnd)[-1]
        assert end.success is False and "fallback exhausted" in (end.error or "")
        with pytest.raises(FallbackExhausted):
            loop.run("still nothing")
        # Once the cooldown is over the primary is probed again.
        clock.now += COOLDOWN
        provider.down.discard("primary")
        assert loop.run("the primary is back").output == "served by primary"
        assert fb.state == "recovering"
    assert provider.targets == ["primary"] * 3 + ["backup"] * 2 + ["primary"]
    assert rec.failed() == ["primary"] * 3 + ["backup"] * 2  # an exhausted run calls no model
    assert rec.fallbacks() == [("primary", "backup")]


# -- cancels never touch the breaker ----------------------------------------------------------


def _to_state(loop: BareLoop, provider: Provider, fb: FallbackManager, clock: FakeClock, state: str) -> str:
    """Drive the breaker (trip_threshold=1) into ``state``; the model the next request goes to."""
    if state == "primary":
        return "primary"
    provider.down.add("primary")
    trip(loop, 1)
    assert fb.state == "fallback"
    if state == "fallback":
        return "backup"
    provider.down.clear()
    clock.now += COOLDOWN
    assert loop.run("probe").output == "served by primary"
    assert fb.state == "recovering"
    return "primary"


PARAMS = [
    pytest.param(mode, order)
    for mode in MODES
    for order in ["takeover_first", "body_first"]
]


@pytest.mark.parametrize("state", ["primary", "fallback", "recovering"])
@pytest.mark.parametrize("mode, order", PARAMS)
def test_a_cancelled_turn_leaves_the_breaker_unchanged(mode: str, order: str, state: str) -> None:
    """Cancel a blocked call from another thread; the call then fails as a torn connection.

    ``takeover_first``: the caller finalizes the run and the body, released
    afterwards, is abandoned. ``body_first``: a listener registered before
    the loop's own releases the call and waits for the run's end, so the
    body re-takes the fence first and must itself see the cancel.
    """
    loop, _, provider, fb, clock, rec = build(
        mode, trip_threshold=1, recovery_successes=2, max_fail_count=1
    )
    listener: Optional[Callable[[], None]] = None
    body_won: list[bool] = []
    with loop:
        target = _to_state(loop, provider, fb, clock, state)
        before = (fb.state, fb.active_fallback, rec.fallbacks(), rec.failed(), rec.served(), loop.conversation())
        hold = provider.hold_next()
        if order == "body_first":
            rec.run_ended.clear()

            def release_then_wait() -> None:
                hold.release.set()
                body_won.append(rec.run_ended.wait(WAIT))

            listener = release_then_wait
            loop.cancel_signal().add_listener(listener)
        fired = threading.Event()

        def canceller() -> None:
            assert hold.entered.wait(WAIT), "the call never started"
            loop.cancel("user pressed stop")
            fired.set()

        th = threading.Thread(target=canceller)
        th.start()
        try:
            with pytest.raises(Cancelled, match="user pressed stop"):
                loop.run("to be cancelled")
        finally:
            hold.release.set()
            th.join(WAIT)
            if listener is not None:
                loop.cancel_signal().remove_listener(listener)
        assert fired.is_set()
        if order == "body_first":
            assert body_won == [True], "the body did not end the run while the loop's listener waited"
        join_threads("loopctl-run-", check=False)  # the abandoned body, if any, exits once released
        assert provider.targets[-1] == target  # the cancelled call did go out
        after = (fb.state, fb.active_fallback, rec.fallbacks(), rec.failed(), rec.served(), loop.conversation())
        assert after == before
        end = rec.of(RunEnd)[-1]
        assert end.success is False and "cancelled" in (end.error or "")
        # The breaker carries on as if the cancelled turn never happened.
        assert loop.run("after the cancel").output == f"served by {target}"
        if state == "recovering":
            assert fb.state == "primary"  # 2 successes: the cancel did not reset the streak
        else:
            assert fb.state == state


# -- the model that served ---------------------------------------------------------------------


def test_stream_success_names_the_model_that_served_every_turn(mode: str) -> None:
    loop, _, provider, fb, clock, rec = build(mode, down=("primary",), trip_threshold=1)
    served: list[str] = []
    with loop:
        trip(loop, 1)
        for i in range(2):
            loop.run(f"backup {i}")
        clock.now += COOLDOWN
        provider.down.clear()
        for i in range(3):
            loop.run(f"primary {i}")
        served = provider.targets[1:]  # the first request tripped the breaker
    assert served == ["backup", "backup", "primary", "primary", "primary"]
    assert rec.served() == served
    runs = loop.session.runs[1:]
    assert [r.output for r in runs] == [f"served by {m}" for m in served]
    # Every success event belongs to its run.
    assert [e.run_id for e in rec.of(StreamSuccess)] == [r.id for r in runs]
