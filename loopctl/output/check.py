"""``OutputCheck``: the machine's ``AnswerCheck`` for one run's answer type and mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import attrs

from loopctl.machine.steps import AnswerVerdict
from loopctl.messages import Message, StopReason
from loopctl.output.reading import feedback_text, read_final_calls, read_reply
from loopctl.output.spec import FINAL_TOOL, OutputSpec


@attrs.frozen
class OutputCheck:
    """Reads final replies of a run that asked for ``spec`` in ``mode``."""

    spec: OutputSpec
    mode: str
    retries: int = 2

    @property
    def final_tool(self) -> Optional[str]:
        """The final-answer tool's name in tool mode, else None."""
        return FINAL_TOOL if self.mode == "tool" else None

    def read(self, message: Message, stop_reason: StopReason) -> AnswerVerdict:
        """Read a final reply into the answer type."""
        if self.mode == "tool" and message.tool_calls:
            calls = [c for c in message.tool_calls if c.name == FINAL_TOOL]
            broken = [c.invalid for c in calls if c.invalid is not None]
            if len(calls) == 1 and broken:
                # Arguments that did not parse: say so, not "every field is missing".
                cut = " (the reply was cut off at max_tokens; answer more briefly)"
                why = broken[0] + (cut if stop_reason is StopReason.MAX_TOKENS else "")
                return AnswerVerdict(False, "", None, (why,))
            reading = read_final_calls(self.spec, [c.input for c in calls])
        else:
            reading = read_reply(self.spec, message.text, truncated=stop_reason is StopReason.MAX_TOKENS)
        text = reading.text if reading.text or self.mode == "tool" else message.text
        return AnswerVerdict(reading.ok, text, reading.value, reading.errors)

    def feedback(self, errors: Sequence[str]) -> str:
        """The message that asks again."""
        return feedback_text(errors, self.mode)


__all__ = ["OutputCheck"]
