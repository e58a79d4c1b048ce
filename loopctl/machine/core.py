"""What the machine holds, what a reader may see of it, and the one way a run ends.

``MachineCore`` owns the state: the committed history and this run's
pending messages (each with an epoch bumped when the list is replaced
wholesale), the state and outcome, the turn count, the context estimate,
the cancel flag, the awaited tool calls and compaction, and the typed
answer's feed. Reads are live views or plain values; ``_terminate`` is
where every ending passes. The feeds that change it live in the
subclasses (``CompactionFeeds``, ``LoopMachine``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

from loopctl.machine.answer_feed import AnswerFeed
from loopctl.machine.steps import (
    AnswerRejected,
    MachineState,
    Outcome,
    PendingToolCall,
)
from loopctl.machine.views import ConversationSnapshot, MessagesView
from loopctl.messages import Message


class MachineCore:
    """The machine's state and its read-only views (``LoopMachine`` adds the feeds)."""

    def __init__(self, history: Iterable[Message] = ()) -> None:
        self._history: list[Message] = list(history)
        self._pending: list[Message] = []
        # Guidance held for after the tool results; a tuple (none shared) until some arrives.
        self._held: Sequence[Message] = ()
        self._state = MachineState.START
        self._outcome: Optional[Outcome] = None
        self._turns_taken = 0
        self._context_tokens = 0
        self._cancelled = False
        self._tool_turn = 0
        self._pending_tools: tuple[PendingToolCall, ...] = ()
        self._compact_reason: Optional[str] = None
        self._history_epoch = 0
        self._pending_epoch = 0
        self._overflow_turn: Optional[int] = None  # the turn that used its overflow retry
        self._answer = AnswerFeed()

    # -- reads ---------------------------------------------------------------

    @property
    def history(self) -> MessagesView:
        """Committed messages from earlier runs (and compactions); live view."""
        return MessagesView(self._history)

    @property
    def pending(self) -> MessagesView:
        """This run's messages, not yet committed; live view."""
        return MessagesView(self._pending)

    @property
    def history_epoch(self) -> int:
        """Bumped whenever history is replaced wholesale (not when it grows)."""
        return self._history_epoch

    @property
    def pending_epoch(self) -> int:
        """Bumped whenever pending is replaced or cleared (not when it grows)."""
        return self._pending_epoch

    @property
    def size_key(self) -> tuple[int, int, int, int]:
        """(history epoch, history length, pending epoch, pending length): equal keys, equal lists."""
        return (self._history_epoch, len(self._history), self._pending_epoch, len(self._pending))

    @property
    def state(self) -> MachineState:
        """The current state."""
        return self._state

    @property
    def outcome(self) -> Optional[Outcome]:
        """The terminal outcome, or None while the run is live."""
        return self._outcome

    @property
    def turns_taken(self) -> int:
        """Model replies accepted in this run."""
        return self._turns_taken

    @property
    def context_tokens(self) -> int:
        """The current context-size estimate (fed by the driver)."""
        return self._context_tokens

    @property
    def is_terminal(self) -> bool:
        """True once the run has an outcome."""
        return self._state is MachineState.TERMINAL

    @property
    def answer_rejected(self) -> Optional[AnswerRejected]:
        """Set when the last ``model_response`` gave an answer that did not fit; else None."""
        return self._answer.rejected

    @property
    def is_cancelled(self) -> bool:
        """True when the cancel flag is set for this run."""
        return self._cancelled

    def full_history(self) -> list[Message]:
        """History then pending: what the next request sends (a new list)."""
        return self._history + self._pending

    def snapshot_conversation(self, prefix: Sequence[Message] = ()) -> ConversationSnapshot:
        """``prefix + history + pending`` as an O(1) snapshot (no copy of the lists)."""
        segs: list[tuple[Sequence[Message], int]] = []
        if prefix:
            segs.append((tuple(prefix), len(prefix)))
        segs.append((self._history, len(self._history)))
        segs.append((self._pending, len(self._pending)))
        return ConversationSnapshot(segs)

    def _terminate(self, outcome: Outcome) -> Outcome:
        self._state = MachineState.TERMINAL
        self._outcome = outcome
        self._pending_tools = ()
        self._compact_reason = None
        return outcome


__all__ = ["MachineCore"]
