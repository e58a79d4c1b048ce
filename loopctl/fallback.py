"""The model breaker and fallback chain (pure: time comes from an injected clock).

Owns which model serves the next request. States: ``"primary"`` (failures
count up, a success resets them; ``trip_threshold`` consecutive failures
trip the breaker), ``"fallback"`` (requests go to the first usable chain
entry; each entry may fail ``max_fail_count`` times before routing advances
to the next one; after ``recovery_timeout`` seconds the next request probes
the primary) and ``"recovering"`` (requests go to the primary on probation:
``recovery_successes`` successes close the breaker, a rate-limited failure
re-trips at once, a transient one resets the success streak and counts
toward a new trip). With every chain entry down, ``before_request`` raises
``FallbackExhausted`` until the cooldown has passed; a manager with no chain
never does (it trips but keeps serving the primary). The driver routes by a
per-request model override, so no client is ever mutated, and never records
a cancelled turn. No IO, no threads of its own; a lock makes it safe to
share between loops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Callable, Optional

import attrs

from loopctl.checks import integer, shown
from loopctl.errors import ConfigError, FallbackExhausted
from loopctl.timeouts import required_seconds

PRIMARY = "primary"
FALLBACK = "fallback"
RECOVERING = "recovering"


@attrs.define
class _Entry:
    name: str
    available: bool = True
    failures: int = 0


def _check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{what} must be a non-empty model name, got {shown(name)}")
    return name


class FallbackManager:
    """Routes requests to the primary model or down a chain of fallbacks.

    Args:
        primary: the model served while the breaker is closed.
        fallbacks: models to try in order once it trips.
        trip_threshold: consecutive failures that trip it (0 trips on the first).
        recovery_timeout: seconds in fallback before probing the primary.
        recovery_successes: successes on probation that close it.
        max_fail_count: failures a fallback entry may have before routing
            advances past it (>= 1).
        clock: returns seconds (``time.monotonic`` by default; tests inject one).
    """

    def __init__(
        self,
        primary: str,
        fallbacks: Sequence[str] = (),
        trip_threshold: int = 3,
        recovery_timeout: float = 60.0,
        recovery_successes: int = 2,
        max_fail_count: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._primary = _check_name("FallbackManager.primary", primary)
        if isinstance(fallbacks, str) or not isinstance(fallbacks, Iterable):
            raise ConfigError(f"FallbackManager.fallbacks must be a sequence of model names, got {shown(fallbacks)}")
        names = [_check_name("a FallbackManager.fallbacks entry", f) for f in fallbacks]
        self._trip_threshold = integer(trip_threshold, "FallbackManager.trip_threshold", 0)
        self._recovery_timeout = required_seconds(recovery_timeout, "FallbackManager.recovery_timeout", zero=True)
        self._recovery_successes = integer(recovery_successes, "FallbackManager.recovery_successes", 1)
        self._max_fail = integer(max_fail_count, "FallbackManager.max_fail_count", 1)
        if not callable(clock):
            raise ConfigError(f"FallbackManager.clock must be callable, got {shown(clock)}")
        self._chain = [_Entry(n) for n in names]
        self._clock = clock
        self._lock = threading.Lock()
        self._state = PRIMARY
        self._failures = 0
        self._successes = 0
        self._tripped_at = 0.0

    # -- reading -----------------------------------------------------------------

    @property
    def state(self) -> str:
        """``"primary"``, ``"fallback"`` or ``"recovering"``."""
        return self._state

    @property
    def primary(self) -> str:
        """The primary model."""
        return self._primary

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """The chain, in order."""
        return tuple(e.name for e in self._chain)

    @property
    def active_fallback(self) -> Optional[str]:
        """The first usable chain entry (None when there is none)."""
        entry = self._active()
        return entry.name if entry is not None else None

    def _usable(self, e: _Entry) -> bool:
        return e.available and e.failures < self._max_fail

    def _active(self) -> Optional[_Entry]:
        for e in self._chain:
            if self._usable(e):
                return e
        return None

    # -- the driver's calls --------------------------------------------------------

    def before_request(self) -> str:
        """The model this request goes to (mutates: may move Fallback -> Recovering).

        Raises:
            FallbackExhausted: in fallback, with every chain entry down and
                the cooldown not yet over.
        """
        with self._lock:
            if self._state == FALLBACK:
                if self._clock() - self._tripped_at >= self._recovery_timeout:
                    self._state = RECOVERING
                    self._successes = 0
                    self._failures = 0
                    return self._primary
                if not self._chain:
                    return self._primary
                entry = self._active()
                if entry is None:
                    raise FallbackExhausted((self._primary, *self.fallbacks))
                return entry.name
            return self._primary

    def record_success(self) -> None:
        """The routed model served the turn (mutates)."""
        with self._lock:
            if self._state == PRIMARY:
                self._failures = 0
            elif self._state == RECOVERING:
                self._failures = 0
                self._successes += 1
                if self._successes >= self._recovery_successes:
                    self._close()
            else:
                entry = self._active()
                if entry is not None:
                    entry.failures = 0

    def record_failure(self, rate_limited: bool = False) -> Optional[tuple[str, str]]:
        """The routed model failed the turn (mutates; never call it for a cancel).

        Returns:
            ``(from_model, to_model)`` when this failure trips the breaker or
            moves routing to another fallback entry (fire ``on_fallback``),
            else None.
        """
        with self._lock:
            if self._state == FALLBACK:
                if not self._chain:
                    return None
                entry = self._active()
                if entry is None:
                    return None
                entry.failures += 1
                if self._usable(entry):
                    return None
                nxt = self._active()
                return (entry.name, nxt.name) if nxt is not None else None
            self._failures += 1
            if self._state == RECOVERING:
                self._successes = 0
                if rate_limited:
                    return self._trip()
            if self._failures >= self._trip_threshold:
                return self._trip()
            return None

    def _trip(self) -> Optional[tuple[str, str]]:
        self._state = FALLBACK
        self._failures = 0
        self._successes = 0
        self._tripped_at = self._clock()
        entry = self._active()
        return (self._primary, entry.name) if entry is not None else None

    def _close(self) -> None:
        self._state = PRIMARY
        self._failures = 0
        self._successes = 0
        for e in self._chain:
            e.failures = 0

    # -- manual control --------------------------------------------------------------

    def reset(self) -> None:
        """Back to a fresh primary state (availability switches are kept)."""
        with self._lock:
            self._close()

    def set_primary(self, name: str) -> None:
        """Make ``name`` the primary (a manual model switch) and reset the breaker."""
        _check_name("primary", name)
        with self._lock:
            self._primary = name
            self._close()

    def set_available(self, name: str, available: bool) -> None:
        """Mark a chain entry usable or not by hand.

        Raises:
            ConfigError: ``name`` is not in the chain.
        """
        with self._lock:
            for e in self._chain:
                if e.name == name:
                    e.available = bool(available)
                    if available:
                        e.failures = 0
                    return
        raise ConfigError(f"{shown(name)} is not in the fallback chain {self.fallbacks!r}")

    def __repr__(self) -> str:
        return f"FallbackManager(primary={self._primary!r}, fallbacks={self.fallbacks!r}, state={self._state!r})"


__all__ = ["FALLBACK", "PRIMARY", "RECOVERING", "FallbackManager"]
