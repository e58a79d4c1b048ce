"""What ``OTelObserver`` adds to a turn (issue 20; target <= 20 µs per turn with a no-op exporter).

One run of N tool turns (as ``turn_overhead.py``: a scripted, non-streaming
model asks for one call of a trivial tool each turn, then answers), timed
three ways on the run's own thread plus the caller's (CPU time, best of
REPEATS, GC off): no observer; an ``OTelObserver`` on the API's no-op
providers (the observer's own bookkeeping); an ``OTelObserver`` on the SDK
with a span processor whose exporter drops everything and a meter provider
whose reader is never collected (what a real setup costs before export).
The overhead per turn is (with observer - without) / N.

The floor of each figure is what any observer-based instrumentation of
this tree must pay, measured in the same process: the loop delivering the
same events to a do-nothing observer, plus the same telemetry written by
hand (per turn one ``chat`` and one ``execute_tool`` span with the same
attributes, children of a run span, and the three histogram records).

Run: ``python benchmarks/otel_overhead.py`` (from the repo root; < 60 s; ``--smoke``: 20
turns, once).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402
from run_all import report, smoke_requested  # noqa: E402
from turn_overhead import Noop, run_bodies, script  # noqa: E402

from loopctl import BareLoop, Observer, RunConfig  # noqa: E402
from loopctl.contrib.otel import OTelObserver  # noqa: E402
from loopctl.testing import ScriptedClient  # noqa: E402

N = 300
REPEATS = 9
SMOKE_N, SMOKE_REPEATS = 20, 1  # --smoke
TARGET_US = 20.0


class DropExporter(SpanExporter):
    """An exporter that drops every span (the "no-op exporter")."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Listening(Observer):
    """Listens to the events ``OTelObserver`` listens to, and does nothing with them."""

    def _ignore(self, event: Any) -> None:
        return None

    on_run_start = on_run_end = on_turn_start = on_turn_end = _ignore
    on_stream_success = on_stream_failure = on_attempt_reset = on_retry_scheduled = _ignore
    on_tool_pre = on_tool_post = on_compaction = on_steering = _ignore


def sdk_providers() -> tuple[Any, Any]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(DropExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return tracer_provider, meter_provider


def noop_providers() -> tuple[Any, Any]:
    return trace.NoOpTracerProvider(), metrics.NoOpMeterProvider()


def run_once(n: int, observer: Any) -> float:
    """CPU seconds of one run of n tool turns (the run's thread plus the caller's)."""
    with BareLoop(ScriptedClient(script(n)), [Noop()]) as loop:
        loop.set_turn_mode("non_streaming")
        if observer is not None:
            loop.register_observer(observer)
        body_cpu: list[float] = []

        def clocking(body: Callable[[Any], None]) -> Callable[[Any], None]:
            def clocked(driver: Any) -> None:
                t = time.thread_time()
                try:
                    body(driver)
                finally:
                    body_cpu.append(time.thread_time() - t)

            return clocked

        with run_bodies(clocking):
            t0 = time.thread_time()
            run = loop.run("go", RunConfig(max_turns=n + 1))
            caller = time.thread_time() - t0
    assert run.turn_count == n + 1
    return caller + body_cpu[0]


def by_hand_once(n: int, providers: tuple[Any, Any]) -> float:
    """CPU seconds to write the same spans and metric points directly."""
    tracer = providers[0].get_tracer("floor")
    meter = providers[1].get_meter("floor")
    duration = meter.create_histogram("gen_ai.client.operation.duration", unit="s")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
    t0 = time.thread_time()
    root = tracer.start_span("invoke_agent", attributes={"gen_ai.operation.name": "invoke_agent"})
    parent = trace.set_span_in_context(root)
    m_attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "scripted"}
    for k in range(n):
        start = time.time_ns()
        chat = tracer.start_span(
            "chat scripted",
            context=parent,
            kind=trace.SpanKind.CLIENT,
            start_time=start,
            attributes={
                "gen_ai.operation.name": "chat", "loopctl.turn": k, "gen_ai.request.model": "scripted",
                "gen_ai.response.model": "scripted", "gen_ai.response.finish_reasons": ("tool_call",),
            },
        )
        chat.end(end_time=time.time_ns())
        duration.record(0.001, m_attrs)
        tokens.record(10, {**m_attrs, "gen_ai.token.type": "input"})
        tokens.record(5, {**m_attrs, "gen_ai.token.type": "output"})
        tool = tracer.start_span(
            "execute_tool noop",
            context=parent,
            start_time=time.time_ns(),
            attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "noop", "gen_ai.tool.call.id": "c",
                "gen_ai.tool.type": "function", "loopctl.turn": k, "loopctl.attempt": 0,
                "loopctl.tool.duration_ms": 0.01,
            },
        )
        tool.end(end_time=time.time_ns())
    root.end()
    return time.thread_time() - t0


def best(fn: Callable[[], float]) -> float:
    samples = []
    for _ in range(REPEATS):
        gc.collect()
        gc.disable()
        try:
            samples.append(fn())
        finally:
            gc.enable()
    return min(samples)


def main(argv: Optional[Sequence[str]] = None) -> None:
    global N, REPEATS
    if smoke_requested(__doc__.splitlines()[0], argv):
        N, REPEATS = SMOKE_N, SMOKE_REPEATS
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"one run of {N} tool turns, non-streaming; CPU time, best of {REPEATS}; load average {load:.1f}")
    run_once(20, None)  # warm-up: imports, first-run costs
    base = best(lambda: run_once(N, None))
    events = best(lambda: run_once(N, Listening()))
    delivery = max(0.0, events - base) / N * 1e6
    print(f"no observer: {base / N * 1e6:.1f} us/turn; the same events to a do-nothing observer: +{delivery:.1f}")
    for label, make in (("no-op providers", noop_providers), ("SDK, dropping exporter", sdk_providers)):
        providers = make()
        observer = OTelObserver(tracer_provider=providers[0], meter_provider=providers[1])
        run_once(20, observer)
        with_obs = best(lambda observer=observer: run_once(N, observer))  # type: ignore[misc]
        by_hand = best(lambda providers=providers: by_hand_once(N, providers))  # type: ignore[misc]
        over = max(0.0, with_obs - base) / N * 1e6
        hand_us = by_hand / N * 1e6
        print(
            f"{label}: overhead {over:.1f} us/turn (target <= {TARGET_US:.0f}); floor: event delivery "
            f"{delivery:.1f} + the same telemetry by hand {hand_us:.1f} = {delivery + hand_us:.1f} us/turn"
        )
        report(f"otel observer overhead per tool turn, {label}", over, delivery + hand_us, unit="us",
               target=f"<= {TARGET_US:g} us")
        shutdown = getattr(providers[0], "shutdown", None)
        if shutdown is not None:
            shutdown()
            providers[1].shutdown()

if __name__ == "__main__":
    main()
