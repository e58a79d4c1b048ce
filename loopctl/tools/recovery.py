"""Recovery from failed tool calls: a reflector analyses, a strategy decides.

Both are pure decision objects: the dispatcher does the waiting (cancel-
aware) and the re-running. ``Reflector.analyze`` looks at an error result
and returns a ``FailureAnalysis`` (recoverable? how bad? a ``Correction``?);
``RecoveryStrategy.decide`` turns it into ``Retry(delay)``, ``Skip``,
``AskUser`` or ``Fail``. Only ``Retry`` re-runs the call (with the
correction applied: an input fix or a tool change); everything else hands
the error result to the model as it is. The defaults (``NoopReflector``:
never recoverable) make zero retries. Whatever the strategy says, more
than ``MAX_RETRIES`` (5) retries of one call end the run with
``ToolRecoveryExhausted(attempts=6)``.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from typing import Any, Optional, Protocol, Union, runtime_checkable

import attrs

from loopctl.checks import integer, number
from loopctl.messages import ToolSchema
from loopctl.timeouts import required_seconds

log = logging.getLogger("loopctl")

#: Retries allowed per call, whatever the strategy says; one more ends the run.
MAX_RETRIES = 5


class Severity(enum.IntEnum):
    """How bad a failure is (ordered)."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2
    CRITICAL = 3


class CorrectionKind(str, enum.Enum):
    """What a correction changes. Only ``INPUT_FIX`` and ``TOOL_CHANGE`` are applied."""

    INPUT_FIX = "input_fix"
    TOOL_CHANGE = "tool_change"
    PREREQUISITE_FIX = "prerequisite_fix"
    APPROACH_CHANGE = "approach_change"
    ESCALATE = "escalate"


@attrs.frozen
class Correction:
    """A suggested change for the retry.

    Args:
        kind: what changes.
        modified_input: the new input (``INPUT_FIX``; must be a mapping).
        alternative_tool: the tool to call instead (``TOOL_CHANGE``).
        guidance: free text (advisory).
    """

    kind: CorrectionKind = attrs.field(converter=CorrectionKind)
    modified_input: Optional[Mapping[str, Any]] = None
    alternative_tool: Optional[str] = None
    guidance: Optional[str] = None

    @classmethod
    def input_fix(cls, input: Mapping[str, Any]) -> Correction:
        """Retry with ``input``."""
        return cls(CorrectionKind.INPUT_FIX, modified_input=input)

    @classmethod
    def tool_change(cls, tool: str) -> Correction:
        """Retry with the tool named ``tool``."""
        return cls(CorrectionKind.TOOL_CHANGE, alternative_tool=tool)


@attrs.frozen
class FailureAnalysis:
    """What a reflector concluded about one failed call."""

    is_recoverable: bool
    root_cause: str = ""
    severity: Severity = Severity.MEDIUM
    correction: Optional[Correction] = None
    context: Optional[str] = None


@attrs.frozen
class ReflectionContext:
    """What a reflector is told besides the error.

    Attributes:
        attempt: 0 for the first attempt.
        max_attempts: the strategy's own limit (the hard ceiling is separate).
        task: the run's input.
        turn: the turn number.
        call_id: the model's id for the call.
    """

    attempt: int
    max_attempts: int
    task: str = ""
    turn: int = 0
    call_id: str = ""


@attrs.frozen
class Retry:
    """Run the call again after ``delay`` seconds (cancel-aware)."""

    delay: float = 0.0


@attrs.frozen
class Skip:
    """Give the model the error result as it is."""

    reason: str = ""


@attrs.frozen
class AskUser:
    """A person should decide; headless, the error result goes to the model."""

    prompt: str = ""


@attrs.frozen
class Fail:
    """Stop retrying; the error result goes to the model."""

    reason: str = ""


RecoveryAction = Union[Retry, Skip, AskUser, Fail]


