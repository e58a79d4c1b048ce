"""StreamHandler: how one streamed model turn survives a real network.

Owns the policy around a client's stream, never the wire: deadlines (first
event, each next event, the whole turn), retries of timeouts, connection
failures, truncated streams, 5xx and 408 with jittered exponential backoff,
the rate-limit ladder (429/503/529, honouring ``Retry-After``, then
``RateLimitEscalation``), and one non-streaming rescue after a timeout or a
transport failure (never after an HTTP error status or a rate limit).
400/401/403/404 and every other non-retryable error get exactly one attempt.
``tenacity`` decides (stop, wait, retry); every sleep is ``cancel.wait``.
The turn's events come out as the client yields them, plus
``StreamAttemptReset(n)`` before attempt ``n`` (n >= 1; the first attempt is
0 and gets none) and ``StreamRescue(response)``. ``close()`` works from any
thread. Deadlines reach a stream that has ``set_deadline(monotonic_time)``
(the HTTP clients' streams do) so a silent socket is cut on time; for other
streams only the total deadline is checked, between events.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import attrs
import tenacity

from loopctl.errors import Cancelled, ConfigError, LoopError, ModelError, RateLimitEscalation
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.providers.base import HandlerEvent, MessageStop, StreamAttemptReset, StreamRescue
from loopctl.providers.http import (
    RATE_LIMIT,
    TIMEOUT,
    TRANSPORT,
    CallScope,
    error_kind,
    model_error,
    transport_error,
)

_NO_RETRY_STATUSES = frozenset((400, 401, 403, 404))


def _seconds(optional: bool) -> Any:
    def check(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            kind = "seconds >= 0 or None" if optional else "seconds >= 0"
            raise ConfigError(f"StreamHandler.{attribute.name} must be {kind}, got {value!r}")

    return check


def _count(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"StreamHandler.{attribute.name} must be an int >= 0, got {value!r}")


def _fraction(inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"StreamHandler.{attribute.name} must be between 0 and 1, got {value!r}")


@attrs.frozen
class StreamHandler:
    """Timeouts, retries, rate limits and the rescue for streamed turns.

    Every delay and timeout is in seconds and configurable (``None`` turns a
    timeout off). Defaults follow the original.

    Args:
        first_event_timeout: from the start of an attempt to its first event.
        event_timeout: between two events.
        total_timeout: for the whole turn's streaming (all attempts); once
            passed, no further streaming attempt starts.
        max_retries: retries of timeouts, connection failures, truncated
            streams, 5xx and 408.
        base_delay, max_delay, jitter: the backoff, ``base * 2**(n-1)``
            capped at ``max_delay``, times ``1 ± jitter`` at random.
        rate_limit_retries: retries of 429/503/529 before
            ``RateLimitEscalation``.
        rate_limit_delay: the wait when the server sends no ``Retry-After``.
        rate_limit_max_delay: the longest wait, whatever ``Retry-After`` says.
        rescue: make one non-streaming call after timeouts or transport
            failures used up the retries.
        rescue_timeout: the rescue call's own deadline.
        single_attempt: one attempt, no deadlines, errors as raised (set by
            ``passthrough()``).
    """

    first_event_timeout: Optional[float] = attrs.field(default=120.0, validator=_seconds(True))
    event_timeout: Optional[float] = attrs.field(default=180.0, validator=_seconds(True))
    total_timeout: Optional[float] = attrs.field(default=300.0, validator=_seconds(True))
    max_retries: int = attrs.field(default=3, validator=_count)
    base_delay: float = attrs.field(default=0.1, validator=_seconds(False))
    max_delay: float = attrs.field(default=10.0, validator=_seconds(False))
    jitter: float = attrs.field(default=0.1, validator=_fraction)
    rate_limit_retries: int = attrs.field(default=5, validator=_count)
    rate_limit_delay: float = attrs.field(default=5.0, validator=_seconds(False))
    rate_limit_max_delay: float = attrs.field(default=60.0, validator=_seconds(False))
    rescue: bool = True
    rescue_timeout: float = attrs.field(default=120.0, validator=_seconds(False))
    single_attempt: bool = False

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

    def stream_turn(self, client: Any, request: ModelRequest, cancel: Any) -> TurnStream:
        """The turn's events; ``close()`` (any thread) stops a blocked read."""
        return TurnStream(self, client, request, cancel)


