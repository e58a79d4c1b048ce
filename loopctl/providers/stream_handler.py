"""StreamHandler: how one streamed model turn survives a real network.

This first cut is the passthrough: one attempt, no timeouts, no retries.
The full handler (timeouts, tenacity retries, rate limits, rescue) builds
on the same ``stream_turn`` contract: it yields stream events, plus
``StreamAttemptReset`` before each retry and ``StreamRescue`` for a reply
obtained without streaming; every wait listens to ``cancel``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from loopctl.messages import ModelRequest
from loopctl.providers.base import HandlerEvent


class StreamHandler:
    """Runs one streamed turn against a client."""

    def __init__(self, *, passthrough: bool = False) -> None:
        self._passthrough = passthrough

    @classmethod
    def passthrough(cls) -> StreamHandler:
        """A handler that makes exactly one attempt with no timeouts."""
        return cls(passthrough=True)

    def stream_turn(self, client: Any, request: ModelRequest, cancel: Any) -> _TurnStream:
        """The turn's events; ``close()`` (any thread) stops a blocked read."""
        return _TurnStream(client, request)


class _TurnStream:
    def __init__(self, client: Any, request: ModelRequest) -> None:
        self._client = client
        self._request = request
        self._stream: Any = None
        self._closed = False

    def __iter__(self) -> Iterator[HandlerEvent]:
        if self._closed:
            return
        self._stream = self._client.stream(self._request)
        try:
            for ev in self._stream:
                yield ev
                if self._closed:
                    return
        finally:
            self._stream.close()

    def close(self) -> None:
        self._closed = True
        s = self._stream
        if s is not None:
            s.close()


__all__ = ["StreamHandler"]
