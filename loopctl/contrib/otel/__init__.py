"""OpenTelemetry for loopctl (extra ``[otel]``; needs only ``opentelemetry-api``).

``OTelObserver`` turns a loop's events into GenAI spans (``invoke_agent``,
``chat {model}``, ``execute_tool {name}``) and metrics
(``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``,
runs started/ended, cancel latency). ``loopctl.contrib.otel.propagation``
carries the caller's trace context to Celery workers. See docs/tracing.md.
"""

from __future__ import annotations

from .observer import OTelObserver

__all__ = ["OTelObserver"]
