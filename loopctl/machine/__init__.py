"""The brain: a sans-IO state machine that makes every loop decision.

Imports only the leaves (errors, messages): no threads, clock, IO or logging.
"""

from __future__ import annotations

from loopctl.machine.machine import LoopMachine
from loopctl.machine.steps import (
    AnswerCheck,
    AnswerRejected,
    AnswerVerdict,
    CallLLM,
    CallTools,
    CancelledOutcome,
    Compact,
    Completed,
    Done,
    Failed,
    MachinePolicy,
    MachineState,
    MaxTurnsReached,
    Outcome,
    PendingToolCall,
    Step,
)
from loopctl.machine.views import ConversationSnapshot, MessagesView

__all__ = [
    "AnswerCheck",
    "AnswerRejected",
    "AnswerVerdict",
    "CallLLM",
    "CallTools",
    "CancelledOutcome",
    "Compact",
    "ConversationSnapshot",
    "Completed",
    "Done",
    "Failed",
    "LoopMachine",
    "MachinePolicy",
    "MachineState",
    "MaxTurnsReached",
    "MessagesView",
    "Outcome",
    "PendingToolCall",
    "Step",
]
