"""OTelObserver: the span tree and metrics of real runs, read back from the SDK's in-memory exporters.

Each test runs a loop with an ``OTelObserver`` on its own SDK tracer and
meter providers (``InMemorySpanExporter``, ``InMemoryMetricReader``) and
asserts names, parents, attributes, events and status. Timing windows are
gates and barriers (tests/support.py), never sleeps. The model-call tests
speak real HTTP to tests/fakeserver.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("opentelemetry.sdk")

from fakeserver import FakeServer, Reply, Stream, openai_stream  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402
from support import WAIT, Gate, GatedReply, Recorder  # noqa: E402

from loopctl import BareLoop, Cancelled, Tool, ToolContext, Usage  # noqa: E402
from loopctl.contrib.otel import OTelObserver  # noqa: E402
from loopctl.errors import ModelError, RateLimited, RateLimitEscalation  # noqa: E402
from loopctl.hosting.registry import RunRegistry  # noqa: E402
from loopctl.messages import RequestOptions  # noqa: E402
from loopctl.observers import (  # noqa: E402
    CallbackObserver,
    Compaction,
    ConvergenceDetected,
    Fallback,
    LoopDetectedEvent,
    ModelSwitched,
    RetryScheduled,
    RunEnd,
    RunStart,
    StreamFailure,
    StreamSuccess,
    ToolCallReceived,
    ToolPost,
    ToolPre,
    TurnEnd,
    TurnStart,
)
from loopctl.providers import OpenAIClient  # noqa: E402
from loopctl.providers.stream_handler import StreamHandler  # noqa: E402
from loopctl.testing import ScriptedClient, call, calls, reply  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-test-secret-0123456789abcdef"
FAST = dict(base_delay=0.001, max_delay=0.01, jitter=0.0, rate_limit_delay=0.001, max_retry_wait=0.01)


class Traced:
    """An observer on private SDK providers, and readers for what it wrote."""

    def __init__(self, **kw: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.observer = OTelObserver(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kw)

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in self.spans()]}"
        return found[0]

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.parent is not None and s.parent.span_id == parent.context.span_id]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == metric:
                        out.extend(m.data.data_points)
        return out

    def dump(self) -> str:
        """Every span as JSON text (to look for what must not be there)."""
        return "\n".join(s.to_json() for s in self.spans())


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    yield t
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


def event_names(span: ReadableSpan) -> list[str]:
    return [e.name for e in span.events]


def event(span: ReadableSpan, name: str) -> Any:
    found = [e for e in span.events if e.name == name]
    assert len(found) == 1, f"{len(found)} events {name!r} on {span.name}: {event_names(span)}"
    return found[0]


def with_usage(response: Any, inp: int, out: int) -> Any:
    return attrs.evolve(response, usage=Usage(inp, out))


class Rendezvous(Tool):
    """A concurrency-safe tool that returns only once ``parties`` calls are inside it at once."""

    concurrency_safe = True
    description = "Meets the other calls."

    def __init__(self, name: str, barrier: threading.Barrier) -> None:
        self.name = name
        self.barrier = barrier

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.barrier.wait(WAIT)  # raises BrokenBarrierError unless the calls overlap
        return f"{self.name} met"


class Held(Tool):
    """A tool that blocks on ``gate`` (cancel-aware)."""

    description = "Holds."

    def __init__(self, name: str, gate: Gate) -> None:
        self.name = name
        self.gate = gate

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.gate.entered.set()
        ctx.cancel.wait(WAIT)
        return "held"


def openai(server: FakeServer) -> OpenAIClient:
    return OpenAIClient("gpt-test", api_key=API_KEY, base_url=server.openai_url)


# -- the tool turn ---------------------------------------------------------------------------


def test_two_parallel_tools_are_overlapping_children_of_the_run_span(traced: Traced) -> None:
    barrier = threading.Barrier(2)
    script = [
        with_usage(calls(("alpha", {"q": 1}), ("beta", {"q": 2})), 30, 8),
        reply("both met", usage=Usage(50, 4)),
    ]
    caller = trace.get_tracer("test", tracer_provider=traced.tracer_provider)
    with BareLoop(ScriptedClient(script, model="m-1"), [Rendezvous("alpha", barrier), Rendezvous("beta", barrier)]) as loop:
        traced.observer.instrument(loop)
        with caller.start_as_current_span("request") as request:
            run = loop.run("meet")
    assert run.output == "both met"
    root = traced.one("invoke_agent")
    assert root.parent is not None and root.parent.span_id == request.get_span_context().span_id
    assert root.context.trace_id == request.get_span_context().trace_id
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.agent.name"] == "loopctl"
    assert root.attributes["gen_ai.conversation.id"] == loop.session.id
    assert root.attributes["loopctl.run.id"] == run.id
    assert root.attributes["loopctl.run.outcome"] == "completed"
    assert root.attributes["loopctl.run.turns"] == 2
    assert (root.attributes["gen_ai.usage.input_tokens"], root.attributes["gen_ai.usage.output_tokens"]) == (80, 12)
    assert root.status.status_code is StatusCode.UNSET

    kids = traced.children(root)
    assert sorted(s.name for s in kids) == ["chat m-1", "chat m-1", "execute_tool alpha", "execute_tool beta"]
    chats = sorted(traced.named("chat m-1"), key=lambda s: s.attributes["loopctl.turn"])
    first = chats[0].attributes
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == first["gen_ai.response.model"] == "m-1"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (30, 8)
    assert first["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    alpha, beta = traced.one("execute_tool alpha"), traced.one("execute_tool beta")
    calls_made = run.turns[0].tool_calls
    assert alpha.attributes["gen_ai.tool.name"] == "alpha"
    assert alpha.attributes["gen_ai.tool.call.id"] == calls_made[0].id
    assert beta.attributes["gen_ai.tool.call.id"] == calls_made[1].id
    assert alpha.attributes["gen_ai.operation.name"] == "execute_tool"
    # They ran at once (the barrier proves it) and their spans overlap, inside the turns.
    assert alpha.start_time < beta.end_time and beta.start_time < alpha.end_time
    assert chats[0].end_time <= min(alpha.start_time, beta.start_time)
    assert max(alpha.end_time, beta.end_time) <= chats[1].start_time <= chats[1].end_time <= root.end_time
    assert all(s.status.status_code is StatusCode.UNSET for s in kids)
    # One trace, explicitly built: every span shares the caller's trace id.
    assert {s.context.trace_id for s in traced.spans()} == {request.get_span_context().trace_id}


def test_token_duration_and_run_metrics(traced: Traced) -> None:
    script = [with_usage(call("alpha", q=1), 30, 8), reply("done", usage=Usage(50, 4))]
    tool = Rendezvous("alpha", threading.Barrier(1))
    with BareLoop(ScriptedClient(script, model="m-1"), [tool]) as loop:
        traced.observer.instrument(loop)
        loop.run("go")
    tokens = {p.attributes["gen_ai.token.type"]: p for p in traced.points("gen_ai.client.token.usage")}
    assert (tokens["input"].sum, tokens["input"].count) == (80, 2)
    assert (tokens["output"].sum, tokens["output"].count) == (12, 2)
    assert tokens["input"].attributes["gen_ai.request.model"] == "m-1"
    assert tokens["input"].attributes["gen_ai.operation.name"] == "chat"
    (duration,) = traced.points("gen_ai.client.operation.duration")
    assert duration.count == 2 and duration.sum > 0
    assert duration.explicit_bounds[0] == 0.01  # the conventions' advised buckets
    (started,) = traced.points("loopctl.runs.started")
    (ended,) = traced.points("loopctl.runs.ended")
    assert started.value == 1 and ended.value == 1
    assert ended.attributes["loopctl.run.outcome"] == "completed"
    assert traced.points("loopctl.cancel.latency") == []


def test_a_tool_error_result_is_an_error_span_without_the_tools_text(traced: Traced) -> None:
    class Broken(Tool):
        name = "broken"
        description = "Fails."

        def call(self, input: Any, ctx: ToolContext) -> str:
            raise RuntimeError("db password=hunter22 rejected")

    with BareLoop(ScriptedClient([call("broken"), reply("sorry")]), [Broken()]) as loop:
        loop.register_observer(traced.observer)
        loop.run("go")
    span = traced.one("execute_tool broken")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "tool_error"
    assert "hunter22" not in traced.dump()
    assert traced.one("invoke_agent").status.status_code is StatusCode.UNSET  # the run went on


# -- cancel -------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["run", "start"])
def test_a_run_cancelled_in_a_tool_ends_every_span_and_records_the_cancel(traced: Traced, how: str) -> None:
    caller = trace.get_tracer("test", tracer_provider=traced.tracer_provider)
    for _ in range(5):
        traced.exporter.clear()
        gate = Gate()
        requests: list[Any] = []
        errors: list[BaseException] = []
        with BareLoop(ScriptedClient([call("held"), reply("never")], model="m-1"), [Held("held", gate)]) as loop:
            traced.observer.instrument(loop)

            def caller_side(
                loop: BareLoop = loop, requests: list[Any] = requests, errors: list[BaseException] = errors
            ) -> None:
                # The caller's thread: its current span is the run's parent.
                with caller.start_as_current_span("request") as request:
                    requests.append(request)
                    try:
                        if how == "start":
                            loop.start("go").result(WAIT)
                        else:
                            loop.run("go")
                    except BaseException as exc:  # noqa: BLE001 - handed to the test
                        errors.append(exc)

            t = threading.Thread(target=caller_side, name="test-caller")
            t.start()
            gate.wait_entered()
            loop.cancel("user pressed stop")
            t.join(WAIT)
            assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], Cancelled)
        root = traced.one("invoke_agent")
        assert root.parent is not None and root.parent.span_id == requests[0].get_span_context().span_id
        assert root.attributes["loopctl.run.outcome"] == "cancelled"
        assert root.attributes["loopctl.cancelled"] is True
        assert root.status.status_code is StatusCode.UNSET  # a cancel is not an error
        cancel = event(root, "loopctl.cancel")
        assert cancel.attributes["loopctl.cancel.reason"] == "user pressed stop"
        assert root.start_time <= cancel.timestamp <= root.end_time
        tool = traced.one("execute_tool held")
        assert tool.parent is not None and tool.parent.span_id == root.context.span_id
        assert tool.attributes["loopctl.cancelled"] is True
        assert tool.status.status_code is StatusCode.UNSET
        assert tool.end_time <= root.end_time
        assert traced.one("chat m-1").status.status_code is StatusCode.UNSET
    ended = traced.points("loopctl.runs.ended")
    assert [(p.attributes["loopctl.run.outcome"], p.value) for p in ended] == [("cancelled", 5)]
    (latency,) = traced.points("loopctl.cancel.latency")
    assert latency.count == 5 and 0 <= latency.max < WAIT


def test_a_run_cancelled_during_the_model_call_ends_its_chat_span(traced: Traced) -> None:
    gated = GatedReply(reply("late"))
    with BareLoop(ScriptedClient([gated], model="m-1")) as loop:
        traced.observer.instrument(loop)
        handle = loop.start("go")
        gated.wait_entered()
        handle.cancel()
        with pytest.raises(Cancelled):
            handle.result(WAIT)
        gated.release.set()
    root = traced.one("invoke_agent")
    chat = traced.one("chat m-1")  # named by the model asked for, though none answered
    assert chat.parent is not None and chat.parent.span_id == root.context.span_id
    assert chat.attributes["loopctl.cancelled"] is True
    assert chat.attributes["gen_ai.request.model"] == "m-1"
    assert "gen_ai.response.model" not in chat.attributes
    assert root.attributes["loopctl.run.outcome"] == "cancelled"
    assert "loopctl.cancel.reason" not in event(root, "loopctl.cancel").attributes


@pytest.mark.parametrize("held_in", [TurnStart, ToolCallReceived], ids=["on_turn_start", "on_tool_call_received"])
@pytest.mark.parametrize("otel_first", [True, False], ids=["otel_first", "otel_after"])
def test_a_cancel_while_an_observer_holds_a_phases_first_event_ends_the_spans_cancelled(
    held_in: type, otel_first: bool
) -> None:
    """The cut phase's failed ``on_turn_end`` reaches the tracer: the spans end as they do for any cancel."""
    traced = Traced(record_content=True)  # with content it also listens to on_tool_call_received
    entered, release = threading.Event(), threading.Event()

    def hold(event: Any) -> None:
        if type(event) is held_in and not entered.is_set():
            entered.set()
            release.wait(WAIT)

    holder = CallbackObserver(hold)
    with BareLoop(ScriptedClient([call("held"), reply("never")], model="m-1"), [Held("held", Gate())]) as loop:
        if otel_first:
            traced.observer.instrument(loop)
        loop.register_observer(holder)
        if not otel_first:
            traced.observer.instrument(loop)
        last = Recorder()  # registered last: its on_run_end comes after the tracer's
        loop.register_observer(last)
        handle = loop.start("go")
        assert entered.wait(WAIT)
        assert handle.cancel("user pressed stop")
        with pytest.raises(Cancelled):
            handle.result(WAIT)
        release.set()
        assert last.run_ended.wait(WAIT)  # the queued events were delivered
    root = traced.one("invoke_agent")
    assert root.attributes["loopctl.run.outcome"] == "cancelled" and root.status.status_code is StatusCode.UNSET
    chats = [s for s in traced.spans() if s.name.startswith("chat")]
    assert len(chats) == 1 and chats[0].parent is not None and chats[0].parent.span_id == root.context.span_id
    if held_in is TurnStart:  # the model was never asked
        assert chats[0].attributes["loopctl.cancelled"] is True
    else:  # the model answered; its call's span is a success, and no tool ever ran
        assert chats[0].status.status_code is StatusCode.UNSET and "loopctl.cancelled" not in chats[0].attributes
        assert traced.named("execute_tool held") == []
    assert chats[0].end_time <= root.end_time
    traced.tracer_provider.shutdown()
    traced.meter_provider.shutdown()


