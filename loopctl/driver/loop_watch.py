"""What the loop detector sees of a run's tool calls: every answer, and where an armed stop ends the run.

Every answer a call gets counts, whoever gave it: the tool's result or
error (the dispatcher's finish phase) and a person's denial or an approval
timeout (the approval gate answers those, and the tool never runs). A
model repeating a call that is denied every time is a loop like any other:
an unattended run stops with ``LoopDetected`` instead of asking until
``max_turns``. The armed stop is raised before the next call starts, or
before it would wait for a person (nobody is asked about a call of a run
that is about to stop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from loopctl.detection import LoopDetector
from loopctl.events import LoopDetectedEvent
from loopctl.messages import ToolCallPart
from loopctl.tools.base import ToolOutput

if TYPE_CHECKING:
    from loopctl.driver.emission import RunEvents


def stop_if_armed(detector: Optional[LoopDetector]) -> None:
    """Raise the ``LoopDetected`` stop the detector armed, if any (the window is cleared)."""
    if detector is not None:
        stop = detector.pre_check()
        if stop is not None:
            raise stop


def count_answer(detector: Optional[LoopDetector], events: RunEvents, call: ToolCallPart, out: ToolOutput) -> None:
    """Record one answer to ``call``; the warning event fires when this answer repeats a pattern enough."""
    if detector is not None:
        found = detector.record(call.name, call.input, out.text, out.is_error)
        if found is not None:
            events.emit(LoopDetectedEvent(events.session_id, events.run_id, found[0], found[1]))


__all__ = ["count_answer", "stop_if_armed"]
