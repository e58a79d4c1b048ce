"""The retry policy of one model call, on tenacity (stop/wait/retry, a cancel-aware sleep, Retry-After as a wait).

Owns when a failed attempt is tried again and how long to wait first, as
the parts of a tenacity ``Retrying``: ``retry`` (a ``ModelError`` marked
retryable, never 400/401/403/404), ``after`` (counts the failure against
its budget: rate limits, 429/503/529, have one and every other retryable
failure the other), ``stop`` (a budget used up, the total deadline passed
or too near for the next wait, a ``Retry-After`` beyond
``max_retry_wait``), ``wait`` (for a rate limit the server's
``Retry-After``, else ``rate_limit_delay``; for the rest a jittered
exponential backoff that never runs past the total deadline),
``before_sleep`` (the ``RetryWait`` that announces the wait),
``retry_error_callback`` (a spent rate-limit budget raises
``RateLimitEscalation``, a refused ``Retry-After`` ``RateLimited``; any other
failure is handed back, for the caller's rescue) and ``sleep`` (a wait on
the run's cancel signal that a cancel or a close ends at once; never
``time.sleep``).

The caller steps the ``Retrying`` itself (``iter``, then ``sleep``), as
tenacity's own loop does, because a wait must be announced before it
starts and tenacity's loop sleeps inside its iterator, where a stream's
generator cannot yield. A call whose first attempt succeeds builds none of
this.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Optional, Protocol

from tenacity import DoSleep, RetryCallState, Retrying

from loopctl.errors import Cancelled, LoopError, ModelError, RateLimited, RateLimitEscalation
from loopctl.providers.base import RetryWait
from loopctl.providers.boundary import RATE_LIMIT, error_kind, error_summary

_NO_RETRY_STATUSES = frozenset((400, 401, 403, 404))


class RetrySettings(Protocol):
    """The budgets and delays the policy reads (``StreamHandler`` has them all)."""

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


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed attempt may be tried again: a retryable ``ModelError``, never 400/401/403/404."""
    if not isinstance(exc, ModelError):
        return False
    if exc.status in _NO_RETRY_STATUSES:
        return False
    return exc.retryable


def _failure(state: RetryCallState) -> BaseException:
    outcome = state.outcome
    exc = None if outcome is None else outcome.exception()
    if exc is None:  # past ``retry``, tenacity consults the policy only about failures
        raise LoopError(f"retry policy consulted about attempt {state.attempt_number}, which did not fail")
    return exc


class CancelAwareSleep:
    """tenacity's ``sleep=`` for one call: a wait that a cancel or a close ends at once.

    Waits on the run's cancel signal (``cancel.wait``) or, for a call made
    without one, on an Event that ``wake()`` (the call's ``close()``) sets;
    never ``time.sleep``.

    Raises:
        Cancelled: the wait was ended by a cancel or a close.
    """

    __slots__ = ("_cancel", "_woken")

    def __init__(self, cancel: Any) -> None:
        self._cancel = cancel
        self._woken = threading.Event()

    def wake(self) -> None:
        """End the current wait, and every later one (any thread)."""
        self._woken.set()

    def __call__(self, seconds: float) -> None:
        cancel = self._cancel
        if cancel is not None:
            fired = bool(cancel.wait(float(seconds)))
        else:
            fired = self._woken.wait(float(seconds))
        if fired or self._woken.is_set():
            raise Cancelled(getattr(cancel, "reason", None))


class CallRetrying(Retrying):
    """A ``Retrying`` for one model call.

    Its statistics belong to the call rather than to a thread: a call's
    events may be read from more than one thread, one after the other.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._call_statistics: dict[str, Any] = {}
        super().__init__(**kwargs)

    @property
    def statistics(self) -> dict[str, Any]:
        """tenacity's counters for this call (start time, attempts, time slept)."""
        return self._call_statistics


