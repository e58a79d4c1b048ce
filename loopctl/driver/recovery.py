"""Recovery decisions for a failed tool call: ask the reflector and the strategy; apply a fix.

Both are user code that may misbehave: a reflector or strategy that raises
(or answers the wrong type) is logged and treated as "not recoverable",
and a correction that makes no sense is skipped (the call retries as it was).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

import attrs

from loopctl.approvals import ApprovalContext
from loopctl.driver.admission import admit, same_call
from loopctl.driver.approval_gate import needs_approval
from loopctl.messages import ToolCallPart, ToolSchema
from loopctl.tools.recovery import (
    MAX_RETRIES,
    CorrectionKind,
    ExponentialBackoffRecovery,
    Fail,
    FailureAnalysis,
    NoopReflector,
    RecoveryAction,
    RecoveryStrategy,
    ReflectionContext,
    Reflector,
    Retry,
)

if TYPE_CHECKING:
    from loopctl.driver.parts import LoopParts
    from loopctl.driver.run_state import RunState
    from loopctl.driver.tool_calls import CallState

log = logging.getLogger("loopctl")


def plan_retry(parts: LoopParts, run: RunState, turn: int, st: CallState) -> Optional[Retry]:
    """Whether a failed call runs again: the loop's reflector and strategy decide (defaults when unset).

    On ``Retry`` the reflector's correction is kept on the call for the next
    attempt. Both are user code that may block, so they run unfenced.
    """
    reflector = parts.reflector if parts.reflector is not None else NoopReflector()
    strategy = parts.recovery if parts.recovery is not None else ExponentialBackoffRecovery()
    limit = getattr(strategy, "max_attempts", MAX_RETRIES)
    max_attempts = limit if isinstance(limit, int) else MAX_RETRIES
    tool = st.tool
    rctx = ReflectionContext(st.attempt, max_attempts, run.run_input, turn, st.call.id)
    call, text = st.call, st.out.text
    with run.rc.unfenced():  # a reflector may ask a model: blocking work; a tool's schema() is user code
        schema = tool.schema() if tool is not None else None
        analysis, action = decide(reflector, strategy, text, call, schema, rctx, st.attempt, max_attempts)
    if type(action) is not Retry:
        return None
    st.correction = analysis.correction
    return action


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


def apply_correction(parts: LoopParts, run: RunState, turn: int, st: CallState) -> None:
    """Apply a retry's correction: a changed call passes the gate again (same id).

    An approval covers the call as it was approved: a correction equal to
    it changes nothing (the call runs again as it stands); one that changes
    it into a call needing approval is refused (``st.refusal``), not run,
    and so is one the gate refuses (too large, nested too deeply: the
    gate's own reason, as the model would get it for its own call).
    """
    fixed = corrected(st.call, st.correction)
    st.correction = None
    if fixed is st.call or same_call(st.call, fixed.name, fixed.input):
        return
    rc = run.rc
    again = admit([fixed], parts.tools, rc.unfenced)[0]
    st.call, st.tool = again.call, again.tool
    c = again.call
    if c.invalid is not None:
        st.refusal = c.invalid
        return
    ctx = ApprovalContext(c.name, c.input, c.id, rc.run.id, run.session_id, turn)
    if needs_approval(again, parts.approval_policy, ctx, rc.unfenced):
        st.refusal = (
            f"Tool '{c.name}': the corrected call was not run because it needs a person's approval; "
            "call the tool again to ask for it"
        )


__all__ = ["apply_correction", "corrected", "decide", "plan_retry"]
