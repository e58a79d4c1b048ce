"""One compaction pass (handler 3): measure, ask hooks, compact, report.

The brain already decided that a pass is due; ``Compaction`` (a part of the
run object: ``RunDriver`` extends it) does the IO:

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
from typing import Any, Optional

from loopctl.driver.run_state import RunState
from loopctl.errors import Cancelled, ContextExceeded, LoopError
from loopctl.events import Compaction as CompactionEvent
from loopctl.events.hooks import CompactHookContext
from loopctl.messages import ModelRequest
from loopctl.providers.stream_handler import cancellable_complete

log = logging.getLogger("loopctl")


class Compaction(RunState):
    """The run's compaction pass (handler 3) and the model call a summarizing compactor makes."""

    __slots__ = ()

    def run_compaction(self, reason: str, deferred_tokens: int) -> None:
        """Compact the conversation and feed the outcome to the machine."""
        parts, m, meter, rc, events = self.parts, self.machine, self.meter, self.rc, self.events
        window = parts.session_config.context_window
        messages = m.full_history()
        before = meter.figure(m)
        reserved = deferred_tokens + meter.overhead
        manager = parts.context_manager
        instructions: Optional[str] = None
        extra: Optional[str] = None
        hooks = parts.hooks if parts.hooks is not None and parts.hooks.hooks else None
        hook_ctx = CompactHookContext(events.session_id, rc.run.id, reason, tuple(messages), before)
        if hooks is not None:
            with rc.unfenced():
                decision = hooks.pre_compact(hook_ctx)
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
            "summarize": self.summarize,
        }
        if _takes_scale(manager):
            kwargs["scale"] = meter.calibration.scale
        compacted = self._call_manager(manager, messages, kwargs, before, window)
        if rc.cancel.is_cancelled():
            raise Cancelled(rc.cancel.reason)
        if compacted is None:
            m.compaction_noop(before, before, window)
            return
        after = meter.figure_for(compacted)
        m.compaction_result(compacted, before, after, window)
        if m.is_terminal:
            return
        events.emit(CompactionEvent(events.session_id, events.run_id, reason, before, after))
        if hooks is not None:
            with rc.unfenced():
                hooks.post_compact(hook_ctx, after)

    def _call_manager(self, manager: Any, messages: object, options: dict[str, Any], before: int, window: int) -> Any:
        """The manager's pass, unfenced; a foreign failure is ``ContextExceeded`` chained to it."""
        with self.rc.unfenced():
            try:
                compacted = manager.compact(messages, **options)
                failure: Optional[BaseException] = None
            except LoopError:
                raise
            except Exception as exc:  # a custom manager's bug: the pass failed
                compacted, failure = None, exc
        if failure is not None:
            raise ContextExceeded(before, window) from failure
        return compacted

    def summarize(self, request: ModelRequest) -> object:
        """A cancel-aware model call for a summarizing compactor."""
        return cancellable_complete(self.parts.client, request, self.rc.cancel)


def _takes_scale(manager: object) -> bool:
    from loopctl.context.manager import ContextManager

    return isinstance(manager, ContextManager)


__all__ = ["Compaction"]
