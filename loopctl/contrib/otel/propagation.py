"""W3C trace context across processes (the Celery registry's hop).

``current_carrier()`` injects the caller's current context with the global
propagator (``traceparent``/``tracestate``, by default) into a plain dict
that travels with the run; ``attached(carrier)`` makes the extracted
context current around the worker's work, so a run started inside it sees
that remote span as the caller's span and its ``invoke_agent`` span joins
the caller's trace (unless a span of that trace is already current there,
as Celery's own OpenTelemetry instrumentation makes its task span). ``loopctl.contrib.celery`` imports this module only
when ``opentelemetry`` is importable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Optional

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace


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


__all__ = ["attached", "current_carrier"]
