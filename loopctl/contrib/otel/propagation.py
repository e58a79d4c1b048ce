"""W3C trace context across processes (the Celery registry's hop).

``current_carrier()`` injects the caller's current context with the global
propagator (``traceparent``/``tracestate``, by default) into a plain dict
that travels with the run; ``attached(carrier)`` makes the extracted
context current around the worker's work, so a run started inside it sees
that remote span as the caller's span and its ``invoke_agent`` span joins
the caller's trace (unless a span of that trace is already current there,
as Celery's own OpenTelemetry instrumentation makes its task span).

A durable run's trace travels with its checkpoint: ``run_carrier(run_id)``
is the context of the run's own ``invoke_agent`` span (an ``OTelObserver``
notes each open run span with ``note_run_span``), else the current one, so
a run resumed on another worker opens its span inside the original trace,
as a child of the span it continues. ``loopctl.contrib.celery`` imports
this module only when ``opentelemetry`` is importable.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Optional

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

#: Open run spans remembered at most (the oldest is forgotten first).
MAX_RUN_SPANS = 4096
_run_spans: OrderedDict[str, Any] = OrderedDict()  # run id -> its run span's SpanContext
_run_spans_lock = threading.Lock()


def note_run_span(run_id: str, span: Any) -> None:
    """Remember ``span`` as the open ``invoke_agent`` span of ``run_id`` (for its checkpoints)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return
    with _run_spans_lock:
        _run_spans[run_id] = ctx
        _run_spans.move_to_end(run_id)
        while len(_run_spans) > MAX_RUN_SPANS:
            _run_spans.popitem(last=False)


def forget_run_span(run_id: str) -> None:
    """The run's span ended: forget it."""
    with _run_spans_lock:
        _run_spans.pop(run_id, None)


def run_carrier(run_id: str) -> Optional[dict[str, str]]:
    """The trace context a checkpoint of ``run_id`` carries: its run span's, else the current one."""
    with _run_spans_lock:
        ctx = _run_spans.get(run_id)
    if ctx is None:
        return current_carrier()
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(ctx)))
    return carrier or None


def current_carrier() -> Optional[dict[str, str]]:
    """The current trace context as W3C headers, or None when there is none to carry."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


@contextmanager
def attached(carrier: Optional[Mapping[str, str]]) -> Iterator[None]:
    """Make the context in ``carrier`` current for the block (no-op for an empty carrier)."""
    if not carrier:
        yield
        return
    clean = {str(k): str(v) for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    extracted = propagate.extract(clean)
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == trace.get_current_span(extracted).get_span_context().trace_id:
        # Already inside that trace (an instrumented worker made its task span
        # current): keep the more precise parent.
        yield
        return
    token = otel_context.attach(extracted)
    try:
        yield
    finally:
        otel_context.detach(token)


__all__ = ["MAX_RUN_SPANS", "attached", "current_carrier", "forget_run_span", "note_run_span", "run_carrier"]