class TurnStream:
    """One turn's events under a ``StreamHandler`` (iterate once; close from anywhere)."""

    def __init__(self, handler: StreamHandler, client: Any, request: ModelRequest, cancel: Any) -> None:
        self._h = handler
        self._client = client
        self._request = request
        self._cancel = cancel
        self._lock = threading.Lock()
        self._closed = False
        self._stream: Any = None
        self._scope: Optional[CallScope] = None
        self._transport_failures = 0
        self._rate_limited = 0
        self._retry_after: Optional[float] = None
        self._total_deadline: Optional[float] = None
        self.attempts = 0

    def close(self) -> None:
        """Stop the turn (idempotent, any thread): the current read returns."""
        with self._lock:
            self._closed = True
            stream = self._stream
            scope = self._scope
        if stream is not None:
            stream.close()
        if scope is not None:
            scope.close()

    def _stopped(self) -> bool:
        return self._closed or bool(self._cancel is not None and self._cancel.is_cancelled())

    def _cancelled(self) -> Cancelled:
        return Cancelled(getattr(self._cancel, "reason", None))

    def __iter__(self) -> Iterator[HandlerEvent]:
        if self._h.single_attempt:
            return self._single()
        return self._run()

    # -- one attempt -------------------------------------------------------------

    def _open(self) -> Any:
        try:
            stream = self._client.stream(self._request)
        except LoopError:
            raise
        except Exception as exc:
            raise _foreign(exc) from exc
        with self._lock:
            closed = self._closed
            if not closed:
                self._stream = stream
        if closed:
            stream.close()
            raise self._cancelled()
        return stream

    def _single(self) -> Iterator[HandlerEvent]:
        if self._stopped():
            return
        stream = self._open()
        try:
            for ev in stream:
                yield ev
                if self._closed:
                    return
        finally:
            stream.close()

    def _attempt(self) -> Iterator[HandlerEvent]:
        """One streaming attempt; raises a ``LoopError`` unless it completes."""
        h = self._h
        self.attempts += 1
        if self._stopped():
            raise self._cancelled()
        stream = self._open()
        set_deadline: Optional[Callable[[Optional[float]], None]] = getattr(stream, "set_deadline", None)
        total = self._total_deadline
        limit, what = h.first_event_timeout, "first event"
        finished = False
        try:
            it = iter(stream)
            while True:
                if set_deadline is not None:
                    deadline = None if limit is None else time.monotonic() + limit
                    if total is not None and (deadline is None or total <= deadline):
                        deadline, what = total, "end of the turn's total timeout"
                    set_deadline(deadline)
                try:
                    ev = next(it)
                except StopIteration:
                    break
                except LoopError as exc:
                    if self._stopped():
                        raise self._cancelled() from exc
                    if error_kind(exc) == TIMEOUT:
                        raise self._timeout(what, limit) from exc
                    raise
                except Exception as exc:
                    if self._stopped():
                        raise self._cancelled() from exc
                    raise _foreign(exc) from exc
                if type(ev) is MessageStop:
                    finished = True
                yield ev
                if total is not None and set_deadline is None and time.monotonic() > total:
                    raise self._timeout("end of the turn's total timeout", h.total_timeout)
                limit, what = h.event_timeout, "next event"
        finally:
            stream.close()
        if self._stopped():
            raise self._cancelled()
        if not finished:
            raise model_error(
                "stream truncated: it ended without its terminal event", retryable=True, kind=TRANSPORT
            )

    def _timeout(self, what: str, limit: Optional[float]) -> ModelError:
        if what.startswith("end"):
            msg = f"stream timed out: the total timeout of {self._h.total_timeout:g}s passed"
        else:
            msg = f"stream timed out: no {what} within {limit:g}s"
        return model_error(msg, retryable=True, kind=TIMEOUT)

    # -- the retry loop ------------------------------------------------------------

    def _run(self) -> Iterator[HandlerEvent]:
        h = self._h
        if h.total_timeout is not None:
            self._total_deadline = time.monotonic() + h.total_timeout
        # The first attempt runs without the retry engine: the common case is cheap.
        try:
            yield from self._attempt()
            return
        except Cancelled:
            raise
        except LoopError as exc:
            failure: LoopError = exc
        self._note(failure)
        if self._stopped():
            raise self._cancelled() from failure
        if not _retryable(failure):
            raise failure
        retrying = tenacity.Retrying(
            stop=self._stop,
            wait=self._wait,
            retry=tenacity.retry_if_exception(_retryable),
            sleep=self._sleep,
            reraise=True,
        )
        state = tenacity.RetryCallState(retrying, fn=None, args=(), kwargs={})
        retrying.begin()
        retrying.iter(retry_state=state)  # DoAttempt: the first attempt, already made
        state.set_exception((type(failure), failure, failure.__traceback__))
        while True:
            try:
                do = retrying.iter(retry_state=state)
            except Cancelled:
                raise
            except LoopError as exc:  # reraise=True: the last failure, retries done
                failure = exc
                break
            if isinstance(do, tenacity.DoAttempt):
                yield StreamAttemptReset(self.attempts)
                try:
                    yield from self._attempt()
                    return
                except Cancelled:
                    raise
                except LoopError as exc:
                    self._note(exc)
                    state.set_exception((type(exc), exc, exc.__traceback__))
            elif isinstance(do, tenacity.DoSleep):
                state.prepare_for_next_attempt()
                retrying.sleep(do)
            else:  # pragma: no cover - a success returns above
                return
        yield from self._give_up(failure)

    def _note(self, exc: BaseException) -> None:
        if error_kind(exc) == RATE_LIMIT:
            self._rate_limited += 1
            self._retry_after = getattr(exc, "retry_after", None)
        else:
            self._transport_failures += 1

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        if self._stopped():
            return True
        exc = state.outcome.exception() if state.outcome is not None else None
        total = self._total_deadline
        past_total = total is not None and time.monotonic() >= total
        if exc is not None and error_kind(exc) == RATE_LIMIT:
            return self._rate_limited > self._h.rate_limit_retries or past_total
        return self._transport_failures > self._h.max_retries or past_total

    def _wait(self, state: tenacity.RetryCallState) -> float:
        h = self._h
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None and error_kind(exc) == RATE_LIMIT:
            after = getattr(exc, "retry_after", None)
            return float(min(h.rate_limit_delay if after is None else after, h.rate_limit_max_delay))
        n = max(self._transport_failures, 1)
        delay = float(min(h.max_delay, h.base_delay * (2 ** (n - 1))))
        if h.jitter:
            delay *= 1.0 + h.jitter * (2.0 * random.random() - 1.0)
        total = self._total_deadline
        if total is not None:
            delay = min(delay, max(0.0, total - time.monotonic()))
        return max(0.0, delay)

    def _sleep(self, seconds: float) -> None:
        if self._cancel is not None:
            fired = self._cancel.wait(seconds)
        else:
            fired = False
        if fired or self._closed:
            raise self._cancelled()

    def _give_up(self, failure: LoopError) -> Iterator[HandlerEvent]:
        if self._stopped():
            raise self._cancelled() from failure
        kind = error_kind(failure)
        if kind == RATE_LIMIT:
            raise RateLimitEscalation(self._rate_limited, self._retry_after) from failure
        if self._h.rescue and kind in (TIMEOUT, TRANSPORT) and not self._rate_limited:
            # A provider that rate-limited this turn would rate-limit the rescue too.
            yield StreamAttemptReset(self.attempts)
            yield StreamRescue(self._rescue(failure))
            return
        raise failure

    def _rescue(self, cause: LoopError) -> ModelResponse:
        scope = CallScope(deadline=time.monotonic() + self._h.rescue_timeout)
        with self._lock:
            if self._closed:
                raise self._cancelled()
            self._scope = scope
        try:
            with scope.bound():
                response: ModelResponse = self._client.complete(self._request)
        except Cancelled:
            raise
        except Exception as exc:
            if self._stopped():
                raise self._cancelled() from exc
            err = exc if isinstance(exc, LoopError) else _foreign(exc)
            raise ModelError(
                f"stream ({cause}) and the non-streaming rescue failed: {err}",
                getattr(err, "status", None),
                False,
            ) from exc
        if self._stopped():
            raise self._cancelled()
        return response


def _retryable(exc: BaseException) -> bool:
    if not isinstance(exc, ModelError):
        return False
    if exc.status in _NO_RETRY_STATUSES:
        return False
    return exc.retryable


def _foreign(exc: BaseException) -> ModelError:
    """A ``ModelError`` for an exception a client let escape untranslated."""
    if isinstance(exc, (OSError, ConnectionError, TimeoutError)) or type(exc).__module__.startswith(
        ("requests", "urllib3")
    ):
        return transport_error("stream", exc)
    return ModelError(f"stream failed: {type(exc).__name__}: {exc}")


def cancellable_complete(client: Any, request: ModelRequest, cancel: Any) -> ModelResponse:
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


__all__ = ["StreamHandler", "TurnStream", "cancellable_complete"]
