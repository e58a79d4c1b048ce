"""The typed-answer side of a run: read a final reply against its check, count rejections.

Pure, like the rest of the machine. A reply that fits completes the run
(in tool mode the answer stays in the conversation as the reply's text, so
no call is left without a result). One that does not fit is answered with
the problems, every call of the reply getting a result, and the model is
asked again, up to ``check.retries`` times; then the run fails with
``OutputValidationError``.
"""

from __future__ import annotations

from typing import Optional

import attrs

from loopctl.errors import OutputValidationError
from loopctl.machine.steps import (
    AnswerCheck,
    AnswerRejected,
    AnswerVerdict,
    Completed,
    Failed,
    Outcome,
)
from loopctl.messages import Message, StopReason, ToolResultPart


@attrs.frozen
class AnswerReading:
    """What a final reply comes to.

    ``outcome``: the run ends so (None: the model is asked again, with
    ``feedback`` appended); ``reply``: the reply as it stays in the
    conversation, when it differs from the one given.
    """

    outcome: Optional[Outcome] = None
    reply: Optional[Message] = None
    feedback: Optional[Message] = None


class AnswerFeed:
    """One run's typed answer: its check, the rejections so far, the last rejection."""

    __slots__ = ("check", "rejections", "rejected")

    def __init__(self, check: Optional[AnswerCheck] = None) -> None:
        self.check = check
        self.rejections = 0
        self.rejected: Optional[AnswerRejected] = None

    def read(
        self, message: Message, stop_reason: StopReason, turn: int, verdict: Optional[AnswerVerdict] = None
    ) -> AnswerReading:
        """Read the final reply ``message`` of ``turn`` (mutates the rejection count).

        ``verdict``: the check's reading, when the caller made it; None: read here.
        """
        check = self.check
        assert check is not None
        if verdict is None:
            verdict = check.read(message, stop_reason)
        if verdict.ok:
            reply = Message.assistant(verdict.text) if message.tool_calls else None
            return AnswerReading(Completed(verdict.text, verdict.value), reply)
        self.rejections += 1
        limit = check.retries + 1
        self.rejected = AnswerRejected(turn, verdict.errors, self.rejections, limit)
        if self.rejections >= limit:
            return AnswerReading(Failed(OutputValidationError(verdict.text or message.text, verdict.errors)))
        feedback = check.feedback(verdict.errors)
        if not message.tool_calls:
            return AnswerReading(feedback=Message.user(feedback))
        # Every call of the reply gets its answer; the final answer's carries the problems.
        return AnswerReading(feedback=Message.from_tool_results([
            ToolResultPart(
                c.id,
                c.name,
                feedback if c.name == check.final_tool else "not run: this reply also gave a final answer",
                True,
            )
            for c in message.tool_calls
        ]))


__all__ = ["AnswerFeed", "AnswerReading"]