class RetryPolicy:
    """One call's retry budgets and waits, as the parts of a tenacity ``Retrying``.

    Mutable: ``count`` (tenacity's ``after``) tallies each failure and
    ``announce`` (its ``before_sleep``) sets ``announced``; one policy per
    call.

    Args:
        settings: the budgets and delays (a ``StreamHandler``).
        deadline: the call's total deadline on ``clock``'s scale, or None.
        clock: monotonic seconds (injectable for tests).
        rand: a random float in [0, 1) for the jitter (injectable for tests).
    """

    __slots__ = (
        "_s", "_deadline", "_clock", "_rand", "rate_limited", "transport_failures", "retry_after", "announced",
    )

    def __init__(
        self,
        settings: RetrySettings,
        deadline: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._s = settings
        self._deadline = deadline
        self._clock = clock
        self._rand = rand
        self.rate_limited = 0
        self.transport_failures = 0
        self.retry_after: Optional[float] = None
        self.announced: Optional[RetryWait] = None

    def retrying(self, sleep: Callable[[float], None]) -> CallRetrying:
        """A ``Retrying`` made of this policy's parts, sleeping with ``sleep``."""
        return CallRetrying(
            sleep=sleep,
            retry=self.retry,
            after=self.count,
            stop=self.stop,
            wait=self.wait,
            before_sleep=self.announce,
            retry_error_callback=self.give_up,
        )

    def retry(self, state: RetryCallState) -> bool:
        """tenacity's ``retry``: whether the attempt failed in a way that may be tried again."""
        outcome = state.outcome
        return outcome is not None and outcome.failed and is_retryable(_failure(state))

    def count(self, state: RetryCallState) -> None:
        """tenacity's ``after``: count the failure against its kind's budget."""
        failure = _failure(state)
        if error_kind(failure) == RATE_LIMIT:
            self.rate_limited += 1
            self.retry_after = getattr(failure, "retry_after", None)
        else:
            self.transport_failures += 1

    def stop(self, state: RetryCallState) -> bool:
        """tenacity's ``stop``: the budget is used up, or the deadline leaves no room."""
        s, deadline = self._s, self._deadline
        now = self._clock()
        if error_kind(_failure(state)) == RATE_LIMIT:
            after = self.retry_after
            if (after is not None and after > s.max_retry_wait) or self.rate_limited > s.rate_limit_retries:
                return True
            # The next attempt could not start before the total deadline.
            return deadline is not None and now + self._rate_limit_wait() >= deadline
        return self.transport_failures > s.max_retries or (deadline is not None and now >= deadline)

    def wait(self, state: RetryCallState) -> float:
        """tenacity's ``wait``: ``Retry-After`` (or the default) for a rate limit, else the backoff."""
        if error_kind(_failure(state)) == RATE_LIMIT:
            return self._rate_limit_wait()
        s = self._s
        delay = float(min(s.max_delay, s.base_delay * (2 ** (self.transport_failures - 1))))
        if s.jitter:
            delay *= 1.0 + s.jitter * (2.0 * self._rand() - 1.0)
        if self._deadline is not None:
            delay = min(delay, max(0.0, self._deadline - self._clock()))
        return max(0.0, delay)

    def _rate_limit_wait(self) -> float:
        s, after = self._s, self.retry_after
        return float(min(s.rate_limit_delay if after is None else after, s.max_retry_wait))

    def announce(self, state: RetryCallState) -> None:
        """tenacity's ``before_sleep``: the ``RetryWait`` the caller yields before the wait."""
        failure, action = _failure(state), state.next_action
        wait = 0.0 if action is None else float(action.sleep)
        if error_kind(failure) == RATE_LIMIT:
            n, of = self.rate_limited, self._s.rate_limit_retries
        else:
            n, of = self.transport_failures, self._s.max_retries
        self.announced = RetryWait(error_summary(failure), wait, n + 1, of + 1)

    def give_up(self, state: RetryCallState) -> BaseException:
        """tenacity's ``retry_error_callback``: a rate limit raises; any other failure is returned.

        Raises:
            RateLimited: the server asked to wait longer than ``max_retry_wait``.
            RateLimitEscalation: the rate-limit budget is spent.
        """
        failure = _failure(state)
        if error_kind(failure) != RATE_LIMIT:
            return failure
        after, longest = self.retry_after, self._s.max_retry_wait
        if after is not None and after > longest:
            raise RateLimited(
                f"{failure}; the server asks to wait {after:g}s, longer than max_retry_wait ({longest:g}s)",
                after,
                longest,
                getattr(failure, "status", 429),
            ) from failure
        raise RateLimitEscalation(self.rate_limited, after) from failure


class CallRetries:
    """One call's retries: its ``RetryPolicy`` stepped through a tenacity ``Retrying``.

    Built only once an attempt has failed. ``after_failure`` asks tenacity
    what comes next and ``sleep`` makes the wait it decided, so the caller
    can yield the announcement in between.

    Args:
        settings: the budgets and delays (a ``StreamHandler``).
        deadline: the call's total deadline (``time.monotonic()``), or None.
        sleep: the cancel-aware wait (tenacity's ``sleep=``).
    """

    __slots__ = ("policy", "retrying", "_state", "_wait")

    def __init__(self, settings: RetrySettings, deadline: Optional[float], sleep: Callable[[float], None]) -> None:
        self.policy = RetryPolicy(settings, deadline)
        self.retrying = self.policy.retrying(sleep)
        self.retrying.begin()
        self._state = RetryCallState(self.retrying, None, (), {})
        self._wait: Optional[DoSleep] = None

    def after_failure(self, failure: BaseException) -> Optional[RetryWait]:
        """Record ``failure``: the ``RetryWait`` to announce before the wait, or None to give up.

        Raises:
            Exception: ``failure`` itself when it may not be retried, or what
                the policy's ``give_up`` raises for a rate limit.
        """
        state = self._state
        state.set_exception((type(failure), failure, failure.__traceback__))
        self.policy.announced = None
        action = self.retrying.iter(state)
        announced = self.policy.announced
        if not isinstance(action, DoSleep) or announced is None:
            return None
        state.prepare_for_next_attempt()
        self._wait = action
        return announced

    def sleep(self) -> None:
        """Make the wait tenacity decided, through the cancel-aware ``sleep``.

        Raises:
            Cancelled: a cancel or a close ended the wait.
        """
        wait, self._wait = self._wait, None
        if wait is not None:
            self.retrying.sleep(wait)


__all__ = ["CallRetries", "CallRetrying", "CancelAwareSleep", "RetryPolicy", "RetrySettings", "is_retryable"]
