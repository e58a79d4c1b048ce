"""Contributors: transient messages added to one turn's request.

The driver consults every contributor at the top of each turn attempt (a
deferred turn's retry included), in registration order, against a snapshot
of the conversation. What they return rides ahead of the conversation, counts
toward the context estimate (and can defer the turn), and is never persisted
into history, pending or the audit trail. A contributor that raises is logged
and skipped by the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Optional, Protocol, runtime_checkable

import attrs

from loopctl.checks import integer, shown
from loopctl.errors import ConfigError
from loopctl.messages import Message, Role, ToolResultPart

GOAL_REMINDER_PREFIX = "Reminder of the original task:"


@attrs.frozen
class ContributorContext:
    """What a contributor sees.

    Attributes:
        turn: the turn about to be requested (0-based within the run).
        conversation: history plus pending (a snapshot; do not mutate).
        input: the run's input text.
    """

    turn: int
    conversation: Sequence[Message]
    input: str


@runtime_checkable
class ContextContributor(Protocol):
    """Adds (at most) one transient message to a turn's request."""

    def contribute(self, ctx: ContributorContext) -> Optional[Message]:
        """The message for this turn, or None."""
        ...


def first_user_text(conversation: Sequence[Message]) -> Optional[str]:
    """The text of the first user message that carries text (tool results skipped)."""
    for m in conversation:
        if m.role is Role.USER and not any(type(p) is ToolResultPart for p in m.parts):
            text = m.text
            if text:
                return text
    return None


class GoalReminder:
    """Re-sends the first user message every ``every_n_turns`` turns.

    Turn 0 is skipped (the task was just sent). The reminder is a user
    message starting with ``GOAL_REMINDER_PREFIX``.

    Args:
        every_n_turns: the period (>= 1).
    """

    def __init__(self, every_n_turns: int = 5) -> None:
        self.every_n_turns = integer(every_n_turns, "GoalReminder.every_n_turns", 1)

    def contribute(self, ctx: ContributorContext) -> Optional[Message]:
        """The reminder on turns n, 2n, ...; None otherwise."""
        if ctx.turn <= 0 or ctx.turn % self.every_n_turns:
            return None
        goal = first_user_text(ctx.conversation) or ctx.input
        if not goal:
            return None
        return Message.user(f"{GOAL_REMINDER_PREFIX}\n{goal}")

    def __repr__(self) -> str:
        return f"GoalReminder(every_n_turns={self.every_n_turns})"


class FunctionContributor:
    """Wraps a plain function ``f(ctx) -> Message | str | None`` (a str becomes a user message)."""

    def __init__(self, fn: Callable[[ContributorContext], object]) -> None:
        if not callable(fn):
            raise ConfigError(f"FunctionContributor needs a callable, got {shown(fn)}")
        self.fn = fn

    def contribute(self, ctx: ContributorContext) -> Optional[Message]:
        """What the function returns, as a message."""
        out = self.fn(ctx)
        if out is None or isinstance(out, Message):
            return out
        if isinstance(out, str):
            return Message.user(out) if out else None
        raise TypeError(f"contributor function must return Message, str or None, got {type(out).__name__}")


__all__ = [
    "ContextContributor",
    "ContributorContext",
    "FunctionContributor",
    "GOAL_REMINDER_PREFIX",
    "GoalReminder",
    "first_user_text",
]
