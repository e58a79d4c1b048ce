"""One compaction pass (handler 3): measure, ask hooks, compact, report.

The brain already decided that a pass is due; this module does the IO:

1. read ``full_history()`` and measure it (calibrated, overhead included);
2. take the deferred-extras reservation (one-shot, given by the run) plus
   the request overhead;
3. offer the pre-compact hooks a veto, instructions and extra context
   (unfenced: hooks are user code and never hold a cancel);
4. run the context manager UNFENCED (a summarizing compactor makes a model
   call), so a cancel takes the run over at once; the uncompacted history
   then survives and the run ends ``Cancelled``;
5. feed ``compaction_result`` (a commit point: pending moves to history) or
   ``compaction_noop``; ``on_compaction`` and post-compact hooks fire only
   for a real compaction.

A hook veto or a manager with nothing to do is a no-op, which the machine's
no-progress guard turns into ``ContextExceeded``: the pass was needed. A
manager that fails with a foreign exception is reported as ``ContextExceeded``
chained to it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

from loopctl.errors import Cancelled, ContextExceeded, LoopError
from loopctl.hooks import CompactHookContext
from loopctl.observers import Compaction

if TYPE_CHECKING:
    from loopctl.driver.emission import RunEvents
    from loopctl.driver.handle import RunContext
    from loopctl.driver.meter import TokenMeter
    from loopctl.driver.parts import LoopParts
    from loopctl.machine import LoopMachine

log = logging.getLogger("loopctl")


def run_compaction(
    parts: LoopParts,
    machine: LoopMachine,
    meter: TokenMeter,
    rc: RunContext,
    events: RunEvents,
    reason: str,
    deferred_tokens: int,
    summarize: Callable[[Any], Any],
) -> None:
    """Compact the conversation and feed the outcome to the machine."""
    m = machine
    window = parts.session_config.context_window
    messages = m.full_history()
    before = meter.figure(m)
    reserved = deferred_tokens + meter.overhead
    manager = parts.context_manager
    instructions: Optional[str] = None
    extra: Optional[str] = None
    hooks = parts.hooks
    has_hooks = hooks is not None and bool(hooks.hooks)
    hook_ctx = CompactHookContext(events.session_id, rc.run.id, reason, tuple(messages), before)
    if has_hooks:
        with rc.unfenced():
            decision = hooks.pre_compact(hook_ctx)  # type: ignore[union-attr]
        if decision.abort:
            log.info("compaction (%s) vetoed by a pre-compact hook", reason)
            m.compaction_noop(before, before, window)
            return
        instructions, extra = decision.instructions, decision.extra_context
    if manager is None:
        m.compaction_noop(before, before, window)
        return
    if rc.cancel.is_cancelled():
        raise Cancelled(rc.cancel.reason)
    kwargs: dict[str, Any] = {
        "reason": reason,
        "reserved": reserved,
        "instructions": instructions,
        "extra_context": extra,
        "summarize": summarize,
    }
    if _takes_scale(manager):
        kwargs["scale"] = meter.calibration.scale
    with rc.unfenced():
        try:
            compacted = manager.compact(messages, **kwargs)
            failure: Optional[BaseException] = None
        except LoopError:
            raise
        except Exception as exc:  # a custom manager's bug: the pass failed
            compacted, failure = None, exc
    if failure is not None:
        raise ContextExceeded(before, window) from failure
    if rc.cancel.is_cancelled():
        raise Cancelled(rc.cancel.reason)
    if compacted is None:
        m.compaction_noop(before, before, window)
        return
    after = meter.figure_for(compacted)
    m.compaction_result(compacted, before, after, window)
    if m.is_terminal:
        return
    events.emit(Compaction(events.session_id, events.run_id, reason, before, after))
    if has_hooks:
        with rc.unfenced():
            hooks.post_compact(hook_ctx, after)  # type: ignore[union-attr]


def _takes_scale(manager: Any) -> bool:
    from loopctl.context.manager import ContextManager

    return isinstance(manager, ContextManager)


__all__ = ["run_compaction"]
