"""Integrations that need optional extras; nothing here is imported by ``loopctl``.

``loopctl.contrib.celery``: the ``RunRegistry`` API with runs on Celery
workers and cancel, steering, events and history carried through Redis
(extra ``[celery]``).

``loopctl.contrib.otel``: OpenTelemetry GenAI spans and metrics from a
loop's events (extra ``[otel]``).

``loopctl.contrib.mcp``: MCP servers (stdio or streamable HTTP) as loopctl
tools, from synchronous code (extra ``[mcp]``, Python >= 3.10).
"""
