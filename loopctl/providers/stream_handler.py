"""StreamHandler: how one model call survives a real network.

Owns the policy around a client's calls, never the wire: deadlines (first
event, each next event, the whole call), retries of timeouts, connection
failures, truncated streams, 5xx and 408 with jittered exponential backoff,
rate limits (429/503/529, honouring ``Retry-After`` up to ``max_retry_wait``,
then ``RateLimitEscalation``; a longer ``Retry-After`` fails at once with
``RateLimited``), and one non-streaming rescue after a timeout or a transport
failure of a streamed call (never after an HTTP error status or a rate
limit). 400/401/403/404 and every other non-retryable error get exactly one
attempt. Non-streaming calls (``complete_turn``) get the same retries.

Each call runs as a ``TurnStream`` (``loopctl.providers.turn_stream``); once
an attempt has failed, what comes next is decided by the retry policy on
tenacity (``loopctl.providers.retry``: its stop, wait, retry and
before_sleep, with a cancel-aware ``sleep``).
The call's events come out as the client yields them, plus ``RetryWait``
before each wait, ``StreamAttemptReset(n)`` before attempt ``n`` (n >= 1; the
first attempt is 0 and gets none) and ``StreamRescue(response)`` (the
rescue's reply, or a non-streaming call's). ``close()`` works from any
thread. Deadlines reach a stream that has ``set_deadline(monotonic_time)``
(the HTTP clients' streams do) so a silent socket is cut on time; for other
streams only the total deadline is checked, between events.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from loopctl.cancel import CancelSignal
from loopctl.checks import flag, integer, number
from loopctl.errors import Cancelled
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.providers.base import ModelClient
from loopctl.providers.http import CallScope
from loopctl.providers.turn_stream import TurnStream
from loopctl.timeouts import clamp, seconds


def _seconds(optional: bool, zero: bool = True) -> Any:
    def check(inst: object, attribute: attrs.Attribute[object], value: object) -> None:
        seconds(value, f"StreamHandler.{attribute.name}", optional=optional, zero=zero)

    return check


def _flag(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    flag(value, f"StreamHandler.{attribute.name}")


def _count(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    integer(value, f"StreamHandler.{attribute.name}", 0)


def _fraction(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    number(value, f"StreamHandler.{attribute.name}", 0, 1)


@attrs.frozen
class StreamHandler:
    """Timeouts, retries, rate limits and the rescue for model calls.

    Every delay and timeout is in seconds and configurable (``None`` turns a
    timeout off). The client's own ``timeout=(connect, read)`` still bounds
    every connect and every read, the rescue's included.

    Args:
        first_event_timeout: from the start of an attempt to its first event.
        event_timeout: between two events.
        total_timeout: for the whole model call (all attempts and waits,
            streamed or not); once passed, no further attempt starts.
        max_retries: retries of timeouts, connection failures, truncated
            streams, 5xx and 408.
        base_delay, max_delay, jitter: the backoff, ``base * 2**(n-1)``
            capped at ``max_delay``, times ``1 ± jitter`` at random.
        rate_limit_retries: retries of 429/503/529 before
            ``RateLimitEscalation``.
        rate_limit_delay: the wait when the server sends no ``Retry-After``.
        max_retry_wait: the longest wait accepted; a ``Retry-After`` beyond
            it fails at once with ``RateLimited``.
        rescue: make one non-streaming call after timeouts or transport
            failures used up the retries of a streamed call.
        rescue_timeout: the rescue call's own deadline (its reads still
            wait at most the client's read timeout each, and it never runs
            past ``total_timeout``; no rescue starts once that has passed).
        single_attempt: one attempt, no deadlines, errors as raised (set by
            ``passthrough()``).
    """

    # A timeout of zero would fail every attempt: None turns one off.
    first_event_timeout: Optional[float] = attrs.field(
        default=120.0, converter=clamp, validator=_seconds(True, zero=False)
    )
    event_timeout: Optional[float] = attrs.field(default=180.0, converter=clamp, validator=_seconds(True, zero=False))
    total_timeout: Optional[float] = attrs.field(default=300.0, converter=clamp, validator=_seconds(True, zero=False))
    max_retries: int = attrs.field(default=3, validator=_count)
    base_delay: float = attrs.field(default=0.1, converter=clamp, validator=_seconds(False))
    max_delay: float = attrs.field(default=10.0, converter=clamp, validator=_seconds(False))
    jitter: float = attrs.field(default=0.1, validator=_fraction)
    rate_limit_retries: int = attrs.field(default=5, validator=_count)
    rate_limit_delay: float = attrs.field(default=5.0, converter=clamp, validator=_seconds(False))
    max_retry_wait: float = attrs.field(default=60.0, converter=clamp, validator=_seconds(False))
    rescue: bool = attrs.field(default=True, validator=_flag)
    rescue_timeout: float = attrs.field(default=120.0, converter=clamp, validator=_seconds(False, zero=False))
    single_attempt: bool = attrs.field(default=False, validator=_flag)

    @classmethod
    def passthrough(cls) -> StreamHandler:
        """A handler that makes exactly one attempt with no timeouts."""
        return cls(
            first_event_timeout=None,
            event_timeout=None,
            total_timeout=None,
            max_retries=0,
            rate_limit_retries=0,
            rescue=False,
            single_attempt=True,
        )

    def stream_turn(self, client: ModelClient, request: ModelRequest, cancel: CancelSignal) -> TurnStream:
        """The turn's events; ``close()`` (any thread) stops a blocked read."""
        return TurnStream(self, client, request, cancel)

    def complete_turn(self, client: ModelClient, request: ModelRequest, cancel: CancelSignal) -> TurnStream:
        """A non-streaming call under the same retries and total deadline.

        Yields ``RetryWait``/``StreamAttemptReset`` around retries and, last,
        one ``StreamRescue`` carrying the reply.
        """
        return TurnStream(self, client, request, cancel, streaming=False)


def cancellable_complete(client: ModelClient, request: ModelRequest, cancel: CancelSignal) -> ModelResponse:
    """``client.complete(request)`` that a cancel interrupts (HTTP clients).

    The call runs in a ``CallScope`` closed by a cancel listener, so a call
    blocked on its socket returns at once with ``Cancelled``.
    """
    scope = CallScope()
    cancel.add_listener(scope.close)
    try:
        with scope.bound():
            response: ModelResponse = client.complete(request)
    except Cancelled:
        raise
    except Exception as exc:
        if cancel.is_cancelled():
            raise Cancelled(getattr(cancel, "reason", None)) from exc
        raise
    finally:
        cancel.remove_listener(scope.close)
    return response


__all__ = ["StreamHandler", "cancellable_complete"]