# -- model failures over real HTTP ----------------------------------------------------------------


def test_a_503_then_success_is_one_chat_span_with_the_retry_as_an_event(traced: Traced, server: FakeServer) -> None:
    server.push(Reply(503, {"error": {"message": "busy"}}), Stream(openai_stream("hello", usage=(11, 7))))
    with BareLoop(openai(server)) as loop:
        loop.set_stream_handler(StreamHandler(**FAST))
        traced.observer.instrument(loop)
        run = loop.run("hi")
    assert run.output == "hello"
    root = traced.one("invoke_agent")
    chat = traced.one("chat gpt-test")
    assert chat.parent is not None and chat.parent.span_id == root.context.span_id
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.request.model"] == chat.attributes["gen_ai.response.model"] == "gpt-test"
    assert (chat.attributes["gen_ai.usage.input_tokens"], chat.attributes["gen_ai.usage.output_tokens"]) == (11, 7)
    assert chat.status.status_code is StatusCode.UNSET
    # The stream handler announces the wait (RetryScheduled) and then the new attempt.
    retry = event(chat, "loopctl.retry_scheduled")
    assert "503" in retry.attributes["loopctl.retry.cause"]
    reset = event(chat, "loopctl.attempt_reset")
    assert reset.attributes["loopctl.attempt"] == 1
    assert chat.start_time <= retry.timestamp <= reset.timestamp <= chat.end_time
    assert root.attributes["gen_ai.provider.name"] == "openai"
    assert len(server.requests) == 2


