"""One compaction pass (handler 3): measure, ask hooks, compact, report.

The brain already decided that a pass is due; this module does the IO. A
hook veto or a manager with nothing to do is a no-op, which the machine's
no-progress guard turns into ``ContextExceeded`` when the pass was needed.
``on_compaction`` and post-compact hooks fire only for a real compaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from loopctl.errors import Cancelled
from loopctl.hooks import CompactHookContext

if TYPE_CHECKING:
    from loopctl.driver.handle import RunContext
    from loopctl.driver.loop import BareLoop


def run_compaction(loop: BareLoop, rc: RunContext, reason: str) -> None:
    """Compact the conversation and feed the outcome to the machine."""
    m = loop._machine
    messages = m.full_history()
    before = loop._measure_figure()
    reserved = loop._deferred_transient_tokens
    loop._deferred_transient_tokens = 0
    manager = loop._context_manager
    instructions: Optional[str] = None
    extra: Optional[str] = None
    hooks = loop._hooks
    hook_ctx = CompactHookContext(loop.session.id, rc.run.id, reason, tuple(messages), before)
    if hooks is not None and hooks.hooks:
        decision = hooks.pre_compact(hook_ctx)
        if decision.abort:
            m.compaction_noop(before, before)
            return
        instructions, extra = decision.instructions, decision.extra_context
    if manager is None:
        m.compaction_noop(before, before)
        return
    if rc.cancel.is_cancelled():
        raise Cancelled(loop._cancel.reason)
    with rc.unfenced():
        compacted = manager.compact(
            messages,
            reason=reason,
            reserved=reserved + loop._overhead_tokens(),
            instructions=instructions,
            extra_context=extra,
            summarize=loop._summarize,
        )
    if rc.cancel.is_cancelled():
        raise Cancelled(loop._cancel.reason)
    if compacted is None:
        m.compaction_noop(before, before)
        return
    after = loop._figure_for(compacted)
    m.compaction_result(compacted, before, after)
    if m.is_terminal:
        return
    loop._emitter.compaction(reason, before, after)
    if hooks is not None and hooks.hooks:
        hooks.post_compact(hook_ctx, after)


__all__ = ["run_compaction"]
