"""StreamHandler over real HTTP: retries, rate limits, timeouts, the rescue."""

from __future__ import annotations

import email.utils
import threading
import time
from typing import Any, Optional

import pytest
from fakeserver import (
    Cut,
    FakeServer,
    Hang,
    Reply,
    Stall,
    Stream,
    oa_chunk,
    openai_completion,
    openai_stream,
)

from loopctl.errors import Cancelled, ConfigError, ModelError, RateLimitEscalation
from loopctl.messages import Message, ModelRequest, ModelResponse
from loopctl.providers import OpenAIClient, StreamHandler
from loopctl.providers.base import (
    IteratorStream,
    MessageStop,
    StreamAccumulator,
    StreamAttemptReset,
    StreamEvent,
    StreamRescue,
    response_events,
)
from loopctl.providers.http import parse_retry_after
from loopctl.testing import reply


class RecordingCancel:
    """A cancel signal whose waits return at once and are recorded."""

    reason: Optional[str] = None

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._fired = threading.Event()

    def is_cancelled(self) -> bool:
        return self._fired.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.waits.append(float(timeout or 0.0))
        return self._fired.is_set()

    def add_listener(self, fn: Any) -> None:
        pass

    def remove_listener(self, fn: Any) -> None:
        pass


FAST = dict(base_delay=0.01, max_delay=1.0, jitter=0.0, rate_limit_delay=0.5, max_retry_wait=60.0)


def client(server: FakeServer) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key="sk-test-key-000000000", base_url=server.openai_url)


REQ = ModelRequest([Message.user("hi")], "sys")


def run_turn(handler: StreamHandler, c: Any, cancel: Any = None) -> tuple[list[Any], ModelResponse]:
    """Consume a turn like the driver does; returns (events, reply)."""
    cancel = cancel if cancel is not None else RecordingCancel()
    events: list[Any] = []
    acc = StreamAccumulator()
    rescued = None
    for ev in handler.stream_turn(c, REQ, cancel):
        events.append(ev)
        if isinstance(ev, StreamAttemptReset):
            acc = StreamAccumulator()
        elif isinstance(ev, StreamRescue):
            rescued = ev.response
        else:
            acc.feed(ev)
    return events, rescued if rescued is not None else acc.build()


def resets(events: list[Any]) -> list[int]:
    return [e.attempt for e in events if isinstance(e, StreamAttemptReset)]


def test_success_on_first_attempt_yields_no_reset(server: FakeServer) -> None:
    server.push(Stream(openai_stream("hello")))
    events, resp = run_turn(StreamHandler(**FAST), client(server))
    assert resp.message.text == "hello" and resets(events) == []


def test_502_then_success_retries_once_after_the_base_delay(server: FakeServer) -> None:
    server.push(Reply(502, {"error": {"message": "bad gateway"}}), Stream(openai_stream("second try")))
    cancel = RecordingCancel()
    events, resp = run_turn(StreamHandler(**FAST), client(server), cancel)
    assert resp.message.text == "second try"
    assert resets(events) == [1]
    assert cancel.waits == [0.01]
    assert len(server.requests) == 2


def test_5xx_backoff_is_exponential_then_fails_without_rescue(server: FakeServer) -> None:
    server.push(*[Reply(500, {"error": {"message": "boom"}}) for _ in range(4)])
    cancel = RecordingCancel()
    with pytest.raises(ModelError, match="boom") as info:
        run_turn(StreamHandler(max_retries=3, **FAST), client(server), cancel)
    assert info.value.status == 500
    assert cancel.waits == [0.01, 0.02, 0.04]
    assert len(server.requests) == 4  # 1 + 3 retries, and no non-streaming rescue
    assert all(r.json.get("stream") for r in server.requests)


def test_408_is_retried(server: FakeServer) -> None:
    server.push(Reply(408, {"error": {"message": "timeout"}}), Stream(openai_stream("ok")))
    _, resp = run_turn(StreamHandler(**FAST), client(server))
    assert resp.message.text == "ok"


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_permanent_errors_get_exactly_one_request(server: FakeServer, status: int) -> None:
    server.push(Reply(status, {"error": {"message": f"nope {status}"}}), Stream(openai_stream("never")))
    cancel = RecordingCancel()
    with pytest.raises(ModelError) as info:
        run_turn(StreamHandler(**FAST), client(server), cancel)
    assert info.value.status == status
    assert len(server.requests) == 1 and cancel.waits == []


