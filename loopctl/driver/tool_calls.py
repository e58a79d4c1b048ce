"""What the dispatcher keeps per call and per run, and how a batch is cut into waves.

``CallState`` is one admitted call across its attempts (its current call and
tool, the attempt's context, output and timing); ``ToolRun`` is what a run
lends the dispatcher; ``plan_waves`` groups a batch for parallel dispatch
keeping request order. No IO here: the dispatcher does the running.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable, Optional

from loopctl.driver.admission import Admitted
from loopctl.messages import ToolResultPart
from loopctl.tools.base import ToolContext, ToolOutput

if TYPE_CHECKING:
    from loopctl.config import ParallelDispatch
    from loopctl.driver.emission import RunEvents
    from loopctl.driver.handle import RunContext


def result_hash(text: str) -> str:
    """A short, stable, non-cryptographic hash of a result's text."""
    return format(zlib.crc32(text.encode("utf-8", "surrogatepass")), "08x") if text else ""


_NO_OUTPUT = ToolOutput("")  # a call's output before it has one (frozen: shared)


class CallState:
    """One admitted call's state across its attempts."""

    __slots__ = (
        "original", "call", "tool", "attempt", "ctx", "out", "ms", "resolved", "correction", "interrupted",
        "refusal",
    )

    def __init__(self, admitted: Admitted) -> None:
        call = admitted.call
        self.original = call
        self.call = call
        self.tool: Any = admitted.tool
        self.attempt = 0
        self.ctx: Optional[ToolContext] = None
        self.out = _NO_OUTPUT
        self.ms = 0.0
        self.resolved = call.name
        self.correction: Any = None
        self.interrupted = False
        self.refusal: Optional[str] = None  # why a corrected retry may not run

    def result(self) -> ToolResultPart:
        o = self.original
        return ToolResultPart(o.id, o.name, self.out.text, self.out.is_error)


class ToolRun:
    """What one run lends the dispatcher: its fence, events, input and dispatch mode."""

    __slots__ = ("rc", "events", "run_input", "parallel", "session_id", "settled")

    def __init__(
        self, rc: RunContext, events: RunEvents, run_input: str, parallel: ParallelDispatch, session_id: str
    ) -> None:
        self.rc = rc
        self.events = events
        self.run_input = run_input
        self.parallel = parallel
        self.session_id = session_id
        # A durable run's checkpoint after each settled call or wave (run thread, fenced).
        self.settled: Optional[Callable[[Sequence[ToolResultPart]], None]] = None


def plan_waves(calls: Sequence[Admitted], limit: int) -> list[list[int]]:
    """Group call indices into waves, keeping request order across waves.

    Safe calls join the current wave up to ``limit`` unless their resource
    key is already in it; an unsafe call runs alone.
    """
    waves: list[list[int]] = []
    current: list[int] = []
    keys: set[str] = set()
    for i, admitted in enumerate(calls):
        tool, call = admitted.tool, admitted.call
        safe = tool is not None and tool.is_concurrency_safe(call.input)
        if not safe:
            if current:
                waves.append(current)
            waves.append([i])
            current, keys = [], set()
            continue
        key = tool.resource_key(call.input)
        if len(current) >= limit or (key is not None and key in keys):
            waves.append(current)
            current, keys = [], set()
        current.append(i)
        if key is not None:
            keys.add(key)
    if current:
        waves.append(current)
    return waves



__all__ = ["CallState", "ToolRun", "plan_waves", "result_hash"]