def test_a_call_is_named_by_the_model_it_asked_for_and_the_server_names_the_one_that_served(
    traced: Traced, server: FakeServer
) -> None:
    # The request goes to the options' model (as a fallback route's does); the
    # server answers with a dated snapshot of it, after a 503 and a retry.
    server.push(Reply(503, {"error": {"message": "busy"}}), Stream(openai_stream("hello", model="gpt-4o-2024-08-06")))
    recorder = Recorder()
    with BareLoop(openai(server)) as loop:
        loop.with_request_options(RequestOptions(model="gpt-4o")).with_observer(recorder)
        loop.set_stream_handler(StreamHandler(**FAST))
        traced.observer.instrument(loop)
        loop.run("hi")
    assert [r.json["model"] for r in server.requests] == ["gpt-4o", "gpt-4o"]
    assert [e.model for e in recorder.of(TurnStart)] == ["gpt-4o"]
    assert [e.model for e in recorder.of(RetryScheduled)] == ["gpt-4o"]
    assert [e.model for e in recorder.of(StreamSuccess)] == ["gpt-4o-2024-08-06"]
    chat = traced.one("chat gpt-4o")
    assert chat.attributes["gen_ai.request.model"] == "gpt-4o"
    assert chat.attributes["gen_ai.response.model"] == "gpt-4o-2024-08-06"
    points = traced.points("gen_ai.client.operation.duration") + traced.points("gen_ai.client.token.usage")
    assert len(points) == 3
    for p in points:
        assert (p.attributes["gen_ai.request.model"], p.attributes["gen_ai.response.model"]) == (
            "gpt-4o", "gpt-4o-2024-08-06"
        )