def test_429_honours_retry_after_seconds(server: FakeServer) -> None:
    server.push(Reply(429, {"error": {"message": "slow"}}, {"retry-after": "3"}), Stream(openai_stream("ok")))
    cancel = RecordingCancel()
    events, resp = run_turn(StreamHandler(**FAST), client(server), cancel)
    assert resp.message.text == "ok" and resets(events) == [1]
    assert cancel.waits == [3.0]


def test_429_honours_retry_after_http_date(server: FakeServer) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server.push(Reply(429, {"error": {"message": "slow"}}, {"retry-after": when}), Stream(openai_stream("ok")))
    cancel = RecordingCancel()
    run_turn(StreamHandler(**FAST), client(server), cancel)
    assert len(cancel.waits) == 1 and 27.0 <= cancel.waits[0] <= 31.0


def test_rate_limit_without_retry_after_uses_the_default_wait(server: FakeServer) -> None:
    server.push(Reply(503, {"error": {"message": "busy"}}),
                Reply(529, {"error": {"message": "overloaded"}}, {"retry-after": "60"}),
                Stream(openai_stream("ok")))
    cancel = RecordingCancel()
    events, _ = run_turn(StreamHandler(**FAST), client(server), cancel)
    assert cancel.waits == [0.5, 60.0]
    assert resets(events) == [1, 2]


def test_rate_limits_escalate_after_the_allowed_retries(server: FakeServer) -> None:
    server.push(*[Reply(429, {"error": {"message": "slow"}}, {"retry-after": "1"}) for _ in range(3)])
    cancel = RecordingCancel()
    with pytest.raises(RateLimitEscalation) as info:
        run_turn(StreamHandler(rate_limit_retries=2, **FAST), client(server), cancel)
    assert info.value.attempts == 3 and info.value.retry_after == 1.0
    assert isinstance(info.value.__cause__, ModelError)
    assert len(server.requests) == 3  # and no rescue after a rate limit
    assert cancel.waits == [1.0, 1.0]


def test_stalled_stream_hits_the_event_timeout_then_the_rescue_answers(server: FakeServer) -> None:
    server.push(
        Stream([oa_chunk({"content": "par"}), Stall()]),
        Stream([oa_chunk({"content": "tial"}), Stall()]),
        Reply(200, openai_completion("rescued reply")),
    )
    handler = StreamHandler(event_timeout=0.15, max_retries=1, **FAST)
    t0 = time.monotonic()
    events, resp = run_turn(handler, client(server))
    elapsed = time.monotonic() - t0
    assert resp.message.text == "rescued reply"
    assert resets(events) == [1, 2]  # before the retry and before the rescue
    assert isinstance(events[-1], StreamRescue)
    assert [bool(r.json.get("stream")) for r in server.requests] == [True, True, False]
    assert elapsed < 5.0  # two 0.15 s timeouts, not the 120 s idle bound
    assert server.wait_open_at_most(1)  # the timed-out connections were closed


def test_first_event_timeout_covers_the_wait_for_headers(server: FakeServer) -> None:
    server.push(Hang())
    handler = StreamHandler(first_event_timeout=0.15, max_retries=0, rescue=False, **FAST)
    with pytest.raises(ModelError, match=r"no first event within 0.15s") as info:
        run_turn(handler, client(server))
    assert info.value.retryable is True
    assert server.wait_open_at_most(0)


def test_total_timeout_stops_a_slow_trickle(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "a"}), Stall()]))
    handler = StreamHandler(event_timeout=30.0, total_timeout=0.2, max_retries=2, rescue=False, **FAST)
    with pytest.raises(ModelError, match="total timeout of 0.2s"):
        run_turn(handler, client(server))
    assert len(server.requests) == 1  # past the total deadline nothing new starts


def test_cut_stream_is_retried_and_the_retry_succeeds(server: FakeServer) -> None:
    server.push(Stream([oa_chunk({"content": "half"}), Cut()]), Stream(openai_stream("whole")))
    events, resp = run_turn(StreamHandler(**FAST), client(server))
    assert resp.message.text == "whole" and resets(events) == [1]


