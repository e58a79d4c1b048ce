"""What the dispatcher keeps per call and per run, and how a batch is cut into waves.

``CallState`` is one admitted call across its attempts (its current call and
tool, the attempt's context, output and timing); ``plan_waves`` groups a batch for parallel dispatch
keeping request order, asking the tools (user code, so outside the run's
fence) which calls may overlap. No IO here: the dispatcher does the running.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Optional

from loopctl.approvals.gate import Unfence
from loopctl.driver.admission import Admitted
from loopctl.messages import ToolResultPart
from loopctl.tools.base import ToolContext, ToolOutput


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
        self.correction: object = None
        self.interrupted = False
        self.refusal: Optional[str] = None  # why a corrected retry may not run

    def result(self) -> ToolResultPart:
        o = self.original
        return ToolResultPart(o.id, o.name, self.out.text, self.out.is_error)


def plan_waves(calls: Sequence[Admitted], limit: int, unfenced: Unfence) -> list[list[int]]:
    """Group call indices into waves, keeping request order across waves.

    Safe calls join the current wave up to ``limit`` unless their resource
    key is already in it; an unsafe call runs alone. The tools'
    ``is_concurrency_safe`` and ``resource_key`` run inside ``unfenced``.
    """
    with unfenced():
        return _plan(calls, limit)


def _plan(calls: Sequence[Admitted], limit: int) -> list[list[int]]:
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



__all__ = ["CallState", "plan_waves", "result_hash"]