def test_a_model_call_failing_after_its_retries_sets_error_status_without_secrets(
    traced: Traced, server: FakeServer
) -> None:
    server.push(*[Reply(503, {"error": {"message": f"busy, key {API_KEY}"}}) for _ in range(3)])
    with BareLoop(openai(server)) as loop:
        loop.set_stream_handler(StreamHandler(rate_limit_retries=2, **FAST))
        traced.observer.instrument(loop)
        with pytest.raises(RateLimitEscalation):
            loop.run("hi")
    root = traced.one("invoke_agent")
    chat = traced.one("chat gpt-test")
    assert [e.attributes["loopctl.attempt"] for e in chat.events if e.name == "loopctl.attempt_reset"] == [1, 2]
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes["error.type"] == "RateLimitEscalation"
    exc = event(chat, "exception")
    assert exc.attributes["exception.type"] == "RateLimitEscalation"
    assert "rate limited after 3 attempts" in exc.attributes["exception.message"]
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == "RateLimitEscalation"
    assert root.attributes["loopctl.run.outcome"] == "failed"
    assert event(root, "exception").attributes["exception.type"] == "RateLimitEscalation"
    assert API_KEY not in traced.dump() and "0123456789abcdef" not in traced.dump()
    (duration,) = traced.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "RateLimitEscalation"
    (ended,) = traced.points("loopctl.runs.ended")
    assert ended.attributes["loopctl.run.outcome"] == "failed"
    assert ended.attributes["error.type"] == "RateLimitEscalation"


def test_retry_scheduled_events_land_on_their_model_calls_span(traced: Traced) -> None:
    obs = traced.observer
    with BareLoop(ScriptedClient([reply("ok")], model="m-1")) as loop:
        loop.register_observer(obs)
        loop.run("go")  # a real run first: the observer's state must not leak into the next
    sid, rid = "s-1", "r-1"
    obs.on_run_start(RunStart(sid, rid, "go"))
    obs.on_turn_start(TurnStart(sid, rid, 0, "go"))
    obs.on_retry_scheduled(RetryScheduled(sid, rid, 0, "m-2", f"rate limited (429), key {API_KEY}", 0.5, 2, 3))
    obs.on_stream_failure(StreamFailure(sid, rid, 0, "m-2", "model call failed: HTTP 500"))
    obs.on_turn_end(TurnEnd(sid, rid, 0, "llm", False, "model call failed: HTTP 500", 3.0, 0, 0, None, 10, None))
    obs.on_turn_start(TurnStart(sid, rid, 1, "go"))
    obs.on_stream_success(StreamSuccess(sid, rid, 1, "m-2", None))
    obs.on_run_end(RunEnd(sid, rid, True, None, 2, 5.0))
    failed = [s for s in traced.named("chat m-2") if s.attributes["loopctl.turn"] == 0]
    assert len(failed) == 1
    retry = event(failed[0], "loopctl.retry_scheduled")
    assert retry.attributes["loopctl.attempt"] == 2
    assert retry.attributes["loopctl.retry.max_attempts"] == 3
    assert retry.attributes["loopctl.retry.wait_s"] == 0.5
    assert retry.attributes["loopctl.retry.cause"].startswith("rate limited (429)")
    assert API_KEY not in traced.dump()
    assert failed[0].status.status_code is StatusCode.ERROR
    assert failed[0].attributes["error.type"] == "ModelError"


