"""Recovery decisions for a failed tool call: ask the reflector and the strategy; apply a fix.

Both are user code that may misbehave: a reflector or strategy that raises
(or answers the wrong type) is logged and treated as "not recoverable",
and a correction that makes no sense is skipped (the call retries as it was).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Optional

import attrs

from loopctl.messages import ToolCallPart, ToolSchema
from loopctl.tools.recovery import (
    CorrectionKind,
    Fail,
    FailureAnalysis,
    RecoveryAction,
    RecoveryStrategy,
    ReflectionContext,
    Reflector,
)

log = logging.getLogger("loopctl")


def decide(
    reflector: Reflector,
    strategy: RecoveryStrategy,
    error: str,
    call: ToolCallPart,
    schema: Optional[ToolSchema],
    rctx: ReflectionContext,
    attempt: int,
    max_attempts: int,
) -> tuple[FailureAnalysis, RecoveryAction]:
    """The reflector's analysis and the strategy's action for one failed attempt."""
    try:
        analysis = reflector.analyze(error, call.name, call.input, schema, rctx)
        if not isinstance(analysis, FailureAnalysis):
            raise TypeError(f"analyze() returned {type(analysis).__name__}, not FailureAnalysis")
    except Exception as exc:
        log.exception("reflector failed on tool %r; treated as not recoverable", call.name)
        return FailureAnalysis(False, f"reflector failed: {exc}"), Fail("reflector failed")
    try:
        action = strategy.decide(analysis, attempt, max_attempts)
    except Exception as exc:
        log.exception("recovery strategy failed on tool %r; giving up", call.name)
        return analysis, Fail(f"strategy failed: {exc}")
    return analysis, action


def corrected(call: ToolCallPart, correction: object) -> ToolCallPart:
    """Apply an input fix or a tool change; anything else (or a bad fix) is skipped."""
    if correction is None:
        return call
    kind = getattr(correction, "kind", None)
    if kind == CorrectionKind.INPUT_FIX:
        new = getattr(correction, "modified_input", None)
        if isinstance(new, Mapping):
            return attrs.evolve(call, input=dict(new))
        log.warning("input fix for tool %r is not an object (%r); retrying uncorrected", call.name, new)
    elif kind == CorrectionKind.TOOL_CHANGE:
        name = getattr(correction, "alternative_tool", None)
        if isinstance(name, str) and name:
            return attrs.evolve(call, name=name)
        log.warning("tool change for %r names no tool; retrying uncorrected", call.name)
    return call


__all__ = ["corrected", "decide"]
