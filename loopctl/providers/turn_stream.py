"""TurnStream: one model call's attempts, retries and rescue.

Owns the run of a single model call under a handler's settings
(``TurnSettings``, which ``StreamHandler`` satisfies): opening each attempt,
its first-event, next-event and total deadlines, the steps between attempts
(decided by the retry policy's tenacity ``Retrying``,
``loopctl.providers.retry``, built only once an attempt has failed), the
``RetryWait``, ``StreamAttemptReset`` and ``StreamRescue`` events it yields,
the one non-streaming rescue, and ``close()`` from any thread. The
settings, their defaults and validation belong to
``loopctl.providers.stream_handler``, which builds a ``TurnStream``; this
module does not import it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Callable, Optional, Protocol

from loopctl.cancel import CancelSignal
from loopctl.errors import Cancelled, LoopError, ModelError
from loopctl.messages import ModelRequest, ModelResponse
from loopctl.providers.base import (
    HandlerEvent,
    MessageStop,
    ModelClient,
    ModelStream,
    StreamAttemptReset,
    StreamRescue,
)
from loopctl.providers.boundary import (
    TIMEOUT,
    TRANSPORT,
    error_kind,
    error_summary,
    foreign_error,
    model_error,
    tag,
)
from loopctl.providers.http import CallScope
from loopctl.providers.retry import CallRetries, CancelAwareSleep, RetrySettings


class TurnSettings(RetrySettings, Protocol):
    """The handler settings one call reads (``StreamHandler`` has them all)."""

    @property
    def first_event_timeout(self) -> Optional[float]: ...
    @property
    def event_timeout(self) -> Optional[float]: ...
    @property
    def total_timeout(self) -> Optional[float]: ...
    @property
    def rescue(self) -> bool: ...
    @property
    def rescue_timeout(self) -> float: ...
    @property
    def single_attempt(self) -> bool: ...


#: Guards what ``close()`` reads (the stream, scope and sleep being swapped in)
#: for every call: held only to swap those fields, never while calling out, so
#: one lock serves all and a call in flight adds no lock for the cyclic GC.
_swap_lock = threading.Lock()


class TurnStream:
    """One model call's events under a handler's settings (iterate once; close from anywhere)."""

    __slots__ = (
        "_h", "_client", "_request", "_cancel", "_streaming", "_lock", "_closed", "_sleep",
        "_stream", "_scope", "_total_deadline", "attempts",
    )

    def __init__(
        self, handler: TurnSettings, client: ModelClient, request: ModelRequest, cancel: CancelSignal, streaming: bool = True
    ) -> None:
        self._h = handler
        self._client = client
        self._request = request
        self._cancel = cancel
        self._streaming = streaming
        self._lock = _swap_lock
        self._closed = False
        # Made once a first attempt failed (most calls never retry); set under the
        # lock, as close() reads it, so a backoff wait never misses a close.
        self._sleep: Optional[CancelAwareSleep] = None
        self._stream: Optional[ModelStream] = None
        self._scope: Optional[CallScope] = None
        self._total_deadline: Optional[float] = None
        self.attempts = 0

    def close(self) -> None:
        """Stop the call (idempotent, any thread): the current read returns."""
        with self._lock:
            self._closed = True
            stream = self._stream
            scope = self._scope
            sleep = self._sleep
        if sleep is not None:
            sleep.wake()
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

    def _open(self) -> ModelStream:
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
        """The attempts after a failed one, stepped through the retry policy's ``Retrying``."""
        sleep = CancelAwareSleep(self._cancel)
        with self._lock:
            self._sleep = sleep
        retries = CallRetries(self._h, self._total_deadline, sleep)
        while True:
            if self._stopped():
                raise self._cancelled() from failure
            announced = retries.after_failure(failure)  # raises a failure it may not retry
            if announced is None:
                break
            yield announced  # before the wait starts: observers see every wait coming
            retries.sleep()
            yield StreamAttemptReset(self.attempts)
            try:
                yield from self._attempt()
                return
            except Cancelled:
                raise
            except LoopError as exc:
                failure = exc
        yield from self._give_up(failure, retries.policy.rate_limited)

    def _give_up(self, failure: LoopError, rate_limited: int) -> Iterator[HandlerEvent]:
        """The retries are spent (a rate limit has raised already): rescue, or raise ``failure``."""
        if self._stopped():
            raise self._cancelled() from failure
        kind = error_kind(failure)
        total = self._total_deadline
        out_of_time = total is not None and time.monotonic() >= total
        if (self._streaming and self._h.rescue and kind in (TIMEOUT, TRANSPORT) and not rate_limited
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


__all__ = ["TurnSettings", "TurnStream"]