# -- steering and content --------------------------------------------------------------------------


@pytest.mark.parametrize("record_content", [False, True])
def test_steering_delivered_is_an_event_on_the_run_span(record_content: bool) -> None:
    t = Traced(record_content=record_content)
    gated = GatedReply(call("alpha", q=1))
    tool = Rendezvous("alpha", threading.Barrier(1))
    with BareLoop(ScriptedClient([gated, reply("steered")], model="m-1"), [tool]) as loop:
        t.observer.instrument(loop)
        handle = loop.start("the secret plan")
        gated.wait_entered()
        assert loop.steering().push("shorter please")
        gated.release.set()
        handle.result(WAIT)
    root = t.one("invoke_agent")
    steering = event(root, "loopctl.steering")
    assert steering.attributes["loopctl.turn"] == 1
    assert steering.attributes["loopctl.steering.count"] == 1
    chats = sorted(t.named("chat m-1"), key=lambda s: s.attributes["loopctl.turn"])
    assert chats[0].end_time <= steering.timestamp <= chats[1].start_time
    dump = t.dump()
    if record_content:
        assert steering.attributes["loopctl.steering.messages"] == ("shorter please",)
        assert json.loads(root.attributes["gen_ai.input.messages"])[0]["parts"][0]["content"] == "the secret plan"
        assert json.loads(root.attributes["gen_ai.output.messages"])[0]["parts"][0]["content"] == "steered"
        tool_span = t.one("execute_tool alpha")
        assert json.loads(tool_span.attributes["gen_ai.tool.call.arguments"]) == {"q": 1}
        assert tool_span.attributes["gen_ai.tool.call.result"] == "alpha met"
    else:
        for text in ("shorter please", "the secret plan", "steered", "alpha met"):
            assert text not in dump
        assert "gen_ai.tool.call.arguments" not in dump
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


def test_recorded_content_is_safe_to_export() -> None:
    t = Traced(record_content=True)

    class Odd(Tool):
        name = "odd"
        description = "Returns a lone surrogate and a key."

        def call(self, input: Any, ctx: ToolContext) -> str:
            return "bad \ud800 text " + API_KEY

    # Non-streaming: a streamed reply's NaN argument is refused as invalid JSON before any span.
    with BareLoop(ScriptedClient([call("odd", x=float("nan")), reply("ok")]), [Odd()]).with_turn_mode("non_streaming") as loop:
        loop.register_observer(t.observer)
        loop.run("go")
    span = t.one("execute_tool odd")
    result = span.attributes["gen_ai.tool.call.result"]
    result.encode("utf-8")  # no lone surrogate left
    assert API_KEY not in result and "<redacted>" in result
    assert json.loads(span.attributes["gen_ai.tool.call.arguments"]) == {"x": None}  # standard JSON: no NaN
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


# -- many runs, many threads -----------------------------------------------------------------------------


def test_one_observer_on_concurrent_loops_keeps_each_runs_tree_apart(traced: Traced) -> None:
    n_loops, rounds = 4, 10
    for _ in range(rounds):
        traced.exporter.clear()
        barrier = threading.Barrier(n_loops * 2)  # every tool of every loop in flight at once
        loops = []
        for _k in range(n_loops):
            script = [calls(("alpha", {}), ("beta", {})), reply("ok")]
            loop = BareLoop(ScriptedClient(script), [Rendezvous("alpha", barrier), Rendezvous("beta", barrier)])
            loops.append(traced.observer.instrument(loop))
        handles = [loop.start("go") for loop in loops]
        runs = [h.result(WAIT) for h in handles]
        for loop in loops:
            loop.close()
        roots = {s.attributes["loopctl.run.id"]: s for s in traced.named("invoke_agent")}
        assert sorted(roots) == sorted(r.id for r in runs)
        for r in runs:
            root = roots[r.id]
            kids = traced.children(root)
            assert sorted(s.name for s in kids) == ["chat scripted"] * 2 + ["execute_tool alpha", "execute_tool beta"]
            ids = {s.attributes["gen_ai.tool.call.id"] for s in kids if s.name.startswith("execute_tool")}
            assert ids == {c.id for c in r.turns[0].tool_calls}
            assert root.parent is None  # no caller span: a root span


