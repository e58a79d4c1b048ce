"""Sub-agents: a loop offered to another loop's model as a tool.

``SubagentTool`` (made by ``BareLoop.as_tool``) runs its loop on a task while
the calling tool's thread waits, and answers with the run's final output.
The rules it keeps:

- One cancel stops the tree: the calling run's cancel signal fires the
  sub-agent run's cancel (a listener, on the cancelling thread), which in
  turn fires the runs it delegates to. The listener is there before the
  start: a start still waiting (its session's store may block) is
  abandoned without being waited for, and refused once it gets through,
  so nothing of that run happens after the cancel. The calling run's
  ``finalize`` waits (briefly, bounded) for its sub-agent runs to settle
  and end, so every loop in the tree is free again when the caller sees
  ``Cancelled``, unless user code at a sub-agent run's own end blocks (an
  observer of its end, its session's write): that is never waited for
  beyond a short patience.
- A sub-agent run that ends on its own account (its own cancel, an error,
  max turns, a failed typed answer) is a soft error naming the sub-agent
  and the reason. Its history stays in its own loop; only the answer
  reaches the caller.
- Its events reach the calling run's tap and observers re-stamped with
  the calling run's id and the sub-agent path (``subagent_events``); its
  pending approvals, guidance and token usage are reached through the
  calling run's ``SubagentRuns`` (``subagent_runs``).
- Calls of one sub-agent run one at a time. A call that would run a loop
  already running in the calling chain (recursion), or delegate deeper than
  ``MAX_DEPTH`` levels, is refused with a soft error.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

from loopctl.cancel import CancelSignal
from loopctl.checks import shown
from loopctl.config import RunConfig
from loopctl.driver.handle import RunContext, RunHandle, current_run
from loopctl.driver.subagent_events import TapForward, forwarder_for
from loopctl.driver.subagent_runs import SETTLE_S, SUBAGENT_ENTRY, SubagentRun, enter
from loopctl.errors import Cancelled, ConfigError, LoopBusy, LoopError
from loopctl.machine import LoopMachine
from loopctl.records import json_form
from loopctl.tools.base import Tool, ToolContext, ToolOutput

log = logging.getLogger("loopctl")

#: Sub-agent levels below a top-level run; a call that would go deeper is refused.
MAX_DEPTH = 8

# The runs above the current one (outermost first, weakly: a run keeps its
# context) and the current run's sub-agent path; set on the calling thread
# just before a sub-agent run starts, so that run's context (a copy) carries it.
_LINEAGE: contextvars.ContextVar[tuple[tuple[weakref.ref[RunContext], ...], tuple[str, ...]]] = contextvars.ContextVar(
    "loopctl_subagent_lineage", default=((), ())
)


class SubagentTool(Tool):
    """A loop as a tool (``BareLoop.as_tool``): one argument, ``task``; calls run one at a time."""

    concurrency_safe = False

    def __init__(
        self,
        loop: Any,
        name: str,
        description: str,
        keep_history: bool = False,
        config: Optional[RunConfig] = None,
        output_type: object = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise ConfigError(f"a sub-agent name must be a non-empty str without '/', got {shown(name)}")
        if not isinstance(description, str):
            raise ConfigError(f"a sub-agent description must be a str, got {type(description).__name__}")
        if config is not None and not isinstance(config, RunConfig):
            raise ConfigError(f"a sub-agent config must be a RunConfig, got {type(config).__name__}")
        if not keep_history:
            _check_not_stored(loop, name)
        self.loop = loop
        self.name = name
        self.description = description
        self.keep_history = bool(keep_history)
        self.config = config
        self.output_type = output_type
        self._turn = threading.Condition()  # one call at a time: ``_busy`` under it
        self._busy = False
        self._forwarder = forwarder_for(loop)

    def input_schema(self) -> Mapping[str, Any]:
        """One required string, ``task``."""
        return {
            "type": "object",
            "properties": {"task": {"type": "string", "description": f"The task for the {self.name} sub-agent."}},
            "required": ["task"],
            "additionalProperties": False,
        }

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> object:
        """Run the sub-agent on ``input["task"]`` and answer with its output."""
        cancel = ctx.cancel
        if not self._take_turn(cancel):
            return ToolOutput.error(f"Sub-agent '{self.name}' was not started: the run was cancelled")
        try:
            return self._delegate(str(input["task"]), cancel)
        finally:
            with self._turn:
                self._busy = False
                self._turn.notify_all()  # a waiter that was cancelled meanwhile takes no turn

    def _take_turn(self, cancel: CancelSignal) -> bool:
        """Wait for the previous call to end; False if ``cancel`` fires first."""
        turn = self._turn
        with turn:
            if not self._busy:
                self._busy = True
                return True

        def wake() -> None:
            with turn:
                turn.notify_all()

        if cancel is not None:
            cancel.add_listener(wake)
        try:
            with turn:
                while self._busy:
                    if cancel is not None and cancel.is_cancelled():
                        return False
                    turn.wait()
                self._busy = True
                return True
        finally:
            if cancel is not None:
                cancel.remove_listener(wake)

    def _refusal(self, chain: tuple[weakref.ref[RunContext], ...], path: tuple[str, ...]) -> Optional[str]:
        active = self.loop._active
        if active is not None and any(active is ref() for ref in chain):
            where = "/".join(path + (self.name,))
            return (
                f"Sub-agent '{self.name}' refused: its loop is already running in this chain ({where}); "
                "a sub-agent cannot call itself"
            )
        if len(path) >= MAX_DEPTH:
            return f"Sub-agent '{self.name}' refused: delegation deeper than {MAX_DEPTH} levels"
        return None

    def _delegate(self, task: str, cancel: CancelSignal) -> ToolOutput:
        parent = current_run()
        ancestors, path = _LINEAGE.get()
        chain = ancestors + (weakref.ref(parent),) if parent is not None else ancestors
        refusal = self._refusal(chain, path)
        if refusal is not None:
            return ToolOutput.error(refusal)
        run_id = uuid.uuid4().hex
        active = enter(parent, self.name, self.loop, run_id) if parent is not None else None
        not_started = ToolOutput.error(f"Sub-agent '{self.name}' was not started: the run was cancelled")
        if parent is not None and active is None:
            return not_started
        stop = None if active is None or cancel is None else _stopper(active, cancel)
        if stop is not None:
            cancel.add_listener(stop)  # from here the caller's cancel reaches the run, even mid-start
        try:
            if cancel is not None and cancel.is_cancelled():
                return not_started
            try:
                handle = self._start(task, run_id, parent, chain, path, active)
            except Cancelled:  # the caller was cancelled while the start waited (its session's store)
                return not_started
            except LoopError as exc:
                busy = isinstance(exc, LoopBusy)
                why = "is busy" if busy else f"could not start ({type(exc).__name__})"
                return ToolOutput.error(f"Sub-agent '{self.name}' {why}: {exc}")
            if active is not None:
                active.handle = handle
            return self._await(handle, active, cancel)
        finally:
            if stop is not None:
                cancel.remove_listener(stop)
            if active is not None:
                active.leave()

    def _start(
        self,
        task: str,
        run_id: str,
        parent: Optional[RunContext],
        chain: tuple[weakref.ref[RunContext], ...],
        path: tuple[str, ...],
        active: Optional[SubagentRun],
    ) -> RunHandle:
        """Start the run, its events forwarded to ``parent``'s (the caller's lineage and ``active`` in its context)."""
        driver = parent.driver if parent is not None else None
        tap: Optional[TapForward] = None
        if driver is not None:
            events = driver.events
            self._forwarder.link(run_id, events, self.name)
            if events.tap is not None:
                tap = TapForward(events.tap, events.run_id, self.name)
        token = _LINEAGE.set((chain, path + (self.name,)))
        entry = SUBAGENT_ENTRY.set(weakref.ref(active) if active is not None else None)
        try:
            if not self.keep_history:
                _check_not_stored(self.loop, self.name)  # kept in a session since as_tool()
                self._fresh_conversation()
            handle: RunHandle = self.loop.start(task, self.config, run_id, output_type=self.output_type, tap=tap)
            return handle
        except BaseException:
            self._forwarder.unlink(run_id)
            raise
        finally:
            SUBAGENT_ENTRY.reset(entry)
            _LINEAGE.reset(token)

    def _await(self, handle: RunHandle, active: Optional[SubagentRun], cancel: CancelSignal) -> ToolOutput:
        """Wait for the run (the caller's cancel fires its cancel), settle it, answer."""

        def on_cancel() -> None:
            handle.cancel(getattr(cancel, "reason", None) or "run cancelled")

        # Under a calling run the caller's cancel already reaches the run (``SubagentRun.stop``).
        listens = active is None and cancel is not None
        if listens:
            cancel.add_listener(on_cancel)  # fired already: cancels the sub-agent run at once
        try:
            handle.wait()
        finally:
            if listens:
                cancel.remove_listener(on_cancel)
            if active is not None:
                active.settle_once(handle.record)  # if its finalize never handed over
            else:
                self.loop.steering().take_leftovers()  # nobody above to hand them to
        return self._answer(handle)

    def _answer(self, handle: RunHandle) -> ToolOutput:
        try:
            run = handle.result()
        except LoopError as exc:
            return ToolOutput.error(f"Sub-agent '{self.name}' did not finish ({type(exc).__name__}): {exc}")
        if run.config.output_type is not None:
            return ToolOutput(json.dumps(json_form(run.output_value), ensure_ascii=False, default=str))
        return ToolOutput(run.output or "")

    def _fresh_conversation(self) -> None:
        """A fresh conversation for this call (the loop's record keeps every run)."""
        loop = self.loop
        with loop._busy:
            if loop._active is None:
                loop._machine = LoopMachine()


def _stopper(active: SubagentRun, cancel: CancelSignal) -> Callable[[], None]:
    """The listener that carries the calling run's cancel to ``active`` (its reason with it)."""

    def stop() -> None:
        active.stop(getattr(cancel, "reason", None) or "run cancelled")

    return stop


def _check_not_stored(loop: Any, name: str) -> None:
    """A fresh conversation per call would replace a stored one: refused.

    Raises:
        ConfigError: ``loop`` keeps its conversation in a session.
    """
    if getattr(loop, "stored_session", None) is not None:
        raise ConfigError(
            f"sub-agent '{name[:60]}' keeps its conversation in a session, which a fresh conversation per "
            "call would replace: use as_tool(..., keep_history=True)"
        )


__all__ = ["MAX_DEPTH", "SETTLE_S", "SubagentTool"]
