"""Traces keep to what they promise: no content without ``record_content``, the provider however attached.

An ``OutputValidationError`` quotes the model's reply and a ``LoopDetected``
quotes a tool's input: without ``record_content`` neither text may reach a
span's status or its ``exception`` event (the error's class does). The
provider's name comes from the model events themselves, so an observer
attached with ``register_observer`` names it on chat spans, the run span
and the metrics as one attached with ``instrument()`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest

pytest.importorskip("opentelemetry.sdk")

from fakeserver import FakeServer, Stream, anthropic_stream, openai_stream  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402
from support import Echo, Recorder  # noqa: E402

from loopctl import BareLoop, LoopDetected, OutputValidationError, RunConfig  # noqa: E402
from loopctl.contrib.otel import OTelObserver  # noqa: E402
from loopctl.detection import LoopDetector  # noqa: E402
from loopctl.observers import StreamSuccess, TurnStart  # noqa: E402
from loopctl.providers import AnthropicClient, OpenAIClient  # noqa: E402
from loopctl.testing import ScriptedClient, call, reply  # noqa: E402

PRIVATE = "the-patients-home-address-221B"


@attrs.frozen
class Answer:
    """A typed answer."""

    value: int


class Traced:
    def __init__(self, **kw: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.observer = OTelObserver(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kw)

    def dump(self) -> str:
        return "\n".join(s.to_json() for s in self.exporter.get_finished_spans())

    def one(self, name: str) -> Any:
        found = [s for s in self.exporter.get_finished_spans() if s.name == name]
        assert len(found) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return found[0]

    def metric_points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        return [p for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
                for m in sm.metrics if m.name == metric for p in m.data.data_points]

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture(params=[False, True], ids=["content off", "content on"])
def traced(request: pytest.FixtureRequest) -> Iterator[Traced]:
    t = Traced(record_content=request.param)
    yield t
    t.close()


def _assert_error_span(traced: Traced, kind: str) -> None:
    root = traced.one("invoke_agent")
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == kind
    (exc,) = [e for e in root.events if e.name == "exception"]
    assert exc.attributes["exception.type"] == kind
    if traced.observer.record_content:
        assert PRIVATE in (root.status.description or "") and PRIVATE in exc.attributes["exception.message"]
    else:
        assert kind in (root.status.description or "")
        assert PRIVATE not in traced.dump(), "content reached a span without record_content"


def test_a_typed_answer_that_never_fits_keeps_the_reply_out_of_spans(traced: Traced) -> None:
    with BareLoop(ScriptedClient([reply(f'{{"value": "{PRIVATE}"}}')])) as loop:
        loop.register_observer(traced.observer)
        with pytest.raises(OutputValidationError):
            loop.run("hi", RunConfig(output_retries=0), output_type=Answer)
    _assert_error_span(traced, "OutputValidationError")


def test_a_detected_loop_keeps_the_tool_input_out_of_spans(traced: Traced) -> None:
    script = [call("echo", x=PRIVATE) for _ in range(4)] + [reply("done")]
    with BareLoop(ScriptedClient(script), [Echo()]) as loop:
        loop.set_loop_detector(LoopDetector(warn_at=2, stop_at=2, window=4))
        loop.register_observer(traced.observer)
        with pytest.raises(LoopDetected) as info:
            loop.run("hi")
    assert PRIVATE in str(info.value)  # the error itself quotes it: the span must not
    _assert_error_span(traced, "LoopDetected")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_every_model_event_names_the_clients_provider(provider: str, server: FakeServer) -> None:
    if provider == "openai":
        server.push(Stream(openai_stream("hello")))
        client: Any = OpenAIClient("m", api_key="k", base_url=f"http://127.0.0.1:{server.port}/v1")
    else:
        server.push(Stream(anthropic_stream("hello")))
        client = AnthropicClient("m", api_key="k", base_url=f"http://127.0.0.1:{server.port}")
    recorder = Recorder()
    with BareLoop(client) as loop:
        loop.register_observer(recorder)
        loop.run("hi")
    assert [e.provider for e in recorder.of(TurnStart)] == [provider]
    assert [e.provider for e in recorder.of(StreamSuccess)] == [provider]
    assert recorder.of(TurnStart)[0].to_dict()["provider"] == provider


def test_register_observer_names_the_provider_on_spans_and_metrics(server: FakeServer) -> None:
    traced = Traced()
    try:
        server.push(Stream(openai_stream("hello")))
        client = OpenAIClient("m", api_key="k", base_url=f"http://127.0.0.1:{server.port}/v1")
        with BareLoop(client) as loop:
            loop.register_observer(traced.observer)  # not instrument(): nobody told it the client
            loop.run("hi")
        chat = traced.one("chat m")  # the model asked for; the server's answer names gpt-test
        assert chat.attributes["gen_ai.provider.name"] == "openai"
        assert traced.one("invoke_agent").attributes["gen_ai.provider.name"] == "openai"
        points = traced.metric_points("gen_ai.client.operation.duration")
        assert points and all(p.attributes.get("gen_ai.provider.name") == "openai" for p in points)
    finally:
        traced.close()


def test_recorded_tool_arguments_are_standard_json() -> None:
    import json

    traced = Traced(record_content=True)
    try:
        script = [call("echo", x=float("nan"), y=float("inf")), reply("done")]
        # Non-streaming: a streamed reply's NaN argument is refused as invalid JSON before any span.
        with BareLoop(ScriptedClient(script), [Echo()]).with_turn_mode("non_streaming") as loop:
            loop.register_observer(traced.observer)
            loop.run("hi")
        args = traced.one("execute_tool echo").attributes["gen_ai.tool.call.arguments"]
        assert json.loads(args, parse_constant=lambda c: pytest.fail(f"{c} in {args}")) == {"x": None, "y": None}
    finally:
        traced.close()