@runtime_checkable
class Reflector(Protocol):
    """Analyses a failed call (may do IO, e.g. ask a model; runs off the run's fence)."""

    def analyze(
        self,
        error: str,
        tool: str,
        input: Mapping[str, Any],
        schema: Optional[ToolSchema],
        ctx: ReflectionContext,
    ) -> FailureAnalysis:
        """Analyse the soft error ``error`` of ``tool(input)`` (``schema`` None if unknown)."""
        ...


@runtime_checkable
class RecoveryStrategy(Protocol):
    """Decides what to do about an analysed failure (pure)."""

    def decide(self, analysis: FailureAnalysis, attempt: int, max_attempts: int) -> RecoveryAction:
        """``Retry(delay)``, ``Skip``, ``AskUser`` or ``Fail`` for attempt ``attempt`` (0 first)."""
        ...


class NoopReflector:
    """The default: every failure is non-recoverable, so nothing is retried."""

    def analyze(
        self,
        error: str,
        tool: str,
        input: Mapping[str, Any],
        schema: Optional[ToolSchema],
        ctx: ReflectionContext,
    ) -> FailureAnalysis:
        """Never recoverable, medium severity, no correction."""
        return FailureAnalysis(False, error, Severity.MEDIUM)


class ExponentialBackoffRecovery:
    """Retry recoverable failures with delays ``base * factor**attempt`` (capped).

    Non-recoverable failures, or ``attempt >= max_attempts``, give ``Fail``;
    a HIGH-or-worse failure that carries a correction gives ``AskUser``.

    Args:
        max_attempts: retries this strategy allows (the hard ceiling is 5).
        base_delay: the first delay in seconds (0.1).
        factor: growth per attempt (2).
        max_delay: the cap (30 s).
    """

    def __init__(
        self, max_attempts: int = 3, base_delay: float = 0.1, factor: float = 2.0, max_delay: float = 30.0
    ) -> None:
        name = "ExponentialBackoffRecovery"
        self.max_attempts = integer(max_attempts, f"{name}.max_attempts", 0)
        self.base_delay = required_seconds(base_delay, f"{name}.base_delay", zero=True)
        self.factor = number(factor, f"{name}.factor", 1)
        self.max_delay = required_seconds(max_delay, f"{name}.max_delay", zero=True)

    def delay(self, attempt: int) -> float:
        """The wait before retry number ``attempt + 1``."""
        try:
            grown = self.base_delay * self.factor**attempt
        except OverflowError:  # a finite factor can grow past the float range: past any cap (unless no delay)
            grown = math.inf if self.base_delay else 0.0
        return float(min(self.max_delay, grown))

    def decide(self, analysis: FailureAnalysis, attempt: int, max_attempts: int) -> RecoveryAction:
        """Retry with backoff while recoverable and under the limit."""
        if not analysis.is_recoverable:
            return Fail(analysis.root_cause or "not recoverable")
        if attempt >= min(max_attempts, self.max_attempts):
            return Fail(f"gave up after {attempt + 1} attempts")
        if analysis.severity >= Severity.HIGH and analysis.correction is not None:
            return AskUser(analysis.correction.guidance or analysis.root_cause)
        return Retry(self.delay(attempt))


class NoRetryRecovery:
    """A strategy that never retries."""

    max_attempts = 0

    def decide(self, analysis: FailureAnalysis, attempt: int, max_attempts: int) -> RecoveryAction:
        """Always ``Fail``."""
        return Fail("retries disabled")


__all__ = [
    "AskUser",
    "Correction",
    "CorrectionKind",
    "ExponentialBackoffRecovery",
    "Fail",
    "FailureAnalysis",
    "MAX_RETRIES",
    "NoRetryRecovery",
    "NoopReflector",
    "RecoveryAction",
    "RecoveryStrategy",
    "Reflector",
    "ReflectionContext",
    "Retry",
    "Severity",
    "Skip",
]
