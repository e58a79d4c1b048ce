"""Per-tool circuit breakers (``loop.with_health_registry``).

A breaker is closed until ``failure_threshold`` consecutive failures of one
tool trip it open. While open, calls to that tool get a soft "temporarily
unavailable" result without running. Once ``cooldown`` seconds have passed,
exactly one call goes through as a probe (the breaker is half-open; other
calls are still refused); its success closes the breaker, its failure
re-opens it for another cooldown. A probe that never reports back (its run
was cancelled) expires after one more cooldown. The dispatcher gates on the
name the model *requested* and records under the *resolved* name (after
middleware rewrites). Time comes from an injectable ``clock``. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import attrs

from loopctl.checks import integer, shown
from loopctl.errors import ConfigError
from loopctl.timeouts import required_seconds

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


@attrs.define
class _Breaker:
    state: str = CLOSED
    failures: int = 0
    opened_at: float = 0.0
    probe_at: Optional[float] = None


@attrs.frozen
class ToolHealth:
    """A snapshot of one tool's breaker."""

    tool: str
    state: str
    consecutive_failures: int


def unavailable_text(tool: str, failures: int) -> str:
    """The soft error text for a refused call."""
    return f"Tool '{tool}' is temporarily unavailable after {failures} consecutive failures"


class ToolHealthRegistry:
    """Breakers by tool name.

    Args:
        failure_threshold: consecutive failures that trip a breaker (>= 1).
        cooldown: seconds an open breaker waits before one probe (>= 0).
        clock: a monotonic clock in seconds (inject a fake in tests).
    """

    def __init__(
        self,
        failure_threshold: int = 5,
        cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = integer(failure_threshold, "ToolHealthRegistry.failure_threshold", 1)
        self.cooldown = required_seconds(cooldown, "ToolHealthRegistry.cooldown", zero=True)
        if not callable(clock):
            raise ConfigError(f"ToolHealthRegistry.clock must be callable, got {shown(clock)}")
        self._clock = clock
        self._lock = threading.Lock()
        self._breakers: dict[str, _Breaker] = {}

    def check(self, tool: str) -> Optional[str]:
        """None when a call to ``tool`` may run now, else the soft refusal text.

        Mutates: an open breaker past its cooldown turns half-open and this
        call becomes its probe.
        """
        with self._lock:
            b = self._breakers.get(tool)
            if b is None or b.state == CLOSED:
                return None
            now = self._clock()
            if b.state == OPEN:
                if now - b.opened_at >= self.cooldown:
                    b.state, b.probe_at = HALF_OPEN, now
                    return None
                return unavailable_text(tool, b.failures)
            # half-open: one probe at a time, unless the probe went silent
            if b.probe_at is None or now - b.probe_at >= max(self.cooldown, 1e-9):
                b.probe_at = now
                return None
            return unavailable_text(tool, b.failures)

    def record(self, tool: str, success: bool) -> None:
        """Count one finished call of ``tool`` (mutates)."""
        with self._lock:
            b = self._breakers.get(tool)
            if success:
                if b is not None:
                    b.state, b.failures, b.probe_at = CLOSED, 0, None
                return
            if b is None:
                b = self._breakers[tool] = _Breaker()
            b.failures += 1
            if b.state == HALF_OPEN or b.failures >= self.failure_threshold:
                b.state, b.opened_at, b.probe_at = OPEN, self._clock(), None

    def state(self, tool: str) -> str:
        """``"closed"``, ``"open"`` or ``"half_open"`` (reports only)."""
        with self._lock:
            b = self._breakers.get(tool)
            return CLOSED if b is None else b.state

    def health(self, tool: str) -> ToolHealth:
        """A snapshot of ``tool``'s breaker."""
        with self._lock:
            b = self._breakers.get(tool) or _Breaker()
            return ToolHealth(tool, b.state, b.failures)

    def snapshot(self) -> dict[str, ToolHealth]:
        """Every tool seen so far."""
        with self._lock:
            return {k: ToolHealth(k, b.state, b.failures) for k, b in self._breakers.items()}

    def reset(self, tool: Optional[str] = None) -> None:
        """Close one breaker, or all (mutates)."""
        with self._lock:
            if tool is None:
                self._breakers.clear()
            else:
                self._breakers.pop(tool, None)

    def __repr__(self) -> str:
        open_ = sorted(k for k, b in self._breakers.items() if b.state != CLOSED)
        return f"<ToolHealthRegistry threshold={self.failure_threshold} open={open_}>"


__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "ToolHealth", "ToolHealthRegistry", "unavailable_text"]
