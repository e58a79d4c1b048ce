"""What the brain answers: steps, outcomes, the policy it is asked under.

Steps are frozen values; the driver pattern-matches on their type. None of
them does anything: the driver does the work and feeds the result back.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Optional, Protocol, Union

import attrs

from loopctl.errors import LoopError
from loopctl.messages import Message, StopReason, ToolCallPart, ToolResultPart


class MachineState(str, enum.Enum):
    """Where the machine stands between two feeds."""

    #: fresh, or ready to decide what the model turn needs.
    START = "start"
    #: the driver was told to call the model.
    AWAITING_MODEL = "awaiting_model"
    #: the model asked for tools; waiting for their results.
    AWAITING_TOOLS = "awaiting_tools"
    #: the driver was told to compact.
    AWAITING_COMPACTION = "awaiting_compaction"
    #: the run ended; see ``LoopMachine.outcome``.
    TERMINAL = "terminal"


@attrs.frozen
class MachinePolicy:
    """The limits one ``next_step`` decision is made under."""

    max_turns: int = 200
    context_window: int = 200_000
    compact_threshold: int = 80
    auto_compact: bool = True


@attrs.frozen
class PendingToolCall:
    """One requested call; ``preresolved`` holds the soft answer for an unknown tool."""

    call: ToolCallPart
    preresolved: Optional[ToolResultPart] = None


@attrs.frozen
class Completed:
    """The model answered without asking for tools.

    ``value`` is the validated answer when the run asked for a typed answer.
    """

    final_text: str
    value: object = None


@attrs.frozen
class AnswerVerdict:
    """How a final reply read against the requested answer type."""

    ok: bool
    text: str
    value: object = None
    errors: tuple[str, ...] = ()


class AnswerCheck(Protocol):
    """Reads final replies against a requested answer type; pure, supplied by the driver.

    ``final_tool`` names the final-answer tool in tool mode (None otherwise);
    ``retries`` is how many rejected answers are answered with ``feedback``
    before the run fails with ``OutputValidationError``.
    """

    @property
    def retries(self) -> int:
        """How many rejected answers are sent back before the run fails."""
        ...

    @property
    def final_tool(self) -> Optional[str]:
        """The final-answer tool's name in tool mode, else None."""
        ...

    def read(self, message: Message, stop_reason: StopReason) -> AnswerVerdict:
        """Read a final reply (no tool calls, or a call to ``final_tool``)."""
        ...

    def feedback(self, errors: Sequence[str]) -> str:
        """The text that asks the model again, listing ``errors``."""
        ...


@attrs.frozen
class AnswerRejected:
    """The last reply's answer did not fit; the model is asked again (or the run failed)."""

    turn: int
    errors: tuple[str, ...]
    attempt: int
    max_attempts: int


@attrs.frozen
class MaxTurnsReached:
    """The run used its turn budget."""


@attrs.frozen
class CancelledOutcome:
    """The run was cancelled."""


@attrs.frozen
class Failed:
    """The run failed with ``error``."""

    error: LoopError = attrs.field(eq=False)


Outcome = Union[Completed, MaxTurnsReached, CancelledOutcome, Failed]


@attrs.frozen
class CallLLM:
    """Call the model for turn ``turn``."""

    turn: int


@attrs.frozen
class CallTools:
    """Run the calls the reply of turn ``turn`` asked for, in order."""

    turn: int
    calls: tuple[PendingToolCall, ...]


@attrs.frozen
class Compact:
    """Compact the conversation; ``reason`` is ``"emergency"`` or ``"threshold"``."""

    reason: str


@attrs.frozen
class Done:
    """The run is over."""

    outcome: Outcome


Step = Union[CallLLM, CallTools, Compact, Done]

__all__ = [
    "AnswerCheck",
    "AnswerRejected",
    "AnswerVerdict",
    "CallLLM",
    "CallTools",
    "CancelledOutcome",
    "Compact",
    "Completed",
    "Done",
    "Failed",
    "MachinePolicy",
    "MachineState",
    "MaxTurnsReached",
    "Outcome",
    "PendingToolCall",
    "Step",
]
