"""TurnStream: one model call's attempts, retries and rescue.

Owns the run of a single model call under a handler's settings
(``TurnSettings``, which ``StreamHandler`` satisfies): opening each attempt,
its first-event, next-event and total deadlines, the backoff and rate-limit
waits between attempts (a cancel-aware wait), the ``RetryWait``,
``StreamAttemptReset`` and ``StreamRescue`` events it yields, the one
non-streaming rescue, and ``close()`` from any thread. The settings, their
defaults and validation belong to ``loopctl.providers.stream_handler``, which
builds a ``TurnStream``; this module does not import it.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional, Protocol

from loopctl.errors import (
    Cancelled,
    LoopError,
    ModelError,
    RateLimited,
    RateLimitEscalation,
)
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.providers.base import (
    HandlerEvent,
    MessageStop,
    RetryWait,
    StreamAttemptReset,
    StreamRescue,
)
from loopctl.providers.boundary import (
    RATE_LIMIT,
    TIMEOUT,
    TRANSPORT,
    error_kind,
    error_summary,
    foreign_error,
    model_error,
    tag,
)
from loopctl.providers.http import CallScope

_NO_RETRY_STATUSES = frozenset((400, 401, 403, 404))


class TurnSettings(Protocol):
    """The handler settings one call reads (``StreamHandler`` has them all)."""

    @property
    def first_event_timeout(self) -> Optional[float]: ...
    @property
    def event_timeout(self) -> Optional[float]: ...
    @property
    def total_timeout(self) -> Optional[float]: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def base_delay(self) -> float: ...
    @property
    def max_delay(self) -> float: ...
    @property
    def jitter(self) -> float: ...
    @property
    def rate_limit_retries(self) -> int: ...
    @property
    def rate_limit_delay(self) -> float: ...
    @property
    def max_retry_wait(self) -> float: ...
    @property
    def rescue(self) -> bool: ...
    @property
    def rescue_timeout(self) -> float: ...
    @property
    def single_attempt(self) -> bool: ...


class TurnStream:
    """One model call's events under a handler's settings (iterate once; close from anywhere)."""

    __slots__ = (
        "_h", "_client", "_request", "_cancel", "_streaming", "_lock", "_closed", "_woken",
        "_stream", "_scope", "_transport_failures", "_rate_limited", "_retry_after",
        "_total_deadline", "attempts",
    )

    def __init__(
        self, handler: TurnSettings, client: Any, request: ModelRequest, cancel: Any, streaming: bool = True
    ) -> None:
        self._h = handler
        self._client = client
        self._request = request
        self._cancel = cancel
        self._streaming = streaming
        self._lock = threading.Lock()
        self._closed = False
        # Made by the first backoff wait without a cancel signal (most calls never
        # wait); close() sets it under the lock, so a wait never misses a close.
        self._woken: Optional[threading.Event] = None
        self._stream: Any = None
        self._scope: Optional[CallScope] = None
        self._transport_failures = 0
        self._rate_limited = 0
        self._retry_after: Optional[float] = None
        self._total_deadline: Optional[float] = None
        self.attempts = 0

    def close(self) -> None:
        """Stop the call (idempotent, any thread): the current read returns."""
        with self._lock:
            self._closed = True
            stream = self._stream
            scope = self._scope
            woken = self._woken
        if woken is not None:
            woken.set()
        if stream is not None:
            stream.close()
        if scope is not None:
            scope.close()

    def _stopped(self) -> bool:
        if self._closed:
            return True
        cancel = self._cancel
        return cancel is not None and cancel.is_cancelled()

    def _cancelled(self) -> Cancelled:
        return Cancelled(getattr(self._cancel, "reason", None))

    def __iter__(self) -> Iterator[HandlerEvent]:
        if self._h.single_attempt:
            return self._single() if self._streaming else self._single_complete()
        return self._run()

    # -- one attempt -------------------------------------------------------------

    def _open(self) -> Any:
        try:
            stream = self._client.stream(self._request)
        except LoopError:
            raise
        except Exception as exc:
            raise foreign_error(exc) from exc
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

    def _single_complete(self) -> Iterator[HandlerEvent]:
        if self._stopped():
            return
        yield StreamRescue(self._complete(None))

    def _attempt(self) -> Iterator[HandlerEvent]:
        """One attempt; raises a ``LoopError`` unless it completes."""
        self.attempts += 1
        if self._stopped():
            raise self._cancelled()
        if not self._streaming:
            try:
                response = self._complete(self._total_deadline)
            except LoopError as exc:
                if error_kind(exc) == TIMEOUT and getattr(exc, "deadline_hit", False):
                    raise self._timeout("end", None) from exc
                raise
            yield StreamRescue(response)
            return
        h = self._h
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
                        deadline, what = total, "end"
                    set_deadline(deadline)
                try:
                    ev = next(it)
                except StopIteration:
                    break
                except LoopError as exc:
                    if self._stopped():
                        raise self._cancelled() from exc
                    if error_kind(exc) == TIMEOUT and getattr(exc, "deadline_hit", True):
                        # Our deadline fired (not the client's read timeout): name ours.
                        raise self._timeout(what, limit) from exc
                    raise
                except Exception as exc:
                    if self._stopped():
                        raise self._cancelled() from exc
                    raise foreign_error(exc) from exc
                if type(ev) is MessageStop:
                    finished = True
                yield ev
                if total is not None and set_deadline is None and time.monotonic() > total:
                    raise self._timeout("end", None)
                limit, what = h.event_timeout, "next event"
        finally:
            stream.close()
        if self._stopped():
            raise self._cancelled()
        if not finished:
            raise model_error(
                "stream truncated: it ended without its terminal event",
                retryable=True, kind=TRANSPORT, summary="stream truncated",
            )

    def _timeout(self, what: str, limit: Optional[float]) -> ModelError:
        if what == "end":
            short = f"the total timeout of {self._h.total_timeout:g}s passed"
        else:
            short = f"no {what} within {limit:g}s"
        prefix = "stream" if self._streaming else "model call"
        return model_error(f"{prefix} timed out: {short}", retryable=True, kind=TIMEOUT, summary=short)

    def _complete(self, deadline: Optional[float]) -> ModelResponse:
        """One non-streaming call, interruptible by ``close()``; ``deadline`` bounds it."""
        scope = CallScope(deadline=deadline)
        with self._lock:
            if self._closed:
                raise self._cancelled()
            self._scope = scope
        try:
            with scope.bound():
                response: ModelResponse = self._client.complete(self._request)
        except Cancelled:
            raise
        except LoopError as exc:
            if self._stopped():
                raise self._cancelled() from exc
            raise
        except Exception as exc:
            if self._stopped():
                raise self._cancelled() from exc
            raise foreign_error(exc) from exc
        if self._stopped():
            raise self._cancelled()
        return response

    # -- the retry loop ------------------------------------------------------------

    def first_reply(self) -> ModelResponse:
        """Non-streaming: the first attempt, made directly (no events, no generator).

        Most calls succeed at once; a failure is raised as it is, and
        ``recover(failure)`` then yields the retries' events and the reply,
        exactly as iterating the call would have after that attempt.

        Raises:
            Cancelled: the call was closed or cancelled.
            LoopError: the attempt failed (its timeout named).
        """
        h = self._h
        if h.single_attempt:
            if self._stopped():
                raise self._cancelled()
            return self._complete(None)
        if h.total_timeout is not None:
            self._total_deadline = time.monotonic() + h.total_timeout
        self.attempts += 1
        if self._stopped():
            raise self._cancelled()
        try:
            return self._complete(self._total_deadline)
        except LoopError as exc:
            if error_kind(exc) == TIMEOUT and getattr(exc, "deadline_hit", False):
                raise self._timeout("end", None) from exc
            raise

    def recover(self, failure: LoopError) -> Iterator[HandlerEvent]:
        """After ``first_reply`` raised ``failure``: the retries' events, then the reply."""
        if self._h.single_attempt or isinstance(failure, Cancelled):
            raise failure
        return self._retry_from(failure)

    def _run(self) -> Iterator[HandlerEvent]:
        h = self._h
        if h.total_timeout is not None:
            self._total_deadline = time.monotonic() + h.total_timeout
        try:
            yield from self._attempt()
            return
        except Cancelled:
            raise
        except LoopError as exc:
            failure: LoopError = exc
        yield from self._retry_from(failure)

    def _retry_from(self, failure: LoopError) -> Iterator[HandlerEvent]:
        while True:
            if self._stopped():
                raise self._cancelled() from failure
            if not _retryable(failure):
                raise failure
            wait = self._next_wait(failure)
            if wait is None:
                break
            yield wait
            self._sleep(wait.wait_s)
            yield StreamAttemptReset(self.attempts)
            try:
                yield from self._attempt()
                return
            except Cancelled:
                raise
            except LoopError as exc:
                failure = exc
        yield from self._give_up(failure)

    def _next_wait(self, failure: LoopError) -> Optional[RetryWait]:
        """The wait before the next attempt, or None when the retries are used up.

        Raises:
            RateLimited: the server asks for a longer wait than ``max_retry_wait``.
        """
        h = self._h
        total = self._total_deadline
        now = time.monotonic()
        if error_kind(failure) == RATE_LIMIT:
            self._rate_limited += 1
            after = getattr(failure, "retry_after", None)
            self._retry_after = after
            if after is not None and after > h.max_retry_wait:
                raise RateLimited(
                    f"{failure}; the server asks to wait {after:g}s, longer than "
                    f"max_retry_wait ({h.max_retry_wait:g}s)",
                    after,
                    h.max_retry_wait,
                    getattr(failure, "status", 429),
                ) from failure
            if self._rate_limited > h.rate_limit_retries:
                return None
            delay = float(min(h.rate_limit_delay if after is None else after, h.max_retry_wait))
            if total is not None and now + delay >= total:
                return None  # the next attempt could not start before the total deadline
            n, of = self._rate_limited, h.rate_limit_retries
        else:
            self._transport_failures += 1
            n, of = self._transport_failures, h.max_retries
            if n > of or (total is not None and now >= total):
                return None
            delay = float(min(h.max_delay, h.base_delay * (2 ** (n - 1))))
            if h.jitter:
                delay *= 1.0 + h.jitter * (2.0 * random.random() - 1.0)
            if total is not None:
                delay = min(delay, max(0.0, total - now))
            delay = max(0.0, delay)
        return RetryWait(error_summary(failure), delay, n + 1, of + 1)

    def _sleep(self, seconds: float) -> None:
        # The driver closes the call from its cancel listener, so either wait ends early on cancel.
        if self._cancel is not None:
            fired = self._cancel.wait(seconds)
        else:
            with self._lock:
                if self._woken is None:
                    self._woken = threading.Event()
                woken = self._woken
                fired = self._closed
            fired = fired or woken.wait(seconds)
        if fired or self._closed:
            raise self._cancelled()

    def _give_up(self, failure: LoopError) -> Iterator[HandlerEvent]:
        if self._stopped():
            raise self._cancelled() from failure
        kind = error_kind(failure)
        if kind == RATE_LIMIT:
            raise RateLimitEscalation(self._rate_limited, self._retry_after) from failure
        total = self._total_deadline
        out_of_time = total is not None and time.monotonic() >= total
        if (self._streaming and self._h.rescue and kind in (TIMEOUT, TRANSPORT) and not self._rate_limited
                and not out_of_time):
            # A provider that rate-limited this call would rate-limit the rescue too,
            # and the total timeout bounds the rescue as it bounds every attempt.
            yield StreamAttemptReset(self.attempts)
            yield StreamRescue(self._rescue(failure))
            return
        raise failure

    def _rescue(self, cause: LoopError) -> ModelResponse:
        deadline = time.monotonic() + self._h.rescue_timeout
        total = self._total_deadline
        cut_by_total = total is not None and total < deadline
        if total is not None and cut_by_total:
            deadline = total
        try:
            return self._complete(deadline)
        except Cancelled:
            raise
        except LoopError as err:
            first, second = error_summary(cause), error_summary(err)
            shown: str = str(err)
            if error_kind(err) == TIMEOUT and getattr(err, "deadline_hit", False):
                if cut_by_total:
                    second = f"the total timeout of {self._h.total_timeout:g}s passed"
                else:
                    second = f"the rescue timeout of {self._h.rescue_timeout:g}s passed"
                shown = f"timed out: {second}"
            if first == second:
                text = f"{cause} (the non-streaming rescue failed the same way)"
            else:
                text = f"{cause}; the non-streaming rescue failed too: {shown}"
            raise tag(
                ModelError(text, getattr(err, "status", None), False), error_kind(err) or TRANSPORT, None, second
            ) from err


def _retryable(exc: BaseException) -> bool:
    if not isinstance(exc, ModelError):
        return False
    if exc.status in _NO_RETRY_STATUSES:
        return False
    return exc.retryable



__all__ = ["TurnSettings", "TurnStream"]