def test_observer_state_is_released_after_each_run(traced: Traced) -> None:
    gate = Gate()
    with BareLoop(ScriptedClient([call("held")] * 3), [Held("held", gate)]) as loop:
        traced.observer.instrument(loop)
        for _ in range(3):
            handle = loop.start("go")
            gate.wait_entered()
            gate.entered.clear()
            handle.cancel()
            with pytest.raises(Cancelled):
                handle.result(WAIT)
    assert traced.observer._runs == {} and traced.observer._cancels == {}


def test_without_providers_the_global_ones_are_used() -> None:
    code = """
import json
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from loopctl import BareLoop
from loopctl.contrib.otel import OTelObserver
from loopctl.testing import ScriptedClient, reply

observer = OTelObserver()  # made before the providers are set: it follows them
exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
with BareLoop(ScriptedClient([reply("ok")])) as loop:
    loop.register_observer(observer)
    loop.run("go")
names = sorted(s.name for s in exporter.get_finished_spans())
metric_names = sorted(m.name for rm in reader.get_metrics_data().resource_metrics
                      for sm in rm.scope_metrics for m in sm.metrics)
print(json.dumps([names, metric_names]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    names, metric_names = json.loads(out.stdout.strip().splitlines()[-1])
    assert names == ["chat scripted", "invoke_agent"]
    assert "loopctl.runs.started" in metric_names and "gen_ai.client.operation.duration" in metric_names


def test_events_of_no_known_run_are_ignored(traced: Traced) -> None:
    obs = traced.observer
    obs.on_turn_start(TurnStart("s", "nobody", 0, "q"))
    obs.on_tool_pre(ToolPre("s", "nobody", 0, "c", "t", 0))
    obs.on_tool_post(ToolPost("s", "nobody", 0, "c", "t", 0, False, 1.0, "out", "h"))
    obs.on_compaction(Compaction("s", "nobody", "threshold", 10, 5))
    obs.on_run_end(RunEnd("s", "nobody", True, None, 0, 1.0))
    assert traced.spans() == []


@attrs.frozen
class ApprovalEvent:
    """The shape SPEC §14 fixes for the approval events (their classes come with the approvals issue)."""

    session_id: str
    run_id: str
    call_id: str
    tool: str
    approved: Any = None


@pytest.mark.parametrize("record_content", [False, True])
def test_run_level_happenings_are_events_on_the_run_span(record_content: bool) -> None:
    t = Traced(record_content=record_content)
    obs = t.observer
    sid, rid = "s-1", "r-1"
    obs.on_run_start(RunStart(sid, rid, "go"))
    obs.on_compaction(Compaction(sid, rid, "threshold", 900, 400))
    obs.on_fallback(Fallback(sid, rid, "big", "small"))
    obs.on_model_switched(ModelSwitched(sid, rid, "big", "small"))
    obs.on_loop_detected(LoopDetectedEvent(sid, rid, "search({'q': 'my secret'})", 3))
    obs.on_convergence_detected(ConvergenceDetected(sid, rid, "warn", 0.97, 3))
    obs.on_approval_requested(ApprovalEvent(sid, rid, "c-1", "delete_file"))
    obs.on_approval_resolved(ApprovalEvent(sid, rid, "c-1", "delete_file", approved=False))
    obs.on_run_end(RunEnd(sid, rid, False, "max turns exceeded: the run used all 3 turns", 3, 9.0))
    root = t.one("invoke_agent")
    assert event_names(root) == [
        "loopctl.compaction", "loopctl.fallback", "loopctl.model_switched", "loopctl.loop_detected",
        "loopctl.convergence_detected", "loopctl.approval_requested", "loopctl.approval_resolved", "exception",
    ]
    compaction = event(root, "loopctl.compaction").attributes
    assert (compaction["loopctl.compaction.reason"], compaction["loopctl.compaction.tokens_before"],
            compaction["loopctl.compaction.tokens_after"]) == ("threshold", 900, 400)
    assert event(root, "loopctl.fallback").attributes["loopctl.model.to"] == "small"
    assert event(root, "loopctl.convergence_detected").attributes["loopctl.convergence.similarity"] == 0.97
    resolved = event(root, "loopctl.approval_resolved").attributes
    assert (resolved["gen_ai.tool.call.id"], resolved["gen_ai.tool.name"]) == ("c-1", "delete_file")
    assert resolved["loopctl.approval.approved"] is False
    assert "loopctl.approval.approved" not in event(root, "loopctl.approval_requested").attributes
    assert ("my secret" in t.dump()) is record_content
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == "MaxTurnsExceeded"
    assert root.attributes["loopctl.run.outcome"] == "failed"
    t.tracer_provider.shutdown()
    t.meter_provider.shutdown()


def test_instrumenting_a_loop_twice_registers_once(traced: Traced) -> None:
    with BareLoop(ScriptedClient([reply("ok")])) as loop:
        assert traced.observer.instrument(loop) is loop
        traced.observer.instrument(loop)
        loop.run("go")
    assert len(traced.named("invoke_agent")) == 1 and len(traced.named("chat scripted")) == 1


@pytest.mark.parametrize("how", ["run", "start", "registry"])
def test_the_callers_current_span_is_the_runs_parent(traced: Traced, how: str) -> None:
    caller = trace.get_tracer("test", tracer_provider=traced.tracer_provider)
    script = [call("alpha"), reply("ok")] * 3
    with BareLoop(ScriptedClient(script), [Rendezvous("alpha", threading.Barrier(1))]) as loop:
        traced.observer.instrument(loop)
        for _ in range(3):
            traced.exporter.clear()
            with caller.start_as_current_span("request") as request:
                if how == "run":
                    loop.run("go")
                elif how == "start":
                    loop.start("go").result(WAIT)
                else:  # a web request's handler starting a hosted run (examples/flask_app.py)
                    registry = RunRegistry()
                    try:
                        registry.result(registry.start(loop, "go"), timeout=WAIT)
                    finally:
                        registry.close()
            root = traced.one("invoke_agent")
            assert root.parent is not None and root.parent.span_id == request.get_span_context().span_id
            assert {s.parent.span_id for s in traced.children(root)} == {root.context.span_id}
            assert len(traced.children(root)) == 3


def test_trace_context_travels_as_a_w3c_carrier() -> None:
    from loopctl.contrib.otel.propagation import attached, current_carrier

    provider = TracerProvider()
    tracer = trace.get_tracer("test", tracer_provider=provider)
    assert current_carrier() is None  # no span: nothing to carry
    with tracer.start_as_current_span("web") as web:
        carrier = current_carrier()
    assert carrier is not None
    ctx = web.get_span_context()
    assert carrier["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    assert not trace.get_current_span().get_span_context().is_valid
    with attached(carrier):
        remote = trace.get_current_span().get_span_context()
        assert (remote.trace_id, remote.span_id, remote.is_remote) == (ctx.trace_id, ctx.span_id, True)
    assert not trace.get_current_span().get_span_context().is_valid  # detached after the block
    with tracer.start_as_current_span("task", context=trace.set_span_in_context(web)) as task:
        with attached(carrier):  # already inside that trace: the closer parent stays current
            assert trace.get_current_span() is task
    with attached({}), attached(None):
        assert not trace.get_current_span().get_span_context().is_valid
    provider.shutdown()


def test_a_call_blocked_by_a_hook_ends_with_its_tool_phase(traced: Traced) -> None:
    from loopctl.hooks import Hook, HookDecision, HookExecutor

    class NoBeta(Hook):
        def on_pre_tool_use(self, ctx: Any) -> Any:
            return HookDecision.block("not beta") if ctx.tool == "beta" else None

    barrier = threading.Barrier(1)
    script = [calls(("alpha", {}), ("beta", {})), reply("ok")]
    with BareLoop(ScriptedClient(script), [Rendezvous("alpha", barrier), Rendezvous("beta", barrier)]) as loop:
        loop.set_hook_executor(HookExecutor([NoBeta()]))
        traced.observer.instrument(loop)
        loop.run("go")
    alpha, beta = traced.one("execute_tool alpha"), traced.one("execute_tool beta")
    assert alpha.status.status_code is StatusCode.UNSET
    assert beta.status.status_code is StatusCode.ERROR and beta.attributes["error.type"] == "no_result"
    assert "not beta" not in traced.dump()
    final = max(traced.named("chat scripted"), key=lambda s: s.attributes["loopctl.turn"])
    assert beta.end_time <= final.start_time  # closed with its tool phase, not at the run's end


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ModelError("run cancelled by the upstream proxy"), "ModelError"),  # a cancel's opening, not a cancel
        (ModelError("max turns exceeded for this API key tier"), "ModelError"),
        (RateLimited("slow down", 3600.0, 60.0), "RateLimited"),
        (ModelError("bad request"), "ModelError"),
    ],
    ids=["cancel-like text", "max-turns-like text", "RateLimited", "plain"],
)
@pytest.mark.parametrize("wiring", ["instrument", "register_observer"])
def test_a_runs_error_type_is_the_errors_class_not_a_guess_from_its_text(
    traced: Traced, error: ModelError, expected: str, wiring: str
) -> None:
    # The events carry the class (error_type): a plain registration is as exact as instrument().
    loop = BareLoop(ScriptedClient([error]))
    if wiring == "instrument":
        traced.observer.instrument(loop)
    else:
        loop.register_observer(traced.observer)
    with loop, pytest.raises(type(error)):
        loop.run("hi")
    root = traced.one("invoke_agent")
    assert root.attributes["loopctl.run.outcome"] == "failed"
    assert "loopctl.cancelled" not in root.attributes
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == expected
    assert event(root, "exception").attributes["exception.type"] == expected
    (ended,) = traced.points("loopctl.runs.ended")
    assert ended.attributes["loopctl.run.outcome"] == "failed" and ended.attributes["error.type"] == expected
    # The failed model call that ended the run names the same class.
    (chat,) = [s for s in traced.children(root) if s.name.startswith("chat")]
    assert chat.status.status_code is StatusCode.ERROR and "loopctl.cancelled" not in chat.attributes
    assert chat.attributes["error.type"] == expected
    assert event(chat, "exception").attributes["exception.type"] == expected
    (duration,) = traced.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == expected


def test_events_without_error_type_fall_back_to_the_texts_fixed_opening(traced: Traced) -> None:
    # Events from an older producer (a stored stream) name no class: the text's opening decides.
    obs = traced.observer
    for rid, text, expected in [
        ("r1", "run cancelled by the upstream proxy", "_OTHER"),
        ("r2", "max turns exceeded: the run used all 3 turns", "MaxTurnsExceeded"),
    ]:
        obs.on_run_start(RunStart("s", rid, "hi"))
        obs.on_turn_start(TurnStart("s", rid, 0, "hi"))
        obs.on_turn_end(TurnEnd("s", rid, 0, "llm", False, "model call failed: HTTP 500", 3.0, 0, 0, None, 10, None))
        obs.on_run_end(RunEnd("s", rid, False, text, 1, 5.0))
        (root,) = [s for s in traced.named("invoke_agent") if s.attributes["loopctl.run.id"] == rid]
        assert root.attributes["loopctl.run.outcome"] == "failed" and root.attributes["error.type"] == expected
        (chat,) = traced.children(root)
        assert chat.attributes["error.type"] == "ModelError"


def test_a_failed_tool_phase_cuts_its_open_calls_with_the_events_error_type(traced: Traced) -> None:
    obs = traced.observer
    obs.on_run_start(RunStart("s", "r", "hi"))
    obs.on_tool_pre(ToolPre("s", "r", 0, "c1", "lookup", 1))
    obs.on_turn_end(
        TurnEnd("s", "r", 0, "tools", False, "oops", 3.0, 0, 0, None, 10, None, error_type="ToolRecoveryExhausted")
    )
    obs.on_run_end(RunEnd("s", "r", False, "oops", 1, 5.0, error_type="ToolRecoveryExhausted"))
    tool = traced.one("execute_tool lookup")
    assert tool.attributes["error.type"] == "ToolRecoveryExhausted"
    assert traced.one("invoke_agent").attributes["error.type"] == "ToolRecoveryExhausted"


class Quick(Tool):
    """A concurrency-safe tool that returns at once (and says so just before)."""

    concurrency_safe = True
    name = "quick"
    description = "Returns at once."

    def __init__(self) -> None:
        self.returning = threading.Event()

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.returning.set()
        return "quick"


class Slow(Tool):
    """A concurrency-safe tool held by a gate."""

    concurrency_safe = True
    name = "slow"
    description = "Waits for the test."

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def call(self, input: Any, ctx: ToolContext) -> str:
        self.gate.pass_through()
        return "slow"


def test_a_quick_tool_beside_a_slow_one_has_a_span_as_short_as_its_call(traced: Traced) -> None:
    gate = Gate()
    quick, slow = Quick(), Slow(gate)
    script = [calls(("quick", {}), ("slow", {})), reply("done")]
    with BareLoop(ScriptedClient(script), [quick, slow]) as loop:
        traced.observer.instrument(loop)
        handle = loop.start("go")
        gate.wait_entered()
        assert quick.returning.wait(WAIT)
        gate.open()  # the slow call ends only after the quick one has returned
        run = handle.result(WAIT)
    assert run.output == "done"
    q, s = traced.one("execute_tool quick"), traced.one("execute_tool slow")
    # The wave's calls start together; each span lasts its own call's run time,
    # not until the wave's slowest call returns.
    assert q.start_time == s.start_time
    for span in (q, s):
        ran_ns = span.attributes["loopctl.tool.duration_ms"] * 1e6
        assert abs((span.end_time - span.start_time) - ran_ns) <= 1_000, span.name
    assert q.start_time < s.end_time and s.start_time < q.end_time
    chat0, chat1 = sorted(traced.named("chat scripted"), key=lambda c: c.attributes["loopctl.turn"])
    assert chat0.end_time <= q.start_time and max(q.end_time, s.end_time) <= chat1.start_time


def test_a_failed_model_call_the_run_survives_is_written_when_the_run_goes_on(traced: Traced) -> None:
    from loopctl import Message, SessionConfig
    from loopctl.errors import ContextOverflow

    script = [ContextOverflow("prompt is too long", 400), reply("fits now")]
    history = [m for i in range(20) for m in (Message.user(f"question {i} " * 50), Message.assistant(f"answer {i}"))]
    loop = BareLoop.from_history(ScriptedClient(script), [], SessionConfig(), history)
    traced.observer.instrument(loop)
    with loop:
        run = loop.run("hi")
    assert run.output == "fits now"
    root = traced.one("invoke_agent")
    assert root.attributes["loopctl.run.outcome"] == "completed"
    failed, ok = sorted(traced.named("chat scripted"), key=lambda c: c.start_time)
    # The exact class from the failed turn end, not a guess from the text.
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes["error.type"] == "ContextOverflow"
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.end_time <= ok.start_time <= ok.end_time <= root.end_time
    assert {s.parent.span_id for s in (failed, ok)} == {root.context.span_id}
