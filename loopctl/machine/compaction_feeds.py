"""The compaction feeds: a pass's result adopted as history, or a pass that changed nothing.

A compaction is a commit point: the compacted conversation replaces
history and pending is cleared. A pass that does not shrink the
conversation fails the run with ``ContextExceeded`` (naming the window, or
the size before when there is none), so a compactor that cannot help never
loops. Neither feed may come while tool results are awaited: clearing
pending would orphan the awaited calls.
"""

from __future__ import annotations

from collections.abc import Iterable

from loopctl.errors import ContextExceeded
from loopctl.machine.core import MachineCore
from loopctl.machine.steps import (
    Failed,
    MachineState,
)
from loopctl.messages import Message


class CompactionFeeds(MachineCore):
    """``LoopMachine``'s compaction feeds (its state lives in ``MachineCore``)."""

    def _await_compaction(self, reason: str) -> None:
        self._state = MachineState.AWAITING_COMPACTION
        self._compact_reason = reason

    def compaction_result(
        self, messages: Iterable[Message], tokens_before: int, tokens_after: int, window: int = 0
    ) -> None:
        """Adopt a compacted conversation as history; clears pending (a commit point).

        ``tokens_after >= tokens_before`` fails the run with ``ContextExceeded``
        naming ``window`` as the limit (``tokens_before`` when no window is given).

        Raises:
            RuntimeError: when tool results are awaited (clearing pending
                would orphan the awaited calls).
        """
        if self._state is MachineState.TERMINAL:
            return
        self._check_not_awaiting_tools("compaction_result")
        if self._no_progress(tokens_before, tokens_after, window):
            return
        self._history = list(messages)
        self._pending = []
        self._history_epoch += 1
        self._pending_epoch += 1
        self._context_tokens = tokens_after
        self._compact_reason = None
        self._state = MachineState.START

    def compaction_noop(self, tokens_before: int, tokens_after: int, window: int = 0) -> None:
        """A pass that changed nothing; history and pending stay as they are.

        ``tokens_after >= tokens_before`` fails the run with ``ContextExceeded``
        naming ``window`` as the limit (``tokens_before`` when no window is given).

        Raises:
            RuntimeError: when tool results are awaited.
        """
        if self._state is MachineState.TERMINAL:
            return
        self._check_not_awaiting_tools("compaction_noop")
        if self._no_progress(tokens_before, tokens_after, window):
            return
        self._context_tokens = tokens_after
        self._compact_reason = None
        self._state = MachineState.START

    def _check_not_awaiting_tools(self, feed: str) -> None:
        if self._state is MachineState.AWAITING_TOOLS:
            raise RuntimeError(f"{feed} fed while tool results are awaited")

    def _no_progress(self, before: int, after: int, window: int) -> bool:
        if after >= before:
            self._terminate(Failed(ContextExceeded(used=after, limit=window if window > 0 else before)))
            return True
        return False


__all__ = ["CompactionFeeds"]
