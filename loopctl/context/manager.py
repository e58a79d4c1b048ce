"""The context manager: the compaction policy and the check that it worked.

The machine decides WHEN to compact; the driver (``driver/compaction.py``)
measures and runs the pass; this manager owns the policy (window, threshold
line, target) and classifies what its compactor returned:

- nothing changed (same list, or no fewer messages and no fewer tokens) -> None;
- a result that still does not fit ``window - reserved`` -> ``ContextExceeded``;
- otherwise the compacted list.

Tokens are recounted with the loop's one counter (``counter``, assigned by
the driver); a compactor's own figures are never trusted. The default target
is 70% of the threshold line (200k x 80% x 70% = 112k); an ``"emergency"``
pass (the estimate reached 95%, or the provider refused the payload) aims at
half of what was measured when that is lower.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from loopctl.checks import integer, shown
from loopctl.context.compactors import (
    CompactionRequest,
    Compactor,
    SummarizingCompactor,
    TruncatingCompactor,
    safe_split,
)
from loopctl.context.tokens import HeuristicTokenCounter, TokenCounter, count_messages
from loopctl.errors import ConfigError, ContextExceeded
from loopctl.messages import Message, ModelRequest, ModelResponse

log = logging.getLogger("loopctl")


class ContextManager:
    """Compaction policy over one compactor.

    Args:
        compactor: how to make the conversation smaller (``compact(messages, request)``).
        context_window: the window in tokens (0 = no window: nothing is enforced).
        compact_threshold: percent of the window that is the threshold line (0-100).
        counter: the token counter; the driver assigns its own so there is one.
        target_pct: percent of the threshold line a pass aims for (1-100).

    Raises:
        ConfigError: a value is out of range (the message names it).
    """

    def __init__(
        self,
        compactor: Compactor,
        context_window: int = 200_000,
        compact_threshold: int = 80,
        counter: Optional[TokenCounter] = None,
        target_pct: int = 70,
    ) -> None:
        if not hasattr(compactor, "compact"):
            raise ConfigError(f"compactor needs a compact(messages, request) method: {shown(compactor)}")
        self.compactor = compactor
        self.context_window = integer(context_window, "ContextManager.context_window", 0)
        self.compact_threshold = integer(compact_threshold, "ContextManager.compact_threshold", 0, 100)
        self.target_pct = integer(target_pct, "ContextManager.target_pct", 1, 100)
        self.counter: TokenCounter = counter if counter is not None else HeuristicTokenCounter()

    @property
    def threshold_tokens(self) -> int:
        """The threshold line in tokens (the window when the threshold is 0)."""
        pct = self.compact_threshold or 100
        return self.context_window * pct // 100

    @property
    def target_tokens(self) -> int:
        """What a pass aims for: ``target_pct`` of the threshold line."""
        return self.threshold_tokens * self.target_pct // 100

    def compact(
        self,
        messages: list[Message],
        *,
        reason: str = "manual",
        reserved: int = 0,
        instructions: Optional[str] = None,
        extra_context: Optional[str] = None,
        summarize: Optional[Callable[[ModelRequest], ModelResponse]] = None,
        scale: Optional[Callable[[int], int]] = None,
    ) -> Optional[list[Message]]:
        """Compact ``messages``; None when there is nothing to do.

        Args:
            reason: why (``"threshold"``, ``"emergency"``, ...).
            reserved: tokens the rest of the request needs (system prompt,
                tool schemas, transient extras); the result must leave room.
            instructions: a pre-compact hook's guidance for the compactor.
            extra_context: a pre-compact hook's text to keep in the result.
            summarize: one model call, for compactors that summarize.
            scale: maps raw counter figures to calibrated ones (the loop's
                ``UsageCalibration.scale``); identity when None.

        Raises:
            ContextExceeded: the compactor failed, or its result plus
                ``reserved`` still does not fit the window.
        """
        counter = self.counter
        sc = scale or _identity
        window = self.context_window
        before: list[int] = []

        def raw_before() -> int:  # counted only when a decision needs it
            if not before:
                before.append(count_messages(counter, messages))
            return before[0]

        target = self._target(reason, raw_before, reserved, sc)
        request = CompactionRequest(
            target=None if target is None else max(1, target - reserved),
            counter=counter,
            reason=reason,
            instructions=instructions,
            extra_context=extra_context,
            summarize=summarize,
        )
        try:
            result = self.compactor.compact(messages, request)
        except Exception as exc:
            raise ContextExceeded(sc(raw_before() + reserved), window) from exc
        if result is messages:
            return None
        return self._accept(messages, list(result), raw_before, reserved, sc)

    def _accept(
        self,
        messages: list[Message],
        result: list[Message],
        raw_before: Callable[[], int],
        reserved: int,
        sc: Callable[[int], int],
    ) -> Optional[list[Message]]:
        """The compactor's result, or None when it saved nothing; it must fit the window."""
        if not result:
            log.warning("compactor %r returned no messages; ignored", self.compactor)
            return None
        raw_after = count_messages(self.counter, result)
        if len(result) >= len(messages) and raw_after >= raw_before():
            return None
        window = self.context_window
        if window > 0 and sc(raw_after + reserved) > window:
            raise ContextExceeded(sc(raw_after + reserved), window)
        return result

    def _target(
        self, reason: str, raw_before: Callable[[], int], reserved: int, sc: Callable[[int], int]
    ) -> Optional[int]:
        """The raw-token target for the whole payload, or None with no window."""
        if self.context_window <= 0:
            return None
        target = self.target_tokens
        if reason == "emergency":
            target = min(target, sc(raw_before() + reserved) // 2)
        # Work in raw units: undo the calibration's ratio.
        calibrated_one = sc(1_000_000)
        if calibrated_one > 0 and calibrated_one != 1_000_000:
            target = target * 1_000_000 // calibrated_one
        return target

    def __repr__(self) -> str:
        return (
            f"ContextManager({self.compactor!r}, context_window={self.context_window}, "
            f"compact_threshold={self.compact_threshold}, target_pct={self.target_pct})"
        )


def _identity(n: int) -> int:
    return n


__all__ = [
    "CompactionRequest",
    "Compactor",
    "ContextManager",
    "SummarizingCompactor",
    "TruncatingCompactor",
    "safe_split",
]
