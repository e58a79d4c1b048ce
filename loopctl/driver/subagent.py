"""Sub-agents: a loop offered to another loop's model as a tool.

``SubagentTool`` (made by ``BareLoop.as_tool``) runs its loop on a task while
the calling tool's thread waits, and answers with the run's final output.
The rules it keeps:

- One cancel stops the tree: the calling run's cancel signal fires the
  sub-agent run's cancel (a listener, on the cancelling thread), which in
  turn fires the runs it delegates to. The calling run's ``finalize`` waits
  (briefly, bounded) for its sub-agent runs to end, so every loop in the
  tree is free again when the caller sees ``Cancelled``.
- A sub-agent run that ends on its own account (its own cancel, an error,
  max turns, a failed typed answer) is a soft error naming the sub-agent
  and the reason. Its history stays in its own loop; only the answer
  reaches the caller.
- Its events reach the calling run's tap inline (the sub-agent run's own
  tap) and its observers through a forwarding observer on the sub-agent
  loop (delivered like any observer, unfenced), re-stamped with the calling
  run's id and the sub-agent path.
  Its pending approvals, guidance and token usage are reached through the
  calling run's ``SubagentRuns``.
- Calls of one sub-agent run one at a time. A call that would run a loop
  already running in the calling chain (recursion), or delegate deeper than
  ``MAX_DEPTH`` levels, is refused with a soft error.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional

import attrs

from loopctl.config import RunConfig
from loopctl.driver.handle import RunContext, RunHandle, current_run
from loopctl.errors import ConfigError, LoopBusy, LoopError
from loopctl.machine import LoopMachine
from loopctl.messages import Usage
from loopctl.observers import EVENT_METHODS, Event, Observer, RunEnd
from loopctl.records import json_form
from loopctl.tools.base import Tool, ToolContext, ToolOutput

log = logging.getLogger("loopctl")

#: Sub-agent levels below a top-level run; a call that would go deeper is refused.
MAX_DEPTH = 8
#: How long a cancelled run's finalize waits for its sub-agent runs to end (seconds).
SETTLE_S = 1.0

# The runs above the current one (outermost first, weakly: a run keeps its
# context) and the current run's sub-agent path; set on the calling thread
# just before a sub-agent run starts, so that run's context (a copy) carries it.
_LINEAGE: contextvars.ContextVar[tuple[tuple[weakref.ref[RunContext], ...], tuple[str, ...]]] = contextvars.ContextVar(
    "loopctl_subagent_lineage", default=((), ())
)
_lock = threading.Lock()  # guards the forwarder table, a run's SubagentRuns creation and usage sums


def join_path(name: str, sub: str) -> str:
    """``name`` prefixed to a sub-agent path (``"research"`` + ``"search"``)."""
    return f"{name}/{sub}" if sub else name


class _Link:
    __slots__ = ("events", "name")

    def __init__(self, events: Any, name: str) -> None:
        self.events = events  # the calling run's RunEvents
        self.name = name


class TapForward:
    """A sub-agent run's tap: its events, re-stamped, into the calling run's tap, inline.

    Taps never block (the registry's appends under a lock), so the calling
    run's tap gets a sub-agent's events in order and before the sub-agent
    run is done: its ``run_end`` always precedes the caller's own.
    """

    __slots__ = ("tap", "run_id", "name")

    def __init__(self, tap: Callable[[Event], None], run_id: str, name: str) -> None:
        self.tap = tap
        self.run_id = run_id
        self.name = name

    def __call__(self, event: Event) -> None:
        out = attrs.evolve(event, run_id=self.run_id, subagent=join_path(self.name, event.subagent))
        try:
            self.tap(out)
        except Exception:
            log.exception("event tap raised on a sub-agent's %s", type(out).__name__)


class Forwarder(Observer):
    """Carries a sub-agent loop's events to the calling run's observers (one per loop).

    Delivered like any observer (unfenced, one at a time), so a blocked
    observer above never holds the sub-agent's cancel.
    """

    def __init__(self) -> None:
        self._links: dict[str, _Link] = {}

    def link(self, run_id: str, events: Any, name: str) -> None:
        """Forward the events of run ``run_id`` to ``events`` under ``name``."""
        with _lock:
            self._links[run_id] = _Link(events, name)

    def unlink(self, run_id: str) -> None:
        """Stop forwarding run ``run_id``'s events (no error if unknown)."""
        with _lock:
            self._links.pop(run_id, None)

    def forward(self, event: Event) -> None:
        """Re-emit ``event`` to the calling run's observers."""
        link = self._links.get(event.run_id)
        if link is None:
            return  # a direct run of this loop: nobody above it
        if type(event) is RunEnd and not event.subagent:
            self.unlink(event.run_id)  # the run's last event
        events = link.events
        emitter = events.emitter
        if emitter.observes(type(event)):
            out = attrs.evolve(event, run_id=events.run_id, subagent=join_path(link.name, event.subagent))
            emitter.deliver(emitter.fan_out, out, None)


for _method in set(EVENT_METHODS.values()):
    setattr(Forwarder, _method, Forwarder.forward)

_FORWARDERS: weakref.WeakKeyDictionary[Any, Forwarder] = weakref.WeakKeyDictionary()


def forwarder_for(loop: Any) -> Forwarder:
    """The loop's forwarding observer, registered on first use.

    Raises:
        ConfigError: a run is in flight on ``loop`` (observers are fixed then).
    """
    with _lock:
        fw = _FORWARDERS.get(loop)
        if fw is not None:
            return fw
        fw = Forwarder()
        loop.register_observer(fw)
        _FORWARDERS[loop] = fw
        return fw


class _Active:
    """One sub-agent run in flight under a calling run."""

    __slots__ = ("name", "loop", "run_id", "handle", "done", "record", "steering", "settled")

    def __init__(self, name: str, loop: Any, run_id: str, record: Any = None, steering: Any = None) -> None:
        self.name = name
        self.loop = loop
        self.run_id = run_id
        self.handle: Any = None  # set once ``start`` has returned
        self.done = threading.Event()  # set once the call is over (the tool returns)
        self.record = record  # the calling run's Run: its sub-agent usage grows here
        self.steering = steering  # the calling run's Steering: leftovers come back to it
        self.settled = False

    def settle_once(self) -> None:
        """Once the run has ended: its usage into the caller's record, its leftovers back."""
        handle = self.handle
        with _lock:
            if self.settled or handle is None or not handle.done():
                return
            self.settled = True
        leftovers = self.loop.steering().take_leftovers()
        if self.steering is not None:
            self.steering._hand_back(leftovers)
        if self.record is not None:
            _add_usage(self.record, handle.record.usage)

    def current(self) -> Any:
        """The run's handle; before ``start`` returned, one made from the loop's run in flight.

        The run may park an approval (or take guidance) before the starting
        thread is scheduled again: it is reachable from its first instant.
        """
        handle = self.handle
        if handle is not None:
            return handle
        loop = self.loop
        rc = loop._active
        if rc is None or rc.run.id != self.run_id:
            return None
        return RunHandle(rc, lambda reason: loop._cancel_run(rc, reason))


class SubagentRuns:
    """A run's sub-agent runs in flight: their approvals, guidance and end (any thread)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._lock = threading.Lock()
        self._active: list[_Active] = []

    def add(self, name: str, loop: Any, run_id: str, record: Any = None, steering: Any = None) -> _Active:
        """Note a sub-agent run about to start (its handle is set once it has)."""
        active = _Active(name, loop, run_id, record, steering)
        with self._lock:
            self._active.append(active)
        return active

    def remove(self, active: _Active) -> None:
        """Forget a sub-agent run whose call has settled."""
        with self._lock:
            if active in self._active:
                self._active.remove(active)
        active.done.set()

    def _snapshot(self) -> list[tuple[_Active, Any]]:
        with self._lock:
            active = list(self._active)
        out = []
        for a in active:
            handle = a.current()
            if handle is not None:
                out.append((a, handle))
        return out

    def settle(self, timeout: float = SETTLE_S) -> None:
        """Wait up to ``timeout`` seconds in all for the runs in flight to settle."""
        deadline = time.monotonic() + timeout
        with self._lock:
            started = list(self._active)
        for active in started:
            left = deadline - time.monotonic()
            handle = active.current()
            # The run's own end, not the calling tool's return: one wake-up fewer per level.
            ended = handle.wait(left) if handle is not None and left > 0 else active.done.wait(max(left, 0))
            if not ended:
                return
            active.settle_once()

    def pending_approvals(self) -> list[Any]:
        """Calls the sub-agent runs have parked, each with its path and this run's id."""
        out = []
        for active, handle in self._snapshot():
            for p in handle.pending_approvals():
                out.append(attrs.evolve(p, run_id=self.run_id, subagent=join_path(active.name, p.subagent)))
        return out

    def approve(self, call_id: str, *, by: Optional[str] = None, arguments: Optional[Mapping[str, Any]] = None) -> bool:
        """Answer a sub-agent run's parked call; False when none holds ``call_id``."""
        return any(h.approve(call_id, by=by, arguments=arguments) for _, h in self._snapshot())

    def deny(self, call_id: str, reason: str, *, by: Optional[str] = None) -> bool:
        """Refuse a sub-agent run's parked call; False when none holds ``call_id``."""
        return any(h.deny(call_id, reason, by=by) for _, h in self._snapshot())

    def steer(self, to: str, message: Any) -> bool:
        """Guidance for the sub-agent run at path ``to``; False when none is in flight."""
        if not isinstance(to, str) or not to:
            raise ValueError(f"a sub-agent path must be a non-empty str like 'research', got {to!r:.60}")
        name, _, rest = to.partition("/")
        for active, handle in self._snapshot():
            if active.name != name or handle.done():
                continue
            if rest:
                return bool(handle.steer_subagent(rest, message))
            return bool(active.loop.steering().push(message))
        return False


def runs_of(rc: RunContext) -> SubagentRuns:
    """``rc``'s ``SubagentRuns``, made on first use."""
    with _lock:
        runs = rc.subagents
        if runs is None:
            runs = rc.subagents = SubagentRuns(rc.run.id)
        return runs  # type: ignore[no-any-return]


def _enter(rc: RunContext, name: str, loop: Any, run_id: str) -> Optional[_Active]:
    """Note a sub-agent run about to start under ``rc``; None once ``rc`` is ending.

    Noted first, ``ending`` read second; ``finalize`` sets ``ending`` first,
    reads the noted runs second: one of the two always sees the other, so a
    run that starts is always one ``finalize`` waits for.
    """
    runs = runs_of(rc)
    driver = rc.driver
    active = runs.add(name, loop, run_id, rc.run, driver.steering if driver is not None else None)
    if rc.ending:
        runs.remove(active)
        return None
    return active


def _add_usage(run: Any, usage: Usage) -> None:
    if usage.input_tokens or usage.output_tokens:
        with _lock:
            sub = run.subagent_usage
            run.subagent_usage = Usage(sub.input_tokens + usage.input_tokens, sub.output_tokens + usage.output_tokens)


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
        output_type: Any = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise ConfigError(f"a sub-agent name must be a non-empty str without '/', got {name!r:.60}")
        if not isinstance(description, str):
            raise ConfigError(f"a sub-agent description must be a str, got {type(description).__name__}")
        if config is not None and not isinstance(config, RunConfig):
            raise ConfigError(f"a sub-agent config must be a RunConfig, got {type(config).__name__}")
        self.loop = loop
        self.name = name
        self.description = description
        self.keep_history = bool(keep_history)
        self.config = config
        self.output_type = output_type
        self._lock = threading.Lock()
        self._forwarder = forwarder_for(loop)

    def input_schema(self) -> Mapping[str, Any]:
        """One required string, ``task``."""
        return {
            "type": "object",
            "properties": {"task": {"type": "string", "description": f"The task for the {self.name} sub-agent."}},
            "required": ["task"],
            "additionalProperties": False,
        }

    def call(self, input: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Run the sub-agent on ``input["task"]`` and answer with its output."""
        cancel = ctx.cancel
        while not self._lock.acquire(timeout=0.05):  # one call at a time; a cancel stops the wait
            if cancel is not None and cancel.is_cancelled():
                return ToolOutput.error(f"Sub-agent '{self.name}' was not started: the run was cancelled")
        try:
            return self._delegate(str(input["task"]), cancel)
        finally:
            self._lock.release()

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

    def _delegate(self, task: str, cancel: Any) -> ToolOutput:
        parent = current_run()
        ancestors, path = _LINEAGE.get()
        chain = ancestors + (weakref.ref(parent),) if parent is not None else ancestors
        refusal = self._refusal(chain, path)
        if refusal is not None:
            return ToolOutput.error(refusal)
        run_id = uuid.uuid4().hex
        active = _enter(parent, self.name, self.loop, run_id) if parent is not None else None
        if (parent is not None and active is None) or (cancel is not None and cancel.is_cancelled()):
            if active is not None:
                runs_of(parent).remove(active)  # type: ignore[arg-type]
            return ToolOutput.error(f"Sub-agent '{self.name}' was not started: the run was cancelled")
        try:
            handle = self._start(task, run_id, parent, chain, path)
            if active is not None:
                active.handle = handle
        except LoopError as exc:
            busy = isinstance(exc, LoopBusy)
            why = "is busy" if busy else f"could not start ({type(exc).__name__})"
            return ToolOutput.error(f"Sub-agent '{self.name}' {why}: {exc}")
        finally:
            if active is not None and active.handle is None:
                runs_of(parent).remove(active)  # type: ignore[arg-type]
        return self._await(handle, parent, active, cancel)

    def _start(
        self, task: str, run_id: str, parent: Optional[RunContext], chain: tuple[weakref.ref[RunContext], ...], path: tuple[str, ...]
    ) -> Any:
        """Start the run, its events forwarded to ``parent``'s (the caller's lineage in its context)."""
        driver = parent.driver if parent is not None else None
        tap: Optional[TapForward] = None
        if driver is not None:
            events = driver.events
            self._forwarder.link(run_id, events, self.name)
            if events.tap is not None:
                tap = TapForward(events.tap, events.run_id, self.name)
        token = _LINEAGE.set((chain, path + (self.name,)))
        try:
            if not self.keep_history:
                self._fresh_conversation()
            return self.loop.start(task, self.config, run_id, output_type=self.output_type, tap=tap)
        except BaseException:
            self._forwarder.unlink(run_id)
            raise
        finally:
            _LINEAGE.reset(token)

    def _await(self, handle: Any, parent: Optional[RunContext], active: Optional[_Active], cancel: Any) -> ToolOutput:
        """Wait for the run (the caller's cancel fires its cancel), settle it, answer."""

        def on_cancel() -> None:
            handle.cancel(getattr(cancel, "reason", None) or "run cancelled")

        if cancel is not None:
            cancel.add_listener(on_cancel)  # fired already: cancels the sub-agent run at once
        try:
            handle.wait()
        finally:
            if cancel is not None:
                cancel.remove_listener(on_cancel)
            if active is not None and parent is not None:
                active.settle_once()
                runs_of(parent).remove(active)
            else:
                self.loop.steering().take_leftovers()  # nobody above to hand them to
        return self._answer(handle)

    def _answer(self, handle: Any) -> ToolOutput:
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


__all__ = ["MAX_DEPTH", "SETTLE_S", "Forwarder", "TapForward", "SubagentRuns", "SubagentTool", "forwarder_for", "join_path"]