def test_repeated_cuts_end_in_the_rescue(server: FakeServer) -> None:
    server.push(*[Stream([oa_chunk({"content": "x"}), Cut()]) for _ in range(2)],
                Reply(200, openai_completion("from rescue")))
    events, resp = run_turn(StreamHandler(max_retries=1, **FAST), client(server))
    assert resp.message.text == "from rescue"


def test_failed_rescue_reports_both_failures(server: FakeServer) -> None:
    server.push(Stream([Cut()]), Reply(500, {"error": {"message": "rescue broke"}}))
    with pytest.raises(ModelError, match="dropped mid-response; the non-streaming rescue failed too: .*rescue broke") as info:
        run_turn(StreamHandler(max_retries=0, **FAST), client(server))
    assert info.value.status == 500


def test_rescue_can_be_turned_off(server: FakeServer) -> None:
    server.push(Stream([Cut()]))
    with pytest.raises(ModelError) as info:
        run_turn(StreamHandler(max_retries=0, rescue=False, **FAST), client(server))
    assert info.value.retryable is True and len(server.requests) == 1


def test_malformed_chunk_is_not_retried(server: FakeServer) -> None:
    server.push(Stream([b"data: {oops\n\n"]), Stream(openai_stream("never")))
    with pytest.raises(ModelError, match="malformed JSON"):
        run_turn(StreamHandler(**FAST), client(server))
    assert len(server.requests) == 1


def test_passthrough_makes_one_attempt_and_raises_as_is(server: FakeServer) -> None:
    server.push(Reply(502, {"error": {"message": "bad gateway"}}), Stream(openai_stream("never")))
    with pytest.raises(ModelError, match="bad gateway"):
        run_turn(StreamHandler.passthrough(), client(server))
    assert len(server.requests) == 1


def test_jitter_keeps_each_delay_within_its_band(server: FakeServer) -> None:
    server.push(*[Reply(502, {}) for _ in range(4)])
    cancel = RecordingCancel()
    with pytest.raises(ModelError):
        run_turn(StreamHandler(max_retries=3, base_delay=1.0, max_delay=3.0, jitter=0.5), client(server), cancel)
    for got, nominal in zip(cancel.waits, [1.0, 2.0, 3.0]):
        assert nominal * 0.5 <= got <= nominal * 1.5
    assert len(cancel.waits) == 3


class FlakyClient:
    """An in-process client: the first stream ends without its terminal event."""

    model = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def stream(self, request: ModelRequest) -> IteratorStream:
        self.calls += 1
        events: list[StreamEvent] = list(response_events(reply("steady answer")))
        if self.calls == 1:
            events = [e for e in events if not isinstance(e, MessageStop)]
        return IteratorStream(iter(events))

    def complete(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("no rescue expected")


def test_truncated_foreign_stream_is_retried_never_taken_as_complete() -> None:
    c = FlakyClient()
    events, resp = run_turn(StreamHandler(**FAST), c)
    assert resp.message.text == "steady answer"
    assert c.calls == 2 and resets(events) == [1]


def test_foreign_exception_becomes_a_model_error() -> None:
    class Broken:
        model = "broken"

        def stream(self, request: ModelRequest) -> Any:
            raise RuntimeError("kaboom")

    with pytest.raises(ModelError, match="kaboom") as info:
        run_turn(StreamHandler(**FAST), Broken())
    assert isinstance(info.value.__cause__, RuntimeError)


def test_cancelled_signal_before_the_turn_raises_cancelled(server: FakeServer) -> None:
    cancel = RecordingCancel()
    cancel._fired.set()
    with pytest.raises(Cancelled):
        run_turn(StreamHandler(**FAST), client(server), cancel)
    assert server.requests == []


@pytest.mark.parametrize(
    "kwargs",
    [{"max_retries": -1}, {"event_timeout": -1.0}, {"jitter": 2.0}, {"base_delay": "1"}, {"rate_limit_retries": 1.5}],
)
def test_bad_settings_raise_config_error_naming_the_field(kwargs: dict[str, Any]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=name):
        StreamHandler(**kwargs)


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
